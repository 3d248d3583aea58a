//! Per-thread ring buffers in a memfd shared by the traced process (the agent, which writes)
//! and the `ftprobe` CLI (which reads, live and after the target died).
//!
//! The CLI creates the memfd ([`SharedRings::create`]) without close-on-exec, so the target
//! inherits it through `exec`; the agent maps it with [`SharedRings::attach`]. Both map it
//! `MAP_SHARED`, so whatever the agent has published stays readable when the target crashes.
//! The CLI seals the size (`F_SEAL_SHRINK | F_SEAL_GROW`): the target cannot truncate the file
//! under the CLI's mapping (which would turn the CLI's reads into `SIGBUS`).
//!
//! # Memory layout
//!
//! All integers little-endian (x86-64), all offsets in bytes from the start of the memfd.
//!
//! ```text
//! offset
//! 0 +-- Header: HEADER_BYTES = 163840 bytes (40 pages) ------------------------------+
//!   |   0 magic "FTPRING1"     8 version u32          12 header_bytes u32            |
//!   |  16 nr_rings u32 (descriptors) 20 ring_bytes u32 (a ring's largest size: stride) |
//!   |  24 total_bytes u64 (file size)                                                 |
//!   |  32 clock.tsc_ref u64   40 clock.mono_ref_ns u64  48 clock.ns_per_tick_q32 u64 |
//!   |  56 nr_objects u32      60 sigtrap_passed_pid u32 (see note_sigtrap_passed)    |
//!   |  64 claimed u64 (rings 0..claimed have been owned: the readers' bound)          |
//!   |  72 lost_no_ring u64 (events of threads that had no ring, all threads)         |
//!   |  80 lost_recursion u64 (events a tracer dropped: nested too deep, or a write      |
//!   |     abandoned by a non-local exit)                                             |
//!   |  88 armed u64 (the agent armed everything it was asked to: the trace is on)        |
//!   |  96 fgraph_overrun u64 (calls the function_graph tracer could not hook: full shadow |
//!   |     stack)                                                                        |
//!   | 104 budget_used u64 (bytes: the sum of the sizes of the rings owned)             |
//!   | 112 freed u64 (rings released or freed so far: threads without a ring retry)     |
//!   | 120 budget_bytes u64 (--buffer-size-kb: what ring sizes may add up to)          |
//!   | 128 objects[512], 272 bytes each:                                              |
//!   |       0 load_bias u64, 8 path_len u32, 12 claimed u32, 16 path[256]            |
//!   | 139392 event_counters[1024], 16 bytes each (kprobe events, by event id):        |
//!   |       0 dropped u64 (hits whose record was lost), 8 nmissed u64                |
//!   | 155776 lost_tids[256], 16 bytes each (threads that had no ring):               |
//!   |       0 tid u32, 4 reserved u32, 8 lost u64                                    |
//!   | 159872 lost_unreclaimed u64 (of lost_no_ring: no ring free, some of them       |
//!   |        released by ended threads and not freed by the reader yet)              |
//!   | 159880 lost_after_end u64 (of lost_no_ring: events of a thread after it        |
//!   |        released its ring, e.g. in a later TLS destructor)                      |
//!   +-- Descriptors at DESC_OFFSET = HEADER_BYTES, 128 bytes per ring ---------------+
//!   |  +0 line 0, written by the producer: 0 head u64 (published), 8 lost u64,        |
//!   |          16 tail_cache u64, 24 tid u32, 28 state u32 (0 free, 1 owned,          |
//!   |          2 released), 32 comm[16], 48 reserved u64 (the reserve pointer),       |
//!   |          56 size u32 (bytes in use, a power of two), 60 nest u32 (writers)      |
//!   | +64 line 1, written by the reader: 64 tail u64; by the owner at its claim:    |
//!   |          72 pid u32 (its process: a forked child's threads have their own)     |
//!   +-- Data at data_offset = DESC_OFFSET + round_up(nr_rings * 128, 4096) ----------+
//!   | ring 0: ring_bytes | ring 1: ring_bytes | ...  | ring nr_rings-1               |
//!   +----------------------------------------------------------------- total_bytes --+
//! ```
//!
//! # Owners, sizes and memory
//!
//! A ring belongs to one thread at a time, its owner. A thread claims a free ring at its
//! first event ([`SharedRings::claim`]: state free -> owned, then `tid` and `comm`), and
//! releases it when it ends ([`SharedRings::release`]: owned -> released, from a pthread key
//! destructor). The reader frees a released ring once it has read everything in it
//! ([`SharedRings::free_released`]): it takes the owner's tid, comm and `lost` first (its
//! snapshot: every record it has read from the ring since it saw the owner's `tid` is that
//! owner's), gives the ring's pages back to the system (`MADV_REMOVE`), zeroes the producer
//! line and the tail and sets the state to free. So a ring's records always belong to the tid
//! in its descriptor, and a reader that starts a new record stream each time it sees a new
//! owner attributes every record correctly (the CLI's streams: one per owner).
//!
//! A ring's data area is `ring_bytes` of address space, of which the owner uses `size`
//! bytes, starting at [`RingConfig::init_bytes`] (16 KiB). On its first lap (the reserve
//! pointer never went past `size`), a record that does not fit before `size` doubles it
//! instead of wrapping, as long as the owned rings' sizes stay within `budget_bytes`
//! (`budget_used` counts them) and `size` within `ring_bytes`; the first wrap fixes `size`
//! until the ring is freed. Pages are touched (and populated ahead, in chunks that double
//! from 8 KiB to [`POPULATE_CHUNK`]) only as records reach them: a thread with a few events
//! costs a page or two. A ring's initial size is granted even when the budget is spent, so
//! memory stays below `max(budget_bytes, owners x init_bytes)`.
//!
//! A thread that finds no free ring counts its events in `lost_no_ring` and in its own entry
//! of `lost_tids` (taken on its first loss; when the table is full only the total counts),
//! and tries to claim again after a ring was released or freed (`freed` moved). Why it
//! found none is counted too ([`NoRing`]): every ring owned by a live thread (more threads
//! at once than rings), or some held by threads that ended and whose rings the reader has
//! not read to the end yet (`lost_unreclaimed`: threads end faster than the reader frees;
//! more rings help, each costs only 128 bytes of descriptor and address space until used).
//! A claim takes the first free ring from ring 0, so the rings in use stay at the low
//! indices and the reader's scans (`0..claimed`) stay as short as the threads at once.
//!
//! # Records
//!
//! A ring's data area holds 8-byte words. A record is one header word, then its payload:
//!
//! ```text
//!  bits 0..16 len (words, header included, >= 1) │ 16..32 rtype │ 32..64 aux (e.g. the CPU)
//! ```
//!
//! The tracers' record types, their `aux` bits and payloads: [`crate::record`].
//!
//! Records never wrap: when a record does not fit before the end of the ring's `size`, the
//! producer writes a header word with rtype [`RTYPE_PADDING`] (len 0: padding always runs to
//! the end of `size`) and puts the record at offset 0. `head`, `reserved` and `tail` are
//! byte counters that only grow (from 0 when the ring is claimed); a position is
//! `counter & (size - 1)` (during the first lap `counter < size`, so a larger `size` gives the
//! same positions). `head - tail` bytes are unread.
//!
//! # Writers and nesting
//!
//! Only the owner thread writes, but a signal handler on that thread may interrupt a write
//! and write records of its own, as interrupts nest in the kernel's ring buffer
//! (`rb_reserve_next_event`, `rb_start_commit`/`rb_end_commit`). A write is: `nest += 1`;
//! reserve room by moving `reserved` with a `cmpxchg` without a lock prefix (one instruction:
//! atomic against a signal handler of the same thread, and only this thread writes it; a
//! handler that reserved in between makes it fail and retry); fill; commit. The commit of the
//! outermost writer (`nest == 1`) publishes `head = reserved` (Release), then drops `nest`,
//! and looks again: a handler that ran between its load of `reserved` and its store of
//! `nest` committed records that no one published, so it publishes again. A nested writer
//! only drops `nest`. A nested writer never makes a ring's first wrap (nor grows it): on the
//! first lap a nested record that does not fit before `size` is dropped, so `size` only
//! changes in the outermost writer. `head` never goes back; a reader that finds `head`
//! behind its tail (a ring freed and claimed again under it) reads nothing.
//!
//! A writer abandoned by a non-local exit (`siglongjmp` out of a handler) is repaired at the
//! thread's next event (`crate::probe_state`): `nest` goes back to the number of writers
//! still live and `reserved` back to where the first abandoned one began (to `head` when
//! none is live): what it reserved is never published.
//!
//! Every access to the mapping goes through an atomic type: the peer is another process that
//! may be buggy or dead, and no value it writes can make this side's code undefined behaviour;
//! the reader validates what it reads (see [`RingReader::corrupt_bytes`]). On x86-64 a relaxed
//! atomic load or store is a plain `mov`.

use std::fmt;
use std::io;
use std::mem::{align_of, offset_of, size_of};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8};

/// The first 8 bytes of the memfd.
pub const MAGIC: [u8; 8] = *b"FTPRING1";
/// Layout version; bumped on any change of the layout above.
pub const LAYOUT_VERSION: u32 = 5;
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
const STATE_FREE: u32 = 0;
const STATE_OWNED: u32 = 1;
const STATE_RELEASED: u32 = 2;
/// Entries in the objects table.
pub const MAX_OBJECTS: usize = 512;
/// Entries in the event counters table: kprobe events with a larger id keep their counters
/// in the process only.
pub const MAX_EVENTS: usize = 1024;
/// Longest path in the objects table, in bytes (the slot has one more, always 0).
pub const MAX_OBJECT_PATH: usize = 255;
/// Record type reserved for padding; [`RingWriter::write`] refuses it.
pub const RTYPE_PADDING: u16 = u16::MAX;
/// Longest record, in words, header word included.
pub const MAX_RECORD_WORDS: usize = u16::MAX as usize;

/// The producer maps its ring in ahead of its records on its first lap, by chunks that double
/// from 8 KiB up to this many bytes ([`RingWriter`]'s `populate_ahead`).
pub const POPULATE_CHUNK: u64 = 256 << 10;
/// The first populate chunk.
const POPULATE_FIRST: u64 = 8 << 10;

const PAGE: usize = 4096;
const CACHE_LINE: usize = 64;
const MAGIC_U64: u64 = u64::from_le_bytes(MAGIC);

/// One entry of the objects table.
#[repr(C)]
struct ObjectSlot {
    load_bias: AtomicU64,
    path_len: AtomicU32,
    /// 1 once the entry is taken (`set_objects`, `add_objects`).
    claimed: AtomicU32,
    path: [AtomicU8; MAX_OBJECT_PATH + 1],
}

/// The start of the memfd. Only atomics: any bit pattern is valid, and all mutation goes
/// through `UnsafeCell`, so a `&Header` over memory another process writes is sound.
#[repr(C)]
struct Header {
    magic: AtomicU64,
    version: AtomicU32,
    header_bytes: AtomicU32,
    nr_rings: AtomicU32,
    ring_bytes: AtomicU32,
    total_bytes: AtomicU64,
    clock_tsc_ref: AtomicU64,
    clock_mono_ref_ns: AtomicU64,
    clock_ns_per_tick_q32: AtomicU64,
    nr_objects: AtomicU32,
    sigtrap_passed_pid: AtomicU32,
    /// Written by the target's threads: on a cache line of its own.
    counters: CacheLine<Counters>,
    objects: [ObjectSlot; MAX_OBJECTS],
    /// Written by the target's threads on rare paths (a lost record, a missed hit), read by
    /// the CLI at the end: exact even when the target never reached its exit.
    event_counters: [EventCounters; MAX_EVENTS],
    /// Threads that had no ring, and how many events each lost.
    lost_tids: [LostTid; MAX_LOST_TIDS],
    /// Why events of `lost_no_ring` were lost (module docs).
    no_ring_kinds: NoRingKinds,
}

#[repr(C)]
struct NoRingKinds {
    lost_unreclaimed: AtomicU64,
    lost_after_end: AtomicU64,
}

/// Why a thread had no ring for an event ([`SharedRings::claim_or_why`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoRing {
    /// Every ring is owned by a thread that has not ended: more threads at once than rings.
    Owned,
    /// Some rings were released by ended threads but the reader has not read them to the end
    /// (freed) yet: threads end faster than the reader frees their rings.
    Unreclaimed,
    /// The thread released its ring already (it is ending): an event after that.
    AfterEnd,
}

#[repr(C)]
struct LostTid {
    tid: AtomicU32,
    _reserved: AtomicU32,
    lost: AtomicU64,
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
struct Counters {
    claimed: AtomicU64,
    lost_no_ring: AtomicU64,
    lost_recursion: AtomicU64,
    armed: AtomicU64,
    fgraph_overrun: AtomicU64,
    budget_used: AtomicU64,
    freed: AtomicU64,
    budget_bytes: AtomicU64,
}

#[repr(C, align(64))]
struct CacheLine<T>(T);

/// Per-ring descriptor: the producer's cache line, then the reader's.
#[repr(C)]
struct RingDesc {
    prod: CacheLine<ProducerLine>,
    tail: CacheLine<ReaderLine>,
}

/// The reader's cache line: its tail, and the owner's process id (written once, at the claim,
/// before the owner publishes its tid).
#[repr(C)]
struct ReaderLine {
    tail: AtomicU64,
    pid: AtomicU32,
}

#[repr(C)]
struct ProducerLine {
    head: AtomicU64,
    lost: AtomicU64,
    /// The producer's last view of `tail` (always <= the real one): it reloads `tail` only
    /// when this one says the ring is too full, so it rarely touches the reader's cache line.
    tail_cache: AtomicU64,
    tid: AtomicU32,
    state: AtomicU32,
    comm: [AtomicU8; 16],
    /// The reserve pointer: `head` plus what writers in progress reserved.
    reserved: AtomicU64,
    /// Bytes in use (a power of two): see the module docs.
    size: AtomicU32,
    /// Writers in progress on the owner thread (nested by signal handlers).
    nest: AtomicU32,
}

const fn round_up(x: usize, to: usize) -> usize {
    x.div_ceil(to) * to
}

/// Size of the header area in bytes (page-aligned).
pub const HEADER_BYTES: usize = round_up(size_of::<Header>(), PAGE);
const DESC_OFFSET: usize = HEADER_BYTES;
const DESC_BYTES: usize = size_of::<RingDesc>();

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
    assert!(size_of::<ObjectSlot>() == 272);
    assert!(offset_of!(ObjectSlot, load_bias) == 0);
    assert!(offset_of!(ObjectSlot, path_len) == 8);
    assert!(offset_of!(ObjectSlot, path) == 16);
    assert!(offset_of!(Header, event_counters) == 139_392);
    assert!(size_of::<EventCounters>() == 16);
    assert!(offset_of!(Header, lost_tids) == 155_776);
    assert!(size_of::<LostTid>() == 16);
    assert!(offset_of!(Header, no_ring_kinds) == 159_872);
    assert!(size_of::<Header>() == 128 + MAX_OBJECTS * 272 + MAX_EVENTS * 16 + 4096 + 64);
    assert!(HEADER_BYTES == 163_840);
    assert!(align_of::<Header>() <= PAGE);
    assert!(DESC_BYTES == 128);
    assert!(align_of::<RingDesc>() == CACHE_LINE);
    assert!(offset_of!(RingDesc, prod) == 0);
    assert!(offset_of!(RingDesc, tail) == CACHE_LINE);
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
    fn check(self) -> Result<Layout, RingError> {
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
struct Layout {
    cfg: RingConfig,
    data_offset: usize,
    total_bytes: usize,
}

/// Errors of [`SharedRings`]. None of them is produced on the probe path.
#[derive(Debug, thiserror::Error)]
pub enum RingError {
    /// `nr_rings` is 0, above [`MAX_RINGS`], or makes the memfd too large to address.
    #[error("ring count {nr_rings} is invalid: must be 1..={MAX_RINGS} and fit in memory")]
    BadRingCount {
        /// The rejected count.
        nr_rings: u32,
    },
    /// `ring_bytes` is not a power of two in [`MIN_RING_BYTES`]..=[`MAX_RING_BYTES`].
    #[error(
        "ring size {ring_bytes} bytes is invalid: must be a power of two in \
         {MIN_RING_BYTES}..={MAX_RING_BYTES}"
    )]
    BadRingBytes {
        /// The rejected size.
        ring_bytes: u32,
    },
    /// A system call failed.
    #[error("{call} failed")]
    Syscall {
        /// The call, e.g. `"mmap"`.
        call: &'static str,
        /// The `errno` it set.
        #[source]
        source: io::Error,
    },
    /// [`SharedRings::attach`]: the file is smaller than the header.
    #[error(
        "ring memfd is {len} bytes, smaller than the {HEADER_BYTES}-byte header: \
         not an ftprobe ring buffer"
    )]
    TooSmall {
        /// Size of the file.
        len: u64,
    },
    /// [`SharedRings::attach`]: the file does not start with [`MAGIC`].
    #[error(
        "ring memfd starts with \"{}\", not \"FTPRING1\": not an ftprobe ring buffer",
        .found.escape_ascii()
    )]
    BadMagic {
        /// The first 8 bytes of the file.
        found: [u8; 8],
    },
    /// [`SharedRings::attach`]: the layout version (or the header size it implies) is not
    /// this build's.
    #[error(
        "ring memfd has layout version {found} (header {header_bytes} bytes), this build reads \
         version {LAYOUT_VERSION} (header {HEADER_BYTES} bytes): CLI and agent are from \
         different builds"
    )]
    BadVersion {
        /// Version in the file.
        found: u32,
        /// Header size in the file.
        header_bytes: u32,
    },
    /// [`SharedRings::attach`]: the file size is not the one the header describes.
    #[error("ring memfd is {len} bytes but its header describes {expected} bytes")]
    SizeMismatch {
        /// Size of the file.
        len: u64,
        /// Size computed from `nr_rings` and `ring_bytes` in the header.
        expected: u64,
    },
    /// [`SharedRings::set_objects`]: more objects than table entries.
    #[error("{count} objects do not fit in the objects table ({MAX_OBJECTS} entries)")]
    TooManyObjects {
        /// Number of objects given.
        count: usize,
    },
    /// [`SharedRings::set_objects`]: a path longer than [`MAX_OBJECT_PATH`].
    #[error("object {index}: path of {len} bytes is longer than the table's {MAX_OBJECT_PATH}")]
    ObjectPathTooLong {
        /// Index of the object in the slice given.
        index: usize,
        /// Length of its path.
        len: usize,
    },
}

/// The one place where this module calls into the kernel (STYLE.md item 5).
mod sys {
    use super::RingError;
    use std::ffi::CStr;
    use std::io;
    use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
    use std::ptr::NonNull;

    fn check(call: &'static str, ret: libc::c_int) -> Result<libc::c_int, RingError> {
        if ret < 0 {
            Err(RingError::Syscall {
                call,
                source: io::Error::last_os_error(),
            })
        } else {
            Ok(ret)
        }
    }

    pub(super) fn memfd_create(name: &CStr, flags: libc::c_uint) -> Result<OwnedFd, RingError> {
        // SAFETY: `name` is a valid NUL-terminated string for the duration of the call.
        let fd = check("memfd_create", unsafe {
            libc::memfd_create(name.as_ptr(), flags)
        })?;
        // SAFETY: the kernel just returned `fd`, a new descriptor that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    pub(super) fn ftruncate(fd: BorrowedFd<'_>, len: usize) -> Result<(), RingError> {
        let len = libc::off_t::try_from(len).map_err(|_| RingError::Syscall {
            call: "ftruncate",
            source: io::Error::from_raw_os_error(libc::EFBIG),
        })?;
        // SAFETY: plain syscall on a descriptor that `fd` keeps open.
        check("ftruncate", unsafe { libc::ftruncate(fd.as_raw_fd(), len) }).map(drop)
    }

    pub(super) fn add_seals(fd: BorrowedFd<'_>, seals: libc::c_int) -> Result<(), RingError> {
        // SAFETY: F_ADD_SEALS takes an int argument; `fd` is open.
        let ret = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) };
        check("fcntl(F_ADD_SEALS)", ret).map(drop)
    }

    pub(super) fn fstat_size(fd: BorrowedFd<'_>) -> Result<u64, RingError> {
        // SAFETY: `struct stat` is plain data; all-zero is a valid value.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `st` is a valid, writable `struct stat`; `fd` is open.
        check("fstat", unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
        Ok(u64::try_from(st.st_size).unwrap_or(0))
    }

    /// Maps `len` bytes of `fd` read-write, `MAP_SHARED`. The result is page-aligned.
    pub(super) fn mmap_shared(fd: BorrowedFd<'_>, len: usize) -> Result<NonNull<u8>, RingError> {
        // SAFETY: a fresh mapping chosen by the kernel (addr NULL) replaces nothing.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(RingError::Syscall {
                call: "mmap",
                source: io::Error::last_os_error(),
            });
        }
        NonNull::new(p.cast()).ok_or(RingError::Syscall {
            call: "mmap",
            source: io::Error::from_raw_os_error(libc::EINVAL),
        })
    }

    /// # Safety
    ///
    /// `base..base+len` is a mapping made by [`mmap_shared`] that nothing references any more.
    pub(super) unsafe fn munmap(base: NonNull<u8>, len: usize) {
        // SAFETY: the caller guarantees the range is ours and unreferenced.
        let ret = unsafe { libc::munmap(base.as_ptr().cast(), len) };
        debug_assert_eq!(ret, 0, "munmap of our own mapping failed");
    }

    /// CLOCK_MONOTONIC in nanoseconds.
    pub(super) fn monotonic_ns() -> u64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec. CLOCK_MONOTONIC always exists, so the
        // call cannot fail (and on failure `ts` stays 0).
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        (ts.tv_sec as u64)
            .wrapping_mul(1_000_000_000)
            .wrapping_add(ts.tv_nsec as u64)
    }
}

/// CLOCK_MONOTONIC now, in nanoseconds (the clock [`Clock::tsc_to_mono_ns`] converts to).
pub fn monotonic_ns() -> u64 {
    sys::monotonic_ns()
}

/// The time-stamp counter: the probe path's timestamp, converted by readers with [`Clock`].
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub fn read_tsc() -> u64 {
    // SAFETY: RDTSC exists on every x86-64 CPU and has no memory effects; user space may run
    // it unless the kernel set CR4.TSD, which Linux does only for seccomp-strict tasks.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// The time-stamp counter and the CPU this thread runs on. Probe path.
///
/// Linux keeps the CPU number in the low 12 bits of `TSC_AUX`. `rdtsc` + `rdpid` (~23 ns on
/// this VM) where the CPU has `rdpid`, else `rdtscp` (~28 ns): see BENCHMARKS.md.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub fn read_tsc_cpu() -> (u64, u32) {
    if has_rdpid() {
        let aux: u64;
        // SAFETY: RDPID exists (checked by CPUID in `has_rdpid`); it only writes `aux`.
        unsafe {
            core::arch::asm!("rdpid {}", out(reg) aux, options(nomem, nostack, preserves_flags))
        };
        (read_tsc(), (aux & 0xfff) as u32)
    } else {
        let mut aux = 0u32;
        // SAFETY: RDTSCP exists on every x86-64 CPU Linux runs on (all since 2006) and only
        // writes `aux`, a local.
        let tsc = unsafe { core::arch::x86_64::__rdtscp(&mut aux) };
        (tsc, aux & 0xfff)
    }
}

/// The CPU this thread runs on, without a timestamp (for a record whose time was read
/// already): `rdpid` (~0.2 ns on this VM, against ~11 ns for `rdtsc`) where the CPU has it,
/// else `rdtscp`'s `TSC_AUX`. Probe path.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub fn read_cpu() -> u32 {
    if has_rdpid() {
        let aux: u64;
        // SAFETY: RDPID exists (checked by CPUID in `has_rdpid`); it only writes `aux`.
        unsafe {
            core::arch::asm!("rdpid {}", out(reg) aux, options(nomem, nostack, preserves_flags))
        };
        (aux & 0xfff) as u32
    } else {
        let mut aux = 0u32;
        // SAFETY: as in `read_tsc_cpu`: RDTSCP only writes `aux`, a local.
        let _ = unsafe { core::arch::x86_64::__rdtscp(&mut aux) };
        aux & 0xfff
    }
}

/// Whether the CPU has `rdpid` (CPUID.7.0:ECX bit 22), asked once; probe path after that.
#[inline(always)]
fn has_rdpid() -> bool {
    use std::sync::atomic::AtomicU8;
    static RDPID: AtomicU8 = AtomicU8::new(0); // 0 unknown, 1 no, 2 yes
    match RDPID.load(Relaxed) {
        2 => true,
        1 => false,
        _ => {
            // CPUID leaf 7 returns zeros (no rdpid) on CPUs too old to have it.
            let yes = core::arch::x86_64::__cpuid_count(7, 0).ecx & (1 << 22) != 0;
            RDPID.store(if yes { 2 } else { 1 }, Relaxed);
            yes
        }
    }
}

/// A (TSC, CLOCK_MONOTONIC) pair: the start of a calibration ([`Clock::start_calibration`]).
#[derive(Debug, Clone, Copy)]
pub struct ClockSample {
    tsc: u64,
    ns: u64,
}

/// Conversion from TSC ticks to CLOCK_MONOTONIC nanoseconds: a reference pair and a rate, stored
/// in the header by [`SharedRings::create`].
///
/// The rate is measured over 20 ms, to about 1 ppm: converted times drift from CLOCK_MONOTONIC
/// by about 1 µs per second away from the reference (which NTP slewing of CLOCK_MONOTONIC adds
/// to). Assumes an invariant TSC, synchronized across CPUs (any x86-64 of the last 15 years).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Clock {
    tsc_ref: u64,
    mono_ref_ns: u64,
    /// Nanoseconds per tick, fixed point with 32 fraction bits.
    ns_per_tick_q32: u64,
}

impl Clock {
    /// Measures the TSC rate against CLOCK_MONOTONIC over about 20 ms (sleeps).
    pub fn calibrate() -> Clock {
        Self::finish_calibration(Self::start_calibration())
    }

    /// The first half of [`calibrate`](Self::calibrate): a reference sample. The caller may
    /// do other work before [`finish_calibration`](Self::finish_calibration), which then only
    /// sleeps what remains of the 20 ms.
    pub fn start_calibration() -> ClockSample {
        let (tsc, ns) = Self::sample();
        ClockSample { tsc, ns }
    }

    /// The second half of [`calibrate`](Self::calibrate): sleeps until 20 ms have passed since
    /// `start` (if they have not), takes the second sample, and derives the rate.
    pub fn finish_calibration(start: ClockSample) -> Clock {
        const SPAN_NS: u64 = 20_000_000;
        let (tsc0, ns0) = (start.tsc, start.ns);
        let elapsed = monotonic_ns().saturating_sub(ns0);
        if elapsed < SPAN_NS {
            std::thread::sleep(std::time::Duration::from_nanos(SPAN_NS - elapsed));
        }
        let (tsc1, ns1) = Self::sample();
        let ticks = u128::from(tsc1.wrapping_sub(tsc0).max(1));
        let ns = u128::from(ns1.saturating_sub(ns0));
        let q32 = u64::try_from((ns << 32) / ticks).unwrap_or(u64::MAX);
        Clock {
            tsc_ref: tsc1,
            mono_ref_ns: ns1,
            ns_per_tick_q32: q32,
        }
    }

    /// A (tsc, monotonic ns) pair taken as close together as this CPU allows: the best of a few
    /// tries, the clock read bracketed by two TSC reads, attributed to their midpoint.
    fn sample() -> (u64, u64) {
        let mut best = (u64::MAX, 0, 0);
        for _ in 0..16 {
            let t0 = read_tsc();
            let ns = monotonic_ns();
            let t1 = read_tsc();
            let width = t1.wrapping_sub(t0);
            if width < best.0 {
                best = (width, t0.wrapping_add(width / 2), ns);
            }
        }
        (best.1, best.2)
    }

    /// CLOCK_MONOTONIC nanoseconds at TSC value `tsc`.
    pub fn tsc_to_mono_ns(&self, tsc: u64) -> u64 {
        let ticks = i128::from(tsc) - i128::from(self.tsc_ref);
        let ns = i128::from(self.mono_ref_ns) + ((ticks * i128::from(self.ns_per_tick_q32)) >> 32);
        u64::try_from(ns.max(0)).unwrap_or(u64::MAX)
    }

    /// The measured TSC frequency in Hz.
    pub fn tsc_hz(&self) -> u64 {
        let hz = (1_000_000_000u128 << 32) / u128::from(self.ns_per_tick_q32.max(1));
        u64::try_from(hz).unwrap_or(u64::MAX)
    }

    /// The conversion's numbers: the reference TSC, the reference CLOCK_MONOTONIC ns, and ns
    /// per tick with 32 fraction bits (what a recording stores).
    pub fn to_parts(&self) -> [u64; 3] {
        [self.tsc_ref, self.mono_ref_ns, self.ns_per_tick_q32]
    }

    /// The conversion [`to_parts`](Self::to_parts) gave.
    pub fn from_parts(parts: [u64; 3]) -> Clock {
        Clock {
            tsc_ref: parts[0],
            mono_ref_ns: parts[1],
            ns_per_tick_q32: parts[2],
        }
    }
}

/// A read-write `MAP_SHARED` mapping, unmapped on drop.
struct Mapping {
    base: NonNull<u8>,
    len: usize,
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `base..base+len` came from `mmap_shared`; everything that borrows from it
        // (`&Header`, writers, readers) borrows the `SharedRings` that owns `self`, so none is
        // left.
        unsafe { sys::munmap(self.base, self.len) }
    }
}

/// The rings of one trace, mapped in this process.
pub struct SharedRings {
    map: Mapping,
    layout: Layout,
}

// SAFETY: the mapping is process-wide memory, valid until `drop`, and this type hands out
// access to it only through atomics; no thread-local state.
unsafe impl Send for SharedRings {}
// SAFETY: as above: all shared access is through atomic types.
unsafe impl Sync for SharedRings {}

impl fmt::Debug for SharedRings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedRings")
            .field("base", &self.map.base)
            .field("len", &self.map.len)
            .field("config", &self.layout.cfg)
            .finish()
    }
}

impl SharedRings {
    /// CLI side: creates the memfd (inherited across `exec`: no `MFD_CLOEXEC`), sizes and seals
    /// it, maps it, writes the header with a freshly calibrated [`Clock`] (takes ~20 ms).
    pub fn create(cfg: RingConfig) -> Result<(Self, OwnedFd), RingError> {
        let (rings, fd) = Self::create_uncalibrated(cfg)?;
        rings.set_clock(Clock::calibrate());
        Ok((rings, fd))
    }

    /// [`create`](Self::create) without the ~20 ms clock calibration: the header's clock is
    /// zero until [`set_clock`](Self::set_clock). The agent never reads the clock (it writes
    /// raw TSC values), so the CLI calibrates while its target starts.
    pub fn create_uncalibrated(cfg: RingConfig) -> Result<(Self, OwnedFd), RingError> {
        cfg.check()?;
        let fd = sys::memfd_create(c"ftprobe-rings", libc::MFD_ALLOW_SEALING)?;
        let rings = Self::create_on(fd_ref(&fd), cfg)?;
        Ok((rings, fd))
    }

    /// [`create_uncalibrated`](Self::create_uncalibrated) in an empty memfd made elsewhere
    /// (with `MFD_ALLOW_SEALING`): attach has the target make it, and opens it through
    /// `/proc/PID/fd/N`, so that the target needs no access to ftprobe's process.
    pub fn create_on(fd: BorrowedFd<'_>, cfg: RingConfig) -> Result<Self, RingError> {
        let layout = cfg.check()?;
        sys::ftruncate(fd, layout.total_bytes)?;
        sys::add_seals(
            fd,
            libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL,
        )?;
        let base = sys::mmap_shared(fd, layout.total_bytes)?;
        let rings = SharedRings {
            map: Mapping {
                base,
                len: layout.total_bytes,
            },
            layout,
        };
        let h = rings.header();
        h.version.store(LAYOUT_VERSION, Relaxed);
        h.header_bytes.store(HEADER_BYTES as u32, Relaxed);
        h.nr_rings.store(cfg.nr_rings, Relaxed);
        h.ring_bytes.store(cfg.ring_bytes, Relaxed);
        h.total_bytes.store(layout.total_bytes as u64, Relaxed);
        h.counters
            .0
            .budget_bytes
            .store(layout.cfg.budget_bytes, Relaxed);
        // Release: publishes the fields above; pairs with the Acquire load in `attach`.
        h.magic.store(MAGIC_U64, Release);
        Ok(rings)
    }

    /// Store `clock` in the header (what [`clock`](Self::clock) returns from then on).
    pub fn set_clock(&self, clock: Clock) {
        let h = self.header();
        h.clock_tsc_ref.store(clock.tsc_ref, Relaxed);
        h.clock_mono_ref_ns.store(clock.mono_ref_ns, Relaxed);
        h.clock_ns_per_tick_q32
            .store(clock.ns_per_tick_q32, Relaxed);
    }

    /// Agent side: maps the memfd `fd` and checks magic, version and sizes.
    pub fn attach(fd: BorrowedFd<'_>) -> Result<Self, RingError> {
        let len = sys::fstat_size(fd)?;
        if len < HEADER_BYTES as u64 {
            return Err(RingError::TooSmall { len });
        }
        let map_len =
            usize::try_from(len).map_err(|_| RingError::SizeMismatch { len, expected: 0 })?;
        let base = sys::mmap_shared(fd, map_len)?;
        let map = Mapping { base, len: map_len };
        // SAFETY: `map` is page-aligned and at least HEADER_BYTES long (checked above).
        let h = unsafe { header_at(&map) };
        // Acquire: pairs with the Release store of `magic` in `create`.
        let magic = h.magic.load(Acquire);
        if magic != MAGIC_U64 {
            return Err(RingError::BadMagic {
                found: magic.to_le_bytes(),
            });
        }
        let (version, header_bytes) = (h.version.load(Relaxed), h.header_bytes.load(Relaxed));
        if version != LAYOUT_VERSION || header_bytes as usize != HEADER_BYTES {
            return Err(RingError::BadVersion {
                found: version,
                header_bytes,
            });
        }
        let cfg = RingConfig {
            nr_rings: h.nr_rings.load(Relaxed),
            ring_bytes: h.ring_bytes.load(Relaxed),
            budget_bytes: h.counters.0.budget_bytes.load(Relaxed),
        };
        // From here on only this validated copy of the sizes is used, never the header's.
        let layout = cfg.check()?;
        let expected = layout.total_bytes as u64;
        if expected != len || h.total_bytes.load(Relaxed) != len {
            return Err(RingError::SizeMismatch { len, expected });
        }
        Ok(SharedRings { map, layout })
    }

    /// The sizes (validated at `create` / `attach`).
    pub fn config(&self) -> RingConfig {
        self.layout.cfg
    }

    fn header(&self) -> &Header {
        // SAFETY: `create` and `attach` only build a `SharedRings` whose mapping is
        // page-aligned and at least HEADER_BYTES long.
        unsafe { header_at(&self.map) }
    }

    fn desc(&self, i: u32) -> Option<&RingDesc> {
        if i >= self.layout.cfg.nr_rings {
            return None;
        }
        let off = DESC_OFFSET + i as usize * DESC_BYTES;
        // SAFETY: `i < nr_rings`, so `off + DESC_BYTES <= data_offset <= len` (from
        // `RingConfig::check`, which the mapping's length was matched against); `off` is a
        // multiple of 64 from a page-aligned base; `RingDesc` holds only atomics.
        Some(unsafe { &*self.map.base.as_ptr().add(off).cast::<RingDesc>() })
    }

    fn data(&self, i: u32) -> Option<&[AtomicU64]> {
        if i >= self.layout.cfg.nr_rings {
            return None;
        }
        let ring_bytes = self.layout.cfg.ring_bytes as usize;
        let off = self.layout.data_offset + i as usize * ring_bytes;
        // SAFETY: `i < nr_rings`, so `off + ring_bytes <= total_bytes == len`; `off` is a
        // multiple of 4096 from a page-aligned base; `AtomicU64` accepts any bits.
        Some(unsafe {
            std::slice::from_raw_parts(
                self.map.base.as_ptr().add(off).cast::<AtomicU64>(),
                ring_bytes / 8,
            )
        })
    }

    /// Probe path, async-signal-safe: takes a free ring for thread `tid` (never 0) named
    /// `comm`, of the calling process (its pid is stored with the tid, one raw syscall), at
    /// its initial size. `None` when all rings are owned; the caller then counts each event it
    /// drops with [`note_lost_no_ring`](Self::note_lost_no_ring).
    ///
    /// The writer is for this thread only (and signal handlers that interrupt it, which nest:
    /// module docs). The thread gives the ring back with [`release`](Self::release) when it
    /// ends. After `fork` the child must claim a ring of its own.
    pub fn claim(&self, tid: u32, comm: [u8; 16]) -> Option<RingWriter<'_>> {
        self.claim_or_why(tid, comm).ok()
    }

    /// [`claim`](Self::claim), saying why there was no ring: [`NoRing::Owned`] when every
    /// ring was owned by a live thread, [`NoRing::Unreclaimed`] when some were released by
    /// ended threads and not freed yet. Probe path, async-signal-safe.
    pub fn claim_or_why(&self, tid: u32, comm: [u8; 16]) -> Result<RingWriter<'_>, NoRing> {
        let n = self.layout.cfg.nr_rings;
        let c = &self.header().counters.0;
        let mut released = false;
        // From ring 0: the first free ring (a freed ring's pages are gone, as a fresh one's),
        // so the rings in use stay at the low indices (module docs).
        for i in 0..n {
            let Some(desc) = self.desc(i) else { break };
            // Acquire: pairs with the Release store of STATE_FREE in `free_released`: the
            // reader's zeroing of the descriptor happens before our writes to it.
            let state = desc.prod.0.state.load(Relaxed);
            if state == STATE_RELEASED {
                released = true;
            }
            if state != STATE_FREE
                || desc
                    .prod
                    .0
                    .state
                    .compare_exchange(STATE_FREE, STATE_OWNED, Acquire, Relaxed)
                    .is_err()
            {
                continue;
            }
            let Some(data) = self.data(i) else { break };
            let init = self.layout.cfg.init_bytes();
            // Relaxed: a statistic of sizes; the reader subtracts what it frees.
            c.budget_used.fetch_add(u64::from(init), Relaxed);
            c.claimed.fetch_max(u64::from(i) + 1, Relaxed);
            let p = &desc.prod.0;
            p.size.store(init, Relaxed);
            for (slot, byte) in p.comm.iter().zip(comm) {
                slot.store(byte, Relaxed);
            }
            desc.tail.0.pid.store(crate::sys::getpid(), Relaxed);
            // Release: publishes `comm`, `size` and `pid`; pairs with the Acquire load in
            // `SharedRings::owner`.
            p.tid.store(tid, Release);
            return Ok(RingWriter {
                ring: desc,
                data,
                budget: c,
            });
        }
        Err(if released {
            NoRing::Unreclaimed
        } else {
            NoRing::Owned
        })
    }

    /// Probe path (a thread's end): give `w`'s ring back. The owner writes nothing into it
    /// after this; the reader frees it once it has read it all.
    pub fn release(&self, w: RingWriter<'_>) {
        // Release: every record published before happens before the reader sees the state.
        w.desc().state.store(STATE_RELEASED, Release);
        // Relaxed: a hint for threads without a ring (the kind of their loss may change).
        self.header().counters.0.freed.fetch_add(1, Relaxed);
    }

    /// Reader side: ring `i`'s owner now, (tid, comm, released); `None` while it is free.
    pub fn owner(&self, i: u32) -> Option<(u32, [u8; 16], bool)> {
        let p = &self.desc(i)?.prod.0;
        // Acquire: pairs with the Release store in `claim`.
        let tid = p.tid.load(Acquire);
        if tid == 0 {
            return None;
        }
        let mut comm = [0u8; 16];
        for (o, b) in comm.iter_mut().zip(&p.comm) {
            *o = b.load(Relaxed);
        }
        Some((tid, comm, p.state.load(Relaxed) == STATE_RELEASED))
    }

    /// Reader side: the process id of ring `i`'s owner (0 while it is free, or from an agent
    /// that did not say); read it after [`owner`](Self::owner) saw the owner.
    pub fn owner_pid(&self, i: u32) -> u32 {
        // Relaxed: published by the claim's Release store of `tid` (read by `owner` first).
        self.desc(i).map_or(0, |d| d.tail.0.pid.load(Relaxed))
    }

    /// Reader side: if ring `i` was released by its owner and everything in it was read,
    /// free it for another thread: its memory goes back to the system and to the budget.
    /// Returns the owner's (tid, comm, lost) then, `None` when the ring is not ready.
    pub fn free_released(&self, i: u32) -> Option<(u32, [u8; 16], u64)> {
        let desc = self.desc(i)?;
        let p = &desc.prod.0;
        // Acquire: pairs with `release`: the owner's last `head` is visible.
        if p.state.load(Acquire) != STATE_RELEASED {
            return None;
        }
        if p.head.load(Acquire) != desc.tail.0.tail.load(Relaxed) {
            return None;
        }
        let (tid, comm, _) = self.owner(i)?;
        let lost = p.lost.load(Relaxed);
        let size = u64::from(p.size.load(Relaxed));
        if let Some(data) = self.data(i) {
            // Every page the owner or this reader may have touched: the owner writes and
            // populates within `size`, the reader prefaults within it.
            let touched = size
                .next_multiple_of(PAGE as u64)
                .min(data.len() as u64 * 8);
            if touched > 0 {
                // SAFETY: the range is the start of ring i's data area in our shared
                // mapping; its owner released it and writes nothing more; MADV_REMOVE frees
                // the memfd's pages (they read as zeros after).
                unsafe {
                    libc::madvise(
                        data.as_ptr() as *mut libc::c_void,
                        touched as usize,
                        libc::MADV_REMOVE,
                    )
                };
            }
        }
        for w in [
            &p.head,
            &p.lost,
            &p.tail_cache,
            &p.reserved,
            &desc.tail.0.tail,
        ] {
            w.store(0, Relaxed);
        }
        for b in &p.comm {
            b.store(0, Relaxed);
        }
        p.size.store(0, Relaxed);
        p.nest.store(0, Relaxed);
        p.tid.store(0, Relaxed);
        desc.tail.0.pid.store(0, Relaxed);
        let c = &self.header().counters.0;
        // Relaxed: a statistic of sizes (see `claim`).
        let _ = c
            .budget_used
            .fetch_update(Relaxed, Relaxed, |u| Some(u.saturating_sub(size)));
        // Release: the zeroed descriptor before the state; pairs with `claim`'s Acquire.
        p.state.store(STATE_FREE, Release);
        // Relaxed: a hint for threads without a ring (they try `claim` again).
        c.freed.fetch_add(1, Relaxed);
        Some((tid, comm, lost))
    }

    /// Rings released or freed so far ([`release`](Self::release),
    /// [`free_released`](Self::free_released)): a thread without a ring tries to claim one
    /// again when this moved.
    #[inline(always)]
    pub fn freed(&self) -> u64 {
        // Relaxed: a hint.
        self.header().counters.0.freed.load(Relaxed)
    }

    /// Bytes the owned rings' sizes add up to now.
    pub fn budget_used(&self) -> u64 {
        // Relaxed: a statistic.
        self.header().counters.0.budget_used.load(Relaxed)
    }

    /// Ring `i`'s size now (0 while it is free).
    pub fn ring_size(&self, i: u32) -> Option<u32> {
        // Relaxed: a statistic.
        Some(self.desc(i)?.prod.0.size.load(Relaxed))
    }

    /// Control path (a thread's first event without a ring): the entry of `lost_tids` for
    /// `tid`, taken now; `u32::MAX` when the table is full (then only the total counts).
    pub fn lost_slot(&self, tid: u32) -> u32 {
        for (k, e) in self.header().lost_tids.iter().enumerate() {
            // Relaxed: the entry's own counter is all that is published with it.
            match e.tid.compare_exchange(0, tid, Relaxed, Relaxed) {
                Ok(_) => return k as u32,
                Err(t) if t == tid => return k as u32,
                Err(_) => {}
            }
        }
        u32::MAX
    }

    /// Probe path: counts one event dropped because its thread has no ring, in the total and
    /// in the thread's entry `slot` ([`lost_slot`](Self::lost_slot)).
    pub fn note_lost_no_ring(&self, slot: u32) {
        self.note_lost_no_ring_as(slot, NoRing::Owned);
    }

    /// Probe path: [`note_lost_no_ring`](Self::note_lost_no_ring), counted as of kind `why`
    /// too.
    pub fn note_lost_no_ring_as(&self, slot: u32, why: NoRing) {
        let h = self.header();
        // Relaxed: statistics.
        match why {
            NoRing::Owned => {}
            NoRing::Unreclaimed => {
                h.no_ring_kinds.lost_unreclaimed.fetch_add(1, Relaxed);
            }
            NoRing::AfterEnd => {
                h.no_ring_kinds.lost_after_end.fetch_add(1, Relaxed);
            }
        }
        // Relaxed: statistics, read with `lost_no_ring` and `lost_by_tid`.
        h.counters.0.lost_no_ring.fetch_add(1, Relaxed);
        if let Some(e) = h.lost_tids.get(slot as usize) {
            e.lost.fetch_add(1, Relaxed);
        }
    }

    /// The threads that had no ring, (tid, events lost), in the order they lost their first.
    pub fn lost_by_tid(&self) -> Vec<(u32, u64)> {
        self.header()
            .lost_tids
            .iter()
            // Relaxed: statistics.
            .map(|e| (e.tid.load(Relaxed), e.lost.load(Relaxed)))
            .filter(|&(t, n)| t != 0 && n != 0)
            .collect()
    }

    /// Probe path: count `n` events a tracer dropped because it was already running on the
    /// thread (a signal handler interrupted it, or its own code hit a traced function).
    pub fn note_lost_recursion(&self, n: u64) {
        // Relaxed: a statistic, read with `lost_recursion`.
        self.header()
            .counters
            .0
            .lost_recursion
            .fetch_add(n, Relaxed);
    }

    /// Events dropped by recursion guards so far.
    pub fn lost_recursion(&self) -> u64 {
        // Relaxed: a statistic (see `note_lost_recursion`).
        self.header().counters.0.lost_recursion.load(Relaxed)
    }

    /// Events dropped because their thread had no ring.
    pub fn lost_no_ring(&self) -> u64 {
        // Relaxed: a statistic, pairs with nothing (see `note_lost_no_ring`).
        self.header().counters.0.lost_no_ring.load(Relaxed)
    }

    /// Of [`lost_no_ring`](Self::lost_no_ring): (events lost while some rings were released
    /// and not freed yet, events of threads after they released their ring).
    pub fn lost_no_ring_kinds(&self) -> (u64, u64) {
        let k = &self.header().no_ring_kinds;
        // Relaxed: statistics.
        (
            k.lost_unreclaimed.load(Relaxed),
            k.lost_after_end.load(Relaxed),
        )
    }

    /// Probe path: `n` calls the function_graph tracer could not hook (the thread's shadow
    /// stack was full: the kernel's `overrun`).
    pub fn note_fgraph_overrun(&self, n: u64) {
        // Relaxed: a statistic, read with `fgraph_overrun`.
        self.header()
            .counters
            .0
            .fgraph_overrun
            .fetch_add(n, Relaxed);
    }

    /// Calls the function_graph tracer could not hook ([`SharedRings::note_fgraph_overrun`]).
    pub fn fgraph_overrun(&self) -> u64 {
        // Relaxed: a statistic.
        self.header().counters.0.fgraph_overrun.load(Relaxed)
    }

    /// Agent side: everything asked for is armed (after the last probe, filter and tracer
    /// were set up). Until then the reader prints nothing: a process stopped because a
    /// definition could not be armed leaves no trace that looks like one.
    pub fn set_armed(&self) {
        // Release: pairs with `armed`'s Acquire; what was written before is visible then.
        self.header().counters.0.armed.store(1, Release);
    }

    /// Whether the agent armed everything ([`SharedRings::set_armed`]).
    pub fn armed(&self) -> bool {
        // Acquire: pairs with `set_armed`.
        self.header().counters.0.armed.load(Acquire) != 0
    }

    /// The shared counters of kprobe event `id`; `None` past [`MAX_EVENTS`]. The agent
    /// counts into them (relaxed increments), the CLI reads them at the end.
    pub fn event_counters(&self, id: u32) -> Option<&EventCounters> {
        self.header().event_counters.get(id as usize)
    }

    /// Probe path (the SIGTRAP handler): process `pid` is about to die of a SIGTRAP that
    /// ftprobe's handler saw and passed to SIGTRAP's default action (the program's own
    /// trap). A program killed by SIGTRAP that did not note it here was killed by a trap
    /// the handler never saw: SIGTRAP was blocked.
    pub fn note_sigtrap_passed(&self, pid: u32) {
        // Relaxed: read by the CLI after the process died (its exit orders it).
        self.header().sigtrap_passed_pid.store(pid, Relaxed);
    }

    /// The last process that noted [`SharedRings::note_sigtrap_passed`] (0: none).
    pub fn sigtrap_passed_pid(&self) -> u32 {
        // Relaxed: see `note_sigtrap_passed`.
        self.header().sigtrap_passed_pid.load(Relaxed)
    }

    /// Rings owned so far are among `0..claimed()` (at most `nr_rings`): the readers' bound.
    pub fn claimed(&self) -> u32 {
        // Relaxed: an index bound; each ring's own identity is published by its `tid`.
        let n = self.header().counters.0.claimed.load(Relaxed);
        n.min(u64::from(self.layout.cfg.nr_rings)) as u32
    }

    /// Agent side, once at start before any event: the loaded objects, as (load bias, path).
    /// Fails, writing nothing, when there are more than [`MAX_OBJECTS`] or a path is longer
    /// than [`MAX_OBJECT_PATH`].
    pub fn set_objects(&self, objs: &[(u64, &[u8])]) -> Result<(), RingError> {
        if objs.len() > MAX_OBJECTS {
            return Err(RingError::TooManyObjects { count: objs.len() });
        }
        if let Some((index, (_, p))) = objs
            .iter()
            .enumerate()
            .find(|(_, (_, p))| p.len() > MAX_OBJECT_PATH)
        {
            return Err(RingError::ObjectPathTooLong {
                index,
                len: p.len(),
            });
        }
        let h = self.header();
        for (slot, &(bias, path)) in h.objects.iter().zip(objs) {
            // Claimed, for `add_objects`.
            slot.claimed.store(1, Relaxed);
            slot.load_bias.store(bias, Relaxed);
            slot.path_len.store(path.len() as u32, Relaxed);
            for (dst, &b) in slot.path.iter().zip(path) {
                dst.store(b, Relaxed);
            }
        }
        // Release: publishes the entries; pairs with the Acquire load in `objects`.
        h.nr_objects.store(objs.len() as u32, Release);
        Ok(())
    }

    /// Agent side, while the program runs: objects loaded later (`dlopen`), appended to the
    /// table after those already there (an entry is never changed once published: readers
    /// take the last entry that covers an address). Several processes (a forked child) may
    /// append at once: each entry is claimed first (its `reserved` word, 0 -> 1), and
    /// `nr_objects` moves past it only after the entries before it are published. Returns how
    /// many were added (fewer when the table is full or a path is too long, those left out).
    pub fn add_objects(&self, objs: &[(u64, &[u8])]) -> usize {
        let h = self.header();
        let mut added = 0;
        for &(bias, path) in objs {
            if path.len() > MAX_OBJECT_PATH {
                continue;
            }
            // Acquire: pairs with the Release store below (and in `set_objects`).
            let start = (h.nr_objects.load(Acquire) as usize).min(MAX_OBJECTS);
            let Some(i) = (start..MAX_OBJECTS).find(|&i| {
                h.objects[i]
                    .claimed
                    .compare_exchange(0, 1, Relaxed, Relaxed)
                    .is_ok()
            }) else {
                break;
            };
            let slot = &h.objects[i];
            slot.load_bias.store(bias, Relaxed);
            slot.path_len.store(path.len() as u32, Relaxed);
            for (dst, &b) in slot.path.iter().zip(path) {
                dst.store(b, Relaxed);
            }
            // The entries before this one are published by their writers in order; bounded,
            // so that a writer that died between its claim and its publication stops nobody.
            for _ in 0..1_000_000 {
                // Release: publishes this entry; pairs with the Acquire load in `objects`.
                if h.nr_objects
                    .compare_exchange(i as u32, i as u32 + 1, Release, Relaxed)
                    .is_ok()
                {
                    added += 1;
                    break;
                }
                std::thread::yield_now();
            }
        }
        added
    }

    /// CLI side: the objects table written by [`set_objects`](Self::set_objects).
    pub fn objects(&self) -> Vec<(u64, Vec<u8>)> {
        let h = self.header();
        // Acquire: pairs with the Release store in `set_objects`.
        let n = (h.nr_objects.load(Acquire) as usize).min(MAX_OBJECTS);
        h.objects
            .iter()
            .take(n)
            .map(|slot| {
                let len = (slot.path_len.load(Relaxed) as usize).min(MAX_OBJECT_PATH);
                let path = slot
                    .path
                    .iter()
                    .take(len)
                    .map(|b| b.load(Relaxed))
                    .collect();
                (slot.load_bias.load(Relaxed), path)
            })
            .collect()
    }

    /// The TSC conversion written by [`create`](Self::create).
    pub fn clock(&self) -> Clock {
        let h = self.header();
        // Relaxed: written before `magic`'s Release store, which `attach` Acquire-loaded (or
        // this process wrote them itself).
        Clock {
            tsc_ref: h.clock_tsc_ref.load(Relaxed),
            mono_ref_ns: h.clock_mono_ref_ns.load(Relaxed),
            ns_per_tick_q32: h.clock_ns_per_tick_q32.load(Relaxed),
        }
    }

    /// Ring `i`'s head: the bytes its producer has written since the ring was claimed (0 for
    /// an unclaimed ring).
    pub fn head(&self, i: u32) -> Option<u64> {
        // Relaxed: a progress hint for `prefault`, not a claim on the records.
        Some(self.desc(i)?.prod.0.head.load(Relaxed))
    }

    /// Reader side: fault in ring `i`'s data bytes `[from, from + len)` (clipped to the ring)
    /// through this mapping, with `MADV_POPULATE_WRITE` (Linux 5.14+). The memfd's pages are
    /// then allocated and zeroed here, on the reader's CPU, and the producer's first write to
    /// each is a minor fault instead of an allocation. Best effort: false when the kernel
    /// refused (an older kernel, no memory); nothing is lost, the producer faults pages in
    /// as before.
    pub fn prefault(&self, i: u32, from: u64, len: u64) -> bool {
        const MADV_POPULATE_WRITE: libc::c_int = 23;
        let Some(data) = self.data(i) else {
            return false;
        };
        let ring_bytes = (data.len() * 8) as u64;
        let page = 4096;
        let from = from.min(ring_bytes) & !(page - 1);
        let len = len.min(ring_bytes - from);
        if len == 0 {
            return true;
        }
        let ptr = data.as_ptr().wrapping_add((from / 8) as usize) as *mut libc::c_void;
        // SAFETY: [ptr, ptr + len) lies inside ring i's data area of our shared mapping
        // (clipped above; `from` is page-aligned, as the data area is); populating changes
        // no contents.
        unsafe { libc::madvise(ptr, len as usize, MADV_POPULATE_WRITE) == 0 }
    }

    /// CLI side: the reader of ring `i`; `None` if `i >= nr_rings`. One reader per ring at a
    /// time (two would read the same records).
    pub fn reader(&self, i: u32) -> Option<RingReader<'_>> {
        let (desc, data) = (self.desc(i)?, self.data(i)?);
        Some(RingReader {
            prod: &desc.prod.0,
            tail_slot: &desc.tail.0.tail,
            pid_slot: &desc.tail.0.pid,
            data,
            // Acquire: pairs with the Release store of an earlier reader's `drain`.
            tail: desc.tail.0.tail.load(Acquire),
            scratch: Vec::new(),
            corrupt_bytes: 0,
        })
    }
}

/// # Safety
///
/// `map` is page-aligned and at least [`HEADER_BYTES`] long.
unsafe fn header_at(map: &Mapping) -> &Header {
    debug_assert!(map.len >= HEADER_BYTES);
    // SAFETY: per the contract, the memory is in bounds and aligned (4096 >= align of
    // Header); `Header` holds only atomics, for which every bit pattern is valid and shared
    // mutation is allowed; the borrow is tied to `map`, which unmaps only on drop.
    unsafe { &*map.base.as_ptr().cast::<Header>() }
}

fn fd_ref(fd: &OwnedFd) -> BorrowedFd<'_> {
    use std::os::fd::AsFd;
    fd.as_fd()
}

#[inline(always)]
const fn record_header(nwords: usize, rtype: u16) -> u64 {
    (nwords as u64 & 0xffff) | ((rtype as u64) << 16)
}

const fn record_header_aux(nwords: usize, rtype: u16, aux: u32) -> u64 {
    record_header(nwords, rtype) | ((aux as u64) << 32)
}

/// The producer end of one ring: `Copy`, no allocation, no lock, no syscall (but the
/// first-lap populate), no panic; async-signal-safe, and re-entrant from a signal handler on
/// the owner thread (module docs: writers nest). Borrowing the [`SharedRings`] keeps the
/// mapping alive: the agent keeps its `SharedRings` in a `static`, so its writers are
/// `RingWriter<'static>`.
#[derive(Clone, Copy)]
pub struct RingWriter<'a, const IN_SECTION: bool = false> {
    ring: &'a RingDesc,
    /// The ring's whole address space (`ring_bytes / 8` words, the most `size` may grow to);
    /// `size` bytes are in use.
    data: &'a [AtomicU64],
    budget: &'a Counters,
}

impl<const S: bool> fmt::Debug for RingWriter<'_, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RingWriter")
            .field("data", &self.data.as_ptr())
            .field("size", &self.desc().size.load(Relaxed))
            .finish()
    }
}

/// `*p = new` if `*p == old`, in one `cmpxchg` without a lock prefix: atomic against a
/// signal handler of this thread (an instruction is never interrupted half-way), and cheap;
/// the producer line is written by this thread only.
#[inline(always)]
fn cmpxchg_local(p: &AtomicU64, old: u64, new: u64) -> bool {
    let ok: u8;
    // SAFETY: `p` is a valid, aligned 8-byte location (an AtomicU64 of our mapping); cmpxchg
    // reads and writes only it, rax and the flags. No other thread writes it while this one
    // owns the ring (the reader writes it only when the ring is free).
    unsafe {
        std::arch::asm!(
            "cmpxchg qword ptr [{p}], {new}",
            "sete {ok}",
            p = in(reg) p.as_ptr(),
            new = in(reg) new,
            ok = out(reg_byte) ok,
            inout("rax") old => _,
            options(nostack),
        )
    };
    ok != 0
}

/// Stops the compiler from moving memory accesses across it (no instruction): what a signal
/// handler of this thread observes is program order.
#[inline(always)]
fn signal_fence() {
    std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
}

/// A writer inside a section the caller began ([`RingWriter::in_section`]): its writes
/// neither begin nor commit, the section's commit publishes them.
pub type SectionWriter<'a> = RingWriter<'a, true>;

impl<'a, const IN_SECTION: bool> RingWriter<'a, IN_SECTION> {
    /// The producer's line of the descriptor.
    #[inline(always)]
    fn desc(&self) -> &ProducerLine {
        &self.ring.prod.0
    }

    /// Writes one record: the header word, then `words`. Returns false, and counts one in
    /// this ring's `lost`, when it does not fit in the free space (the newest event is dropped,
    /// never one already written), when `words.len() + 1 > MAX_RECORD_WORDS` or the ring, or
    /// when `rtype` is [`RTYPE_PADDING`].
    #[inline]
    pub fn write(&self, rtype: u16, words: &[u64]) -> bool {
        self.write_aux(rtype, 0, words)
    }

    /// [`write`](Self::write) with a 32-bit `aux` value in the header word, read back by
    /// [`RingReader::drain_aux`].
    #[inline]
    pub fn write_aux(&self, rtype: u16, aux: u32, words: &[u64]) -> bool {
        self.write_with(rtype, aux, words.len(), |body| {
            for (slot, &w) in body.iter().zip(words) {
                slot.store(w, Relaxed);
            }
        })
    }

    /// Write a record of `payload_words` words that `fill` stores directly into the ring
    /// (`slot.store(value, Relaxed)`): no buffer on the caller's stack, which matters on a
    /// probe path that may run on a small stack (a signal stack, a coroutine's). Same
    /// semantics as [`write`](Self::write); `fill` runs only if there is room.
    #[inline]
    pub fn write_with(
        &self,
        rtype: u16,
        aux: u32,
        payload_words: usize,
        fill: impl FnOnce(&[AtomicU64]),
    ) -> bool {
        self.try_write_with(rtype, aux, payload_words, fill) || self.drop_one()
    }

    /// [`write_with`](Self::write_with) that does not count a record that does not fit.
    #[inline(always)]
    fn try_write_with(
        &self,
        rtype: u16,
        aux: u32,
        payload_words: usize,
        fill: impl FnOnce(&[AtomicU64]),
    ) -> bool {
        let nwords = payload_words + 1;
        if nwords > MAX_RECORD_WORDS || rtype == RTYPE_PADDING {
            return false;
        }
        if !IN_SECTION {
            self.begin();
        }
        let ok = match self.reserve(nwords).and_then(|start| {
            self.data
                .get(start..start + nwords)
                .and_then(|s| s.split_first())
        }) {
            Some((hdr, body)) => {
                hdr.store(record_header_aux(nwords, rtype, aux), Relaxed);
                fill(body);
                self.point(hook::FILLED);
                true
            }
            None => false,
        };
        if !IN_SECTION {
            self.commit();
        }
        ok
    }

    /// Control path: [`write_aux`](Self::write_aux) that, when the record does not fit, leaves
    /// `lost` alone and returns false, for a caller that will try again once the reader has
    /// made room (the agent's counters at exit, which must not be counted as a lost event).
    pub fn try_write_aux(&self, rtype: u16, aux: u32, words: &[u64]) -> bool {
        self.try_write_with(rtype, aux, words.len(), |body| {
            for (slot, &w) in body.iter().zip(words) {
                slot.store(w, Relaxed);
            }
        })
    }

    /// [`write`](Self::write) of exactly three payload words (the function tracer's
    /// timestamp, ip, parent ip), without a loop.
    #[inline]
    pub fn write3(&self, rtype: u16, a: u64, b: u64, c: u64) -> bool {
        self.write3_aux(rtype, 0, a, b, c)
    }

    /// [`write3`](Self::write3) with a 32-bit `aux` value in the header word (the CPU, for
    /// the function tracer), read back by [`RingReader::drain_aux`].
    #[inline]
    pub fn write3_aux(&self, rtype: u16, aux: u32, a: u64, b: u64, c: u64) -> bool {
        self.write_n_aux(rtype, aux, [a, b, c])
    }

    /// The ring's head plus its `lost` count: changes with every record the outermost writer
    /// publishes or this ring drops. Two loads of the producer's own cache line.
    #[inline(always)]
    pub fn mark(&self) -> u64 {
        // Relaxed: only this producer stores either.
        self.desc()
            .head
            .load(Relaxed)
            .wrapping_add(self.desc().lost.load(Relaxed))
    }

    /// [`write_aux`](Self::write_aux) of a fixed number of payload words, inlined without a
    /// loop or a closure (the function_graph tracer's two records, one per event).
    #[inline(always)]
    pub fn write_n_aux<const N: usize>(&self, rtype: u16, aux: u32, words: [u64; N]) -> bool {
        if N + 1 > MAX_RECORD_WORDS || rtype == RTYPE_PADDING {
            return self.drop_one();
        }
        if !IN_SECTION {
            self.begin();
        }
        let ok = match self.reserve(N + 1).and_then(|start| {
            self.data
                .get(start..start + N + 1)
                .and_then(|s| s.split_first())
        }) {
            Some((hdr, body)) => {
                hdr.store(record_header_aux(N + 1, rtype, aux), Relaxed);
                for (slot, w) in body.iter().zip(words) {
                    slot.store(w, Relaxed);
                }
                self.point(hook::FILLED);
                true
            }
            None => false,
        };
        if !IN_SECTION {
            self.commit();
        }
        ok || self.drop_one()
    }

    /// Start a write (or a group of writes that publish together): one more writer on the
    /// ring. Returns the writers already in progress (0: this is the outermost); a nested
    /// writer's repair also needs [`reserved`](Self::reserved) as it is now (see
    /// [`abandon`](Self::abandon)). Each `begin` is paired with one [`commit`](Self::commit).
    #[inline(always)]
    pub fn begin(&self) -> u32 {
        // Relaxed load and store: a handler that interrupts between them runs whole writes
        // (begin and commit) and leaves `nest` as it found it.
        let n = self.desc().nest.load(Relaxed);
        self.desc().nest.store(n.wrapping_add(1), Relaxed);
        signal_fence();
        self.point(hook::BEGUN);
        n
    }

    /// The reserve pointer: where the next record goes.
    #[inline(always)]
    pub fn reserved(&self) -> u64 {
        // Relaxed: the owner thread's own value.
        self.desc().reserved.load(Relaxed)
    }

    /// End a write begun with [`begin`](Self::begin): the outermost writer publishes
    /// everything reserved, nested ones included (module docs).
    #[inline(always)]
    pub fn commit(&self) {
        loop {
            let n = self.desc().nest.load(Relaxed);
            if n != 1 {
                // Nested: the outermost writer publishes.
                self.desc().nest.store(n.wrapping_sub(1), Relaxed);
                signal_fence();
                return;
            }
            let r = self.desc().reserved.load(Relaxed);
            self.point(hook::COMMIT_LOADED);
            // Release: publishes the records' words; pairs with the Acquire load in
            // `RingReader::drain_aux`.
            self.desc().head.store(r, Release);
            signal_fence();
            self.point(hook::PUBLISHED);
            self.desc().nest.store(0, Relaxed);
            signal_fence();
            self.point(hook::UNNESTED);
            // A handler that ran between the load of `reserved` and the store of `nest` saw
            // a writer in progress and did not publish: publish its records now.
            if self.desc().reserved.load(Relaxed) == r {
                return;
            }
            self.desc().nest.store(1, Relaxed);
            signal_fence();
        }
    }

    /// This writer inside a section begun with [`begin`](Self::begin): its writes are
    /// published by the section's [`commit`](Self::commit), not each by itself.
    #[inline(always)]
    pub fn in_section(self) -> SectionWriter<'a> {
        RingWriter {
            ring: self.ring,
            data: self.data,
            budget: self.budget,
        }
    }

    /// Tests: a nested writer (a simulated signal handler) at point `p` of a write.
    #[inline(always)]
    fn point(&self, _p: u32) {
        #[cfg(test)]
        hook::fire(
            &RingWriter {
                ring: self.ring,
                data: self.data,
                budget: self.budget,
            },
            _p,
        );
    }

    /// Writers in progress on this ring (nested).
    #[inline(always)]
    pub fn nesting(&self) -> u32 {
        // Relaxed: the owner thread's own value.
        self.desc().nest.load(Relaxed)
    }

    /// Repair after a non-local exit (`crate::probe_state`): the writers from `level` on (as
    /// [`begin`](Self::begin) numbered them) were abandoned; `reserved_at` is what `begin`
    /// returned for the writer at `level`. Their records are never published: the reserve
    /// pointer goes back to where they began (to `head` when no writer is left).
    pub fn abandon(&self, level: u32, reserved_at: u64) {
        // Relaxed: only this thread writes the producer line.
        let head = self.desc().head.load(Relaxed);
        let back = if level == 0 {
            head
        } else {
            // A live writer below `level` reserved nothing after `reserved_at` (it was
            // interrupted): going back there is safe, never below what was published.
            let cur = self.desc().reserved.load(Relaxed);
            if reserved_at.wrapping_sub(head) <= cur.wrapping_sub(head) {
                reserved_at
            } else {
                cur
            }
        };
        self.desc().reserved.store(back, Relaxed);
        self.desc().nest.store(level, Relaxed);
        signal_fence();
    }

    /// Finds room for `nwords` words at the reserve pointer and writes the padding word if
    /// the record has to go to offset 0. Returns the record's first word index.
    #[inline(always)]
    fn reserve(&self, nwords: usize) -> Option<usize> {
        let need = nwords as u64 * 8;
        loop {
            // Relaxed: only this thread (and its signal handlers) store these.
            let r = self.desc().reserved.load(Relaxed);
            // A size that is not a power of two (only a scribbled line has one) gives
            // positions that `data.get` refuses or that are wrong but in bounds.
            let size = u64::from(self.desc().size.load(Relaxed));
            if r <= size && r + need > size {
                // The first lap's end (the ring never wrapped: `reserved` is at most `size`):
                // the outermost writer grows the ring instead of wrapping, while the budget
                // lets it; a nested one never wraps it first.
                if self.nesting() > 1 {
                    return None;
                }
                if self.grow(size) {
                    continue;
                }
            }
            let pos = r & size.wrapping_sub(1);
            let to_end = size.wrapping_sub(pos);
            let (start, total) = if need <= to_end {
                (pos, need)
            } else {
                (0, to_end + need)
            };
            if !self.has_room(r, total, size) {
                return None;
            }
            let new = r.wrapping_add(total);
            self.point(hook::RESERVING);
            if !cmpxchg_local(&self.desc().reserved, r, new) {
                // A signal handler reserved in between: again from its end.
                continue;
            }
            self.point(hook::RESERVED);
            if start != pos {
                let pad = self.data.get((pos / 8) as usize)?;
                pad.store(record_header(0, RTYPE_PADDING), Relaxed);
            }
            // First lap only (the counter is the position): entering a new chunk maps the
            // next one in.
            // Chunks start at multiples of 8 KiB: most records cross no such line.
            if new <= size
                && (r == 0 || (r ^ new) >= POPULATE_FIRST)
                && (r == 0 || populate_chunk_index(r) != populate_chunk_index(new))
            {
                let k = populate_chunk_index(new);
                let from = if r == 0 {
                    0
                } else {
                    populate_chunk_start(k + 1)
                };
                self.populate(from, populate_chunk_start(k + 2).min(size));
            }
            return Some((start / 8) as usize);
        }
    }

    /// The outermost writer at the end of the first lap: double the ring's size if the budget
    /// and `ring_bytes` allow. Out of line: once per doubling.
    #[cold]
    #[inline(never)]
    fn grow(&self, size: u64) -> bool {
        let new = size * 2;
        if size == 0 || new > self.data.len() as u64 * 8 {
            return false;
        }
        // Relaxed: written once by the reader before the target started.
        let budget = self.budget.budget_bytes.load(Relaxed);
        // Relaxed: the budget is a sum of sizes, not a publication. A locked instruction,
        // but once per doubling, not per event.
        let took = self.budget.budget_used.fetch_update(Relaxed, Relaxed, |u| {
            let u2 = u.checked_add(size)?;
            (u2 <= budget).then_some(u2)
        });
        if took.is_err() {
            return false;
        }
        // Relaxed: published to the reader by the Release store of `head` that publishes the
        // first record past the old size.
        self.desc().size.store(new as u32, Relaxed);
        // The records go on into the new half: map its first chunk in.
        self.populate(size, size + size.min(POPULATE_CHUNK));
        true
    }

    /// Producer, first lap: map bytes `[from, to)` of the ring into this process with one
    /// `MADV_POPULATE_WRITE` (Linux 5.14+), so that the writes into them take no page fault:
    /// at the first record the first two chunks, on entering a chunk the next one (within the
    /// ring's size), on a doubling the new half's first chunk. Chunks double from 8 KiB to
    /// [`POPULATE_CHUNK`]: a thread with a few events maps a few pages, a busy one makes one
    /// system call per [`POPULATE_CHUNK`] (one fault per 4 KiB page cost ~2-4 us on this VM).
    /// Best effort and async-signal-safe (one raw system call); after a refusal (an older
    /// kernel, a seccomp filter) it is not tried again in this process.
    #[cold]
    #[inline(never)]
    fn populate(&self, from: u64, to: u64) {
        static REFUSED: AtomicU8 = AtomicU8::new(0);
        if REFUSED.load(Relaxed) != 0 {
            return;
        }
        let to = to.min(self.data.len() as u64 * 8);
        if from >= to {
            return;
        }
        const MADV_POPULATE_WRITE: u64 = 23;
        let addr = self.data.as_ptr() as u64 + from;
        // SAFETY: [addr, addr + len) lies inside this ring's data area of our shared mapping
        // (page-aligned: the data area is, and so are `from` and `to`); populating changes no
        // contents; a raw syscall: no errno, no lock.
        let ret = unsafe {
            crate::sys::raw_syscall4(libc::SYS_madvise, addr, to - from, MADV_POPULATE_WRITE, 0)
        };
        if ret < 0 && ret != -(libc::EINTR as i64) && ret != -(libc::EAGAIN as i64) {
            REFUSED.store(1, Relaxed);
        }
    }

    #[inline(always)]
    fn has_room(&self, reserved: u64, total: u64, size: u64) -> bool {
        // A tail "ahead" of the reserve pointer or more than a ring behind (a corrupted
        // reader) means full.
        let fits = |tail: u64| {
            let free = size.checked_sub(reserved.wrapping_sub(tail));
            free.is_some_and(|free| total <= free)
        };
        // Relaxed: the producer's own copy of a value it loaded with Acquire below.
        if fits(self.desc().tail_cache.load(Relaxed)) {
            return true;
        }
        // Acquire: pairs with the Release store in `RingReader::drain`: the reader's loads of
        // the bytes it freed happen before our stores that reuse them.
        let tail = self.ring.tail.0.tail.load(Acquire);
        // Relaxed: producer-private.
        self.desc().tail_cache.store(tail, Relaxed);
        fits(tail)
    }

    #[cold]
    fn drop_one(&self) -> bool {
        // Relaxed: a statistic, read by `RingReader::lost`. The owner thread's own counter,
        // but a signal handler may drop one in between a load and a store: a locked add, on
        // the (cold) dropping path only.
        self.desc().lost.fetch_add(1, Relaxed);
        false
    }
}

/// The points of a write where the tests let a "signal handler" write (`RingWriter::point`).
mod hook {
    pub(super) const BEGUN: u32 = 1;
    pub(super) const RESERVING: u32 = 2;
    pub(super) const RESERVED: u32 = 3;
    pub(super) const FILLED: u32 = 4;
    pub(super) const COMMIT_LOADED: u32 = 5;
    pub(super) const PUBLISHED: u32 = 6;
    pub(super) const UNNESTED: u32 = 7;

    /// A nested write, run at a point.
    #[cfg(test)]
    pub(super) type Nested = fn(&super::RingWriter<'_>);

    #[cfg(test)]
    thread_local! {
        /// The point to fire at (once), and the nested write to run there.
        pub(super) static AT: std::cell::Cell<(u32, Option<Nested>)> =
            const { std::cell::Cell::new((0, None)) };
    }

    #[cfg(test)]
    pub(super) fn fire(w: &super::RingWriter<'_>, p: u32) {
        let (at, f) = AT.get();
        if at == p {
            if let Some(f) = f {
                AT.set((0, None));
                f(w);
            }
        }
    }
}

/// The populate chunk that byte `at` of a ring's first lap is in: 0 for [0, 8K), 1 for
/// [8K, 16K), 2 for [16K, 32K), ... doubling up to [`POPULATE_CHUNK`], then one per
/// [`POPULATE_CHUNK`].
#[inline(always)]
fn populate_chunk_index(at: u64) -> u64 {
    // Chunk k >= 1 starts at POPULATE_FIRST << (k - 1) while that is below POPULATE_CHUNK.
    const DOUBLINGS: u64 = (POPULATE_CHUNK / POPULATE_FIRST).trailing_zeros() as u64;
    if at < POPULATE_FIRST {
        0
    } else if at < POPULATE_CHUNK {
        1 + u64::from(63 - (at / POPULATE_FIRST).leading_zeros())
    } else {
        1 + DOUBLINGS + (at - POPULATE_CHUNK) / POPULATE_CHUNK
    }
}

/// The first byte of populate chunk `k` ([`populate_chunk_index`]).
fn populate_chunk_start(k: u64) -> u64 {
    const DOUBLINGS: u64 = (POPULATE_CHUNK / POPULATE_FIRST).trailing_zeros() as u64;
    if k == 0 {
        0
    } else if k <= DOUBLINGS {
        POPULATE_FIRST << (k - 1)
    } else {
        POPULATE_CHUNK + (k - 1 - DOUBLINGS) * POPULATE_CHUNK
    }
}

/// The consumer end of one ring (CLI side).
pub struct RingReader<'a> {
    prod: &'a ProducerLine,
    tail_slot: &'a AtomicU64,
    pid_slot: &'a AtomicU32,
    data: &'a [AtomicU64],
    /// This reader's tail; published to `tail_slot` at the end of each `drain`.
    tail: u64,
    scratch: Vec<u64>,
    corrupt_bytes: u64,
}

impl fmt::Debug for RingReader<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RingReader")
            .field("tid", &self.tid())
            .field("tail", &self.tail)
            .field("corrupt_bytes", &self.corrupt_bytes)
            .finish()
    }
}

impl RingReader<'_> {
    /// Thread id of the ring's owner; 0 while unclaimed (or claimed but not yet published).
    pub fn tid(&self) -> u32 {
        // Acquire: pairs with the Release store in `SharedRings::claim`.
        self.prod.tid.load(Acquire)
    }

    /// The owner's `comm` as given to `claim` (valid once `tid() != 0`).
    pub fn comm(&self) -> [u8; 16] {
        let mut out = [0u8; 16];
        // Relaxed: published by `tid`'s Release store (load `tid()` first).
        for (o, b) in out.iter_mut().zip(&self.prod.comm) {
            *o = b.load(Relaxed);
        }
        out
    }

    /// The owner's process id (valid once `tid() != 0`; 0 from an agent that did not say).
    pub fn pid(&self) -> u32 {
        // Relaxed: published by `tid`'s Release store (load `tid()` first).
        self.pid_slot.load(Relaxed)
    }

    /// Records the producer dropped because the ring was full.
    pub fn lost(&self) -> u64 {
        // Relaxed: a statistic (see `RingWriter::drop_one`).
        self.prod.lost.load(Relaxed)
    }

    /// Bytes skipped because they did not parse as records (a buggy or hostile writer): after
    /// such bytes the reader resynchronizes at the producer's `head`, which is always a record
    /// boundary. 0 with a correct writer.
    pub fn corrupt_bytes(&self) -> u64 {
        self.corrupt_bytes
    }

    /// Calls `f(rtype, payload)` for every record published so far, then frees their space.
    /// Returns the number of records.
    pub fn drain(&mut self, mut f: impl FnMut(u16, &[u64])) -> usize {
        self.drain_aux(|rtype, _aux, words| f(rtype, words))
    }

    /// [`drain`](Self::drain), also passing each record's `aux` header bits:
    /// `f(rtype, aux, payload)`.
    pub fn drain_aux(&mut self, f: impl FnMut(u16, u32, &[u64])) -> usize {
        let mut scratch = std::mem::take(&mut self.scratch);
        let n = self.drain_aux_in(&mut scratch, f);
        self.scratch = scratch;
        n
    }

    /// [`drain_aux`](Self::drain_aux) that copies the records through `scratch` (cleared
    /// first), a buffer the caller keeps from drain to drain: a reader made for one drain
    /// then does not allocate (and fault in) a buffer of the ring's size each time.
    pub fn drain_aux_in(
        &mut self,
        scratch: &mut Vec<u64>,
        f: impl FnMut(u16, u32, &[u64]),
    ) -> usize {
        self.drain_aux_in_max(scratch, u64::MAX, f)
    }

    /// [`drain_aux_in`](Self::drain_aux_in) of at most about `max_bytes` of records (whole
    /// records: it stops at the first record past that many bytes; at least one): a reader
    /// that keeps up in pieces holds a piece, not a whole ring.
    pub fn drain_aux_in_max(
        &mut self,
        scratch: &mut Vec<u64>,
        max_bytes: u64,
        mut f: impl FnMut(u16, u32, &[u64]),
    ) -> usize {
        scratch.clear();
        let mut count = 0;
        self.drain_words(scratch, max_bytes, |words| {
            let mut at = 0;
            while at < words.len() {
                let hdr = words[at];
                let len = (hdr & 0xffff) as usize;
                f(
                    (hdr >> 16) as u16,
                    (hdr >> 32) as u32,
                    &words[at + 1..at + len],
                );
                at += len;
                count += 1;
            }
        });
        count
    }

    /// Bulk form of [`drain`](Self::drain): copies every record published so far, as the ring
    /// holds them (header word `len | rtype << 16 | aux << 32`, then the payload; no padding),
    /// to the end of `buf`, checked record by record, and frees their space. Returns the
    /// number of records. What does not parse is skipped and counted in
    /// [`corrupt_bytes`](Self::corrupt_bytes).
    pub fn drain_raw(&mut self, buf: &mut Vec<u64>) -> usize {
        self.drain_raw_max(buf, u64::MAX)
    }

    /// [`drain_raw`](Self::drain_raw) of at most about `max_bytes` of records (as
    /// [`drain_aux_in_max`](Self::drain_aux_in_max)).
    pub fn drain_raw_max(&mut self, buf: &mut Vec<u64>, max_bytes: u64) -> usize {
        let mut count = 0;
        self.drain_words(buf, max_bytes, |words| {
            let mut at = 0;
            while at < words.len() {
                at += (words[at] & 0xffff) as usize;
                count += 1;
            }
        });
        count
    }

    /// Copy the published records to the end of `buf` (the words as they are in the ring,
    /// padding left out), checking each header against what was published; call `f` with
    /// the valid records (whole records only: what this call appended); then free their
    /// space.
    /// Stops after about `max_bytes` of records (at a record's start: module docs of
    /// [`drain_aux_in_max`](Self::drain_aux_in_max)); the rest stays for the next drain.
    fn drain_words(&mut self, buf: &mut Vec<u64>, max_bytes: u64, f: impl FnOnce(&[u64])) {
        let base = buf.len();
        // Acquire: pairs with the Release store in `RingWriter::commit`: the record words
        // before `head` (and the ring's `size`) are visible.
        let head = self.prod.head.load(Acquire);
        // Relaxed: published by `head` (Acquire above).
        let size = u64::from(self.prod.size.load(Relaxed));
        let avail = head.wrapping_sub(self.tail);
        if avail == 0 {
            return;
        }
        if avail > u64::MAX / 2 {
            // `head` behind the tail: the ring was freed and claimed again under this reader
            // (or the producer line was scribbled over). Nothing to read from it.
            return;
        }
        if !size.is_power_of_two() || size > self.data.len() as u64 * 8 {
            self.resync(head, avail);
            self.tail_slot.store(self.tail, Release);
            return;
        }
        if avail > size || avail % 8 != 0 {
            self.resync(head, avail);
        }
        // Copy the whole span (at most two pieces: before and after the wrap) with relaxed
        // loads, then walk the copy: what is checked is what is handed out.
        let mut t = self.tail;
        // Bytes of records taken so far, and where a drain limited by `max_bytes` stopped.
        let mut taken: u64 = 0;
        let mut stop: Option<u64> = None;
        while t != head {
            let left = head.wrapping_sub(t);
            let pos = t & (size - 1);
            let to_end = size - pos;
            let idx = (pos / 8) as usize;
            let piece = left.min(to_end);
            // A limited drain copies what it may take, plus room for one whole record past
            // it (so that it stops at a record's start, not inside one).
            let room = max_bytes
                .saturating_sub(taken)
                .saturating_add(MAX_RECORD_WORDS as u64 * 8);
            let copy = piece.min(room);
            let cut_short = copy < piece;
            let Some(words) = self.data.get(idx..idx + (copy / 8) as usize) else {
                break;
            };
            let from = buf.len();
            buf.extend(words.iter().map(|w| w.load(Relaxed)));
            // Walk this piece's records.
            let mut at = from;
            let mut end = buf.len();
            let mut skip_to_end = false;
            while at < end {
                if taken >= max_bytes {
                    stop = Some(t.wrapping_add(((at - from) * 8) as u64));
                    end = at;
                    break;
                }
                let hdr = buf[at];
                let len = (hdr & 0xffff) as usize;
                let rtype = (hdr >> 16) as u16;
                if rtype == RTYPE_PADDING {
                    // Padding runs to the end of `size`: valid only if the records go on at 0.
                    if to_end > left {
                        self.corrupt_bytes =
                            self.corrupt_bytes.wrapping_add(((end - at) * 8) as u64);
                        end = at;
                        t = head;
                        break;
                    }
                    end = at;
                    skip_to_end = true;
                    break;
                }
                if len != 0 && at + len > end && cut_short {
                    // Runs past what this limited drain copied: the next drain takes it.
                    stop = Some(t.wrapping_add(((at - from) * 8) as u64));
                    end = at;
                    break;
                }
                if len == 0 || at + len > end {
                    // Runs past what was published, or no length: skip to `head`.
                    self.corrupt_bytes = self.corrupt_bytes.wrapping_add(((end - at) * 8) as u64);
                    end = at;
                    t = head;
                    break;
                }
                at += len;
                taken += 8 * len as u64;
            }
            buf.truncate(end);
            if cut_short && stop.is_none() && !skip_to_end && t != head {
                // Every copied record taken: the rest of the piece is for the next drain.
                stop = Some(t.wrapping_add(copy));
            }
            if t == head || stop.is_some() {
                break;
            }
            t = t.wrapping_add(if skip_to_end { to_end } else { piece });
        }
        self.tail = stop.unwrap_or(head);
        f(&buf[base..]);
        // Release: our loads of the consumed words happen before the producer reuses them;
        // pairs with the Acquire load in `RingWriter::has_room`.
        self.tail_slot.store(self.tail, Release);
    }

    #[cold]
    fn resync(&mut self, head: u64, skipped: u64) {
        self.corrupt_bytes = self.corrupt_bytes.wrapping_add(skipped);
        self.tail = head;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsFd, AsRawFd};

    const COMM: [u8; 16] = *b"worker-1\0\0\0\0\0\0\0\0";

    fn rings(nr_rings: u32, ring_bytes: u32) -> SharedRings {
        SharedRings::create(RingConfig {
            nr_rings,
            ring_bytes,
            budget_bytes: 0,
        })
        .expect("create")
        .0
    }

    fn drain_all(r: &mut RingReader<'_>) -> Vec<(u16, Vec<u64>)> {
        let mut out = Vec::new();
        r.drain(|t, w| out.push((t, w.to_vec())));
        out
    }

    fn head_of(r: &RingReader<'_>) -> u64 {
        r.prod.head.load(Relaxed)
    }

    #[test]
    fn round_trip_exact_values() {
        let sr = rings(2, 4096);
        let w = sr.claim(1234, COMM).unwrap();
        assert!(w.write(7, &[1, 2, 3]));
        assert!(w.write(8, &[]));
        assert!(w.write3(9, 10, 11, 12));
        let mut r = sr.reader(0).unwrap();
        assert_eq!(r.tid(), 1234);
        assert_eq!(r.comm(), COMM);
        assert_eq!(
            drain_all(&mut r),
            vec![(7, vec![1, 2, 3]), (8, vec![]), (9, vec![10, 11, 12])]
        );
        assert_eq!(head_of(&r), (4 + 1 + 4) * 8);
        assert_eq!(r.lost(), 0);
        assert_eq!(r.corrupt_bytes(), 0);
        assert_eq!(drain_all(&mut r), vec![]);
        // Raw words as the layout doc says: len | rtype << 16, then the payload.
        let d = sr.data(0).unwrap();
        let words: Vec<u64> = d[..9].iter().map(|w| w.load(Relaxed)).collect();
        assert_eq!(
            words,
            [4 | 7 << 16, 1, 2, 3, 1 | 8 << 16, 4 | 9 << 16, 10, 11, 12]
        );
    }

    #[test]
    fn write_n_aux_writes_header_aux_and_words() {
        let sr = rings(1, 4096);
        let w = sr.claim(1, COMM).unwrap();
        assert!(w.write_n_aux(5, 0x0003_0001, [7, 8]));
        assert!(w.write_n_aux(6, 2, [1, 2, 3, 4]));
        let d = sr.data(0).unwrap();
        let words: Vec<u64> = d[..8].iter().map(|w| w.load(Relaxed)).collect();
        assert_eq!(
            words,
            [
                record_header_aux(3, 5, 0x0003_0001),
                7,
                8,
                record_header_aux(5, 6, 2),
                1,
                2,
                3,
                4
            ]
        );
        let mut r = sr.reader(0).unwrap();
        assert_eq!(
            drain_all(&mut r),
            vec![(5, vec![7, 8]), (6, vec![1, 2, 3, 4])]
        );
    }

    /// Whether the page at byte `off` of ring 0's data area is in the memfd's page cache.
    fn page_present(sr: &SharedRings, off: usize) -> bool {
        let p = sr.data(0).unwrap().as_ptr() as usize + off;
        let mut v = 0u8;
        // SAFETY: one page of our mapping, page-aligned; mincore writes one byte.
        let r = unsafe { libc::mincore(p as *mut libc::c_void, 4096, &mut v) };
        assert_eq!(r, 0, "mincore");
        v & 1 != 0
    }

    /// The producer maps the chunk ahead of its writes in on its first lap (one
    /// MADV_POPULATE_WRITE per chunk instead of one page fault per page), chunks doubling with
    /// the ring: at the first record its first 16 KiB (its initial size), no more; when it
    /// doubles, the new half's first chunk.
    #[test]
    fn producer_maps_the_next_chunk_in_on_its_first_lap() {
        if !rings(1, 4096).prefault(0, 0, 4096) {
            eprintln!("skipped: MADV_POPULATE_WRITE refused (kernel < 5.14?)");
            return;
        }
        let sr = rings(1, 1 << 20);
        let w = sr.claim(1, COMM).unwrap();
        assert!(!page_present(&sr, 12 << 10), "fresh memfd");
        assert!(w.write_n_aux(5, 0, [1, 2]));
        assert!(
            page_present(&sr, 12 << 10),
            "the first 16 KiB at the first record"
        );
        assert!(!page_present(&sr, 16 << 10), "not past the initial size");
        assert_eq!(sr.ring_size(0), Some(16 << 10));
        // Past 16 KiB: the ring doubled (first lap) and its new half is mapped.
        let mut r = sr.reader(0).unwrap();
        while head_of(&r) < (16 << 10) + 64 {
            assert!(w.write_n_aux(5, 0, [0; 7]));
            r.drain(|_, _| {});
        }
        assert_eq!(sr.ring_size(0), Some(32 << 10));
        assert!(page_present(&sr, 28 << 10));
        assert!(!page_present(&sr, 32 << 10));
        // Into the 256 KiB chunks: the next one is mapped ahead.
        while head_of(&r) < (256 << 10) + 64 {
            assert!(w.write_n_aux(5, 0, [0; 7]));
            r.drain(|_, _| {});
        }
        assert_eq!(sr.ring_size(0), Some(512 << 10));
        assert!(page_present(&sr, (512 << 10) - 4096));
        assert!(!page_present(&sr, 512 << 10));
    }

    /// Many records of lengths 1..=13 words across ~40 wraps of a 4 KiB ring, drained every few
    /// records; checks every value and the head against a model of the padding rule.
    #[test]
    fn wrap_around_with_padding_mixed_lengths() {
        let sr = rings(1, 4096);
        let w = sr.claim(1, COMM).unwrap();
        let mut r = sr.reader(0).unwrap();
        let (mut model_head, mut pads, mut seq) = (0u64, 0, 0u64);
        let mut expected = Vec::new();
        let mut got = Vec::new();
        for i in 0..20_000u64 {
            let payload_len = (i % 13) as usize;
            let payload: Vec<u64> = (0..payload_len as u64).map(|k| seq * 100 + k).collect();
            let need = (payload_len as u64 + 1) * 8;
            let to_end = 4096 - model_head % 4096;
            if need > to_end {
                model_head += to_end;
                pads += 1;
            }
            model_head += need;
            let rtype = (i % 5) as u16;
            assert!(w.write(rtype, &payload), "record {i}");
            expected.push((rtype, payload));
            seq += 1;
            if i % 7 == 6 {
                r.drain(|t, p| got.push((t, p.to_vec())));
                assert_eq!(head_of(&r), model_head);
            }
        }
        r.drain(|t, p| got.push((t, p.to_vec())));
        assert_eq!(got.len(), 20_000);
        assert_eq!(got, expected);
        assert_eq!(head_of(&r), model_head);
        assert!(
            pads > 30 && model_head > 40 * 4096,
            "pads {pads} head {model_head}"
        );
        assert_eq!((r.lost(), r.corrupt_bytes()), (0, 0));
    }

    #[test]
    fn limited_drains_take_every_record_once_in_pieces() {
        // A ring large enough that a limited drain copies only part of what is there (it
        // copies the limit plus one largest record's room), across wraps.
        let sr = rings(1, 4 << 20);
        let w = sr.claim(1, COMM).unwrap();
        let mut r = sr.reader(0).unwrap();
        let (mut expected, mut got) = (Vec::new(), Vec::new());
        let mut scratch = Vec::new();
        let mut seq = 0u64;
        let mut drains = 0;
        for _ in 0..8 {
            for _ in 0..50_000 {
                let payload: Vec<u64> = (0..seq % 13).map(|k| seq * 100 + k).collect();
                let rtype = (seq % 5) as u16;
                assert!(w.write(rtype, &payload), "record {seq}");
                expected.push((rtype, payload));
                seq += 1;
            }
            // A 4 KiB limit: each drain stops at a record's start past 4 KiB.
            loop {
                let n = r.drain_aux_in_max(&mut scratch, 4096, |t, _, p| got.push((t, p.to_vec())));
                drains += 1;
                assert!(
                    scratch.len() * 8 <= 4096 + MAX_RECORD_WORDS * 8,
                    "{}",
                    scratch.len()
                );
                if n == 0 {
                    break;
                }
            }
        }
        assert_eq!(got.len(), expected.len());
        assert_eq!(got, expected);
        assert!(drains > 1000, "{drains}");
        assert_eq!((r.lost(), r.corrupt_bytes()), (0, 0));
    }

    #[test]
    fn record_of_whole_ring_and_too_large() {
        let sr = rings(1, 4096);
        let w = sr.claim(1, COMM).unwrap();
        let mut r = sr.reader(0).unwrap();
        let big: Vec<u64> = (0..511).collect();
        assert!(w.write(3, &big));
        assert!(!w.write(3, &[]), "ring is exactly full");
        assert_eq!(drain_all(&mut r), vec![(3, big.clone())]);
        let too_big: Vec<u64> = (0..512).collect();
        assert!(!w.write(3, &too_big));
        assert!(!w.write(RTYPE_PADDING, &[1]));
        assert!(!w.write3(RTYPE_PADDING, 1, 2, 3));
        assert_eq!(r.lost(), 4);
        // After a wrap to a non-zero position, a whole-ring record needs padding too.
        assert!(w.write(1, &[42]));
        assert_eq!(drain_all(&mut r), vec![(1, vec![42])]);
        assert!(!w.write(3, &big), "needs 4096 + padding");
        assert!(w.write(3, &big[..509]), "4080 bytes fit before the end");
        assert_eq!(drain_all(&mut r), vec![(3, big[..509].to_vec())]);
        assert_eq!(r.lost(), 5);
    }

    #[test]
    fn full_ring_drops_newest_and_counts() {
        let sr = rings(1, 4096);
        let w = sr.claim(1, COMM).unwrap();
        let mut r = sr.reader(0).unwrap();
        // 4-word records: exactly 128 fit in 4096 bytes.
        let ok: Vec<bool> = (0..200u64).map(|i| w.write3(5, i, i * 2, i * 3)).collect();
        assert_eq!(ok.iter().filter(|&&b| b).count(), 128);
        assert!(ok[..128].iter().all(|&b| b) && ok[128..].iter().all(|&b| !b));
        assert_eq!(r.lost(), 72);
        let got = drain_all(&mut r);
        let want: Vec<(u16, Vec<u64>)> = (0..128u64).map(|i| (5, vec![i, i * 2, i * 3])).collect();
        assert_eq!(got, want);
        // Space is back; the count stays.
        assert!(w.write(6, &[99]));
        assert_eq!(drain_all(&mut r), vec![(6, vec![99])]);
        assert_eq!(r.lost(), 72);
    }

    #[test]
    fn concurrent_producer_and_reader_million() {
        const N: u64 = 1_000_000;
        let sr = rings(1, 4096);
        let w = sr.claim(1, COMM).unwrap();
        let mut r = sr.reader(0).unwrap();
        std::thread::scope(|s| {
            let producer = s.spawn(move || {
                let mut fails = 0u64;
                for n in 0..N {
                    // Lengths 2..=6 words, so padding happens often.
                    let extra = (n % 5) as usize;
                    let payload = [n; 5];
                    while !w.write(1, &payload[..=extra]) {
                        fails += 1;
                        std::hint::spin_loop();
                    }
                }
                fails
            });
            let mut next = 0u64;
            let mut bad = 0u64;
            while next < N {
                r.drain(|t, p| {
                    let extra = (next % 5) as usize;
                    if t != 1 || p.len() != extra + 1 || p.iter().any(|&x| x != next) {
                        bad += 1;
                    }
                    next += 1;
                });
            }
            let fails = producer.join().unwrap();
            assert_eq!(bad, 0);
            assert_eq!(next, N);
            assert_eq!(r.drain(|_, _| {}), 0);
            assert_eq!(r.lost(), fails);
            assert_eq!(r.corrupt_bytes(), 0);
        });
    }

    /// Runs in a forked child: only async-signal-safe work, then `_exit`.
    fn child_write(fd: i32, n: u64, tid: u32, kill_self: bool) -> ! {
        // SAFETY: `fd` is the memfd the parent created before forking; the child has its own
        // copy of the descriptor table, and the descriptor stays open while it runs.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        let code = match SharedRings::attach(fd) {
            Ok(sr) => match sr.claim(tid, *b"child\0\0\0\0\0\0\0\0\0\0\0") {
                Some(w) => {
                    let mut code = 0;
                    for i in 0..n {
                        if !w.write(2, &[i, !i]) {
                            code = 3;
                        }
                    }
                    code
                }
                None => 2,
            },
            Err(_) => 1,
        };
        if kill_self {
            // SAFETY: plain syscalls; the process dies here, as in a crash.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        // SAFETY: `_exit` ends the child without running the parent's atexit handlers.
        unsafe { libc::_exit(code) }
    }

    /// The child's pid and wait status.
    fn fork_child(fd: i32, n: u64, tid: u32, kill_self: bool) -> (u32, libc::c_int) {
        // SAFETY: the child runs only `child_write` (syscalls, atomics, no allocation on
        // the success path) and leaves with `_exit`/SIGKILL.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
        if pid == 0 {
            child_write(fd, n, tid, kill_self);
        }
        let mut status = 0;
        // SAFETY: waits for our own child; `status` is a valid out-pointer.
        let ret = unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(ret, pid);
        (pid as u32, status)
    }

    #[test]
    fn cross_process_dead_writer_loses_nothing() {
        const N: u64 = 400; // 400 records × 24 bytes fit in 16 KiB: no reader runs meanwhile
        let (sr, fd) = SharedRings::create(RingConfig {
            nr_rings: 4,
            ring_bytes: 16384,
            budget_bytes: 0,
        })
        .unwrap();
        // Inherited across exec: no FD_CLOEXEC.
        // SAFETY: F_GETFD on an open descriptor.
        let fd_flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFD) };
        assert_eq!(fd_flags & libc::FD_CLOEXEC, 0);

        let (_, status) = fork_child(fd.as_raw_fd(), N, 4242, false);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
        let (_, status) = fork_child(fd.as_raw_fd(), 100, 4343, true);
        assert!(libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGKILL);

        assert_eq!(sr.claimed(), 2);
        let mut r0 = sr.reader(0).unwrap();
        assert_eq!((r0.tid(), &r0.comm()[..6]), (4242, &b"child\0"[..]));
        let got = drain_all(&mut r0);
        let want: Vec<(u16, Vec<u64>)> = (0..N).map(|i| (2, vec![i, !i])).collect();
        assert_eq!(got, want);
        let mut r1 = sr.reader(1).unwrap();
        assert_eq!(r1.tid(), 4343);
        assert_eq!(drain_all(&mut r1).len(), 100);
        assert_eq!((r0.lost(), r1.lost()), (0, 0));
    }

    #[test]
    fn a_ring_says_the_pid_of_the_process_that_claimed_it() {
        let (sr, fd) = SharedRings::create(RingConfig {
            nr_rings: 2,
            ring_bytes: 4096,
            budget_bytes: 0,
        })
        .unwrap();
        let (child, status) = fork_child(fd.as_raw_fd(), 1, 4242, false);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
        let _w = sr.claim(4343, COMM).unwrap();
        let (r0, r1) = (sr.reader(0).unwrap(), sr.reader(1).unwrap());
        assert_eq!((r0.tid(), r0.pid()), (4242, child));
        assert_eq!((r1.tid(), r1.pid()), (4343, std::process::id()));
        assert_ne!(child, std::process::id());
    }

    #[test]
    fn create_seals_size() {
        let (_sr, fd) = SharedRings::create(RingConfig {
            nr_rings: 1,
            ring_bytes: 4096,
            budget_bytes: 0,
        })
        .unwrap();
        let err = sys::ftruncate(fd.as_fd(), 4096).unwrap_err();
        let RingError::Syscall { call, source } = err else {
            panic!("{err:?}")
        };
        assert_eq!(call, "ftruncate");
        assert_eq!(source.raw_os_error(), Some(libc::EPERM));
    }

    fn raw_memfd(len: usize, prefix: &[u8]) -> OwnedFd {
        let fd = sys::memfd_create(c"ftprobe-test", 0).unwrap();
        sys::ftruncate(fd.as_fd(), len).unwrap();
        // SAFETY: `prefix` is valid for reads of its length; `fd` is open.
        let n = unsafe { libc::pwrite(fd.as_raw_fd(), prefix.as_ptr().cast(), prefix.len(), 0) };
        assert_eq!(n as usize, prefix.len());
        fd
    }

    #[test]
    fn attach_rejects_bad_files() {
        let cfg = RingConfig {
            nr_rings: 2,
            ring_bytes: 8192,
            budget_bytes: 0,
        };
        let total = cfg.total_bytes().unwrap();
        assert_eq!(total, HEADER_BYTES + 4096 + 2 * 8192);

        let err = SharedRings::attach(raw_memfd(100, &[]).as_fd()).unwrap_err();
        assert!(matches!(err, RingError::TooSmall { len: 100 }), "{err:?}");
        assert_eq!(
            err.to_string(),
            "ring memfd is 100 bytes, smaller than the 163840-byte header: \
             not an ftprobe ring buffer"
        );

        let err = SharedRings::attach(raw_memfd(total, b"ELF\x7f").as_fd()).unwrap_err();
        assert!(matches!(err, RingError::BadMagic { .. }), "{err:?}");
        assert_eq!(
            err.to_string(),
            "ring memfd starts with \"ELF\\x7f\\x00\\x00\\x00\\x00\", not \"FTPRING1\": \
             not an ftprobe ring buffer"
        );

        // A real header in a file of the wrong size.
        let (sr, _fd) = SharedRings::create(cfg).unwrap();
        let hdr: Vec<u8> = {
            // SAFETY: the mapping is at least HEADER_BYTES long; reading its bytes while no
            // other thread writes them (nothing has claimed a ring).
            unsafe { std::slice::from_raw_parts(sr.map.base.as_ptr(), 128) }.to_vec()
        };
        for len in [total - 8192, total + 4096] {
            let err = SharedRings::attach(raw_memfd(len, &hdr).as_fd()).unwrap_err();
            assert!(
                matches!(
                    err,
                    RingError::SizeMismatch { len: l, expected }
                        if l == len as u64 && expected == total as u64
                ),
                "{err:?}"
            );
        }
        let mut wrong_version = hdr.clone();
        wrong_version[8] = LAYOUT_VERSION as u8 + 1;
        let err = SharedRings::attach(raw_memfd(total, &wrong_version).as_fd()).unwrap_err();
        assert!(
            matches!(err, RingError::BadVersion { found, .. } if found == LAYOUT_VERSION + 1),
            "{err:?}"
        );
        let mut wrong_rings = hdr.clone();
        wrong_rings[20..24].copy_from_slice(&5000u32.to_le_bytes());
        let err = SharedRings::attach(raw_memfd(total, &wrong_rings).as_fd()).unwrap_err();
        assert!(
            matches!(err, RingError::BadRingBytes { ring_bytes: 5000 }),
            "{err:?}"
        );

        // And the same header at the right size attaches.
        let ok = SharedRings::attach(raw_memfd(total, &hdr).as_fd()).unwrap();
        assert_eq!(ok.config(), sr.config());
        assert_eq!(ok.config().budget_bytes, 2 * 8192);
        assert_eq!(ok.clock(), sr.clock());
    }

    #[test]
    fn create_rejects_bad_configs() {
        for (nr_rings, ring_bytes) in [(0, 4096), (MAX_RINGS + 1, 4096), (1, 2048), (1, 6000)] {
            let err = SharedRings::create(RingConfig {
                nr_rings,
                ring_bytes,
                budget_bytes: 0,
            })
            .unwrap_err();
            assert!(
                matches!(
                    err,
                    RingError::BadRingCount { .. } | RingError::BadRingBytes { .. }
                ),
                "{err:?}"
            );
        }
    }

    #[test]
    fn claim_until_exhausted() {
        let sr = rings(3, 4096);
        assert_eq!(sr.claimed(), 0);
        let ws: Vec<_> = (0..3).map(|t| sr.claim(100 + t, COMM)).collect();
        assert!(ws.iter().all(Option::is_some));
        assert!(sr.claim(103, COMM).is_none());
        assert!(sr.claim(104, COMM).is_none());
        assert_eq!(sr.claimed(), 3);
        assert_eq!(sr.lost_no_ring(), 0);
        let (s103, s104) = (sr.lost_slot(103), sr.lost_slot(104));
        assert_eq!((s103, s104, sr.lost_slot(103)), (0, 1, 0));
        for _ in 0..5 {
            sr.note_lost_no_ring(s103);
        }
        sr.note_lost_no_ring(s104);
        sr.note_lost_no_ring(u32::MAX);
        assert_eq!(sr.lost_no_ring(), 7);
        assert_eq!(sr.lost_by_tid(), vec![(103, 5), (104, 1)]);
        // Each writer has its own ring.
        for (t, w) in ws.iter().enumerate() {
            assert!(w.unwrap().write(1, &[t as u64]));
        }
        for i in 0..3 {
            let mut r = sr.reader(i).unwrap();
            assert_eq!(r.tid(), 100 + i);
            assert_eq!(drain_all(&mut r), vec![(1, vec![u64::from(i)])]);
        }
        assert!(sr.reader(3).is_none());
    }

    #[test]
    fn objects_table() {
        let sr = rings(1, 4096);
        assert_eq!(sr.objects(), vec![]);
        let long = [b'x'; MAX_OBJECT_PATH];
        let objs: [(u64, &[u8]); 3] = [
            (0x5555_5555_4000, b"/usr/bin/true"),
            (0x7f00_0000_0000, b"/lib/x86_64-linux-gnu/libc.so.6"),
            (0, &long),
        ];
        sr.set_objects(&objs).unwrap();
        let got = sr.objects();
        assert_eq!(got.len(), 3);
        for ((b, p), (gb, gp)) in objs.iter().zip(&got) {
            assert_eq!((b, *p), (gb, gp.as_slice()));
        }
        let too_long = [b'y'; MAX_OBJECT_PATH + 1];
        let err = sr.set_objects(&[(1, b"/a"), (2, &too_long)]).unwrap_err();
        assert!(matches!(
            err,
            RingError::ObjectPathTooLong { index: 1, len: 256 }
        ));
        let many = vec![(1u64, &b"/a"[..]); MAX_OBJECTS + 1];
        let err = sr.set_objects(&many).unwrap_err();
        assert!(matches!(err, RingError::TooManyObjects { count: 513 }));
        assert_eq!(sr.objects(), got, "failed calls wrote nothing");
        sr.set_objects(&many[..MAX_OBJECTS]).unwrap();
        assert_eq!(sr.objects().len(), MAX_OBJECTS);
    }

    #[test]
    fn objects_loaded_later_are_appended() {
        let sr = rings(1, 4096);
        sr.set_objects(&[(0x1000, b"/bin/prog"), (0x7f00, b"/lib/libc.so.6")])
            .unwrap();
        assert_eq!(sr.add_objects(&[(0x9000, b"/tmp/libdl.so")]), 1);
        let too_long = vec![b'x'; MAX_OBJECT_PATH + 1];
        assert_eq!(
            sr.add_objects(&[(0xa000, &too_long), (0x9000, b"/tmp/libdl.so")]),
            1
        );
        let got = sr.objects();
        assert_eq!(got.len(), 4);
        assert_eq!(got[0], (0x1000, b"/bin/prog".to_vec()));
        assert_eq!(got[2], (0x9000, b"/tmp/libdl.so".to_vec()));
        assert_eq!(got[3], got[2], "a reload is a new entry");
        let fill: Vec<(u64, &[u8])> = vec![(1, b"/a"); MAX_OBJECTS];
        assert_eq!(
            sr.add_objects(&fill),
            MAX_OBJECTS - 4,
            "up to the table's end"
        );
        assert_eq!(sr.objects().len(), MAX_OBJECTS);
    }

    #[test]
    fn clock_matches_monotonic() {
        let clock = Clock::calibrate();
        let hz = clock.tsc_hz();
        assert!((100_000_000..10_000_000_000).contains(&hz), "{hz} Hz");
        for _ in 0..2 {
            let (tsc, mono) = (read_tsc(), monotonic_ns());
            let conv = clock.tsc_to_mono_ns(tsc);
            assert!(conv.abs_diff(mono) < 1_000_000, "{conv} vs {mono}");
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let sr = rings(1, 4096);
        let c = sr.clock();
        let conv = c.tsc_to_mono_ns(read_tsc());
        assert!(conv.abs_diff(monotonic_ns()) < 1_000_000);
        // Before the reference, the conversion goes back in time (saturating at 0).
        assert_eq!(c.tsc_to_mono_ns(c.tsc_ref), c.mono_ref_ns);
        assert!(c.tsc_to_mono_ns(c.tsc_ref - 1_000_000) < c.mono_ref_ns);
    }

    /// A writer that scribbles over the ring must not crash the reader; it resyncs at head.
    #[test]
    fn reader_survives_garbage() {
        let sr = rings(1, 4096);
        let w = sr.claim(1, COMM).unwrap();
        let mut r = sr.reader(0).unwrap();
        assert!(w.write(1, &[1, 2]));
        sr.data(0).unwrap()[0].store(0xffff_0000_0000_0123, Relaxed); // len 0x123 > left
        assert_eq!(drain_all(&mut r), vec![]);
        assert_eq!(r.corrupt_bytes(), 24);
        assert!(w.write(1, &[3]));
        assert_eq!(drain_all(&mut r), vec![(1, vec![3])]);
        // A head more than a ring ahead.
        w.desc().head.store(head_of(&r) + 10_000, Relaxed);
        w.desc().reserved.store(head_of(&r), Relaxed);
        assert_eq!(drain_all(&mut r), vec![]);
        assert_eq!(r.corrupt_bytes(), 24 + 10_000);
        assert!(w.write(1, &[4]));
        assert_eq!(drain_all(&mut r), vec![(1, vec![4])]);
    }

    /// Pages of ring `i`'s data `[from, from + len)` resident in this mapping (mincore).
    fn resident_pages(sr: &SharedRings, i: u32, from: usize, len: usize) -> usize {
        let data = sr.data(i).unwrap();
        let ptr = data.as_ptr().wrapping_add(from / 8) as *mut libc::c_void;
        let mut vec = vec![0u8; len / 4096];
        // SAFETY: the range is inside ring i's data area of our mapping; vec has one byte
        // per page of it.
        let r = unsafe { libc::mincore(ptr, len, vec.as_mut_ptr()) };
        assert_eq!(r, 0, "mincore");
        vec.iter().filter(|&&b| b & 1 != 0).count()
    }

    #[test]
    fn prefault_faults_in_the_range_only_and_clips() {
        let sr = rings(2, 1 << 22);
        assert_eq!(
            resident_pages(&sr, 1, 0, 1 << 22),
            0,
            "a fresh ring has no pages"
        );
        assert!(sr.prefault(1, 1 << 20, 1 << 20));
        assert_eq!(resident_pages(&sr, 1, 1 << 20, 1 << 20), 256);
        assert_eq!(resident_pages(&sr, 1, 0, 1 << 20), 0, "before the range");
        assert_eq!(
            resident_pages(&sr, 1, 2 << 20, 2 << 20),
            0,
            "after the range"
        );
        assert_eq!(resident_pages(&sr, 0, 0, 1 << 22), 0, "another ring");
        // Clipped to the ring: past its end there is nothing to do.
        assert!(sr.prefault(1, 3 << 20, 64 << 20));
        assert_eq!(resident_pages(&sr, 1, 3 << 20, 1 << 20), 256);
        assert!(sr.prefault(1, 8 << 20, 1 << 20));
        assert!(!sr.prefault(2, 0, 4096), "no ring 2");
        // The producer sees the zeroed pages: a record written and read back.
        let w = sr.claim(7, COMM).unwrap();
        assert!(w.write(5, &[1, 2, 3]));
        assert_eq!(sr.head(0), Some(32));
        assert_eq!(
            drain_all(&mut sr.reader(0).unwrap()),
            vec![(5, vec![1, 2, 3])]
        );
    }

    /// A nested writer ("a signal handler" of the owner thread) at each point of a write:
    /// both records are published, whole, in the order they reserved, by the outermost
    /// commit at the latest; nothing is left reserved and unpublished, nothing stuck.
    #[test]
    fn a_write_interrupted_at_each_point_by_a_nested_one() {
        fn nested(w: &RingWriter<'_>) {
            assert!(w.write3(9, 90, 91, 92));
        }
        let points = [
            hook::BEGUN,
            hook::RESERVING,
            hook::RESERVED,
            hook::FILLED,
            hook::COMMIT_LOADED,
            hook::PUBLISHED,
            hook::UNNESTED,
        ];
        for p in points {
            let sr = rings(1, 4096);
            let w = sr.claim(1, COMM).unwrap();
            let mut r = sr.reader(0).unwrap();
            hook::AT.set((p, Some(nested)));
            assert!(w.write3(1, 10, 11, 12), "point {p}");
            assert_eq!(hook::AT.get().0, 0, "point {p} fired");
            let got = drain_all(&mut r);
            // Before the outer reserved, the nested record comes first.
            let (outer, inner) = ((1, vec![10, 11, 12]), (9, vec![90, 91, 92]));
            let want = if p <= hook::RESERVING {
                vec![inner, outer]
            } else {
                vec![outer, inner]
            };
            assert_eq!(got, want, "point {p}");
            assert_eq!(w.nesting(), 0, "point {p}");
            assert_eq!(head_of(&r), w.desc().reserved.load(Relaxed), "point {p}");
            assert_eq!((r.lost(), r.corrupt_bytes()), (0, 0), "point {p}");
            // The ring goes on.
            assert!(w.write3(2, 3, 4, 5));
            assert_eq!(drain_all(&mut r), vec![(2, vec![3, 4, 5])], "point {p}");
        }
    }

    /// The wrap rule under nesting: the outer write pads to the end and goes to offset 0, a
    /// nested one interrupts it between its reservation and its padding word, or before its
    /// reservation (then the nested one wraps). Every record is read whole, in order.
    #[test]
    fn wrap_under_nesting() {
        fn nested(w: &RingWriter<'_>) {
            assert!(w.write(9, &[7; 5]));
        }
        for p in [hook::RESERVING, hook::RESERVED, hook::FILLED] {
            let sr = rings(1, 4096);
            let w = sr.claim(1, COMM).unwrap();
            let mut r = sr.reader(0).unwrap();
            // A whole lap, then one word: the second lap (the size is fixed); then up to
            // 16 bytes before the end; all read.
            assert!(w.write(1, &[0; 511]));
            assert_eq!(drain_all(&mut r).len(), 1);
            assert!(w.write(1, &[]));
            assert_eq!(drain_all(&mut r).len(), 1);
            assert!(w.write(1, &[0; 508]));
            assert_eq!(drain_all(&mut r).len(), 1);
            assert_eq!(head_of(&r) % 4096, 4080);
            hook::AT.set((p, Some(nested)));
            // 4 words do not fit in the last 2: padding, then offset 0.
            assert!(w.write3(2, 1, 2, 3), "point {p}");
            let got = drain_all(&mut r);
            let (outer, inner) = ((2, vec![1, 2, 3]), (9, vec![7; 5]));
            let want = if p == hook::RESERVING {
                vec![inner, outer]
            } else {
                vec![outer, inner]
            };
            assert_eq!(got, want, "point {p}");
            assert_eq!((r.lost(), r.corrupt_bytes(), w.nesting()), (0, 0, 0));
        }
    }

    /// On the ring's first lap a nested writer that does not fit before the end drops its
    /// record (it never wraps nor grows the ring: only the outermost does); the outer one
    /// grows the ring and goes on.
    #[test]
    fn a_nested_writer_never_makes_the_first_wrap() {
        fn nested(w: &RingWriter<'_>) {
            assert!(!w.write(9, &[7; 5]));
        }
        let sr = rings(1, 1 << 16);
        let w = sr.claim(1, COMM).unwrap();
        let mut r = sr.reader(0).unwrap();
        assert_eq!(sr.ring_size(0), Some(16 << 10));
        assert!(w.write(1, &[0; 2045])); // 16384 - 16 bytes
        hook::AT.set((hook::BEGUN, Some(nested)));
        assert!(w.write3(2, 1, 2, 3));
        assert_eq!(sr.ring_size(0), Some(32 << 10));
        let got = drain_all(&mut r);
        assert_eq!(got.len(), 2);
        assert_eq!(got[1], (2, vec![1, 2, 3]));
        assert_eq!((r.lost(), r.corrupt_bytes()), (1, 0));
    }

    /// A repair after the nested writer was abandoned (its handler jumped out) with the outer
    /// one still live: the nest count goes back, the reserve pointer back to where the nested
    /// one began; the outer commit publishes only the outer records.
    #[test]
    fn abandon_rewinds_to_the_abandoned_writer() {
        let sr = rings(1, 4096);
        let w = sr.claim(1, COMM).unwrap();
        let mut r = sr.reader(0).unwrap();
        let l0 = w.begin();
        assert_eq!(l0, 0);
        assert!(w.in_section().write3(1, 1, 1, 1));
        let at = w.reserved();
        let l1 = w.begin();
        assert_eq!(l1, 1);
        assert!(w.in_section().write3(9, 9, 9, 9)); // then abandoned
        w.abandon(1, at);
        assert_eq!(w.nesting(), 1);
        assert!(w.in_section().write3(2, 2, 2, 2));
        w.commit();
        assert_eq!(
            drain_all(&mut r),
            vec![(1, vec![1, 1, 1]), (2, vec![2, 2, 2])]
        );
        // Everything abandoned: back to head.
        w.begin();
        assert!(w.in_section().write3(3, 3, 3, 3));
        w.abandon(0, 0);
        assert_eq!(w.nesting(), 0);
        assert!(w.write3(4, 4, 4, 4));
        assert_eq!(drain_all(&mut r), vec![(4, vec![4, 4, 4])]);
        assert_eq!(r.corrupt_bytes(), 0);
    }

    /// A ring released by its owner is freed only once read to the end; then another thread
    /// claims it, from a clean start, and a reader left from before (its tail ahead of the
    /// new owner's head) reads nothing rather than garbage.
    #[test]
    fn rings_are_freed_after_their_owner_released_them_and_reused() {
        let sr = rings(1, 1 << 16);
        let w = sr.claim(100, COMM).unwrap();
        let mut old = sr.reader(0).unwrap();
        for i in 0..1000u64 {
            assert!(w.write3(1, i, i, i));
        }
        assert_eq!(sr.ring_size(0), Some(32 << 10), "grew on its first lap");
        let used = sr.budget_used();
        assert!(sr.claim(101, COMM).is_none(), "one ring, owned");
        assert_eq!(sr.free_released(0), None, "not released");
        sr.release(w);
        assert_eq!(sr.owner(0).map(|o| (o.0, o.2)), Some((100, true)));
        assert_eq!(sr.free_released(0), None, "not read yet");
        let freed = sr.freed();
        let mut r = sr.reader(0).unwrap();
        assert_eq!(drain_all(&mut r).len(), 1000);
        let (tid, comm, lost) = sr.free_released(0).unwrap();
        assert_eq!((tid, comm, lost), (100, COMM, 0));
        assert_eq!(sr.freed(), freed + 1);
        assert_eq!(sr.budget_used(), used - (32 << 10));
        assert_eq!(sr.owner(0), None);
        assert_eq!(resident_pages(&sr, 0, 0, 1 << 16), 0, "its pages are gone");
        // A new owner starts clean.
        let w2 = sr.claim(101, *b"second\0\0\0\0\0\0\0\0\0\0").unwrap();
        assert_eq!(sr.ring_size(0), Some(16 << 10));
        assert!(w2.write3(2, 7, 8, 9));
        assert_eq!(sr.owner(0).map(|o| (o.0, o.2)), Some((101, false)));
        // `old` read up to 1000 records' worth before: the new head is behind its tail.
        let old_tail = old.tail;
        old.tail = 32_000;
        assert_eq!(drain_all(&mut old), vec![]);
        assert_eq!(old.corrupt_bytes(), 0);
        old.tail = old_tail;
        let mut r = sr.reader(0).unwrap();
        assert_eq!(drain_all(&mut r), vec![(2, vec![7, 8, 9])]);
    }

    /// The bulk drain hands out the records as the ring holds them, padding left out, and
    /// skips what does not parse.
    #[test]
    fn drain_raw_copies_whole_records() {
        let sr = rings(1, 4096);
        let w = sr.claim(1, COMM).unwrap();
        let mut r = sr.reader(0).unwrap();
        assert!(w.write(1, &[0; 500]));
        let mut buf = Vec::new();
        assert_eq!(r.drain_raw(&mut buf), 1);
        assert_eq!(buf.len(), 501);
        assert!(w.write3_aux(2, 5, 1, 2, 3)); // fits before the end
        assert!(w.write(3, &[4; 20])); // padding, then offset 0
        buf.clear();
        assert_eq!(r.drain_raw(&mut buf), 2);
        assert_eq!(
            buf[..4],
            [record_header_aux(4, 2, 5), 1, 2, 3],
            "first record"
        );
        assert_eq!(buf[4], record_header(21, 3));
        assert_eq!(buf.len(), 4 + 21);
        assert_eq!(r.corrupt_bytes(), 0);
    }
}
