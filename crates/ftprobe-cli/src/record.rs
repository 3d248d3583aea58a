//! `ftprobe record`: run CMD in a tracing session ([`crate::session`]) as `trace` does, but
//! store the records unformatted in a data directory, for `ftprobe replay`.
//!
//! The directory's layout and files are [`crate::format`]'s. The directory defaults to
//! `ftprobe.data`; an existing recording there is moved to `DIR.old`, as uftrace does with
//! `uftrace.data`. The run writes into a staging directory next to it (`DIR.new-PID`) and
//! moves it to `DIR` only once the agent armed: a run that recorded nothing (the program
//! cannot be run, nothing matches a filter, the agent did not start) leaves the existing
//! recording, and `DIR.old`, alone. Neither `DIR` nor `DIR.old` is replaced unless it is a
//! recording (or empty).

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;

use crate::format::{
    ring_file, Info, JournalEntry, ObjectInfo, RingInfo, FORMAT, JOURNAL, SMALL_FILE,
};
use crate::session::{self, End, SessionArgs, Sink, Source};

/// A stream's bytes in memory before it gets a file of its own.
const SPILL: usize = 64 << 10;

/// The streams' bytes kept in memory at most: beyond, the largest get files of their own.
const PENDING_BUDGET: usize = 16 << 20;

/// Arguments of `ftprobe record`.
#[derive(Args)]
pub struct RecordArgs {
    /// The data directory to write (`-o DIR` too).
    #[arg(
        short = 'd',
        short_alias = 'o',
        long = "data",
        value_name = "DIR",
        default_value = "ftprobe.data"
    )]
    dir: PathBuf,
    #[command(flatten)]
    session: SessionArgs,
}

/// `info.json` as [`Recorder::finish`] writes it: [`Info`] and its `rings`, written as the
/// session gives them.
#[derive(Serialize)]
struct InfoOut<'a, R: Serialize> {
    #[serde(flatten)]
    info: &'a Info,
    rings: R,
}

/// A JSON array of what the closure's iterator yields, made while it is written.
struct SeqOf<F>(F);

impl<F, I> Serialize for SeqOf<F>
where
    F: Fn() -> I,
    I: Iterator,
    I::Item: Serialize,
{
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_seq((self.0)())
    }
}

/// Pieces of a ring `record` writes per poll while the program runs (a few MiB each).
const MAX_PIECES: usize = 16;

/// `dir` with `suffix` appended to its name.
fn sibling(dir: &Path, suffix: &str) -> PathBuf {
    let mut s = dir.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// Refuse unless `dir` is absent, empty or a recording (it is to be replaced).
fn check_replaceable(dir: &Path) -> Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    let empty = std::fs::read_dir(dir)
        .with_context(|| format!("{} is not a directory", dir.display()))?
        .next()
        .is_none();
    if !empty && !dir.join("info.json").exists() && !dir.join("objects").exists() {
        bail!(
            "{} exists and is not a recording: not replacing it",
            dir.display()
        );
    }
    Ok(())
}

/// Check that `dir` and `DIR.old` may be replaced, and create the staging directory (with
/// its `objects/`) the run writes into: its path.
fn make_staging(dir: &Path) -> Result<PathBuf> {
    check_replaceable(dir)?;
    if dir.exists() {
        check_replaceable(&sibling(dir, ".old"))?;
    }
    remove_stale_staging(dir);
    let staging = sibling(dir, &format!(".new-{}", std::process::id()));
    if staging.exists() {
        std::fs::remove_dir_all(&staging)
            .with_context(|| format!("removing {}", staging.display()))?;
    }
    // Private, as perf's: the recording holds the program's command line and its objects.
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(staging.join("objects"))
        .with_context(|| format!("creating {}", staging.display()))?;
    Ok(staging)
}

/// Staging directories of earlier runs on `dir` whose recorder is gone (`DIR.new-PID` with no
/// process PID: killed before it started recording, holding only a recording's files), and
/// old recordings such a recorder was removing (`DIR.del-PID`), are removed.
fn remove_stale_staging(dir: &Path) {
    let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) else {
        return;
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let name = name.to_string_lossy();
    let prefixes = [format!("{name}.new-"), format!("{name}.del-")];
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for e in entries.flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = prefixes
            .iter()
            .find_map(|p| n.strip_prefix(p.as_str()))
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        // SAFETY: kill with signal 0 only checks that the process exists.
        let gone = unsafe { libc::kill(pid, 0) } != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        // Only what `record` puts there (a kill may come before `objects/` was made).
        let ours = std::fs::read_dir(e.path()).is_ok_and(|mut d| {
            d.all(|f| {
                f.is_ok_and(|f| {
                    let n = f.file_name().to_string_lossy().into_owned();
                    matches!(
                        n.as_str(),
                        "objects" | "info.json" | "info.json.tmp" | JOURNAL | SMALL_FILE
                    ) || (n.starts_with("ring-") && n.ends_with(".dat"))
                })
            })
        });
        if gone && ours {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Move an existing recording at `dir` aside to `DIR.old` (checked again: it may have
/// changed while the program started), then `staging` to `dir`.
fn rotate(staging: &Path, dir: &Path) -> Result<()> {
    check_replaceable(dir)?;
    if dir.exists() {
        let old = sibling(dir, ".old");
        check_replaceable(&old)?;
        if old.exists() {
            // Renamed first, then removed: a kill during the removal leaves no half-deleted
            // `DIR.old` (the next `record` removes the `DIR.del-PID` left).
            let doomed = sibling(dir, &format!(".del-{}", std::process::id()));
            std::fs::rename(&old, &doomed)
                .with_context(|| format!("moving {} to {}", old.display(), doomed.display()))?;
            std::fs::remove_dir_all(&doomed)
                .with_context(|| format!("removing {}", doomed.display()))?;
        }
        std::fs::rename(dir, &old)
            .with_context(|| format!("moving {} to {}", dir.display(), old.display()))?;
    }
    std::fs::rename(staging, dir)
        .with_context(|| format!("moving {} to {}", staging.display(), dir.display()))
}

struct Recorder {
    /// Where the files go: the staging directory, then (once rotated) the data directory.
    dir: PathBuf,
    /// The data directory, and whether the staging directory became it.
    target: PathBuf,
    rotated: bool,
    /// The files of the streams that may still bring records (opened at a stream's first
    /// record, closed once the stream ended: its ring was freed), by stream.
    files: BTreeMap<u32, File>,
    /// Per stream: records and bytes in its file (all streams: 16 bytes each).
    records: Vec<u64>,
    bytes: Vec<u64>,
    /// Streams' records kept in memory (not in a file yet), and their bytes in all.
    pending: BTreeMap<u32, Vec<u8>>,
    pending_bytes: usize,
    /// Streams that have a file of their own.
    own_file: Vec<bool>,
    /// Per stream, its offset in [`SMALL_FILE`] if it went there.
    offsets: Vec<Option<u64>>,
    /// [`SMALL_FILE`], open once a stream went there, and its length.
    small: Option<File>,
    small_len: u64,
    /// The streams that may still bring records, this poll (reused).
    active: Vec<u32>,
    /// The objects table as last seen, and every object seen (copied when first seen).
    table: Vec<(u64, Vec<u8>)>,
    objects: Vec<ObjectInfo>,
    /// The first write error.
    error: Option<String>,
    info: Info,
    /// [`JOURNAL`], open once the run records, and the objects table's entries it has.
    journal: Option<File>,
    journaled_objects: usize,
    /// The words of a drain, reused.
    buf: Vec<u64>,
}

/// The bytes of `words`, little-endian (this is x86-64 only).
fn words_as_bytes(words: &[u64]) -> &[u8] {
    const _: () = assert!(cfg!(target_endian = "little"));
    // SAFETY: u8 has no alignment and every bit pattern; the slice covers exactly the
    // words' memory, borrowed for as long as `words`.
    unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), std::mem::size_of_val(words)) }
}

impl Recorder {
    /// Close stream `i`'s file (unbuffered: each drain's piece, whole records of up to a
    /// few MiB, is one write, so a thread alive costs a descriptor and no buffer).
    fn close(&mut self, i: u32) {
        self.files.remove(&i);
    }

    /// Stream `i`'s file, opened (appending: it may have been closed to free a descriptor)
    /// if need be.
    fn file(&mut self, i: u32) -> Result<&mut File, String> {
        if !self.files.contains_key(&i) {
            let path = self.dir.join(ring_file(i));
            let open = || {
                OpenOptions::new()
                    .create(true)
                    .append(true)
                    .mode(0o600)
                    .open(&path)
            };
            let f = match open() {
                // Out of descriptors (many threads alive at once, a low `ulimit -n`): close
                // the other streams' files (they are opened again when they bring more), and
                // try again.
                Err(e) if e.raw_os_error() == Some(libc::EMFILE) && !self.files.is_empty() => {
                    let others: Vec<u32> = self.files.keys().copied().collect();
                    for o in others {
                        self.close(o);
                    }
                    open()
                }
                r => r,
            };
            let f = f.map_err(|e| {
                let hint = if e.raw_os_error() == Some(libc::EMFILE) {
                    " (the open files limit, `ulimit -n`, is too low even for one stream)"
                } else {
                    ""
                };
                format!("creating {}: {e}{hint}", path.display())
            })?;
            self.files.insert(i, f);
        }
        Ok(self.files.get_mut(&i).expect("inserted above"))
    }

    /// Write what stream `i` has now to its file.
    fn drain_stream<S: Source>(&mut self, src: &mut S, i: u32, final_poll: bool) {
        if self.error.is_some() {
            // Drained and dropped: what was recorded before the error stays readable (the
            // counts in `info.json` are those of the files).
            src.drain(i, |_, _, _| {});
            return;
        }
        // In pieces of a few MiB, each written before the next is read (the CLI holds one
        // piece, not a ring); at most MAX_PIECES a poll while the program runs (the other
        // rings' turn), everything at the last poll.
        let mut pieces = 0;
        let mut buf = std::mem::take(&mut self.buf);
        loop {
            buf.clear();
            let records = src.drain_raw(i, &mut buf).unwrap_or(0) as u64;
            if records == 0 {
                break;
            }
            let bytes = 8 * buf.len() as u64;
            // The words' bytes as they are in memory (little-endian on x86-64, as the format
            // says): kept while the stream is small, else one write of the whole span.
            let written = if self.own_file[i as usize] {
                let path = self.dir.join(ring_file(i));
                self.file(i).and_then(|out| {
                    out.write_all(words_as_bytes(&buf))
                        .map_err(|e| format!("writing {}: {e}", path.display()))
                })
            } else {
                let p = self.pending.entry(i).or_default();
                p.extend_from_slice(words_as_bytes(&buf));
                self.pending_bytes += buf.len() * 8;
                if p.len() >= SPILL {
                    let entry = stream_entry(src, i);
                    self.spill(i, entry)
                } else {
                    Ok(())
                }
            };
            if let Err(e) = written {
                self.fail(e);
                break;
            }
            self.records[i as usize] += records;
            self.bytes[i as usize] += bytes;
            self.note_images(&buf);
            pieces += 1;
            if !final_poll && pieces >= MAX_PIECES {
                break;
            }
        }
        self.buf = buf;
    }

    /// Stream `i`'s records kept in memory go to a file of its own, where the rest will go
    /// (`entry`: its thread, for the journal).
    fn spill(&mut self, i: u32, entry: Option<RingInfo>) -> Result<(), String> {
        self.own_file[i as usize] = true;
        if let Some(entry) = entry {
            self.journal(&JournalEntry::Stream(entry))?;
        }
        let Some(p) = self.pending.remove(&i) else {
            return Ok(());
        };
        self.pending_bytes -= p.len();
        let path = self.dir.join(ring_file(i));
        self.file(i)?
            .write_all(&p)
            .map_err(|e| format!("writing {}: {e}", path.display()))
    }

    /// Stream `i` ended: its records kept in memory go to the end of [`SMALL_FILE`] (`entry`:
    /// its thread, for the journal).
    fn settle(&mut self, i: u32, entry: Option<RingInfo>) -> Result<(), String> {
        let Some(p) = self.pending.remove(&i) else {
            return Ok(());
        };
        self.pending_bytes -= p.len();
        let path = self.dir.join(SMALL_FILE);
        if self.small.is_none() {
            let f = OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .open(&path)
                .map_err(|e| format!("creating {}: {e}", path.display()))?;
            self.small = Some(f);
        }
        self.offsets[i as usize] = Some(self.small_len);
        if let Some(mut entry) = entry {
            entry.file = SMALL_FILE.to_owned();
            entry.offset = Some(self.small_len);
            entry.records = self.records[i as usize];
            entry.bytes = p.len() as u64;
            self.journal(&JournalEntry::Stream(entry))?;
        }
        let f = self.small.as_mut().expect("opened above");
        // Counted first: a write cut short by a full disk leaves the stream's first records
        // readable, and the next segment (if any) starts after all of it.
        self.small_len += p.len() as u64;
        f.write_all(&p)
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
        Ok(())
    }

    /// Over the memory budget: the largest streams kept in memory get files of their own.
    fn trim_pending<S: Source>(&mut self, src: &S) {
        while self.pending_bytes > PENDING_BUDGET && self.error.is_none() {
            let Some((&i, _)) = self.pending.iter().max_by_key(|(_, p)| p.len()) else {
                break;
            };
            if let Err(e) = self.spill(i, stream_entry(src, i)) {
                self.fail(e);
            }
        }
    }

    /// The [`TEXT_IMAGE`](crate::symbols::TEXT_IMAGE) records among `words` (records as the
    /// ring holds them): the images the recording's readers name records from.
    fn note_images(&mut self, words: &[u64]) {
        let mut at = 0;
        while at < words.len() {
            let h = words[at];
            let len = (h & 0xffff) as usize;
            if len == 0 {
                break;
            }
            let (rt, aux) = (((h >> 16) & 0xffff) as u16, (h >> 32) as u32);
            let payload = &words[(at + 1).min(words.len())..(at + len).min(words.len())];
            if rt == ftprobe::trace::rtype::TEXT && aux == crate::symbols::TEXT_IMAGE {
                let bytes: Vec<u8> = payload
                    .iter()
                    .flat_map(|w| w.to_le_bytes())
                    .filter(|&b| b != 0)
                    .collect();
                if let Some(im) = crate::symbols::parse_image(&String::from_utf8_lossy(&bytes)) {
                    if !self.info.images.contains(&im) {
                        if let Err(e) = self.journal(&JournalEntry::Image(im.clone())) {
                            self.fail(e);
                        }
                        self.info.images.push(im);
                    }
                }
            }
            at += len;
        }
    }

    /// Once the agent armed (the run is recording): the staging directory becomes the data
    /// directory. Open files keep writing to it.
    fn rotate_once_armed<S: Source>(&mut self, src: &S) {
        if self.rotated || self.error.is_some() || !src.armed() {
            return;
        }
        // What a reader needs from the start, written in the staging directory before it
        // becomes the data directory (a kill in between leaves `DIR` as it was, or a
        // recording a reader opens): a partial info.json, then the journal (its descriptor
        // follows the rename).
        self.info.clock = src.clock().to_parts();
        self.info.tsc_hz = src.clock().tsc_hz();
        self.info.armed = true;
        self.info.partial = true;
        let journal = || {
            OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .open(self.dir.join(JOURNAL))
        };
        let started = self
            .write_info(Vec::<RingInfo>::new())
            .map_err(|e| format!("{e:#}"))
            .and_then(|()| {
                journal().map_err(|e| format!("creating {}: {e}", self.dir.join(JOURNAL).display()))
            });
        match started {
            Ok(f) => self.journal = Some(f),
            Err(e) => return self.fail(e),
        }
        match rotate(&self.dir, &self.target) {
            Ok(()) => {
                self.dir = self.target.clone();
                self.rotated = true;
            }
            Err(e) => return self.fail(format!("{e:#}")),
        }
        self.journal_objects();
    }

    /// Append `entry` to the journal, in one write (a line cut by a kill or a full disk is
    /// the last one, and readers skip it).
    fn journal(&mut self, entry: &JournalEntry) -> Result<(), String> {
        let Some(f) = self.journal.as_mut() else {
            return Ok(());
        };
        let mut line = serde_json::to_vec(entry).map_err(|e| e.to_string())?;
        line.push(b'\n');
        f.write_all(&line)
            .map_err(|e| format!("writing {}: {e}", self.dir.join(JOURNAL).display()))
    }

    /// Write `info.json` (with `rings`) whole or not at all: a full disk must not leave an
    /// empty `info.json` beside the records.
    fn write_info<R: Serialize>(&self, rings: R) -> Result<()> {
        let path = self.dir.join("info.json");
        let tmp = self.dir.join("info.json.tmp");
        let out = InfoOut {
            info: &self.info,
            rings,
        };
        let write = || -> std::io::Result<()> {
            let f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)?;
            let mut w = std::io::BufWriter::new(f);
            serde_json::to_writer_pretty(&mut w, &out)?;
            w.write_all(b"\n")?;
            w.into_inner().map_err(|e| e.into_error())?.sync_all()?;
            std::fs::rename(&tmp, &path)
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            anyhow::Error::from(e).context(format!("writing {}", path.display()))
        })
    }

    fn fail(&mut self, what: String) {
        if self.error.is_none() {
            if self.rotated {
                eprintln!(
                    "ftprobe: {what}: recording stopped; what was written before is readable \
                     (`ftprobe replay -d {}`)",
                    self.target.display()
                );
            } else {
                eprintln!("ftprobe: {what}");
            }
            self.error = Some(what);
        }
    }

    /// One entry per entry of the table (`load_tsc`: when each was added), in its order;
    /// the files not seen before copied into `objects/`.
    fn copy_objects(&mut self, table: Vec<(u64, Vec<u8>)>, load_tsc: &[u64]) {
        // The table only grows (objects loaded later are appended): the entries past those
        // kept are new. A table that is not a continuation (another session's) starts over.
        if !table.starts_with(&self.table) {
            self.objects.clear();
            self.journaled_objects = 0;
        }
        for (k, (bias, path)) in table.iter().enumerate().skip(self.objects.len()) {
            let path = String::from_utf8_lossy(path).into_owned();
            let load_tsc = load_tsc.get(k).copied().unwrap_or(0);
            // The same file mapped again: its copy is there already.
            if let Some(o) = self.objects.iter().find(|o| o.path == path).cloned() {
                self.objects.push(ObjectInfo {
                    bias: *bias,
                    load_tsc,
                    ..o
                });
                continue;
            }
            let (build_id, copy) = match copy_object(&self.dir, Path::new(&path)) {
                Ok(x) => x,
                Err(e) => {
                    eprintln!("ftprobe: not copying {path}: {e:#}");
                    (None, None)
                }
            };
            self.objects.push(ObjectInfo {
                bias: *bias,
                path,
                build_id,
                copy,
                load_tsc,
            });
        }
        self.table = table;
        self.journal_objects();
    }

    /// The table's entries not in the journal yet go there, in the table's order.
    fn journal_objects(&mut self) {
        while self.journal.is_some() && self.journaled_objects < self.table.len() {
            let Some(o) = self.objects.get(self.journaled_objects).cloned() else {
                break;
            };
            if let Err(e) = self.journal(&JournalEntry::Object(o)) {
                return self.fail(e);
            }
            self.journaled_objects += 1;
        }
    }
}

/// Stream `i`'s thread, for the journal (its place and counts are the caller's to fill).
fn stream_entry<S: Source>(src: &S, i: u32) -> Option<RingInfo> {
    let (comm, tid) = src.task(i)?;
    Some(RingInfo {
        index: i,
        ring: src.ring_index(i),
        tid,
        pid: src.pid(i),
        comm: String::from_utf8_lossy(&comm).into_owned(),
        comm_bytes: std::str::from_utf8(&comm).is_err().then_some(comm),
        lost: 0,
        records: 0,
        bytes: 0,
        file: ring_file(i),
        offset: None,
    })
}

/// Copy the object at `path` into `dir/objects/` (once per build-id or contents): its
/// build-id (hex) and the copy's path relative to `dir`.
fn copy_object(dir: &Path, path: &Path) -> Result<(Option<String>, Option<String>)> {
    use object::Object;
    use std::hash::{Hash, Hasher};

    let data = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let build_id = object::File::parse(&*data)
        .ok()
        .and_then(|f| f.build_id().ok().flatten().map(hex));
    let key = build_id.clone().unwrap_or_else(|| {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        data.hash(&mut h);
        format!("h{:016x}", h.finish())
    });
    let name = path
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let rel = format!("objects/{key}-{name}");
    let dest = dir.join(&rel);
    if !dest.exists() {
        // 0600 whatever the program's own mode: a copy of a 0700 program is not readable by
        // others either.
        let write = || {
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&dest)?
                .write_all(&data)
        };
        if let Err(e) = write() {
            // No cut copy left behind (a full disk): the reader falls back to the original.
            let _ = std::fs::remove_file(&dest);
            return Err(e).with_context(|| format!("writing {}", dest.display()));
        }
    }
    Ok((build_id, Some(rel)))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Sink for Recorder {
    fn poll<S: Source>(&mut self, src: &mut S, final_poll: bool) {
        self.rotate_once_armed(src);
        let table = src.objects();
        if table != self.table {
            let times = src.object_load_times();
            self.copy_objects(table, &times);
        }
        let n = src.claimed().min(src.nr_rings()) as usize;
        if self.records.len() < n {
            self.records.resize(n, 0);
            self.bytes.resize(n, 0);
            self.own_file.resize(n, false);
            self.offsets.resize(n, None);
        }
        let mut active = std::mem::take(&mut self.active);
        src.active(&mut active);
        // The streams that ended since the last poll (read to the end then): their files are
        // complete, and those kept in memory go to the shared file.
        let ended: Vec<u32> = self
            .files
            .keys()
            .copied()
            .filter(|i| active.binary_search(i).is_err())
            .collect();
        for i in ended {
            self.close(i);
        }
        let settled: Vec<u32> = self
            .pending
            .keys()
            .copied()
            .filter(|i| active.binary_search(i).is_err())
            .collect();
        for i in settled {
            if let Err(e) = self.settle(i, stream_entry(src, i)) {
                self.fail(e);
            }
        }
        for &i in &active {
            self.drain_stream(src, i, final_poll);
        }
        self.trim_pending(src);
        self.active = active;
    }

    fn flush(&mut self) {}

    fn finish<S: Source>(&mut self, src: &mut S, end: &End) -> Result<()> {
        // Every file closed first: `info.json` then has a descriptor to be written
        // with, whatever happened before.
        let open: Vec<u32> = self.files.keys().copied().collect();
        for i in open {
            self.close(i);
        }
        // The streams still in memory (threads alive at the end), to the shared file.
        let kept: Vec<u32> = self.pending.keys().copied().collect();
        for i in kept {
            if let Err(e) = self.settle(i, stream_entry(src, i)) {
                self.fail(e);
            }
        }
        self.small = None;
        self.rotate_once_armed(src);
        if !self.rotated {
            // Nothing recorded (or it could not be moved in place): `run` says so.
            return Ok(());
        }
        let info = &mut self.info;
        info.clock = src.clock().to_parts();
        info.tsc_hz = src.clock().tsc_hz();
        info.armed = src.armed();
        // `nr_rings` stays --rings; the streams are `claimed`.
        info.claimed = src.claimed();
        info.lost_no_ring = src.lost_no_ring();
        (info.lost_unreclaimed, info.lost_after_end) = src.lost_no_ring_kinds();
        info.lost_by_tid = src
            .lost_by_tid()
            .into_iter()
            .map(|(t, n)| [u64::from(t), n])
            .collect();
        info.lost_recursion = src.lost_recursion();
        info.fgraph_overrun = src.fgraph_overrun();
        info.event_counters = (0..info.events.len() as u32)
            .map(|id| {
                let (d, m) = src.event_counters(id);
                [d, m]
            })
            .collect();
        info.end = end.clone();
        // One entry per entry of the table, in its order (each load with its own time).
        info.objects = self.objects.clone();
        // Losses are said at the end, as perf record does (the recording keeps the details).
        let streams = 0..src.claimed().min(src.nr_rings());
        let full: u64 = streams.clone().map(|i| src.lost(i)).sum();
        let total = full + self.info.lost_no_ring + self.info.lost_recursion;
        if total > 0 {
            eprintln!(
                "ftprobe: {total} events lost ({full} to full rings, {} with no ring free, {} \
                 to recursion): `ftprobe replay -d {}` says where; --buffer-size-kb and \
                 --rings give more room",
                self.info.lost_no_ring,
                self.info.lost_recursion,
                self.target.display()
            );
        }
        self.info.partial = false;
        self.info.stopped = self.error.clone();
        let (records, bytes, offsets) = (&self.records, &self.bytes, &self.offsets);
        let ring_info = |i: u32| -> Option<RingInfo> {
            let offset = offsets.get(i as usize).copied().flatten();
            Some(RingInfo {
                lost: src.lost(i),
                records: records.get(i as usize).copied().unwrap_or(0),
                bytes: bytes.get(i as usize).copied().unwrap_or(0),
                file: match offset {
                    Some(_) => SMALL_FILE.to_owned(),
                    None => ring_file(i),
                },
                offset,
                ..stream_entry(src, i)?
            })
        };
        if let Err(e) = self.write_info(SeqOf(|| streams.clone().filter_map(ring_info))) {
            // The partial info.json and the journal stay: the recording is read from them.
            self.fail(format!("{e:#}"));
            return Ok(());
        }
        // The final info.json holds everything the journal said.
        self.journal = None;
        let _ = std::fs::remove_file(self.dir.join(JOURNAL));
        Ok(())
    }

    fn failed(&self) -> bool {
        self.error.is_some()
    }
}

/// Run the command; returns the exit code to exit with.
pub fn run(args: RecordArgs) -> Result<i32> {
    if args.session.pid.is_some() {
        anyhow::bail!("record -p (attach) is not supported yet: use `ftprobe trace -p PID`");
    }
    if args.session.control || args.session.interactive {
        return Err(crate::usage!(
            "--control and --interactive are options of `trace` (a recording's events are \
             fixed when it starts)"
        ));
    }
    let plan = session::prepare(args.session)?;
    let staging = make_staging(&args.dir)?;
    let a = &plan.args;
    let info = Info {
        format: FORMAT,
        partial: false,
        stopped: None,
        command: a.cmd.clone(),
        tracer: plan.tracer.to_owned(),
        filter: a.filter.clone(),
        notrace: a.notrace.clone(),
        graph_function: a.graph_function.clone(),
        graph_notrace: a.graph_notrace.clone(),
        max_depth: a.max_depth,
        options: a.options.clone(),
        buffer_size_kb: a.buffer_size_kb,
        events: plan.events.iter().map(|(defs, _)| defs.clone()).collect(),
        clock: [0; 3],
        tsc_hz: 0,
        ncpus: session::nr_cpus(),
        cpus_online: session::cpus_online(),
        armed: false,
        nr_rings: a.nr_rings(),
        claimed: 0,
        rings: Vec::new(),
        lost_no_ring: 0,
        lost_unreclaimed: 0,
        lost_after_end: 0,
        lost_by_tid: Vec::new(),
        lost_recursion: 0,
        fgraph_overrun: 0,
        event_counters: Vec::new(),
        end: End::default(),
        objects: Vec::new(),
        images: Vec::new(),
    };
    let mut recorder = Recorder {
        dir: staging.clone(),
        target: args.dir,
        rotated: false,
        files: BTreeMap::new(),
        records: Vec::new(),
        bytes: Vec::new(),
        pending: BTreeMap::new(),
        pending_bytes: 0,
        own_file: Vec::new(),
        offsets: Vec::new(),
        small: None,
        small_len: 0,
        active: Vec::new(),
        table: Vec::new(),
        objects: Vec::new(),
        error: None,
        info,
        journal: None,
        journaled_objects: 0,
        buf: Vec::new(),
    };
    let r = session::run(plan, &mut recorder);
    if !recorder.rotated {
        let _ = std::fs::remove_dir_all(&staging);
        if recorder.error.is_none() {
            eprintln!(
                "ftprobe: nothing was recorded: {} left as it was",
                recorder.target.display()
            );
        }
        // A run that recorded nothing is a failure, whatever the program's exit code.
        return r.map(|code| if code == 0 { 1 } else { code });
    }
    r
}
