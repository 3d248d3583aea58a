//! A program that puts a kprobe on one of its own functions through ftrace.
//!
//! `cargo run -p ftprobe --example kprobe_self`
//!
//! `double_plus_one` carries the ftrace site that `rustc -Zpatchable-function-entry=5` would
//! emit (a 5-byte NOP at its entry, listed in `__patchable_function_entries`), written out in
//! a naked function so that this example builds with stable Rust.

use std::sync::atomic::{AtomicU64, Ordering};

use ftprobe::ftrace::{self, PtRegs};
use ftprobe::kprobes::{self, Kprobe, KprobeTarget};

/// `2x + 1`.
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub extern "C" fn double_plus_one(x: u64) -> u64 {
    core::arch::naked_asm!(
        "2:",
        // nopl 0x0(%rax,%rax,1): the site
        ".byte 0x0f, 0x1f, 0x44, 0x00, 0x00",
        "lea rax, [rdi + rdi + 1]",
        "ret",
        // R (SHF_GNU_RETAIN): kept by --gc-sections although nothing refers to it.
        ".pushsection __patchable_function_entries,\"awR\",@progbits",
        ".balign 8",
        ".quad 2b",
        ".popsection",
    )
}

static HITS: AtomicU64 = AtomicU64::new(0);
static LAST_ARG: AtomicU64 = AtomicU64::new(0);

/// Runs before `double_plus_one`'s first instruction, `regs.ip` = the site + 1 as after an
/// int3. Async-signal-safe: atomics only.
fn pre_handler(_p: &Kprobe, regs: &mut PtRegs) -> i32 {
    HITS.fetch_add(1, Ordering::Relaxed);
    LAST_ARG.store(regs.rdi, Ordering::Relaxed);
    0
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // SAFETY: first thing in main: this process has one thread.
    unsafe { ftrace::init() }?;
    let probe: &'static Kprobe = Box::leak(Box::new(Kprobe::new(
        KprobeTarget::Addr(double_plus_one as *const () as u64),
        Some(pre_handler),
        None,
    )));
    kprobes::register_kprobe(probe)?;
    print!("{}", kprobes::list());
    let results: Vec<u64> = (1..=3)
        .map(|x| double_plus_one(std::hint::black_box(x)))
        .collect();
    println!("double_plus_one(1..=3) = {results:?}");
    println!(
        "hits = {}, last $arg1 = {}",
        HITS.load(Ordering::Relaxed),
        LAST_ARG.load(Ordering::Relaxed)
    );
    kprobes::unregister_kprobe(probe)?;
    double_plus_one(10);
    let ok = results == [3, 5, 7]
        && HITS.load(Ordering::Relaxed) == 3
        && LAST_ARG.load(Ordering::Relaxed) == 3;
    if !ok {
        return Err("the probe did not see exactly the three calls".into());
    }
    println!(
        "after unregister_kprobe: hits = {}",
        HITS.load(Ordering::Relaxed)
    );
    Ok(())
}
