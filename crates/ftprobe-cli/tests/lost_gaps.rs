//! Lost events are marked where they happened: a ring that was full drops events, and the
//! first record that fits after them is preceded by a LOST record, which `trace` and
//! `replay` print as `COMM-TID [LOST N EVENTS]` in the thread's place, the function_graph
//! layout closes the calls whose return was lost without a duration, `report` leaves those
//! calls out of its times and says so, and `dump --chrome` marks them and the gap.
//!
//! The fixture, `gaps`, makes the gap at a known place without depending on when the CLI
//! reads: it stops the CLI (SIGSTOP) while it calls `gap_burst(1000)` (1000 `gap_leaf`
//! calls: a 4 KiB ring fills and drops the rest), resumes it, waits until it read the ring,
//! then calls `gap_after` 10 times. The truth: its own call count, and the CLI's own
//! end-of-trace totals (`# tid T: N events lost (ring full)`, `info.json`).

use std::path::Path;

mod common;
use common::{ftprobe, tmp_dir};

use ftprobe_dev::gaps_fixture;

const BURST: u64 = 1000;
const AFTER: u64 = 10;
/// A ring of 4 KiB: 128 function-tracer records.
const SMALL: &[&str] = &["--buffer-size-kb", "4", "-F", "gap_*"];

/// The fixture's `calls=C`.
fn own_calls(stdout: &[u8]) -> u64 {
    String::from_utf8_lossy(stdout)
        .lines()
        .find_map(|l| l.strip_prefix("calls="))
        .expect("calls=")
        .parse()
        .unwrap()
}

/// The `COMM-TID [LOST N EVENTS]` lines of a trace: (comm, tid, N).
fn lost_lines(text: &str) -> Vec<(String, u32, u64)> {
    text.lines()
        .filter_map(|l| {
            let (task, rest) = l.split_once(" [LOST ")?;
            let n = rest.strip_suffix(" EVENTS]")?.parse().ok()?;
            let (comm, tid) = task.rsplit_once('-')?;
            Some((comm.to_owned(), tid.parse().ok()?, n))
        })
        .collect()
}

/// The trailer's `# tid T: N events lost (ring full)` lines: (T, N).
fn ring_full_totals(text: &str) -> Vec<(u32, u64)> {
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("# tid ")?;
            let (tid, rest) = rest.split_once(": ")?;
            let n = rest.strip_suffix(" events lost (ring full)")?;
            Some((tid.parse().ok()?, n.parse().ok()?))
        })
        .collect()
}

/// `gaps BURST AFTER`.
fn gaps_cmd() -> [String; 3] {
    [
        gaps_fixture().display().to_string(),
        BURST.to_string(),
        AFTER.to_string(),
    ]
}

/// `ftprobe trace ARGS -- gaps BURST AFTER`: (the CLI's output, the trace).
fn trace_gaps(args: &[&str]) -> (std::process::Output, String) {
    let cmd = gaps_cmd();
    let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
    common::trace(args, &cmd)
}

/// The function tracer: one LOST line, in the thread's place (after its last `gap_leaf`
/// before the gap, before its first `gap_after`), with N equal to the thread's total lost;
/// every call is either printed or counted in N.
#[test]
fn the_function_trace_marks_the_gap_where_it_happened() {
    let (out, text) = trace_gaps(SMALL);
    assert!(out.status.success(), "{out:?}\n{text}");
    let calls = own_calls(&out.stdout);
    assert_eq!(calls, 1 + BURST + AFTER);
    let lost = lost_lines(&text);
    assert_eq!(lost.len(), 1, "one gap: {lost:?}\n{text}");
    let (comm, tid, n) = lost[0].clone();
    assert_eq!(comm, "gaps");
    assert_eq!(ring_full_totals(&text), vec![(tid, n)], "{text}");
    // 128 records fit in the ring: the burst's entry and 127 of its leaves.
    assert!(n > 0 && n < BURST, "{n}");
    let events: Vec<&str> = common::events(&text).collect();
    let printed = events.iter().filter(|l| !l.contains("[LOST ")).count() as u64;
    assert_eq!(
        printed + n,
        calls,
        "printed {printed} + lost {n} != {calls}\n{text}"
    );
    let at = events.iter().position(|l| l.contains("[LOST ")).unwrap();
    assert!(
        events[..at].iter().all(|l| !l.contains("gap_after")),
        "{text}"
    );
    assert!(
        events[at - 1].contains("gap_leaf <-gap_burst"),
        "{}",
        events[at - 1]
    );
    assert!(
        events[at + 1..].iter().all(|l| l.contains("gap_after")),
        "after the gap only gap_after: {text}"
    );
    assert_eq!(events.len() - at - 1, AFTER as usize);
}

/// The function_graph layout: the calls whose return fell in the gap (the leaf being
/// entered, and `gap_burst`) are closed after the LOST line, before the next call, and
/// no duration is printed for them.
#[test]
fn function_graph_closes_the_calls_whose_return_was_lost_without_a_duration() {
    let mut args = SMALL.to_vec();
    args.extend(["-t", "function_graph"]);
    let (out, text) = trace_gaps(&args);
    assert!(out.status.success(), "{out:?}\n{text}");
    let lost = lost_lines(&text);
    assert_eq!(lost.len(), 1, "{lost:?}\n{text}");
    let (_, tid, n) = lost[0];
    assert_eq!(ring_full_totals(&text), vec![(tid, n)], "{text}");
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .collect();
    let at = lines.iter().position(|l| l.contains("[LOST ")).unwrap();
    // Before the gap: the burst's entry, whole leaf calls, and the leaf it was in.
    assert_eq!(
        lines[..at]
            .iter()
            .filter(|l| l.ends_with("gap_burst() {"))
            .count(),
        1,
        "{text}"
    );
    assert_eq!(
        lines[..at]
            .iter()
            .filter(|l| l.ends_with("gap_leaf() {"))
            .count(),
        1,
        "the leaf whose return was dropped: {text}"
    );
    assert!(lines[at - 1].ends_with("gap_leaf() {"), "{}", lines[at - 1]);
    // After it: the two closed, deepest first, with no duration; then the after calls.
    assert!(
        lines[at + 1].ends_with("} /* gap_leaf: return lost */"),
        "{}",
        lines[at + 1]
    );
    assert!(
        lines[at + 2].ends_with("} /* gap_burst: return lost */"),
        "{}",
        lines[at + 2]
    );
    for l in &lines[at + 1..at + 3] {
        assert!(!l.contains(" us "), "a made-up duration: {l}");
    }
    assert_eq!(
        text.matches("return lost").count(),
        2,
        "nothing else closed: {text}"
    );
    let after: Vec<&&str> = lines[at + 3..].iter().collect();
    assert_eq!(after.len(), AFTER as usize, "{text}");
    assert!(after
        .iter()
        .all(|l| l.ends_with("gap_after();") && l.contains(" us ")));
    // No line closes gap_burst with a duration anywhere.
    assert!(!lines
        .iter()
        .any(|l| l.contains(" us ") && l.contains("} /* gap_burst")));
}

/// `ftprobe SUB -d DIR ARGS`: its standard output.
fn run(sub: &str, dir: &Path, args: &[&str]) -> String {
    let out = ftprobe()
        .arg(sub)
        .arg("-d")
        .arg(dir)
        .args(args)
        .output()
        .expect("run ftprobe");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// A recording of the same program (the gap is at the same place, the same size): replay
/// prints the LOST line live `trace` printed, with the recording's own total; report leaves
/// the two calls whose return was lost out of its times and notes them; the Chrome JSON
/// marks them `lost_return` and has the gap as an instant; the flame graph has no time for
/// them.
#[test]
fn a_recording_replays_reports_and_dumps_the_gap() {
    let mut args = SMALL.to_vec();
    args.extend(["-t", "function_graph"]);
    let (out, live) = trace_gaps(&args);
    assert!(out.status.success(), "{out:?}");
    let live_lost = lost_lines(&live);

    let dir = tmp_dir("gaps");
    let data = dir.join("data");
    let out = common::record_to(&data, &args, gaps_cmd());
    assert!(out.status.success(), "{out:?}");
    let info: serde_json::Value =
        serde_json::from_slice(&std::fs::read(data.join("info.json")).unwrap()).unwrap();
    let ring = info["rings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["comm"] == "gaps")
        .expect("the thread's ring");
    let (tid, total) = (
        ring["tid"].as_u64().unwrap() as u32,
        ring["lost"].as_u64().unwrap(),
    );

    // replay: the same line as live (same gap), N the recording's total.
    let replay = run("replay", &data, &[]);
    let lost = lost_lines(&replay);
    assert_eq!(lost, vec![("gaps".to_owned(), tid, total)], "{replay}");
    assert_eq!(
        live_lost.iter().map(|l| l.2).collect::<Vec<_>>(),
        vec![total],
        "live and replayed runs lose the same events"
    );
    assert_eq!(replay.matches("return lost").count(), 2, "{replay}");
    let whole_leaves = replay
        .lines()
        .filter(|l| l.ends_with("gap_leaf();"))
        .count() as u64;

    // report: gap_leaf's whole calls only; gap_burst (its one call lost its return) has
    // no line; both noted.
    let report = run("report", &data, &[]);
    assert!(
        report.contains("# gap_leaf: 1 calls whose return was lost in a gap"),
        "{report}"
    );
    assert!(
        report.contains("# gap_burst: 1 calls whose return was lost in a gap"),
        "{report}"
    );
    let row = |f: &str| {
        report
            .lines()
            .find(|l| !l.starts_with('#') && l.ends_with(&format!("  {f}")))
            .map(str::to_owned)
    };
    assert_eq!(row("gap_burst"), None, "{report}");
    let leaf = row("gap_leaf").expect("gap_leaf's row");
    // Columns: total (2), self (2), calls, ...
    let cols: Vec<&str> = leaf.split_whitespace().collect();
    assert_eq!(cols[4].parse::<u64>().unwrap(), whole_leaves, "{leaf}");
    assert!(row("gap_after").is_some_and(|r| r.split_whitespace().nth(4) == Some("10")));

    // dump --chrome: the two calls marked, the gap an instant of the thread.
    let json = dir.join("trace.json");
    run("dump", &data, &["--chrome", json.to_str().unwrap()]);
    let chrome: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let events = chrome["traceEvents"].as_array().unwrap();
    let lost_returns: Vec<&str> = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["args"]["lost_return"] == true)
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(lost_returns, vec!["gap_leaf", "gap_burst"]);
    let x_leaves = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["name"] == "gap_leaf")
        .count() as u64;
    assert_eq!(x_leaves, whole_leaves + 1);
    let instants: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["ph"] == "i" && e["cat"] == "lost")
        .collect();
    assert_eq!(instants.len(), 1, "{instants:?}");
    assert_eq!(instants[0]["name"], format!("LOST {total} EVENTS"));
    assert_eq!(instants[0]["tid"], tid);
    assert_eq!(instants[0]["args"]["lost"], total);

    // The flame graph: no time for a call whose return was lost.
    let folded = dir.join("folded.txt");
    run("dump", &data, &["--flame-graph", folded.to_str().unwrap()]);
    let folded = std::fs::read_to_string(&folded).unwrap();
    assert!(
        !folded.lines().any(|l| l.starts_with("gap_burst ")),
        "{folded}"
    );
    assert!(folded.lines().any(|l| l.starts_with("gap_burst;gap_leaf ")));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `dump --perfetto` of the recording, read with Perfetto's own protos (the `perfetto`
/// Python package; skipped without it): the gap is an instant `LOST N EVENTS` on the
/// thread's track, and the two calls whose return was lost end with `lost_return`.
#[test]
fn perfetto_has_the_gap_on_the_threads_track() {
    const PB2: &str = "perfetto.protos.perfetto.trace.perfetto_trace_pb2";
    let ok = std::process::Command::new("python3")
        .args(["-c", &format!("import {PB2}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("skipped: no Python module {PB2} (pip install perfetto)");
        return;
    }
    let mut args = SMALL.to_vec();
    args.extend(["-t", "function_graph"]);
    let dir = tmp_dir("gaps-perfetto");
    let data = dir.join("data");
    let out = common::record_to(&data, &args, gaps_cmd());
    assert!(out.status.success(), "{out:?}");
    let info: serde_json::Value =
        serde_json::from_slice(&std::fs::read(data.join("info.json")).unwrap()).unwrap();
    let ring = &info["rings"].as_array().unwrap()[0];
    let (tid, total) = (
        ring["tid"].as_u64().unwrap(),
        ring["lost"].as_u64().unwrap(),
    );
    let file = dir.join("trace.pftrace");
    run("dump", &data, &["--perfetto", file.to_str().unwrap()]);
    // Per thread track its tid; per event: track, type, name (interned), annotations.
    let script = format!(
        r#"
import sys
from {PB2} import Trace, TracePacket
t = Trace()
t.ParseFromString(open(sys.argv[1], "rb").read())
names = {{}}
for p in t.packet:
    if p.sequence_flags & TracePacket.SEQ_INCREMENTAL_STATE_CLEARED:
        names = {{}}
    for n in p.interned_data.event_names:
        names[n.iid] = n.name
    if p.HasField("track_descriptor") and p.track_descriptor.HasField("thread"):
        print("T", p.track_descriptor.uuid, p.track_descriptor.thread.tid)
    elif p.HasField("track_event"):
        e = p.track_event
        name = names.get(e.name_iid, "?") if e.HasField("name_iid") else "-"
        args = ["%s=%s" % (a.name, getattr(a, a.WhichOneof("value"))) for a in e.debug_annotations]
        print("E", e.track_uuid, e.Type.Name(e.type), name.replace(" ", "_"), *args)
"#
    );
    let py = std::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(&file)
        .output()
        .unwrap();
    assert!(py.status.success(), "{py:?}");
    let text = String::from_utf8(py.stdout).unwrap();
    let track = text
        .lines()
        .find_map(|l| {
            let w: Vec<&str> = l.split(' ').collect();
            (w[0] == "T" && w[2] == tid.to_string()).then(|| w[1].to_owned())
        })
        .expect("the thread's track");
    let lost: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("TYPE_INSTANT LOST_"))
        .collect();
    assert_eq!(
        lost,
        vec![format!("E {track} TYPE_INSTANT LOST_{total}_EVENTS lost={total}").as_str()],
        "{text}"
    );
    let lost_ends = text
        .lines()
        .filter(|l| l.contains("TYPE_SLICE_END") && l.contains("lost_return=True"))
        .count();
    assert_eq!(lost_ends, 2, "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}
