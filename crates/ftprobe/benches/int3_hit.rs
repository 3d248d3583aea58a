//! ns per hit of int3 kprobes next to the ftrace-based kprobe, the bare floor (int3 + an empty
//! SIGTRAP handler + return), and the kernel's uprobes (root, via tracefs `uprobe_events`;
//! skipped with the reason where tracefs is not available).
//!
//! ftprobe rows: in this process, on `fx_add` (a site at +0, `lea rax,[rdi+rsi]` at +5), the
//! median of 7 runs of 20,000 calls minus the untraced median. Kernel rows: a kernel uprobe
//! cannot see this process (ftprobe's patching made its text pages private copies), so they
//! run the `calls-fentry-nop` fixture (`work`: NOP5 site at +0, `lea rax,[rdi+rdi*2]` at +9),
//! timed at two call counts; the slope is the per-call cost, minus the untraced slope.
//!
//! `cargo bench -p ftprobe --bench int3_hit`

use std::io::Write;
use std::time::Instant;

use ftprobe::ftrace::{self, PtRegs};
use ftprobe::kprobes::{self, Kprobe, KprobeTarget};

const N: i64 = 20_000;
const RUNS: usize = 7;

mod common;

fn loop_once() -> f64 {
    common::loop_fx_add(N)
}

fn median(run: impl FnMut() -> f64) -> (f64, f64, f64) {
    common::median_of(RUNS, run)
}

fn empty_pre(_p: &Kprobe, _r: &mut PtRegs) -> i32 {
    0
}
fn empty_post(_p: &Kprobe, _r: &mut PtRegs, _f: u64) {}

fn probe(offset: u64, post: bool) -> &'static Kprobe {
    let target = KprobeTarget::Symbol {
        module: None,
        name: "fx_add".into(),
        offset,
    };
    let p = Box::leak(Box::new(Kprobe::new(
        target,
        Some(empty_pre),
        post.then_some(empty_post as _),
    )));
    kprobes::register_kprobe(p).unwrap();
    p
}

extern "C" fn nothing(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {}

/// int3 + the kernel's signal delivery + an empty handler + sigreturn, in a loop.
fn bare_int3_floor() -> f64 {
    // SAFETY: a zeroed sigaction is valid; the handler does nothing and int3 resumes after
    // itself; the old action is put back below.
    unsafe {
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = nothing as *const () as usize;
        act.sa_flags = libc::SA_SIGINFO;
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGTRAP, &act, &mut old);
        let t = Instant::now();
        for _ in 0..N {
            std::arch::asm!("int3");
        }
        let ns = t.elapsed().as_nanos() as f64 / N as f64;
        libc::sigaction(libc::SIGTRAP, &old, std::ptr::null_mut());
        ns
    }
}

/// A kernel uprobe through tracefs, removed on drop.
struct KernelUprobe {
    enable: std::path::PathBuf,
}

impl KernelUprobe {
    fn new(
        exe: &std::path::Path,
        func: &str,
        name: &str,
        off: u64,
    ) -> Result<KernelUprobe, String> {
        let tracefs = std::path::Path::new("/sys/kernel/tracing");
        if !tracefs.join("uprobe_events").exists() {
            // SAFETY: plain mount(2) of tracefs at its usual place; fails harmlessly if not root.
            let r = unsafe {
                libc::mount(
                    c"nodev".as_ptr(),
                    c"/sys/kernel/tracing".as_ptr(),
                    c"tracefs".as_ptr(),
                    0,
                    std::ptr::null(),
                )
            };
            if r != 0 {
                return Err(format!(
                    "tracefs not available: {}",
                    std::io::Error::last_os_error()
                ));
            }
        }
        let data = std::fs::read(exe).map_err(|e| e.to_string())?;
        let img = ftprobe::elf::ElfImage::parse(exe, &data).map_err(|e| e.to_string())?;
        let f = img.funcs_named(func).next().ok_or("no such function")?;
        let file_off = file_offset(&data, f.svma + off).ok_or("no file offset")?;
        let def = format!("p:ftprobe_bench/{name} {}:{file_off:#x}\n", exe.display());
        std::fs::OpenOptions::new()
            .append(true)
            .open(tracefs.join("uprobe_events"))
            .and_then(|mut f| f.write_all(def.as_bytes()))
            .map_err(|e| format!("uprobe_events: {e}"))?;
        let enable = tracefs.join(format!("events/ftprobe_bench/{name}/enable"));
        std::fs::write(&enable, "1").map_err(|e| format!("enable: {e}"))?;
        Ok(KernelUprobe { enable })
    }
}

impl Drop for KernelUprobe {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.enable, "0");
        let name = self
            .enable
            .parent()
            .and_then(|p| p.file_name())
            .map(|n| n.to_string_lossy().into_owned());
        if let (Some(name), Ok(mut f)) = (
            name,
            std::fs::OpenOptions::new()
                .append(true)
                .open("/sys/kernel/tracing/uprobe_events"),
        ) {
            let _ = f.write_all(format!("-:ftprobe_bench/{name}\n").as_bytes());
        }
    }
}

/// ns per call of `work` in `calls N`: the median wall time at two N, 5 runs each; the slope
/// cancels process start-up.
fn slope(exe: &std::path::Path) -> f64 {
    let (n1, n2) = (20_000u64, 220_000u64);
    let time = |n: u64| {
        let mut v: Vec<f64> = (0..5)
            .map(|_| {
                let t = Instant::now();
                let out = std::process::Command::new(exe)
                    .arg(n.to_string())
                    .output()
                    .unwrap();
                assert!(out.status.success());
                t.elapsed().as_nanos() as f64
            })
            .collect();
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[2]
    };
    (time(n2) - time(n1)) / (n2 - n1) as f64
}

/// File offset of a file address, through the program headers.
fn file_offset(data: &[u8], svma: u64) -> Option<u64> {
    use object::read::elf::{FileHeader, ProgramHeader};
    let hdr = object::elf::FileHeader64::<object::Endianness>::parse(data).ok()?;
    let e = hdr.endian().ok()?;
    hdr.program_headers(e, data).ok()?.iter().find_map(|p| {
        let (va, sz, off) = (p.p_vaddr(e), p.p_filesz(e), p.p_offset(e));
        (p.p_type(e) == object::elf::PT_LOAD && svma >= va && svma < va + sz)
            .then(|| svma - va + off)
    })
}

fn main() {
    // SAFETY: first thing in main, single-threaded.
    unsafe { ftrace::init() }.expect("init");
    let base = median(loop_once);
    let mut rows: Vec<(String, (f64, f64, f64))> = vec![("untraced".into(), base)];

    let p = probe(0, false);
    rows.push((
        "ftrace kprobe on the site (fx_add+0), empty pre_handler".into(),
        median(loop_once),
    ));
    kprobes::unregister_kprobe(p).unwrap();
    let p = probe(5, false);
    rows.push((
        "int3 kprobe on fx_add+5 (lea), boosted".into(),
        median(loop_once),
    ));
    kprobes::unregister_kprobe(p).unwrap();
    let p = probe(5, true);
    rows.push((
        "int3 kprobe on fx_add+5, with a post_handler (2 traps)".into(),
        median(loop_once),
    ));
    kprobes::unregister_kprobe(p).unwrap();
    rows.push((
        "floor: int3 + empty SIGTRAP handler, no call".into(),
        median(bare_int3_floor),
    ));

    let mut skipped = Vec::new();
    let fixture = ftprobe_dev::fixture("calls", ftprobe_dev::Flavour::FentryNop).unwrap();
    let plain = slope(&fixture);
    rows.push(("fixture untraced (slope)".into(), (plain, plain, plain)));
    for (name, off, what) in [
        ("lea", 9, "kernel uprobe on work+9 (lea), fixture"),
        ("nop5", 0, "kernel uprobe on work+0 (NOP5 site), fixture"),
    ] {
        match KernelUprobe::new(&fixture, "work", name, off) {
            Ok(u) => {
                let ns = slope(&fixture) - plain;
                rows.push((what.into(), (ns, ns, ns)));
                drop(u);
            }
            Err(e) => skipped.push(format!("{what}: skipped: {e}")),
        }
    }

    println!(
        "{:<58} {:>10} {:>10} {:>19}",
        "int3_hit (ns per call)", "median", "per hit", "min-max"
    );
    for (name, (m, lo, hi)) in rows {
        // In-process rows: minus the untraced loop. Floor: its own loop. Fixture rows: slopes
        // (the kernel rows already minus the untraced slope).
        let per = if name.starts_with("floor") || name.contains("fixture") {
            m
        } else {
            m - base.0
        };
        println!("{name:<58} {m:>10.1} {per:>10.1} {lo:>9.1}-{hi:<9.1}");
    }
    for s in skipped {
        println!("{s}");
    }
    println!("({RUNS} runs of {N} calls; 'per hit' = median minus the untraced median; the floor row is its own loop)");
}
