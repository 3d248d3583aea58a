//! Chrome's Trace Event Format (`dump --chrome`): JSON through `serde_json`, which
//! chrome://tracing, ui.perfetto.dev and speedscope open (see [`crate::dump`]).

use std::io::Write;

use anyhow::Result;
use ftprobe::record::Record;
use ftprobe::trace_kprobe::RecordDecoder;
use serde_json::{json, Value};

use super::process_name;
use crate::recording::Recording;
use crate::symbols::name_of;

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
pub fn write(rec: &mut Recording, o: &mut dyn Write) -> Result<()> {
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
