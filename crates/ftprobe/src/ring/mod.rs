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
//! 0 +-- Header: HEADER_BYTES = 167936 bytes (41 pages) ------------------------------+
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
//!   | 128 objects[512], 280 bytes each:                                              |
//!   |       0 load_bias u64, 8 path_len u32, 12 claimed u32, 16 load_tsc u64 (raw TSC |
//!   |       when added; 0: before the first event), 24 path[256]                     |
//!   | 143488 event_counters[1024], 16 bytes each (kprobe events, by event id):        |
//!   |       0 dropped u64 (hits whose record was lost), 8 nmissed u64                |
//!   | 159872 lost_tids[256], 16 bytes each (threads that had no ring):               |
//!   |       0 tid u32, 4 reserved u32, 8 lost u64                                    |
//!   | 163968 lost_unreclaimed u64 (of lost_no_ring: no ring free, some of them       |
//!   |        released by ended threads and not freed by the reader yet)              |
//!   | 163976 lost_after_end u64 (of lost_no_ring: events of a thread after it        |
//!   |        released its ring, e.g. in a later TLS destructor)                      |
//!   +-- Descriptors at DESC_OFFSET = HEADER_BYTES, 128 bytes per ring ---------------+
//!   |  +0 line 0, written by the producer: 0 head u64 (published), 8 lost u64,        |
//!   |          16 tail_cache u64 (bit 63: LOST_PENDING), 24 tid u32, 28 state u32     |
//!   |          (0 free, 1 owned, 2 released), 32 comm[16], 48 reserved u64 (the       |
//!   |          reserve pointer),                                                     |
//!   |          56 size u32 (bytes in use, a power of two), 60 nest u32 (writers)      |
//!   | +64 line 1, written by the reader: 64 tail u64; by the owner at its claim:    |
//!   |          72 pid u32 (its process: a forked child's threads have their own);    |
//!   |          by the owner's writer once per gap: 80 lost_marked u64 (the `lost`     |
//!   |          its last LOST record accounted for)                                   |
//!   +-- Data at data_offset = DESC_OFFSET + round_up(nr_rings * 128, 4096) ----------+
//!   | ring 0: ring_bytes | ring 1: ring_bytes | ...  | ring nr_rings-1               |
//!   +----------------------------------------------------------------- total_bytes --+
//! ```
//!
//! # Owners, sizes and memory
//!
//! A ring belongs to one thread at a time, its owner. A thread claims a free ring at its
//! first event ([`SharedRings::claim`]: state free -> owned, then `tid` and `comm`), marks it
//! ending when its last pthread key destructor runs ([`SharedRings::ending`]: it goes on
//! writing until its last instruction), and it is released once the owner is gone (owned or
//! ending -> released: [`SharedRings::release`] by the owner itself, a claim that finds the
//! ending owner gone, or the reader's `gone` in [`SharedRings::free_released`]). The reader
//! frees a released ring once it has read everything in it
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
//! # Lost events
//!
//! A record that does not fit (the ring is full: the reader is behind) is dropped, the
//! newest, never one already written, and counted in the ring's `lost`. So that a reader
//! sees *where* in the thread's records events are missing (as the kernel's ring buffer
//! marks `[LOST N EVENTS]`), a drop also sets `LOST_PENDING`, bit 63 of the producer's
//! cached tail: the writer's fast path compares with that word anyway, so the bit makes it
//! fail and costs nothing until there is a gap. The first record that fits after one or more
//! drops is then preceded by a LOST record ([`RTYPE_LOST`]: the timestamp and the number
//! of events dropped since the previous LOST record, `lost - lost_marked`), reserved
//! together with it, out of line. The sum of a ring's LOST counts is its `lost`, except for
//! drops after its last record (a thread that ended with its ring full: the ring's release
//! writes the mark if there is room by then). A LOST record may count 0 events (a signal
//! handler took the count in between): readers skip it.
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
//! A record whose size is known only once it is written (a kprobe event's strings, copied
//! in one pass: `RingWriter::try_write_shrinking`) reserves room for the most it may take,
//! fills it, and moves `reserved` back to its end with a second `cmpxchg`: that fails only if
//! a handler reserved after it meanwhile, and the record then keeps all of its room (the
//! unused words zero). It is only tried where the room fits as it is (no padding to the end,
//! no growth, no LOST record pending, room free); elsewhere the record is measured first.
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
//!
//! # Files
//!
//! `layout.rs`: the header and descriptor structs drawn above, the constants and
//! [`LAYOUT_VERSION`]; `writer.rs`: [`RingWriter`], the probe path's producer (claim's
//! writer, reserve and commit, nesting, growth); `reader.rs`: [`RingReader`], the CLI's
//! consumer; `clock.rs`: timestamps and [`Clock`]; this file: [`SharedRings`] (creating,
//! attaching, claiming, releasing and freeing rings, the header's counters and tables).

mod clock;
mod layout;
mod reader;
mod writer;

use std::fmt;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

pub use clock::{monotonic_ns, read_cpu, read_tsc, read_tsc_cpu, Clock, ClockSample};
use layout::*;
pub use layout::{
    EventCounters, RingConfig, HEADER_BYTES, INIT_RING_BYTES, LAYOUT_VERSION, MAGIC, MAX_EVENTS,
    MAX_LOST_TIDS, MAX_NEST, MAX_OBJECTS, MAX_OBJECT_PATH, MAX_RECORD_WORDS, MAX_RINGS,
    MAX_RING_BYTES, MIN_RING_BYTES, POPULATE_CHUNK, RTYPE_LOST, RTYPE_PADDING,
};
pub use reader::RingReader;
pub use writer::{RingWriter, SectionWriter};

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
        // Not in a core dump of the process: a traced program that dies would otherwise dump
        // every ring's reserved size (gigabytes); the events are the reader's, in the file.
        // SAFETY: advice on the mapping just made; changes nothing of its contents. Failure
        // (an old kernel) only leaves the rings in core dumps.
        unsafe { libc::madvise(p, len, libc::MADV_DONTDUMP) };
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
        let [tsc_ref, mono_ref_ns, ns_per_tick_q32] = clock.to_parts();
        h.clock_tsc_ref.store(tsc_ref, Relaxed);
        h.clock_mono_ref_ns.store(mono_ref_ns, Relaxed);
        h.clock_ns_per_tick_q32.store(ns_per_tick_q32, Relaxed);
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

    pub(super) fn data(&self, i: u32) -> Option<&[AtomicU64]> {
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
            let mut state = desc.prod.0.state.load(Relaxed);
            if state == STATE_ENDING {
                // An ending ring of a thread of this process that is gone: released now (its
                // last record came before its exit). Another process's (a fork's) is left
                // to that process: its pids may not be ours.
                let p = &desc.prod.0;
                let tid = p.tid.load(Relaxed);
                if tid != 0
                    && desc.tail.0.pid.load(Relaxed) == crate::sys::getpid()
                    && crate::sys::thread_gone(tid)
                    && p.state
                        .compare_exchange(STATE_ENDING, STATE_RELEASED, Release, Relaxed)
                        .is_ok()
                {
                    // Relaxed: a hint for threads without a ring.
                    c.freed.fetch_add(1, Relaxed);
                    state = STATE_RELEASED;
                }
            }
            if state == STATE_RELEASED || state == STATE_ENDING {
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
        // Drops at the end of the thread's records: marked if there is room.
        w.flush_lost();
        // Release: every record published before happens before the reader sees the state.
        w.desc().state.store(STATE_RELEASED, Release);
        // Relaxed: a hint for threads without a ring (the kind of their loss may change).
        self.header().counters.0.freed.fetch_add(1, Relaxed);
    }

    /// Probe path (a thread's end, its last pthread key destructor): mark `w`'s ring as
    /// ending. The owner goes on writing into it until its last instruction (the C library's
    /// exit work after the destructors calls traced functions). The reader frees it once
    /// the owner is gone ([`free_released`](Self::free_released)'s `gone`), or a later claim
    /// in the same process that finds the owner gone (`tgkill(pid, tid, 0)`: ESRCH) releases
    /// it and the reader frees it as any released ring.
    pub fn ending(&self, w: &RingWriter<'_>) {
        // Relaxed: only the owner's process looks at it, after the owner is gone.
        w.desc().state.store(STATE_ENDING, Relaxed);
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

    /// Reader side: if ring `i` was released by its owner (or, ending, found gone by a
    /// claim, [`claim`](Self::claim), or by `gone(pid, tid)`) and everything in it was read,
    /// free it for another thread: its memory goes back to the system and to the budget.
    /// Returns the owner's (tid, comm, lost) then, `None` when the ring is not ready.
    /// `gone` must never say so of a live thread (its later records would go into a ring
    /// another thread owns): it answers for the pid and tid the owner had in its own pid
    /// namespace.
    pub fn free_released(
        &self,
        i: u32,
        gone: impl Fn(u32, u32) -> bool,
    ) -> Option<(u32, [u8; 16], u64)> {
        let desc = self.desc(i)?;
        let p = &desc.prod.0;
        // Acquire: pairs with `release`: the owner's last `head` is visible (for an ending
        // ring, the owner's exit happened before `gone` saw it gone).
        match p.state.load(Acquire) {
            STATE_RELEASED => {}
            STATE_ENDING => {
                let tid = p.tid.load(Acquire);
                let pid = desc.tail.0.pid.load(Relaxed);
                if tid == 0 || pid == 0 || !gone(pid, tid) {
                    return None;
                }
                std::sync::atomic::fence(Acquire);
            }
            _ => return None,
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
            &desc.tail.0.lost_marked,
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
            slot.load_tsc.store(0, Relaxed);
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
            // After the object was mapped and before its code can run (the loader's
            // notification): an event at or after this time is the new object's.
            slot.load_tsc.store(read_tsc(), Relaxed);
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

    /// CLI side: when each entry of [`objects`](Self::objects) was added (raw TSC; 0: at the
    /// start, before any event). An address resolves to the last entry covering it that was
    /// added at or before the event (issue 26, item 10: a library unloaded, and another one
    /// loaded at the same address, name each its own calls).
    pub fn object_load_times(&self) -> Vec<u64> {
        let h = self.header();
        // Acquire: pairs with the Release store in `set_objects`/`add_objects`.
        let n = (h.nr_objects.load(Acquire) as usize).min(MAX_OBJECTS);
        h.objects
            .iter()
            .take(n)
            .map(|slot| slot.load_tsc.load(Relaxed))
            .collect()
    }

    /// The TSC conversion written by [`create`](Self::create).
    pub fn clock(&self) -> Clock {
        let h = self.header();
        // Relaxed: written before `magic`'s Release store, which `attach` Acquire-loaded (or
        // this process wrote them itself).
        Clock::from_parts([
            h.clock_tsc_ref.load(Relaxed),
            h.clock_mono_ref_ns.load(Relaxed),
            h.clock_ns_per_tick_q32.load(Relaxed),
        ])
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

/// Helpers of the unit tests of this module's files.
#[cfg(test)]
mod test_util {
    use super::*;

    pub(super) const COMM: [u8; 16] = *b"worker-1\0\0\0\0\0\0\0\0";

    pub(super) fn rings(nr_rings: u32, ring_bytes: u32) -> SharedRings {
        SharedRings::create(RingConfig {
            nr_rings,
            ring_bytes,
            budget_bytes: 0,
        })
        .expect("create")
        .0
    }

    pub(super) fn drain_all(r: &mut RingReader<'_>) -> Vec<(u16, Vec<u64>)> {
        let mut out = Vec::new();
        r.drain(|t, w| out.push((t, w.to_vec())));
        out
    }

    pub(super) fn head_of(r: &RingReader<'_>) -> u64 {
        r.prod.head.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::test_util::{drain_all, rings, COMM};
    use super::*;
    use std::os::fd::{AsFd, AsRawFd};

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
            "ring memfd is 100 bytes, smaller than the 167936-byte header: \
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

    /// A ring its owner marked ending (its last pthread key destructor ran) takes the owner's
    /// later records, and is freed only once the owner is gone (the reader's `gone`, for the
    /// pid and tid the owner claimed with) and it was read to the end (issue 26, item 9).
    #[test]
    fn an_ending_ring_is_freed_once_its_owner_is_gone() {
        let sr = rings(1, 1 << 16);
        let w = sr.claim(100, COMM).unwrap();
        assert!(w.write3(1, 1, 1, 1));
        sr.ending(&w);
        assert!(w.write3(1, 2, 2, 2), "written after the destructors");
        let pid = crate::sys::getpid();
        let mut r = sr.reader(0).unwrap();
        assert_eq!(drain_all(&mut r).len(), 2);
        assert_eq!(sr.free_released(0, |_, _| false), None, "owner alive");
        assert_eq!(
            sr.free_released(0, |p, t| (p, t) == (pid, 100))
                .map(|o| o.0),
            Some(100)
        );
        assert_eq!(sr.owner(0), None);
        // Freed: a claim gets it again.
        assert!(sr.claim(101, COMM).is_some());
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
        assert_eq!(sr.free_released(0, |_, _| false), None, "not released");
        sr.release(w);
        assert_eq!(sr.owner(0).map(|o| (o.0, o.2)), Some((100, true)));
        assert_eq!(sr.free_released(0, |_, _| false), None, "not read yet");
        let freed = sr.freed();
        let mut r = sr.reader(0).unwrap();
        assert_eq!(drain_all(&mut r).len(), 1000);
        let (tid, comm, lost) = sr.free_released(0, |_, _| false).unwrap();
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
}
