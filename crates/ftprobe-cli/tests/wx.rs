//! W^X and leaving no mark (issue 26, items 1-5): no mapping of a traced program is ever
//! writable and executable, in every probe mode, started under ftprobe or attached; and a
//! program attached to and detached from again and again in every mode (`attach_target
//! prof`: busy, blocked and sleeping threads that check their own results, gprof's
//! profiling timer on) has after each detach the code bytes and the mapping protections it
//! had before the first attach, no more descriptors and no growing memory, and ends clean
//! (no EINTR, no failed call, every signal delivered).

use std::io::{BufRead, BufReader};
use std::process::Stdio;

mod common;
use common::attach_target::{code_bytes, Target, CLEAN_END};
use common::ftprobe;

use ftprobe_dev::{attach_target_fixture, KillOnDrop};

/// A probe mode: its name, extra environment, `trace` options.
type Mode = (
    &'static str,
    &'static [(&'static str, &'static str)],
    &'static [&'static str],
);

/// The probe modes.
const MODES: &[Mode] = &[
    ("function tracer", &[], &["-F", "attach_*"]),
    (
        "function_graph",
        &[],
        &["-t", "function_graph", "-F", "attach_*"],
    ),
    ("site kprobe", &[], &["-e", "p:s attach_window x=%di"]),
    (
        "int3",
        &[("FTPROBE_KPROBES_OPTIMIZATION", "0")],
        &["-e", "p:q attach_loop+9 x=%di"],
    ),
    ("optprobe", &[], &["-e", "p:q attach_loop+9 x=%di"]),
    (
        "return probe",
        &[],
        &[
            "-e",
            "r:r attach_window ret=$retval",
            "-e",
            "p:n libc:nanosleep",
        ],
    ),
    (
        "two probes in one function",
        &[],
        &["-e", "p:a attach_loop+5", "-e", "p:b attach_loop+9 x=%di"],
    ),
];

/// `/proc/PID/maps`, line by line: (start, end, permissions, path).
fn maps(pid: i32) -> Vec<(u64, u64, String, String)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    text.lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (s, e) = f[0].split_once('-').unwrap();
            (
                u64::from_str_radix(s, 16).unwrap(),
                u64::from_str_radix(e, 16).unwrap(),
                f[1].to_owned(),
                f.get(5).copied().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

fn writable_and_executable(pid: i32) -> Vec<String> {
    maps(pid)
        .into_iter()
        .filter(|(_, _, p, _)| p.contains('w') && p.contains('x'))
        .map(|(s, e, p, n)| format!("{s:x}-{e:x} {p} {n}"))
        .collect()
}

/// Every byte range mapped in `before` has the same permissions in `after` (new mappings,
/// the agent's and its rings, may be there too).
fn same_protections(
    before: &[(u64, u64, String, String)],
    after: &[(u64, u64, String, String)],
) -> Result<(), String> {
    for (s, e, p, n) in before {
        let mut at = *s;
        while at < *e {
            let Some((_, ae, ap, _)) = after.iter().find(|(as_, ae, _, _)| *as_ <= at && at < *ae)
            else {
                return Err(format!("{at:x} ({n}) unmapped"));
            };
            if ap != p {
                return Err(format!("{at:x} ({n}): {p} before, {ap} after"));
            }
            at = *ae;
        }
    }
    Ok(())
}

/// Issue 26, item 3: during a `trace -- prog`, the program's and ld.so's text were `rwxp`,
/// libc's after a probe there, and ftprobe's trampoline areas were anonymous `rwxp`
/// mappings. Now code is written through `/proc/self/mem` and every mapping keeps its
/// protection: none is writable and executable, in any mode, while the program runs its
/// probed code.
#[test]
fn no_mapping_is_writable_and_executable_while_tracing() {
    for (name, env, args) in MODES {
        let out = common::tmp_dir("wx").join("trace.txt");
        let mut cmd = ftprobe();
        cmd.envs(env.iter().copied())
            .arg("trace")
            .args(*args)
            .arg("-o")
            .arg(&out)
            .arg("--")
            .arg(attach_target_fixture());
        let mut t = Target::spawn(cmd);
        let pid = common::child_of(t.pid() as u32) as i32;
        assert_eq!(t.window(200), "window 200 done\n", "{name}");
        assert_eq!(writable_and_executable(pid), Vec::<String>::new(), "{name}");
        assert_eq!(t.quit(), (CLEAN_END.to_owned(), Some(0)), "{name}");
        let text = std::fs::read_to_string(&out).unwrap_or_default();
        assert!(
            text.contains("attach_"),
            "{name}: traced nothing:\n{text:.2000}"
        );
    }
}

/// `ftprobe trace -p PID ARGS` until it says it traces; ended by [`end`].
fn attach(pid: i32, env: &[(&str, &str)], args: &[&str]) -> (KillOnDrop, String) {
    let mut cli = KillOnDrop::spawn(
        ftprobe()
            .envs(env.iter().copied())
            .args(["trace", "-p", &pid.to_string()])
            .args(args)
            .args(["-o", "/dev/null"])
            .stderr(Stdio::piped()),
    )
    .unwrap();
    let mut err = BufReader::new(cli.stderr.take().unwrap());
    let mut said = String::new();
    assert!(common::wait_until_tracing(&mut err, &mut said), "{said}");
    // The rest of what it says, read meanwhile (a full pipe would block it).
    std::thread::spawn(move || for _ in err.lines() {});
    (cli, said)
}

fn end(mut cli: KillOnDrop, said: &str) {
    common::interrupt(&cli);
    let status = cli.wait().unwrap();
    assert!(status.success(), "{said}");
}

fn fds(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

fn rss_kib(pid: i32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Attach, trace, detach `cycles` times, the modes in turn; see the module's docs.
fn attach_detach_cycles(cycles: usize) {
    let mut t = Target::start(&["prof"]);
    let pid = t.pid();
    let code = code_bytes(pid);
    let prot = maps(pid);
    let mut first = None;
    for i in 0..cycles {
        let (name, env, args) = MODES[i % MODES.len()];
        let (cli, said) = attach(pid, env, args);
        assert_eq!(t.window(100), "window 100 done\n", "cycle {i} ({name})");
        assert_eq!(
            writable_and_executable(pid),
            Vec::<String>::new(),
            "cycle {i} ({name}), attached"
        );
        end(cli, &said);
        let at = format!("cycle {i} ({name}), detached");
        if let Err(e) = common_code(&code, &code_bytes(pid)) {
            panic!("{at}: {e}");
        }
        if let Err(e) = same_protections(&prot, &maps(pid)) {
            panic!("{at}: {e}");
        }
        assert_eq!(writable_and_executable(pid), Vec::<String>::new(), "{at}");
        let (f, r) = (fds(pid), rss_kib(pid));
        let (f0, r0) = *first.get_or_insert((f, r));
        assert!(
            f <= f0,
            "{at}: {f} descriptors, {f0} after the first detach"
        );
        assert!(
            r <= r0 + 16 * 1024,
            "{at}: {r} KiB resident, {r0} after the first detach"
        );
    }
    assert_eq!(t.quit(), (CLEAN_END.to_owned(), Some(0)));
}

/// The code of every object mapped before the first attach is byte for byte the same.
fn common_code(before: &[(String, Vec<u8>)], after: &[(String, Vec<u8>)]) -> Result<(), String> {
    for (range, bytes) in before {
        let Some((_, now)) = after.iter().find(|(r, _)| r == range) else {
            return Err(format!("{range}: gone or split"));
        };
        if let Some(i) = bytes.iter().zip(now).position(|(a, b)| a != b) {
            return Err(format!(
                "{range}: byte {i:#x} was {:#04x}, is {:#04x}",
                bytes[i], now[i]
            ));
        }
    }
    Ok(())
}

/// Each mode once (quick tier); the stress tier runs 35 cycles.
#[test]
fn attach_and_detach_in_every_mode_leave_the_process_as_it_was() {
    attach_detach_cycles(MODES.len());
}

#[test]
#[ignore = "stress tier: 35 attach/detach cycles"]
fn stress_thirty_five_attach_detach_cycles_leave_the_process_as_it_was() {
    attach_detach_cycles(35);
}
