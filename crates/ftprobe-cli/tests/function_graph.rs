//! `ftprobe trace -t function_graph` end to end on programs that do what breaks return
//! hooks elsewhere (exceptions, longjmp): each fixture prints its own call tree; traced, its
//! output and exit status are the untraced ones, and the graph ftprobe records is that tree.

mod common;
use common::{trace, untraced};

use ftprobe_dev::{fgraph_exc_fixture, fgraph_jmp_fixture};

/// One call of the graph: (depth, function name), in entry order; and the marks of calls
/// closed without returning (`unwound`, `longjmp`, `lost`) by name.
struct Graph {
    entries: Entries,
    marks: Vec<(String, String)>,
    closes: usize,
}

/// Parse the function column of `-t function_graph` output (after `|  `, two columns per
/// depth): `name() {`, `name();`, `}` and `} /* name: mark */`.
fn graph(text: &str) -> Graph {
    let mut g = Graph {
        entries: Vec::new(),
        marks: Vec::new(),
        closes: 0,
    };
    for l in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((_, f)) = l.split_once("|  ") else {
            continue;
        };
        let body = f.trim_start();
        let depth = (f.len() - body.len()) / 2;
        if let Some(name) = body.strip_suffix("() {") {
            g.entries.push((depth, name.to_owned()));
        } else if let Some(name) = body.strip_suffix("();") {
            g.entries.push((depth, name.to_owned()));
            g.closes += 1;
        } else if body.starts_with('}') {
            g.closes += 1;
            if let Some(c) = body
                .strip_prefix("} /* ")
                .and_then(|c| c.strip_suffix(" */"))
            {
                if let Some((name, mark)) = c.split_once(": ") {
                    g.marks.push((name.to_owned(), mark.to_owned()));
                }
            }
        }
    }
    g
}

/// Calls in entry order: (depth, name).
type Entries = Vec<(usize, String)>;

/// The tree the program printed: `E depth name` lines, shifted one level (under `main`),
/// and the other lines' first word and argument.
fn program_tree(stdout: &str) -> (Entries, Vec<(String, String)>) {
    let mut entries = vec![(0, "main".to_owned())];
    let mut other = Vec::new();
    for l in stdout.lines() {
        let mut w = l.split_whitespace();
        match (w.next(), w.next(), w.next()) {
            (Some("E"), Some(d), Some(name)) => {
                entries.push((d.parse::<usize>().unwrap() + 1, name.to_owned()))
            }
            (Some(k @ ("U" | "J")), Some(x), None) => other.push((k.to_owned(), x.to_owned())),
            _ => {}
        }
    }
    (entries, other)
}

#[test]
fn cxx_exceptions_through_hooked_frames_keep_the_program_and_its_tree() {
    let exe = fgraph_exc_fixture();
    let exe = exe.to_str().unwrap();
    let plain = untraced(&[exe, "6"]);
    assert!(plain.status.success());
    let (out, text) = trace(
        &["-t", "function_graph", "-N", "std::*", "-N", "_GLOBAL_*"],
        &[exe, "6"],
    );
    // Without the unwinder probes: `terminate called after throwing ...`, SIGABRT.
    assert_eq!(out.status.code(), Some(0), "{out:?}\n{text}");
    assert_eq!(out.stdout, plain.stdout, "program output unchanged");
    let stdout = String::from_utf8_lossy(&plain.stdout);
    // backtrace() saw real return addresses through the hooked frames.
    assert!(
        stdout.starts_with("bt: bt bt_mid bt_top main (deep)\n"),
        "{stdout}"
    );
    let (entries, unwound) = program_tree(&stdout);
    let g = graph(&text);
    assert_eq!(
        g.entries, entries,
        "the graph is the program's tree:\n{text}"
    );
    assert_eq!(g.closes, g.entries.len(), "every call closed:\n{text}");
    // The calls an exception cut off, in the order the program saw their frames go.
    let want: Vec<(String, String)> = unwound
        .iter()
        .map(|(_, name)| (name.clone(), "unwound".to_owned()))
        .collect();
    assert_eq!(g.marks, want, "{text}");
    assert!(!want.is_empty());
}

#[test]
fn longjmp_siglongjmp_and_longjmp_chk_close_the_calls_they_leave() {
    let exe = fgraph_jmp_fixture();
    let exe = exe.to_str().unwrap();
    let plain = untraced(&[exe, "4"]);
    assert!(plain.status.success());
    let (out, text) = trace(&["-t", "function_graph", "-N", "note"], &[exe, "4"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}\n{text}");
    assert_eq!(out.stdout, plain.stdout, "program output unchanged");
    let stdout = String::from_utf8_lossy(&plain.stdout);
    let (entries, jumps) = program_tree(&stdout);
    let g = graph(&text);
    assert_eq!(
        g.entries, entries,
        "the graph is the program's tree:\n{text}"
    );
    assert_eq!(g.closes, g.entries.len(), "every call closed:\n{text}");
    let cut: usize = jumps.iter().map(|(_, n)| n.parse::<usize>().unwrap()).sum();
    assert!(cut > 0);
    assert!(g.marks.iter().all(|(_, m)| m == "longjmp"), "{text}");
    assert_eq!(
        g.marks.len(),
        cut,
        "one longjmp mark per call cut off:\n{text}"
    );
}
