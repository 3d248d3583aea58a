//! Issue 25, items 5 to 7: a recording survives its recorder, and damage is said.
//!
//! - `record` killed (SIGKILL) at several points, or stopped by a full disk (a small tmpfs):
//!   the readers read every whole record the files hold, exit 0, and warn that the
//!   recording was not finished; `record` says the disk was full and exits 1.
//! - A ring file cut at random points: every whole record before the cut is read, with a
//!   warning naming the file.
//! - `info.json` that disagrees with the files (a thread's count set to 0, the `rings` list
//!   removed or empty) and object copies missing or cut: said on standard error.
//! - `info.json` whose object list is repeated 800 and 2 000 times: read in bounded memory and
//!   time.
//!
//! The truth for "every whole record" is the files themselves, walked here by the format the
//! README gives (a header word: length in words, header included, in bits 0-15; the record
//! type in bits 16-31), independently of the readers' code.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{ftprobe, record_to, tmp_dir};

/// Function entry records (`rtype` 1).
const FUNC: u64 = 1;

fn churn() -> String {
    ftprobe_dev::churn_fixture().to_str().unwrap().to_owned()
}

/// The function-entry records of every ring file of `dir`, walked header by header up to the
/// first record that is not whole (the files' own truth).
fn whole_func_records(dir: &Path) -> u64 {
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if !(name.starts_with("ring") && name.ends_with(".dat")) {
            continue;
        }
        let bytes = std::fs::read(&p).unwrap();
        let words: Vec<u64> = bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let mut at = 0;
        while at < words.len() {
            let h = words[at];
            let len = (h & 0xffff) as usize;
            if len == 0 || at + len > words.len() {
                break;
            }
            if (h >> 16) & 0xffff == FUNC {
                n += 1;
            }
            at += len;
        }
    }
    n
}

/// Run a reader (`replay`, `report`, `dump ...`) on `dir`.
fn read(dir: &Path, cmd: &[&str]) -> Output {
    ftprobe()
        .arg(cmd[0])
        .arg("-d")
        .arg(dir)
        .args(&cmd[1..])
        .output()
        .unwrap()
}

/// `replay`: (exit code, function-entry lines, stderr).
fn replay(dir: &Path) -> (Option<i32>, u64, String) {
    let out = read(dir, &["replay"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let funcs = text
        .lines()
        .filter(|l| l.contains(": churn_mid <-") || l.contains(": churn_leaf <-"))
        .count() as u64;
    (
        out.status.code(),
        funcs,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn copy_dir(from: &Path, to: &Path) {
    let ok = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap()
        .success();
    assert!(ok, "cp -a {} {}", from.display(), to.display());
}

/// `record` killed with SIGKILL at several points after it started recording (its partial
/// `info.json` is there): every whole record is read back, and the readers say the recording
/// was not finished.
#[test]
fn a_recording_whose_recorder_was_killed_is_read_to_its_last_whole_record() {
    let tmp = tmp_dir("killed");
    let mut last = 0;
    for (k, after_ms) in [0u64, 150, 400, 800].into_iter().enumerate() {
        let dir = tmp.join(format!("rec{k}"));
        // ~2 s of short threads, each calling churn_mid and churn_leaf.
        let mut child = ftprobe()
            .arg("record")
            .arg("-d")
            .arg(&dir)
            .args(["-F", "churn_mid", "-F", "churn_leaf", "--"])
            .args([&churn(), "40", "4", "50", "400"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let t0 = Instant::now();
        while !dir.join("info.json").exists() {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "record never started"
            );
            assert!(child.try_wait().unwrap().is_none(), "record ended early");
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(after_ms));
        child.kill().unwrap();
        child.wait().unwrap();
        // The program, left running by its killed recorder, writes into its rings (not
        // into the recording): the files are what they are now.
        let want = whole_func_records(&dir);
        let (code, got, err) = replay(&dir);
        assert_eq!(code, Some(0), "{err}");
        assert!(err.contains("was not finished"), "{err}");
        assert_eq!(got, want, "after {after_ms} ms: {err}");
        // The trailer says its counts are not whole.
        let text = String::from_utf8_lossy(&read(&dir, &["replay"]).stdout).into_owned();
        assert!(
            text.contains("# the recording is not whole: "),
            "{text:.3000}"
        );
        for cmd in [&["report"][..], &["dump", "--chrome", "/dev/null"]] {
            let out = read(&dir, cmd);
            assert!(out.status.success(), "{cmd:?}: {out:?}");
        }
        last = got;
    }
    assert!(last > 0, "the last kill came after records were written");
    let _ = std::fs::remove_dir_all(&tmp);
}

/// Run `script` as root in a mount namespace of its own (a user namespace too when not
/// root), with `$MNT` an empty directory: `None` when namespaces are not available here.
/// Its mounts are private (they never reach this namespace); in a chroot, where the root is
/// no mount point and its propagation cannot be changed, they keep the chroot's.
fn in_mount_namespace(script: &str, mnt: &Path) -> Option<Output> {
    std::fs::create_dir_all(mnt).unwrap();
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let user: &[&str] = if root {
        &[]
    } else {
        &["--user", "--map-root-user"]
    };
    let works = |propagation: &str| {
        Command::new("unshare")
            .args(user)
            .args(["--mount", "--propagation", propagation, "true"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let propagation = ["private", "unchanged"].into_iter().find(|p| works(p))?;
    let out = Command::new("unshare")
        .args(user)
        .args(["--mount", "--propagation", propagation, "sh", "-ec", script])
        .env("MNT", mnt)
        .env("FTPROBE", env!("CARGO_BIN_EXE_ftprobe"))
        .env("CHURN", churn())
        .output()
        .unwrap();
    Some(out)
}

/// A full disk (a tmpfs of a few MiB): `record` says so and exits 1, and what it wrote before
/// is read back whole. At 3 MiB the objects' copies fit and the records fill the rest; at
/// 1 MiB the C library's copy does not fit first (its name then comes from the original).
#[test]
fn a_full_disk_stops_the_recording_and_leaves_it_readable() {
    let tmp = tmp_dir("enospc");
    for size in ["3m", "1m"] {
        let out_dir = tmp.join(format!("out-{size}"));
        std::fs::create_dir_all(&out_dir).unwrap();
        let script = format!(
            "mount -t tmpfs -o size={size} tmpfs \"$MNT\"
             rc=0
             \"$FTPROBE\" record -d \"$MNT/rec\" -F churn_mid -F churn_leaf -- \"$CHURN\" 20 4 0 3000 \
                 >/dev/null 2>\"{out}/record.err\" || rc=$?
             echo $rc >\"{out}/record.rc\"
             cp -a \"$MNT/rec\" \"{out}/rec\"",
            out = out_dir.display()
        );
        let Some(out) = in_mount_namespace(&script, &tmp.join(format!("mnt-{size}"))) else {
            panic!("no mount namespace here (unshare): this test needs one");
        };
        assert!(out.status.success(), "{out:?}");
        let err = std::fs::read_to_string(out_dir.join("record.err")).unwrap();
        let rc = std::fs::read_to_string(out_dir.join("record.rc")).unwrap();
        assert_eq!(rc.trim(), "1", "{err}");
        assert!(
            err.contains("No space left on device") && err.contains("recording stopped"),
            "{err}"
        );
        let dir = out_dir.join("rec");
        let want = whole_func_records(&dir);
        let (code, got, rerr) = replay(&dir);
        assert_eq!(code, Some(0), "{rerr}");
        assert!(got > 0, "{size}: nothing was read back: {rerr}");
        assert_eq!(got, want, "{size}: {rerr}");
        // Names come from the copies, or from the originals where a copy did not fit.
        let text = String::from_utf8_lossy(&read(&dir, &["replay"]).stdout).into_owned();
        assert!(
            text.contains("churn_mid <-churn_worker"),
            "{size}: {text:.2000}"
        );
        assert!(!tmp.join(format!("mnt-{size}")).join("rec").exists());
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

/// A small deterministic generator (the cuts are the same every run).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, below: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % below.max(1)
    }
}

/// The ring files of `dir` with data: (name, size).
fn ring_files(dir: &Path) -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let e = e.unwrap();
            let name = e.file_name().into_string().unwrap();
            let len = e.metadata().unwrap().len();
            (name.starts_with("ring") && name.ends_with(".dat") && len > 0).then_some((name, len))
        })
        .collect();
    v.sort();
    v
}

/// Ring files cut at random points, in a recording whose threads have files of their own
/// (long) and one whose threads share `rings-small.dat` (short): every whole record before
/// the cut is read, the file is named in a warning, the exit status is 0.
#[test]
fn a_ring_file_cut_anywhere_is_read_to_its_last_whole_record() {
    let tmp = tmp_dir("cut");
    let mut rng = Lcg(25);
    for (name, iters) in [("long", "3000"), ("short", "60")] {
        let orig = tmp.join(name);
        let out = record_to(
            &orig,
            &["-F", "churn_mid", "-F", "churn_leaf"],
            [churn().as_str(), "2", "3", "0", iters],
        );
        assert!(out.status.success(), "{out:?}");
        let files = ring_files(&orig);
        assert!(!files.is_empty());
        if name == "long" {
            assert!(files.iter().any(|f| f.0.starts_with("ring-")), "{files:?}");
        } else {
            assert!(files.iter().any(|f| f.0 == "rings-small.dat"), "{files:?}");
        }
        let full = whole_func_records(&orig);
        assert_eq!(replay(&orig).1, full);
        for k in 0..6 {
            let (file, size) = &files[rng.next(files.len() as u64) as usize];
            let cut = rng.next(*size);
            let dir = tmp.join(format!("{name}-cut{k}"));
            copy_dir(&orig, &dir);
            std::fs::OpenOptions::new()
                .write(true)
                .open(dir.join(file))
                .unwrap()
                .set_len(cut)
                .unwrap();
            let want = whole_func_records(&dir);
            let (code, got, err) = replay(&dir);
            let at = format!("{file} cut at {cut} of {size}: {err}");
            assert_eq!(code, Some(0), "{at}");
            assert_eq!(got, want, "{at}");
            assert!(want < full || cut % 8 == 0, "{at}");
            assert!(err.contains(file.as_str()) && err.contains("cut"), "{at}");
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

/// Edit `dir/info.json` with `f`.
fn edit_info(dir: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let p = dir.join("info.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(&p, serde_json::to_string(&v).unwrap()).unwrap();
}

/// The program's own copy in `dir/objects/`.
fn program_copy(dir: &Path) -> PathBuf {
    std::fs::read_dir(dir.join("objects"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with("-churn"))
        .expect("the program's copy")
}

/// What a recording's `info.json` and files disagree on is said, and what can be read is:
/// a thread's record count set to 0, the `rings` list removed or empty, the program's copy
/// missing or cut.
#[test]
fn inconsistencies_of_a_recording_are_said() {
    let tmp = tmp_dir("inconsistent");
    let orig = tmp.join("orig");
    let out = record_to(
        &orig,
        &["-F", "churn_mid", "-F", "churn_leaf"],
        [churn().as_str(), "2", "3", "0", "3000"],
    );
    assert!(out.status.success(), "{out:?}");
    let full = whole_func_records(&orig);
    let (code, got, err) = replay(&orig);
    assert_eq!((code, got), (Some(0), full), "{err}");
    assert!(!err.contains("warning"), "{err}");

    // A thread's records set to 0: its records are still read, and that is said.
    let dir = tmp.join("zero");
    copy_dir(&orig, &dir);
    edit_info(&dir, |v| {
        let r = v["rings"]
            .as_array_mut()
            .unwrap()
            .iter_mut()
            .find(|r| r["records"].as_u64() > Some(0))
            .unwrap();
        r["records"] = 0.into();
    });
    let (code, got, err) = replay(&dir);
    assert_eq!((code, got), (Some(0), full), "{err}");
    assert!(err.contains("has no records"), "{err}");

    // The rings list removed, or empty: the ring files are read as threads nobody names.
    for (k, edit) in [None, Some(serde_json::json!([]))].into_iter().enumerate() {
        let dir = tmp.join(format!("rings{k}"));
        copy_dir(&orig, &dir);
        edit_info(&dir, |v| match edit {
            None => {
                v.as_object_mut().unwrap().remove("rings");
            }
            Some(e) => v["rings"] = e,
        });
        let (code, got, err) = replay(&dir);
        assert_eq!((code, got), (Some(0), full), "{err}");
        assert!(err.contains("no entry of info.json names"), "{err}");
    }

    // Fields a reader can do without, removed: said, and the records read.
    let dir = tmp.join("fields");
    copy_dir(&orig, &dir);
    edit_info(&dir, |v| {
        let o = v.as_object_mut().unwrap();
        for k in [
            "lost_recursion",
            "command",
            "event_counters",
            "end",
            "ncpus",
        ] {
            o.remove(k);
        }
    });
    let (code, got, err) = replay(&dir);
    assert_eq!((code, got), (Some(0), full), "{err}");
    assert!(err.contains("info.json has no `lost_recursion`"), "{err}");
    assert!(err.contains("info.json has no `end`"), "{err}");

    // The program's copy missing, or cut: said; its addresses print as numbers.
    for (k, cut) in [None, Some(100u64)].into_iter().enumerate() {
        let dir = tmp.join(format!("copy{k}"));
        copy_dir(&orig, &dir);
        let copy = program_copy(&dir);
        match cut {
            None => std::fs::remove_file(&copy).unwrap(),
            Some(n) => std::fs::OpenOptions::new()
                .write(true)
                .open(&copy)
                .unwrap()
                .set_len(n)
                .unwrap(),
        }
        let out = read(&dir, &["replay"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        let name = copy.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            err.contains(&name) && err.contains("missing or cannot be read"),
            "{err}"
        );
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

/// Run `ftprobe ARGS` and wait for it with `wait4`: (its output, max RSS in KiB, CPU time).
// Waited for by `wait4` (for its rusage), which `Child` does not offer.
#[allow(clippy::zombie_processes)]
fn measured(args: &[&str], dir: &Path) -> (Output, u64, Duration) {
    let child = ftprobe()
        .args(&args[..1])
        .arg("-d")
        .arg(dir)
        .args(&args[1..])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 fills it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // The pipe holds what it says (a few lines) until it is read below.
    // SAFETY: our child, pointers to locals.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    assert_eq!(r, pid);
    let cpu = Duration::from_micros(
        (ru.ru_utime.tv_sec * 1_000_000
            + ru.ru_utime.tv_usec
            + ru.ru_stime.tv_sec * 1_000_000
            + ru.ru_stime.tv_usec) as u64,
    );
    let mut stderr = Vec::new();
    std::io::Read::read_to_end(&mut child.stderr.unwrap(), &mut stderr).unwrap();
    let out = Output {
        status: std::os::unix::process::ExitStatusExt::from_raw(status),
        stdout: Vec::new(),
        stderr,
    };
    (out, ru.ru_maxrss as u64, cpu)
}

/// A crafted `info.json` whose object list is the recording's repeated 800 and 2 000 times
/// costs the readers no more than the objects it names (each file is loaded once): under
/// 50 MB and 1 s of CPU each (it took 5 s and 1.0 GB at 800).
#[test]
fn a_crafted_object_list_costs_no_more_than_its_files() {
    let tmp = tmp_dir("crafted");
    let orig = tmp.join("orig");
    let out = record_to(
        &orig,
        &[
            "-t",
            "function_graph",
            "-F",
            "churn_mid",
            "-F",
            "churn_leaf",
        ],
        [churn().as_str(), "2", "3", "0", "300"],
    );
    assert!(out.status.success(), "{out:?}");
    for times in [800, 2000] {
        let dir = tmp.join(format!("x{times}"));
        copy_dir(&orig, &dir);
        edit_info(&dir, |v| {
            let objs = v["objects"].as_array().unwrap().clone();
            let many: Vec<serde_json::Value> =
                (0..times).flat_map(|_| objs.iter().cloned()).collect();
            v["objects"] = many.into();
        });
        for cmd in [
            &["replay"][..],
            &["report"],
            &["dump", "--chrome", "/dev/null"],
            &["dump", "--flame-graph", "/dev/null"],
        ] {
            let (out, rss_kb, cpu) = measured(cmd, &dir);
            let at = format!("{times}x {cmd:?}: {rss_kb} KiB, {cpu:?}: {out:?}");
            assert!(out.status.success(), "{at}");
            assert!(rss_kb < 50 * 1024, "{at}");
            assert!(cpu < Duration::from_secs(1), "{at}");
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

/// A fresh user's review (2026-12-06) of the above: a crafted `info.json` naming files outside
/// the recording (read as ring data: `/etc/passwd`) or FIFOs (a reader blocked forever), and
/// numbers that overflow (a panic in debug builds, wrapped counts in release): each is said,
/// nothing outside the recording is opened, no reader hangs or panics.
#[test]
fn crafted_paths_and_numbers_are_refused_or_bounded() {
    let tmp = tmp_dir("crafted-paths");
    let orig = tmp.join("orig");
    let out = record_to(
        &orig,
        &["-F", "churn_mid", "-F", "churn_leaf"],
        [churn().as_str(), "2", "3", "0", "60"],
    );
    assert!(out.status.success(), "{out:?}");
    let full = whole_func_records(&orig);
    // A ring entry naming a file outside the recording, and an object copy that is a FIFO.
    let dir = tmp.join("outside");
    copy_dir(&orig, &dir);
    edit_info(&dir, |v| {
        let r = &mut v["rings"].as_array_mut().unwrap()[0];
        r["file"] = "../../../../../../etc/passwd".into();
        r["offset"] = 0.into();
    });
    let copy = program_copy(&dir);
    std::fs::remove_file(&copy).unwrap();
    let ok = Command::new("mkfifo")
        .arg(&copy)
        .status()
        .unwrap()
        .success();
    assert!(ok, "mkfifo");
    let child = ftprobe()
        .args(["replay", "-d"])
        .arg(&dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A watchdog: a reader blocked on the FIFO is killed after 30 s (and the test fails).
    let pid = child.id() as i32;
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watch = {
        let done = done.clone();
        std::thread::spawn(move || {
            let t0 = Instant::now();
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                if t0.elapsed() > Duration::from_secs(30) {
                    // SAFETY: kill has no memory effects; the pid is our unwaited child.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                    return true;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            false
        })
    };
    let out = child.wait_with_output().unwrap();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(!watch.join().unwrap(), "replay blocked (a FIFO opened?)");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("not a path inside the recording"), "{err}");
    assert!(err.contains("not a regular file"), "{err}");
    assert!(!err.contains("passwd: cut"), "read as ring data: {err}");
    // (The program's names print as numbers: its copy was refused.)
    let text = String::from_utf8_lossy(&out.stdout);
    let got: u64 = text.lines().filter(|l| !l.starts_with('#')).count() as u64;
    assert!(
        got < full,
        "the refused thread's records are not read: {got} of {full}"
    );

    // Numbers at the top of their range: bounded, no panic.
    let dir = tmp.join("numbers");
    copy_dir(&orig, &dir);
    edit_info(&dir, |v| {
        v["clock"] = serde_json::json!([u64::MAX, u64::MAX, u64::MAX]);
        for r in v["rings"].as_array_mut().unwrap() {
            r["lost"] = u64::MAX.into();
        }
        v["lost_no_ring"] = u64::MAX.into();
        v["lost_recursion"] = u64::MAX.into();
    });
    for cmd in [
        &["replay"][..],
        &["report"],
        &["dump", "--chrome", "/dev/null"],
    ] {
        let out = read(&dir, cmd);
        assert!(
            out.status.success(),
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = String::from_utf8_lossy(&read(&dir, &["replay"]).stdout).into_owned();
    assert!(
        text.contains(&format!("# lost events: {}", u64::MAX)),
        "{text:.3000}"
    );
    let _ = std::fs::remove_dir_all(&tmp);
}

/// A fresh user's review (2026-12-06): `record` killed just after it moved the last
/// recording to `DIR.old` left a `DIR` with no `info.json` (readers refused it, and the next
/// `record` took it for a recording and deleted the good `DIR.old`). The partial `info.json`
/// is now written before the move: at every kill point `DIR` is either the earlier
/// recording or a readable new one, and `DIR.old` when present is readable. A staging
/// directory of a killed recorder is removed by the next `record`.
#[test]
fn a_recorder_killed_around_its_start_leaves_readable_recordings() {
    let tmp = tmp_dir("killed-start");
    let dir = tmp.join("rec");
    for k in 0..12u64 {
        let out = record_to(
            &dir,
            &["-F", "churn_mid"],
            [churn().as_str(), "1", "1", "0", "5"],
        );
        assert!(out.status.success(), "{out:?}");
        let mut child = ftprobe()
            .arg("record")
            .arg("-d")
            .arg(&dir)
            .args(["-t", "function_graph", "-F", "churn_mid", "--"])
            .args([&churn(), "5", "2", "20", "200"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(5 * k));
        child.kill().unwrap();
        child.wait().unwrap();
        for d in [dir.clone(), tmp.join("rec.old")] {
            if d.exists() {
                let (code, _, err) = replay(&d);
                assert_eq!(
                    code,
                    Some(0),
                    "kill after {} ms: {}: {err}",
                    5 * k,
                    d.display()
                );
            }
        }
    }
    // The next record removes the staging directories killed recorders left, and an old
    // recording a killed recorder was removing (moved to `DIR.del-PID` first, so that a kill
    // during the removal leaves no half-deleted `DIR.old`; PID 999999999 does not exist).
    let doomed = tmp.join("rec.del-999999999");
    std::fs::create_dir_all(doomed.join("objects")).unwrap();
    std::fs::write(doomed.join("ring-0.dat"), b"").unwrap();
    let out = record_to(
        &dir,
        &["-F", "churn_mid"],
        [churn().as_str(), "1", "1", "0", "5"],
    );
    assert!(out.status.success(), "{out:?}");
    let left: Vec<String> = std::fs::read_dir(&tmp)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".new-") || n.contains(".del-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let _ = std::fs::remove_dir_all(&tmp);
}
