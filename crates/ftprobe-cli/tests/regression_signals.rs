//! The program's own signal handlers see the program as without ftprobe (issue 10): the stack
//! a handler runs on, the PC an asynchronous signal interrupted, and the stress test's exact
//! accounting. Each test runs a fixture traced and untraced (`crates/ftprobe-dev/c/signals.c`,
//! `probepath.c`); the program's own output is the truth.

use std::process::Output;

use ftprobe_dev::signals_fixture;

mod common;
use common::{events, trace, untraced};

fn exe() -> String {
    signals_fixture().to_str().unwrap().to_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `key=VALUE` from the program's output.
fn field(out: &str, key: &str) -> u64 {
    out.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("{key} in {out:?}"))
        .parse()
        .unwrap()
}

/// Hits of kprobe event `event` in the trace.
fn hits(text: &str, event: &str) -> usize {
    let tag = format!(": {event}: (");
    events(text).filter(|l| l.contains(&tag)).count()
}

/// The program's SIGTRAP handler (and SIGSEGV handler) ran on the signal stack whenever the
/// thread had one, because ftprobe's handler (`SA_ONSTACK`) ran there and called it: a
/// handler installed without `SA_ONSTACK` saw its locals on the signal stack and
/// `sigaltstack` said `SS_ONSTACK`, where the kernel runs it on the interrupted stack.
#[test]
fn a_handler_without_sa_onstack_runs_on_the_interrupted_stack() {
    let exe = exe();
    let cmd = [exe.as_str(), "altstack"];
    let plain = untraced(&cmd);
    // What the kernel does, as the fixture sees it.
    assert_eq!(
        stdout(&plain),
        "raise, SA_ONSTACK: ran=1 on_alt=1 ss_onstack=1\n\
         raise, no SA_ONSTACK: ran=1 on_alt=0 ss_onstack=0\n\
         int3, SA_ONSTACK: ran=1 on_alt=1 ss_onstack=1\n  rax=42 xmm0=4242\n\
         int3, no SA_ONSTACK: ran=1 on_alt=0 ss_onstack=0\n  rax=42 xmm0=4242\n\
         raise from a handler on the signal stack, no SA_ONSTACK: ran=1 on_alt=1 ss_onstack=1\n\
         raise from a handler on the signal stack, SA_ONSTACK: ran=1 on_alt=1 ss_onstack=1\n\
         SIGSEGV, SA_ONSTACK: ran=1 on_alt=1 ss_onstack=1\n\
         SIGSEGV, no SA_ONSTACK: ran=1 on_alt=0 ss_onstack=0\n\
         autodisarm, SA_ONSTACK: ran=1 on_alt=1 ss_disabled=1\n\
         autodisarm, no SA_ONSTACK: ran=1 on_alt=0 ss_disabled=1\n\
         autodisarm after: armed=1\n\
         mark=1\n"
    );
    // An int3 probe on `mark` (no patchable entry): ftprobe's SIGTRAP handler, and its fault
    // handlers (the probe has an XOL slot), are installed.
    let (out, text) = trace(&["-e", "p:m mark"], &cmd);
    assert!(out.status.success(), "{out:?}\n{text}");
    assert_eq!(stdout(&out), stdout(&plain), "{text}");
    assert_eq!(hits(&text, "m"), 4, "{text}");
}

/// A 1 ms timer's handler looked at the PC its signal interrupted while the program ran a
/// loop with an int3 probe on a boosted instruction: the signal, held while ftprobe's SIGTRAP
/// handler ran, was delivered when it returned into the XOL slot, and 1386 of 1388 ticks saw
/// a PC in no loaded object (the slot), where the program never runs.
#[test]
fn an_asynchronous_signal_never_sees_a_pc_inside_an_xol_slot() {
    let exe = exe();
    // Until 1000 ticks came (a count, not a time: issue 31, a loaded machine delivered 173
    // in 1.5 s).
    let cmd = [exe.as_str(), "pcs", "1000"];
    let (out, text) = trace(&["-e", "p:h hot_loop+2"], &cmd);
    assert!(out.status.success(), "{out:?}\n{text}");
    let o = stdout(&out);
    let tail = &text[text.len().saturating_sub(1500)..];
    assert!(field(&o, "ticks") >= 1000, "the timer ran: {o}");
    assert_eq!(field(&o, "sum_ok"), 1, "{o}");
    assert!(hits(&text, "h") > 1000, "the probe was hit: {tail}");
    assert_eq!(
        field(&o, "outside"),
        0,
        "no tick saw a PC outside the program's objects: {o}"
    );
    // The same program untraced: the handler's lookup is right (0 outside).
    let plain = stdout(&untraced(&cmd));
    assert_eq!(field(&plain, "outside"), 0, "{plain}");
}

/// The same timer over a loop whose probe is an optprobe (`hot_sp_loop+16`: a `jmp` to a
/// detour over `add` and `cmp`): a tick that lands in the detour or its trampoline is shown
/// as the program would be without ftprobe: at an instruction boundary of the function, with
/// the stack pointer the function saved, its own `rdi`/`rax`, and the flags the instruction
/// before left. Before this was fixed, a process without ftrace sites never held a signal in
/// the optprobe trampoline (1085 of 1500 ticks saw a PC in it), and a tick in the detour's
/// own instructions saw the stack pointer 128-144 bytes low (1168 of 1173).
#[test]
fn an_asynchronous_signal_in_an_optprobe_sees_the_program_registers() {
    let exe = exe();
    // Until 1000 ticks hit the loop.
    let cmd = [exe.as_str(), "regs", "1000"];
    let (out, text) = trace(&["-e", "p:h hot_sp_loop+16"], &cmd);
    assert!(out.status.success(), "{out:?}\n{text}");
    assert!(
        text.contains("hot_sp_loop+0x10  signals [OPTIMIZED]"),
        "the probe is jump-optimized: {}",
        &text[..text.len().min(600)]
    );
    let o = stdout(&out);
    assert!(field(&o, "in_loop") >= 1000, "the timer hit the loop: {o}");
    assert_eq!(field(&o, "sum_ok"), 1, "{o}");
    for bad in ["bad_pc", "bad_sp", "bad_args", "bad_flags"] {
        assert_eq!(field(&o, bad), 0, "{bad}: {o}");
    }
    assert!(hits(&text, "h") > 1000, "the probe was hit");
    // Untraced, the handler's checks hold.
    let plain = stdout(&untraced(&cmd));
    for bad in ["bad_pc", "bad_sp", "bad_args", "bad_flags"] {
        assert_eq!(field(&plain, bad), 0, "{bad}: {plain}");
    }
}

/// While XOL slots exist ftprobe's wrapper stands in for every handler the program installs
/// (`sigaction`, `signal`, `sigset`); the program must not see it: what `sigaction` reads
/// back (handler, flags, mask), `SA_RESETHAND`'s reset, the previous handler `signal` and
/// `sigset` return, and the deliveries are as untraced.
#[test]
fn wrapped_handlers_read_back_as_the_program_installed_them() {
    let exe = exe();
    let cmd = [exe.as_str(), "actions"];
    let plain = untraced(&cmd);
    let (out, text) = trace(&["-e", "p:m mark"], &cmd);
    assert!(out.status.success(), "{out:?}\n{text}");
    assert_eq!(stdout(&out), stdout(&plain), "{text}");
    assert_eq!(hits(&text, "m"), 1, "{text}");
    assert!(
        stdout(&plain).contains("usr1 after delivery: DFL flags=0x94000000"),
        "{}",
        stdout(&plain)
    );
}

/// Regression (review 14, F1): a timer handler that left by `siglongjmp` while the thread was
/// in a return hook (a good part of the time with `r:rh hot` on a hot loop) left the return
/// path's state behind: its recursion guard (later probes taken for nested ones: the handler's
/// own probe counted nothing), and its kretprobe instance closed twice by the jump (the live
/// count wrapped below zero: every later return of `hot` counted as missed, 1.4 M misses for
/// ~10 000 hits). Now the agent's `siglongjmp` clears the guards of the frames it leaves, and a
/// closed call's users are never called twice: no miss, every return of `hot` an event but
/// those a jump cut off, and every call of the handler an event of `pa` or counted lost: a
/// jump out of a handler that interrupted an event abandons that event, and with it the
/// handler's event written inside it (review 14, F5: that one was counted nowhere). Optimized
/// and int3 probes, 3 runs each.
#[test]
fn siglongjmp_out_of_a_return_hook_leaves_the_probes_working() {
    let exe = ftprobe_dev::sigjmp_ret_fixture();
    let exe = exe.to_str().unwrap();
    for opt in ["1", "0"] {
        for run in 0..3 {
            let (out, text) = common::trace_env(
                &[("FTPROBE_KPROBES_OPTIMIZATION", opt)],
                &["-e", "r:rh hot", "-e", "p:pa on_alrm"],
                &[exe],
            );
            let said = stdout(&out);
            assert!(out.status.success(), "{out:?}");
            let (calls, returned) = (field(&said, "hot_calls"), field(&said, "returned"));
            let (jumps, handled) = (field(&said, "jumps"), field(&said, "handler_calls"));
            assert!(jumps >= 200 && handled == jumps, "{said}");
            let lost = common::lost_events(&text);
            let (rh, rh_missed) = common::profile(&text, "rh");
            let (pa, pa_missed) = common::profile(&text, "pa");
            // The trace's loss lines say which losses these are (a ring-full loss would
            // break the pairing below: seen once, issue 31, not reproduced in 50 runs).
            let losses: String = text
                .lines()
                .filter(|l| l.starts_with('#') && l.contains("lost"))
                .map(|l| format!("{l}\n"))
                .collect();
            let at = format!("optimization {opt}, run {run}: {said}rh {rh}/{rh_missed}, pa {pa}/{pa_missed}, lost {lost}\n{losses}");
            assert_eq!((rh_missed, pa_missed), (0, 0), "{at}");
            assert_eq!(hits(&text, "rh") as u64, rh, "{at}");
            // Each jump that abandoned an event (rh's, in the loop) discarded it and the
            // handler's event written inside it: two events lost, both counted.
            assert_eq!(lost % 2, 0, "{at}");
            assert!(rh <= calls && rh + lost / 2 >= returned, "{at}");
            assert_eq!(pa + lost / 2, handled, "{at}");
            assert!(lost <= jumps, "{at}");
        }
    }
}

/// Issue 26, item 11: a traced program's `/proc/PID/status` showed signals 32 and 33 (the C
/// library's own) as ignored, from the posix_spawn that started it; it now starts with the
/// dispositions it has untraced.
#[test]
fn a_traced_program_starts_with_its_untraced_signal_dispositions() {
    let exe = common::build_at_test_time(
        "cc",
        "sigign.c",
        r#"
#include <stdio.h>
#include <string.h>
int main(void) {
    char buf[256];
    FILE *f = fopen("/proc/self/status", "r");
    while (fgets(buf, sizeof buf, f))
        if (!strncmp(buf, "SigIgn:", 7) || !strncmp(buf, "SigBlk:", 7)) fputs(buf, stdout);
    return 0;
}
"#,
        &["-O1"],
    )
    .expect("cc builds sigign.c");
    // Both started as from a shell, where signals 32 and 33 have their default action (this
    // test process's own children inherit them ignored: it was spawned by posix_spawn too).
    let run = |cmd: &mut std::process::Command| {
        // SAFETY: two raw rt_sigaction calls in the forked child: async-signal-safe.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(cmd, || {
                let dfl = [0u64; 4];
                for sig in [32, 33] {
                    libc::syscall(
                        libc::SYS_rt_sigaction,
                        sig,
                        dfl.as_ptr(),
                        std::ptr::null_mut::<u64>(),
                        8usize,
                    );
                }
                Ok(())
            })
        };
        cmd.output().unwrap()
    };
    let plain = stdout(&run(&mut std::process::Command::new(&exe)));
    let ign = |s: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix("SigIgn:"))
            .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
            .unwrap_or_else(|| panic!("{s}"))
    };
    assert_eq!(ign(&plain) & (3 << 31), 0, "{plain}");
    let out = run(common::ftprobe()
        .args(["trace", "-e", "p:m main", "-o", "/dev/null", "--"])
        .arg(&exe));
    assert!(out.status.success(), "{out:?}");
    assert_eq!(stdout(&out), plain);
}
