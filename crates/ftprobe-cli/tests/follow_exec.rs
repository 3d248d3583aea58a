//! `--follow-exec` (issue 13, item 5): a traced process that replaces itself with `exec` is
//! traced on in the new program, under its own name, with the new program's symbols (its
//! addresses overlap the old one's: both fixtures are `-no-pie`, and `exec_b`'s text covers
//! `exec_a`'s functions), in `trace` and in `record` + `replay`/`report`/`dump`. Without the
//! flag the exec is not followed, as before, and the trace says so with a hint. The counts
//! are checked against the programs' own, and their environments against what the user set.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;
use common::{ftprobe, tmp_dir};

use ftprobe_dev::{exec_a_fixture, exec_b_fixture, exec_b_static_fixture};

fn path(p: PathBuf) -> String {
    p.to_str().unwrap().to_owned()
}

/// `ftprobe trace ARGS -o FILE -- CMD` with `env` added to its environment: (output, trace).
fn trace_env(args: &[&str], cmd: &[&str], env: &[(&str, &str)]) -> (Output, String) {
    let dir = tmp_dir("follow-trace");
    let file = dir.join("trace.txt");
    let out = ftprobe()
        .arg("trace")
        .args(args)
        .arg("-o")
        .arg(&file)
        .arg("--")
        .args(cmd)
        .envs(env.iter().copied())
        .output()
        .expect("run ftprobe trace");
    let text = std::fs::read_to_string(&file).unwrap_or_default();
    std::fs::remove_dir_all(&dir).unwrap();
    (out, text)
}

fn trace(args: &[&str], cmd: &[&str]) -> (Output, String) {
    trace_env(args, cmd, &[])
}

/// The function tracer's event lines as (comm, pid, function).
fn events(text: &str) -> Vec<(String, u32, String)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && l.contains(": "))
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let task = f.next()?;
            let (comm, pid) = task.rsplit_once('-')?;
            let func = f.nth(2)?;
            Some((comm.to_owned(), pid.parse().ok()?, func.to_owned()))
        })
        .collect()
}

/// Calls per (comm, function) among `events`.
fn counts(events: &[(String, u32, String)]) -> BTreeMap<(String, String), u64> {
    let mut m = BTreeMap::new();
    for (comm, _, func) in events {
        *m.entry((comm.clone(), func.clone())).or_default() += 1;
    }
    m
}

/// A program's own counts from its stdout line `PROG name=N name=N ...`, as (PROG, name) ->
/// N (zero counts left out).
fn own_counts(stdout: &str, prog: &str) -> BTreeMap<(String, String), u64> {
    let line = stdout
        .lines()
        .find(|l| l.starts_with(&format!("{prog} ")) && !l.contains(" env "))
        .unwrap_or_else(|| panic!("no counts of {prog} in {stdout:?}"));
    line.split_whitespace()
        .skip(1)
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| ((prog.to_owned(), k.to_owned()), v.parse().unwrap()))
        .filter(|(_, v)| *v > 0)
        .collect()
}

/// The environment entries a fixture printed (`PROG env ENTRY`).
fn env_lines<'a>(stdout: &'a str, prog: &str) -> Vec<&'a str> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix(&format!("{prog} env ")))
        .collect()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A `#!/bin/sh` script in `dir` that execs `cmd`.
fn script(dir: &Path, cmd: &[&str]) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join("run.sh");
    std::fs::write(&p, format!("#!/bin/sh\nexec {}\n", cmd.join(" "))).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

/// The address and size of `sym` in `file` (`nm -S`).
fn nm(file: &str, sym: &str) -> (u64, u64) {
    let out = Command::new("nm").arg("-S").arg(file).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 4 && f[3] == sym).then(|| {
                (
                    u64::from_str_radix(f[0], 16).unwrap(),
                    u64::from_str_radix(f[1], 16).unwrap(),
                )
            })
        })
        .unwrap_or_else(|| panic!("{sym} not in {file}"))
}

/// (1) A shell script that execs a traced program: the program's events are in the trace
/// under its own name, each function as many times as the program says it called it; the
/// shell (no sites) is followed through; nothing of the session leaks into the program's
/// environment.
#[test]
fn a_script_that_execs_a_program_is_followed() {
    let dir = tmp_dir("follow-script");
    let b = path(exec_b_fixture());
    let sh = script(&dir, &[&b, "5"]);
    let (out, text) = trace(&["--follow-exec", "-F", "eb_*"], &[sh.to_str().unwrap()]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(out.status.code(), Some(3), "{out:?}\n{text}");
    let so = stdout(&out);
    let want = own_counts(&so, "exec_b");
    assert_eq!(want.values().sum::<u64>(), 15, "{so}");
    let ev = events(&text);
    assert_eq!(counts(&ev), want, "{text}");
    assert_eq!(env_lines(&so, "exec_b"), Vec::<&str>::new(), "{so}");
    let pid = ev[0].1;
    assert!(
        text.contains(&format!("# pid {pid} exec'd {b}: followed\n")),
        "{text}"
    );
    assert!(!text.contains("not traced after exec"), "{text}");
}

/// (2) Without --follow-exec: the exec'd program's events are not in the trace, the exec
/// line says so as before, and a hint names the option. The program still sees none of the
/// session's variables. A script (its shell has no sites) is stopped before main as before.
#[test]
fn without_follow_exec_the_exec_is_not_followed_and_the_trace_says_how_to() {
    let (a, b) = (path(exec_a_fixture()), path(exec_b_fixture()));
    let (out, text) = trace(&["-F", "e[ab]_*"], &[&a, "exec", &b, "4"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}\n{text}");
    let so = stdout(&out);
    let ev = events(&text);
    assert_eq!(counts(&ev), own_counts(&so, "exec_a"), "{text}");
    assert_eq!(own_counts(&so, "exec_b").values().sum::<u64>(), 12, "{so}");
    assert!(env_lines(&so, "exec_b").is_empty(), "{so}");
    let pid = ev[0].1;
    assert!(
        text.contains(&format!("# pid {pid} exec'd {b}: not traced after exec\n")),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "# pid {pid}'s counts stop at its exec of {b} (not traced after exec)\n"
        )),
        "{text}"
    );
    assert!(text.contains("--follow-exec"), "{text}");

    let dir = tmp_dir("nofollow-script");
    let sh = script(&dir, &[&b, "5"]);
    let (out, text) = trace(&["-F", "eb_*"], &[sh.to_str().unwrap()]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}\n{text}");
    assert!(events(&text).is_empty(), "{text}");
    assert!(!stdout(&out).contains("exec_b"), "{out:?}");
}

/// (3) A traced program that execs another traced program whose text covers the first's
/// addresses: every event is named from its own program (exec_a's records would be named
/// `eb_pad` from exec_b's symbols, exec_b's `main+...` from exec_a's), under its own comm,
/// in one pid, with the programs' own counts. The user's own LD_PRELOAD reaches the new
/// program as the user set it, and nothing else does.
#[test]
fn a_program_that_execs_another_keeps_each_ones_names() {
    let (a, b) = (path(exec_a_fixture()), path(exec_b_fixture()));
    // The premise: exec_b's eb_pad covers exec_a's functions.
    let (pad, pad_len) = nm(&b, "eb_pad");
    for f in ["ea_one", "ea_two"] {
        let (at, _) = nm(&a, f);
        assert!((pad..pad + pad_len).contains(&at), "{f} at {at:#x}");
    }
    let (out, text) = trace_env(
        &["--follow-exec", "-F", "e[ab]_*"],
        &[&a, "exec", &b, "4"],
        &[("LD_PRELOAD", "libm.so.6")],
    );
    assert_eq!(out.status.code(), Some(3), "{out:?}\n{text}");
    let so = stdout(&out);
    let mut want = own_counts(&so, "exec_a");
    want.extend(own_counts(&so, "exec_b"));
    assert_eq!(want.values().sum::<u64>(), 8 + 12, "{so}");
    let ev = events(&text);
    assert_eq!(counts(&ev), want, "{text}");
    assert!(ev.iter().all(|e| e.1 == ev[0].1), "one process: {text}");
    // exec_a's events all come before exec_b's.
    let first_b = ev.iter().position(|e| e.0 == "exec_b").unwrap();
    assert!(ev[first_b..].iter().all(|e| e.0 == "exec_b"), "{text}");
    for prog in ["exec_a", "exec_b"] {
        assert_eq!(
            env_lines(&so, prog),
            vec!["LD_PRELOAD=libm.so.6"],
            "{prog}: {so}"
        );
    }
}

/// (4) `sh -c 'exec PROGRAM'`.
#[test]
fn sh_c_exec_is_followed() {
    let b = path(exec_b_fixture());
    let (out, text) = trace(
        &["--follow-exec", "-F", "eb_*"],
        &["sh", "-c", &format!("exec {b} 3")],
    );
    assert_eq!(out.status.code(), Some(3), "{out:?}\n{text}");
    let so = stdout(&out);
    let want = own_counts(&so, "exec_b");
    assert_eq!(want.values().sum::<u64>(), 9, "{so}");
    assert_eq!(counts(&events(&text)), want, "{text}");
    assert!(env_lines(&so, "exec_b").is_empty(), "{so}");
}

/// The event lines without their pid and time columns: `comm [cpu]` is dropped too (the
/// CPU may differ), leaving comm and the function columns.
fn strip(text: &str) -> Vec<String> {
    events(text)
        .into_iter()
        .map(|(comm, _, func)| format!("{comm} {func}"))
        .zip(
            text.lines()
                .filter(|l| !l.starts_with('#') && l.contains(": "))
                .map(|l| l.split_once(": ").unwrap().1.to_owned()),
        )
        .map(|(a, b)| format!("{a} | {b}"))
        .collect()
}

/// (5) `record --follow-exec` then `replay`: the same events as the live trace (lines
/// apart from the pid and time columns), named right although the recording's objects
/// table holds both programs at overlapping addresses; `report` counts each function as the
/// programs do; a function_graph recording's `report` and `dump --chrome` name them right.
#[test]
fn record_then_replay_equals_the_live_trace() {
    let (a, b) = (path(exec_a_fixture()), path(exec_b_fixture()));
    let cmd = [a.as_str(), "exec", b.as_str(), "4"];
    let (out, live) = trace(&["--follow-exec", "-F", "e[ab]_*"], &cmd);
    assert_eq!(out.status.code(), Some(3), "{out:?}\n{live}");
    let so = stdout(&out);
    let mut want = own_counts(&so, "exec_a");
    want.extend(own_counts(&so, "exec_b"));

    let dir = tmp_dir("follow-record");
    let data = dir.join("rec");
    let out = common::record_to(&data, &["--follow-exec", "-F", "e[ab]_*"], cmd);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let info = std::fs::read_to_string(data.join("info.json")).unwrap();
    assert!(info.contains("\"images\""), "{info}");
    let replay = ftprobe()
        .arg("replay")
        .arg("-d")
        .arg(&data)
        .output()
        .unwrap();
    assert!(replay.status.success(), "{replay:?}");
    let replayed = stdout(&replay);
    assert_eq!(strip(&replayed), strip(&live), "{replayed}\n{live}");
    assert_eq!(counts(&events(&replayed)), want, "{replayed}");
    let pid = events(&replayed)[0].1;
    assert!(
        replayed.contains(&format!("# pid {pid} exec'd {b}: followed\n")),
        "{replayed}"
    );
    let report = ftprobe()
        .arg("report")
        .arg("-d")
        .arg(&data)
        .output()
        .unwrap();
    let report = stdout(&report);
    for ((_, func), n) in &want {
        assert!(
            report
                .lines()
                .any(|l| l.split_whitespace().collect::<Vec<_>>() == [&n.to_string(), func]),
            "{func} x{n}: {report}"
        );
    }
    assert!(
        !report.contains("eb_pad") && !report.contains("main"),
        "{report}"
    );

    // function_graph: report's calls and dump --chrome's slices by name.
    let out = common::record_to(
        &data,
        &["--follow-exec", "-t", "function_graph", "-F", "e[ab]_*"],
        cmd,
    );
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let report = ftprobe()
        .arg("report")
        .arg("-d")
        .arg(&data)
        .output()
        .unwrap();
    let report = stdout(&report);
    for ((_, func), n) in &want {
        assert!(
            report.lines().any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.last() == Some(&func.as_str()) && f.contains(&n.to_string().as_str())
            }),
            "{func} x{n}: {report}"
        );
    }
    let chrome = ftprobe()
        .arg("dump")
        .arg("-d")
        .arg(&data)
        .arg("--chrome")
        .arg("-")
        .output()
        .unwrap();
    let chrome = stdout(&chrome);
    for ((_, func), n) in &want {
        let exact = chrome
            .lines()
            .filter(|l| l.contains("\"ph\":\"X\"") && l.contains(&format!("\"name\":\"{func}\"")))
            .count() as u64;
        assert_eq!(exact, *n, "{func}: {chrome}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// (6) An exec from a program with other threads (they die at the exec, inside their
/// rings): ftprobe ends, their events before the exec are there, the new program's after.
#[test]
fn exec_from_a_multithreaded_program() {
    let (a, b) = (path(exec_a_fixture()), path(exec_b_fixture()));
    let (out, text) = trace(
        &["--follow-exec", "-F", "e[ab]_*"],
        &[&a, "threads", &b, "3"],
    );
    assert_eq!(out.status.code(), Some(3), "{out:?}\n{text}");
    let so = stdout(&out);
    let mut want = own_counts(&so, "exec_a");
    assert_eq!(
        want.get(&("exec_a".into(), "ea_thread".into())),
        Some(&3),
        "{so}"
    );
    want.extend(own_counts(&so, "exec_b"));
    let ev = events(&text);
    assert_eq!(counts(&ev), want, "{text}");
    assert!(env_lines(&so, "exec_b").is_empty(), "{so}");
    // Three threads of exec_a called ea_thread, each once.
    let tids: std::collections::BTreeSet<&str> = text
        .lines()
        .filter(|l| l.contains(" ea_thread <-"))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(tids.len(), 3, "{text}");
}

/// An exec that cannot be followed (a static program: no dynamic loader to preload the
/// agent) is said so, and the program runs with its own environment.
#[test]
fn an_exec_of_a_static_program_says_why_it_is_not_followed() {
    let (a, s) = (path(exec_a_fixture()), path(exec_b_static_fixture()));
    let (out, text) = trace(&["--follow-exec", "-F", "e[ab]_*"], &[&a, "exec", &s, "2"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}\n{text}");
    let so = stdout(&out);
    assert_eq!(counts(&events(&text)), own_counts(&so, "exec_a"), "{text}");
    assert_eq!(own_counts(&so, "exec_b").values().sum::<u64>(), 6, "{so}");
    assert!(env_lines(&so, "exec_b").is_empty(), "{so}");
    let pid = events(&text)[0].1;
    assert!(
        text.contains(&format!(
            "# pid {pid} exec'd {s}: not traced after exec (it is statically linked: no dynamic \
             loader to preload the agent)\n"
        )),
        "{text}"
    );
}

/// A program that closed every descriptor before its exec (the rings' memfd with them): the
/// exec is not followed, and the trace says why.
#[test]
fn an_exec_after_the_program_closed_the_rings_descriptor_says_so() {
    let (a, b) = (path(exec_a_fixture()), path(exec_b_fixture()));
    let (out, text) = trace(
        &["--follow-exec", "-F", "e[ab]_*"],
        &[&a, "closefds", &b, "2"],
    );
    assert_eq!(out.status.code(), Some(3), "{out:?}\n{text}");
    let so = stdout(&out);
    assert_eq!(counts(&events(&text)), own_counts(&so, "exec_a"), "{text}");
    assert_eq!(own_counts(&so, "exec_b").values().sum::<u64>(), 6, "{so}");
    assert!(env_lines(&so, "exec_b").is_empty(), "{so}");
    let pid = events(&text)[0].1;
    assert!(
        text.contains(&format!(
            "# pid {pid} exec'd {b}: not traced after exec (the program closed ftprobe's ring \
             descriptor)\n"
        )),
        "{text}"
    );
}

/// An exec that looked followable but whose new program never started the agent (here a
/// `#!` script whose interpreter is a script whose interpreter is static: the wrapper
/// checks one level of interpreter): the trace says at the end that it was not traced.
#[test]
fn an_exec_whose_agent_never_starts_is_named_at_the_end() {
    use std::os::unix::fs::PermissionsExt;
    let (a, s) = (path(exec_a_fixture()), path(exec_b_static_fixture()));
    let dir = tmp_dir("follow-nested");
    let inner = dir.join("inner");
    std::fs::write(&inner, format!("#!{s}\n")).unwrap();
    let outer = dir.join("outer");
    std::fs::write(&outer, format!("#!{}\n", inner.display())).unwrap();
    for p in [&inner, &outer] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let outer = path(outer);
    let (out, text) = trace(&["--follow-exec", "-F", "e[ab]_*"], &[&a, "exec", &outer]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(out.status.code(), Some(3), "{out:?}\n{text}");
    let so = stdout(&out);
    assert!(so.contains("exec_b eb_alpha=0 eb_beta=0\n"), "{so}");
    assert_eq!(counts(&events(&text)), own_counts(&so, "exec_a"), "{text}");
    let pid = events(&text)[0].1;
    assert!(
        text.contains(&format!("# pid {pid} exec'd {outer}: followed\n")),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "# pid {pid} exec'd {outer} but ftprobe's agent never started there: not traced \
             after exec"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "# pid {pid}'s counts stop at its exec of {outer} (not traced after exec)\n"
        )),
        "{text}"
    );
}

/// A program that forks after a followed exec: the child runs the exec'd program's image
/// (its records are named from it), in a pid of its own.
#[test]
fn a_child_forked_by_an_execd_program_is_named_from_its_image() {
    let (a, b) = (path(exec_a_fixture()), path(exec_b_fixture()));
    let (out, text) = trace(
        &["--follow-exec", "-F", "e[ab]_*"],
        &[&a, "exec", &b, "4", "fork"],
    );
    assert_eq!(out.status.code(), Some(3), "{out:?}\n{text}");
    let so = stdout(&out);
    let mut want = own_counts(&so, "exec_a");
    want.extend(own_counts(&so, "exec_b"));
    let ev = events(&text);
    assert_eq!(counts(&ev), want, "{text}");
    let pa = ev.iter().find(|e| e.0 == "exec_a").unwrap().1;
    let pb = ev.iter().find(|e| e.0 == "exec_b").unwrap().1;
    assert_ne!(pa, pb, "{text}");
}

/// A `vfork` child that execs (followed, in its own pid) while the parent goes on traced:
/// the child's records are named from the new program, the parent's later ones from its own
/// (the new program's text covers the parent's addresses).
#[test]
fn a_vfork_child_that_execs_is_followed_and_the_parent_keeps_its_names() {
    let (a, b) = (path(exec_a_fixture()), path(exec_b_fixture()));
    let (out, text) = trace(&["--follow-exec", "-F", "e[ab]_*"], &[&a, "vfork", &b, "3"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}\n{text}");
    let so = stdout(&out);
    let mut want = own_counts(&so, "exec_a");
    assert_eq!(
        want.get(&("exec_a".into(), "ea_one".into())),
        Some(&5),
        "{so}"
    );
    want.extend(own_counts(&so, "exec_b"));
    let ev = events(&text);
    assert_eq!(counts(&ev), want, "{text}");
    assert!(env_lines(&so, "exec_b").is_empty(), "{so}");
    let pa = ev.iter().find(|e| e.0 == "exec_a").unwrap().1;
    let pb = ev.iter().find(|e| e.0 == "exec_b").unwrap().1;
    assert_ne!(pa, pb, "{text}");
    assert!(
        text.contains(&format!("# pid {pb} exec'd {b}: followed\n")),
        "{text}"
    );
}
