//! `ftprobe trace`: run CMD in a tracing session ([`crate::session`]) and print its events
//! live in ftrace's `trace` format, then the lost-event counts and the kprobe profile; exit
//! with its status. [`Printer`] is also what `ftprobe replay` formats a recording with.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use ftprobe::events::ProbeDef;
use ftprobe::ring::Clock;
use ftprobe::trace::rtype;
use ftprobe::trace_kprobe::{RecordDecoder, RECORD_HEAD_WORDS};

use crate::output;
use crate::session::{self, End, SessionArgs, Sink, Source, PREFAULT_EVERY};
use crate::symbols::Symbols;

/// TEXT record kinds the agent writes (`ftprobe-agent`'s `TEXT_*`): the armed-probes
/// listing, `PID\tPATH` before an exec, `PID\tERRNO` when that exec failed.
const TEXT_KPROBES_LIST: u32 = 1;
const TEXT_EXEC: u32 = 2;
const TEXT_EXEC_FAILED: u32 = 3;

/// Arguments of `ftprobe trace`.
#[derive(Args)]
pub struct TraceArgs {
    /// Write the trace to FILE instead of standard output.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: Option<PathBuf>,
    #[command(flatten)]
    session: SessionArgs,
}

/// The trace's output: FILE, or standard output.
pub fn open_output(path: Option<&PathBuf>) -> Result<Box<dyn Write>> {
    Ok(match path {
        Some(p) => Box::new(BufWriter::new(
            File::create(p).with_context(|| format!("creating {}", p.display()))?,
        )),
        None => Box::new(BufWriter::new(std::io::stdout())),
    })
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

/// One record of a poll, its words in `Printer::arena`.
struct Event {
    ts: u64,
    ring: u32,
    aux: u32,
    rtype: u16,
    /// `arena[start..start + len]`: the record's payload (timestamp first).
    start: usize,
    len: usize,
}

pub struct Printer {
    /// `None` once the output is gone (a closed pipe): the program keeps running untraced.
    out: Option<Box<dyn Write>>,
    /// The source's clock, taken at the first poll.
    clock: Clock,
    symbols: Option<Symbols>,
    objects: Vec<(u64, Vec<u8>)>,
    events: Vec<ProbeDef>,
    /// Per event, its record layout (worked out once, not per record).
    decoders: Vec<Option<RecordDecoder>>,
    batch: Vec<Event>,
    /// Payload words of the records in `batch`, reused from poll to poll.
    arena: Vec<u64>,
    /// `TASK-PID ` per stream (one thread: a ring's next owner is a new stream).
    tasks: Vec<Option<Vec<u8>>>,
    /// The text of a poll, reused.
    lines: Vec<u8>,
    /// Records seen per event id.
    seen: Vec<u64>,
    /// Event lines formatted (function and kprobe events).
    printed: u64,
    /// Writing the trace failed (not a closed pipe).
    write_failed: bool,
    /// Processes that exec'd (pid, the program they ran), as the agent noted it.
    execs: Vec<(u32, String)>,
    /// `# tracer:` in the header.
    tracer: &'static str,
    /// The agent armed everything and the header is out. Until then nothing is printed: a
    /// program stopped because something could not be armed leaves no trace-like output.
    started: bool,
    /// The function_graph tracer's layout and state, when it is the tracer.
    graph: Option<crate::graph::Graph>,
    /// function_graph: per ring, an entry that was the ring's last record at the end of a
    /// poll (rtype, aux, words), kept for the next poll, where the thread's next record
    /// tells whether it is a leaf.
    carry: Vec<Option<(u16, u32, Vec<u64>)>>,
    /// The last poll: nothing is kept for later.
    final_poll: bool,
    /// comm and tid per ring.
    task_ids: Vec<Option<(Vec<u8>, u32)>>,
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
            decoders: events.iter().map(RecordDecoder::new).collect(),
            events,
            batch: Vec::new(),
            arena: Vec::new(),
            tasks: Vec::new(),
            lines: Vec::new(),
            seen: Vec::new(),
            printed: 0,
            write_failed: false,
            execs: Vec::new(),
            tracer,
            started: false,
            graph: graph.map(|(opts, ncpus)| crate::graph::Graph::new(opts, ncpus)),
            carry: Vec::new(),
            final_poll: false,
            task_ids: Vec::new(),
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

    /// Drain every ring, merge the records by timestamp, print them.
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
        self.batch.clear();
        self.arena.clear();
        // (pid, line) of the execs noted in this poll.
        let mut exec_notes: Vec<(u32, String)> = Vec::new();
        for i in 0..rings.claimed().min(rings.nr_rings()) {
            let batch = &mut self.batch;
            let arena = &mut self.arena;
            let mut texts = Vec::new();
            let first = batch.len();
            if self.carry.len() <= i as usize {
                self.carry.resize(i as usize + 1, None);
            }
            if let Some((rtype, aux, w)) = self.carry[i as usize].take() {
                batch.push(Event {
                    ts: w[0],
                    ring: i,
                    aux,
                    rtype,
                    start: arena.len(),
                    len: w.len(),
                });
                arena.extend_from_slice(&w);
            }
            let readable = rings.drain(i, |rtype, aux, w| match rtype {
                rtype::FUNC | rtype::KPROBE | rtype::FGRAPH_ENT | rtype::FGRAPH_RET
                    if !w.is_empty() =>
                {
                    batch.push(Event {
                        ts: w[0],
                        ring: i,
                        aux,
                        rtype,
                        start: arena.len(),
                        len: w.len(),
                    });
                    arena.extend_from_slice(w);
                }
                rtype::TEXT => texts.push((
                    aux,
                    w.iter()
                        .flat_map(|x| x.to_le_bytes())
                        .filter(|&b| b != 0)
                        .collect::<Vec<u8>>(),
                )),
                _ => {}
            });
            if !readable {
                continue;
            }
            // function_graph: an entry that is the thread's last record so far waits for the
            // next poll (its return, if it is a leaf, is not written yet).
            if self.graph.is_some()
                && !self.final_poll
                && batch.len() > first
                && batch.last().is_some_and(|e| e.rtype == rtype::FGRAPH_ENT)
            {
                let e = batch.pop().expect("checked");
                let w = arena[e.start..e.start + e.len].to_vec();
                arena.truncate(e.start);
                self.carry[i as usize] = Some((e.rtype, e.aux, w));
            }
            for (kind, t) in texts {
                let text = String::from_utf8_lossy(&t).into_owned();
                match kind {
                    TEXT_KPROBES_LIST => self.write(|o| {
                        writeln!(o, "# kprobes/list:")?;
                        text.lines().try_for_each(|l| writeln!(o, "#   {l}"))
                    }),
                    TEXT_EXEC | TEXT_EXEC_FAILED => {
                        let (pid, rest) = text.split_once('\t').unwrap_or((&text, ""));
                        let pid: u32 = pid.parse().unwrap_or(0);
                        if kind == TEXT_EXEC {
                            self.execs.push((pid, rest.to_owned()));
                            exec_notes.push((
                                pid,
                                format!("# pid {pid} exec'd {rest}: not traced after exec\n"),
                            ));
                        } else if let Some(at) = self.execs.iter().rposition(|e| e.0 == pid) {
                            let (_, path) = self.execs.remove(at);
                            // Its "exec'd" line, if not printed yet, is replaced by this one.
                            if let Some(n) = exec_notes.iter().rposition(|n| n.0 == pid) {
                                exec_notes.remove(n);
                            }
                            let err = std::io::Error::from_raw_os_error(rest.parse().unwrap_or(0))
                                .to_string();
                            let err = err.split(" (os error").next().unwrap_or_default();
                            exec_notes.push((
                                pid,
                                format!(
                                    "# pid {pid}: exec of {path} failed ({err}); still traced\n"
                                ),
                            ));
                        }
                    }
                    _ => {}
                }
            }
        }
        // After this poll's events: an exec is the last thing its process did.
        let exec_notes = std::mem::take(&mut exec_notes);
        if self.batch.is_empty() {
            for (_, n) in &exec_notes {
                self.write(|o| o.write_all(n.as_bytes()));
            }
            return;
        }
        let objects = rings.objects();
        if self.symbols.is_none() || objects != self.objects {
            self.symbols = Some(Symbols::new(&objects));
            self.objects = objects;
        }
        // Each ring is in time order already; with one thread (or threads that never
        // overlapped in this poll) there is nothing to merge. The sort is stable: records of
        // one ring with equal timestamps keep their order.
        if !self.batch.windows(2).all(|p| p[0].ts <= p[1].ts) {
            self.batch.sort_by_key(|e| e.ts);
        }
        let nr_rings = rings.nr_rings() as usize;
        if self.tasks.len() < nr_rings {
            self.tasks.resize(nr_rings, None);
        }
        if self.graph.is_some() {
            self.print_graph_batch(rings, exec_notes);
            return;
        }
        let lines = &mut self.lines;
        lines.clear();
        let syms = self.symbols.as_mut().expect("set above");
        for (n, e) in self.batch.iter().enumerate() {
            if n % PREFAULT_EVERY == PREFAULT_EVERY - 1 {
                rings.prefault();
            }
            let mark = lines.len();
            let task = self.tasks[e.ring as usize].get_or_insert_with(|| {
                let (comm, tid) = rings.task(e.ring).unwrap_or_default();
                output::task_prefix(&comm, tid)
            });
            lines.extend_from_slice(task);
            output::push_cpu_time(lines, e.aux & 0xfff, self.clock.tsc_to_mono_ns(e.ts));
            let words = &self.arena[e.start..e.start + e.len];
            match e.rtype {
                rtype::FUNC if words.len() == 3 => {
                    // kernel/trace/trace_output.c, print_fn_trace(): no parent when it is 0.
                    syms.push_name(words[1], lines);
                    if words[2] != 0 {
                        lines.extend_from_slice(b" <-");
                        syms.push_return_name(words[2], lines);
                    }
                    lines.push(b'\n');
                    self.printed += 1;
                }
                rtype::KPROBE if words.len() >= RECORD_HEAD_WORDS => {
                    let id = (e.aux >> 12) as usize;
                    let Some(def) = self.events.get(id) else {
                        // Not an event of ours (a mismatched agent): no line.
                        lines.truncate(mark);
                        continue;
                    };
                    if self.seen.len() <= id {
                        self.seen.resize(id + 1, 0);
                    }
                    self.seen[id] += 1;
                    let decoder = self.decoders.get(id).and_then(Option::as_ref);
                    output::kprobe_event(lines, def, decoder, words, syms);
                    self.printed += 1;
                }
                _ => lines.push(b'\n'),
            }
        }
        let mut lines = std::mem::take(&mut self.lines);
        for (_, n) in &exec_notes {
            lines.extend_from_slice(n.as_bytes());
        }
        self.write(|o| o.write_all(&lines));
        self.lines = lines;
    }

    /// The function_graph tracer's lines for this poll's records (see [`crate::graph`]).
    fn print_graph_batch<S: Source>(&mut self, rings: &mut S, exec_notes: Vec<(u32, String)>) {
        let nr_rings = rings.nr_rings() as usize;
        if self.task_ids.len() < nr_rings {
            self.task_ids.resize(nr_rings, None);
        }
        // Per record, the index of its thread's next record in the batch.
        let n = self.batch.len();
        let mut next_of = vec![usize::MAX; n];
        let mut last_seen = vec![usize::MAX; nr_rings];
        for k in (0..n).rev() {
            let r = self.batch[k].ring as usize;
            next_of[k] = last_seen[r];
            last_seen[r] = k;
        }
        let mut consumed = vec![false; n];
        let mut lines = std::mem::take(&mut self.lines);
        lines.clear();
        let graph = self.graph.as_mut().expect("graph tracer");
        graph.threads_seen(rings.claimed() as usize, &mut lines);
        let syms = self.symbols.as_mut().expect("set by poll");
        let clock = &self.clock;
        for k in 0..n {
            if consumed[k] {
                continue;
            }
            if k % PREFAULT_EVERY == PREFAULT_EVERY - 1 {
                rings.prefault();
            }
            let e = &self.batch[k];
            let (comm, tid) = self.task_ids[e.ring as usize]
                .get_or_insert_with(|| rings.task(e.ring).unwrap_or_default());
            let ctx = crate::graph::Ctx {
                cpu: e.aux & 0xfff,
                pid: *tid,
                comm,
            };
            let words = &self.arena[e.start..e.start + e.len];
            let depth = crate::graph::depth_of(e.aux);
            match e.rtype {
                rtype::FGRAPH_ENT if words.len() >= 2 => {
                    let func = words[1];
                    let leaf = next_of[k];
                    let ret = (leaf != usize::MAX).then(|| &self.batch[leaf]).filter(|r| {
                        r.rtype == rtype::FGRAPH_RET
                            && r.len >= 4
                            && crate::graph::Exit::from_aux(r.aux) == crate::graph::Exit::Returned
                            && self.arena[r.start + 1] == func
                    });
                    match ret {
                        Some(r) => {
                            let rw = &self.arena[r.start..r.start + r.len];
                            let ns = clock
                                .tsc_to_mono_ns(rw[0])
                                .saturating_sub(clock.tsc_to_mono_ns(rw[2]));
                            graph.leaf(&mut lines, ctx, func, depth, ns, rw[3], syms);
                            consumed[leaf] = true;
                        }
                        None => graph.nested(&mut lines, ctx, func, depth, syms),
                    }
                    self.printed += 1;
                }
                rtype::FGRAPH_RET if words.len() >= 4 => {
                    let ns = clock
                        .tsc_to_mono_ns(words[0])
                        .saturating_sub(clock.tsc_to_mono_ns(words[2]));
                    let exit = crate::graph::Exit::from_aux(e.aux);
                    graph.ret(&mut lines, ctx, words[1], depth, ns, words[3], exit, syms);
                    self.printed += 1;
                }
                rtype::KPROBE if words.len() >= RECORD_HEAD_WORDS => {
                    let id = (e.aux >> 12) as usize;
                    let Some(def) = self.events.get(id) else {
                        continue;
                    };
                    if self.seen.len() <= id {
                        self.seen.resize(id + 1, 0);
                    }
                    self.seen[id] += 1;
                    let decoder = self.decoders.get(id).and_then(Option::as_ref);
                    let mut text = Vec::new();
                    output::kprobe_event(&mut text, def, decoder, words, syms);
                    graph.comment(&mut lines, ctx, &text);
                    self.printed += 1;
                }
                _ => {}
            }
        }
        for (_, n) in &exec_notes {
            lines.extend_from_slice(n.as_bytes());
        }
        self.write(|o| o.write_all(&lines));
        self.lines = lines;
    }

    fn finish_source<S: Source>(&mut self, rings: &mut S, end: &End) {
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
        let mut total = rings.lost_no_ring() + rings.lost_recursion();
        for i in 0..rings.claimed().min(rings.nr_rings()) {
            let Some((_, tid)) = rings.task(i) else {
                continue;
            };
            let lost = rings.lost(i);
            if lost > 0 {
                per_ring.push((tid, lost));
            }
            total += lost;
        }
        // Per event: (records dropped, nmissed), from the shared header: exact whether or
        // not the target reached its exit.
        let counters: Vec<(u64, u64)> = (0..self.events.len() as u32)
            .map(|id| rings.event_counters(id))
            .collect();
        let events = self.events.clone();
        let seen = self.seen.clone();
        let abandoned = end.abandoned.clone();
        let cpus = rings.cpus_online();
        let lost_by_tid = rings.lost_by_tid();
        let (lost_no_ring, lost_recursion, fgraph_overrun) = (
            rings.lost_no_ring(),
            rings.lost_recursion(),
            rings.fgraph_overrun(),
        );
        let execs = self.execs.clone();
        let printed = self.printed;
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
            if lost_no_ring > 0 {
                writeln!(o, "# {lost_no_ring} events lost: more threads than rings (--rings)")?;
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
            writeln!(o, "# lost events: {total}")?;
            output::entries(o, printed, total, cpus)?;
            if !events.is_empty() {
                writeln!(o, "# kprobe_profile:")?;
                for (id, def) in events.iter().enumerate() {
                    // Hits: records seen plus those the agent could not write.
                    let seen = seen.get(id).copied().unwrap_or(0);
                    let (dropped, missed) = counters[id];
                    writeln!(o, "#   {:<44} {:>15} {:>15}", def.event, seen + dropped, missed)?;
                }
            }
            for (pid, path) in &execs {
                writeln!(o, "# pid {pid}'s counts stop at its exec of {path} (not traced after exec)")?;
            }
            o.flush()
        });
    }
}

impl Sink for Printer {
    fn poll<S: Source>(&mut self, src: &mut S, final_poll: bool) {
        self.final_poll = final_poll;
        self.poll_source(src);
    }

    fn flush(&mut self) {
        Printer::flush(self);
    }

    fn finish<S: Source>(&mut self, src: &mut S, end: &End) -> Result<()> {
        self.finish_source(src, end);
        Ok(())
    }

    fn failed(&self) -> bool {
        self.write_failed
    }
}
