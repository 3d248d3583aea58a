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
//! return address and jump), exactly as the kernel's `poke_int3_handler()` does. A trap that is
//! not ours is passed on to the handler that was installed before ours.
//!
//! Text is made writable once per executable segment ([`make_writable`]), never per site.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};

use super::nops::{call_target, INT3, SITE_LEN};
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

/// Errors of the patching layer.
#[derive(Debug, thiserror::Error)]
pub enum TextPokeError {
    /// A system call failed (mprotect, membarrier, sigaction).
    #[error(transparent)]
    Syscall(#[from] SyscallError),
}

static BATCH: AtomicPtr<Vec<Poke>> = AtomicPtr::new(std::ptr::null_mut());
static HANDLERS_ACTIVE: AtomicUsize = AtomicUsize::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);
/// The program's SIGTRAP action, which ours chains to for traps that are not ftprobe's: the
/// one in place before ours, then whatever the program installs later (the agent interposes
/// `sigaction`/`signal`, see [`replace_chained`]). Leaked boxes: a handler may be reading the
/// previous one.
static CHAINED: AtomicPtr<libc::sigaction> = AtomicPtr::new(std::ptr::null_mut());

/// Whether ftprobe's SIGTRAP handler is installed.
pub fn installed() -> bool {
    INSTALLED.load(Ordering::Acquire)
}

/// The program's view of SIGTRAP while ftprobe's handler is installed: store `new` (if any)
/// as the action traps that are not ftprobe's go to, and return the previous one. What an
/// interposed `sigaction(SIGTRAP, new, old)` does, so that the program's handler keeps
/// working and ftprobe's stays in place.
pub fn replace_chained(new: Option<&libc::sigaction>) -> libc::sigaction {
    // Acquire pairs with the Release swap below / in `init`.
    let cur = CHAINED.load(Ordering::Acquire);
    let prev = if cur.is_null() {
        // SAFETY: a zeroed sigaction is valid: SIG_DFL.
        unsafe { std::mem::zeroed() }
    } else {
        // SAFETY: CHAINED holds a leaked, never-freed Box once `init` ran.
        unsafe { *cur }
    };
    if let Some(n) = new {
        // Release pairs with the Acquire loads here and in `chain_to_old_handler`.
        CHAINED.store(Box::into_raw(Box::new(*n)), Ordering::Release);
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
    // Release pairs with the Acquire load in `chain_to_old_handler`.
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
    // SAFETY: the caller's contract.
    unsafe { std::ptr::write_volatile(addr as *mut u8, byte) };
    sys::sync_core_all_threads()?;
    Ok(())
}

/// Install the SIGTRAP handler and register for membarrier. Idempotent.
pub fn init() -> Result<(), TextPokeError> {
    if INSTALLED.load(Ordering::Acquire) {
        return Ok(());
    }
    sys::membarrier_register()?;
    // SAFETY: a zeroed sigaction is a valid value (empty mask, no flags, SIG_DFL).
    let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
    act.sa_sigaction = sigtrap_handler as *const () as usize;
    // SA_NODEFER: a probe handler running inside this handler may hit another int3 probe; with
    // SIGTRAP blocked the kernel would kill the process instead of delivering it.
    act.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART | libc::SA_ONSTACK | libc::SA_NODEFER;
    // SAFETY: a zeroed sigaction is a valid value.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: `act` is a valid sigaction whose handler is async-signal-safe; `old` is ours.
    let r = unsafe { sys::real_sigaction(libc::SIGTRAP, &act, &mut old) };
    CHAINED.store(Box::into_raw(Box::new(old)), Ordering::Release);
    if r != 0 {
        return Err(SyscallError {
            call: "sigaction",
            source: std::io::Error::last_os_error(),
        }
        .into());
    }
    // Release pairs with the Acquire load in `chain_to_old_handler`.
    INSTALLED.store(true, Ordering::Release);
    Ok(())
}

/// Make the pages of `[start, start+len)` readable, writable and executable.
///
/// # Safety
/// The range must be mapped code of this process. Adding `PROT_WRITE` invalidates no access.
pub unsafe fn make_writable(start: u64, len: u64) -> Result<(), TextPokeError> {
    let page = sys::page_size() as u64;
    let lo = start & !(page - 1);
    let hi = (start + len).div_ceil(page) * page;
    // SAFETY: the caller guarantees the range is our mapped code; RWX only adds permissions.
    unsafe {
        sys::mprotect(
            lo as usize,
            (hi - lo) as usize,
            libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC,
        )?
    };
    Ok(())
}

/// Rewrite sites while no other thread can run (the kernel's `text_poke_early()`): plain
/// stores, no protocol. Used in the agent's constructor and in `ftrace::init`.
///
/// # Safety
/// Every `addr..addr+bytes.len()` must be writable code of this process (see [`make_writable`])
/// that no other thread executes or can start executing until this returns.
pub unsafe fn text_poke_early(addr: u64, bytes: &[u8]) {
    for (i, b) in bytes.iter().enumerate() {
        // SAFETY: the caller guarantees the byte is writable and not concurrently executed.
        unsafe { std::ptr::write_volatile((addr as usize + i) as *mut u8, *b) };
    }
}

/// Rewrite a batch of 5-byte sites while other threads may execute them (module docs).
///
/// # Safety
/// Every `addr` must be the first byte of a 5-byte site in writable code of this process
/// (see [`make_writable`]) whose current and new contents are each one whole instruction, and no
/// other thread may patch the same sites concurrently (callers hold the ftrace lock).
pub unsafe fn text_poke_batch(pokes: &[Poke]) -> Result<(), TextPokeError> {
    if pokes.is_empty() {
        return Ok(());
    }
    init()?;
    let mut batch = Box::new(pokes.to_vec());
    batch.sort_by_key(|p| p.addr);
    let batch = Box::into_raw(batch);
    // Release pairs with the Acquire load in `sigtrap_handler`: the handler sees the whole Vec.
    BATCH.store(batch, Ordering::SeqCst);
    let result = (|| {
        for p in pokes {
            // SAFETY: see above.
            unsafe { std::ptr::write_volatile(p.addr as *mut u8, INT3) };
        }
        sys::sync_core_all_threads()?;
        poke_bytes(pokes, |p| &p.new, 1..SITE_LEN as usize);
        sys::sync_core_all_threads()?;
        poke_bytes(pokes, |p| &p.new, 0..1);
        sys::sync_core_all_threads()
    })();
    if result.is_err() {
        // Put every site back as it was, through the same int3-first order; the batch stays
        // published meanwhile so a thread that traps is still emulated (as the old bytes now).
        for p in pokes {
            // SAFETY: see above.
            unsafe { std::ptr::write_volatile(p.addr as *mut u8, INT3) };
        }
        let _ = sys::sync_core_all_threads();
        poke_bytes(pokes, |p| &p.old, 1..SITE_LEN as usize);
        let _ = sys::sync_core_all_threads();
        poke_bytes(pokes, |p| &p.old, 0..1);
        let _ = sys::sync_core_all_threads();
    }
    BATCH.store(std::ptr::null_mut(), Ordering::SeqCst);
    // A handler that incremented HANDLERS_ACTIVE before our store may still read the batch
    // (SeqCst on both sides: any handler that increments later loads null).
    while HANDLERS_ACTIVE.load(Ordering::SeqCst) != 0 {
        std::thread::yield_now();
    }
    // SAFETY: `batch` came from Box::into_raw above and no handler can reach it any more.
    drop(unsafe { Box::from_raw(batch) });
    result.map_err(Into::into)
}

/// Write bytes `range` of each site's `which` contents.
fn poke_bytes(pokes: &[Poke], which: fn(&Poke) -> &[u8; 5], range: std::ops::Range<usize>) {
    for p in pokes {
        for i in range.clone() {
            // SAFETY: text_poke_batch's contract: each address is a site in writable code; the
            // first byte is an int3 while other bytes change, so no thread decodes a mix.
            unsafe { std::ptr::write_volatile((p.addr as usize + i) as *mut u8, which(p)[i]) };
        }
    }
}

/// Probe path: the SIGTRAP handler. Async-signal-safe: atomics, loads and stores only.
extern "C" fn sigtrap_handler(
    sig: libc::c_int,
    info: *mut libc::siginfo_t,
    ctx: *mut libc::c_void,
) {
    // A SIGTRAP sent by kill/raise/tgkill is the program's, never an int3 of ours (those come
    // with si_code SI_KERNEL).
    // SAFETY: the kernel passes a valid siginfo_t to an SA_SIGINFO handler.
    if unsafe { (*info).si_code } != libc::SI_KERNEL {
        chain_to_old_handler(sig, info, ctx);
        return;
    }
    // SAFETY: the kernel passes a valid ucontext_t for an SA_SIGINFO handler; this thread owns it.
    let uc = unsafe { &mut *(ctx as *mut libc::ucontext_t) };
    let ip = uc.uc_mcontext.gregs[libc::REG_RIP as usize] as u64;
    let addr = ip.wrapping_sub(1);
    let mut handled = emulate_if_in_batch(uc, addr);
    if !handled {
        let hook = TRAP_HOOK.load(Ordering::Acquire);
        if !hook.is_null() {
            // SAFETY: TRAP_HOOK only ever holds a `TrapHook` (see `set_trap_hook`).
            let hook: TrapHook = unsafe { std::mem::transmute::<*mut (), TrapHook>(hook) };
            handled = hook(uc);
        }
    }
    if !handled {
        // SAFETY: `addr` is where the trapping int3 was fetched from: mapped, readable code.
        let still_int3 = unsafe { std::ptr::read_volatile(addr as *const u8) } == INT3;
        if !still_int3 {
            // The int3 of a batch that has completed since this thread trapped: run the
            // instruction that is there now.
            uc.uc_mcontext.gregs[libc::REG_RIP as usize] = addr as i64;
            handled = true;
        } else {
            // The int3 may be the next batch's, written after we looked: a batch is published
            // before it writes its int3s (x86 keeps stores in order), so seeing the int3 means
            // a look now finds that batch. Found by a test flipping sites 200 times while two
            // threads ran through them.
            std::sync::atomic::fence(Ordering::SeqCst);
            handled = emulate_if_in_batch(uc, addr);
        }
    }
    if !handled {
        chain_to_old_handler(sig, info, ctx);
    }
}

/// Probe path: if `addr` is a site of the batch in flight, emulate its new instruction.
fn emulate_if_in_batch(uc: &mut libc::ucontext_t, addr: u64) -> bool {
    HANDLERS_ACTIVE.fetch_add(1, Ordering::SeqCst);
    let batch = BATCH.load(Ordering::SeqCst);
    let mut handled = false;
    if !batch.is_null() {
        // SAFETY: a non-null BATCH points to a live Vec until HANDLERS_ACTIVE drops to zero
        // after BATCH is cleared (see text_poke_batch).
        let pokes = unsafe { &*batch };
        if let Ok(i) = pokes.binary_search_by_key(&addr, |p| p.addr) {
            emulate(uc, &pokes[i]);
            handled = true;
        }
    }
    HANDLERS_ACTIVE.fetch_sub(1, Ordering::SeqCst);
    handled
}

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
        None => g[libc::REG_RIP as usize] = (p.addr + SITE_LEN) as i64,
    }
}

fn chain_to_old_handler(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // Acquire pairs with the Release store in `init`; the handler is only installed after it.
    if !INSTALLED.load(Ordering::Acquire) {
        return;
    }
    // Acquire pairs with the Release stores in `init` and `replace_chained`.
    let p = CHAINED.load(Ordering::Acquire);
    if p.is_null() {
        return;
    }
    // SAFETY: CHAINED points to a leaked Box that is never freed.
    let old = unsafe { &*p };
    let h = old.sa_sigaction;
    // SAFETY: the kernel passes a valid siginfo_t to an SA_SIGINFO handler.
    let from_kernel = unsafe { (*info).si_code } == libc::SI_KERNEL;
    if h == libc::SIG_IGN && !from_kernel {
        // A SIGTRAP sent by kill/raise to a program that ignores it: ignored, as without us.
        return;
    }
    if h == libc::SIG_DFL || h == libc::SIG_IGN {
        // Not our trap and nobody else's: die of SIGTRAP as the program would have without us
        // (the kernel kills a program that ignores a trap of its own too).
        let hook = FATAL_TRAP_HOOK.load(Ordering::Acquire);
        if !hook.is_null() {
            // SAFETY: FATAL_TRAP_HOOK only ever holds a `FatalTrapHook`.
            let hook = unsafe { std::mem::transmute::<*mut (), FatalTrapHook>(hook) };
            hook();
        }
        // SAFETY: sigaction and raise are async-signal-safe; a zeroed sigaction is SIG_DFL.
        unsafe {
            let mut dfl: libc::sigaction = std::mem::zeroed();
            dfl.sa_sigaction = libc::SIG_DFL;
            sys::real_sigaction(libc::SIGTRAP, &dfl, std::ptr::null_mut());
            libc::raise(libc::SIGTRAP);
        }
    } else if old.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the program installed this handler for SIGTRAP with SA_SIGINFO.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(h) };
        f(sig, info, ctx);
    } else {
        // SAFETY: the program installed this plain handler for SIGTRAP.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(h) };
        f(sig);
    }
}
