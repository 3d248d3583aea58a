//! The `attach_target` fixture (ftprobe-dev), driven through its standard input and output:
//! the target of the attach tests.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{ChildStdin, ChildStdout, Command, Stdio};

use ftprobe_dev::{attach_target_fixture, KillOnDrop};

/// The fixture's last line when nothing went wrong (no EINTR, no failed call, every signal
/// it sent itself delivered, its reader woken once, its busy thread ran).
pub const CLEAN_END: &str = "eintr=0 bad=0 selfsig=ok reader=1 busy=yes\n";

/// `setpriv` arguments that run a program as `nobody` without capabilities (we are root).
pub const AS_NOBODY: &[&str] = &[
    "--reuid=nobody",
    "--regid=nogroup",
    "--clear-groups",
    "--inh-caps=-all",
];

/// The fixture, started and past its `ready` line (killed when dropped).
pub struct Target {
    pub child: KillOnDrop,
    pub stdin: ChildStdin,
    pub stdout: BufReader<ChildStdout>,
}

impl Target {
    /// The fixture with `args`.
    pub fn start(args: &[&str]) -> Target {
        let mut cmd = Command::new(attach_target_fixture());
        cmd.args(args);
        Target::spawn(cmd)
    }

    /// As user `nobody`.
    pub fn start_as_nobody() -> Target {
        let mut cmd = Command::new("setpriv");
        cmd.args(AS_NOBODY).arg(attach_target_fixture());
        Target::spawn(cmd)
    }

    /// `cmd` (which runs the fixture), with its standard input and output piped.
    pub fn spawn(mut cmd: Command) -> Target {
        let mut child = KillOnDrop::spawn(cmd.stdin(Stdio::piped()).stdout(Stdio::piped()))
            .expect("start attach_target");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut t = Target {
            child,
            stdin,
            stdout,
        };
        assert_eq!(t.line(), "ready\n");
        t
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn line(&mut self) -> String {
        let mut l = String::new();
        self.stdout.read_line(&mut l).unwrap();
        l
    }

    pub fn send(&mut self, line: &str) {
        self.stdin.write_all(line.as_bytes()).unwrap();
        self.stdin.flush().unwrap();
    }

    /// `window N`: returns its line.
    pub fn window(&mut self, n: u32) -> String {
        self.send(&format!("window {n}\n"));
        self.line()
    }

    /// `quit`: the rest of its output and its exit code.
    pub fn quit(mut self) -> (String, Option<i32>) {
        self.send("quit\n");
        let mut rest = String::new();
        self.stdout.read_to_string(&mut rest).unwrap();
        let status = self.child.wait().unwrap();
        (rest, status.code())
    }
}

/// The bytes of every executable file mapping of `pid` (but the agent's), by range and path
/// (ftprobe makes patched code writable: the permissions change, the bytes must not).
pub fn code_bytes(pid: i32) -> Vec<(String, Vec<u8>)> {
    use std::os::unix::fs::FileExt;
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut out = Vec::new();
    for l in maps.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() < 6 || !f[1].contains('x') || !f[5].starts_with('/') {
            continue;
        }
        if f[5].ends_with("/libftprobe_agent.so") {
            continue;
        }
        let (s, e) = f[0].split_once('-').unwrap();
        let (s, e) = (
            u64::from_str_radix(s, 16).unwrap(),
            u64::from_str_radix(e, 16).unwrap(),
        );
        let mut buf = vec![0u8; (e - s) as usize];
        mem.read_exact_at(&mut buf, s).unwrap();
        // By range and path: ftprobe makes patched code writable (the permissions change).
        out.push((format!("{} {}", f[0], f[5]), buf));
    }
    out
}
