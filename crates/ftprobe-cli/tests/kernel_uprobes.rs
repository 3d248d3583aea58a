//! ftprobe's counts against the kernel's uprobes on the same addresses (root and tracefs;
//! skipped otherwise). In a test binary of their own: while a kernel uprobe is armed, its
//! int3 is in every process's copy of the page, and ftprobe refuses to probe over it.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Mutex;

use common::kernel_uprobes::{count_hits, file_offset_of, tracefs};

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
