//! Attaching to a running process (`ftprobe trace -p PID`, issue 13). The target is
//! `attach_target` (ftprobe-dev), a multithreaded program blocked in system calls that
//! checks every result (an `EINTR` is counted), signals itself, and prints the same lines
//! for the same commands whatever happens around it: its output with ftprobe attaching and
//! detaching must equal its output without.

use std::io::{BufReader, Read, Write};
use std::process::{Command, Output, Stdio};

mod common;
use common::attach_target::{code_bytes, Target, CLEAN_END};
use common::ftprobe;

use ftprobe_dev::KillOnDrop;

fn attach_load(pid: i32) -> Output {
    ftprobe()
        .args(["attach-load", "-p", &pid.to_string()])
        .output()
        .expect("run ftprobe attach-load")
}

fn tasks(pid: i32) -> Vec<i32> {
    let mut v: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_str().unwrap().parse().unwrap())
        .collect();
    v.sort_unstable();
    v
}

/// `TracerPid` of every thread of `pid`.
fn tracer_pids(pid: i32) -> Vec<i32> {
    tasks(pid)
        .iter()
        .map(|t| {
            let s = std::fs::read_to_string(format!("/proc/{pid}/task/{t}/status")).unwrap();
            s.lines()
                .find_map(|l| l.strip_prefix("TracerPid:"))
                .unwrap()
                .trim()
                .parse()
                .unwrap()
        })
        .collect()
}

/// How many times the agent is mapped in `pid` (its mappings at file offset 0).
fn agent_loads(pid: i32) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap()
        .lines()
        .filter(|l| {
            l.ends_with("/libftprobe_agent.so") && l.split_whitespace().nth(2) == Some("00000000")
        })
        .count()
}

/// The open file descriptors of `pid`.
fn open_fds(pid: i32) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn state(pid: i32) -> String {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    s.rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn the_fixture_alone_prints_its_clean_end() {
    let mut t = Target::start(&[]);
    assert_eq!(t.window(1000), "window 1000 done\n");
    assert_eq!(t.quit(), (CLEAN_END.to_owned(), Some(0)));
}

/// The agent is loaded with the target's own `dlopen` by one of its threads while the
/// others are stopped, five times (the first loads it, the others find it loaded): the
/// program's blocked `nanosleep`s, `read`s and `fgets` never see EINTR, its own signals
/// are all delivered, its threads are the same, nobody traces it afterwards, and the agent
/// is mapped once.
#[test]
fn loading_the_agent_changes_nothing_the_program_sees() {
    let mut t = Target::start(&[]);
    let pid = t.pid();
    let before = tasks(pid);
    assert_eq!(before.len(), 5, "main and four threads");
    assert_eq!(agent_loads(pid), 0);
    for i in 0..5 {
        let o = attach_load(pid);
        assert!(o.status.success(), "attach {i}: {}", stderr(&o));
        assert!(
            String::from_utf8_lossy(&o.stdout).starts_with("loaded "),
            "{}",
            String::from_utf8_lossy(&o.stdout)
        );
        assert_eq!(agent_loads(pid), 1, "attach {i}");
        assert_eq!(tasks(pid), before, "attach {i}");
        assert!(tracer_pids(pid).iter().all(|&p| p == 0), "attach {i}");
        assert_eq!(t.window(1000), "window 1000 done\n");
    }
    assert_eq!(t.quit(), (CLEAN_END.to_owned(), Some(0)));
}

/// A stopped process (SIGSTOP: every thread in group-stop) is still stopped after the
/// agent was loaded, and runs as before once continued.
#[test]
fn a_stopped_process_stays_stopped() {
    let mut t = Target::start(&[]);
    let pid = t.pid();
    // SAFETY: kill has no memory effects; the pid is our live child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    while state(pid) != "T" {
        std::thread::yield_now();
    }
    let o = attach_load(pid);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(agent_loads(pid), 1);
    assert!(tracer_pids(pid).iter().all(|&p| p == 0));
    // A detached thread re-enters the group-stop on its way out of ptrace: soon after.
    let mut n = 0;
    while state(pid) != "T" && n < 5000 {
        std::thread::sleep(std::time::Duration::from_millis(1));
        n += 1;
    }
    assert_eq!(state(pid), "T", "stopped again after the detach");
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    assert_eq!(t.window(10), "window 10 done\n");
    assert_eq!(t.quit(), (CLEAN_END.to_owned(), Some(0)));
}

#[test]
fn no_such_process() {
    // A pid that was just used and is free now (pids are not reused at once).
    let mut c = Command::new("true").spawn().unwrap();
    let pid = c.id() as i32;
    c.wait().unwrap();
    let o = attach_load(pid);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains(&format!("no process with pid {pid}")),
        "{}",
        stderr(&o)
    );
}

/// ftprobe as `nobody` cannot attach to our (root's) process: EPERM, and the message says
/// whose process it is and what would allow it.
#[test]
fn another_users_process_is_eperm() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root (runs ftprobe as nobody against a root process)");
        return;
    }
    let t = Target::start(&[]);
    let pid = t.pid();
    let o = Command::new("setpriv")
        .args([
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(env!("CARGO_BIN_EXE_ftprobe"))
        .args(["attach-load", "-p", &pid.to_string()])
        .output()
        .expect("run setpriv");
    let err = stderr(&o);
    if err.contains("Permission denied") && !err.contains("EPERM") {
        eprintln!("skipped: nobody cannot run the ftprobe binary here: {err}");
        return;
    }
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("Operation not permitted (EPERM)"), "{err}");
    assert!(err.contains("belongs to uid 0"), "{err}");
    assert!(err.contains("CAP_SYS_PTRACE"), "{err}");
    assert_eq!(agent_loads(pid), 0);
    assert!(tracer_pids(pid).iter().all(|&p| p == 0));
    assert_eq!(t.quit(), (CLEAN_END.to_owned(), Some(0)));
}

/// A process another tracer holds (this test, with PTRACE_SEIZE) is refused, naming the
/// tracer, before anything is touched.
#[test]
fn an_already_traced_process_is_refused() {
    let t = Target::start(&[]);
    let pid = t.pid();
    // SAFETY: ptrace with integer arguments; the tracee is our child.
    let r = unsafe { libc::ptrace(libc::PTRACE_SEIZE, pid, 0usize, 0usize) };
    assert_eq!(r, 0, "seize: {}", std::io::Error::last_os_error());
    let o = attach_load(pid);
    // Let it go (from this thread, its tracer): detach needs a stop.
    // SAFETY: as above; waitpid writes our own status word.
    unsafe {
        assert_eq!(libc::ptrace(libc::PTRACE_INTERRUPT, pid, 0usize, 0usize), 0);
        let mut status = 0;
        assert_eq!(libc::waitpid(pid, &mut status, libc::__WALL), pid);
        assert_eq!(libc::ptrace(libc::PTRACE_DETACH, pid, 0usize, 0usize), 0);
    }
    let err = stderr(&o);
    assert!(!o.status.success(), "{err}");
    // The tracer is this test's thread.
    // SAFETY: gettid has no preconditions.
    let me = unsafe { libc::gettid() };
    assert!(
        err.contains(&format!("is already traced by process {me} ")),
        "{err}"
    );
    assert_eq!(agent_loads(pid), 0);
    assert_eq!(t.quit(), (CLEAN_END.to_owned(), Some(0)));
}

/// A process in strict seccomp mode would be killed by the agent's loading: refused before
/// it is touched, and it goes on (reads its byte, says `bye`, exits 0).
#[test]
fn a_strict_seccomp_process_is_refused() {
    let mut t = Target::start(&["strict"]);
    let pid = t.pid();
    let seccomp = || {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("Seccomp:").map(|v| v.trim().to_owned()))
            .unwrap()
    };
    while seccomp() != "1" {
        std::thread::yield_now();
    }
    let o = attach_load(pid);
    let err = stderr(&o);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("strict seccomp mode"), "{err}");
    assert!(tracer_pids(pid).iter().all(|&p| p == 0));
    t.send("x");
    assert_eq!(t.line(), "bye\n");
    assert_eq!(t.child.wait().unwrap().code(), Some(0));
}

/// `ftprobe trace -p PID ARGS -o FILE`, running until `stop` returns; then SIGINT. Returns
/// the CLI's output and the trace.
fn trace_attached(pid: i32, args: &[&str], during: impl FnOnce()) -> (Output, String) {
    let out_file =
        std::env::temp_dir().join(format!("ftprobe-attach-{}-{pid}.txt", std::process::id()));
    let mut cli = KillOnDrop::spawn(
        ftprobe()
            .args(["trace", "-p", &pid.to_string()])
            .args(args)
            .arg("-o")
            .arg(&out_file)
            .stderr(Stdio::piped()),
    )
    .unwrap();
    // A line says it is tracing (after the agent's messages, if any), or it fails.
    let mut err = BufReader::new(cli.stderr.take().unwrap());
    let mut first = String::new();
    if common::wait_until_tracing(&mut err, &mut first) {
        during();
        common::interrupt(&cli);
    }
    let mut rest = String::new();
    err.read_to_string(&mut rest).unwrap();
    let status = cli.wait().unwrap();
    let text = std::fs::read_to_string(&out_file).unwrap_or_default();
    let _ = std::fs::remove_file(&out_file);
    (
        Output {
            status,
            stdout: Vec::new(),
            stderr: (first + &rest).into_bytes(),
        },
        text,
    )
}

fn count(text: &str, what: &str) -> usize {
    text.lines()
        .filter(|l| !l.starts_with('#') && l.contains(what))
        .count()
}

/// `trace -p -F attach_window`: exactly the calls of the window made while attached, the
/// program's output as without ftprobe, and, after the detach, every byte of its code as it
/// was (the sites are the compiler's NOP5, which is their canonical NOP).
#[test]
fn trace_p_counts_a_window_exactly_and_leaves_the_code_as_it_was() {
    let mut t = Target::start(&[]);
    let pid = t.pid();
    let before = code_bytes(pid);
    let threads = tasks(pid);
    let fds = open_fds(pid);
    let (o, text) = trace_attached(pid, &["-F", "attach_window"], || {
        assert_eq!(t.window(777), "window 777 done\n");
    });
    // The ring buffer's memfd was the target's, and the agent closed it once mapped.
    assert_eq!(open_fds(pid), fds);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(count(&text, "attach_window <-main"), 777, "{}", stderr(&o));
    assert_eq!(count(&text, "attach_loop"), 0);
    assert_eq!(agent_loads(pid), 1);
    assert_eq!(tasks(pid), threads);
    assert!(tracer_pids(pid).iter().all(|&p| p == 0));
    // Every code mapping the program had (the agent brought libgcc_s.so.1 if the program
    // had not loaded it), byte for byte.
    let after = code_bytes(pid);
    for (m, b) in &before {
        let a = after
            .iter()
            .find(|(n, _)| n == m)
            .unwrap_or_else(|| panic!("{m} is gone"));
        if let Some(i) = (0..b.len()).find(|&i| b[i] != a.1[i]) {
            panic!(
                "{m}: byte {i:#x} changed after the detach: {:02x?} -> {:02x?}",
                &b[i..(i + 8).min(b.len())],
                &a.1[i..(i + 8).min(b.len())]
            );
        }
    }
    // After the detach the window's calls are not traced, and the program is as before.
    assert_eq!(t.window(100), "window 100 done\n");
    // A second session on the same process: the agent is loaded already, and starts again
    // with the new session's rings and options.
    // (Another tracer: the function tracer's filter must not stay.)
    let (o, text) = trace_attached(
        pid,
        &["-t", "function_graph", "-F", "attach_window"],
        || {
            assert_eq!(t.window(222), "window 222 done\n");
        },
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(count(&text, "attach_window()"), 222, "{}", stderr(&o));
    assert_eq!(count(&text, "attach_window <-"), 0);
    assert_eq!(agent_loads(pid), 1);
    assert_eq!(tasks(pid), threads);
    assert!(tracer_pids(pid).iter().all(|&p| p == 0));
    let again = code_bytes(pid);
    for (m, b) in &before {
        let a = again.iter().find(|(n, _)| n == m).unwrap();
        assert!(*b == a.1, "{m} changed after the second detach");
    }
    assert_eq!(t.quit(), (CLEAN_END.to_owned(), Some(0)));
}

/// `trace -p` with the function_graph tracer and a kprobe event on the window's function.
#[test]
fn trace_p_function_graph_and_kprobe_event() {
    let mut t = Target::start(&[]);
    let pid = t.pid();
    let (o, text) = trace_attached(
        pid,
        &[
            "-t",
            "function_graph",
            "-F",
            "attach_window",
            "-e",
            "p:win attach_window x=%di:s64",
        ],
        || {
            assert_eq!(t.window(50), "window 50 done\n");
        },
    );
    assert!(o.status.success(), "{}", stderr(&o));
    // A leaf `attach_window();`, or `attach_window() {` around the event's line.
    assert_eq!(count(&text, "attach_window()"), 50, "{text}");
    let xs: Vec<i64> = text
        .lines()
        .filter(|l| l.contains("win:"))
        .map(|l| {
            let v = l.rsplit_once(" x=").unwrap().1;
            v.trim_end_matches(" */").trim().parse().unwrap()
        })
        .collect();
    assert_eq!(xs, (0..50).collect::<Vec<i64>>(), "{text}");
    assert_eq!(t.quit(), (CLEAN_END.to_owned(), Some(0)));
}

/// The target's exit ends `trace -p` (a pidfd: it is not ftprobe's child).
#[test]
fn trace_p_ends_when_the_process_exits() {
    let mut t = Target::start(&[]);
    let pid = t.pid();
    let mut quit_out = None;
    let (o, text) = trace_attached(pid, &["-F", "attach_window"], || {
        assert_eq!(t.window(3), "window 3 done\n");
        t.send("quit\n");
        let mut rest = String::new();
        t.stdout.read_to_string(&mut rest).unwrap();
        quit_out = Some(rest);
        // Reaped here: the CLI sees the pidfd readable.
        t.child.wait().unwrap();
    });
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(count(&text, "attach_window <-main"), 3);
    assert_eq!(quit_out.as_deref(), Some(CLEAN_END));
}

/// A root ftprobe traces another user's process: the ring buffer is a memfd the target
/// makes (it could not open one of a root process's descriptors), twice.
#[test]
fn a_root_ftprobe_traces_another_users_process() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root (a root ftprobe against a process of nobody)");
        return;
    }
    let mut t = Target::start_as_nobody();
    let pid = t.pid();
    for n in [10, 20] {
        let (o, text) = trace_attached(pid, &["-F", "attach_window"], || {
            assert_eq!(t.window(n), format!("window {n} done\n"));
        });
        assert!(o.status.success(), "{}", stderr(&o));
        assert_eq!(count(&text, "attach_window <-main"), n as usize);
        assert_eq!(agent_loads(pid), 1);
        assert!(tracer_pids(pid).iter().all(|&p| p == 0));
    }
    assert_eq!(t.quit(), (CLEAN_END.to_owned(), Some(0)));
}

/// The thread that makes ftprobe's calls is the main thread when it is blocked in a system
/// call: here in `nanosleep` (`clock_nanosleep`, restarted through the kernel's restart
/// block): the call is restarted after each attach, never EINTR (the fixture counts one).
#[test]
fn a_nanosleep_of_the_calling_thread_is_restarted() {
    let mut t = Target::start(&[]);
    let pid = t.pid();
    t.send("nap 900\n");
    // Main is in clock_nanosleep (its first field in /proc/PID/syscall: 230).
    loop {
        let sc = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/syscall")).unwrap();
        if sc.starts_with("230 ") {
            break;
        }
        std::thread::yield_now();
    }
    for _ in 0..2 {
        let o = attach_load(pid);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    assert_eq!(t.line(), "nap done\n");
    assert_eq!(t.quit(), (CLEAN_END.to_owned(), Some(0)));
}

/// An int3 kprobe in the C library (no site there) in an attached process: hit by the
/// program's threads, then its byte is put back at the detach with every other code byte.
#[test]
fn trace_p_int3_probe_in_libc_is_removed_at_detach() {
    let mut t = Target::start(&[]);
    let pid = t.pid();
    let before = code_bytes(pid);
    let (o, text) = trace_attached(pid, &["-e", "p:ns libc:clock_nanosleep"], || {
        // main's own nap: at least one hit on a thread we know.
        t.send("nap 20\n");
        assert_eq!(t.line(), "nap done\n");
    });
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        text.lines()
            .any(|l| l.contains(&format!("-{pid} ")) && l.contains(" ns: ")),
        "{text}"
    );
    let after = code_bytes(pid);
    for (m, b) in &before {
        let a = after.iter().find(|(n, _)| n == m).unwrap();
        assert!(*b == a.1, "{m} changed after the detach");
    }
    assert_eq!(t.quit(), (CLEAN_END.to_owned(), Some(0)));
}

/// A `-pg` program whose two threads call `work` in a loop and check every result; it
/// prints `ready`, and `ok N` once a line on stdin stops it (N: the calls checked).
const GPROF_PROGRAM: &str = r#"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
static volatile int stop;
__attribute__((noinline)) long work(long x) { __asm__ volatile(""); return x + 1; }
static void *loop(void *a) {
    long i = 0;
    for (; !stop; i++)
        if (work(i) != i + 1) abort();
    return (void *)i;
}
int main(void) {
    pthread_t t[2];
    for (int i = 0; i < 2; i++) pthread_create(&t[i], 0, loop, 0);
    printf("ready\n");
    fflush(stdout);
    char line[8];
    if (!fgets(line, sizeof line, stdin)) return 2;
    stop = 1;
    long n = 0;
    for (int i = 0; i < 2; i++) { void *r; pthread_join(t[i], &r); n += (long)r; }
    printf("ok %d\n", n > 0);
    return 0;
}
"#;

/// Start `exe` (built from [`GPROF_PROGRAM`]) and wait for its `ready`: the child, its
/// output, its pid.
fn start_ready(exe: &std::path::Path) -> (KillOnDrop, BufReader<std::process::ChildStdout>, i32) {
    let mut child = KillOnDrop::spawn(
        Command::new(exe)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped()),
    )
    .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert_eq!(line, "ready\n");
    let pid = child.id() as i32;
    (child, out, pid)
}

/// Issue 26, item 2: a detach puts back the bytes the sites held at the attach, whatever
/// their form: a `-pg -mfentry` PIE calls `__fentry__` through the GOT (`ff 15`, 6 bytes;
/// gprof is on, the link used `-pg`), a `-pg` non-PIE calls `mcount` after the prologue
/// (`e8`). The busy threads are inside the trampolines when the detach stops them (a GOT
/// call put back then would have them return into its middle): those sites are put back
/// once the threads have left. Three sessions each; after every detach, every code byte is
/// what it was before the first attach, and the program's checks all pass.
#[test]
fn detach_puts_back_the_bytes_the_sites_held_at_the_attach() {
    for (name, flags) in [
        (
            "gprof_got.c",
            &["-O2", "-pg", "-mfentry", "-fPIE", "-pie", "-pthread"][..],
        ),
        (
            "gprof_mcount.c",
            &["-O2", "-pg", "-fno-pie", "-no-pie", "-pthread"][..],
        ),
    ] {
        let exe = common::build_at_test_time("cc", name, GPROF_PROGRAM, flags)
            .unwrap_or_else(|| panic!("cc {flags:?} builds {name}"));
        let (mut child, mut out, pid) = start_ready(&exe);
        let mut line = String::new();
        let before = code_bytes(pid);
        let site_form = |bytes: &[(String, Vec<u8>)]| {
            bytes
                .iter()
                .find(|(m, _)| m.ends_with(exe.to_str().unwrap()))
                .map(|(_, b)| b.clone())
                .expect("the program's code")
        };
        for round in 0..3 {
            let (o, text) = trace_attached(pid, &["-F", "work"], || {
                std::thread::sleep(std::time::Duration::from_millis(100));
            });
            assert!(o.status.success(), "{name} round {round}: {}", stderr(&o));
            assert!(
                count(&text, "work <-") > 0,
                "{name} round {round}: {}",
                stderr(&o)
            );
            let after = code_bytes(pid);
            for (m, b) in &before {
                let a = &after
                    .iter()
                    .find(|(n, _)| n == m)
                    .unwrap_or_else(|| panic!("{m} is gone"))
                    .1;
                if let Some(i) = (0..b.len()).find(|&i| b[i] != a[i]) {
                    panic!(
                        "{name} round {round}: {m}: byte {i:#x} changed after the detach: \
                         {:02x?} -> {:02x?}\n{}",
                        &b[i..(i + 8).min(b.len())],
                        &a[i..(i + 8).min(b.len())],
                        stderr(&o)
                    );
                }
            }
            assert_eq!(site_form(&after), site_form(&before));
        }
        child.stdin.take().unwrap().write_all(b"x\n").unwrap();
        line.clear();
        std::io::BufRead::read_line(&mut out, &mut line).unwrap();
        assert_eq!(line, "ok 1\n", "{name}");
        assert_eq!(child.wait().unwrap().code(), Some(0), "{name}");
    }
}

/// An attach is never refused because a busy thread was stopped inside a site (found by
/// `a_second_sigint_stops_a_long_print_out`, which failed on it now and then): with
/// `-fpatchable-function-entry=5` a site is five one-byte NOPs, and a thread stopped
/// between two of them would resume mid-instruction once they are one 5-byte NOP. The
/// agent refuses that attach for now; the CLI lets the threads run a moment and sends it
/// again. Two busy threads call `work` (its NOP run is a third of its instructions) while
/// 8 processes are attached to 4 times each: every attach traces, and the program's checks
/// all pass.
#[test]
fn an_attach_is_not_refused_for_a_thread_stopped_inside_a_nop_run() {
    let exe = common::build_at_test_time(
        "cc",
        "nop_run.c",
        GPROF_PROGRAM,
        &["-O2", "-fpatchable-function-entry=5", "-pthread"],
    )
    .expect("cc builds the program");
    for p in 0..8 {
        let (mut child, mut out, pid) = start_ready(&exe);
        for round in 0..4 {
            let o = ftprobe()
                .args([
                    "trace",
                    "-p",
                    &pid.to_string(),
                    "-F",
                    "work",
                    "--duration",
                    "0",
                ])
                .args(["-o", "/dev/null"])
                .output()
                .unwrap();
            assert!(
                o.status.success(),
                "process {p}, attach {round}: {}",
                stderr(&o)
            );
        }
        child.stdin.take().unwrap().write_all(b"x\n").unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(&mut out, &mut line).unwrap();
        assert_eq!(line, "ok 1\n", "process {p}");
        assert_eq!(child.wait().unwrap().code(), Some(0), "process {p}");
    }
}

/// Issue 26, item 6: Ctrl-C ends the session, and while ftprobe prints what the rings hold
/// (it says so after a second), a second Ctrl-C stops the printing at once and says how
/// many events were not printed; the entries line counts them as written.
#[test]
fn a_second_sigint_stops_a_long_print_out() {
    let exe = common::build_at_test_time(
        "cc",
        "print_out.c",
        GPROF_PROGRAM,
        &["-O2", "-fpatchable-function-entry=5", "-pthread"],
    )
    .expect("cc builds the program");
    let (mut child, mut out, pid) = start_ready(&exe);
    let mut line = String::new();
    let file = common::tmp_dir("second-sigint").join("trace.txt");
    // Rings of 256 MiB per thread: millions of lines to print after the first Ctrl-C.
    let mut cli = KillOnDrop::spawn(
        ftprobe()
            .args(["trace", "-p", &pid.to_string(), "-F", "work"])
            .args(["--buffer-size-kb", "262144", "-o"])
            .arg(&file)
            .stderr(Stdio::piped()),
    )
    .unwrap();
    let mut err = BufReader::new(cli.stderr.take().unwrap());
    let mut said = String::new();
    assert!(common::wait_until_tracing(&mut err, &mut said), "{said}");
    std::thread::sleep(std::time::Duration::from_secs(2));
    common::interrupt(&cli);
    let mut l = String::new();
    while !l.contains("still printing") {
        l.clear();
        assert!(
            std::io::BufRead::read_line(&mut err, &mut l).unwrap() > 0,
            "ftprobe ended before it said it was still printing: {said}"
        );
        said.push_str(&l);
    }
    let second = std::time::Instant::now();
    common::interrupt(&cli);
    let mut rest = String::new();
    err.read_to_string(&mut rest).unwrap();
    let status = cli.wait().unwrap();
    let took = second.elapsed();
    assert!(status.success(), "{said}{rest}");
    // Counting what is left, not printing it: ~1.3 s for 7 M events on a loaded 2-CPU VM.
    assert!(took < std::time::Duration::from_secs(15), "{took:?}");
    let not_printed: u64 = rest
        .lines()
        .find_map(|l| {
            l.strip_prefix("ftprobe: printing stopped by a second signal: ")?
                .strip_suffix(" events not printed")
        })
        .unwrap_or_else(|| panic!("no count of what was not printed: {rest}"))
        .parse()
        .unwrap();
    assert!(not_printed > 0, "{rest}");
    let text = std::fs::read_to_string(&file).unwrap();
    let printed = count(&text, "work <-");
    let entries = text
        .lines()
        .find_map(|l| l.strip_prefix("# entries-in-buffer/entries-written: "))
        .expect("the entries line");
    let (shown, written) = entries
        .split_whitespace()
        .next()
        .unwrap()
        .split_once('/')
        .unwrap();
    assert_eq!(shown.parse::<usize>().unwrap(), printed);
    assert!(written.parse::<u64>().unwrap() >= printed as u64 + not_printed);
    // The program ran on, unharmed.
    child.stdin.take().unwrap().write_all(b"x\n").unwrap();
    line.clear();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert_eq!(line, "ok 1\n");
    let _ = std::fs::remove_dir_all(file.parent().unwrap());
}

/// The end of a gone session (its ftprobe killed) is said by the next `trace -p` also when
/// the gone session's sites are 6-byte GOT calls that the next attach makes NOPs again
/// (the agent's answer for sites left hid the message: found by a fresh user's review).
#[test]
fn the_end_of_a_gone_session_is_said_for_a_gprof_pie_too() {
    let exe = common::build_at_test_time(
        "cc",
        "gone_got.c",
        GPROF_PROGRAM,
        &["-O2", "-pg", "-mfentry", "-fPIE", "-pie", "-pthread"],
    )
    .expect("cc builds the program");
    let (mut child, mut out, pid) = start_ready(&exe);
    let before = code_bytes(pid);
    let mut cli = KillOnDrop::spawn(
        ftprobe()
            .args([
                "trace",
                "-p",
                &pid.to_string(),
                "-F",
                "work",
                "-o",
                "/dev/null",
            ])
            .stderr(Stdio::piped()),
    )
    .unwrap();
    let mut err = BufReader::new(cli.stderr.take().unwrap());
    let mut said = String::new();
    assert!(common::wait_until_tracing(&mut err, &mut said), "{said}");
    // SAFETY: kill with a pid of our own child.
    unsafe { libc::kill(cli.id() as i32, libc::SIGKILL) };
    let _ = cli.wait();
    let (o, text) = trace_attached(pid, &["-F", "work"], || {
        std::thread::sleep(std::time::Duration::from_millis(100));
    });
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("which is gone, was ended first"),
        "{}",
        stderr(&o)
    );
    assert!(count(&text, "work <-") > 0, "{}", stderr(&o));
    let after = code_bytes(pid);
    for (m, b) in &before {
        let a = &after.iter().find(|(n, _)| n == m).expect("still mapped").1;
        assert!(b == a, "{m} changed after the detach\n{}", stderr(&o));
    }
    child.stdin.take().unwrap().write_all(b"x\n").unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert_eq!(line, "ok 1\n");
}

/// The C++ program of issue 26, item 5: threads calling `leaf(i)`, which throws on one call
/// in seven, caught by the caller, until SIGTERM; then `bad=0` if every result and every
/// catch was right.
const THROWER: &str = r#"
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <thread>
#include <vector>
static std::atomic<bool> stop;
extern "C" __attribute__((noinline)) int leaf(int i)
{
	if (i % 7 == 0)
		throw std::runtime_error("seven");
	return i * 2;
}
struct Counts { long calls = 0, caught = 0, bad = 0; };
static void worker(Counts *c)
{
	for (int i = 1; !stop.load(std::memory_order_relaxed); i++) {
		try {
			if (leaf(i) != 2 * i)
				c->bad++;
			c->calls++;
		} catch (const std::runtime_error &) {
			c->caught++;
			if (i % 7)
				c->bad++;
		}
	}
}
int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 2;
	signal(SIGTERM, [](int) { stop = true; });
	std::vector<Counts> c(n);
	std::vector<std::thread> t;
	for (int i = 0; i < n; i++)
		t.emplace_back(worker, &c[i]);
	printf("ready\n");
	fflush(stdout);
	for (auto &x : t)
		x.join();
	long calls = 0, caught = 0, bad = 0;
	for (auto &x : c) {
		calls += x.calls;
		caught += x.caught;
		bad += x.bad;
	}
	printf("bad=%ld calls>0=%d caught>0=%d\n", bad, calls > 0, caught > 0);
	return 0;
}
"#;

/// A program that leaves hooked calls by `longjmp`/`siglongjmp` (`leaf` jumps past `deep`
/// back into `jumper` on one call in five, in 2 threads) and switches stacks by
/// `swapcontext` (a coroutine whose `co_work` yields to the thread's main context in the
/// middle of every call, in a third thread); it checks every result (`bad=0`).
const JUMPER: &str = r#"
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>
#include <unistd.h>

static volatile int stop;
static __thread jmp_buf env;
static __thread sigjmp_buf senv;
static long bad;

__attribute__((noinline)) int leaf(int i) {
    if (i % 5 == 0) {
        if (i % 2)
            longjmp(env, 1);
        else
            siglongjmp(senv, 1);
    }
    return i + 1;
}
__attribute__((noinline)) int deep(int i) { int r = leaf(i); __asm__ volatile(""); return r + 1; }
__attribute__((noinline)) long jumper(int i) {
    if (i % 2) {
        if (setjmp(env)) return -1;
    } else {
        if (sigsetjmp(senv, 1)) return -1;
    }
    return deep(i);
}
static void *jumps(void *a) {
    for (int i = 1; !stop; i++) {
        long r = jumper(i);
        if (r != (i % 5 == 0 ? -1 : i + 2)) __atomic_add_fetch(&bad, 1, __ATOMIC_RELAXED);
    }
    return a;
}

static __thread ucontext_t main_ctx, co_ctx;
__attribute__((noinline)) int co_work(int i) {
    swapcontext(&co_ctx, &main_ctx);
    __asm__ volatile("");
    return i + 2;
}
static void co_body(void) {
    for (int i = 0;; i++)
        if (co_work(i) != i + 2) __atomic_add_fetch(&bad, 1, __ATOMIC_RELAXED);
}
static void *coroutine(void *a) {
    static __thread char stack[1 << 16];
    getcontext(&co_ctx);
    co_ctx.uc_stack.ss_sp = stack;
    co_ctx.uc_stack.ss_size = sizeof stack;
    co_ctx.uc_link = 0;
    makecontext(&co_ctx, co_body, 0);
    while (!stop) swapcontext(&main_ctx, &co_ctx);
    return a;
}

int main(void) {
    pthread_t t[3];
    pthread_create(&t[0], 0, jumps, 0);
    pthread_create(&t[1], 0, jumps, 0);
    pthread_create(&t[2], 0, coroutine, 0);
    printf("ready\n");
    fflush(stdout);
    char line[8];
    if (!fgets(line, sizeof line, stdin)) return 2;
    stop = 1;
    for (int i = 0; i < 3; i++) pthread_join(t[i], 0);
    printf("bad=%ld\n", bad);
    return 0;
}
"#;

/// Issue 26, item 5: an attached session follows `longjmp` and `swapcontext` for return
/// hooks, as the preloaded one does with its interposers: the attached agent probes the C
/// library's `siglongjmp` (which is `longjmp` and `_longjmp` too), `__longjmp_chk`
/// (`longjmp` under `_FORTIFY_SOURCE`), `setcontext` and `swapcontext` (jump-optimized:
/// a coroutine switch costs no trap). Before, function_graph closed each call a jump left
/// as `/* leaf: lost */`, late, at the next event deeper on the stack. Built with sites,
/// plain and with `-D_FORTIFY_SOURCE=2`; per program two sessions of return probes (4
/// returns of `deep` in 5 entries, up to the calls a session's ends cut; every `co_work`
/// entry returns; nothing missed) and one of function_graph (every call a jump left is
/// closed as `longjmp`, none as lost), and the program's checks all pass.
#[test]
fn return_hooks_in_an_attached_process_follow_longjmp_and_swapcontext() {
    for (name, flags) in [
        (
            "jumper.c",
            &["-O2", "-pthread", "-fpatchable-function-entry=5"][..],
        ),
        (
            "jumper_fortify.c",
            &[
                "-O2",
                "-D_FORTIFY_SOURCE=2",
                "-pthread",
                "-fpatchable-function-entry=5",
            ][..],
        ),
    ] {
        let exe = common::build_at_test_time("cc", name, JUMPER, flags).expect("cc builds it");
        let (mut child, mut out, pid) = start_ready(&exe);
        for round in 0..2 {
            let o = ftprobe()
                .args(["trace", "-p", &pid.to_string(), "--duration", "0.2"])
                .args(["-e", "r:dr deep", "-e", "p:dp deep"])
                .args(["-e", "r:cr co_work", "-e", "p:cp co_work"])
                .stdout(Stdio::piped())
                .output()
                .unwrap();
            assert!(o.status.success(), "{name} round {round}: {}", stderr(&o));
            let text = String::from_utf8_lossy(&o.stdout);
            let (dr, dr_missed) = common::profile(&text, "dr");
            let (dp, _) = common::profile(&text, "dp");
            let (cr, cr_missed) = common::profile(&text, "cr");
            let (cp, _) = common::profile(&text, "cp");
            let at = format!(
                "{name} round {round}: deep {dp}/{dr}/{dr_missed}, co_work {cp}/{cr}/{cr_missed}"
            );
            assert!(dp > 1000 && cp > 1000, "{at}");
            assert_eq!((dr_missed, cr_missed), (0, 0), "{at}");
            // Each of the 2 jumping threads may be cut between an entry and its return at
            // either end of the session; the coroutine's thread once.
            assert!((5 * dr as i64 - 4 * dp as i64).abs() <= 5 * 2 * 2, "{at}");
            assert!((cp as i64 - cr as i64).abs() <= 2, "{at}");
        }
        let file = common::tmp_dir("attach-longjmp").join(format!("{name}.txt"));
        let o = ftprobe()
            .args(["trace", "-p", &pid.to_string(), "--duration", "0.3"])
            .args([
                "-t",
                "function_graph",
                "-F",
                "deep",
                "-F",
                "leaf",
                "-F",
                "jumper",
            ])
            .args(["-F", "co_work", "-o"])
            .arg(&file)
            .output()
            .unwrap();
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        let text = std::fs::read_to_string(&file).unwrap();
        let jumped = count(&text, "} /* leaf: longjmp */");
        let entered = count(&text, "jumper() {");
        assert!(
            jumped > 100 && entered > 500,
            "{name}: {jumped} jumps, {entered} calls"
        );
        assert_eq!(count(&text, ": lost */"), 0, "{name}");
        assert!(count(&text, "co_work();") > 100, "{name}");
        child.stdin.take().unwrap().write_all(b"x\n").unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(&mut out, &mut line).unwrap();
        assert_eq!(line, "bad=0\n", "{name}");
        assert_eq!(child.wait().unwrap().code(), Some(0), "{name}");
    }
}

/// Issue 26, item 5: a return probe in an attached C++ process whose `leaf` throws on one
/// call in seven (4 threads, `g++ -O2 -pthread`, no site flags). After the detach, calls
/// still returning through ftprobe's return trampoline could not be unwound (the unwinder
/// probes were gone, and the trampoline has no unwind information): the next exception
/// through one ended the program in `std::terminate` (4 runs of 6 here). Now the detach
/// gives every hooked call its return address back (the unwinder probes stay until it
/// could). Five sessions one after another: the counts are 6 returns in 7 entries (up to
/// the calls a detach cut), the program lives through every detach, and on SIGTERM ends
/// with every result right.
#[test]
fn return_probes_in_an_attached_cpp_process_survive_exceptions_and_detach() {
    let Some(exe) = common::build_at_test_time("g++", "thrower.cc", THROWER, &["-O2", "-pthread"])
    else {
        eprintln!("skipped: g++ could not build the program");
        return;
    };
    let mut child = KillOnDrop::spawn(Command::new(&exe).arg("4").stdout(Stdio::piped())).unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert_eq!(line, "ready\n");
    let pid = child.id().to_string();
    for round in 0..5 {
        let o = ftprobe()
            .args(["trace", "-p", &pid, "--duration", "0.5"])
            .args([
                "-e",
                "r:lr leaf ret=$retval:s32",
                "-e",
                "p:lp leaf i=%di:s32",
            ])
            .stdout(Stdio::piped())
            .output()
            .unwrap();
        assert!(o.status.success(), "round {round}: {}", stderr(&o));
        let text = String::from_utf8_lossy(&o.stdout);
        let (lr, lr_missed) = common::profile(&text, "lr");
        let (lp, _) = common::profile(&text, "lp");
        assert!(lp > 1000, "round {round}: {lp} entries");
        assert_eq!(lr_missed, 0, "round {round}");
        // 6 returns in 7 calls; each of the 4 threads may be cut between its entry and its
        // return by the session's end.
        let (r7, p6) = (7 * lr as i64, 6 * lp as i64);
        assert!(
            (r7 - p6).abs() <= 7 * 4 * 2,
            "round {round}: {lr} returns, {lp} entries"
        );
        // SAFETY: kill with signal 0 only checks that the process exists.
        let alive = unsafe { libc::kill(child.id() as i32, 0) } == 0;
        assert!(alive, "round {round}: the program died");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    // SAFETY: kill has no memory effects; the pid is our live child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(
        (rest.as_str(), status.code()),
        ("bad=0 calls>0=1 caught>0=1\n", Some(0))
    );
}
