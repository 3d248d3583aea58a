//! The object, symbol and code-area services of the loaded objects ftrace looked at, used by
//! kprobes (int3 probes need no site): functions by name or address, indirect functions,
//! file offsets, executable memory near an address, writable code.

use super::*;

/// A function symbol of a loaded object, at its address in this process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SymbolAddr {
    /// Name as in the symbol table.
    pub name: String,
    /// File name of the object.
    pub module: String,
    /// Address in this process.
    pub addr: u64,
    /// Size in bytes (0 if the symbol table does not say).
    pub size: u64,
}

/// Whether `module` names the object whose file name is `file`: the file name itself, a path
/// ending in it, or one of [`glob::module_names`] (`libc`, `libc.so` for `libc.so.6`).
pub fn module_matches(module: &str, file: &str) -> bool {
    let module = module.rsplit('/').next().unwrap_or(module);
    glob::module_names(file).any(|n| n == module)
}

/// Every function called `name`, by any of its names (in the object `module`, if given),
/// among the objects ftrace looked at; `NoObject` if `module` names none of them.
///
/// The objects' own symbol tables are searched first; only when no object has the name
/// there, their separate debug files (`libc6-dbg` for libc's internal functions such as
/// `_int_malloc`). A symbol without a size gets its FDE's.
pub fn find_symbol(module: Option<&str>, name: &str) -> Result<Vec<SymbolAddr>, FtraceError> {
    // Objects where `name` is a GNU indirect function: resolved below, without the lock.
    let mut ifuncs: Vec<(u64, String)> = Vec::new();
    let mut found: Vec<SymbolAddr> = {
        let mut g = lock();
        let st = g.as_mut().ok_or(FtraceError::NotInitialized)?;
        let mut found: Vec<SymbolAddr> = st
            .objects
            .iter()
            .filter(|o| !o.gone && module.is_none_or(|m| module_matches(m, &o.module)))
            .flat_map(|o| {
                let resolver = o.image.ifuncs().iter().find(|(n, _)| n == name);
                let ifunc = resolver.is_some();
                if let Some((_, svma)) = resolver {
                    // The IFUNC is the default version programs bind to; a plain function of
                    // the same name is an old compatibility version (glibc's memcpy@GLIBC_2.2.5).
                    ifuncs.push((svma + o.bias, o.module.clone()));
                }
                o.image
                    .funcs_named(name)
                    .filter(move |_| !ifunc)
                    .map(|f| SymbolAddr {
                        name: f.name.clone(),
                        module: o.module.clone(),
                        addr: f.svma + o.bias,
                        size: o.size_of(f.svma, f.size),
                    })
            })
            .collect();
        if found.is_empty() && ifuncs.is_empty() {
            for o in st
                .objects
                .iter_mut()
                .filter(|o| !o.gone && module.is_none_or(|m| module_matches(m, &o.module)))
            {
                let Some(debug) = o.debug() else { continue };
                let funcs: Vec<(String, u64, u64)> = debug
                    .funcs_named(name)
                    .map(|f| (f.name.clone(), f.svma, f.size))
                    .collect();
                for (sym, svma, size) in funcs {
                    found.push(SymbolAddr {
                        name: sym,
                        module: o.module.clone(),
                        addr: svma + o.bias,
                        size: o.size_of(svma, size),
                    });
                }
            }
        }
        found
    };
    for (resolver, module) in ifuncs {
        let Some(addr) = resolve_ifunc(resolver) else {
            continue;
        };
        let mut g = lock();
        let Some(st) = g.as_mut() else { continue };
        // The implementation, by its own name where the library or its debug file has one,
        // else by the IFUNC's, with its FDE's size (remembered, for `symbol_at`).
        found.push(match lookup(st, addr, false) {
            Some((sym, 0)) => sym,
            _ => {
                let size = lookup(st, addr, true)
                    .filter(|(_, off)| *off == 0)
                    .map_or(0, |(s, _)| s.size);
                let sym = SymbolAddr {
                    name: name.to_owned(),
                    module,
                    addr,
                    size,
                };
                if !st.ifunc_impls.iter().any(|s| s.addr == addr) {
                    st.ifunc_impls.push(sym.clone());
                }
                sym
            }
        });
    }
    Ok(found)
}

/// The implementation of an indirect function, from its resolver at `resolver` (an address
/// in this process): called as the dynamic linker calls it on x86-64, with no argument
/// (glibc's `elf_ifunc_invoke`, which `dlsym` runs too). Not through `dlopen(RTLD_NOLOAD)` +
/// `dlsym`: for a library that was never `dlopen`ed, glibc builds its search list then, with
/// the program's `malloc`, which the agent never calls.
fn resolve_ifunc(resolver: u64) -> Option<u64> {
    // SAFETY: `resolver` is the STT_GNU_IFUNC symbol's value plus its object's load bias: the
    // function the dynamic linker called for this symbol at relocation, with the same (empty)
    // argument list; resolvers only read CPU features and return an address.
    let addr = unsafe { std::mem::transmute::<usize, extern "C" fn() -> u64>(resolver as usize)() };
    (addr != 0).then_some(addr)
}

/// The address in this process of `offset` bytes into the file of the loaded object at
/// `path` (matched as the same file, else by file name): the `uprobe_events` `PATH:OFFSET`
/// form. `NoSite` if no loaded object is that file or no segment maps the offset.
pub fn addr_of_file_offset(path: &str, offset: u64) -> Result<u64, FtraceError> {
    addr_of_offset_in(path, offset, |_| true)
}

/// The address in this process of file offset `offset` of loaded object `path`, in a
/// writable segment: where a uprobe's reference counter (an SDT marker's semaphore, the
/// kernel's `ref_ctr_offset`) is. Errors as [`addr_of_file_offset`], and
/// [`FtraceError::NoSite`] for an offset outside every writable segment.
pub fn data_addr_of_file_offset(path: &str, offset: u64) -> Result<u64, FtraceError> {
    addr_of_offset_in(path, offset, |s| s.writable)
}

fn addr_of_offset_in(
    path: &str,
    offset: u64,
    seg_ok: impl Fn(&crate::elf::Segment) -> bool,
) -> Result<u64, FtraceError> {
    let g = lock();
    let st = g.as_ref().ok_or(FtraceError::NotInitialized)?;
    // The same file by device and inode.
    let file_id = crate::elf::file_id;
    let want = file_id(std::path::Path::new(path));
    let o = st
        .objects
        .iter()
        .find(|o| !o.gone && want.is_some() && file_id(&o.image.path) == want)
        .or_else(|| {
            st.objects
                .iter()
                .find(|o| !o.gone && module_matches(path, &o.module))
        })
        .ok_or(FtraceError::NoSite(offset))?;
    let svma = o
        .image
        .segments
        .iter()
        .find(|s| seg_ok(s) && offset >= s.offset && offset - s.offset < s.filesz)
        .map(|s| s.svma + (offset - s.offset))
        .ok_or(FtraceError::NoSite(offset))?;
    Ok(svma + o.bias)
}

/// Whether the `:mod:` part of filter pattern `e` names a loaded object (true for a pattern
/// without one): a `:mod:` filter of an object not loaded selects nothing until it is.
pub fn filter_module_loaded(e: &crate::ftrace::glob::FilterEntry) -> bool {
    if !e.names_a_module() {
        return true;
    }
    let g = lock();
    g.as_ref().is_some_and(|st| {
        st.objects
            .iter()
            .any(|o| !o.gone && e.matches_module(&o.module))
    })
}

/// Whether an object that `module` names is loaded (see [`module_matches`]).
pub fn has_module(module: &str) -> bool {
    let g = lock();
    g.as_ref().is_some_and(|st| {
        st.objects
            .iter()
            .any(|o| !o.gone && module_matches(module, &o.module))
    })
}

/// The function containing `addr`, with the offset into it: from the object's symbols, its
/// debug file's, or (in a stripped object) the bounds of the `.eh_frame` FDE covering it,
/// named `module+0xSTART` (see `Object::function_at`).
pub fn symbol_at(addr: u64) -> Option<(SymbolAddr, u64)> {
    let mut g = lock();
    let st = g.as_mut()?;
    lookup(st, addr, true)
}

/// [`symbol_at`] among unloaded objects too (a loaded one first): how a probe listing names
/// a probe whose object went away (`[GONE]`).
pub fn symbol_at_or_gone(addr: u64) -> Option<(SymbolAddr, u64)> {
    let mut g = lock();
    let st = g.as_mut()?;
    if let Some(found) = lookup(st, addr, true) {
        return Some(found);
    }
    st.objects
        .iter_mut()
        .rev()
        .filter(|o| o.gone)
        .find_map(|o| {
            let svma = addr.checked_sub(o.bias)?;
            if !o.image.contains(svma) {
                return None;
            }
            let (name, start, size) = o.function_at(svma, true)?;
            Some((
                SymbolAddr {
                    name,
                    module: o.module.clone(),
                    addr: start + o.bias,
                    size,
                },
                svma - start,
            ))
        })
}

/// [`symbol_at`] under the lock; without `fde`, named functions only.
fn lookup(st: &mut State, addr: u64, fde: bool) -> Option<(SymbolAddr, u64)> {
    if let Some(s) = st
        .ifunc_impls
        .iter()
        .find(|s| addr >= s.addr && addr - s.addr < s.size.max(1))
    {
        return Some((s.clone(), addr - s.addr));
    }
    st.objects.iter_mut().filter(|o| !o.gone).find_map(|o| {
        let svma = addr.checked_sub(o.bias)?;
        if !o.image.contains(svma) {
            return None;
        }
        let (name, start, size) = o.function_at(svma, fde)?;
        Some((
            SymbolAddr {
                name,
                module: o.module.clone(),
                addr: start + o.bias,
                size,
            },
            svma - start,
        ))
    })
}

/// Every name (aliases included, as the symbol tables spell them, the debug file's too) of
/// the function that starts at `addr`, e.g. `sigaction` and `__sigaction`. Empty if no named
/// function starts there.
pub fn names_at(addr: u64) -> Vec<String> {
    let mut g = lock();
    let Some(st) = g.as_mut() else {
        return Vec::new();
    };
    let names = |img: &ElfImage, svma: u64| -> Vec<String> {
        match img.func_at(svma) {
            Some((i, 0)) => img
                .names()
                .iter()
                .filter(|(_, j)| *j == i)
                .map(|(n, _)| n.clone())
                .collect(),
            _ => Vec::new(),
        }
    };
    st.objects
        .iter_mut()
        .filter(|o| !o.gone)
        .find_map(|o| {
            let svma = addr.checked_sub(o.bias)?;
            if !o.image.contains(svma) {
                return None;
            }
            let mut all = names(&o.image, svma);
            if let Some(d) = o.debug() {
                all.extend(names(d, svma));
            }
            Some(all)
        })
        .unwrap_or_default()
}

/// Executable memory near `addr` (within call/jmp rel32 reach of it) for code that `make`
/// produces for the address it will have: XOL slots of int3 kprobes. Never freed.
pub fn alloc_code_near(
    addr: u64,
    len: usize,
    make: impl FnOnce(u64) -> Vec<u8>,
) -> Result<u64, FtraceError> {
    let mut g = lock();
    let st = g.as_mut().ok_or(FtraceError::NotInitialized)?;
    let o = st
        .objects
        .iter_mut()
        .find(|o| !o.gone && addr >= o.text.0 && addr < o.text.1)
        .ok_or(FtraceError::NoSite(addr))?;
    let mut make = Some(make);
    if let Some(a) = o
        .areas
        .iter_mut()
        .filter(|a| a.reachable_from(addr))
        .find_map(|a| {
            let m = make.take()?;
            a.alloc_with(len, m)
        })
    {
        return Ok(a);
    }
    let mut area = TrampArea::near(o.text.0, o.text.1)?;
    let make = make.ok_or(FtraceError::NoSite(addr))?;
    let a = area.alloc_with(len, make).expect("a new area holds a slot");
    o.areas.push(area);
    Ok(a)
}

/// The executable range `[start, end)` of the (loaded) object containing `addr`.
pub fn text_range(addr: u64) -> Option<(u64, u64)> {
    let g = lock();
    let st = g.as_ref()?;
    st.objects
        .iter()
        .find(|o| !o.gone && addr >= o.text.0 && addr < o.text.1)
        .map(|o| o.text)
}

/// Whether `addr` is in the code of a loaded object ftprobe knows (an int3 probe's place):
/// [`FtraceError::NoSite`] if not.
pub fn check_code(addr: u64) -> Result<(), FtraceError> {
    let g = lock();
    let st = g.as_ref().ok_or(FtraceError::NotInitialized)?;
    if st
        .objects
        .iter()
        .any(|o| !o.gone && addr >= o.text.0 && addr < o.text.1)
    {
        Ok(())
    } else {
        Err(FtraceError::NoSite(addr))
    }
}

/// Whether `addr` is in code ftprobe made (a trampoline or an XOL slot).
pub fn is_ftprobe_code(addr: u64) -> bool {
    let g = lock();
    g.as_ref().is_some_and(|st| {
        st.objects
            .iter()
            .any(|o| o.areas.iter().any(|a| a.contains(addr)))
    })
}

/// The module (file name) of the object containing `addr`.
pub fn module_of(addr: u64) -> Option<String> {
    let g = lock();
    let st = g.as_ref()?;
    st.objects
        .iter()
        .find(|o| !o.gone && o.image.contains(addr.wrapping_sub(o.bias)))
        .map(|o| o.module.clone())
}
