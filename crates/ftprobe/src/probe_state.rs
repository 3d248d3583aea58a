//! The probe path's per-thread state, in one thread-local, and its repair after a non-local
//! exit (the user-space form of the kernel's per-CPU kprobe state and its reset in
//! `kprobe_fault_handler`, or uprobes' `arch_uprobe_abort_xol`).
//!
//! A thread's probe path keeps: its ring, the writer sections open on that ring (nested by
//! signal handlers, see `crate::ring`'s "Writers and nesting"), the recursion
//! guard of `FTRACE_OPS_FL_RECURSION` ops, the kprobe running on it (`current_kprobe`), the
//! single-step state of a non-boosted XOL slot, and whether the program's own SIGTRAP handler
//! is running (to defer a nested SIGTRAP as the kernel would). One thread-local holds it all,
//! so a hit finds it with one TLS access (in the preloaded agent each is a `__tls_get_addr`
//! call).
//!
//! Every guard records the stack pointer of the code that set it. A signal handler can leave
//! the probe path without returning (`siglongjmp` out of a handler that interrupted a
//! callback, a fault in an XOL slot whose handler jumps out): the guard then stays set while
//! its frame is gone. Every entry point calls [`ThreadState::enter`] with its own stack
//! pointer: a guard whose stack pointer is at or below it (the stack grows down) belongs to a
//! frame that no longer exists, and is cleared ([`ThreadState::repair`]); a live guard's
//! nested entries (a signal handler that interrupted it) are always below it. Entries on
//! another stack (a handler on the `sigaltstack`) compare only with guards on that stack.

use std::cell::Cell;
use std::sync::atomic::{AtomicI64, Ordering};

use crate::kprobes::Kprobe;
use crate::ring::{RingWriter, MAX_NEST};

/// This thread's ring.
#[derive(Clone, Copy)]
pub(crate) enum ThreadRing {
    /// Not claimed yet (claimed on the first event).
    Unclaimed,
    /// Claimed.
    Claimed(RingWriter<'static>),
    /// No ring was free: events are counted as lost, in the header's total (as of kind
    /// `why`) and in the thread's entry `slot` of its lost table; a claim is tried again once
    /// a ring was released or freed since `freed` (`SharedRings::freed`).
    NoneFree {
        slot: u32,
        freed: u64,
        why: crate::ring::NoRing,
    },
}

/// Between a non-boosted int3 hit and its slot's trap.
#[derive(Clone, Copy)]
pub(crate) struct Xol {
    /// The probed address (0: the thread is not in a slot).
    pub addr: u64,
    /// The address after the probed instruction.
    pub next: u64,
    /// The slot's first byte.
    pub slot: u64,
    /// The slot's final `int3`.
    pub slot_trap: u64,
    /// The post_handlers are due (not on a re-entered hit).
    pub post_due: bool,
    /// Signals blocked while the thread runs the slot that its own mask did not block (the
    /// kernel's first mask word): taken out again at the slot's trap, or on a repair.
    pub added_mask: u64,
}

impl Xol {
    pub(crate) const NONE: Xol = Xol {
        addr: 0,
        next: 0,
        slot: 0,
        slot_trap: 0,
        post_due: false,
        added_mask: 0,
    };
}

/// The probe path's state of one thread (module docs). Stack pointers are 0 when the guard
/// is clear.
pub(crate) struct ThreadState {
    pub ring: Cell<ThreadRing>,
    /// The innermost writer section open on this thread's ring: its stack pointer (8-aligned)
    /// with its level in the low 3 bits (0 when none is open). See `crate::trace`.
    pub writing: Cell<u64>,
    /// Per nested section level (as `RingWriter::begin` numbers them, 1 and up): the
    /// `writing` of the section it nests in, and the ring's reserve pointer when it began.
    /// Level 0 (the outermost) nests in nothing: its `level_prev` is the `writing` of a section
    /// a signal handler interrupted before that section's ring nesting moved (put back at its
    /// end; `trace::begin_section`), its `level_reserved` unused.
    pub level_prev: [Cell<u64>; MAX_NEST as usize],
    pub level_reserved: [Cell<u64>; MAX_NEST as usize],
    /// Per open section level: the sections that committed while nested in it (their own
    /// nested ones included). An abandoned section's rewind discards their records too.
    pub level_nested: [Cell<u64>; MAX_NEST as usize],
    /// An `FTRACE_OPS_FL_RECURSION` ops' callback is running.
    pub in_ftrace: Cell<u64>,
    /// The kprobe running (`current_kprobe`), from `kprobe_sp`.
    pub kprobe: Cell<*const Kprobe>,
    pub kprobe_sp: Cell<u64>,
    /// The non-boosted slot the thread is in (`kprobe` is set meanwhile).
    pub xol: Cell<Xol>,
    /// The program's SIGTRAP handler is running (called from ftprobe's).
    pub program_trap_sp: Cell<u64>,
    /// A SIGTRAP for the program arrived while its handler ran without `SA_NODEFER`.
    pub program_trap_pending: Cell<bool>,
    /// This thread's fgraph shadow stack (`ftrace::fgraph`): mapped on its first hooked call.
    pub fgraph: Cell<*mut crate::ftrace::fgraph::ShadowStack>,
    /// This thread's signal stack as last asked (`ftrace::fgraph_unwind`): `(known, lo,
    /// hi)`, `lo == hi` when it has none.
    pub alt_stack: Cell<(bool, u64, u64)>,
    /// Whether this thread's mask blocks SIGSEGV or SIGBUS, as last asked of the kernel
    /// (`arch::x86_64::uaccess`; `MASK_UNKNOWN` until asked, and after the program changed it).
    pub fault_mask: Cell<u8>,
}

thread_local! {
    /// Const-initialized, no destructor: no allocation on first touch.
    static STATE: ThreadState = const { ThreadState::INIT };
}

impl ThreadState {
    /// A thread's state before its first event.
    #[allow(clippy::declare_interior_mutable_const)]
    const INIT: ThreadState = ThreadState {
        ring: Cell::new(ThreadRing::Unclaimed),
        writing: Cell::new(0),
        level_prev: [const { Cell::new(0) }; MAX_NEST as usize],
        level_reserved: [const { Cell::new(0) }; MAX_NEST as usize],
        level_nested: [const { Cell::new(0) }; MAX_NEST as usize],
        in_ftrace: Cell::new(0),
        kprobe: Cell::new(std::ptr::null()),
        kprobe_sp: Cell::new(0),
        xol: Cell::new(Xol::NONE),
        program_trap_sp: Cell::new(0),
        program_trap_pending: Cell::new(false),
        fgraph: Cell::new(std::ptr::null_mut()),
        alt_stack: Cell::new((false, 0, 0)),
        fault_mask: Cell::new(crate::arch::x86_64::uaccess::MASK_UNKNOWN),
    };
}

/// Put this thread's state back to [`ThreadState::INIT`].
///
/// # Safety
/// No probe-path code runs on this thread (no reference from [`this_thread`] is live):
/// a thread whose TLS is a copy of another thread's, before it runs anything else.
pub(crate) unsafe fn reset_this_thread() {
    let t = this_thread();
    let init = ThreadState::INIT;
    t.ring.set(init.ring.get());
    t.writing.set(0);
    for ((a, b), c) in t
        .level_prev
        .iter()
        .zip(&t.level_reserved)
        .zip(&t.level_nested)
    {
        a.set(0);
        b.set(0);
        c.set(0);
    }
    t.in_ftrace.set(0);
    t.kprobe.set(std::ptr::null());
    t.kprobe_sp.set(0);
    t.xol.set(Xol::NONE);
    t.program_trap_sp.set(0);
    t.program_trap_pending.set(false);
    t.fgraph.set(std::ptr::null_mut());
    t.alt_stack.set((false, 0, 0));
    t.fault_mask.set(crate::arch::x86_64::uaccess::MASK_UNKNOWN);
}

/// [`STATE`]'s offset from the thread pointer, once [`fix_thread_state_offset`] ran
/// ([`NO_OFFSET`] before).
static STATE_TP_OFFSET: AtomicI64 = AtomicI64::new(NO_OFFSET);
const NO_OFFSET: i64 = i64::MIN;

/// The thread pointer (`%fs` base; glibc keeps it at `%fs:0` too).
#[inline(always)]
fn thread_pointer() -> u64 {
    let tp: u64;
    // SAFETY: reads the TCB's self pointer at %fs:0 (x86-64 TLS variant II): no other effect.
    unsafe {
        std::arch::asm!("mov {}, qword ptr fs:[0]", out(reg) tp,
                        options(nostack, readonly, preserves_flags))
    };
    tp
}

/// From now on, find a thread's state (`STATE`) at its fixed offset from the thread
/// pointer instead of through `__tls_get_addr`. Only valid in an object whose TLS block is static (at the
/// same offset from the thread pointer in every thread, initialized in every thread): the
/// agent is, since it has an initial-exec TLS word (`DF_STATIC_TLS`: glibc refuses to
/// `dlopen` it otherwise). Needed when the agent is `dlopen`ed into a running process
/// (attach): there, a thread's first `__tls_get_addr` for the agent's module updates the
/// thread's DTV, which takes the loader's `dl_load_tls_lock` (and may `malloc` a larger
/// DTV or `free` an unloaded module's block): not for the probe path. Returns the offset.
pub fn fix_thread_state_offset() -> i64 {
    let addr = STATE.with(|t| t as *const ThreadState as u64);
    let off = addr.wrapping_sub(thread_pointer()) as i64;
    STATE_TP_OFFSET.store(off, Ordering::Release);
    off
}

/// The state of the thread whose thread pointer is `tp`, once [`fix_thread_state_offset`]
/// ran.
///
/// # Safety
/// `tp` is a live thread's thread pointer, and that thread does not run (or is this one)
/// while the reference is used.
pub(crate) unsafe fn thread_state_at(tp: u64) -> Option<&'static ThreadState> {
    let off = STATE_TP_OFFSET.load(Ordering::Acquire);
    // SAFETY: the caller's contract, and `fix_thread_state_offset`'s.
    (off != NO_OFFSET).then(|| unsafe { &*((tp as i64).wrapping_add(off) as *const ThreadState) })
}

/// This thread's state: one TLS access.
#[inline(always)]
pub(crate) fn this_thread() -> &'static ThreadState {
    // Acquire: pairs with the Release store in `fix_thread_state_offset`.
    let off = STATE_TP_OFFSET.load(Ordering::Acquire);
    if off != NO_OFFSET {
        // SAFETY: [`fix_thread_state_offset`]'s contract: STATE is in a static TLS block at
        // this offset from every thread's thread pointer, initialized (const image) in every
        // thread; the reference is only used on this thread (as below).
        return unsafe { &*((thread_pointer() as i64).wrapping_add(off) as *const ThreadState) };
    }
    // SAFETY: a const-initialized thread-local without a destructor lives in the thread's
    // static TLS block for the thread's whole life; the reference is only used on this thread
    // (ThreadState is not Sync, and callers keep it within the call that took it).
    STATE.with(|t| unsafe { &*(t as *const ThreadState) })
}

/// The `kprobe` of a thread whose control code runs ([`KprobeBusy`]): not a probe, never
/// dereferenced ([`crate::kprobes::kprobe_running`] says `None` for it).
pub(crate) const KPROBE_BUSY: *const Kprobe = std::ptr::NonNull::<Kprobe>::dangling().as_ptr();

/// The kernel's `kprobe_busy_begin()` / `kprobe_busy_end()` (kernel/kprobes.c): while the
/// engine's control code runs on a thread (registering and optimizing probes, patching
/// code, reading `/proc`), a probe that code reaches (its own `close`, `memcpy`, ... of the
/// C library) runs no handler, as a probe hit inside a probe handler, but counts neither a
/// hit nor a miss: those calls are not the program's (the kernel keeps its own tracing code
/// out of its probes altogether, `NOKPROBE_SYMBOL`). Held for a scope; nests (an inner one,
/// or one begun inside a probe handler, does nothing). Control path.
pub struct KprobeBusy {
    outermost: bool,
}

impl KprobeBusy {
    #[inline(always)]
    pub fn begin() -> KprobeBusy {
        let t = this_thread();
        let outermost = t.kprobe.get().is_null();
        if outermost {
            // Its frame: the calls it covers run below it (a later hit above it finds the
            // guard stale, as after a non-local exit, and clears it).
            t.kprobe_sp.set(stack_pointer());
            t.kprobe.set(KPROBE_BUSY);
        }
        KprobeBusy { outermost }
    }
}

impl Drop for KprobeBusy {
    fn drop(&mut self) {
        let t = this_thread();
        if self.outermost && t.kprobe.get() == KPROBE_BUSY {
            t.kprobe.set(std::ptr::null());
            t.kprobe_sp.set(0);
        }
    }
}

/// The stack pointer of the caller (an entry point's frame).
#[inline(always)]
pub(crate) fn stack_pointer() -> u64 {
    let sp: u64;
    // SAFETY: reads rsp into a register; no memory access, no flags.
    unsafe {
        std::arch::asm!("mov {}, rsp", out(reg) sp, options(nomem, nostack, preserves_flags))
    };
    sp
}

/// Where an entry point runs: its stack pointer, and how to learn whether that is on the
/// thread's signal stack.
#[derive(Clone, Copy)]
pub(crate) enum Entry<'a> {
    /// A trampoline callback: this stack pointer; the signal stack is asked for if needed.
    Here(u64),
    /// The SIGTRAP handler: the interrupted context (its stack pointer, and its signal stack
    /// as the kernel saved it in `uc_stack`).
    Interrupted(&'a libc::ucontext_t),
}

/// A signal stack, and whether the entry's stack pointer is on it.
struct AltStack {
    on: bool,
    lo: u64,
    hi: u64,
}

impl AltStack {
    fn of(st: &libc::stack_t, sp: u64) -> AltStack {
        let lo = st.ss_sp as u64;
        let hi = lo.wrapping_add(st.ss_size as u64);
        let disabled = st.ss_flags & libc::SS_DISABLE != 0;
        AltStack {
            on: !disabled && sp > lo && sp <= hi,
            lo,
            hi,
        }
    }

    /// The thread's signal stack now (one raw `sigaltstack` system call: no errno).
    fn now(sp: u64) -> AltStack {
        // SAFETY: a zeroed stack_t is a valid value to be overwritten.
        let mut st: libc::stack_t = unsafe { std::mem::zeroed() };
        // SAFETY: sigaltstack(NULL, &st) only writes st.
        let r =
            unsafe { crate::sys::raw_syscall2(libc::SYS_sigaltstack, 0, &mut st as *mut _ as u64) };
        if r != 0 {
            return AltStack {
                on: false,
                lo: 0,
                hi: 0,
            };
        }
        AltStack::of(&st, sp)
    }

    fn contains(&self, sp: u64) -> bool {
        sp > self.lo && sp <= self.hi
    }
}

impl ThreadState {
    /// Whether a guard is set at or below `sp` (the common case is none: nothing to check; a
    /// guard above `sp` belongs to a frame this entry is nested in, as when a kprobe event's
    /// handler opens a writer section under the kprobe guard). `x - 1 < sp` is
    /// `x != 0 && x <= sp`.
    #[inline(always)]
    fn maybe_stale(&self, sp: u64) -> bool {
        ((self.writing.get() & !7).wrapping_sub(1) < sp)
            | (self.in_ftrace.get().wrapping_sub(1) < sp)
            | (self.kprobe_sp.get().wrapping_sub(1) < sp)
            | (self.program_trap_sp.get().wrapping_sub(1) < sp)
    }

    /// Every entry point of the probe path calls this first: clears the guards that a
    /// non-local exit left behind (module docs). Free when no guard is set at or below the
    /// entry's stack pointer. Returns the signals a stale slot had blocked that the caller
    /// must unblock in the interrupted context (`Entry::Interrupted` only; for `Entry::Here`
    /// they are unblocked now).
    #[inline(always)]
    #[must_use]
    pub(crate) fn enter(&self, at: Entry<'_>) -> u64 {
        let sp = match at {
            Entry::Here(sp) => sp,
            Entry::Interrupted(uc) => uc.uc_mcontext.gregs[libc::REG_RSP as usize] as u64,
        };
        if self.maybe_stale(sp) {
            self.repair(at)
        } else {
            0
        }
    }

    /// The repair: each guard whose frame cannot be live any more is cleared; a stale slot
    /// gives back the signals it blocked (see [`ThreadState::enter`]).
    #[cold]
    #[inline(never)]
    pub(crate) fn repair(&self, at: Entry<'_>) -> u64 {
        let sp = match at {
            Entry::Here(sp) => sp,
            Entry::Interrupted(uc) => uc.uc_mcontext.gregs[libc::REG_RSP as usize] as u64,
        };
        let mut alt: Option<AltStack> = None;
        let mut stale = |recorded: u64| -> bool {
            if recorded == 0 || sp < recorded {
                return false;
            }
            let a = alt.get_or_insert_with(|| match at {
                Entry::Here(sp) => AltStack::now(sp),
                Entry::Interrupted(uc) => AltStack::of(&uc.uc_stack, sp),
            });
            // On the signal stack, a guard set on another stack belongs to the code this
            // handler interrupted: live.
            !a.on || a.contains(recorded)
        };
        if stale(self.writing.get() & !7) {
            // The innermost section was abandoned, and maybe sections it nests in: walk out
            // to the outermost stale one (levels only go down on the way out; a section
            // begun after its enclosing one committed reuses that level and ends the walk).
            let mut at = self.writing.get();
            loop {
                let level = (at & 7) as usize;
                let prev = match level {
                    0 => 0,
                    l => self.level_prev.get(l).map_or(0, Cell::get),
                };
                if prev == 0 || (prev & 7) >= (at & 7) || !stale(prev & !7) {
                    break;
                }
                at = prev;
            }
            let d = (at & 7) as u32;
            self.writing.set(match d {
                0 => 0,
                d => self.level_prev.get(d as usize).map_or(0, Cell::get),
            });
            // Sections d.. that had not committed (the ring's nesting still counts them):
            // their records are never published, one event lost each, and so are the
            // records of the sections that committed inside them (a signal handler's events,
            // written while it interrupted one: the rewind below discards them). A section
            // that had committed (a jump between its commit and the restore of `writing`)
            // is not counted.
            if let ThreadRing::Claimed(w) = self.ring.get() {
                let n = w.nesting();
                let inside: u64 = (d..n)
                    .filter_map(|l| self.level_nested.get(l as usize))
                    .map(Cell::get)
                    .sum();
                let lost = u64::from(n.saturating_sub(d)) + if n > d { inside } else { 0 };
                let at = self.level_reserved.get(d as usize).map_or(0, Cell::get);
                if n > d {
                    w.abandon(d, at);
                }
                if lost > 0 {
                    if let Some(b) = crate::trace::buffer() {
                        b.note_lost_recursion(lost);
                    }
                }
            }
        }
        if stale(self.in_ftrace.get()) {
            self.in_ftrace.set(0);
        }
        if stale(self.program_trap_sp.get()) {
            self.program_trap_sp.set(0);
            self.program_trap_pending.set(false);
        }
        if stale(self.kprobe_sp.get()) {
            self.kprobe.set(std::ptr::null());
            self.kprobe_sp.set(0);
            let x = self.take_xol();
            if x.added_mask != 0 {
                match at {
                    Entry::Here(_) => unblock_now(x.added_mask),
                    Entry::Interrupted(_) => return x.added_mask,
                }
            }
        }
        0
    }

    /// Leave the slot state: what it was.
    pub(crate) fn take_xol(&self) -> Xol {
        self.xol.replace(Xol::NONE)
    }
}

/// Before a non-local jump (`longjmp`, `siglongjmp`, ...) that sets this thread's stack
/// pointer to `target_sp`: the guards set by frames below it, which the jump leaves (a
/// signal handler that interrupted the probe path and jumps out of it), are cleared now,
/// their open writer sections abandoned ([`ThreadState::repair`] as for an entry at
/// `target_sp`). Left to the thread's next entry, they would be cleared only if that entry's
/// frame were at or above theirs: the calls made after the jump run deeper, and took them
/// for live (their hits counted as missed, their events lost).
pub(crate) fn before_longjmp(target_sp: u64) {
    crate::arch::x86_64::tramp_signals::before_longjmp(target_sp);
    let t = this_thread();
    if t.maybe_stale(target_sp) {
        let _ = t.repair(Entry::Here(target_sp));
    }
}

/// The signals a thread runs a non-boosted slot with blocked (as the kernel single-steps a
/// kprobe with interrupts off): every one but those the slot's own instruction can raise
/// (`SIGSEGV`, `SIGBUS`, `SIGILL`, `SIGFPE`), SIGTRAP (the slot's trap) and those that cannot
/// be blocked. An asynchronous signal waits until the slot's trap: no handler runs, sees the
/// slot's address or leaves it by a non-local exit in between.
pub(crate) const SLOT_BLOCKED: u64 = !(bit(libc::SIGTRAP)
    | bit(libc::SIGSEGV)
    | bit(libc::SIGBUS)
    | bit(libc::SIGILL)
    | bit(libc::SIGFPE)
    | bit(libc::SIGKILL)
    | bit(libc::SIGSTOP));

/// Signal `sig`'s bit in the kernel's first mask word.
pub(crate) const fn bit(sig: libc::c_int) -> u64 {
    1 << (sig - 1)
}

/// The kernel's first mask word of a `sigset_t` (signals 1 to 64).
pub(crate) fn mask_word(set: &mut libc::sigset_t) -> &mut u64 {
    // SAFETY: glibc's sigset_t is an array of unsigned longs, 8-aligned, signal n at bit
    // n - 1 of the first.
    unsafe { &mut *(set as *mut libc::sigset_t as *mut u64) }
}

/// Unblock `mask` (the kernel's first mask word) on this thread: one raw `rt_sigprocmask`.
fn unblock_now(mask: u64) {
    // SAFETY: rt_sigprocmask(SIG_UNBLOCK, &mask, NULL, 8) reads 8 bytes of `mask`.
    unsafe {
        crate::sys::raw_syscall4(
            libc::SYS_rt_sigprocmask,
            libc::SIG_UNBLOCK as u64,
            &mask as *const u64 as u64,
            0,
            8,
        )
    };
}
