//! Addresses of the traced process to `function+offset`, from the objects table the agent
//! publishes in the rings' header (path and load bias of every object).

use std::collections::HashMap;
use std::path::PathBuf;

use ftprobe::elf::ElfImage;

/// Symbolizer over the target's objects.
pub struct Symbols {
    objects: Vec<(u64, ElfImage)>,
    cache: HashMap<u64, Option<(String, u64, u64)>>,
}

impl Symbols {
    /// Load every object of the table; objects that cannot be read are left out.
    pub fn new(table: &[(u64, Vec<u8>)]) -> Symbols {
        let objects = table
            .iter()
            .filter_map(|(bias, path)| {
                let path = PathBuf::from(String::from_utf8_lossy(path).into_owned());
                Some((*bias, ElfImage::open(&path).ok()?))
            })
            .collect();
        Symbols {
            objects,
            cache: HashMap::new(),
        }
    }

    /// The function containing `addr` and the offset into it.
    pub fn lookup(&mut self, addr: u64) -> Option<(&str, u64)> {
        self.lookup_sized(addr).map(|(n, o, _)| (n, o))
    }

    /// The function containing `addr`, the offset into it, and the function's size.
    pub fn lookup_sized(&mut self, addr: u64) -> Option<(&str, u64, u64)> {
        let objects = &self.objects;
        let hit = self.cache.entry(addr).or_insert_with(|| {
            objects.iter().find_map(|(bias, img)| {
                let svma = addr.checked_sub(*bias)?;
                if !img.contains(svma) {
                    return None;
                }
                let (i, off) = img.func_at(svma)?;
                Some((
                    ftprobe::elf::display_name(&img.funcs[i].name),
                    off,
                    img.funcs[i].size,
                ))
            })
        });
        hit.as_ref().map(|(n, o, z)| (n.as_str(), *o, *z))
    }

    /// The function name at `addr`, or the address in hex.
    pub fn name(&mut self, addr: u64) -> String {
        match self.lookup(addr) {
            Some((n, _)) => n.to_owned(),
            None => format!("{addr:#x}"),
        }
    }
}
