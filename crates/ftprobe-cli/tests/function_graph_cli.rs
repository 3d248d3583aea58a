//! `ftprobe trace -t function_graph` end to end on programs built at test time: the graph
//! parsed back from the kernel's layout must be the program's own call tree (counted by the
//! program), with every call closed and durations that nest, and -G, --graph-notrace,
//! --max-depth, -O and kprobe events as comments must do what ftrace's do.

mod common;
use common::{build_at_test_time, events, trace, untraced};

const FIB: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>

static long calls, leaves;
__attribute__((noinline)) long fib(int n)
{
    calls++;
    if (n < 2) {
        leaves++;
        return n;
    }
    return fib(n - 1) + fib(n - 2);
}
__attribute__((noinline)) void other(void) { calls++; }
__attribute__((noinline)) long outer(int n) { other(); return fib(n); }
static void *worker(void *arg) { return (void *)fib((int)(long)arg); }

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 10;
    long r = outer(n);
    printf("fib(%d) = %ld\ncalls = %ld\nleaves = %ld\n", n, r, calls, leaves);
    if (argc > 2) {
        pthread_t t[2];
        for (long i = 0; i < 2; i++)
            pthread_create(&t[i], 0, worker, (void *)(long)(5 + i));
        for (int i = 0; i < 2; i++)
            pthread_join(t[i], 0);
    }
    return 0;
}
"#;

fn fib_exe() -> String {
    static BUILT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            build_at_test_time(
                "gcc",
                "fibgraph.c",
                FIB,
                &["-O1", "-pthread", "-fpatchable-function-entry=5"],
            )
            .expect("gcc")
            .to_str()
            .unwrap()
            .to_owned()
        })
        .clone()
}

/// One line of the graph: depth (from the indentation), what it is, duration in ns.
#[derive(Debug, Clone, PartialEq)]
enum Line {
    Open(String),
    Leaf(String, u64),
    Close(u64, String),
    Comment(String),
}

/// The FUNCTION CALLS column of a line, and its duration (ns, from `X.YYY us`).
fn split(line: &str) -> Option<(usize, String, Option<u64>)> {
    // ` 1) ` [TASK/PID ` | `] `  DURATION ` `|  ` CALLS
    let (left, calls) = line.rsplit_once("|  ").or_else(|| line.split_once("|  "))?;
    let dur = left
        .split_whitespace()
        .rev()
        .skip_while(|w| *w != "us")
        .nth(1)
        .and_then(|v| {
            let (a, b) = v.split_once('.').unwrap_or((v, ""));
            let frac: String = format!("{b:0<3}").chars().take(3).collect();
            Some(a.parse::<u64>().ok()? * 1000 + frac.parse::<u64>().ok()?)
        });
    let depth = calls.len() - calls.trim_start().len();
    Some((depth / 2, calls.trim().to_owned(), dur))
}

fn parse(text: &str) -> Vec<(usize, Line)> {
    events(text)
        .filter(|l| l.contains(") "))
        .filter_map(split)
        .map(|(d, c, dur)| {
            let line = if let Some(f) = c.strip_suffix("() {") {
                Line::Open(f.to_owned())
            } else if let Some(f) = c.strip_suffix("();") {
                Line::Leaf(f.to_owned(), dur.unwrap())
            } else if c.starts_with('}') {
                Line::Close(dur.unwrap(), c.to_owned())
            } else {
                Line::Comment(c)
            };
            (d, line)
        })
        .collect()
}

/// A call of the graph: name, duration, children.
#[derive(Debug)]
struct Call {
    name: String,
    ns: u64,
    kids: Vec<Call>,
}

/// Rebuild the calls from the lines; panics on a close without an open, or an open left.
fn tree(lines: &[(usize, Line)]) -> Vec<Call> {
    let mut stack: Vec<(usize, Call)> = Vec::new();
    let mut top = Vec::new();
    for (d, l) in lines {
        let done = match l {
            Line::Open(f) => {
                stack.push((
                    *d,
                    Call {
                        name: f.clone(),
                        ns: 0,
                        kids: Vec::new(),
                    },
                ));
                continue;
            }
            Line::Leaf(f, ns) => Call {
                name: f.clone(),
                ns: *ns,
                kids: Vec::new(),
            },
            Line::Close(ns, text) => {
                let (od, mut c) = stack
                    .pop()
                    .unwrap_or_else(|| panic!("close without open: {text}"));
                assert_eq!(
                    od, *d,
                    "the close of {} is at the depth of its open",
                    c.name
                );
                c.ns = *ns;
                c
            }
            Line::Comment(_) => continue,
        };
        match stack.last_mut() {
            Some((_, p)) => p.kids.push(done),
            None => top.push(done),
        }
    }
    assert!(stack.is_empty(), "calls left open: {stack:?}");
    top
}

fn count(calls: &[Call], name: &str) -> usize {
    calls
        .iter()
        .map(|c| usize::from(c.name == name) + count(&c.kids, name))
        .sum()
}

fn leaves(calls: &[Call], name: &str) -> usize {
    calls
        .iter()
        .map(|c| usize::from(c.name == name && c.kids.is_empty()) + leaves(&c.kids, name))
        .sum()
}

/// Every parent's duration covers its children's (each line's duration is truncated to
/// the ns, so a parent may show up to 1 ns per child less).
fn check_durations(c: &Call) {
    let sum: u64 = c.kids.iter().map(|k| k.ns).sum();
    assert!(
        c.ns + c.kids.len() as u64 >= sum,
        "{} took {} ns, its {} children {} ns",
        c.name,
        c.ns,
        c.kids.len(),
        sum
    );
    c.kids.iter().for_each(check_durations);
}

fn printed(out: &std::process::Output, key: &str) -> usize {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| {
            l.strip_prefix(&format!("{key} = "))
                .map(|v| v.parse().unwrap())
        })
        .unwrap()
}

#[test]
fn fibonacci_graph_is_the_programs_call_tree_with_nested_durations() {
    let exe = fib_exe();
    let (out, text) = trace(&["-t", "function_graph"], &[&exe, "12"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.stdout, untraced(&[&exe, "12"]).stdout);
    let calls = tree(&parse(&text));
    // main > outer > {other, fib...}: one main, and the program's own counts.
    assert_eq!(calls.len(), 1, "{text}");
    assert_eq!(calls[0].name, "main");
    let fibs = count(&calls, "fib");
    assert_eq!(fibs + 1, printed(&out, "calls"), "fib calls + other()");
    assert_eq!(leaves(&calls, "fib"), printed(&out, "leaves"));
    calls.iter().for_each(check_durations);
    // The recursion's shape: fib(n) calls fib(n-1) then fib(n-2), so the depth of the graph
    // is n + 2 (main, outer, fib(12) .. fib(1)).
    fn depth(c: &Call) -> usize {
        1 + c.kids.iter().map(depth).max().unwrap_or(0)
    }
    assert_eq!(depth(&calls[0]), 12 + 2);
    assert!(text.contains("# lost events: 0"), "{text}");
}

#[test]
fn graph_function_max_depth_and_notrace_select_as_ftrace_does() {
    let exe = fib_exe();
    // -G outer: the graph starts at outer (depth 0); main is not in it.
    let (_, text) = trace(&["-t", "function_graph", "-G", "outer"], &[&exe, "6"]);
    let calls = tree(&parse(&text));
    assert_eq!(calls.len(), 1, "{text}");
    assert_eq!(calls[0].name, "outer");
    assert_eq!(count(&calls, "fib"), 25, "fib(6) makes 25 calls");
    // --max-depth 2: main and what main calls, nothing deeper.
    let (_, text) = trace(&["-t", "function_graph", "--max-depth", "2"], &[&exe, "6"]);
    let calls = tree(&parse(&text));
    assert_eq!(calls[0].name, "main");
    assert_eq!(calls[0].kids.len(), 1, "{text}");
    assert_eq!(calls[0].kids[0].name, "outer");
    assert!(calls[0].kids[0].kids.is_empty(), "{text}");
    // --graph-notrace fib: neither fib nor what it calls.
    let (_, text) = trace(
        &["-t", "function_graph", "--graph-notrace", "fib"],
        &[&exe, "6"],
    );
    let calls = tree(&parse(&text));
    assert_eq!(count(&calls, "fib"), 0, "{text}");
    assert_eq!(count(&calls, "other"), 1, "{text}");
}

#[test]
fn threads_get_the_task_pid_column_and_each_its_own_graph() {
    let exe = fib_exe();
    let (out, text) = trace(
        &["-t", "function_graph", "-F", "fib", "-F", "worker"],
        &[&exe, "4", "threads"],
    );
    assert!(out.status.success(), "{out:?}");
    // The column appears once a second thread records.
    assert!(text.contains("TASK/PID"), "{text}");
    // Per thread, the graph closes: group lines by the TASK-PID column. Lines printed before
    // a second thread recorded have no such column: they are the first thread's (main's,
    // which runs fib(4) before it starts the workers), whenever the workers' first records
    // came.
    let mut per: std::collections::BTreeMap<String, Vec<&str>> = Default::default();
    let mut early: Vec<&str> = Vec::new();
    for l in events(&text).filter(|l| l.contains(" | ") && l.contains(')')) {
        let field = l
            .split(") ")
            .nth(1)
            .unwrap()
            .split(" | ")
            .next()
            .unwrap()
            .trim();
        let is_task = field
            .rsplit_once('-')
            .is_some_and(|(c, p)| !c.is_empty() && p.chars().all(|d| d.is_ascii_digit()));
        if !is_task {
            assert!(
                per.is_empty(),
                "a line without the task column after it appeared: {l}"
            );
            early.push(l);
            continue;
        }
        per.entry(field.to_owned()).or_default().push(l);
    }
    if !early.is_empty() {
        // The main thread's task: its tid is the process id, below its threads' (created
        // after it).
        let tid = |k: &String| k.rsplit_once('-').unwrap().1.parse::<u32>().unwrap();
        let main = per
            .keys()
            .min_by_key(|k| tid(k))
            .cloned()
            .expect("a task column");
        let v = per.entry(main).or_default();
        let mut all = early;
        all.append(v);
        *v = all;
    }
    let mut fibs = 0;
    for lines in per.values() {
        let t = tree(&parse(&lines.join("\n")));
        fibs += count(&t, "fib");
    }
    // main: fib(4) = 9 calls; the workers fib(5) = 15 and fib(6) = 25.
    assert_eq!(fibs, 9 + 15 + 25, "{text}");
}

#[test]
fn kprobe_events_show_as_comments_inside_the_graph() {
    let exe = fib_exe();
    let (_, text) = trace(
        &[
            "-t",
            "function_graph",
            "-F",
            "outer",
            "-F",
            "other",
            "-e",
            "p:o other",
        ],
        &[&exe, "3"],
    );
    let lines = parse(&text);
    let i = lines
        .iter()
        .position(|(_, l)| matches!(l, Line::Comment(c) if c.starts_with("/* o: (other+")))
        .unwrap_or_else(|| panic!("{text}"));
    // After the entry of other, inside it... other is a leaf here, so the comment comes
    // after `outer() {` and before other's line.
    assert!(
        matches!(&lines[i - 1].1, Line::Open(f) if f == "outer"),
        "{text}"
    );
}
