//! Return probes (`r[MAXACTIVE]:EVENT SYM`, `p SYM%return`) end to end: a program built at
//! test time prints what its functions return; the return events ftprobe records must
//! carry the same values, with the entry arguments saved at entry, the caller they
//! returned to, and MAXACTIVE's misses in the profile. Each case runs on a build with
//! patchable entries (the entry probe goes through ftrace) and on one without (an int3
//! probe at the function's first byte).

use std::collections::HashMap;

mod common;
use common::{build_at_test_time, events, trace, untraced};

const SOURCE: &str = r#"
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) long add(long a, long b) { return a + b; }
__attribute__((noinline)) const char *name_of(int i)
{
    static const char *names[] = {"zero", "one", "two"};
    return names[i % 3];
}
__attribute__((noinline)) int neg(int x) { return -x; }
__attribute__((noinline)) int rec(int n) { return n <= 1 ? 1 : 1 + rec(n - 1); }
__attribute__((noinline)) long sum7(long a, long b, long c, long d, long e, long f, long g)
{
    return a + b + c + d + e + f + g;
}

int main(void)
{
    for (int i = 0; i < 3; i++)
        printf("add %d 40 = %ld\n", i, add(i, 40));
    for (int i = 0; i < 3; i++) {
        const char *p = name_of(i);
        printf("name_of %d = %p %s\n", i, (void *)p, p);
    }
    printf("neg 22 = %d\n", neg(22));
    void *m = malloc(77);
    printf("malloc 77 = %p\n", m);
    free(m);
    printf("rec 5 = %d\n", rec(5));
    printf("sum7 = %ld\n", sum7(1, 2, 3, 4, 5, 6, 7000));
    return 0;
}
"#;

/// The program with patchable entries (sites), and without; built once per test process (the
/// tests run in parallel and would rebuild the same files under each other).
fn programs() -> Vec<(&'static str, String)> {
    static BUILT: std::sync::OnceLock<Vec<(&'static str, String)>> = std::sync::OnceLock::new();
    BUILT.get_or_init(build).clone()
}

fn build() -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    for (name, flags) in [
        (
            "retvals_sites.c",
            &["-O1", "-fpatchable-function-entry=5"][..],
        ),
        ("retvals_plain.c", &["-O1"][..]),
    ] {
        let exe = build_at_test_time("gcc", name, SOURCE, flags)
            .unwrap_or_else(|| panic!("gcc failed on {name}"));
        out.push((name, exe.to_str().unwrap().to_owned()));
    }
    out
}

/// The program's own lines, `KEY = VALUE`, by key.
fn printed(stdout: &[u8]) -> HashMap<String, String> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter_map(|l| l.split_once(" = "))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// Each line of `event`: (the part inside the parentheses, the arguments after them).
fn hits(text: &str, event: &str) -> Vec<(String, HashMap<String, String>)> {
    let tag = format!(" {event}: (");
    events(text)
        .filter_map(|l| l.split_once(&tag))
        .map(|(_, rest)| {
            let (at, args) = rest.split_once(')').unwrap();
            let args = args
                .split_whitespace()
                .filter_map(|a| a.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect();
            (at.to_owned(), args)
        })
        .collect()
}

fn num(v: &str) -> u64 {
    match v.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).unwrap(),
        None => v.parse::<i64>().unwrap() as u64,
    }
}

/// `(caller+0xOFF/0xSIZE <- func)`: the caller's name and the function's.
fn at_parts(at: &str) -> (String, String) {
    let (ret, func) = at.split_once(" <- ").unwrap_or_else(|| panic!("{at:?}"));
    (ret.split('+').next().unwrap().to_owned(), func.to_owned())
}

fn run(exe: &str, defs: &[&str]) -> (HashMap<String, String>, String) {
    let mut args = Vec::new();
    for d in defs {
        args.push("-e");
        args.push(*d);
    }
    let (out, text) = trace(&args, &[exe]);
    let plain = untraced(&[exe]);
    assert!(out.status.success(), "{exe}: {out:?}\n{text}");
    // The same output as untraced, but for addresses (ASLR moves them from run to run).
    let strip = |b: &[u8]| -> Vec<String> {
        String::from_utf8_lossy(b)
            .lines()
            .map(|l| {
                l.split_whitespace()
                    .filter(|w| !w.starts_with("0x"))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect()
    };
    assert_eq!(
        strip(&out.stdout),
        strip(&plain.stdout),
        "{exe}: output differs from the untraced run"
    );
    (printed(&out.stdout), text)
}

#[test]
fn retval_of_integer_returns_equals_what_the_program_printed() {
    for (name, exe) in programs() {
        let (p, text) = run(
            &exe,
            &[
                "r:addret add a=$arg1 b=$arg2 ret=$retval",
                "r:negret neg ret=$retval:s32",
                "p:sumret sum7%return g=$arg7 ret=$retval:s64",
            ],
        );
        let adds = hits(&text, "addret");
        assert_eq!(adds.len(), 3, "{name}\n{text}");
        for (i, (at, args)) in adds.iter().enumerate() {
            assert_eq!(at_parts(at), ("main".into(), "add".into()), "{name}");
            assert_eq!(num(&args["a"]), i as u64, "{name}: {args:?}");
            assert_eq!(num(&args["b"]), 40, "{name}: {args:?}");
            let want: u64 = p[&format!("add {i} 40")].parse().unwrap();
            assert_eq!(num(&args["ret"]), want, "{name}: {args:?}");
        }
        let negs = hits(&text, "negret");
        assert_eq!(negs.len(), 1, "{name}\n{text}");
        assert_eq!(negs[0].1["ret"], p["neg 22"], "{name}");
        let sums = hits(&text, "sumret");
        assert_eq!(sums.len(), 1, "{name}\n{text}");
        assert_eq!(sums[0].1["ret"], p["sum7"], "{name}");
        // The seventh argument is on the stack at entry: saved there, printed at return.
        assert_eq!(num(&sums[0].1["g"]), 7000, "{name}");
    }
}

#[test]
fn retval_of_pointer_returns_and_strings_read_at_return() {
    for (name, exe) in programs() {
        let (p, text) = run(
            &exe,
            &["r:nameret name_of i=$arg1:s32 p=$retval s=+0($retval):string"],
        );
        let h = hits(&text, "nameret");
        assert_eq!(h.len(), 3, "{name}\n{text}");
        for (i, (_, args)) in h.iter().enumerate() {
            assert_eq!(args["i"], i.to_string());
            let line = &p[&format!("name_of {i}")];
            let (ptr, s) = line.split_once(' ').unwrap();
            assert_eq!(num(&args["p"]), num(ptr), "{name}: {args:?}");
            assert_eq!(args["s"], format!("\"{s}\""), "{name}: {args:?}");
        }
    }
}

#[test]
fn retval_of_libc_malloc_in_an_unmodified_program() {
    let (_, exe) = programs().pop().unwrap();
    let (p, text) = run(&exe, &["r:mret libc:malloc size=$arg1:u64 ret=$retval"]);
    let h = hits(&text, "mret");
    let ours: Vec<_> = h.iter().filter(|(_, a)| a["size"] == "77").collect();
    assert_eq!(ours.len(), 1, "{text}");
    let (at, args) = ours[0];
    assert_eq!(at_parts(at), ("main".into(), "malloc".into()));
    assert_eq!(num(&args["ret"]), num(&p["malloc 77"]), "{args:?}");
}

/// The kprobe_profile line of `event`: (hits, nmissed).
fn profile(text: &str, event: &str) -> (u64, u64) {
    let l = text
        .lines()
        .find(|l| l.starts_with("#   ") && l.split_whitespace().nth(1) == Some(event))
        .unwrap_or_else(|| panic!("no profile line for {event}\n{text}"));
    let v: Vec<u64> = l
        .split_whitespace()
        .skip(2)
        .map(|x| x.parse().unwrap())
        .collect();
    (v[0], v[1])
}

#[test]
fn maxactive_overflow_is_counted_in_nmissed() {
    for (name, exe) in programs() {
        // rec(5) nests five calls: with MAXACTIVE 1 only the outermost is hooked, the four
        // inner ones are missed, as a kernel kretprobe with maxactive 1 counts them.
        let (p, text) = run(
            &exe,
            &[
                "r1:rec1 rec ret=$retval:s32",
                "r:recall rec ret=$retval:s32",
            ],
        );
        assert_eq!(p["rec 5"], "5");
        let one = hits(&text, "rec1");
        assert_eq!(one.len(), 1, "{name}\n{text}");
        assert_eq!(one[0].1["ret"], "5", "{name}: the outermost call returns 5");
        assert_eq!(profile(&text, "rec1"), (1, 4), "{name}\n{text}");
        // With the default MAXACTIVE every call returns through the probe, innermost first.
        let all: Vec<String> = hits(&text, "recall")
            .into_iter()
            .map(|(_, a)| a["ret"].clone())
            .collect();
        assert_eq!(all, ["1", "2", "3", "4", "5"], "{name}\n{text}");
        assert_eq!(profile(&text, "recall"), (5, 0), "{name}");
    }
}

#[test]
fn a_return_probe_on_an_offset_is_refused_as_the_kernel_does() {
    let (_, exe) = programs().pop().unwrap();
    let out = common::ftprobe()
        .args(["trace", "-e", "r:bad add+4", "--", &exe])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    // The kernel's parser refuses an offset other than 0 on a return probe (BAD_RETPROBE).
    assert!(
        err.contains("Retprobe address must be an function entry"),
        "{err}"
    );
}
