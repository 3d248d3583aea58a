//! A user's review of return hooks (function_graph and return events): each case is a
//! program built at test time, run untraced for the truth, then traced.

mod common;
use common::{build_at_test_time, events, trace, untraced};

/// The README's demo flags.
const FG: [&str; 5] = [
    "-pg",
    "-mfentry",
    "-mnop-mcount",
    "-mrecord-mcount",
    "-fno-pie",
];

fn build(compiler: &str, file: &str, source: &str, extra: &[&str]) -> String {
    let mut flags: Vec<&str> = FG.to_vec();
    flags.push("-no-pie");
    flags.extend_from_slice(extra);
    build_at_test_time(compiler, file, source, &flags)
        .unwrap_or_else(|| panic!("{compiler} {file}"))
        .to_str()
        .unwrap()
        .to_owned()
}

/// The FUNCTION CALLS column of the graph's event lines.
fn calls(text: &str) -> Vec<String> {
    events(text)
        .filter_map(|l| l.split_once("|  ").map(|(_, c)| c.trim().to_owned()))
        .collect()
}

/// `outer_tail` ends in `jmp mid` (gcc -O2): mid's return slot is outer_tail's, holding the
/// trampoline; the throw below is caught in `catcher`, above both.
const TAIL_BELOW_CATCH: &str = r#"
#include <cstdio>
__attribute__((noinline)) int thrower(int x){ if (x) throw x; return x; }
__attribute__((noinline)) int catcher(int x){ try { return thrower(x)+1; } catch(int v){ return -v; } }
__attribute__((noinline)) int mid(int x){ int r = catcher(x); return r*2; }
__attribute__((noinline)) int outer_tail(int x){ return mid(x+1); }
int main(){ int a=outer_tail(0); printf("a=%d\n", a); return 0; }
"#;

/// Before: the catch re-hijacked the tail call's slot and closed `outer_tail` as unwound;
/// mid's return then found no entry for that slot (abort, exit status 134).
#[test]
fn tail_call_below_a_catch_is_not_unwound_and_the_program_runs() {
    let exe = build("g++", "tailx2.cpp", TAIL_BELOW_CATCH, &["-O2"]);
    let plain = untraced(&[&exe]);
    assert_eq!(String::from_utf8_lossy(&plain.stdout), "a=-2\n");
    let (out, text) = trace(&["-t", "function_graph", "-O", "funcgraph-retval"], &[&exe]);
    assert_eq!(out.status.code(), Some(0), "{out:?}\n{text}");
    assert_eq!(out.stdout, plain.stdout, "{text}");
    let c = calls(&text);
    // Only the frame between the throw and the catch is unwound.
    let unwound: Vec<_> = c.iter().filter(|l| l.contains("unwound")).collect();
    assert_eq!(unwound, ["} /* thrower: unwound */"], "{text}");
    for closed in [
        "} /* catcher ret=-1 */",
        "} /* mid ret=-2 */",
        "} /* outer_tail ret=-2 */",
        "} /* main ret=0x0 */",
    ] {
        assert!(c.iter().any(|l| l == closed), "{closed}:\n{text}");
    }
}

/// A tail-calling frame that stays live across several catches above it, then an exception
/// through it (Lua built as C++: each `coroutine.yield` is a throw caught in `lua_resume`,
/// then an error in the coroutine goes further).
const TAIL_THEN_THROW_THROUGH: &str = r#"
#include <cstdio>
__attribute__((noinline)) int thrower(int x){ if (x) throw x; return x; }
__attribute__((noinline)) int catcher(int x){ try { return thrower(x)+1; } catch(int v){ return -v; } }
__attribute__((noinline)) int mid(int x){
  int s = 0;
  for (int i = 0; i < 3; i++) s += catcher(x+i);
  if (x > 0) throw s;
  return s;
}
__attribute__((noinline)) int outer_tail(int x){ return mid(x+1); }
int main(){
  try { outer_tail(0); } catch (int v) { printf("caught %d\n", v); }
  try { outer_tail(5); } catch (int v) { printf("caught %d\n", v); }
  return 0;
}
"#;

/// Before: the first catch closed outer_tail's entry and left only the tail call's (whose
/// `ret` is the trampoline); the next unwinder entry "restored" the trampoline into the
/// slot, the unwinder found no FDE there: `std::terminate` (the Lua coroutine case).
#[test]
fn tail_call_frame_survives_a_catch_and_a_later_throw_through_it() {
    let exe = build("g++", "tailthrough.cpp", TAIL_THEN_THROW_THROUGH, &["-O2"]);
    let plain = untraced(&[&exe]);
    assert_eq!(
        String::from_utf8_lossy(&plain.stdout),
        "caught -6\ncaught -21\n"
    );
    let (out, text) = trace(&["-t", "function_graph", "-O", "funcgraph-retval"], &[&exe]);
    assert_eq!(out.status.code(), Some(0), "{out:?}\n{text}");
    assert_eq!(out.stdout, plain.stdout, "{text}");
    let c = calls(&text);
    let count = |s: &str| c.iter().filter(|l| *l == s).count();
    // Each outer_tail: 3 throws caught in catcher, then one through mid and outer_tail.
    assert_eq!(count("} /* thrower: unwound */"), 6, "{text}");
    assert_eq!(count("} /* mid: unwound */"), 2, "{text}");
    assert_eq!(count("} /* outer_tail: unwound */"), 2, "{text}");
    let caught = c
        .iter()
        .filter(|l| l.starts_with("} /* catcher ret=-"))
        .count();
    assert_eq!(caught, 6, "{text}");
    assert_eq!(
        c.iter().filter(|l| l.contains("unwound")).count(),
        10,
        "{text}"
    );
}

/// The reviewer's qs.cpp: a `qsort` comparator throws, the caller catches; a return event
/// on libc's qsort alone (no function_graph).
const QSORT_THROWS: &str = r#"
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
static int calls;
extern "C" __attribute__((noinline)) int cmp(const void*a,const void*b){ if(++calls==5) throw std::runtime_error("cmp"); return *(int*)a-*(int*)b; }
__attribute__((noinline)) int sorter(int *v,int n){ qsort(v,n,sizeof(int),cmp); return v[0]; }
__attribute__((noinline)) int wrap(int*v,int n){ try { return sorter(v,n); } catch(std::exception&e){ printf("caught %s after %d\n", e.what(), calls); return -5; } }
int main(){ int v[]={5,3,9,1,7,2,8}; int r=wrap(v,7); calls=100; int r2=wrap(v,7); printf("r=%d r2=%d\n", r, r2); return 0; }
"#;

#[test]
fn return_event_alone_on_qsort_survives_a_throwing_comparator() {
    let exe = build("g++", "qs.cpp", QSORT_THROWS, &["-O1"]);
    let plain = untraced(&[&exe]);
    assert!(plain.status.success());
    let (out, text) = trace(&["-e", "r:qr libc:qsort ret=$retval"], &[&exe]);
    assert_eq!(out.status.code(), Some(0), "{out:?}\n{text}");
    assert_eq!(out.stdout, plain.stdout, "{text}");
    // The unwound qsort did not return: only the second one is reported.
    let hits: Vec<_> = events(&text).filter(|l| l.contains(" qr: (")).collect();
    assert_eq!(hits.len(), 1, "{text}");
    assert!(hits[0].contains("(sorter+"), "{text}");
}

/// The reviewer's bt.c: `backtrace()` under a return event on its caller's caller.
const BACKTRACE: &str = r#"
#include <stdio.h>
#include <execinfo.h>
__attribute__((noinline)) int bt(void){ void *b[32]; int n=backtrace(b,32); char**s=backtrace_symbols(b,n); for(int i=0;i<n;i++) printf("  %s\n", s[i]); return n; }
__attribute__((noinline)) int b2(void){ return bt()+0; }
__attribute__((noinline)) int b1(void){ return b2()+0; }
int main(){ int n=b1(); printf("frames=%d\n", n); n=b1(); printf("frames=%d\n", n); return 0; }
"#;

#[test]
fn return_event_alone_keeps_backtrace_whole() {
    let exe = build("gcc", "bt.c", BACKTRACE, &["-O1", "-rdynamic"]);
    let plain = untraced(&[&exe]);
    let (out, text) = trace(&["-e", "r:b b2 $retval"], &[&exe]);
    assert_eq!(out.status.code(), Some(0), "{out:?}\n{text}");
    // Addresses of libc differ between runs (ASLR): compare the frames' names.
    let names = |o: &[u8]| -> Vec<String> {
        String::from_utf8_lossy(o)
            .lines()
            .map(|l| l.split(" [").next().unwrap().to_owned())
            .collect()
    };
    assert_eq!(names(&out.stdout), names(&plain.stdout), "{text}");
    assert!(String::from_utf8_lossy(&plain.stdout).contains("(main+"));
    let hits = events(&text).filter(|l| l.contains(" b: (b1+")).count();
    assert_eq!(hits, 2, "{text}");
}

/// `f` called from `main`, both traced: each entry of `f` asks for its parent's data.
const LOOP: &str = r#"
#include <stdio.h>
#include <stdlib.h>
__attribute__((noinline)) int f(int x){ __asm__ volatile(""); return x+1; }
int main(int c,char**v){ long n=c>1?atol(v[1]):1000000, s=0; for(long i=0;i<n;i++) s+=f(i); printf("s=%ld\n",s); }
"#;

/// `strace -f -c -e trace=sigaltstack` of a run: how many `sigaltstack` calls it made.
fn sigaltstack_calls(args: &[&str], exe: &str, n: &str) -> Option<u64> {
    let out = std::process::Command::new("strace")
        .args(["-f", "-c", "-e", "trace=sigaltstack"])
        .arg(env!("CARGO_BIN_EXE_ftprobe"))
        .arg("trace")
        .args(args)
        .args(["-o", "/dev/null", "--", exe, n])
        .output()
        .ok()?;
    assert!(out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    // `% time seconds usecs/call calls [errors] syscall`: the calls column.
    err.lines()
        .find(|l| l.trim_end().ends_with(" sigaltstack"))
        .and_then(|l| l.split_whitespace().nth(3)?.parse().ok())
}

/// Before: one `sigaltstack` system call per traced call made inside another traced call
/// (the signal stack was asked for at each nested entry): 100003 for 100000 calls of `f`.
#[test]
fn nested_traced_calls_make_no_sigaltstack_system_call() {
    let exe = build("gcc", "loop.c", LOOP, &["-O2"]);
    if std::process::Command::new("strace")
        .arg("-V")
        .output()
        .is_err()
    {
        eprintln!("skipped: no strace");
        return;
    }
    let calls = 100_000u64;
    let n = calls.to_string();
    let graph = sigaltstack_calls(&["-t", "function_graph"], &exe, &n).unwrap();
    // The CLI's own (Rust's main thread sets one up: never 0) and one per traced thread;
    // not one per call.
    assert!(
        graph > 0 && graph < 20,
        "{graph} sigaltstack calls for {calls} calls"
    );
    let depth1 = sigaltstack_calls(&["-t", "function_graph", "--max-depth", "1"], &exe, &n);
    assert!(depth1.is_some_and(|d| d < 20), "{depth1:?}");
}

/// Three calls of a leaf in `main`, then three in a new thread (each thread's first traced
/// call is the one that claims its ring).
const FIRST_CALLS: &str = r#"
#include <stdio.h>
#include <pthread.h>
static volatile int v;
__attribute__((noinline)) int leaf(int x){ v++; return x; }
static void *three(void *a){ for(int i=0;i<3;i++) leaf(i); return a; }
int main(){ three(0); pthread_t t; pthread_create(&t, 0, three, 0); pthread_join(t, 0); printf("v=%d\n", v); return 0; }
"#;

/// The durations (ns) of the graph's `leaf();` lines, in order.
fn leaf_durations(text: &str) -> Vec<u64> {
    events(text)
        .filter(|l| l.ends_with("leaf();"))
        .map(|l| {
            let left = l.rsplit('|').nth(1).expect(l);
            let w: Vec<_> = left.split_whitespace().collect();
            let i = w.iter().position(|x| *x == "us").expect(l);
            (w[i - 1].parse::<f64>().expect(l) * 1000.0) as u64
        })
        .collect()
}

/// Before: each thread's first traced call was charged the claim of its ring and the first
/// page faults (24-40 us against 0.1-0.3 us for the next calls).
#[test]
fn first_traced_call_of_a_thread_is_not_charged_the_tracer_setup() {
    let exe = build("gcc", "first.c", FIRST_CALLS, &["-O1", "-pthread"]);
    let plain = untraced(&[&exe]);
    assert_eq!(String::from_utf8_lossy(&plain.stdout), "v=6\n");
    // The smallest of three runs, per position: a loaded machine may preempt one call, the
    // set-up is in every run.
    let mut best = [u64::MAX; 6];
    for _ in 0..3 {
        let (out, text) = trace(&["-t", "function_graph", "-F", "leaf"], &[&exe]);
        assert_eq!(out.status.code(), Some(0), "{out:?}\n{text}");
        let d = leaf_durations(&text);
        assert_eq!(d.len(), 6, "{text}");
        for (b, d) in best.iter_mut().zip(d) {
            *b = (*b).min(d);
        }
    }
    // A leaf that increments a variable: well under 5 us once ftprobe's set-up is out
    // (before: about 25 us in main, 8 us in the second thread).
    eprintln!("first calls {best:?} ns");
    for first in [best[0], best[3]] {
        assert!(first < 5_000, "first calls {best:?} ns");
    }
}

/// Lua 5.4's sources from the `lua-src` crate (a dependency of ftprobe-dev) in cargo's
/// registry, if there.
fn lua54_sources() -> Option<std::path::PathBuf> {
    let home = std::env::var_os("CARGO_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".cargo")))?;
    for index in std::fs::read_dir(home.join("registry/src")).ok()?.flatten() {
        for krate in std::fs::read_dir(index.path()).ok()?.flatten() {
            let name = krate.file_name();
            if name.to_string_lossy().starts_with("lua-src-") {
                let dir = krate.path().join("lua-5.4.9");
                if dir.join("ldo.c").exists() {
                    return Some(dir);
                }
            }
        }
    }
    None
}

/// Lua built as C++ (`error` and `coroutine.yield` are C++ throws caught in
/// `luaD_rawrunprotected`), one object per source file as its makefile does (so `f_call`
/// ends in a tail call to `luaD_callnoyield`), with a 5-line driver.
fn lua_as_cxx() -> Option<String> {
    let dir = lua54_sources()?;
    let files: Vec<String> = [
        "lapi", "lauxlib", "lbaselib", "lcode", "lcorolib", "lctype", "ldblib", "ldebug", "ldo",
        "ldump", "lfunc", "lgc", "linit", "liolib", "llex", "lmathlib", "lmem", "loadlib",
        "lobject", "lopcodes", "loslib", "lparser", "lstate", "lstring", "lstrlib", "ltable",
        "ltablib", "ltm", "lundump", "lutf8lib", "lvm", "lzio",
    ]
    .iter()
    .map(|f| dir.join(format!("{f}.c")).to_str().unwrap().to_owned())
    .collect();
    let driver = r#"
#include <stdio.h>
#include "lua.h"
#include "lauxlib.h"
#include "lualib.h"
int main(int argc, char **argv){ lua_State *L = luaL_newstate(); luaL_openlibs(L);
  int rc = luaL_dofile(L, argv[1]); if (rc) { fprintf(stderr, "lua error: %s\n", lua_tostring(L,-1)); }
  lua_close(L); return rc; }
"#;
    let inc = format!("-I{}", dir.display());
    let mut flags = vec!["-O2", "-w", &inc, "-x", "c++"];
    flags.extend(files.iter().map(String::as_str));
    Some(build("g++", "luaxx.cpp", driver, &flags))
}

/// Before: `pcall(error, "x")` aborted (no shadow entry for f_call's slot, which its tail
/// call to luaD_callnoyield shares), and an error in a coroutine after 5 yields reached
/// `std::terminate`.
#[test]
fn lua_as_cxx_errors_and_coroutines_run_as_untraced() {
    let Some(lua) = lua_as_cxx() else {
        eprintln!("skipped: lua-src's Lua 5.4.9 sources not found in cargo's registry");
        return;
    };
    let dir = std::path::Path::new(&lua).parent().unwrap();
    let scripts = [
        ("t3.lua", "print(pcall(error, \"x\"))\n", "false\tx\n"),
        (
            "t2.lua",
            "local co = coroutine.wrap(function(a) for i=1,5 do a = coroutine.yield(a*2) end error(\"co err\") end)\n\
             local s = 0\n\
             for i=1,5 do s = s + co(i) end\n\
             local ok2, m2 = pcall(co, 1)\n\
             print(s, ok2, m2)\n",
            "t2.lua:1: co err\n",
        ),
    ];
    let mut failed = Vec::new();
    for (name, text, want) in scripts {
        let script = dir.join(name);
        std::fs::write(&script, text).unwrap();
        let script = script.to_str().unwrap();
        let plain = untraced(&[&lua, script]);
        assert!(plain.status.success(), "{plain:?}");
        assert!(
            String::from_utf8_lossy(&plain.stdout).ends_with(want),
            "{plain:?}"
        );
        let (out, _) = trace(&["-t", "function_graph"], &[&lua, script]);
        if out.status.code() != Some(0) || out.stdout != plain.stdout {
            failed.push(format!("{name}: {out:?}"));
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
}
