//! The CLI reads in bounded memory: its peak private RSS (the `ftprobe` process's `RssAnon +
//! RssFile`) on a run with 10 times the events stays within 1.5 times the smaller run's, for
//! the live `trace` and for `replay`, `report` and `dump` (Perfetto, Chrome, flame graph) of a
//! recording; and the live trace of
//! threads whose events interleave closely is merged strictly by timestamp, as the kernel's
//! `trace` file is.

use std::path::Path;
use std::process::Stdio;

mod common;
use common::{events, ftprobe, tmp_dir, trace};

use ftprobe_dev::{fixture, pingpong_fixture, Flavour};

/// `threads N`: 4 threads, each calls `work` N times.
fn threads_exe() -> String {
    fixture("threads", Flavour::FentryNop)
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned()
}

/// Run `ftprobe ARGS` (output to /dev/null); its exit code and peak private RSS in KiB:
/// `RssAnon + RssFile` of its `/proc/PID/status`, read every millisecond until it is reaped.
///
/// Not `ru_maxrss`: on exec the kernel keeps, as the new program's maximum, the RSS of the
/// memory it replaced, and `Command` spawns with `CLONE_VM`: that is this test process's
/// (~15 MiB), more than `replay` ever uses. Not `VmHWM` either: it counts the shared ring
/// pages the live trace reads (`RssShmem`), which are the target's buffers, bounded by
/// `--buffer-size-kb` however many events go through them (rings grow while their threads
/// fill them faster than the CLI reads), not memory the CLI keeps.
fn peak_rss_kib(args: &[&str]) -> (i32, u64) {
    let mut child = ftprobe()
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("run ftprobe");
    let pid = child.id();
    let hwm = || -> Option<u64> {
        let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let field = |name: &str| -> Option<u64> {
            let l = s.lines().find(|l| l.starts_with(name))?;
            l.split_whitespace().nth(1)?.parse().ok()
        };
        Some(field("RssAnon:")? + field("RssFile:")?)
    };
    let mut peak = 0;
    let status = loop {
        peak = peak.max(hwm().unwrap_or(0));
        if let Some(status) = child.try_wait().expect("waitpid") {
            break status;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    };
    assert!(peak > 0, "no RssAnon read for ftprobe {args:?}");
    (status.code().expect("exited"), peak)
}

/// Record `threads N` (`ARGS` for record) into `dir`; the size of its ring files.
fn record_threads(dir: &Path, args: &[&str], n: u64) -> u64 {
    let out = ftprobe()
        .arg("record")
        .arg("-d")
        .arg(dir)
        .args(args)
        .arg("--")
        .arg(threads_exe())
        .arg(n.to_string())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("ring"))
        .map(|e| e.metadata().unwrap().len())
        .sum()
}

fn assert_bounded(what: &str, small: u64, large: u64) {
    eprintln!("{what}: peak RSS {small} KiB, with 10x the events {large} KiB");
    assert!(
        large * 2 <= small * 3,
        "{what}: peak RSS {small} KiB, with 10x the events {large} KiB (more than 1.5x)"
    );
}

#[test]
fn cli_memory_is_bounded() {
    let (small, large) = (20_000u64, 200_000u64);
    let exe = threads_exe();
    // The live trace (function tracer), to /dev/null. Its merge holds what arrives in its
    // bounded delay (100 ms), up to its bound on held records: runs long enough to reach
    // that steady state (4 threads x 1 000 000 and x 10 000 000 calls; at this rate the
    // live text loses events, as `# lost events` says: the memory is what is measured).
    let rss = |n: u64| {
        let (code, kib) = peak_rss_kib(&["trace", "-o", "/dev/null", "--", &exe, &n.to_string()]);
        assert_eq!(code, 0);
        kib
    };
    assert_bounded("trace", rss(50 * small), rss(50 * large));
    // replay and report of function_graph recordings (each call an entry and a return).
    let dir = tmp_dir("mem");
    let (ds, dl) = (dir.join("small"), dir.join("large"));
    let bytes_small = record_threads(&ds, &["-t", "function_graph"], small);
    let bytes_large = record_threads(&dl, &["-t", "function_graph"], large);
    // 4 threads x N calls x (24 + 40 bytes).
    assert!(bytes_large >= 4 * large * 64, "{bytes_large}");
    assert!(bytes_small < bytes_large / 9, "{bytes_small} {bytes_large}");
    for sub in [
        &["replay"][..],
        &["report"],
        &["dump", "--perfetto", "/dev/null"],
        &["dump", "--chrome", "/dev/null"],
        &["dump", "--flame-graph", "/dev/null"],
    ] {
        let rss = |d: &Path| {
            let mut args = vec![sub[0], "-d", d.to_str().unwrap()];
            args.extend_from_slice(&sub[1..]);
            let (code, kib) = peak_rss_kib(&args);
            assert_eq!(code, 0);
            kib
        };
        assert_bounded(&sub.join(" "), rss(&ds), rss(&dl));
    }
    // And the function tracer's recording, replayed.
    let (fs, fl) = (dir.join("fsmall"), dir.join("flarge"));
    record_threads(&fs, &[], small);
    record_threads(&fl, &[], large);
    let rss = |d: &Path| peak_rss_kib(&["replay", "-d", d.to_str().unwrap()]).1;
    assert_bounded("replay (function)", rss(&fs), rss(&fl));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The timestamp of an event line, in microseconds.
fn ts_us(line: &str) -> u64 {
    let ts = line.split("]  ").nth(1).unwrap().split(':').next().unwrap();
    let (s, us) = ts.trim().split_once('.').unwrap();
    s.parse::<u64>().unwrap() * 1_000_000 + us.parse::<u64>().unwrap()
}

#[test]
fn live_trace_is_in_timestamp_order() {
    // Two threads whose events alternate every few microseconds: a reader that drains one
    // ring and then the other sees the second's newer records before the first's that came
    // in between (the trace printed them up to tens of ms out of order).
    let exe = pingpong_fixture();
    for _ in 0..3 {
        let (out, text) = trace(&[], &[exe.to_str().unwrap(), "20000", "5"]);
        assert!(out.status.success(), "{out:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "ping=100000 pong=100000\n"
        );
        let lines: Vec<&str> = events(&text).collect();
        // Every event is there, and nothing says the merge's bound was reached.
        assert_eq!(
            lines
                .iter()
                .filter(|l| l.ends_with(": ping <-main"))
                .count(),
            100_000
        );
        assert_eq!(
            lines
                .iter()
                .filter(|l| l.ends_with(": pong <-pong_thread"))
                .count(),
            100_000
        );
        assert!(!text.contains("# the merge of the threads held"), "{text}");
        let back: Vec<(usize, &str, &str)> = lines
            .windows(2)
            .enumerate()
            .filter(|(_, w)| ts_us(w[1]) < ts_us(w[0]))
            .map(|(i, w)| (i, w[0], w[1]))
            .take(5)
            .collect();
        assert!(back.is_empty(), "timestamps go backwards: {back:#?}");
    }
}
