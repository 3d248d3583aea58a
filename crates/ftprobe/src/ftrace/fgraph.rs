//! Return hooks: the function-graph shadow stack (the kernel's kernel/trace/fgraph.c, our
//! code), shared by every user of function exits (the function_graph tracer, kretprobes).
//!
//! A hooked call pushes a `ShadowEntry` `{ret, retp, func, calltime, depth, users, data}`
//! on its thread's shadow stack and replaces the return address in its slot `retp` with the
//! return trampoline (`arch::x86_64::return_trampoline`). The function's `ret` lands there;
//! `ftprobe_fgraph_return` finds the entry **by its slot** (searching from the top: an
//! entry is never popped blindly), puts the real return address back, calls the return
//! callback of each user that took the call, and the trampoline returns to the real address.
//!
//! ```text
//!   thread stack                         shadow stack (mmap, per thread)
//!   | caller frame    |                  entries[top-1] {ret, retp, func, calltime,
//!   | [retp] = tramp  | <- retp ------+                  depth, users, data[user][4]}
//!   | f's frame       |               +------------------ retp
//! ```
//!
//! Memory: each thread's shadow stack is one anonymous mapping of [`FGRAPH_CAPACITY`] entries
//! made by a raw `mmap` on its first hooked call (no allocator, no TLS but the probe path's
//! one const thread-local). A full stack counts an overrun for the user and leaves the call
//! unhooked. After `fork` the child keeps a copy (its stack is a copy too).
//!
//! Entry states: `LIVE` (slot hijacked), `RESTORED` (the real address was put back in the
//! slot while an unwinder runs: see [`super::fgraph_unwind`]), `ZOMBIE` (reported closed
//! because its frame looked gone, but its slot still held the trampoline: kept so that a
//! late return still finds its real address), `HOLE` (free). Closing calls that did not
//! return, deciding which stack an entry belongs to, longjmp and exceptions: the cases are
//! in [`super::fgraph_unwind`].
//!
//! Recursion: entries made through ftrace sites run under the `FTRACE_OPS_FL_RECURSION`
//! guard (a hooked function called from a callback is not hooked, counted in the ops'
//! `missed`), taken by the ops' own callback so that an entry looks its thread up once (one
//! TLS access per event: the thread's state is handed to the users in [`FgraphEnt`] and
//! [`FgraphRet`]); the return callbacks run under the same guard.
//!
//! Everything reached from a trampoline is on the probe path: no allocation, no lock, no
//! panic, no C library call (the return path must not touch the vector registers' upper
//! halves).

use std::sync::atomic::{compiler_fence, AtomicPtr, AtomicU32, AtomicU64, Ordering};

use super::fgraph_unwind as unwind;
pub(crate) use super::fgraph_unwind::thread_ending;
use super::{FtraceError, FtraceOps, PtRegs, FTRACE_OPS_FL_GRAPH};
use crate::arch::x86_64::return_trampoline;
use crate::arch::x86_64::sites::SitePlace;
use crate::probe_state::{self, stack_pointer, Entry};

/// Words of per-call data each graph user may keep on the shadow stack for its return
/// callback (the kernel's `fgraph_reserve_data`, fixed size here).
pub const FGRAPH_DATA_WORDS: usize = 4;
/// Graph users at once (function_graph tracer, kretprobes, ...): the kernel's
/// `FGRAPH_ARRAY_SIZE`.
pub const FGRAPH_MAX_USERS: usize = 16;
/// Entries per thread's shadow stack (the kernel's `SHADOW_STACK_MAX_OFFSET` in spirit):
/// deeper hooked calls are overruns.
pub const FGRAPH_CAPACITY: usize = 1024;

/// What a return callback is told about the end of a call.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FgraphExit {
    /// The function returned (through the return trampoline, or an XRay exit sled).
    Returned = 0,
    /// Its frame was unwound by an exception (C++ throw, Rust panic, forced unwind of
    /// pthread_exit/cancel) without returning.
    Unwound = 1,
    /// Its frame was left by longjmp/siglongjmp (or setcontext) without returning.
    Longjmp = 2,
    /// Found dead later by the stack check (frame gone, reason unknown).
    Lost = 3,
}

/// `struct ftrace_graph_ent`.
#[derive(Clone, Copy, Debug)]
pub struct FgraphEnt {
    /// The function's address (its symbol's start).
    pub func: u64,
    /// Hooked calls below this one on the thread's shadow stack.
    pub depth: u32,
    /// Raw TSC at entry.
    pub calltime: u64,
    /// The entering thread's probe state (its one TLS access), for the crate's own users.
    pub(crate) thread: *const probe_state::ThreadState,
}

/// `struct ftrace_graph_ret`.
#[derive(Clone, Copy, Debug)]
pub struct FgraphRet {
    /// The function's address.
    pub func: u64,
    /// As at entry.
    pub depth: u32,
    /// Raw TSC at entry.
    pub calltime: u64,
    /// Raw TSC at the return, or when the unwind was seen.
    pub rettime: u64,
    /// rax at return (0 when exit != Returned).
    pub retval: u64,
    /// rdx (second return word).
    pub retval2: u64,
    /// How the call ended.
    pub exit: FgraphExit,
    /// The real return address (the caller's instruction after the call).
    pub ret: u64,
    /// The stack slot that held it.
    pub retp: u64,
    /// The thread's probe state (as in [`FgraphEnt`]).
    pub(crate) thread: *const probe_state::ThreadState,
}

impl FgraphEnt {
    /// The entering thread's probe state (no TLS access).
    #[inline(always)]
    pub(crate) fn thread(&self) -> &probe_state::ThreadState {
        // SAFETY: set from `probe_state::this_thread()` of the thread that runs the
        // callback, which lives as long as that thread; the FgraphEnt is only lent to it.
        unsafe { &*self.thread }
    }
}

impl FgraphRet {
    /// The returning thread's probe state (no TLS access).
    #[inline(always)]
    pub(crate) fn thread(&self) -> &probe_state::ThreadState {
        // SAFETY: as in `FgraphEnt::thread`.
        unsafe { &*self.thread }
    }
}

/// entryfunc: return false to not take this call (the kernel's semantics: no return
/// callback for it). `data` starts zeroed; whatever is written there is handed to retfunc.
pub type FgraphEntryFunc = unsafe fn(
    ent: &FgraphEnt,
    gops: &FgraphOps,
    regs: &mut PtRegs,
    data: &mut [u64; FGRAPH_DATA_WORDS],
) -> bool;

/// retfunc: runs on the probe path at the function's return (or when its frame was found
/// unwound: `ret.exit`). `regs` holds the return registers (rax, rdx; sp = retp + 8; ip =
/// the real return address); all zeros but sp/ip when exit != Returned.
pub type FgraphRetFunc =
    unsafe fn(ret: &FgraphRet, gops: &FgraphOps, regs: &PtRegs, data: &[u64; FGRAPH_DATA_WORDS]);

/// A graph user (`struct fgraph_ops`), made in a static.
pub struct FgraphOps {
    /// Called at a hooked function's entry.
    pub entryfunc: FgraphEntryFunc,
    /// Called when the call ends.
    pub retfunc: FgraphRetFunc,
    /// For the user's own use.
    pub private: AtomicU64,
    /// Its site filter; its callback enters the graph for this user.
    ops: FtraceOps,
    /// User index + 1 while registered (0: not registered).
    index: AtomicU32,
    overrun: AtomicU64,
    /// Another counter each overrun is also added to (null: none).
    overrun_also: AtomicPtr<AtomicU64>,
}

impl FgraphOps {
    /// A user with these callbacks; its filter selects every function until set.
    pub const fn new(entryfunc: FgraphEntryFunc, retfunc: FgraphRetFunc) -> FgraphOps {
        FgraphOps {
            entryfunc,
            retfunc,
            private: AtomicU64::new(0),
            // The recursion guard of FTRACE_OPS_FL_RECURSION, taken by the callback itself
            // (one TLS access for the guard and the shadow stack together).
            ops: FtraceOps::new(fgraph_ftrace_entry, FTRACE_OPS_FL_GRAPH),
            index: AtomicU32::new(0),
            overrun: AtomicU64::new(0),
            overrun_also: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// Also count each overrun from now on in `counter` (a kretprobe event's misses in
    /// memory shared with the CLI: the kernel counts a kretprobe instance it could not take
    /// in the probe's `nmissed`).
    pub fn count_overrun_in(&self, counter: &'static AtomicU64) {
        self.overrun_also.store(
            counter as *const AtomicU64 as *mut AtomicU64,
            Ordering::Release,
        );
    }

    /// Its site filter (set before register): the kernel's `ops->ops` filter hash.
    pub fn ops(&self) -> &FtraceOps {
        &self.ops
    }

    /// Calls not hooked because the shadow stack was full (the kernel's overrun).
    pub fn overrun(&self) -> u64 {
        self.overrun.load(Ordering::Relaxed)
    }

    /// Calls not hooked because a callback of a recursion-guarded ops was running on the
    /// thread (a signal handler interrupted one, or a callback called a hooked function).
    pub fn missed(&self) -> u64 {
        self.ops.missed()
    }

    /// Its user index while registered.
    #[inline(always)]
    fn slot(&self) -> Option<usize> {
        match self.index.load(Ordering::Relaxed) {
            0 => None,
            i => Some(i as usize - 1),
        }
    }
}

/// The registered users, by index.
static USERS: [AtomicPtr<FgraphOps>; FGRAPH_MAX_USERS] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; FGRAPH_MAX_USERS];

/// Counts user registrations; each user slot keeps the count at its holder's registration
/// ([`SINCE`]), each entry the count when it took its users (`ShadowEntry::epoch`). An entry
/// of a call hooked for a user that is gone (a session ended while the call ran) keeps that
/// user's bit; when a later user holds the slot, the bit is not its own and its return
/// callback is not called for it (it took a kretprobe's count of live instances below
/// zero: every later call was missed, issue 26, item 5).
static EPOCH: AtomicU32 = AtomicU32::new(1);
static SINCE: [AtomicU32; FGRAPH_MAX_USERS] = [const { AtomicU32::new(0) }; FGRAPH_MAX_USERS];

/// Whether user slot `u`'s bit in an entry of epoch `epoch` is its current holder's.
#[inline(always)]
fn holder_took(u: usize, epoch: u32) -> bool {
    SINCE[u].load(Ordering::Relaxed) <= epoch
}

/// Hook every function its ftrace filter selects, through their sites
/// (`register_ftrace_graph`).
pub fn register_ftrace_graph(gops: &'static FgraphOps) -> Result<(), FtraceError> {
    register_fgraph_user(gops)?;
    if let Err(e) = super::register_ftrace_function(&gops.ops) {
        release(gops);
        return Err(e);
    }
    Ok(())
}

/// Stop hooking (`unregister_ftrace_graph`). Calls already hooked still return through the
/// trampoline, which restores their return address; their return callback is still called
/// while this user's slot is not reused.
pub fn unregister_ftrace_graph(gops: &'static FgraphOps) -> Result<(), FtraceError> {
    if gops.slot().is_none() {
        return Err(FtraceError::NotRegistered);
    }
    if gops.ops.is_registered() {
        super::unregister_ftrace_function(&gops.ops)?;
    }
    release(gops);
    Ok(())
}

/// Register a user that is entered by hand (kretprobes on int3 entry probes, XRay sleds):
/// no ftrace_ops; gets its user index. Unregistered with [`unregister_ftrace_graph`].
pub fn register_fgraph_user(gops: &'static FgraphOps) -> Result<(), FtraceError> {
    if gops.slot().is_some() {
        return Err(FtraceError::AlreadyRegistered);
    }
    unwind::check_return_hooks_allowed()?;
    unwind::init_thread_exit_key();
    // One registration at a time: a slot's epoch is written only by the one taking it.
    static REGISTERING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = REGISTERING.lock().unwrap_or_else(|e| e.into_inner());
    for (i, u) in USERS.iter().enumerate() {
        let p = gops as *const FgraphOps as *mut FgraphOps;
        if !u.load(Ordering::Acquire).is_null() {
            continue;
        }
        // Before the slot is published: an entry that sees this user sees its epoch too.
        let since = EPOCH.fetch_add(1, Ordering::Relaxed) + 1;
        SINCE[i].store(since, Ordering::Relaxed);
        // AcqRel pairs with the Acquire loads of the return path (`user`).
        if u.compare_exchange(std::ptr::null_mut(), p, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            gops.index.store(i as u32 + 1, Ordering::Release);
            return Ok(());
        }
    }
    Err(FtraceError::TooManyOps)
}

fn release(gops: &'static FgraphOps) {
    if let Some(i) = gops.slot() {
        gops.index.store(0, Ordering::Release);
        // Release pairs with the Acquire load in `user`.
        USERS[i].store(std::ptr::null_mut(), Ordering::Release);
    }
}

#[inline(always)]
fn user(i: usize) -> Option<&'static FgraphOps> {
    // Acquire pairs with the stores in register_fgraph_user / release.
    let p = USERS[i].load(Ordering::Acquire);
    // SAFETY: users are &'static FgraphOps.
    (!p.is_null()).then(|| unsafe { &*p })
}

/// The return trampoline's address (what hijacked slots hold).
#[inline(always)]
pub fn return_trampoline() -> u64 {
    return_trampoline::address()
}

// ---------------------------------------------------------------------------------------
// The shadow stack.

pub(crate) const HOLE: u32 = 0;
pub(crate) const LIVE: u32 = 1;
pub(crate) const RESTORED: u32 = 2;
pub(crate) const ZOMBIE: u32 = 3;

/// The entry is an XRay-style pairing: its slot was never touched.
pub(crate) const FL_NOHIJACK: u32 = 1;

/// One hooked call.
#[repr(C)]
pub(crate) struct ShadowEntry {
    /// The slot (0 while the entry is being filled: not matched yet).
    pub retp: u64,
    /// The real return address (the trampoline itself for a tail call from a hooked call).
    pub ret: u64,
    pub func: u64,
    pub calltime: u64,
    pub depth: u32,
    /// Bit i: user i took the call.
    pub users: u32,
    pub state: u32,
    pub flags: u32,
    /// [`EPOCH`] when the entry was pushed or last given a user: a `users` bit of a slot
    /// whose holder registered later ([`SINCE`]) is a bit of the slot's earlier holder.
    pub epoch: u32,
    pub data: [[u64; FGRAPH_DATA_WORDS]; FGRAPH_MAX_USERS],
}

/// A thread's shadow stack (one mapping; see the module docs).
#[repr(C)]
pub struct ShadowStack {
    /// Entries in use: `entries[..top]` (holes included).
    pub(crate) top: usize,
    /// The next thread's shadow stack (a list of all, for a return that finds its entry on
    /// another thread's: a coroutine moved between threads).
    next: AtomicPtr<ShadowStack>,
    /// Some entries are `RESTORED` (an unwinder is or was running).
    pub(crate) restored: bool,
    /// The restore was for an exception or forced unwind (not a backtrace).
    pub(crate) unwinding: bool,
    /// The stack pointer of the unwinder call that restored them.
    pub(crate) unwinder_sp: u64,
    /// Entries declared dead whose slot still held the trampoline.
    pub(crate) zombies: usize,
    /// Returns that found their entry only as a zombie, or on another thread.
    pub(crate) late_returns: u64,
    pub(crate) entries: [ShadowEntry; FGRAPH_CAPACITY],
}

/// Every thread's shadow stack (a push-only list).
static ALL_STACKS: AtomicPtr<ShadowStack> = AtomicPtr::new(std::ptr::null_mut());

/// Probe path: this thread's shadow stack, mapped on first use (`None` if `mmap` failed).
#[inline(always)]
pub(crate) fn shadow_stack(t: &probe_state::ThreadState) -> Option<&'static mut ShadowStack> {
    let p = t.fgraph.get();
    if !p.is_null() {
        // SAFETY: a mapping owned by this thread for its life, reached only from it (and
        // from a forked child's copy); the probe path holds no other reference across calls
        // that could alias it mutably (see the signal notes at the push and pop).
        return Some(unsafe { &mut *p });
    }
    map_shadow_stack(t)
}

#[cold]
#[inline(never)]
fn map_shadow_stack(t: &probe_state::ThreadState) -> Option<&'static mut ShadowStack> {
    let len = std::mem::size_of::<ShadowStack>() as u64;
    // SAFETY: an anonymous private mapping; the kernel picks the address.
    let r = unsafe {
        crate::sys::raw_syscall6(
            libc::SYS_mmap,
            [
                0,
                len,
                (libc::PROT_READ | libc::PROT_WRITE) as u64,
                (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE) as u64,
                u64::MAX,
                0,
            ],
        )
    };
    if r < 0 {
        return None;
    }
    let p = r as *mut ShadowStack;
    // Zero-filled memory is a valid empty ShadowStack (all holes, top 0, null next).
    let mut head = ALL_STACKS.load(Ordering::Relaxed);
    loop {
        // SAFETY: p is our fresh mapping.
        unsafe { (*p).next.store(head, Ordering::Relaxed) };
        // Release pairs with the Acquire loads of `find_elsewhere`.
        match ALL_STACKS.compare_exchange_weak(head, p, Ordering::Release, Ordering::Relaxed) {
            Ok(_) => break,
            Err(h) => head = h,
        }
    }
    t.fgraph.set(p);
    unwind::note_thread(p);
    // SAFETY: as in `shadow_stack`.
    Some(unsafe { &mut *p })
}

impl ShadowStack {
    /// Drop trailing holes.
    #[inline(always)]
    pub(crate) fn shrink(&mut self) {
        while self.top > 0 && self.entries[self.top - 1].state == HOLE {
            self.top -= 1;
        }
    }

    /// The depth of a call pushed now: one more than the nearest live entry below.
    #[inline(always)]
    fn next_depth(&self) -> u32 {
        self.depth_below(self.top)
    }

    /// The depth of a call whose entry goes at `at`: one more than the nearest live entry
    /// below it.
    #[inline(always)]
    fn depth_below(&self, at: usize) -> u32 {
        let mut i = at;
        while i > 0 {
            i -= 1;
            let e = &self.entries[i];
            if (e.state == LIVE || e.state == RESTORED) && e.retp != 0 {
                return e.depth + 1;
            }
        }
        0
    }
}

/// The callback of every graph user's ftrace ops: enter the graph from a site.
unsafe extern "C" fn fgraph_ftrace_entry(
    ip: u64,
    parent_ip: u64,
    op: &FtraceOps,
    regs: &mut PtRegs,
) {
    // SAFETY: every FtraceOps with this callback is the `ops` field of a &'static
    // FgraphOps (the callback is private to this module), so stepping back to the
    // containing struct stays inside it.
    let gops: &'static FgraphOps = unsafe {
        &*((op as *const FtraceOps as *const u8).sub(std::mem::offset_of!(FgraphOps, ops))
            as *const FgraphOps)
    };
    let Some((func, place, nohijack)) = super::site_info(ip) else {
        return;
    };
    let retp = match place {
        SitePlace::Entry | SitePlace::AfterEndbr => regs.sp,
        SitePlace::AfterPushR10 => regs.sp + 8,
        SitePlace::AfterPrologue => regs.rbp + 8,
    };
    // SAFETY: retp is the traced function's return-address slot, on the live stack (the
    // trampoline read parent_ip from the same place).
    let now = unsafe { *(retp as *const u64) };
    // Another graph user on this site may have hijacked it already (same call).
    if now != parent_ip && now != return_trampoline() {
        return;
    }
    // `nohijack`: an XRay entry sled whose exit sleds ftrace patched with it
    // (`super::xray`): the exits close the call, the return address stays the program's.
    // FTRACE_OPS_FL_RECURSION's guard (`ftrace_ops_assist_func`), here so that the entry
    // looks the thread up once.
    let t = probe_state::this_thread();
    let sp = stack_pointer();
    let _ = t.enter(Entry::Here(sp));
    if t.in_ftrace.get() != 0 {
        op.missed.fetch_add(1, Ordering::Relaxed);
        return;
    }
    t.in_ftrace.set(sp);
    // SAFETY: as above.
    unsafe { enter(t, gops, func, retp as *mut u64, regs, nohijack) };
    t.in_ftrace.set(0);
}

/// Probe path: enter function `func` whose return address is in `*retp` (from a kprobe
/// pre_handler at `func+0`: `retp = regs.sp`). Calls `gops.entryfunc`; if it returns true,
/// pushes a shadow entry (or adds this user to the entry already pushed for this call) and
/// hijacks the return address. Returns whether the call is hooked for this user.
///
/// # Safety
/// `retp` must be the live return-address slot of the call of `func` being entered, on
/// this thread's stack.
pub unsafe fn function_graph_enter_user(
    gops: &'static FgraphOps,
    func: u64,
    retp: *mut u64,
    regs: &mut PtRegs,
) -> bool {
    let t = probe_state::this_thread();
    let _ = t.enter(Entry::Here(stack_pointer()));
    // SAFETY: forwarded.
    unsafe { enter(t, gops, func, retp, regs, false) }
}

/// XRay: entry without touching the return address; paired by
/// [`function_graph_exit_nohijack`] with the top entry for `func` on this thread.
///
/// # Safety
/// `sp` must be the stack pointer at the function's entry (its return-address slot).
pub unsafe fn function_graph_enter_nohijack(
    gops: &'static FgraphOps,
    func: u64,
    sp: u64,
    regs: &mut PtRegs,
) -> bool {
    let t = probe_state::this_thread();
    let _ = t.enter(Entry::Here(stack_pointer()));
    // SAFETY: forwarded; no memory at sp is written.
    unsafe { enter(t, gops, func, sp as *mut u64, regs, true) }
}

/// XRay exit sled: close the top no-hijack entry of `func` on this thread (entries above it
/// on the same stack are closed as lost first).
///
/// # Safety
/// Probe path, from the exit sled of `func`.
pub unsafe fn function_graph_exit_nohijack(func: u64, sp: u64, regs: &PtRegs) {
    let _ = sp;
    let t = probe_state::this_thread();
    let Some(ss) = shadow_stack(t) else { return };
    let rettime = crate::ring::read_tsc();
    let mut i = ss.top;
    while i > 0 {
        i -= 1;
        let e = &ss.entries[i];
        if e.state == LIVE && e.flags & FL_NOHIJACK != 0 && e.func == func {
            let retp = e.retp;
            unwind::close_above(ss, i, retp, rettime, FgraphExit::Lost);
            call_retfuncs(t, ss, i, regs, FgraphExit::Returned, rettime);
            ss.entries[i].state = HOLE;
            ss.shrink();
            return;
        }
    }
}

/// A call `gops` could not hook (no room, no shadow stack). The function_graph tracer's are
/// also counted in the shared ring header at once, for the CLI (exact even if the process
/// never reaches its exit; a fork child counts in the same header).
#[cold]
#[inline(never)]
fn count_overrun(gops: &'static FgraphOps) {
    gops.overrun.fetch_add(1, Ordering::Relaxed);
    // Acquire pairs with the Release store in `count_overrun_in`.
    let also = gops.overrun_also.load(Ordering::Acquire);
    if !also.is_null() {
        // SAFETY: a &'static AtomicU64 (`count_overrun_in`).
        unsafe { &*also }.fetch_add(1, Ordering::Relaxed);
    }
    if std::ptr::eq(gops, &crate::function_graph::GRAPH_OPS) {
        if let Some(b) = crate::trace::buffer() {
            b.note_fgraph_overrun(1);
        }
    }
}

/// The shared entry path; `t` is this thread's state, its stale guards repaired.
///
/// # Safety
/// As [`function_graph_enter_user`].
#[inline(always)]
unsafe fn enter(
    t: &'static probe_state::ThreadState,
    gops: &'static FgraphOps,
    func: u64,
    retp: *mut u64,
    regs: &mut PtRegs,
    nohijack: bool,
) -> bool {
    let Some(u) = gops.slot() else { return false };
    let Some(ss) = shadow_stack(t) else {
        count_overrun(gops);
        return false;
    };
    let retp_v = retp as u64;
    // Entries the program left without returning (see fgraph_unwind): closed before this
    // event, deepest first.
    unwind::before_event(ss, retp_v, false);
    let bit = 1u32 << u;
    let top = ss.top;
    if top > 0 {
        // A second user on the same call (its ops' callback runs right after the first's).
        let e = &mut ss.entries[top - 1];
        if e.state == LIVE && e.retp == retp_v && e.func == func && e.users & bit == 0 {
            let ent = FgraphEnt {
                func,
                depth: e.depth,
                calltime: e.calltime,
                thread: t,
            };
            e.data[u] = [0; FGRAPH_DATA_WORDS];
            // SAFETY: the user's callback, with its contract.
            if unsafe { (gops.entryfunc)(&ent, gops, regs, &mut e.data[u]) } {
                // The entry may have moved down the list if a signal handler pushed above
                // it meanwhile; it is still at top - 1 (pushes above are popped or holes).
                let e = &mut ss.entries[top - 1];
                // Bits of earlier holders of their slots go before the epoch moves on.
                let mut stale = 0;
                let mut b = e.users;
                while b != 0 {
                    let v = b.trailing_zeros() as usize;
                    b &= b - 1;
                    if !holder_took(v, e.epoch) {
                        stale |= 1 << v;
                    }
                }
                e.users = (e.users & !stale) | bit;
                e.epoch = EPOCH.load(Ordering::Relaxed);
                return true;
            }
            return false;
        }
    }
    let mut at = top;
    if top >= FGRAPH_CAPACITY && !unwind::reclaim(ss) {
        match unwind::reusable_hole(ss, retp_v) {
            Some(h) => at = h,
            None => {
                count_overrun(gops);
                return false;
            }
        }
    }
    let top = ss.top;
    let (top, depth) = if at < top {
        (at, ss.depth_below(at))
    } else {
        (top, ss.next_depth())
    };
    let calltime = crate::ring::read_tsc();
    // Reserve the slot first (retp 0: not matched by a return yet), then fill it: a signal
    // handler that interrupts us pushes above it and pops back down to it.
    ss.entries[top].retp = 0;
    ss.entries[top].state = LIVE;
    compiler_fence(Ordering::SeqCst);
    if top >= ss.top {
        ss.top = top + 1;
    }
    compiler_fence(Ordering::SeqCst);
    let e = &mut ss.entries[top];
    e.ret = if nohijack {
        0
    } else {
        // SAFETY: the caller's contract: a live slot.
        unsafe { *retp }
    };
    e.func = func;
    e.calltime = calltime;
    e.depth = depth;
    e.users = 0;
    e.flags = if nohijack { FL_NOHIJACK } else { 0 };
    // After the Acquire load that found this user: at least its registration's epoch.
    e.epoch = EPOCH.load(Ordering::Relaxed);
    e.data[u] = [0; FGRAPH_DATA_WORDS];
    let ent = FgraphEnt {
        func,
        depth,
        calltime,
        thread: t,
    };
    // SAFETY: the user's callback, with its contract.
    let take = unsafe { (gops.entryfunc)(&ent, gops, regs, &mut e.data[u]) };
    let e = &mut ss.entries[top];
    if !take {
        e.state = HOLE;
        ss.shrink();
        return false;
    }
    e.users = bit;
    compiler_fence(Ordering::SeqCst);
    e.retp = retp_v;
    compiler_fence(Ordering::SeqCst);
    if !nohijack {
        // SAFETY: the caller's contract: a live slot; the entry holds the real address.
        unsafe { *retp = return_trampoline() };
    }
    true
}

/// The data words of the nearest entry below the call being entered that `gops` took (its
/// parent call for this user) on the same stack: for an entryfunc that inherits state from
/// its caller (the function_graph tracer's depth and `set_graph_function`). Probe path.
pub fn parent_data(gops: &FgraphOps, retp: u64) -> Option<[u64; FGRAPH_DATA_WORDS]> {
    parent_data_of(probe_state::this_thread(), gops, retp)
}

/// [`parent_data`] for thread state `t` (no TLS access).
#[inline(always)]
pub(crate) fn parent_data_of(
    t: &probe_state::ThreadState,
    gops: &FgraphOps,
    retp: u64,
) -> Option<[u64; FGRAPH_DATA_WORDS]> {
    let u = gops.slot()?;
    let p = t.fgraph.get();
    if p.is_null() {
        return None;
    }
    // SAFETY: as in `shadow_stack`; read only.
    let ss = unsafe { &*p };
    let mut other = None;
    let mut i = ss.top;
    while i > 0 {
        i -= 1;
        let e = &ss.entries[i];
        if (e.state == LIVE || e.state == RESTORED)
            && e.retp != 0
            && e.users & (1 << u) != 0
            && holder_took(u, e.epoch)
        {
            if e.retp > retp && unwind::same_stack(e.retp, retp) {
                return Some(e.data[u]);
            }
            if other.is_none() {
                other = Some(e.data[u]);
            }
        }
    }
    // The first call of a signal handler on the signal stack nests under the call it
    // interrupted (the topmost of another stack), as it would on the thread's stack.
    other.filter(|_| unwind::on_signal_stack(retp))
}

/// Call the return callback of each user of entry `i` (then the caller frees it). Each
/// user is taken out of the entry's `users` before its callback runs: a signal handler that
/// interrupts this and leaves by `siglongjmp` closes the entry with the users not called
/// yet, never one twice (a kretprobe's count of live instances taken down twice wrapped
/// below zero: every later call of the function was missed).
#[inline(always)]
pub(crate) fn call_retfuncs(
    t: &probe_state::ThreadState,
    ss: &mut ShadowStack,
    i: usize,
    regs: &PtRegs,
    exit: FgraphExit,
    rettime: u64,
) {
    let e = &ss.entries[i];
    let returned = exit == FgraphExit::Returned;
    let r = FgraphRet {
        func: e.func,
        depth: e.depth,
        calltime: e.calltime,
        rettime,
        retval: if returned { regs.rax } else { 0 },
        retval2: if returned { regs.rdx } else { 0 },
        exit,
        ret: e.ret,
        retp: e.retp,
        thread: t,
    };
    let epoch = ss.entries[i].epoch;
    loop {
        let e = &mut ss.entries[i];
        if e.users == 0 {
            break;
        }
        let u = e.users.trailing_zeros() as usize;
        e.users &= e.users - 1;
        let data = e.data[u];
        compiler_fence(Ordering::SeqCst);
        if let Some(g) = user(u).filter(|_| holder_took(u, epoch)) {
            // SAFETY: the user's callback, with its contract.
            unsafe { (g.retfunc)(&r, g, regs, &data) };
        }
    }
}

/// The return trampoline's handler (called from the asm with its frame's `PtRegs`): finds
/// the entry for `regs.sp - 8`, writes the real return address into `regs.ip` and the slot,
/// and calls the return callbacks.
///
/// # Safety
/// Only from the return trampoline.
pub(crate) unsafe extern "C" fn ftprobe_fgraph_return(regs: &mut PtRegs) {
    let retp = regs.sp - 8;
    let t = probe_state::this_thread();
    let sp = stack_pointer();
    let _ = t.enter(Entry::Here(sp));
    let rettime = crate::ring::read_tsc();
    let p = t.fgraph.get();
    let found = if p.is_null() {
        None
    } else {
        // SAFETY: as in `shadow_stack`.
        let ss = unsafe { &mut *p };
        let mut i = ss.top;
        let mut k = None;
        while i > 0 {
            i -= 1;
            let e = &ss.entries[i];
            if e.retp == retp && (e.state == LIVE || e.state == ZOMBIE) {
                k = Some(i);
                break;
            }
        }
        k.map(|k| (ss, k))
    };
    let Some((ss, k)) = found else {
        // SAFETY: forwarded.
        unsafe { return_elsewhere(regs, retp) };
        return;
    };
    let ret = ss.entries[k].ret;
    regs.ip = ret;
    // SAFETY: retp is the slot this entry hijacked, just below the caller's stack pointer;
    // the trampoline's `ret` pops it. Written first so that unwinders see the real caller.
    unsafe { *(retp as *mut u64) = ret };
    if ss.entries[k].state == ZOMBIE {
        // Reported closed already; it returned after all.
        ss.late_returns += 1;
        ss.zombies = ss.zombies.saturating_sub(1);
        ss.entries[k].state = HOLE;
        ss.shrink();
        return;
    }
    // A return above restored entries, or above entries whose frames are gone: closed first.
    unwind::before_event(ss, retp, true);
    unwind::close_above(ss, k, retp, rettime, FgraphExit::Lost);
    let guard = t.in_ftrace.get() == 0;
    if guard {
        t.in_ftrace.set(sp);
    }
    call_retfuncs(t, ss, k, regs, FgraphExit::Returned, rettime);
    if guard {
        t.in_ftrace.set(0);
    }
    ss.entries[k].state = HOLE;
    ss.shrink();
}

/// A return whose entry is not on this thread's shadow stack: a coroutine that moved to
/// another thread (its entry is on that thread's), else fatal.
#[cold]
#[inline(never)]
unsafe fn return_elsewhere(regs: &mut PtRegs, retp: u64) {
    // Acquire pairs with the Release CAS in `map_shadow_stack`.
    let mut p = ALL_STACKS.load(Ordering::Acquire);
    while !p.is_null() {
        // SAFETY: shadow stacks are never unmapped; another thread's may change meanwhile
        // (a rare race accepted here: this path only runs for a migrated coroutine).
        let ss = unsafe { &mut *p };
        for i in (0..ss.top.min(FGRAPH_CAPACITY)).rev() {
            let e = &mut ss.entries[i];
            if e.retp == retp && (e.state == LIVE || e.state == ZOMBIE) {
                let ret = e.ret;
                e.state = HOLE;
                regs.ip = ret;
                // SAFETY: as in ftprobe_fgraph_return.
                unsafe { *(retp as *mut u64) = ret };
                ss.late_returns += 1;
                return;
            }
        }
        p = ss.next.load(Ordering::Acquire);
    }
    unwind::fatal_no_entry(retp);
}

/// How far above a kept stack pointer (a thread stopped in ftprobe's code, see
/// [`unhook_returns`]) a slot is taken to be that thread's.
const KEEP_SPAN: u64 = 8 << 20;

/// The end of a session whose process goes on (an attached agent's detach): every hooked
/// call still running, on every thread, gets its real return address back in its slot and
/// its entry dropped (its return is not reported: the session is over). Without this, a
/// frame still returning through the trampoline after the detach could not be unwound (no
/// unwind information for it, and the unwinder probes are gone): an exception thrown
/// through it ended the program in `std::terminate` (issue 26, item 5). Entries whose slot
/// lies within 8 MiB above one of `keep_sps` (threads stopped inside ftprobe's
/// code, perhaps in the return trampoline itself; `None`: the stacks are not known, every
/// hooked call is left) are left, as are entries whose slot no longer holds the trampoline.
/// Returns (restored, left).
///
/// # Safety
/// Every other thread of the process is stopped, none in the middle of an fgraph event
/// except those whose stack pointer is in `keep_sps`, and no graph user is registered.
pub unsafe fn unhook_returns(keep_sps: Option<&[u64]>) -> (usize, usize) {
    let (mut restored, mut left) = (0, 0);
    let kept = |retp: u64| match keep_sps {
        Some(sps) => sps
            .iter()
            .any(|&sp| retp.wrapping_add(8) >= sp && retp < sp.saturating_add(KEEP_SPAN)),
        None => true,
    };
    // Acquire pairs with the Release CAS in `map_shadow_stack`.
    let mut p = ALL_STACKS.load(Ordering::Acquire);
    while !p.is_null() {
        // SAFETY: shadow stacks are never unmapped; their threads are stopped (the
        // caller's contract), or the caller's own.
        let ss = unsafe { &mut *p };
        // Top down: a tail call's entry (its `ret` is the trampoline) is written before the
        // entry below it with the same slot, which writes the real address last.
        for i in (0..ss.top.min(FGRAPH_CAPACITY)).rev() {
            let e = &mut ss.entries[i];
            if e.state != LIVE || e.retp == 0 || e.flags & FL_NOHIJACK != 0 {
                continue;
            }
            let mut b = [0u8; 8];
            let holds = crate::sys::read_nofault(e.retp, &mut b) == 8
                && u64::from_le_bytes(b) == return_trampoline();
            if !holds {
                continue;
            }
            if kept(e.retp) {
                left += 1;
                continue;
            }
            // SAFETY: a live entry's slot in a frame of a stopped thread (or of the
            // caller's, above this call), holding the trampoline: the call's own slot.
            unsafe { *(e.retp as *mut u64) = e.ret };
            e.state = HOLE;
            e.users = 0;
            restored += 1;
        }
        ss.shrink();
        p = ss.next.load(Ordering::Acquire);
    }
    (restored, left)
}

/// `ftrace_graph_ret_addr()`: the real return address for a slot `retp` holding `ret`
/// (unchanged if `ret` is not the return trampoline or no entry of this thread has `retp`).
pub fn ftrace_graph_ret_addr(ret: u64, retp: *const u64) -> u64 {
    if ret != return_trampoline() {
        return ret;
    }
    let t = probe_state::this_thread();
    let p = t.fgraph.get();
    if p.is_null() {
        return ret;
    }
    // SAFETY: as in `shadow_stack`; read only.
    let ss = unsafe { &*p };
    let mut i = ss.top.min(FGRAPH_CAPACITY);
    // A tail call's entry holds the trampoline as its `ret`: the next entry for the same
    // slot holds the real one.
    while i > 0 {
        i -= 1;
        let e = &ss.entries[i];
        if e.retp == retp as u64 && e.state != HOLE && e.ret != return_trampoline() {
            return e.ret;
        }
    }
    ret
}

/// Counts for tests and the agent: (overrun, late returns of this thread).
pub fn thread_late_returns() -> u64 {
    let p = probe_state::this_thread().fgraph.get();
    if p.is_null() {
        return 0;
    }
    // SAFETY: as in `shadow_stack`; read only.
    unsafe { (*p).late_returns }
}

/// Live (hooked, not yet returned) entries of this thread: for tests.
pub fn thread_depth() -> usize {
    let p = probe_state::this_thread().fgraph.get();
    if p.is_null() {
        return 0;
    }
    // SAFETY: as in `shadow_stack`; read only.
    let ss = unsafe { &*p };
    ss.entries[..ss.top]
        .iter()
        .filter(|e| e.state == LIVE || e.state == RESTORED)
        .count()
}

/// An address inside the return trampoline's code (for unwinders and the NOKPROBE list).
pub fn is_return_trampoline(addr: u64) -> bool {
    let (s, e) = return_trampoline::range();
    addr >= s && addr < e
}
