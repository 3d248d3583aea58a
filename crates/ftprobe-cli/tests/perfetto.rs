//! `ftprobe dump --perfetto` (and the pids of `--chrome`) on recordings of programs that print
//! their own call counts, thread ids and process ids: the trace is read with Perfetto's own
//! protos (the `perfetto` Python package's `perfetto_trace_pb2`, which resolves the interned
//! names as a reader of the sequence must), and it has one slice per call on the track of the
//! thread that made it, nested as the program's call tree, and the threads of a forked child
//! in the child's process.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::ftprobe;
use common::tmp_dir;

use ftprobe_dev::{procs_tree_fixture, report_tree_fixture};

/// The module of Perfetto's trace protos in the `perfetto` Python package.
const PB2: &str = "perfetto.protos.perfetto.trace.perfetto_trace_pb2";

/// Why the Perfetto checks cannot run here, if they cannot.
fn no_perfetto_protos() -> Option<String> {
    match Command::new("python3")
        .args(["-c", &format!("import {PB2}")])
        .output()
    {
        Err(e) => Some(format!("no python3 ({e})")),
        Ok(o) if !o.status.success() => Some(format!(
            "no Python module {PB2} (pip install perfetto): {}",
            String::from_utf8_lossy(&o.stderr)
                .lines()
                .last()
                .unwrap_or("")
        )),
        Ok(_) => None,
    }
}

/// `ftprobe record -d DIR/data ARGS -- PROGRAM`: the program's output.
fn record(dir: &Path, args: &[&str], program: &Path) -> String {
    let out = common::record_to(&dir.join("data"), args, [program]);
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// `ftprobe dump -d DIR/data --FORMAT DIR/FILE`: the file.
fn dump(dir: &Path, format: &str, file: &str) -> PathBuf {
    let path = dir.join(file);
    let out = ftprobe()
        .arg("dump")
        .arg("-d")
        .arg(dir.join("data"))
        .arg(format!("--{format}"))
        .arg(&path)
        .output()
        .expect("run ftprobe dump");
    assert!(out.status.success(), "{out:?}");
    path
}

/// Python parses the trace with Perfetto's protos and prints a line per packet, interned
/// names resolved with the sequence's state as Perfetto defines it (cleared by
/// SEQ_INCREMENTAL_STATE_CLEARED; a name used before it was interned prints as `?`):
/// `C seq flags primary_clock` for a clock snapshot, `P seq uuid pid name` per process track,
/// `T seq uuid parent pid tid name` per thread track, and per track event
/// `E seq flags clock uuid type ts name cats arg=value...`.
fn perfetto_lines(path: &Path) -> String {
    let script = format!(
        r#"
import sys
from {PB2} import Trace, TracePacket
t = Trace()
t.ParseFromString(open(sys.argv[1], "rb").read())
names, cats = {{}}, {{}}
for p in t.packet:
    seq = p.trusted_packet_sequence_id
    if p.sequence_flags & TracePacket.SEQ_INCREMENTAL_STATE_CLEARED:
        names, cats = {{}}, {{}}
    for n in p.interned_data.event_names:
        names[n.iid] = n.name
    for c in p.interned_data.event_categories:
        cats[c.iid] = c.name
    if p.HasField("clock_snapshot"):
        print("C", seq, p.sequence_flags, p.clock_snapshot.primary_trace_clock)
    elif p.HasField("track_descriptor"):
        d = p.track_descriptor
        if d.HasField("process"):
            print("P", seq, d.uuid, d.process.pid, d.process.process_name)
        elif d.HasField("thread"):
            print("T", seq, d.uuid, d.parent_uuid, d.thread.pid, d.thread.tid, d.thread.thread_name)
    elif p.HasField("track_event"):
        e = p.track_event
        name = names.get(e.name_iid, "?") if e.HasField("name_iid") else "-"
        cs = ",".join(cats.get(c, "?") for c in e.category_iids) or "-"
        args = []
        for a in e.debug_annotations:
            v = getattr(a, a.WhichOneof("value"))
            args.append("%s=%s" % (a.name, v))
        print("E", seq, p.sequence_flags, p.timestamp_clock_id, e.track_uuid,
              e.Type.Name(e.type), p.timestamp, name, cs, *args)
    else:
        print("X", p)
"#
    );
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(path)
        .output()
        .expect("python3");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// A thread track: its process and thread ids and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Thread {
    pid: u32,
    tid: u32,
    name: String,
}

/// A slice rebuilt from a track's begin and end events.
#[derive(Debug, Clone)]
struct Slice {
    name: String,
    /// The name of the slice it is in (`None`: a root).
    parent: Option<String>,
    /// Its end says `cut: true` (the call did not return).
    cut: bool,
    /// Its begin and end, ns.
    begin: u64,
    end: u64,
}

/// The trace as read back: tracks, slices and instants per thread track, after checking the
/// packets' sequence, flags, clock and nesting.
#[derive(Debug, Default)]
struct Read {
    /// Process tracks: pid -> name.
    processes: BTreeMap<u32, String>,
    threads: BTreeMap<u64, Thread>,
    slices: BTreeMap<u64, Vec<Slice>>,
    /// Per track: (name, category, args) in order.
    instants: BTreeMap<u64, Vec<(String, String, Vec<String>)>>,
}

fn read(lines: &str) -> Read {
    let mut r = Read::default();
    let mut process_uuid: BTreeMap<u64, u32> = BTreeMap::new();
    // Per track: the open slices' names, the last timestamp.
    let mut open: BTreeMap<u64, Vec<(String, u64)>> = BTreeMap::new();
    let mut last: BTreeMap<u64, u64> = BTreeMap::new();
    let mut first = true;
    for l in lines.lines() {
        let t: Vec<&str> = l.split(' ').collect();
        // One sequence, its id given.
        assert_eq!(t.get(1), Some(&"1"), "sequence id: {l}");
        match t[0] {
            "C" => {
                assert!(first, "the clock snapshot comes first: {l}");
                // SEQ_INCREMENTAL_STATE_CLEARED; the trace's clock CLOCK_MONOTONIC.
                assert_eq!(t[2..], ["1", "3"], "{l}");
            }
            "P" => {
                let (uuid, pid) = (t[2].parse().unwrap(), t[3].parse().unwrap());
                process_uuid.insert(uuid, pid);
                r.processes.insert(pid, t[4..].join(" "));
            }
            "T" => {
                let uuid: u64 = t[2].parse().unwrap();
                let pid: u32 = t[4].parse().unwrap();
                assert_eq!(
                    process_uuid.get(&t[3].parse().unwrap()),
                    Some(&pid),
                    "a thread track's parent is its process's track: {l}"
                );
                let th = Thread {
                    pid,
                    tid: t[5].parse().unwrap(),
                    name: t[6..].join(" "),
                };
                assert!(r.threads.insert(uuid, th).is_none(), "{l}");
            }
            "E" => {
                // SEQ_NEEDS_INCREMENTAL_STATE, CLOCK_MONOTONIC, on a thread track.
                assert_eq!(t[2..4], ["2", "3"], "{l}");
                let uuid: u64 = t[4].parse().unwrap();
                assert!(r.threads.contains_key(&uuid), "an event on no track: {l}");
                let ts: u64 = t[6].parse().unwrap();
                let prev = last.insert(uuid, ts).unwrap_or(0);
                assert!(ts >= prev, "a track's time goes back: {l}");
                let (name, cats) = (t[7].to_owned(), t[8].to_owned());
                assert_ne!(name, "?", "a name not interned: {l}");
                let stack = open.entry(uuid).or_default();
                match t[5] {
                    "TYPE_SLICE_BEGIN" => {
                        assert_eq!(cats, "function", "{l}");
                        assert!(t.len() == 9, "begin args: {l}");
                        stack.push((name, ts));
                    }
                    "TYPE_SLICE_END" => {
                        assert_eq!(name, "-", "{l}");
                        // A cut call's end says so (its slice gets the end's args).
                        let cut = match &t[9..] {
                            [] => false,
                            ["cut=True"] => true,
                            args => panic!("end args {args:?}: {l}"),
                        };
                        let (name, begin) = stack.pop().expect("an end with no begin");
                        r.slices.entry(uuid).or_default().push(Slice {
                            name,
                            parent: stack.last().map(|(n, _)| n.clone()),
                            cut,
                            begin,
                            end: ts,
                        });
                    }
                    "TYPE_INSTANT" => {
                        let args = t[9..].iter().map(|s| s.to_string()).collect();
                        r.instants.entry(uuid).or_default().push((name, cats, args));
                    }
                    ty => panic!("type {ty}: {l}"),
                }
            }
            _ => panic!("a packet of no expected kind: {l}"),
        }
        first = false;
    }
    for (uuid, stack) in &open {
        assert!(
            stack.is_empty(),
            "track {uuid}: slices never ended: {stack:?}"
        );
    }
    r
}

/// Per thread name, per function: the slices (each checked to be in the caller the
/// program's tree gives it: `a` a root, `b` in `a`, `c` in `b`).
fn counts_by_thread(r: &Read) -> BTreeMap<String, BTreeMap<String, u64>> {
    let mut got: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    for (uuid, slices) in &r.slices {
        for s in slices {
            let want_parent = match s.name.as_str() {
                "a" => None,
                "b" => Some("a"),
                "c" => Some("b"),
                f => panic!("a slice of {f}"),
            };
            assert_eq!(s.parent.as_deref(), want_parent, "{s:?}");
            *got.entry(r.threads[uuid].name.clone())
                .or_default()
                .entry(s.name.clone())
                .or_default() += 1;
        }
    }
    got
}

/// The program's `T ... a=A b=B c=C` lines: the fields before the counts, and the counts.
fn own_lines(program: &str) -> Vec<(Vec<String>, BTreeMap<String, u64>)> {
    program
        .lines()
        .filter_map(|l| l.strip_prefix("T "))
        .map(|l| {
            let (ids, counts): (Vec<&str>, Vec<&str>) =
                l.split(' ').partition(|f| !f.contains('='));
            let counts = counts
                .iter()
                .map(|kv| {
                    let (k, v) = kv.split_once('=').unwrap();
                    (k.to_owned(), v.parse().unwrap())
                })
                .collect();
            (ids.iter().map(|s| s.to_string()).collect(), counts)
        })
        .collect()
}

#[test]
fn perfetto_trace_has_one_slice_per_call_on_its_threads_track_and_the_kprobe_instants() {
    if let Some(why) = no_perfetto_protos() {
        eprintln!("skipped: {why}");
        return;
    }
    // report_tree: main calls a 3 times, its thread "worker" once; it prints
    // `T name a=A b=B c=C` per thread, then `C x` per call of c.
    let dir = tmp_dir("threads");
    let program = record(
        &dir,
        &["-t", "function_graph", "-e", "p:pc c x=%di:u32"],
        &report_tree_fixture(),
    );
    let own: BTreeMap<String, BTreeMap<String, u64>> = own_lines(&program)
        .into_iter()
        .map(|(ids, counts)| {
            let name = if ids[0] == "main" {
                "report_tree"
            } else {
                "worker"
            };
            (name.to_owned(), counts)
        })
        .collect();
    assert_eq!(own.len(), 2, "{program}");
    let lines = perfetto_lines(&dump(&dir, "perfetto", "trace.pftrace"));
    let r = read(&lines);
    let names: BTreeSet<&str> = r.threads.values().map(|t| t.name.as_str()).collect();
    assert_eq!(names, BTreeSet::from(["report_tree", "worker"]), "{lines}");
    assert_eq!(counts_by_thread(&r), own, "{lines}");
    // One instant per call of c, with the argument the program passed, in order, all on
    // the tracks of the threads that called c.
    let mut xs = Vec::new();
    for (uuid, instants) in &r.instants {
        for (name, cat, args) in instants {
            assert_eq!((name.as_str(), cat.as_str()), ("pc", "kprobe"), "{lines}");
            let [x] = &args[..] else { panic!("{args:?}") };
            xs.push((
                r.threads[uuid].name.clone(),
                x.strip_prefix("x=").unwrap().parse::<u64>().unwrap(),
            ));
        }
    }
    let c_args: Vec<u64> = program
        .lines()
        .filter_map(|l| l.strip_prefix("C "))
        .map(|x| x.parse().unwrap())
        .collect();
    // The program's list: main's 12 calls, then the worker's 4.
    let (main, worker): (Vec<_>, Vec<_>) = xs.into_iter().partition(|(t, _)| t == "report_tree");
    let got: Vec<u64> = main.into_iter().chain(worker).map(|(_, x)| x).collect();
    assert_eq!(got, c_args, "{lines}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn perfetto_trace_puts_a_forked_childs_threads_in_the_childs_process() {
    if let Some(why) = no_perfetto_protos() {
        eprintln!("skipped: {why}");
        return;
    }
    // procs_tree: two threads in the program, two in its forked child; each prints
    // `T pid tid name a=A b=B c=C`.
    let dir = tmp_dir("fork");
    let program = record(&dir, &["-t", "function_graph"], &procs_tree_fixture());
    let own = own_lines(&program);
    assert_eq!(own.len(), 4, "{program}");
    let lines = perfetto_lines(&dump(&dir, "perfetto", "trace.pftrace"));
    let r = read(&lines);
    // The thread tracks: the program's own pids, tids and names.
    let mut got: Vec<Thread> = r.threads.values().cloned().collect();
    got.sort();
    let mut want: Vec<Thread> = own
        .iter()
        .map(|(ids, _)| Thread {
            pid: ids[0].parse().unwrap(),
            tid: ids[1].parse().unwrap(),
            name: ids[2].clone(),
        })
        .collect();
    want.sort();
    assert_eq!(got, want, "{program}\n{lines}");
    let pids: BTreeSet<u32> = want.iter().map(|t| t.pid).collect();
    assert_eq!(pids.len(), 2, "{program}");
    assert_eq!(
        r.processes.keys().copied().collect::<BTreeSet<_>>(),
        pids,
        "{lines}"
    );
    // The child's process is named after its main thread.
    let child = want.iter().find(|t| t.name == "pchild").unwrap();
    assert_eq!(r.processes[&child.pid], "pchild", "{lines}");
    // Per thread, its slices: the program's counts.
    let want: BTreeMap<String, BTreeMap<String, u64>> = own
        .into_iter()
        .map(|(ids, counts)| (ids[2].clone(), counts))
        .collect();
    assert_eq!(counts_by_thread(&r), want, "{lines}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn perfetto_trace_of_the_function_tracer_has_an_instant_per_call() {
    if let Some(why) = no_perfetto_protos() {
        eprintln!("skipped: {why}");
        return;
    }
    let dir = tmp_dir("func");
    let program = record(&dir, &[], &procs_tree_fixture());
    let lines = perfetto_lines(&dump(&dir, "perfetto", "trace.pftrace"));
    let r = read(&lines);
    assert!(r.slices.is_empty(), "{lines}");
    let mut got: BTreeMap<u32, BTreeMap<String, u64>> = BTreeMap::new();
    for (uuid, instants) in &r.instants {
        for (name, cat, args) in instants {
            assert_eq!(cat, "function", "{lines}");
            // The caller: b's is a; c's is b, or a for the c that b tail-calls (its return
            // address is b's).
            let parent = args[0].strip_prefix("parent=").unwrap();
            match name.as_str() {
                "b" => assert_eq!(parent, "a", "{lines}"),
                "c" => assert!(parent == "b" || parent == "a", "{lines}"),
                _ => {}
            }
            *got.entry(r.threads[uuid].tid)
                .or_default()
                .entry(name.clone())
                .or_default() += 1;
        }
    }
    let want: BTreeMap<u32, BTreeMap<String, u64>> = own_lines(&program)
        .into_iter()
        .map(|(ids, counts)| (ids[1].parse().unwrap(), counts))
        .collect();
    assert_eq!(got, want, "{program}\n{lines}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn perfetto_trace_ends_the_calls_that_never_returned_and_marks_them_cut() {
    if let Some(why) = no_perfetto_protos() {
        eprintln!("skipped: {why}");
        return;
    }
    // fgraph_deep 5: the parent calls exit(3) inside `finisher`, its forked child exit(0)
    // inside `child_exit`; it prints every traced entry as `E depth name`.
    let dir = tmp_dir("cut");
    let out = ftprobe()
        .arg("record")
        .arg("-d")
        .arg(dir.join("data"))
        .args(["-t", "function_graph", "--"])
        .arg(ftprobe_dev::fgraph_deep_fixture())
        .arg("5")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let program = String::from_utf8(out.stdout).unwrap();
    let mut own: BTreeMap<String, u64> = BTreeMap::new();
    for l in program.lines().filter_map(|l| l.strip_prefix("E ")) {
        *own.entry(l.split(' ').nth(1).unwrap().into()).or_default() += 1;
    }
    assert!(own.contains_key("child_exit"), "{program}");
    let lines = perfetto_lines(&dump(&dir, "perfetto", "trace.pftrace"));
    let r = read(&lines);
    let mut got: BTreeMap<String, u64> = BTreeMap::new();
    // The cut calls: (name, pid).
    let mut cut = Vec::new();
    for (uuid, slices) in &r.slices {
        for s in slices {
            *got.entry(s.name.clone()).or_default() += 1;
            if s.cut {
                cut.push((s.name.as_str(), r.threads[uuid].pid));
            }
        }
    }
    assert_eq!(got, own, "{lines}");
    cut.sort();
    let names: Vec<&str> = cut.iter().map(|c| c.0).collect();
    assert_eq!(names, ["child_exit", "finisher"], "{lines}");
    // The child's in its own process.
    assert_ne!(cut[0].1, cut[1].1, "{lines}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn chrome_json_gives_a_forked_childs_threads_the_childs_pid() {
    if Command::new("python3").arg("-V").output().is_err() {
        eprintln!("skipped: no python3");
        return;
    }
    let dir = tmp_dir("chrome");
    let program = record(&dir, &["-t", "function_graph"], &procs_tree_fixture());
    let json = dump(&dir, "chrome", "trace.json");
    // Python prints `X pid tid name` per complete event, `M pid tid name` per thread name,
    // `N pid name` per process name.
    let script = r#"
import json, sys
for e in json.load(open(sys.argv[1]))["traceEvents"]:
    if e["ph"] == "X":
        print("X", e["pid"], e["tid"], e["name"])
    elif e["ph"] == "M" and e["name"] == "thread_name":
        print("M", e["pid"], e["tid"], e["args"]["name"])
    elif e["ph"] == "M" and e["name"] == "process_name":
        print("N", e["pid"], e["args"]["name"])
"#;
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(&json)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let summary = String::from_utf8(out.stdout).unwrap();
    let own = own_lines(&program);
    // The threads: (pid, tid, name) as the program printed them.
    let want: BTreeSet<String> = own.iter().map(|(ids, _)| ids.join(" ")).collect();
    let got: BTreeSet<String> = summary
        .lines()
        .filter_map(|l| l.strip_prefix("M "))
        .map(str::to_owned)
        .collect();
    assert_eq!(got, want, "{summary}");
    // Each call under its thread's own pid: per "pid tid", per function, the program's counts.
    let want: BTreeMap<String, BTreeMap<String, u64>> = own
        .iter()
        .map(|(ids, counts)| (ids[..2].join(" "), counts.clone()))
        .collect();
    let mut got: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    for l in summary.lines().filter_map(|l| l.strip_prefix("X ")) {
        let t: Vec<&str> = l.split(' ').collect();
        *got.entry(t[..2].join(" "))
            .or_default()
            .entry(t[2].to_owned())
            .or_default() += 1;
    }
    assert_eq!(got, want, "{summary}");
    // A process name per process.
    let named: BTreeSet<&str> = summary
        .lines()
        .filter_map(|l| l.strip_prefix("N "))
        .map(|l| l.split(' ').next().unwrap())
        .collect();
    let pids: BTreeSet<&str> = own.iter().map(|(ids, _)| ids[0].as_str()).collect();
    assert_eq!(named, pids, "{summary}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn perfetto_trace_of_a_time_range_begins_a_call_whose_entry_is_outside_it_at_its_entry() {
    if let Some(why) = no_perfetto_protos() {
        eprintln!("skipped: {why}");
        return;
    }
    // report_tree's first record is a call's entry; `--time-range 1ns~` leaves it out and
    // keeps its return, which holds the entry's time. The export streams the records in time
    // order, so that call's begin is found by a first pass: every call is still a slice, in
    // its place in the tree, at the times Chrome's complete events (built another way: from
    // each return, after the fact) give it.
    let dir = tmp_dir("range");
    let program = record(&dir, &["-t", "function_graph"], &report_tree_fixture());
    let (pf, json) = (dir.join("t.pftrace"), dir.join("t.json"));
    let out = ftprobe()
        .arg("dump")
        .arg("-d")
        .arg(dir.join("data"))
        .args(["--time-range", "1ns~", "--perfetto"])
        .arg(&pf)
        .arg("--chrome")
        .arg(&json)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let lines = perfetto_lines(&pf);
    let r = read(&lines);
    let own: BTreeMap<String, BTreeMap<String, u64>> = own_lines(&program)
        .into_iter()
        .map(|(ids, counts)| {
            let name = if ids[0] == "main" {
                "report_tree"
            } else {
                "worker"
            };
            (name.to_owned(), counts)
        })
        .collect();
    assert_eq!(counts_by_thread(&r), own, "{lines}");
    // (thread, name, begin, end) of every slice, and of every complete event.
    let mut got: Vec<(String, String, u64, u64)> = Vec::new();
    for (uuid, slices) in &r.slices {
        for s in slices {
            got.push((r.threads[uuid].name.clone(), s.name.clone(), s.begin, s.end));
        }
    }
    got.sort();
    let script = r#"
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
names = {e["tid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
for e in ev:
    if e["ph"] == "X":
        b = round(e["ts"] * 1000)
        print(names[e["tid"]], e["name"], b, b + round(e["dur"] * 1000))
"#;
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(&json)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let mut want: Vec<(String, String, u64, u64)> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let t: Vec<&str> = l.split(' ').collect();
            (
                t[0].into(),
                t[1].into(),
                t[2].parse().unwrap(),
                t[3].parse().unwrap(),
            )
        })
        .collect();
    want.sort();
    assert_eq!(got.len(), want.len(), "{lines}");
    // Chrome's microseconds are floats: within a nanosecond.
    for (g, w) in got.iter().zip(&want) {
        assert_eq!((&g.0, &g.1), (&w.0, &w.1), "{g:?} {w:?}");
        assert!(
            g.2.abs_diff(w.2) <= 1 && g.3.abs_diff(w.3) <= 1,
            "{g:?} {w:?}"
        );
    }
    // The call whose entry was left out begins before every other record of the range.
    let first = got.iter().map(|g| g.2).min().unwrap();
    let outside = got.iter().filter(|g| g.2 == first).count();
    assert_eq!(outside, 1, "{got:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
