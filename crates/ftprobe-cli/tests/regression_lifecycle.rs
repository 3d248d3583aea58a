//! Regression tests: the whole life of a traced process is traced, from the first
//! constructor of any of its objects to libc's own exit work (issue 9, item 2).

mod common;

use common::{events, trace};

/// `libfxctors`' constructor calls `lib_traced` twice and its destructor three times, `main`
/// once: the library says `lib_traced calls=6` at the end. Both run outside `main`, before
/// the agent's own constructor and after its destructor.
#[test]
fn constructor_and_destructor_calls_of_other_libraries_are_traced() {
    let prog = ftprobe_dev::ctors_fixture();
    let prog = prog.to_str().unwrap();
    let plain = common::untraced(&[prog]);
    assert!(String::from_utf8_lossy(&plain.stderr).contains("lib_traced calls=6"));

    let (out, text) = trace(&["-F", "lib_traced"], &[prog]);
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("lib_traced calls=6"));
    assert_eq!(out.stdout, plain.stdout);
    let parents: Vec<&str> = events(&text)
        .filter(|l| l.contains(": lib_traced <-"))
        .map(|l| l.rsplit("<-").next().unwrap())
        .collect();
    assert_eq!(parents.len(), 6, "{text}");
    assert_eq!(
        parents.iter().filter(|p| **p == "lib_fini").count(),
        3,
        "{text}"
    );
    assert_eq!(
        parents.iter().filter(|p| **p == "main").count(),
        1,
        "{text}"
    );

    // The same through a kprobe event, and a probe on libc's write: the destructor's write
    // and stdio's flush in `exit` (after every destructor) are the program's two writes.
    let (out, text) = trace(
        &["-e", "p:lt lib_traced", "-e", "p:w libc:write fd=%di"],
        &[prog],
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        events(&text).filter(|l| l.contains(" lt: ")).count(),
        6,
        "{text}"
    );
    let writes: Vec<&str> = events(&text).filter(|l| l.contains(" w: ")).collect();
    assert_eq!(writes.len(), 2, "{text}");
    assert!(
        writes[0].ends_with("fd=0x2"),
        "the destructor's write to stderr: {text}"
    );
    assert!(
        writes[1].ends_with("fd=0x1"),
        "stdio's flush of stdout: {text}"
    );
    assert!(
        text.contains(&format!("#   {:<44} {:>15} {:>15}\n", "lt", 6, 0)),
        "{text}"
    );
    assert!(
        text.contains(&format!("#   {:<44} {:>15} {:>15}\n", "w", 2, 0)),
        "{text}"
    );
}

/// Issue 9, item 3: a program that execs another was shown under the old name, with no word
/// that its events stop at the exec. Every member of the exec family is seen; a failed
/// exec is said too, and tracing goes on after it.
#[test]
fn exec_is_reported_and_the_profile_says_where_counts_stop() {
    let prog = ftprobe_dev::execs_fixture();
    let prog = prog.to_str().unwrap();
    for mode in [
        "execve", "execv", "execvp", "execvpe", "execl", "execle", "execlp", "fexecve", "execveat",
    ] {
        let plain = common::untraced(&[prog, mode]);
        assert_eq!(plain.status.code(), Some(7), "{mode}: {plain:?}");
        let (out, text) = trace(&["-e", "p:w work"], &[prog, mode]);
        assert_eq!(out.status.code(), Some(7), "{mode}: {out:?}");
        // work(1), work(2), and work(3) after the failed exec.
        assert_eq!(
            events(&text).filter(|l| l.contains(" w: ")).count(),
            3,
            "{mode}: {text}"
        );
        let pid = events(&text)
            .next()
            .and_then(|l| l.split_whitespace().next())
            .and_then(|t| t.rsplit('-').next())
            .unwrap_or_else(|| panic!("{mode}: {text}"))
            .to_owned();
        assert!(
            text.contains(&format!(
                "# pid {pid}: exec of /nonexistent/ftprobe-no-such-program failed (No such file or directory); still traced\n"
            )),
            "{mode}: {text}"
        );
        let sh = std::fs::canonicalize("/bin/sh").unwrap();
        let ran = text
            .lines()
            .find_map(|l| {
                l.strip_prefix(&format!("# pid {pid} exec'd "))
                    .and_then(|r| r.strip_suffix(": not traced after exec"))
            })
            .unwrap_or_else(|| panic!("{mode}: no exec line: {text}"));
        assert_eq!(std::fs::canonicalize(ran).unwrap(), sh, "{mode}: {text}");
        assert!(
            text.contains(&format!(
                "# pid {pid}'s counts stop at its exec of {ran} (not traced after exec)\n"
            )),
            "{mode}: {text}"
        );
        assert!(
            text.contains(&format!("#   {:<44} {:>15} {:>15}\n", "w", 3, 0)),
            "{mode}: {text}"
        );
    }
}

/// Issue 9, item 5: a thread that a library's constructor starts was already running when
/// the agent started, and the program ran untraced with exit 0 (kprobe events silently not
/// armed). The agent now starts before that constructor: the thread is traced.
#[test]
fn thread_started_by_a_library_constructor_is_traced() {
    let prog = ftprobe_dev::ctors_fixture();
    let prog = prog.to_str().unwrap();
    let plain = common::untraced(&[prog]);
    assert_eq!(
        String::from_utf8_lossy(&plain.stdout),
        "ctors main done thread_work=4\n"
    );
    let (out, text) = trace(
        &["-F", "thread_work", "-e", "p:tw thread_work x=%di"],
        &[prog],
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.stdout, plain.stdout);
    let args: Vec<&str> = events(&text)
        .filter(|l| l.contains(" tw: "))
        .map(|l| l.rsplit(' ').next().unwrap())
        .collect();
    assert_eq!(args, ["x=0x0", "x=0x1", "x=0x2", "x=0x3"], "{text}");
    assert_eq!(
        events(&text)
            .filter(|l| l.ends_with(": thread_work <-worker_main"))
            .count(),
        4,
        "{text}"
    );
}

/// Issue 9, item 5: after a definition could not be armed (the program stopped before
/// `main`, exit 1), stdout still got a trace header and a `kprobe_profile` with `0+ -`.
#[test]
fn arming_failure_prints_nothing_that_looks_like_a_trace() {
    let prog = ftprobe_dev::ctors_fixture();
    let out = common::ftprobe()
        .args(["trace", "-e", "p:x no_such_symbol_anywhere", "--"])
        .arg(&prog)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "",
        "no header, no profile, no main"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with(
            "ftprobe-agent: trace_kprobe: error: Invalid probed address or symbol\n  Command: p:x no_such_symbol_anywhere\n"
        ),
        "{err}"
    );
}

/// Issue 9, item 5: a program built with `-fsanitize=address` aborted ("ASan runtime does
/// not come first in initial library list") and ftprobe blamed a setuid program or a loader
/// that ignores LD_PRELOAD. The sanitizer's runtime is now preloaded first. Built here with
/// the system's gcc; skipped where it has no ASan runtime.
#[test]
fn asan_program_is_traced() {
    let Some(exe) = common::build_at_test_time(
        "cc",
        "asan.c",
        "#include <stdio.h>\n#include <stdlib.h>\n\
         __attribute__((noinline)) int work(int x) { return x + 1; }\n\
         int main(void) { int s = 0; for (int i = 0; i < 3; i++) s += work(i);\n\
         char *p = malloc(8); p[0] = 1; free(p); printf(\"asan s=%d\\n\", s); return 0; }\n",
        &["-O1", "-g", "-fsanitize=address", "-pg", "-mfentry"],
    ) else {
        eprintln!("skipped: cc cannot build with -fsanitize=address here");
        return;
    };
    let exe = exe.to_str().unwrap();
    let plain = common::untraced(&[exe]);
    if !plain.status.success() {
        eprintln!("skipped: the ASan program does not run here: {plain:?}");
        return;
    }
    let (out, text) = trace(&["-F", "work"], &[exe]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "asan s=6\n");
    assert_eq!(
        events(&text)
            .filter(|l| l.ends_with(": work <-main"))
            .count(),
        3,
        "{text}"
    );
}

/// The agent starts from other objects' initializers: real programs with many libraries
/// (each initializer redirected, then put back) run traced exactly as untraced: the same
/// output and exit status, with a probe on `libc:malloc` hit.
#[test]
fn system_programs_run_traced_as_untraced() {
    let programs: &[&[&str]] = &[
        &["bash", "-c", "echo from bash; exit 4"],
        &["perl", "-e", "print 6*7, qq(\n)"],
        &["python3", "-c", "import json; print(json.dumps([1, 2]))"],
        &["git", "--version"],
        &["ls", "-d", "/"],
    ];
    let mut ran = 0;
    for cmd in programs {
        let Ok(plain) = std::process::Command::new(cmd[0]).args(&cmd[1..]).output() else {
            eprintln!("skipped {}: not installed", cmd[0]);
            continue;
        };
        let (out, text) = trace(&["-e", "p:m libc:malloc"], cmd);
        assert_eq!(out.status.code(), plain.status.code(), "{cmd:?}: {out:?}");
        assert_eq!(out.stdout, plain.stdout, "{cmd:?}");
        assert_eq!(out.stderr, plain.stderr, "{cmd:?}");
        let hits: u64 = text
            .lines()
            .find(|l| l.starts_with("#   m "))
            .and_then(|l| l.split_whitespace().nth(2))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{cmd:?}: {text}"));
        assert!(hits > 0, "{cmd:?}: {text}");
        ran += 1;
    }
    assert!(ran >= 2, "bash and ls at least");
}

/// Found by a user: a program that died of a signal under tracing (an int3 probe in a handler
/// on a too small `sigaltstack`) left only its exit status; the trace now says how it ended.
#[test]
fn a_program_killed_by_a_signal_is_said_so_in_the_trace() {
    let (out, text) = trace(&["-e", "p:g libc:getuid"], &["sh", "-c", "kill -SEGV $$"]);
    assert_eq!(out.status.code(), Some(128 + 11));
    let last = text.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("# pid ") && last.contains(" was killed by signal 11 (Segmentation fault"),
        "{text}"
    );
}

/// Found by a user: functions of the executable's `.preinit_array` run before any library is
/// initialized (libc included), so before the agent can start; their calls went untraced
/// without a word. The agent now says so.
#[test]
fn preinit_functions_are_reported_as_not_traced() {
    let Some(exe) = common::build_at_test_time(
        "cc",
        "pre.c",
        "__attribute__((noinline)) void f(const char *w) { __asm__ volatile(\"\"); }\n\
         static void pre(int c, char **v, char **e) { f(\"preinit\"); }\n\
         __attribute__((section(\".preinit_array\"), used))\n\
         static void (*pp)(int, char **, char **) = pre;\n\
         __attribute__((constructor)) static void ct(void) { f(\"ctor\"); }\n\
         int main(void) { f(\"main\"); return 0; }\n",
        &["-O1", "-pg", "-mfentry"],
    ) else {
        eprintln!("skipped: cc cannot build the program");
        return;
    };
    let (out, text) = trace(&["-F", "f"], &[exe.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let parents: Vec<&str> = events(&text)
        .map(|l| l.rsplit("<-").next().unwrap())
        .collect();
    assert_eq!(parents, ["ct", "main"], "{text}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(
            "the executable's 1 .preinit_array function(s) ran before any library was \
             initialized, so before the agent: calls made there are not traced"
        ),
        "{out:?}"
    );
}

/// Found by a user: a second definition of an event on another function was refused
/// (EVENT_EXIST), where the kernel adds the probe to the event (uprobe_events accepts `p:x A`
/// then `p:x B` with the same arguments). Both probes record under the one event, and
/// `kprobe_profile` counts its hits on both.
#[test]
fn an_event_can_have_several_probes() {
    let exe = ftprobe_dev::fixture("calls", ftprobe_dev::Flavour::Patchable).unwrap();
    let exe = exe.to_str().unwrap();
    // calls N: caller once, work N times.
    let (out, text) = trace(
        &["-e", "p:ev work a=%di:s32", "-e", "p:ev caller a=%di:s32"],
        &[exe, "3"],
    );
    assert!(out.status.success(), "{out:?}");
    let lines: Vec<&str> = events(&text).filter(|l| l.contains(" ev: (")).collect();
    assert_eq!(
        lines.iter().filter(|l| l.contains("(caller+")).count(),
        1,
        "{text}"
    );
    assert_eq!(
        lines.iter().filter(|l| l.contains("(work+")).count(),
        3,
        "{text}"
    );
    assert!(
        text.contains(&format!("#   {:<44} {:>15} {:>15}\n", "ev", 4, 0)),
        "{text}"
    );
    // kprobes/list: both probes.
    for f in ["work", "caller"] {
        assert!(
            text.lines()
                .any(|l| l.starts_with("#   ") && l.contains(&format!("  k  {f}+0x0  "))),
            "{f}: {text}"
        );
    }
}

/// Issue 26, item 8: bash defines its own `getenv`/`unsetenv` (its definitions win over the
/// C library's), so the agent's `unsetenv` of its session variables did nothing there: bash
/// saw `LD_PRELOAD` and 12 `FTPROBE_*` variables, and `/proc/PID/environ` listed them. The
/// agent edits `environ` itself now, and clears the bytes: bash sees only what the user set,
/// as untraced.
#[test]
fn bash_sees_only_the_users_environment() {
    let script = "echo \"[$LD_PRELOAD]\"; export -p | grep -c FTPROBE; \
                  tr '\\0' '\\n' < /proc/$$/environ | grep -c .";
    let plain = common::untraced(&["/bin/bash", "-c", script]);
    let plain = String::from_utf8_lossy(&plain.stdout).into_owned();
    let (out, text) = trace(&["-e", "p:g libc:getenv"], &["/bin/bash", "-c", script]);
    assert!(out.status.success(), "{out:?}");
    assert!(events(&text).any(|l| l.contains(" g: ")), "{text}");
    let traced = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(traced.starts_with("[]\n0\n"), "{traced}");
    assert_eq!(traced, plain);
}
