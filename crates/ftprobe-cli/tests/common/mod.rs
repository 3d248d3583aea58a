//! Helpers shared by the CLI's end-to-end tests: run `ftprobe trace` on a program and read
//! back the trace it wrote.

#![allow(dead_code)] // each test binary uses its own subset

use std::process::{Command, Output};
use std::sync::atomic::{AtomicU64, Ordering};

/// The `ftprobe` binary under test.
pub fn ftprobe() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ftprobe"))
}

/// Run `ftprobe trace ARGS -o TMP -- CMD`; returns (the CLI's output, the trace text).
pub fn trace(args: &[&str], cmd: &[&str]) -> (Output, String) {
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!("ftprobe-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out_file = dir.join(format!("trace-{}.txt", N.fetch_add(1, Ordering::Relaxed)));
    let out = ftprobe()
        .arg("trace")
        .args(args)
        .arg("-o")
        .arg(&out_file)
        .arg("--")
        .args(cmd)
        .output()
        .expect("run ftprobe");
    let text = std::fs::read_to_string(&out_file).unwrap_or_default();
    let _ = std::fs::remove_file(&out_file);
    (out, text)
}

/// The same program, not traced.
pub fn untraced(cmd: &[&str]) -> Output {
    Command::new(cmd[0]).args(&cmd[1..]).output().unwrap()
}

/// Event lines of a trace (not `#` comments).
pub fn events(text: &str) -> impl Iterator<Item = &str> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
}

/// What the `sigstack` fixture printed: bytes of its signal stack used (`used N`).
pub fn signal_stack_used(out: &Output) -> usize {
    let s = String::from_utf8_lossy(&out.stdout);
    s.trim()
        .strip_prefix("used ")
        .unwrap_or_else(|| panic!("{s:?}"))
        .parse()
        .unwrap()
}
