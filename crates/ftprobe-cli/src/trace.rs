//! `ftprobe trace`: run CMD in a tracing session ([`crate::session`]) and print its events
//! live in ftrace's `trace` format, then the lost-event counts and the kprobe profile; exit
//! with its status. [`Printer`] is also what `ftprobe replay` formats a recording with.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use ftprobe::events::ProbeDef;
use ftprobe::ftrace::fgraph::FgraphExit;
use ftprobe::record::{self, rtype, Record};
use ftprobe::ring::Clock;
use ftprobe::trace_kprobe::RecordDecoder;

use crate::merge::Merge;
use crate::output;
use crate::output::open_output;
use crate::session::{self, End, SessionArgs, Sink, Source, PREFAULT_EVERY};
use crate::symbols::{parse_image, Symbols, TEXT_IMAGE};

/// TEXT record kinds the agent writes (`ftprobe-agent`'s `TEXT_*`): the armed-probes
/// listing, `PID\tPATH` before an exec (`PID\tPATH\tfollowed` or `PID\tPATH\tnot
/// followed: WHY` in a session that follows execs), `PID\tERRNO` when that exec failed,
/// `PID\tTSC\tFIRST\tCOUNT\tEXE` when a followed exec's new image joined the session.
const TEXT_KPROBES_LIST: u32 = 1;
/// The listing's next part (cut at a line's end): printed under the first part's header.
const TEXT_KPROBES_LIST_MORE: u32 = 6;
const TEXT_EXEC: u32 = 2;
const TEXT_EXEC_FAILED: u32 = 3;

/// The trailer's hint after an exec that was not followed, in a session that did not ask.
pub const FOLLOW_EXEC_HINT: &str =
    "# ftprobe trace --follow-exec (and record) follows an exec: the new program is traced";

/// A note of the agent's for the header (`# note: ...`).
const TEXT_NOTE: u32 = 5;
/// How long the last drain prints before it says so (and that Ctrl-C stops it).
const SAY_STILL_PRINTING: std::time::Duration = std::time::Duration::from_secs(1);

/// Why events of threads without a ring were lost (the trailer's lines): every ring owned
/// by a live thread; some held by threads that ended, not read to the end yet; events of a
/// thread after its ring was released.
pub const LOST_OWNED: &str = "more threads at once than rings (--rings)";
pub const LOST_UNRECLAIMED: &str = "no ring free, some held by ended threads that ftprobe \
                                    had not read yet (threads ended faster than it read \
                                    them): a larger --rings helps";
pub const LOST_AFTER_END: &str = "events of threads after they released their ring (at \
                                  their end)";

/// Arguments of `ftprobe trace`.
#[derive(Args)]
pub struct TraceArgs {
    /// Write the trace to FILE instead of standard output (`-`: standard output, as perf's
    /// and uftrace's `-o -`).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: Option<PathBuf>,
    #[command(flatten)]
    session: SessionArgs,
}

/// Run the command; returns the exit code to exit with.
pub fn run(args: TraceArgs) -> Result<i32> {
    let plan = session::prepare(args.session)?;
    let out = open_output(args.output.as_ref())?;
    let mut printer = Printer::new(
        out,
        plan.tracer,
        plan.events.iter().map(|(_, d)| d.clone()).collect(),
        (plan.tracer == "function_graph").then(|| (plan.graph_opts, session::nr_cpus())),
    );
    session::run(plan, &mut printer)
}

/// A change of a ring's owner, in the ring's merge queue (not a ring record type): words
/// tid, then the comm's bytes in two words, then the pid (0: not known). The printer names a record's thread after the
/// owner change before it in its ring, so a ring may pass from thread to thread.
const OWNER: u16 = 0xfff0;
/// An exec note of the agent's (TEXT_EXEC or TEXT_EXEC_FAILED, in aux), in the ring's merge
/// queue where it happened: words the line's bytes.
const NOTE: u16 = 0xfff1;

/// The live trace prints a record once every ring has shown a timestamp at or past it, or
/// has been idle this long (then up to the ring's last read), or once the record is this
/// old: threads are merged strictly by timestamp, as the kernel's `trace` file is, at the
/// cost of this delay at most (a thread preempted for longer between taking a timestamp
/// and publishing its record may still come out of order). An old record still waits for
/// the rings whose last drain left records behind (the CLI's own backlog:
/// [`Queue::backlog`](crate::merge::Queue::backlog)).
pub const MERGE_DELAY_NS: u64 = 100_000_000;

/// Records the merge holds at most (all rings together, 5-6 MiB), plus what one drain of a
/// ring brings (at most 1 MiB of records, `session::LIVE_DRAIN_BYTES`): beyond it, the oldest
/// held records are printed in order until half of it is left, whatever the rings still hold
/// (order across threads may then slip; nothing is lost), and the trace says so. At the
/// ~3.5 M lines/s the CLI formats, that is ~40 ms of events; a program that writes faster
/// than that fills its rings anyway.
pub const MAX_HELD: usize = 1 << 17;

/// The live trace drains a ring only while its queue in the merge holds fewer records than
/// this: a thread far ahead of the others waits in its own ring, not in the CLI's memory.
const DRAIN_BELOW: usize = 1 << 15;

/// Text written to the output once it reaches this size (not a whole poll's text at once).
const WRITE_EVERY: usize = 1 << 16;

/// The thread a ring's records are printed as.
struct Owner {
    comm: Vec<u8>,
    tid: u32,
    /// Its process (0: not known): which image names its records.
    pid: u32,
    /// `TASK-PID ` of the function layout.
    prefix: Vec<u8>,
}

pub struct Printer {
    /// `None` once the output is gone (a closed pipe): the program keeps running untraced.
    out: Option<Box<dyn Write>>,
    /// The source's clock, taken at the first poll.
    clock: Clock,
    symbols: Option<Symbols>,
    objects: Vec<(u64, Vec<u8>)>,
    /// When each of `objects` was added (see `Symbols::with_load_times`).
    load_times: Vec<u64>,
    events: Vec<ProbeDef>,
    /// Per event, its record layout (worked out once, not per record).
    decoders: Vec<Option<RecordDecoder>>,
    /// The rings' records not printed yet, merged by timestamp.
    merge: Merge,
    /// Per ring (stream) with a queue in the merge, the owner its printed records belong to.
    owners: HashMap<u32, Owner>,
    /// Per ring with a queue in the merge, the owner last put in its queue.
    queued_owner: HashMap<u32, (Vec<u8>, u32)>,
    /// The source's streams that may still bring records, this poll (reused).
    active: Vec<u32>,
    /// Rings claimed at the last poll.
    claimed: u32,
    /// Text not written yet.
    lines: Vec<u8>,
    /// Records seen per event id.
    seen: Vec<u64>,
    /// Event lines formatted (function and kprobe events).
    printed: u64,
    /// Writing the trace failed (not a closed pipe).
    write_failed: bool,
    /// Processes that exec'd (pid, the program they ran, followed), as the agent noted it.
    execs: Vec<(u32, String, bool)>,
    /// The images processes exec'd into (followed).
    images: Vec<crate::symbols::Image>,
    /// Some exec was not followed because the session did not ask (an agent without
    /// `--follow-exec` notes `PID\tPATH` only).
    hint_follow: bool,
    /// `# tracer:` in the header.
    tracer: &'static str,
    /// The agent armed everything and the header is out. Until then nothing is printed: a
    /// program stopped because something could not be armed leaves no trace-like output.
    started: bool,
    /// The function_graph tracer's layout and state, when it is the tracer.
    graph: Option<crate::graph::Graph>,
    /// The last poll: nothing is kept for later.
    final_poll: bool,
    /// The source is a recording: every record is there to be read, none is held back for
    /// its age.
    recorded: bool,
    /// Times the merge reached [`MAX_HELD`] and printed before every ring was seen.
    forced: u64,
    /// The last drain was cut short by a second signal: its events are counted, not printed.
    discarding: bool,
    /// The events so counted.
    discarded: u64,
    /// The control channel's events and profile, in a session with one.
    live: Option<std::sync::Arc<crate::control::LiveEvents>>,
}

impl Printer {
    /// A printer to `out` for `tracer`'s records and the kprobe `events` (by id); `graph`: the
    /// function_graph layout's options and CPU count, when that is the tracer.
    pub fn new(
        out: Box<dyn Write>,
        tracer: &'static str,
        events: Vec<ProbeDef>,
        graph: Option<(crate::graph::Options, u32)>,
    ) -> Printer {
        Printer {
            out: Some(out),
            clock: Clock::from_parts([0, 0, 0]),
            symbols: None,
            objects: Vec::new(),
            load_times: Vec::new(),
            decoders: events.iter().map(RecordDecoder::new).collect(),
            events,
            merge: Merge::default(),
            owners: HashMap::new(),
            queued_owner: HashMap::new(),
            active: Vec::new(),
            claimed: 0,
            lines: Vec::new(),
            seen: Vec::new(),
            printed: 0,
            write_failed: false,
            execs: Vec::new(),
            images: Vec::new(),
            hint_follow: false,
            tracer,
            started: false,
            graph: graph.map(|(opts, ncpus)| crate::graph::Graph::new(opts, ncpus)),
            final_poll: false,
            recorded: false,
            forced: 0,
            discarding: false,
            discarded: 0,
            live: None,
        }
    }

    /// Take the events a control channel adds while the session runs, and publish the
    /// `kprobe_profile` counts to it.
    pub fn set_live(&mut self, live: std::sync::Arc<crate::control::LiveEvents>) {
        self.live = Some(live);
    }

    /// Processes exec'd into `images` (a recording's): their records are named from them.
    pub fn add_images(&mut self, images: &[crate::symbols::Image]) {
        for im in images {
            if !self.images.contains(im) {
                self.images.push(im.clone());
            }
        }
    }

    fn write(&mut self, f: impl FnOnce(&mut dyn Write) -> std::io::Result<()>) {
        if let Some(o) = self.out.as_mut() {
            if let Err(e) = f(o.as_mut()) {
                // A closed pipe (`| head`) is the reader's choice; anything else loses the
                // trace: said now, and in the exit status.
                if e.kind() != std::io::ErrorKind::BrokenPipe {
                    let _ = writeln!(std::io::stderr(), "ftprobe: writing the trace: {e}");
                    self.write_failed = true;
                }
                self.out = None;
            }
        }
    }

    fn flush(&mut self) {
        self.write(|o| o.flush());
    }

    /// Drain the rings into the merge, print what may be printed.
    fn poll_source<S: Source>(&mut self, rings: &mut S) {
        if !self.started {
            if !rings.armed() {
                return;
            }
            self.started = true;
            self.clock = rings.clock();
            let tracer = self.tracer;
            if self.graph.is_some() {
                // The column header comes with the first lines (it depends on how many
                // threads record).
                self.write(|o| {
                    writeln!(o, "# tracer: {tracer}")?;
                    writeln!(o, "#")
                });
            } else {
                self.write(|o| output::header(o, tracer));
            }
        }
        let chunked = rings.chunked();
        self.recorded = chunked;
        if self.final_poll && !chunked {
            // The writers are gone: drain every ring (a ring whose queue is full waits for
            // the next round) and print, until nothing is left. A second signal (the first
            // ended the session, or was forwarded to the program) stops the printing: the
            // rest is counted. One signal alone does not (the program's exit ended this
            // session, and one Ctrl-C came after it).
            let drain_start = std::time::Instant::now();
            let mut said = false;
            loop {
                if !self.discarding && crate::signals::received() >= 2 {
                    self.discarding = true;
                }
                if !said && !self.discarding && drain_start.elapsed() >= SAY_STILL_PRINTING {
                    said = true;
                    let again = if crate::signals::received() == 0 {
                        "Ctrl-C twice"
                    } else {
                        "Ctrl-C again"
                    };
                    eprintln!(
                        "ftprobe: still printing the events the rings hold ({again} to stop \
                         printing)"
                    );
                }
                self.drain_round(rings, true);
                self.emit(&mut || rings.prefault(), usize::MAX);
                if self.merge.queues.values().all(|q| q.done) && self.merge.held == 0 {
                    break;
                }
            }
            self.retire();
            if self.discarding {
                eprintln!(
                    "ftprobe: printing stopped by a second signal: {} events not printed",
                    self.discarded
                );
            }
            return;
        }
        self.drain_round(rings, false);
        if self.symbols.is_none() && self.merge.held > 0 {
            // Loaded after the drain (it takes ~10 ms: before it, the ring would fill), and
            // before the lines: the threads that claimed rings meanwhile count for the
            // function_graph layout's TASK/PID column.
            self.symbols = Some(
                Symbols::with_images(&self.objects, &self.images)
                    .with_load_times(self.load_times.clone()),
            );
            self.claimed = rings.claimed();
        }
        if self.final_poll {
            for q in self.merge.queues.values_mut() {
                q.done = true;
            }
        }
        self.emit(&mut || rings.prefault(), usize::MAX);
        self.retire();
    }

    /// Forget the rings (streams) that ended and whose records were all printed.
    fn retire(&mut self) {
        for r in self.merge.retire() {
            if let (Some(o), Some(g)) = (self.owners.remove(&r), self.graph.as_mut()) {
                g.forget_thread(o.tid);
            }
            self.queued_owner.remove(&r);
        }
    }

    /// Drain the rings into the merge: each ring the merge needs more of (a recording's, in
    /// chunks; a live one whose queue is not full). `last`: live rings whose writers are gone
    /// (a ring drained is then done).
    fn drain_round<S: Source>(&mut self, rings: &mut S, last: bool) {
        let n = rings.claimed().min(rings.nr_rings());
        self.claimed = rings.claimed();
        let chunked = rings.chunked();
        // The objects first: a merge that holds too much prints during the drain. The symbols
        // are loaded when first needed (loading takes ~10 ms: before a drain, the ring would
        // fill meanwhile).
        let objects = rings.objects();
        if objects != self.objects || self.symbols.is_none() {
            self.symbols = None;
            self.objects = objects;
            self.load_times = rings.object_load_times();
        }
        let mut active = std::mem::take(&mut self.active);
        rings.active(&mut active);
        if !chunked {
            // A live stream no longer active ended, and everything in it was read.
            for (r, q) in self.merge.queues.iter_mut() {
                if active.binary_search(r).is_err() {
                    q.done = true;
                }
            }
        }
        // A recording's streams are read in chunks (of CHUNK records; smaller with many
        // streams, so that all of them together stay within 16 * MAX_HELD records), and the
        // merge's bound is what they hold: every stream holds a record when the merge hands
        // one out, so the output is in timestamp order whatever the number of threads.
        // (Streams read to their end may still hold records: they count too.)
        let streams = active.len().max(self.merge.queues.len()).max(1);
        let chunk = (8 * MAX_HELD / streams).clamp(16, crate::recording::CHUNK);
        let max_held = if chunked {
            MAX_HELD.max(streams * 2 * chunk)
        } else {
            MAX_HELD
        };
        for &i in &active {
            let q = self.merge.queue(i);
            let limit = if chunked { chunk / 2 } else { DRAIN_BELOW };
            if q.done || q.len() >= limit {
                // Not drained: its ring may hold records (earlier than other rings' ones).
                q.backlog |= !chunked && !q.done;
                continue;
            }
            if let Some(task) = rings.task(i).filter(|t| t.1 != 0) {
                if self.queued_owner.get(&i) != Some(&task) {
                    let pid = rings.pid(i).unwrap_or(0);
                    let mut comm = [0u8; 16];
                    let len = task.0.len().min(16);
                    comm[..len].copy_from_slice(&task.0[..len]);
                    let w = [
                        u64::from(task.1),
                        u64::from_le_bytes(comm[..8].try_into().expect("8")),
                        u64::from_le_bytes(comm[8..].try_into().expect("8")),
                        u64::from(pid),
                    ];
                    self.merge.push(i, OWNER, 0, &w);
                    self.queued_owner.insert(i, task);
                }
            }
            let mut texts = Vec::new();
            let mut got = 0usize;
            if !chunked {
                let q = self.merge.queue(i);
                if q.arrival_ns == 0 {
                    // A ring seen for the first time counts as active from now.
                    q.arrival_ns = ftprobe::ring::monotonic_ns();
                }
                q.drained_tsc = ftprobe::ring::read_tsc();
            }
            let mut records = 0usize;
            let discarding = self.discarding;
            let readable = rings.drain_max(i, chunk, |rt, aux, w| {
                records += 1;
                // Timed records (with a timestamp) are merged; TEXT is the agent's. After a
                // second signal the events are counted here, not merged (LOST marks: the
                // rings' own counts say the losses).
                if discarding && rt != rtype::LOST && record::timestamp(rt, w).is_some() {
                    if let Some(Record::Kprobe { event, .. }) = Record::decode(rt, aux, w) {
                        let id = event as usize;
                        if self.seen.len() <= id {
                            self.seen.resize(id + 1, 0);
                        }
                        self.seen[id] += 1;
                    }
                    self.discarded += 1;
                } else if record::timestamp(rt, w).is_some() {
                    got += 1;
                    self.merge.push(i, rt, aux, w);
                } else if let Some(t @ Record::Text { kind, .. }) = Record::decode(rt, aux, w) {
                    texts.push((kind, t.text_bytes().filter(|&b| b != 0).collect()));
                }
            });
            // A live ring is drained in pieces: done when a last drain finds nothing.
            if (chunked && rings.done(i)) || (last && !chunked && (records == 0 || !readable)) {
                self.merge.queue(i).done = true;
            }
            if !chunked && got > 0 {
                self.merge.queue(i).arrival_ns = ftprobe::ring::monotonic_ns();
            }
            if !chunked {
                // A drain that stopped at its piece's size left the rest in the ring.
                self.merge.queue(i).backlog = rings.drain_stopped_short();
            }
            if readable {
                self.texts(i, texts);
            }
            // Printing waits for the drain to end: until then the ring's space is not
            // handed back to its writer.
            if self.merge.held > max_held {
                self.forced += 1;
                self.emit(&mut || rings.prefault(), max_held / 2);
            }
        }
        self.active = active;
        // Rings past the claimed ones (none in a live session) are done at the end.
        if last {
            for (_, q) in self.merge.queues.range_mut(n..) {
                q.done = true;
            }
        }
        // Again after the drain: objects loaded meanwhile (dlopen) name the records drained.
        let objects = rings.objects();
        if objects != self.objects {
            self.symbols = None;
            self.objects = objects;
            self.load_times = rings.object_load_times();
        }
    }

    /// The agent's TEXT records of ring `i`: the armed-probes listing is printed at once,
    /// the exec notes go in the ring's queue, after its records.
    fn texts(&mut self, i: u32, texts: Vec<(u32, Vec<u8>)>) {
        // (pid, kind, line) of the execs noted in this drain.
        let mut notes: Vec<(u32, u32, String)> = Vec::new();
        for (kind, t) in texts {
            let text = String::from_utf8_lossy(&t).into_owned();
            match kind {
                TEXT_KPROBES_LIST => self.write(|o| {
                    writeln!(o, "# kprobes/list:")?;
                    text.lines().try_for_each(|l| writeln!(o, "#   {l}"))
                }),
                TEXT_KPROBES_LIST_MORE => {
                    self.write(|o| text.lines().try_for_each(|l| writeln!(o, "#   {l}")))
                }
                TEXT_IMAGE => {
                    if let Some(im) = parse_image(&text) {
                        if let Some(syms) = self.symbols.as_mut() {
                            syms.add_image(im.clone());
                        }
                        if !self.images.contains(&im) {
                            self.images.push(im);
                        }
                    }
                }
                TEXT_NOTE => self.write(|o| writeln!(o, "# note: {text}")),
                TEXT_EXEC | TEXT_EXEC_FAILED => {
                    let (pid, rest) = text.split_once('\t').unwrap_or((&text, ""));
                    let pid: u32 = pid.parse().unwrap_or(0);
                    // `PATH`, or `PATH\tfollowed` / `PATH\tnot followed: WHY` (--follow-exec).
                    let (rest, how) = match rest.split_once('\t') {
                        Some((p, how)) if kind == TEXT_EXEC => (p, Some(how)),
                        _ => (rest, None),
                    };
                    if kind == TEXT_EXEC {
                        let line = match how {
                            Some("followed") => {
                                self.execs.push((pid, rest.to_owned(), true));
                                format!("# pid {pid} exec'd {rest}: followed\n")
                            }
                            Some(how) => {
                                self.execs.push((pid, rest.to_owned(), false));
                                let why = how.strip_prefix("not followed: ").unwrap_or(how);
                                format!(
                                    "# pid {pid} exec'd {rest}: not traced after exec ({why})\n"
                                )
                            }
                            None => {
                                self.execs.push((pid, rest.to_owned(), false));
                                self.hint_follow = true;
                                format!("# pid {pid} exec'd {rest}: not traced after exec\n")
                            }
                        };
                        notes.push((pid, kind, line));
                    } else if let Some(at) = self.execs.iter().rposition(|e| e.0 == pid) {
                        let (_, path, _) = self.execs.remove(at);
                        // Its "exec'd" line, if not printed yet, is replaced by this one.
                        if let Some(n) = notes.iter().rposition(|n| n.0 == pid) {
                            notes.remove(n);
                        }
                        let err = std::io::Error::from_raw_os_error(rest.parse().unwrap_or(0))
                            .to_string();
                        let err = err.split(" (os error").next().unwrap_or_default();
                        notes.push((
                            pid,
                            kind,
                            format!("# pid {pid}: exec of {path} failed ({err}); still traced\n"),
                        ));
                    }
                }
                _ => {}
            }
        }
        for (_, kind, line) in notes {
            let words: Vec<u64> = line
                .as_bytes()
                .chunks(8)
                .map(|c| {
                    let mut b = [0u8; 8];
                    b[..c.len()].copy_from_slice(c);
                    u64::from_le_bytes(b)
                })
                .collect();
            self.merge.push(i, NOTE, kind, &words);
        }
    }

    /// Print the merged records that may be printed: those no ring can still bring an
    /// earlier record than, and those [`MERGE_DELAY_NS`] old (live) that no undrained ring
    /// may still bring an earlier record than. `keep`: with fewer
    /// records than `MAX_HELD`, print until only `keep` are held, whatever the rings may
    /// still bring (the bound).
    fn emit(&mut self, prefault: &mut dyn FnMut(), keep: usize) {
        let now_ns = ftprobe::ring::monotonic_ns();
        let idle = (!self.recorded).then_some(MERGE_DELAY_NS);
        let mut horizon = self.merge.horizon(now_ns, idle);
        // Records still in rings the last drains did not empty: even an aged record waits
        // for them (review of issue 31: a live trace went back by 1-2 ms every 32 768
        // records of a thread, a drain's piece, while the CLI was over 100 ms behind).
        let mut backlog = self.merge.backlog_bound();
        let force = keep != usize::MAX;
        let all_done = self.merge.queues.values().all(|q| q.done);
        let graph = self.graph.is_some();
        let mut count = 0usize;
        let mut started_lines = false;
        let clock = Clock::from_parts(self.clock.to_parts());
        // Whether ring `r`'s first record (key `key`) may be printed now.
        let may_print = |m: &Merge, key: u64, r: u32, horizon: u64, backlog: u64| -> bool {
            if force {
                return m.held > keep;
            }
            if all_done {
                return true;
            }
            if key > backlog {
                return false;
            }
            let q = &m.queues[&r];
            let aged = idle.is_some_and(|d| now_ns.saturating_sub(clock.tsc_to_mono_ns(key)) >= d);
            let later = key > horizon;
            let head = q.head().expect("not empty");
            // function_graph: whether an entry is a leaf is its ring's next record (a live
            // ring idle for the delay: the thread is inside the call).
            let waits_next = graph
                && head.rtype == rtype::FGRAPH_ENT
                && q.len() < 2
                && !q.done
                && idle.is_none_or(|d| now_ns.saturating_sub(q.arrival_ns) < d);
            // An entry whose return may be in the ring's undrained records waits for them
            // however old (else a leaf would print as `func() {` ... `}`).
            !(later || waits_next) || (aged && !(waits_next && q.backlog))
        };
        while let Some((key, r)) = self.merge.peek() {
            if !may_print(&self.merge, key, r, horizon, backlog) {
                break;
            }
            if !started_lines {
                started_lines = true;
                if let Some(g) = self.graph.as_mut() {
                    g.threads_seen(self.claimed as usize, &mut self.lines);
                }
            }
            self.merge.take();
            // The ring's records while they come first (no heap work per record).
            loop {
                self.print_head(r);
                count += 1;
                if count % PREFAULT_EVERY == PREFAULT_EVERY - 1 {
                    prefault();
                }
                if self.lines.len() >= WRITE_EVERY {
                    self.write_lines();
                }
                let q = &self.merge.queues[&r];
                let Some(h) = q.head() else {
                    if !q.done {
                        horizon = horizon.min(q.bound(now_ns, idle));
                        if q.backlog {
                            backlog = backlog.min(q.last_ts);
                        }
                    }
                    break;
                };
                let key = h.key;
                if self.merge.peek().is_some_and(|next| next < (key, r))
                    || !may_print(&self.merge, key, r, horizon, backlog)
                {
                    break;
                }
            }
            self.merge.reinsert(r);
        }
        self.write_lines();
    }

    fn write_lines(&mut self) {
        if self.lines.is_empty() {
            return;
        }
        let lines = std::mem::take(&mut self.lines);
        self.write(|o| o.write_all(&lines));
        self.lines = lines;
        self.lines.clear();
    }

    /// Print the first record of ring `r` (and pop it; a leaf's return with it).
    fn print_head(&mut self, r: u32) {
        if self.discarding {
            let head = self.merge.queues[&r].head().expect("taken from the heap");
            if !matches!(head.rtype, OWNER | rtype::LOST | NOTE) {
                // Counted as the events they are: a kprobe event's hit still counts in
                // its profile.
                if let Some(Record::Kprobe { event, .. }) =
                    Record::decode(head.rtype, head.aux, head.words)
                {
                    let id = event as usize;
                    if self.seen.len() <= id {
                        self.seen.resize(id + 1, 0);
                    }
                    self.seen[id] += 1;
                }
                self.discarded += 1;
                self.merge.pop_record(r);
                return;
            }
        }
        if self.symbols.is_none() {
            self.symbols = Some(
                Symbols::with_images(&self.objects, &self.images)
                    .with_load_times(self.load_times.clone()),
            );
        }
        let head = self.merge.queues[&r].head().expect("taken from the heap");
        let (rt, aux, key) = (head.rtype, head.aux, head.key);
        match rt {
            OWNER => {
                let w = head.words;
                let mut comm: Vec<u8> = w[1..3]
                    .iter()
                    .flat_map(|x| x.to_le_bytes())
                    .collect::<Vec<u8>>();
                let n = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
                comm.truncate(n);
                let tid = w[0] as u32;
                let pid = w.get(3).map_or(0, |&p| p as u32);
                self.owners.insert(
                    r,
                    Owner {
                        prefix: output::task_prefix(&comm, tid),
                        comm,
                        tid,
                        pid,
                    },
                );
                self.merge.pop_record(r);
                return;
            }
            rtype::LOST => {
                self.print_lost(r);
                return;
            }
            NOTE => {
                let bytes: Vec<u8> = head
                    .words
                    .iter()
                    .flat_map(|x| x.to_le_bytes())
                    .filter(|&b| b != 0)
                    .collect();
                self.lines.extend_from_slice(&bytes);
                self.merge.pop_record(r);
                return;
            }
            _ => {}
        }
        if self.graph.is_some() {
            self.print_graph_head(r);
            return;
        }
        let owner = self.owners.entry(r).or_insert_with(|| Owner {
            comm: Vec::new(),
            tid: 0,
            pid: 0,
            prefix: output::task_prefix(b"<...>", 0),
        });
        let lines = &mut self.lines;
        let syms = self.symbols.as_mut().expect("set before printing");
        syms.select(owner.pid, key);
        let words = head.words;
        let mark = lines.len();
        lines.extend_from_slice(&owner.prefix);
        // Every record queued here is timed: its merge key is its timestamp.
        output::push_cpu_time(lines, record::cpu_of(aux), self.clock.tsc_to_mono_ns(key));
        match Record::decode(rt, aux, words) {
            Some(Record::Func { ip, parent_ip, .. }) if words.len() == 3 => {
                // kernel/trace/trace_output.c, print_fn_trace(): no parent when it is 0.
                syms.push_name(ip, lines);
                if parent_ip != 0 {
                    lines.extend_from_slice(b" <-");
                    syms.push_return_name(parent_ip, lines);
                }
                lines.push(b'\n');
                self.printed += 1;
            }
            Some(Record::Kprobe {
                addr, event, words, ..
            }) => {
                let id = event as usize;
                if let Some(def) = self.events.get(id) {
                    if self.seen.len() <= id {
                        self.seen.resize(id + 1, 0);
                    }
                    self.seen[id] += 1;
                    let decoder = self.decoders.get(id).and_then(Option::as_ref);
                    output::kprobe_event(lines, def, decoder, addr, words, syms);
                    self.printed += 1;
                } else {
                    // Not an event of ours (a mismatched agent): no line.
                    lines.truncate(mark);
                }
            }
            _ => lines.push(b'\n'),
        }
        self.merge.pop_record(r);
    }

    /// The first record of ring `r`, a gap in its thread's records (its ring was full):
    /// the kernel's `[LOST N EVENTS]` line, named after the thread (`COMM-TID`) where the
    /// kernel names the CPU (the rings are per thread). In the function_graph layout the
    /// thread's calls that returned in the gap are closed with its next line.
    fn print_lost(&mut self, r: u32) {
        let head = self.merge.queues[&r].head().expect("taken from the heap");
        if let Some(Record::Lost { count, .. }) = Record::decode(head.rtype, head.aux, head.words) {
            // A mark of 0 events: an earlier one counted its drops.
            if count > 0 {
                let (comm, tid) = self
                    .owners
                    .get(&r)
                    .map_or((&b"<...>"[..], 0), |o| (&o.comm[..], o.tid));
                self.lines.extend_from_slice(comm);
                self.lines
                    .extend_from_slice(format!("-{tid} [LOST {count} EVENTS]\n").as_bytes());
                if let Some(g) = self.graph.as_mut() {
                    g.gap(tid);
                }
            }
        }
        self.merge.pop_record(r);
    }

    /// The function_graph tracer's line for the first record of ring `r` (see
    /// [`crate::graph`]); an entry whose return is the ring's next record is a leaf.
    fn print_graph_head(&mut self, r: u32) {
        let q = &self.merge.queues[&r];
        let e = q.head().expect("taken from the heap");
        let owner = self.owners.entry(r).or_insert_with(|| Owner {
            comm: b"<...>".to_vec(),
            tid: 0,
            pid: 0,
            prefix: Vec::new(),
        });
        let pid = owner.pid;
        let ctx = crate::graph::Ctx {
            cpu: record::cpu_of(e.aux),
            ts_ns: self.clock.tsc_to_mono_ns(e.key),
            pid: owner.tid,
            comm: &owner.comm,
        };
        let graph = self.graph.as_mut().expect("graph tracer");
        let syms = self.symbols.as_mut().expect("set before printing");
        syms.select(pid, e.key);
        let clock = &self.clock;
        let lines = &mut self.lines;
        let mut leaf = false;
        match Record::decode(e.rtype, e.aux, e.words) {
            Some(Record::GraphEntry { func, depth, .. }) => {
                // A leaf: the ring's next record is this call's return.
                let ret = q
                    .second()
                    .and_then(|r| match Record::decode(r.rtype, r.aux, r.words) {
                        Some(Record::GraphReturn {
                            ts,
                            func: f,
                            calltime,
                            retval,
                            exit: FgraphExit::Returned,
                            ..
                        }) if f == func => Some((ts, calltime, retval)),
                        _ => None,
                    });
                match ret {
                    Some((ts, calltime, retval)) => {
                        let ns = clock
                            .tsc_to_mono_ns(ts)
                            .saturating_sub(clock.tsc_to_mono_ns(calltime));
                        graph.leaf(lines, ctx, func, depth, ns, retval, syms);
                        leaf = true;
                    }
                    None => graph.nested(lines, ctx, func, depth, syms),
                }
                // Entries counts ring records, as the kernel's: a leaf line is two.
                self.printed += 1 + u64::from(leaf);
            }
            Some(Record::GraphReturn {
                ts,
                func,
                calltime,
                retval,
                depth,
                exit,
                ..
            }) => {
                let ns = clock
                    .tsc_to_mono_ns(ts)
                    .saturating_sub(clock.tsc_to_mono_ns(calltime));
                graph.ret(lines, ctx, func, depth, ns, retval, exit.into(), syms);
                self.printed += 1;
            }
            Some(Record::Kprobe {
                addr, event, words, ..
            }) => {
                let id = event as usize;
                if let Some(def) = self.events.get(id) {
                    if self.seen.len() <= id {
                        self.seen.resize(id + 1, 0);
                    }
                    self.seen[id] += 1;
                    let decoder = self.decoders.get(id).and_then(Option::as_ref);
                    let mut text = Vec::new();
                    output::kprobe_event(&mut text, def, decoder, addr, words, syms);
                    graph.comment(lines, ctx, &text);
                    self.printed += 1;
                }
            }
            _ => {}
        }
        self.merge.pop_record(r);
        if leaf {
            self.merge.pop_record(r);
        }
    }

    fn finish_source<S: Source>(&mut self, rings: &mut S, end: &End) {
        // Whatever is still held (a source that ended without a final poll).
        if self.started {
            for q in self.merge.queues.values_mut() {
                q.done = true;
            }
            self.emit(&mut || rings.prefault(), usize::MAX);
        }
        self.counters(rings, end);
        if let (Some(sig), true) = (end.signal, self.started) {
            // If it dies, the trace says how (the exit status alone is easy to miss).
            // SAFETY: strsignal returns a NUL-terminated string (static or per-thread); this
            // thread copies it at once.
            let name = unsafe { std::ffi::CStr::from_ptr(libc::strsignal(sig)) }
                .to_string_lossy()
                .into_owned();
            let core = if end.core_dumped { ", core dumped" } else { "" };
            let pid = end.pid;
            self.write(|o| {
                writeln!(o, "# pid {pid} was killed by signal {sig} ({name}{core})")?;
                o.flush()
            });
        }
        if end.sigtrap_untaken {
            self.write(|o| {
                writeln!(o, "# the program was {}", session::SIGTRAP_UNTAKEN)?;
                o.flush()
            });
        }
    }

    /// The lost-event counts, the entries line and the kprobe profile.
    fn counters<S: Source>(&mut self, rings: &mut S, end: &End) {
        if !self.started {
            return;
        }
        if let Some(g) = self.graph.as_mut() {
            // Nothing recorded: the column header still.
            let mut h = Vec::new();
            g.threads_seen(rings.claimed() as usize, &mut h);
            self.write(|o| o.write_all(&h));
        }
        let mut per_ring = Vec::new();
        let mut total = rings.lost_no_ring().saturating_add(rings.lost_recursion());
        for i in 0..rings.claimed().min(rings.nr_rings()) {
            let Some((_, tid)) = rings.task(i) else {
                continue;
            };
            let lost = rings.lost(i);
            if lost > 0 {
                per_ring.push((tid, lost));
            }
            total = total.saturating_add(lost);
        }
        // Per event: (records dropped, nmissed), from the shared header: exact whether or
        // not the target reached its exit.
        let counters: Vec<(u64, u64)> = (0..self.events.len() as u32)
            .map(|id| rings.event_counters(id))
            .collect();
        let events = self.events.clone();
        let seen = self.seen.clone();
        let abandoned = end.abandoned.clone();
        let unfinished = rings.unfinished();
        let cpus = rings.cpus_online();
        let lost_by_tid = rings.lost_by_tid();
        let (unreclaimed, after_end) = rings.lost_no_ring_kinds();
        let (lost_no_ring, lost_recursion, fgraph_overrun) = (
            rings.lost_no_ring(),
            rings.lost_recursion(),
            rings.fgraph_overrun(),
        );
        let execs = self.execs.clone();
        // Followed execs whose new image never joined: per process, its images joined in
        // the order of its execs.
        let mut not_joined = Vec::new();
        let mut joined: HashMap<u32, usize> = HashMap::new();
        for im in &self.images {
            // A forked child's image is its parent's (the same entries, announced later):
            // not an exec of its own.
            let inherited = self.images.iter().any(|o| {
                o.pid != im.pid && o.first == im.first && o.count == im.count && o.tsc < im.tsc
            });
            if !inherited {
                *joined.entry(im.pid).or_default() += 1;
            }
        }
        for (pid, path, followed) in &execs {
            if *followed {
                match joined.get_mut(pid) {
                    Some(n) if *n > 0 => *n -= 1,
                    _ => not_joined.push((*pid, path.clone())),
                }
            }
        }
        let hint = self.hint_follow;
        let printed = self.printed;
        let discarded = self.discarded;
        // Events added over the control channel and refused: never there.
        let refused = self.live.as_ref().map(|l| l.refused()).unwrap_or_default();
        let forced = self.forced;
        self.write(|o| {
            for pid in &abandoned {
                writeln!(o, "# pid {pid} was still running: its later events are not in this trace")?;
            }
            for (tid, n) in &per_ring {
                writeln!(o, "# tid {tid}: {n} events lost (ring full)")?;
            }
            if !per_ring.is_empty() {
                writeln!(
                    o,
                    "# a full ring drops the newest events: --buffer-size-kb N gives the rings \
                     more room"
                )?;
            }
            for (tid, n) in &lost_by_tid {
                writeln!(o, "# tid {tid}: {n} events lost (no ring free)")?;
            }
            // The table of threads without a ring is bounded: the rest are in the totals.
            let listed: u64 = lost_by_tid.iter().map(|x| x.1).sum();
            if lost_by_tid.len() >= ftprobe::ring::MAX_LOST_TIDS && listed < lost_no_ring {
                writeln!(
                    o,
                    "# {} more events lost (no ring free) by threads past the {} listed",
                    lost_no_ring - listed,
                    ftprobe::ring::MAX_LOST_TIDS
                )?;
            }
            let owned = lost_no_ring.saturating_sub(unreclaimed + after_end);
            if owned > 0 {
                writeln!(o, "# {owned} events lost: {LOST_OWNED}")?;
            }
            if unreclaimed > 0 {
                writeln!(o, "# {unreclaimed} events lost: {LOST_UNRECLAIMED}")?;
            }
            if after_end > 0 {
                writeln!(o, "# {after_end} events lost: {LOST_AFTER_END}")?;
            }
            if lost_recursion > 0 {
                writeln!(
                    o,
                    "# {} events lost: the tracer was already running on the thread (a signal handler interrupted it)",
                    lost_recursion
                )?;
            }
            if fgraph_overrun > 0 {
                writeln!(
                    o,
                    "# {} calls not hooked: the shadow stack was full",
                    fgraph_overrun
                )?;
            }
            if forced > 0 {
                writeln!(
                    o,
                    "# the merge of the threads held {MAX_HELD} records {forced} times and printed the \
                     oldest before every thread was read: there, threads may be out of timestamp \
                     order (the merge itself drops nothing)"
                )?;
            }
            if let Some(why) = &unfinished {
                writeln!(o, "# the recording is not whole: {why}")?;
            }
            writeln!(o, "# lost events: {total}")?;
            output::entries(o, printed, total.saturating_add(discarded), cpus)?;
            if (0..events.len() as u32).any(|id| !refused.contains(&id)) {
                writeln!(o, "# kprobe_profile:")?;
                for (id, def) in events.iter().enumerate() {
                    if refused.contains(&(id as u32)) {
                        continue;
                    }
                    // Hits: records seen plus those the agent could not write.
                    let seen = seen.get(id).copied().unwrap_or(0);
                    let (dropped, missed) = counters[id];
                    writeln!(o, "#   {:<44} {:>15} {:>15}", def.event, seen.saturating_add(dropped), missed)?;
                }
            }
            for (pid, path, _) in execs.iter().filter(|e| !e.2) {
                writeln!(o, "# pid {pid}'s counts stop at its exec of {path} (not traced after exec)")?;
            }
            for (pid, path) in &not_joined {
                writeln!(
                    o,
                    "# pid {pid} exec'd {path} but ftprobe's agent never started there: not traced \
                     after exec (the dynamic loader did not preload it: a program with file \
                     capabilities, or one that runs without the environment it was given?)"
                )?;
                writeln!(o, "# pid {pid}'s counts stop at its exec of {path} (not traced after exec)")?;
            }
            if hint && execs.iter().any(|e| !e.2) {
                writeln!(o, "{FOLLOW_EXEC_HINT}")?;
            }
            o.flush()
        });
    }
}

impl Sink for Printer {
    fn poll<S: Source>(&mut self, src: &mut S, final_poll: bool) {
        self.final_poll = final_poll;
        if let Some(live) = self.live.clone() {
            // Events the control channel added: known before the agent writes any record.
            for (id, def) in live.take_added() {
                let id = id as usize;
                if self.events.len() <= id {
                    self.events.resize(id + 1, def.clone());
                    self.decoders.resize_with(id + 1, || None);
                }
                self.decoders[id] = RecordDecoder::new(&def);
                self.events[id] = def;
            }
        }
        self.poll_source(src);
        if let Some(live) = &self.live {
            live.publish_profile(
                (0..self.events.len())
                    .map(|id| {
                        let (dropped, missed) = src.event_counters(id as u32);
                        (self.seen.get(id).copied().unwrap_or(0), dropped, missed)
                    })
                    .collect(),
            );
        }
    }

    fn flush(&mut self) {
        Printer::flush(self);
    }

    fn finish<S: Source>(&mut self, src: &mut S, end: &End) -> Result<()> {
        self.finish_source(src, end);
        Ok(())
    }

    fn set_live(&mut self, live: std::sync::Arc<crate::control::LiveEvents>) {
        Printer::set_live(self, live);
    }

    fn failed(&self) -> bool {
        self.write_failed
    }
}
