//! `ftprobe report` and `ftprobe dump` on recordings of `report_tree`, a program with a known
//! call tree that prints its own call counts per thread and the arguments of its calls: the
//! report's counts equal the program's, its times add up and agree with the replayed
//! durations; the Chrome JSON loads with Python's `json` and has one `X` event per call; the
//! folded stacks sum to the roots' total time; the SVG is XML.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

mod common;
use common::ftprobe;
use common::tmp_dir;

use ftprobe_dev::report_tree_fixture;

/// `ftprobe record -d DIR/data ARGS -- report_tree`: the program's output.
fn record(dir: &Path, args: &[&str]) -> String {
    let out = common::record_to(&dir.join("data"), args, [report_tree_fixture()]);
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// `ftprobe SUB -d DIR/data ARGS`: its standard output.
fn run(sub: &str, dir: &Path, args: &[&str]) -> String {
    let out: Output = ftprobe()
        .arg(sub)
        .arg("-d")
        .arg(dir.join("data"))
        .args(args)
        .output()
        .expect("run ftprobe");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// The program's `T name a=A b=B c=C` lines: per thread name, per function, its calls.
fn own_counts(program: &str) -> BTreeMap<String, BTreeMap<String, u64>> {
    program
        .lines()
        .filter_map(|l| l.strip_prefix("T "))
        .map(|l| {
            let mut it = l.split(' ');
            let name = it.next().unwrap().to_owned();
            let counts = it
                .map(|kv| {
                    let (k, v) = kv.split_once('=').unwrap();
                    (k.to_owned(), v.parse().unwrap())
                })
                .collect();
            (name, counts)
        })
        .collect()
}

/// The arguments the program called `c` with (its `C x` lines), in order.
fn c_args(program: &str) -> Vec<u64> {
    program
        .lines()
        .filter_map(|l| l.strip_prefix("C "))
        .map(|x| x.parse().unwrap())
        .collect()
}

/// A time as the report prints it (`85.530 us`) in ns, and its resolution in ns.
fn ns(num: &str, unit: &str) -> (u64, u64) {
    let (int, frac) = num.split_once('.').unwrap();
    let scale = match unit {
        "ns" => 1,
        "us" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        u => panic!("unit {u}"),
    };
    let v =
        int.trim().parse::<u64>().unwrap() * scale + frac.parse::<u64>().unwrap() * scale / 1000;
    (v, (scale / 1000).max(1))
}

/// A line of the function_graph table.
#[derive(Debug, Clone, Copy)]
struct Line {
    total: u64,
    self_ns: u64,
    calls: u64,
    /// The resolution of the printed times.
    res: u64,
}

/// The report's tables: per `# task` heading (`""` without --task), per function, its line.
fn tables(report: &str) -> BTreeMap<String, BTreeMap<String, Line>> {
    let mut out: BTreeMap<String, BTreeMap<String, Line>> = BTreeMap::new();
    let mut task = String::new();
    for l in report.lines() {
        if let Some(t) = l.strip_prefix("# task ") {
            // `TID (comm)`: the comm.
            task = t
                .split_once(" (")
                .unwrap()
                .1
                .trim_end_matches(')')
                .to_owned();
            continue;
        }
        let t: Vec<&str> = l.split_whitespace().collect();
        if t.len() != 12 || !t[0].contains('.') {
            continue;
        }
        let (total, r1) = ns(t[0], t[1]);
        let (self_ns, r2) = ns(t[2], t[3]);
        out.entry(task.clone()).or_default().insert(
            t[11].to_owned(),
            Line {
                total,
                self_ns,
                calls: t[4].parse().unwrap(),
                res: r1.max(r2),
            },
        );
    }
    out
}

#[test]
fn report_counts_equal_the_programs_own_and_times_add_up() {
    let dir = tmp_dir("graph");
    let program = record(&dir, &["-t", "function_graph"]);
    let own = own_counts(&program);
    assert_eq!(own.len(), 2, "{program}");

    // Per thread: the program's own counts.
    let report = run("report", &dir, &["--task"]);
    let per_task = tables(&report);
    let names: Vec<&String> = per_task.keys().collect();
    assert_eq!(names, ["report_tree", "worker"], "{report}");
    for (task, counts) in &own {
        let key = if task == "main" {
            "report_tree"
        } else {
            "worker"
        };
        let t = &per_task[key];
        for (f, n) in counts {
            assert_eq!(t[f].calls, *n, "{task} {f}:\n{report}");
        }
    }

    // All threads: the sums; a (the root) calls only b, b only c, c nothing.
    let report = run("report", &dir, &[]);
    let all = &tables(&report)[""];
    for f in ["a", "b", "c"] {
        let n: u64 = own.values().map(|c| c[f]).sum();
        assert_eq!(all[f].calls, n, "{f}:\n{report}");
    }
    for (parent, child) in [("a", Some("b")), ("b", Some("c")), ("c", None)] {
        let p = all[parent];
        let children = child.map_or(0, |c| all[c].total);
        // Times are printed truncated to their resolution.
        let slack = p.res + child.map_or(0, |c| all[c].res);
        assert!(
            p.total + slack >= p.self_ns + children,
            "{parent}:\n{report}"
        );
        // Self time is what the children leave.
        assert!(
            p.total.abs_diff(p.self_ns + children) <= slack,
            "{parent}:\n{report}"
        );
        assert!(p.self_ns > 0, "{parent} spins on its own:\n{report}");
    }
    assert!(!report.contains("did not return"), "{report}");

    // c's total equals the sum of its durations as replay prints them (`c();` leaves).
    let replayed = run("replay", &dir, &[]);
    let mut leaves = 0;
    let mut sum = 0;
    for l in replayed.lines().filter(|l| l.ends_with("c();")) {
        let d = l
            .split('|')
            .nth(1)
            .unwrap()
            .trim()
            .trim_start_matches(['+', '!', '#', '*', '@', '$', ' ']);
        let (num, unit) = d.split_once(' ').unwrap();
        sum += ns(num, unit.trim()).0;
        leaves += 1;
    }
    assert_eq!(leaves, all["c"].calls, "{replayed}");
    assert!(
        sum.abs_diff(all["c"].total) <= all["c"].res,
        "replay's c() durations sum to {sum} ns:\n{report}"
    );

    // Sorted by calls: c (16), b (8), a (4).
    let by_calls = run("report", &dir, &["-s", "call"]);
    let order: Vec<&str> = by_calls
        .lines()
        .filter_map(|l| l.split_whitespace().nth(11))
        .collect();
    assert_eq!(order, ["c", "b", "a"], "{by_calls}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn report_of_the_function_tracer_counts_calls() {
    let dir = tmp_dir("func");
    let program = record(&dir, &[]);
    let own = own_counts(&program);
    let report = run("report", &dir, &[]);
    let counts: BTreeMap<&str, u64> = report
        .lines()
        .filter_map(|l| {
            let t: Vec<&str> = l.split_whitespace().collect();
            (t.len() == 2 && t[0].bytes().all(|b| b.is_ascii_digit()))
                .then(|| (t[1], t[0].parse().unwrap()))
        })
        .collect();
    for f in ["a", "b", "c"] {
        let n: u64 = own.values().map(|c| c[f]).sum();
        assert_eq!(counts.get(f), Some(&n), "{f}:\n{report}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// bpftrace's `hist()` label of `v`'s bucket.
fn bucket_label(v: u64) -> String {
    let label = |n: u64| -> String {
        let (mut n, mut u) = (n, 0);
        while n >= 1024 && n % 1024 == 0 {
            n /= 1024;
            u += 1;
        }
        format!("{n}{}", ["", "K", "M", "G"][u])
    };
    match v {
        0 => "[0]".into(),
        1 => "[1]".into(),
        v => {
            let k = 63 - v.leading_zeros();
            format!("[{}, {})", label(1 << k), label(1 << (k + 1)))
        }
    }
}

#[test]
fn report_hits_and_hist_of_a_kprobe_arg_match_the_programs_arguments() {
    let dir = tmp_dir("kprobe");
    let program = record(&dir, &["-e", "p:pc c x=%di:u32"]);
    let args = c_args(&program);
    assert_eq!(args.len(), 16, "{program}");
    let report = run("report", &dir, &["--hist", "x"]);
    assert!(
        report
            .lines()
            .any(|l| l.split_whitespace().eq(["16", "pc"])),
        "{report}"
    );
    let mut want: BTreeMap<String, u64> = BTreeMap::new();
    for &x in &args {
        *want.entry(bucket_label(x)).or_default() += 1;
    }
    let after = report.split("@pc.x:\n").nth(1).expect("the histogram");
    let mut got: BTreeMap<String, u64> = BTreeMap::new();
    for l in after.lines().take_while(|l| !l.is_empty()) {
        let (head, _) = l.split_once(" |").unwrap();
        let (label, n) = head.rsplit_once(' ').unwrap();
        let n: u64 = n.parse().unwrap();
        if n > 0 {
            got.insert(label.trim().to_owned(), n);
        }
    }
    assert_eq!(got, want, "{report}");
    // No such arg: an error, not an empty histogram.
    let out = ftprobe()
        .args(["report", "--hist", "nope", "-d"])
        .arg(dir.join("data"))
        .output()
        .unwrap();
    assert!(!out.status.success(), "{out:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Python prints, from the Chrome JSON at `path`: `X name tid` per complete event,
/// `M tid name` per thread name, `I name tid x` per instant event with an `x` arg.
fn chrome_summary(path: &Path) -> String {
    let script = r#"
import json, sys
d = json.load(open(sys.argv[1]))
for e in d["traceEvents"]:
    if e["ph"] == "X":
        assert e["dur"] >= 0 and isinstance(e["ts"], (int, float))
        print("X", e["name"], e["tid"])
    elif e["ph"] == "M" and e["name"] == "thread_name":
        print("M", e["tid"], e["args"]["name"])
    elif e["ph"] == "i":
        print("I", e["name"], e["tid"], e["args"]["x"])
"#;
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(path)
        .output()
        .expect("python3");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn chrome_json_has_one_x_event_per_call_and_the_kprobe_events_with_their_args() {
    if Command::new("python3").arg("-V").output().is_err() {
        eprintln!("skipped: no python3");
        return;
    }
    let dir = tmp_dir("chrome");
    let program = record(&dir, &["-t", "function_graph", "-e", "p:pc c x=%di:u32"]);
    let own = own_counts(&program);
    let json = dir.join("trace.json");
    run("dump", &dir, &["--chrome", json.to_str().unwrap()]);
    let summary = chrome_summary(&json);
    // Thread names by tid.
    let names: BTreeMap<&str, &str> = summary
        .lines()
        .filter_map(|l| l.strip_prefix("M "))
        .map(|l| l.split_once(' ').unwrap())
        .collect();
    assert_eq!(names.len(), 2, "{summary}");
    // Per thread name, per function: the X events.
    let mut got: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    for l in summary.lines().filter_map(|l| l.strip_prefix("X ")) {
        let (name, tid) = l.split_once(' ').unwrap();
        let thread = match names[tid] {
            "worker" => "worker",
            _ => "main",
        };
        *got.entry(thread.into())
            .or_default()
            .entry(name.into())
            .or_default() += 1;
    }
    assert_eq!(got, own, "{summary}");
    // One instant event per call of c, with the argument the program passed, in order.
    let xs: Vec<u64> = summary
        .lines()
        .filter_map(|l| l.strip_prefix("I pc "))
        .map(|l| l.split_once(' ').unwrap().1.parse().unwrap())
        .collect();
    assert_eq!(xs, c_args(&program), "{summary}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn flame_graph_folds_the_stacks_by_self_time_and_draws_an_svg() {
    let dir = tmp_dir("flame");
    record(&dir, &["-t", "function_graph"]);
    let folded = dir.join("folded.txt");
    run("dump", &dir, &["--flame-graph", folded.to_str().unwrap()]);
    let text = std::fs::read_to_string(&folded).unwrap();
    let mut stacks = Vec::new();
    let mut sum = 0u64;
    for l in text.lines() {
        let (stack, n) = l.rsplit_once(' ').unwrap();
        stacks.push(stack);
        sum += n.parse::<u64>().unwrap();
    }
    assert_eq!(stacks, ["a", "a;b", "a;b;c"], "{text}");
    // The roots' (a's) total time, as report prints it.
    let report = run("report", &dir, &[]);
    let a = &tables(&report)[""]["a"];
    assert!(
        sum.abs_diff(a.total) <= a.res,
        "folded sum {sum} ns against a's total:\n{report}"
    );

    let svg = dir.join("flame.svg");
    run(
        "dump",
        &dir,
        &["--flame-graph", svg.to_str().unwrap(), "--svg"],
    );
    let data = std::fs::read_to_string(&svg).unwrap();
    assert!(
        data.starts_with("<?xml") || data.starts_with("<svg"),
        "{}",
        &data[..data.len().min(200)]
    );
    assert!(data.contains("<svg"), "an svg element");
    // It is well-formed XML (when Python is here to say so).
    if let Ok(out) = Command::new("python3")
        .args([
            "-c",
            "import sys, xml.dom.minidom; xml.dom.minidom.parse(sys.argv[1])",
        ])
        .arg(&svg)
        .output()
    {
        assert!(out.status.success(), "{out:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn report_counts_calls_that_never_returned_and_says_so() {
    // fgraph_deep: the parent calls exit(3) inside `finisher`, its forked child exit(0)
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
    let program = String::from_utf8(out.stdout).unwrap();
    let mut own: BTreeMap<String, u64> = BTreeMap::new();
    for l in program.lines().filter_map(|l| l.strip_prefix("E ")) {
        *own.entry(l.split(' ').nth(1).unwrap().into()).or_default() += 1;
    }
    assert!(own.contains_key("finisher"), "{program}");
    let report = run("report", &dir, &[]);
    let got: BTreeMap<String, u64> = tables(&report)[""]
        .iter()
        .map(|(f, l)| (f.clone(), l.calls))
        .collect();
    assert_eq!(got, own, "{report}");
    let mut said: Vec<&str> = report
        .lines()
        .filter(|l| l.ends_with("did not return (cut off: counted to the cut)"))
        .collect();
    said.sort();
    assert_eq!(
        said,
        [
            "# child_exit: 1 of its calls did not return (cut off: counted to the cut)",
            "# finisher: 1 of its calls did not return (cut off: counted to the cut)",
        ],
        "{report}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `ftprobe record -d DIR/data -t function_graph -- fgraph_deep N`: the program's own count
/// of entries per function (its `E depth name` lines, parent and child).
fn record_deep(dir: &Path, n: u32) -> BTreeMap<String, u64> {
    let out = ftprobe()
        .arg("record")
        .arg("-d")
        .arg(dir.join("data"))
        .args(["-t", "function_graph", "--"])
        .arg(ftprobe_dev::fgraph_deep_fixture())
        .arg(n.to_string())
        .output()
        .unwrap();
    let program = String::from_utf8(out.stdout).unwrap();
    let mut own: BTreeMap<String, u64> = BTreeMap::new();
    for l in program.lines().filter_map(|l| l.strip_prefix("E ")) {
        *own.entry(l.split(' ').nth(1).unwrap().into()).or_default() += 1;
    }
    assert!(own.contains_key("finisher"), "{program}");
    own
}

#[test]
fn report_total_of_a_recursive_function_counts_only_its_outermost_calls() {
    // fgraph_deep 200: `rec` recurses 201 deep from main (no site). Its total is the
    // outermost call's time, so it cannot exceed all the traced time (the sum of every
    // function's self time); counting each level again made it about 100 times that.
    let dir = tmp_dir("recursion");
    let own = record_deep(&dir, 200);
    assert_eq!(own["rec"], 201);
    let report = run("report", &dir, &[]);
    let t = &tables(&report)[""];
    assert_eq!(t["rec"].calls, 201, "{report}");
    let traced: u64 = t.values().map(|l| l.self_ns).sum();
    let slack: u64 = t.values().map(|l| l.res).sum();
    assert!(
        t["rec"].total <= traced + slack,
        "rec total {} > traced {traced}\n{report}",
        t["rec"].total
    );
    assert!(
        t["rec"].self_ns <= t["rec"].total + t["rec"].res,
        "{report}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn report_says_how_many_calls_the_full_shadow_stack_did_not_record() {
    // fgraph_deep 2000: deeper than the shadow stack (1024); the calls beyond it are not
    // hooked. The program's own entries less the report's calls are the ones the note
    // counts, and it comes before the table.
    let dir = tmp_dir("overrun");
    let own = record_deep(&dir, 2000);
    let report = run("report", &dir, &[]);
    let reported: u64 = tables(&report)[""].values().map(|l| l.calls).sum();
    let missed = own.values().sum::<u64>() - reported;
    assert!(missed > 0, "{report}");
    let note = format!(
        "# {missed} calls not hooked (the shadow stack was full): the numbers below miss them"
    );
    let at = report.lines().position(|l| l == note);
    let table = report.lines().position(|l| l.contains("Total time"));
    assert!(at.is_some() && at < table, "{note}\n{report}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn report_hist_of_a_string_arg_is_an_error() {
    let dir = tmp_dir("hist-string");
    record(&dir, &["-e", "p:pc c s=$comm x=%di:u32"]);
    let out = ftprobe()
        .args(["report", "--hist", "s", "-d"])
        .arg(dir.join("data"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("\"s\" is not numeric"), "{err}");
    // The numeric arg of the same event still has its histogram.
    let report = run("report", &dir, &["--hist", "x"]);
    assert!(report.contains("@pc.x:\n["), "{report}");
    let _ = std::fs::remove_dir_all(&dir);
}
