//! SDT markers (USDT, `<sys/sdt.h>`) end to end: `ftprobe list sdt` against binutils'
//! `readelf -n`, and probes on markers (`sdt_PROVIDER:NAME`, `%sdt_...`, `OBJ:sdt_...`)
//! against the programs' own printouts and counts. Fixtures: `sdt` (`c/sdt.c`,
//! `c/sdt_sema.c`: markers of provider `ftp`, one inlined at three places, one guarded by a
//! semaphore) and `sdt_throw` (`c/sdt_throw.cc`: C++ exceptions, which fire libstdc++'s own
//! `libstdcxx:throw` and `libstdcxx:catch` markers; Debian 12's glibc has no SDT notes, so
//! libc's `setjmp` marker cannot be tested here).

use std::process::Command;

mod common;
use common::{events, ftprobe, trace, untraced};

fn sdt() -> String {
    ftprobe_dev::sdt_fixture().to_str().unwrap().to_owned()
}

/// The program's own `KEY=VALUE` words of lines starting with `prefix`, in order.
fn printed(out: &std::process::Output, prefix: &str) -> Vec<Vec<(String, String)>> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with(prefix))
        .map(|l| {
            l.split_whitespace()
                .filter_map(|w| w.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect()
        })
        .collect()
}

fn value(words: &[(String, String)], key: &str) -> String {
    words
        .iter()
        .find(|(k, _)| k == key)
        .unwrap_or_else(|| panic!("{key} in {words:?}"))
        .1
        .clone()
}

/// The arguments (`NAME=VALUE ...` after the `(sym+off/size) `) of each hit of `event`.
fn hits(text: &str, event: &str) -> Vec<String> {
    let tag = format!(": {event}: (");
    events(text)
        .filter_map(|l| l.split_once(&tag))
        .map(|(_, rest)| rest.split_once(") ").map_or("", |x| x.1).to_owned())
        .collect()
}

/// One line of `readelf -n` SDT output per marker: (event, address, semaphore, args).
fn readelf_markers(path: &str) -> Vec<(String, u64, u64, String)> {
    let out = Command::new("readelf")
        .args(["-n", path])
        .output()
        .expect("readelf (binutils)");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let mut rows = Vec::new();
    let mut lines = text.lines().map(str::trim);
    let hex = |s: &str| u64::from_str_radix(s.trim().trim_start_matches("0x"), 16).unwrap();
    while let Some(l) = lines.next() {
        let Some(provider) = l.strip_prefix("Provider: ") else {
            continue;
        };
        let name = lines.next().unwrap().strip_prefix("Name: ").unwrap();
        // `Location: 0x..., Base: 0x..., Semaphore: 0x...`
        let loc = lines.next().unwrap();
        let field = |f: &str| {
            let s = loc.split(&format!("{f}: ")).nth(1).unwrap();
            hex(s.split(',').next().unwrap())
        };
        let args = lines
            .next()
            .unwrap()
            .strip_prefix("Arguments:")
            .unwrap()
            .trim()
            .to_owned();
        rows.push((
            format!("sdt_{provider}:{name}"),
            field("Location"),
            field("Semaphore"),
            args,
        ));
    }
    rows
}

/// `prog` and the libraries `ldd` says it links.
fn ldd_objects(prog: &str) -> Vec<String> {
    let out = Command::new("ldd").arg(prog).output().unwrap();
    let mut objs = vec![prog.to_owned()];
    for l in String::from_utf8_lossy(&out.stdout).lines() {
        let p = l.split_once("=>").map_or(l, |x| x.1).trim();
        let p = p.split(" (").next().unwrap();
        if p.starts_with('/') {
            objs.push(p.to_owned());
        }
    }
    objs
}

#[test]
fn list_sdt_is_readelfs_notes_of_the_program_and_its_libraries() {
    for prog in [
        sdt(),
        ftprobe_dev::sdt_throw_fixture()
            .to_str()
            .unwrap()
            .to_owned(),
    ] {
        let out = ftprobe().args(["list", "sdt", &prog]).output().unwrap();
        assert!(out.status.success(), "{out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        let mut listed: Vec<(String, u64, u64, String, String)> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
                let sem = if w[2] == "-" { 0 } else { hex(w[2]) };
                (
                    w[0].to_owned(),
                    hex(w[1]),
                    sem,
                    w[3].to_owned(),
                    w[4..].join(" "),
                )
            })
            .collect();
        let mut truth = Vec::new();
        for o in ldd_objects(&prog) {
            for (e, a, s, args) in readelf_markers(&o) {
                truth.push((e, a, s, o.clone(), args));
            }
        }
        listed.sort();
        truth.sort();
        assert!(!truth.is_empty(), "{prog}: readelf finds markers");
        assert_eq!(listed, truth, "{prog}:\n{text}");
        assert!(
            text.starts_with(&format!("# {} SDT markers", truth.len())),
            "{text}"
        );
    }
}

#[test]
fn every_operand_kind_is_fetched_as_the_program_passed_it() {
    let n = 5;
    let exe = sdt();
    let (out, text) = trace(
        &[
            "-e",
            "p sdt_ftp:args",
            "-e",
            "p:strs/args_s %sdt_ftp:args s=+0($arg5):string c=$arg2:char",
            "-e",
            "p:m sdt_ftp:mem v=$arg1 p=$arg2:x64 pv=+0($arg2):s64",
            "-e",
            "p sdt_ftp:noargs",
            "-e",
            "p sdt_ftp:global",
        ],
        &[&exe, &n.to_string()],
    );
    let plain = untraced(&[&exe, &n.to_string()]);
    assert!(out.status.success(), "{out:?}");
    // Nothing guarded is probed: the program runs as without ftprobe.
    assert_eq!(out.stdout, plain.stdout);
    assert!(text.contains("# lost events: 0\n"), "{text}");
    let rounds = printed(&out, "args ");
    assert_eq!(rounds.len(), n);
    let args = hits(&text, "args");
    let strs = hits(&text, "args_s");
    let mem = hits(&text, "m");
    assert_eq!((args.len(), strs.len(), mem.len()), (n, n, n), "{text}");
    for (i, r) in rounds.iter().enumerate() {
        let c = value(r, "c");
        // perf's default arguments: every operand, typed by its size (`-1@` char: s8).
        assert_eq!(
            args[i],
            format!(
                "arg1={} arg2={} arg3={} arg4=5 arg5={}",
                value(r, "neg"),
                c.as_bytes()[0],
                value(r, "l"),
                // The string's address: checked through the string below.
                args[i].rsplit("arg5=").next().unwrap()
            )
        );
        assert_eq!(strs[i], format!("s=\"{}\" c='{c}'", value(r, "s")));
        let v = value(r, "mem");
        let (p, pv) = (
            mem[i]
                .split("p=")
                .nth(1)
                .unwrap()
                .split(' ')
                .next()
                .unwrap(),
            mem[i].rsplit("pv=").next().unwrap(),
        );
        assert!(p.starts_with("0x7ff"), "a stack address: {}", mem[i]);
        assert_eq!(mem[i], format!("v={v} p={p} pv={pv}"));
        assert_eq!(pv, v);
    }
    // RIP-relative operands (`sdt_global(%rip)`, `sdt_bss(%rip)`): `@+OFFS` fetches.
    let globals = printed(&out, "global ");
    let g = hits(&text, "global");
    assert_eq!(globals.len(), n);
    let want: Vec<String> = globals
        .iter()
        .map(|r| {
            format!(
                "arg1={} arg2={} arg3={}",
                value(r, "g"),
                value(r, "i"),
                value(r, "b")
            )
        })
        .collect();
    assert_eq!(g, want, "{text}");
    let own = printed(&out, "inlined=");
    assert_eq!(
        hits(&text, "noargs").len().to_string(),
        value(&own[0], "noargs")
    );
    assert!(hits(&text, "noargs").iter().all(|h| h.is_empty()));
}

#[test]
fn an_inlined_marker_is_probed_at_every_copy() {
    let n = 4;
    let exe = sdt();
    let (out, text) = trace(&["-e", "p:g/inl sdt_ftp:inlined"], &[&exe, &n.to_string()]);
    assert!(out.status.success(), "{out:?}");
    let own = printed(&out, "inlined=");
    let hits = hits(&text, "inl");
    // The program's own count (3 per round), and each copy's constant argument in order.
    assert_eq!(hits.len().to_string(), value(&own[0], "inlined"));
    let want: Vec<String> = (0..n)
        .flat_map(|_| ["arg1=1", "arg1=2", "arg1=3"])
        .map(str::to_owned)
        .collect();
    assert_eq!(hits, want);
    // Three probes, one event: the profile has one line for it with every hit.
    assert!(
        text.lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>()
                == ["#", "inl", &(3 * n).to_string(), "0"]),
        "{text}"
    );
}

#[test]
fn a_guarded_marker_runs_while_its_semaphore_is_held() {
    let n = 6;
    let exe = sdt();
    // Without the probe the semaphore stays 0: the program skips the marker.
    let (out, _) = trace(&["-e", "p sdt_ftp:noargs"], &[&exe, &n.to_string()]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(value(&printed(&out, "inlined=")[0], "guarded"), "0");
    // With it, the agent raises the semaphore while the probe is armed.
    let (out, text) = trace(
        &["-e", "p:gd sdt:sdt_ftp:guarded i=$arg1 sq=$arg2"],
        &[&exe, &n.to_string()],
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        value(&printed(&out, "inlined=")[0], "guarded"),
        n.to_string()
    );
    let want: Vec<String> = (0..n).map(|i| format!("i={i} sq={}", i * i)).collect();
    assert_eq!(hits(&text, "gd"), want, "{text}");
}

#[test]
fn libstdcxx_markers_in_an_unmodified_program() {
    let n = 4;
    let exe = ftprobe_dev::sdt_throw_fixture();
    let exe = exe.to_str().unwrap();
    let (out, text) = trace(
        &[
            "-e",
            "p sdt_libstdcxx:throw",
            "-e",
            "p libstdc++:sdt_libstdcxx:catch",
        ],
        &[exe, &n.to_string()],
    );
    assert!(out.status.success(), "{out:?}");
    let thrown = printed(&out, "thrown ");
    assert_eq!(thrown.len(), n);
    let throws = hits(&text, "throw");
    assert_eq!(throws.len(), n, "{text}");
    assert_eq!(hits(&text, "catch").len(), n, "{text}");
    // arg1 of `throw` is the exception object __cxa_throw got: the program's `&b`.
    for (h, t) in throws.iter().zip(&thrown) {
        let obj = u64::from_str_radix(value(t, "obj").trim_start_matches("0x"), 16).unwrap();
        let arg1: u64 = h
            .strip_prefix("arg1=")
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(arg1, obj, "{h}");
    }
}

#[test]
fn unknown_markers_and_arguments_are_refused_with_a_caret() {
    let exe = sdt();
    for (def, caret_at, name, detail) in [
        (
            "p sdt_ftp:nope",
            "sdt_ftp:nope",
            "BAD_PROBE_ADDR",
            "no SDT marker ftp:nope",
        ),
        (
            "p libm:sdt_ftp:args",
            "libm:",
            "BAD_PROBE_ADDR",
            "no SDT marker ftp:args in libm of",
        ),
        (
            "p sdt_ftp:args x=$arg6",
            "x=",
            "BAD_VAR",
            "the marker has 5",
        ),
        (
            "r sdt_ftp:args",
            "sdt_ftp",
            "BAD_RETPROBE",
            "no return probe",
        ),
    ] {
        let out = ftprobe()
            .args(["trace", "-e", def, "--", &exe, "1"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{def}: {out:?}");
        assert!(out.stdout.is_empty(), "nothing ran");
        let err = String::from_utf8_lossy(&out.stderr);
        let col = def.find(caret_at).unwrap();
        let want = format!(
            "  Command: {def}\n{}^\n",
            " ".repeat("  Command: ".len() + col)
        );
        assert!(err.contains(&want), "{def}:\n{err}");
        assert!(err.contains(detail), "{def}:\n{err}");
        assert!(
            err.contains(&format!("invalid probe definition ({name})")),
            "{def}:\n{err}"
        );
    }
}

#[test]
fn addresses_follow_a_moved_stapsdt_base_as_after_prelink() {
    // objcopy moves `.stapsdt.base` by 0x10 and leaves the notes as they were: the notes'
    // recorded base is then 0x10 below the section, as after prelink moved an object.
    let dir = common::tmp_dir("sdt-moved");
    let moved = dir.join("sdt-moved");
    let moved_s = moved.to_str().unwrap();
    let out = Command::new("objcopy")
        .args([
            "--change-section-address",
            ".stapsdt.base+0x10",
            &sdt(),
            moved_s,
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let sections = Command::new("readelf")
        .args(["-SW", moved_s])
        .output()
        .unwrap();
    let sections = String::from_utf8_lossy(&sections.stdout);
    let w: Vec<&str> = sections.split_whitespace().collect();
    let i = w.iter().position(|t| *t == ".stapsdt.base").unwrap();
    let actual = u64::from_str_radix(w[i + 2], 16).unwrap();
    // readelf -n prints each note's Location and Base as recorded.
    let notes = Command::new("readelf")
        .args(["-n", moved_s])
        .output()
        .unwrap();
    let notes = String::from_utf8_lossy(&notes.stdout);
    let hex = |s: &str| u64::from_str_radix(s.trim().trim_start_matches("0x"), 16).unwrap();
    let mut want: Vec<(u64, u64)> = notes
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Location: "))
        .map(|l| {
            let f: Vec<&str> = l.split(", ").collect();
            let (loc, base) = (hex(f[0]), hex(f[1].strip_prefix("Base: ").unwrap()));
            let sem = hex(f[2].strip_prefix("Semaphore: ").unwrap());
            assert_eq!(actual - base, 0x10);
            let sem = if sem == 0 { 0 } else { sem + actual - base };
            (loc + actual - base, sem)
        })
        .collect();
    let out = ftprobe().args(["list", "sdt", moved_s]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut listed: Vec<(u64, u64)> = text
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains(moved_s))
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (hex(w[1]), if w[2] == "-" { 0 } else { hex(w[2]) })
        })
        .collect();
    want.sort();
    listed.sort();
    assert!(!want.is_empty());
    assert_eq!(listed, want, "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_reference_counter_outside_writable_data_is_refused() {
    // The uprobe-style definition the expansion writes, with a counter the engine must
    // refuse: file offset 0x10 is in the ELF header (read-only); the semaphore's + 1 is odd.
    let exe = ftprobe_dev::sdt_fixture().canonicalize().unwrap();
    let exe = exe.to_str().unwrap();
    let list = ftprobe().args(["list", "sdt", exe]).output().unwrap();
    let list = String::from_utf8_lossy(&list.stdout);
    let pc: u64 = list
        .lines()
        .find(|l| l.starts_with("sdt_ftp:noargs "))
        .map(|l| {
            let a = l.split_whitespace().nth(1).unwrap();
            u64::from_str_radix(a.trim_start_matches("0x"), 16).unwrap()
        })
        .unwrap();
    let sem: u64 = list
        .lines()
        .find(|l| l.starts_with("sdt_ftp:guarded "))
        .map(|l| {
            let a = l.split_whitespace().nth(2).unwrap();
            u64::from_str_radix(a.trim_start_matches("0x"), 16).unwrap()
        })
        .unwrap();
    // File offsets from readelf's program headers: (offset, vaddr, filesz) of each PT_LOAD.
    let ph = Command::new("readelf").args(["-lW", exe]).output().unwrap();
    let loads: Vec<(u64, u64, u64)> = String::from_utf8_lossy(&ph.stdout)
        .lines()
        .filter(|l| l.trim_start().starts_with("LOAD"))
        .map(|l| {
            let w: Vec<u64> = l
                .split_whitespace()
                .skip(1)
                .take(4)
                .map(|x| u64::from_str_radix(x.trim_start_matches("0x"), 16).unwrap())
                .collect();
            (w[0], w[1], w[3])
        })
        .collect();
    let offset_of = |a: u64| {
        loads
            .iter()
            .find(|&&(_, v, sz)| a >= v && a - v < sz)
            .map(|&(o, v, _)| o + (a - v))
            .unwrap()
    };
    let pc = offset_of(pc);
    // The semaphore's own offset is accepted (the guarded test); one byte further is not
    // 2-byte aligned.
    let odd = format!("{:#x}", offset_of(sem) + 1);
    for counter in ["0x10", &odd] {
        let def = format!("p {exe}:{pc:#x}({counter})");
        let out = ftprobe()
            .args(["trace", "-e", &def, "--", exe, "1"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        let col = def.find('(').unwrap() + 1;
        let want = format!(
            "error: Invalid reference counter offset\n  Command: {def}\n{}^\n",
            " ".repeat("  Command: ".len() + col)
        );
        assert!(err.contains(&want), "{err}");
        assert!(err.contains("no writable, 2-byte aligned counter"), "{err}");
    }
}

/// `sdt -`, driven one round at a time.
struct Rounds {
    child: ftprobe_dev::KillOnDrop,
    stdin: std::process::ChildStdin,
    stdout: std::io::BufReader<std::process::ChildStdout>,
}

impl Rounds {
    fn start() -> Rounds {
        use std::io::BufRead;
        use std::process::Stdio;
        let mut child = ftprobe_dev::KillOnDrop::spawn(
            Command::new(ftprobe_dev::sdt_fixture())
                .arg("-")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped()),
        )
        .unwrap();
        let stdin = child.stdin.take().unwrap();
        let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut l = String::new();
        stdout.read_line(&mut l).unwrap();
        assert_eq!(l, "ready\n");
        Rounds {
            child,
            stdin,
            stdout,
        }
    }

    /// One round; the program's count of guarded runs so far.
    fn round(&mut self) -> u32 {
        use std::io::{BufRead, Write};
        self.stdin.write_all(b"round\n").unwrap();
        self.stdin.flush().unwrap();
        loop {
            let mut l = String::new();
            assert!(
                self.stdout.read_line(&mut l).unwrap() > 0,
                "the fixture ended"
            );
            if let Some(g) = l.trim().strip_prefix("done guarded=") {
                return g.parse().unwrap();
            }
        }
    }
}

#[test]
fn an_attached_trace_holds_the_semaphore_only_while_attached() {
    use std::io::Read;
    use std::process::Stdio;
    let mut t = Rounds::start();
    assert_eq!(t.round(), 0, "not traced: the guarded marker does not run");
    let pid = t.child.id();
    let out_file = common::tmp_dir("sdt-attach").join("trace.txt");
    let mut cli = ftprobe_dev::KillOnDrop::spawn(
        ftprobe()
            .args(["trace", "-p", &pid.to_string()])
            .args(["-e", "p:gd sdt_ftp:guarded i=$arg1"])
            .arg("-o")
            .arg(&out_file)
            .stderr(Stdio::piped()),
    )
    .unwrap();
    let mut err = std::io::BufReader::new(cli.stderr.take().unwrap());
    let mut said = String::new();
    let mut during = Vec::new();
    if common::wait_until_tracing(&mut err, &mut said) {
        for _ in 0..3 {
            during.push(t.round());
        }
        common::interrupt(&cli);
    }
    err.read_to_string(&mut said).unwrap();
    let status = cli.wait().unwrap();
    assert!(status.success(), "{said}");
    assert_eq!(during, [1, 2, 3], "{said}");
    let text = std::fs::read_to_string(&out_file).unwrap();
    assert_eq!(hits(&text, "gd"), ["i=1", "i=2", "i=3"], "{text}");
    // Detached: the counter is back to 0, the marker is skipped again.
    assert_eq!(t.round(), 3);
    let _ = std::fs::remove_dir_all(out_file.parent().unwrap());
}
