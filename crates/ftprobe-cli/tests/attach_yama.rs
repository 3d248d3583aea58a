//! `ftprobe trace -p PID` under Yama's `kernel.yama.ptrace_scope` (issue 13): refused with
//! a message that names the setting, its value and what would allow the attach, exit
//! status 1, and the process untouched.
//!
//! What the kernel does (security/yama/yama_lsm.c, read for facts), for a
//! `PTRACE_MODE_ATTACH` access (`PTRACE_SEIZE`, as ftprobe does) after the classic checks
//! passed (same user, dumpable):
//! - 0: nothing more;
//! - 1 (relational): allowed only if the tracer is an ancestor of the tracee, or the tracee
//!   named it (or any process) with `prctl(PR_SET_PTRACER)`, or the tracer has
//!   CAP_SYS_PTRACE in the tracee's user namespace;
//! - 2 (capability): allowed only with CAP_SYS_PTRACE there;
//! - 3 (no attach): always refused, and once 3 is written the sysctl's minimum becomes 3:
//!   it cannot be lowered until reboot.
//!
//! Writing the sysctl needs CAP_SYS_PTRACE (root).
//!
//! So the test, as root: starts the target (`attach_target`) as `nobody`, a child of the
//! test, and runs ftprobe as `nobody` too (same user, not the target's ancestor: a
//! sibling, without capabilities). At 0 (or without Yama) that attach must succeed: the
//! refusals that follow are Yama's, not the classic rules'. It sets 1, then 2 (never 3: a
//! machine would keep it until reboot, and every other attach on it would fail), and 3 is
//! checked only when the machine is at 3 already. A drop guard puts the original value back
//! whatever happens (a failed assertion unwinds through it). Root's ftprobe (CAP_SYS_PTRACE,
//! which the messages name as a way out) must attach at 1 and 2.
//!
//! While it runs, attaches elsewhere on the machine see the changed setting: run it alone
//! on a shared machine with Yama.

use std::process::{Command, Output};

mod common;
use common::attach_target::{Target, AS_NOBODY, CLEAN_END};
use common::ftprobe;

const PTRACE_SCOPE: &str = "/proc/sys/kernel/yama/ptrace_scope";

fn agent_loads(pid: i32) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap()
        .lines()
        .filter(|l| {
            l.ends_with("/libftprobe_agent.so") && l.split_whitespace().nth(2) == Some("00000000")
        })
        .count()
}

fn tracer_pids(pid: i32) -> Vec<i32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .filter_map(|t| {
            let s = std::fs::read_to_string(t.path().join("status")).ok()?;
            s.lines()
                .find_map(|l| l.strip_prefix("TracerPid:"))?
                .trim()
                .parse()
                .ok()
        })
        .collect()
}

/// `ftprobe trace -p PID -F attach_window --duration 0` (attach, start, stop, detach), as
/// `nobody` or as ourselves (root).
fn trace_p(pid: i32, as_nobody: bool) -> Output {
    let mut cmd = if as_nobody {
        let mut c = Command::new("setpriv");
        c.args(AS_NOBODY).arg(env!("CARGO_BIN_EXE_ftprobe"));
        c
    } else {
        ftprobe()
    };
    cmd.args(["trace", "-p", &pid.to_string(), "-F", "attach_window"])
        .args(["--duration", "0"])
        .output()
        .expect("run ftprobe trace -p")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The attach succeeded, and left nothing traced.
fn assert_attached(o: &Output, pid: i32, what: &str) {
    let err = stderr(o);
    assert!(o.status.success(), "{what}: {err}");
    assert!(
        err.contains(&format!("ftprobe: tracing process {pid} ")),
        "{what}: {err}"
    );
    assert!(tracer_pids(pid).iter().all(|&p| p == 0), "{what}");
}

/// Sets `ptrace_scope` and puts the value it found back when dropped (also when a failed
/// assertion unwinds).
struct ScopeGuard {
    original: String,
}

impl ScopeGuard {
    fn new() -> ScopeGuard {
        ScopeGuard {
            original: std::fs::read_to_string(PTRACE_SCOPE)
                .unwrap()
                .trim()
                .to_owned(),
        }
    }

    fn set(&self, scope: u32) {
        std::fs::write(PTRACE_SCOPE, format!("{scope}\n"))
            .unwrap_or_else(|e| panic!("setting ptrace_scope to {scope}: {e}"));
        assert_eq!(
            std::fs::read_to_string(PTRACE_SCOPE).unwrap().trim(),
            scope.to_string()
        );
    }
}

impl Drop for ScopeGuard {
    fn drop(&mut self) {
        if let Err(e) = std::fs::write(PTRACE_SCOPE, format!("{}\n", self.original)) {
            eprintln!(
                "could not restore kernel.yama.ptrace_scope to {}: {e}",
                self.original
            );
        }
    }
}

/// The refusal of `nobody`'s `trace -p` at `scope`: the message and exit status, and the
/// process as it was.
fn assert_refused(t: &mut Target, scope: u32) {
    let pid = t.pid();
    let loads = agent_loads(pid);
    let o = trace_p(pid, true);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "scope {scope}: {err}");
    assert!(
        err.contains(&format!(
            "cannot attach to process {pid}: Operation not permitted (EPERM)"
        )),
        "scope {scope}: {err}"
    );
    assert!(
        err.contains(&format!("kernel.yama.ptrace_scope is {scope} ")),
        "scope {scope}: {err}"
    );
    // Same user: the classic rules are not the cause, and not said to be.
    assert!(!err.contains("belongs to uid"), "scope {scope}: {err}");
    // What would allow it.
    let allows: &[&str] = match scope {
        1 => &[
            "`sysctl kernel.yama.ptrace_scope=0`",
            "CAP_SYS_PTRACE",
            "`ftprobe trace -- PROGRAM ...`",
        ],
        2 => &["CAP_SYS_PTRACE", "`ftprobe trace -- PROGRAM ...`"],
        _ => &["until the next reboot", "`ftprobe trace -- PROGRAM ...`"],
    };
    for a in allows {
        assert!(err.contains(a), "scope {scope}: no {a:?} in {err}");
    }
    assert!(!err.contains("tracing process"), "scope {scope}: {err}");
    assert_eq!(agent_loads(pid), loads, "scope {scope}");
    assert!(tracer_pids(pid).iter().all(|&p| p == 0), "scope {scope}");
    assert_eq!(t.window(10), "window 10 done\n", "scope {scope}");
}

#[test]
fn yama_ptrace_scope_refusals_say_why() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!(
            "skipped: needs root (sets kernel.yama.ptrace_scope, runs ftprobe and its target \
             as nobody)"
        );
        return;
    }
    let mut t = Target::start_as_nobody();
    let pid = t.pid();
    let scope_now: Option<u32> = std::fs::read_to_string(PTRACE_SCOPE)
        .ok()
        .map(|s| s.trim().parse().unwrap());
    if scope_now == Some(3) {
        // Cannot be lowered: the refusal is all there is to see.
        assert_refused(&mut t, 3);
        let o = trace_p(pid, false);
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        assert!(stderr(&o).contains("ptrace_scope is 3"), "{}", stderr(&o));
        assert_eq!(t.quit(), (CLEAN_END.to_owned(), Some(0)));
        eprintln!("ptrace_scope is 3 here: only its refusal was checked (1 and 2 need a reboot)");
        return;
    }
    let guard = scope_now.map(|_| ScopeGuard::new());
    if let Some(g) = &guard {
        g.set(0);
    }
    // The control: nobody's ftprobe attaches to nobody's process when Yama does not stand
    // in the way (the classic rules allow it).
    let o = trace_p(pid, true);
    let err = stderr(&o);
    if err.contains("Permission denied") && !err.contains("EPERM") {
        eprintln!("skipped: nobody cannot run the ftprobe binary or its agent here: {err}");
        return;
    }
    assert_attached(&o, pid, "nobody, ptrace_scope 0 or no Yama");
    assert_eq!(t.window(10), "window 10 done\n");
    let Some(guard) = guard else {
        assert_eq!(t.quit(), (CLEAN_END.to_owned(), Some(0)));
        eprintln!(
            "skipped: no Yama on this kernel ({PTRACE_SCOPE} is absent): only the control \
             attach (nobody to nobody) was checked"
        );
        return;
    };
    for scope in [1, 2] {
        guard.set(scope);
        assert_refused(&mut t, scope);
        // The way out the message names first for root: CAP_SYS_PTRACE.
        let o = trace_p(pid, false);
        assert_attached(&o, pid, &format!("root, ptrace_scope {scope}"));
        assert_eq!(t.window(10), "window 10 done\n");
    }
    drop(guard);
    assert_eq!(
        std::fs::read_to_string(PTRACE_SCOPE).unwrap().trim(),
        scope_now.unwrap().to_string(),
        "restored"
    );
    assert_eq!(t.quit(), (CLEAN_END.to_owned(), Some(0)));
}
