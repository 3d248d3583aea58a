//! Objects loaded later with `dlopen` and unloaded with `dlclose` (issue 13, item 4): their
//! sites are found and converted before their constructors run, filters and kprobe events
//! that name them (pending until then) cover them, `dlclose` makes their probes `[GONE]`
//! without touching their unmapped code, and a second `dlopen` arms them again. Exact counts
//! against what `dlopen_main` (c/dlopen_main.c) prints of its own calls.

mod common;

use common::{events, trace};

/// `name=value` (a number) in the program's output.
fn field(stdout: &str, line_start: &str, name: &str) -> u64 {
    let line = stdout
        .lines()
        .find(|l| l.starts_with(line_start))
        .unwrap_or_else(|| panic!("no line {line_start:?} in {stdout}"));
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name}= in {line}"))
        .parse()
        .unwrap()
}

/// The trace's event lines split at each `mk` event (`mark(phase)`): `phases[i]` holds the
/// lines after `mark(i)` and before the next mark (`phases[0]`: before the first), the
/// function tracer's own `mark <-main` lines left out.
fn phases(text: &str) -> Vec<Vec<&str>> {
    let mut out = vec![Vec::new()];
    for l in events(text) {
        if let Some(p) = l.split(" mk: ").nth(1) {
            let phase = p.rsplit("phase=0x").next().unwrap();
            let phase = usize::from_str_radix(phase, 16).unwrap();
            assert_eq!(phase, out.len(), "marks in order: {text}");
            out.push(Vec::new());
            continue;
        }
        if !l.contains(": mark <-") {
            out.last_mut().unwrap().push(l);
        }
    }
    out
}

/// The `arg=` values of the `dw` events among `lines`, in order.
fn dw_args(lines: &[&str]) -> Vec<u64> {
    lines
        .iter()
        .filter_map(|l| l.split(" dw: ").nth(1))
        .map(|e| u64::from_str_radix(e.rsplit("arg=0x").next().unwrap(), 16).unwrap())
        .collect()
}

/// The `# kprobes/list:` blocks of the trace, in order, each as its probe lines.
fn listings(text: &str) -> Vec<Vec<&str>> {
    let mut out: Vec<Vec<&str>> = Vec::new();
    let mut in_list = false;
    for l in text.lines() {
        if l == "# kprobes/list:" {
            out.push(Vec::new());
            in_list = true;
        } else if in_list && l.starts_with("#   ") {
            out.last_mut().unwrap().push(l);
        } else {
            in_list = false;
        }
    }
    out
}

/// The hits of `event` in the `# kprobe_profile:` lines.
fn profile_hits(text: &str, event: &str) -> u64 {
    let at = text.find("# kprobe_profile:").expect("a kprobe_profile");
    text[at..]
        .lines()
        .find_map(|l| {
            let mut w = l.trim_start_matches('#').split_whitespace();
            (w.next() == Some(event)).then(|| w.next().unwrap().parse().unwrap())
        })
        .unwrap_or_else(|| panic!("no {event} in the profile: {text}"))
}

/// A library loaded with `dlopen`, called, unloaded and loaded again: the function tracer
/// (`-F dl_work:mod:libdlfix.so`, given before the library exists) and a kprobe event on
/// `libdlfix.so:dl_work` (pending until then) see every call of both load periods, the three
/// of its constructor included (they run inside `dlopen`, before it returns), with exact
/// arguments; between `dlclose` and the second `dlopen` nothing is recorded from it and the
/// probe is listed `[GONE]`; after the second `dlopen` it is armed again. Before this change
/// both definitions stopped the program before `main` (no such object, no matching function).
#[test]
fn a_dlopened_library_is_traced_from_its_constructor_in_both_load_periods() {
    let prog = ftprobe_dev::dlopen_main_fixture();
    let lib = ftprobe_dev::dlfix_lib();
    let (n, m) = (5u64, 7u64);
    let cmd = [
        prog.to_str().unwrap(),
        "cycle",
        lib.to_str().unwrap(),
        &n.to_string(),
        &m.to_string(),
    ];
    let plain = common::untraced(&cmd);
    assert!(plain.status.success(), "{plain:?}");
    let (out, text) = trace(
        &[
            "-F",
            "dl_work:mod:libdlfix.so",
            "-F",
            "mark",
            "-e",
            "p:dw libdlfix.so:dl_work arg=%di",
            "-e",
            "p:mk mark phase=%di",
        ],
        &cmd,
    );
    assert!(out.status.success(), "{out:?}\n{text}");
    assert_eq!(
        out.stdout, plain.stdout,
        "the program's output is unchanged"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    // The program's own account: unmapped after each dlclose, 3 constructor calls per load.
    assert_eq!(field(&stdout, "mapped_before", "mapped_before"), 0);
    assert_eq!(
        field(&stdout, "mapped_after_close1", "mapped_after_close1"),
        0
    );
    assert_eq!(
        field(&stdout, "mapped_after_close2", "mapped_after_close2"),
        0
    );
    let ctor1 = field(&stdout, "period1", "ctor_calls");
    let ctor2 = field(&stdout, "period2", "ctor_calls");
    assert_eq!(field(&stdout, "period1", "calls"), n);
    assert_eq!(field(&stdout, "period2", "calls"), m);
    assert_eq!((ctor1, ctor2), (3, 3));

    let ph = phases(&text);
    assert_eq!(ph.len(), 5, "mark(1) .. mark(4): {text}");
    let funcs = |lines: &[&str], parent: &str| {
        lines
            .iter()
            .filter(|l| l.contains(&format!(": dl_work <-{parent}")))
            .count() as u64
    };
    // Period 1: mark(1) .. mark(2).
    assert_eq!(funcs(&ph[1], "dl_ctor"), ctor1, "{text}");
    assert_eq!(funcs(&ph[1], "load_and_call"), n, "{text}");
    let want1: Vec<u64> = (0..ctor1).chain(100..100 + n).collect();
    assert_eq!(dw_args(&ph[1]), want1, "{text}");
    // Unloaded: mark(2) .. mark(3) holds nothing.
    assert!(ph[2].is_empty(), "{text}");
    // Period 2: mark(3) .. mark(4), the library loaded again.
    assert_eq!(funcs(&ph[3], "dl_ctor"), ctor2, "{text}");
    assert_eq!(funcs(&ph[3], "load_and_call"), m, "{text}");
    let want2: Vec<u64> = (0..ctor2).chain(200..200 + m).collect();
    assert_eq!(dw_args(&ph[3]), want2, "{text}");
    assert!(ph[0].is_empty() && ph[4].is_empty(), "{text}");
    assert_eq!(profile_hits(&text, "dw"), ctor1 + n + ctor2 + m, "{text}");

    // The armed-probes listings: at start the probe waits (not listed, as a kernel probe on
    // a module not loaded); then armed, GONE, armed, GONE.
    let lists = listings(&text);
    let dw: Vec<Option<&str>> = lists
        .iter()
        .map(|l| {
            l.iter()
                .copied()
                .find(|p| p.contains("dl_work+0x0  libdlfix.so"))
        })
        .collect();
    assert_eq!(dw.len(), 5, "{text}");
    assert_eq!(dw[0], None, "{text}");
    for (i, gone) in [(1, false), (2, true), (3, false), (4, true)] {
        let line = dw[i].unwrap_or_else(|| panic!("listing {i} has dl_work: {text}"));
        assert_eq!(line.contains("[GONE]"), gone, "listing {i}: {text}");
        assert!(line.contains("[FTRACE]"), "{text}");
    }
    assert!(
        lists
            .iter()
            .all(|l| l.iter().any(|p| p.contains("mark+0x0"))),
        "{text}"
    );
}

/// `dlopen_main cycle LIB N M` traced with `events`: the trace's output and text, and the
/// calls of `dl_work` the program made (its own counts), checked against `N` and `M`.
fn traced_cycle(lib: &str, n: u64, m: u64, events: &[&str]) -> (String, u64) {
    let prog = ftprobe_dev::dlopen_main_fixture();
    let (n_arg, m_arg) = (n.to_string(), m.to_string());
    let cmd = [prog.to_str().unwrap(), "cycle", lib, &n_arg, &m_arg];
    let plain = common::untraced(&cmd);
    let (out, text) = trace(events, &cmd);
    assert!(out.status.success(), "{out:?}\n{text}");
    assert_eq!(out.stdout, plain.stdout);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let want = field(&stdout, "period1", "ctor_calls")
        + field(&stdout, "period1", "calls")
        + field(&stdout, "period2", "ctor_calls")
        + field(&stdout, "period2", "calls");
    assert_eq!(want, 3 + n + 3 + m);
    (text, want)
}

/// A kprobe event alone (no function tracer) on a library that is not loaded yet is
/// accepted and hits exactly once loaded; one naming an object that is never loaded waits
/// and records nothing, and the program runs as untraced.
#[test]
fn a_probe_on_an_object_not_loaded_yet_waits_for_it() {
    let lib = ftprobe_dev::dlfix_lib();
    let (text, want) = traced_cycle(
        lib.to_str().unwrap(),
        11,
        2,
        &[
            "-e",
            "p:dw libdlfix.so:dl_work arg=%di",
            "-e",
            "p:never libnothere.so:nothing",
        ],
    );
    let all: Vec<&str> = events(&text).collect();
    assert_eq!(dw_args(&all).len() as u64, want, "{text}");
    assert_eq!(profile_hits(&text, "dw"), want, "{text}");
    assert!(!text.contains(" never: "), "{text}");
    assert_eq!(profile_hits(&text, "never"), 0, "{text}");
}

/// A probe on a library with no ftrace site, loaded later: the agent reads only the
/// library's headers and string tables at the `dlopen` (issue 25, item 8) and its symbols
/// when the pending probe asks for `dl_work`; the probe hits once per call, with its
/// argument, in both load periods.
#[test]
fn a_probe_on_a_library_without_sites_finds_its_symbol_after_the_dlopen() {
    let lib = ftprobe_dev::dlplain_lib();
    let (text, want) = traced_cycle(
        lib.to_str().unwrap(),
        5,
        4,
        &["-e", "p:dw libdlplain.so:dl_work arg=%di"],
    );
    let all: Vec<&str> = events(&text).collect();
    let mut args = dw_args(&all);
    assert_eq!(args.len() as u64, want, "{text}");
    args.sort_unstable();
    // The constructor's 0, 1, 2 in each period; main's calls pass 100 + i, then 200 + i.
    let mut expect: Vec<u64> = (0..3).chain(100..105).chain(0..3).chain(200..204).collect();
    expect.sort_unstable();
    assert_eq!(args, expect, "{text}");
    assert_eq!(profile_hits(&text, "dw"), want, "{text}");
}

/// A second thread calls into one library (traced, and probed) the whole time the main
/// thread loads, calls and unloads another one 50 times: the engine's tables change under
/// the running thread, whose every call is still recorded once (the program's own count),
/// and each load of the other library is traced from its constructor.
#[test]
fn a_thread_calls_a_traced_library_while_another_is_loaded_and_unloaded() {
    let prog = ftprobe_dev::dlopen_main_fixture();
    let lib = ftprobe_dev::dlfix_lib();
    let lib2 = ftprobe_dev::dlfix2_lib();
    let loads = 50u64;
    let cmd = [
        prog.to_str().unwrap(),
        "threads",
        lib.to_str().unwrap(),
        lib2.to_str().unwrap(),
        "20000",
        &loads.to_string(),
    ];
    let (out, text) = trace(
        &[
            "-F",
            "*_work:mod:libdlfix*",
            "-e",
            "p:dw libdlfix.so:dl_work arg=%di",
        ],
        &cmd,
    );
    assert!(out.status.success(), "{out:?}\n{text}");
    assert!(text.contains("# lost events: 0\n"), "{text}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let thread_calls = field(&stdout, "thread_calls", "thread_calls");
    assert!(thread_calls >= 20000);
    assert_eq!(field(&stdout, "thread_calls", "lib2_calls"), loads);
    let count = |pat: &str| events(&text).filter(|l| l.contains(pat)).count() as u64;
    // libdlfix.so: its constructor's 3 calls, then the thread's.
    assert_eq!(count(": dl_work <-dl_ctor"), 3, "{text}");
    assert_eq!(count(": dl_work <-worker_main"), thread_calls);
    assert_eq!(count(" dw: "), 3 + thread_calls);
    assert_eq!(profile_hits(&text, "dw"), 3 + thread_calls);
    // libdlfix2.so: 3 constructor calls and one from main per load.
    assert_eq!(count(": dl2_work <-dl2_ctor"), 3 * loads, "{text}");
    assert_eq!(count(": dl2_work <-main"), loads, "{text}");

    // The same under the function_graph tracer: the probe path's site table is replaced at
    // each load and unload while the thread's calls look their sites up in it.
    let (out, text) = trace(
        &["-t", "function_graph", "-F", "*_work:mod:libdlfix*"],
        &cmd,
    );
    assert!(out.status.success(), "{out:?}\n{text}");
    assert!(text.contains("# lost events: 0\n"), "{text}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let thread_calls = field(&stdout, "thread_calls", "thread_calls");
    // A call is a leaf line, or an opening line when the thread was descheduled inside it
    // longer than the live trace waits for its return (a loaded machine: issue 31).
    let count = |f: &str| {
        events(&text)
            .filter(|l| l.ends_with(&format!(" {f}();")) || l.ends_with(&format!(" {f}() {{")))
            .count() as u64
    };
    assert_eq!(count("dl_work"), 3 + thread_calls);
    assert_eq!(count("dl2_work"), 4 * loads);
}

/// The function_graph tracer (`-F '*:mod:libdlfix.so'`, pending at start) draws each load's
/// calls, the constructor's under `dl_ctor`, and a return probe given before the library is
/// loaded sees every return with its value (`dl_work(x)` returns `2x + 1`).
#[test]
fn function_graph_and_return_probes_cover_a_dlopened_library() {
    let prog = ftprobe_dev::dlopen_main_fixture();
    let lib = ftprobe_dev::dlfix_lib();
    let cmd = [
        prog.to_str().unwrap(),
        "cycle",
        lib.to_str().unwrap(),
        "2",
        "1",
    ];
    let (out, text) = trace(
        &[
            "-t",
            "function_graph",
            "-F",
            "*:mod:libdlfix.so",
            "-F",
            "load_and_call",
        ],
        &cmd,
    );
    assert!(out.status.success(), "{out:?}\n{text}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let ctor = field(&stdout, "period1", "ctor_calls") + field(&stdout, "period2", "ctor_calls");
    let calls = field(&stdout, "period1", "calls") + field(&stdout, "period2", "calls");
    let count = |pat: &str| events(&text).filter(|l| l.ends_with(pat)).count() as u64;
    assert_eq!(count("load_and_call() {"), 2, "{text}");
    assert_eq!(count("  dl_ctor() {"), 2, "{text}");
    assert_eq!(count("dl_work();"), ctor + calls, "{text}");

    let (out, text) = trace(&["-e", "r:dr libdlfix.so:dl_work ret=$retval"], &cmd);
    assert!(out.status.success(), "{out:?}\n{text}");
    let rets: Vec<String> = events(&text)
        .filter_map(|l| l.split(" dr: ").nth(1))
        .map(|e| e.rsplit(") ").next().unwrap().to_owned())
        .collect();
    let want: Vec<String> = [0u64, 1, 2, 100, 101, 0, 1, 2, 200]
        .iter()
        .map(|x| format!("ret={:#x}", 2 * x + 1))
        .collect();
    assert_eq!(rets, want, "{text}");
}

/// `dlmopen` into a new namespace (with its own copy of libc): the library is found there
/// too (the loader's lists of the other namespaces; `dl_iterate_phdr` reports only its
/// caller's), traced from its constructor on, and GONE after `dlclose`.
#[test]
fn a_library_loaded_in_a_new_namespace_with_dlmopen_is_traced() {
    let prog = ftprobe_dev::dlopen_main_fixture();
    let lib = ftprobe_dev::dlfix_lib();
    let cmd = [
        prog.to_str().unwrap(),
        "dlmopen",
        lib.to_str().unwrap(),
        "4",
    ];
    let (out, text) = trace(
        &[
            "-F",
            "dl_work:mod:libdlfix.so",
            "-e",
            "p:dw libdlfix.so:dl_work arg=%di",
        ],
        &cmd,
    );
    assert!(out.status.success(), "{out:?}\n{text}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let ctor = field(&stdout, "dlmopen", "ctor_calls");
    let calls = field(&stdout, "dlmopen", "calls");
    assert_eq!((ctor, calls), (3, 4));
    let all: Vec<&str> = events(&text).collect();
    let want: Vec<u64> = (0..ctor).chain(300..300 + calls).collect();
    assert_eq!(dw_args(&all), want, "{text}");
    let count = |pat: &str| all.iter().filter(|l| l.contains(pat)).count() as u64;
    assert_eq!(count(": dl_work <-dl_ctor"), ctor, "{text}");
    assert_eq!(count(": dl_work <-main"), calls, "{text}");
    let lists = listings(&text);
    assert!(
        lists.last().is_some_and(|l| l
            .iter()
            .any(|p| p.contains("dl_work+0x0  libdlfix.so [GONE]"))),
        "{text}"
    );
}

/// uftrace's `s-dlopen` shape: `main` loads `libfirst.so`, calls `lib_first` twice, unloads
/// it, loads `libsecond.so` (same size and layout: the loader maps it where the first one
/// was) and calls `lib_second` three times, unloads it, loads `libfirst.so` again and calls
/// `lib_first` twice more (`argv[3]` and `argv[4]`, when given, name the two functions
/// instead). Prints `same` when the three loads put the functions at one address.
const SAME_PLACE_MAIN: &str = r#"
#include <dlfcn.h>
#include <stdio.h>
typedef int (*fn)(int);
static fn load(const char *lib, const char *name, void **h)
{
	*h = dlopen(lib, RTLD_NOW);
	if (!*h) {
		fprintf(stderr, "%s\n", dlerror());
		return 0;
	}
	return (fn)dlsym(*h, name);
}
int main(int argc, char **argv)
{
	void *h;
	const char *first_name = argc > 4 ? argv[3] : "lib_first";
	const char *second_name = argc > 4 ? argv[4] : "lib_second";
	fn f = load(argv[1], first_name, &h);
	if (!f)
		return 1;
	int s = f(1) + f(2);
	void *first = (void *)f;
	dlclose(h);
	fn g = load(argv[2], second_name, &h);
	if (!g)
		return 1;
	s += g(1) + g(2) + g(3);
	void *second = (void *)g;
	dlclose(h);
	f = load(argv[1], first_name, &h);
	if (!f)
		return 1;
	s += f(3) + f(4);
	printf("%s %d\n", first == second && (void *)f == first ? "same" : "apart", s);
	dlclose(h);
	return 0;
}
"#;

/// A program with no sites of its own whose only sites are in a library it `dlopen`s
/// (found by a fresh user's review): `-F 'FUNC:mod:LIB'` was refused at start ("no function
/// of this program or its libraries has an ftrace site"), although the kernel keeps a
/// `:mod:` filter for a module loaded later. Now the filter waits for the library: both
/// load periods of `libfirst.so` are traced, in the function tracer and function_graph.
#[test]
fn a_program_whose_only_sites_are_in_a_dlopened_library_is_traced_by_mod_filter() {
    let dir = common::tmp_dir("only-lib-sites");
    for (lib, name) in [("libfirst.so", "lib_first"), ("libsecond.so", "lib_second")] {
        build_lib(&dir, lib, &same_place_lib(name));
    }
    let main = common::build_at_test_time("cc", "no_sites.c", SAME_PLACE_MAIN, &["-O1", "-ldl"])
        .expect("cc builds the program");
    let (first, second) = (dir.join("libfirst.so"), dir.join("libsecond.so"));
    let cmd = [
        main.to_str().unwrap(),
        first.to_str().unwrap(),
        second.to_str().unwrap(),
    ];
    let (out, text) = trace(&["-F", "lib_first:mod:libfirst.so"], &cmd);
    assert!(out.status.success(), "{out:?}");
    let calls = events(&text)
        .filter(|l| l.contains(": lib_first <-"))
        .count();
    assert_eq!(calls, 4, "trace:\n{text}");
    let (out, text) = trace(
        &["-t", "function_graph", "-F", "lib_first:mod:libfirst.so"],
        &cmd,
    );
    assert!(out.status.success(), "{out:?}");
    let calls = text.lines().filter(|l| l.contains("lib_first();")).count();
    assert_eq!(calls, 4, "trace:\n{text}");
}

/// `report` keeps apart two libraries' functions of one name loaded one after the other at
/// one address (found by a fresh user's review: its rows were keyed by address, so one row
/// counted both), and counts one function's calls in both load periods of its library in
/// one row. `work` of `libwa.so` (4 calls) and of `libwb.so` (3 calls): two rows, each
/// named with its file, as perf report's Shared Object column.
#[test]
fn report_keeps_apart_same_named_functions_of_two_libraries_at_one_address() {
    let dir = common::tmp_dir("same-name");
    for (lib, k) in [("libwa.so", 3), ("libwb.so", 5)] {
        build_lib(
            &dir,
            lib,
            &format!("int work(int x) {{ return x * {k} + 1; }}\n"),
        );
    }
    let main = common::build_at_test_time("cc", "no_sites.c", SAME_PLACE_MAIN, &["-O1", "-ldl"])
        .expect("cc builds the program");
    let (wa, wb) = (dir.join("libwa.so"), dir.join("libwb.so"));
    let cmd = [
        main.to_str().unwrap(),
        wa.to_str().unwrap(),
        wb.to_str().unwrap(),
        "work",
        "work",
    ];
    let rec = dir.join("rec");
    let args = ["-F", "work:mod:libwa.so", "-F", "work:mod:libwb.so"];
    for tracer in ["function", "function_graph"] {
        let targs: Vec<&str> = ["-t", tracer].into_iter().chain(args).collect();
        let o = common::record_to(&rec, &targs, cmd);
        assert!(o.status.success(), "{o:?}");
        let stdout = String::from_utf8_lossy(&o.stdout);
        if !stdout.starts_with("same ") {
            eprintln!("skipped: the loader put the second library elsewhere: {stdout}");
            return;
        }
        let report = common::ftprobe()
            .args(["report", "-d"])
            .arg(&rec)
            .output()
            .unwrap();
        let r = String::from_utf8_lossy(&report.stdout);
        let calls_of = |f: &str| {
            r.lines()
                .find(|l| l.ends_with(f))
                .and_then(|l| l.split_whitespace().find_map(|w| w.parse::<u64>().ok()))
        };
        assert_eq!(
            (calls_of("work [libwa.so]"), calls_of("work [libwb.so]")),
            (Some(4), Some(3)),
            "{tracer} report:\n{r}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Build the shared library `dir/lib` from C source `src`, with sites
/// (`-fpatchable-function-entry=5`).
fn build_lib(dir: &std::path::Path, lib: &str, src: &str) {
    let file = dir.join(format!("{lib}.c"));
    std::fs::write(&file, src).unwrap();
    let ok = std::process::Command::new("cc")
        .args(["-O1", "-fPIC", "-shared", "-fpatchable-function-entry=5"])
        .arg(&file)
        .arg("-o")
        .arg(dir.join(lib))
        .status()
        .unwrap()
        .success();
    assert!(ok, "cc {lib}");
}

fn same_place_lib(name: &str) -> String {
    format!("int {name}(int x) {{ return x * 3 + 1; }}\n")
}

/// Issue 26, item 10 (uftrace's `s-dlopen`): a library unloaded and another loaded at the
/// same address: each names its own calls. The objects table only grows and the last entry
/// covering an address named it whatever the record's time, so `lib_first`'s calls were
/// shown as `lib_second`. Entries now carry when they were added and a record resolves
/// among those added by its timestamp: in `trace`, in `replay` and in `report` of a
/// recording (whose object entries kept, at first, the time of a file's first load for
/// its later loads: found by a fresh user's review).
#[test]
fn a_library_loaded_where_an_unloaded_one_was_names_only_its_own_calls() {
    let dir = common::tmp_dir("same-place");
    for (lib, name) in [("libfirst.so", "lib_first"), ("libsecond.so", "lib_second")] {
        build_lib(&dir, lib, &same_place_lib(name));
    }
    let main = common::build_at_test_time(
        "cc",
        "same_place.c",
        SAME_PLACE_MAIN,
        &["-O1", "-fpatchable-function-entry=5", "-ldl"],
    )
    .expect("cc builds the program");
    let (first, second) = (dir.join("libfirst.so"), dir.join("libsecond.so"));
    let cmd = [
        main.to_str().unwrap(),
        first.to_str().unwrap(),
        second.to_str().unwrap(),
    ];
    let filters = [
        "-F",
        "lib_first:mod:libfirst.so",
        "-F",
        "lib_second:mod:libsecond.so",
    ];
    let (out, text) = trace(&filters, &cmd);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    if !stdout.starts_with("same ") {
        eprintln!("skipped: the loader put the second library elsewhere: {stdout}");
        return;
    }
    let count = |t: &str, f: &str| {
        events(t)
            .filter(|l| l.contains(&format!(": {f} <-")))
            .count()
    };
    assert_eq!(
        (count(&text, "lib_first"), count(&text, "lib_second")),
        (4, 3),
        "trace:\n{text}"
    );
    // A recording, read by replay and report.
    let rec = dir.join("rec");
    let graph: Vec<&str> = ["-t", "function_graph"]
        .into_iter()
        .chain(filters)
        .collect();
    let o = common::record_to(&rec, &graph, cmd);
    assert!(o.status.success(), "{o:?}");
    let replay = common::ftprobe()
        .args(["replay", "-d"])
        .arg(&rec)
        .output()
        .unwrap();
    let r = String::from_utf8_lossy(&replay.stdout);
    let calls = |r: &str, f: &str| r.lines().filter(|l| l.contains(&format!("{f}();"))).count();
    assert_eq!(
        (calls(&r, "lib_first"), calls(&r, "lib_second")),
        (4, 3),
        "replay:\n{r}"
    );
    // `replay -F` selects by the same names (it named an address by the library loaded
    // there last: `-F lib_second` showed nothing, `-F lib_first` all 7 calls; found by a
    // fresh user's review).
    for (f, want) in [("lib_first", (4, 0)), ("lib_second", (0, 3))] {
        let replay = common::ftprobe()
            .args(["replay", "-F", f, "-d"])
            .arg(&rec)
            .output()
            .unwrap();
        let r = String::from_utf8_lossy(&replay.stdout);
        assert_eq!(
            (calls(&r, "lib_first"), calls(&r, "lib_second")),
            want,
            "replay -F {f}:\n{r}"
        );
    }
    let report = common::ftprobe()
        .args(["report", "-d"])
        .arg(&rec)
        .output()
        .unwrap();
    let r = String::from_utf8_lossy(&report.stdout);
    let calls_of = |f: &str| {
        r.lines()
            .find(|l| l.split_whitespace().last() == Some(f))
            .and_then(|l| {
                // The calls column: the first plain number of the line.
                l.split_whitespace().find_map(|w| w.parse::<u64>().ok())
            })
    };
    assert_eq!(
        (calls_of("lib_first"), calls_of("lib_second")),
        (Some(4), Some(3)),
        "report:\n{r}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
