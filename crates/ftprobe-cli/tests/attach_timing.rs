//! `FTPROBE_TIMING=1 ftprobe trace -p PID` (read by bench/attach.sh): one line with the
//! number of threads held and the attach's and detach's steps in order. Not a timed test:
//! the times are only checked to follow one another.

use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;

mod common;
use common::ftprobe;

use ftprobe_dev::{attach_target_fixture, KillOnDrop};

#[test]
fn the_timing_line_names_every_step_in_order() {
    let mut target = KillOnDrop::spawn(
        std::process::Command::new(attach_target_fixture())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped()),
    )
    .unwrap();
    let mut stdin = target.stdin.take().unwrap();
    let mut stdout = BufReader::new(target.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    let pid = target.id();
    // The fixture's threads: main and four (its own count, checked by tests/attach.rs).
    let threads = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .count();
    assert_eq!(threads, 5);
    let out = common::tmp_dir("timing").join("trace.txt");
    let mut cli = KillOnDrop::spawn(
        ftprobe()
            .env("FTPROBE_TIMING", "1")
            .args(["trace", "-p", &pid.to_string(), "-F", "attach_window", "-o"])
            .arg(&out)
            .stderr(Stdio::piped()),
    )
    .unwrap();
    let mut err = BufReader::new(cli.stderr.take().unwrap());
    let mut text = String::new();
    assert!(
        common::wait_until_tracing(&mut err, &mut text),
        "no tracing line: {text}"
    );
    // Events to drain: the window's calls.
    stdin.write_all(b"window 100\n").unwrap();
    line.clear();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "window 100 done\n");
    // SAFETY: kill has no memory effects; the pid is our live child.
    unsafe { libc::kill(cli.id() as i32, libc::SIGINT) };
    std::io::Read::read_to_string(&mut err, &mut text).unwrap();
    assert!(cli.wait().unwrap().success(), "{text}");
    let trace = std::fs::read_to_string(&out).unwrap();
    std::fs::remove_dir_all(out.parent().unwrap()).unwrap();
    assert_eq!(
        trace
            .lines()
            .filter(|l| l.contains(" attach_window <-"))
            .count(),
        100
    );
    let timing = text
        .lines()
        .find_map(|l| l.strip_prefix("ftprobe: timing: "))
        .unwrap_or_else(|| panic!("no timing line: {text}"));
    let field = |name: &str| -> &str {
        timing
            .split_whitespace()
            .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
            .unwrap_or_else(|| panic!("no {name} in {timing}"))
    };
    assert_eq!(field("threads"), "5", "{timing}");
    let ms = |name: &str| -> f64 { field(name).parse().unwrap() };
    let attach = [
        ms("all_stopped"),
        ms("agent_started"),
        ms("resumed"),
        ms("first_event"),
    ];
    assert!(attach.windows(2).all(|w| w[0] <= w[1]), "{timing}");
    let detach = [
        ms("detach_stopped"),
        ms("detach_agent_stopped"),
        ms("detach_resumed"),
    ];
    assert!(detach.windows(2).all(|w| w[0] <= w[1]), "{timing}");
    assert!(timing.ends_with(" (ms)"), "{timing}");
    stdin.write_all(b"quit\n").unwrap();
    assert_eq!(target.wait().unwrap().code(), Some(0));
}
