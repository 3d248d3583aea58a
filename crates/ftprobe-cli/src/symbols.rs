//! Addresses of the traced process to `function+offset`, from the objects table the agent
//! publishes in the rings' header (path and load bias of every object).
//!
//! A trace repeats the same few thousand addresses millions of times, so every address is
//! resolved once and kept: a lookup after the first is one hash probe, and names are handed
//! out as `&str` into a table of the names seen (no allocation per line).

use std::path::PathBuf;

use ftprobe::elf::ElfImage;
use rustc_hash::FxHashMap;

/// A resolved address: the index of its function's name in `Symbols::names`, the offset into
/// the function, and the function's size.
#[derive(Clone, Copy)]
struct Resolved {
    name: u32,
    off: u64,
    size: u64,
}

/// Symbolizer over the target's objects.
pub struct Symbols {
    objects: Vec<(u64, ElfImage)>,
    /// Display names (demangled) of the functions seen so far.
    names: Vec<String>,
    /// (object index, function index, or the start of an `.eh_frame` range with no symbol
    /// as `usize::MAX - start`) to its slot in `names`.
    name_ids: FxHashMap<(usize, usize), u32>,
    cache: FxHashMap<u64, Option<Resolved>>,
}

impl Symbols {
    /// Load every object of the table; objects that cannot be read are left out.
    pub fn new(table: &[(u64, Vec<u8>)]) -> Symbols {
        let objects = table
            .iter()
            .filter_map(|(bias, path)| {
                let path = PathBuf::from(String::from_utf8_lossy(path).into_owned());
                Some((*bias, ElfImage::open_symbols(&path).ok()?))
            })
            .collect();
        Symbols {
            objects,
            names: Vec::new(),
            name_ids: FxHashMap::default(),
            cache: FxHashMap::default(),
        }
    }

    fn resolve(&mut self, addr: u64) -> Option<Resolved> {
        if let Some(r) = self.cache.get(&addr) {
            return *r;
        }
        // The last entry first: an object loaded later (dlopen) is appended to the table, and
        // one loaded where an unloaded one was is the one mapped now.
        let found = self
            .objects
            .iter()
            .enumerate()
            .rev()
            .find_map(|(o, (bias, img))| {
                let svma = addr.checked_sub(*bias)?;
                if !img.contains(svma) {
                    return None;
                }
                if let Some((i, off)) = img.func_at(svma) {
                    return Some((o, i, off, img.funcs[i].size));
                }
                // A function the object has no symbol for (a stripped library without its
                // debug file): its `.eh_frame` range, named `object+0xSTART` as the probe
                // listing names it.
                let (start, len) = img.fde_at(svma)?;
                Some((o, usize::MAX - start as usize, svma - start, len))
            });
        let r = found.map(|(o, i, off, size)| {
            let next = self.names.len() as u32;
            let name = *self.name_ids.entry((o, i)).or_insert(next);
            if name == next {
                let img = &self.objects[o].1;
                self.names.push(match img.funcs.get(i) {
                    Some(f) => ftprobe::elf::display_name(&f.name),
                    None => {
                        let file = img.path.file_name().unwrap_or_default().to_string_lossy();
                        format!("{file}+{:#x}", usize::MAX - i)
                    }
                });
            }
            Resolved { name, off, size }
        });
        self.cache.insert(addr, r);
        r
    }

    /// The function containing `addr` and the offset into it.
    pub fn lookup(&mut self, addr: u64) -> Option<(&str, u64)> {
        self.lookup_sized(addr).map(|(n, o, _)| (n, o))
    }

    /// The function containing `addr`, the offset into it, and the function's size.
    pub fn lookup_sized(&mut self, addr: u64) -> Option<(&str, u64, u64)> {
        let r = self.resolve(addr)?;
        Some((self.names[r.name as usize].as_str(), r.off, r.size))
    }

    /// Appends the function name at `addr`, or the address as the kernel prints one it has
    /// no symbol for ([`push_unknown_addr`]), to `out`.
    pub fn push_name(&mut self, addr: u64, out: &mut Vec<u8>) {
        match self.lookup(addr) {
            Some((n, _)) => out.extend_from_slice(n.as_bytes()),
            None => push_unknown_addr(out, addr),
        }
    }

    /// [`Symbols::push_name`] for a return address (a function tracer's parent): the caller
    /// is the function that holds the call instruction, which ends at `addr`, so `addr - 1`
    /// is looked up first, as unwinders do. This names the caller when the call is the last
    /// instruction of a function (a call to a `noreturn` function), where `addr` is one past
    /// the function's end: the kernel's kallsyms, where a symbol runs to the next one, names
    /// it too, while a lookup of `addr` found no function, or the next one. A signal
    /// handler's return address is the first byte of glibc's `__restore_rt`, which glibc
    /// puts after a `nop` for this very rule: `addr - 1` is in no function there, and `addr`
    /// is looked up.
    pub fn push_return_name(&mut self, addr: u64, out: &mut Vec<u8>) {
        if let Some((n, _)) = addr.checked_sub(1).and_then(|a| self.lookup(a)) {
            out.extend_from_slice(n.as_bytes());
            return;
        }
        self.push_name(addr, out);
    }
}

/// Appends an address that no symbol covers, as the kernel's `trace_seq_print_sym()`
/// (`"0x%08lx"`), or `0` for a null address (`seq_print_ip_sym()`).
pub fn push_unknown_addr(out: &mut Vec<u8>, addr: u64) {
    if addr == 0 {
        out.push(b'0');
        return;
    }
    let mut hex = Vec::with_capacity(18);
    push_hex(&mut hex, addr);
    out.extend_from_slice(b"0x");
    out.extend(std::iter::repeat_n(b'0', 10usize.saturating_sub(hex.len())));
    out.extend_from_slice(&hex[2..]);
}

/// Appends `0x` and `v` in lower-case hex, as `format!("{v:#x}")`.
pub fn push_hex(out: &mut Vec<u8>, v: u64) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    out.extend_from_slice(b"0x");
    let n = (64 - v.leading_zeros()).div_ceil(4).max(1);
    for i in (0..n).rev() {
        out.push(DIGITS[((v >> (4 * i)) & 0xf) as usize]);
    }
}

#[cfg(test)]
mod tests {
    use super::push_hex;

    #[test]
    fn hex_as_format() {
        for v in [0, 1, 0xf, 0x10, 0x7f87_6cef_124a, u64::MAX] {
            let mut out = Vec::new();
            push_hex(&mut out, v);
            assert_eq!(String::from_utf8(out).unwrap(), format!("{v:#x}"));
        }
    }
}
