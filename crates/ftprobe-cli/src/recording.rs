//! Reading a recording ([`crate::record`]): its `info.json` and ring files, as a [`Source`]
//! for `ftprobe replay`'s printer, and as per-thread record streams and calls for `ftprobe
//! report` and `ftprobe dump`. One decoder of the files for every reader of a recording.
//!
//! [`Recording::calls`] rebuilds a thread's calls from its function_graph records: an entry
//! opens a frame, the return with the same function closes it (its duration is the return's
//! timestamp less its `calltime`, as `trace` prints it). A call whose return says it was cut
//! off (unwound, longjmp, lost), and a call still open at the thread's last record, counts
//! with its time to the cut and is marked `cut`. A call's self time is its duration less its
//! children's.
//!
//! A recording whose recorder died (killed, a full disk) or whose files were damaged is read
//! as far as it goes, as perf and trace-cmd read a cut file: a partial `info.json` is
//! completed from the journal ([`crate::format::JOURNAL`]), ring files no entry names are
//! read as threads of unknown identity, a file cut short is read up to its last whole
//! record, and every such thing is said on standard error (`ftprobe: warning: ...`), once.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use ftprobe::events::ProbeDef;
use ftprobe::record::{self, rtype, Record};
use ftprobe::ring::Clock;
use ftprobe::trace_kprobe;

use crate::filter::{parse_tids, Ctx as FilterCx, Filters, Names, ThreadFilter, TimeRange};
use crate::format::{Info, JournalEntry, RingInfo, FORMAT, JOURNAL, SMALL_FILE};
use crate::session::Source;
use crate::symbols::Symbols;
use ftprobe::ftrace::fgraph::FgraphExit;

/// The data directory `ftprobe record` writes when no `-d` is given, and the readers read
/// when none is given: the last recording made there.
pub const DEFAULT_DIR: &str = "ftprobe.data";

/// The `-d DIR` (or `-i DIR`) of the commands that read a recording.
#[derive(clap::Args)]
pub struct DataDir {
    /// The recording's data directory (`-i DIR` too). Default: the last recording `ftprobe
    /// record` made without `-d` (`ftprobe.data`).
    #[arg(
        short = 'd',
        short_alias = 'i',
        long = "data",
        value_name = "DIR",
        default_value = DEFAULT_DIR
    )]
    pub dir: PathBuf,
}

/// `--tid` and `--time-range`, shared by the readers of a recording.
#[derive(clap::Args, Clone)]
pub struct Selection {
    /// Only these threads (`--tid 1234,1240`). Repeatable.
    #[arg(long = "tid", value_name = "TID[,TID]", value_parser = parse_tids)]
    pub tid: Vec<Vec<u32>>,
    /// Only records in this time range, `START~END` as uftrace takes it: timestamps as
    /// printed (`11439.845101~11439.9`), or times with a unit (`ns`, `us`, `ms`, `s`) after
    /// the recording's first record (`10ms~25ms`); either side may be empty.
    #[arg(long = "time-range", value_name = "START~END", value_parser = clap::value_parser!(TimeRange))]
    pub time_range: Option<TimeRange>,
}

impl Selection {
    pub fn filters(&self) -> Filters {
        Filters {
            tids: self.tid.iter().flatten().copied().collect(),
            range: self.time_range,
            ..Filters::default()
        }
    }
}

/// Records a drain of a recording hands out per ring at most (the merge's chunk).
pub const CHUNK: usize = 1 << 12;

/// A stream's records in a recording: a file of its own, or a segment of a file that holds
/// the streams of short-lived threads one after another.
#[derive(Clone, Debug)]
pub struct Stream {
    pub path: PathBuf,
    /// Its first byte in the file.
    pub offset: u64,
    /// Its bytes and records, as `info.json` gives them ([`UNKNOWN`] records: as many as
    /// the bytes hold).
    pub bytes: u64,
    pub records: u64,
}

/// A stream's record count when nothing says it (a journal's stream, a damaged entry).
pub const UNKNOWN: u64 = u64::MAX;

/// A stream's file, read one record at a time through a buffer.
pub struct RingFile {
    r: BufReader<File>,
    /// The recording's format (1: another header word; 2 and 3: as the rings hold it).
    format: u32,
    /// The current record's payload, and its bytes as read.
    words: Vec<u64>,
    bytes: Vec<u8>,
    /// Words of the stream read so far (for errors), and the stream's length in words.
    at: u64,
    len: u64,
    /// The stream ended inside a record (a file cut short): the records before it were read.
    cut: bool,
}

impl RingFile {
    fn open(s: &Stream, format: u32) -> std::io::Result<RingFile> {
        RingFile::open_at(s, format, 0)
    }

    /// Stream `s` from word `at` on (a record's start: where an earlier `RingFile` of it
    /// stopped). A file shorter than the stream (said when the recording was opened) ends
    /// it: the records before are read.
    fn open_at(s: &Stream, format: u32, at: u64) -> std::io::Result<RingFile> {
        use std::io::Seek;
        let mut f = File::open(&s.path)?;
        let start = s.offset + at * 8;
        if start != 0 {
            f.seek(std::io::SeekFrom::Start(start))?;
        }
        // A short stream (a segment of the shared file) reads no more than it holds.
        let left = s.bytes.saturating_sub(at * 8).clamp(8, 64 << 10) as usize;
        Ok(RingFile {
            r: BufReader::with_capacity(left, f),
            format,
            words: Vec::new(),
            bytes: Vec::new(),
            at,
            len: s.bytes / 8,
            cut: false,
        })
    }

    /// The next record (rtype, aux; its payload in `self.words`), `None` at the end (and
    /// `self.cut` when the stream ends inside a record).
    fn next(&mut self) -> Result<Option<(u16, u32)>> {
        if self.at >= self.len {
            return Ok(None);
        }
        let mut b = [0u8; 8];
        match self.r.read_exact(&mut b) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                self.cut = true;
                return Ok(None);
            }
            Err(e) => return Err(e.into()),
        }
        let h = u64::from_le_bytes(b);
        // Format 2: header words as the rings hold them (`len` counts the header); format 1:
        // `rtype | payload words << 16 | aux << 32`.
        let (rtype, len) = if self.format == 1 {
            ((h & 0xffff) as u16, ((h >> 16) & 0xffff) as usize)
        } else {
            let len = (h & 0xffff) as usize;
            if len == 0 {
                // Not a record: the stream is damaged from here.
                self.cut = true;
                return Ok(None);
            }
            (((h >> 16) & 0xffff) as u16, len - 1)
        };
        if self.at + 1 + len as u64 > self.len {
            self.cut = true;
            return Ok(None);
        }
        self.bytes.resize(len * 8, 0);
        match self.r.read_exact(&mut self.bytes) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                self.cut = true;
                return Ok(None);
            }
            Err(e) => return Err(e.into()),
        }
        self.words.clear();
        self.words.extend(
            self.bytes
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))),
        );
        self.at += 1 + len as u64;
        Ok(Some((rtype, (h >> 32) as u32)))
    }
}

/// The fields of `info.json` a reader can do without, each with the value taken when it is
/// missing (said in `warnings`). The others (`format`, `tracer`, `clock`, `tsc_hz`) are needed
/// to read any record: without one, parsing fails and says which.
fn fill_missing(v: &mut serde_json::Value, warnings: &mut Vec<String>) {
    use serde_json::json;
    let Some(o) = v.as_object_mut() else {
        return;
    };
    let defaults = [
        ("command", json!([])),
        ("filter", json!([])),
        ("notrace", json!([])),
        ("graph_function", json!([])),
        ("graph_notrace", json!([])),
        ("max_depth", json!(0)),
        ("options", json!([])),
        ("buffer_size_kb", json!(0)),
        ("events", json!([])),
        ("ncpus", json!(1)),
        ("cpus_online", json!(1)),
        ("armed", json!(true)),
        ("nr_rings", json!(0)),
        ("claimed", json!(0)),
        ("lost_no_ring", json!(0)),
        ("lost_recursion", json!(0)),
        ("fgraph_overrun", json!(0)),
        ("event_counters", json!([])),
        (
            "end",
            serde_json::to_value(crate::session::End::default()).unwrap_or_default(),
        ),
        ("objects", json!([])),
    ];
    for (key, default) in defaults {
        if !o.contains_key(key) {
            warnings.push(format!("info.json has no `{key}`: taken as {default}"));
            o.insert(key.to_owned(), default);
        }
    }
}

/// Whether `rel` names a regular file of the recording at `dir`: a relative path with no
/// `..` (a crafted info.json must not make a reader open `/etc/shadow`, or a FIFO that
/// blocks it forever), not a symbolic link.
fn file_of(dir: &Path, rel: &str) -> std::result::Result<PathBuf, &'static str> {
    let p = Path::new(rel);
    if p.is_absolute()
        || p.components()
            .any(|c| !matches!(c, std::path::Component::Normal(_)))
    {
        return Err("not a path inside the recording");
    }
    let path = dir.join(p);
    match std::fs::symlink_metadata(&path) {
        Ok(m) if m.file_type().is_file() => Ok(path),
        Ok(_) => Err("not a regular file"),
        Err(_) => Err("missing"),
    }
}

/// Whether `path` (an object's original, named by a recording) is a regular file.
fn regular(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_file())
}

/// Complete and check `info` against the files of `dir` (module docs): a partial
/// `info.json` from the journal, ring files no entry names, entries whose files are missing,
/// shorter than they say, or whose counts disagree. What it finds goes to `warnings`.
fn complete(dir: &Path, info: &mut Info, warnings: &mut Vec<String>) {
    if info.partial {
        warnings.push(
            "the recording was not finished (its recorder was killed, or stopped on an \
             error): reading what its files hold; its lost-event counts and how the program \
             ended are unknown"
                .to_owned(),
        );
        read_journal(dir, info, warnings);
    }
    if let Some(why) = &info.stopped {
        warnings.push(format!(
            "recording stopped before the program ended ({why}): the records after are missing"
        ));
    }
    if info.format >= 2 {
        add_unnamed_streams(dir, info, warnings);
    }
    for r in &mut info.rings {
        if r.records == 0 && r.bytes == 0 {
            continue;
        }
        let thread = format!("thread {} ({})", r.tid, r.comm);
        let size = match file_of(dir, &r.file) {
            Ok(p) => std::fs::metadata(p).map_or(0, |m| m.len()),
            Err(why) => {
                warnings.push(format!(
                    "{}: {why}: {thread}'s records are not read",
                    r.file
                ));
                (r.records, r.bytes) = (0, 0);
                continue;
            }
        };
        let offset = r.offset.unwrap_or(0);
        if r.records == UNKNOWN && r.bytes == 0 && r.offset.is_none() {
            // A journal's stream with a file of its own: to the file's end.
            r.bytes = size;
            continue;
        }
        if size < offset.saturating_add(r.bytes) {
            warnings.push(format!(
                "{}: cut short: {size} bytes, where info.json puts {thread}'s {} bytes at \
                 offset {offset}: the records before the cut are read",
                r.file, r.bytes
            ));
            r.bytes = size.saturating_sub(offset);
            r.records = UNKNOWN;
        }
        if r.records == 0 && r.bytes > 0 {
            warnings.push(format!(
                "info.json says {thread} has no records, and gives it {} bytes in {}: they are \
                 read",
                r.bytes, r.file
            ));
            r.records = UNKNOWN;
        } else if r.bytes == 0 && r.records != 0 && r.records != UNKNOWN {
            warnings.push(format!(
                "info.json gives {thread} {} records and no bytes in {}{}",
                r.records,
                r.file,
                if r.offset.is_none() {
                    ": its file is read"
                } else {
                    ""
                }
            ));
            if r.offset.is_none() {
                r.bytes = size;
            }
            r.records = UNKNOWN;
        }
    }
    if info.format >= 2 {
        let end = info.rings.iter().map(|r| r.index + 1).max().unwrap_or(0);
        info.claimed = info.claimed.max(end);
    }
    check_objects(dir, info, warnings);
}

/// Object copies that are missing or cut (shorter than their ELF header's section table
/// says): said, once per file; their addresses print as numbers.
fn check_objects(dir: &Path, info: &Info, warnings: &mut Vec<String>) {
    let mut seen = std::collections::HashSet::new();
    for o in &info.objects {
        let Some(copy) = &o.copy else { continue };
        if !seen.insert(copy.as_str()) {
            continue;
        }
        if let Err(why) = file_of(dir, copy)
            .map_err(str::to_owned)
            .and_then(|p| whole_elf(&p))
        {
            warnings.push(format!(
                "{copy} (the copy of {}) is missing or cannot be read ({why}): addresses in it \
                 print as numbers",
                o.path
            ));
        }
    }
}

/// Whether `path` is an ELF file as long as its header says (its section headers, which
/// come last, inside it).
fn whole_elf(path: &Path) -> std::result::Result<(), String> {
    let mut f = File::open(path).map_err(|e| e.to_string())?;
    let len = f.metadata().map_err(|e| e.to_string())?.len();
    let mut h = [0u8; 64];
    f.read_exact(&mut h).map_err(|_| format!("{len} bytes"))?;
    if &h[..4] != b"\x7fELF" || h[4] != 2 {
        return Err("not a 64-bit ELF file".to_owned());
    }
    let u = |at: usize, n: usize| {
        h[at..at + n]
            .iter()
            .rev()
            .fold(0u64, |v, &b| (v << 8) | u64::from(b))
    };
    // e_shoff, e_shentsize, e_shnum.
    let end = u(0x28, 8).saturating_add(u(0x3a, 2).saturating_mul(u(0x3c, 2)));
    if len < end {
        return Err(format!("{len} bytes, its section headers end at {end}"));
    }
    Ok(())
}

/// Add to a partial `info.json` what the journal says (a line cut by the recorder's death
/// is skipped).
fn read_journal(dir: &Path, info: &mut Info, warnings: &mut Vec<String>) {
    let text = match std::fs::read(dir.join(JOURNAL)) {
        Ok(t) => t,
        Err(e) => {
            warnings.push(format!(
                "{JOURNAL}: {e}: the threads and objects of the recording are unknown"
            ));
            return;
        }
    };
    let lines: Vec<&[u8]> = text.split(|&b| b == b'\n').collect();
    // By stream index: a later line of a stream replaces an earlier one.
    let mut streams: std::collections::BTreeMap<u32, RingInfo> = std::mem::take(&mut info.rings)
        .into_iter()
        .map(|r| (r.index, r))
        .collect();
    for (k, line) in lines.iter().enumerate() {
        if line.is_empty() {
            continue;
        }
        match serde_json::from_slice::<JournalEntry>(line) {
            Ok(JournalEntry::Object(o)) => info.objects.push(o),
            Ok(JournalEntry::Stream(mut r)) => {
                if r.offset.is_none() {
                    (r.records, r.bytes) = (UNKNOWN, 0);
                }
                streams.insert(r.index, r);
            }
            Ok(JournalEntry::Image(im)) => {
                if !info.images.contains(&im) {
                    info.images.push(im);
                }
            }
            Err(_) if k + 1 == lines.len() => {
                warnings.push(format!("{JOURNAL}: its last line is cut: skipped"));
            }
            Err(e) => warnings.push(format!("{JOURNAL}, line {}: {e}: skipped", k + 1)),
        }
    }
    info.rings = streams.into_values().collect();
}

/// Ring files no entry of `info` names (a stream whose journal line was never written, a
/// `rings` list removed), and the end of [`SMALL_FILE`] past every segment named: read as
/// threads of unknown identity (tid 0), and said.
fn add_unnamed_streams(dir: &Path, info: &mut Info, warnings: &mut Vec<String>) {
    let mut next = info.rings.iter().map(|r| r.index + 1).max().unwrap_or(0);
    let mut unnamed = |info: &mut Info, file: String, offset: Option<u64>, bytes: u64| {
        let taken = |i: u32| info.rings.iter().any(|r| r.index == i);
        let own = file
            .strip_prefix("ring-")
            .and_then(|f| f.strip_suffix(".dat"))
            .and_then(|n| n.parse::<u32>().ok())
            .filter(|&n| !taken(n));
        let index = own.unwrap_or_else(|| {
            next += 1;
            next - 1
        });
        next = next.max(index + 1);
        warnings.push(format!(
            "{file}{}: {bytes} bytes no entry of info.json names: read as thread 0 (<unknown>)",
            offset.map_or_else(String::new, |o| format!(" from byte {o}"))
        ));
        info.rings.push(RingInfo {
            index,
            ring: None,
            tid: 0,
            pid: None,
            comm: "<unknown>".to_owned(),
            comm_bytes: None,
            lost: 0,
            records: UNKNOWN,
            bytes,
            file,
            offset,
        });
    };
    let mut files: Vec<(String, u64)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let e = e.ok()?;
            let name = e.file_name().into_string().ok()?;
            let is_ring = name.starts_with("ring-") && name.ends_with(".dat");
            let m = e.metadata().ok()?;
            ((is_ring || name == SMALL_FILE) && m.file_type().is_file()).then_some((name, m.len()))
        })
        .collect();
    files.sort();
    for (name, size) in files {
        if name == SMALL_FILE {
            let named = info
                .rings
                .iter()
                .filter(|r| r.file == SMALL_FILE)
                .map(|r| r.offset.unwrap_or(0).saturating_add(r.bytes))
                .max()
                .unwrap_or(0);
            if size > named {
                unnamed(info, name, Some(named), size - named);
            }
        } else if size > 0 && !info.rings.iter().any(|r| r.file == name) {
            unnamed(info, name, None, size);
        }
    }
    info.rings.sort_by_key(|r| r.index);
}

/// A ring of a recording being read.
struct Cursor {
    /// Open while a read is under way: closed between chunks, so that a recording of many
    /// threads is read with one file descriptor (`at`: where to go on).
    file: Option<RingFile>,
    at: u64,
    stream: Stream,
    /// Records read so far (checked against the stream's count at its end).
    read: u64,
    filter: ThreadFilter,
    done: bool,
}

/// A recording, as a [`Source`] that hands out each ring's records in chunks, through the
/// filters: a reader holds O(rings x chunk) records, never the whole recording.
pub struct Recording {
    pub info: Info,
    dir: PathBuf,
    /// By ring index (`None`: not read, or no such ring).
    cursors: Vec<Option<Cursor>>,
    /// The objects table, the paths those of the copies.
    objects: Vec<(u64, Vec<u8>)>,
    pub filters: Filters,
    names: Names,
    /// The time range, CLOCK_MONOTONIC ns.
    range: (u64, u64),
    /// The recording's first timestamp, CLOCK_MONOTONIC ns.
    pub start_ns: u64,
    /// The first read error.
    error: Option<anyhow::Error>,
    /// Per stream, its first timestamp (raw TSC), once asked ([`Recording::select_stream`]).
    first_tsc: std::collections::HashMap<u32, u64>,
    /// What was said on standard error about the recording (each once).
    warned: std::cell::RefCell<std::collections::HashSet<String>>,
}

impl Recording {
    /// Open the recording at `dir`, to be read through `filters`.
    pub fn open_filtered(dir: &Path, filters: Filters) -> Result<Recording> {
        let path = dir.join("info.json");
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !dir.exists() => {
                bail!(
                    "no recording at {}: run `ftprobe record -- CMD` first (it writes \
                     {DEFAULT_DIR} by default), or name one with -i DIR",
                    dir.display()
                )
            }
            Err(e)
                if e.kind() == std::io::ErrorKind::NotFound
                    && std::fs::read_dir(dir).is_ok_and(|mut d| {
                        d.any(|f| {
                            f.is_ok_and(|f| f.file_name().to_string_lossy().starts_with("ring"))
                        })
                    }) =>
            {
                bail!(
                    "{} has records but no info.json: `ftprobe record` was killed before it \
                     wrote it (it writes one when the program starts recording), or it was \
                     removed: without it (the clock, the tracer, the events) the records \
                     cannot be read",
                    dir.display()
                )
            }
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("reading {} (not a recording?)", path.display()))
            }
        };
        let mut warnings = Vec::new();
        let mut value: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        fill_missing(&mut value, &mut warnings);
        let mut info: Info =
            serde_json::from_value(value).with_context(|| format!("parsing {}", path.display()))?;
        if !(1..=FORMAT).contains(&info.format) {
            bail!(
                "{}: format {} (this ftprobe reads 1 to {FORMAT})",
                path.display(),
                info.format
            );
        }
        complete(dir, &mut info, &mut warnings);
        let objects = info
            .objects
            .iter()
            .map(|o| {
                let p = match &o.copy {
                    // Not copied: the original, if it is still there (a regular file).
                    None => Some(PathBuf::from(&o.path)).filter(|p| regular(p)),
                    // A copy that is no regular file of the recording is not opened (said
                    // by `complete`).
                    Some(c) => file_of(dir, c).ok(),
                };
                (
                    o.bias,
                    p.unwrap_or_default().into_os_string().into_encoded_bytes(),
                )
            })
            .collect();
        let mut rec = Recording {
            info,
            dir: dir.to_owned(),
            cursors: Vec::new(),
            objects,
            filters,
            names: Names::new(None),
            range: (0, u64::MAX),
            start_ns: 0,
            error: None,
            first_tsc: std::collections::HashMap::new(),
            warned: std::cell::RefCell::new(std::collections::HashSet::new()),
        };
        for w in warnings {
            rec.warn(w);
        }
        if let Some(t) = rec
            .filters
            .tids
            .iter()
            .find(|t| !rec.info.rings.iter().any(|r| r.tid == **t))
        {
            let tids: Vec<String> = rec.info.rings.iter().map(|r| r.tid.to_string()).collect();
            bail!(
                "--tid {t}: no such thread in {} (its threads: {})",
                dir.display(),
                tids.join(", ")
            );
        }
        rec.start_ns = rec.first_ns()?;
        rec.range = rec.filters.range_ns(rec.start_ns);
        if !rec.filters.filter.is_empty() || !rec.filters.notrace.is_empty() {
            rec.names = Names::with_filters(rec.symbols(), &rec.objects, &rec.filters)
                .map_err(anyhow::Error::msg)?;
        }
        rec.rewind();
        Ok(rec)
    }

    /// The rings read (claimed, with an entry in `info.json`, of a selected thread).
    /// The record streams of the recording: format 2 numbers one per owner of a ring (as
    /// many as were claimed), format 1 one per ring.
    fn nr_streams(&self) -> u32 {
        if self.info.format == 1 {
            self.info.claimed.min(self.info.nr_rings)
        } else {
            self.info.claimed
        }
    }

    /// The streams read: (index, where its records are).
    fn streams(&self) -> Vec<(u32, Stream)> {
        let n = self.nr_streams();
        self.info
            .rings
            .iter()
            .filter(|r| r.index < n && self.filters.thread(r.tid))
            .map(|r| {
                (
                    r.index,
                    Stream {
                        path: self.dir.join(&r.file),
                        offset: r.offset.unwrap_or(0),
                        bytes: r.bytes,
                        records: r.records,
                    },
                )
            })
            .collect()
    }

    /// The first timestamp of the recording (CLOCK_MONOTONIC ns; 0 when there is none).
    fn first_ns(&self) -> Result<u64> {
        let clock = self.clock();
        let mut first = u64::MAX;
        for (_, s) in self.streams() {
            if s.records == 0 {
                continue;
            }
            let Ok(mut f) = RingFile::open(&s, self.info.format) else {
                // Said when it is read.
                continue;
            };
            while let Ok(Some((rt, _))) = f.next() {
                if let Some(ts) = record::timestamp(rt, &f.words) {
                    first = first.min(clock.tsc_to_mono_ns(ts));
                    break;
                }
            }
        }
        Ok(if first == u64::MAX { 0 } else { first })
    }

    /// Start reading every ring from its beginning.
    pub fn rewind(&mut self) {
        let n = self.nr_streams() as usize;
        let mut cursors: Vec<Option<Cursor>> = (0..n).map(|_| None).collect();
        for (i, stream) in self.streams() {
            cursors[i as usize] = Some(Cursor {
                file: None,
                at: 0,
                stream,
                read: 0,
                filter: ThreadFilter::default(),
                done: false,
            });
        }
        self.cursors = cursors;
    }

    /// Hand ring `i`'s next records, filtered, to `f`: up to `max` of them (then `true`),
    /// or all that are left (then `false`: the ring is done).
    fn read(&mut self, i: u32, max: usize, f: &mut dyn FnMut(u16, u32, &[u64])) -> bool {
        let clock = self.clock();
        let graph = self.info.tracer == "function_graph";
        let pid = self.pid_of(i);
        let format = self.info.format;
        let Some(Some(c)) = self.cursors.get_mut(i as usize) else {
            return false;
        };
        if c.done {
            return false;
        }
        if c.file.is_none() {
            // A stream with no record has no file.
            if c.stream.records == 0 {
                c.done = true;
                return false;
            }
            match RingFile::open_at(&c.stream, format, c.at) {
                Ok(file) => c.file = Some(file),
                Err(e) => {
                    let what = format!(
                        "{}: {e}: its thread's records are missing",
                        c.stream.path.display()
                    );
                    c.done = true;
                    self.warn(what);
                    return false;
                }
            }
        }
        let file = c.file.as_mut().expect("opened");
        let names = &mut self.names;
        let n = std::cell::Cell::new(0usize);
        let mut out = |rt: u16, aux: u32, w: &[u64]| {
            n.set(n.get() + 1);
            f(rt, aux, w);
        };
        loop {
            let rec = match file.next() {
                Ok(r) => r,
                Err(e) => {
                    self.error
                        .get_or_insert(e.context(format!("{}", c.stream.path.display())));
                    None
                }
            };
            let Some((rt, aux)) = rec else {
                let mut said = Vec::new();
                if file.cut {
                    said.push(format!(
                        "{}: cut inside a record (at byte {} of the file): its {} records \
                         before were read",
                        c.stream.path.display(),
                        c.stream.offset + file.at * 8,
                        c.read
                    ));
                } else if c.read != c.stream.records && c.stream.records != UNKNOWN {
                    said.push(format!(
                        "{}: {} records, where info.json says {}",
                        c.stream.path.display(),
                        c.read,
                        c.stream.records
                    ));
                }
                c.filter.finish(&mut out);
                c.done = true;
                c.file = None;
                for w in said {
                    self.warn(w);
                }
                return false;
            };
            c.read += 1;
            let mut cx = FilterCx {
                filters: &self.filters,
                names,
                clock: &clock,
                graph,
                range: self.range,
                pid,
            };
            c.filter.push(&mut cx, rt, aux, &file.words, &mut out);
            if n.get() >= max {
                c.at = file.at;
                c.file = None;
                return true;
            }
        }
    }

    /// The first error reading the files, if any.
    /// Say `what` about the recording on standard error, once.
    fn warn(&self, what: String) {
        let mut warned = self.warned.borrow_mut();
        if !warned.contains(&what) {
            eprintln!("ftprobe: warning: {}: {what}", self.dir.display());
            warned.insert(what);
        }
    }

    pub fn take_error(&mut self) -> Option<anyhow::Error> {
        self.error.take()
    }

    /// When ring `i`'s calls still open at its last record read end: the time range's end
    /// if the thread went on past it, else `last_ns` (its last record's time).
    pub fn end_ns(&self, i: u32, last_ns: u64) -> u64 {
        match self.cursors.get(i as usize) {
            Some(Some(c)) if c.filter.past_range => self.range.1.max(last_ns),
            _ => last_ns,
        }
    }

    /// Ring `i`'s records in order, filtered (threads, time range): `f(rtype, aux, payload)`.
    pub fn for_each(&mut self, i: u32, f: &mut dyn FnMut(u16, u32, &[u64])) -> Result<()> {
        if let Some(Some(c)) = self.cursors.get_mut(i as usize) {
            *c = Cursor {
                file: None,
                at: 0,
                stream: c.stream.clone(),
                read: 0,
                filter: ThreadFilter::default(),
                done: false,
            };
        }
        while self.read(i, usize::MAX, f) {}
        match self.take_error() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Source for Recording {
    fn armed(&self) -> bool {
        self.info.armed
    }
    fn clock(&self) -> Clock {
        Clock::from_parts(self.info.clock)
    }
    fn nr_rings(&self) -> u32 {
        self.nr_streams()
    }
    fn claimed(&self) -> u32 {
        self.nr_streams()
    }
    fn drain(&mut self, i: u32, mut f: impl FnMut(u16, u32, &[u64])) -> bool {
        if !matches!(self.cursors.get(i as usize), Some(Some(_))) {
            return false;
        }
        self.read(i, CHUNK, &mut f);
        true
    }
    fn drain_max(&mut self, i: u32, max: usize, mut f: impl FnMut(u16, u32, &[u64])) -> bool {
        if !matches!(self.cursors.get(i as usize), Some(Some(_))) {
            return false;
        }
        self.read(i, max.clamp(1, CHUNK), &mut f);
        true
    }
    fn chunked(&self) -> bool {
        true
    }
    fn done(&self, i: u32) -> bool {
        self.cursors
            .get(i as usize)
            .is_none_or(|c| c.as_ref().is_none_or(|c| c.done))
    }
    fn task(&self, i: u32) -> Option<(Vec<u8>, u32)> {
        let r = self.info.rings.iter().find(|r| r.index == i)?;
        let comm = r
            .comm_bytes
            .clone()
            .unwrap_or_else(|| r.comm.clone().into_bytes());
        Some((comm, r.tid))
    }
    fn pid(&self, i: u32) -> Option<u32> {
        self.info.rings.iter().find(|r| r.index == i)?.pid
    }
    fn lost(&self, i: u32) -> u64 {
        self.info
            .rings
            .iter()
            .find(|r| r.index == i)
            .map_or(0, |r| r.lost)
    }
    fn objects(&self) -> Vec<(u64, Vec<u8>)> {
        self.objects.clone()
    }
    fn object_load_times(&self) -> Vec<u64> {
        self.info.objects.iter().map(|o| o.load_tsc).collect()
    }
    fn cpus_online(&self) -> u32 {
        self.info.cpus_online
    }
    fn unfinished(&self) -> Option<String> {
        if self.info.partial {
            Some(
                "its recorder did not finish (killed, or a write failed): the events lost \
                 and how the program ended are unknown"
                    .to_owned(),
            )
        } else {
            self.info.stopped.as_ref().map(|why| {
                format!(
                    "recording stopped before the program ended ({why}): later events are not here"
                )
            })
        }
    }
    fn lost_no_ring(&self) -> u64 {
        self.info.lost_no_ring
    }
    fn lost_no_ring_kinds(&self) -> (u64, u64) {
        (self.info.lost_unreclaimed, self.info.lost_after_end)
    }
    fn lost_by_tid(&self) -> Vec<(u32, u64)> {
        self.info
            .lost_by_tid
            .iter()
            .map(|&[t, n]| (t as u32, n))
            .collect()
    }
    fn lost_recursion(&self) -> u64 {
        self.info.lost_recursion
    }
    fn fgraph_overrun(&self) -> u64 {
        self.info.fgraph_overrun
    }
    fn event_counters(&self, id: u32) -> (u64, u64) {
        self.info
            .event_counters
            .get(id as usize)
            .map_or((0, 0), |c| (c[0], c[1]))
    }
}

/// A call rebuilt from function_graph records.
#[derive(Clone, Copy, Debug)]
pub struct Call {
    pub func: u64,
    /// Its entry, CLOCK_MONOTONIC ns.
    pub start_ns: u64,
    pub dur_ns: u64,
    /// `dur_ns` less its children's.
    pub self_ns: u64,
    /// It did not return: cut off (unwound, longjmp, lost) or still open at the end.
    pub cut: bool,
    /// Its return is in a gap (`[LOST N EVENTS]`: the thread's ring was full): when it
    /// returned is unknown. `dur_ns` then runs to the gap's mark (an upper bound) and
    /// `self_ns` is 0; time statistics leave such a call out.
    pub lost_return: bool,
}

/// A frame of [`Recording::calls`]'s stack.
struct Frame {
    func: u64,
    start_ns: u64,
    child_ns: u64,
    /// Its entry's depth.
    depth: u32,
}

impl Recording {
    /// The rings read, by index (of the threads selected).
    pub fn ring_ids(&self) -> Vec<u32> {
        self.cursors
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.as_ref().map(|_| i as u32))
            .collect()
    }

    /// The kprobe events' definitions, by id.
    pub fn events(&self) -> Result<Vec<ProbeDef>> {
        let mut events = Vec::new();
        for defs in &self.info.events {
            let first = defs.first().context("an event with no definition")?;
            match trace_kprobe::check(first) {
                Ok(d) => events.push(d),
                Err(e) => bail!("recorded event {first:?}: {}", e.err.kind.name()),
            }
        }
        Ok(events)
    }

    /// A symbolizer over the recorded objects (their copies), with the images processes
    /// exec'd into (`--follow-exec`): before naming a stream's records, select its image
    /// with [`select_stream`](Self::select_stream).
    pub fn symbols(&self) -> Symbols {
        Symbols::with_images(&self.objects, &self.info.images)
            .with_load_times(self.info.objects.iter().map(|o| o.load_tsc).collect())
    }

    /// Make `syms` name stream `i`'s records: from the image its process ran when the
    /// stream's thread claimed its ring (a ring is claimed in one image: an exec'd image's
    /// threads claim new ones), found by the stream's first timestamp.
    pub fn select_stream(&mut self, syms: &mut Symbols, i: u32) {
        self.select_stream_at(syms, i, u64::MAX);
    }

    /// As [`select_stream`](Self::select_stream), with the objects loaded by `load_time`
    /// (the unit of the symbolizer's load times: [`symbols_by_ns`](Self::symbols_by_ns)'s
    /// CLOCK_MONOTONIC ns for a call's `start_ns`).
    pub fn select_stream_at(&mut self, syms: &mut Symbols, i: u32, load_time: u64) {
        if !syms.has_images() {
            syms.select_view(0, 0, load_time);
            return;
        }
        let tsc = self.first_tsc_cached(i);
        syms.select_view(self.pid_of(i), tsc, load_time);
    }

    /// For stream `i`'s calls one by one: select in `syms` the stream's image and the
    /// objects loaded by a time in CLOCK_MONOTONIC ns (a [`Call::start_ns`]), for a
    /// symbolizer from [`symbols_by_ns`](Self::symbols_by_ns).
    pub fn stream_selector(&mut self, i: u32) -> impl FnMut(&mut Symbols, u64) {
        let pid = self.pid_of(i);
        let tsc = self.first_tsc_cached(i);
        move |syms: &mut Symbols, ns: u64| syms.select_view(pid, tsc, ns)
    }

    /// [`symbols`](Self::symbols) whose objects' load times are CLOCK_MONOTONIC ns (the
    /// unit of [`Call::start_ns`]).
    pub fn symbols_by_ns(&self) -> Symbols {
        let clock = self.clock();
        Symbols::with_images(&self.objects, &self.info.images).with_load_times(
            self.info
                .objects
                .iter()
                .map(|o| match o.load_tsc {
                    0 => 0,
                    t => clock.tsc_to_mono_ns(t),
                })
                .collect(),
        )
    }

    /// [`stream_first_tsc`](Self::stream_first_tsc), read once per stream.
    fn first_tsc_cached(&mut self, i: u32) -> u64 {
        if let Some(&t) = self.first_tsc.get(&i) {
            return t;
        }
        let t = self.stream_first_tsc(i);
        self.first_tsc.insert(i, t);
        t
    }

    /// The first timestamp (raw TSC) of stream `i`'s file (0: none).
    fn stream_first_tsc(&self, i: u32) -> u64 {
        let Some(s) = self
            .streams()
            .into_iter()
            .find_map(|(x, s)| (x == i).then_some(s))
        else {
            return 0;
        };
        let Ok(mut f) = RingFile::open(&s, self.info.format) else {
            return 0;
        };
        while let Ok(Some((rt, _))) = f.next() {
            if let Some(ts) = record::timestamp(rt, &f.words) {
                return ts;
            }
        }
        0
    }

    /// The process of ring `i`'s thread: its own pid (a forked child's), or for a recording
    /// that does not say, the target's.
    pub fn pid_of(&self, i: u32) -> u32 {
        self.pid(i).unwrap_or(self.info.end.pid)
    }

    /// The thread of ring `i`: its comm (lossy) and tid.
    pub fn thread(&self, i: u32) -> (String, u32) {
        let (comm, tid) = self.task(i).unwrap_or_default();
        (String::from_utf8_lossy(&comm).into_owned(), tid)
    }

    /// The calls of ring `i`'s thread, in the order they end: `f(call, callers)`, the callers
    /// outermost first.
    pub fn calls(&mut self, i: u32, mut f: impl FnMut(&Call, &[u64])) -> Result<()> {
        let clock = self.clock();
        let mut stack: Vec<Frame> = Vec::new();
        let mut funcs: Vec<u64> = Vec::new();
        let mut last_ns = 0;
        // After a LOST record (its time): the frames the thread's next graph record shows
        // gone returned in the gap.
        let mut gap: Option<u64> = None;
        // Close the frames whose entry depth is `from` or deeper: their return is in the gap
        // marked at `gap_ns`.
        fn close_lost(
            stack: &mut Vec<Frame>,
            funcs: &mut Vec<u64>,
            from: u32,
            gap_ns: u64,
            f: &mut impl FnMut(&Call, &[u64]),
        ) {
            while stack.last().is_some_and(|fr| fr.depth >= from) {
                let fr = stack.pop().expect("checked");
                funcs.pop();
                let call = Call {
                    func: fr.func,
                    start_ns: fr.start_ns,
                    dur_ns: gap_ns.saturating_sub(fr.start_ns),
                    self_ns: 0,
                    cut: true,
                    lost_return: true,
                };
                f(&call, funcs);
            }
        }
        // Close the frames above `depth` at `end_ns` (cut), then hand out `call` if any.
        fn close(
            stack: &mut Vec<Frame>,
            funcs: &mut Vec<u64>,
            depth: usize,
            end_ns: u64,
            f: &mut impl FnMut(&Call, &[u64]),
        ) {
            while stack.len() > depth {
                let fr = stack.pop().expect("len > depth");
                funcs.pop();
                let dur_ns = end_ns.saturating_sub(fr.start_ns);
                let call = Call {
                    func: fr.func,
                    start_ns: fr.start_ns,
                    dur_ns,
                    self_ns: dur_ns.saturating_sub(fr.child_ns),
                    cut: true,
                    lost_return: false,
                };
                if let Some(p) = stack.last_mut() {
                    p.child_ns += dur_ns;
                }
                f(&call, funcs);
            }
        }
        self.for_each(i, &mut |rt, aux, w| {
            match Record::decode(rt, aux, w) {
                Some(Record::Lost { ts, count, .. }) if count > 0 => {
                    let ns = clock.tsc_to_mono_ns(ts);
                    last_ns = last_ns.max(ns);
                    gap = Some(ns);
                }
                Some(Record::GraphEntry {
                    ts, func, depth, ..
                }) => {
                    // After a gap: the calls open at this depth or deeper returned in it.
                    if let Some(g) = gap.take() {
                        close_lost(&mut stack, &mut funcs, depth, g, &mut f);
                    }
                    let ns = clock.tsc_to_mono_ns(ts);
                    last_ns = last_ns.max(ns);
                    stack.push(Frame {
                        func,
                        start_ns: ns,
                        child_ns: 0,
                        depth,
                    });
                    funcs.push(func);
                }
                Some(Record::GraphReturn {
                    ts,
                    func,
                    calltime,
                    exit,
                    depth,
                    ..
                }) => {
                    // After a gap: the calls open deeper than this return's returned in it.
                    if let Some(g) = gap.take() {
                        close_lost(&mut stack, &mut funcs, depth + 1, g, &mut f);
                    }
                    let end_ns = clock.tsc_to_mono_ns(ts);
                    last_ns = last_ns.max(end_ns);
                    let start_ns = clock.tsc_to_mono_ns(calltime);
                    // Its entry's frame; frames above it never returned (cut at this return).
                    let child_ns = match stack.iter().rposition(|fr| fr.func == func) {
                        Some(p) => {
                            close(&mut stack, &mut funcs, p + 1, end_ns, &mut f);
                            funcs.pop();
                            stack.pop().map_or(0, |fr| fr.child_ns)
                        }
                        // Its entry is not in the recording: a call under the open frames.
                        None => 0,
                    };
                    let dur_ns = end_ns.saturating_sub(start_ns);
                    let call = Call {
                        func,
                        start_ns,
                        dur_ns,
                        self_ns: dur_ns.saturating_sub(child_ns),
                        cut: exit != FgraphExit::Returned,
                        lost_return: false,
                    };
                    if let Some(p) = stack.last_mut() {
                        p.child_ns += dur_ns;
                    }
                    f(&call, &funcs);
                }
                // FUNC, KPROBE: their time (even of one too short to decode).
                _ if matches!(rt, rtype::FUNC | rtype::KPROBE | rtype::LOST) => {
                    if let Some(ts) = record::timestamp(rt, w) {
                        last_ns = last_ns.max(clock.tsc_to_mono_ns(ts));
                    }
                }
                _ => {}
            }
        })?;
        // A gap with no graph record after it: every call still open may have returned in
        // it.
        if let Some(g) = gap {
            close_lost(&mut stack, &mut funcs, 0, g, &mut f);
        }
        let end_ns = self.end_ns(i, last_ns);
        close(&mut stack, &mut funcs, 0, end_ns, &mut f);
        Ok(())
    }
}
