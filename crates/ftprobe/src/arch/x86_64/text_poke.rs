//! Live patching of code that other threads may be executing: the user-space form of the
//! kernel's `text_poke_bp_batch()` (arch/x86/kernel/alternative.c).
//!
//! For a batch of 5-byte sites:
//! 1. publish the batch for the SIGTRAP handler, write `int3` on the first byte of every site,
//!    serialize every thread (`membarrier(PRIVATE_EXPEDITED_SYNC_CORE)`);
//! 2. write bytes 1..5 of every site, serialize;
//! 3. write the first byte of every site, serialize;
//! 4. unpublish the batch and wait until no SIGTRAP handler still reads it.
//!
//! A thread that reaches a site while it is in flight executes the `int3`; the handler finds
//! the site in the batch and emulates the *new* instruction (a NOP: skip it; a call: push the
//! return address and jump; the `jmp`s and `ret` of XRay sleds), exactly as the kernel's `poke_int3_handler()` does. A trap that is
//! not ours is passed on to the handler that was installed before ours.
//!
//! Code is never made writable: every store goes through `code_write` (a write to
//! `/proc/self/mem`; a batch's changes joined into one write per run of nearby sites).

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

use super::nops::{call_target, INT3, SITE_LEN};
use super::sigframe;
use crate::probe_state;
use crate::sys::{self, SyscallError};

/// One site to rewrite: its address and its new 5 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Poke {
    /// Address of the site's first byte in this process.
    pub addr: u64,
    /// The 5 bytes the site holds now, restored if the batch fails.
    pub old: [u8; 5],
    /// The 5 bytes the site must hold afterwards.
    pub new: [u8; 5],
}

/// What the patching layer has done since the process started: counted with relaxed atomics
/// outside the probe path (the SIGTRAP handler adds one to `emulated` per site it emulates).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PokeStats {
    /// Calls of [`text_poke_batch`] that wrote something.
    pub batches: u64,
    /// Sites rewritten by those batches (an XRay exit sled counts as one).
    pub sites: u64,
    /// Bytes of code stored by them (int3s, tails, first bytes; a failed batch's restores too).
    pub bytes: u64,
    /// Pages of code those bytes are on, counted once per batch.
    pub pages: u64,
    /// `membarrier(PRIVATE_EXPEDITED_SYNC_CORE)` calls made by them and by [`poke_byte`].
    pub sync_core: u64,
    /// Writes to `/proc/self/mem` that stored them (and every other code write:
    /// `code_write`), a run of nearby changes in one.
    pub writes: u64,
    /// Writes made through a transient `rwx` window instead, because the kernel refused
    /// writes through `/proc/self/mem` (`code_write`): 0 on a usual kernel.
    pub fallbacks: u64,
    /// Threads that hit an int3 of a batch in flight and had the site's new instruction
    /// emulated by the SIGTRAP handler.
    pub emulated: u64,
}

static STAT_BATCHES: AtomicU64 = AtomicU64::new(0);
static STAT_SITES: AtomicU64 = AtomicU64::new(0);
static STAT_BYTES: AtomicU64 = AtomicU64::new(0);
static STAT_PAGES: AtomicU64 = AtomicU64::new(0);
static STAT_SYNC_CORE: AtomicU64 = AtomicU64::new(0);
static STAT_EMULATED: AtomicU64 = AtomicU64::new(0);

/// The counters of [`PokeStats`] as they are now (subtract two readings for one operation).
pub fn stats() -> PokeStats {
    // Relaxed: statistics, no ordering with the code they count.
    PokeStats {
        batches: STAT_BATCHES.load(Ordering::Relaxed),
        sites: STAT_SITES.load(Ordering::Relaxed),
        bytes: STAT_BYTES.load(Ordering::Relaxed),
        pages: STAT_PAGES.load(Ordering::Relaxed),
        sync_core: STAT_SYNC_CORE.load(Ordering::Relaxed),
        writes: super::code_write::writes(),
        fallbacks: super::code_write::fallbacks(),
        emulated: STAT_EMULATED.load(Ordering::Relaxed),
    }
}

/// `sync_core_all_threads`, counted in [`PokeStats::sync_core`].
fn sync_core() -> Result<(), SyscallError> {
    // Relaxed: a statistic.
    STAT_SYNC_CORE.fetch_add(1, Ordering::Relaxed);
    sys::sync_core_all_threads()
}

/// Errors of the patching layer.
#[derive(Debug, thiserror::Error)]
pub enum TextPokeError {
    /// A system call failed (mprotect, membarrier, sigaction).
    #[error(transparent)]
    Syscall(#[from] SyscallError),
}

/// The batch in flight, sorted by address: a pointer to [`text_poke_batch`]'s local copy of
/// the slice pointer, null between batches.
static BATCH: AtomicPtr<*const [Poke]> = AtomicPtr::new(std::ptr::null_mut());
static HANDLERS_ACTIVE: AtomicUsize = AtomicUsize::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);
/// Signals whose handler is ftprobe's (bit `sig`): SIGTRAP, and the fault signals once an
/// XOL slot exists ([`install_fault_handlers`]).
static OWNED: AtomicU64 = AtomicU64::new(0);
/// Per signal, the program's action, which ftprobe's handler delivers the signals it did not
/// cause to: the one in place before ours, then whatever the program installs later (the
/// agent interposes `sigaction`/`signal`, see [`replace_chained`]). Leaked boxes: a handler
/// may be reading the previous one.
static CHAINED: [AtomicPtr<libc::sigaction>; 65] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; 65];

/// `SIG_DFL`, for a reset on delivery (`SA_RESETHAND`) without allocating.
// SAFETY: a zeroed sigaction is a valid value: SIG_DFL, no flags, an empty mask.
static DFL_ACTION: libc::sigaction = unsafe { std::mem::zeroed() };

/// The fault signals whose handler becomes ftprobe's while XOL slots exist.
pub const FAULT_SIGNALS: [libc::c_int; 4] =
    [libc::SIGSEGV, libc::SIGBUS, libc::SIGILL, libc::SIGFPE];

/// Whether ftprobe's SIGTRAP handler is installed.
pub fn installed() -> bool {
    INSTALLED.load(Ordering::Acquire)
}

/// Whether ftprobe's handler is installed for `sig` (SIGTRAP, or a fault signal).
pub fn owns(sig: libc::c_int) -> bool {
    // Acquire pairs with the Release fetch_or where a handler is installed.
    (0..64).contains(&sig) && OWNED.load(Ordering::Acquire) & (1 << sig) != 0
}

fn chained_slot(sig: libc::c_int) -> Option<&'static AtomicPtr<libc::sigaction>> {
    usize::try_from(sig).ok().and_then(|s| CHAINED.get(s))
}

/// The program's action for `sig` as ftprobe keeps it (SIG_DFL if none).
fn chained(sig: libc::c_int) -> libc::sigaction {
    // Acquire pairs with the Release stores in `replace_chained` and where it is installed.
    match chained_slot(sig).map(|c| c.load(Ordering::Acquire)) {
        // SAFETY: CHAINED holds leaked, never-freed Boxes.
        Some(p) if !p.is_null() => unsafe { *p },
        // SAFETY: a zeroed sigaction is valid: SIG_DFL.
        _ => unsafe { std::mem::zeroed() },
    }
}

/// The program's view of a signal whose handler is ftprobe's ([`owns`]): store `new` (if
/// any) as the action the signals ftprobe did not cause go to, and return the previous one.
/// What an interposed `sigaction(sig, new, old)` does, so that the program's handler keeps
/// working and ftprobe's stays in place.
pub fn replace_chained(sig: libc::c_int, new: Option<&libc::sigaction>) -> libc::sigaction {
    let prev = chained(sig);
    if let (Some(n), Some(slot)) = (new, chained_slot(sig)) {
        // Release pairs with the Acquire load in `chained`.
        slot.store(Box::into_raw(Box::new(*n)), Ordering::Release);
    }
    prev
}

/// A trap handler of a higher layer (int3 kprobes), called for a trap that is not a batch in
/// flight; returns whether the trap was its own. Probe path: async-signal-safe.
pub type TrapHook = fn(&mut libc::ucontext_t) -> bool;

static TRAP_HOOK: AtomicPtr<()> = AtomicPtr::new(std::ptr::null_mut());

/// Register the trap hook (one; a later call replaces it).
pub fn set_trap_hook(hook: TrapHook) {
    // Release pairs with the Acquire load in `sigtrap_handler`.
    TRAP_HOOK.store(hook as *mut (), Ordering::Release);
}

/// Called by ftprobe's handler just before it lets a SIGTRAP that is not its own kill the
/// program (SIGTRAP's default action, as without ftprobe). Probe path: async-signal-safe.
pub type FatalTrapHook = fn();

static FATAL_TRAP_HOOK: AtomicPtr<()> = AtomicPtr::new(std::ptr::null_mut());

/// Register the fatal-trap hook (one; a later call replaces it).
pub fn set_fatal_trap_hook(hook: FatalTrapHook) {
    // Release pairs with the Acquire load in `deliver`.
    FATAL_TRAP_HOOK.store(hook as *mut (), Ordering::Release);
}

/// Write one byte of code and make every thread see it: arming or disarming an int3
/// (a one-byte store is atomic with respect to instruction fetch; `sync_core` follows).
///
/// # Safety
/// `addr` must be the first byte of an instruction in writable code of this process (or the
/// int3 this module wrote there), and `byte` either `INT3` or that instruction's original first
/// byte.
pub unsafe fn poke_byte(addr: u64, byte: u8) -> Result<(), TextPokeError> {
    init()?;
    // Before the write (SeqCst): a SIGTRAP handler that sees this byte sees the count moved
    // (`sigtrap_work`).
    POKE_SEQ.fetch_add(1, Ordering::SeqCst);
    // SAFETY: the caller's contract.
    unsafe { super::code_write::write(addr, &[byte])? };
    // Relaxed: a statistic.
    STAT_BYTES.fetch_add(1, Ordering::Relaxed);
    sync_core()?;
    Ok(())
}

/// Write `bytes` over `addr + 1 ..` while the int3 at `addr` guards them (an optprobe's
/// `jmp` rel32 going in, or the original bytes coming back), then make every thread see them.
///
/// # Safety
/// `addr` must hold an int3 this module wrote, `addr + 1 .. addr + 1 + bytes.len()` must be
/// inside writable code that no thread executes now or can reach before the int3 is replaced
/// (`kprobes::opt` checks it), and `bytes` either an optprobe's rel32 or the original bytes.
pub unsafe fn poke_behind_int3(addr: u64, bytes: &[u8]) -> Result<(), TextPokeError> {
    init()?;
    // SAFETY: the caller's contract.
    unsafe { super::code_write::write(addr + 1, bytes)? };
    // Relaxed: a statistic.
    STAT_BYTES.fetch_add(bytes.len() as u64, Ordering::Relaxed);
    sync_core()?;
    Ok(())
}

/// Install the SIGTRAP handler and register for membarrier. Idempotent.
pub fn init() -> Result<(), TextPokeError> {
    if INSTALLED.load(Ordering::Acquire) {
        return Ok(());
    }
    sys::membarrier_register()?;
    install(libc::SIGTRAP, sigtrap_entry())?;
    // Release pairs with the Acquire load in `deliver`.
    INSTALLED.store(true, Ordering::Release);
    Ok(())
}

type Handler = extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void);

/// Install ftprobe's `handler` for `sig`, keeping the action in place as the program's.
fn install(sig: libc::c_int, handler: Handler) -> Result<(), TextPokeError> {
    // SAFETY: a zeroed sigaction is a valid value (empty mask, no flags, SIG_DFL).
    let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
    act.sa_sigaction = handler as *const () as usize;
    // SA_NODEFER: a probe handler running inside this handler may hit another int3 probe; with
    // SIGTRAP blocked the kernel would kill the process instead of delivering it. The
    // program's handler gets its own mask ([`deliver`]).
    act.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART | libc::SA_ONSTACK | libc::SA_NODEFER;
    // No signal is blocked while the handler runs (an empty `sa_mask`): one blocked there
    // would be routed by the kernel to another thread (`tramp_signals::enter_trap`). A
    // program's signal that comes inside the handler waits until it is done (held by the
    // wrapper of the program's handlers): none interrupts the probe path in it (to leave it
    // by a non-local exit) or runs while a batch is being emulated.
    // SAFETY: a zeroed sigaction is a valid value.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: `act` is a valid sigaction whose handler is async-signal-safe; `old` is ours.
    let r = unsafe { sys::real_sigaction(sig, &act, &mut old) };
    if r != 0 {
        return Err(SyscallError {
            call: "sigaction",
            source: std::io::Error::last_os_error(),
        }
        .into());
    }
    if let Some(slot) = chained_slot(sig) {
        // Release pairs with the Acquire load in `chained`.
        slot.store(Box::into_raw(Box::new(old)), Ordering::Release);
    }
    // Release pairs with the Acquire load in `owns`.
    OWNED.fetch_or(1 << sig, Ordering::Release);
    Ok(())
}

/// A fault handler of a higher layer (int3 kprobes' `abort_xol`): called for a fault signal
/// before the program's handler sees it; may rewrite the context. Probe path.
pub type FaultHook = fn(&mut libc::ucontext_t) -> bool;

static FAULT_HOOK: AtomicPtr<()> = AtomicPtr::new(std::ptr::null_mut());

/// Make ftprobe's handler the one for the fault signals ([`FAULT_SIGNALS`]), calling `hook`
/// before the program's handler. Idempotent.
pub fn install_fault_handlers(hook: FaultHook) -> Result<(), TextPokeError> {
    // Release pairs with the Acquire load in `fault_handler`.
    FAULT_HOOK.store(hook as *mut (), Ordering::Release);
    for sig in FAULT_SIGNALS {
        if !owns(sig) {
            install(sig, fault_handler)?;
        }
    }
    Ok(())
}

/// Make ftprobe's handler the one for SIGSEGV and SIGBUS, without a [`FaultHook`]: what the
/// fault-safe reads need (`uaccess`: a fault at one of their loads resumes at its fixup).
/// Idempotent.
pub fn install_fault_signal_handlers() -> Result<(), TextPokeError> {
    for sig in [libc::SIGSEGV, libc::SIGBUS] {
        if !owns(sig) {
            install(sig, fault_handler)?;
        }
    }
    Ok(())
}

/// Whether `h` (a `sa_sigaction` the kernel reported) is ftprobe's fault handler.
pub fn is_fault_handler(h: libc::sighandler_t) -> bool {
    h == fault_handler as *const () as usize
}

// ---- the program's other handlers while XOL slots exist ----------------------------------
//
// A boosted slot runs with every signal deliverable: an asynchronous signal (a timer's, one
// held while ftprobe's SIGTRAP handler ran and delivered as it returns into the slot) can
// interrupt a thread at a slot's instruction or at its `jmp` back. While slots exist, every
// handler the program installs for a signal other than SIGTRAP and the fault signals is
// installed with ftprobe's [`wrapper`] in its place, with the program's own flags and mask
// (the kernel still chooses the stack, blocks the mask, resets with `SA_RESETHAND`, restarts
// with `SA_RESTART` exactly as for the program's action), plus `SA_SIGINFO` for the
// context. The wrapper shows the program the probed instruction's address instead of the
// slot's ([`PcHook`]) and puts the slot's back if the handler left it. `SIG_DFL` and
// `SIG_IGN` are installed as they are. What `sigaction` reports is the program's action.

/// Maps a PC inside an XOL slot to the address the program must see (0: not in a slot).
/// Probe path.
pub type PcHook = fn(u64) -> u64;

static PC_HOOK: AtomicPtr<()> = AtomicPtr::new(std::ptr::null_mut());

/// Asked before a program's handler runs, after `tramp_signals`: whether the signal is held
/// (optprobes' detours: `kprobes::opt::on_program_signal`). Probe path.
pub type SignalHook = fn(libc::c_int, *mut libc::siginfo_t, &mut libc::ucontext_t) -> bool;

static SIGNAL_HOOK: AtomicPtr<()> = AtomicPtr::new(std::ptr::null_mut());

/// Install the [`SignalHook`] (before the first detour exists).
pub fn set_signal_hook(hook: SignalHook) {
    // Release pairs with the Acquire load in `held_for_trampoline`.
    SIGNAL_HOOK.store(hook as *mut (), Ordering::Release);
}
/// [`wrap_program_handlers`] ran.
static WRAPPING: AtomicBool = AtomicBool::new(false);
/// Per signal: the kernel's action is (or was, before an `SA_RESETHAND` reset) ftprobe's
/// wrapper with `SA_SIGINFO` the program's action did not have.
static ADDED_SIGINFO: [AtomicBool; 65] = [const { AtomicBool::new(false) }; 65];

/// Whether the program's handlers for `sig` are wrapped ([`wrap_program_handlers`] ran):
/// catchable signals but SIGTRAP, the fault signals and the C library's own two (32, 33).
pub fn wraps(sig: libc::c_int) -> bool {
    WRAPPING.load(Ordering::Acquire)
        && (1..=64).contains(&sig)
        && !matches!(sig, libc::SIGKILL | libc::SIGSTOP | libc::SIGTRAP | 32 | 33)
        && !FAULT_SIGNALS.contains(&sig)
}

/// Wrap the handlers the program has installed, and those it installs from now on
/// (through the agent's `sigaction`, [`sigaction_wrapped`]); with `hook`, the wrapper shows
/// PCs in XOL slots as the probed instruction's. Idempotent. Ftrace trampolines need the
/// wrapper too (`tramp_signals`: a signal is held while a trampoline runs).
pub fn wrap_program_handlers(hook: Option<PcHook>) -> Result<(), TextPokeError> {
    if let Some(hook) = hook {
        // Release pairs with the Acquire load in `wrapper`.
        PC_HOOK.store(hook as *mut (), Ordering::Release);
    }
    // Release pairs with the Acquire loads in `wraps`.
    if WRAPPING.swap(true, Ordering::AcqRel) {
        return Ok(());
    }
    for sig in 1..=64 {
        if !wraps(sig) {
            continue;
        }
        // SAFETY: a zeroed sigaction is valid; sigaction only writes it.
        let mut cur: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: reading the action of a catchable signal into our own struct.
        if unsafe { sys::real_sigaction(sig, std::ptr::null(), &mut cur) } != 0 {
            continue;
        }
        if cur.sa_sigaction == libc::SIG_DFL || cur.sa_sigaction == libc::SIG_IGN {
            continue;
        }
        *probe_state::mask_word(&mut cur.sa_mask) &= !probe_state::bit(libc::SIGTRAP);
        let act = wrap_action(sig, &cur);
        // SAFETY: the program's action with ftprobe's wrapper in its place.
        if unsafe { sys::real_sigaction(sig, &act, std::ptr::null_mut()) } != 0 {
            return Err(SyscallError {
                call: "sigaction",
                source: std::io::Error::last_os_error(),
            }
            .into());
        }
    }
    Ok(())
}

/// The action to give the kernel for the program's `act` on a wrapped signal: its handler
/// kept as the one ftprobe's wrapper calls, the wrapper in its place.
fn wrap_action(sig: libc::c_int, act: &libc::sigaction) -> libc::sigaction {
    let Some(added) = usize::try_from(sig).ok().and_then(|s| ADDED_SIGINFO.get(s)) else {
        return *act;
    };
    if act.sa_sigaction == libc::SIG_DFL || act.sa_sigaction == libc::SIG_IGN {
        // Relaxed: per-signal bookkeeping of the calling thread's sigaction.
        added.store(false, Ordering::Relaxed);
        return *act;
    }
    replace_chained(sig, Some(act));
    added.store(act.sa_flags & libc::SA_SIGINFO == 0, Ordering::Relaxed);
    let mut w = *act;
    w.sa_sigaction = wrapper as *const () as usize;
    w.sa_flags |= libc::SA_SIGINFO;
    w
}

/// `sigaction(sig, act, old)` for the program, through `real` (the C library's): on a
/// wrapped signal ([`wraps`]) the kernel gets the wrapped action and `old` reports the
/// program's (its handler, its flags: an `SA_RESETHAND` reset reads back as the kernel
/// reports it for the program's action).
///
/// # Safety
/// `old` is null or writable; `real` is a `sigaction`.
pub unsafe fn sigaction_wrapped(
    sig: libc::c_int,
    act: Option<&libc::sigaction>,
    old: *mut libc::sigaction,
    real: impl FnOnce(*const libc::sigaction, *mut libc::sigaction) -> libc::c_int,
) -> libc::c_int {
    if !wraps(sig) {
        return real(act.map_or(std::ptr::null(), |a| a as *const _), old);
    }
    let prev = chained(sig).sa_sigaction;
    // Relaxed: see `wrap_action`.
    let prev_added = ADDED_SIGINFO[sig as usize].load(Ordering::Relaxed);
    let new = act.map(|a| wrap_action(sig, a));
    let r = real(
        new.as_ref().map_or(std::ptr::null(), |a| a as *const _),
        old,
    );
    // SAFETY: the caller's contract: null or writable (and just filled in).
    if let (0, Some(o)) = (r, unsafe { old.as_mut() }) {
        if o.sa_sigaction == wrapper as *const () as usize {
            o.sa_sigaction = prev;
        }
        if prev_added {
            o.sa_flags &= !libc::SA_SIGINFO;
        }
    }
    r
}

/// The program's handler as `sigaction` must report it: `h` itself, or the program's
/// handler for `sig` when `h` is ftprobe's wrapper (for interposers of calls that return a
/// handler, such as `sigset`).
pub fn program_handler(sig: libc::c_int, h: libc::sighandler_t) -> libc::sighandler_t {
    if h == wrapper as *const () as usize {
        chained(sig).sa_sigaction
    } else {
        h
    }
}

/// Probe path: the kernel's handler for a wrapped signal (module section above). The kernel
/// has already applied the program's action (stack, mask, reset); only the PC is shown as
/// the program's own when the thread was in an XOL slot.
extern "C" fn wrapper(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // The handler and flags only: the wrapper's frame stays small (it is below the program's
    // handler on a signal stack that may be small).
    let (h, flags) = chained_handler(sig);
    if h == libc::SIG_DFL || h == libc::SIG_IGN {
        wrapped_default(sig, h);
        return;
    }
    // SAFETY: the kernel passes a valid ucontext_t to an SA_SIGINFO handler; this thread's.
    let uc = unsafe { &mut *(ctx as *mut libc::ucontext_t) };
    if held_for_trampoline(sig, info, uc, flags) {
        return;
    }
    let pc = uc.uc_mcontext.gregs[libc::REG_RIP as usize];
    let hook = PC_HOOK.load(Ordering::Acquire);
    let shown = if hook.is_null() {
        0
    } else {
        // SAFETY: PC_HOOK only ever holds a `PcHook`.
        let hook: PcHook = unsafe { std::mem::transmute::<*mut (), PcHook>(hook) };
        hook(pc as u64) as i64
    };
    if shown != 0 {
        uc.uc_mcontext.gregs[libc::REG_RIP as usize] = shown;
    }
    if flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the program installed this handler for `sig` with SA_SIGINFO.
        let f: Handler = unsafe { std::mem::transmute(h) };
        f(sig, info, ctx);
    } else {
        // SAFETY: the program installed this plain handler for `sig`.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(h) };
        f(sig);
    }
    // The handler left the PC as shown: resume in the slot (the probe must not fire again).
    // A PC the handler changed is the handler's.
    if shown != 0 && uc.uc_mcontext.gregs[libc::REG_RIP as usize] == shown {
        uc.uc_mcontext.gregs[libc::REG_RIP as usize] = pc;
    }
}

/// The program's handler and flags for `sig` as ftprobe keeps them, without copying the
/// whole action (SIG_DFL if none).
fn chained_handler(sig: libc::c_int) -> (libc::sighandler_t, libc::c_int) {
    // Acquire pairs with the Release stores in `replace_chained` and where it is installed.
    match chained_slot(sig).map(|c| c.load(Ordering::Acquire)) {
        // SAFETY: CHAINED holds leaked, never-freed Boxes.
        Some(p) if !p.is_null() => unsafe { ((*p).sa_sigaction, (*p).sa_flags) },
        _ => (libc::SIG_DFL, 0),
    }
}

/// The wrapper found the program's action reset to `h` (SIG_DFL or SIG_IGN) under a signal
/// in flight: as that action.
#[cold]
#[inline(never)]
fn wrapped_default(sig: libc::c_int, h: libc::sighandler_t) {
    if h == libc::SIG_DFL {
        // SAFETY: sigaction and raise are async-signal-safe; the signal is held (blocked in
        // this handler unless SA_NODEFER) until the kernel's default action takes it.
        unsafe {
            sys::real_sigaction(sig, &DFL_ACTION, std::ptr::null_mut());
            libc::raise(sig);
        }
    }
}

/// A signal in ftprobe's SIGTRAP handler or in an ftrace trampoline waits until it is done
/// (`tramp_signals`), one in an optprobe's detour as its [`SignalHook`] says: whether it was held (the program's handler is then not called now). Out of line: its
/// frame is gone when the program's handler runs.
#[inline(never)]
fn held_for_trampoline(
    sig: libc::c_int,
    info: *mut libc::siginfo_t,
    uc: &mut libc::ucontext_t,
    flags: libc::c_int,
) -> bool {
    let held = super::tramp_signals::hold_if_in_trap(sig, info, uc)
        || super::tramp_signals::on_program_signal(sig, info, uc)
            == super::tramp_signals::Verdict::Deferred
        || {
            let hook = SIGNAL_HOOK.load(Ordering::Acquire);
            // SAFETY: SIGNAL_HOOK only ever holds a `SignalHook`.
            !hook.is_null()
                && unsafe { std::mem::transmute::<*mut (), SignalHook>(hook) }(sig, info, uc)
        };
    if !held {
        return false;
    }
    if flags & libc::SA_RESETHAND != 0 {
        // The kernel reset the action for this delivery: the held one must find it.
        let mut w = chained(sig);
        w.sa_sigaction = wrapper as *const () as usize;
        w.sa_flags |= libc::SA_SIGINFO;
        // SAFETY: the program's action with the wrapper in its place, as installed.
        unsafe { sys::real_sigaction(sig, &w, std::ptr::null_mut()) };
    }
    true
}

/// Rewrite sites while no other thread can run (the kernel's `text_poke_early()`): plain
/// stores, no protocol. Used in the agent's constructor and in `ftrace::init`, and for the
/// sites of an object just loaded, before its code runs (`ftrace::load_objects`).
///
/// # Safety
/// Every `addr..addr+bytes.len()` must be code of this process that no other thread
/// executes or can start executing until this returns.
pub unsafe fn text_poke_early(addr: u64, bytes: &[u8]) -> Result<(), TextPokeError> {
    // SAFETY: the caller's contract.
    unsafe { super::code_write::write(addr, bytes)? };
    Ok(())
}

/// [`text_poke_early`] for many changes, sorted by address (joined into few writes).
///
/// # Safety
/// As [`text_poke_early`], for each change.
pub unsafe fn text_poke_early_many(changes: &[(u64, &[u8])]) -> Result<(), TextPokeError> {
    // SAFETY: the caller's contract.
    unsafe { super::code_write::write_many(changes)? };
    Ok(())
}

/// Rewrite a batch of 5-byte sites while other threads may execute them (module docs).
///
/// # Safety
/// Every `addr` must be the first byte of a 5-byte site in code of this process whose
/// current and new contents are each one whole instruction, and no
/// other thread may patch the same sites concurrently (callers hold the ftrace lock).
pub unsafe fn text_poke_batch(pokes: &[Poke]) -> Result<(), TextPokeError> {
    if pokes.is_empty() {
        return Ok(());
    }
    init()?;
    // Relaxed: statistics.
    STAT_BATCHES.fetch_add(1, Ordering::Relaxed);
    STAT_SITES.fetch_add(pokes.len() as u64, Ordering::Relaxed);
    // Sorted for the handler's binary search; the callers' batches usually are already (sites
    // in address order), and are then published as they are, without a copy.
    let copy: Vec<Poke>;
    let sorted: &[Poke] = if pokes.is_sorted_by_key(|p| p.addr) {
        pokes
    } else {
        let mut v = pokes.to_vec();
        v.sort_by_key(|p| p.addr);
        copy = v;
        &copy
    };
    // Relaxed: a statistic. Sorted: a page is counted once (a site across two, twice).
    let page = sys::page_size() as u64;
    let mut last_page = None;
    let mut pages = 0;
    for p in sorted {
        for pg in [p.addr / page, (p.addr + SITE_LEN - 1) / page] {
            if last_page != Some(pg) {
                last_page = Some(pg);
                pages += 1;
            }
        }
    }
    STAT_PAGES.fetch_add(pages, Ordering::Relaxed);
    let published: *const [Poke] = sorted;
    let batch = &published as *const *const [Poke] as *mut *const [Poke];
    // Release pairs with the Acquire load in `sigtrap_handler`: the handler sees the whole slice.
    BATCH.store(batch, Ordering::SeqCst);
    let result = (|| -> Result<(), TextPokeError> {
        poke_bytes(sorted, |_| &INT3_SITE, 0..1)?;
        sync_core()?;
        poke_bytes(sorted, |p| &p.new, 1..SITE_LEN as usize)?;
        sync_core()?;
        poke_bytes(sorted, |p| &p.new, 0..1)?;
        sync_core()?;
        Ok(())
    })();
    if result.is_err() {
        // Put every site back as it was, through the same int3-first order; the batch stays
        // published meanwhile so a thread that traps is still emulated (as the old bytes now).
        let _ = poke_bytes(sorted, |_| &INT3_SITE, 0..1);
        let _ = sync_core();
        let _ = poke_bytes(sorted, |p| &p.old, 1..SITE_LEN as usize);
        let _ = sync_core();
        let _ = poke_bytes(sorted, |p| &p.old, 0..1);
        let _ = sync_core();
    }
    BATCH.store(std::ptr::null_mut(), Ordering::SeqCst);
    // A handler that incremented HANDLERS_ACTIVE before our store may still read the batch
    // (SeqCst on both sides: any handler that increments later loads null).
    while HANDLERS_ACTIVE.load(Ordering::SeqCst) != 0 {
        std::thread::yield_now();
    }
    // No handler can reach `published` or the slice any more: both may go.
    result
}

/// An int3 where a site's first byte goes (only byte 0 of it is written).
const INT3_SITE: [u8; 5] = [INT3, 0, 0, 0, 0];

/// Write bytes `range` of each site's `which` contents (the sites sorted by address): each
/// run of nearby sites in one write (`code_write::write_many`).
fn poke_bytes(
    pokes: &[Poke],
    which: fn(&Poke) -> &[u8; 5],
    range: std::ops::Range<usize>,
) -> Result<(), TextPokeError> {
    // Relaxed: a statistic.
    STAT_BYTES.fetch_add((pokes.len() * range.len()) as u64, Ordering::Relaxed);
    let changes: Vec<(u64, &[u8])> = pokes
        .iter()
        .map(|p| (p.addr + range.start as u64, &which(p)[range.clone()]))
        .collect();
    // SAFETY: text_poke_batch's contract: each address is a site in code of this process;
    // the first byte is an int3 while the others change, so no thread decodes a mix (the
    // bytes between joined sites are written with the values they hold).
    unsafe { super::code_write::write_many(&changes)? };
    Ok(())
}

/// This thread's `errno`.
fn errno_slot() -> *mut libc::c_int {
    // SAFETY: __errno_location has no preconditions (blacklisted as a probe target).
    unsafe { libc::__errno_location() }
}

// The SIGTRAP handler's entry: the trap word (`tramp_signals::trap_in_progress`) holds this
// frame's stack pointer while `sigtrap_handler` runs, the previous word saved below it.
// Every register it uses is free at a handler's entry (rax) or preserved (rsp); the
// arguments pass through untouched. At entry rsp is 8 mod 16; after the push, 0 mod 16,
// so the call gives `sigtrap_handler` the ABI's alignment.
std::arch::global_asm!(
    ".pushsection .text.ftprobe_sigtrap_entry,\"ax\",@progbits",
    ".globl ftprobe_sigtrap_entry",
    ".hidden ftprobe_sigtrap_entry",
    ".globl ftprobe_sigtrap_push",
    ".hidden ftprobe_sigtrap_push",
    ".globl ftprobe_sigtrap_set",
    ".hidden ftprobe_sigtrap_set",
    ".globl ftprobe_sigtrap_ret",
    ".hidden ftprobe_sigtrap_ret",
    ".type ftprobe_sigtrap_entry,@function",
    "ftprobe_sigtrap_entry:",
    "mov rax, qword ptr [rip + ftprobe_tramp_frame@GOTTPOFF]",
    "ftprobe_sigtrap_push:",
    "push qword ptr fs:[rax + {word}]",
    "ftprobe_sigtrap_set:",
    "mov qword ptr fs:[rax + {word}], rsp",
    "call {handler}",
    "mov rax, qword ptr [rip + ftprobe_tramp_frame@GOTTPOFF]",
    "pop qword ptr fs:[rax + {word}]",
    "ftprobe_sigtrap_ret:",
    "ret",
    ".size ftprobe_sigtrap_entry, . - ftprobe_sigtrap_entry",
    ".popsection",
    word = const super::tramp_signals::TRAP_WORD,
    handler = sym sigtrap_handler,
);

extern "C" {
    fn ftprobe_sigtrap_entry(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void);
}

/// The SIGTRAP handler as installed: [`sigtrap_handler`] through its entry stub.
fn sigtrap_entry() -> Handler {
    // SAFETY: the stub takes the handler's arguments and returns as an `extern "C"`
    // function of that signature; the kernel calls it as a signal handler.
    unsafe {
        std::mem::transmute::<
            unsafe extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void),
            Handler,
        >(ftprobe_sigtrap_entry)
    }
}

/// Probe path: the SIGTRAP handler. Async-signal-safe: atomics, loads and stores only. The
/// program's `errno` is as it was when the handler returns or calls the program's handler.
extern "C" fn sigtrap_handler(
    sig: libc::c_int,
    info: *mut libc::siginfo_t,
    ctx: *mut libc::c_void,
) {
    let errno = errno_slot();
    // SAFETY: this thread's errno.
    let saved = unsafe { *errno };
    let ours = sigtrap_work(info, ctx);
    // SAFETY: as above.
    unsafe { *errno = saved };
    if !ours {
        super::tramp_signals::suspend_trap();
        deliver(sig, info, ctx);
    }
}

/// The SIGTRAP handler's own work: whether the trap was ftprobe's.
fn sigtrap_work(info: *mut libc::siginfo_t, ctx: *mut libc::c_void) -> bool {
    // A SIGTRAP sent by kill/raise/tgkill is the program's, never an int3 of ours (those come
    // with si_code SI_KERNEL).
    // SAFETY: the kernel passes a valid siginfo_t to an SA_SIGINFO handler.
    if unsafe { (*info).si_code } != libc::SI_KERNEL {
        return false;
    }
    // SAFETY: the kernel passes a valid ucontext_t for an SA_SIGINFO handler; this thread owns it.
    let uc = unsafe { &mut *(ctx as *mut libc::ucontext_t) };
    // The end of a trampoline that held a program's signal.
    if super::tramp_signals::on_trap(uc) {
        return true;
    }
    let ip = uc.uc_mcontext.gregs[libc::REG_RIP as usize] as u64;
    let addr = ip.wrapping_sub(1);
    // The int3 may be one written after we looked (a batch's, or an int3 probe armed again
    // just after it was disarmed): each is published before its int3 is written, and
    // `POKE_SEQ` moves before every single-byte write, so a look that found nothing while
    // the count stayed the same, and then the int3 still there, is a look at an int3 that
    // is not ftprobe's. Found by tests flipping sites 200 times, and registering and
    // unregistering an int3 probe 10 000 times, while threads ran through them.
    loop {
        let seq = POKE_SEQ.load(Ordering::SeqCst);
        if emulate_if_in_batch(uc, addr) {
            return true;
        }
        let hook = TRAP_HOOK.load(Ordering::Acquire);
        if !hook.is_null() {
            // SAFETY: TRAP_HOOK only ever holds a `TrapHook` (see `set_trap_hook`).
            let hook: TrapHook = unsafe { std::mem::transmute::<*mut (), TrapHook>(hook) };
            if hook(uc) {
                return true;
            }
        }
        // SAFETY: `addr` is where the trapping int3 was fetched from: mapped, readable code.
        let still_int3 = unsafe { std::ptr::read_volatile(addr as *const u8) } == INT3;
        if !still_int3 {
            // The int3 of a batch or probe that is gone since this thread trapped: run the
            // instruction that is there now.
            uc.uc_mcontext.gregs[libc::REG_RIP as usize] = addr as i64;
            return true;
        }
        std::sync::atomic::fence(Ordering::SeqCst);
        if emulate_if_in_batch(uc, addr) {
            return true;
        }
        if POKE_SEQ.load(Ordering::SeqCst) == seq {
            return false;
        }
    }
}

/// Single-byte writes so far ([`poke_byte`]): moved before each write.
static POKE_SEQ: AtomicU64 = AtomicU64::new(0);

/// Probe path: the handler of the fault signals while XOL slots exist: a fault inside a slot
/// is shown to the program at the probed instruction ([`FaultHook`]), then delivered.
extern "C" fn fault_handler(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // First, before anything else: a fault at a load of the fault-safe reads resumes at its
    // fixup (the kernel's `fixup_exception()`), whatever the program's action is. Only a
    // fault the kernel raised for the instruction (si_code > 0), not a kill(2).
    // SAFETY: the kernel passes a valid siginfo_t and ucontext_t to an SA_SIGINFO handler;
    // this thread's.
    let uc = unsafe { &mut *(ctx as *mut libc::ucontext_t) };
    // SAFETY: as above.
    if unsafe { (*info).si_code } > 0 {
        let pc = uc.uc_mcontext.gregs[libc::REG_RIP as usize] as u64;
        if let Some(to) = super::uaccess::fixup(pc) {
            uc.uc_mcontext.gregs[libc::REG_RIP as usize] = to as i64;
            return;
        }
    }
    let errno = errno_slot();
    // SAFETY: this thread's errno.
    let saved = unsafe { *errno };
    let h = chained(sig).sa_sigaction;
    let hook = FAULT_HOOK.load(Ordering::Acquire);
    if h != libc::SIG_DFL && h != libc::SIG_IGN && !hook.is_null() {
        // SAFETY: FAULT_HOOK only ever holds a `FaultHook`.
        let hook: FaultHook = unsafe { std::mem::transmute::<*mut (), FaultHook>(hook) };
        hook(uc);
    }
    // SAFETY: as above.
    unsafe { *errno = saved };
    deliver(sig, info, ctx);
}

/// Probe path: if `addr` is a site of the batch in flight, emulate its new instruction.
fn emulate_if_in_batch(uc: &mut libc::ucontext_t, addr: u64) -> bool {
    // The batch is read between the increment and the decrement and nothing else is done
    // there: no fault, and no program's signal whose handler ftprobe wraps (held until the
    // SIGTRAP handler is done) can leave the window without the decrement, which would make
    // every later batch wait forever. (A handler installed by a raw `rt_sigaction` system
    // call, which ftprobe does not wrap, that left this window of a few instructions by
    // `siglongjmp` would: a limit DEVELOPERS.md states.)
    HANDLERS_ACTIVE.fetch_add(1, Ordering::SeqCst);
    let batch = BATCH.load(Ordering::SeqCst);
    let mut found = None;
    if !batch.is_null() {
        // SAFETY: a non-null BATCH points to text_poke_batch's live slice pointer, and that
        // to its live slice, until HANDLERS_ACTIVE drops to zero after BATCH is cleared.
        let pokes = unsafe { &**batch };
        if let Ok(i) = pokes.binary_search_by_key(&addr, |p| p.addr) {
            found = Some(pokes[i]);
        }
    }
    HANDLERS_ACTIVE.fetch_sub(1, Ordering::SeqCst);
    match found {
        Some(p) => {
            // Relaxed: a statistic (an atomic add: async-signal-safe).
            STAT_EMULATED.fetch_add(1, Ordering::Relaxed);
            emulate(uc, &p);
            true
        }
        None => false,
    }
}

/// `jmp rel8`.
const JMP_REL8: u8 = 0xeb;
/// `jmp rel32`.
const JMP_REL32: u8 = 0xe9;
/// `ret`.
const RET: u8 = 0xc3;

/// Emulate the new instruction of a site hit while in flight (the kernel's
/// `int3_emulate_call()` / `int3_emulate_jmp()`).
fn emulate(uc: &mut libc::ucontext_t, p: &Poke) {
    let g = &mut uc.uc_mcontext.gregs;
    match call_target(p.addr, &p.new) {
        Some(target) => {
            let sp = (g[libc::REG_RSP as usize] as u64).wrapping_sub(8);
            // SAFETY: the thread is at a function-entry site where the stack below sp is free
            // (the kernel placed the signal frame below the red zone); we push the return address
            // exactly as the call would have.
            unsafe { std::ptr::write(sp as *mut u64, p.addr + SITE_LEN) };
            g[libc::REG_RSP as usize] = sp as i64;
            g[libc::REG_RIP as usize] = target as i64;
        }
        // `jmp rel8`: an XRay entry or tail sled put back (`eb 09`, over the rest of it).
        None if p.new[0] == JMP_REL8 => {
            let target = (p.addr + 2).wrapping_add(p.new[1] as i8 as u64);
            g[libc::REG_RIP as usize] = target as i64;
        }
        // `jmp rel32`: an XRay exit or tail sled sent to its stub.
        None if p.new[0] == JMP_REL32 => {
            let rel = i32::from_le_bytes([p.new[1], p.new[2], p.new[3], p.new[4]]);
            let target = (p.addr + SITE_LEN).wrapping_add(rel as i64 as u64);
            g[libc::REG_RIP as usize] = target as i64;
        }
        // `ret`: an XRay exit sled put back.
        None if p.new[0] == RET => {
            let sp = g[libc::REG_RSP as usize] as u64;
            // SAFETY: the thread is at a `ret` of a function it is running: its stack
            // pointer is the return-address slot, readable.
            g[libc::REG_RIP as usize] = unsafe { std::ptr::read(sp as *const u64) } as i64;
            g[libc::REG_RSP as usize] = sp.wrapping_add(8) as i64;
        }
        None => g[libc::REG_RIP as usize] = (p.addr + SITE_LEN) as i64,
    }
}

/// Deliver a signal ftprobe did not cause (and whose handler is ftprobe's) to the program's
/// action, as the kernel would have: ignored (`SIG_IGN`, unless the kernel raised it for a
/// fault or trap of the thread, which the kernel never lets be ignored), the default action
/// (`SIG_DFL`: the program dies of it), or the program's handler, with `SA_SIGINFO`'s
/// arguments or not, under the mask the kernel would give it (the interrupted mask, its
/// `sa_mask`, the signal itself unless `SA_NODEFER`), reset to `SIG_DFL` first with
/// `SA_RESETHAND`. SIGTRAP itself is never blocked (int3 probes need it): a SIGTRAP that
/// arrives while the program's own SIGTRAP handler runs without `SA_NODEFER` is held and
/// delivered when that handler returns, as the kernel holds a blocked signal. The handler
/// runs on the stack the kernel would have chosen: ftprobe's handler (`SA_ONSTACK`) runs on
/// the thread's signal stack whenever it has one; a program's handler without `SA_ONSTACK`
/// runs on the interrupted stack, in a copy of the frame ([`sigframe`]).
fn deliver(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // Acquire pairs with the Release store in `init`; the handler is only installed after it.
    if !INSTALLED.load(Ordering::Acquire) && sig == libc::SIGTRAP {
        return;
    }
    let act = chained(sig);
    let h = act.sa_sigaction;
    // si_code > 0: raised by the kernel for this thread's own instruction (SI_KERNEL for an
    // int3, SEGV_MAPERR, ...); kill/raise/sigqueue give SI_USER, SI_TKILL, SI_QUEUE (<= 0).
    // SAFETY: the kernel passes a valid siginfo_t to an SA_SIGINFO handler.
    let from_kernel = unsafe { (*info).si_code } > 0;
    if h == libc::SIG_IGN && !from_kernel {
        // A signal sent by kill/raise to a program that ignores it: ignored, as without us.
        return;
    }
    if h == libc::SIG_DFL || h == libc::SIG_IGN {
        if sig == libc::SIGTRAP {
            // Not our trap and nobody else's: die of SIGTRAP as the program would have
            // without us (the kernel kills a program that ignores a trap of its own too).
            let hook = FATAL_TRAP_HOOK.load(Ordering::Acquire);
            if !hook.is_null() {
                // SAFETY: FATAL_TRAP_HOOK only ever holds a `FatalTrapHook`.
                let hook = unsafe { std::mem::transmute::<*mut (), FatalTrapHook>(hook) };
                hook();
            }
        }
        // SAFETY: sigaction and raise are async-signal-safe; a zeroed sigaction is SIG_DFL.
        unsafe {
            let mut dfl: libc::sigaction = std::mem::zeroed();
            dfl.sa_sigaction = libc::SIG_DFL;
            sys::real_sigaction(sig, &dfl, std::ptr::null_mut());
            if sig != libc::SIGTRAP && from_kernel {
                // The faulting instruction runs again and faults under the default action.
                return;
            }
            libc::raise(sig);
        }
        return;
    }
    // SAFETY: the kernel passes a valid ucontext_t to an SA_SIGINFO handler; this thread's.
    let uc = unsafe { &mut *(ctx as *mut libc::ucontext_t) };
    let st = probe_state::this_thread();
    let nodefer = act.sa_flags & libc::SA_NODEFER != 0;
    let outer = if sig == libc::SIGTRAP {
        let unblock = st.enter(probe_state::Entry::Interrupted(uc));
        *probe_state::mask_word(&mut uc.uc_sigmask) &= !unblock;
        if st.program_trap_sp.get() != 0 && !nodefer {
            st.program_trap_pending.set(true);
            return;
        }
        let outer = st.program_trap_sp.get();
        st.program_trap_sp
            .set(uc.uc_mcontext.gregs[libc::REG_RSP as usize] as u64);
        outer
    } else {
        0
    };
    let mut mask = *probe_state::mask_word(&mut uc.uc_sigmask) | {
        let mut m = act.sa_mask;
        *probe_state::mask_word(&mut m)
    };
    if !nodefer {
        mask |= probe_state::bit(sig);
    }
    // SIGTRAP stays unblocked: a probe hit in the handler must reach ftprobe's.
    mask &= !probe_state::bit(libc::SIGTRAP);
    if act.sa_flags & libc::SA_RESETHAND != 0 {
        if let Some(slot) = chained_slot(sig) {
            // No allocation here (a signal handler): the static default action. Release
            // pairs with the Acquire load in `chained`; CHAINED is never written through.
            slot.store(
                &DFL_ACTION as *const libc::sigaction as *mut libc::sigaction,
                Ordering::Release,
            );
        }
    }
    // SAFETY: rt_sigprocmask(SIG_SETMASK, &mask, NULL, 8) reads 8 bytes of `mask`; the mask
    // the handler interrupted is restored by the kernel's sigreturn.
    unsafe {
        sys::raw_syscall4(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK as u64,
            &mask as *const u64 as u64,
            0,
            8,
        )
    };
    // The program's handler runs under a mask ftprobe set: the fault-safe reads ask the
    // kernel for it again (and again after the handler, in `delivered`).
    super::uaccess::forget_thread_mask();
    if sigframe::needs_interrupted_stack(act.sa_flags, uc) {
        // SAFETY: `info` and `ctx` are the kernel's frame of the handler this runs in, on the
        // signal stack; `h` is the program's handler for `sig`. Never returns: the thread
        // resumes from the copied frame.
        unsafe { sigframe::run_on_interrupted_stack(sig, info, uc, h, outer, after_delivered) };
    }
    if act.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the program installed this handler for `sig` with SA_SIGINFO.
        let f: Handler = unsafe { std::mem::transmute(h) };
        f(sig, info, ctx);
    } else {
        // SAFETY: the program installed this plain handler for `sig`.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(h) };
        f(sig);
    }
    delivered(sig, info, ctx, outer);
}

/// After the program's handler returned from [`deliver`]: the program's SIGTRAP handler is no
/// longer running (`outer`: the one it interrupted, 0 if none), and a SIGTRAP held meanwhile
/// is delivered now.
fn delivered(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void, outer: u64) {
    super::uaccess::forget_thread_mask();
    if sig == libc::SIGTRAP {
        let st = probe_state::this_thread();
        st.program_trap_sp.set(outer);
        if outer == 0 && st.program_trap_pending.replace(false) {
            deliver(sig, info, ctx);
        }
    }
}

/// [`delivered`], for a handler run on the interrupted stack (`sigframe`'s frame).
fn after_delivered(info: *mut libc::siginfo_t, uc: *mut libc::ucontext_t, t: &sigframe::Trailer) {
    delivered(t.sig, info, uc as *mut libc::c_void, t.word);
}
