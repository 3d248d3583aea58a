//! kprobes in one process (kernel/kprobes.c): a probe table keyed by address, aggregate probes,
//! enable/disable, `nmissed`, and arming by the best mechanism. Today the mechanism is ftrace:
//! an address that is a site's first byte is served by an `ftrace_ops` callback with the
//! semantics of the kernel's `kprobe_ftrace_handler()` (see the private `kprobes::ftrace` module); other
//! addresses are refused until int3 probes land.
//!
//! Address rules (arch/x86/kernel/kprobes/core.c, `arch_adjust_kprobe_addr()`): when a function
//! starts with `endbr64` and its site is right after it, `func+0` and `func+4` both mean the
//! site. An address inside a site but not at its first byte is refused with EILSEQ, "Probe
//! point is not an instruction boundary". With `-pg` (mcount after the prologue) `func+0` is an
//! ordinary instruction, not the site.

mod ftrace;
mod int3;
mod kretprobe;
mod opt;

pub use opt::{optimization_enabled, BUSY_WAIT, STACK_SCAN};

pub use kretprobe::{
    register_kretprobe, unregister_kretprobe, Kretprobe, KretprobeEntryHandler, KretprobeHandler,
    KretprobeInstance,
};

pub use crate::probe_state::KprobeBusy;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::arch::x86_64::sites::ENDBR64;
use crate::ftrace::{self as ft, FtraceError, PtRegs, SymbolAddr};
use crate::probe_state;

/// `pre_handler(p, regs)`: runs before the probed instruction with `regs.ip = addr + 1`, as
/// after a breakpoint. Returning non-zero means "I changed `regs.ip`": the thread continues
/// there and no post_handler runs.
pub type KprobePreHandler = fn(p: &Kprobe, regs: &mut PtRegs) -> i32;
/// `post_handler(p, regs, flags)`: runs after the probed instruction, `regs.ip` the next
/// instruction (for a site, `addr + 5`). `flags` is 0.
pub type KprobePostHandler = fn(p: &Kprobe, regs: &mut PtRegs, flags: u64);

/// The probe's object went away (`KPROBE_FLAG_GONE`).
pub const KPROBE_FLAG_GONE: u32 = 1;
/// Disabled: registered but its handlers do not run (`KPROBE_FLAG_DISABLED`).
pub const KPROBE_FLAG_DISABLED: u32 = 2;
/// Jump-optimized (`KPROBE_FLAG_OPTIMIZED`): an int3 probe replaced by a `jmp` to a detour
/// (see [`set_optimization`]).
pub const KPROBE_FLAG_OPTIMIZED: u32 = 4;
/// Served by ftrace: the address is a site (`KPROBE_FLAG_FTRACE`).
pub const KPROBE_FLAG_FTRACE: u32 = 8;
/// ftprobe's own: a probe the engine places for itself (the unwinder probes of the return
/// hooks), not one the user asked for: left out of [`list`]. Set with
/// [`Kprobe::mark_internal`] before registering.
pub const KPROBE_FLAG_INTERNAL: u32 = 16;
/// ftprobe's own: the entry probe of a kretprobe (the kernel tells it by its pre_handler,
/// `pre_handler_kretprobe`): listed with type `r`.
pub const KPROBE_FLAG_KRETPROBE: u32 = 32;

/// Where a probe goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KprobeTarget {
    /// `[OBJ:]SYM+offset` (the kernel's `symbol_name` + `offset`).
    Symbol {
        /// Object (file name, or its name before `.so`), or any object.
        module: Option<String>,
        /// Symbol name.
        name: String,
        /// Byte offset from the symbol.
        offset: u64,
    },
    /// An address in this process.
    Addr(u64),
}

/// A probe (`struct kprobe`). Made in a `static`, or leaked: registration needs `&'static`.
pub struct Kprobe {
    /// Where it goes.
    pub target: KprobeTarget,
    /// Runs before the probed instruction.
    pub pre_handler: Option<KprobePreHandler>,
    /// Runs after it.
    pub post_handler: Option<KprobePostHandler>,
    /// For the handlers' own use.
    pub data: AtomicU64,
    addr: AtomicU64,
    pub(crate) flags: AtomicU32,
    nmissed: AtomicU64,
    /// Where `nmissed` is counted instead, when set ([`Kprobe::count_nmissed_in`]).
    nmissed_at: AtomicPtr<AtomicU64>,
}

impl Kprobe {
    /// A probe, not yet registered.
    pub const fn new(
        target: KprobeTarget,
        pre_handler: Option<KprobePreHandler>,
        post_handler: Option<KprobePostHandler>,
    ) -> Kprobe {
        Kprobe {
            target,
            pre_handler,
            post_handler,
            data: AtomicU64::new(0),
            addr: AtomicU64::new(0),
            flags: AtomicU32::new(0),
            nmissed: AtomicU64::new(0),
            nmissed_at: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// The resolved address (0 before registration).
    pub fn addr(&self) -> u64 {
        self.addr.load(Ordering::Relaxed)
    }

    /// `KPROBE_FLAG_*`.
    pub fn flags(&self) -> u32 {
        self.flags.load(Ordering::Relaxed)
    }

    /// Mark this probe as the engine's own ([`KPROBE_FLAG_INTERNAL`]): not listed.
    pub fn mark_internal(&self) {
        self.flags.fetch_or(KPROBE_FLAG_INTERNAL, Ordering::Relaxed);
    }

    /// Hits not handled because a probe was already running on the thread.
    pub fn nmissed(&self) -> u64 {
        self.nmissed_counter().load(Ordering::Relaxed)
    }

    /// Count `nmissed` in `counter` from now on (e.g. a counter in memory shared with a
    /// reader that outlives this process); what was counted before stays where it was.
    pub fn count_nmissed_in(&self, counter: &'static AtomicU64) {
        self.nmissed_at.store(
            counter as *const AtomicU64 as *mut AtomicU64,
            Ordering::Release,
        );
    }

    fn nmissed_counter(&self) -> &AtomicU64 {
        let at = self.nmissed_at.load(Ordering::Acquire);
        if at.is_null() {
            &self.nmissed
        } else {
            // SAFETY: set by `count_nmissed_in` from a `&'static AtomicU64`.
            unsafe { &*at }
        }
    }

    /// Probe path: one hit not handled (a probe was already running on the thread).
    pub(crate) fn note_missed(&self) {
        // Relaxed: a statistic, read with `nmissed`.
        self.nmissed_counter().fetch_add(1, Ordering::Relaxed);
    }

    fn is_disabled(&self) -> bool {
        self.flags() & (KPROBE_FLAG_DISABLED | KPROBE_FLAG_GONE) != 0
    }
}

/// Errors of kprobe registration. `errno()` gives the kernel's errno.
#[derive(Debug, thiserror::Error)]
pub enum KprobeError {
    /// No function of that name (-ENOENT).
    #[error("symbol {0:?} not found")]
    NoSymbol(String),
    /// No loaded object of that name (-ENOENT; the kernel's "module not loaded").
    #[error("no object {0:?} is loaded in this process")]
    NoObject(String),
    /// Several functions of that name (-EADDRNOTAVAIL, "The symbol is not unique").
    #[error("the symbol {name:?} is not unique: {candidates}; name one by its full C++ signature or mangled name, or its object (OBJ:SYM)")]
    NotUnique {
        /// The name.
        name: String,
        /// Each function of that name (its full demangled name) and the object defining it.
        candidates: String,
    },
    /// The offset is past the end of the function (-EINVAL).
    #[error("offset {offset:#x} is past the end of {name} (size {size:#x})")]
    OffsetOutside {
        /// Function.
        name: String,
        /// Offset asked for.
        offset: u64,
        /// Its size.
        size: u64,
    },
    /// An offset into a function whose size is unknown (-EINVAL): the implementation of an
    /// indirect function in a stripped library with neither an `.eh_frame` FDE nor a debug
    /// file, whose instruction boundaries cannot be found.
    #[error(
        "offset {offset:#x} into {name}: only +0 can be probed there, its size is unknown (no \
         symbol size, no .eh_frame entry, no debug file)"
    )]
    SizeUnknown {
        /// Function.
        name: String,
        /// Offset asked for.
        offset: u64,
    },
    /// Inside a site but not at its first byte (-EILSEQ).
    #[error("Probe point is not an instruction boundary")]
    NotInsnBoundary,
    /// In an XRay exit or tail sled, which ftrace patches for graph users (-EBUSY).
    #[error(
        "Probe point is in an XRay exit sled at {sled:#x}, which ftprobe patches for the \
         function_graph tracer: probe the function's entry or use a return probe"
    )]
    XrayExitSled {
        /// The sled's address.
        sled: u64,
    },
    /// An address no function symbol of a loaded object contains (-EINVAL): ftprobe must
    /// decode from a function's start to know the instruction boundaries.
    #[error("{at} is not inside a function of a loaded object{hint}")]
    NotASite {
        /// `sym+0xoff`.
        at: String,
        /// Where the function's site is, if it has one.
        hint: String,
    },
    /// A probe on the probe path itself (the kernel's NOKPROBE_SYMBOL blacklist) (-EINVAL).
    #[error("{0} is on ftprobe's probe path (blacklisted)")]
    Blacklisted(String),
    /// An int3 probe on a function that glibc's `posix_spawn` child runs after resetting every
    /// signal handler to the default (`system`, `popen`, `posix_spawn` start children that
    /// way): the trap would kill that child (-EINVAL).
    #[error(
        "{0} runs in the children that system(), popen() and posix_spawn() start, after glibc \
         has reset their signal handlers: an int3 probe there would kill them (refused; probe \
         the caller instead)"
    )]
    SpawnChild(String),
    /// The instruction cannot be probed with int3 (refused, undecodable, out of reach).
    #[error(transparent)]
    Insn(#[from] crate::arch::x86_64::insn::InsnError),
    /// A return probe on something that is not a function's entry (-EINVAL; the kernel's
    /// `BAD_RETPROBE`, "Retprobe address must be an function entry").
    #[error("a return probe goes on a function's entry, not on {0}")]
    NotFunctionEntry(String),
    /// The same `Kprobe` is registered already (-EINVAL).
    #[error("kprobe is already registered")]
    AlreadyRegistered,
    /// Unregistering or enabling a probe that is not registered (-EINVAL).
    #[error("kprobe is not registered")]
    NotRegistered,
    /// Arming through ftrace failed; nothing was enabled.
    #[error(transparent)]
    Ftrace(#[from] FtraceError),
}

impl KprobeError {
    /// The kernel errno for this error.
    pub fn errno(&self) -> i32 {
        match self {
            KprobeError::NoSymbol(_) | KprobeError::NoObject(_) => libc::ENOENT,
            KprobeError::NotUnique { .. } => libc::EADDRNOTAVAIL,
            KprobeError::NotInsnBoundary => libc::EILSEQ,
            KprobeError::XrayExitSled { .. } => libc::EBUSY,
            KprobeError::NotASite { .. } => libc::EINVAL,
            KprobeError::Ftrace(e) => e.errno(),
            _ => libc::EINVAL,
        }
    }
}

/// The control-plane table: address -> probes there, in registration order.
struct Table {
    probes: BTreeMap<u64, Vec<&'static Kprobe>>,
    /// Published copies read by the probe path; kept, never freed (no grace period yet).
    /// Boxed: readers hold pointers to the lists themselves, which must not move.
    #[allow(clippy::vec_box)]
    retired: Vec<Box<ProbeList>>,
}

/// What the probe path reads: sorted (address, probes) pairs.
pub(crate) struct ProbeList {
    entries: Vec<(u64, Vec<&'static Kprobe>)>,
}

impl ProbeList {
    pub(crate) fn get(&self, addr: u64) -> Option<&[&'static Kprobe]> {
        let i = self.entries.binary_search_by_key(&addr, |e| e.0).ok()?;
        Some(&self.entries[i].1)
    }
}

static TABLE: Mutex<Table> = Mutex::new(Table {
    probes: BTreeMap::new(),
    retired: Vec::new(),
});
static PUBLISHED: AtomicPtr<ProbeList> = AtomicPtr::new(std::ptr::null_mut());

fn lock() -> MutexGuard<'static, Table> {
    TABLE.lock().unwrap_or_else(|e| e.into_inner())
}

impl Table {
    fn publish(&mut self) {
        let list = Box::new(ProbeList {
            entries: self.probes.iter().map(|(a, v)| (*a, v.clone())).collect(),
        });
        // Release pairs with the Acquire load in `published()`.
        let old = PUBLISHED.swap(Box::into_raw(list), Ordering::AcqRel);
        if !old.is_null() {
            // SAFETY: old came from Box::into_raw here; kept alive in `retired` for readers.
            self.retired.push(unsafe { Box::from_raw(old) });
        }
    }
}

/// Probe path: the start of a hit of `probes` on this thread, common to the ftrace handler
/// (`kprobe_ftrace_handler`) and the optprobe callback: the thread's state, repaired after a
/// non-local exit; when a kprobe already runs on the thread (a handler reached a probed
/// address), every enabled probe counts `nmissed` and `None` is returned; else its state
/// with `kprobe_sp` set to this frame's stack pointer.
#[inline(always)]
pub(crate) fn hit_begin(probes: &[&'static Kprobe]) -> Option<&'static probe_state::ThreadState> {
    let t = probe_state::this_thread();
    let sp = probe_state::stack_pointer();
    let _ = t.enter(probe_state::Entry::Here(sp));
    let running = t.kprobe.get();
    if !running.is_null() {
        // The engine's own work (`KprobeBusy`) is not the program's: not counted at all.
        if running != probe_state::KPROBE_BUSY {
            for p in probes.iter().filter(|p| !p.is_disabled()) {
                p.note_missed();
            }
        }
        return None;
    }
    t.kprobe_sp.set(sp);
    Some(t)
}

/// Probe path: the probes at `addr`.
pub(crate) fn published() -> Option<&'static ProbeList> {
    // Acquire pairs with the Release swap in `Table::publish`.
    let p = PUBLISHED.load(Ordering::Acquire);
    // SAFETY: published lists are never freed (see Table::retired).
    (!p.is_null()).then(|| unsafe { &*p })
}

/// Where a probe goes and how it is armed.
#[derive(Clone, Debug)]
pub struct Resolved {
    /// The address probed (after the ENDBR rule).
    pub addr: u64,
    /// The function containing it.
    pub func: SymbolAddr,
    /// A site's first byte: armed through ftrace. Otherwise an int3 probe.
    pub ftrace: bool,
}

/// Resolve a target to the address to probe, applying the ENDBR rule; refuse an address
/// inside a site but not at its first byte (EILSEQ). Whether any other address is an
/// instruction boundary is checked when an int3 probe is armed.
pub fn resolve(target: &KprobeTarget) -> Result<Resolved, KprobeError> {
    let (func, offset) =
        match target {
            KprobeTarget::Symbol {
                module,
                name,
                offset,
            } => {
                if let Some(m) = module {
                    if !ft::has_module(m) {
                        return Err(KprobeError::NoObject(m.clone()));
                    }
                }
                let hits = ft::find_symbol(module.as_deref(), name)?;
                let func = match hits.len() {
                    0 => return Err(KprobeError::NoSymbol(name.clone())),
                    1 => hits.into_iter().next().expect("one"),
                    _ => {
                        let candidates: Vec<String> = hits
                            .iter()
                            .map(|h| {
                                let full = crate::elf::demangled_names(&h.name)
                                    .into_iter()
                                    .next()
                                    .unwrap_or_else(|| h.name.clone());
                                format!("{full} in {}", h.module)
                            })
                            .collect();
                        return Err(KprobeError::NotUnique {
                            name: name.clone(),
                            candidates: candidates.join(", "),
                        });
                    }
                };
                if func.size != 0 && *offset >= func.size {
                    return Err(KprobeError::OffsetOutside {
                        name: name.clone(),
                        offset: *offset,
                        size: func.size,
                    });
                }
                if func.size == 0 && *offset != 0 {
                    return Err(KprobeError::SizeUnknown {
                        name: name.clone(),
                        offset: *offset,
                    });
                }
                (func, *offset)
            }
            KprobeTarget::Addr(a) => match ft::symbol_at(*a) {
                Some((f, off)) => (f, off),
                None => return Err(KprobeError::NotASite {
                    at: format!("{a:#x}"),
                    hint:
                        " (ftprobe decodes from a function's start to find instruction boundaries)"
                            .to_owned(),
                }),
            },
        };
    let mut addr = func.addr + offset;
    // ENDBR: func+0 means the instruction after endbr64 (arch_adjust_kprobe_addr).
    if offset == 0 && starts_with_endbr(&func) {
        addr += ENDBR64.len() as u64;
    }
    if let Some(sled) = ft::xray_exit_covering(addr) {
        return Err(KprobeError::XrayExitSled { sled });
    }
    match ft::site_covering(addr) {
        Some(ip) if ip == addr => Ok(Resolved {
            addr,
            func,
            ftrace: true,
        }),
        Some(_) => Err(KprobeError::NotInsnBoundary),
        None => Ok(Resolved {
            addr,
            func,
            ftrace: false,
        }),
    }
}

fn starts_with_endbr(func: &SymbolAddr) -> bool {
    if func.size < 4 {
        return false;
    }
    // SAFETY: the function is in an executable segment of a loaded object and at least 4
    // bytes long: mapped and readable.
    let b = unsafe { std::ptr::read_unaligned(func.addr as *const [u8; 4]) };
    b == ENDBR64
}

/// Register and arm a probe (`register_kprobe()`). On error nothing is enabled.
pub fn register_kprobe(p: &'static Kprobe) -> Result<(), KprobeError> {
    let _busy = crate::probe_state::KprobeBusy::begin();
    let mut t = lock();
    if t.probes
        .values()
        .any(|v| v.iter().any(|q| std::ptr::eq(*q, p)))
    {
        return Err(KprobeError::AlreadyRegistered);
    }
    let r = resolve(&p.target)?;
    let addr = r.addr;
    p.addr.store(addr, Ordering::Relaxed);
    if r.ftrace {
        p.flags.fetch_or(KPROBE_FLAG_FTRACE, Ordering::Relaxed);
    } else {
        p.flags.fetch_and(!KPROBE_FLAG_FTRACE, Ordering::Relaxed);
    }
    p.flags.fetch_and(!KPROBE_FLAG_GONE, Ordering::Relaxed);
    t.probes.entry(addr).or_default().push(p);
    t.publish();
    if let Err(e) = arm(&t, addr) {
        remove(&mut t, p);
        return Err(e);
    }
    Ok(())
}

/// Bring the arming of `addr` in line with the probes registered there: ftrace ops for a
/// site, the int3 otherwise (armed while any probe there is enabled).
fn arm(t: &Table, addr: u64) -> Result<(), KprobeError> {
    let here = t.probes.get(&addr).map(Vec::as_slice).unwrap_or(&[]);
    let is_site = ft::site_covering(addr) == Some(addr);
    if is_site {
        return ftrace::arm(&t.probes, addr).map_err(Into::into);
    }
    if here.iter().any(|p| !p.is_disabled()) {
        let func = ft::symbol_at(addr)
            .map(|(f, _)| f)
            .ok_or_else(|| KprobeError::NoSymbol(format!("{addr:#x}")))?;
        // An int3 inside another probe's optimized range would land in its jmp or its
        // replaced instructions: that one goes back to its int3 first (the kernel's
        // `unoptimize_kprobe()` of an aggregate that now overlaps).
        let covering = opt::covering(addr);
        for a in &covering {
            opt::unoptimize(*a)?;
        }
        // The optimizer's settings come from the environment (getenv calls libc's strlen):
        // read before this int3 is in place, or a probe on strlen records the agent's call.
        opt::optimization_enabled();
        int3::arm(addr, &func, &opt::jumps())?;
        for a in covering {
            opt::update(a, t.probes.get(&a).map(Vec::as_slice).unwrap_or(&[]))?;
        }
        opt::update(addr, here)
    } else {
        opt::unoptimize(addr)?;
        for p in here {
            p.flags.fetch_and(!KPROBE_FLAG_OPTIMIZED, Ordering::Relaxed);
        }
        int3::disarm(addr)?;
        // A probe just before may have been kept from optimizing by this one (the kernel's
        // optimizer is kicked again when a probe goes away).
        for (a, probes) in t.probes.range(addr.saturating_sub(MAX_RANGE)..addr) {
            if probes
                .iter()
                .any(|p| !p.is_disabled() && p.flags() & KPROBE_FLAG_FTRACE == 0)
            {
                opt::update(*a, probes)?;
            }
        }
        Ok(())
    }
}

/// The longest range an optprobe replaces: 4 bytes of instructions plus one of 15.
const MAX_RANGE: u64 = 19;

/// Why an int3 probe is not optimized: the last refusal's reason (`None` when it is
/// optimized, not an int3 probe, or never tried).
pub fn optimization_refused(p: &'static Kprobe) -> Option<String> {
    let _t = lock();
    opt::refusal(p.addr())
}

/// Turn jump optimization on or off for every int3 probe (the kernel's
/// `debug.kprobes-optimization` sysctl; the environment variable
/// `FTPROBE_KPROBES_OPTIMIZATION=0` starts with it off). Turning it on optimizes every
/// probe that may be (see the `opt` module's rules; a probe that may not stays an int3
/// probe); off puts every int3 back.
pub fn set_optimization(on: bool) -> Result<(), KprobeError> {
    let _busy = crate::probe_state::KprobeBusy::begin();
    let t = lock();
    opt::set_enabled(on);
    for (addr, probes) in &t.probes {
        if ft::site_covering(*addr) == Some(*addr) || !probes.iter().any(|p| !p.is_disabled()) {
            continue;
        }
        if probes.iter().all(|p| p.flags() & KPROBE_FLAG_GONE != 0) {
            continue;
        }
        opt::update(*addr, probes)?;
    }
    Ok(())
}

fn remove(t: &mut Table, p: &'static Kprobe) -> Option<u64> {
    let addr = p.addr();
    let v = t.probes.get_mut(&addr)?;
    let i = v.iter().position(|q| std::ptr::eq(*q, p))?;
    v.remove(i);
    p.flags.fetch_and(!KPROBE_FLAG_OPTIMIZED, Ordering::Relaxed);
    if v.is_empty() {
        t.probes.remove(&addr);
    }
    t.publish();
    Some(addr)
}

/// Disarm and remove a probe (`unregister_kprobe()`).
pub fn unregister_kprobe(p: &'static Kprobe) -> Result<(), KprobeError> {
    let _busy = crate::probe_state::KprobeBusy::begin();
    let mut t = lock();
    let addr = remove(&mut t, p).ok_or(KprobeError::NotRegistered)?;
    arm(&t, addr)
}

/// Stop a probe's handlers without unregistering it (`disable_kprobe()`).
pub fn disable_kprobe(p: &'static Kprobe) -> Result<(), KprobeError> {
    let _busy = crate::probe_state::KprobeBusy::begin();
    set_disabled(p, true)
}

/// Resume a disabled probe (`enable_kprobe()`).
pub fn enable_kprobe(p: &'static Kprobe) -> Result<(), KprobeError> {
    let _busy = crate::probe_state::KprobeBusy::begin();
    set_disabled(p, false)
}

/// Flip DISABLED and re-arm the probe's address; on error the flag is put back.
fn set_disabled(p: &'static Kprobe, disabled: bool) -> Result<(), KprobeError> {
    let t = lock();
    if !t
        .probes
        .values()
        .any(|v| v.iter().any(|q| std::ptr::eq(*q, p)))
    {
        return Err(KprobeError::NotRegistered);
    }
    let set = |on: bool| {
        if on {
            p.flags.fetch_or(KPROBE_FLAG_DISABLED, Ordering::Relaxed)
        } else {
            p.flags.fetch_and(!KPROBE_FLAG_DISABLED, Ordering::Relaxed)
        }
    };
    set(disabled);
    if let Err(e) = arm(&t, p.addr()) {
        set(!disabled);
        return Err(e);
    }
    Ok(())
}

/// Objects were unloaded (`dlclose`; already unmapped): their probes become GONE (the
/// kernel's `kill_kprobe()` on MODULE_STATE_GOING), stay registered and listed `[GONE]`,
/// and their handlers no longer run; nothing of their code is read or written. ftrace drops
/// the objects' sites. To arm such a probe again (its object loaded again), unregister it
/// and register it again, as the kernel's trace_kprobe does on module load. Returns how many
/// probes became GONE.
pub fn objects_unloaded(objs: &[crate::process::LoadedObject]) -> Result<usize, KprobeError> {
    let _busy = crate::probe_state::KprobeBusy::begin();
    let t = lock();
    let ranges = ft::unload_objects(objs)?;
    if ranges.is_empty() {
        return Ok(0);
    }
    let in_gone = |a: u64| ranges.iter().any(|&(lo, hi)| a >= lo && a < hi);
    let mut n = 0;
    for (_, probes) in t.probes.iter().filter(|(a, _)| in_gone(**a)) {
        for p in probes {
            if p.flags.fetch_or(KPROBE_FLAG_GONE, Ordering::Relaxed) & KPROBE_FLAG_GONE == 0 {
                n += 1;
            }
        }
    }
    opt::forget(&ranges);
    int3::forget(&ranges);
    ftrace::forget(&ranges);
    Ok(n)
}

/// Turn per-site trampolines for probes on ftrace sites on or off (on by default): with them,
/// a site whose only user is one enabled kprobe calls a trampoline of its own that carries
/// the probe, so a hit needs no lookup; without them every site probe goes through the shared
/// kprobes `ftrace_ops` and its lookup by address (as several probes on one address, or a
/// probe next to another `ftrace_ops`, always do). Armed sites are retargeted at once. For
/// comparisons and tests.
pub fn set_per_site_trampolines(on: bool) -> Result<(), KprobeError> {
    let _busy = crate::probe_state::KprobeBusy::begin();
    let t = lock();
    ftrace::set_per_site(&t.probes, on).map_err(Into::into)
}

/// Whether `p` is registered (armed, disabled or GONE).
pub fn is_registered(p: &'static Kprobe) -> bool {
    lock()
        .probes
        .values()
        .any(|v| v.iter().any(|q| std::ptr::eq(*q, p)))
}

/// The armed probes as the kernel's `debug/kprobes/list` shows them:
/// `ADDR  k  sym+0xoff  OBJ [DISABLED][FTRACE]`, one line per probe (each child of an
/// aggregate on its own line); a kretprobe's type is `r` (the kernel's `report_probe()`).
/// The engine's own probes ([`KPROBE_FLAG_INTERNAL`]) are not listed.
pub fn list() -> String {
    let t = lock();
    let mut out = String::new();
    for (addr, probes) in &t.probes {
        for p in probes {
            let f = p.flags();
            if f & KPROBE_FLAG_INTERNAL != 0 {
                continue;
            }
            let kind = if f & KPROBE_FLAG_KRETPROBE != 0 {
                'r'
            } else {
                'k'
            };
            let (sym, off, module) = match ft::symbol_at_or_gone(*addr) {
                Some((s, off)) => (crate::elf::display_name(&s.name), off, s.module),
                None => (format!("{addr:#x}"), 0, String::new()),
            };
            out.push_str(&format!(
                "{addr:016x}  {kind}  {sym}+{off:#x}  {module} {}{}{}{}\n",
                if f & KPROBE_FLAG_GONE != 0 {
                    "[GONE]"
                } else {
                    ""
                },
                if f & KPROBE_FLAG_DISABLED != 0 {
                    "[DISABLED]"
                } else {
                    ""
                },
                if f & KPROBE_FLAG_OPTIMIZED != 0 && f & KPROBE_FLAG_GONE == 0 {
                    "[OPTIMIZED]"
                } else {
                    ""
                },
                if f & KPROBE_FLAG_FTRACE != 0 {
                    "[FTRACE]"
                } else {
                    ""
                },
            ));
        }
    }
    out
}

/// Probe path: the probe running on this thread, if any (`kprobe_running()`).
pub fn kprobe_running() -> Option<&'static Kprobe> {
    let p = crate::probe_state::this_thread().kprobe.get();
    // SAFETY: only registered &'static probes are stored as the current kprobe, besides
    // KPROBE_BUSY, which is not dereferenced.
    (!p.is_null() && p != crate::probe_state::KPROBE_BUSY).then(|| unsafe { &*p })
}
