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
    /// The (object, function) of each of `names`.
    owner: Vec<(usize, usize)>,
    /// (object index, function index, or the start of an `.eh_frame` range with no symbol
    /// as `usize::MAX - start`) to its slot in `names`.
    name_ids: FxHashMap<(usize, usize), u32>,
    cache: FxHashMap<u64, Option<Resolved>>,
    /// Per object (lazily): the names that tell apart its functions of the same short name.
    distinct: FxHashMap<usize, Distinct>,
}

/// The functions of one object that share their short (shown) name with another of its
/// functions, and the name each is given instead ([`Distinct::new`]).
#[derive(Default)]
pub struct Distinct {
    /// Index in `funcs` to its name.
    names: FxHashMap<usize, String>,
}

impl Distinct {
    /// The names of `img`'s functions whose short name another of its functions has too: an
    /// overloaded C++ function by its full signature as `c++filt` prints it (`f(int)`,
    /// `f(double)`); where that does not tell them apart (C functions, `static` in
    /// different files; the same signature twice), the name then `@` and the source file its
    /// symbol table gives (`helper@names_st_a.c`, the form of the kernel's kallsyms aliases
    /// for duplicate names), else `@` and the function's address in the file.
    pub fn new(img: &ElfImage) -> Distinct {
        let mut groups: FxHashMap<String, Vec<usize>> = FxHashMap::default();
        for (i, f) in img.funcs.iter().enumerate() {
            groups
                .entry(ftprobe::elf::display_name(&f.name))
                .or_default()
                .push(i);
        }
        groups.retain(|_, g| g.len() > 1);
        let mut names = FxHashMap::default();
        if groups.is_empty() {
            return Distinct { names };
        }
        let full = |j: usize| {
            let sym = &img.funcs[j].name;
            sym.starts_with("_Z")
                .then(|| ftprobe::elf::demangled_names(sym).into_iter().next())
                .flatten()
        };
        let mut files: Option<FxHashMap<u64, String>> = None;
        for (short, group) in &groups {
            let fulls: Vec<Option<String>> = group.iter().map(|&j| full(j)).collect();
            for (k, &j) in group.iter().enumerate() {
                let unique = fulls[k]
                    .as_ref()
                    .filter(|f| fulls.iter().filter(|g| g.as_ref() == Some(*f)).count() == 1);
                let name = match unique {
                    Some(f) => f.clone(),
                    None => {
                        let base = fulls[k].as_deref().unwrap_or(short);
                        let files = files.get_or_insert_with(|| source_files(&img.path));
                        let svma = img.funcs[j].svma;
                        match files.get(&svma) {
                            Some(file) => format!("{base}@{file}"),
                            None => format!("{base}@{svma:#x}"),
                        }
                    }
                };
                names.insert(j, name);
            }
        }
        Distinct { names }
    }

    /// The name of function `i` if it needs one other than its short name.
    pub fn get(&self, i: usize) -> Option<&str> {
        self.names.get(&i).map(String::as_str)
    }
}

/// The source file (`STT_FILE` symbol before it) of each local function symbol of the file
/// at `path`, by address.
fn source_files(path: &std::path::Path) -> FxHashMap<u64, String> {
    use object::{Object, ObjectSymbol, SymbolKind};
    let mut out = FxHashMap::default();
    let Ok(data) = std::fs::read(path) else {
        return out;
    };
    let Ok(file) = object::File::parse(&*data) else {
        return out;
    };
    let mut current: Option<String> = None;
    for sym in file.symbols() {
        match sym.kind() {
            SymbolKind::File => current = sym.name().ok().map(str::to_owned),
            SymbolKind::Text if sym.is_local() => {
                if let Some(f) = &current {
                    out.entry(sym.address()).or_insert_with(|| f.clone());
                }
            }
            _ => {}
        }
    }
    out
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
            owner: Vec::new(),
            name_ids: FxHashMap::default(),
            cache: FxHashMap::default(),
            distinct: FxHashMap::default(),
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
                self.owner.push((o, i));
                let img = &self.objects[o].1;
                let distinct = self.distinct.entry(o).or_insert_with(|| Distinct::new(img));
                self.names.push(match img.funcs.get(i) {
                    Some(f) => distinct
                        .get(i)
                        .map_or_else(|| ftprobe::elf::display_name(&f.name), str::to_owned),
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

    /// The symbol name (as in the symbol table) and the short (demangled) name of the
    /// function containing `addr`: what filters match
    /// ([`FilterEntry::matches_function`]).
    ///
    /// [`FilterEntry::matches_function`]: ftprobe::ftrace::glob::FilterEntry::matches_function
    pub fn names_at(&mut self, addr: u64) -> Option<(&str, String)> {
        let r = self.resolve(addr)?;
        let (o, i) = self.owner[r.name as usize];
        Some(match self.objects[o].1.funcs.get(i) {
            Some(f) => (f.name.as_str(), ftprobe::elf::display_name(&f.name)),
            // An `.eh_frame` range with no symbol.
            None => {
                let n = self.names[r.name as usize].as_str();
                (n, n.to_owned())
            }
        })
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
