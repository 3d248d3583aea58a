//! The probe path leaves no mark on the program (issue 10): `errno`, SIGTRAP's disposition and
//! flags, faults inside XOL slots, non-local exits out of signal handlers, a slow `dlopen`.
//! Each test runs the `probepath` fixture (`crates/ftprobe-dev/c/probepath.c`) traced and
//! untraced; the program's own output is the truth, and must be the same both ways.

use std::process::Output;

use ftprobe_dev::{probepath_fixture, slowctor_lib};

mod common;
use common::{events, trace, untraced};

fn exe() -> String {
    probepath_fixture().to_str().unwrap().to_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Hits of kprobe event `event` in the trace.
fn hits(text: &str, event: &str) -> Vec<String> {
    let tag = format!(": {event}: (");
    events(text)
        .filter(|l| l.contains(&tag))
        .map(str::to_owned)
        .collect()
}

/// Function tracer records of `func`.
fn calls(text: &str, func: &str) -> usize {
    let tag = format!(": {func} <-");
    events(text).filter(|l| l.contains(&tag)).count()
}

/// `(hits, nmissed)` of `event` in the trace's `# kprobe_profile:` lines.
fn profile(text: &str, event: &str) -> (u64, u64) {
    let at = text.find("# kprobe_profile:").expect("a kprobe_profile");
    text[at..]
        .lines()
        .skip(1)
        .map_while(|l| l.strip_prefix("#   "))
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.first() == Some(&event)).then(|| (f[1].parse().unwrap(), f[2].parse().unwrap()))
        })
        .unwrap_or_else(|| panic!("{event} in\n{}", &text[at..]))
}

/// The `# lost events: N` total.
fn lost(text: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix("# lost events: "))
        .unwrap_or_else(|| panic!("no lost-events line in\n{text}"))
        .trim()
        .parse()
        .unwrap()
}

/// `key=VALUE` from the program's output.
fn field(out: &str, key: &str) -> u64 {
    out.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("{key} in {out:?}"))
        .parse()
        .unwrap()
}

/// Trace `probepath ARGS` with `trace_args`; the program must behave exactly as untraced
/// (same output, same exit). Returns its output and the trace.
fn same_as_untraced(trace_args: &[&str], args: &[&str]) -> (String, String) {
    let exe = exe();
    let mut cmd = vec![exe.as_str()];
    cmd.extend_from_slice(args);
    let (out, text) = trace(trace_args, &cmd);
    let plain = untraced(&cmd);
    assert_eq!(
        stdout(&out),
        stdout(&plain),
        "{args:?}: the program's output is unchanged\n{}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = |o: &Output| {
        use std::os::unix::process::ExitStatusExt;
        o.status
            .code()
            .unwrap_or_else(|| 128 + o.status.signal().unwrap())
    };
    assert_eq!(status(&out), status(&plain), "{args:?}: same exit\n{text}");
    (stdout(&out), text)
}

/// A string fetch arg on a NULL pointer goes through `process_vm_readv`, which failed with
/// EFAULT and left `errno = EFAULT` in the program: `report("open", NULL)` after a failed
/// `open` printed 14 (Bad address) instead of 2. Through ftrace (`report` has a site) and
/// through int3 (`report_nosite` has none).
#[test]
fn errno_is_unchanged_by_a_fault_in_a_fetch_arg() {
    let (out, text) = same_as_untraced(
        &[
            "-e",
            "p:rep report s=+0(%si):string",
            "-e",
            "p:rep2 report_nosite s=+0(%si):string",
        ],
        &["errno"],
    );
    assert_eq!(
        out,
        "open: - errno=2 (No such file or directory)\n\
         open (no site): - errno=2 (No such file or directory)\n"
    );
    assert!(
        text.contains(" k  report+0x0  probepath [FTRACE]"),
        "{text}"
    );
    assert!(
        !text.contains("report_nosite+0x0  probepath [FTRACE]"),
        "{text}"
    );
    for ev in ["rep", "rep2"] {
        let h = hits(&text, ev);
        assert_eq!(h.len(), 1, "{text}");
        assert!(h[0].ends_with(" s=(fault)"), "{}", h[0]);
    }
}

/// `signal(SIGTRAP, SIG_IGN); raise(SIGTRAP);` exited 0 untraced and 133 traced; the same for
/// `kill -TRAP` from another process. A SIGTRAP ftprobe did not cause honours SIG_IGN.
#[test]
fn sigtrap_ignored_by_the_program_stays_ignored() {
    let (out, text) = same_as_untraced(&["-e", "p:w work"], &["ign"]);
    assert_eq!(
        out,
        "ignored SIGTRAP from raise, kill and another process: alive\n"
    );
    assert_eq!(
        hits(&text, "w").len(),
        2,
        "traced before and after:\n{text}"
    );
}

/// The program's SIGTRAP handler was called without its flags: with `SA_RESETHAND` the
/// second `raise` kills the program untraced, but traced ran the handler again (and the
/// action still read back as the handler).
#[test]
fn sa_resethand_is_honoured_for_the_programs_sigtrap_handler() {
    let (out, text) = same_as_untraced(&["-e", "p:w work"], &["resethand"]);
    assert_eq!(out, "first: traps=1 reset=1\n");
    assert_eq!(hits(&text, "w").len(), 2, "{text}");
}

/// ... nor its `sa_mask` (SIGUSR1 not blocked in the handler), nor the kernel's deferral
/// of a SIGTRAP raised inside a handler installed without `SA_NODEFER` (it ran nested, at
/// depth 2, instead of after the handler returned).
#[test]
fn sigtrap_handler_runs_under_its_sa_mask_and_a_nested_sigtrap_waits() {
    let (out, text) = same_as_untraced(&["-e", "p:w work"], &["mask"]);
    assert_eq!(
        out,
        "deferred: traps=2 maxdepth=1 usr1_blocked=1 si_code_tkill=1\n\
         nodefer: traps=2 maxdepth=2\n\
         after: usr1_blocked=0\n"
    );
    assert_eq!(hits(&text, "w").len(), 2, "{text}");
}

/// A fault in a non-boosted XOL slot (`movups` through NULL, probed) whose SIGSEGV handler
/// `siglongjmp`s out: the slot's second trap never came, the thread's current kprobe stayed
/// set, and every later kprobe on it (the ftrace one on `work` too) counted as re-entered:
/// `w` recorded 0 of 4 (nmissed 4). The handler also saw the PC inside the slot, not at the
/// probed load in `get` (inside=0).
#[test]
fn a_fault_in_a_slot_shows_the_probed_pc_and_tracing_goes_on() {
    let (out, text) = same_as_untraced(
        &["-e", "p:g get", "-e", "p:w work"],
        &["slotfault", "3", "4"],
    );
    assert_eq!(out, "faults=3 inside=3 work=4 get=7 s=10\n");
    assert_eq!(
        hits(&text, "g").len(),
        3 + 1,
        "3 faulting calls, 1 that reads:\n{text}"
    );
    assert_eq!(hits(&text, "w").len(), 4, "{text}");
    assert_eq!(profile(&text, "w"), (4, 0));
    assert_eq!(profile(&text, "g"), (4, 0));
}

/// A 2 ms itimer whose handler `siglongjmp`s out of a loop of traced calls (a common C
/// timeout): the jump left the one-writer guard (function tracer) or the current kprobe
/// (kprobe events) set on the thread, and every later event was lost: `final_call` x5 -> 0
/// records, a million "already running".
#[test]
fn tracing_goes_on_after_siglongjmp_out_of_a_signal_handler() {
    let (out, text) = same_as_untraced(&["-F", "spin", "-F", "final_call"], &["itimer", "20"]);
    assert_eq!(out, "rounds=20 final_call=5 s=20\n");
    assert_eq!(
        calls(&text, "final_call"),
        5,
        "{}",
        &text[text.len().saturating_sub(2000)..]
    );
    assert!(calls(&text, "spin") > 0);
    let (_, text) = same_as_untraced(
        &["-e", "p:s spin x=%di", "-e", "p:f final_call"],
        &["itimer", "20"],
    );
    assert_eq!(
        hits(&text, "f").len(),
        5,
        "{}",
        &text[text.len().saturating_sub(2000)..]
    );
    assert_eq!(profile(&text, "f"), (5, 0));
    assert_eq!(
        profile(&text, "s").1,
        0,
        "no spin hit counted as re-entered"
    );
}

/// The interposed `pthread_sigmask` looked up its next definition with `dlsym` on every call,
/// which takes the loader's lock: traced, it waited 0.8 s behind a `dlopen` whose constructor
/// sleeps 1 s (untraced: 0 ms).
#[test]
fn pthread_sigmask_is_not_blocked_by_a_slow_dlopen() {
    let lib = slowctor_lib();
    let exe = exe();
    let cmd = [exe.as_str(), "dlopen", lib.to_str().unwrap()];
    let (out, text) = trace(&["-F", "work"], &cmd);
    assert!(out.status.success(), "{out:?}\n{text}");
    let ms = field(&stdout(&out), "pthread_sigmask_ms");
    assert!(ms < 300, "pthread_sigmask took {ms} ms traced");
}

/// `(thread, timestamp)` of a trace line (`comm-tid [cpu] flags secs.micros: ...`).
fn tid_and_time(line: &str) -> (String, f64) {
    let mut words = line.split_whitespace();
    let task = words.next().unwrap_or_default();
    let tid = task.rsplit('-').next().unwrap_or_default().to_owned();
    let ts = words
        .find_map(|w| w.strip_suffix(':').and_then(|t| t.parse().ok()))
        .unwrap_or_else(|| panic!("no timestamp in {line}"));
    (tid, ts)
}

/// What the stress mode printed for one function (`func: done=.. cut=.. fired=..
/// in_probe=..`).
#[derive(Clone, Copy, Debug)]
struct Stress {
    /// Calls completed.
    done: u64,
    /// Calls a jump cut short.
    cut: u64,
    /// Of those, cut after the probe point (from the interrupted PC).
    fired: u64,
    /// Of those, cut in ftprobe's code (a PC outside the program's).
    in_probe: u64,
}

fn stress_counts(out: &str, func: &str) -> Stress {
    let line = out
        .lines()
        .find(|l| l.starts_with(&format!("{func}: ")))
        .unwrap_or_else(|| panic!("{func} in {out}"));
    Stress {
        done: field(line, "done"),
        cut: field(line, "cut"),
        fired: field(line, "fired"),
        in_probe: field(line, "in_probe"),
    }
}

/// 4 threads call probed functions for 10 s while each thread's own 2 ms timer's handler
/// `siglongjmp`s out of them: `stress_site` (ftrace: the function tracer and a kprobe event
/// with a fetch arg), `stress_call` (an int3 probe on a `call`: emulated) and `stress_load`
/// (an int3 probe with a string fetch arg on a `movups`: a slot that is not boosted). The
/// program classifies each call a jump cut short from the interrupted PC: at or before the
/// probe point, or in the caller, not fired; anywhere else fired, and of those, in ftprobe's
/// code when the PC is outside the program's.
///
/// int3 events (a program signal that comes during their handler is held until it is done):
/// for each, the calls completed plus those cut after the probe fired equal its hits (records plus drops), and
/// no cut lands in ftprobe's code. ftrace events: no cut lands in ftprobe's code either (a
/// signal in a trampoline is held until the hit is done, or the hit is undone), and every
/// call that fired has both events recorded or counted as lost, exactly. No hit counts as
/// re-entered; every thread's events of the last second are there, and
/// `final_call` after the threads is traced.
#[test]
fn stress_siglongjmp_out_of_probed_calls_in_four_threads() {
    let (out, text) = trace(
        &[
            "-F",
            "stress_site",
            "-F",
            "final_call",
            "-e",
            "p:s stress_site x=%di",
            "-e",
            "p:n stress_call",
            "-e",
            "p:t stress_load s=+0(%di):string",
        ],
        &[&exe(), "stress", "10", "4"],
    );
    let tail = &text[text.len().saturating_sub(3000)..];
    assert!(out.status.success(), "{out:?}\n{tail}");
    let o = stdout(&out);
    eprintln!("{o}{}", &text[text.find("# lost events").unwrap_or(0)..]);
    let site = stress_counts(&o, "site");
    let call = stress_counts(&o, "call");
    let load = stress_counts(&o, "load");
    for (name, c) in [("site", site), ("call", call), ("load", load)] {
        assert!(
            c.done > 10_000 && c.cut > 0,
            "{name}: calls made and cut: {o}"
        );
    }
    assert_eq!(
        calls(&text, "final_call"),
        5,
        "tracing works to the end: {tail}"
    );
    for ev in ["s", "n", "t"] {
        let (_, missed) = profile(&text, ev);
        assert_eq!(missed, 0, "{ev}: no hit counted as re-entered\n{tail}");
    }
    // The int3 events: exact, per event.
    let mut int3_dropped = 0;
    for (ev, c) in [("n", call), ("t", load)] {
        let (h, _) = profile(&text, ev);
        let recorded = hits(&text, ev).len() as u64;
        assert_eq!(
            c.in_probe, 0,
            "{ev}: no signal lands in ftprobe's code\n{o}"
        );
        assert_eq!(
            c.done + c.fired,
            h,
            "{ev}: completed + fired and cut vs hits (recorded {recorded} + dropped)\n{o}"
        );
        int3_dropped += h - recorded;
    }
    // The ftrace events (two per call): the losses are reported in one total, the int3
    // events' drops included. A signal that arrives in the trampoline is held until the hit
    // is complete, or the hit is undone: no cut lands in ftprobe's code, and every call the
    // program saw fire has both events recorded or counted as lost.
    assert_eq!(
        site.in_probe, 0,
        "site: no signal lands in ftprobe's code\n{o}"
    );
    assert!(
        o.contains(" bad_siginfo=0\n"),
        "a held signal keeps its siginfo (SI_TIMER)\n{o}"
    );
    let recorded = calls(&text, "stress_site") as u64 + hits(&text, "s").len() as u64;
    let accounted = recorded + lost(&text) - int3_dropped;
    assert_eq!(
        accounted,
        2 * (site.done + site.fired),
        "stress_site: recorded {recorded} + lost {}\n{o}",
        lost(&text) - int3_dropped,
    );
    for line in hits(&text, "t").iter().take(1000) {
        assert!(line.ends_with(" s=\"fetched\""), "{line}");
    }
    // Tracing works to the end: each thread has each event in the last second of the run.
    let t_end: f64 = o
        .split_whitespace()
        .find_map(|w| w.strip_prefix("t_end="))
        .expect("t_end")
        .parse()
        .unwrap();
    for tag in [": stress_site <-", ": s: (", ": n: (", ": t: ("] {
        let mut threads: Vec<String> = events(&text)
            .filter(|l| l.contains(tag))
            .map(tid_and_time)
            .filter(|(_, ts)| *ts >= t_end - 1.0)
            .map(|(tid, _)| tid)
            .collect();
        threads.sort();
        threads.dedup();
        assert_eq!(
            threads.len(),
            4,
            "{tag}: threads with events in the last second"
        );
    }
}
