//! SIGTRAP stays ftprobe's while it traces.
//!
//! int3 probes and text_poke batches need ftprobe's SIGTRAP handler, and SIGTRAP unblocked on
//! every thread at every moment a probe can be hit: the kernel kills a thread that traps
//! with SIGTRAP blocked or ignored (`force_sig_info_to_task`), silently. The agent interposes
//! what changes them, while ftprobe's handler is installed:
//!
//! - SIGTRAP's action (`sigaction`, `signal`, `bsd_signal`, `ssignal`, `sysv_signal`,
//!   `sigset`, `sigignore`): the program's action becomes the one ftprobe's handler chains
//!   to for traps that are not its own ([`text_poke::replace_chained`]); the program sees it
//!   as installed, and gets it back as `old`. The same for the fault signals (`SIGSEGV`,
//!   `SIGBUS`, `SIGILL`, `SIGFPE`) once int3 probes have XOL slots: ftprobe's handler shows a
//!   fault inside a slot at the probed instruction, then delivers it to the program's action.
//! - The thread's mask (`sigprocmask`, `pthread_sigmask`, `sigblock`, `sigsetmask`,
//!   `sighold`, `sigset(SIGTRAP, SIG_HOLD)`): SIGTRAP is taken out of what gets blocked, and
//!   is never reported as blocked.
//! - The mask a handler runs under: SIGTRAP is taken out of the `sa_mask` of every action
//!   installed (every signal), including those installed before the agent started
//!   ([`start`]). `old` gives back the mask as the program installed it (with SIGTRAP, if it
//!   asked for it), so that saving and restoring an action round-trips.
//! - Temporary masks a handler can run under (`sigsuspend`, `sigpause`, `ppoll`, `pselect`,
//!   `epoll_pwait`, `epoll_pwait2`) and a new thread's first mask
//!   (`pthread_attr_setsigmask_np`): passed on without SIGTRAP.
//! - Masks restored from saved state: `siglongjmp`/`longjmp`/`_longjmp`/`__longjmp_chk`
//!   (glibc restores the `sigsetjmp` mask with an internal call: SIGTRAP is taken out of the
//!   mask saved in the `jmp_buf` first) and `setcontext`/`swapcontext` (out of the
//!   `uc_sigmask` of the context switched to, in place).
//!
//! Not covered (the CLI says so when the kernel kills the program with a SIGTRAP that
//! ftprobe's handler never saw, see [`start`]): raw `rt_sigprocmask`/`rt_sigaction` system
//! calls, a handler that adds SIGTRAP to the `uc_sigmask` its `rt_sigreturn` restores, and
//! glibc's internal windows with every signal blocked (inside `pthread_create`,
//! `posix_spawn`, `raise`; the threads of `aio` and `getaddrinfo_a`).
//!
//! The next definitions (the C library's) are resolved once, eagerly in [`init`] (a `dlsym`
//! takes the loader's lock: a call from a signal handler could block behind a `dlopen`);
//! an interposer called before [`init`] resolves its own on first use.

use std::ffi::CStr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use ftprobe::arch::x86_64::{text_poke, uaccess};
use ftprobe::trace;

/// The thread's mask may have changed: the fault-safe reads ask the kernel for it again
/// before they use plain loads (`uaccess`: a fault with SIGSEGV or SIGBUS blocked kills).
fn mask_changed() {
    if uaccess::enabled() {
        uaccess::forget_thread_mask();
    }
}

/// An exported C function of the C library's signature that does what `$body` says with
/// its arguments (most interposers are such one-liners over a shared implementation).
macro_rules! interposer {
    ($(#[$m:meta])* fn $name:ident($($a:ident: $t:ty),*) -> $r:ty = $body:expr;) => {
        $(#[$m])*
        ///
        /// # Safety
        /// As the C library's function of this name.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> $r {
            // SAFETY: the caller's contract, passed on.
            unsafe { $body }
        }
    };
}

/// The interposed functions' next definitions, by index into [`NEXT`].
#[derive(Clone, Copy)]
enum Next {
    Sigaction,
    Signal,
    SysvSignal,
    Sigset,
    Sigignore,
    Sighold,
    Sigprocmask,
    PthreadSigmask,
    Sigblock,
    Sigsetmask,
    Sigsuspend,
    Sigpause,
    Ppoll,
    PpollChk,
    Pselect,
    EpollPwait,
    EpollPwait2,
    PthreadAttrSetsigmaskNp,
    Siglongjmp,
    LongjmpChk,
    Setcontext,
    Swapcontext,
    Sigaltstack,
}

/// Symbol names, in [`Next`]'s order. `signal` serves `bsd_signal` and `ssignal` (one
/// function in glibc), `siglongjmp` serves `longjmp` and `_longjmp`, `__sigpause` serves
/// `sigpause`.
const NAMES: [&CStr; 23] = [
    c"sigaction",
    c"signal",
    c"sysv_signal",
    c"sigset",
    c"sigignore",
    c"sighold",
    c"sigprocmask",
    c"pthread_sigmask",
    c"sigblock",
    c"sigsetmask",
    c"sigsuspend",
    c"__sigpause",
    c"ppoll",
    c"__ppoll_chk",
    c"pselect",
    c"epoll_pwait",
    c"epoll_pwait2",
    c"pthread_attr_setsigmask_np",
    c"siglongjmp",
    c"__longjmp_chk",
    c"setcontext",
    c"swapcontext",
    c"sigaltstack",
];

/// Resolved addresses ([`UNRESOLVED`], [`ABSENT`], or the address).
static NEXT: [AtomicUsize; NAMES.len()] = [const { AtomicUsize::new(UNRESOLVED) }; NAMES.len()];
const UNRESOLVED: usize = 0;
/// Looked up, not found (an older C library): not looked up again.
const ABSENT: usize = 1;

/// Per signal: whether the `sa_mask` the program last installed held SIGTRAP (taken out of
/// what the kernel got; put back into what `old` returns).
static HAD_SIGTRAP: [AtomicBool; 65] = [const { AtomicBool::new(false) }; 65];

/// Resolve every next definition now: called by the agent's constructor.
pub fn init() {
    for (i, name) in NAMES.iter().enumerate() {
        // Relaxed: a plain cache; a racing resolution stores the same value.
        NEXT[i].store(lookup(name), Ordering::Relaxed);
    }
}

/// The next definition of `name`, or [`ABSENT`].
fn lookup(name: &CStr) -> usize {
    // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated name; a lookup only.
    match unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) as usize } {
        0 => ABSENT,
        f => f,
    }
}

/// The next definition of `f`, resolved by [`init`] (or now, if called before it); 0 when
/// the C library has none.
fn next(f: Next) -> usize {
    let i = f as usize;
    // Relaxed: see `init`.
    let mut v = NEXT[i].load(Ordering::Relaxed);
    if v == UNRESOLVED {
        v = lookup(NAMES[i]);
        NEXT[i].store(v, Ordering::Relaxed);
    }
    if v == ABSENT {
        0
    } else {
        v
    }
}

/// Fail as a C function that does not exist: `errno = ENOSYS`, -1.
fn enosys() -> libc::c_int {
    // SAFETY: __errno_location returns this thread's errno.
    unsafe { *libc::__errno_location() = libc::ENOSYS };
    -1
}

/// SIGTRAP's bit in a `sigset_t` (glibc's `__sigset_t`: an array of unsigned longs, signal
/// `n` at bit `n - 1` of the first). Set without calling `sigdelset`, which a program may
/// be probing: the agent's calls must not count as the program's.
const SIGTRAP_BIT: u64 = 1 << (libc::SIGTRAP - 1);

fn has_sigtrap(set: &libc::sigset_t) -> bool {
    // SAFETY: a sigset_t starts with a u64 (see SIGTRAP_BIT) and is 8-aligned.
    unsafe { *(set as *const libc::sigset_t as *const u64) & SIGTRAP_BIT != 0 }
}

fn set_sigtrap(set: &mut libc::sigset_t, on: bool) {
    // SAFETY: as in `has_sigtrap`.
    let w = unsafe { &mut *(set as *mut libc::sigset_t as *mut u64) };
    if on {
        *w |= SIGTRAP_BIT;
    } else {
        *w &= !SIGTRAP_BIT;
    }
}

/// A copy of `*set` without SIGTRAP while ftprobe's handler is installed; `None` (pass `set`
/// on as is) otherwise or for a null `set`.
///
/// # Safety
/// `set` is null or points to a readable `sigset_t`.
unsafe fn without_sigtrap(set: *const libc::sigset_t) -> Option<libc::sigset_t> {
    if set.is_null() || !text_poke::installed() {
        return None;
    }
    // SAFETY: the caller's contract.
    let mut copy = unsafe { *set };
    set_sigtrap(&mut copy, false);
    Some(copy)
}

/// `copy` if there is one, else `set`.
fn either(copy: &Option<libc::sigset_t>, set: *const libc::sigset_t) -> *const libc::sigset_t {
    copy.as_ref().map_or(set, |c| c as *const libc::sigset_t)
}

/// Record what the program installed for `sig` (an action whose `sa_mask` has SIGTRAP or
/// not); `signal`-like calls install an empty mask.
fn note_installed(sig: libc::c_int, had: bool) {
    if let Some(h) = usize::try_from(sig).ok().and_then(|s| HAD_SIGTRAP.get(s)) {
        // Relaxed: per-signal bookkeeping; calls racing on one signal race in the kernel too.
        h.store(had, Ordering::Relaxed);
    }
}

fn had_sigtrap(sig: libc::c_int) -> bool {
    usize::try_from(sig)
        .ok()
        .and_then(|s| HAD_SIGTRAP.get(s))
        .is_some_and(|h| h.load(Ordering::Relaxed))
}

/// The agent has started tracing (ftprobe's handler is installed): take SIGTRAP out of the
/// `sa_mask` of the actions installed before (by constructors that ran before the agent's),
/// and have ftprobe's handler mark the ring header when it lets a SIGTRAP that is not its
/// own kill the program, so that the CLI can tell that death from a trap it could not take.
pub fn start() {
    text_poke::set_fatal_trap_hook(|| {
        if let Some(b) = trace::buffer() {
            // SAFETY: getpid has no preconditions.
            b.note_sigtrap_passed(unsafe { libc::getpid() } as u32);
        }
    });
    let real = next(Next::Sigaction);
    if real == 0 || !text_poke::installed() {
        return;
    }
    // SAFETY: libc's sigaction, of this type.
    let real = unsafe { std::mem::transmute::<usize, SigactionFn>(real) };
    for sig in 1..HAD_SIGTRAP.len() as libc::c_int {
        if sig == libc::SIGTRAP || sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // SAFETY: a zeroed sigaction is valid; `real` only writes it.
        let mut cur: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: reading the action of a valid signal number into our own struct.
        if unsafe { real(sig, std::ptr::null(), &mut cur) } != 0 || !has_sigtrap(&cur.sa_mask) {
            continue;
        }
        set_sigtrap(&mut cur.sa_mask, false);
        // SAFETY: the same action back, with SIGTRAP out of its mask.
        if unsafe { real(sig, &cur, std::ptr::null_mut()) } == 0 {
            note_installed(sig, true);
        }
    }
}

type SigactionFn =
    unsafe extern "C" fn(libc::c_int, *const libc::sigaction, *mut libc::sigaction) -> libc::c_int;
type SignalFn = unsafe extern "C" fn(libc::c_int, libc::sighandler_t) -> libc::sighandler_t;
type MaskFn =
    unsafe extern "C" fn(libc::c_int, *const libc::sigset_t, *mut libc::sigset_t) -> libc::c_int;
type IntFn = unsafe extern "C" fn(libc::c_int) -> libc::c_int;

/// An action for SIGTRAP as `signal`-like calls make it: `handler`, an empty mask, `flags`.
fn simple_action(handler: libc::sighandler_t, flags: libc::c_int) -> libc::sigaction {
    // SAFETY: a zeroed sigaction is valid: empty mask, no flags, SIG_DFL.
    let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
    act.sa_sigaction = handler;
    act.sa_flags = flags;
    act
}

// ---- actions ------------------------------------------------------------------------------

interposer! {
    /// Interposed `sigaction(2)`.
    fn sigaction(sig: libc::c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> libc::c_int = sigaction_impl(sig, act, old);
}

interposer! {
    /// Interposed `__sigaction` (glibc's other name for `sigaction`).
    fn __sigaction(sig: libc::c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> libc::c_int = sigaction_impl(sig, act, old);
}

/// # Safety
/// As `sigaction(2)`.
unsafe fn sigaction_impl(
    sig: libc::c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> libc::c_int {
    let installed = text_poke::installed();
    if text_poke::owns(sig) {
        // SAFETY: the caller passes null or a valid sigaction.
        let prev = text_poke::replace_chained(sig, unsafe { act.as_ref() });
        if !old.is_null() {
            // SAFETY: the caller passes null or a writable sigaction.
            unsafe { *old = prev };
        }
        return 0;
    }
    let f = next(Next::Sigaction);
    if f == 0 {
        return enosys();
    }
    // SAFETY: libc's sigaction, of this type.
    let f = unsafe { std::mem::transmute::<usize, SigactionFn>(f) };
    if !installed {
        // SAFETY: forwarded as is.
        return unsafe { f(sig, act, old) };
    }
    // SAFETY: the caller passes null or a valid sigaction.
    let new = unsafe { act.as_ref() }.map(|a| {
        let mut copy = *a;
        set_sigtrap(&mut copy.sa_mask, false);
        (copy, has_sigtrap(&a.sa_mask))
    });
    let had_before = had_sigtrap(sig);
    // SAFETY: forwarded with our copy of the action (wrapped while XOL slots exist).
    let r = unsafe {
        text_poke::sigaction_wrapped(sig, new.as_ref().map(|(c, _)| c), old, |a, o| f(sig, a, o))
    };
    if r == 0 {
        if !old.is_null() && had_before {
            // SAFETY: the caller passes a writable sigaction, just filled in.
            set_sigtrap(unsafe { &mut (*old).sa_mask }, true);
        }
        if let Some((_, had)) = new {
            note_installed(sig, had);
        }
        // SAFETY: the caller passes null or a valid sigaction.
        if let Some(a) = unsafe { act.as_ref() } {
            uaccess::note_action(sig, a);
        }
    }
    r
}

/// The `signal` family: glibc's calls its internal sigaction, past this interposer. `next` is
/// the C library's function, `flags` the action's (BSD semantics, `SA_RESTART`, for
/// `signal`, `bsd_signal`, `ssignal`; one-shot and not deferred, `SA_RESETHAND |
/// SA_NODEFER`, for `sysv_signal`); glibc installs a mask of `sig` alone, or an empty one.
///
/// # Safety
/// As `signal(3)`.
unsafe fn signal_family(
    next_fn: Next,
    flags: libc::c_int,
    sig: libc::c_int,
    handler: libc::sighandler_t,
) -> libc::sighandler_t {
    if text_poke::owns(sig) {
        return text_poke::replace_chained(sig, Some(&simple_action(handler, flags))).sa_sigaction;
    }
    if text_poke::wraps(sig) {
        // The C library's would install the handler past the interposed `sigaction`: the
        // same action through it (glibc's: a mask of `sig` alone, none for sysv_signal).
        let mut act = simple_action(handler, flags);
        if flags & libc::SA_NODEFER == 0 {
            // SAFETY: a valid set of our own and a signal number wraps() accepted.
            unsafe { libc::sigaddset(&mut act.sa_mask, sig) };
        }
        // SAFETY: a zeroed sigaction is valid.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: our own action and result.
        return match unsafe { sigaction_impl(sig, &act, &mut old) } {
            0 => old.sa_sigaction,
            _ => libc::SIG_ERR,
        };
    }
    let f = next(next_fn);
    if f == 0 {
        return libc::SIG_ERR;
    }
    // SAFETY: the C library's function of that name, of this type.
    let r = unsafe { std::mem::transmute::<usize, SignalFn>(f)(sig, handler) };
    if r != libc::SIG_ERR {
        note_installed(sig, false);
    }
    r
}

interposer! {
    /// Interposed `signal(3)`.
    fn signal(sig: libc::c_int, handler: libc::sighandler_t) -> libc::sighandler_t =
        signal_family(Next::Signal, libc::SA_RESTART, sig, handler);
}

interposer! {
    /// Interposed `bsd_signal(3)`.
    fn bsd_signal(sig: libc::c_int, handler: libc::sighandler_t) -> libc::sighandler_t =
        signal_family(Next::Signal, libc::SA_RESTART, sig, handler);
}

interposer! {
    /// Interposed `ssignal(3)` (glibc's `signal`).
    fn ssignal(sig: libc::c_int, handler: libc::sighandler_t) -> libc::sighandler_t =
        signal_family(Next::Signal, libc::SA_RESTART, sig, handler);
}

interposer! {
    /// Interposed `sysv_signal(3)`.
    fn sysv_signal(sig: libc::c_int, handler: libc::sighandler_t) -> libc::sighandler_t =
        signal_family(Next::SysvSignal, libc::SA_RESETHAND | libc::SA_NODEFER, sig, handler);
}

interposer! {
    /// Interposed `__sysv_signal` (glibc's other name for `sysv_signal`).
    fn __sysv_signal(sig: libc::c_int, handler: libc::sighandler_t) -> libc::sighandler_t =
        signal_family(Next::SysvSignal, libc::SA_RESETHAND | libc::SA_NODEFER, sig, handler);
}

/// `SIG_HOLD` (glibc's value; the libc crate does not have it).
const SIG_HOLD: libc::sighandler_t = 2;

/// Interposed `sigset(3)`: for SIGTRAP, `SIG_HOLD` blocks nothing (the previous action is
/// returned: SIGTRAP was not blocked), anything else becomes the chained action.
///
/// # Safety
/// As `sigset(3)`.
#[no_mangle]
pub unsafe extern "C" fn sigset(sig: libc::c_int, disp: libc::sighandler_t) -> libc::sighandler_t {
    if sig == libc::SIGTRAP && text_poke::installed() && disp == SIG_HOLD {
        return text_poke::replace_chained(sig, None).sa_sigaction;
    }
    if text_poke::owns(sig) && disp != SIG_HOLD {
        return text_poke::replace_chained(sig, Some(&simple_action(disp, 0))).sa_sigaction;
    }
    let f = next(Next::Sigset);
    if f == 0 {
        return libc::SIG_ERR;
    }
    // SAFETY: libc's sigset, of this type.
    let r = unsafe { std::mem::transmute::<usize, SignalFn>(f)(sig, disp) };
    mask_changed();
    if r != libc::SIG_ERR && disp != SIG_HOLD {
        note_installed(sig, false);
    }
    if r != libc::SIG_ERR && text_poke::wraps(sig) {
        let r = text_poke::program_handler(sig, r);
        if disp != SIG_HOLD && disp != libc::SIG_DFL && disp != libc::SIG_IGN {
            // The C library's installed the handler past the interposed `sigaction`: wrap
            // it now, as installed.
            // SAFETY: a zeroed sigaction is valid.
            let mut cur: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: reading the action just installed, then installing it through ours.
            unsafe {
                if sys_sigaction(sig, std::ptr::null(), &mut cur) == 0 {
                    sigaction_impl(sig, &cur, std::ptr::null_mut());
                }
            }
        }
        return r;
    }
    r
}

/// The C library's `sigaction`.
///
/// # Safety
/// As `sigaction(2)`.
unsafe fn sys_sigaction(
    sig: libc::c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> libc::c_int {
    match next(Next::Sigaction) {
        0 => enosys(),
        // SAFETY: libc's sigaction, of this type; the caller's contract.
        f => unsafe { std::mem::transmute::<usize, SigactionFn>(f)(sig, act, old) },
    }
}

/// Interposed `sigignore(3)`.
///
/// # Safety
/// As `sigignore(3)`.
#[no_mangle]
pub unsafe extern "C" fn sigignore(sig: libc::c_int) -> libc::c_int {
    if text_poke::owns(sig) {
        text_poke::replace_chained(sig, Some(&simple_action(libc::SIG_IGN, 0)));
        return 0;
    }
    let f = next(Next::Sigignore);
    if f == 0 {
        return enosys();
    }
    // SAFETY: libc's sigignore, of this type.
    let r = unsafe { std::mem::transmute::<usize, IntFn>(f)(sig) };
    if r == 0 {
        note_installed(sig, false);
    }
    r
}

// ---- the thread's mask --------------------------------------------------------------------

/// Interposed `sighold(3)`: holding SIGTRAP holds nothing.
///
/// # Safety
/// As `sighold(3)`.
#[no_mangle]
pub unsafe extern "C" fn sighold(sig: libc::c_int) -> libc::c_int {
    if sig == libc::SIGTRAP && text_poke::installed() {
        return 0;
    }
    let f = next(Next::Sighold);
    if f == 0 {
        return enosys();
    }
    // SAFETY: libc's sighold, of this type.
    let r = unsafe { std::mem::transmute::<usize, IntFn>(f)(sig) };
    mask_changed();
    r
}

/// Forward a mask change to `which`, with SIGTRAP taken out of what gets blocked.
///
/// # Safety
/// As `sigprocmask(2)`.
unsafe fn mask_without_sigtrap(
    which: Next,
    how: libc::c_int,
    set: *const libc::sigset_t,
    old: *mut libc::sigset_t,
) -> libc::c_int {
    let f = next(which);
    if f == 0 {
        return if matches!(which, Next::PthreadSigmask) {
            libc::ENOSYS
        } else {
            enosys()
        };
    }
    // SAFETY: libc's sigprocmask/pthread_sigmask, of type MaskFn.
    let f = unsafe { std::mem::transmute::<usize, MaskFn>(f) };
    // Unblocking needs no change.
    let copy = if how == libc::SIG_UNBLOCK {
        None
    } else {
        // SAFETY: the caller passes null or a valid set.
        unsafe { without_sigtrap(set) }
    };
    // SAFETY: forwarded, with our copy of the set if any.
    let r = unsafe { f(how, either(&copy, set), old) };
    mask_changed();
    r
}

interposer! {
    /// Interposed `sigprocmask(2)`.
    fn sigprocmask(how: libc::c_int, set: *const libc::sigset_t, old: *mut libc::sigset_t) -> libc::c_int = mask_without_sigtrap(Next::Sigprocmask, how, set, old);
}

interposer! {
    /// Interposed `pthread_sigmask(3)`.
    fn pthread_sigmask(how: libc::c_int, set: *const libc::sigset_t, old: *mut libc::sigset_t) -> libc::c_int = mask_without_sigtrap(Next::PthreadSigmask, how, set, old);
}

/// A BSD signal mask (`sigblock`, `sigsetmask`, `sigpause`) without SIGTRAP's bit.
fn bsd_mask_without_sigtrap(mask: libc::c_int) -> libc::c_int {
    if text_poke::installed() {
        mask & !(SIGTRAP_BIT as libc::c_int)
    } else {
        mask
    }
}

/// Interposed `sigblock(3)`.
///
/// # Safety
/// As `sigblock(3)`.
#[no_mangle]
pub unsafe extern "C" fn sigblock(mask: libc::c_int) -> libc::c_int {
    let f = next(Next::Sigblock);
    if f == 0 {
        return enosys();
    }
    // SAFETY: libc's sigblock, of this type.
    let r = unsafe { std::mem::transmute::<usize, IntFn>(f)(bsd_mask_without_sigtrap(mask)) };
    mask_changed();
    r
}

/// Interposed `sigsetmask(3)`.
///
/// # Safety
/// As `sigsetmask(3)`.
#[no_mangle]
pub unsafe extern "C" fn sigsetmask(mask: libc::c_int) -> libc::c_int {
    let f = next(Next::Sigsetmask);
    if f == 0 {
        return enosys();
    }
    // SAFETY: libc's sigsetmask, of this type.
    let r = unsafe { std::mem::transmute::<usize, IntFn>(f)(bsd_mask_without_sigtrap(mask)) };
    mask_changed();
    r
}

// ---- temporary masks ----------------------------------------------------------------------

/// # Safety
/// As `sigsuspend(2)`.
unsafe fn sigsuspend_impl(set: *const libc::sigset_t) -> libc::c_int {
    let f = next(Next::Sigsuspend);
    if f == 0 {
        return enosys();
    }
    type F = unsafe extern "C" fn(*const libc::sigset_t) -> libc::c_int;
    // SAFETY: the caller passes a valid set.
    let copy = unsafe { without_sigtrap(set) };
    // Handlers run under the temporary mask meanwhile, and the thread's comes back after.
    mask_changed();
    // SAFETY: libc's sigsuspend, of type F, with our copy of the set if any.
    let r = unsafe { std::mem::transmute::<usize, F>(f)(either(&copy, set)) };
    mask_changed();
    r
}

interposer! {
    /// Interposed `sigsuspend(2)`.
    fn sigsuspend(set: *const libc::sigset_t) -> libc::c_int = sigsuspend_impl(set);
}

interposer! {
    /// Interposed `__sigsuspend` (glibc's other name for `sigsuspend`).
    fn __sigsuspend(set: *const libc::sigset_t) -> libc::c_int = sigsuspend_impl(set);
}

/// glibc's `__sigpause(sig_or_mask, is_sig)`: a BSD mask when `is_sig` is 0, else the
/// current mask without `sig` (which holds no SIGTRAP).
///
/// # Safety
/// As `sigpause(3)`.
unsafe fn sigpause_impl(sig_or_mask: libc::c_int, is_sig: libc::c_int) -> libc::c_int {
    let f = next(Next::Sigpause);
    if f == 0 {
        return enosys();
    }
    type F = unsafe extern "C" fn(libc::c_int, libc::c_int) -> libc::c_int;
    let arg = if is_sig == 0 {
        bsd_mask_without_sigtrap(sig_or_mask)
    } else {
        sig_or_mask
    };
    mask_changed();
    // SAFETY: glibc's __sigpause, of type F.
    let r = unsafe { std::mem::transmute::<usize, F>(f)(arg, is_sig) };
    mask_changed();
    r
}

interposer! {
    /// Interposed `sigpause` (BSD: the mask to wait under).
    fn sigpause(mask: libc::c_int) -> libc::c_int = sigpause_impl(mask, 0);
}

interposer! {
    /// Interposed `__sigpause`.
    fn __sigpause(sig_or_mask: libc::c_int, is_sig: libc::c_int) -> libc::c_int = sigpause_impl(sig_or_mask, is_sig);
}

/// An interposed call that waits under a temporary signal mask, one of its arguments
/// (`$set`, null or a mask): passed on to the C library's function (`$next`) with SIGTRAP
/// taken out of that mask, the other arguments as they are.
macro_rules! temporary_mask {
    ($(#[$m:meta])* fn $name:ident($($a:ident: $t:ty),*) with $set:ident = $next:expr;) => {
        $(#[$m])*
        ///
        /// # Safety
        /// As the C library's function of this name.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> libc::c_int {
            let f = next($next);
            if f == 0 {
                return enosys();
            }
            type F = unsafe extern "C" fn($($t),*) -> libc::c_int;
            // SAFETY: the caller passes null or a valid set.
            let copy = unsafe { without_sigtrap($set) };
            let $set = either(&copy, $set);
            mask_changed();
            // SAFETY: the C library's function of this name, of type F.
            let r = unsafe { std::mem::transmute::<usize, F>(f)($($a),*) };
            mask_changed();
            r
        }
    };
}

temporary_mask! {
    /// Interposed `ppoll(2)`.
    fn ppoll(
        fds: *mut libc::pollfd,
        nfds: libc::nfds_t,
        timeout: *const libc::timespec,
        set: *const libc::sigset_t
    ) with set = Next::Ppoll;
}

temporary_mask! {
    /// Interposed `__ppoll_chk` (`ppoll` under `_FORTIFY_SOURCE`; `fdslen`: the size of `fds`
    /// in bytes).
    fn __ppoll_chk(
        fds: *mut libc::pollfd,
        nfds: libc::nfds_t,
        timeout: *const libc::timespec,
        set: *const libc::sigset_t,
        fdslen: usize
    ) with set = Next::PpollChk;
}

temporary_mask! {
    /// Interposed `pselect(2)`.
    fn pselect(
        nfds: libc::c_int,
        readfds: *mut libc::fd_set,
        writefds: *mut libc::fd_set,
        exceptfds: *mut libc::fd_set,
        timeout: *const libc::timespec,
        set: *const libc::sigset_t
    ) with set = Next::Pselect;
}

temporary_mask! {
    /// Interposed `epoll_pwait(2)`.
    fn epoll_pwait(
        epfd: libc::c_int,
        events: *mut libc::epoll_event,
        maxevents: libc::c_int,
        timeout: libc::c_int,
        set: *const libc::sigset_t
    ) with set = Next::EpollPwait;
}

temporary_mask! {
    /// Interposed `epoll_pwait2(2)`.
    fn epoll_pwait2(
        epfd: libc::c_int,
        events: *mut libc::epoll_event,
        maxevents: libc::c_int,
        timeout: *const libc::timespec,
        set: *const libc::sigset_t
    ) with set = Next::EpollPwait2;
}

/// Interposed `pthread_attr_setsigmask_np(3)`: the new thread's first mask, without SIGTRAP.
///
/// # Safety
/// As `pthread_attr_setsigmask_np(3)`.
#[no_mangle]
pub unsafe extern "C" fn pthread_attr_setsigmask_np(
    attr: *mut libc::pthread_attr_t,
    set: *const libc::sigset_t,
) -> libc::c_int {
    let f = next(Next::PthreadAttrSetsigmaskNp);
    if f == 0 {
        return libc::ENOSYS;
    }
    type F = unsafe extern "C" fn(*mut libc::pthread_attr_t, *const libc::sigset_t) -> libc::c_int;
    // SAFETY: the caller passes null or a valid set.
    let copy = unsafe { without_sigtrap(set) };
    // SAFETY: glibc's pthread_attr_setsigmask_np, of type F (it copies the set).
    unsafe { std::mem::transmute::<usize, F>(f)(attr, either(&copy, set)) }
}

// ---- masks restored from saved state ------------------------------------------------------

/// glibc's `struct __jmp_buf_tag` (`jmp_buf`, `sigjmp_buf`): the registers, whether
/// `sigsetjmp` saved the mask, the mask.
#[repr(C)]
pub struct JmpBufTag {
    regs: [libc::c_long; 8],
    mask_was_saved: libc::c_int,
    saved_mask: libc::sigset_t,
}

type LongjmpFn = unsafe extern "C" fn(*mut JmpBufTag, libc::c_int) -> !;

/// Take SIGTRAP out of the mask `env` will restore, then jump with `which`.
///
/// # Safety
/// As `siglongjmp(3)`: `env` was filled by `sigsetjmp`/`setjmp` in a function still running.
unsafe fn longjmp_impl(which: Next, env: *mut JmpBufTag, val: libc::c_int) -> ! {
    // SAFETY: the caller's contract: a valid jmp_buf, the program's own, writable.
    let e = unsafe { &mut *env };
    // The hooked calls this jump leaves (JB_RSP, word 6, mangled by glibc).
    crate::returns::before_longjmp(e.regs[6] as u64);
    if e.mask_was_saved != 0 && text_poke::installed() {
        set_sigtrap(&mut e.saved_mask, false);
    }
    // A jump out of a handler leaves its mask, or restores the saved one.
    mask_changed();
    let f = next(which);
    if f == 0 {
        // SAFETY: abort has no preconditions; there is no way to jump without the C library.
        unsafe { libc::abort() };
    }
    // SAFETY: glibc's longjmp, of this type; it unwinds only this frame, which owns nothing.
    unsafe { std::mem::transmute::<usize, LongjmpFn>(f)(env, val) }
}

interposer! {
    /// Interposed `siglongjmp(3)`.
    fn siglongjmp(env: *mut JmpBufTag, val: libc::c_int) -> ! = longjmp_impl(Next::Siglongjmp, env, val);
}

interposer! {
    /// Interposed `longjmp(3)` (glibc's restores a mask `sigsetjmp` saved, as `siglongjmp`).
    fn longjmp(env: *mut JmpBufTag, val: libc::c_int) -> ! = longjmp_impl(Next::Siglongjmp, env, val);
}

interposer! {
    /// Interposed `_longjmp(3)` (the same function in glibc).
    fn _longjmp(env: *mut JmpBufTag, val: libc::c_int) -> ! = longjmp_impl(Next::Siglongjmp, env, val);
}

interposer! {
    /// Interposed `__longjmp_chk` (`longjmp` under `_FORTIFY_SOURCE`).
    fn __longjmp_chk(env: *mut JmpBufTag, val: libc::c_int) -> ! = longjmp_impl(Next::LongjmpChk, env, val);
}

/// Take SIGTRAP out of the mask a context switch to `ucp` restores. In place: glibc's
/// `setcontext` goes on reading `ucp` after it has switched stacks, so a copy on this
/// frame could be overwritten by a signal meanwhile.
///
/// # Safety
/// `ucp` is a valid, writable `ucontext_t` (the program's).
unsafe fn context_without_sigtrap(ucp: *mut libc::ucontext_t) {
    if !ucp.is_null() && text_poke::installed() {
        // SAFETY: the caller's contract.
        set_sigtrap(unsafe { &mut (*ucp).uc_sigmask }, false);
    }
}

/// Interposed `setcontext(3)`.
///
/// # Safety
/// As `setcontext(3)`; `ucp` must be writable (it is the program's).
#[no_mangle]
pub unsafe extern "C" fn setcontext(ucp: *mut libc::ucontext_t) -> libc::c_int {
    // SAFETY: the caller's contract.
    unsafe { context_without_sigtrap(ucp) };
    // SAFETY: the caller's contract.
    unsafe { crate::returns::before_context_switch(ucp) };
    let f = next(Next::Setcontext);
    if f == 0 {
        return enosys();
    }
    type F = unsafe extern "C" fn(*mut libc::ucontext_t) -> libc::c_int;
    mask_changed();
    // SAFETY: glibc's setcontext, of type F.
    unsafe { std::mem::transmute::<usize, F>(f)(ucp) }
}

/// Interposed `swapcontext(3)`. When the program later switches back to `oucp`, execution
/// resumes in this frame, which returns to its caller.
///
/// # Safety
/// As `swapcontext(3)`; `ucp` must be writable (it is the program's).
#[no_mangle]
pub unsafe extern "C" fn swapcontext(
    oucp: *mut libc::ucontext_t,
    ucp: *mut libc::ucontext_t,
) -> libc::c_int {
    // SAFETY: the caller's contract.
    unsafe { context_without_sigtrap(ucp) };
    // SAFETY: the caller's contract.
    unsafe { crate::returns::before_context_switch(ucp) };
    let f = next(Next::Swapcontext);
    if f == 0 {
        return enosys();
    }
    type F = unsafe extern "C" fn(*mut libc::ucontext_t, *mut libc::ucontext_t) -> libc::c_int;
    mask_changed();
    // SAFETY: glibc's swapcontext, of type F.
    let r = unsafe { std::mem::transmute::<usize, F>(f)(oucp, ucp) };
    // Back in `oucp`'s context, under its mask.
    mask_changed();
    r
}

/// Interposed `sigaltstack(2)`: return hooks keep the thread's signal stack (to tell its
/// frames from the thread's stack) and ask again after it changed.
///
/// # Safety
/// As `sigaltstack(2)`.
#[no_mangle]
pub unsafe extern "C" fn sigaltstack(
    ss: *const libc::stack_t,
    old: *mut libc::stack_t,
) -> libc::c_int {
    let f = next(Next::Sigaltstack);
    if f == 0 {
        return enosys();
    }
    type F = unsafe extern "C" fn(*const libc::stack_t, *mut libc::stack_t) -> libc::c_int;
    // SAFETY: the C library's sigaltstack, of type F, with the caller's arguments.
    let r = unsafe { std::mem::transmute::<usize, F>(f)(ss, old) };
    if r == 0 && !ss.is_null() {
        ftprobe::ftrace::fgraph_unwind::signal_stack_changed();
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sigtrap_bit_matches_the_c_library() {
        // SAFETY: sigemptyset/sigaddset/sigismember on our own zeroed sets.
        unsafe {
            let mut a: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut a);
            libc::sigaddset(&mut a, libc::SIGTRAP);
            assert!(has_sigtrap(&a));
            set_sigtrap(&mut a, false);
            assert_eq!(libc::sigismember(&a, libc::SIGTRAP), 0);
            libc::sigfillset(&mut a);
            set_sigtrap(&mut a, false);
            assert_eq!(libc::sigismember(&a, libc::SIGTRAP), 0);
            assert_eq!(libc::sigismember(&a, libc::SIGUSR1), 1);
            assert_eq!(libc::sigismember(&a, libc::SIGINT), 1);
        }
        assert_eq!(
            SIGTRAP_BIT as libc::c_int,
            1 << (libc::SIGTRAP - 1),
            "BSD sigmask(SIGTRAP)"
        );
    }

    #[test]
    fn every_next_symbol_resolves() {
        init();
        for (i, name) in NAMES.iter().enumerate() {
            let v = NEXT[i].load(Ordering::Relaxed);
            assert!(v != UNRESOLVED && v != ABSENT, "{name:?}");
        }
    }

    #[test]
    fn jmp_buf_layout_is_glibcs() {
        // setjmp.h: __jmpbuf (8 longs), __mask_was_saved (int), __saved_mask (__sigset_t).
        assert_eq!(std::mem::offset_of!(JmpBufTag, mask_was_saved), 64);
        assert_eq!(std::mem::offset_of!(JmpBufTag, saved_mask), 72);
        assert_eq!(std::mem::size_of::<JmpBufTag>(), 200);
    }
}
