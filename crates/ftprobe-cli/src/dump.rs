//! `ftprobe dump`: a recording ([`crate::recording`]) exported for other tools:
//! - `--chrome FILE`: Chrome's Trace Event Format (JSON, through `serde_json`), which
//!   chrome://tracing, ui.perfetto.dev and speedscope open: one complete event (`X`) per call
//!   of a function_graph recording, with `ts` and `dur` in microseconds (fractions for the
//!   nanoseconds); an instant event (`i`) per function-tracer entry and per kprobe event, a
//!   kprobe event's fetch args as its `args`; each thread's name as a metadata event (`M`).
//! - `--perfetto FILE`: Perfetto's native protobuf trace ([`crate::perfetto`]): a track per
//!   process and per thread, a begin and an end slice event per call, an instant event per
//!   function-tracer entry and per kprobe event.
//! - `--flame-graph FILE`: folded stacks (`a;b;c N`, one line per distinct stack, as
//!   Brendan Gregg's `stackcollapse` scripts write them), N the self time in ns of the calls
//!   with that stack, so that a stack's width is its total time; with `--svg` the flame graph
//!   drawn from them by the `inferno` crate.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use ftprobe::record::Record;
use ftprobe::trace_kprobe::RecordDecoder;
use rustc_hash::FxHashMap;
use serde_json::{json, Value};

use crate::recording::{DataDir, Recording};
use crate::report::name_of;
use crate::trace::open_output;

/// Arguments of `ftprobe dump`.
#[derive(Args)]
pub struct DumpArgs {
    #[command(flatten)]
    data: DataDir,
    /// Write Chrome Trace Event JSON to FILE (`-` for standard output).
    #[arg(long, value_name = "FILE")]
    chrome: Option<PathBuf>,
    /// Write a Perfetto protobuf trace to FILE (`-` for standard output).
    #[arg(long, value_name = "FILE")]
    perfetto: Option<PathBuf>,
    /// Write folded stacks weighted by self time in ns to FILE (`-` for standard output).
    #[arg(long = "flame-graph", value_name = "FILE")]
    flame_graph: Option<PathBuf>,
    /// With --flame-graph: write an SVG flame graph instead of the folded stacks.
    #[arg(long, requires = "flame_graph")]
    svg: bool,
    #[command(flatten)]
    selection: crate::replay::Selection,
}

/// FILE, or standard output for `-`; its write errors name it.
fn output(path: &PathBuf) -> Result<Box<dyn Write>> {
    let inner = open_output((path.as_os_str() != "-").then_some(path))?;
    let name = if path.as_os_str() == "-" {
        "standard output".to_owned()
    } else {
        path.display().to_string()
    };
    Ok(Box::new(Named { inner, name }))
}

/// A writer whose errors say what was being written (their kind kept: a closed pipe is
/// still one).
struct Named {
    inner: Box<dyn Write>,
    name: String,
}

impl Named {
    fn named(&self, e: std::io::Error) -> std::io::Error {
        std::io::Error::new(e.kind(), format!("writing {}: {e}", self.name))
    }
}

impl Write for Named {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.inner.write(buf).map_err(|e| self.named(e))
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush().map_err(|e| self.named(e))
    }
}

/// Writes a JSON array's elements one at a time (memory bounded by one event, not by the
/// recording).
struct JsonArray<'a> {
    out: &'a mut dyn Write,
    first: bool,
    err: Option<std::io::Error>,
}

impl JsonArray<'_> {
    fn push(&mut self, v: Value) {
        if self.err.is_some() {
            return;
        }
        let r = if self.first {
            Ok(())
        } else {
            self.out.write_all(b",\n")
        };
        self.first = false;
        if let Err(e) =
            r.and_then(|()| serde_json::to_writer(&mut *self.out, &v).map_err(Into::into))
        {
            self.err = Some(e);
        }
    }
}

/// Chrome Trace Event JSON of the recording, written to `o` event by event.
fn chrome(rec: &mut Recording, o: &mut dyn Write) -> Result<()> {
    o.write_all(b"{\"traceEvents\":[\n")?;
    let mut out = JsonArray {
        out: o,
        first: true,
        err: None,
    };
    chrome_events(rec, &mut out)?;
    if let Some(e) = out.err {
        return Err(e.into());
    }
    o.write_all(b"\n],\"displayTimeUnit\":\"ns\"}\n")?;
    Ok(())
}

fn chrome_events(rec: &mut Recording, out: &mut JsonArray<'_>) -> Result<()> {
    let events = rec.events()?;
    let decoders: Vec<Option<RecordDecoder>> = events.iter().map(RecordDecoder::new).collect();
    let mut syms = rec.symbols();
    let mono = crate::session::Source::clock(&*rec);
    let us = |ns: u64| ns as f64 / 1000.0;
    let graph = rec.info.tracer == "function_graph";
    // Each process's name: the command for the target, its main thread's comm for a forked
    // child (threads of a process share its pid: a forked child's have their own).
    let mut named = std::collections::BTreeSet::new();
    for i in rec.ring_ids() {
        let pid = rec.pid_of(i);
        if named.insert(pid) {
            out.push(json!({
                "name": "process_name", "ph": "M", "pid": pid, "tid": pid,
                "args": { "name": process_name(rec, pid) },
            }));
        }
    }
    for i in rec.ring_ids() {
        let (comm, tid) = rec.thread(i);
        let pid = rec.pid_of(i);
        out.push(json!({
            "name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
            "args": { "name": comm },
        }));
        rec.select_stream(&mut syms, i);
        if graph {
            rec.calls(i, |c, _| {
                let mut e = json!({
                    "name": name_of(&mut syms, c.func),
                    "cat": "function",
                    "ph": "X",
                    "ts": us(c.start_ns),
                    "dur": us(c.dur_ns),
                    "pid": pid,
                    "tid": tid,
                });
                if c.lost_return {
                    // Its return is in a gap: the slice runs to the gap's mark.
                    e["args"] = json!({ "cut": true, "lost_return": true });
                } else if c.cut {
                    e["args"] = json!({ "cut": true });
                }
                out.push(e);
            })?;
        }
        rec.for_each(i, &mut |rt, aux, w| {
            match Record::decode(rt, aux, w) {
                // A gap in the thread's records: an instant where it was marked.
                Some(Record::Lost { ts, count, .. }) if count > 0 => {
                    out.push(json!({
                        "name": format!("LOST {count} EVENTS"),
                        "cat": "lost",
                        "ph": "i", "s": "t",
                        "ts": us(mono.tsc_to_mono_ns(ts)),
                        "pid": pid, "tid": tid,
                        "args": { "lost": count },
                    }));
                }
                Some(Record::Func {
                    ts, ip, parent_ip, ..
                }) if !graph => {
                    let mut parent = Vec::new();
                    syms.push_return_name(parent_ip, &mut parent);
                    out.push(json!({
                        "name": name_of(&mut syms, ip),
                        "cat": "function",
                        "ph": "i", "s": "t",
                        "ts": us(mono.tsc_to_mono_ns(ts)),
                        "pid": pid, "tid": tid,
                        "args": { "parent": String::from_utf8_lossy(&parent) },
                    }));
                }
                Some(Record::Kprobe {
                    ts, event, words, ..
                }) => {
                    let id = event as usize;
                    let Some(def) = events.get(id) else { return };
                    let dec = decoders.get(id).and_then(Option::as_ref);
                    let args: serde_json::Map<String, Value> =
                        crate::output::kprobe_args(def, dec, words, &mut syms)
                            .into_iter()
                            .map(|(n, t)| {
                                // A number stays a number; the rest as `trace` prints it.
                                let v = t
                                    .parse::<i64>()
                                    .map(Value::from)
                                    .or_else(|_| t.parse::<u64>().map(Value::from))
                                    .unwrap_or(Value::String(t));
                                (n, v)
                            })
                            .collect();
                    out.push(json!({
                        "name": def.event,
                        "cat": "kprobe",
                        "ph": "i", "s": "t",
                        "ts": us(mono.tsc_to_mono_ns(ts)),
                        "pid": pid, "tid": tid,
                        "args": args,
                    }));
                }
                _ => {}
            }
        })?;
    }
    Ok(())
}

/// The name of process `pid` of the recording: the command for the target, else the comm of
/// its main thread (tid = pid) if it has a ring, else its first thread's.
pub(crate) fn process_name(rec: &Recording, pid: u32) -> String {
    if pid == rec.info.end.pid {
        return rec.info.command.join(" ");
    }
    let threads: Vec<(String, u32)> = rec
        .ring_ids()
        .into_iter()
        .filter(|&i| rec.pid_of(i) == pid)
        .map(|i| rec.thread(i))
        .collect();
    threads
        .iter()
        .find(|(_, tid)| *tid == pid)
        .or(threads.first())
        .map(|(comm, _)| comm.clone())
        .unwrap_or_default()
}

/// Folded stacks of a function_graph recording: (stack, self ns), sorted by stack.
fn folded(rec: &mut Recording) -> Result<Vec<(String, u64)>> {
    if rec.info.tracer != "function_graph" {
        bail!(
            "a flame graph needs a function_graph recording (this one is {}): record with -t function_graph",
            rec.info.tracer
        );
    }
    let mut syms = rec.symbols();
    let mut stacks: FxHashMap<String, u64> = FxHashMap::default();
    let ids: Vec<u32> = rec.ring_ids();
    for i in ids {
        rec.select_stream(&mut syms, i);
        rec.calls(i, |c, callers| {
            // A call whose return was lost in a gap has no known time.
            if c.self_ns == 0 || c.lost_return {
                return;
            }
            let mut s = String::new();
            for &f in callers {
                s.push_str(&name_of(&mut syms, f));
                s.push(';');
            }
            s.push_str(&name_of(&mut syms, c.func));
            *stacks.entry(s).or_default() += c.self_ns;
        })?;
    }
    let mut v: Vec<(String, u64)> = stacks.into_iter().collect();
    v.sort();
    Ok(v)
}

/// Write what was asked; returns the exit code.
pub fn run(args: DumpArgs) -> Result<i32> {
    if args.chrome.is_none() && args.perfetto.is_none() && args.flame_graph.is_none() {
        return Err(crate::usage!(
            "nothing to dump: --chrome FILE, --perfetto FILE and/or --flame-graph FILE"
        ));
    }
    let stdout = [&args.chrome, &args.perfetto, &args.flame_graph]
        .iter()
        .filter(|p| p.as_ref().is_some_and(|p| p.as_os_str() == "-"))
        .count();
    if stdout > 1 {
        // A usage error, as clap's own (exit status 2).
        return Err(crate::usage!(
            "only one of --chrome, --perfetto and --flame-graph may write to standard output (-)"
        ));
    }
    let mut rec = Recording::open_filtered(&args.data.dir, args.selection.filters())?;
    if let Some(path) = &args.chrome {
        let mut o = output(path)?;
        chrome(&mut rec, &mut o)?;
        o.flush()?;
    }
    if let Some(path) = &args.perfetto {
        let mut o = output(path)?;
        crate::perfetto::write(&mut rec, &mut o)?;
        o.flush()?;
    }
    if let Some(path) = &args.flame_graph {
        let stacks = folded(&mut rec)?;
        let lines: Vec<String> = stacks.iter().map(|(s, n)| format!("{s} {n}")).collect();
        let mut o = output(path)?;
        if args.svg {
            let mut opts = inferno::flamegraph::Options::default();
            opts.title = format!("ftprobe: {}", rec.info.command.join(" "));
            opts.count_name = "ns".to_owned();
            inferno::flamegraph::from_lines(&mut opts, lines.iter().map(String::as_str), &mut o)
                .context("drawing the flame graph")?;
        } else {
            for l in &lines {
                writeln!(o, "{l}")?;
            }
        }
        o.flush()?;
    }
    Ok(0)
}
