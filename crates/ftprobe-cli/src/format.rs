//! The files of a recording (`ftprobe record` writes them, [`crate::recording`] reads them):
//! its directory holds:
//! - `ring-N.dat` per record stream, that is per thread that owned a ring (a ring used by
//!   several threads one after the other gives one stream per thread: the CLI frees a
//!   thread's ring only once it has read all of it, and numbers the next owner's records as a
//!   new stream): its records in the order drained, copied from the ring as they are there
//!   (checked, padding left out, whole spans at once): a little-endian header word
//!   `len | rtype << 16 | aux << 32` (`len` in words, the header included), then the payload
//!   words: 8 + 8 x payload bytes per record (32 for a function-tracer event), LOST records
//!   where the thread's events were dropped (format 4; formats 2 and 3 have the same words without
//!   them, which older builds would have ignored silently). Format 1
//!   recordings (`rtype | payload words << 16 | aux << 32`) are read too;
//! - `info.json` ([`Info`]): the command, tracer, options and event definitions, the clock's
//!   conversion, per ring its thread and lost count, the header's counters, how the run ended,
//!   and the loaded objects. Written first when the run starts recording, marked `partial`
//!   (what is known then), and replaced at the end (format 5);
//! - `journal.jsonl` while the run records ([`JournalEntry`], one JSON line each, appended
//!   before the bytes they describe): each object of the objects table as it is copied, each
//!   stream's thread and place as its records first reach a file, each exec'd image. A
//!   recorder killed or stopped by a full disk leaves a partial `info.json` and this journal,
//!   from which the readers read every whole record the files hold (and say what is
//!   unknown); the final `info.json` makes it redundant, and it is removed;
//! - `objects/`: a copy of each loaded object's file, named by its build-id (or, without one,
//!   a hash of its contents), so that a recording replays after the program's binaries
//!   changed or were deleted. The whole file is copied rather than a symbol table extracted:
//!   `Symbols` then reads the copy through the same ELF code as live (symbols, `.eh_frame`
//!   ranges, demangling), and `std::fs::copy` is cheap (`copy_file_range`).

use serde::{Deserialize, Serialize};

use crate::session::End;

/// The `format` of the `info.json` this code writes (2: ring files hold records as the
/// rings do; 3: and the streams of short-lived threads share [`SMALL_FILE`]; 4: and the
/// records may include LOST records, the marks of the gaps a full ring left, which older
/// builds would have ignored silently; 5: and `info.json` may be `partial`, completed by
/// [`JOURNAL`], which older builds would have read as an empty recording; 1 to 4 are read
/// too).
pub const FORMAT: u32 = 5;

/// The journal of a recording being written (see the module docs).
pub const JOURNAL: &str = "journal.jsonl";

/// A line of [`JOURNAL`].
#[derive(Serialize, Deserialize, Debug)]
#[serde(rename_all = "snake_case")]
pub enum JournalEntry {
    /// The next entry of the objects table (entries keep the table's order: images name
    /// them by index).
    Object(ObjectInfo),
    /// A stream's thread and where its records are: its own file (`records` and `bytes` 0:
    /// to the file's end), or a segment of [`SMALL_FILE`] (`offset`, `records`, `bytes`).
    Stream(RingInfo),
    /// A process exec'd into an image (`--follow-exec`).
    Image(crate::symbols::Image),
}

/// The file the streams of short-lived threads share: a stream's records are kept in memory
/// until it ended (then appended here, one after another) or holds 64 KiB (then it
/// gets a file of its own). A file per thread cost ~70 µs of the CLI's time to create on
/// ext4: a program starting thousands of short threads a second outran it, and their rings
/// were not freed in time (events lost where `trace` lost none).
pub const SMALL_FILE: &str = "rings-small.dat";

/// A recording's `info.json`.
#[derive(Serialize, Deserialize, Debug)]
pub struct Info {
    pub format: u32,
    /// Written when the run started recording: what was known then (no streams, no
    /// counters, no end); [`JOURNAL`] has the rest.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub partial: bool,
    /// Why the run stopped recording before the program ended (a write failed: a full
    /// disk); what was written before is in the files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
    pub command: Vec<String>,
    /// `function`, `function_graph` or `nop`.
    pub tracer: String,
    pub filter: Vec<String>,
    pub notrace: Vec<String>,
    pub graph_function: Vec<String>,
    pub graph_notrace: Vec<String>,
    pub max_depth: u32,
    /// The -O options.
    pub options: Vec<String>,
    pub buffer_size_kb: u32,
    /// Per kprobe event id, its definitions (`kprobe_events` syntax).
    pub events: Vec<Vec<String>>,
    /// The TSC to CLOCK_MONOTONIC conversion (`Clock::to_parts`).
    pub clock: [u64; 3],
    pub tsc_hz: u64,
    /// The CPU count the function_graph layout sizes its CPU column for.
    pub ncpus: u32,
    /// The CPUs online (the entries line's `#P:`).
    pub cpus_online: u32,
    /// The agent armed everything (the trace was on).
    pub armed: bool,
    pub nr_rings: u32,
    /// Format 2: the record streams (threads that owned a ring), `ring-0.dat` to
    /// `ring-{claimed - 1}.dat`. Format 1: rings the target's threads claimed (more than
    /// `nr_rings`: some threads had none).
    pub claimed: u32,
    /// Written by `ftprobe record` at its end from the session, one entry at a time (a run of
    /// 100 000 threads must not hold 100 000 entries and their JSON text at its end).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rings: Vec<RingInfo>,
    pub lost_no_ring: u64,
    /// Of `lost_no_ring`: events lost while some rings were held by ended threads that
    /// ftprobe had not read yet, and events of threads after they released their ring.
    #[serde(default)]
    pub lost_unreclaimed: u64,
    #[serde(default)]
    pub lost_after_end: u64,
    /// The threads that had no ring: (tid, events lost).
    #[serde(default)]
    pub lost_by_tid: Vec<[u64; 2]>,
    pub lost_recursion: u64,
    pub fgraph_overrun: u64,
    /// Per kprobe event id: records dropped, nmissed.
    pub event_counters: Vec<[u64; 2]>,
    pub end: End,
    pub objects: Vec<ObjectInfo>,
    /// The images processes exec'd into (`--follow-exec`): from `tsc` on, `pid`'s records
    /// are named from `objects[first..]` (see `symbols`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<crate::symbols::Image>,
}

/// A ring of a recording.
#[derive(Serialize, Deserialize, Debug)]
pub struct RingInfo {
    /// The stream's number (its file's).
    pub index: u32,
    /// The ring it was read from (format 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ring: Option<u32>,
    pub tid: u32,
    /// The thread's process id (a forked child's own); absent in older recordings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// The thread's comm (without NULs), when it is UTF-8 ...
    pub comm: String,
    /// ... else its bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comm_bytes: Option<Vec<u8>>,
    /// Records the ring lost (full).
    pub lost: u64,
    /// Records and bytes in its file.
    pub records: u64,
    pub bytes: u64,
    /// Its data file, relative to the directory ...
    pub file: String,
    /// ... and where in it the stream starts (format 3: the streams of short-lived threads
    /// share one file, [`SMALL_FILE`], one after another; absent: 0, a file of its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
}

/// A loaded object of a recording.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct ObjectInfo {
    pub bias: u64,
    pub path: String,
    /// `NT_GNU_BUILD_ID`, hex.
    pub build_id: Option<String>,
    /// The copy of its file, relative to the directory (none: it could not be read).
    pub copy: Option<String>,
    /// When it was loaded (raw TSC; 0 or absent: before the first event). A library loaded
    /// again, or another loaded where an unloaded one was, is another entry: each names
    /// the records written while it was the one mapped there.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub load_tsc: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// The data file of ring `i`.
pub fn ring_file(i: u32) -> String {
    format!("ring-{i}.dat")
}
