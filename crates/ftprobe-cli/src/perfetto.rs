//! `ftprobe dump --perfetto FILE`: a recording as Perfetto's native trace, a protobuf `Trace`
//! of `TracePacket`s holding TrackEvents, which ui.perfetto.dev and `trace_processor` open.
//!
//! # The trace
//!
//! - one packet sequence (`trusted_packet_sequence_id` [`SEQUENCE_ID`]); its first packet
//!   clears the incremental state (`SEQ_INCREMENTAL_STATE_CLEARED`) and is a `ClockSnapshot`
//!   that makes CLOCK_MONOTONIC the trace's clock (`primary_trace_clock`); every timed packet
//!   says its timestamp is CLOCK_MONOTONIC ns (`timestamp_clock_id` 3), the recording's clock;
//! - a `TrackDescriptor` per process (`ProcessDescriptor`: pid, the command or the comm) and
//!   per thread (`ThreadDescriptor`: pid, tid, the thread's name; its parent the process's
//!   track): a forked child's threads are in their own process;
//! - per call of a function_graph recording, a `TYPE_SLICE_BEGIN` and a `TYPE_SLICE_END` on
//!   its thread's track, nested as the calls were (a call cut off, which did not return, is
//!   ended at its cut and has the debug annotation `cut: true`);
//! - per function-tracer entry and per kprobe event, a `TYPE_INSTANT` on its thread's track
//!   (categories `function` and `kprobe`); a kprobe event's fetch args are its debug
//!   annotations (a number as an int or uint, the rest as `trace` prints it), a function
//!   entry's caller is its `parent` annotation;
//! - event names and categories are interned (`InternedData` in the packet that first uses
//!   one, `SEQ_NEEDS_INCREMENTAL_STATE` on the packets that refer to them).
//!
//! Packets are written in timestamp order (a thread's own events in its order).
//!
//! # The encoder
//!
//! The messages below declare only the fields this export writes, with the names, types and
//! field numbers of Perfetto's `.proto` files (`protos/perfetto/trace/trace.proto`,
//! `trace_packet.proto`, `clock_snapshot.proto`, `interned_data/interned_data.proto`,
//! `track_event/{track_event,track_descriptor,process_descriptor,thread_descriptor,
//! debug_annotation}.proto`); `prost` encodes them. A reader with the full schema parses the
//! result (the tests check it with the `perfetto` Python package's `perfetto_trace_pb2`).
//! The whole schema (some 400 `.proto` files) is not compiled in: these few fields are all
//! the export needs.

use std::io::Write;

use anyhow::Result;
use ftprobe::record::Record;
use ftprobe::trace_kprobe::RecordDecoder;
use prost::Message;
use rustc_hash::FxHashMap;

use crate::recording::Recording;
use crate::report::name_of;

/// `trace.proto`'s `Trace`: `repeated TracePacket packet = 1` (written one packet at a time,
/// each as that field: see [`write_packet`]).
const TRACE_PACKET_FIELD: u32 = 1;

/// The packet sequence of the whole trace.
pub const SEQUENCE_ID: u32 = 1;

/// `builtin_clock.proto`'s `BUILTIN_CLOCK_MONOTONIC`.
pub const CLOCK_MONOTONIC: u32 = 3;

/// `TracePacket.SequenceFlags`.
const SEQ_INCREMENTAL_STATE_CLEARED: u32 = 1;
const SEQ_NEEDS_INCREMENTAL_STATE: u32 = 2;

/// `TrackEvent.Type`.
const TYPE_SLICE_BEGIN: i32 = 1;
const TYPE_SLICE_END: i32 = 2;
const TYPE_INSTANT: i32 = 3;

/// Track uuids: a process's is this plus its pid, a thread's (ring's) this plus its ring index.
const PROCESS_UUID: u64 = 1 << 48;
const THREAD_UUID: u64 = 2 << 48;

/// Interned categories: their iids, and their names by iid - 1.
const CAT_FUNCTION: u64 = 1;
const CAT_KPROBE: u64 = 2;
const CATEGORIES: [&str; 2] = ["function", "kprobe"];

/// `trace_packet.proto`'s `TracePacket` (the fields used).
#[derive(Clone, PartialEq, Message)]
pub struct TracePacket {
    #[prost(uint64, optional, tag = "8")]
    pub timestamp: Option<u64>,
    #[prost(uint32, optional, tag = "58")]
    pub timestamp_clock_id: Option<u32>,
    #[prost(message, optional, tag = "6")]
    pub clock_snapshot: Option<ClockSnapshot>,
    #[prost(message, optional, tag = "11")]
    pub track_event: Option<TrackEvent>,
    #[prost(message, optional, tag = "60")]
    pub track_descriptor: Option<TrackDescriptor>,
    #[prost(uint32, optional, tag = "10")]
    pub trusted_packet_sequence_id: Option<u32>,
    #[prost(message, optional, tag = "12")]
    pub interned_data: Option<InternedData>,
    #[prost(uint32, optional, tag = "13")]
    pub sequence_flags: Option<u32>,
    #[prost(bool, optional, tag = "87")]
    pub first_packet_on_sequence: Option<bool>,
}

/// `clock_snapshot.proto`'s `ClockSnapshot`.
#[derive(Clone, PartialEq, Message)]
pub struct ClockSnapshot {
    #[prost(message, repeated, tag = "1")]
    pub clocks: Vec<Clock>,
    #[prost(int32, optional, tag = "2")]
    pub primary_trace_clock: Option<i32>,
}

/// `ClockSnapshot.Clock`.
#[derive(Clone, PartialEq, Message)]
pub struct Clock {
    #[prost(uint32, optional, tag = "1")]
    pub clock_id: Option<u32>,
    #[prost(uint64, optional, tag = "2")]
    pub timestamp: Option<u64>,
}

/// `track_descriptor.proto`'s `TrackDescriptor`.
#[derive(Clone, PartialEq, Message)]
pub struct TrackDescriptor {
    #[prost(uint64, optional, tag = "1")]
    pub uuid: Option<u64>,
    #[prost(uint64, optional, tag = "5")]
    pub parent_uuid: Option<u64>,
    #[prost(message, optional, tag = "3")]
    pub process: Option<ProcessDescriptor>,
    #[prost(message, optional, tag = "4")]
    pub thread: Option<ThreadDescriptor>,
}

/// `process_descriptor.proto`'s `ProcessDescriptor`.
#[derive(Clone, PartialEq, Message)]
pub struct ProcessDescriptor {
    #[prost(int32, optional, tag = "1")]
    pub pid: Option<i32>,
    #[prost(string, repeated, tag = "2")]
    pub cmdline: Vec<String>,
    #[prost(string, optional, tag = "6")]
    pub process_name: Option<String>,
}

/// `thread_descriptor.proto`'s `ThreadDescriptor`.
#[derive(Clone, PartialEq, Message)]
pub struct ThreadDescriptor {
    #[prost(int32, optional, tag = "1")]
    pub pid: Option<i32>,
    #[prost(int32, optional, tag = "2")]
    pub tid: Option<i32>,
    #[prost(string, optional, tag = "5")]
    pub thread_name: Option<String>,
}

/// `track_event.proto`'s `TrackEvent`.
#[derive(Clone, PartialEq, Message)]
pub struct TrackEvent {
    /// proto2 `repeated uint64`: not packed.
    #[prost(uint64, repeated, packed = "false", tag = "3")]
    pub category_iids: Vec<u64>,
    #[prost(message, repeated, tag = "4")]
    pub debug_annotations: Vec<DebugAnnotation>,
    #[prost(int32, optional, tag = "9")]
    pub r#type: Option<i32>,
    #[prost(uint64, optional, tag = "10")]
    pub name_iid: Option<u64>,
    #[prost(uint64, optional, tag = "11")]
    pub track_uuid: Option<u64>,
}

/// `debug_annotation.proto`'s `DebugAnnotation` (name and value inline, not interned).
#[derive(Clone, PartialEq, Message)]
pub struct DebugAnnotation {
    #[prost(string, optional, tag = "10")]
    pub name: Option<String>,
    #[prost(bool, optional, tag = "2")]
    pub bool_value: Option<bool>,
    #[prost(uint64, optional, tag = "3")]
    pub uint_value: Option<u64>,
    #[prost(int64, optional, tag = "4")]
    pub int_value: Option<i64>,
    #[prost(string, optional, tag = "6")]
    pub string_value: Option<String>,
}

/// `interned_data.proto`'s `InternedData`.
#[derive(Clone, PartialEq, Message)]
pub struct InternedData {
    #[prost(message, repeated, tag = "1")]
    pub event_categories: Vec<Interned>,
    #[prost(message, repeated, tag = "2")]
    pub event_names: Vec<Interned>,
}

/// `track_event.proto`'s `EventCategory` and `EventName` (the same two fields).
#[derive(Clone, PartialEq, Message)]
pub struct Interned {
    #[prost(uint64, optional, tag = "1")]
    pub iid: Option<u64>,
    #[prost(string, optional, tag = "2")]
    pub name: Option<String>,
}

/// Write `packet` as one `Trace.packet` field: a `Trace` is the concatenation of them.
fn write_packet(out: &mut dyn Write, packet: &TracePacket, buf: &mut Vec<u8>) -> Result<()> {
    buf.clear();
    prost::encoding::message::encode(TRACE_PACKET_FIELD, packet, buf);
    out.write_all(buf)?;
    Ok(())
}

/// A packet of the sequence.
fn packet() -> TracePacket {
    TracePacket {
        trusted_packet_sequence_id: Some(SEQUENCE_ID),
        ..Default::default()
    }
}

/// An annotation with a value as `trace` prints it: a number stays a number.
fn annotation(name: String, text: String) -> DebugAnnotation {
    let mut a = DebugAnnotation {
        name: Some(name),
        ..Default::default()
    };
    if let Ok(v) = text.parse::<i64>() {
        a.int_value = Some(v);
    } else if let Ok(v) = text.parse::<u64>() {
        a.uint_value = Some(v);
    } else {
        a.string_value = Some(text);
    }
    a
}

/// What a thread's event is.
enum Kind {
    /// A call begins: its function, and whether it was cut off.
    Begin(u64, bool),
    End,
    /// An instant: its name, category iid, annotations.
    Instant(String, u64, Vec<DebugAnnotation>),
}

/// A thread's event at `ts` (CLOCK_MONOTONIC ns).
struct Event {
    ts: u64,
    kind: Kind,
}

/// The calls of ring `i` as begin/end events, nested, in order: the calls come in the order
/// they end with their depth; the tree they make is walked depth first.
fn slices(rec: &mut Recording, i: u32) -> Result<Vec<Event>> {
    let mut calls = Vec::new();
    // Per call, its children (indexes into `calls`); `open`: calls whose parent is to come.
    let mut children: Vec<Vec<usize>> = Vec::new();
    let mut open: Vec<(usize, usize)> = Vec::new();
    rec.calls(i, |c, callers| {
        let depth = callers.len();
        let n = calls.len();
        calls.push(*c);
        let at = open
            .iter()
            .rposition(|&(_, d)| d <= depth)
            .map_or(0, |p| p + 1);
        children.push(open.drain(at..).map(|(k, _)| k).collect());
        open.push((n, depth));
    })?;
    let mut out = Vec::with_capacity(calls.len() * 2);
    // Timestamps never go back: a call begins no earlier than its parent or the previous
    // event, and ends no earlier than its last child.
    let mut last = 0u64;
    let mut stack: Vec<(usize, usize)> = open.iter().rev().map(|&(k, _)| (k, 0)).collect();
    while let Some((k, next)) = stack.pop() {
        let c = &calls[k];
        if next == 0 {
            last = last.max(c.start_ns);
            out.push(Event {
                ts: last,
                kind: Kind::Begin(c.func, c.cut),
            });
        }
        if let Some(&child) = children[k].get(next) {
            stack.push((k, next + 1));
            stack.push((child, 0));
        } else {
            last = last.max(c.start_ns + c.dur_ns);
            out.push(Event {
                ts: last,
                kind: Kind::End,
            });
        }
    }
    Ok(out)
}

/// The instants of ring `i`: function-tracer entries (not in a function_graph recording,
/// whose entries are the slices) and kprobe events, in order.
fn instants(
    rec: &mut Recording,
    i: u32,
    graph: bool,
    events: &[ftprobe::events::ProbeDef],
    decoders: &[Option<RecordDecoder>],
    syms: &mut crate::symbols::Symbols,
) -> Result<Vec<Event>> {
    let mono = crate::session::Source::clock(&*rec);
    let mut out = Vec::new();
    let mut last = 0u64;
    rec.for_each(i, &mut |rt, aux, w| {
        let rec = Record::decode(rt, aux, w);
        let (name, cat, args) = match rec {
            Some(Record::Func { ip, parent_ip, .. }) if !graph => {
                let mut parent = Vec::new();
                syms.push_return_name(parent_ip, &mut parent);
                let parent = String::from_utf8_lossy(&parent).into_owned();
                (
                    name_of(syms, ip),
                    CAT_FUNCTION,
                    vec![DebugAnnotation {
                        name: Some("parent".into()),
                        string_value: Some(parent),
                        ..Default::default()
                    }],
                )
            }
            Some(Record::Kprobe { event, words, .. }) => {
                let id = event as usize;
                let Some(def) = events.get(id) else { return };
                let dec = decoders.get(id).and_then(Option::as_ref);
                let args = crate::output::kprobe_args(def, dec, words, syms)
                    .into_iter()
                    .map(|(n, t)| annotation(n, t))
                    .collect();
                (def.event.clone(), CAT_KPROBE, args)
            }
            _ => return,
        };
        let Some(ts) = rec.and_then(|r| r.ts()) else {
            return;
        };
        last = last.max(mono.tsc_to_mono_ns(ts));
        out.push(Event {
            ts: last,
            kind: Kind::Instant(name, cat, args),
        });
    })?;
    Ok(out)
}

/// Merge a thread's slices and instants by time (at one timestamp: a slice's begin, then the
/// instants, then its end).
fn merge(slices: Vec<Event>, instants: Vec<Event>) -> Vec<Event> {
    let mut out = Vec::with_capacity(slices.len() + instants.len());
    let mut s = slices.into_iter().peekable();
    let mut t = instants.into_iter().peekable();
    loop {
        let take_slice = match (s.peek(), t.peek()) {
            (Some(a), Some(b)) => {
                a.ts < b.ts || (a.ts == b.ts && matches!(a.kind, Kind::Begin(..)))
            }
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => break,
        };
        out.extend(if take_slice { s.next() } else { t.next() });
    }
    out
}

/// Write the recording as a Perfetto trace to `out`.
pub fn write(rec: &mut Recording, out: &mut dyn Write) -> Result<()> {
    let events = rec.events()?;
    let decoders: Vec<Option<RecordDecoder>> = events.iter().map(RecordDecoder::new).collect();
    let mut syms = rec.symbols();
    let graph = rec.info.tracer == "function_graph";
    let rings: Vec<u32> = rec.ring_ids();

    // Per ring, its events.
    let mut threads: Vec<Vec<Event>> = Vec::with_capacity(rings.len());
    for &i in &rings {
        let s = if graph { slices(rec, i)? } else { Vec::new() };
        let t = instants(rec, i, graph, &events, &decoders, &mut syms)?;
        threads.push(merge(s, t));
    }
    let first_ts = threads
        .iter()
        .filter_map(|t| t.first().map(|e| e.ts))
        .min()
        .unwrap_or(0);

    let mut buf = Vec::new();
    // The clock, and the sequence's incremental state cleared. It comes before any timestamp
    // is read: the trace's clock cannot change once one was converted (so the packet has no
    // timestamp of its own).
    let mut p = packet();
    p.first_packet_on_sequence = Some(true);
    p.sequence_flags = Some(SEQ_INCREMENTAL_STATE_CLEARED);
    p.clock_snapshot = Some(ClockSnapshot {
        clocks: vec![Clock {
            clock_id: Some(CLOCK_MONOTONIC),
            timestamp: Some(first_ts),
        }],
        primary_trace_clock: Some(CLOCK_MONOTONIC as i32),
    });
    write_packet(out, &p, &mut buf)?;

    // The tracks: each process, then each thread.
    let mut seen = std::collections::BTreeSet::new();
    for &i in &rings {
        let pid = rec.pid_of(i);
        if !seen.insert(pid) {
            continue;
        }
        let mut p = packet();
        let name = crate::dump::process_name(rec, pid);
        p.track_descriptor = Some(TrackDescriptor {
            uuid: Some(PROCESS_UUID + u64::from(pid)),
            process: Some(ProcessDescriptor {
                pid: Some(pid as i32),
                cmdline: if pid == rec.info.end.pid {
                    rec.info.command.clone()
                } else {
                    Vec::new()
                },
                process_name: Some(name),
            }),
            ..Default::default()
        });
        write_packet(out, &p, &mut buf)?;
    }
    for &i in &rings {
        let pid = rec.pid_of(i);
        let (comm, tid) = rec.thread(i);
        let mut p = packet();
        p.track_descriptor = Some(TrackDescriptor {
            uuid: Some(THREAD_UUID + u64::from(i)),
            parent_uuid: Some(PROCESS_UUID + u64::from(pid)),
            thread: Some(ThreadDescriptor {
                pid: Some(pid as i32),
                tid: Some(tid as i32),
                thread_name: Some(comm),
            }),
            ..Default::default()
        });
        write_packet(out, &p, &mut buf)?;
    }

    // The events of all threads by time, each thread's in its order.
    let mut order: Vec<(u64, usize, usize)> = threads
        .iter()
        .enumerate()
        .flat_map(|(t, evs)| evs.iter().enumerate().map(move |(k, e)| (e.ts, t, k)))
        .collect();
    order.sort_unstable();
    let mut names: FxHashMap<String, u64> = FxHashMap::default();
    let mut func_names: FxHashMap<u64, String> = FxHashMap::default();
    // The categories interned so far (bit per iid).
    let mut cats_done = 0u32;
    for (ts, t, k) in order {
        let e = &mut threads[t][k];
        let mut p = packet();
        p.timestamp = Some(ts);
        p.timestamp_clock_id = Some(CLOCK_MONOTONIC);
        p.sequence_flags = Some(SEQ_NEEDS_INCREMENTAL_STATE);
        let mut te = TrackEvent {
            track_uuid: Some(THREAD_UUID + u64::from(rings[t])),
            ..Default::default()
        };
        // The iid of an event name, interned in this packet when new; the category's too.
        let mut intern = |name: &str, cat: u64, p: &mut TracePacket| -> u64 {
            let data = p.interned_data.get_or_insert_with(InternedData::default);
            if cats_done & (1 << cat) == 0 {
                cats_done |= 1 << cat;
                data.event_categories.push(Interned {
                    iid: Some(cat),
                    name: Some(CATEGORIES[cat as usize - 1].into()),
                });
            }
            let iid = match names.get(name) {
                Some(&iid) => iid,
                None => {
                    let iid = names.len() as u64 + 1;
                    names.insert(name.to_owned(), iid);
                    data.event_names.push(Interned {
                        iid: Some(iid),
                        name: Some(name.to_owned()),
                    });
                    iid
                }
            };
            if data.event_categories.is_empty() && data.event_names.is_empty() {
                p.interned_data = None;
            }
            iid
        };
        match &mut e.kind {
            Kind::Begin(func, cut) => {
                let name = func_names
                    .entry(*func)
                    .or_insert_with(|| name_of(&mut syms, *func));
                te.name_iid = Some(intern(name, CAT_FUNCTION, &mut p));
                te.r#type = Some(TYPE_SLICE_BEGIN);
                te.category_iids = vec![CAT_FUNCTION];
                if *cut {
                    te.debug_annotations = vec![DebugAnnotation {
                        name: Some("cut".into()),
                        bool_value: Some(true),
                        ..Default::default()
                    }];
                }
            }
            Kind::End => te.r#type = Some(TYPE_SLICE_END),
            Kind::Instant(name, cat, args) => {
                te.name_iid = Some(intern(name, *cat, &mut p));
                te.r#type = Some(TYPE_INSTANT);
                te.category_iids = vec![*cat];
                te.debug_annotations = std::mem::take(args);
            }
        }
        p.track_event = Some(te);
        write_packet(out, &p, &mut buf)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes of a packet with a timestamp and a sequence id: checked by hand against the
    /// protobuf wire format (field 8 varint, field 10 varint, field 58 varint, in field order; the whole as
    /// `Trace` field 1, length-delimited).
    #[test]
    fn a_packet_is_a_length_delimited_trace_field_1() {
        let mut p = packet();
        p.timestamp = Some(300);
        p.timestamp_clock_id = Some(CLOCK_MONOTONIC);
        let mut out = Vec::new();
        write_packet(&mut out, &p, &mut Vec::new()).unwrap();
        let body = [
            0x40, 0xac, 0x02, // 8: 300
            0x50, 0x01, // 10: 1
            0xd0, 0x03, 0x03, // 58: 3
        ];
        let mut want = vec![0x0a, body.len() as u8];
        want.extend_from_slice(&body);
        assert_eq!(out, want);
    }
}
