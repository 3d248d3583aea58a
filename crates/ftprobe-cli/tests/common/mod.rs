//! Helpers shared by the CLI's end-to-end tests: run `ftprobe trace` on a program and read
//! back the trace it wrote.

#![allow(dead_code)] // each test binary uses its own subset

use std::process::{Command, Output};
use std::sync::atomic::{AtomicU64, Ordering};

/// A fresh, empty directory of this test process, named after `what`.
pub fn tmp_dir(what: &str) -> std::path::PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let d = std::env::temp_dir().join(format!(
        "ftprobe-t-{}-{what}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Read an attaching CLI's standard error (`trace -p PID`) up to its "ftprobe: tracing
/// process" line, or to its end if it never says it: what it said is added to `said`;
/// whether it is tracing.
pub fn wait_until_tracing(err: &mut impl std::io::BufRead, said: &mut String) -> bool {
    loop {
        let mut l = String::new();
        if err.read_line(&mut l).unwrap() == 0 {
            return false;
        }
        said.push_str(&l);
        if l.starts_with("ftprobe: tracing process") {
            return true;
        }
    }
}

/// SIGINT to the CLI (ends a `trace -p` session: it detaches).
pub fn interrupt(cli: &std::process::Child) {
    // SAFETY: kill has no memory effects; the pid is the caller's live child.
    unsafe { libc::kill(cli.id() as i32, libc::SIGINT) };
}

/// `ftprobe record -d DIR ARGS -- CMD...`.
pub fn record_to(
    dir: &std::path::Path,
    args: &[&str],
    cmd: impl IntoIterator<Item = impl AsRef<std::ffi::OsStr>>,
) -> Output {
    ftprobe()
        .arg("record")
        .arg("-d")
        .arg(dir)
        .args(args)
        .arg("--")
        .args(cmd)
        .output()
        .expect("run ftprobe record")
}

/// The pid of the program `ftprobe` (pid `cli`) runs: its one child, once it exists.
pub fn child_of(cli: u32) -> u32 {
    for _ in 0..2000 {
        let children =
            std::fs::read_to_string(format!("/proc/{cli}/task/{cli}/children")).unwrap_or_default();
        if let Some(p) = children.split_whitespace().next() {
            return p.parse().unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    panic!("no child of ftprobe");
}

/// The `ftprobe` binary under test.
pub fn ftprobe() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ftprobe"))
}

/// Run `ftprobe trace ARGS -o TMP -- CMD`; returns (the CLI's output, the trace text).
pub fn trace(args: &[&str], cmd: &[&str]) -> (Output, String) {
    trace_env(&[], args, cmd)
}

/// [`trace`] with variables added to ftprobe's environment (so to the program's).
pub fn trace_env(env: &[(&str, &str)], args: &[&str], cmd: &[&str]) -> (Output, String) {
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!("ftprobe-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out_file = dir.join(format!("trace-{}.txt", N.fetch_add(1, Ordering::Relaxed)));
    let out = ftprobe()
        .envs(env.iter().copied())
        .arg("trace")
        .args(args)
        .arg("-o")
        .arg(&out_file)
        .arg("--")
        .args(cmd)
        .output()
        .expect("run ftprobe");
    // Lossy: the trace holds the program's bytes as they are (a string argument may not be
    // UTF-8, as in the kernel's output).
    let text = String::from_utf8_lossy(&std::fs::read(&out_file).unwrap_or_default()).into_owned();
    let _ = std::fs::remove_file(&out_file);
    (out, text)
}

/// (hits, misses) of `event` in a trace's `# kprobe_profile:` lines.
pub fn profile(text: &str, event: &str) -> (u64, u64) {
    let at = text.find("# kprobe_profile:").expect("a kprobe_profile");
    text[at..]
        .lines()
        .find_map(|l| {
            let mut w = l.trim_start_matches('#').split_whitespace();
            (w.next() == Some(event)).then(|| {
                let mut n = || w.next().unwrap().parse::<u64>().unwrap();
                (n(), n())
            })
        })
        .unwrap_or_else(|| panic!("no {event} in the profile: {text}"))
}

/// `# lost events: N` of a trace.
pub fn lost_events(text: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix("# lost events: "))
        .unwrap_or_else(|| panic!("no lost line: {text}"))
        .parse()
        .unwrap()
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

/// A one-file program built at test time (for toolchain features the fixtures crate does not
/// assume, such as ASan): `source` written as `dir/file`, compiled by `compiler` with
/// `flags` into `dir/` + the file's stem, in a directory of this test process; `None` when
/// the compiler fails (the caller skips, saying why).
pub fn build_at_test_time(
    compiler: &str,
    file: &str,
    source: &str,
    flags: &[&str],
) -> Option<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("ftprobe-built-{}", std::process::id()));
    std::fs::create_dir_all(&dir).ok()?;
    let src = dir.join(file);
    std::fs::write(&src, source).ok()?;
    let exe = dir.join(std::path::Path::new(file).file_stem()?);
    Command::new(compiler)
        .args(flags)
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .status()
        .is_ok_and(|s| s.success())
        .then_some(exe)
}

pub mod attach_target;

/// The kernel's uprobes through tracefs, as an independent count of hits (root only).
pub mod kernel_uprobes {
    use std::io::Write;
    use std::path::{Path, PathBuf};
    use std::process::Command;
    use std::sync::atomic::{AtomicU32, Ordering};

    const TRACEFS: &str = "/sys/kernel/tracing";

    /// tracefs, mounted if it is not (root only); why not when it cannot be had.
    pub fn tracefs() -> Result<PathBuf, String> {
        let dir = PathBuf::from(TRACEFS);
        if dir.join("uprobe_events").exists() {
            return Ok(dir);
        }
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not root".into());
        }
        // SAFETY: mount(2) with NUL-terminated strings that outlive the call.
        let rc = unsafe {
            libc::mount(
                c"nodev".as_ptr(),
                c"/sys/kernel/tracing".as_ptr(),
                c"tracefs".as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        if rc != 0 || !dir.join("uprobe_events").exists() {
            return Err(format!(
                "tracefs with uprobe_events not available: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(dir)
    }

    /// Appends one command to a tracefs control file; the kernel's answer.
    pub fn tracefs_write(path: &Path, cmd: &str) -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new().append(true).open(path)?;
        f.write_all(cmd.as_bytes())
    }

    /// The file offset of the symbol `sym` of the ELF file `path` (`.dynsym`, else `.symtab`).
    pub fn file_offset_of(path: &Path, sym: &str) -> Option<u64> {
        use object::{Object, ObjectSegment, ObjectSymbol};
        let data = std::fs::read(path).ok()?;
        let file = object::File::parse(&*data).ok()?;
        let addr = file
            .dynamic_symbols()
            .chain(file.symbols())
            .find(|s| s.name() == Ok(sym) && s.size() > 0)?
            .address();
        file.segments().find_map(|seg| {
            let (off, _) = seg.file_range();
            (addr >= seg.address() && addr < seg.address() + seg.size())
                .then(|| addr - seg.address() + off)
        })
    }

    /// Kernel uprobes at `(file, offset)` places, enabled in a tracefs instance of their own
    /// (its own buffer, `tracing_on`, filters and options, whatever else uses tracefs);
    /// every event and the instance are removed on drop.
    pub struct KernelUprobes {
        instance: PathBuf,
        group: String,
        count: usize,
    }

    impl KernelUprobes {
        /// Probe `p0`, `p1`, ... at each place; `filter` (an event filter such as
        /// `comm == "ls"`) on each when given. Why not, when not root or tracefs cannot be
        /// had.
        pub fn new(places: &[(&Path, u64)], filter: Option<&str>) -> Result<KernelUprobes, String> {
            let places: Vec<(&Path, u64, &str)> = places.iter().map(|&(p, o)| (p, o, "")).collect();
            Self::make(&places, filter)
        }

        /// As [`KernelUprobes::new`], each probe with fetch args (`uprobe_events` syntax).
        pub fn with_args(places: &[(&Path, u64, &str)]) -> Result<KernelUprobes, String> {
            Self::make(places, None)
        }

        /// As [`KernelUprobes::with_args`], return probes (uretprobes, `r:`).
        pub fn returns(places: &[(&Path, u64, &str)]) -> Result<KernelUprobes, String> {
            Self::make_kind('r', places, None)
        }

        fn make(
            places: &[(&Path, u64, &str)],
            filter: Option<&str>,
        ) -> Result<KernelUprobes, String> {
            Self::make_kind('p', places, filter)
        }

        fn make_kind(
            kind: char,
            places: &[(&Path, u64, &str)],
            filter: Option<&str>,
        ) -> Result<KernelUprobes, String> {
            let dir = tracefs()?;
            static N: AtomicU32 = AtomicU32::new(0);
            let n = N.fetch_add(1, Ordering::Relaxed);
            let group = format!("ftprobe_test_{}_{n}", std::process::id());
            let probes = KernelUprobes {
                instance: dir.join("instances").join(&group),
                group,
                count: 0,
            };
            let mut probes = probes;
            for (i, (path, off, args)) in places.iter().enumerate() {
                let def = format!(
                    "{kind}:{}/p{i} {}:{off:#x} {args}\n",
                    probes.group,
                    path.display()
                );
                tracefs_write(&dir.join("uprobe_events"), &def)
                    .map_err(|e| format!("uprobe_events {def:?}: {e}"))?;
                probes.count = i + 1;
            }
            std::fs::create_dir(&probes.instance).map_err(|e| format!("instance: {e}"))?;
            let events = probes.instance.join("events").join(&probes.group);
            for i in 0..places.len() {
                let ev = events.join(format!("p{i}"));
                if let Some(f) = filter {
                    std::fs::write(ev.join("filter"), format!("{f}\n"))
                        .map_err(|e| format!("filter: {e}"))?;
                }
            }
            let _ = std::fs::write(probes.instance.join("tracing_on"), "1\n");
            std::fs::write(events.join("enable"), "1\n").map_err(|e| format!("enable: {e}"))?;
            Ok(probes)
        }

        /// The path of the instance's `trace` file (its bytes as the kernel prints them).
        pub fn trace_path(&self) -> PathBuf {
            self.instance.join("trace")
        }

        /// The instance's `trace` file: every event recorded so far.
        pub fn trace(&self) -> String {
            std::fs::read_to_string(self.instance.join("trace")).unwrap_or_default()
        }

        /// Hits of probe `i` by thread `tid` (a single-threaded process: its pid).
        pub fn hits(&self, i: usize, tid: u32) -> u64 {
            let (tag, task) = (format!(" p{i}: ("), format!("-{tid}"));
            self.trace()
                .lines()
                .filter(|l| !l.starts_with('#') && l.contains(&tag))
                .filter(|l| {
                    l.split_whitespace()
                        .next()
                        .is_some_and(|t| t.ends_with(&task))
                })
                .count() as u64
        }
    }

    impl Drop for KernelUprobes {
        fn drop(&mut self) {
            let events = self.instance.join("events").join(&self.group);
            let _ = std::fs::write(events.join("enable"), "0\n");
            let _ = std::fs::remove_dir(&self.instance);
            for i in 0..self.count {
                let _ = tracefs_write(
                    &Path::new(TRACEFS).join("uprobe_events"),
                    &format!("-:{}/p{i}\n", self.group),
                );
            }
        }
    }

    /// Run `cmd` (a single-threaded program) under kernel uprobes at each `(path, file
    /// offset)`; returns the hits of each probe by that process. `None` (and why, printed)
    /// when not root or tracefs cannot be had.
    pub fn count_hits(places: &[(&Path, u64)], cmd: &mut Command) -> Option<Vec<u64>> {
        let probes = match KernelUprobes::new(places, None) {
            Ok(p) => p,
            Err(why) => {
                eprintln!("skipped: {why}");
                return None;
            }
        };
        let mut child = cmd.spawn().expect("run the command");
        child.wait().expect("wait");
        Some(
            (0..places.len())
                .map(|i| probes.hits(i, child.id()))
                .collect(),
        )
    }
}
