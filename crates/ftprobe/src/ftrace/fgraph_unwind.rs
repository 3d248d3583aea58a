//! Return hooks under what real programs do: when a hooked call that will never return
//! through the trampoline is declared closed, and how unwinders, longjmp and coroutines are
//! kept consistent with hijacked return addresses. One comment per case; DEVELOPERS.md
//! ("Return hooks (fgraph)") has the reasoning.
//!
//! The rule that makes most cases safe: a return is matched to its entry **by its slot**
//! (`retp`), never by popping the top. So whatever the program did meanwhile (longjmp over
//! hooked frames, switching coroutines, an exception that unwound frames without our
//! knowledge), the trampoline always finds the real return address of the call that is
//! returning. What remains is *when* to tell users that a call ended without returning, and
//! never to forget an entry whose slot may still be returned through.
//!
//! - **Which stack.** Entries on another stack are never closed by an event on this one.
//!   Stacks the program makes with `makecontext` are known (the agent interposes it and
//!   calls [`note_stack`]); the thread's signal stack is asked for (`sigaltstack`) when a
//!   decision first needs it, then kept until the program calls `sigaltstack` (the agent
//!   interposes it: [`signal_stack_changed`]); every other address counts as the thread's
//!   own stack.
//! - **Normal nesting.** A call's slot is below its caller's on the same stack; an event
//!   (entry or return) at slot `R` proves that every entry on the same stack with a slot
//!   below `R` (or equal, for an entry event whose slot does not hold the trampoline: the
//!   slot was reused by a new call) belongs to a frame that is gone (`before_event`,
//!   `close_above`): closed as `Lost`, deepest first, before the event is handled.
//! - **A stack switched by hand** (no API: a coroutine library's own assembly) looks like the
//!   thread's stack, so its entries can be judged gone when they are not. Such an entry is
//!   never forgotten while its slot still holds the trampoline: it becomes a *zombie*
//!   (reported `Lost`, kept with its real return address; a late return through it still
//!   works and is counted in `late_returns`). Zombies whose slots no longer hold the
//!   trampoline are reclaimed when the stack is full (`reclaim`).
//! - **A coroutine resumed on another thread**: its return finds no entry on this thread's
//!   shadow stack; every thread's shadow stack is searched (`return_elsewhere`). Only if no
//!   entry anywhere has the slot is it fatal (`fatal_no_entry`): the real address is lost,
//!   so the process is stopped with a clear message rather than jumping anywhere.
//! - **Tail calls**: a hooked function that jumps to another hooked function passes on its
//!   own slot, which already holds the trampoline: the new entry records the trampoline as
//!   its return address, and is matched first (searching from the top); the trampoline then
//!   returns into itself and closes the outer call (the kernel's behaviour). An entry event
//!   at the same slot whose value is the trampoline is such a tail call, not a slot reuse.
//!   After an unwinder restored the slots (below), the outer call's real address is in the
//!   slot: the tail call's entry lives on with it, and the outer one writes the trampoline
//!   back (`after_unwinder`; closing the outer call there left the tail call's return
//!   with no entry, and the next throw with only the trampoline to restore).
//! - **longjmp / siglongjmp / _longjmp / __longjmp_chk** (interposed by the agent, which
//!   calls [`longjmp_unwind`] with the target's stack pointer from the `jmp_buf`): every
//!   entry on the target's stack with a slot below the target stack pointer (and at or above
//!   the caller's, when the caller is on the same stack) is closed `Longjmp`, deepest first;
//!   a longjmp that leaves another stack (a handler on the signal stack, a coroutine) closes
//!   the calls of the caller's chain on that stack too (zombies while their slots hold the
//!   trampoline).
//!   A longjmp the agent does not see (none is known in glibc's exported ones) is caught by
//!   the nesting rule at the next event, as `Lost`.
//! - **setcontext / swapcontext**: stacks are known from `makecontext` ([`note_stack`]); an
//!   entry on a stack the thread left stays live until that stack returns through it.
//! - **Exceptions, forced unwinding, backtraces** (C++ throw, Rust panic, `pthread_exit`,
//!   cancellation, `backtrace()`, `_Unwind_Backtrace`): an unwinder reads return addresses
//!   from the stack and would find the trampoline (no FDE covering the caller: "end of
//!   stack", `std::terminate`). At each entry of the unwinder (the agent puts probes on
//!   libgcc_s's `_Unwind_RaiseException`, `_Unwind_Resume`, `_Unwind_Resume_or_Rethrow`,
//!   `_Unwind_ForcedUnwind`, `_Unwind_Backtrace`: glibc reaches the last three through
//!   pointers it got from `dlsym`, so interposing the symbols would miss them),
//!   [`unwinder_entered`] puts back every real return address of the thread's current stack
//!   (entries become `RESTORED`, keyed by the unwinder's stack pointer). At the thread's next
//!   graph event outside the unwinder (a slot above the unwinder's stack pointer: the catch,
//!   a landing pad's call, the next call after a backtrace), or at the landing itself (a
//!   probe on `_Unwind_SetIP`, which every personality routine calls on the frame it
//!   resumes: the context's CFA is that frame's stack pointer at the call site; Rust's
//!   `catch_unwind` is seen only there), restored entries whose frames are gone (slot at or
//!   below the event's) are closed `Unwound` (`Lost` after a mere
//!   backtrace), and the live ones are hijacked again if their slot still holds their real
//!   return address. A restored call that returns before the next event returns to its real
//!   caller untraced and is closed at that event (late, its exit as above).
//! - **The end of a thread** (`pthread_exit`, cancellation: a forced unwind that ends in
//!   `start_thread` by glibc's internal longjmp, never returning through the thread's first
//!   frames): the calls still on the thread's shadow stack are closed when the thread's
//!   pthread key destructors run (`init_thread_exit_key`), deepest first:
//!   `Unwound` when an unwinder restored them, else `Lost`.
//! - **Signal handlers** run on the same stack below the interrupted frame (or on the signal
//!   stack, a known stack): their hooked calls nest normally; the first one on the signal
//!   stack nests under the call it interrupted (its depth in the graph). A handler that
//!   leaves by `siglongjmp` is the longjmp case.
//! - **fork** inside a hooked function: the child's memory is a copy, shadow stack included,
//!   so its returns find their entries. **exit** inside one: the process ends, nothing to do.
//! - **CET shadow stacks**: a hijacked return would fault (`#CP`) in a process whose shadow
//!   stack is enabled: `check_return_hooks_allowed` refuses return hooks there (entry
//!   tracing keeps working).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::fgraph::{
    call_retfuncs, return_trampoline, shadow_stack, FgraphExit, ShadowStack, FGRAPH_CAPACITY,
    FL_NOHIJACK, HOLE, LIVE, RESTORED, ZOMBIE,
};
use super::{FtraceError, PtRegs};
use crate::probe_state;

// ---------------------------------------------------------------------------------------
// Which stack an address belongs to.

/// Stacks made with `makecontext` (lo, hi), newest last; a ring of [`MAX_STACKS`].
const MAX_STACKS: usize = 256;
static STACKS: [(AtomicU64, AtomicU64); MAX_STACKS] =
    [const { (AtomicU64::new(0), AtomicU64::new(0)) }; MAX_STACKS];
static STACKS_NEXT: AtomicUsize = AtomicUsize::new(0);

/// A stack the program made (`makecontext`'s `uc_stack`): entries on it are judged only by
/// events on it. Older stacks overlapping it are forgotten (the memory was reused).
pub fn note_stack(lo: u64, hi: u64) {
    if hi <= lo {
        return;
    }
    let n = STACKS_NEXT.load(Ordering::Relaxed).min(MAX_STACKS);
    for (l, h) in &STACKS[..n] {
        let (ol, oh) = (l.load(Ordering::Relaxed), h.load(Ordering::Relaxed));
        if ol == lo && oh == hi {
            return;
        }
        if ol < hi && lo < oh {
            l.store(0, Ordering::Relaxed);
            h.store(0, Ordering::Relaxed);
        }
    }
    let i = STACKS_NEXT.fetch_add(1, Ordering::Relaxed) % MAX_STACKS;
    STACKS[i].0.store(lo, Ordering::Relaxed);
    STACKS[i].1.store(hi, Ordering::Relaxed);
    // Keep the scan bound at the table size once it wrapped.
    if STACKS_NEXT.load(Ordering::Relaxed) > 2 * MAX_STACKS {
        STACKS_NEXT.store(MAX_STACKS, Ordering::Relaxed);
    }
}

/// The known stack holding `a`: its low end, or 0 (the thread's own stack).
fn known_stack_of(a: u64) -> u64 {
    let n = STACKS_NEXT.load(Ordering::Relaxed).min(MAX_STACKS);
    for (l, h) in &STACKS[..n] {
        let (lo, hi) = (l.load(Ordering::Relaxed), h.load(Ordering::Relaxed));
        if a > lo && a <= hi {
            return lo;
        }
    }
    0
}

// This thread's signal stack as last asked: `(known, lo, hi)`, `lo == hi` when it has none:
// `ThreadState::alt_stack` (one thread-local for the probe path, see `probe_state`).

/// The thread's signal stack `(lo, hi)`, if enabled: asked (one raw `sigaltstack`) once per
/// thread and again after the program changes it ([`signal_stack_changed`]), not per event.
/// The range stays while a handler runs on it with `SS_AUTODISARM` (the kernel then answers
/// "disabled" and restores it at `sigreturn`, past any interposer): it is still that stack.
/// A thread whose first question is asked inside such a handler, or a program that calls
/// the system call itself, keeps a stale answer until its next `sigaltstack` call.
pub(crate) fn alt_stack() -> Option<(u64, u64)> {
    let (known, lo, hi) = probe_state::this_thread().alt_stack.get();
    if known {
        return (lo < hi).then_some((lo, hi));
    }
    // SAFETY: a zeroed stack_t is a valid value to be overwritten.
    let mut st: libc::stack_t = unsafe { std::mem::zeroed() };
    // SAFETY: sigaltstack(NULL, &st) only writes st.
    let r = unsafe { crate::sys::raw_syscall2(libc::SYS_sigaltstack, 0, &mut st as *mut _ as u64) };
    if r != 0 {
        return None;
    }
    let (lo, hi) = if st.ss_flags & libc::SS_DISABLE != 0 {
        (0, 0)
    } else {
        let lo = st.ss_sp as u64;
        (lo, lo + st.ss_size as u64)
    };
    probe_state::this_thread().alt_stack.set((true, lo, hi));
    (lo < hi).then_some((lo, hi))
}

/// The agent's `sigaltstack` interposer, after the program set its signal stack: the next
/// question asks the kernel again.
pub fn signal_stack_changed() {
    probe_state::this_thread().alt_stack.set((false, 0, 0));
}

/// Whether `a` is on the thread's signal stack (and not on a stack of `makecontext`).
pub(crate) fn on_signal_stack(a: u64) -> bool {
    known_stack_of(a) == 0 && alt_stack().is_some_and(|(lo, hi)| a > lo && a <= hi)
}

/// Whether two slots are on the same stack (see the module docs). Not on the hot path:
/// called only when an event would close entries.
pub(crate) fn same_stack(a: u64, b: u64) -> bool {
    let (ka, kb) = (known_stack_of(a), known_stack_of(b));
    if ka != kb {
        return false;
    }
    if ka != 0 {
        return true;
    }
    match alt_stack() {
        Some((lo, hi)) => (a > lo && a <= hi) == (b > lo && b <= hi),
        None => true,
    }
}

// ---------------------------------------------------------------------------------------
// Closing entries.

/// Whether the slot still holds the return trampoline (read without faulting: the stack
/// may be gone).
fn slot_holds_trampoline(retp: u64) -> bool {
    let mut b = [0u8; 8];
    crate::sys::read_nofault(retp, &mut b) == 8 && u64::from_le_bytes(b) == return_trampoline()
}

/// Close entry `j` that did not return: its users' return callbacks with `exit`, then it
/// becomes a hole, or a zombie if it may still be returned through.
fn close_entry(ss: &mut ShadowStack, j: usize, exit: FgraphExit, rettime: u64, certain: bool) {
    let e = &ss.entries[j];
    let mut regs = PtRegs {
        sp: e.retp.wrapping_add(8),
        ip: e.ret,
        ..PtRegs::default()
    };
    if e.flags & FL_NOHIJACK != 0 {
        regs.ip = 0;
    }
    let t = probe_state::this_thread();
    let guard = t.in_ftrace.get() == 0;
    if guard {
        t.in_ftrace.set(probe_state::stack_pointer());
    }
    call_retfuncs(t, ss, j, &regs, exit, rettime);
    if guard {
        t.in_ftrace.set(0);
    }
    let e = &mut ss.entries[j];
    let zombie =
        e.state == LIVE && e.flags & FL_NOHIJACK == 0 && !certain && slot_holds_trampoline(e.retp);
    if zombie {
        e.state = ZOMBIE;
        e.users = 0;
        ss.zombies += 1;
    } else {
        e.state = HOLE;
    }
}

/// The exit for a restored entry found gone.
fn restored_exit(ss: &ShadowStack) -> FgraphExit {
    if ss.unwinding {
        FgraphExit::Unwound
    } else {
        FgraphExit::Lost
    }
}

/// Before an event at slot `retp` (an entry, or with `is_return` a return): close the
/// entries of frames that are gone (module docs: normal nesting; restored entries after an
/// unwinder ran). Hot path: one comparison when nothing is to be done.
#[inline(always)]
pub(crate) fn before_event(ss: &mut ShadowStack, retp: u64, is_return: bool) {
    if ss.restored {
        after_unwinder(ss, retp, is_return);
    }
    if is_return {
        return;
    }
    // Entry: the topmost entries whose slot is at or below this one.
    let mut i = ss.top;
    while i > 0 {
        let e = &ss.entries[i - 1];
        if e.state == HOLE || e.state == ZOMBIE {
            i -= 1;
            continue;
        }
        if e.retp == 0 || e.retp > retp {
            return;
        }
        break;
    }
    if i > 0 {
        entry_closes(ss, retp);
    }
}

/// Slow part of `before_event` for an entry event: close the top entries on this stack
/// whose slot is below `retp` (or at it, unless it is a tail call).
#[cold]
#[inline(never)]
fn entry_closes(ss: &mut ShadowStack, retp: u64) {
    let rettime = crate::ring::read_tsc();
    // SAFETY: retp is the live slot of the call being entered.
    let tail_call = unsafe { *(retp as *const u64) } == return_trampoline();
    let mut i = ss.top;
    while i > 0 {
        i -= 1;
        let e = &ss.entries[i];
        match e.state {
            HOLE | ZOMBIE => continue,
            _ => {}
        }
        if e.retp == 0 {
            break;
        }
        let gone = e.retp < retp || (e.retp == retp && !tail_call);
        if !gone {
            break;
        }
        if !same_stack(e.retp, retp) {
            // Another stack's entry on top: this stack's entries are below it; keep
            // looking past it.
            continue;
        }
        let exit = if e.state == RESTORED {
            restored_exit(ss)
        } else {
            FgraphExit::Lost
        };
        close_entry(ss, i, exit, rettime, false);
    }
    ss.shrink();
}

/// At a return matched to entry `k` at slot `retp`: the entries above `k` on the same stack
/// with a slot below `retp` are gone; closed with `exit` (restored ones as unwound),
/// deepest first. Entries of other stacks stay.
#[inline(always)]
pub(crate) fn close_above(
    ss: &mut ShadowStack,
    k: usize,
    retp: u64,
    rettime: u64,
    exit: FgraphExit,
) {
    if ss.top <= k + 1 {
        return;
    }
    close_above_slow(ss, k, retp, rettime, exit);
}

#[cold]
#[inline(never)]
fn close_above_slow(ss: &mut ShadowStack, k: usize, retp: u64, rettime: u64, exit: FgraphExit) {
    let mut j = ss.top;
    while j > k + 1 {
        j -= 1;
        let e = &ss.entries[j];
        if (e.state == LIVE || e.state == RESTORED)
            && e.retp != 0
            && e.retp < retp
            && same_stack(e.retp, retp)
        {
            let x = if e.state == RESTORED {
                restored_exit(ss)
            } else {
                exit
            };
            close_entry(ss, j, x, rettime, false);
        }
    }
}

/// A full stack: reclaim zombies whose slot no longer holds the trampoline. Whether room
/// was made.
#[cold]
#[inline(never)]
pub(crate) fn reclaim(ss: &mut ShadowStack) -> bool {
    if ss.zombies == 0 {
        return false;
    }
    for e in ss.entries.iter_mut() {
        if e.state == ZOMBIE && !slot_holds_trampoline(e.retp) {
            e.state = HOLE;
            ss.zombies -= 1;
        }
    }
    ss.shrink();
    ss.top < ss.entries.len()
}

/// A full stack that `reclaim` could not shrink: a hole where a call at slot `retp` may go,
/// the lowest one above every entry of `retp`'s stack that is not a hole (so the calls of
/// each stack stay in the order they nest; entries of other stacks may stay above it).
/// Coroutines that switch with `swapcontext` leave such holes: each switch's return frees
/// an entry below the other stack's live one, and only holes at the top are dropped
/// (`shrink`), so a few hundred switches filled the stack with holes and calls went
/// unhooked. The trailing holes go once the entries above return.
#[cold]
#[inline(never)]
pub(crate) fn reusable_hole(ss: &ShadowStack, retp: u64) -> Option<usize> {
    let mut hole = None;
    let mut i = ss.top.min(FGRAPH_CAPACITY);
    while i > 0 {
        i -= 1;
        let e = &ss.entries[i];
        if e.state == HOLE {
            hole = Some(i);
        } else if e.retp == 0 || same_stack(e.retp, retp) {
            // An entry being made (retp 0: an interrupted push) or one of this stack.
            break;
        }
    }
    hole
}

/// No entry anywhere for a return through the trampoline: the real address is unknown.
#[cold]
#[inline(never)]
pub(crate) fn fatal_no_entry(retp: u64) -> ! {
    let mut hex = [0u8; 16];
    for (i, b) in hex.iter_mut().enumerate() {
        *b = b"0123456789abcdef"[((retp >> (60 - 4 * i)) & 0xf) as usize];
    }
    let head: &[u8] =
        b"ftprobe: return through the fgraph trampoline with no shadow entry for slot 0x";
    let tail: &[u8] = b": the real return address is lost; aborting\n";
    // SAFETY: write(2) of live buffers to fd 2, then the process ends by SIGABRT (raw
    // syscalls: no C library on this path, not even memcpy).
    unsafe {
        for part in [head, &hex[..], tail] {
            crate::sys::raw_syscall6(
                libc::SYS_write,
                [2, part.as_ptr() as u64, part.len() as u64, 0, 0, 0],
            );
        }
        let pid = crate::sys::raw_syscall6(libc::SYS_getpid, [0; 6]) as u64;
        crate::sys::raw_syscall2(libc::SYS_kill, pid, libc::SIGABRT as u64);
        crate::sys::raw_syscall2(libc::SYS_exit_group, 134, 0);
    }
    #[allow(clippy::empty_loop)]
    loop {}
}

// ---------------------------------------------------------------------------------------
// The end of a thread.

/// The pthread key whose destructor closes a thread's remaining calls (`u64::MAX`: none).
static EXIT_KEY: AtomicU64 = AtomicU64::new(u64::MAX);

/// glibc keeps the values of the first 32 keys in the thread descriptor
/// (`PTHREAD_KEY_2NDLEVEL_SIZE`): `pthread_setspecific` on them allocates nothing and takes
/// no lock, so the probe path may call it. A later key is not used.
const KEYS_IN_DESCRIPTOR: u32 = 32;

/// Once, when the first graph user registers (not on the probe path): create the key whose
/// destructor closes the calls a thread leaves open when it ends (module docs).
pub(crate) fn init_thread_exit_key() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let mut key: libc::pthread_key_t = 0;
        // SAFETY: pthread_key_create writes key; the destructor has the C signature.
        let r = unsafe { libc::pthread_key_create(&mut key, Some(thread_exit_dtor)) };
        if r == 0 && key < KEYS_IN_DESCRIPTOR {
            EXIT_KEY.store(key as u64, Ordering::Release);
        }
    });
}

/// Probe path, when a thread's shadow stack is mapped: give the thread a value for the key,
/// so that its destructor runs when the thread ends.
pub(crate) fn note_thread(ss: *mut ShadowStack) {
    let k = EXIT_KEY.load(Ordering::Acquire);
    if k != u64::MAX {
        // SAFETY: a key of the first block (see KEYS_IN_DESCRIPTOR): a store in this
        // thread's descriptor, async-signal-safe in practice.
        unsafe { libc::pthread_setspecific(k as libc::pthread_key_t, ss as *const libc::c_void) };
    }
}

/// The key's destructor, in the ending thread (glibc's `start_thread`, after a forced
/// unwind or the start routine's return): close every call left, deepest first.
unsafe extern "C" fn thread_exit_dtor(p: *mut libc::c_void) {
    let t = probe_state::this_thread();
    if t.fgraph.get() != p as *mut ShadowStack {
        return;
    }
    let Some(ss) = shadow_stack(t) else { return };
    thread_ended(ss);
}

/// The thread is ending (the trace buffer's key destructor, before it releases the ring):
/// close every call left now, while the ring can take their records. Nothing when the thread
/// has no shadow stack or no call open.
pub(crate) fn thread_ending(t: &probe_state::ThreadState) {
    if t.fgraph.get().is_null() {
        return;
    }
    if let Some(ss) = shadow_stack(t) {
        thread_ended(ss);
    }
}

/// Close every call of a thread that ended.
fn thread_ended(ss: &mut ShadowStack) {
    let rettime = crate::ring::read_tsc();
    let mut j = ss.top;
    while j > 0 {
        j -= 1;
        match ss.entries[j].state {
            LIVE => close_entry(ss, j, FgraphExit::Lost, rettime, true),
            RESTORED => {
                let exit = restored_exit(ss);
                close_entry(ss, j, exit, rettime, true);
            }
            ZOMBIE => ss.entries[j].state = HOLE,
            _ => {}
        }
    }
    ss.zombies = 0;
    ss.restored = false;
    ss.unwinding = false;
    ss.unwinder_sp = 0;
    ss.shrink();
}

// ---------------------------------------------------------------------------------------
// longjmp.

/// The agent's longjmp interposers, before the real `longjmp`: the program is about to set
/// its stack pointer to `target_sp` (from the `jmp_buf`). Closes (as `Longjmp`, deepest
/// first) every entry on the target's stack between the caller and the target.
pub fn longjmp_unwind(target_sp: u64) {
    longjmp_unwind_from(probe_state::stack_pointer(), target_sp);
}

/// [`longjmp_unwind`] for a thread whose stack pointer is `cur` (a probe's pre_handler on
/// the C library's `longjmp`, which runs on another stack or below `cur`: `regs.sp`).
pub fn longjmp_unwind_from(cur: u64, target_sp: u64) {
    let t = probe_state::this_thread();
    if t.fgraph.get().is_null() {
        return;
    }
    let Some(ss) = shadow_stack(t) else { return };
    let from_same = same_stack(cur, target_sp);
    let rettime = crate::ring::read_tsc();
    let mut j = ss.top;
    while j > 0 {
        j -= 1;
        let e = &ss.entries[j];
        if !(e.state == LIVE || e.state == RESTORED || e.state == ZOMBIE) || e.retp == 0 {
            continue;
        }
        if e.retp < target_sp && (!from_same || e.retp >= cur) && same_stack(e.retp, target_sp) {
            if e.state == ZOMBIE {
                // Reported already.
                ss.entries[j].state = HOLE;
                ss.zombies = ss.zombies.saturating_sub(1);
                continue;
            }
            close_entry(ss, j, FgraphExit::Longjmp, rettime, true);
        } else if !from_same && e.state != ZOMBIE && e.retp >= cur && same_stack(e.retp, cur) {
            // Leaving another stack (a handler on the signal stack, a coroutine): the calls
            // of the current chain there are left too. Kept as zombies while their slots
            // hold the trampoline (a context saved on that stack could still resume them).
            close_entry(ss, j, FgraphExit::Longjmp, rettime, false);
        }
    }
    ss.shrink();
}

// ---------------------------------------------------------------------------------------
// Unwinders.

/// At an unwinder's entry (a probe on `_Unwind_RaiseException` & co. whose stack pointer is
/// `sp`): put back the real return address of every hooked call on this stack, so the
/// unwinder walks real frames. `unwinding`: an exception or forced unwind (frames will be
/// removed), not a backtrace.
pub fn unwinder_entered(sp: u64, unwinding: bool) {
    let t = probe_state::this_thread();
    if t.fgraph.get().is_null() {
        return;
    }
    let Some(ss) = shadow_stack(t) else { return };
    let mut any = false;
    // Top down: a tail call's entry (its `ret` is the trampoline) is written before the
    // entry below it with the same slot, which writes the real address last.
    let mut j = ss.top;
    while j > 0 {
        j -= 1;
        let e = &mut ss.entries[j];
        if e.state == LIVE && e.flags & FL_NOHIJACK == 0 && e.retp > sp && same_stack(e.retp, sp) {
            // SAFETY: a live entry's slot is in a live frame above the unwinder's.
            unsafe { *(e.retp as *mut u64) = e.ret };
            e.state = RESTORED;
            any = true;
        }
    }
    if any || ss.restored {
        ss.restored = true;
        ss.unwinding |= unwinding;
        ss.unwinder_sp = if ss.unwinder_sp == 0 {
            sp
        } else {
            ss.unwinder_sp.max(sp)
        };
    }
}

/// A landing point after an unwind (the agent's `__cxa_begin_catch` and
/// `_Unwind_DeleteException` interposers): `slot` is the return-address slot of that call,
/// made from the catching frame. The same work as a graph event's at that slot.
pub fn unwinder_landed(slot: u64) {
    let sp = slot;
    let t = probe_state::this_thread();
    if t.fgraph.get().is_null() {
        return;
    }
    let Some(ss) = shadow_stack(t) else { return };
    if ss.restored {
        after_unwinder(ss, sp, false);
    }
}

/// The first event outside the unwinder after it restored entries: close those whose frames
/// are gone, hijack the others again.
#[cold]
#[inline(never)]
fn after_unwinder(ss: &mut ShadowStack, retp: u64, is_return: bool) {
    if retp <= ss.unwinder_sp && same_stack(retp, ss.unwinder_sp) {
        // Inside the unwinder (a hooked call it made): nothing yet.
        return;
    }
    let rettime = crate::ring::read_tsc();
    let exit = restored_exit(ss);
    let mut left = false;
    let mut j = ss.top;
    while j > 0 {
        j -= 1;
        let e = &ss.entries[j];
        if e.state != RESTORED {
            continue;
        }
        if !same_stack(e.retp, retp) {
            left = true;
            continue;
        }
        let gone = if is_return {
            e.retp < retp
        } else {
            e.retp <= retp
        };
        if gone {
            close_entry(ss, j, exit, rettime, true);
            continue;
        }
        // A tail call's entry (its `ret` is the trampoline) shares its slot with the call
        // it replaced, below it, whose real return address the unwinder found there: it is
        // live if that one is, and that one writes the trampoline back (the slot must
        // still hold the real address when it is checked).
        let (retp, expect) = if e.ret == return_trampoline() {
            (e.retp, tail_base_ret(ss, j))
        } else {
            (e.retp, Some(e.ret))
        };
        let mut b = [0u8; 8];
        let holds_ret = expect.is_some_and(|r| {
            crate::sys::read_nofault(retp, &mut b) == 8 && u64::from_le_bytes(b) == r
        });
        if holds_ret {
            let e = &mut ss.entries[j];
            if e.ret != return_trampoline() {
                // SAFETY: the slot is readable (just read) and in a live frame above this
                // event's; it holds the address this entry put back.
                unsafe { *(e.retp as *mut u64) = return_trampoline() };
            }
            e.state = LIVE;
        } else {
            close_entry(ss, j, exit, rettime, true);
        }
    }
    ss.restored = left;
    if !left {
        ss.unwinding = false;
        ss.unwinder_sp = 0;
    }
    ss.shrink();
}

/// For the tail call's entry `j` (its `ret` is the trampoline): the real return address of
/// the restored call below it with the same slot, the one the tail call replaced.
fn tail_base_ret(ss: &ShadowStack, j: usize) -> Option<u64> {
    let retp = ss.entries[j].retp;
    ss.entries[..j]
        .iter()
        .rev()
        .find(|e| e.state == RESTORED && e.retp == retp && e.ret != return_trampoline())
        .map(|e| e.ret)
}

/// The unwinder entry points of libgcc_s probed by [`arm_unwinder_probes`], and whether each
/// removes frames (else it only reads them: a backtrace).
pub const UNWINDER_ENTRIES: [(&str, bool); 5] = [
    ("_Unwind_RaiseException", true),
    ("_Unwind_Resume", true),
    ("_Unwind_Resume_or_Rethrow", true),
    ("_Unwind_ForcedUnwind", true),
    ("_Unwind_Backtrace", false),
];

/// The probes' pre_handler: `regs.sp` is the unwinder's return-address slot.
fn unwinder_pre_handler(p: &crate::kprobes::Kprobe, regs: &mut PtRegs) -> i32 {
    unwinder_entered(regs.sp, p.data.load(Ordering::Relaxed) != 0);
    0
}

/// Put a probe on each of libgcc_s's unwinder entry points ([`UNWINDER_ENTRIES`]) whose
/// pre_handler puts back the real return addresses of the thread ([`unwinder_entered`]).
/// int3 probes (libgcc_s has no sites), so they catch glibc's calls through `dlsym`'d
/// pointers too (nothing if they are armed already). Returns how many are armed; the ones
/// that failed (libgcc_s not loaded:
/// a C program that never throws loads it only on its first `pthread_exit`, cancellation
/// or `backtrace`) are returned as errors. `extra`: more probes armed and disarmed with them
/// (an attached agent's on the C library's `longjmp` and context switches, which the
/// preloaded one interposes), each `(module, symbol, pre_handler)`.
pub fn arm_unwinder_probes(
    extra: &[(&str, &str, crate::kprobes::KprobePreHandler)],
) -> (usize, Vec<crate::kprobes::KprobeError>) {
    use crate::kprobes::{KprobePreHandler, KprobeTarget};
    // Still armed (an attached session's detach left hooked calls, and with them these
    // probes): as they are.
    let already = armed_probes().len();
    if already > 0 {
        return (already, Vec::new());
    }
    let mut armed = 0;
    let mut errors = Vec::new();
    let mut arm = |target: KprobeTarget, handler: KprobePreHandler, data: u64| match arm_internal(
        target, handler, data,
    ) {
        Ok(()) => armed += 1,
        Err(e) => errors.push(e),
    };
    let symbol = |module: &str, name: &str| KprobeTarget::Symbol {
        module: Some(module.to_owned()),
        name: name.to_owned(),
        offset: 0,
    };
    for (name, unwinding) in UNWINDER_ENTRIES {
        arm(
            symbol("libgcc_s.so.1", name),
            unwinder_pre_handler,
            unwinding as u64,
        );
    }
    // Landing pads: the personality routine (C++'s, Rust's, ...) calls `_Unwind_SetIP` on
    // the frame the unwinder is about to resume (a catch or a cleanup), just before the jump.
    if let Ok(f) = super::find_symbol(Some("libgcc_s.so.1"), "_Unwind_GetCFA") {
        if let Some(f) = f.first() {
            GET_CFA.store(f.addr, Ordering::Relaxed);
            arm(
                symbol("libgcc_s.so.1", "_Unwind_SetIP"),
                set_ip_pre_handler,
                0,
            );
        }
    }
    for &(module, name, handler) in extra {
        arm(symbol(module, name), handler, 0);
    }
    // A backtrace removes no frame: at each `ret` of `_Unwind_Backtrace` every restored call
    // is still live and is hijacked again at once (else a call that returns before the
    // thread's next graph event would be closed late).
    for ret in backtrace_returns() {
        arm(KprobeTarget::Addr(ret), backtrace_done_handler, 0);
    }
    (armed, errors)
}

/// Register one of the engine's own probes (not in the user's kprobes/list) at `target`
/// with `handler` and `data`, into the list [`disarm_unwinder_probes`] takes out.
fn arm_internal(
    target: crate::kprobes::KprobeTarget,
    handler: crate::kprobes::KprobePreHandler,
    data: u64,
) -> Result<(), crate::kprobes::KprobeError> {
    let p: &'static crate::kprobes::Kprobe = Box::leak(Box::new(crate::kprobes::Kprobe::new(
        target,
        Some(handler),
        None,
    )));
    p.data.store(data, Ordering::Relaxed);
    p.mark_internal();
    crate::kprobes::register_kprobe(p)?;
    armed_probes().push(p);
    Ok(())
}

/// The probes [`arm_unwinder_probes`] armed.
static ARMED: std::sync::Mutex<Vec<&'static crate::kprobes::Kprobe>> =
    std::sync::Mutex::new(Vec::new());

fn armed_probes() -> std::sync::MutexGuard<'static, Vec<&'static crate::kprobes::Kprobe>> {
    ARMED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Unregister the probes [`arm_unwinder_probes`] armed (an attached agent's detach);
/// returns the failures.
pub fn disarm_unwinder_probes() -> Vec<crate::kprobes::KprobeError> {
    let probes = std::mem::take(&mut *armed_probes());
    probes
        .into_iter()
        .filter_map(|p| crate::kprobes::unregister_kprobe(p).err())
        .collect()
}

/// libgcc_s's `_Unwind_GetCFA` (0 until the probes are armed).
static GET_CFA: AtomicU64 = AtomicU64::new(0);

/// At `_Unwind_SetIP(context, ip)` (`rdi`: the context of the frame about to be resumed at a
/// landing pad): `_Unwind_GetCFA` of that context is the frame's stack pointer at its call
/// site (the CFA of the callee it was unwound from); every restored call with a slot below
/// it is gone (closed `Unwound`), the others are hijacked again. A Rust `catch_unwind` is
/// seen only here (it calls no libgcc_s function when it catches a Rust panic).
fn set_ip_pre_handler(_p: &crate::kprobes::Kprobe, regs: &mut PtRegs) -> i32 {
    let f = GET_CFA.load(Ordering::Relaxed);
    if f == 0 || regs.rdi == 0 {
        return 0;
    }
    let t = probe_state::this_thread();
    if t.fgraph.get().is_null() {
        return 0;
    }
    // SAFETY: libgcc_s's `_Unwind_Ptr _Unwind_GetCFA(struct _Unwind_Context *)`, a field
    // read, on the context `_Unwind_SetIP` was called with.
    let cfa = unsafe { std::mem::transmute::<u64, extern "C" fn(u64) -> u64>(f)(regs.rdi) };
    if let Some(ss) = shadow_stack(t) {
        if ss.restored && ss.unwinding {
            // The context's CFA is its callee's: the frame's stack pointer at the call site.
            // As a return there: calls with a lower slot (the frame's callees) are gone.
            after_unwinder(ss, cfa, true);
        }
    }
    0
}

/// The addresses of the `ret` instructions of libgcc_s's `_Unwind_Backtrace`.
fn backtrace_returns() -> Vec<u64> {
    let Ok(syms) = super::find_symbol(Some("libgcc_s.so.1"), "_Unwind_Backtrace") else {
        return Vec::new();
    };
    let Some(f) = syms.first().filter(|f| f.size > 0 && f.size < 4096) else {
        return Vec::new();
    };
    let mut code = vec![0u8; f.size as usize];
    if crate::sys::read_nofault(f.addr, &mut code) != code.len() {
        return Vec::new();
    }
    let mut dec = iced_x86::Decoder::with_ip(64, &code, f.addr, 0);
    let mut rets = Vec::new();
    for insn in &mut dec {
        if insn.is_invalid() {
            return Vec::new();
        }
        if insn.mnemonic() == iced_x86::Mnemonic::Ret {
            rets.push(insn.ip());
        }
    }
    rets
}

/// At a `ret` of `_Unwind_Backtrace` (`regs.sp`: its return-address slot).
fn backtrace_done_handler(_p: &crate::kprobes::Kprobe, regs: &mut PtRegs) -> i32 {
    let t = probe_state::this_thread();
    if t.fgraph.get().is_null() {
        return 0;
    }
    if let Some(ss) = shadow_stack(t) {
        if ss.restored && !ss.unwinding {
            // As an event in its caller: just above its return-address slot.
            after_unwinder(ss, regs.sp + 8, false);
        }
    }
    0
}

// ---------------------------------------------------------------------------------------
// CET.

/// Return hooks are refused in a process whose CET shadow stack is enabled (a hijacked
/// return would raise `#CP`): `/proc/self/status` says `x86_Thread_features: shstk`.
pub(crate) fn check_return_hooks_allowed() -> Result<(), FtraceError> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    if shadow_stack_enabled(&status) {
        return Err(FtraceError::CetShadowStack);
    }
    Ok(())
}

/// Whether a `/proc/PID/status` text says the thread runs with a CET shadow stack.
pub fn shadow_stack_enabled(status: &str) -> bool {
    status
        .lines()
        .find_map(|l| l.strip_prefix("x86_Thread_features:"))
        .is_some_and(|f| f.split_whitespace().any(|w| w == "shstk"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shadow_stack_status_is_parsed() {
        assert!(!shadow_stack_enabled("Name:\tx\nx86_Thread_features:\t\n"));
        assert!(shadow_stack_enabled(
            "Name:\tx\nx86_Thread_features:\tshstk wrss\nx86_Thread_features_locked:\tshstk\n"
        ));
        assert!(!shadow_stack_enabled("Name:\tx\n"));
    }
}
