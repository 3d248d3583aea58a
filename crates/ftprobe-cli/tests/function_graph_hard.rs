//! `ftprobe trace -t function_graph` end to end on the hard cases of return hooks (issue 11
//! point 2) not covered by `function_graph.rs`: pthread_exit and cancellation in a C program
//! (libgcc_s loaded only then), signal handlers at depth, coroutines, a Rust panic caught
//! through C frames, exit/fork inside a hooked call, recursion deeper than the shadow stack,
//! a stack switched by hand. Each fixture prints its own call tree (or counts); traced, its
//! output and exit status are the untraced ones, and the graph ftprobe records is that tree,
//! calls cut off marked as such.

mod common;
use common::{trace, untraced};

use ftprobe_dev::{
    fgraph_co_fixture, fgraph_deep_fixture, fgraph_exc_fixture, fgraph_panic_parts,
    fgraph_sig_fixture, fgraph_swstk_fixture, fgraph_thr_fixture,
};
use std::process::Command;

/// One event of a call tree, in order: an entry (depth, name), or a call closed without
/// returning (name, mark: `unwound`, `longjmp`, `lost`).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Ev {
    E(usize, String),
    Cut(String, String),
}

/// A graph: per task (the TASK-PID column, "" when absent), its events in order, and how
/// many calls were closed (returned or cut). Tests that count tasks trace with `-O
/// funcgraph-proc`: without it the column turns on only at the first poll that sees a second
/// thread, so the first thread's earlier lines carry no task, and where that poll falls is
/// up to the scheduler (context-switch banners are no count either: the kernel prints one
/// only when a CPU changes task).
#[derive(Debug, Default)]
struct Graph {
    tasks: Vec<(String, Vec<Ev>)>,
    entries: usize,
    closes: usize,
}

impl Graph {
    fn task(&mut self, t: &str) -> &mut Vec<Ev> {
        if let Some(i) = self.tasks.iter().position(|(n, _)| n == t) {
            return &mut self.tasks[i].1;
        }
        self.tasks.push((t.to_owned(), Vec::new()));
        &mut self.tasks.last_mut().unwrap().1
    }

    /// Every task's events, one after the other (tasks in order of first appearance).
    fn all(&self) -> Vec<Ev> {
        self.tasks.iter().flat_map(|(_, e)| e.clone()).collect()
    }
}

/// Parse `-t function_graph` output: `CPU) [TASK-PID] | DURATION | FUNCTION` lines, the
/// function column two spaces per depth after `|  `.
fn graph(text: &str) -> Graph {
    let mut g = Graph::default();
    for l in text.lines().filter(|l| !l.starts_with('#')) {
        let cols: Vec<&str> = l.split('|').collect();
        if cols.len() < 2 {
            continue; // context-switch banners
        }
        let task = if cols.len() >= 3 {
            cols[0]
                .split_once(')')
                .map_or("", |(_, t)| t.trim())
                .to_owned()
        } else {
            String::new()
        };
        let f = cols[cols.len() - 1];
        let Some(f) = f.strip_prefix("  ") else {
            continue;
        };
        let body = f.trim_start();
        let depth = (f.len() - body.len()) / 2;
        if let Some(name) = body.strip_suffix("() {") {
            g.task(&task).push(Ev::E(depth, name.to_owned()));
            g.entries += 1;
        } else if let Some(name) = body.strip_suffix("();") {
            g.task(&task).push(Ev::E(depth, name.to_owned()));
            g.entries += 1;
            g.closes += 1;
        } else if body.starts_with('}') {
            g.closes += 1;
            if let Some((name, mark)) = body
                .strip_prefix("} /* ")
                .and_then(|c| c.strip_suffix(" */"))
                .and_then(|c| c.split_once(": "))
            {
                g.task(&task)
                    .push(Ev::Cut(name.to_owned(), mark.to_owned()));
            }
        }
    }
    g
}

/// The trees a program printed: `T name` starts a thread's tree; `E depth name` is an entry,
/// `U name` a call an unwind cut off, `L name` one a longjmp cut off.
fn program_trees(stdout: &str) -> Vec<(String, Vec<Ev>)> {
    let mut trees: Vec<(String, Vec<Ev>)> = vec![(String::new(), Vec::new())];
    for l in stdout.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        match w[..] {
            ["T", name] => trees.push((name.to_owned(), Vec::new())),
            ["E", d, name] => trees
                .last_mut()
                .unwrap()
                .1
                .push(Ev::E(d.parse().unwrap(), name.to_owned())),
            ["U", name] => trees
                .last_mut()
                .unwrap()
                .1
                .push(Ev::Cut(name.to_owned(), "unwound".to_owned())),
            ["L", name] => trees
                .last_mut()
                .unwrap()
                .1
                .push(Ev::Cut(name.to_owned(), "longjmp".to_owned())),
            _ => {}
        }
    }
    trees.retain(|(_, t)| !t.is_empty());
    trees
}

/// `got == want`, else a failure that shows where they part (the trees are long).
fn assert_same_tree(got: &[Ev], want: &[Ev], what: &str) {
    if got == want {
        return;
    }
    let i = got.iter().zip(want).take_while(|(a, b)| a == b).count();
    let lo = i.saturating_sub(5);
    panic!(
        "{what}: the trees part at event {i} (graph {} events, program {}):\n \
         graph:   {:?}\n program: {:?}",
        got.len(),
        want.len(),
        &got[lo..got.len().min(i + 8)],
        &want[lo..want.len().min(i + 8)],
    );
}

/// The `DT_NEEDED` names of an ELF file.
fn needed(path: &std::path::Path) -> Vec<String> {
    use object::read::elf::{Dyn, FileHeader, SectionHeader};
    let data = std::fs::read(path).unwrap();
    let hdr = object::elf::FileHeader64::<object::Endianness>::parse(&*data).unwrap();
    let e = hdr.endian().unwrap();
    let sections = hdr.sections(e, &*data).unwrap();
    let mut out = Vec::new();
    for s in sections.iter() {
        let Ok(Some((dyns, link))) = s.dynamic(e, &*data) else {
            continue;
        };
        let strings = sections.strings(e, &*data, link).unwrap();
        for d in dyns {
            if d.tag32(e) == Some(object::elf::DT_NEEDED) {
                let name = d.string(e, strings).unwrap();
                out.push(String::from_utf8_lossy(name).into_owned());
            }
        }
    }
    out
}

#[test]
fn pthread_exit_and_cancel_in_hooked_calls_close_them_unwound() {
    let exe = fgraph_thr_fixture();
    // The C program loads libgcc_s only when its first thread exits (glibc's dlopen); the
    // agent, which needs it for its unwinder probes before main, has it as a dependency.
    assert!(
        !needed(&exe).iter().any(|n| n.starts_with("libgcc_s")),
        "{:?}",
        needed(&exe)
    );
    let bin = std::path::PathBuf::from(env!("CARGO_BIN_EXE_ftprobe"));
    let agent = ["libftprobe_agent.so", "deps/libftprobe_agent.so"]
        .iter()
        .map(|p| bin.parent().unwrap().join(p))
        .find(|p| p.exists())
        .expect("the agent next to ftprobe");
    assert!(
        needed(&agent).iter().any(|n| n == "libgcc_s.so.1"),
        "{:?}",
        needed(&agent)
    );
    let exe = exe.to_str().unwrap();
    let plain = untraced(&[exe, "4"]);
    assert!(plain.status.success(), "{plain:?}");
    let (out, text) = trace(
        &["-t", "function_graph", "-O", "funcgraph-proc"],
        &[exe, "4"],
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}\n{text}");
    assert_eq!(out.stdout, plain.stdout, "program output unchanged");
    let stdout = String::from_utf8_lossy(&plain.stdout);
    assert!(!stdout.contains("bad"), "{stdout}");
    let want = program_trees(&stdout);
    assert_eq!(want.len(), 2, "{stdout}");
    let g = graph(&text);
    // Without the thread-exit close, the frames above the cleanup handler's stay open.
    assert_eq!(g.closes, g.entries, "every call closed:\n{text}");
    assert_eq!(g.tasks.len(), want.len(), "one tree per thread:\n{text}");
    for ((_, got), (name, want)) in g.tasks.iter().zip(&want) {
        assert_same_tree(got, want, name);
    }
    // Cut calls are there, under the cleanup handler and after it.
    let cut = want[0]
        .1
        .iter()
        .filter(|e| matches!(e, Ev::Cut(..)))
        .count();
    assert_eq!(cut, 4 + 3, "{stdout}");
}

#[test]
fn signal_handlers_at_depth_nest_and_siglongjmp_out_of_them_is_marked() {
    let exe = fgraph_sig_fixture();
    let exe = exe.to_str().unwrap();
    let plain = untraced(&[exe, "1"]);
    assert!(plain.status.success(), "{plain:?}");
    let (out, text) = trace(&["-t", "function_graph"], &[exe, "1"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}\n{text}");
    assert_eq!(out.stdout, plain.stdout, "program output unchanged");
    let stdout = String::from_utf8_lossy(&plain.stdout);
    let want = program_trees(&stdout);
    let g = graph(&text);
    assert_eq!(g.closes, g.entries, "every call closed:\n{text}");
    assert_same_tree(&g.all(), &want[0].1, "the graph is the program's tree");
    let jumps = want[0]
        .1
        .iter()
        .filter(|e| matches!(e, Ev::Cut(_, m) if m == "longjmp"))
        .count();
    // Two rounds jump from the handler (its own calls returned): the recursion (100 + 1,
    // 150 + 1 calls), `spin` and the handler are cut.
    assert_eq!(jumps, 103 + 153, "{stdout}");
}

#[test]
fn coroutines_ping_ponging_between_stacks_keep_each_tree_and_lose_nothing() {
    let exe = fgraph_co_fixture();
    let exe = exe.to_str().unwrap();
    let plain = untraced(&[exe, "4"]);
    assert!(plain.status.success(), "{plain:?}");
    let (out, text) = trace(&["-t", "function_graph"], &[exe, "4"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}\n{text}");
    assert_eq!(out.stdout, plain.stdout, "program output unchanged");
    let stdout = String::from_utf8_lossy(&plain.stdout);
    let want = program_trees(&stdout);
    let g = graph(&text);
    assert_eq!(g.closes, g.entries, "every call closed:\n{text}");
    // No `lost` (or other) mark: a live call on a stack the thread left is never judged gone.
    assert_same_tree(&g.all(), &want[0].1, "the graph is the program's tree");
    assert!(g.entries > 40, "{text}");
}

/// The lines of a program's stderr, without what changes from run to run (the thread id in
/// Rust's panic message).
fn stable_lines(b: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(b)
        .lines()
        .map(|l| match (l.find(" ("), l.find(") panicked")) {
            (Some(a), Some(b)) if a < b => format!("{}{}", &l[..a], &l[b + 1..]),
            _ => l.to_owned(),
        })
        .collect()
}

#[test]
fn rust_panic_through_hooked_c_frames_caught_by_catch_unwind() {
    let (libdir, src) = fgraph_panic_parts();
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    if Command::new(&rustc).arg("--version").output().is_err() {
        eprintln!("skipped: no rustc to build the Rust program ({rustc})");
        return;
    }
    let dir = std::env::temp_dir().join(format!("ftprobe-panic-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("fgraph_panic");
    // Stable rustc: no sites in Rust code; the hooked functions are the C library's.
    let built = Command::new(&rustc)
        .args(["--edition=2021", "-g", "-Copt-level=1", "-L"])
        .arg(&libdir)
        .args(["-l", "static=fxpanic", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .unwrap();
    assert!(built.status.success(), "{built:?}");
    let exe = exe.to_str().unwrap();
    let plain = Command::new(exe)
        .arg("6")
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    assert!(plain.status.success(), "{plain:?}");
    let out = common::ftprobe()
        .args(["trace", "-t", "function_graph", "-o"])
        .arg(dir.join("trace.txt"))
        .args(["--", exe, "6"])
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    let text = std::fs::read_to_string(dir.join("trace.txt")).unwrap_or_default();
    assert_eq!(out.status.code(), Some(0), "{out:?}\n{text}");
    assert_eq!(out.stdout, plain.stdout, "program output unchanged");
    // The panic messages and backtraces (through the hooked frames: real return addresses,
    // no trampoline) are the untraced ones.
    let err = stable_lines(&plain.stderr);
    assert!(
        err.iter().any(|l| l.contains(": fx_outer")) && err.iter().any(|l| l.contains(": fx_mid")),
        "the backtrace names the hooked C frames: {err:#?}"
    );
    assert_eq!(stable_lines(&out.stderr), err, "stderr unchanged");
    let stdout = String::from_utf8_lossy(&plain.stdout);
    assert_eq!(stdout.matches("caught").count(), 4, "{stdout}");
    let want = program_trees(&stdout);
    let g = graph(&text);
    assert_eq!(g.closes, g.entries, "every call closed:\n{text}");
    // Closed unwound at the catch (the probe on `_Unwind_SetIP`): without it the last
    // round's calls stay open and the others are closed late, at the next call.
    assert_same_tree(&g.all(), &want[0].1, "the graph is the program's tree");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Return events alone (no function_graph tracer) hook returns too: a C++ exception through
/// them must not reach `std::terminate`, and each call that returned is reported once.
#[test]
fn return_events_alone_survive_exceptions_through_their_calls() {
    let exe = fgraph_exc_fixture();
    let exe = exe.to_str().unwrap();
    let plain = untraced(&[exe, "6"]);
    assert!(plain.status.success());
    let (out, text) = trace(
        &["-e", "r:mid middle $retval", "-e", "r:thr thrower"],
        &[exe, "6"],
    );
    // Without the unwinder probes: `terminate called after throwing ...`, SIGABRT.
    assert_eq!(out.status.code(), Some(0), "{out:?}\n{text}");
    assert_eq!(out.stdout, plain.stdout, "program output unchanged");
    let stdout = String::from_utf8_lossy(&plain.stdout);
    let (tree, cut) = (program_trees(&stdout), |name: &str| {
        stdout.lines().filter(|l| *l == format!("U {name}")).count()
    });
    for (event, name) in [("mid", "middle"), ("thr", "thrower")] {
        let entries = tree[0]
            .1
            .iter()
            .filter(|e| matches!(e, Ev::E(_, n) if n == name))
            .count();
        let hits = common::events(&text)
            .filter(|l| l.contains(&format!(" {event}: (")))
            .count();
        assert!(cut(name) > 0, "{stdout}");
        assert_eq!(
            hits,
            entries - cut(name),
            "{event}: one per return:\n{text}"
        );
    }
}

/// The shadow stack's size (`ftprobe::ftrace::fgraph::FGRAPH_CAPACITY`).
const SHADOW_CAPACITY: usize = 1024;

#[test]
fn recursion_deeper_than_the_shadow_stack_fork_and_exit_inside_hooked_calls() {
    let exe = fgraph_deep_fixture();
    let exe = exe.to_str().unwrap();
    let plain = untraced(&[exe, "1500"]);
    assert_eq!(plain.status.code(), Some(3), "{plain:?}");
    let (out, text) = trace(
        &["-t", "function_graph", "-O", "funcgraph-proc"],
        &[exe, "1500"],
    );
    assert_eq!(
        out.status.code(),
        Some(3),
        "exit status kept: {out:?}\n{text}"
    );
    assert_eq!(out.stdout, plain.stdout, "program output unchanged");
    let stdout = String::from_utf8_lossy(&plain.stdout);
    let trees = program_trees(&stdout);
    let tree = |name: &str| &trees.iter().find(|(n, _)| n == name).unwrap().1;
    let (parent, child) = (tree("parent"), tree("child"));
    // Hooked: the calls that found room on the shadow stack (main has no site, so depth d
    // is entry d of the thread's shadow stack); the deeper ones are the overruns.
    let hooked: Vec<Ev> = parent
        .iter()
        .filter(|e| matches!(e, Ev::E(d, _) if *d < SHADOW_CAPACITY))
        .cloned()
        .collect();
    let overruns = parent.len() - hooked.len();
    assert!(overruns > 400, "{overruns}");
    let g = graph(&text);
    assert_eq!(g.tasks.len(), 2, "parent and fork child:\n{text}");
    assert_same_tree(&g.tasks[0].1, &hooked, "parent");
    // The child's own calls, under the frames it inherited (`forker`, depth 0).
    assert_same_tree(&g.tasks[1].1, child, "child");
    // Open at exit: `finisher` (parent), `child_exit` (child); the kernel's function_graph
    // shows no end either for calls a task never left.
    assert_eq!(g.closes + 2, g.entries, "{text}");
    let line = format!("# {overruns} calls not hooked: the shadow stack was full");
    assert!(text.lines().any(|l| l == line), "want {line:?} in:\n{text}");
}

/// What the graph shows for a stack switched by hand (no API: nothing tells ftprobe): below
/// the thread's stack, the switched calls nest under their caller and the tree is exact;
/// above it, an entry there proves (by the nesting rule) that the calls live on the thread's
/// stack are gone: they are closed `lost` and kept as zombies, so that their returns, late,
/// still find their real addresses. Never a crash or a wrong return.
#[test]
fn a_stack_switched_by_hand_never_breaks_a_return() {
    let exe = fgraph_swstk_fixture();
    let exe = exe.to_str().unwrap();
    for mode in ["below", "above"] {
        let plain = untraced(&[exe, mode]);
        assert!(plain.status.success(), "{plain:?}");
        let (out, text) = trace(&["-t", "function_graph"], &[exe, mode]);
        assert_eq!(out.status.code(), Some(0), "{mode}: {out:?}\n{text}");
        assert_eq!(out.stdout, plain.stdout, "{mode}: program output unchanged");
        let stdout = String::from_utf8_lossy(&plain.stdout);
        let want = &program_trees(&stdout)[0].1;
        let g = graph(&text);
        assert_eq!(g.closes, g.entries, "{mode}: every call closed:\n{text}");
        let got = g.all();
        if mode == "below" {
            assert_same_tree(&got, want, mode);
            continue;
        }
        // Above: the same calls in the same order; the only marks are `lost`, on the calls
        // that were live on the thread's stack at a switch.
        let names = |t: &[Ev]| -> Vec<String> {
            t.iter()
                .filter_map(|e| match e {
                    Ev::E(_, n) => Some(n.clone()),
                    Ev::Cut(..) => None,
                })
                .collect()
        };
        assert_eq!(names(&got), names(want), "{mode}:\n{text}");
        let marks: Vec<(&str, &str)> = got
            .iter()
            .filter_map(|e| match e {
                Ev::Cut(n, m) => Some((n.as_str(), m.as_str())),
                Ev::E(..) => None,
            })
            .collect();
        assert!(!marks.is_empty(), "{text}");
        assert!(
            marks
                .iter()
                .all(|(n, m)| *m == "lost" && ["switcher", "thread_fn"].contains(n)),
            "{marks:?}"
        );
    }
}
