//! Regressions of the agent's life inside the traced program: it never calls the program's
//! allocator, and a probe hit is never fatal because of a signal mask that holds SIGTRAP.
//! Exact expectations from the fixtures' own counts.

use std::process::Output;

mod common;
use common::{events, ftprobe, trace, untraced};

use ftprobe_dev::{libc_mallocs_fixture, own_malloc_fixture, sigmasks_fixture};

/// Lines of the kprobe event `event` (after `: event: (`).
fn kprobe_lines<'a>(text: &'a str, event: &str) -> Vec<&'a str> {
    let tag = format!(": {event}: (");
    events(text)
        .filter_map(|l| l.split_once(&tag).map(|(_, rest)| rest))
        .collect()
}

/// Function-tracer lines whose function is `func` (`func <-parent`).
fn calls_of(text: &str, func: &str) -> usize {
    let want = format!("{func} <-");
    events(text)
        .filter(|l| {
            l.split_once(": ")
                .is_some_and(|(_, f)| f.starts_with(&want))
        })
        .count()
}

/// `key=value` from a fixture's line of counts.
fn field(stdout: &str, key: &str) -> usize {
    let want = format!("{key}=");
    stdout
        .split_whitespace()
        .find_map(|w| w.strip_prefix(&want))
        .unwrap_or_else(|| panic!("no {key}= in {stdout:?}"))
        .parse()
        .unwrap()
}

/// [`trace`] with one more variable in ftprobe's environment (so in the program's).
fn trace_with_env(var: Option<(&str, &str)>, args: &[&str], cmd: &[&str]) -> (Output, String) {
    let Some((k, v)) = var else {
        return trace(args, cmd);
    };
    let file = std::env::temp_dir().join(format!(
        "ftprobe-regression-agent-{}-{k}.txt",
        std::process::id()
    ));
    let out = ftprobe()
        .env(k, v)
        .arg("trace")
        .args(args)
        .arg("-o")
        .arg(&file)
        .arg("--")
        .args(cmd)
        .output()
        .unwrap();
    let text = std::fs::read_to_string(&file).unwrap_or_default();
    let _ = std::fs::remove_file(&file);
    (out, text)
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Regression (issue 9, item 6): the agent allocated through the program's `malloc`, so a
/// program whose own `malloc` returns 8-byte-aligned blocks died with SIGSEGV in the agent's
/// start-up (SSE code in a hash table on a misaligned block), and the agent's calls showed
/// up in the program's allocator. The agent now has its own allocator: the program runs
/// traced, no call comes from the agent (by return address, or before `main`), and probes on
/// its `malloc` count exactly the calls it counted itself.
#[test]
fn a_program_with_its_own_8_byte_aligned_malloc_runs_traced_and_the_agent_never_calls_it() {
    let exe = own_malloc_fixture();
    let exe = exe.to_str().unwrap();
    let plain = untraced(&[exe, "12"]);
    assert!(plain.status.success(), "{plain:?}");
    let want = stdout(&plain);
    assert_eq!(field(&want, "agent_calls"), 0, "{want}");
    assert_eq!(field(&want, "before_main"), 0, "{want}");
    assert_eq!(field(&want, "mallocs"), 24, "{want}");

    // The function tracer on the allocator itself and on work.
    let (out, text) = trace(
        &[
            "-F", "work", "-F", "malloc", "-F", "calloc", "-F", "realloc", "-F", "free",
        ],
        &[exe, "12"],
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(stdout(&out), want, "same counts, none from the agent");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("after main"), "{err}");
    assert_eq!(calls_of(&text, "work"), 12, "{text}");
    for f in ["malloc", "calloc", "realloc", "free"] {
        let key = format!("{f}s");
        assert_eq!(calls_of(&text, f), field(&want, &key), "{f}:\n{text}");
    }

    // A kprobe event on its malloc (an ftrace site): one hit per call it counted. Also with
    // another library preloaded, which makes the agent edit LD_PRELOAD (`setenv` would call
    // the program's malloc before main).
    for preload in [None, Some("libm.so.6")] {
        let (out, text) = trace_with_env(
            preload.map(|p| ("LD_PRELOAD", p)),
            &["-e", "p:m own_malloc:malloc size=%di:u64"],
            &[exe, "12"],
        );
        assert!(out.status.success(), "{preload:?}: {out:?}");
        assert_eq!(stdout(&out), want, "{preload:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("after main"), "{preload:?}: {err}");
        assert_eq!(
            kprobe_lines(&text, "m").len(),
            field(&want, "mallocs"),
            "{preload:?}:\n{text}"
        );
    }

    // The other ways of naming a target the agent resolves in the program: an indirect
    // function (`dlopen(RTLD_NOLOAD)` + `dlsym`) and the `PATH:0xOFFSET` form (the file
    // compared by identity, not `realpath`): still no call into its allocator.
    let img = ftprobe::elf::ElfImage::open(std::path::Path::new(exe)).unwrap();
    let work = img.funcs_named("work").next().unwrap().svma;
    let seg = img
        .segments
        .iter()
        .find(|s| work >= s.svma && work - s.svma < s.filesz)
        .unwrap();
    let by_offset = format!("p:o {exe}:{:#x}", work - seg.svma + seg.offset);
    let (out, text) = trace(
        &[
            "-e",
            "p:m own_malloc:malloc",
            "-e",
            "p:s libc:strlen",
            "-e",
            &by_offset,
        ],
        &[exe, "12"],
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(stdout(&out), want);
    assert_eq!(
        kprobe_lines(&text, "m").len(),
        field(&want, "mallocs"),
        "{text}"
    );
    assert_eq!(kprobe_lines(&text, "o").len(), 12, "{text}");
}

/// Regression (issue 9, item 6): probes on libc's `malloc` and `free` counted the agent's
/// own calls too (its start-up allocations were hidden by a "quiet" flag, but not, e.g., the
/// allocation of the interposed `sigaction(SIGTRAP)`); with no special case left, they count
/// exactly the program's calls.
#[test]
fn probes_on_libc_malloc_and_free_count_only_the_programs_calls() {
    traced_mallocs(&[]);
}

/// `libc_mallocs 9` traced with probes on libc's malloc (its sizes) and free, and the
/// definitions `extra`: the program's own output, and exactly its own calls; the trace.
fn traced_mallocs(extra: &[&str]) -> String {
    let exe = libc_mallocs_fixture();
    let exe = exe.to_str().unwrap();
    let want = stdout(&untraced(&[exe, "9"]));
    assert_eq!(want, "mallocs=9 frees=8\n");
    let mut args = vec!["-e", "p:m libc:malloc size=%di:u64", "-e", "p:f libc:free"];
    for d in extra {
        args.extend(["-e", d]);
    }
    let (out, text) = trace(&args, &[exe, "9"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(stdout(&out), want);
    let sizes: Vec<u64> = kprobe_lines(&text, "m")
        .iter()
        .map(|l| l.rsplit_once(" size=").unwrap().1.parse().unwrap())
        .collect();
    assert_eq!(sizes, (100..109).collect::<Vec<u64>>(), "{text}");
    assert_eq!(kprobe_lines(&text, "f").len(), 8, "{text}");
    text
}

/// Review 14, F3: `p libc:close` counted the agent's own `close` calls (reading
/// `/proc/self/task` and `/proc/PID/stat` to check threads while it optimized a probe: 1, 2
/// or 4 events by run, in a program that never calls `close`). The engine's control code
/// runs as the kernel's `kprobe_busy_begin()` section (`KprobeBusy`): the probes it reaches
/// record nothing and count neither a hit nor a miss (`kprobe_profile`: 0 and 0). `libc_mallocs` prints with `write(2)` and never calls
/// `close`, `open` or `read`: no event, with the probes optimized and as int3 probes; its
/// own `malloc` calls are still exact (the same run).
#[test]
fn probes_on_libc_count_none_of_the_agents_own_calls() {
    let exe = libc_mallocs_fixture();
    let exe = exe.to_str().unwrap();
    let args = [
        "-e",
        "p:c libc:close fd=%di:s32",
        "-e",
        "p:o libc:open",
        "-e",
        "p:r libc:read",
        "-e",
        "p:m libc:malloc size=%di:u64",
    ];
    for var in [None, Some(("FTPROBE_KPROBES_OPTIMIZATION", "0"))] {
        for _ in 0..3 {
            let (out, text) = trace_with_env(var, &args, &[exe, "9"]);
            assert!(out.status.success(), "{var:?}: {out:?}");
            assert_eq!(stdout(&out), "mallocs=9 frees=8\n");
            for ev in ["c", "o", "r"] {
                assert_eq!(kprobe_lines(&text, ev), Vec::<&str>::new(), "{var:?}: {ev}");
                // Nor a miss in `kprobe_profile` (`#   EVENT   HITS   MISSES`).
                let profile: Vec<&str> = text
                    .lines()
                    .find(|l| l.split_whitespace().nth(1) == Some(ev) && l.starts_with("#  "))
                    .map(|l| l.split_whitespace().skip(2).collect())
                    .unwrap_or_default();
                assert_eq!(profile, ["0", "0"], "{var:?}: {ev}: {text}");
            }
            assert_eq!(kprobe_lines(&text, "m").len(), 9, "{var:?}: {text}");
        }
    }
}

/// Found by a user: with return hooks on (a return event, `-t function_graph`), the agent
/// looked up `__cxa_begin_catch` with `dlsym` in a C program, where no object defines it: the
/// failed lookup's error message is allocated with the program's `malloc` (two extra calls
/// counted before `main`). The same counts as the program's own now, with a return event on
/// `malloc` too.
#[test]
fn return_hooks_in_a_c_program_never_call_its_malloc() {
    let text = traced_mallocs(&["r:mr libc:malloc"]);
    assert_eq!(kprobe_lines(&text, "mr").len(), 9, "{text}");
}

/// Regression (issue 9, item 1): an int3 probe hit while SIGTRAP was blocked by a handler's
/// `sa_mask` (or a mask restored by `siglongjmp`, `swapcontext`, `setcontext`, taken by
/// `sigsuspend`/`ppoll`/`pselect`/`epoll_pwait`, set by `sigset`/`sighold`/`sigblock`, given
/// to a new thread, installed by a library's constructor before the agent started, or
/// SIGTRAP's handler replaced by `sysv_signal`/`sigignore`) killed the
/// program silently (exit 133). Now every variant runs to completion with exact hit counts,
/// for a probe on libc's `write` and an int3 probe on the handler itself.
#[test]
fn sigtrap_in_a_signal_mask_does_not_kill_the_program() {
    let exe = sigmasks_fixture();
    let exe = exe.to_str().unwrap();
    for v in [
        "fill", "trap", "jmp", "swapctx", "setctx", "sigset", "signal", "suspend", "ppoll",
        "pselect", "epoll", "thread", "early",
    ] {
        let plain = untraced(&[exe, v, "6"]);
        assert!(plain.status.success(), "{v}: {plain:?}");
        let want = stdout(&plain);
        assert_eq!(field(&want, "handled"), 6, "{v}: {want}");
        assert_eq!(field(&want, "writes"), 13, "{v}: {want}");
        let installed_with_trap = usize::from(["fill", "trap", "early"].contains(&v));
        assert_eq!(field(&want, "trap_in_sa_mask"), installed_with_trap, "{v}");
        let (out, text) = trace(
            &["-e", "p:w libc:write fd=%di:s32", "-e", "p:h on_usr1"],
            &[exe, v, "6"],
        );
        assert_eq!(out.status.code(), Some(0), "{v}: {out:?}\n{text}");
        // The same line: the program reads back the mask it installed (with SIGTRAP).
        assert_eq!(stdout(&out), want, "{v}");
        assert_eq!(kprobe_lines(&text, "w").len(), 13, "{v}:\n{text}");
        assert_eq!(kprobe_lines(&text, "h").len(), 6, "{v}:\n{text}");
        // An int3 probe, not an ftrace site: the fixture has none.
        assert!(
            text.lines()
                .any(|l| l.contains("  k  on_usr1+0x0  ") && !l.contains("[FTRACE]")),
            "{v}:\n{text}"
        );
    }
}

/// Regression (issue 9, item 1): what ftprobe cannot cover (SIGTRAP blocked by a raw
/// `rt_sigprocmask` syscall) killed the program with only an exit status (133). The trace
/// and stderr now say that a trap ftprobe could not take killed it; a program that kills
/// itself with its own SIGTRAP gets no such line. Since optprobes (issue 14), the probe on
/// `write` is jump-optimized and takes no trap at all: the program lives; the int3 probe's
/// case is run with optimization off.
#[test]
fn a_trap_that_ftprobe_could_not_take_is_reported() {
    let exe = sigmasks_fixture();
    let exe = exe.to_str().unwrap();
    let said = "killed by a trap that ftprobe could not take";
    let plain = untraced(&[exe, "raw"]);
    let (out, text) = trace_with_env(
        Some(("FTPROBE_KPROBES_OPTIMIZATION", "1")),
        &["-e", "p:w libc:write"],
        &[exe, "raw"],
    );
    assert!(
        text.lines()
            .any(|l| l.contains("write+0x0  libc") && l.contains("[OPTIMIZED]")),
        "{text}"
    );
    assert_eq!(out.status.code(), plain.status.code(), "{out:?}");
    assert_eq!(out.stdout, plain.stdout, "{out:?}");
    let (out, text) = trace_with_env(
        Some(("FTPROBE_KPROBES_OPTIMIZATION", "0")),
        &["-e", "p:w libc:write"],
        &[exe, "raw"],
    );
    assert_eq!(out.status.code(), Some(128 + libc::SIGTRAP), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(said), "{err}");
    assert!(
        text.lines().any(|l| l.starts_with('#') && l.contains(said)),
        "{text}"
    );
    // The program's own SIGTRAP, with its default action: the exit status only.
    let plain = untraced(&[exe, "selftrap"]);
    assert_eq!(plain.status.code(), None, "{plain:?}");
    let (out, text) = trace(&["-e", "p:w libc:write"], &[exe, "selftrap"]);
    assert_eq!(out.status.code(), Some(128 + libc::SIGTRAP), "{out:?}");
    assert_eq!(kprobe_lines(&text, "w").len(), 10, "{text}");
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains(said),
        "{out:?}"
    );
    assert!(!text.contains(said), "{text}");
}
