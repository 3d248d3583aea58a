//! LLVM XRay sleds (`clang -fxray-instrument`) as ftrace sites (issue 11, point 5): a C program
//! built here with clang counts its own calls and names its own return addresses; ftprobe
//! must find its sleds as `llvm-xray extract` does, trace it with exact counts, and leave its
//! output and exit status as they are untraced. Skipped (saying why) without clang or its
//! XRay runtime.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

mod common;
use common::{build_at_test_time, events, ftprobe, trace, untraced};

/// The program, built once per test process (tests run in parallel).
fn program() -> Option<&'static str> {
    static EXE: OnceLock<Option<PathBuf>> = OnceLock::new();
    let exe = EXE.get_or_init(|| {
        build_at_test_time(
            "clang",
            "xray_calls.c",
            include_str!("xray/xray_calls.c"),
            &[
                "-O2",
                "-fxray-instrument",
                "-fxray-instruction-threshold=1",
                // dladdr names the program's functions.
                "-rdynamic",
            ],
        )
    });
    match exe {
        Some(p) => Some(p.to_str().expect("a UTF-8 temp path")),
        None => {
            eprintln!("skipped: clang -fxray-instrument could not build the program");
            None
        }
    }
}

/// The counts the program prints: `leaf=N pair=N fib=N tailer=N where=N`.
fn printed_counts(stdout: &[u8]) -> HashMap<String, usize> {
    let s = String::from_utf8_lossy(stdout);
    let line = s
        .lines()
        .find(|l| l.starts_with("leaf="))
        .unwrap_or_else(|| panic!("no counts in {s:?}"));
    line.split(' ')
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap();
            (k.to_owned(), v.parse().unwrap())
        })
        .collect()
}

/// Function tracer lines per function: `... TIMESTAMP: func <-parent`.
fn entries_by_function(text: &str) -> HashMap<String, usize> {
    let mut n = HashMap::new();
    for l in events(text) {
        let f = l.split_once(": ").unwrap().1.split(' ').next().unwrap();
        *n.entry(f.to_owned()).or_default() += 1;
    }
    n
}

/// One sled as `llvm-xray extract --symbolize` prints it: `- { id: 1, address: 0x..,
/// function: 0x.., kind: function-enter, always-instrument: false, function-name: leaf,
/// version: 2 }`.
struct Sled {
    kind: String,
    name: String,
    address: u64,
    function: u64,
}

/// The program's sled map by `llvm-xray extract`, or `None` (saying so) without llvm-xray.
fn llvm_xray_extract(exe: &str) -> Option<Vec<Sled>> {
    let Ok(extract) = Command::new("llvm-xray")
        .args(["extract", "--symbolize", exe])
        .output()
    else {
        eprintln!("skipped: llvm-xray is not installed");
        return None;
    };
    assert!(extract.status.success(), "{extract:?}");
    let text = String::from_utf8_lossy(&extract.stdout);
    let sleds = text
        .lines()
        .filter_map(|l| {
            let field = |k: &str| {
                l.split(", ")
                    .find_map(|f| f.trim_start_matches("- { ").strip_prefix(k))
                    .map(str::to_owned)
            };
            let hex = |k: &str| u64::from_str_radix(field(k)?.trim_start_matches("0x"), 16).ok();
            Some(Sled {
                kind: field("kind: ")?,
                name: field("function-name: ")?,
                address: hex("address: ")?,
                function: hex("function: ")?,
            })
        })
        .collect();
    Some(sleds)
}

const COUNTED: [&str; 5] = ["leaf", "pair", "fib", "tailer", "where"];

/// `ftprobe list functions` gives every function with an entry sled an `xray-sled` site at
/// +0x0 found in `xray_instr_map`, with the entry and exit sled counts `llvm-xray extract`
/// gives (an independent reader of the same map).
#[test]
fn list_functions_shows_the_sleds_llvm_xray_extract_shows() {
    let Some(exe) = program() else { return };
    let Some(sleds) = llvm_xray_extract(exe) else {
        return;
    };
    let mut want: HashMap<String, (usize, usize)> = HashMap::new();
    for sled in &sleds {
        let e = want.entry(sled.name.clone()).or_default();
        match sled.kind.as_str() {
            "function-enter" => e.0 += 1,
            "function-exit" | "tail-exit" => e.1 += 1,
            k => panic!("unexpected sled kind {k}"),
        }
    }
    for f in COUNTED.iter().chain(&["outer", "main"]) {
        assert!(want.contains_key(*f), "llvm-xray lists {f}: {want:?}");
    }
    // tailer's exit is its tail call.
    assert!(sleds
        .iter()
        .any(|s| s.name == "tailer" && s.kind == "tail-exit"));

    let out = ftprobe().args(["list", "functions", exe]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut got: HashMap<String, (usize, usize)> = HashMap::new();
    let mut lines = text.lines();
    assert!(lines
        .next()
        .unwrap()
        .starts_with(&format!("# {} functions", want.len())));
    assert_eq!(
        lines.next().unwrap().split_whitespace().collect::<Vec<_>>(),
        [
            "#",
            "SITE",
            "KIND",
            "PLACE",
            "FOUND",
            "IN",
            "XRAY-ENTRY",
            "XRAY-EXIT",
            "FUNCTION"
        ]
    );
    for l in lines {
        let c: Vec<&str> = l.split_whitespace().collect();
        assert_eq!(
            c[..4],
            ["+0x0", "xray-sled", "entry", "xray_instr_map"],
            "{l}"
        );
        got.insert(
            c[6].to_owned(),
            (c[4].parse().unwrap(), c[5].parse().unwrap()),
        );
    }
    assert_eq!(got, want, "{text}");
}

/// The function tracer on XRay functions: one entry per call, exactly the program's own
/// counts; the program prints the same and exits with the same status as untraced.
#[test]
fn function_tracer_counts_xray_calls_exactly() {
    let Some(exe) = program() else { return };
    let plain = untraced(&[exe, "5"]);
    let mut args = Vec::new();
    for f in COUNTED {
        args.extend(["-F", f]);
    }
    let (out, text) = trace(&args, &[exe, "5"]);
    assert_eq!(
        out.stdout,
        plain.stdout,
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), plain.status.code());
    let counts = printed_counts(&plain.stdout);
    assert_eq!(counts["leaf"], 15, "3 calls per iteration");
    let got = entries_by_function(&text);
    for f in COUNTED {
        assert_eq!(got.get(f).copied().unwrap_or(0), counts[f], "{f}:\n{text}");
    }
    assert_eq!(got.len(), COUNTED.len(), "{text}");
    // tailer jumps to leaf: leaf's caller is tailer's caller.
    assert_eq!(
        events(&text)
            .filter(|l| l.ends_with("leaf <-outer"))
            .count(),
        5,
        "{text}"
    );
}

/// A `p` kprobe event on an XRay function rides its entry sled (through ftrace): one event
/// per call with the argument the program passed; a probe inside the sled (its 9-byte NOP,
/// which the site's call overwrites) is refused.
#[test]
fn kprobe_event_on_an_xray_function() {
    let Some(exe) = program() else { return };
    let plain = untraced(&[exe, "5"]);
    let (out, text) = trace(&["-e", "p:xleaf leaf x=%di:s64"], &[exe, "5"]);
    assert_eq!(
        out.stdout,
        plain.stdout,
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), plain.status.code());
    // outer calls pair(i) -> leaf(i), leaf(i + 1) and tailer(i) -> leaf(2i).
    let mut want: Vec<i64> = (0..5).flat_map(|i| [i, i + 1, 2 * i]).collect();
    let mut got: Vec<i64> = events(&text)
        .map(|l| {
            assert!(l.contains("xleaf: (leaf+0x0/"), "{l}");
            l.rsplit_once("x=").unwrap().1.parse().unwrap()
        })
        .collect();
    want.sort_unstable();
    got.sort_unstable();
    assert_eq!(got, want, "{text}");

    let (out, _) = trace(&["-e", "p:inside leaf+2"], &[exe, "5"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("p:inside leaf+2"), "{err}");
    assert!(err.contains("not an instruction boundary"), "{err}");

    // leaf's exit sled (its `ret`), which ftprobe patches for the function_graph tracer:
    // refused, not armed under the graph's jump.
    let Some(sleds) = llvm_xray_extract(exe) else {
        return;
    };
    let exit = sleds
        .iter()
        .find(|s| s.name == "leaf" && s.kind == "function-exit")
        .expect("leaf has an exit sled");
    let def = format!("p:atexit leaf+{:#x}", exit.address - exit.function);
    let (out, _) = trace(&["-e", &def], &[exe, "5"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("XRay exit sled"), "{err}");
}

/// The function_graph tracer on an XRay program enters at the entry sleds and closes each
/// call at its exit or tail sled, without touching a return address: every call is closed,
/// once per call the program counted, nested as the program calls (`tailer` is closed at its
/// tail sled, before the `leaf` it jumps to), and the program's own view of its stack is the
/// untraced one: `where` names the function it returns into (`__builtin_return_address`) and
/// the symbols of its `backtrace()`, which a hijacked return address (the return
/// trampoline, in no symbol of the program) would change.
#[test]
fn function_graph_on_xray_sleds_leaves_return_addresses_alone() {
    let Some(exe) = program() else { return };
    let plain = untraced(&[exe, "4"]);
    let shown = String::from_utf8_lossy(&plain.stdout);
    assert!(
        shown.contains("where returns into outer\n  bt where\n  bt outer\n  bt main\n"),
        "{shown}"
    );
    let (out, text) = trace(&["-t", "function_graph"], &[exe, "4"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        shown,
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), plain.status.code());
    let counts = printed_counts(&plain.stdout);
    // ` 1)   0.932 us    |        leaf();` / `|      pair() {` / `|      }`
    let mut depth = 0usize;
    let mut calls: HashMap<String, usize> = HashMap::new();
    let mut order = Vec::new();
    for l in events(&text) {
        let body = l.split_once('|').unwrap_or_else(|| panic!("{l}")).1.trim();
        assert!(
            !body.contains("/*"),
            "a call cut off or unmatched: {l}\n{text}"
        );
        if body == "}" {
            depth = depth.checked_sub(1).unwrap_or_else(|| panic!("{text}"));
            continue;
        }
        let (name, open) = match (body.strip_suffix("() {"), body.strip_suffix("();")) {
            (Some(n), _) => (n, true),
            (_, Some(n)) => (n, false),
            _ => panic!("{l}"),
        };
        *calls.entry(name.to_owned()).or_default() += 1;
        order.push((depth, name.to_owned()));
        depth += open as usize;
    }
    assert_eq!(depth, 0, "every call closed:\n{text}");
    for f in COUNTED {
        assert_eq!(
            calls.get(f).copied().unwrap_or(0),
            counts[f],
            "{f}:\n{text}"
        );
    }
    assert_eq!((calls["main"], calls["outer"]), (1, 1), "{text}");
    // In outer (depth 2 under main): pair, then tailer closed before the leaf it jumps to,
    // a sibling.
    let at = order
        .iter()
        .position(|(d, f)| *d == 2 && f == "tailer")
        .unwrap_or_else(|| panic!("{text}"));
    assert_eq!(order[at + 1], (2, "leaf".to_owned()), "{text}");
}
