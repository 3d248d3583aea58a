//! ELF objects on disk: function symbols, loadable segments and ftrace sites, all as addresses
//! in the file (svma). The process's address of a file address is `svma + load_bias`.
//!
//! A stripped object (Debian's libc has no `.symtab`) still tells where its functions are:
//! every function has an `.eh_frame` FDE ([`ElfImage::fde_at`]), and its full symbol table may
//! be in a separate debug file ([`ElfImage::debug_symbols`]), found as gdb and perf find it:
//! `<debug dir>/.build-id/xx/yyyy.debug` from the `NT_GNU_BUILD_ID` note, else the
//! `.gnu_debuglink` name next to the object, in its `.debug/`, or under the debug dir.
//!
//! Pure parsing over `&[u8]` with the `object` and `gimli` crates; nothing here touches the
//! running process.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use object::elf::{R_X86_64_GLOB_DAT, R_X86_64_JUMP_SLOT};
use object::{
    Object, ObjectSection, ObjectSymbol, ObjectSymbolTable, ReadRef, RelocationFlags,
    RelocationTarget, SymbolKind,
};

use crate::arch::x86_64::sites::{self, CallTarget, SiteKind, SitePlace};
pub use crate::demangle::{demangled_names, display_name};

/// Errors reading an object file.
#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    /// The file could not be read.
    #[error("cannot read {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not an ELF object `object` can parse.
    #[error("{path} is not a readable ELF object")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: object::Error,
    },
    /// Not x86-64.
    #[error("{path} is not an x86-64 object")]
    Arch {
        /// The file.
        path: PathBuf,
    },
}

/// A function symbol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FuncSym {
    /// Symbol name, as in the symbol table (not demangled).
    pub name: String,
    /// Start address in the file.
    pub svma: u64,
    /// Size in bytes (0 when the symbol table does not say).
    pub size: u64,
}

/// How a site was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SiteSource {
    /// Listed in `__mcount_loc` (`-mrecord-mcount`).
    McountLoc,
    /// Listed in `__patchable_function_entries`.
    PatchableEntries,
    /// Found by decoding the start of the function (a call to `__fentry__`/`mcount`).
    Decoded,
    /// An LLVM XRay entry sled listed in `xray_instr_map` (`clang -fxray-instrument`); a
    /// function gets one only when it has no other site.
    Xray,
}

impl SiteSource {
    /// Short name used by `ftprobe list functions`.
    pub fn name(self) -> &'static str {
        match self {
            SiteSource::McountLoc => "__mcount_loc",
            SiteSource::PatchableEntries => "__patchable_function_entries",
            SiteSource::Decoded => "decoded",
            SiteSource::Xray => "xray_instr_map",
        }
    }
}

/// What an XRay sled is for (`xray_instr_map`'s kind byte, LLVM's `SledKind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum XrayKind {
    /// Function entry (0): `jmp .+11` and a 9-byte NOP at the function's start.
    Entry,
    /// Function exit (1): `ret` and a 10-byte NOP, one per return.
    Exit,
    /// Tail call (2): `jmp .+11` and a 9-byte NOP just before a tail jump.
    Tail,
    /// Function entry that logs its first argument (3, `[[clang::xray_log_args(1)]]`): the
    /// same sled as [`XrayKind::Entry`].
    LogArgsEntry,
    /// `__xray_customevent` (4) or `__xray_typedevent` (5) call sites, or a kind this
    /// version does not know: listed, never patched.
    Other(u8),
}

impl XrayKind {
    fn from_byte(b: u8) -> XrayKind {
        match b {
            0 => XrayKind::Entry,
            1 => XrayKind::Exit,
            2 => XrayKind::Tail,
            3 => XrayKind::LogArgsEntry,
            b => XrayKind::Other(b),
        }
    }

    /// An entry sled (plain or logging its arguments).
    pub fn is_entry(self) -> bool {
        matches!(self, XrayKind::Entry | XrayKind::LogArgsEntry)
    }

    /// An exit sled (a return or a tail call).
    pub fn is_exit(self) -> bool {
        matches!(self, XrayKind::Exit | XrayKind::Tail)
    }
}

/// One entry of `xray_instr_map`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct XraySled {
    /// Address of the sled's first byte in the file.
    pub svma: u64,
    /// Address of its function in the file (as the map gives it).
    pub func_svma: u64,
    /// What it is for.
    pub kind: XrayKind,
    /// The map entry's version (0 and 1: absolute addresses; 2: relative to the entry).
    pub version: u8,
}

/// An ftrace site in a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SiteInfo {
    /// Address of the site's first byte in the file.
    pub svma: u64,
    /// What the compiler left there.
    pub kind: SiteKind,
    /// Where it stands in its function.
    pub place: SitePlace,
    /// How it was found.
    pub source: SiteSource,
    /// Index of the function in [`ElfImage::funcs`].
    pub func: usize,
}

/// A loadable segment (`PT_LOAD`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Start address in the file.
    pub svma: u64,
    /// Size in memory, bytes.
    pub memsz: u64,
    /// Executable.
    pub exec: bool,
    /// Writable (`PF_W`): data, where an SDT marker's semaphore lives.
    pub writable: bool,
    /// Offset of its first byte in the file.
    pub offset: u64,
    /// Bytes of it in the file.
    pub filesz: u64,
}

/// What ftprobe needs from one ELF file.
#[derive(Clone, Debug)]
pub struct ElfImage {
    /// The file it came from.
    pub path: PathBuf,
    /// `ET_DYN` (PIE or shared library): loaded at a bias. `ET_EXEC` is loaded at its addresses.
    pub relocatable: bool,
    /// The symbol side ([`funcs`](Self::funcs), [`names`](Self::names),
    /// [`ifuncs`](Self::ifuncs), [`fdes`](Self::fdes)): parsed with the file, or, for an
    /// object that cannot have a site ([`ElfImage::open`]), read again from `path` when first
    /// asked (a `dlopen` of libstdc++ spent ~8 ms on them in the program's thread, for
    /// nothing when no probe or lookup names it).
    symbols: std::sync::OnceLock<Symbols>,
    /// The file as it was when its headers were read, for symbols read later.
    stamp: Option<FileStamp>,
    /// Sites, sorted by address.
    pub sites: Vec<SiteInfo>,
    /// Loadable segments.
    pub segments: Vec<Segment>,
    /// Site addresses listed in a record section that did not hold a recognisable site
    /// (e.g. `-fpatchable-function-entry=N,M` entries before the symbol). Reported, not patched.
    pub rejected: Vec<u64>,
    /// The `NT_GNU_BUILD_ID` note's bytes.
    pub build_id: Option<Vec<u8>>,
    /// Where those bytes are (the `.note.gnu.build-id` section's descriptor), to compare
    /// with what is mapped: a file replaced on disk since it was loaded is not the code in
    /// memory.
    pub build_id_svma: Option<u64>,
    /// The `.gnu_debuglink` section: the debug file's name and the CRC-32 of its contents.
    pub debuglink: Option<(String, u32)>,
    /// The LLVM XRay sleds of `xray_instr_map` (`clang -fxray-instrument`), sorted by
    /// address; empty when the object has none (or for [`ElfImage::open_symbols`]).
    pub xray: Vec<XraySled>,
}

/// Parts of a file read with `pread`, each at its offset: what [`ElfImage::open`] keeps of an
/// object that cannot have sites (its ELF and program headers, section headers and names,
/// notes and `.gnu_debuglink`), without reading all of it. `object` reads them through
/// [`object::ReadRef`]; a read outside them fails as a read past the end of a file would.
struct Parts {
    len: u64,
    blocks: Vec<(u64, Vec<u8>)>,
}

impl Parts {
    /// Read `size` bytes at `offset`, unless a part read already holds them.
    fn load(&mut self, f: &std::fs::File, offset: u64, size: u64) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        if size == 0 || (&*self).read_bytes_at(offset, size).is_ok() {
            return Ok(());
        }
        if offset.checked_add(size).is_none_or(|end| end > self.len) {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let mut buf = vec![0u8; size as usize];
        f.read_exact_at(&mut buf, offset)?;
        self.blocks.push((offset, buf));
        Ok(())
    }

    /// The parts of ELF file `f` listed above, if it cannot have a site: no record section
    /// (`__mcount_loc`, `__patchable_function_entries`), no XRay map, and no symbol named as
    /// a hook in the string tables of `.symtab` and `.dynsym`. `None` if it may have sites,
    /// or is not a 64-bit ELF file whose sections this reads (the caller then reads it whole,
    /// and parsing says what is wrong with it).
    fn of_elf(f: &std::fs::File) -> std::io::Result<Option<Parts>> {
        use object::elf::{SHN_XINDEX, SHT_DYNSYM, SHT_NOTE, SHT_STRTAB, SHT_SYMTAB};
        use object::read::elf::{FileHeader, SectionHeader};
        let mut parts = Parts {
            len: f.metadata()?.len(),
            blocks: Vec::new(),
        };
        let hdr_len = std::mem::size_of::<object::elf::FileHeader64<object::Endianness>>() as u64;
        if parts.load(f, 0, hdr_len).is_err() {
            return Ok(None);
        }
        let (ph, sh, shstrndx) = {
            let Ok(hdr) = object::elf::FileHeader64::<object::Endianness>::parse(&parts) else {
                return Ok(None);
            };
            let Ok(e) = hdr.endian() else { return Ok(None) };
            let ph = (
                hdr.e_phoff(e),
                u64::from(hdr.e_phnum(e)) * u64::from(hdr.e_phentsize(e)),
            );
            let shnum = u64::from(hdr.e_shnum(e));
            let shstrndx = hdr.e_shstrndx(e);
            // Extended numbering (counts in section 0): read whole.
            if shnum == 0 || shstrndx == SHN_XINDEX {
                return Ok(None);
            }
            (
                ph,
                (hdr.e_shoff(e), shnum * u64::from(hdr.e_shentsize(e))),
                shstrndx,
            )
        };
        if parts.load(f, ph.0, ph.1).is_err() || parts.load(f, sh.0, sh.1).is_err() {
            return Ok(None);
        }
        // (type, name offset, file offset, size, link) of every section.
        let links: Vec<(u32, u32, u64, u64, u32)> = {
            let Ok(hdr) = object::elf::FileHeader64::<object::Endianness>::parse(&parts) else {
                return Ok(None);
            };
            let Ok(e) = hdr.endian() else { return Ok(None) };
            let Ok(shdrs) = hdr.section_headers(e, &parts) else {
                return Ok(None);
            };
            shdrs
                .iter()
                .map(|s| {
                    let (off, size) = s.file_range(e).unwrap_or((0, 0));
                    (s.sh_type(e), s.sh_name(e), off, size, s.sh_link(e))
                })
                .collect()
        };
        let secs: Vec<(u32, u32, u64, u64)> =
            links.iter().map(|&(t, n, o, z, _)| (t, n, o, z)).collect();
        let Some(&(_, _, str_off, str_size)) = secs.get(usize::from(shstrndx)) else {
            return Ok(None);
        };
        if parts.load(f, str_off, str_size).is_err() {
            return Ok(None);
        }
        let name_of = |parts: &Parts, name: u32| -> Option<Vec<u8>> {
            parts
                .read_bytes_at_until(str_off + u64::from(name)..str_off + str_size, 0)
                .ok()
                .map(<[u8]>::to_vec)
        };
        // A record section or an XRay map: sites.
        for &(_, name, _, _) in &secs {
            if let Some(n) = name_of(&parts, name) {
                if matches!(
                    &n[..],
                    b"__mcount_loc" | b"__patchable_function_entries" | b"xray_instr_map"
                ) {
                    return Ok(None);
                }
            }
        }
        // A symbol named as a hook, in the string table of `.symtab` or `.dynsym` (a GOT
        // slot's or PLT entry's symbol is a `.dynsym` entry): maybe decoded sites
        // (`find_sites_by_decoding` looks at these). Scanned in pieces, not kept.
        for &(ty, _, _, _, link) in &links {
            if !matches!(ty, SHT_SYMTAB | SHT_DYNSYM) {
                continue;
            }
            let Some(&(SHT_STRTAB, _, off, size)) = secs.get(link as usize) else {
                continue;
            };
            // A hook's name, or a table that cannot be read: read whole.
            if !matches!(strings_name_a_hook(f, off, size), Ok(false)) {
                return Ok(None);
            }
        }
        let wanted: Vec<(u64, u64)> = secs
            .iter()
            .filter(|&&(ty, name, _, _)| {
                ty == SHT_NOTE || name_of(&parts, name).is_some_and(|n| n == b".gnu_debuglink")
            })
            .map(|&(_, _, off, size)| (off, size))
            .collect();
        for (off, size) in wanted {
            if parts.load(f, off, size).is_err() {
                return Ok(None);
            }
        }
        Ok(Some(parts))
    }
}

/// Whether the string table at `offset` (`size` bytes) of `f` holds a hook's name
/// ([`sites::is_hook_name`]: `mcount`, `__fentry__`, ..., with or without `@VERSION`). Read
/// in 64 KiB pieces into one buffer; a string cut by a piece's end is read again whole.
fn strings_name_a_hook(f: &std::fs::File, offset: u64, size: u64) -> std::io::Result<bool> {
    use std::os::unix::fs::FileExt;
    const PIECE: u64 = 64 * 1024;
    let mut buf = vec![0u8; PIECE as usize];
    let mut at = 0u64;
    while at < size {
        let n = PIECE.min(size - at) as usize;
        f.read_exact_at(&mut buf[..n], offset + at)?;
        let piece = &buf[..n];
        // The strings whose end is in this piece; the last one, unless the table ends here,
        // may go on in the next piece: the next read starts at its first byte.
        let whole = match piece.iter().rposition(|&c| c == 0) {
            Some(last) => last + 1,
            // No string ends in a whole piece: longer than any hook's name.
            None => n,
        };
        let piece = &piece[..whole];
        // Every hook's name holds one of these; the string around each match is checked.
        for needle in [&b"mcount"[..], b"__fentry__"] {
            for m in memchr::memmem::find_iter(piece, needle) {
                let start = piece[..m]
                    .iter()
                    .rposition(|&c| c == 0)
                    .map_or(0, |z| z + 1);
                let end = memchr::memchr(0, &piece[m..]).map_or(piece.len(), |z| m + z);
                if std::str::from_utf8(&piece[start..end]).is_ok_and(sites::is_hook_name) {
                    return Ok(true);
                }
            }
        }
        at += whole as u64;
    }
    Ok(false)
}

impl<'a> object::ReadRef<'a> for &'a Parts {
    fn len(self) -> Result<u64, ()> {
        Ok(self.len)
    }

    fn read_bytes_at(self, offset: u64, size: u64) -> Result<&'a [u8], ()> {
        self.blocks
            .iter()
            .find_map(|(at, b)| {
                let start = offset.checked_sub(*at)?;
                let end = start.checked_add(size)?;
                b.get(usize::try_from(start).ok()?..usize::try_from(end).ok()?)
            })
            .ok_or(())
    }

    fn read_bytes_at_until(
        self,
        range: std::ops::Range<u64>,
        delimiter: u8,
    ) -> Result<&'a [u8], ()> {
        let (at, b) = self
            .blocks
            .iter()
            .find(|(at, b)| range.start >= *at && range.start - at < b.len() as u64)
            .ok_or(())?;
        let start = (range.start - at) as usize;
        let end = (range.end.min(at + b.len() as u64) - at) as usize;
        let bytes = b.get(start..end).ok_or(())?;
        let n = bytes.iter().position(|&c| c == delimiter).ok_or(())?;
        Ok(&bytes[..n])
    }
}

/// A file's device, inode, size and last change (`st_ctime` seconds and nanoseconds).
type FileStamp = (u64, u64, u64, i64, i64);

fn stamp(f: &std::fs::File) -> Option<FileStamp> {
    use std::os::unix::fs::MetadataExt;
    let m = f.metadata().ok()?;
    Some((m.dev(), m.ino(), m.size(), m.ctime(), m.ctime_nsec()))
}

/// An object's function symbols, indirect functions and FDE ranges (see [`ElfImage`]'s
/// accessors).
#[derive(Clone, Debug, Default)]
struct Symbols {
    /// Function symbols with a size, sorted by address, from `.symtab` and `.dynsym`
    /// (duplicates at the same address keep the first name seen, `.symtab` first).
    funcs: Vec<FuncSym>,
    /// Every function name as in the symbol tables, aliases included, with the index in
    /// `funcs` of its function; `names` adds the demangled ones, when first asked
    /// (demangling every name of libstdc++ took ~20 ms at each `dlopen`).
    aliases: Vec<(String, usize)>,
    names: std::sync::OnceLock<Vec<(String, usize)>>,
    ifuncs: Vec<(String, u64)>,
    fdes: Vec<(u64, u64)>,
}

impl Symbols {
    /// The symbols of `file` (with its separate debug file's, when `with_debug`).
    /// With `debug` (the image of `file`: its path, build-id and debuglink), its separate
    /// debug file's symbols too.
    fn of(file: &object::File<'_>, debug: Option<&ElfImage>) -> Symbols {
        let mut raw = raw_func_symbols(file);
        if let Some(img) = debug {
            if let Some((_, debug)) =
                find_debug_file(&img.path, img.build_id.as_deref(), img.debuglink.as_ref())
            {
                if let Ok(dfile) = object::File::parse(&*debug) {
                    // After the object's own: those win at an address (stable sort).
                    raw.extend(raw_func_symbols(&dfile));
                }
            }
        }
        let (funcs, aliases) = index_funcs(raw);
        Symbols {
            funcs,
            aliases,
            names: std::sync::OnceLock::new(),
            ifuncs: ifunc_symbols(file),
            fdes: eh_frame_fdes(file),
        }
    }
}

impl ElfImage {
    /// Read a file for its sites and symbols.
    ///
    /// The file is read, not mapped: in a traced process a mapped file that is truncated
    /// meanwhile would raise SIGBUS in the program. Its headers are read first: an object that
    /// cannot have a site (no record section, no XRay map, no symbol named as a profiling
    /// hook: libstdc++, most libraries) gets no sites, and its symbols are read from `path`
    /// only when first asked, and only if the file there still has the build-id read now
    /// (else it has none). Any other object is read and parsed whole.
    pub fn open(path: &Path) -> Result<ElfImage, ElfError> {
        let read_err = |source| ElfError::Read {
            path: path.to_owned(),
            source,
        };
        let f = std::fs::File::open(path).map_err(read_err)?;
        if let Some(parts) = Parts::of_elf(&f).map_err(read_err)? {
            return ElfImage::without_sites(path, &parts, stamp(&f));
        }
        let data = std::fs::read(path).map_err(read_err)?;
        ElfImage::parse(path, &data)
    }

    /// The image of an object that cannot have a site (what [`Parts::of_elf`] found), its
    /// symbols left for later.
    fn without_sites(
        path: &Path,
        data: &Parts,
        stamp: Option<FileStamp>,
    ) -> Result<ElfImage, ElfError> {
        use object::read::elf::FileHeader;
        let parse_err = |source| ElfError::Parse {
            path: path.to_owned(),
            source,
        };
        let hdr =
            object::elf::FileHeader64::<object::Endianness>::parse(data).map_err(parse_err)?;
        let e = hdr.endian().map_err(parse_err)?;
        if hdr.e_machine(e) != object::elf::EM_X86_64 {
            return Err(ElfError::Arch {
                path: path.to_owned(),
            });
        }
        Ok(ElfImage::without_sites_yet(
            path,
            hdr.e_type(e) == object::elf::ET_DYN,
            data,
            std::sync::OnceLock::new(),
            stamp,
        ))
    }

    /// An image of the file read through `data`, its symbols `symbols` (set, or left for
    /// later), no sites (yet).
    fn without_sites_yet<'d, R: ReadRef<'d>>(
        path: &Path,
        relocatable: bool,
        data: R,
        symbols: std::sync::OnceLock<Symbols>,
        stamp: Option<FileStamp>,
    ) -> ElfImage {
        let (build_id, build_id_svma, debuglink) = identity(data);
        ElfImage {
            path: path.to_owned(),
            relocatable,
            symbols,
            stamp,
            sites: Vec::new(),
            segments: load_segments(data),
            rejected: Vec::new(),
            build_id,
            build_id_svma,
            debuglink,
            xray: Vec::new(),
        }
    }

    /// The symbols, parsed now if they were not with the file: from the file at `path` if it
    /// still has this image's build-id (none if it cannot be read, or is another file).
    fn symbols(&self) -> &Symbols {
        self.symbols.get_or_init(|| {
            let Ok(f) = std::fs::File::open(&self.path) else {
                return Symbols::default();
            };
            // Without a build-id, the same file is the same inode, size and change time.
            if self.build_id.is_none() && (self.stamp.is_none() || stamp(&f) != self.stamp) {
                return Symbols::default();
            }
            let mut data = Vec::new();
            if std::io::Read::read_to_end(&mut &f, &mut data).is_err() {
                return Symbols::default();
            }
            let Ok(file) = object::File::parse(&*data) else {
                return Symbols::default();
            };
            if file.build_id().ok().flatten() != self.build_id.as_deref() {
                return Symbols::default();
            }
            Symbols::of(&file, None)
        })
    }

    /// Whether the symbols were parsed already (with the file, or by a first use since).
    pub fn symbols_parsed(&self) -> bool {
        self.symbols.get().is_some()
    }

    /// Function symbols with a size, sorted by address, from `.symtab` and `.dynsym`
    /// (duplicates at the same address keep the first name seen, `.symtab` first).
    pub fn funcs(&self) -> &[FuncSym] {
        &self.symbols().funcs
    }

    /// GNU indirect functions (`STT_GNU_IFUNC`, e.g. glibc's `strlen`, `memcpy`): the name
    /// and the address of the resolver, which the dynamic linker calls to pick the
    /// implementation, sorted by name. Not in [`funcs`](Self::funcs): probing the resolver
    /// would probe nothing the program calls.
    pub fn ifuncs(&self) -> &[(String, u64)] {
        &self.symbols().ifuncs
    }

    /// The code ranges of the `.eh_frame` FDEs, `(svma, len)` sorted by address: the bounds
    /// of every function (or function part, such as a `.cold` clone) compiled with unwind
    /// tables, symbol or not.
    pub fn fdes(&self) -> &[(u64, u64)] {
        &self.symbols().fdes
    }

    /// Map and parse a file for its symbols and segments only: `sites` and `rejected` stay
    /// empty (what a symbolizer needs; finding sites decodes code and costs more). The
    /// symbols of its separate debug file, if one is found, are merged into `funcs` and
    /// `names` (the object's own names first at an address). For tools outside the traced
    /// process (the CLI): the file is mapped, not copied, so a file truncated while it is
    /// parsed raises SIGBUS in the caller.
    pub fn open_symbols(path: &Path) -> Result<ElfImage, ElfError> {
        let map = crate::sys::FileMap::open(path).map_err(|source| ElfError::Read {
            path: path.to_owned(),
            source,
        })?;
        ElfImage::parse_inner(path, map.bytes(), false, true)
    }

    /// Parse file contents.
    pub fn parse(path: &Path, data: &[u8]) -> Result<ElfImage, ElfError> {
        ElfImage::parse_inner(path, data, true, false)
    }

    /// The function symbols of this object's separate debug file (see the module's doc), as
    /// an image of their own (`funcs`, `names`; no sites), or `None` when there is none or it
    /// is not this object's (another build-id, or another CRC). The file is read, not mapped.
    pub fn debug_symbols(&self) -> Option<ElfImage> {
        let (path, data) = find_debug_file(
            &self.path,
            self.build_id.as_deref(),
            self.debuglink.as_ref(),
        )?;
        ElfImage::parse_inner(&path, &data, false, false).ok()
    }

    /// The `.eh_frame` FDE whose code range holds `svma`: `(start, len)`.
    pub fn fde_at(&self, svma: u64) -> Option<(u64, u64)> {
        let fdes = self.fdes();
        let i = fdes.partition_point(|f| f.0 <= svma).checked_sub(1)?;
        let (start, len) = fdes[i];
        (svma - start < len).then_some((start, len))
    }

    fn parse_inner(
        path: &Path,
        data: &[u8],
        sites: bool,
        with_debug: bool,
    ) -> Result<ElfImage, ElfError> {
        let file = object::File::parse(data).map_err(|source| ElfError::Parse {
            path: path.to_owned(),
            source,
        })?;
        if file.architecture() != object::Architecture::X86_64 {
            return Err(ElfError::Arch {
                path: path.to_owned(),
            });
        }
        let mut img = ElfImage::without_sites_yet(
            path,
            file.kind() == object::ObjectKind::Dynamic,
            data,
            std::sync::OnceLock::new(),
            None,
        );
        let symbols = Symbols::of(&file, with_debug.then_some(&img));
        img.symbols = symbols.into();
        if sites {
            img.find_sites(&file);
        }
        Ok(img)
    }

    /// Every function name, aliases and demangled names included (`ns::K::get(int) const`
    /// and `ns::K::get` for C++, `crate::module::func` for Rust), sorted, with the index in
    /// `funcs` of its function. Made when first asked.
    pub fn names(&self) -> &[(String, usize)] {
        let sym = self.symbols();
        sym.names.get_or_init(|| {
            let mut names = sym.aliases.clone();
            names.extend(
                sym.aliases
                    .iter()
                    .flat_map(|(n, i)| demangled_names(n).into_iter().map(move |d| (d, *i))),
            );
            names.sort();
            names.dedup();
            names
        })
    }

    /// The functions called `name` (by any of their names).
    pub fn funcs_named<'a>(&'a self, name: &str) -> impl Iterator<Item = &'a FuncSym> + 'a {
        let names = self.names();
        let start = names.partition_point(|(n, _)| n.as_str() < name);
        let name = name.to_owned();
        names[start..]
            .iter()
            .take_while(move |(n, _)| *n == name)
            .map(|(_, i)| &self.funcs()[*i])
    }

    /// The function containing `svma`, with the offset into it.
    pub fn func_at(&self, svma: u64) -> Option<(usize, u64)> {
        let funcs = self.funcs();
        let i = funcs.partition_point(|f| f.svma <= svma).checked_sub(1)?;
        let f = &funcs[i];
        let off = svma - f.svma;
        (off < f.size.max(1)).then_some((i, off))
    }

    /// The file address of a file offset (`uprobe_events`' `PATH:OFFSET`), if a loadable
    /// segment maps it.
    pub fn svma_of_offset(&self, offset: u64) -> Option<u64> {
        self.segments
            .iter()
            .find(|s| offset >= s.offset && offset - s.offset < s.filesz)
            .map(|s| s.svma + (offset - s.offset))
    }

    /// Whether `svma` lies in one of the file's loadable segments.
    pub fn contains(&self, svma: u64) -> bool {
        self.segments
            .iter()
            .any(|s| svma >= s.svma && svma - s.svma < s.memsz)
    }

    fn find_sites(&mut self, file: &object::File<'_>) {
        let relative = relative_relocs(file);
        let mut recorded: Vec<(u64, SiteSource)> = Vec::new();
        for (name, source) in [
            ("__mcount_loc", SiteSource::McountLoc),
            ("__patchable_function_entries", SiteSource::PatchableEntries),
        ] {
            // A linked file may hold several sections of that name (one per input group).
            for sec in file.sections().filter(|s| s.name() == Ok(name)) {
                let Ok(bytes) = sec.data() else { continue };
                // Entries are link-time addresses. In an ET_DYN file each has an
                // R_X86_64_RELATIVE relocation whose addend is the address; GNU ld also writes
                // it in place, lld leaves the place 0.
                let base = sec.address();
                recorded.extend(
                    bytes
                        .chunks_exact(8)
                        .enumerate()
                        .map(|(i, c)| {
                            let in_place = u64::from_le_bytes(c.try_into().expect("8 bytes"));
                            relative
                                .get(&(base + 8 * i as u64))
                                .copied()
                                .unwrap_or(in_place)
                        })
                        .filter(|&a| a != 0)
                        .map(|a| (a, source)),
                );
            }
        }
        for (svma, source) in recorded {
            match self.site_at(file, svma, source) {
                Some(site) => self.sites.push(site),
                None => self.rejected.push(svma),
            }
        }
        // Functions no record section lists may still have a site (an object linked from
        // files built with and without -mrecord-mcount): decode those.
        self.find_sites_by_decoding(file);
        // Functions that still have none get their XRay entry sled.
        self.xray = xray_sleds(file, &relative);
        self.find_xray_sites(file);
        self.sites.sort_by_key(|s| s.svma);
        self.sites.dedup_by_key(|s| s.svma);
    }

    fn site_at(&self, file: &object::File<'_>, svma: u64, source: SiteSource) -> Option<SiteInfo> {
        let (func, off) = self.func_at(svma)?;
        let f = &self.funcs()[func];
        let code = bytes_at(file, f.svma, (off + 8).max(16))?;
        let kind = sites::classify(code.get(off as usize..)?)?;
        let place = sites::place_of(code, off)?;
        Some(SiteInfo {
            svma,
            kind,
            place,
            source,
            func,
        })
    }

    /// An XRay entry sled becomes the ftrace site of a function that has no other site.
    /// Sleds the XRay runtime has already patched (bytes not a sled) are left out.
    fn find_xray_sites(&mut self, file: &object::File<'_>) {
        let mut covered: Vec<usize> = self.sites.iter().map(|s| s.func).collect();
        covered.sort_unstable();
        let mut found = Vec::new();
        for sled in self.xray.iter().filter(|s| s.kind.is_entry()) {
            let Some((func, off)) = self.func_at(sled.svma) else {
                continue;
            };
            if covered.binary_search(&func).is_ok() {
                continue;
            }
            let f = &self.funcs()[func];
            let Some(code) = bytes_at(file, f.svma, off + sites::XRAY_SLED_LEN) else {
                continue;
            };
            if sites::classify(code.get(off as usize..).unwrap_or(&[])) != Some(SiteKind::XraySled)
            {
                self.rejected.push(sled.svma);
                continue;
            }
            // At the function's start, or after its endbr64 (-fcf-protection): the caller's
            // return address is at the top of the stack.
            let Some(place @ (SitePlace::Entry | SitePlace::AfterEndbr)) =
                sites::place_of(code, off)
            else {
                self.rejected.push(sled.svma);
                continue;
            };
            found.push(SiteInfo {
                svma: sled.svma,
                kind: SiteKind::XraySled,
                place,
                source: SiteSource::Xray,
                func,
            });
        }
        // One site per function, the first entry sled.
        found.sort_by_key(|s| (s.func, s.svma));
        found.dedup_by_key(|s| s.func);
        self.sites.extend(found);
    }

    /// The number of XRay entry and exit (return and tail) sleds of the function that starts
    /// at `func_svma`.
    pub fn xray_counts(&self, func_svma: u64) -> (usize, usize) {
        self.xray
            .iter()
            .filter(|s| s.func_svma == func_svma)
            .fold((0, 0), |(e, x), s| {
                (
                    e + s.kind.is_entry() as usize,
                    x + s.kind.is_exit() as usize,
                )
            })
    }

    fn find_sites_by_decoding(&mut self, file: &object::File<'_>) {
        let got_names = got_slot_names(file);
        // A decoded site is a call to the hook: through a GOT slot or a PLT entry (both named
        // by the GOT slot's symbol) or to a local hook function. An object with none of these
        // (libstdc++, most libraries) has no such call, and its thousands of functions are not
        // decoded (~30 ms for libstdc++ at each `dlopen`).
        if !got_names.values().any(|n| sites::is_hook_name(n))
            && !self.funcs().iter().any(|f| sites::is_hook_name(&f.name))
        {
            return;
        }
        let plt: Vec<(u64, &[u8])> = file
            .sections()
            .filter(|s| s.name().is_ok_and(|n| n.starts_with(".plt")))
            .filter_map(|s| Some((s.address(), s.data().ok()?)))
            .collect();
        let hook_syms: Vec<u64> = self
            .funcs()
            .iter()
            .filter(|f| sites::is_hook_name(&f.name))
            .map(|f| f.svma)
            .collect();
        let is_hook = |t: CallTarget| match t {
            CallTarget::Got(slot) => got_names.get(&slot).is_some_and(|n| sites::is_hook_name(n)),
            CallTarget::Direct(addr) => {
                hook_syms.contains(&addr)
                    || plt.iter().any(|&(start, data)| {
                        let Some(code) =
                            addr.checked_sub(start).and_then(|o| data.get(o as usize..))
                        else {
                            return false;
                        };
                        sites::plt_entry_got_slot(code, addr)
                            .and_then(|slot| got_names.get(&slot))
                            .is_some_and(|n| sites::is_hook_name(n))
                    })
            }
        };
        let mut covered: Vec<usize> = self.sites.iter().map(|s| s.func).collect();
        covered.sort_unstable();
        let mut found = Vec::new();
        for (i, f) in self.funcs().iter().enumerate() {
            if covered.binary_search(&i).is_ok() {
                continue;
            }
            let Some(code) = bytes_at(file, f.svma, f.size.min(sites::DECODE_WINDOW as u64 + 8))
            else {
                continue;
            };
            if let Some((off, kind, place)) = sites::find_by_decoding(code, f.svma, is_hook) {
                found.push(SiteInfo {
                    svma: f.svma + off,
                    kind,
                    place,
                    source: SiteSource::Decoded,
                    func: i,
                });
            }
        }
        self.sites.extend(found);
    }
}

/// Up to `len` bytes of section contents at file address `svma`.
fn bytes_at<'d>(file: &object::File<'d>, svma: u64, len: u64) -> Option<&'d [u8]> {
    file.sections().find_map(|s| {
        let off = svma.checked_sub(s.address())?;
        if off >= s.size() {
            return None;
        }
        let data = s.data().ok()?;
        let end = (off + len).min(data.len() as u64);
        data.get(off as usize..end as usize)
    })
}

/// Size of one `xray_instr_map` entry on 64-bit targets (LLVM's `XRaySledEntry`).
const XRAY_ENTRY_LEN: usize = 32;

/// The sleds of every `xray_instr_map` section of `file`, sorted by address. An entry is
/// `{address: u64, function: u64, kind: u8, always_instrument: u8, version: u8, pad[13]}`.
/// Version 2 (clang >= 12) stores each address relative to the field that holds it, so a PIE
/// map needs no relocation; versions 0 and 1 store absolute addresses, which in an `ET_DYN`
/// file are `R_X86_64_RELATIVE` addends (`relative`: place -> addend; GNU ld also writes them
/// in place, lld leaves 0).
fn xray_sleds(file: &object::File<'_>, relative: &HashMap<u64, u64>) -> Vec<XraySled> {
    let mut out = Vec::new();
    for sec in file.sections().filter(|s| s.name() == Ok("xray_instr_map")) {
        let Ok(bytes) = sec.data() else { continue };
        let base = sec.address();
        for (i, e) in bytes.chunks_exact(XRAY_ENTRY_LEN).enumerate() {
            let at = base + (i * XRAY_ENTRY_LEN) as u64;
            let word = |o: usize| u64::from_le_bytes(e[o..o + 8].try_into().expect("8 bytes"));
            let version = e[18];
            let (svma, func_svma) = if version >= 2 {
                (at.wrapping_add(word(0)), (at + 8).wrapping_add(word(8)))
            } else {
                let abs = |o: usize| relative.get(&(at + o as u64)).copied().unwrap_or(word(o));
                (abs(0), abs(8))
            };
            if svma == 0 {
                continue;
            }
            out.push(XraySled {
                svma,
                func_svma,
                kind: XrayKind::from_byte(e[16]),
                version,
            });
        }
    }
    out.sort_by_key(|s| s.svma);
    out
}

/// Every function symbol of `file`, `.symtab` first, then `.dynsym`.
fn raw_func_symbols(file: &object::File<'_>) -> Vec<FuncSym> {
    file.symbols()
        .chain(file.dynamic_symbols())
        .filter(|s| s.kind() == SymbolKind::Text && s.is_definition() && s.address() != 0)
        .filter_map(|s| {
            let name = s.name().ok()?;
            (!name.is_empty()).then(|| FuncSym {
                name: name.split("@@").next().unwrap_or(name).to_owned(),
                svma: s.address(),
                size: s.size(),
            })
        })
        .collect()
}

/// Function symbols, one per address (the first name seen in `raw`), and every name
/// (aliases included: glibc's `printf` is `_IO_printf`'s) with the index of its function.
fn index_funcs(mut funcs: Vec<FuncSym>) -> (Vec<FuncSym>, Vec<(String, usize)>) {
    // Stable: .symtab entries come first and win at equal addresses.
    funcs.sort_by_key(|f| f.svma);
    let all = funcs.clone();
    funcs.dedup_by_key(|f| f.svma);
    let names: Vec<(String, usize)> = all
        .into_iter()
        .map(|f| {
            let i = funcs.partition_point(|g| g.svma < f.svma);
            (f.name, i)
        })
        .collect();
    (funcs, names)
}

/// The code ranges `(svma, len)` of the FDEs in `file`'s `.eh_frame`, sorted. Empty when it
/// has none (or only a `NOBITS` placeholder, as in a separate debug file).
fn eh_frame_fdes(file: &object::File<'_>) -> Vec<(u64, u64)> {
    use gimli::{BaseAddresses, CieOrFde, EhFrame, LittleEndian, UnwindSection};
    let Some(sec) = file.section_by_name(".eh_frame") else {
        return Vec::new();
    };
    let Ok(data) = sec.data() else {
        return Vec::new();
    };
    let mut eh = EhFrame::new(data, LittleEndian);
    eh.set_address_size(8);
    // Pointer encodings may be relative to these sections (pcrel is the usual one).
    let mut bases = BaseAddresses::default().set_eh_frame(sec.address());
    for (name, set) in [
        (
            ".eh_frame_hdr",
            BaseAddresses::set_eh_frame_hdr as fn(_, _) -> _,
        ),
        (".text", BaseAddresses::set_text),
        (".got", BaseAddresses::set_got),
    ] {
        if let Some(s) = file.section_by_name(name) {
            bases = set(bases, s.address());
        }
    }
    let mut out = Vec::new();
    let mut entries = eh.entries(&bases);
    // A malformed entry ends the walk: the FDEs before it still hold.
    while let Ok(Some(entry)) = entries.next() {
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        if let Ok(fde) =
            partial.parse(|section, bases, offset| section.cie_from_offset(bases, offset))
        {
            if fde.len() > 0 && fde.initial_address() != 0 {
                out.push((fde.initial_address(), fde.len()));
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// Where separate debug files are looked for (gdb's `debug-file-directory`):
/// `$FTPROBE_DEBUG_DIR` when set (empty: nowhere), else `/usr/lib/debug`.
pub fn debug_dir() -> Option<PathBuf> {
    match std::env::var_os("FTPROBE_DEBUG_DIR") {
        Some(d) if d.is_empty() => None,
        Some(d) => Some(PathBuf::from(d)),
        None => Some(PathBuf::from("/usr/lib/debug")),
    }
}

/// A file's identity (device, inode): which paths name the same file. Not `canonicalize`:
/// glibc's `realpath` calls the C library's `malloc`, which the agent never does.
pub(crate) fn file_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// The separate debug file of the object at `path` and its contents: by build-id first
/// (`<dir>/.build-id/xx/yyyy.debug`), then by `.gnu_debuglink` name (next to the object, in
/// its `.debug/`, under `<dir>/<object's directory>/`). A candidate counts only if it is
/// this object's: the same build-id when the object has one, else the CRC-32 the link gives.
fn find_debug_file(
    path: &Path,
    build_id: Option<&[u8]>,
    debuglink: Option<&(String, u32)>,
) -> Option<(PathBuf, Vec<u8>)> {
    find_debug_file_in(&debug_dir()?, path, build_id, debuglink)
}

/// [`find_debug_file`] under the debug directory `dir`.
fn find_debug_file_in(
    dir: &Path,
    path: &Path,
    build_id: Option<&[u8]>,
    debuglink: Option<&(String, u32)>,
) -> Option<(PathBuf, Vec<u8>)> {
    let mut candidates = Vec::new();
    if let Some(id) = build_id.filter(|id| id.len() >= 2) {
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        candidates.push(
            dir.join(".build-id")
                .join(&hex[..2])
                .join(format!("{}.debug", &hex[2..])),
        );
    }
    if let Some((name, _)) = debuglink {
        let obj_dir = path.parent().unwrap_or(Path::new("/"));
        candidates.push(obj_dir.join(name));
        candidates.push(obj_dir.join(".debug").join(name));
        let rel = obj_dir.strip_prefix("/").unwrap_or(obj_dir);
        candidates.push(dir.join(rel).join(name));
    }
    let itself = file_id(path);
    candidates.into_iter().find_map(|c| {
        if !c.is_file() || file_id(&c) == itself {
            return None;
        }
        let data = std::fs::read(&c).ok()?;
        let ours = match (build_id, debuglink) {
            (Some(id), _) => object::File::parse(&*data)
                .ok()
                .and_then(|f| f.build_id().ok().flatten().map(|b| b == id))
                .unwrap_or(false),
            (None, Some((_, crc))) => crc32fast::hash(&data) == *crc,
            (None, None) => false,
        };
        ours.then_some((c, data))
    })
}

/// The `STT_GNU_IFUNC` symbols of `file` (name, resolver address), sorted by name.
fn ifunc_symbols(file: &object::File<'_>) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = file
        .symbols()
        .chain(file.dynamic_symbols())
        .filter(|s| {
            // Not `is_definition()`: the object crate gives IFUNCs no kind, and only
            // symbols with a kind count as definitions there.
            !s.is_undefined()
                && s.address() != 0
                && matches!(s.flags(), object::SymbolFlags::Elf { st_info, .. }
                    if st_info & 0xf == object::elf::STT_GNU_IFUNC)
        })
        .filter_map(|s| Some((s.name().ok()?.to_owned(), s.address())))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Place -> addend of every R_X86_64_RELATIVE dynamic relocation.
fn relative_relocs(file: &object::File<'_>) -> HashMap<u64, u64> {
    let Some(relocs) = file.dynamic_relocations() else {
        return HashMap::new();
    };
    relocs
        .filter(|(_, r)| {
            r.flags()
                == RelocationFlags::Elf {
                    r_type: object::elf::R_X86_64_RELATIVE,
                }
        })
        .map(|(off, r)| (off, r.addend() as u64))
        .collect()
}

/// GOT slot address -> name of the symbol the dynamic linker writes there.
fn got_slot_names(file: &object::File<'_>) -> HashMap<u64, String> {
    let mut names = HashMap::new();
    let Some(relocs) = file.dynamic_relocations() else {
        return names;
    };
    for (offset, reloc) in relocs {
        let RelocationFlags::Elf { r_type } = reloc.flags() else {
            continue;
        };
        if r_type != R_X86_64_GLOB_DAT && r_type != R_X86_64_JUMP_SLOT {
            continue;
        }
        let RelocationTarget::Symbol(idx) = reloc.target() else {
            continue;
        };
        let Some(name) = file
            .dynamic_symbol_table()
            .and_then(|t| t.symbol_by_index(idx).ok())
            .and_then(|s| s.name().ok().map(str::to_owned))
        else {
            continue;
        };
        names.insert(offset, name);
    }
    names
}

/// One SDT marker (a USDT static tracepoint, systemtap's `<sys/sdt.h>` `STAP_PROBE*`): an
/// `NT_STAPSDT` note of the `.note.stapsdt` section. Format (systemtap's "UserSpaceProbe
/// Implementation" notes): note name `stapsdt`, type 3; descriptor: three address-sized
/// words (the marker's `nop`, the link-time address of the `.stapsdt.base` section, the
/// semaphore or 0), then the NUL-terminated provider, name and argument strings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SdtNote {
    /// The provider (`libc`).
    pub provider: String,
    /// The marker's name (`setjmp`).
    pub name: String,
    /// The address of the marker's `nop` in the file, adjusted by the difference between
    /// the `.stapsdt.base` section's address and the note's recorded base (an object
    /// prelinked after the notes were written moved both).
    pub pc: u64,
    /// The address of the marker's 16-bit semaphore in the file (adjusted as `pc`), 0 when
    /// it has none.
    pub semaphore: u64,
    /// The arguments as the assembler operands the note gives (`-4@%edi 8@-8(%rbp)`),
    /// separated by spaces; empty for none.
    pub args: String,
}

/// The note type of an SDT marker (`NT_STAPSDT`, sys/sdt.h `_SDT_NOTE_TYPE`).
pub const NT_STAPSDT: u32 = 3;

/// The SDT markers of an ELF file, in note order (a marker inlined at several places has a
/// note for each copy). A file without `.note.stapsdt` has none.
pub fn sdt_notes(data: &[u8]) -> Result<Vec<SdtNote>, String> {
    use object::read::elf::{FileHeader, SectionHeader};
    use object::Endian;
    let hdr =
        object::elf::FileHeader64::<object::Endianness>::parse(data).map_err(|e| e.to_string())?;
    let endian = hdr.endian().map_err(|e| e.to_string())?;
    let sections = hdr.sections(endian, data).map_err(|e| e.to_string())?;
    let base = sections
        .section_by_name(endian, b".stapsdt.base")
        .map(|(_, s)| s.sh_addr(endian));
    let mut out = Vec::new();
    for s in sections.iter() {
        if sections
            .section_name(endian, s)
            .map_err(|e| e.to_string())?
            != b".note.stapsdt"
        {
            continue;
        }
        let Some(mut notes) = s.notes(endian, data).map_err(|e| e.to_string())? else {
            continue;
        };
        while let Some(n) = notes.next().map_err(|e| e.to_string())? {
            if n.name() != b"stapsdt" || n.n_type(endian) != NT_STAPSDT {
                continue;
            }
            let desc = n.desc();
            let word = |i: usize| -> Option<u64> {
                let b = desc.get(i * 8..i * 8 + 8)?;
                let b: [u8; 8] = b.try_into().ok()?;
                Some(if endian.is_little_endian() {
                    u64::from_le_bytes(b)
                } else {
                    u64::from_be_bytes(b)
                })
            };
            let (Some(mut pc), Some(note_base), Some(mut semaphore)) = (word(0), word(1), word(2))
            else {
                return Err("SDT note shorter than its three addresses".into());
            };
            let mut strings = desc[24..].split(|&b| b == 0);
            let mut next = || {
                strings
                    .next()
                    .map(|b| String::from_utf8_lossy(b).into_owned())
            };
            let (Some(provider), Some(name)) = (next(), next()) else {
                return Err("SDT note without provider and name".into());
            };
            let args = next().unwrap_or_default();
            if let Some(base) = base {
                let delta = base.wrapping_sub(note_base);
                pc = pc.wrapping_add(delta);
                if semaphore != 0 {
                    semaphore = semaphore.wrapping_add(delta);
                }
            }
            out.push(SdtNote {
                provider,
                name,
                pc,
                semaphore,
                args,
            });
        }
    }
    Ok(out)
}

/// The file offset of address `svma` of a file with loadable segments `segments`, when a
/// segment has its byte in the file.
pub fn offset_of_svma(segments: &[Segment], svma: u64) -> Option<u64> {
    segments
        .iter()
        .find(|s| svma >= s.svma && svma - s.svma < s.filesz)
        .map(|s| s.offset + (svma - s.svma))
}

/// The loadable segments of an ELF file (see [`Segment`]).
pub fn segments_of(data: &[u8]) -> Vec<Segment> {
    load_segments(data)
}

/// The build-id note's bytes (the first `NT_GNU_BUILD_ID` note of a note section) and where
/// they are when the note is the `.note.gnu.build-id` section's (the descriptor, after the
/// note's 12-byte header and its name `GNU\0`), and the `.gnu_debuglink` (the debug file's
/// name, then at the next multiple of 4 the CRC-32 of its contents).
#[allow(clippy::type_complexity)]
fn identity<'d, R: ReadRef<'d>>(data: R) -> (Option<Vec<u8>>, Option<u64>, Option<(String, u32)>) {
    use object::read::elf::{FileHeader, SectionHeader};
    let none = (None, None, None);
    let Ok(hdr) = object::elf::FileHeader64::<object::Endianness>::parse(data) else {
        return none;
    };
    let Ok(e) = hdr.endian() else { return none };
    let Ok(sections) = hdr.sections(e, data) else {
        return none;
    };
    let mut build_id = None;
    let mut build_id_svma = None;
    'notes: for s in sections.iter() {
        let Ok(Some(mut notes)) = s.notes(e, data) else {
            continue;
        };
        while let Ok(Some(note)) = notes.next() {
            if note.name() == object::elf::ELF_NOTE_GNU
                && note.n_type(e) == object::elf::NT_GNU_BUILD_ID
            {
                let id = note.desc().to_vec();
                let in_section = sections.section_name(e, s) == Ok(b".note.gnu.build-id")
                    && s.data(e, data).ok().and_then(|d| d.get(16..)) == Some(&id[..]);
                build_id_svma = in_section.then(|| s.sh_addr(e) + 16);
                build_id = Some(id);
                break 'notes;
            }
        }
    }
    let debuglink = sections
        .section_by_name(e, b".gnu_debuglink")
        .and_then(|(_, s)| s.data(e, data).ok())
        .and_then(|d| {
            let n = d.iter().position(|&c| c == 0)?;
            let at = (n + 1).next_multiple_of(4);
            let crc = u32::from_le_bytes(d.get(at..at + 4)?.try_into().ok()?);
            Some((String::from_utf8_lossy(&d[..n]).into_owned(), crc))
        });
    (build_id, build_id_svma, debuglink)
}

fn load_segments<'d, R: object::ReadRef<'d>>(data: R) -> Vec<Segment> {
    use object::read::elf::{FileHeader, ProgramHeader};
    let Ok(hdr) = object::elf::FileHeader64::<object::Endianness>::parse(data) else {
        return Vec::new();
    };
    let Ok(endian) = hdr.endian() else {
        return Vec::new();
    };
    let Ok(phdrs) = hdr.program_headers(endian, data) else {
        return Vec::new();
    };
    phdrs
        .iter()
        .filter(|p| p.p_type(endian) == object::elf::PT_LOAD)
        .map(|p| Segment {
            svma: p.p_vaddr(endian),
            memsz: p.p_memsz(endian),
            exec: p.p_flags(endian) & object::elf::PF_X != 0,
            writable: p.p_flags(endian) & object::elf::PF_W != 0,
            offset: p.p_offset(endian),
            filesz: p.p_filesz(endian),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{find_debug_file_in, ElfImage};
    use std::path::Path;

    const LIBC: &str = "/lib/x86_64-linux-gnu/libc.so.6";

    /// ftrace::init dereferenced addresses taken from the file on disk before checking them
    /// against what is mapped (a library replaced since it was loaded). It now first compares
    /// the build-id note in memory, at `build_id_svma`, with the file's: equal for libc as
    /// loaded, different for another file at the same address.
    #[test]
    fn build_id_in_memory_tells_the_loaded_file_from_another() {
        let objs = crate::process::loaded_objects();
        let libc = objs
            .iter()
            .find(|o| o.path.to_string_lossy().contains("libc.so"))
            .expect("libc is loaded");
        let read = |img: &ElfImage| {
            let id = img.build_id.as_ref().expect("a build-id");
            let at = img.build_id_svma.expect("its address");
            let mut mem = vec![0u8; id.len()];
            let n = crate::sys::read_nofault(at + libc.bias, &mut mem);
            (n == id.len() && mem == *id, id.clone())
        };
        let img = ElfImage::open(&libc.path).unwrap();
        let (same, id) = read(&img);
        assert!(same, "libc's build-id is in memory where its note says");
        // Another file with a build-id (the dynamic loader), as if it had replaced libc.
        let other = objs
            .iter()
            .find(|o| o.path.to_string_lossy().contains("ld-linux"))
            .expect("the dynamic loader is loaded");
        let other = ElfImage::open(&other.path).unwrap();
        assert_ne!(other.build_id.as_ref(), Some(&id));
        let at = other.build_id_svma.expect("its address");
        let mut mem = vec![0u8; other.build_id.as_ref().unwrap().len()];
        let n = crate::sys::read_nofault(at + libc.bias, &mut mem);
        assert!(
            n != mem.len() || Some(&mem) != other.build_id.as_ref(),
            "another file's build-id is not what libc's mapping holds there"
        );
    }

    /// An object that cannot have a site (libm: no record section, no hook's name) is read
    /// only as far as its headers and string tables, with the build-id and segments a whole
    /// read gives; its symbols are read when first asked and equal a whole parse's. libc,
    /// which defines `mcount`, is read whole at once.
    #[test]
    fn an_object_without_sites_has_its_symbols_read_when_first_asked() {
        let libm = Path::new("/lib/x86_64-linux-gnu/libm.so.6");
        let data = std::fs::read(libm).unwrap();
        let whole = ElfImage::parse(libm, &data).unwrap();
        let img = ElfImage::open(libm).unwrap();
        assert!(!img.symbols_parsed());
        assert!(img.sites.is_empty() && whole.sites.is_empty());
        assert_eq!(img.build_id, whole.build_id);
        assert_eq!(img.build_id_svma, whole.build_id_svma);
        assert_eq!(img.debuglink, whole.debuglink);
        assert_eq!(img.relocatable, whole.relocatable);
        assert_eq!(img.segments.len(), whole.segments.len());
        for (a, b) in img.segments.iter().zip(&whole.segments) {
            assert_eq!(
                (a.svma, a.memsz, a.offset, a.filesz),
                (b.svma, b.memsz, b.offset, b.filesz)
            );
            assert_eq!((a.exec, a.writable), (b.exec, b.writable));
        }
        assert!(whole.funcs().len() > 100, "{}", whole.funcs().len());
        assert_eq!(img.funcs(), whole.funcs());
        assert!(img.symbols_parsed());
        assert_eq!(img.fdes(), whole.fdes());
        assert_eq!(img.ifuncs(), whole.ifuncs());
        assert_eq!(img.names(), whole.names());
        assert!(ElfImage::open(Path::new(LIBC)).unwrap().symbols_parsed());
    }

    /// Symbols read later come from the same file or not at all: a file replaced by another
    /// object (another build-id) after its headers were read gives no symbols.
    #[test]
    fn symbols_read_later_are_only_the_same_files() {
        let dir = std::env::temp_dir().join(format!("ftprobe-elf-lazy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let at = dir.join("libm.so.6");
        std::fs::copy("/lib/x86_64-linux-gnu/libm.so.6", &at).unwrap();
        let img = ElfImage::open(&at).unwrap();
        assert!(!img.symbols_parsed());
        let other = dir.join("other");
        std::fs::copy("/lib/x86_64-linux-gnu/libdl.so.2", &other).unwrap();
        std::fs::rename(&other, &at).unwrap();
        assert!(img.funcs().is_empty());
        assert!(img.fdes().is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The FDE of a compiled C function covers exactly its symbol's range.
    #[test]
    fn fde_bounds_match_symbol_sizes() {
        let img = ElfImage::open(Path::new(LIBC)).unwrap();
        assert!(img.fdes().len() > 1000, "{}", img.fdes().len());
        for name in ["malloc", "qsort_r", "strtol"] {
            let f = img.funcs_named(name).next().unwrap();
            assert!(f.size > 0, "{name}");
            assert_eq!(img.fde_at(f.svma), Some((f.svma, f.size)), "{name}");
            assert_eq!(img.fde_at(f.svma + f.size - 1), Some((f.svma, f.size)));
            assert_ne!(img.fde_at(f.svma + f.size).map(|x| x.0), Some(f.svma));
        }
    }

    /// A debug file is found at `<dir>/.build-id/xx/yyyy.debug` only when its build-id is the
    /// object's.
    #[test]
    fn debug_file_by_build_id_must_have_the_same_build_id() {
        let img = ElfImage::open(Path::new(LIBC)).unwrap();
        let id = img.build_id.clone().expect("Debian's libc has a build-id");
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        let dir = std::env::temp_dir().join(format!("ftprobe-elf-debug-{}", std::process::id()));
        let sub = dir.join(".build-id").join(&hex[..2]);
        std::fs::create_dir_all(&sub).unwrap();
        let at = sub.join(format!("{}.debug", &hex[2..]));
        // Another object's file there: refused.
        std::fs::copy("/proc/self/exe", &at).unwrap();
        assert!(find_debug_file_in(&dir, Path::new(LIBC), Some(&id), None).is_none());
        // A file with the same build-id (a copy of the object: its symbols stand in for a
        // debug file's): found.
        std::fs::copy(LIBC, &at).unwrap();
        let found = find_debug_file_in(&dir, Path::new(LIBC), Some(&id), None);
        assert_eq!(found.map(|f| f.0), Some(at.clone()));
        // Nothing under another directory.
        let empty = dir.join("empty");
        std::fs::create_dir_all(&empty).unwrap();
        assert!(find_debug_file_in(&empty, Path::new(LIBC), Some(&id), None).is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Without a build-id, the `.gnu_debuglink` name is looked for next to the object, and
    /// the file counts only if its CRC-32 is the one the link gives.
    #[test]
    fn debug_file_by_debuglink_must_have_the_crc() {
        let dir = std::env::temp_dir().join(format!("ftprobe-elf-link-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (prog, dbg) = (dir.join("prog"), dir.join("prog.dbg"));
        let objcopy = |args: &[&std::ffi::OsStr]| {
            std::process::Command::new("objcopy")
                .args(args)
                .status()
                .is_ok_and(|s| s.success())
        };
        let ok = objcopy(&[
            "--remove-section=.note.gnu.build-id".as_ref(),
            "--remove-section=.gnu_debuglink".as_ref(),
            "/bin/true".as_ref(),
            prog.as_os_str(),
        ]) && std::fs::copy(&prog, &dbg).is_ok()
            && objcopy(&[
                format!("--add-gnu-debuglink={}", dbg.display()).as_ref(),
                prog.as_os_str(),
            ]);
        if !ok {
            eprintln!("skipped: objcopy is not installed");
            return;
        }
        let img = ElfImage::open(&prog).unwrap();
        assert_eq!(img.build_id, None);
        let link = img.debuglink.clone().expect("a debuglink");
        assert_eq!(link.0, "prog.dbg");
        let nowhere = dir.join("nowhere");
        let found = find_debug_file_in(&nowhere, &prog, None, Some(&link));
        assert_eq!(found.map(|f| f.0), Some(dbg.clone()));
        // Another file of that name: refused.
        std::fs::write(&dbg, b"not the debug file").unwrap();
        assert!(find_debug_file_in(&nowhere, &prog, None, Some(&link)).is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
