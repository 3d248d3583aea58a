//! The function_graph tracer against uftrace, an independent implementation, where uftrace is
//! right: programs built with `-pg` (uftrace's mcount; ftprobe's `-pg` sites) that recurse,
//! call from signal handlers, run threads and fork. Per thread, the call tree ftprobe prints
//! must be the one `uftrace replay` prints (names and nesting; durations differ run to run).
//! Skipped, saying why, when uftrace is not installed.

use std::collections::BTreeMap;
use std::process::Command;

mod common;
use common::{build_at_test_time, trace, untraced};

const PROGRAM: &str = r#"
#include <stdio.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>
#include <sys/wait.h>

__attribute__((noinline)) long fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }
__attribute__((noinline)) void leaf(void) { __asm__ volatile(""); }
__attribute__((noinline)) void deep(int n) { if (n) deep(n - 1); else leaf(); }
__attribute__((noinline)) void handler(int s) { (void)s; leaf(); fib(3); }
__attribute__((noinline)) void *worker(void *a) { fib((int)(long)a); deep(3); return 0; }
__attribute__((noinline)) void child(void) { deep(2); fib(2); }

int main(void)
{
    signal(SIGUSR1, handler);
    pthread_t t[2];
    for (long i = 0; i < 2; i++)
        pthread_create(&t[i], 0, worker, (void *)(3 + i));
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], 0);
    printf("fib(6) = %ld\n", fib(6));
    raise(SIGUSR1);
    deep(4);
    fflush(stdout);
    pid_t p = fork();
    if (p == 0) {
        child();
        _exit(0);
    }
    waitpid(p, 0, 0);
    leaf();
    return 0;
}
"#;

fn have_uftrace() -> bool {
    Command::new("uftrace")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Per thread (by its id in that run), the tree as lines `INDENT NAME {` / `NAME();` / `}`.
type Trees = BTreeMap<String, Vec<String>>;

/// A FUNCTION CALLS cell: its indentation (depth) and the call, normalized: closing braces
/// without their `/* name */` (uftrace always names the function; ftrace only when asked).
fn norm(calls: &str) -> Option<String> {
    let depth = (calls.len() - calls.trim_start().len()) / 2;
    let c = calls.trim();
    let c = if c.starts_with('}') { "}" } else { c };
    if c.starts_with("/*") || c.is_empty() {
        return None;
    }
    Some(format!("{}{}", "  ".repeat(depth), c))
}

/// `uftrace replay -f tid`: ` [  TID] | CALLS`.
fn uftrace_trees(exe: &str) -> Trees {
    let dir = std::env::temp_dir().join(format!("ftprobe-uftrace-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let rec = Command::new("uftrace")
        .args(["record", "--no-libcall", "-d"])
        .arg(&dir)
        .arg(exe)
        .output()
        .unwrap();
    assert!(rec.status.success(), "uftrace record: {rec:?}");
    let rep = Command::new("uftrace")
        .args(["replay", "--no-libcall", "-f", "tid", "-d"])
        .arg(&dir)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let mut out = Trees::new();
    for l in String::from_utf8_lossy(&rep.stdout).lines() {
        let Some((tid, calls)) = l.split_once("] | ") else {
            continue;
        };
        if let Some(n) = norm(calls) {
            out.entry(tid.trim().trim_start_matches('[').trim().to_owned())
                .or_default()
                .push(n);
        }
    }
    out
}

/// `ftprobe trace -t function_graph -O funcgraph-proc -O nofuncgraph-cpu -O
/// nofuncgraph-duration`: `  comm-pid   | CALLS`.
fn ftprobe_trees(exe: &str) -> Trees {
    let (out, text) = trace(
        &[
            "-t",
            "function_graph",
            "-O",
            "funcgraph-proc",
            "-O",
            "nofuncgraph-cpu",
            "-O",
            "nofuncgraph-duration",
        ],
        &[exe],
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.stdout, untraced(&[exe]).stdout);
    assert!(text.contains("# lost events: 0"), "{text}");
    let mut trees = Trees::new();
    for l in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((task, calls)) = l.split_once(" | ") else {
            continue;
        };
        let task = task.trim();
        if task.is_empty() || task.starts_with("---") {
            continue;
        }
        let pid = task.rsplit('-').next().unwrap().to_owned();
        if let Some(n) = norm(calls) {
            trees.entry(pid).or_default().push(n);
        }
    }
    trees
}

/// The trees, without the thread ids (they differ from run to run), sorted, each shifted to
/// start at depth 0: a forked child's first call is at its real depth in ftprobe (under the
/// parent's `main`, on the shadow stack the child inherits), as the kernel indents a graph
/// that starts mid-stack, while uftrace starts the child's graph at 0.
fn shapes(t: &Trees) -> Vec<String> {
    let mut v: Vec<String> = t
        .values()
        .map(|lines| {
            let shift = lines
                .iter()
                .map(|l| l.len() - l.trim_start().len())
                .min()
                .unwrap_or(0);
            // A call with nothing inside printed as `f() {` then `}` (uftrace does so when
            // another of its records, e.g. a task switch, came between the entry and the
            // exit) is the leaf `f();`.
            let mut out: Vec<String> = Vec::new();
            for l in lines.iter().map(|l| &l[shift..]) {
                let close = l.trim_start() == "}";
                let indent = l.len() - l.trim_start().len();
                match out.last_mut() {
                    Some(prev)
                        if close
                            && prev.ends_with("() {")
                            && prev.len() - prev.trim_start().len() == indent =>
                    {
                        let leaf = format!("{}();", &prev[..prev.len() - 4]);
                        *prev = leaf;
                    }
                    _ => out.push(l.to_owned()),
                }
            }
            out.join("\n")
        })
        .collect();
    v.sort();
    v
}

#[test]
fn graph_of_recursion_signals_threads_and_fork_equals_uftraces() {
    if !have_uftrace() {
        eprintln!("skipped: uftrace is not installed (apt-get install uftrace)");
        return;
    }
    let exe =
        build_at_test_time("gcc", "vsuft.c", PROGRAM, &["-O1", "-pg", "-pthread"]).expect("gcc");
    let exe = exe.to_str().unwrap();
    let ours = ftprobe_trees(exe);
    let theirs = uftrace_trees(exe);
    // main, two workers, the forked child.
    assert_eq!(ours.len(), 4, "{ours:#?}");
    assert_eq!(
        shapes(&ours),
        shapes(&theirs),
        "ftprobe:\n{ours:#?}\nuftrace:\n{theirs:#?}"
    );
}
