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
//!   ended at its cut, and its end has the debug annotation `cut: true`, which the slice
//!   gets; a call whose return is in the recording but not its entry begins at its entry's
//!   time, from the return's record);
//! - a gap in a thread's records (its ring was full: `[LOST N EVENTS]`), a `TYPE_INSTANT`
//!   `LOST N EVENTS` (category `lost`, annotation `lost: N`) on its track; the calls that
//!   returned in the gap (open at the depth of the thread's next graph record or deeper) end
//!   at the gap's mark with the annotations `cut: true` and `lost_return: true`;
//! - per function-tracer entry and per kprobe event, a `TYPE_INSTANT` on its thread's track
//!   (categories `function` and `kprobe`); a kprobe event's fetch args are its debug
//!   annotations (a number as an int or uint, the rest as `trace` prints it), a function
//!   entry's caller is its `parent` annotation;
//! - event names and categories are interned (`InternedData` in the packet that first uses
//!   one, `SEQ_NEEDS_INCREMENTAL_STATE` on the packets that refer to them).
//!
//! Packets are written in timestamp order (a thread's own events in its order), as they are
//! read: the rings are merged as `replay` merges them, so memory does not grow with the
//! recording.
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

use ftprobe::ftrace::fgraph::FgraphExit;
use ftprobe::record::rtype;

use crate::merge::Merge;
use crate::recording::Recording;
use crate::session::Source;
use crate::symbols::name_of;

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
const CAT_LOST: u64 = 3;
const CATEGORIES: [&str; 3] = ["function", "kprobe", "lost"];

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

/// What an event is.
enum Kind {
    /// A call begins: its function.
    Begin(u64),
    /// The innermost open call of the thread ends; `cut`: it did not return; `lost_return`:
    /// its return was in a gap (its end is the gap's mark).
    End { cut: bool, lost_return: bool },
    /// An instant: its name, category iid, annotations.
    Instant(String, u64, Vec<DebugAnnotation>),
}

/// What a first pass over ring `i` finds out about its calls that the records' order does not
/// tell (both bounded by the call depth at a break in the stream or a thread's start, not by
/// the recording's size).
#[derive(Default)]
struct Thread {
    /// Calls whose return is in the recording but not their entry (it came before
    /// `--time-range`, or was lost): `(calltime, func)` in TSC, outer calls first. The
    /// merge puts an entry for each in the ring's stream, before their children's.
    missing: std::collections::VecDeque<(u64, u64)>,
    /// Entries whose call began later than their record says: `(entry's ts, calltime)`, in
    /// order. A thread's first call claims its ring before its duration starts (the return
    /// holds the later calltime, which `replay` and `report` use).
    moved: std::collections::VecDeque<(u64, u64)>,
    /// The calls open on the thread (their functions) while the merge writes.
    open: Vec<u64>,
    /// The last timestamp written (CLOCK_MONOTONIC ns: a track's time never goes back).
    last_ns: u64,
    /// A gap (LOST record) since the thread's last graph record: its time.
    gap_ns: Option<u64>,
}

fn first_pass(rec: &mut Recording, i: u32) -> Result<Thread> {
    // The open entries: (func, ts).
    let mut stack: Vec<(u64, u64)> = Vec::new();
    let mut missing = Vec::new();
    let mut moved = Vec::new();
    rec.for_each(i, &mut |rt, aux, w| match Record::decode(rt, aux, w) {
        Some(Record::GraphEntry { ts, func, .. }) => stack.push((func, ts)),
        Some(Record::GraphReturn { func, calltime, .. }) => {
            match stack.iter().rposition(|&(f, _)| f == func) {
                Some(p) => {
                    if stack[p].1 != calltime {
                        moved.push((stack[p].1, calltime));
                    }
                    stack.truncate(p);
                }
                None => missing.push((calltime, func)),
            }
        }
        _ => {}
    })?;
    missing.sort_unstable();
    moved.sort_unstable();
    Ok(Thread {
        missing: missing.into(),
        moved: moved.into(),
        ..Thread::default()
    })
}

/// The packets of the events, with the interning state of the sequence.
struct Events<'a> {
    out: &'a mut dyn Write,
    buf: Vec<u8>,
    /// Event names interned so far, and their iids.
    names: FxHashMap<String, u64>,
    /// Function names by address (symbolized once).
    /// By (symbols view, address): a process that exec'd names one address two ways.
    func_names: FxHashMap<(usize, u64), String>,
    /// The categories interned so far (bit per iid).
    cats_done: u32,
}

impl Events<'_> {
    /// The iid of an event name, interned in `p` when new; its category's too.
    fn intern(&mut self, name: &str, cat: u64, p: &mut TracePacket) -> u64 {
        let data = p.interned_data.get_or_insert_with(InternedData::default);
        if self.cats_done & (1 << cat) == 0 {
            self.cats_done |= 1 << cat;
            data.event_categories.push(Interned {
                iid: Some(cat),
                name: Some(CATEGORIES[cat as usize - 1].into()),
            });
        }
        let iid = match self.names.get(name) {
            Some(&iid) => iid,
            None => {
                let iid = self.names.len() as u64 + 1;
                self.names.insert(name.to_owned(), iid);
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
    }

    /// End `n` calls of ring `ring` at `ts`, cut (they never returned in the recording).
    fn end_cut(
        &mut self,
        syms: &mut crate::symbols::Symbols,
        ts: u64,
        ring: u32,
        n: usize,
    ) -> Result<()> {
        for _ in 0..n {
            let kind = Kind::End {
                cut: true,
                lost_return: false,
            };
            self.write(syms, ts, ring, kind)?;
        }
        Ok(())
    }

    /// Write one event of ring `ring` at `ts` (CLOCK_MONOTONIC ns).
    fn write(
        &mut self,
        syms: &mut crate::symbols::Symbols,
        ts: u64,
        ring: u32,
        kind: Kind,
    ) -> Result<()> {
        let mut p = packet();
        p.timestamp = Some(ts);
        p.timestamp_clock_id = Some(CLOCK_MONOTONIC);
        p.sequence_flags = Some(SEQ_NEEDS_INCREMENTAL_STATE);
        let mut te = TrackEvent {
            track_uuid: Some(THREAD_UUID + u64::from(ring)),
            ..Default::default()
        };
        match kind {
            Kind::Begin(func) => {
                let key = (syms.view(), func);
                let name = match self.func_names.get(&key) {
                    Some(n) => n.clone(),
                    None => {
                        let n = name_of(syms, func);
                        self.func_names.insert(key, n.clone());
                        n
                    }
                };
                te.name_iid = Some(self.intern(&name, CAT_FUNCTION, &mut p));
                te.r#type = Some(TYPE_SLICE_BEGIN);
                te.category_iids = vec![CAT_FUNCTION];
            }
            Kind::End { cut, lost_return } => {
                te.r#type = Some(TYPE_SLICE_END);
                if cut {
                    te.debug_annotations = vec![DebugAnnotation {
                        name: Some("cut".into()),
                        bool_value: Some(true),
                        ..Default::default()
                    }];
                }
                if lost_return {
                    te.debug_annotations.push(DebugAnnotation {
                        name: Some("lost_return".into()),
                        bool_value: Some(true),
                        ..Default::default()
                    });
                }
            }
            Kind::Instant(name, cat, args) => {
                te.name_iid = Some(self.intern(&name, cat, &mut p));
                te.r#type = Some(TYPE_INSTANT);
                te.category_iids = vec![cat];
                te.debug_annotations = args;
            }
        }
        p.track_event = Some(te);
        write_packet(self.out, &p, &mut self.buf)
    }
}

/// Fill ring `i`'s queue with its next chunk of records (none left: the queue is done), its
/// missing entries put before the first record at or after their time, its moved entries at
/// their call's time.
fn fill(rec: &mut Recording, m: &mut Merge, t: &mut Thread, i: u32) {
    let q = m.queue(i);
    while q.is_empty() && !q.done {
        let missing = &mut t.missing;
        let moved = &mut t.moved;
        rec.drain(i, |rt, aux, w| {
            let ent;
            let w = match moved.front() {
                Some(&(ts, calltime)) if rt == rtype::FGRAPH_ENT && w.len() >= 2 && w[0] == ts => {
                    moved.pop_front();
                    ent = [calltime, w[1]];
                    &ent[..]
                }
                _ => w,
            };
            if let Some(ts) = ftprobe::record::timestamp(rt, w) {
                while let Some(&(calltime, func)) = missing.front().filter(|e| e.0 <= ts) {
                    missing.pop_front();
                    q.push(rtype::FGRAPH_ENT, 0, &[calltime, func]);
                }
            }
            q.push(rt, aux, w);
        });
        q.done = rec.done(i);
    }
    m.held += m.queues[&i].len();
    m.reinsert(i);
}

/// Write the recording as a Perfetto trace to `out`.
///
/// The rings are merged by timestamp as `replay` merges them ([`crate::merge`]), and each
/// record becomes its packet as it comes: memory is O(rings x chunk + call depth), whatever
/// the recording's size.
pub fn write(rec: &mut Recording, out: &mut dyn Write) -> Result<()> {
    let events = rec.events()?;
    let decoders: Vec<Option<RecordDecoder>> = events.iter().map(RecordDecoder::new).collect();
    let mut syms = rec.symbols();
    let graph = rec.info.tracer == "function_graph";
    let rings: Vec<u32> = rec.ring_ids();
    let mono = crate::session::Source::clock(&*rec);

    // Per ring, what a first pass finds out (function_graph).
    let mut threads: FxHashMap<u32, Thread> = FxHashMap::default();
    let mut first_ns = rec.start_ns;
    for &i in &rings {
        let t = if graph {
            first_pass(rec, i)?
        } else {
            Thread::default()
        };
        if let Some(&(calltime, _)) = t.missing.front() {
            first_ns = first_ns.min(mono.tsc_to_mono_ns(calltime));
        }
        threads.insert(i, t);
    }

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
            timestamp: Some(first_ns),
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
        let name = super::process_name(rec, pid);
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
    let mut w = Events {
        out,
        buf,
        names: FxHashMap::default(),
        func_names: FxHashMap::default(),
        cats_done: 0,
    };
    rec.rewind();
    let mut m = Merge::default();
    for &i in &rings {
        fill(
            rec,
            &mut m,
            threads.get_mut(&i).expect("a thread per ring"),
            i,
        );
    }
    let mut events_out: Vec<(u64, Kind)> = Vec::new();
    // Rings whose open calls end at the time range's end: (ring, calls).
    let mut at_range_end: Vec<(u32, usize)> = Vec::new();
    loop {
        // Rings done and emptied: their calls still open end at their last event, cut (or
        // at the time range's end if the thread went on past it: after every other event).
        for i in m.retire() {
            if let Some(t) = threads.remove(&i) {
                // A gap with no graph record after it: the calls still open may have
                // returned in it.
                if let Some(g) = t.gap_ns {
                    for _ in 0..t.open.len() {
                        let lost = Kind::End {
                            cut: true,
                            lost_return: true,
                        };
                        w.write(&mut syms, g, i, lost)?;
                    }
                    continue;
                }
                let end = rec.end_ns(i, t.last_ns);
                if end > t.last_ns {
                    at_range_end.push((i, t.open.len()));
                    continue;
                }
                rec.select_stream(&mut syms, i);
                w.end_cut(&mut syms, end, i, t.open.len())?;
            }
        }
        let Some(r) = m.take() else { break };
        rec.select_stream(&mut syms, r);
        let t = threads.get_mut(&r).expect("a thread per ring");
        let h = m.queues[&r]
            .head()
            .expect("a ring in the heap holds a record");
        let at = |t: &mut Thread, ts: u64| {
            t.last_ns = t.last_ns.max(mono.tsc_to_mono_ns(ts));
            t.last_ns
        };
        // After a gap: the calls open at the next graph record's depth or deeper (deeper
        // than a return's) returned in it; they end at its mark.
        let gone_from = match Record::decode(h.rtype, h.aux, h.words) {
            Some(Record::GraphEntry { depth, .. }) if graph => Some(depth as usize),
            Some(Record::GraphReturn { depth, .. }) if graph => Some(depth as usize + 1),
            _ => None,
        };
        if let (Some(from), Some(g)) = (gone_from, t.gap_ns) {
            t.gap_ns = None;
            while t.open.len() > from {
                t.open.pop();
                events_out.push((
                    g,
                    Kind::End {
                        cut: true,
                        lost_return: true,
                    },
                ));
            }
        }
        match Record::decode(h.rtype, h.aux, h.words) {
            Some(Record::Lost { ts, count, .. }) if count > 0 => {
                let ns = at(t, ts);
                if graph {
                    t.gap_ns = Some(ns);
                }
                let args = vec![DebugAnnotation {
                    name: Some("lost".into()),
                    uint_value: Some(count),
                    ..Default::default()
                }];
                events_out.push((
                    ns,
                    Kind::Instant(format!("LOST {count} EVENTS"), CAT_LOST, args),
                ));
            }
            Some(Record::GraphEntry { ts, func, .. }) if graph => {
                t.open.push(func);
                events_out.push((at(t, ts), Kind::Begin(func)));
            }
            Some(Record::GraphReturn { ts, func, exit, .. }) if graph => {
                // Its entry is open (the first pass put the missing ones in the stream);
                // calls above it never returned (cut at this return).
                if let Some(p) = t.open.iter().rposition(|&f| f == func) {
                    let ns = at(t, ts);
                    for _ in p + 1..t.open.len() {
                        events_out.push((
                            ns,
                            Kind::End {
                                cut: true,
                                lost_return: false,
                            },
                        ));
                    }
                    t.open.truncate(p);
                    events_out.push((
                        ns,
                        Kind::End {
                            cut: exit != FgraphExit::Returned,
                            lost_return: false,
                        },
                    ));
                }
            }
            Some(Record::Func {
                ts, ip, parent_ip, ..
            }) if !graph => {
                let mut parent = Vec::new();
                syms.push_return_name(parent_ip, &mut parent);
                let parent = String::from_utf8_lossy(&parent).into_owned();
                let args = vec![DebugAnnotation {
                    name: Some("parent".into()),
                    string_value: Some(parent),
                    ..Default::default()
                }];
                let name = name_of(&mut syms, ip);
                events_out.push((at(t, ts), Kind::Instant(name, CAT_FUNCTION, args)));
            }
            Some(Record::Kprobe {
                ts, event, words, ..
            }) => {
                let id = event as usize;
                if let Some(def) = events.get(id) {
                    let dec = decoders.get(id).and_then(Option::as_ref);
                    let args = crate::output::kprobe_args(def, dec, words, &mut syms)
                        .into_iter()
                        .map(|(n, t)| annotation(n, t))
                        .collect();
                    let name = def.event.clone();
                    events_out.push((at(t, ts), Kind::Instant(name, CAT_KPROBE, args)));
                }
            }
            _ => {}
        }
        for (ts, kind) in events_out.drain(..) {
            w.write(&mut syms, ts, r, kind)?;
        }
        m.pop_record(r);
        if m.queues[&r].is_empty() {
            fill(
                rec,
                &mut m,
                threads.get_mut(&r).expect("a thread per ring"),
                r,
            );
        } else {
            m.reinsert(r);
        }
    }
    for (i, open) in at_range_end {
        let end = rec.end_ns(i, 0);
        rec.select_stream(&mut syms, i);
        w.end_cut(&mut syms, end, i, open)?;
    }
    if let Some(e) = rec.take_error() {
        return Err(e);
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
