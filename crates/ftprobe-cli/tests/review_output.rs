//! Output defects found in review (issue 12), one test each: the `# kprobes/list:` blocks
//! list a kretprobe with type `r` and never the engine's own probes; `--time-range` refuses
//! mixed forms and values too large; usage errors exit with 2 (as clap's own), runtime
//! failures with 1; a `:mod:` filter naming an object not loaded is said in the header.

use std::process::Output;

mod common;
use common::{events, ftprobe, trace};

/// The `# kprobes/list:` blocks of a trace, in order, each as its probe lines.
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

/// (type, symbol) of a listing line `#   ADDR  T  SYM+0xOFF  OBJ FLAGS`.
fn kind_and_sym(line: &str) -> (&str, &str) {
    let mut w = line.trim_start_matches('#').split_whitespace();
    let _addr = w.next().unwrap();
    let kind = w.next().unwrap();
    let sym = w.next().unwrap().split('+').next().unwrap();
    (kind, sym)
}

/// A return probe is listed as the kernel lists a kretprobe, `r`; the probes the engine
/// places on libgcc_s's unwinder for its return hooks (`_Unwind_*`) are its own and never
/// listed, also in the listings written again after each dlopen/dlclose.
#[test]
fn kprobes_list_shows_kretprobes_as_r_and_hides_internal_probes() {
    let prog = ftprobe_dev::dlopen_main_fixture();
    let lib = ftprobe_dev::dlfix_lib();
    let (out, text) = trace(
        &[
            "-e",
            "r:mkret mark",
            "-e",
            "p:dw libdlfix.so:dl_work arg=%di",
        ],
        &[
            prog.to_str().unwrap(),
            "cycle",
            lib.to_str().unwrap(),
            "1",
            "1",
        ],
    );
    assert!(out.status.success(), "{out:?}\n{text}");
    let lists = listings(&text);
    assert!(lists.len() >= 2, "the start's and a dlopen's: {text}");
    for (i, list) in lists.iter().enumerate() {
        assert!(
            list.iter().all(|l| !l.contains("_Unwind_")),
            "listing {i} shows the engine's own probes: {list:#?}"
        );
        let kinds: Vec<(&str, &str)> = list.iter().map(|l| kind_and_sym(l)).collect();
        assert!(kinds.contains(&("r", "mark")), "listing {i}: {list:#?}");
        assert!(!kinds.contains(&("k", "mark")), "listing {i}: {list:#?}");
        assert!(
            kinds
                .iter()
                .all(|(k, s)| (*k == "r" && *s == "mark") || (*k == "k" && *s != "mark")),
            "listing {i}: {list:#?}"
        );
    }
    // Once libdlfix is loaded, its probe is listed as a kprobe.
    assert!(lists
        .iter()
        .any(|l| l.iter().any(|x| kind_and_sym(x) == ("k", "dl_work"))));
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `--time-range` with one bound a timestamp and the other a time after the start is
/// refused (it was read as two different things); values too large for a u64 of ns are
/// refused, not wrapped nor saturated. Both are usage errors: status 2.
#[test]
fn time_range_refuses_mixed_forms_and_overflowing_values() {
    for range in ["11439.845101~10ms", "10ms~11439.9"] {
        let out = ftprobe()
            .args([
                "replay",
                "-d",
                "/nonexistent-recording",
                "--time-range",
                range,
            ])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{range}: {out:?}");
        assert!(
            stderr(&out).contains("mix a timestamp"),
            "{range}: {}",
            stderr(&out)
        );
    }
    for range in [
        "99999999999999999999s~",
        "~18446744073709551616ns",
        "18446744073.709551616~",
    ] {
        let out = ftprobe()
            .args([
                "report",
                "-d",
                "/nonexistent-recording",
                "--time-range",
                range,
            ])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{range}: {out:?}");
        assert!(
            stderr(&out).contains("too large"),
            "{range}: {}",
            stderr(&out)
        );
    }
}

/// Bad option values and options that do not go together exit with 2 as clap's own
/// errors do; a failure at run time keeps 1.
#[test]
fn usage_errors_exit_with_2_runtime_failures_with_1() {
    let naps = ftprobe_dev::naps_fixture();
    let naps = naps.to_str().unwrap();
    for args in [
        &["trace", "-t", "nosuch", "--", naps][..],
        &[
            "trace",
            "-t",
            "function_graph",
            "-O",
            "funcgraph-nosuch",
            "--",
            naps,
        ],
        &["trace", "--buffer-size-kb", "2", "--", naps],
        &["trace", "--rings", "0", "--", naps],
        &["trace", "-G", "quick", "--", naps],
        &[
            "record",
            "-d",
            "/nonexistent-dir/x",
            "--max-depth",
            "2",
            "--",
            naps,
        ],
        &["dump", "-d", "/nonexistent-recording"],
        // clap's own, for comparison.
        &["trace", "--no-such-option", "--", naps],
    ] {
        let out = ftprobe().args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        assert!(out.stdout.is_empty(), "{args:?}: nothing ran");
    }
    // Runtime failures: a recording that is not there, a trace that cannot be written.
    let out = ftprobe()
        .args(["replay", "-d", "/nonexistent-recording"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let out = ftprobe()
        .args(["trace", "-F", "quick", "-o", "/dev/full", "--", naps])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
}

/// A `:mod:` filter naming an object that is not loaded selects nothing until one is
/// (dlopen): the trace's header says so instead of tracing nothing silently; a `:mod:`
/// filter of a loaded object gets no note.
#[test]
fn a_mod_filter_of_an_object_not_loaded_is_noted_in_the_header() {
    let naps = ftprobe_dev::naps_fixture();
    let (out, text) = trace(
        &["-F", "quick", "-F", "*:mod:libnosuch.so"],
        &[naps.to_str().unwrap()],
    );
    assert!(out.status.success(), "{out:?}\n{text}");
    let notes: Vec<&str> = text.lines().filter(|l| l.starts_with("# note: ")).collect();
    assert_eq!(
        notes,
        [
            "# note: -F *:mod:libnosuch.so: no object it names is loaded (yet): it selects \
          nothing until one is (dlopen)"
        ],
        "{text}"
    );
    // The header's notes come before the events.
    let note_at = text.find("# note: ").unwrap();
    let first_event = text
        .find(events(&text).next().expect("quick's events"))
        .unwrap();
    assert!(note_at < first_event, "{text}");
    assert_eq!(events(&text).filter(|l| l.contains(" quick")).count(), 5);

    let (out, text) = trace(&["-F", "quick:mod:naps"], &[naps.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}\n{text}");
    assert!(!text.contains("# note: "), "{text}");
    assert_eq!(events(&text).filter(|l| l.contains(" quick")).count(), 5);
}
