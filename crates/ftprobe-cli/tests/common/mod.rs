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

/// The kernel's uprobes through tracefs, as an independent count of hits (root only).
pub mod kernel_uprobes {
    use std::io::Write;
    use std::path::{Path, PathBuf};
    use std::process::Command;

    const TRACEFS: &str = "/sys/kernel/tracing";

    /// tracefs, mounted if it was not; `None` (with the reason printed) when not root or
    /// the kernel has no uprobe events.
    pub fn tracefs() -> Option<PathBuf> {
        let dir = PathBuf::from(TRACEFS);
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root for tracefs");
            return None;
        }
        if !dir.join("uprobe_events").exists() {
            let _ = Command::new("mount")
                .args(["-t", "tracefs", "nodev", TRACEFS])
                .status();
        }
        if !dir.join("uprobe_events").exists() {
            eprintln!("skipped: no {TRACEFS}/uprobe_events");
            return None;
        }
        Some(dir)
    }

    /// The file offset of the dynamic symbol `sym` of the ELF file `path`.
    pub fn file_offset_of(path: &Path, sym: &str) -> Option<u64> {
        use object::{Object, ObjectSegment, ObjectSymbol};
        let data = std::fs::read(path).ok()?;
        let file = object::File::parse(&*data).ok()?;
        let addr = file
            .dynamic_symbols()
            .find(|s| s.name() == Ok(sym) && s.size() > 0)?
            .address();
        file.segments().find_map(|seg| {
            let (off, _) = seg.file_range();
            (addr >= seg.address() && addr < seg.address() + seg.size())
                .then(|| addr - seg.address() + off)
        })
    }

    /// Run `cmd` with kernel uprobes at each `(path, file offset)`, traced for this test
    /// process's new children only (`set_event_pid` with `event-fork`, and only the child's
    /// pid counted); returns the hits of each probe. Every event is removed again before
    /// returning.
    pub fn count_hits(probes: &[(&Path, u64)], cmd: &mut Command) -> Option<Vec<u64>> {
        let dir = tracefs()?;
        let group = format!("ftpt{}", std::process::id());
        let write = |file: &str, text: &str, append: bool| {
            std::fs::OpenOptions::new()
                .write(true)
                .append(append)
                .truncate(!append)
                .open(dir.join(file))
                .and_then(|mut f| f.write_all(text.as_bytes()))
        };
        let remove = || {
            for i in 0..probes.len() {
                let _ = write("uprobe_events", &format!("-:{group}/p{i}\n"), true);
            }
        };
        remove();
        for (i, (path, off)) in probes.iter().enumerate() {
            if let Err(e) = write(
                "uprobe_events",
                &format!("p:{group}/p{i} {}:{off:#x}\n", path.display()),
                true,
            ) {
                remove();
                panic!("uprobe_events: {e}");
            }
        }
        // A tracing instance of our own: its own buffer, tracing_on, pid filter and options,
        // whatever other users of tracefs do meanwhile.
        let inst = format!("instances/{group}");
        let _ = std::fs::remove_dir(dir.join(&inst));
        if let Err(e) = std::fs::create_dir(dir.join(&inst)) {
            remove();
            panic!("tracefs instance: {e}");
        }
        let write =
            |file: &str, text: &str, append: bool| write(&format!("{inst}/{file}"), text, append);
        let _ = write("tracing_on", "1\n", false);
        let _ = write("options/event-fork", "1\n", false);
        // The thread that forks: `event-fork` adds the children of the listed tasks.
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        let _ = write("set_event_pid", &format!("{tid}\n"), false);
        let _ = write(&format!("events/{group}/enable"), "1\n", false);
        let child = cmd.spawn().and_then(|mut c| c.wait().map(|_| c.id()));
        let _ = write(&format!("events/{group}/enable"), "0\n", false);
        let _ = write("set_event_pid", "", false);
        let _ = write("options/event-fork", "0\n", false);
        let trace = std::fs::read_to_string(dir.join(&inst).join("trace")).unwrap_or_default();
        let _ = std::fs::remove_dir(dir.join(&inst));
        remove();
        let child = child.expect("run the command");
        // The child's own thread (a single-threaded program): its tid is its pid.
        let pid_of = |l: &str| -> Option<u32> {
            let task = l.split_whitespace().next()?;
            task.rsplit('-').next()?.parse().ok()
        };
        let counted: Vec<&str> = trace
            .lines()
            .filter(|l| !l.starts_with('#') && pid_of(l) == Some(child))
            .collect();
        Some(
            (0..probes.len())
                .map(|i| {
                    counted
                        .iter()
                        .filter(|l| l.contains(&format!(" p{i}: (")))
                        .count() as u64
                })
                .collect(),
        )
    }
}
