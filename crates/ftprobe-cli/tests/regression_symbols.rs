//! Regressions of issue 9 about finding functions and sites: a gcc nested function's site
//! after `push %r10`, and probes in stripped objects (Debian's libc) through `.eh_frame`
//! bounds and the separate debug file (`libc6-dbg`), checked against the fixtures' own counts
//! and, as root, against kernel uprobes on the same file offsets.

use std::path::Path;

mod common;
use common::{events, ftprobe, trace, untraced};

use ftprobe_dev::{fixture, Flavour};

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
            let f = img.funcs_named("foo_internal.0").next().expect("foo_internal.0");
            let seg = img
                .segments
                .iter()
                .find(|s| f.svma >= s.svma && f.svma - s.svma < s.filesz)
                .unwrap();
            let off = (f.svma - seg.svma + seg.offset) as usize;
            assert_eq!(&data[off..off + 2], [0x41, 0x52], "{}: push %r10", fl.name());
        }

        let list = ftprobe().args(["list", "functions", exe]).output().unwrap();
        let list = String::from_utf8_lossy(&list.stdout);
        let line = list
            .lines()
            .find(|l| l.starts_with("foo_internal.0 "))
            .unwrap_or_else(|| panic!("{}: foo_internal.0 not listed:\n{list}", fl.name()));
        let cols: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(
            (cols[1], cols[3]),
            (format!("foo_internal.0+{site:#x}").as_str(), place),
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
