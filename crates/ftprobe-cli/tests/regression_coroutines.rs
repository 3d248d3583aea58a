//! Return probes in programs that switch stacks with `swapcontext` (a fresh user's review,
//! 2026-12-02): the program's own counts are the truth.

mod common;

/// Regression: main and a generator switching 20 000 times lost about one return in 1000
/// of each side's probe, silently (0 misses, 0 events lost). Each switch's return frees its
/// entry below the other stack's live one, and only holes at the top of the shadow stack
/// were dropped: it filled with holes every ~500 switches and calls went unhooked, counted
/// in no event's misses. Now a full shadow stack reuses a hole above the stack's own
/// entries, and a kretprobe event's unhooked calls count in its misses. Exact: every return
/// of `resume` (N) and of `yield` (N - 1: the generator's last one never returns) is an
/// event; no miss, nothing lost. Optimized and int3 probes.
#[test]
fn return_probes_on_coroutines_see_every_return() {
    let exe = ftprobe_dev::coswitch_fixture();
    let exe = exe.to_str().unwrap();
    for opt in ["1", "0"] {
        let (out, text) = common::trace_env(
            &[("FTPROBE_KPROBES_OPTIMIZATION", opt)],
            &["-e", "r:rr resume", "-e", "r:yr yield"],
            &[exe, "20000"],
        );
        assert!(out.status.success(), "{out:?}");
        let said = String::from_utf8_lossy(&out.stdout);
        assert_eq!(said, "resumes=20000 yields=20000\n");
        let at = format!("optimization {opt}");
        assert_eq!(
            common::profile(&text, "rr"),
            (20000, 0),
            "{at}: {text:.3000}"
        );
        assert_eq!(common::profile(&text, "yr"), (19999, 0), "{at}");
        assert_eq!(common::lost_events(&text), 0, "{at}");
        let events = |e: &str| {
            let tag = format!(": {e}: (");
            common::events(&text).filter(|l| l.contains(&tag)).count()
        };
        assert_eq!((events("rr"), events("yr")), (20000, 19999), "{at}");
    }
}
