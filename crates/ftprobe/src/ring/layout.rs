//! The shared memory's layout (drawn in the [module docs](super)): the header, the ring
//! descriptors, their constants and the record header word. Everything in the mapping is an
//! atomic: the peer is another process, and no value it writes is undefined behaviour here.

use std::mem::{align_of, offset_of, size_of};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8};

use super::RingError;

/// The first 8 bytes of the memfd.
pub const MAGIC: [u8; 8] = *b"FTPRING1";
/// Layout version; bumped on any change of the layout above.
pub const LAYOUT_VERSION: u32 = 7;
/// Smallest data area of one ring, in bytes.
pub const MIN_RING_BYTES: u32 = 4096;
/// Largest data area of one ring, in bytes.
pub const MAX_RING_BYTES: u32 = 1 << 30;
/// Largest number of rings.
pub const MAX_RINGS: u32 = 1 << 16;
/// A ring's size when it is claimed (or `ring_bytes` if smaller): see the module docs.
pub const INIT_RING_BYTES: u32 = 16 << 10;
/// Entries in the table of threads that had no ring.
pub const MAX_LOST_TIDS: usize = 256;
/// Writers nested on one thread (a write, a signal handler's inside it, ...): a deeper one
/// drops its record (counted in `lost_recursion`), as the kernel's recursion lock stops at
/// its few contexts.
pub const MAX_NEST: u32 = 8;
/// Ring states (the descriptor's `state`).
pub(super) const STATE_FREE: u32 = 0;
pub(super) const STATE_OWNED: u32 = 1;
pub(super) const STATE_RELEASED: u32 = 2;
/// The owner is ending (its last pthread key destructors ran) but may still write (the C
/// library's own exit work, e.g. `free` calls): the reader frees the ring once the owner
/// thread is gone and everything was read.
pub(super) const STATE_ENDING: u32 = 3;
/// Entries in the objects table.
pub const MAX_OBJECTS: usize = 512;
/// Entries in the event counters table: kprobe events with a larger id keep their counters
/// in the process only.
pub const MAX_EVENTS: usize = 1024;
/// Longest path in the objects table, in bytes (the slot has one more, always 0).
pub const MAX_OBJECT_PATH: usize = 255;
/// Record type reserved for padding; [`RingWriter::write`](super::RingWriter::write) refuses it.
pub const RTYPE_PADDING: u16 = u16::MAX;
/// Record type of the LOST record the writer puts before the first record that fits after
/// drops (module docs, "Lost events"); `crate::record` decodes it.
pub const RTYPE_LOST: u16 = 7;
/// Bit 63 of the producer's `tail_cache`: drops happened that no LOST record marks yet.
pub(super) const LOST_PENDING: u64 = 1 << 63;
/// Longest record, in words, header word included.
pub const MAX_RECORD_WORDS: usize = u16::MAX as usize;

/// The producer maps its ring in ahead of its records on its first lap, by chunks that double
/// from 8 KiB up to this many bytes ([`RingWriter`](super::RingWriter)'s `populate_ahead`).
pub const POPULATE_CHUNK: u64 = 256 << 10;
/// The first populate chunk.
pub(super) const POPULATE_FIRST: u64 = 8 << 10;

pub(super) const PAGE: usize = 4096;
pub(super) const CACHE_LINE: usize = 64;
pub(super) const MAGIC_U64: u64 = u64::from_le_bytes(MAGIC);

/// One entry of the objects table.
#[repr(C)]
pub(super) struct ObjectSlot {
    pub(super) load_bias: AtomicU64,
    pub(super) path_len: AtomicU32,
    /// 1 once the entry is taken (`set_objects`, `add_objects`).
    pub(super) claimed: AtomicU32,
    /// The raw TSC when the object was added (0: loaded before the session's first event).
    pub(super) load_tsc: AtomicU64,
    pub(super) path: [AtomicU8; MAX_OBJECT_PATH + 1],
}

/// The start of the memfd. Only atomics: any bit pattern is valid, and all mutation goes
/// through `UnsafeCell`, so a `&Header` over memory another process writes is sound.
#[repr(C)]
pub(super) struct Header {
    pub(super) magic: AtomicU64,
    pub(super) version: AtomicU32,
    pub(super) header_bytes: AtomicU32,
    pub(super) nr_rings: AtomicU32,
    pub(super) ring_bytes: AtomicU32,
    pub(super) total_bytes: AtomicU64,
    pub(super) clock_tsc_ref: AtomicU64,
    pub(super) clock_mono_ref_ns: AtomicU64,
    pub(super) clock_ns_per_tick_q32: AtomicU64,
    pub(super) nr_objects: AtomicU32,
    pub(super) sigtrap_passed_pid: AtomicU32,
    /// Written by the target's threads: on a cache line of its own.
    pub(super) counters: CacheLine<Counters>,
    pub(super) objects: [ObjectSlot; MAX_OBJECTS],
    /// Written by the target's threads on rare paths (a lost record, a missed hit), read by
    /// the CLI at the end: exact even when the target never reached its exit.
    pub(super) event_counters: [EventCounters; MAX_EVENTS],
    /// Threads that had no ring, and how many events each lost.
    pub(super) lost_tids: [LostTid; MAX_LOST_TIDS],
    /// Why events of `lost_no_ring` were lost (module docs).
    pub(super) no_ring_kinds: NoRingKinds,
}

#[repr(C)]
pub(super) struct NoRingKinds {
    pub(super) lost_unreclaimed: AtomicU64,
    pub(super) lost_after_end: AtomicU64,
}

#[repr(C)]
pub(super) struct LostTid {
    pub(super) tid: AtomicU32,
    pub(super) _reserved: AtomicU32,
    pub(super) lost: AtomicU64,
}

/// The counters of one kprobe event, in the shared header.
#[repr(C)]
pub struct EventCounters {
    /// Hits whose record could not be written (ring full, no ring, a write in progress).
    pub dropped: AtomicU64,
    /// Hits not handled because a probe was already running on the thread (`nmissed`).
    pub nmissed: AtomicU64,
}

#[repr(C)]
pub(super) struct Counters {
    pub(super) claimed: AtomicU64,
    pub(super) lost_no_ring: AtomicU64,
    pub(super) lost_recursion: AtomicU64,
    pub(super) armed: AtomicU64,
    pub(super) fgraph_overrun: AtomicU64,
    pub(super) budget_used: AtomicU64,
    pub(super) freed: AtomicU64,
    pub(super) budget_bytes: AtomicU64,
}

#[repr(C, align(64))]
pub(super) struct CacheLine<T>(pub(super) T);

/// Per-ring descriptor: the producer's cache line, then the reader's.
#[repr(C)]
pub(super) struct RingDesc {
    pub(super) prod: CacheLine<ProducerLine>,
    pub(super) tail: CacheLine<ReaderLine>,
}

/// The reader's cache line: its tail, and the owner's process id (written once, at the claim,
/// before the owner publishes its tid).
#[repr(C)]
pub(super) struct ReaderLine {
    pub(super) tail: AtomicU64,
    pub(super) pid: AtomicU32,
    /// Written by the owner's writer on its cold path: the ring's `lost` count that its last
    /// LOST record accounted for.
    pub(super) lost_marked: AtomicU64,
}

#[repr(C)]
pub(super) struct ProducerLine {
    pub(super) head: AtomicU64,
    pub(super) lost: AtomicU64,
    /// The producer's last view of `tail` (always <= the real one): it reloads `tail` only
    /// when this one says the ring is too full, so it rarely touches the reader's cache line.
    pub(super) tail_cache: AtomicU64,
    pub(super) tid: AtomicU32,
    pub(super) state: AtomicU32,
    pub(super) comm: [AtomicU8; 16],
    /// The reserve pointer: `head` plus what writers in progress reserved.
    pub(super) reserved: AtomicU64,
    /// Bytes in use (a power of two): see the module docs.
    pub(super) size: AtomicU32,
    /// Writers in progress on the owner thread (nested by signal handlers).
    pub(super) nest: AtomicU32,
}

pub(super) const fn round_up(x: usize, to: usize) -> usize {
    x.div_ceil(to) * to
}

/// Size of the header area in bytes (page-aligned).
pub const HEADER_BYTES: usize = round_up(size_of::<Header>(), PAGE);
pub(super) const DESC_OFFSET: usize = HEADER_BYTES;
pub(super) const DESC_BYTES: usize = size_of::<RingDesc>();

const _: () = {
    assert!(offset_of!(Header, magic) == 0);
    assert!(offset_of!(Header, version) == 8);
    assert!(offset_of!(Header, header_bytes) == 12);
    assert!(offset_of!(Header, nr_rings) == 16);
    assert!(offset_of!(Header, ring_bytes) == 20);
    assert!(offset_of!(Header, total_bytes) == 24);
    assert!(offset_of!(Header, clock_tsc_ref) == 32);
    assert!(offset_of!(Header, clock_mono_ref_ns) == 40);
    assert!(offset_of!(Header, clock_ns_per_tick_q32) == 48);
    assert!(offset_of!(Header, nr_objects) == 56);
    assert!(offset_of!(Header, sigtrap_passed_pid) == 60);
    assert!(offset_of!(Header, counters) == 64);
    assert!(offset_of!(Header, counters) + offset_of!(Counters, claimed) == 64);
    assert!(offset_of!(Header, counters) + offset_of!(Counters, lost_no_ring) == 72);
    assert!(offset_of!(Header, counters) + offset_of!(Counters, lost_recursion) == 80);
    assert!(offset_of!(Header, counters) + offset_of!(Counters, armed) == 88);
    assert!(offset_of!(Header, counters) + offset_of!(Counters, fgraph_overrun) == 96);
    assert!(offset_of!(Header, counters) + offset_of!(Counters, budget_used) == 104);
    assert!(offset_of!(Header, counters) + offset_of!(Counters, freed) == 112);
    assert!(offset_of!(Header, counters) + offset_of!(Counters, budget_bytes) == 120);
    assert!(offset_of!(Header, objects) == 128);
    assert!(size_of::<ObjectSlot>() == 280);
    assert!(offset_of!(ObjectSlot, load_bias) == 0);
    assert!(offset_of!(ObjectSlot, path_len) == 8);
    assert!(offset_of!(ObjectSlot, load_tsc) == 16);
    assert!(offset_of!(ObjectSlot, path) == 24);
    assert!(offset_of!(Header, event_counters) == 143_488);
    assert!(size_of::<EventCounters>() == 16);
    assert!(offset_of!(Header, lost_tids) == 159_872);
    assert!(size_of::<LostTid>() == 16);
    assert!(offset_of!(Header, no_ring_kinds) == 163_968);
    assert!(size_of::<Header>() == 128 + MAX_OBJECTS * 280 + MAX_EVENTS * 16 + 4096 + 64);
    assert!(HEADER_BYTES == 167_936);
    assert!(align_of::<Header>() <= PAGE);
    assert!(DESC_BYTES == 128);
    assert!(align_of::<RingDesc>() == CACHE_LINE);
    assert!(offset_of!(RingDesc, prod) == 0);
    assert!(offset_of!(RingDesc, tail) == CACHE_LINE);
    assert!(offset_of!(ReaderLine, tail) == 0);
    assert!(offset_of!(ReaderLine, pid) == 8);
    assert!(offset_of!(ReaderLine, lost_marked) == 16);
    assert!(size_of::<ReaderLine>() <= CACHE_LINE);
    assert!(offset_of!(ProducerLine, head) == 0);
    assert!(offset_of!(ProducerLine, lost) == 8);
    assert!(offset_of!(ProducerLine, tail_cache) == 16);
    assert!(offset_of!(ProducerLine, tid) == 24);
    assert!(offset_of!(ProducerLine, state) == 28);
    assert!(offset_of!(ProducerLine, comm) == 32);
    assert!(offset_of!(ProducerLine, reserved) == 48);
    assert!(offset_of!(ProducerLine, size) == 56);
    assert!(offset_of!(ProducerLine, nest) == 60);
    assert!(size_of::<ProducerLine>() <= CACHE_LINE);
    assert!(MIN_RING_BYTES as usize % PAGE == 0);
};

/// Sizes of a set of rings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingConfig {
    /// Number of rings: how many threads can own one at once, 1..=[`MAX_RINGS`].
    pub nr_rings: u32,
    /// The largest size of one ring (its address space), in bytes: a power of two in
    /// [`MIN_RING_BYTES`]..=[`MAX_RING_BYTES`].
    pub ring_bytes: u32,
    /// What the sizes of the rings owned at once may add up to, in bytes (module docs); 0:
    /// `nr_rings * ring_bytes` (every ring may grow to `ring_bytes`).
    pub budget_bytes: u64,
}

impl RingConfig {
    pub(super) fn check(self) -> Result<Layout, RingError> {
        if !(1..=MAX_RINGS).contains(&self.nr_rings) {
            return Err(RingError::BadRingCount {
                nr_rings: self.nr_rings,
            });
        }
        if !self.ring_bytes.is_power_of_two()
            || !(MIN_RING_BYTES..=MAX_RING_BYTES).contains(&self.ring_bytes)
        {
            return Err(RingError::BadRingBytes {
                ring_bytes: self.ring_bytes,
            });
        }
        let nr = self.nr_rings as usize;
        let data_offset = DESC_OFFSET + round_up(nr * DESC_BYTES, PAGE);
        let total_bytes = (self.ring_bytes as usize)
            .checked_mul(nr)
            .and_then(|d| d.checked_add(data_offset))
            .filter(|&t| i64::try_from(t).is_ok())
            .ok_or(RingError::BadRingCount {
                nr_rings: self.nr_rings,
            })?;
        let budget_bytes = if self.budget_bytes == 0 {
            self.ring_bytes as u64 * nr as u64
        } else {
            self.budget_bytes
        };
        Ok(Layout {
            cfg: RingConfig {
                budget_bytes,
                ..self
            },
            data_offset,
            total_bytes,
        })
    }

    /// The configuration for a total of `budget_bytes` over `nr_rings` rings: each ring may
    /// grow to half the total (a power of two, at least [`MIN_RING_BYTES`], at most
    /// [`MAX_RING_BYTES`]).
    pub fn with_budget(nr_rings: u32, budget_bytes: u64) -> RingConfig {
        let half = (budget_bytes / 2).clamp(MIN_RING_BYTES as u64, MAX_RING_BYTES as u64);
        let ring_bytes = 1u32 << (63 - half.leading_zeros());
        RingConfig {
            nr_rings,
            ring_bytes,
            budget_bytes: budget_bytes.max(MIN_RING_BYTES as u64),
        }
    }

    /// A ring's size when it is claimed: [`INIT_RING_BYTES`], or `ring_bytes` if smaller.
    pub fn init_bytes(self) -> u32 {
        INIT_RING_BYTES.min(self.ring_bytes)
    }

    /// Size of the memfd for this configuration, in bytes; `None` if the configuration is
    /// invalid.
    pub fn total_bytes(self) -> Option<usize> {
        self.check().ok().map(|l| l.total_bytes)
    }
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Layout {
    pub(super) cfg: RingConfig,
    pub(super) data_offset: usize,
    pub(super) total_bytes: usize,
}

#[inline(always)]
pub(super) const fn record_header(nwords: usize, rtype: u16) -> u64 {
    (nwords as u64 & 0xffff) | ((rtype as u64) << 16)
}

pub(super) const fn record_header_aux(nwords: usize, rtype: u16, aux: u32) -> u64 {
    record_header(nwords, rtype) | ((aux as u64) << 32)
}
