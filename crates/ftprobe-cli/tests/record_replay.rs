//! `ftprobe record` and `ftprobe replay` end to end: a recording of a deterministic fixture
//! replays as the text `ftprobe trace` prints for the same program and options, line for line
//! apart from the columns that differ from run to run (TASK-PID, CPU, timestamp, duration); it
//! replays after the program's file is gone or changed; the exit status and the lost-event
//! counts are kept.

use std::path::Path;
use std::process::Output;

mod common;
use common::{ftprobe, tmp_dir, trace, untraced};

use ftprobe_dev::{fgraph_deep_fixture, fixture, Flavour};

/// `ftprobe record -d DIR ARGS -- CMD`.
fn record(dir: &Path, args: &[&str], cmd: &[&str]) -> Output {
    common::record_to(dir, args, cmd)
}

/// `ftprobe replay -d DIR ARGS`: (its output, the text it printed).
fn replay(dir: &Path, args: &[&str]) -> (Output, String) {
    let out = ftprobe()
        .arg("replay")
        .arg("-d")
        .arg(dir)
        .args(args)
        .output()
        .expect("run ftprobe replay");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (out, text)
}

/// The trace without what differs from run to run: the TASK-PID, CPU and timestamp columns
/// of event lines (`TASK-PID [CPU] TS: ` is cut), the CPU and duration columns of
/// function_graph lines (up to the `|`), pids in `# pid N` lines and the addresses of the
/// `kprobes/list` lines (ASLR).
fn normalize(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| {
            if let Some(rest) = l.strip_prefix("# pid ") {
                let (_, after) = rest.split_once(' ').unwrap_or(("", rest));
                return format!("# pid N {after}");
            }
            // A `kprobes/list` line: the address moves with ASLR.
            if let Some(rest) = l.strip_prefix("#   ") {
                if rest.len() > 16 && rest[..16].bytes().all(|b| b.is_ascii_hexdigit()) {
                    return format!("#   ADDR{}", &rest[16..]);
                }
            }
            if l.starts_with('#') {
                return l.to_owned();
            }
            if let Some((_, rest)) = l.split_once("]  ") {
                if let Some((_, event)) = rest.split_once(": ") {
                    return event.to_owned();
                }
            }
            if let Some((_, rest)) = l.split_once('|') {
                return format!("|{rest}");
            }
            l.to_owned()
        })
        .collect()
}

/// Records and replays `cmd` with `args`, traces it with the same `args`, and checks that the
/// two texts are the same apart from the per-run columns; returns the replayed text.
fn replay_equals_trace(args: &[&str], cmd: &[&str]) -> String {
    let dir = tmp_dir("data");
    let rec = record(&dir, args, cmd);
    let plain = untraced(cmd);
    assert_eq!(rec.status.code(), plain.status.code(), "{rec:?}");
    assert_eq!(
        rec.stdout, plain.stdout,
        "the program's output is unchanged"
    );
    let (out, replayed) = replay(&dir, &[]);
    assert!(out.status.success(), "{out:?}");
    let (_, live) = trace(args, cmd);
    assert!(live.lines().count() > 5, "{live}");
    let (a, b) = (normalize(&live), normalize(&replayed));
    assert_eq!(a, b, "trace:\n{live}\nreplay:\n{replayed}");
    let _ = std::fs::remove_dir_all(&dir);
    replayed
}

/// Lines whose event part is exactly `what`.
fn count(text: &str, what: &str) -> usize {
    normalize(text).iter().filter(|l| *l == what).count()
}

fn calls_exe() -> String {
    fixture("calls", Flavour::FentryNop)
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned()
}

#[test]
fn replay_prints_what_trace_printed_for_the_function_tracer() {
    let exe = calls_exe();
    let text = replay_equals_trace(&[], &[&exe, "7"]);
    // The fixture's own counts: caller once from main, work 7 times from caller.
    assert_eq!(count(&text, "work <-caller"), 7, "{text}");
    assert_eq!(count(&text, "caller <-main"), 1, "{text}");
    assert!(text.contains("# lost events: 0\n"), "{text}");
}

#[test]
fn replay_prints_what_trace_printed_for_kprobe_events_with_fetch_args() {
    let exe = fixture("fetchargs", Flavour::FentryNop).unwrap();
    let exe = exe.to_str().unwrap();
    let def = "p:pk take id=+0(%di):u32 s=+0($arg2):string";
    let text = replay_equals_trace(&["-e", def], &[exe]);
    // The fixture's known data (see fetchargs.c): its first two calls.
    assert_eq!(
        count(&text, "pk: (take+0x0/0x12) id=100 s=\"heap string 0\""),
        1,
        "{text}"
    );
    assert_eq!(
        count(&text, "pk: (take+0x0/0x12) id=101 s=\"stack string 1\""),
        1,
        "{text}"
    );
    assert!(text.contains("# kprobes/list:\n"), "{text}");
    let profile = text
        .lines()
        .find(|l| l.starts_with("#   pk "))
        .unwrap_or_else(|| panic!("{text}"));
    assert_eq!(
        profile.split_whitespace().collect::<Vec<_>>(),
        ["#", "pk", "4", "0"]
    );
}

#[test]
fn replay_prints_what_trace_printed_for_function_graph() {
    let exe = calls_exe();
    let text = replay_equals_trace(&["-t", "function_graph"], &[&exe, "5"]);
    assert_eq!(count(&text, "|      work();"), 5, "{text}");
    assert_eq!(count(&text, "|    caller() {"), 1, "{text}");
    // And with -O at replay: the options apply to the recording.
    let dir = tmp_dir("graph-opt");
    let rec = record(&dir, &["-t", "function_graph"], &[&exe, "5"]);
    assert!(rec.status.success(), "{rec:?}");
    let (_, plain) = replay(&dir, &[]);
    let (_, retval) = replay(&dir, &["-O", "funcgraph-retval"]);
    assert_ne!(plain, retval);
    let (_, live) = trace(
        &["-t", "function_graph", "-O", "funcgraph-retval"],
        &[&exe, "5"],
    );
    assert_eq!(normalize(&live), normalize(&retval), "{live}\n{retval}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_recording_replays_after_its_binary_is_deleted_or_changed() {
    let work = tmp_dir("bin");
    let exe = work.join("calls-copy");
    std::fs::copy(calls_exe(), &exe).unwrap();
    let exe_s = exe.to_str().unwrap();
    let (_, live) = trace(&[], &[exe_s, "6"]);
    assert_eq!(count(&live, "work <-caller"), 6, "{live}");
    let dir = work.join("ftprobe.data");
    let rec = record(&dir, &[], &[exe_s, "6"]);
    assert!(rec.status.success(), "{rec:?}");
    // Changed in place: another program's bytes.
    std::fs::copy(fixture("fetchargs", Flavour::FentryNop).unwrap(), &exe).unwrap();
    let (_, changed) = replay(&dir, &[]);
    assert_eq!(normalize(&live), normalize(&changed), "{live}\n{changed}");
    // Deleted.
    std::fs::remove_file(&exe).unwrap();
    let (out, deleted) = replay(&dir, &[]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(normalize(&live), normalize(&deleted), "{live}\n{deleted}");
    let _ = std::fs::remove_dir_all(&work);
}

#[test]
fn record_keeps_the_exit_status() {
    // fgraph_deep's parent exits with 3 (after its forked child exits 0).
    let exe = fgraph_deep_fixture();
    let exe = exe.to_str().unwrap();
    let plain = untraced(&[exe]);
    assert_eq!(plain.status.code(), Some(3));
    let dir = tmp_dir("status");
    let rec = record(&dir, &["-t", "function_graph"], &[exe]);
    assert_eq!(rec.status.code(), Some(3), "{rec:?}");
    let info: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("info.json")).unwrap()).unwrap();
    assert_eq!(info["end"]["code"], 3, "{info}");
    let (out, text) = replay(&dir, &[]);
    assert!(out.status.success(), "{out:?}");
    assert!(text.contains("child_exit()"), "{text}");

    // Killed by a signal: the trace says so, and so does the replay.
    let dir = tmp_dir("killed");
    let cmd = ["/bin/sh", "-c", "kill -9 $$"];
    let args = ["-e", "p:g libc:getuid"];
    let rec = record(&dir, &args, &cmd);
    assert_eq!(rec.status.code(), Some(128 + 9), "{rec:?}");
    let (_, live) = trace(&args, &cmd);
    let (_, text) = replay(&dir, &[]);
    assert!(text.contains("was killed by signal 9 (Killed)\n"), "{text}");
    assert_eq!(normalize(&live), normalize(&text), "{live}\n{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn record_keeps_the_lost_counts_and_stores_32_bytes_per_function_event() {
    // 200000 calls through a 4 KiB ring: most are lost. The fixture's own count is the truth:
    // replayed plus lost events make all of its calls of work.
    const N: u64 = 200_000;
    let exe = calls_exe();
    let dir = tmp_dir("lost");
    let n = N.to_string();
    let rec = record(&dir, &["-F", "work", "--buffer-size-kb", "4"], &[&exe, &n]);
    assert!(rec.status.success(), "{rec:?}");
    let (_, text) = replay(&dir, &[]);
    let lost: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("# lost events: "))
        .unwrap_or_else(|| panic!("{text}"))
        .parse()
        .unwrap();
    let printed = count(&text, "work <-caller") as u64;
    assert!(lost > 0, "{text}");
    assert_eq!(printed + lost, N, "{text}");
    let entries = format!("# entries-in-buffer/entries-written: {printed}/{N} ");
    assert!(text.contains(&entries), "{text}");
    let tid_line = text
        .lines()
        .find(|l| l.starts_with("# tid ") && l.ends_with("events lost (ring full)"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        tid_line.contains(&format!(": {lost} events lost")),
        "{text}"
    );
    // One header word and three payload words (timestamp, function, parent) per event, in
    // the stream's file (a short stream's is the shared `rings-small.dat`).
    let size: u64 = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().starts_with("ring"))
        .map(|e| e.metadata().unwrap().len())
        .sum();
    // And a LOST record (header, timestamp, count: 24 bytes) per gap, marked where the
    // events were lost (`COMM-TID [LOST N EVENTS]` lines).
    let marks = text.lines().filter(|l| l.contains(" [LOST ")).count() as u64;
    assert_eq!(size, 32 * printed + 24 * marks);
    // `report` says so before its table: its count plus the lost ones are all the calls.
    let out = ftprobe().args(["report", "-d"]).arg(&dir).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let report = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = report.lines().collect();
    assert_eq!(
        lines[1],
        format!("# {lost} events lost: the numbers below miss them"),
        "{report}"
    );
    let calls: u64 = lines
        .iter()
        .find_map(|l| {
            let t: Vec<&str> = l.split_whitespace().collect();
            (t.len() == 2 && t[1] == "work").then(|| t[0].parse().unwrap())
        })
        .unwrap_or_else(|| panic!("{report}"));
    assert_eq!(calls + lost, N, "{report}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_failed_record_leaves_the_good_recording_alone() {
    // A good recording (work 7 times), then runs that record nothing: a filter that matches
    // no function, a program that does not exist, and a program with no ftrace site. Each
    // fails, and the good recording still replays, with no `.old` made of it.
    let exe = calls_exe();
    let work = tmp_dir("failed");
    let dir = work.join("data");
    let good = record(&dir, &[], &[&exe, "7"]);
    assert!(good.status.success(), "{good:?}");
    let (_, before) = replay(&dir, &[]);
    assert_eq!(count(&before, "work <-caller"), 7, "{before}");
    let missing = work.join("no-such-program");
    for (args, cmd) in [
        (&["-F", "nosuchfunc"][..], vec![exe.as_str(), "7"]),
        (&[][..], vec![missing.to_str().unwrap()]),
        (&[][..], vec!["/bin/true"]),
    ] {
        let out = record(&dir, args, &cmd);
        assert!(!out.status.success(), "{args:?} {cmd:?}: {out:?}");
        let (out, after) = replay(&dir, &[]);
        assert!(out.status.success(), "{args:?} {cmd:?}: {out:?}");
        assert_eq!(normalize(&before), normalize(&after), "{args:?} {cmd:?}");
    }
    assert!(!work.join("data.old").exists());
    // Only the data directory: no staging directory left behind.
    let names: Vec<_> = std::fs::read_dir(&work)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["data"], "{names:?}");

    // A second good run moves the first to `.old`; a `.old` that is not a recording is
    // never deleted: the run is refused before it starts.
    let again = record(&dir, &[], &[&exe, "3"]);
    assert!(again.status.success(), "{again:?}");
    let (_, old) = replay(&work.join("data.old"), &[]);
    assert_eq!(normalize(&before), normalize(&old));
    std::fs::remove_dir_all(work.join("data.old")).unwrap();
    std::fs::create_dir(work.join("data.old")).unwrap();
    std::fs::write(work.join("data.old/mine.txt"), "keep").unwrap();
    let refused = record(&dir, &[], &[&exe, "5"]);
    assert!(!refused.status.success(), "{refused:?}");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("is not a recording"),
        "{refused:?}"
    );
    assert!(work.join("data.old/mine.txt").exists());
    let (_, now) = replay(&dir, &[]);
    assert_eq!(count(&now, "work <-caller"), 3, "{now}");
    let _ = std::fs::remove_dir_all(&work);
}
