//! ftrace in one process: site records, `ftrace_ops`, and patching sites between their NOP and
//! a call to a trampoline (kernel/trace/ftrace.c).
//!
//! - [`init`] finds every site of every loaded object, keeps a [`DynFtrace`] record per site
//!   and converts each site to its canonical NOP (the kernel's `ftrace_init()` at boot).
//! - [`register_ftrace_function`] adds an [`FtraceOps`]; each site's wanted state is then
//!   recomputed from the ops that want it: none, NOP; exactly one, a call to a trampoline that
//!   calls that ops directly; several, a call to a trampoline that calls
//!   `ftrace_ops_list_func`, which calls each ops whose filter holds the site
//!   (`ftrace_ops_list_func()` / `__ftrace_ops_list_func()` in the kernel).
//! - Changed sites are rewritten in one batch by `text_poke_batch` (int3 protocol), so threads
//!   may run meanwhile. A registration that fails at any step leaves every site as it was.

pub mod fgraph;
pub mod fgraph_unwind;
pub mod glob;
mod modules;
mod objects;
mod xray;

pub use modules::{load_objects, unload_objects};
pub use objects::{
    addr_of_file_offset, alloc_code_near, check_code, data_addr_of_file_offset,
    filter_module_loaded, find_symbol, has_module, is_ftprobe_code, module_matches, module_of,
    names_at, symbol_at, symbol_at_or_gone, text_range, SymbolAddr,
};

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::arch::x86_64::nops::{self, NOP1, NOP5, SITE_LEN};
use crate::arch::x86_64::sites::{SiteKind, SitePlace};
use crate::arch::x86_64::text_poke::{self, Poke, TextPokeError};
use crate::arch::x86_64::tramp_area::TrampArea;
use crate::arch::x86_64::tramp_signals;
pub use crate::arch::x86_64::trampoline::PtRegs;
use crate::arch::x86_64::trampoline::{ParentAt, TrampolineFunc, Variant};
use crate::elf::{ElfError, ElfImage, SiteSource};
use crate::probe_state;
use crate::process::LoadedObject;
use crate::sys::SyscallError;
use glob::{FilterEntry, FilterError};

/// A site record, 16 bytes as the kernel's `struct dyn_ftrace` without the arch part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct DynFtrace {
    /// Address of the site in this process.
    pub ip: u64,
    /// Reference count in the low bits ([`FTRACE_FL_REF_MASK`]), `FTRACE_FL_*` above.
    pub flags: u64,
}

/// Number of ops that want the site.
pub const FTRACE_FL_REF_MASK: u64 = (1 << 24) - 1;
/// The site is patched to call a trampoline.
pub const FTRACE_FL_ENABLED: u64 = 1 << 24;
/// The trampoline saves the full register set.
pub const FTRACE_FL_REGS: u64 = 1 << 25;
/// An IPMODIFY ops holds the site.
pub const FTRACE_FL_IPMODIFY: u64 = 1 << 26;
/// The trampoline calls one ops directly (no list function).
pub const FTRACE_FL_DIRECT: u64 = 1 << 27;
/// The site stands after `push %rbp; mov %rsp,%rbp` (`-pg` mcount).
pub const FTRACE_FL_AFTER_PROLOGUE: u64 = 1 << 28;
/// The site calls a trampoline of its own: its only ops set a per-site callback for it
/// ([`ftrace_set_direct_ip`]; the kernel's per-ops trampolines and direct calls).
pub const FTRACE_FL_TRAMP: u64 = 1 << 29;

const _: () = assert!(std::mem::size_of::<DynFtrace>() == 16);

/// A graph user's ops (`fgraph`): while one holds a function whose site is an XRay entry
/// sled, its exit and tail sleds are patched too and the graph entry leaves the return
/// address alone (see `xray`).
pub const FTRACE_OPS_FL_GRAPH: u32 = 1 << 3;

/// Save the full register set (the kernel's `FTRACE_OPS_FL_SAVE_REGS`).
pub const FTRACE_OPS_FL_SAVE_REGS: u32 = 1 << 0;
/// The callback may change `regs.ip` (`FTRACE_OPS_FL_IPMODIFY`); needs SAVE_REGS; at most one
/// such ops per site (`-EBUSY`).
pub const FTRACE_OPS_FL_IPMODIFY: u32 = 1 << 1;
/// ftrace guards the callback against recursion (`FTRACE_OPS_FL_RECURSION`): a hit while the
/// callback is already running on this thread is not delivered but counted in
/// [`FtraceOps::missed`]. Without it the callback must guard itself, as in the kernel.
pub const FTRACE_OPS_FL_RECURSION: u32 = 1 << 2;

/// The callback: `func(ip, parent_ip, op, regs)`. `ip` is the site's address, `parent_ip` the
/// return address of the traced function (its caller), `regs` the registers at the site (see
/// [`PtRegs`] for which fields are valid without SAVE_REGS).
///
/// It runs on the probe path: it must be async-signal-safe (no allocation, no locks that can
/// block, no unwinding panic).
pub type FtraceFunc =
    unsafe extern "C" fn(ip: u64, parent_ip: u64, op: &FtraceOps, regs: &mut PtRegs);

/// A per-site callback ([`ftrace_set_direct_ip`]): `func(ip, parent_ip, data, regs)`, where
/// `data` is the word given for the site, which the site's own trampoline carries (no
/// lookup on a hit). Same rules as [`FtraceFunc`].
pub type FtraceDirectFunc =
    unsafe extern "C" fn(ip: u64, parent_ip: u64, data: *const (), regs: &mut PtRegs);

/// A set of callbacks on a set of functions (`struct ftrace_ops`). Made in a `static`.
pub struct FtraceOps {
    /// The callback.
    pub func: FtraceFunc,
    /// `FTRACE_OPS_FL_*`.
    pub flags: u32,
    /// For the callback's own use.
    pub private: AtomicU64,
    filters: Mutex<Filters>,
    /// Sorted site addresses this ops wants while registered; read by the list function.
    hash: AtomicPtr<Vec<u64>>,
    registered: AtomicBool,
    missed: AtomicU64,
}

/// Per-site callbacks of an ops: site -> (data, func).
type DirectMap = BTreeMap<u64, (usize, FtraceDirectFunc)>;

#[derive(Default)]
struct Filters {
    filter: Vec<FilterEntry>,
    notrace: Vec<FilterEntry>,
    /// Site addresses added by [`ftrace_set_filter_ip`], sorted.
    ips: Vec<u64>,
    /// Per-site callbacks ([`ftrace_set_direct_ip`]).
    direct: DirectMap,
}

impl FtraceOps {
    /// An ops with no filter (every function) and no notrace.
    pub const fn new(func: FtraceFunc, flags: u32) -> FtraceOps {
        FtraceOps {
            func,
            flags,
            private: AtomicU64::new(0),
            filters: Mutex::new(Filters {
                filter: Vec::new(),
                notrace: Vec::new(),
                ips: Vec::new(),
                direct: BTreeMap::new(),
            }),
            hash: AtomicPtr::new(std::ptr::null_mut()),
            registered: AtomicBool::new(false),
            missed: AtomicU64::new(0),
        }
    }

    /// Hits not delivered because the callback was already running on the thread (with
    /// [`FTRACE_OPS_FL_RECURSION`], or always through the list function).
    pub fn missed(&self) -> u64 {
        self.missed.load(Ordering::Relaxed)
    }

    /// Whether the ops is registered.
    pub fn is_registered(&self) -> bool {
        self.registered.load(Ordering::Relaxed)
    }

    /// Probe path: whether this ops wants the site at `ip`.
    #[inline]
    fn wants(&self, ip: u64) -> bool {
        // Acquire pairs with the Release store in `register_ftrace_function`.
        let h = self.hash.load(Ordering::Acquire);
        // SAFETY: a non-null hash is a Vec published before the ops was made visible and never
        // freed while any thread can reach it (retired hashes are kept, see `State::retired`).
        !h.is_null() && unsafe { &*h }.binary_search(&ip).is_ok()
    }

    fn lock_filters(&self) -> MutexGuard<'_, Filters> {
        self.filters.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Errors of the ftrace layer. The kernel's errno is given where one exists.
#[derive(Debug, thiserror::Error)]
pub enum FtraceError {
    /// [`init`] has not run.
    #[error("ftrace is not initialized (call ftrace::init first)")]
    NotInitialized,
    /// [`init`] ran already.
    #[error("ftrace is already initialized")]
    AlreadyInitialized,
    /// A loaded object could not be read.
    #[error(transparent)]
    Elf(#[from] ElfError),
    /// Other threads already run, so sites cannot be converted safely (a thread may be inside
    /// a multi-byte NOP run, or block SIGTRAP).
    #[error(
        "{0} other threads are already running (started before ftprobe, e.g. by a library \
         constructor): converting the sites now could crash them, so nothing is traced"
    )]
    ThreadsRunning(usize),
    /// A stopped thread resumes inside a site that init would rewrite
    /// ([`init_objects_stopped`]).
    #[error(
        "a thread is stopped at {pc:#x}, inside the ftrace site at {site:#x}: converting the \
         sites now would resume it mid-instruction (try again)"
    )]
    ThreadInSite { site: u64, pc: u64 },
    /// A filter pattern does not parse.
    #[error(transparent)]
    Filter(#[from] FilterError),
    /// A filter pattern matches no function with a site (the kernel's -EINVAL).
    #[error("no function with an ftrace site matches {0:?}")]
    NoMatch(String),
    /// The ops is registered; filters change only while it is not (-EBUSY).
    #[error("ftrace_ops is registered: unregister it before changing its filters")]
    OpsBusy,
    /// Registering an ops twice (-EBUSY).
    #[error("ftrace_ops is already registered")]
    AlreadyRegistered,
    /// Unregistering an ops that is not registered (-ENODEV).
    #[error("ftrace_ops is not registered")]
    NotRegistered,
    /// IPMODIFY without SAVE_REGS (-EINVAL).
    #[error("FTRACE_OPS_FL_IPMODIFY requires FTRACE_OPS_FL_SAVE_REGS")]
    IpmodifyWithoutRegs,
    /// Another IPMODIFY ops already holds a site this one wants (-EBUSY).
    #[error("{func}: another ftrace_ops with IPMODIFY already holds this function")]
    IpmodifyBusy {
        /// The function both want.
        func: String,
    },
    /// No site starts at this address (the kernel's -ENOENT).
    #[error("no ftrace site at {0:#x}")]
    NoSite(u64),
    /// All ops slots are taken.
    #[error("too many ftrace_ops registered (at most {MAX_OPS})")]
    TooManyOps,
    /// A site's current bytes are not what ftrace wrote there.
    #[error("site at {ip:#x} holds unexpected bytes {found:02x?}")]
    SiteCorrupt {
        /// The site.
        ip: u64,
        /// Its bytes.
        found: [u8; 5],
    },
    /// A system call failed (no trampoline memory, mprotect, membarrier, sigaction).
    #[error(transparent)]
    Syscall(#[from] SyscallError),
    /// The object's file on disk is not the one in memory (its build-id differs: replaced
    /// since it was loaded, e.g. by a package upgrade): its addresses cannot be trusted.
    #[error("{0}: the file on disk is not the one loaded (changed since): not traced")]
    ObjectChanged(std::path::PathBuf),
    /// Return hooks in a process with a CET shadow stack enabled: a hijacked return address
    /// would fault (`#CP`).
    #[error(
        "this process runs with a CET shadow stack (x86_Thread_features: shstk): return \
         hooks (function_graph, return probes) would crash it, so they are refused; entry \
         tracing still works"
    )]
    CetShadowStack,
}

impl FtraceError {
    /// The kernel errno for this error.
    pub fn errno(&self) -> i32 {
        match self {
            FtraceError::OpsBusy
            | FtraceError::AlreadyRegistered
            | FtraceError::IpmodifyBusy { .. } => libc::EBUSY,
            FtraceError::NotRegistered => libc::ENODEV,
            FtraceError::NoSite(_) => libc::ENOENT,
            FtraceError::TooManyOps => libc::ENOSPC,
            FtraceError::CetShadowStack => libc::EOPNOTSUPP,
            FtraceError::Syscall(e) => e.errno().unwrap_or(libc::EIO),
            _ => libc::EINVAL,
        }
    }
}

impl From<TextPokeError> for FtraceError {
    fn from(e: TextPokeError) -> Self {
        match e {
            TextPokeError::Syscall(s) => FtraceError::Syscall(s),
        }
    }
}

/// Maximum number of registered ops.
pub const MAX_OPS: usize = 64;

/// The registered ops, for the list function. A slot is written only under the state lock.
static OPS_LIST: [AtomicPtr<FtraceOps>; MAX_OPS] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_OPS];

/// One past the highest OPS_LIST slot ever used: the list function scans no further.
static OPS_LIST_END: AtomicUsize = AtomicUsize::new(0);

/// Probe path: calls every registered ops that wants `ip`.
///
/// Recursion is handled per ops exactly as on its direct trampoline: an ops with
/// [`FTRACE_OPS_FL_RECURSION`] goes through the guard (and counts [`FtraceOps::missed`]), one
/// without is called as is and guards itself (the kprobes ops count `nmissed`, the function
/// tracer counts lost events). The kernel's list function guards every ops, but its guard has
/// a bit per context (normal, softirq, irq, NMI) so interrupts still get through; a user
/// process cannot tell a signal handler from normal context, so a global guard here would
/// silently drop every hit in a signal handler that interrupted a callback.
unsafe extern "C" fn ftrace_ops_list_func(
    ip: u64,
    parent_ip: u64,
    _op: *const (),
    regs: *mut PtRegs,
) {
    // Acquire pairs with the Release fetch_max in `register_ftrace_function`.
    let end = OPS_LIST_END.load(Ordering::Acquire).min(MAX_OPS);
    for slot in &OPS_LIST[..end] {
        // Acquire pairs with the Release store in `register_ftrace_function`.
        let p = slot.load(Ordering::Acquire);
        if p.is_null() {
            continue;
        }
        // SAFETY: ops in OPS_LIST are &'static.
        let op = unsafe { &*p };
        if !op.wants(ip) {
            continue;
        }
        if op.flags & FTRACE_OPS_FL_RECURSION != 0 {
            // SAFETY: forwarded: the trampoline's arguments.
            unsafe { ftrace_ops_assist_func(ip, parent_ip, p as *const (), regs) };
        } else {
            // SAFETY: regs points to the trampoline's frame, live for this call.
            unsafe { (op.func)(ip, parent_ip, op, &mut *regs) };
        }
    }
}

/// Probe path: one ops with [`FTRACE_OPS_FL_RECURSION`] called directly from its trampoline,
/// under the recursion guard (the kernel's `ftrace_ops_assist_func()`).
unsafe extern "C" fn ftrace_ops_assist_func(
    ip: u64,
    parent_ip: u64,
    op: *const (),
    regs: *mut PtRegs,
) {
    // SAFETY: the trampoline's ops slot holds a &'static FtraceOps.
    let op = unsafe { &*(op as *const FtraceOps) };
    let t = probe_state::this_thread();
    let sp = probe_state::stack_pointer();
    let _ = t.enter(probe_state::Entry::Here(sp));
    if t.in_ftrace.get() != 0 {
        op.missed.fetch_add(1, Ordering::Relaxed);
        return;
    }
    t.in_ftrace.set(sp);
    // SAFETY: regs points to the trampoline's frame, live for this call.
    unsafe { (op.func)(ip, parent_ip, op, &mut *regs) };
    t.in_ftrace.set(0);
}

/// A function with an ftrace site, as listed by [`functions`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FuncSite {
    /// Function name.
    pub name: String,
    /// The object's file name (what `:mod:` matches).
    pub module: String,
    /// Address of the function in this process.
    pub func_addr: u64,
    /// Address of the site in this process.
    pub ip: u64,
    /// What the compiler left there (before canonicalization).
    pub kind: SiteKind,
    /// Where the site stands in the function.
    pub place: SitePlace,
    /// How it was found.
    pub source: SiteSource,
    /// Current record flags.
    pub flags: u64,
}

struct Object {
    image: ElfImage,
    bias: u64,
    module: String,
    areas: Vec<TrampArea>,
    text: (u64, u64),
    /// The symbols of the object's separate debug file: `None` until first needed (a name
    /// or an address its own symbols do not know), then what was found.
    debug: Option<Option<ElfImage>>,
    /// Unloaded (`dlclose`): its code is unmapped, so nothing reads or writes it any more,
    /// and no lookup finds it; kept (not removed) so that the object indices in `RecMeta`
    /// and `tramps` stay valid, and its trampoline areas stay mapped for threads that may
    /// still be returning through them.
    gone: bool,
}

impl Object {
    /// The symbols of the object's separate debug file, read on first use.
    fn debug(&mut self) -> Option<&ElfImage> {
        self.debug
            .get_or_insert_with(|| self.image.debug_symbols())
            .as_ref()
    }

    /// The function holding file address `svma`: `(name, start svma, size)` from the object's
    /// own symbols, else its debug file's, else (with `fde`) the `.eh_frame` FDE covering it,
    /// named after a symbol that starts there (one without a size, as hand-written assembly
    /// has), or `module+0xSTART`.
    fn function_at(&mut self, svma: u64, fde: bool) -> Option<(String, u64, u64)> {
        let sym = |img: &ElfImage, svma: u64| {
            img.func_at(svma).map(|(i, off)| {
                let f = &img.funcs()[i];
                (f.name.clone(), f.svma, f.size, off)
            })
        };
        if let Some((name, start, size, _)) = sym(&self.image, svma) {
            return Some((name, start, size));
        }
        if let Some((name, start, size, _)) = self.debug().and_then(|d| sym(d, svma)) {
            return Some((name, start, size));
        }
        if !fde {
            return None;
        }
        let (start, len) = self.image.fde_at(svma)?;
        let name = sym(&self.image, start)
            .or_else(|| self.debug().and_then(|d| sym(d, start)))
            .filter(|s| s.3 == 0)
            .map(|s| s.0)
            .unwrap_or_else(|| format!("{}+{start:#x}", self.module));
        Some((name, start, len))
    }

    /// The size of the function starting at `svma` with symbol size `size`: that size, or
    /// when the symbol has none, the length of the FDE that starts there (0 if none does).
    fn size_of(&self, svma: u64, size: u64) -> u64 {
        if size != 0 {
            return size;
        }
        match self.image.fde_at(svma) {
            Some((start, len)) if start == svma => len,
            _ => 0,
        }
    }
}

struct RecMeta {
    obj: usize,
    func: usize,
    kind: SiteKind,
    place: SitePlace,
    source: SiteSource,
    /// What the site holds while no ops wants it: [`NOP5`], or for an XRay sled its own first
    /// 5 bytes (`jmp .+11` and the start of its NOP), so a disabled sled is what clang wrote.
    nop: [u8; 5],
    /// Bytes the site covers: 5, or an XRay sled's 11 (its call returns to the sled's end).
    len: u64,
    /// The bytes the site held when it was found (`kind.byte_len()` of them: a `-pg` build's
    /// `call __fentry__`, or its 6-byte `call *__fentry__@GOTPCREL(%rip)`): what a detach
    /// puts back ([`restore_found_sites`]).
    found: [u8; 6],
}

struct State {
    objects: Vec<Object>,
    /// Sorted by ip.
    records: Vec<DynFtrace>,
    meta: Vec<RecMeta>,
    /// Each site's function name as shown and matched by filters too: demangled.
    display: Vec<String>,
    /// What each site holds now.
    current: Vec<[u8; 5]>,
    registered: Vec<&'static FtraceOps>,
    tramps: HashMap<(usize, Variant, usize, usize), u64>,
    /// Hashes of unregistered ops: the list function of another thread may still read one, so
    /// they are kept (the kernel frees them after synchronize_rcu; we have no grace period).
    /// Boxed: readers hold a pointer to the `Vec` header itself, which must not move.
    #[allow(clippy::vec_box)]
    retired: Vec<Box<Vec<u64>>>,
    /// Implementations of indirect functions resolved by [`find_symbol`] that no symbol of
    /// their object (or of its debug file) names: known by the IFUNC's name, with the size of
    /// their `.eh_frame` FDE (0 when there is none: then only their start is known).
    ifunc_impls: Vec<SymbolAddr>,
    /// The XRay exit and tail sleds of functions whose site is their XRay entry sled,
    /// sorted by address.
    xray_exits: Vec<xray::XrayExit>,
    /// What each of them holds now (its first 5 bytes).
    xray_current: Vec<[u8; 5]>,
    /// Sites whose found bytes a detach put back ([`restore_found_sites`]), by ip: their
    /// `current` still says their NOP (a registration before [`convert_found_sites`] fails
    /// with `SiteCorrupt` instead of patching over a call it does not expect).
    restored: Vec<u64>,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

fn lock() -> MutexGuard<'static, Option<State>> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Find the sites of every loaded object, make their code writable and convert every site to
/// its canonical NOP. Objects that cannot be read are skipped and returned as errors.
///
/// # Safety
/// No other thread of this process may run code of the loaded objects until this returns
/// (the agent's constructor; the start of `main`): sites are rewritten with plain stores.
pub unsafe fn init() -> Result<Vec<FtraceError>, FtraceError> {
    let objs = crate::process::loaded_objects();
    // SAFETY: forwarded contract.
    unsafe { init_objects(&objs) }
}

/// [`init`] for a given list of objects.
///
/// # Safety
/// As [`init`]; and every object's bias must be its real load bias in this process.
pub unsafe fn init_objects(objs: &[LoadedObject]) -> Result<Vec<FtraceError>, FtraceError> {
    // The caller promises a single thread; check what we can, since plain stores into a
    // running thread's code (a NOP run it is in the middle of) would crash it.
    let threads = crate::process::thread_count().unwrap_or(1);
    if threads > 1 {
        return Err(FtraceError::ThreadsRunning(threads - 1));
    }
    // SAFETY: forwarded contract; no other thread.
    unsafe { init_objects_stopped(objs, &[]) }
}

/// [`init_objects`] in a process whose other threads are all stopped (by a ptrace attach),
/// at the instruction pointers `stopped_ips` (where each resumes). A thread stopped inside
/// a site (the second to last byte of a run of one-byte NOPs that would become one NOP5)
/// would resume in the middle of an instruction: refused with
/// [`FtraceError::ThreadInSite`] before anything is written.
///
/// # Safety
/// As [`init_objects`], except that other threads may exist if none of them runs until this
/// returns, and `stopped_ips` holds where every one of them resumes.
pub unsafe fn init_objects_stopped(
    objs: &[LoadedObject],
    stopped_ips: &[u64],
) -> Result<Vec<FtraceError>, FtraceError> {
    let mut g = lock();
    if g.is_some() {
        return Err(FtraceError::AlreadyInitialized);
    }
    text_poke::init()?;
    let mut skipped = Vec::new();
    let mut objects = Vec::new();
    let mut sites: Vec<(u64, RecMeta)> = Vec::new();
    let mut xray_exits = Vec::new();
    for lo in objs {
        match scan_object(lo, objects.len()) {
            Ok((o, s, x)) => {
                objects.push(o);
                sites.extend(s);
                xray_exits.extend(x);
            }
            Err(e) => skipped.push(e),
        }
    }
    sites.sort_by_key(|s| s.0);
    for (ip, m) in &sites {
        let len = if m.kind == SiteKind::CallGot {
            SITE_LEN + 1
        } else {
            SITE_LEN
        };
        if let Some(&pc) = stopped_ips.iter().find(|&&pc| pc > *ip && pc < *ip + len) {
            return Err(FtraceError::ThreadInSite { site: *ip, pc });
        }
    }
    let mut records = Vec::with_capacity(sites.len());
    let mut meta = Vec::with_capacity(sites.len());
    let mut idle: Vec<(u64, [u8; 6], usize)> = sites
        .iter()
        .filter_map(|(ip, m)| idle_bytes(m).map(|(b, n)| (*ip, b, n)))
        .collect();
    idle.sort_unstable_by_key(|c| c.0);
    let changes: Vec<(u64, &[u8])> = idle.iter().map(|(ip, b, n)| (*ip, &b[..*n])).collect();
    // SAFETY: the sites are in the objects' code (sorted by address, apart) and, by this
    // function's contract, no other thread runs; a CallGot site is 6 bytes, all of its own
    // instruction. An XRay sled is left as it is (its `nop` is its own bytes).
    unsafe { text_poke::text_poke_early_many(&changes)? };
    for (ip, m) in sites {
        let flags = if m.place == SitePlace::AfterPrologue {
            FTRACE_FL_AFTER_PROLOGUE
        } else {
            0
        };
        records.push(DynFtrace { ip, flags });
        meta.push(m);
    }
    let current = meta.iter().map(|m| m.nop).collect();
    let display = meta
        .iter()
        .map(|m: &RecMeta| crate::elf::display_name(&objects[m.obj].image.funcs()[m.func].name))
        .collect();
    xray_exits.sort_by_key(|e: &xray::XrayExit| e.addr);
    let xray_current = xray_exits.iter().map(|e| e.orig).collect();
    let mut nohijack: Vec<u64> = xray_exits.iter().map(|e| e.entry_ip).collect();
    nohijack.sort_unstable();
    nohijack.dedup();
    publish_site_table(&records, &meta, &objects, &nohijack);
    *g = Some(State {
        objects,
        records,
        meta,
        display,
        current,
        registered: Vec::new(),
        tramps: HashMap::new(),
        retired: Vec::new(),
        ifunc_impls: Vec::new(),
        xray_exits,
        xray_current,
        restored: Vec::new(),
    });
    Ok(skipped)
}

/// What a site holds while no ops wants it, over what was found: its NOP, and after a
/// 6-byte GOT call's NOP5 a one-byte NOP. `None` for an XRay sled (left as clang wrote it).
fn idle_bytes(m: &RecMeta) -> Option<([u8; 6], usize)> {
    let mut b = [NOP1; 6];
    b[..5].copy_from_slice(&m.nop);
    match m.kind {
        SiteKind::XraySled => None,
        SiteKind::CallGot => Some((b, 6)),
        _ => Some((b, 5)),
    }
}

/// For the end of an attached session: put back the bytes each site held when it was found,
/// where they were not its NOP (a `-pg` build's `call __fentry__` or `call mcount`, direct
/// or through the GOT: after a detach, gprof goes on counting as before the attach). Every
/// ops must be unregistered (the sites hold their NOPs). Returns the sites left as NOPs: a
/// stopped thread is between a GOT call's NOP5 and its NOP1, or may return there (a word of
/// one of the `stacks`, from that `sp` up, is that address: the stacks of the threads that
/// may be inside a trampoline the site called, which returns after the NOP5), where the
/// 6-byte call put back would have it resume mid-instruction, or `stacks` is `None` (not
/// known); or the site is not at its NOP (an ops still registered).
/// [`convert_found_sites`] makes them NOPs again for the next session.
///
/// # Safety
/// Every other thread of the process is stopped until this returns, and `stopped_ips` holds
/// where each resumes.
pub unsafe fn restore_found_sites(
    stopped_ips: &[u64],
    stacks: Option<&[u64]>,
) -> Result<Vec<u64>, FtraceError> {
    let mut g = lock();
    let st = g.as_mut().ok_or(FtraceError::NotInitialized)?;
    let mut left = Vec::new();
    let mut restored = Vec::new();
    let mut writes: Vec<(u64, [u8; 6], usize)> = Vec::new();
    // Where a GOT call's trampoline returns (its NOP1), for the sites to put back.
    let mut returns: Vec<u64> = st
        .records
        .iter()
        .zip(&st.meta)
        .filter(|(_, m)| m.kind == SiteKind::CallGot && !st.objects[m.obj].gone)
        .map(|(r, _)| r.ip + SITE_LEN)
        .collect();
    returns.sort_unstable();
    let on_stacks = stack_words_in(stacks.unwrap_or_default(), &returns);
    // Without the stacks, a GOT call site stays a NOP.
    let stacks_known = stacks.is_some();
    for i in 0..st.records.len() {
        let (ip, m) = (st.records[i].ip, &st.meta[i]);
        let Some((idle, n)) = idle_bytes(m) else {
            continue;
        };
        if m.found[..n] == idle[..n]
            || st.objects[m.obj].gone
            || st.restored.binary_search(&ip).is_ok()
        {
            continue;
        }
        let mut now = [0u8; 6];
        let read = crate::sys::read_nofault(ip, &mut now[..n]);
        if st.current[i] != m.nop || read != n || now[..n] != idle[..n] {
            left.push(ip);
            continue;
        }
        if stopped_ips.iter().any(|&pc| pc > ip && pc < ip + n as u64)
            || (m.kind == SiteKind::CallGot
                && (!stacks_known || on_stacks.binary_search(&(ip + SITE_LEN)).is_ok()))
        {
            left.push(ip);
            continue;
        }
        writes.push((ip, m.found, n));
        restored.push(ip);
    }
    let changes: Vec<(u64, &[u8])> = writes.iter().map(|(ip, b, n)| (*ip, &b[..*n])).collect();
    // SAFETY: sites of this state (in address order, as the records), that no thread runs
    // (every other one is stopped, none inside them: checked above).
    unsafe { text_poke::text_poke_early_many(&changes)? };
    if !restored.is_empty() {
        crate::sys::sync_core_all_threads()?;
    }
    st.restored.extend(restored);
    st.restored.sort_unstable();
    st.restored.dedup();
    Ok(left)
}

/// The values of `wanted` (sorted) found as aligned words of the stacks that start at
/// `sps`: each read from its `sp` up for at most 1 MiB or to the first unreadable page.
fn stack_words_in(sps: &[u64], wanted: &[u64]) -> Vec<u64> {
    const SCAN: u64 = 1 << 20;
    const CHUNK: usize = 4096;
    let mut found = Vec::new();
    if wanted.is_empty() {
        return found;
    }
    let mut buf = vec![0u8; CHUNK];
    for &sp in sps {
        let mut at = sp & !7;
        let end = at.saturating_add(SCAN);
        while at < end {
            // Up to the end of this page, then page by page.
            let n = (CHUNK - (at as usize & (CHUNK - 1))).min((end - at) as usize);
            let got = crate::sys::read_nofault(at, &mut buf[..n]);
            for w in buf[..got].chunks_exact(8) {
                let v = u64::from_le_bytes(w.try_into().expect("8 bytes"));
                if wanted.binary_search(&v).is_ok() {
                    found.push(v);
                }
            }
            if got < n {
                break;
            }
            at += n as u64;
        }
    }
    found.sort_unstable();
    found.dedup();
    found
}

/// For the start of an attached session after [`restore_found_sites`]: the sites it put
/// back become their NOPs again (as when they were found), if their object is still the one
/// loaded there (its build-id in memory) and they still hold what was put back. Returns the
/// sites left as they are (a stopped thread between a GOT call's first five bytes and its
/// last would resume mid-instruction): a later registration fails on them
/// (`SiteCorrupt`), so the caller refuses the session.
///
/// # Safety
/// As [`restore_found_sites`].
pub unsafe fn convert_found_sites(stopped_ips: &[u64]) -> Result<Vec<u64>, FtraceError> {
    let mut g = lock();
    let st = g.as_mut().ok_or(FtraceError::NotInitialized)?;
    let mut left = Vec::new();
    let mut wrote = false;
    for ip in std::mem::take(&mut st.restored) {
        let Ok(i) = st.records.binary_search_by_key(&ip, |r| r.ip) else {
            continue;
        };
        let m = &st.meta[i];
        let o = &st.objects[m.obj];
        let Some((idle, n)) = idle_bytes(m) else {
            continue;
        };
        let mut now = [0u8; 6];
        if o.gone
            || !is_mapped_at(&o.image, o.bias)
            || crate::sys::read_nofault(ip, &mut now[..n]) != n
            || now[..n] != m.found[..n]
        {
            continue;
        }
        if stopped_ips.iter().any(|&pc| pc > ip && pc < ip + n as u64) {
            left.push(ip);
            st.restored.push(ip);
            continue;
        }
        // SAFETY: the object's text, mapped (its bytes were just read); as in
        // `restore_found_sites`.
        unsafe { text_poke::text_poke_early(ip, &idle[..n])? };
        wrote = true;
    }
    if wrote {
        crate::sys::sync_core_all_threads()?;
    }
    Ok(left)
}

/// Whether `image` is what is mapped at `bias`: its build-id note's bytes are in memory where
/// the note says (read without faulting); true for a file without one. A file replaced on
/// disk since it was loaded, or another object mapped there since, is not.
fn is_mapped_at(image: &ElfImage, bias: u64) -> bool {
    let (Some(id), Some(at)) = (&image.build_id, image.build_id_svma) else {
        return true;
    };
    let mut mem = vec![0u8; id.len()];
    crate::sys::read_nofault(at.wrapping_add(bias), &mut mem) == id.len() && mem == *id
}

/// What [`scan_object`] finds: the object, its sites (by address), its XRay exit sleds.
type Scanned = (Object, Vec<(u64, RecMeta)>, Vec<xray::XrayExit>);

/// Read the object `lo` (index `oi` in `State::objects`): its [`Object`], its sites that
/// hold in memory what the file says, and its XRay exit sleds. Nothing is written.
fn scan_object(lo: &LoadedObject, oi: usize) -> Result<Scanned, FtraceError> {
    let image = ElfImage::open(&lo.path)?;
    let module = lo
        .path
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let exec = image.segments.iter().filter(|s| s.exec);
    let text = (
        exec.clone().map(|s| s.svma).min().unwrap_or(0) + lo.bias,
        exec.map(|s| s.svma + s.memsz).max().unwrap_or(0) + lo.bias,
    );
    if !is_mapped_at(&image, lo.bias) {
        return Err(FtraceError::ObjectChanged(lo.path.clone()));
    }
    let mut sites = Vec::new();
    for s in &image.sites {
        let ip = s.svma + lo.bias;
        // The bytes in memory must be what the file says (else: not this file's code).
        // Read without faulting: an address from the file is checked before it is trusted.
        let mut mem = [0u8; 16];
        let len = s.kind.byte_len() as usize;
        if crate::sys::read_nofault(ip, &mut mem[..len]) != len
            || crate::arch::x86_64::sites::classify(&mem[..len]) != Some(s.kind)
        {
            continue;
        }
        let mut found = [0u8; 6];
        let n = len.min(found.len());
        found[..n].copy_from_slice(&mem[..n]);
        let (nop, len) = match s.kind {
            SiteKind::XraySled => (
                mem[..5].try_into().expect("5 bytes"),
                crate::arch::x86_64::sites::XRAY_SLED_LEN,
            ),
            _ => (NOP5, SITE_LEN),
        };
        sites.push((
            ip,
            RecMeta {
                obj: oi,
                func: s.func,
                kind: s.kind,
                place: s.place,
                source: s.source,
                nop,
                len,
                found,
            },
        ));
    }
    // (function start, entry site) of this object's XRay entry sleds that are sites.
    let mut entry_ips: Vec<(u64, u64)> = sites
        .iter()
        .filter(|(_, m)| m.kind == SiteKind::XraySled)
        .map(|(ip, m)| (image.funcs()[m.func].svma + lo.bias, *ip))
        .collect();
    entry_ips.sort_unstable();
    let xray_exits = xray::exits_of(&image, lo.bias, oi, &entry_ips);
    let object = Object {
        image,
        bias: lo.bias,
        module,
        areas: Vec::new(),
        text,
        debug: None,
        gone: false,
    };
    Ok((object, sites, xray_exits))
}

/// One site in the probe path's lookup table ([`site_info`]).
#[derive(Clone, Copy)]
struct SiteInfo {
    /// The site (0: an empty slot).
    ip: u64,
    /// The start of the function holding it.
    func: u64,
    place: SitePlace,
    /// An XRay entry sled whose function's exit sleds ftrace patches for graph users: the
    /// graph enters without hijacking the return address.
    nohijack: bool,
}

/// Sites by address, for the probe path (no lock): an open-addressing table, power-of-two
/// sized, at most half full, built by [`init_objects`] and built again when objects are
/// loaded or unloaded (`modules`); a replaced table is never freed (a reader may hold it).
static SITE_TABLE: AtomicPtr<Vec<SiteInfo>> = AtomicPtr::new(std::ptr::null_mut());

fn site_hash(ip: u64, mask: usize) -> usize {
    (ip.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as usize & mask
}

fn publish_site_table(
    records: &[DynFtrace],
    meta: &[RecMeta],
    objects: &[Object],
    nohijack: &[u64],
) {
    let size = (records.len() * 2).next_power_of_two().max(16);
    let mut table = vec![
        SiteInfo {
            ip: 0,
            func: 0,
            place: SitePlace::Entry,
            nohijack: false,
        };
        size
    ];
    for (r, m) in records.iter().zip(meta) {
        let o = &objects[m.obj];
        let func = o.image.funcs()[m.func].svma + o.bias;
        let mut i = site_hash(r.ip, size - 1);
        while table[i].ip != 0 {
            i = (i + 1) & (size - 1);
        }
        table[i] = SiteInfo {
            ip: r.ip,
            func,
            place: m.place,
            nohijack: nohijack.binary_search(&r.ip).is_ok(),
        };
    }
    // Release pairs with the Acquire load in `site_info`.
    SITE_TABLE.store(Box::into_raw(Box::new(table)), Ordering::Release);
}

/// Probe path: the function holding the site at `ip`, where the site stands in it, and
/// whether it is an XRay entry sled whose exits ftrace patches for graph users (the graph
/// then enters without touching the return address).
#[inline]
pub(crate) fn site_info(ip: u64) -> Option<(u64, SitePlace, bool)> {
    // Acquire pairs with the Release store in `publish_site_table`.
    let t = SITE_TABLE.load(Ordering::Acquire);
    if t.is_null() {
        return None;
    }
    // SAFETY: published once, never freed.
    let t = unsafe { &*t };
    let mask = t.len() - 1;
    let mut i = site_hash(ip, mask);
    loop {
        let s = t[i];
        if s.ip == ip {
            return Some((s.func, s.place, s.nohijack));
        }
        if s.ip == 0 {
            return None;
        }
        i = (i + 1) & mask;
    }
}

/// The start addresses of the functions with a site that `patterns` select (`set_ftrace_filter`
/// syntax, applied in order, matching the symbol or its demangled name), sorted. A pattern
/// that matches nothing is `NoMatch` (as a write to `set_graph_function`: -EINVAL).
pub fn select_functions(patterns: &[String]) -> Result<Vec<u64>, FtraceError> {
    let g = lock();
    let st = g.as_ref().ok_or(FtraceError::NotInitialized)?;
    let entries = patterns
        .iter()
        .map(|p| FilterEntry::parse(p))
        .collect::<Result<Vec<_>, _>>()?;
    let mut set = vec![false; st.meta.len()];
    for (e, p) in entries.iter().zip(patterns) {
        let mut any = false;
        for (i, (m, d)) in st.meta.iter().zip(&st.display).enumerate() {
            let o = &st.objects[m.obj];
            if e.matches_function(&o.image.funcs()[m.func].name, d, &o.module) {
                set[i] = !e.negate;
                any = true;
            }
        }
        if !any && !e.negate {
            return Err(FtraceError::NoMatch(p.clone()));
        }
    }
    let mut out: Vec<u64> = st
        .meta
        .iter()
        .zip(&set)
        .filter(|(_, s)| **s)
        .map(|(m, _)| {
            let o = &st.objects[m.obj];
            o.image.funcs()[m.func].svma + o.bias
        })
        .collect();
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// Whether [`init`] (or one of its variants) has run.
pub fn is_initialized() -> bool {
    lock().is_some()
}

/// Every function with a site, in address order (the kernel's `available_filter_functions`).
pub fn functions() -> Result<Vec<FuncSite>, FtraceError> {
    let g = lock();
    let st = g.as_ref().ok_or(FtraceError::NotInitialized)?;
    Ok(st
        .records
        .iter()
        .zip(&st.meta)
        .map(|(r, m)| st.func_site(r, m))
        .collect())
}

/// The loaded objects ftrace looked at, with their load bias.
pub fn objects() -> Result<Vec<LoadedObject>, FtraceError> {
    let g = lock();
    let st = g.as_ref().ok_or(FtraceError::NotInitialized)?;
    Ok(st
        .objects
        .iter()
        .filter(|o| !o.gone)
        .map(|o| LoadedObject {
            path: o.image.path.clone(),
            bias: o.bias,
        })
        .collect())
}

/// The record of the site at `ip`, if there is one.
pub fn record(ip: u64) -> Option<DynFtrace> {
    let g = lock();
    let st = g.as_ref()?;
    st.index_of(ip).map(|i| st.records[i])
}

/// The site whose bytes cover `addr` (`ip <= addr < ip + 5`, or `ip + 11` for an XRay
/// sled), if any.
pub fn site_covering(addr: u64) -> Option<u64> {
    let g = lock();
    let st = g.as_ref()?;
    let i = st
        .records
        .partition_point(|r| r.ip <= addr)
        .checked_sub(1)?;
    let ip = st.records[i].ip;
    (addr - ip < st.meta[i].len).then_some(ip)
}

/// The XRay exit or tail sled whose 11 bytes cover `addr`, if ftrace may patch it (its
/// function's site is its XRay entry sled).
pub fn xray_exit_covering(addr: u64) -> Option<u64> {
    let g = lock();
    let st = g.as_ref()?;
    let i = st
        .xray_exits
        .partition_point(|e| e.addr <= addr)
        .checked_sub(1)?;
    let sled = st.xray_exits[i].addr;
    (addr - sled < crate::arch::x86_64::sites::XRAY_SLED_LEN).then_some(sled)
}

/// The site inside the function `func` (at or after its start, before its end), if any.
pub fn site_covering_func(func: &SymbolAddr) -> Option<u64> {
    let g = lock();
    let st = g.as_ref()?;
    let i = st.records.partition_point(|r| r.ip < func.addr);
    let r = st.records.get(i)?;
    (r.ip < func.addr + func.size.max(1)).then_some(r.ip)
}

/// Set (with `reset`, replace) the filter of an unregistered ops (`ftrace_set_filter()`).
pub fn ftrace_set_filter(ops: &FtraceOps, pattern: &str, reset: bool) -> Result<(), FtraceError> {
    let _busy = crate::probe_state::KprobeBusy::begin();
    set_filter(ops, pattern, reset, false)
}

/// Clear an unregistered ops' filter and notrace lists (every function again): an attached
/// agent's next session starts from none.
pub fn ftrace_reset_filters(ops: &FtraceOps) -> Result<(), FtraceError> {
    if ops.is_registered() {
        return Err(FtraceError::OpsBusy);
    }
    let mut f = ops.lock_filters();
    f.filter.clear();
    f.notrace.clear();
    Ok(())
}

/// Set (with `reset`, replace) the notrace list of an unregistered ops (`ftrace_set_notrace()`).
pub fn ftrace_set_notrace(ops: &FtraceOps, pattern: &str, reset: bool) -> Result<(), FtraceError> {
    let _busy = crate::probe_state::KprobeBusy::begin();
    set_filter(ops, pattern, reset, true)
}

fn set_filter(
    ops: &FtraceOps,
    pattern: &str,
    reset: bool,
    notrace: bool,
) -> Result<(), FtraceError> {
    if ops.is_registered() {
        return Err(FtraceError::OpsBusy);
    }
    let e = FilterEntry::parse(pattern)?;
    if !e.negate {
        let g = lock();
        let st = g.as_ref().ok_or(FtraceError::NotInitialized)?;
        // `:mod:OBJ` naming no loaded object is kept for when it is loaded (the kernel caches
        // such filters for a module not loaded yet: `ftrace_mod_load`, `process_cached_mods`).
        let pending = e.names_a_module()
            && !st
                .objects
                .iter()
                .any(|o| !o.gone && e.matches_module(&o.module));
        if !pending
            && !st.meta.iter().zip(&st.display).any(|(m, d)| {
                let o = &st.objects[m.obj];
                e.matches_function(&o.image.funcs()[m.func].name, d, &o.module)
            })
        {
            return Err(FtraceError::NoMatch(pattern.to_owned()));
        }
    }
    let mut f = ops.lock_filters();
    let list = if notrace {
        &mut f.notrace
    } else {
        &mut f.filter
    };
    if reset {
        list.clear();
    }
    list.push(e);
    Ok(())
}

/// Change the filter (with `notrace`, the notrace list) of `ops`, registered or not, as a
/// write to the kernel's `set_ftrace_filter` does while a tracer runs: `reset` replaces the
/// list (`>`), else `patterns` are appended (`>>`; a `!PAT` entry takes functions out). A
/// registered ops' sites are re-patched at once, in one batch (`ftrace_hash_move_and_update_ops`);
/// on error nothing changes. A pattern matching no function is left out and returned as a
/// warning; if every pattern of a non-empty `patterns` is, the write fails (EINVAL) and
/// nothing changes. The old hash is retired, never freed (a thread may still read it).
pub fn ftrace_update_filter(
    ops: &'static FtraceOps,
    patterns: &[String],
    reset: bool,
    notrace: bool,
) -> Result<Vec<FtraceError>, FtraceError> {
    let mut g = lock();
    let st = g.as_mut().ok_or(FtraceError::NotInitialized)?;
    let mut entries = Vec::new();
    let mut warnings = Vec::new();
    for p in patterns {
        let e = FilterEntry::parse(p)?;
        if e.negate || st.entry_selects(&e) {
            entries.push(e);
        } else {
            warnings.push(FtraceError::NoMatch(p.clone()));
        }
    }
    if !patterns.is_empty() && entries.is_empty() {
        return Err(warnings
            .pop()
            .unwrap_or(FtraceError::NoMatch(String::new())));
    }
    let old = {
        let mut f = ops.lock_filters();
        let old = (f.filter.clone(), f.notrace.clone());
        let list = if notrace {
            &mut f.notrace
        } else {
            &mut f.filter
        };
        if reset {
            list.clear();
        }
        list.extend(entries);
        old
    };
    if !ops.is_registered() {
        return Ok(warnings);
    }
    let hash = st.hash_of(ops);
    let result = st.check_ipmodify(ops, &hash).and_then(|()| {
        // Release pairs with the Acquire load in `FtraceOps::wants`.
        let prev = ops
            .hash
            .swap(Box::into_raw(Box::new(hash)), Ordering::AcqRel);
        // SAFETY: prev came from Box::into_raw; `retired` keeps it for concurrent readers.
        st.retired.push(unsafe { Box::from_raw(prev) });
        st.update_sites()
    });
    if let Err(e) = result {
        {
            let mut f = ops.lock_filters();
            (f.filter, f.notrace) = old;
        }
        let hash = st.hash_of(ops);
        let prev = ops
            .hash
            .swap(Box::into_raw(Box::new(hash)), Ordering::AcqRel);
        // SAFETY: as above.
        st.retired.push(unsafe { Box::from_raw(prev) });
        return Err(e);
    }
    Ok(warnings)
}

/// The ops' glob filter (with `notrace`, its notrace list), as `set_ftrace_filter` reads.
pub fn ftrace_filter_text(ops: &FtraceOps, notrace: bool) -> Vec<String> {
    let f = ops.lock_filters();
    let list = if notrace { &f.notrace } else { &f.filter };
    list.iter().map(|e| e.text.clone()).collect()
}

/// Add (or with `remove`, remove) the site at `ip` to the ops' filter; with `reset`, clear the
/// address list first (`ftrace_set_filter_ip()`). Unlike glob filters this works on a
/// registered ops: its sites are re-patched at once, and on error nothing changes.
/// `ip` must be a site's first byte (else `NoSite`, the kernel's -ENOENT).
///
/// As in the kernel, an ops whose filter ends up empty selects every function: users of
/// this call (kprobes) unregister the ops before removing its last address.
pub fn ftrace_set_filter_ip(
    ops: &'static FtraceOps,
    ip: u64,
    remove: bool,
    reset: bool,
) -> Result<(), FtraceError> {
    let mut g = lock();
    let st = g.as_mut().ok_or(FtraceError::NotInitialized)?;
    if st.index_of(ip).is_none() {
        return Err(FtraceError::NoSite(ip));
    }
    let old = {
        let mut f = ops.lock_filters();
        let old = f.ips.clone();
        if reset {
            f.ips.clear();
        }
        match (f.ips.binary_search(&ip), remove) {
            (Err(at), false) => f.ips.insert(at, ip),
            (Ok(at), true) => {
                f.ips.remove(at);
            }
            _ => {}
        }
        old
    };
    if !ops.is_registered() {
        return Ok(());
    }
    let hash = st.hash_of(ops);
    let result = st.check_ipmodify(ops, &hash).and_then(|()| {
        let new = Box::into_raw(Box::new(hash));
        // Release pairs with the Acquire load in `FtraceOps::wants`.
        let prev = ops.hash.swap(new, Ordering::AcqRel);
        // SAFETY: prev came from Box::into_raw; `retired` keeps it for concurrent readers.
        st.retired.push(unsafe { Box::from_raw(prev) });
        st.update_sites()
    });
    if let Err(e) = result {
        ops.lock_filters().ips = old;
        let hash = st.hash_of(ops);
        let prev = ops
            .hash
            .swap(Box::into_raw(Box::new(hash)), Ordering::AcqRel);
        // SAFETY: as above.
        st.retired.push(unsafe { Box::from_raw(prev) });
        // The sites were not changed by the failed update (update_sites rolls back), so the
        // restored hash matches what is patched.
        return Err(e);
    }
    Ok(())
}

/// Give (or with `None`, take back) the site at `ip` a callback of its own for `ops`: while
/// `ops` is the only ops that wants the site, the site calls a trampoline made for it that
/// calls `func(ip, parent_ip, data, regs)` directly, with `data` in the trampoline's data
/// slot; otherwise (no ops, or several, which share the list function) the entry is unused
/// and `ops.func` serves the site as usual. The kernel's per-ops trampolines and direct
/// calls (`ftrace_ops` with a single function gets a trampoline of its own): kprobes give a
/// site with a single probe a trampoline that carries the probe. `data` must stay valid for
/// as long as a thread may run such a trampoline: forever (trampolines are never freed).
/// `func` runs without ftrace's recursion guard, whatever the ops' flags: it guards itself.
///
/// A registered ops' site is retargeted at once, live (one `text_poke` batch); on error
/// nothing changes. `ip` must be a site's first byte (else `NoSite`).
pub fn ftrace_set_direct_ip(
    ops: &'static FtraceOps,
    ip: u64,
    direct: Option<(*const (), FtraceDirectFunc)>,
) -> Result<(), FtraceError> {
    let mut g = lock();
    let st = g.as_mut().ok_or(FtraceError::NotInitialized)?;
    if st.index_of(ip).is_none() {
        return Err(FtraceError::NoSite(ip));
    }
    let old = {
        let mut f = ops.lock_filters();
        match direct {
            Some((data, func)) => f.direct.insert(ip, (data as usize, func)),
            None => f.direct.remove(&ip),
        }
    };
    if !ops.is_registered() {
        return Ok(());
    }
    if let Err(e) = st.update_sites() {
        let mut f = ops.lock_filters();
        match old {
            Some(d) => f.direct.insert(ip, d),
            None => f.direct.remove(&ip),
        };
        return Err(e);
    }
    Ok(())
}

/// Where the site at `ip` calls now: its trampoline, or `None` when it is a NOP (or no site).
pub fn site_call_target(ip: u64) -> Option<u64> {
    let g = lock();
    let st = g.as_ref()?;
    let i = st.index_of(ip)?;
    let b = st.current[i];
    (b[0] == 0xe8).then(|| {
        let rel = i32::from_le_bytes([b[1], b[2], b[3], b[4]]);
        ip.wrapping_add(SITE_LEN).wrapping_add(rel as i64 as u64)
    })
}

/// Start calling `ops` on the functions its filter selects (`register_ftrace_function()`).
/// On error nothing changed: no site is patched, the ops is not registered.
pub fn register_ftrace_function(ops: &'static FtraceOps) -> Result<(), FtraceError> {
    let _busy = crate::probe_state::KprobeBusy::begin();
    let mut g = lock();
    let st = g.as_mut().ok_or(FtraceError::NotInitialized)?;
    if ops.is_registered() {
        return Err(FtraceError::AlreadyRegistered);
    }
    if ops.flags & FTRACE_OPS_FL_IPMODIFY != 0 && ops.flags & FTRACE_OPS_FL_SAVE_REGS == 0 {
        return Err(FtraceError::IpmodifyWithoutRegs);
    }
    let hash = st.hash_of(ops);
    st.check_ipmodify(ops, &hash)?;
    let (slot_index, slot) = OPS_LIST
        .iter()
        .enumerate()
        .find(|(_, s)| s.load(Ordering::Relaxed).is_null())
        .ok_or(FtraceError::TooManyOps)?;
    // Release pairs with the Acquire load in `FtraceOps::wants`.
    ops.hash
        .store(Box::into_raw(Box::new(hash)), Ordering::Release);
    // Release pairs with the Acquire load in `ftrace_ops_list_func`.
    slot.store(ops as *const FtraceOps as *mut FtraceOps, Ordering::Release);
    // Release pairs with the Acquire load in `ftrace_ops_list_func`.
    OPS_LIST_END.fetch_max(slot_index + 1, Ordering::Release);
    st.registered.push(ops);
    ops.registered.store(true, Ordering::Relaxed);
    if let Err(e) = st.update_sites() {
        st.registered.pop();
        slot.store(std::ptr::null_mut(), Ordering::Release);
        ops.registered.store(false, Ordering::Relaxed);
        st.retire_hash(ops);
        return Err(e);
    }
    Ok(())
}

/// Stop calling `ops` (`unregister_ftrace_function()`). Its sites go back to NOP or to the
/// trampolines of the remaining ops. A callback already running on another thread may still
/// finish after this returns; the ops is `'static`, so that is memory-safe. On error nothing
/// changed: the ops is still registered, its sites still call it.
pub fn unregister_ftrace_function(ops: &'static FtraceOps) -> Result<(), FtraceError> {
    let _busy = crate::probe_state::KprobeBusy::begin();
    let mut g = lock();
    let st = g.as_mut().ok_or(FtraceError::NotInitialized)?;
    let pos = st
        .registered
        .iter()
        .position(|o| std::ptr::eq(*o, ops))
        .ok_or(FtraceError::NotRegistered)?;
    st.registered.remove(pos);
    if let Err(e) = st.update_sites() {
        // The sites were not changed (update_sites rolls back): they still call this ops,
        // directly or through the list function, which must keep finding it.
        st.registered.insert(pos, ops);
        return Err(e);
    }
    if let Some(slot) = OPS_LIST
        .iter()
        .find(|s| std::ptr::eq(s.load(Ordering::Relaxed), ops))
    {
        slot.store(std::ptr::null_mut(), Ordering::Release);
    }
    ops.registered.store(false, Ordering::Relaxed);
    st.retire_hash(ops);
    Ok(())
}

impl State {
    /// -EBUSY if `ops` is IPMODIFY and another registered IPMODIFY ops holds a site of `hash`.
    fn check_ipmodify(&self, ops: &FtraceOps, hash: &[u64]) -> Result<(), FtraceError> {
        if ops.flags & FTRACE_OPS_FL_IPMODIFY == 0 {
            return Ok(());
        }
        for other in self
            .registered
            .iter()
            .filter(|o| o.flags & FTRACE_OPS_FL_IPMODIFY != 0 && !std::ptr::eq(**o, ops))
        {
            // SAFETY: registered ops have a live hash (set at registration, cleared after).
            let oh = unsafe { &*other.hash.load(Ordering::Relaxed) };
            if let Some(ip) = hash.iter().find(|ip| oh.binary_search(ip).is_ok()) {
                let i = self.index_of(*ip).expect("hash holds record ips");
                return Err(FtraceError::IpmodifyBusy {
                    func: self.func_name(i).to_owned(),
                });
            }
        }
        Ok(())
    }

    fn index_of(&self, ip: u64) -> Option<usize> {
        self.records.binary_search_by_key(&ip, |r| r.ip).ok()
    }

    fn func_name(&self, i: usize) -> &str {
        let m = &self.meta[i];
        &self.objects[m.obj].image.funcs()[m.func].name
    }

    fn func_site(&self, r: &DynFtrace, m: &RecMeta) -> FuncSite {
        let o = &self.objects[m.obj];
        let f = &o.image.funcs()[m.func];
        FuncSite {
            name: f.name.clone(),
            module: o.module.clone(),
            func_addr: f.svma + o.bias,
            ip: r.ip,
            kind: m.kind,
            place: m.place,
            source: m.source,
            flags: r.flags,
        }
    }

    /// Whether a (non-negated) filter entry selects a function now, or names a module that
    /// is not loaded (kept for when it is, as `set_filter` does).
    fn entry_selects(&self, e: &FilterEntry) -> bool {
        let pending = e.names_a_module()
            && !self
                .objects
                .iter()
                .any(|o| !o.gone && e.matches_module(&o.module));
        pending
            || self.meta.iter().zip(&self.display).any(|(m, d)| {
                let o = &self.objects[m.obj];
                e.matches_function(&o.image.funcs()[m.func].name, d, &o.module)
            })
    }

    /// Sorted ips the ops selects: its filter (empty: all) minus its notrace.
    fn hash_of(&self, ops: &FtraceOps) -> Vec<u64> {
        let f = ops.lock_filters();
        // Patterns match the symbol name, its demangled form (see `FuncMeta::display`), or
        // its full signature (`FilterEntry::matches_function`).
        let sets = |list: &[FilterEntry]| -> Option<Vec<bool>> {
            if list.is_empty() {
                return None;
            }
            let set: Vec<bool> = self
                .meta
                .iter()
                .zip(&self.display)
                .map(|(m, d)| {
                    let o = &self.objects[m.obj];
                    let sym = o.image.funcs()[m.func].name.as_str();
                    glob::in_set(list, |e| e.matches_function(sym, d, &o.module))
                })
                .collect();
            set.iter().any(|&b| b).then_some(set)
        };
        let mut filter = sets(&f.filter);
        let notrace = sets(&f.notrace);
        // A `:mod:` filter that selects no site (its object is not loaded yet, any more, or
        // has no matching site) selects nothing, not every function (the kernel's cached
        // module filters, FTRACE_HASH_FL_MOD).
        let selects_some = |e: &FilterEntry| {
            self.meta.iter().zip(&self.display).any(|(m, d)| {
                let o = &self.objects[m.obj];
                e.matches_function(&o.image.funcs()[m.func].name, d, &o.module)
            })
        };
        if filter.is_none()
            && f.filter
                .iter()
                .any(|e| !e.negate && e.names_a_module() && !selects_some(e))
        {
            filter = Some(vec![false; self.records.len()]);
        }
        if !f.ips.is_empty() {
            let set = filter.get_or_insert_with(|| vec![false; self.records.len()]);
            for ip in &f.ips {
                if let Some(i) = self.index_of(*ip) {
                    set[i] = true;
                }
            }
        }
        self.records
            .iter()
            .enumerate()
            .filter(|(i, _)| filter.as_ref().is_none_or(|s| s[*i]))
            .filter(|(i, _)| notrace.as_ref().is_none_or(|s| !s[*i]))
            .map(|(_, r)| r.ip)
            .collect()
    }

    fn retire_hash(&mut self, ops: &FtraceOps) {
        let h = ops.hash.swap(std::ptr::null_mut(), Ordering::AcqRel);
        if !h.is_null() {
            // SAFETY: h came from Box::into_raw in register_ftrace_function; ownership moves to
            // `retired`, which keeps it alive for readers that loaded it before the swap.
            self.retired.push(unsafe { Box::from_raw(h) });
        }
    }

    /// The trampoline for `variant`, calling `func` with `ops`, near object `obj`.
    fn trampoline(
        &mut self,
        obj: usize,
        site: u64,
        variant: Variant,
        ops: *const (),
        func: TrampolineFunc,
    ) -> Result<u64, FtraceError> {
        let key = (obj, variant, ops as usize, func as usize);
        if let Some(&t) = self.tramps.get(&key) {
            return Ok(t);
        }
        // A program's signal that arrives in a trampoline is held until it returns
        // (`tramp_signals`): the program's handlers are wrapped from the first one on.
        tramp_signals::prepare();
        text_poke::wrap_program_handlers(None)?;
        let code = variant.instantiate(ops, func);
        let o = &mut self.objects[obj];
        let addr = match o
            .areas
            .iter_mut()
            .filter(|a| a.reachable_from(site))
            .find_map(|a| a.alloc(&code))
        {
            Some(a) => a,
            None => {
                let mut area = TrampArea::near(o.text.0, o.text.1)?;
                let a = area.alloc(&code).expect("a new area holds a trampoline");
                o.areas.push(area);
                a
            }
        };
        self.tramps.insert(key, addr);
        Ok(addr)
    }

    /// The stub of XRay exit sled `j` (made on first use, with its function's exit
    /// trampoline), near the sled.
    fn xray_stub(&mut self, j: usize) -> Result<u64, FtraceError> {
        let e = &self.xray_exits[j];
        if e.stub != 0 {
            return Ok(e.stub);
        }
        let (obj, addr, tail, func) = (e.obj, e.addr, e.tail, e.func);
        let variant = Variant {
            save_regs: false,
            parent: ParentAt::Top,
            xray: false,
        };
        let tramp = self.trampoline(obj, addr, variant, func as *const (), xray::xray_exit_func)?;
        let make = |at: u64| {
            xray::stub_code(at, addr, tail, tramp).expect("trampoline areas are within rel32 reach")
        };
        let len = xray::stub_len(tail);
        let o = &mut self.objects[obj];
        let stub = match o
            .areas
            .iter_mut()
            .filter(|a| a.reachable_from(addr))
            .find_map(|a| a.alloc_with(len, make))
        {
            Some(s) => s,
            None => {
                let mut area = TrampArea::near(o.text.0, o.text.1)?;
                let s = area.alloc_with(len, make).expect("a new area holds a stub");
                o.areas.push(area);
                s
            }
        };
        self.xray_exits[j].stub = stub;
        Ok(stub)
    }

    /// Recompute every site's wanted bytes and patch those that differ, in one batch.
    /// On error no site has changed.
    fn update_sites(&mut self) -> Result<(), FtraceError> {
        let n = self.records.len();
        let mut pokes = Vec::with_capacity(n);
        let mut new_flags = Vec::with_capacity(n);
        // Sites a graph user holds (sorted): their XRay exit sleds are patched too.
        let mut graph_ips = Vec::new();
        // Each registered ops' hash (sorted, like the records) and how far this walk has
        // got in it: one merge pass over records and hashes, no search per site.
        let mut hashes: Vec<(&'static FtraceOps, &[u64], usize)> = self
            .registered
            .iter()
            .map(|&op| {
                // SAFETY: registered ops have a live hash, replaced only under the lock we
                // hold and never freed (retired).
                let h = unsafe { &*op.hash.load(Ordering::Relaxed) };
                debug_assert!(h.is_sorted(), "hash_of builds hashes in record order");
                (op, h.as_slice(), 0)
            })
            .collect();
        // The per-site callbacks of each registered ops that has any (`ftrace_set_direct_ip`).
        let directs: Vec<(&'static FtraceOps, DirectMap)> = self
            .registered
            .iter()
            .filter_map(|&op| {
                let f = op.lock_filters();
                (!f.direct.is_empty()).then(|| (op, f.direct.clone()))
            })
            .collect();
        // The last trampoline looked up: neighbouring sites almost always want the same one.
        let mut last_tramp: Option<((usize, Variant, usize, usize), u64)> = None;
        for i in 0..n {
            let ip = self.records[i].ip;
            let mut count = 0u64;
            let mut save_regs = false;
            let mut ipmodify = false;
            let mut graph = false;
            let mut only: Option<&'static FtraceOps> = None;
            for (op, h, at) in hashes.iter_mut() {
                let op: &'static FtraceOps = op;
                while h.get(*at).is_some_and(|&x| x < ip) {
                    *at += 1;
                }
                if h.get(*at) == Some(&ip) {
                    count += 1;
                    save_regs |= op.flags & FTRACE_OPS_FL_SAVE_REGS != 0;
                    ipmodify |= op.flags & FTRACE_OPS_FL_IPMODIFY != 0;
                    graph |= op.flags & FTRACE_OPS_FL_GRAPH != 0;
                    only = Some(op);
                }
            }
            if graph {
                graph_ips.push(ip);
            }
            let mut flags = (self.records[i].flags & FTRACE_FL_AFTER_PROLOGUE) | count;
            let want = if count == 0 {
                self.meta[i].nop
            } else {
                let variant = Variant {
                    save_regs,
                    parent: ParentAt::of(self.meta[i].place),
                    xray: self.meta[i].kind == SiteKind::XraySled,
                };
                let direct = match (count, only) {
                    (1, Some(op)) => directs
                        .iter()
                        .find(|(o, _)| std::ptr::eq(*o, op))
                        .and_then(|(_, d)| d.get(&ip).copied()),
                    _ => None,
                };
                let (ops_ptr, func): (*const (), TrampolineFunc) = match (count, only, direct) {
                    // A per-site callback guards itself against recursion, whatever the
                    // ops' flags (the kprobes ops have no RECURSION).
                    (_, _, Some((data, f))) => (
                        data as *const (),
                        // SAFETY: FtraceDirectFunc and TrampolineFunc have the same ABI: the
                        // reference parameter is passed as the pointer the trampoline holds.
                        unsafe { std::mem::transmute::<FtraceDirectFunc, TrampolineFunc>(f) },
                    ),
                    (1, Some(op), None) if op.flags & FTRACE_OPS_FL_RECURSION != 0 => {
                        (op as *const FtraceOps as *const (), ftrace_ops_assist_func)
                    }
                    (1, Some(op), None) => (
                        op as *const FtraceOps as *const (),
                        // SAFETY: FtraceFunc and TrampolineFunc have the same ABI: the two
                        // reference parameters are passed as the pointers the trampoline holds.
                        unsafe { std::mem::transmute::<FtraceFunc, TrampolineFunc>(op.func) },
                    ),
                    _ => (std::ptr::null(), ftrace_ops_list_func),
                };
                flags |= FTRACE_FL_ENABLED
                    | if save_regs { FTRACE_FL_REGS } else { 0 }
                    | if ipmodify { FTRACE_FL_IPMODIFY } else { 0 }
                    | if count == 1 { FTRACE_FL_DIRECT } else { 0 }
                    | if direct.is_some() { FTRACE_FL_TRAMP } else { 0 };
                let obj = self.meta[i].obj;
                let key = (obj, variant, ops_ptr as usize, func as usize);
                let tramp = match last_tramp {
                    // `trampoline` keys its cache the same way: the same answer, unhashed.
                    Some((k, t)) if k == key => t,
                    _ => {
                        let t = self.trampoline(obj, ip, variant, ops_ptr, func)?;
                        last_tramp = Some((key, t));
                        t
                    }
                };
                nops::call_rel32(ip, tramp).expect("trampoline areas are within rel32 reach")
            };
            new_flags.push(flags);
            if want != self.current[i] {
                // SAFETY: ip is a site this state canonicalized; 5 readable bytes.
                let found = unsafe { std::ptr::read_unaligned(ip as *const [u8; 5]) };
                if found != self.current[i] {
                    return Err(FtraceError::SiteCorrupt { ip, found });
                }
                pokes.push((
                    i,
                    Poke {
                        addr: ip,
                        old: self.current[i],
                        new: want,
                    },
                ));
            }
        }
        let mut exit_pokes = Vec::new();
        for j in 0..self.xray_exits.len() {
            let e = &self.xray_exits[j];
            let want = if graph_ips.binary_search(&e.entry_ip).is_ok() {
                let stub = self.xray_stub(j)?;
                xray::jmp_to(self.xray_exits[j].addr, stub)
                    .expect("trampoline areas are within rel32 reach")
            } else {
                e.orig
            };
            let (addr, now) = (self.xray_exits[j].addr, self.xray_current[j]);
            if want != now {
                // SAFETY: an exit sled checked at init: 11 readable bytes of code.
                let found = unsafe { std::ptr::read_unaligned(addr as *const [u8; 5]) };
                if found != now {
                    return Err(FtraceError::SiteCorrupt { ip: addr, found });
                }
                exit_pokes.push((
                    j,
                    Poke {
                        addr,
                        old: now,
                        new: want,
                    },
                ));
            }
        }
        let mut batch = Vec::with_capacity(pokes.len() + exit_pokes.len());
        batch.extend(pokes.iter().chain(&exit_pokes).map(|p| p.1));
        // SAFETY: every address is a canonicalized 5-byte site, or an XRay exit sled whose
        // first byte is a whole instruction (`ret`, `jmp`) that nothing falls through from,
        // in code made writable by init; the state lock we hold excludes concurrent patching.
        unsafe { text_poke::text_poke_batch(&batch)? };
        for (i, p) in pokes {
            self.current[i] = p.new;
        }
        for (j, p) in exit_pokes {
            self.xray_current[j] = p.new;
        }
        for (r, f) in self.records.iter_mut().zip(new_flags) {
            r.flags = f;
        }
        Ok(())
    }
}
