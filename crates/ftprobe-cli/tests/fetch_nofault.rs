//! Fetch args that read memory through bad pointers (`arch::x86_64::uaccess`: plain loads
//! whose faults ftprobe's SIGSEGV/SIGBUS handler turns into `(fault)`), and the program's
//! own faults next to them, which must reach it exactly as without ftprobe. The `nofault`
//! fixture (`crates/ftprobe-dev/c/nofault.c`) passes the pointers to `take(t, s, p)`, which
//! never reads through them; its own counts (faults, their addresses and PCs, the stack its
//! handler ran on) are the truth the traced run must reproduce. Each case runs on the
//! fixture with sites (a site kprobe) and without (an int3 probe, whose handler runs in
//! ftprobe's SIGTRAP handler).

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Command, Output};

use ftprobe_dev::{nofault_fixture, nofault_int3_fixture};

mod common;
use common::{ftprobe, tmp_dir, trace, untraced};

/// Every fetch arg reads memory: a word, the string a word in memory points to, a
/// string, a word.
const DEF: &str = "p:nf take id=+0(%di):x64 name=+0(+8(%di)):string s=+0(%si):string v=+0(%dx):u64";

fn fixtures() -> [PathBuf; 2] {
    [nofault_fixture(), nofault_int3_fixture()]
}

/// The arguments part of each hit of the `nf` event.
fn hits(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once(": nf: (take+0x0/0x"))
        .map(|(_, rest)| rest.split_once(") ").map_or("", |x| x.1).to_owned())
        .collect()
}

/// Trace `DEF` on `exe ARGS`; the program's output and exit status must be the untraced
/// run's. Returns the hits.
fn traced_as_untraced(exe: &std::path::Path, args: &[&str]) -> Vec<String> {
    let exe = exe.to_str().unwrap();
    let cmd: Vec<&str> = std::iter::once(exe).chain(args.iter().copied()).collect();
    let (out, text) = trace(&["-e", DEF], &cmd);
    let plain = untraced(&cmd);
    assert!(plain.status.success(), "{plain:?}");
    assert_eq!(out.status.code(), Some(0), "{cmd:?}: {out:?}\n{text}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&plain.stdout),
        "{cmd:?}: the program's output is unchanged"
    );
    assert!(text.contains("# lost events: 0\n"), "{text}");
    hits(&text)
}

/// Bad pointers give `(fault)` (a number that could not be read prints 0, as before), good
/// ones their values, including the good bytes just before a hole; the program runs on.
#[test]
fn bad_pointers_are_faults_and_good_ones_exact_values() {
    let fault = "id=0x0 name=(fault) s=(fault) v=0";
    // The last 32 bytes of a page followed by a hole (or a PROT_NONE page): an id, a pointer
    // to "in-page", then 16 'Z' with no NUL (the string runs into the hole: a fault, as the
    // kernel's fetch_store_string() for a partial read), and a word that straddles the end.
    let edge = "id=0x102030405060708 name=\"in-page\" s=(fault) v=0";
    let want = [
        "id=0x1122334455667788 name=\"good-name\" s=\"good string\" v=42",
        fault, // NULL
        fault, // an unmapped page
        fault, // a PROT_NONE page
        edge,  // before a hole
        edge,  // before a PROT_NONE page
        // 'Z' * 8 read as an id and as a word, and used as a pointer (non-canonical: the
        // load raises #GP, SIGSEGV with SI_KERNEL, not a page fault).
        "id=0x5a5a5a5a5a5a5a5a name=(fault) s=(fault) v=6510615555426900570",
        fault, // a file mapping past the file's end: SIGBUS
    ];
    for exe in fixtures() {
        assert_eq!(traced_as_untraced(&exe, &["bad"]), want, "{exe:?}");
    }
}

/// The program's own SIGSEGV handler gets exactly its own faults, with their addresses and
/// PCs (the fixture checks them: `good`), while every call's probe reads a PROT_NONE page.
/// `handler` leaves its handler by siglongjmp; `altstack` runs it on a sigaltstack
/// (`SA_ONSTACK`: `onstack` counts the faults it saw there) and returns after mprotect.
#[test]
fn own_sigsegv_handler_gets_exactly_its_faults() {
    const N: usize = 20;
    let n = N.to_string();
    for exe in fixtures() {
        for mode in ["handler", "altstack"] {
            let hits = traced_as_untraced(&exe, &[mode, &n]);
            let plain = untraced(&[exe.to_str().unwrap(), mode, &n]);
            let line = String::from_utf8_lossy(&plain.stdout).into_owned();
            let want = if mode == "altstack" {
                format!("{mode} faults={N} good={N} onstack={N}\n")
            } else {
                format!("{mode} faults={N} good={N}\n")
            };
            assert_eq!(line, want, "the fixture's own truth");
            assert_eq!(hits.len(), N, "{exe:?} {mode}: {hits:?}");
            assert!(
                hits.iter()
                    .all(|h| h == "id=0x0 name=(fault) s=(fault) v=0"),
                "{hits:?}"
            );
        }
    }
}

/// A stack overflow's SIGSEGV reaches the program's handler on its signal stack (ftprobe's
/// handler runs there too), after probes that faulted.
#[test]
fn stack_overflow_reaches_the_handler_on_its_signal_stack() {
    for exe in fixtures() {
        let hits = traced_as_untraced(&exe, &["overflow"]);
        let plain = untraced(&[exe.to_str().unwrap(), "overflow"]);
        assert_eq!(
            String::from_utf8_lossy(&plain.stdout),
            "overflow caught=1 onstack=1\n"
        );
        assert_eq!(hits, vec!["id=0x0 name=(fault) s=(fault) v=0"; 3]);
    }
}

/// Whether `dir` holds a core file (`core` or `core.PID`).
fn has_core(dir: &std::path::Path) -> bool {
    std::fs::read_dir(dir)
        .unwrap()
        .any(|e| e.unwrap().file_name().to_string_lossy().starts_with("core"))
}

/// Where a fault would kill (SIGSEGV and SIGBUS blocked by the thread's mask, in a thread
/// started with every signal blocked, in a handler whose `sa_mask` is full), the reads take
/// the system call: every probe hit is `(fault)` and the program lives.
#[test]
fn bad_pointers_where_the_fault_signals_are_blocked() {
    for exe in fixtures() {
        let hits = traced_as_untraced(&exe, &["blocked"]);
        let plain = untraced(&[exe.to_str().unwrap(), "blocked"]);
        assert_eq!(String::from_utf8_lossy(&plain.stdout), "blocked calls=9\n");
        assert_eq!(
            hits,
            vec!["id=0x0 name=(fault) s=(fault) v=0"; 9],
            "{exe:?}"
        );
    }
}

/// `cmd` run in `dir`.
fn run_in(dir: &std::path::Path, mut cmd: Command) -> Output {
    cmd.current_dir(dir).output().unwrap()
}

/// A program with no handler that faults on purpose dies of SIGSEGV as it does untraced,
/// with a core file or without, after its probe hits faulted and were survived. The core is
/// cut at 4 MiB (the fixture's RLIMIT_CORE): the traced process maps the agent's rings and
/// trampolines, gigabytes of core; a cut core still counts as dumped.
#[test]
fn a_program_without_handler_dies_of_its_fault_as_untraced() {
    for exe in fixtures() {
        for core in ["0", "4194304"] {
            let plain_dir = tmp_dir("nofault-plain");
            let mut c = Command::new(&exe);
            c.args(["die", core]);
            let plain = run_in(&plain_dir, c);
            assert_eq!(plain.status.signal(), Some(libc::SIGSEGV), "{plain:?}");
            assert_eq!(String::from_utf8_lossy(&plain.stdout), "die before\n");
            let plain_core = plain.status.core_dumped();

            let dir = tmp_dir("nofault-traced");
            let out_file = dir.join("trace.txt");
            let mut c = ftprobe();
            c.args(["trace", "-e", DEF, "-o"])
                .arg(&out_file)
                .arg("--")
                .arg(&exe)
                .args(["die", core]);
            let out = run_in(&dir, c);
            let text = std::fs::read_to_string(&out_file).unwrap();
            assert_eq!(out.status.code(), Some(128 + libc::SIGSEGV), "{out:?}");
            assert_eq!(out.stdout, plain.stdout);
            assert_eq!(
                hits(&text),
                vec!["id=0x0 name=(fault) s=(fault) v=0"; 3],
                "{text}"
            );
            let how = if plain_core {
                "(Segmentation fault, core dumped)"
            } else {
                "(Segmentation fault)"
            };
            assert!(
                text.contains(&format!("was killed by signal 11 {how}\n")),
                "{exe:?} core={core}: {text}"
            );
            // Where the system writes cores (core_pattern), both runs left the same files.
            assert_eq!(has_core(&dir), has_core(&plain_dir), "{exe:?} core={core}");
            let _ = std::fs::remove_dir_all(&plain_dir);
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

/// A traced program's core dump holds the program, not ftprobe's rings: with an 8 GiB core
/// limit the core of `die` was the whole 8 GiB (the rings' reserved space), and it filled a
/// disk once. The rings are mapped `MADV_DONTDUMP`; the core is now within 32 MiB of the
/// untraced one (the agent's code and data, trampolines, XOL slots).
#[test]
fn a_traced_program_core_holds_no_rings() {
    let pattern = std::fs::read_to_string("/proc/sys/kernel/core_pattern").unwrap_or_default();
    if !pattern.trim_start().starts_with("core") {
        eprintln!("skipped: core_pattern is {pattern:?}, not a file in the current directory");
        return;
    }
    let limit = (8u64 << 30).to_string();
    let core_bytes = |dir: &std::path::Path| -> u64 {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| e.file_name().to_string_lossy().starts_with("core"))
            .map(|e| {
                use std::os::unix::fs::MetadataExt;
                e.metadata().unwrap().blocks() * 512
            })
            .sum()
    };
    let exe = nofault_fixture();
    let plain_dir = tmp_dir("nofault-core-plain");
    let mut c = Command::new(&exe);
    c.args(["die", &limit]);
    let plain = run_in(&plain_dir, c);
    assert!(plain.status.core_dumped(), "{plain:?}");
    let plain_size = core_bytes(&plain_dir);
    let dir = tmp_dir("nofault-core-traced");
    let mut c = ftprobe();
    c.args(["trace", "-e", DEF, "-o"])
        .arg(dir.join("trace.txt"))
        .arg("--")
        .arg(&exe)
        .args(["die", &limit]);
    let out = run_in(&dir, c);
    let size = core_bytes(&dir);
    let _ = std::fs::remove_dir_all(&plain_dir);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(out.status.code(), Some(128 + libc::SIGSEGV), "{out:?}");
    assert!(
        size > 0,
        "the traced program dumped core as the untraced one"
    );
    assert!(
        size < plain_size + (32 << 20),
        "core of the traced program: {size} bytes, untraced {plain_size}"
    );
}

/// `trace -p`: the agent loaded into a running program installs the fault handler when the
/// event is created; every read through the bad pointers `attach_window(0..N)` gets (fault),
/// and the program ends as it does untraced (no EINTR, its own SIGUSR1s all delivered).
#[test]
fn attached_bad_pointers_are_faults() {
    use common::attach_target::{Target, CLEAN_END};
    use std::io::{BufReader, Read};
    use std::process::Stdio;

    let mut t = Target::start(&[]);
    let pid = t.pid();
    let out_file = tmp_dir("nofault-attach").join("trace.txt");
    let mut cli = ftprobe_dev::KillOnDrop::spawn(
        ftprobe()
            .args(["trace", "-p", &pid.to_string(), "-e"])
            .arg("p:win attach_window v=+0(%di):u64 s=+0(%di):string w=+8(+0(%di)):x32")
            .arg("-o")
            .arg(&out_file)
            .stderr(Stdio::piped()),
    )
    .unwrap();
    let mut err = BufReader::new(cli.stderr.take().unwrap());
    let mut said = String::new();
    if common::wait_until_tracing(&mut err, &mut said) {
        assert_eq!(t.window(50), "window 50 done\n");
        common::interrupt(&cli);
    }
    err.read_to_string(&mut said).unwrap();
    assert!(cli.wait().unwrap().success(), "{said}");
    let text = std::fs::read_to_string(&out_file).unwrap();
    let _ = std::fs::remove_dir_all(out_file.parent().unwrap());
    let hits: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains(" win: "))
        .map(|l| l.split_once(") ").unwrap().1)
        .collect();
    assert_eq!(hits, vec!["v=0 s=(fault) w=0x0"; 50], "{text}");
    assert_eq!(t.quit(), (CLEAN_END.to_owned(), Some(0)));
}
