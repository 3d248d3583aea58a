//! The trace buffer of this process (kernel/trace/trace.c's global buffer): the shared rings,
//! and this thread's ring, claimed on its first event. Used by every tracer (function tracer,
//! kprobe events). Probe path: no allocation, no lock.
//!
//! A thread claims its ring with two raw syscalls (`gettid`, `prctl(PR_GET_NAME)`); when no
//! ring is free its events are counted in the header's `lost_no_ring`. After `fork` the
//! child's thread claims a ring of its own (one producer per ring).

use std::sync::OnceLock;

use crate::probe_state::{self, stack_pointer, Entry, ThreadRing, ThreadState};
use crate::ring::{self, RingWriter, SharedRings};
use crate::sys;

/// Record types written into the rings.
pub mod rtype {
    /// Function entry: aux = CPU; words: tsc, ip, parent_ip.
    pub const FUNC: u16 = 1;
    /// kprobe event: aux = CPU | event id << 12; words: tsc, probe address, one word per
    /// fetch arg.
    pub const KPROBE: u16 = 2;
    /// Text for the CLI (e.g. the armed-probes listing): aux = kind; words: UTF-8 bytes,
    /// NUL-padded to whole words.
    pub const TEXT: u16 = 3;
    /// Per-event counters at exit: aux = event id; words: hits whose record was dropped,
    /// nmissed. The reader adds the event's records to the first for its hits.
    pub const PROFILE: u16 = 4;
    /// function_graph entry: aux = CPU | depth << 16; words: tsc (the shadow stack's
    /// calltime), func.
    pub const FGRAPH_ENT: u16 = 5;
    /// function_graph return: aux = CPU | how the call ended (`FgraphExit`) << 12 | depth
    /// << 16; words: tsc (at the return, or when the call was found cut off), func,
    /// calltime (tsc at entry), retval (rax).
    pub const FGRAPH_RET: u16 = 6;
}

static RINGS: OnceLock<SharedRings> = OnceLock::new();

/// After `fork`, the child's only thread must not write into its parent's ring.
extern "C" fn forget_ring_in_child() {
    probe_state::this_thread().ring.set(ThreadRing::Unclaimed);
}

/// Make `rings` this process's trace buffer. Once; later calls return `false`.
pub fn set_buffer(rings: SharedRings) -> bool {
    if RINGS.set(rings).is_err() {
        return false;
    }
    // SAFETY: registers a plain extern "C" callback; pthread_atfork has no other contract.
    unsafe { libc::pthread_atfork(None, None, Some(forget_ring_in_child)) };
    true
}

/// The trace buffer, if set.
pub fn buffer() -> Option<&'static SharedRings> {
    RINGS.get()
}

/// Probe path: this thread's ring, claimed on first use; `None` (and the event counted as
/// lost) when there is no buffer or no free ring.
#[inline]
pub fn this_thread_ring() -> Option<RingWriter<'static>> {
    ring_of(probe_state::this_thread())
}

#[inline(always)]
fn ring_of(t: &ThreadState) -> Option<RingWriter<'static>> {
    match t.ring.get() {
        ThreadRing::Claimed(w) => Some(w),
        ThreadRing::NoneFree => {
            if let Some(r) = RINGS.get() {
                r.note_lost_no_ring();
            }
            None
        }
        ThreadRing::Unclaimed => claim_ring(t),
    }
}

/// What a kprobe event does with a hit ([`event_ring`]).
pub enum EventRing {
    /// Record into this ring; the guard ends the write (drop it after publishing).
    Ring(RingWriter<'static>, WriteGuard),
    /// No ring for this thread (counted in `lost_no_ring`): the hit counts, its record is lost.
    NoRing,
    /// Another write into this thread's ring is in progress (a signal handler interrupted
    /// it): the hit counts, its record is lost (counted in `lost_recursion`).
    Busy,
}

/// The thread's write into its ring is in progress while this lives ([`event_ring`]).
pub struct WriteGuard(&'static ThreadState);

impl Drop for WriteGuard {
    fn drop(&mut self) {
        self.0.writing.set(0);
    }
}

/// Take the one-writer guard of this thread's ring (its frame's stack pointer `sp`), after
/// repairing what a non-local exit left; `false` when a write is in progress.
#[inline(always)]
fn begin_write(t: &ThreadState, sp: u64) -> bool {
    let _ = t.enter(Entry::Here(sp));
    if t.writing.get() != 0 {
        if let Some(b) = RINGS.get() {
            b.note_lost_recursion(1);
        }
        return false;
    }
    t.writing.set(sp);
    true
}

/// Probe path, kprobe events: this thread's ring, or why there is none; one TLS access.
#[inline]
pub fn event_ring() -> EventRing {
    let t = probe_state::this_thread();
    if !begin_write(t, stack_pointer()) {
        return EventRing::Busy;
    }
    match ring_of(t) {
        Some(w) => {
            t.write_mark.set(w.mark());
            EventRing::Ring(w, WriteGuard(t))
        }
        None => {
            t.writing.set(0);
            EventRing::NoRing
        }
    }
}

/// Probe path, the function tracer's: calls `f` with this thread's ring unless a tracer is
/// already writing into it on this thread (a signal handler interrupted the function tracer
/// or a kprobe event, or their own code called a traced function): then nothing is written
/// and one event is counted in the buffer's `lost_recursion`. One TLS access for the guard
/// and the ring together.
#[inline(always)]
pub fn with_ring_guarded(f: impl FnOnce(RingWriter<'static>)) {
    with_ring_guarded_of(probe_state::this_thread(), f)
}

/// [`with_ring_guarded`] for thread state `t` (no TLS access).
#[inline(always)]
pub(crate) fn with_ring_guarded_of(t: &ThreadState, f: impl FnOnce(RingWriter<'static>)) {
    if !begin_write(t, stack_pointer()) {
        return;
    }
    if let Some(w) = ring_of(t) {
        t.write_mark.set(w.mark());
        f(w);
    }
    t.writing.set(0);
}

/// Probe path, first event of a thread: claim its ring. Out of line and cold, so that the
/// hot path's stack frame stays small (probes may run on small signal stacks).
#[cold]
#[inline(never)]
fn claim_ring(t: &ThreadState) -> Option<RingWriter<'static>> {
    let rings = RINGS.get()?;
    let state = match rings.claim(sys::gettid(), sys::thread_comm()) {
        Some(w) => ThreadRing::Claimed(w),
        None => ThreadRing::NoneFree,
    };
    t.ring.set(state);
    match state {
        ThreadRing::Claimed(w) => Some(w),
        _ => {
            rings.note_lost_no_ring();
            None
        }
    }
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
/// at most 4 KiB) into this thread's ring, under the ring's one-writer guard (a caller in a
/// signal handler that interrupted a write writes nothing: `false`). The records are built
/// before the guard is taken, so that a traced `malloc` is not counted as lost.
pub fn write_text(kind: u32, text: &str) -> bool {
    let records: Vec<Vec<u64>> = text
        .as_bytes()
        .chunks(4096)
        .map(|chunk| {
            chunk
                .chunks(8)
                .map(|b| {
                    let mut w = [0u8; 8];
                    w[..b.len()].copy_from_slice(b);
                    u64::from_le_bytes(w)
                })
                .collect()
        })
        .collect();
    let t = probe_state::this_thread();
    if !begin_write(t, stack_pointer()) {
        return false;
    }
    let ok = ring_of(t).is_some_and(|w| {
        t.write_mark.set(w.mark());
        records.iter().all(|r| w.write_aux(rtype::TEXT, kind, r))
    });
    t.writing.set(0);
    ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::RingConfig;

    /// A write left by a non-local exit (here a panic that unwinds out of the closure, as a
    /// `siglongjmp` out of a signal handler leaves it) is counted as lost by the next entry's
    /// repair only if its record was not published: a jump between the publish and the
    /// guard's release counted a recorded event as lost too.
    #[test]
    fn a_write_published_before_a_jump_out_is_not_counted_as_lost() {
        let (rings, _fd) = SharedRings::create_uncalibrated(RingConfig {
            nr_rings: 4,
            ring_bytes: 1 << 16,
        })
        .unwrap();
        // The only test of this binary that sets the buffer.
        assert!(set_buffer(rings));
        let b = buffer().unwrap();
        std::thread::spawn(move || {
            let lost = || b.lost_recursion();
            let abandon = |publish: bool| {
                let r = std::panic::catch_unwind(|| {
                    with_ring_guarded(|w| {
                        if publish {
                            assert!(w.write3(rtype::FUNC, 1, 2, 3));
                        }
                        panic!("a jump out of the write");
                    })
                });
                assert!(r.is_err());
            };
            let write_one = || with_ring_guarded(|w| assert!(w.write3(rtype::FUNC, 4, 5, 6)));
            let mut reader = b.reader(0).unwrap();
            let mut records = || {
                let mut n = 0;
                reader.drain(|_, _| n += 1);
                n
            };
            write_one();
            assert_eq!((records(), lost()), (1, 0));
            // Published, then abandoned: recorded, not lost.
            abandon(true);
            write_one();
            assert_eq!((records(), lost()), (2, 0), "published and abandoned");
            // Abandoned before it published: lost.
            abandon(false);
            write_one();
            assert_eq!((records(), lost()), (1, 1), "abandoned unpublished");
        })
        .join()
        .unwrap();
    }
}
