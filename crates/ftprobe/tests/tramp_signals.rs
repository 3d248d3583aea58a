//! A program's signal that arrives while an ftrace callback runs is held until the trampoline
//! returns, then delivered with the program's own action (`arch::x86_64::tramp_signals`).
//! Each callback here sends its own thread a signal (`tgkill`) in the middle of the hit, so
//! the signal is pending the moment the callback runs: untraced, the same signal sent at the
//! function's first instruction would run the handler there.
//!
//! `harness = false`: `ftrace::init` must run while the process is single-threaded, and the
//! cases share one process-wide ftrace state, so they run in order from `main`.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};

use ftprobe::arch::x86_64::tramp_signals;
use ftprobe::ftrace::{self, FtraceOps, PtRegs};
use ftprobe_dev::fxsites::*;

/// The signal the running case's callback sends (0: none).
static SEND: AtomicI32 = AtomicI32::new(0);
/// The callback has finished (set after the signal was sent).
static CALLBACK_DONE: AtomicBool = AtomicBool::new(false);
/// What the handler saw: runs, the callback finished before it ran, the PC, si_code, si_pid.
static RUNS: AtomicU64 = AtomicU64::new(0);
static AFTER_CALLBACK: AtomicBool = AtomicBool::new(false);
static PC: AtomicU64 = AtomicU64::new(0);
static CODE: AtomicI32 = AtomicI32::new(0);
static SENDER: AtomicI32 = AtomicI32::new(0);
/// The handler jumps out with `siglongjmp` to this buffer when set.
static JUMP: AtomicBool = AtomicBool::new(false);
static mut JMP_BUF: [u64; 64] = [0; 64];

extern "C" {
    #[link_name = "__sigsetjmp"]
    fn sigsetjmp(env: *mut u64, savemask: i32) -> i32;
    fn siglongjmp(env: *mut u64, val: i32) -> !;
}

fn tgkill(sig: i32) {
    // SAFETY: sends a signal to this thread; no memory is passed.
    unsafe {
        libc::syscall(
            libc::SYS_tgkill,
            libc::getpid(),
            libc::syscall(libc::SYS_gettid),
            sig,
        )
    };
}

static OPS: FtraceOps = {
    unsafe extern "C" fn cb(_ip: u64, _p: u64, _op: &FtraceOps, _r: &mut PtRegs) {
        let sig = SEND.load(Ordering::Relaxed);
        if sig != 0 {
            tgkill(sig);
        }
        CALLBACK_DONE.store(true, Ordering::Relaxed);
    }
    FtraceOps::new(cb, 0)
};

extern "C" fn handler(_sig: i32, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    RUNS.fetch_add(1, Ordering::Relaxed);
    AFTER_CALLBACK.store(CALLBACK_DONE.load(Ordering::Relaxed), Ordering::Relaxed);
    // SAFETY: the kernel passes a valid siginfo_t and ucontext_t to an SA_SIGINFO handler.
    unsafe {
        let uc = &*(ctx as *const libc::ucontext_t);
        PC.store(
            uc.uc_mcontext.gregs[libc::REG_RIP as usize] as u64,
            Ordering::Relaxed,
        );
        CODE.store((*info).si_code, Ordering::Relaxed);
        SENDER.store((*info).si_pid(), Ordering::Relaxed);
    }
    if JUMP.swap(false, Ordering::Relaxed) {
        // SAFETY: JMP_BUF was filled by sigsetjmp in a frame that is still live.
        unsafe { siglongjmp(&raw mut JMP_BUF as *mut u64, 1) };
    }
}

fn install(sig: i32, flags: i32) {
    // SAFETY: a zeroed sigaction is valid; the handler is an extern "C" fn of ours.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | flags;
        assert_eq!(libc::sigaction(sig, &sa, std::ptr::null_mut()), 0);
    }
}

fn action(sig: i32) -> usize {
    // SAFETY: reads the action into a zeroed sigaction of ours.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut sa);
        sa.sa_sigaction
    }
}

fn fx_add_at() -> u64 {
    fx_add as *const () as u64
}

/// One traced call of fx_add whose callback sends `sig`.
fn call_sending(sig: i32) -> i64 {
    RUNS.store(0, Ordering::Relaxed);
    CALLBACK_DONE.store(false, Ordering::Relaxed);
    AFTER_CALLBACK.store(false, Ordering::Relaxed);
    SEND.store(sig, Ordering::Relaxed);
    // SAFETY: a plain C function of ftprobe-dev.
    let r = unsafe { fx_add(20, 22) };
    SEND.store(0, Ordering::Relaxed);
    r
}

fn pending(sig: i32) -> bool {
    // SAFETY: sigpending writes our own set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigpending(&mut set);
        libc::sigismember(&set, sig) == 1
    }
}

fn a_signal_sent_in_a_callback_runs_its_handler_after_the_hit() {
    assert_eq!(call_sending(libc::SIGUSR1), 42);
    assert_eq!(RUNS.load(Ordering::Relaxed), 1, "the handler ran once");
    assert!(
        AFTER_CALLBACK.load(Ordering::Relaxed),
        "the handler ran after the callback finished, not inside it"
    );
    assert_eq!(
        PC.load(Ordering::Relaxed),
        fx_add_at() + 5,
        "the handler sees the PC after the site (the trampoline's return address), not one in ftprobe"
    );
    assert_eq!(
        CODE.load(Ordering::Relaxed),
        libc::SI_TKILL,
        "its own siginfo"
    );
    // SAFETY: getpid has no preconditions.
    assert_eq!(SENDER.load(Ordering::Relaxed), unsafe { libc::getpid() });
    assert!(!pending(libc::SIGUSR1), "nothing left pending");
    assert_eq!(tramp_signals::frame_word(), 0, "no trampoline frame left");
}

fn sa_resethand_resets_once_after_the_held_delivery() {
    assert_eq!(call_sending(libc::SIGUSR2), 42);
    assert_eq!(RUNS.load(Ordering::Relaxed), 1);
    assert!(AFTER_CALLBACK.load(Ordering::Relaxed));
    assert_eq!(
        action(libc::SIGUSR2),
        libc::SIG_DFL,
        "reset to SIG_DFL by its one delivery"
    );
}

fn sa_nodefer_handler_runs_once_after_the_hit() {
    assert_eq!(call_sending(libc::SIGURG), 42);
    assert_eq!(RUNS.load(Ordering::Relaxed), 1);
    assert!(AFTER_CALLBACK.load(Ordering::Relaxed));
    assert_eq!(PC.load(Ordering::Relaxed), fx_add_at() + 5);
}

fn siglongjmp_out_of_a_held_delivery_leaves_tracing_working() {
    JUMP.store(true, Ordering::Relaxed);
    // SAFETY: JMP_BUF is ours; the jump comes back into this frame, which is live.
    let jumped = unsafe { sigsetjmp(&raw mut JMP_BUF as *mut u64, 1) };
    if jumped == 0 {
        call_sending(libc::SIGUSR1);
        panic!("the handler jumps out");
    }
    assert!(
        AFTER_CALLBACK.load(Ordering::Relaxed),
        "the hit was complete"
    );
    assert_eq!(PC.load(Ordering::Relaxed), fx_add_at() + 5);
    assert_eq!(tramp_signals::frame_word(), 0);
    // Tracing and signals work on: the next hit's signal is held and delivered as before.
    assert_eq!(call_sending(libc::SIGUSR1), 42);
    assert_eq!(RUNS.load(Ordering::Relaxed), 1);
    assert!(AFTER_CALLBACK.load(Ordering::Relaxed));
    assert!(!pending(libc::SIGUSR1));
}

fn main() {
    // Quick tier only: this binary has no stress case (ftprobe_dev::tier).
    if !ftprobe_dev::tier::quick_tier_requested() {
        return;
    }
    install(libc::SIGUSR1, 0);
    install(libc::SIGUSR2, libc::SA_RESETHAND);
    install(libc::SIGURG, libc::SA_NODEFER);
    // SAFETY: early in main (reading the arguments starts no thread): no other thread exists yet.
    let skipped = unsafe { ftrace::init() }.expect("ftrace::init");
    assert!(skipped.is_empty(), "{skipped:?}");
    ftrace::ftrace_set_filter(&OPS, "fx_add", true).unwrap();
    ftrace::register_ftrace_function(&OPS).unwrap();
    let cases: &[(&str, fn())] = &[
        (
            "a_signal_sent_in_a_callback_runs_its_handler_after_the_hit",
            a_signal_sent_in_a_callback_runs_its_handler_after_the_hit,
        ),
        (
            "sa_resethand_resets_once_after_the_held_delivery",
            sa_resethand_resets_once_after_the_held_delivery,
        ),
        (
            "sa_nodefer_handler_runs_once_after_the_hit",
            sa_nodefer_handler_runs_once_after_the_hit,
        ),
        (
            "siglongjmp_out_of_a_held_delivery_leaves_tracing_working",
            siglongjmp_out_of_a_held_delivery_leaves_tracing_working,
        ),
    ];
    for (name, f) in cases {
        f();
        println!("test {name} ... ok");
    }
    ftrace::unregister_ftrace_function(&OPS).unwrap();
    println!("{} passed, 0 failed", cases.len());
}
