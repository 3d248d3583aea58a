//! `hit_api N`: the Rust program of `bench/peers.sh`'s in-process rows. Arms one ftprobe
//! mechanism on `fx_add` (a C function with a `-fpatchable-function-entry=5` site at +0 and
//! `lea rax,[rdi+rsi]` at +5, from ftprobe-dev's libfxsites) through the library API, then
//! calls `fx_add` N times, like `bench/hit.c` calls `target`, and writes the loop's own time in
//! ns to `$HIT_TIME_FILE` (the harness's "in program" column).
//!
//! The mechanism comes from `$HIT_MODE`:
//! - unset or `none`: nothing armed (the untraced base of every row here);
//! - `ftrace-ops`: an `ftrace_ops` with an empty callback, filtered to `fx_add`;
//! - `kprobe-site`: a kprobe at `fx_add+0` (on the ftrace site), counting `pre_handler`: the
//!   site calls a per-site trampoline that carries the probe;
//! - `kprobe-site-shared`: the same through the shared kprobes `ftrace_ops` and its lookup by
//!   address (`kprobes::set_per_site_trampolines(false)`), as a site with several probes;
//! - `int3`: a kprobe at `fx_add+5` (int3, boosted: one trap), counting `pre_handler`, with
//!   jump optimization off (`kprobes::set_optimization(false)`);
//! - `optprobe`: the same probe jump-optimized (`[OPTIMIZED]`: a `jmp` to a detour, no trap);
//!   fails unless it was optimized;
//! - `int3-post`: the same with an empty `post_handler` (single-stepped out of line: two traps).
//!
//! Every mode counts its hits and the program fails unless the count is N: a row cannot time
//! a probe that did not fire.
//!
//! `cargo run --release -p ftprobe --example hit_api -- 1000000` (with `HIT_MODE=...`)

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

use ftprobe::ftrace::{self, FtraceOps, PtRegs};
use ftprobe::kprobes::{self, Kprobe, KprobeTarget};
use ftprobe_dev::fxsites::fx_add;

static HITS: AtomicU64 = AtomicU64::new(0);

/// `hits++` as the peers' counting handlers do it (XRay's, Frida's): the loop is
/// single-threaded, so a plain load and store, not a locked add (~10 ns more here).
#[inline(always)]
fn count_hit() {
    HITS.store(HITS.load(Relaxed) + 1, Relaxed);
}

unsafe extern "C" fn count_call(_ip: u64, _parent: u64, _op: &FtraceOps, _r: &mut PtRegs) {
    count_hit();
}
static COUNT_OPS: FtraceOps = FtraceOps::new(count_call, 0);

fn count_pre(_p: &Kprobe, _r: &mut PtRegs) -> i32 {
    count_hit();
    0
}
fn count_post(_p: &Kprobe, _r: &mut PtRegs, _flags: u64) {}

fn kprobe_at(offset: u64, post: bool) -> Result<(), String> {
    let kp: &'static Kprobe = Box::leak(Box::new(Kprobe::new(
        KprobeTarget::Symbol {
            module: None,
            name: "fx_add".into(),
            offset,
        },
        Some(count_pre),
        post.then_some(count_post as _),
    )));
    kprobes::register_kprobe(kp).map_err(|e| format!("register_kprobe(fx_add+{offset}): {e}"))
}

fn arm(mode: &str) -> Result<(), String> {
    match mode {
        "none" => Ok(()),
        "ftrace-ops" => {
            ftrace::ftrace_set_filter(&COUNT_OPS, "fx_add", true).map_err(|e| e.to_string())?;
            ftrace::register_ftrace_function(&COUNT_OPS).map_err(|e| e.to_string())
        }
        "kprobe-site" => kprobe_at(0, false),
        "kprobe-site-shared" => {
            kprobes::set_per_site_trampolines(false).map_err(|e| e.to_string())?;
            kprobe_at(0, false)
        }
        "int3" => {
            kprobes::set_optimization(false).map_err(|e| e.to_string())?;
            kprobe_at(5, false)
        }
        "optprobe" => {
            kprobes::set_optimization(true).map_err(|e| e.to_string())?;
            kprobe_at(5, false)?;
            let list = kprobes::list();
            if !list.contains("[OPTIMIZED]") {
                return Err(format!("fx_add+5 not optimized:\n{list}"));
            }
            Ok(())
        }
        "int3-post" => kprobe_at(5, true),
        m => Err(format!(
            "unknown HIT_MODE {m:?} (none, ftrace-ops, kprobe-site, kprobe-site-shared, int3, \
             optprobe, int3-post)"
        )),
    }
}

fn main() {
    let n: i64 = match std::env::args().nth(1).map(|a| a.parse()) {
        Some(Ok(n)) if n >= 0 => n,
        _ => {
            eprintln!("usage: [HIT_MODE=MODE] hit_api N");
            std::process::exit(2);
        }
    };
    let mode = std::env::var("HIT_MODE").unwrap_or_else(|_| "none".into());
    if mode != "none" {
        // SAFETY: called once, from main, before any other thread exists.
        if let Err(e) = unsafe { ftrace::init() } {
            eprintln!("hit_api: ftrace::init: {e}");
            std::process::exit(1);
        }
    }
    if let Err(e) = arm(&mode) {
        eprintln!("hit_api: {e}");
        std::process::exit(1);
    }
    let t = Instant::now();
    let mut acc = 0;
    for i in 0..n {
        // SAFETY: a plain C function of two integers.
        acc += unsafe { fx_add(black_box(i), 1) };
    }
    let ns = t.elapsed().as_nanos();
    black_box(acc);
    let hits = HITS.load(Relaxed);
    if mode != "none" && hits != n as u64 {
        eprintln!("hit_api: {mode}: {hits} hits for {n} calls");
        std::process::exit(1);
    }
    if let Ok(path) = std::env::var("HIT_TIME_FILE") {
        if let Err(e) = std::fs::write(&path, format!("{ns}\n")) {
            eprintln!("hit_api: writing {path}: {e}");
            std::process::exit(1);
        }
    }
}
