//! The trace buffer of this process (kernel/trace/trace.c's global buffer): the shared rings,
//! and this thread's ring, claimed on its first event. Used by every tracer (function tracer,
//! function_graph, kprobe events). Probe path: no allocation, no lock.
//!
//! A thread claims a free ring with two raw syscalls (`gettid`, `prctl(PR_GET_NAME)`), with
//! its signals blocked meanwhile (so that a handler's event cannot claim a second one); when
//! no ring is free its events are counted in the header's `lost_no_ring` and in its own entry
//! of the lost table. The claim gives the thread a value for a pthread key whose destructor,
//! when the thread ends, closes its function_graph calls and releases the ring for the reader
//! to free and another thread to claim. After `fork` the child's thread claims a ring of its
//! own.
//!
//! Every write goes through a writer section (`begin` ... `end`): the ring's nesting
//! (`RingWriter::begin`/`commit`: a signal handler that interrupts a section writes its own
//! records into the same ring, published with the outermost section's commit), and
//! `ThreadState::writing`, the innermost section's stack pointer and level, from which a
//! repair after a non-local exit finds the sections abandoned (`crate::probe_state`).

use std::sync::OnceLock;

pub use crate::probe_state::fix_thread_state_offset;
use crate::probe_state::{self, stack_pointer, Entry, ThreadRing, ThreadState};
use crate::ring::{self, RingWriter, SectionWriter, SharedRings};
use crate::sys;

/// Record types written into the rings. Their `aux` bits and payload words are documented, and
/// decoded, in [`crate::record`].
pub mod rtype {
    /// Function entry.
    pub const FUNC: u16 = 1;
    /// kprobe event.
    pub const KPROBE: u16 = 2;
    /// Text for the CLI (e.g. the armed-probes listing).
    pub const TEXT: u16 = 3;
    /// Per-event counters at exit (the reader adds the event's records to the first, dropped
    /// hits, for its hits).
    pub const PROFILE: u16 = 4;
    /// function_graph entry.
    pub const FGRAPH_ENT: u16 = 5;
    /// function_graph return.
    pub const FGRAPH_RET: u16 = 6;
    /// Events lost before the next record (written by the ring itself:
    /// [`crate::ring::RTYPE_LOST`]).
    pub const LOST: u16 = crate::ring::RTYPE_LOST;
}

static RINGS: OnceLock<SharedRings> = OnceLock::new();

/// After `fork`, the child's only thread must not write into its parent's ring (nor write
/// a note its parent left for its own first claim).
extern "C" fn forget_ring_in_child() {
    probe_state::this_thread().ring.set(ThreadRing::Unclaimed);
    CLAIM_NOTE.store(std::ptr::null_mut(), std::sync::atomic::Ordering::Relaxed);
}

/// A TEXT record for the first ring this process claims, written into it before anything
/// else ([`note_at_first_claim`]): the words, then their count and the record's kind.
static CLAIM_NOTE: std::sync::atomic::AtomicPtr<u64> =
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());
static CLAIM_NOTE_LEN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static CLAIM_NOTE_KIND: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Control path, in a process with one thread (a child just forked): the first ring this
/// process claims starts with a [`rtype::TEXT`] record of kind `kind` holding `words` (text
/// bytes, little-endian, zero-padded), so that a reader sees it before any record of that
/// ring, whichever thread claims it. A thread that claimed a ring already writes it now.
/// Nothing is claimed for it: a process that never writes an event never writes it. A later
/// call replaces a note not written yet. Async-signal-safe (no allocation).
pub fn note_at_first_claim(kind: u32, words: &'static [u64]) {
    use std::sync::atomic::Ordering::{Relaxed, Release};
    if claimed_writer(probe_state::this_thread()).is_some() {
        with_ring_guarded(|w| {
            w.write_aux(rtype::TEXT, kind, words);
        });
        return;
    }
    CLAIM_NOTE.store(std::ptr::null_mut(), Relaxed);
    CLAIM_NOTE_KIND.store(kind, Relaxed);
    CLAIM_NOTE_LEN.store(words.len(), Relaxed);
    // Release: the kind and length are seen by the claim that takes the pointer.
    CLAIM_NOTE.store(words.as_ptr().cast_mut(), Release);
}

/// Probe path, a claim (signals blocked): write the note of [`note_at_first_claim`], if one
/// waits, as the ring's first record (in its own section: the claiming event's section has
/// not begun).
#[inline(never)]
#[cold]
fn write_claim_note(t: &ThreadState, w: RingWriter<'static>) {
    use std::sync::atomic::Ordering::{Acquire, Relaxed};
    let p = CLAIM_NOTE.swap(std::ptr::null_mut(), Acquire);
    if p.is_null() {
        return;
    }
    let kind = CLAIM_NOTE_KIND.load(Relaxed);
    // SAFETY: `p` and the length are a `&'static [u64]`'s (note_at_first_claim), published
    // with Release before the pointer.
    let words = unsafe { std::slice::from_raw_parts(p, CLAIM_NOTE_LEN.load(Relaxed)) };
    let sp = probe_state::stack_pointer();
    if let Some(level) = begin_section(t, w, sp) {
        w.in_section().write_aux(rtype::TEXT, kind, words);
        end_section(t, w, level);
    }
}

/// Make `rings` this process's trace buffer. Once; later calls return `false`.
pub fn set_buffer(rings: SharedRings) -> bool {
    if RINGS.set(rings).is_err() {
        return false;
    }
    init_ring_key();
    // SAFETY: registers a plain extern "C" callback; pthread_atfork has no other contract.
    unsafe { libc::pthread_atfork(None, None, Some(forget_ring_in_child)) };
    true
}

/// The buffer of the current attached session ([`replace_buffer`]).
static REPLACED: std::sync::atomic::AtomicPtr<SharedRings> =
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());

/// The trace buffer, if set.
#[inline]
pub fn buffer() -> Option<&'static SharedRings> {
    // Acquire: pairs with the Release store in `replace_buffer`.
    let p = REPLACED.load(std::sync::atomic::Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: a leaked Box, freed only once replaced and no thread can use it any more
        // (`free_retired_buffers`' contract).
        return Some(unsafe { &*p });
    }
    RINGS.get()
}

/// A session's buffer (attach): replaces the current one, which stays mapped (a thread may
/// still be writing into it) until [`free_retired_buffers`]. Every thread's claim on the
/// old one must be dropped ([`forget_thread_ring`]) while no thread runs.
pub fn replace_buffer(rings: SharedRings) {
    static INIT: std::sync::Once = std::sync::Once::new();
    if RINGS.get().is_none() {
        INIT.call_once(|| {
            init_ring_key();
            // SAFETY: registers a plain extern "C" callback; no other contract.
            unsafe { libc::pthread_atfork(None, None, Some(forget_ring_in_child)) };
        });
    }
    let old = REPLACED.swap(
        Box::into_raw(Box::new(rings)),
        std::sync::atomic::Ordering::AcqRel,
    );
    if !old.is_null() {
        RETIRED
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(old as usize);
    }
}

/// Buffers [`replace_buffer`] replaced, still mapped (leaked `Box`es, as addresses).
static RETIRED: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());

/// Whether the thread whose thread pointer is `tp` is inside the probe path: a writer
/// section open on its ring, an ftrace callback or a kprobe running (not the engine's
/// control code, [`KprobeBusy`](crate::kprobes::KprobeBusy), which writes no event).
///
/// # Safety
/// As [`forget_thread_ring`].
pub unsafe fn thread_in_probe_path(tp: u64) -> bool {
    // SAFETY: forwarded contract.
    let t = unsafe { probe_state::thread_state_at(tp) };
    t.is_some_and(|t| {
        let k = t.kprobe.get();
        t.writing.get() != 0
            || t.in_ftrace.get() != 0
            || (!k.is_null() && k != probe_state::KPROBE_BUSY)
    })
}

/// [`thread_in_probe_path`] for a stopped thread whose stack pointer is `sp`: a writer
/// section whose frame the thread has left (`writing` below `sp` on the same stack, as
/// `same_stack` says: a jump out of it, or a session ended around it, left it open; its next
/// probe entry repairs it) does not count. A thread that never enters the probe path again
/// would otherwise keep every retired buffer mapped for good (found by a fresh user's
/// review: after killed attaches, each later session added a 1 TiB mapping until `mmap`
/// failed).
///
/// # Safety
/// As [`forget_thread_ring`].
pub unsafe fn thread_in_probe_path_at(
    tp: u64,
    sp: u64,
    same_stack: impl Fn(u64, u64) -> bool,
) -> bool {
    // SAFETY: forwarded contract.
    let t = unsafe { probe_state::thread_state_at(tp) };
    t.is_some_and(|t| {
        let k = t.kprobe.get();
        let w = t.writing.get() & !7;
        let section = w != 0 && !(w < sp && same_stack(w, sp));
        section || t.in_ftrace.get() != 0 || (!k.is_null() && k != probe_state::KPROBE_BUSY)
    })
}

/// Unmap every buffer a later session's replaced; returns how many.
///
/// # Safety
/// No thread holds a writer of a retired buffer or will use one: every live thread's claim
/// was dropped ([`forget_thread_ring`]), none is inside the probe path (its instruction
/// pointer in ftprobe's code, or [`thread_in_probe_path`]), and they are all stopped (but
/// this one) until this returns.
pub unsafe fn free_retired_buffers() -> usize {
    let retired = std::mem::take(&mut *RETIRED.lock().unwrap_or_else(|e| e.into_inner()));
    for &p in &retired {
        // SAFETY: `p` came from `Box::into_raw` in `replace_buffer` and is in no other
        // list; by the contract nothing borrows from it any more. Dropping it unmaps it.
        drop(unsafe { Box::from_raw(p as *mut SharedRings) });
    }
    retired.len()
}

/// Drop the ring claim of the thread whose thread pointer is `tp`: its next event claims a
/// ring of the current buffer ([`replace_buffer`]). A thread whose ring was released (it
/// is ending) stays so.
///
/// # Safety
/// [`fix_thread_state_offset`] ran, `tp` is a live thread's thread pointer, and that thread
/// is stopped (or is this one) until this returns.
pub unsafe fn forget_thread_ring(tp: u64) {
    // SAFETY: forwarded contract.
    let t = unsafe { probe_state::thread_state_at(tp) };
    if let Some(t) = t {
        if let ThreadRing::Claimed(_) | ThreadRing::NoneFree { .. } = t.ring.get() {
            t.ring.set(ThreadRing::Unclaimed);
        }
    }
}

/// Probe path: this thread's ring, claimed on first use; `None` (and the event counted as
/// lost) when there is no buffer or no free ring.
#[inline]
pub fn this_thread_ring() -> Option<RingWriter<'static>> {
    ring_of(probe_state::this_thread())
}

#[inline(always)]
fn ring_of(t: &ThreadState) -> Option<RingWriter<'static>> {
    // `tracing_on` 0: nothing is written, nothing counted as lost (the kernel's
    // `tracer_tracing_off()`: the ring buffer refuses writes).
    if TRACING_OFF.load(std::sync::atomic::Ordering::Relaxed) {
        return None;
    }
    match claimed_writer(t) {
        Some(w) => Some(w),
        None => no_ring(t),
    }
}

/// Probe path: the thread's writer, if it has claimed a ring. Reads the writer's fields in
/// place: `Cell::get` copies the whole enum through the stack (with vector registers), and
/// reading the copy back costs store-forwarding round trips on every event.
#[inline(always)]
fn claimed_writer(t: &ThreadState) -> Option<RingWriter<'static>> {
    // SAFETY: a shared reference to the cell's contents, used only to copy the writer out
    // before anything else runs on this thread. A signal handler that interrupts this
    // thread changes `ring` only from `Unclaimed`/`NoneFree` to `Claimed` (its first
    // event's claim; `Ended` is set at the thread's end, outside any probe), so a `Claimed`
    // value seen here is not written while the copy is made.
    match unsafe { &*t.ring.as_ptr() } {
        ThreadRing::Claimed(w) => Some(*w),
        _ => None,
    }
}

/// `tracing_on` is 0 ([`set_tracing_on`]).
static TRACING_OFF: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The kernel's `tracing_on`: with `false`, events are no longer written into the rings
/// (callbacks and probes still run; nothing is counted as lost); `true` writes again.
pub fn set_tracing_on(on: bool) {
    TRACING_OFF.store(!on, std::sync::atomic::Ordering::Relaxed);
}

/// Whether events are written (`tracing_on`).
pub fn tracing_on() -> bool {
    !TRACING_OFF.load(std::sync::atomic::Ordering::Relaxed)
}

/// A thread made with a copy of another thread's TLS (the agent's control thread) starts
/// with a fresh probe-path state (no ring, no guard set), not the copy of the other's.
///
/// # Safety
/// The caller is a thread whose static TLS block was copied from another live thread's and
/// that has not run any probe-path code yet.
pub unsafe fn reset_copied_thread_state() {
    // SAFETY: the caller's contract.
    unsafe { probe_state::reset_this_thread() };
}

/// Probe path, a thread without a ring: claim one (its first event, or a ring was freed since
/// it last found none), else count the event as lost.
#[cold]
#[inline(never)]
fn no_ring(t: &ThreadState) -> Option<RingWriter<'static>> {
    let rings = buffer()?;
    let slot = match t.ring.get() {
        ThreadRing::Claimed(w) => return Some(w),
        ThreadRing::Unclaimed => None,
        ThreadRing::NoneFree { slot, freed, why } => {
            (rings.freed() == freed).then_some((slot, why))
        }
    };
    if let Some((slot, why)) = slot {
        rings.note_lost_no_ring_as(slot, why);
        return None;
    }
    match claim_ring(t, rings) {
        Some(w) => Some(w),
        None => {
            if let ThreadRing::NoneFree { slot, why, .. } = t.ring.get() {
                rings.note_lost_no_ring_as(slot, why);
            }
            None
        }
    }
}

/// Open a writer section on `w` at stack pointer `sp`: its level, or `None` (the event
/// counted in `lost_recursion`) when [`MAX_NEST`] sections are open already.
#[inline(always)]
fn begin_section(t: &ThreadState, w: RingWriter<'static>, sp: u64) -> Option<u32> {
    if w.nesting() != 0 {
        let level = w.begin();
        return begin_nested(t, w, sp, level);
    }
    // The outermost: it nests in nothing and a repair of it goes back to the ring's `head`
    // (no reserve pointer to keep). `writing` is set before the ring's nesting moves: a
    // signal handler that interrupts in between and leaves by `siglongjmp` then finds the
    // section (had it come after, the ring would have stayed nested with no section to
    // repair: nothing published again). Such a handler's own outermost section keeps the
    // interrupted one's `writing` in `level_prev[0]` and puts it back at its end.
    t.level_prev[0].set(t.writing.get());
    t.writing.set(sp & !7);
    t.level_nested[0].set(0);
    signal_fence();
    let level = w.begin();
    if level != 0 {
        // A handler's section left the ring nested (it jumped out; repaired at the next
        // entry): this one nests in it.
        t.writing.set(t.level_prev[0].get());
        return begin_nested(t, w, sp, level);
    }
    Some(0)
}

/// Stops the compiler from moving memory accesses across it: a signal handler of this
/// thread sees the stores before it in program order.
#[inline(always)]
fn signal_fence() {
    std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
}

/// [`begin_section`] of a nested section (a signal handler's, inside a write).
#[cold]
#[inline(never)]
fn begin_nested(t: &ThreadState, w: RingWriter<'static>, sp: u64, level: u32) -> Option<u32> {
    let (Some(prev), Some(res)) = (
        t.level_prev.get(level as usize),
        t.level_reserved.get(level as usize),
    ) else {
        w.commit();
        if let Some(b) = buffer() {
            b.note_lost_recursion(1);
        }
        return None;
    };
    prev.set(t.writing.get());
    res.set(w.reserved());
    if let Some(c) = t.level_nested.get(level as usize) {
        c.set(0);
    }
    t.writing.set((sp & !7) | u64::from(level));
    Some(level)
}

/// A nested section at `level` committed: one more in the section it nests in, with those
/// that committed inside it (`ThreadState::level_nested`: what a rewind of the enclosing one
/// would discard).
#[cold]
#[inline(never)]
fn nested_committed(t: &ThreadState, level: u32) {
    let l = level as usize;
    let inner = t.level_nested.get(l).map_or(0, |c| c.get());
    if let Some(c) = l.checked_sub(1).and_then(|k| t.level_nested.get(k)) {
        c.set(c.get() + 1 + inner);
    }
}

/// Close the section at `level`: commit (the outermost publishes), then restore `writing`.
#[inline(always)]
fn end_section(t: &ThreadState, w: RingWriter<'static>, level: u32) {
    w.commit();
    let prev = if level == 0 {
        t.level_prev[0].get()
    } else {
        nested_committed(t, level);
        t.level_prev.get(level as usize).map_or(0, |c| c.get())
    };
    t.writing.set(prev);
}

/// Probe path, the tracers': calls `f` with this thread's ring inside a writer section (a
/// signal handler that interrupts it writes its own records, nested: module docs). Nothing
/// is written when the thread has no ring (counted in `lost_no_ring`) or sections nest too
/// deep (counted in `lost_recursion`). One TLS access for the state and the ring together.
#[inline(always)]
pub fn with_ring_guarded(f: impl FnOnce(SectionWriter<'static>)) {
    with_ring_guarded_of(probe_state::this_thread(), f);
}

/// [`with_ring_guarded`] for thread state `t` (no TLS access).
/// Returns whether `f` ran.
#[inline(always)]
pub(crate) fn with_ring_guarded_of(
    t: &ThreadState,
    f: impl FnOnce(SectionWriter<'static>),
) -> bool {
    let sp = stack_pointer();
    let _ = t.enter(Entry::Here(sp));
    let Some(w) = ring_of(t) else {
        return false;
    };
    let Some(level) = begin_section(t, w, sp) else {
        return false;
    };
    f(w.in_section());
    end_section(t, w, level);
    true
}

/// A writer section open on this thread's ring ([`event_section`]); dropping it closes the
/// section (the outermost publishes).
/// Small: it lives in the event's frame (the writer is the thread's, looked up again).
pub struct EventSection {
    t: &'static ThreadState,
    level: u32,
}

impl EventSection {
    /// The writer, inside the section.
    #[inline(always)]
    pub fn writer(&self) -> Option<SectionWriter<'static>> {
        claimed_writer(self.t).map(RingWriter::in_section)
    }
}

impl Drop for EventSection {
    #[inline(always)]
    fn drop(&mut self) {
        // The ring a section began on stays the thread's until the thread ends.
        if let Some(w) = claimed_writer(self.t) {
            end_section(self.t, w, self.level);
        }
    }
}

/// Probe path, kprobe events: a writer section on this thread's ring, or `None` (no ring,
/// or sections nested too deep: the hit counts, its record is lost). Not a closure as
/// [`with_ring_guarded`] takes: the event's code then stays in its caller's frame, which
/// matters on a small signal stack; and out of line itself, so that its own locals (the
/// repair check, a first event's claim) are not in that frame.
#[inline(never)]
pub fn event_section() -> Option<EventSection> {
    let t = probe_state::this_thread();
    let sp = stack_pointer();
    let _ = t.enter(Entry::Here(sp));
    // The common case on its own: merged with `no_ring`'s result (returned through memory),
    // the writer went through two copies on the stack before its first use.
    if !TRACING_OFF.load(std::sync::atomic::Ordering::Relaxed) {
        if let Some(w) = claimed_writer(t) {
            let level = begin_section(t, w, sp)?;
            return Some(EventSection { t, level });
        }
    }
    event_section_slow(t, sp)
}

/// [`event_section`] without a claimed ring (or with tracing off): out of line, so that its
/// locals stay out of the common case's frame (probes may run on small signal stacks).
#[cold]
#[inline(never)]
fn event_section_slow(t: &'static ThreadState, sp: u64) -> Option<EventSection> {
    let w = ring_of(t)?;
    let level = begin_section(t, w, sp)?;
    Some(EventSection { t, level })
}

/// Probe path, first event of a thread (or a retry after a ring was freed): claim a ring,
/// with every signal blocked (one claim per thread, even when a handler's event comes
/// meanwhile). Inlined into [`no_ring`], which is out of line and cold, so that the hot
/// path's stack frame stays small and the first event's adds one frame (probes may run on
/// small signal stacks).
#[inline(always)]
fn claim_ring(t: &ThreadState, rings: &'static SharedRings) -> Option<RingWriter<'static>> {
    let all: u64 = !0;
    let mut old: u64 = 0;
    // SAFETY: rt_sigprocmask(SIG_BLOCK, &all, &old, 8) reads and writes 8 bytes each.
    unsafe {
        sys::raw_syscall4(
            libc::SYS_rt_sigprocmask,
            libc::SIG_BLOCK as u64,
            &all as *const u64 as u64,
            &mut old as *mut u64 as u64,
            8,
        )
    };
    let state = match t.ring.get() {
        // A handler claimed between our look and the block.
        ThreadRing::Claimed(w) => ThreadRing::Claimed(w),
        prior => {
            let tid = sys::gettid();
            // Taken before the claim: a ring freed after this is seen by the next retry.
            let freed = rings.freed();
            match rings.claim_or_why(tid, sys::thread_comm()) {
                Ok(w) => {
                    note_thread_ring();
                    if !CLAIM_NOTE
                        .load(std::sync::atomic::Ordering::Relaxed)
                        .is_null()
                    {
                        write_claim_note(t, w);
                    }
                    ThreadRing::Claimed(w)
                }
                // The thread's losses keep the kind of its first: why it had no ring from
                // its start (a retry that finds rings held by ended threads does not make
                // more threads at once the reader's delay).
                Err(why) => match prior {
                    ThreadRing::NoneFree { slot, why, .. } => {
                        ThreadRing::NoneFree { slot, freed, why }
                    }
                    _ => ThreadRing::NoneFree {
                        slot: rings.lost_slot(tid),
                        freed,
                        why,
                    },
                },
            }
        }
    };
    t.ring.set(state);
    // SAFETY: rt_sigprocmask(SIG_SETMASK, &old, NULL, 8) reads 8 bytes.
    unsafe {
        sys::raw_syscall4(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK as u64,
            &old as *const u64 as u64,
            0,
            8,
        )
    };
    match state {
        ThreadRing::Claimed(w) => Some(w),
        _ => None,
    }
}

/// The pthread key whose destructor releases a thread's ring (`u64::MAX`: none).
static RING_KEY: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(u64::MAX);

/// glibc keeps the values of the first 32 keys in the thread descriptor: a
/// `pthread_setspecific` of one allocates nothing and takes no lock (the probe path may).
const KEYS_IN_DESCRIPTOR: libc::pthread_key_t = 32;

/// Control path, with the buffer: create the key (`release_at_exit` is its destructor).
fn init_ring_key() {
    let mut key: libc::pthread_key_t = 0;
    // SAFETY: pthread_key_create writes key; the destructor has the C signature.
    let r = unsafe { libc::pthread_key_create(&mut key, Some(release_at_exit)) };
    if r == 0 && key < KEYS_IN_DESCRIPTOR {
        RING_KEY.store(u64::from(key), std::sync::atomic::Ordering::Release);
    }
}

/// Probe path (a claim): give this thread a value for the key, so that its destructor runs
/// when the thread ends.
fn note_thread_ring() {
    let k = RING_KEY.load(std::sync::atomic::Ordering::Acquire);
    if k != u64::MAX {
        // SAFETY: a key of the first block (see KEYS_IN_DESCRIPTOR): a store in this
        // thread's descriptor, async-signal-safe in practice; the value (the destructor's
        // round, 1: `c_void`'s dangling pointer) is never dereferenced.
        unsafe {
            libc::pthread_setspecific(
                k as libc::pthread_key_t,
                std::ptr::dangling::<libc::c_void>(),
            )
        };
    }
}

/// glibc's `PTHREAD_DESTRUCTOR_ITERATIONS`: the rounds of key destructors at a thread's end.
const DESTRUCTOR_ROUNDS: usize = 4;

/// The key's destructor, in the ending thread (glibc's `start_thread`): close the thread's
/// function_graph calls (their records go into the ring), then mark the ring as ending: the
/// thread goes on writing its events into it until its last instruction (glibc's
/// `__libc_thread_freeres` calls the program's `free` after every destructor: uftrace's
/// `s-malloc-tsd`, issue 26, item 9), and the reader frees it once the thread is gone.
///
/// glibc calls the keys' destructors in rounds, in key order, while some key still has a
/// value (at most [`DESTRUCTOR_ROUNDS`]); ftprobe's key is one of the first, so releasing in
/// the first round lost every event of the program's own key destructors (`pthread_key`
/// destructors calling traced functions: 800 of 880 calls lost, found by a user). The value
/// counts the rounds: the ring is released in the last one.
unsafe extern "C" fn release_at_exit(value: *mut libc::c_void) {
    let round = value as usize;
    let k = RING_KEY.load(std::sync::atomic::Ordering::Acquire);
    if round < DESTRUCTOR_ROUNDS && k != u64::MAX {
        // SAFETY: a key of the first block (see `note_thread_ring`); the value is a count.
        unsafe { libc::pthread_setspecific(k as libc::pthread_key_t, (round + 1) as *const _) };
        return;
    }
    release_this_thread();
}

/// This thread's end (its last pthread key destructor): see `release_at_exit`.
pub fn release_this_thread() {
    let t = probe_state::this_thread();
    let Some(rings) = buffer() else { return };
    let ThreadRing::Claimed(w) = t.ring.get() else {
        return;
    };
    crate::ftrace::fgraph::thread_ending(t);
    rings.ending(&w);
}

/// Probe path: timestamp and CPU for an event.
#[inline(always)]
pub fn clock() -> (u64, u32) {
    ring::read_tsc_cpu()
}

/// Probe path: the CPU for an event whose timestamp the caller has (the function_graph
/// records carry the shadow stack's entry and return times: one `rdtsc` per event).
#[inline(always)]
pub fn cpu() -> u32 {
    ring::read_cpu()
}

/// Control path: write `text` as [`rtype::TEXT`] records of kind `kind` (split in pieces of
/// at most 4 KiB) into this thread's ring, in one writer section (`false`: some did not
/// fit, or the thread has no ring). The records are built before the section begins, so that
/// a traced `malloc` does not nest in it.
pub fn write_text(kind: u32, text: &str) -> bool {
    write_text_parts(kind, kind, text)
}

/// As [`write_text`], for a text of lines: each record ends at a line's end (a line longer
/// than 4 KiB is cut), the first has kind `kind` and the others `more` (a reader joins them
/// into one text).
pub fn write_text_parts(kind: u32, more: u32, text: &str) -> bool {
    const MAX: usize = 4096;
    let bytes = text.as_bytes();
    let mut pieces = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let end = (at + MAX).min(bytes.len());
        let cut = if end == bytes.len() {
            end
        } else {
            bytes[at..end]
                .iter()
                .rposition(|&b| b == b'\n')
                .map_or(end, |i| at + i + 1)
        };
        pieces.push(&bytes[at..cut]);
        at = cut;
    }
    let records: Vec<(u32, Vec<u64>)> = pieces
        .iter()
        .enumerate()
        .map(|(i, chunk)| {
            let words = chunk
                .chunks(8)
                .map(|b| {
                    let mut w = [0u8; 8];
                    w[..b.len()].copy_from_slice(b);
                    u64::from_le_bytes(w)
                })
                .collect();
            (if i == 0 { kind } else { more }, words)
        })
        .collect();
    let mut ok = false;
    with_ring_guarded(|w| ok = records.iter().all(|(k, r)| w.write_aux(rtype::TEXT, *k, r)));
    ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::RingConfig;

    /// A section left by a non-local exit (here a panic that unwinds out of it, as a
    /// `siglongjmp` out of a signal handler leaves it) is counted as lost by the next entry's
    /// repair only if it had not committed: a jump between the commit and the restore of
    /// `writing` must not count a recorded event as lost. And a nested section abandoned
    /// inside a live one (a handler that jumped back into the handler it interrupted) leaves
    /// the ring neither stuck nor corrupt: its record is never published, the live one's
    /// records are, and the ring goes on.
    #[test]
    fn a_write_published_before_a_jump_out_is_not_counted_as_lost() {
        let (rings, _fd) = SharedRings::create_uncalibrated(RingConfig {
            nr_rings: 4,
            ring_bytes: 1 << 16,
            budget_bytes: 0,
        })
        .unwrap();
        // The only test of this binary that sets the buffer.
        assert!(set_buffer(rings));
        let b = buffer().unwrap();
        std::thread::spawn(move || {
            let lost = || b.lost_recursion();
            // A section: its record written, committed if `commit`, then a jump out (before
            // `writing` is restored).
            let abandon = |commit: bool, x: u64| {
                let r = std::panic::catch_unwind(|| {
                    // Deeper than any frame of `write_one`, as a signal handler's frames are
                    // below the code it interrupted.
                    let pad = std::hint::black_box([0u8; 4096]);
                    let t = probe_state::this_thread();
                    let sp = stack_pointer();
                    std::hint::black_box(&pad);
                    let _ = t.enter(Entry::Here(sp));
                    let w = ring_of(t).unwrap();
                    begin_section(t, w, sp).unwrap();
                    assert!(w.in_section().write3(rtype::FUNC, x, x, x));
                    if commit {
                        w.commit();
                    }
                    panic!("a jump out of the write");
                });
                assert!(r.is_err());
            };
            let write_one = |x: u64| with_ring_guarded(|w| assert!(w.write3(rtype::FUNC, x, x, x)));
            let mut reader = b.reader(0).unwrap();
            let mut records = || {
                let mut got = Vec::new();
                reader.drain(|_, w| got.push(w[0]));
                got
            };
            write_one(1);
            assert_eq!((records(), lost()), (vec![1], 0));
            // Committed, then abandoned: recorded, not lost.
            abandon(true, 2);
            write_one(3);
            assert_eq!(
                (records(), lost()),
                (vec![2, 3], 0),
                "committed and abandoned"
            );
            // Abandoned before it committed: lost, never published.
            abandon(false, 4);
            write_one(5);
            assert_eq!((records(), lost()), (vec![5], 1), "abandoned uncommitted");
            // Nested: inside a live section, a nested one is abandoned; then another nested
            // one, and the outer goes on and commits.
            with_ring_guarded(|w| {
                assert!(w.write3(rtype::FUNC, 6, 6, 6));
                abandon(false, 7);
                write_one(8);
                assert!(w.write3(rtype::FUNC, 9, 9, 9));
            });
            assert_eq!(
                (records(), lost()),
                (vec![6, 8, 9], 2),
                "a nested section abandoned"
            );
            let w = match probe_state::this_thread().ring.get() {
                ThreadRing::Claimed(w) => w,
                _ => panic!("no ring"),
            };
            assert_eq!(w.nesting(), 0, "not stuck");
            assert_eq!(probe_state::this_thread().writing.get(), 0);
            write_one(10);
            assert_eq!((records(), lost()), (vec![10], 2));
            assert_eq!(reader.corrupt_bytes(), 0);
        })
        .join()
        .unwrap();
    }
}
