//! Addresses of the traced process to `function+offset`, from the objects table the agent
//! publishes in the rings' header (path and load bias of every object).
//!
//! The table is the session's, append-only: a process that `exec`s (followed, `--follow-exec`)
//! appends the new image's objects and says where they start and how many ([`Image`]). A
//! record is then looked up in its process's image at its time ([`Symbols::select`]): the
//! table's entries from the image's first to the next image's of that process (before its
//! first image: from the start), less the objects other images started with. A process that
//! never exec'd (the first image, a forked child) sees the whole table less those, the last
//! entry covering an address first, as objects loaded later are.
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

/// An image a process exec'd into: from `tsc` on, the records of `pid` are named from the
/// objects table's entries from index `first` on (up to its next image's).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Image {
    pub pid: u32,
    pub tsc: u64,
    pub first: usize,
    /// How many objects it started with (`first..first + count`; 0: not said).
    #[serde(default)]
    pub count: usize,
    /// The program (`/proc/PID/exe` when the image's agent started).
    #[serde(default)]
    pub exe: String,
}

/// The agent's TEXT record kind (`ftprobe-agent`'s `follow::TEXT_IMAGE`): a followed
/// exec's new image (or a forked child of one) joined the session,
/// `PID\tTSC\tFIRST\tCOUNT\tEXE`.
pub const TEXT_IMAGE: u32 = 4;

/// Parse a [`TEXT_IMAGE`] text.
pub fn parse_image(text: &str) -> Option<Image> {
    let mut f = text.splitn(5, '\t');
    Some(Image {
        pid: f.next()?.parse().ok()?,
        tsc: f.next()?.parse().ok()?,
        first: f.next()?.parse().ok()?,
        count: f.next()?.parse().ok()?,
        exe: f.next().unwrap_or_default().to_owned(),
    })
}

/// The table entries `lo..hi` that name a record, less the objects of every image but the
/// one at index `own` (see the module docs).
type View = (usize, usize, usize);
const WHOLE: View = (0, usize::MAX, usize::MAX);

/// Symbolizer over the target's objects.
pub struct Symbols {
    /// (the entry's index in the table, load bias, the object's index in `elf`).
    objects: Vec<(usize, u64, usize)>,
    /// Each object file once (a table may name one file many times: a damaged or crafted
    /// recording's, 800 times, must not load it 800 times).
    elf: Vec<ElfImage>,
    images: Vec<Image>,
    /// The view lookups use now, and the address cache of each view seen.
    view: usize,
    caches: Vec<(View, FxHashMap<u64, Option<Resolved>>)>,
    /// Display names (demangled) of the functions seen so far.
    names: Vec<String>,
    /// The (object, function) of each of `names`.
    owner: Vec<(usize, usize)>,
    /// (object index, function index, or the start of an `.eh_frame` range with no symbol
    /// as `usize::MAX - start`) to its slot in `names`.
    name_ids: FxHashMap<(usize, usize), u32>,
    /// Per object (lazily): the names that tell apart its functions of the same short name.
    distinct: FxHashMap<usize, Distinct>,
    /// When each table entry was added (raw TSC; 0 or none: from the start), and the
    /// latest of those times: a record before it sees only the entries added by then.
    load_tsc: Vec<u64>,
    last_load: u64,
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
        for (i, f) in img.funcs().iter().enumerate() {
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
            let sym = &img.funcs()[j].name;
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
                        let svma = img.funcs()[j].svma;
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
    /// Load every object of the table (objects that cannot be read are left out), with the
    /// images processes exec'd into.
    pub fn with_images(table: &[(u64, Vec<u8>)], images: &[Image]) -> Symbols {
        let mut elf = Vec::new();
        let mut by_path: FxHashMap<&[u8], Option<usize>> = FxHashMap::default();
        let mut objects = Vec::new();
        for (i, (bias, path)) in table.iter().enumerate() {
            let loaded = *by_path.entry(path.as_slice()).or_insert_with(|| {
                let p = PathBuf::from(String::from_utf8_lossy(path).into_owned());
                let img = ElfImage::open_symbols(&p).ok()?;
                elf.push(img);
                Some(elf.len() - 1)
            });
            if let Some(e) = loaded {
                objects.push((i, *bias, e));
            }
        }
        Symbols {
            objects,
            elf,
            images: images.to_vec(),
            view: 0,
            caches: vec![(WHOLE, FxHashMap::default())],
            names: Vec::new(),
            owner: Vec::new(),
            name_ids: FxHashMap::default(),
            distinct: FxHashMap::default(),
            load_tsc: Vec::new(),
            last_load: 0,
        }
    }

    /// When each entry of the table was added (the rings' `object_load_times`, a
    /// recording's `load_tsc`s): a record then resolves only among the entries added at or
    /// before its timestamp ([`select`](Self::select)). Without it, the last entry that
    /// covers an address names it, whenever the record was written: a library loaded where
    /// an unloaded one was named the unloaded one's calls (uftrace's `s-dlopen`; issue 26,
    /// item 10).
    pub fn with_load_times(mut self, load_tsc: Vec<u64>) -> Symbols {
        self.last_load = load_tsc.iter().copied().max().unwrap_or(0);
        self.load_tsc = load_tsc;
        self
    }

    /// How many entries of the table were added at or before `tsc` (the table is in the
    /// order objects were added, which is their time order).
    fn loaded_by(&self, tsc: u64) -> usize {
        if tsc >= self.last_load {
            return usize::MAX;
        }
        self.load_tsc.partition_point(|&t| t <= tsc)
    }

    /// A process exec'd into `image` (once per image: a repeat is ignored).
    pub fn add_image(&mut self, image: Image) {
        if !self.images.contains(&image) {
            self.images.push(image);
            // The views' exclusions changed.
            self.caches = vec![(WHOLE, FxHashMap::default())];
            self.view = 0;
        }
    }

    /// Look the next addresses up as the records of process `pid` at timestamp `tsc` (raw
    /// TSC, as the records carry it) see them: in that process's image then.
    #[inline]
    pub fn select(&mut self, pid: u32, tsc: u64) {
        self.select_view(pid, tsc, tsc);
    }

    /// As [`select`](Self::select), the process's image by `image_tsc` and the objects
    /// loaded by `load_time` (in the unit of [`with_load_times`](Self::with_load_times);
    /// `u64::MAX`: every object of the table, whenever loaded).
    #[inline]
    pub fn select_view(&mut self, pid: u32, image_tsc: u64, load_time: u64) {
        if self.images.is_empty() && load_time >= self.last_load && self.view == 0 {
            return;
        }
        let (lo, hi, own) = if self.images.is_empty() {
            WHOLE
        } else {
            image_view(&self.images, pid, image_tsc)
        };
        let view = (lo, hi.min(self.loaded_by(load_time)), own);
        if self.caches[self.view].0 == view {
            return;
        }
        self.view = match self.caches.iter().position(|c| c.0 == view) {
            Some(v) => v,
            None => {
                self.caches.push((view, FxHashMap::default()));
                self.caches.len() - 1
            }
        };
    }

    /// Which view lookups use now (see [`select`](Self::select)): a cache of names by
    /// address must be per view.
    pub fn view(&self) -> usize {
        self.view
    }

    /// Whether any process exec'd into another image.
    pub fn has_images(&self) -> bool {
        !self.images.is_empty()
    }

    fn resolve(&mut self, addr: u64) -> Option<Resolved> {
        if let Some(r) = self.caches[self.view].1.get(&addr) {
            return *r;
        }
        let (lo, hi, own) = self.caches[self.view].0;
        let images = &self.images;
        // A forked child's image is its parent's: the same entries.
        let own = images.get(own).map(|im| (im.first, im.count));
        let theirs = |t: usize| {
            images.iter().any(|im| {
                Some((im.first, im.count)) != own && (im.first..im.first + im.count).contains(&t)
            })
        };
        // The last entry first: an object loaded later (dlopen) is appended to the table, and
        // one loaded where an unloaded one was is the one mapped now.
        let found = self
            .objects
            .iter()
            .enumerate()
            .rev()
            .filter(|(_, (t, _, _))| (lo..hi).contains(t) && !theirs(*t))
            .find_map(|(o, &(_, bias, e))| {
                let img = &self.elf[e];
                let svma = addr.checked_sub(bias)?;
                if !img.contains(svma) {
                    return None;
                }
                if let Some((i, off)) = img.func_at(svma) {
                    return Some((o, i, off, img.funcs()[i].size));
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
                let e = self.objects[o].2;
                let img = &self.elf[e];
                let distinct = self.distinct.entry(e).or_insert_with(|| Distinct::new(img));
                self.names.push(match img.funcs().get(i) {
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
        self.caches[self.view].1.insert(addr, r);
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
        Some(match self.elf[self.objects[o].2].funcs().get(i) {
            Some(f) => (f.name.as_str(), ftprobe::elf::display_name(&f.name)),
            // An `.eh_frame` range with no symbol.
            None => {
                let n = self.names[r.name as usize].as_str();
                (n, n.to_owned())
            }
        })
    }

    /// The function containing `addr` as `(file, function)`: an index of this table's files
    /// (the same for every load of one file) and of the file's functions. Calls of one
    /// function in two load periods of its library (maybe at two addresses) have the same;
    /// two libraries' functions loaded one after the other at one address do not.
    pub fn function_of(&mut self, addr: u64) -> Option<(usize, usize)> {
        let r = self.resolve(addr)?;
        let (o, i) = self.owner[r.name as usize];
        Some((self.objects[o].2, i))
    }

    /// The path of file `file` ([`Symbols::function_of`]).
    pub fn file_path(&self, file: usize) -> &std::path::Path {
        &self.elf[file].path
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

/// The table entries that name the records of `pid` at `tsc` (see the module docs).
fn image_view(images: &[Image], pid: u32, tsc: u64) -> View {
    let mut lo = None;
    let mut hi = usize::MAX;
    for (k, im) in images.iter().enumerate().filter(|(_, im)| im.pid == pid) {
        if im.tsc <= tsc {
            if lo.is_none_or(|(t, _, _)| im.tsc >= t) {
                lo = Some((im.tsc, im.first, k));
            }
        } else {
            hi = hi.min(im.first);
        }
    }
    match lo {
        // Its image at that time, up to the next one's entries.
        Some((_, first, k)) => (first, hi, k),
        // Before its first exec (or it never exec'd).
        None => (0, hi, usize::MAX),
    }
}

/// The function at `addr`, by name (or its address).
pub fn name_of(syms: &mut Symbols, addr: u64) -> String {
    let mut v = Vec::new();
    syms.push_name(addr, &mut v);
    String::from_utf8_lossy(&v).into_owned()
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
