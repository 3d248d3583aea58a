//! A review of the readers' names and filters, on the `names` fixture
//! (crates/ftprobe-dev/c/names_ov.cc: `f(int)` called 3 times and `f(double)` once; `top`
//! calls `mid` 4 times, each `mid` calls `leaf` twice; two static C functions named
//! `helper`, in names_st_a.c (called once) and names_st_b.c (twice)):
//!
//! - A: `replay -F/-N` follow `set_ftrace_filter`'s rules as `trace` does (an emptied filter
//!   means every function; a glob matching no function is refused);
//! - B: overloads and same-named statics stay apart (report rows, replay, dumps, `list
//!   functions`), and full signatures and mangled names work as filters;
//! - C: `-O funcgraph-abstime` prints the kernel's absolute time column, and its timestamps
//!   work with `--time-range`.

use std::path::Path;
use std::process::Output;

mod common;
use common::{ftprobe, tmp_dir};

use ftprobe_dev::names_fixture;

/// What the fixture prints (f: 2+3+4+3, chain: sum of 3i+2 for i < 4, st: 11+21+22).
const STDOUT: &str = "names f=12 chain=26 st=54\n";

fn names() -> String {
    names_fixture().to_str().unwrap().to_owned()
}

/// Removes its directory when dropped (recordings are large).
struct Dir(std::path::PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn record(what: &str, args: &[&str]) -> Dir {
    let dir = Dir(tmp_dir(what).join("rec"));
    let out = common::record_to(&dir.0, args, [names()]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), STDOUT);
    dir
}

fn run(cmd: &str, dir: &Path, args: &[&str]) -> Output {
    ftprobe()
        .arg(cmd)
        .arg("-d")
        .arg(dir)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run ftprobe {cmd}: {e}"))
}

fn ok_text(out: Output) -> String {
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// The function tracer's lines less their task, CPU and timestamp: `func <-parent`.
fn funcs(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once(": ").map(|(_, f)| f.to_owned()))
        .collect()
}

/// The function_graph lines' calls (what follows the last `|`, less two spaces).
fn calls(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once('|'))
        .map(|(_, c)| c.strip_prefix("  ").unwrap_or(c).to_owned())
        .collect()
}

/// `ftprobe trace ARGS -- names`: the trace's text.
fn trace(args: &[&str]) -> String {
    let (out, text) = common::trace(args, &[&names()]);
    assert!(out.status.success(), "{out:?}");
    text
}

/// Every function of the fixture, in the order it calls them, with its parent.
fn all_calls() -> Vec<String> {
    let mut v = vec!["main <-__libc_start_call_main".to_owned()];
    v.extend(["f(int) <-main"; 3].map(str::to_owned));
    v.push("f(double) <-main".into());
    v.push("top <-main".into());
    for _ in 0..4 {
        v.push("mid <-top".into());
        v.extend(["leaf <-mid"; 2].map(str::to_owned));
    }
    // st_a and st_b tail-call their helper (-O2): its return address is main's.
    v.push("st_a <-main".into());
    v.push("helper@names_st_a.c <-main".into());
    for _ in 0..2 {
        v.push("st_b <-main".into());
        v.push("helper@names_st_b.c <-main".into());
    }
    v
}

#[test]
fn replay_filters_follow_set_ftrace_filter_as_trace_does() {
    let rec = record("funcs", &[]);
    let full = funcs(&ok_text(run("replay", &rec.0, &[])));
    assert_eq!(full, all_calls());
    let without = |name: &str| -> Vec<String> {
        full.iter()
            .filter(|l| !l.starts_with(&format!("{name} ")))
            .cloned()
            .collect()
    };
    let only = |names: &[&str]| -> Vec<String> {
        full.iter()
            .filter(|l| names.iter().any(|n| l.starts_with(&format!("{n} "))))
            .cloned()
            .collect()
    };
    // (arguments, what the kernel's rules give).
    let cases: Vec<(Vec<&str>, Vec<String>)> = vec![
        // An emptied filter, or one of `!` only: every function.
        (vec!["-F", "mid", "-F", "!mid"], full.clone()),
        (vec!["-F", "!mid"], full.clone()),
        (vec!["-F", "mid"], only(&["mid"])),
        (vec!["-F", "*", "-F", "!mid"], without("mid")),
        (vec!["-N", "mid"], without("mid")),
        (vec!["-F", "m*", "-N", "main"], only(&["mid"])),
        // Full signatures, mangled names, short names (both overloads).
        (vec!["-F", "f(double)"], only(&["f(double)"])),
        (vec!["-F", "_Z1fd"], only(&["f(double)"])),
        (vec!["-F", "f"], only(&["f(int)", "f(double)"])),
        (vec!["-F", "f", "-F", "!f(int)"], only(&["f(double)"])),
    ];
    for (args, want) in cases {
        let replayed = funcs(&ok_text(run("replay", &rec.0, &args)));
        assert_eq!(replayed, want, "replay {args:?}");
        let traced = funcs(&trace(&args));
        assert_eq!(traced, want, "trace {args:?}");
    }
}

#[test]
fn a_glob_matching_no_function_is_refused_by_replay_as_by_trace() {
    let rec = record("nomatch", &[]);
    let (t, _) = common::trace(&["-F", "nosuch*"], &[&names()]);
    assert!(!t.status.success(), "{t:?}");
    let terr = String::from_utf8_lossy(&t.stderr);
    assert!(
        terr.contains("no function with an ftrace site matches \"nosuch*\""),
        "{terr}"
    );
    for args in [
        &["-F", "nosuch*"][..],
        &["-N", "nosuch*"],
        &["-F", "mid", "-F", "nosuch*"],
    ] {
        let r = run("replay", &rec.0, args);
        assert_eq!(r.status.code(), t.status.code(), "replay {args:?}: {r:?}");
        assert!(r.stdout.is_empty(), "replay {args:?}: {r:?}");
        let rerr = String::from_utf8_lossy(&r.stderr);
        assert!(
            rerr.contains("no function with an ftrace site") && rerr.contains("\"nosuch*\""),
            "{rerr}"
        );
    }
    // A `!` pattern that matches nothing removes nothing (the kernel takes it).
    let r = ok_text(run("replay", &rec.0, &["-F", "!nosuch*"]));
    assert_eq!(funcs(&r), all_calls());
}

#[test]
fn function_graph_replay_filters_follow_set_graph_function_as_trace_does() {
    let rec = record("graph", &["-t", "function_graph"]);
    let full = calls(&ok_text(run("replay", &rec.0, &[])));
    for (targs, rargs) in [
        (
            vec!["-t", "function_graph", "-G", "mid", "-G", "!mid"],
            vec!["-F", "mid", "-F", "!mid"],
        ),
        (
            vec!["-t", "function_graph", "-G", "!mid"],
            vec!["-F", "!mid"],
        ),
    ] {
        let replayed = calls(&ok_text(run("replay", &rec.0, &rargs)));
        assert_eq!(replayed, full, "replay {rargs:?}");
        let traced = calls(&trace(&targs));
        assert_eq!(traced, full, "trace {targs:?}");
    }
    // -F on a full signature: that overload's calls only.
    let one = calls(&ok_text(run("replay", &rec.0, &["-F", "f(double)"])));
    assert_eq!(one, vec!["f(double)();"]);
    let traced = calls(&trace(&["-t", "function_graph", "-G", "f(double)"]));
    assert_eq!(traced, one);
}

#[test]
fn overloads_and_same_named_statics_stay_apart() {
    let rec = record("ov", &["-t", "function_graph"]);
    // replay: each by its own name.
    let c = calls(&ok_text(run("replay", &rec.0, &[])));
    let n = |name: &str| c.iter().filter(|l| l.trim() == name).count();
    assert_eq!(n("f(int)();"), 3, "{c:#?}");
    assert_eq!(n("f(double)();"), 1, "{c:#?}");
    assert_eq!(n("helper@names_st_a.c();"), 1, "{c:#?}");
    assert_eq!(n("helper@names_st_b.c();"), 2, "{c:#?}");
    // report: a row each, with its own calls.
    let report = ok_text(run("report", &rec.0, &["-s", "func"]));
    let calls_of = |name: &str| -> Vec<u64> {
        report
            .lines()
            .filter(|l| l.split_whitespace().last() == Some(name))
            .map(|l| {
                // Total, self (two words each), then calls.
                let w: Vec<&str> = l.split_whitespace().collect();
                w[4].parse().unwrap()
            })
            .collect()
    };
    assert_eq!(calls_of("f(int)"), vec![3], "{report}");
    assert_eq!(calls_of("f(double)"), vec![1], "{report}");
    assert_eq!(calls_of("helper@names_st_a.c"), vec![1], "{report}");
    assert_eq!(calls_of("helper@names_st_b.c"), vec![2], "{report}");
    assert_eq!(calls_of("mid"), vec![4], "{report}");
    // Flame graph: a stack each.
    let flame = ok_text(run("dump", &rec.0, &["--flame-graph", "-"]));
    let stacks: Vec<&str> = flame
        .lines()
        .filter_map(|l| l.rsplit_once(' ').map(|(s, _)| s))
        .collect();
    for s in [
        "main;f(int)",
        "main;f(double)",
        "main;st_a;helper@names_st_a.c",
        "main;st_b;helper@names_st_b.c",
    ] {
        assert!(stacks.contains(&s), "{s} in {flame}");
    }
    assert!(!stacks.contains(&"main;f"), "{flame}");
    // Chrome: an X event per call, under its own name.
    let dir = tmp_dir("ov-chrome");
    let json = dir.join("t.json");
    ok_text(run("dump", &rec.0, &["--chrome", json.to_str().unwrap()]));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let events = v
        .get("traceEvents")
        .and_then(|e| e.as_array())
        .or_else(|| v.as_array())
        .expect("events");
    let count = |name: &str| {
        events
            .iter()
            .filter(|e| e["ph"] == "X" && e["name"] == name)
            .count()
    };
    assert_eq!((count("f(int)"), count("f(double)"), count("f")), (3, 1, 0));
    // list functions: each once.
    let out = ftprobe()
        .args(["list", "functions"])
        .arg(names_fixture())
        .output()
        .unwrap();
    let list = ok_text(out);
    let listed = |name: &str| {
        list.lines()
            .filter(|l| l.split_whitespace().last() == Some(name))
            .count()
    };
    for name in [
        "f(int)",
        "f(double)",
        "helper@names_st_a.c",
        "helper@names_st_b.c",
        "mid",
    ] {
        assert_eq!(listed(name), 1, "{name} in {list}");
    }
    assert_eq!(listed("f") + listed("helper"), 0, "{list}");
}

/// The timestamp a function_graph line with `funcgraph-abstime` starts with, and its value
/// in microseconds.
fn abstime(line: &str) -> (&str, u64) {
    let t = line.split_whitespace().next().unwrap();
    let (s, us) = t.split_once('.').unwrap();
    (
        t,
        s.parse::<u64>().unwrap() * 1_000_000 + us.parse::<u64>().unwrap(),
    )
}

#[test]
fn funcgraph_abstime_prints_the_kernels_column_and_serves_time_range() {
    let text = trace(&["-t", "function_graph", "-O", "funcgraph-abstime"]);
    let head: Vec<&str> = text.lines().filter(|l| l.starts_with("# ")).collect();
    assert!(
        head.iter()
            .any(|l| l.starts_with("#     TIME        CPU  DURATION")),
        "{text}"
    );
    let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(lines.len(), calls(&text).len());
    for l in &lines {
        // `%5lu.%06lu |  ` then the CPU column.
        let (ts, rest) = l.split_once(" |  ").unwrap();
        let (s, us) = ts.trim_start().split_once('.').unwrap();
        assert!(
            s.parse::<u64>().is_ok() && us.len() == 6 && us.parse::<u32>().is_ok(),
            "{l}"
        );
        assert!(
            rest.trim_start().starts_with("0)") || rest.trim_start().starts_with("1)"),
            "{l}"
        );
    }

    // A recording: the stamps of top's entry and its closing brace bound its subtree.
    let rec = record("abstime", &["-t", "function_graph"]);
    let full = ok_text(run("replay", &rec.0, &["-O", "funcgraph-abstime"]));
    let lines: Vec<&str> = full.lines().filter(|l| !l.starts_with('#')).collect();
    let c = calls(&full);
    let start = c.iter().position(|l| l.trim() == "top() {").expect("top");
    let close = c[start].replace("top() {", "}");
    let end = start
        + c[start..]
            .iter()
            .position(|l| *l == close)
            .expect("top's end");
    let (from, to) = (abstime(lines[start]), abstime(lines[end]));
    let range = format!("{}~{}", from.0, to.0);
    let cut = ok_text(run(
        "replay",
        &rec.0,
        &["-O", "funcgraph-abstime", "--time-range", &range],
    ));
    let got = calls(&cut);
    // Calls that began in the range, with top's own lines; the stamps are microseconds, so
    // a line of the same microsecond before or after may come too.
    let want = &c[start..=end];
    let at = got
        .iter()
        .position(|l| l.trim() == "top() {")
        .unwrap_or_else(|| panic!("{range}: {cut}"));
    assert_eq!(&got[at..at + want.len()], want, "{range}: {cut}");
    // Every line printed is in the range.
    for l in cut.lines().filter(|l| !l.starts_with('#')) {
        let t = abstime(l).1;
        assert!(from.1 <= t && t <= to.1, "{l} outside {range}");
    }
}
