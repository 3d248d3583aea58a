//! ftprobe's counts against the kernel's uprobes on the same addresses (root and tracefs;
//! skipped otherwise). In a test binary of their own: while a kernel uprobe is armed, its
//! int3 is in every process's copy of the page, and ftprobe refuses to probe over it.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Mutex;

use common::kernel_uprobes::{count_hits, file_offset_of, tracefs, KernelUprobes};

/// One kernel uprobe session at a time.
static TRACEFS: Mutex<()> = Mutex::new(());

const LIBC: &str = "/lib/x86_64-linux-gnu/libc.so.6";

/// The hits of kprobe_profile's line for `event`.
fn profile_hits(text: &str, event: &str) -> u64 {
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("#   {event} ")))
        .unwrap_or_else(|| panic!("no profile line for {event}: {text}"));
    line.split_whitespace().nth(2).unwrap().parse().unwrap()
}

/// Issue 9, item 2: `ls`'s calls of `malloc` and `free` made in libselinux's constructor
/// and at exit were not counted; the kernel counted them.
#[test]
fn libc_malloc_in_ls_counts_what_a_kernel_uprobe_counts() {
    let _one = TRACEFS.lock().unwrap_or_else(|e| e.into_inner());
    if let Err(why) = tracefs() {
        eprintln!("skipped: {why}");
        return;
    }
    let libc = Path::new(LIBC);
    let (Some(malloc), Some(free)) = (file_offset_of(libc, "malloc"), file_offset_of(libc, "free"))
    else {
        eprintln!("skipped: no {LIBC} with malloc and free");
        return;
    };
    let dir = std::env::temp_dir();
    let kernel = count_hits(
        &[(libc, malloc), (libc, free)],
        Command::new("ls")
            .arg("/")
            .current_dir(&dir)
            .stdout(std::process::Stdio::null()),
    )
    .expect("tracefs");
    assert!(kernel[0] > 0 && kernel[1] > 0, "{kernel:?}");
    let out_file = dir.join(format!("ftprobe-ls-{}.txt", std::process::id()));
    let out = common::ftprobe()
        .current_dir(&dir)
        .args([
            "trace",
            "-e",
            "p:m libc:malloc",
            "-e",
            "p:f libc:free",
            "-o",
        ])
        .arg(&out_file)
        .args(["--", "ls", "/"])
        .stdout(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = std::fs::read_to_string(&out_file).unwrap();
    let _ = std::fs::remove_file(&out_file);
    let ours = [profile_hits(&text, "m"), profile_hits(&text, "f")];
    assert_eq!(
        ours.to_vec(),
        kernel,
        "ftprobe (malloc, free) vs the kernel's uprobes"
    );
}

/// Regression (issue 9, item 4: the kernel's output): a number, char, bitfield or array that
/// could not be read printed `(fault)`; this kernel prints the zero its record holds (only a
/// string prints `(fault)`). The same fetch args through a kernel uprobe on the `fetchargs`
/// fixture's `take` print the same values on each of its four calls (two with a NULL and a
/// wild pointer). Not a nested dereference that faults: the kernel leaves that field as its
/// per-CPU buffer held it (the previous event's value), where ftprobe prints 0.
#[test]
fn faulting_numbers_print_zero_as_the_kernel() {
    let _one = TRACEFS.lock().unwrap_or_else(|e| e.into_inner());
    let args = "id=+0(%di):u32 neg=+4(%di):s32 c=+24(%di):char[2] bf=+0(%di):b3@2/32 \
                v=+40(%di):s64[2] n=+24(%di):string";
    let exe = ftprobe_dev::fixture("fetchargs", ftprobe_dev::Flavour::FentryNop).unwrap();
    let (out, text) = common::trace(
        &["-e", &format!("p:z take {args}")],
        &[exe.to_str().unwrap()],
    );
    assert!(out.status.success(), "{out:?}");
    let ours: Vec<String> = common::events(&text)
        .filter(|l| l.contains(" z: ("))
        .map(|l| l.split_once(") ").unwrap().1.to_owned())
        .collect();
    assert_eq!(ours.len(), 4, "{text}");
    assert_eq!(ours[2], "id=0 neg=0 c={'\0','\0'} bf=0 v={0,0} n=(fault)");
    assert_eq!(ours[2], ours[3], "a NULL and a wild pointer read alike");
    let offset = file_offset_of(&exe, "take").unwrap();
    let probes = match KernelUprobes::with_args(&[(&exe, offset, args)]) {
        Ok(p) => p,
        Err(why) => {
            eprintln!("skipped the comparison with the kernel: {why}");
            return;
        }
    };
    let mut child = Command::new(&exe)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    assert!(child.wait().unwrap().success());
    let tag = format!("-{} ", child.id());
    let kernel: Vec<String> = probes
        .trace()
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains(" p0: (") && l.contains(&tag))
        .map(|l| l.split_once(") ").unwrap().1.to_owned())
        .collect();
    assert_eq!(kernel, ours, "ftprobe's values against the kernel's uprobe");
}

/// Found by a user: a string or `char` with bytes of 0x80 and above was printed as Unicode
/// (`'È'`, `"x\u{fffd}"`), where the kernel prints the program's bytes as they are. The
/// program is built here; the kernel comparison needs root.
#[test]
fn strings_and_chars_print_their_bytes_as_the_kernel() {
    let _one = TRACEFS.lock().unwrap_or_else(|e| e.into_inner());
    let Some(exe) = common::build_at_test_time(
        "cc",
        "bytes.c",
        "struct S { unsigned char a; } gs = {200};\n\
         __attribute__((noinline)) int probe_me(struct S *s, const char *str)\n\
         { __asm__ volatile(\"\"); return 0; }\n\
         int main(void) { probe_me(&gs, \"x\\xff\"); return 0; }\n",
        &["-O1", "-fno-pie", "-no-pie"],
    ) else {
        eprintln!("skipped: cc cannot build the program");
        return;
    };
    let args = "ch=+0(%di):char str=+0(%si):string";
    let out_file = exe.with_extension("trace");
    let out = common::ftprobe()
        .args(["trace", "-e", &format!("p:pm probe_me {args}"), "-o"])
        .arg(&out_file)
        .arg("--")
        .arg(&exe)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = std::fs::read(&out_file).unwrap();
    let line = text
        .split(|&b| b == b'\n')
        .find(|l| l.windows(5).any(|w| w == b" pm: "))
        .expect("the event line");
    let ours = line.splitn(2, |&b| b == b')').nth(1).unwrap().to_vec();
    assert_eq!(
        ours,
        b" ch='\xc8' str=\"x\xff\"".to_vec(),
        "{}",
        String::from_utf8_lossy(line)
    );
    let offset = file_offset_of(&exe, "probe_me").or_else(|| {
        // Not a dynamic symbol: from the symbol table.
        use object::{Object, ObjectSegment, ObjectSymbol};
        let data = std::fs::read(&exe).ok()?;
        let file = object::File::parse(&*data).ok()?;
        let a = file
            .symbols()
            .find(|s| s.name() == Ok("probe_me"))?
            .address();
        let seg = file
            .segments()
            .find(|s| a >= s.address() && a < s.address() + s.size())?;
        Some(a - seg.address() + seg.file_range().0)
    });
    let probes = match KernelUprobes::with_args(&[(&exe, offset.unwrap(), args)]) {
        Ok(p) => p,
        Err(why) => {
            eprintln!("skipped the comparison with the kernel: {why}");
            return;
        }
    };
    let mut child = Command::new(&exe).spawn().unwrap();
    assert!(child.wait().unwrap().success());
    let trace = std::fs::read(probes.trace_path()).unwrap();
    let tag = format!("-{} ", child.id());
    let kernel = trace
        .split(|&b| b == b'\n')
        .find(|l| {
            l.windows(tag.len()).any(|w| w == tag.as_bytes()) && l.windows(5).any(|w| w == b" p0: ")
        })
        .expect("the kernel's event line");
    let kernel = kernel.splitn(2, |&b| b == b')').nth(1).unwrap().to_vec();
    assert_eq!(ours, kernel, "ftprobe's bytes against the kernel's");
}

/// Return events: `$retval` of a function's returns, in order, as the kernel's uretprobe on
/// the same function records them (an int returned negative, a long, a pointer into the
/// program's data: the program is not PIE, so addresses are the same in both runs).
#[test]
fn return_values_equal_the_kernels_uretprobe() {
    let _one = TRACEFS.lock().unwrap_or_else(|e| e.into_inner());
    let src = r#"
#include <stdio.h>
__attribute__((noinline)) int neg(int x) { return -x; }
__attribute__((noinline)) long twice(long x) { return 2 * x; }
static const char *names[] = {"a", "bb", "ccc"};
__attribute__((noinline)) const char *name(int i) { return names[i % 3]; }
int main(void)
{
    long s = 0;
    for (int i = 0; i < 5; i++)
        s += neg(i * 7) + twice(i - 2) + (long)name(i)[0];
    printf("%ld\n", s);
    return 0;
}
"#;
    let Some(exe) = common::build_at_test_time(
        "gcc",
        "uretvals.c",
        src,
        &["-O1", "-fno-pie", "-no-pie", "-fpatchable-function-entry=5"],
    ) else {
        panic!("gcc failed");
    };
    let e = exe.to_str().unwrap();
    let funcs = [
        ("neg", "r=$retval:s32"),
        ("twice", "r=$retval:s64"),
        ("name", "r=$retval s=+0($retval):string"),
    ];
    let defs: Vec<String> = funcs
        .iter()
        .enumerate()
        .map(|(i, (f, a))| format!("r:p{i} {f} {a}"))
        .collect();
    let mut args = Vec::new();
    for d in &defs {
        args.push("-e");
        args.push(d.as_str());
    }
    let (out, text) = common::trace(&args, &[e]);
    assert!(out.status.success(), "{out:?}");
    let values = |text: &str, i: usize, tag: &str| -> Vec<String> {
        common::events(text)
            .filter(|l| l.contains(&format!(" p{i}: (")) && l.contains(tag))
            .map(|l| l.split_once(") ").unwrap().1.to_owned())
            .collect()
    };
    let places: Vec<(&Path, u64, &str)> = funcs
        .iter()
        .map(|(f, a)| (exe.as_path(), file_offset_of(&exe, f).unwrap(), *a))
        .collect();
    let probes = match KernelUprobes::returns(&places) {
        Ok(p) => p,
        Err(why) => {
            eprintln!("skipped the comparison with the kernel: {why}");
            return;
        }
    };
    let mut child = Command::new(&exe)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    assert!(child.wait().unwrap().success());
    let kernel = probes.trace();
    let tag = format!("-{} ", child.id());
    for i in 0..funcs.len() {
        let ours = values(&text, i, "");
        assert_eq!(ours.len(), 5, "{text}");
        assert_eq!(
            values(&kernel, i, &tag),
            ours,
            "p{i}: ftprobe against the kernel's uretprobe"
        );
    }
}
