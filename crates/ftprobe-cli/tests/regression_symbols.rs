//! Regressions of issue 9 about finding functions and sites: a gcc nested function's site
//! after `push %r10`, and probes in stripped objects (Debian's libc) through `.eh_frame`
//! bounds and the separate debug file (`libc6-dbg`), checked against the fixtures' own counts
//! and, as root, against kernel uprobes on the same file offsets.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;
use common::kernel_uprobes::KernelUprobes;
use common::{events, ftprobe, trace, untraced};

use ftprobe_dev::{fixture, libc_calls_fixture, Flavour};
use object::{Object, ObjectSegment, ObjectSymbol};

/// The event records of `event`: what follows `: EVENT: (` on each line.
fn kprobe_lines<'a>(text: &'a str, event: &str) -> Vec<&'a str> {
    let tag = format!(": {event}: (");
    events(text)
        .filter_map(|l| l.split_once(&tag).map(|(_, rest)| rest))
        .collect()
}

/// The `# kprobes/list:` line of the probe whose symbol part starts with `sym`.
fn list_line<'a>(text: &'a str, sym: &str) -> Option<&'a str> {
    text.lines()
        .filter(|l| l.starts_with("#   "))
        .find(|l| l.split("  k  ").nth(1).is_some_and(|r| r.starts_with(sym)))
}

/// Event lines whose function part is exactly `func_line` (`foo <-main`).
fn count(text: &str, func_line: &str) -> usize {
    events(text)
        .filter(|l| l.split_once(": ").map(|x| x.1) == Some(func_line))
        .count()
}

/// Where gcc 12 puts `foo_internal`'s site in each flavour (objdump of `nested-*`): after
/// `push %r10` with `-mfentry` (the static chain is saved around the `__fentry__` call), after
/// `push %rbp; mov %rsp,%rbp; push %r10` with `-pg` alone, at entry with patchable entries
/// (`foo_internal` is static and never address-taken: no `endbr64` even with CET).
fn nested_site(fl: Flavour) -> (u64, &'static str) {
    if fl.is_mcount() {
        (6, "after-prologue")
    } else if matches!(fl, Flavour::Patchable | Flavour::PatchableCet) {
        (0, "entry")
    } else {
        (2, "after-push-r10")
    }
}

/// Regression (issue 9, item 7): gcc's nested functions built with `-pg -mfentry` start with
/// `push %r10; call __fentry__; pop %r10`; the site at +2 was "no recognisable site" (listed
/// under rejected addresses with `-mrecord-mcount`, missing without) and `-F '*'` skipped it
/// silently. Now it is found in every flavour, traced with its real parent (the trampoline
/// reads the return address above the saved `%r10`), and a kprobe on it rides ftrace.
#[test]
fn nested_function_site_after_push_r10_is_found_and_traced() {
    for fl in Flavour::ALL {
        let exe = fixture("nested", fl).unwrap();
        let exe = exe.to_str().unwrap();
        let (site, place) = nested_site(fl);
        if place == "after-push-r10" {
            // The fixture is what this test is about: `push %r10` first.
            let data = std::fs::read(exe).unwrap();
            let img = ftprobe::elf::ElfImage::parse(Path::new(exe), &data).unwrap();
            let f = img
                .funcs_named("foo_internal.0")
                .next()
                .expect("foo_internal.0");
            let seg = img
                .segments
                .iter()
                .find(|s| f.svma >= s.svma && f.svma - s.svma < s.filesz)
                .unwrap();
            let off = (f.svma - seg.svma + seg.offset) as usize;
            assert_eq!(
                &data[off..off + 2],
                [0x41, 0x52],
                "{}: push %r10",
                fl.name()
            );
        }

        let list = ftprobe().args(["list", "functions", exe]).output().unwrap();
        let list = String::from_utf8_lossy(&list.stdout);
        // Columns: SITE KIND PLACE FOUND-IN FUNCTION.
        let line = list
            .lines()
            .find(|l| l.ends_with(" foo_internal.0"))
            .unwrap_or_else(|| panic!("{}: foo_internal.0 not listed:\n{list}", fl.name()));
        let cols: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(
            (cols[0], cols[2]),
            (format!("+{site:#x}").as_str(), place),
            "{}: {line}",
            fl.name()
        );
        assert!(
            !list.contains("no recognisable site"),
            "{}:\n{list}",
            fl.name()
        );

        // Every function: the program's own count of foo_internal's calls, with its parent.
        let plain = untraced(&[exe, "7"]);
        assert_eq!(
            String::from_utf8_lossy(&plain.stdout),
            "calls=7\nsum=63\n",
            "{}",
            fl.name()
        );
        let (out, text) = trace(&["-F", "*"], &[exe, "7"]);
        assert!(out.status.success(), "{}: {out:?}", fl.name());
        assert_eq!(out.stdout, plain.stdout, "{}", fl.name());
        assert_eq!(
            count(&text, "foo_internal.0 <-foo"),
            7,
            "{}:\n{text}",
            fl.name()
        );
        assert_eq!(count(&text, "foo <-main"), 1, "{}:\n{text}", fl.name());
        let (_, text) = trace(&["-F", "foo_internal*"], &[exe, "7"]);
        assert_eq!(
            count(&text, "foo_internal.0 <-foo"),
            7,
            "{}:\n{text}",
            fl.name()
        );
        assert_eq!(events(&text).count(), 7, "{}:\n{text}", fl.name());

        // A kprobe event at the site goes through ftrace; one at +0 is an int3 probe on
        // `push %r10` (or on `push %rbp` for -pg), where $arg1 is allowed (the entry).
        let at_site = format!("p:site foo_internal.0+{site} x=%di:s32");
        let at_entry = "p:entry foo_internal.0 x=$arg1:s32".to_owned();
        for (event, def, ftrace) in [("site", &at_site, true), ("entry", &at_entry, site == 0)] {
            let (out, text) = trace(&["-e", def], &[exe, "7"]);
            assert!(out.status.success(), "{}: {def}: {out:?}", fl.name());
            assert_eq!(out.stdout, plain.stdout, "{}: {def}", fl.name());
            let listed = list_line(&text, "foo_internal.0+")
                .unwrap_or_else(|| panic!("{}: {def}: not listed:\n{text}", fl.name()));
            let off = if event == "site" { site } else { 0 };
            assert!(
                listed.contains(&format!("  k  foo_internal.0+{off:#x}  ")),
                "{}: {listed}",
                fl.name()
            );
            assert_eq!(
                listed.ends_with("[FTRACE]"),
                ftrace,
                "{}: {def}: {listed}",
                fl.name()
            );
            let xs: Vec<&str> = kprobe_lines(&text, event)
                .iter()
                .map(|l| l.rsplit_once(" x=").unwrap().1)
                .collect();
            assert_eq!(
                xs,
                ["0", "1", "2", "3", "4", "5", "6"],
                "{}: {def}:\n{text}",
                fl.name()
            );
        }
    }
}

const LIBC: &str = "/lib/x86_64-linux-gnu/libc.so.6";

/// Held by the tests that run `libc_calls`: a kernel uprobe filters by the process name, so
/// one of them must not count another's runs, and its breakpoint must not meet ftprobe's in
/// another run's libc pages.
static LIBC_CALLS: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn libc_calls_lock() -> std::sync::MutexGuard<'static, ()> {
    LIBC_CALLS.lock().unwrap_or_else(|e| e.into_inner())
}

/// `ftprobe trace ARGS -o TMP -- CMD` with `FTPROBE_DEBUG_DIR` set to `debug_dir` (empty: no
/// debug files at all, so only `.eh_frame` bounds), or as the environment has it.
fn trace_with_debug_dir(debug_dir: Option<&str>, args: &[&str], cmd: &[&str]) -> (Output, String) {
    let dir = std::env::temp_dir().join(format!("ftprobe-regsym-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let out_file = dir.join(format!("trace-{n}.txt"));
    let mut c = ftprobe();
    c.arg("trace")
        .args(args)
        .arg("-o")
        .arg(&out_file)
        .arg("--")
        .args(cmd);
    match debug_dir {
        Some(d) => c.env("FTPROBE_DEBUG_DIR", d),
        None => c.env_remove("FTPROBE_DEBUG_DIR"),
    };
    let out = c.output().expect("run ftprobe");
    let text = String::from_utf8_lossy(&std::fs::read(&out_file).unwrap_or_default()).into_owned();
    let _ = std::fs::remove_file(&out_file);
    (out, text)
}

/// The hits `# kprobe_profile:` gives for `event`.
fn profile_hits(text: &str, event: &str) -> Option<u64> {
    let at = text.find("# kprobe_profile:")?;
    text[at..].lines().find_map(|l| {
        let mut w = l.trim_start_matches('#').split_whitespace();
        (w.next() == Some(event)).then(|| w.next()?.parse().ok())?
    })
}

/// The system libc's separate debug file (`libc6-dbg`), found the way perf and gdb find it,
/// computed here from the libc's build-id with the `object` crate; `None` (the caller skips)
/// when it is not installed or not this libc's.
fn libc_debug_file() -> Option<(Vec<u8>, PathBuf)> {
    let libc = std::fs::read(LIBC).ok()?;
    let id = object::File::parse(&*libc).ok()?.build_id().ok()??.to_vec();
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let path = PathBuf::from(format!(
        "/usr/lib/debug/.build-id/{}/{}.debug",
        &hex[..2],
        &hex[2..]
    ));
    let data = std::fs::read(&path).ok()?;
    let same = object::File::parse(&*data).ok()?.build_id().ok()?? == id.as_slice();
    same.then_some((data, path))
}

/// A function of libc that its own symbol tables do not name, from the debug file's `.symtab`:
/// `(svma, size, every name at svma)` (glibc has aliases: `____strtoll_l_internal`).
fn internal_function(debug: &[u8], name: &str) -> (u64, u64, Vec<String>) {
    let libc = std::fs::read(LIBC).unwrap();
    let own = object::File::parse(&*libc).unwrap();
    assert!(
        !own.symbols()
            .chain(own.dynamic_symbols())
            .any(|s| s.name() == Ok(name)),
        "{name} has a symbol in {LIBC} itself: not what this test is about"
    );
    let file = object::File::parse(debug).unwrap();
    let sym = file
        .symbols()
        .find(|s| s.name() == Ok(name))
        .unwrap_or_else(|| panic!("{name} not in libc's debug file"));
    let aliases = file
        .symbols()
        .filter(|s| s.address() == sym.address() && s.kind() == object::SymbolKind::Text)
        .filter_map(|s| Some(s.name().ok()?.to_owned()))
        .collect();
    (sym.address(), sym.size(), aliases)
}

/// The file offset of libc's file address `svma`.
fn libc_file_offset(svma: u64) -> u64 {
    let data = std::fs::read(LIBC).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let seg = file
        .segments()
        .find(|s| svma >= s.address() && svma - s.address() < s.file_range().1)
        .expect("a segment maps it");
    svma - seg.address() + seg.file_range().0
}

/// The instruction boundaries of libc's code at `[svma, svma + len)`, by `objdump -d` (an
/// independent decoder). `None` when objdump is not installed.
fn objdump_boundaries(svma: u64, len: u64) -> Option<Vec<u64>> {
    let out = Command::new("objdump")
        .arg("-d")
        .arg(format!("--start-address={svma:#x}"))
        .arg(format!("--stop-address={:#x}", svma + len))
        .arg(LIBC)
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    Some(
        text.lines()
            .filter_map(|l| {
                let (addr, rest) = l.trim_start().split_once(":\t")?;
                // Continuation lines of long instructions have bytes but no mnemonic.
                rest.contains('\t')
                    .then(|| u64::from_str_radix(addr, 16).ok())?
            })
            .collect(),
    )
}

/// Hits of a kernel uprobe at libc's file `offset` in one run of `libc_calls N`, or why not.
fn kernel_hits(offset: u64, n: &str) -> Result<usize, String> {
    let exe = libc_calls_fixture();
    let probe = KernelUprobes::new(&[(Path::new(LIBC), offset)], Some("comm == \"libc_calls\""))?;
    let child = Command::new(&exe).arg(n).output().unwrap();
    assert!(child.status.success());
    // The pid is gone with the process; the trace keeps it. One run per probe: count them all.
    let text = probe.trace();
    let pids: std::collections::BTreeSet<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_whitespace().next()?.rsplit_once('-').map(|x| x.1))
        .collect();
    assert!(pids.len() <= 1, "one process only: {pids:?}");
    Ok(pids
        .iter()
        .next()
        .map_or(0, |p| probe.hits(0, p.parse().unwrap()) as usize))
}

/// Regression (issue 9, item 10): Debian's libc has no `.symtab`, and a probe by file offset
/// (`uprobe_events`' `PATH:0xOFFSET`) inside one of its internal functions failed with "not
/// inside a function of a loaded object". The function's bounds now come from its `.eh_frame`
/// FDE (with no debug file at all) or from the debug file's symbols, so any instruction
/// boundary can be probed; each counts what a kernel uprobe on the same offset counts.
#[test]
fn probe_by_file_offset_inside_a_stripped_libc_function_counts_as_a_kernel_uprobe() {
    let _serial = libc_calls_lock();
    let Some((debug, path)) = libc_debug_file() else {
        eprintln!("skipped: libc6-dbg for this libc is not installed (.ci/run installs it)");
        return;
    };
    let exe = libc_calls_fixture();
    let exe = exe.to_str().unwrap();
    // strtol's worker runs once per strtol (N + 1 with main's atoi); qsort's merge sort
    // recurses a number of times that depends only on N. Neither depends on the heap, which
    // differs with the agent loaded.
    for func in ["____strtol_l_internal", "msort_with_tmp.part.0"] {
        let (svma, size, names) = internal_function(&debug, func);
        let Some(bounds) = objdump_boundaries(svma, size.min(0x40)) else {
            eprintln!("skipped: objdump is not installed");
            return;
        };
        assert_eq!(bounds.first(), Some(&svma), "{func}: {bounds:x?}");
        // An inner boundary on the straight-line start of the function.
        let at = bounds[5];
        let offset = libc_file_offset(at);
        let def = format!("p:x {LIBC}:{offset:#x}");
        let mut counts = Vec::new();
        for debug_dir in [Some(""), None] {
            let (out, text) = trace_with_debug_dir(debug_dir, &["-e", &def], &[exe, "25"]);
            assert!(
                out.status.success(),
                "{func} {debug_dir:?}: {out:?}\n{text}"
            );
            assert_eq!(out.stdout, untraced(&[exe, "25"]).stdout);
            let listed = list_line(&text, "").unwrap_or_else(|| panic!("{text}"));
            let named = |n: &str| {
                let listed = format!("  k  {n}+{:#x}  libc.so.6", at - svma);
                match debug_dir {
                    // Bounds from .eh_frame only: named after the object and the FDE's start.
                    Some(_) => listed.replace(n, &format!("libc.so.6+{svma:#x}")),
                    None => listed,
                }
            };
            assert!(
                names.iter().any(|n| listed.contains(&named(n))),
                "{func} {debug_dir:?}: {listed}"
            );
            if debug_dir.is_none() {
                // The CLI names it too, from the debug file `path`.
                let tags: Vec<String> = names
                    .iter()
                    .map(|n| format!("x: ({n}+{:#x}/{size:#x})", at - svma))
                    .collect();
                assert!(
                    events(&text).all(|l| tags.iter().any(|t| l.ends_with(t))),
                    "{func} ({}):\n{text}",
                    path.display()
                );
            } else {
                // Without it, after its `.eh_frame` range, as the listing names it (the event
                // lines printed a bare address; found by a user).
                let tag = format!("x: (libc.so.6+{svma:#x}+{:#x}/{size:#x})", at - svma);
                assert!(
                    events(&text).all(|l| l.ends_with(&tag)),
                    "{func}: {tag}\n{text}"
                );
            }
            let hits = kprobe_lines(&text, "x").len();
            assert_eq!(profile_hits(&text, "x"), Some(hits as u64), "{text}");
            counts.push(hits);
        }
        assert_eq!(counts[0], counts[1], "{func}");
        assert!(counts[0] > 0, "{func}: never hit");
        if func.starts_with("____strtol") {
            assert_eq!(counts[0], 26, "{func}: 25 strtol + main's atoi");
        }
        match kernel_hits(offset, "25") {
            Ok(kernel) => assert_eq!(counts[0], kernel, "{func}+{:#x}", at - svma),
            Err(why) => eprintln!("kernel comparison skipped: {why}"),
        }
    }
}

/// Regression (issue 9, item 10): `p libc:_int_malloc` was "symbol not found" (Debian's libc
/// has no `.symtab`); with `libc6-dbg` installed the name comes from the debug file found by
/// build-id. `_int_malloc(arena, bytes)` sees each of the fixture's requests (all larger than
/// a tcache chunk), in order.
#[test]
fn p_libc_int_malloc_is_named_by_the_debug_file() {
    let _serial = libc_calls_lock();
    if libc_debug_file().is_none() {
        eprintln!("skipped: libc6-dbg for this libc is not installed (.ci/run installs it)");
        return;
    }
    let exe = libc_calls_fixture();
    let exe = exe.to_str().unwrap();
    let def = "p:im libc:_int_malloc bytes=%si:u64";
    let (out, text) = trace_with_debug_dir(None, &["-e", def], &[exe, "12"]);
    assert!(out.status.success(), "{out:?}\n{text}");
    assert!(
        list_line(&text, "_int_malloc+0x0").is_some_and(|l| l.contains(" libc.so.6")),
        "{text}"
    );
    let bytes: Vec<u64> = kprobe_lines(&text, "im")
        .iter()
        .map(|l| {
            assert!(l.starts_with("_int_malloc+0x0/0x"), "{l}");
            l.rsplit_once(" bytes=").unwrap().1.parse().unwrap()
        })
        .filter(|&b| (2000..2000 + 16 * 12).contains(&b))
        .collect();
    let asked: Vec<u64> = (0..12).map(|i| 2000 + 16 * i).collect();
    assert_eq!(bytes, asked, "{text}");
    // Without the debug file the name is unknown, as before: the kernel's error, before main.
    let (out, _) = trace_with_debug_dir(Some(""), &["-e", def], &[exe, "12"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("error: Invalid probed address or symbol"),
        "{err}"
    );
}

/// The implementation the dynamic linker picks for libc's `strlen` on this machine (the same
/// for every process here): its file offset in libc, found in this test process with
/// `dlsym` and `dladdr`.
fn strlen_impl_offset() -> u64 {
    // SAFETY: dlsym and dladdr only look up; `info` is written by dladdr.
    let (addr, base) = unsafe {
        let p = libc::dlsym(libc::RTLD_DEFAULT, c"strlen".as_ptr());
        assert!(!p.is_null());
        let mut info: libc::Dl_info = std::mem::zeroed();
        assert!(libc::dladdr(p, &mut info) != 0);
        let name = std::ffi::CStr::from_ptr(info.dli_fname).to_string_lossy();
        assert!(name.ends_with("libc.so.6"), "{name}");
        (p as u64, info.dli_fbase as u64)
    };
    // libc's first segment is at file address 0: its base is its load bias.
    libc_file_offset(addr - base)
}

/// Regression (issue 9, item 5): `p libc:strlen+2` (an offset into an indirect function in a
/// stripped libc) said `symbol "0x7f..." not found`. The offset now goes into the
/// implementation the loader picked, whose bounds come from its FDE (no debug file) or its
/// debug symbol (`__strlen_avx2` here); the hits are what a kernel uprobe at that
/// implementation's +2 counts.
#[test]
fn offset_into_an_indirect_function_probes_the_picked_implementation() {
    let _serial = libc_calls_lock();
    let exe = libc_calls_fixture();
    let exe = exe.to_str().unwrap();
    let def = "p:s libc:strlen+2";
    let mut counts = Vec::new();
    for debug_dir in [Some(""), None] {
        let (out, text) = trace_with_debug_dir(debug_dir, &["-e", def], &[exe, "30"]);
        assert!(out.status.success(), "{debug_dir:?}: {out:?}\n{text}");
        let listed = list_line(&text, "").unwrap_or_else(|| panic!("{text}"));
        let with_debug = debug_dir.is_none() && libc_debug_file().is_some();
        assert!(
            if with_debug {
                listed.contains("  k  __strlen_") && listed.contains("+0x2  libc.so.6")
            } else {
                listed.contains("  k  strlen+0x2  libc.so.6")
            },
            "{debug_dir:?}: {listed}"
        );
        let hits = kprobe_lines(&text, "s").len();
        // The fixture's 30 calls, and libc's own.
        assert!(hits >= 30, "{debug_dir:?}: {hits}\n{text}");
        counts.push(hits);
    }
    assert_eq!(counts[0], counts[1]);
    match kernel_hits(strlen_impl_offset() + 2, "30") {
        Ok(kernel) => assert_eq!(counts[0], kernel),
        Err(why) => eprintln!("kernel comparison skipped: {why}"),
    }
}

/// Regression (issue 9, item 5): an offset into a function whose size nothing gives (no
/// symbol size, no `.eh_frame` entry: `bare`, hand-written assembly; or an indirect function's
/// implementation in a stripped library without either) said `symbol "0x..." not found`; now
/// the error says that only +0 can be probed there, and +0 works.
#[test]
fn offset_into_a_function_of_unknown_size_is_a_clear_error() {
    let _serial = libc_calls_lock();
    let exe = libc_calls_fixture();
    let exe = exe.to_str().unwrap();
    let (out, _) = trace(&["-e", "p:b bare+3"], &[exe, "4"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("error: Invalid probed address or symbol")
            && err
                .contains("offset 0x3 into bare: only +0 can be probed there, its size is unknown"),
        "{err}"
    );
    let (out, text) = trace(&["-e", "p:b bare x=%di"], &[exe, "4"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.stdout, untraced(&[exe, "4"]).stdout);
    let xs: Vec<&str> = kprobe_lines(&text, "b")
        .iter()
        .map(|l| l.rsplit_once(" x=").unwrap().1)
        .collect();
    assert_eq!(xs, ["0x0", "0x1", "0x2", "0x3"], "{text}");
}

/// Regression (found by a user): `p f` on an overloaded C++ function said only "not unique: in
/// ov, ov". The error now lists each overload's full name and object, and one overload is a
/// probe target by that full name (as `c++filt` prints it). Built here with the system's g++.
#[test]
fn cxx_overloads_are_listed_and_named_by_signature() {
    let Some(exe) = common::build_at_test_time(
        "g++",
        "ov.cc",
        "#include <cstdio>\n\
         __attribute__((noinline)) int f(int x) { return x + 1; }\n\
         __attribute__((noinline)) double f(double x) { return x * 2; }\n\
         int main() { volatile int a = f(1); volatile double b = f(2.0); volatile double c = f(3.0);\n\
         std::printf(\"%d %g %g\\n\", a, b, c); }\n",
        &["-O1", "-pg", "-mfentry"],
    ) else {
        eprintln!("skipped: g++ cannot build the fixture");
        return;
    };
    let exe = exe.to_str().unwrap();
    let (out, _) = trace(&["-e", "p:any f"], &[exe]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("(the symbol \"f\" is not unique: f(int) in ov, f(double) in ov;"),
        "{err}"
    );
    let (out, text) = trace(&["-e", "p:fd f(double)", "-e", "p:fi _Z1fi"], &[exe]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "2 4 6\n");
    assert_eq!(kprobe_lines(&text, "fd").len(), 2, "{text}");
    assert_eq!(kprobe_lines(&text, "fi").len(), 1, "{text}");
}
