//! Time to enable and disable the function tracer on every site of a generated shared object
//! of 100 000 functions (`-fpatchable-function-entry=5`, gcc -O1; `tests/scale`) while 8
//! threads walk through all of them: `register_ftrace_function` and
//! `unregister_ftrace_function` of a counting ops with no filter, 20 cycles, with the text
//! writes, membarrier calls and in-flight emulations of each, from `text_poke::stats`. Each
//! cycle also checks every site (a call while enabled, the canonical NOP after) and that the
//! callbacks counted the threads' own calls while enabled (the test `live_patch_scale` does
//! this with 12 000 sites).
//!
//! `cargo bench -p ftprobe --bench live_patch_scale` (`FTPROBE_SCALE_N` to change the size).
//! The object is compiled on the first run (about 1 ms of gcc per function) and kept in the
//! target's tmp dir.

#[path = "../tests/scale/mod.rs"]
mod scale;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ftprobe::arch::x86_64::nops::NOP5;
use ftprobe::arch::x86_64::text_poke::{self, PokeStats};
use ftprobe::ftrace::{self, FtraceOps, PtRegs};

const THREADS: usize = 8;
const CYCLES: usize = 20;

static HITS: AtomicU64 = AtomicU64::new(0);

unsafe extern "C" fn count(_ip: u64, _parent: u64, _op: &FtraceOps, _regs: &mut PtRegs) {
    HITS.fetch_add(1, Ordering::Relaxed);
}

static TRACER: FtraceOps = FtraceOps::new(count, 0);

fn diff(a: PokeStats, b: PokeStats) -> PokeStats {
    PokeStats {
        batches: b.batches - a.batches,
        sites: b.sites - a.sites,
        bytes: b.bytes - a.bytes,
        pages: b.pages - a.pages,
        sync_core: b.sync_core - a.sync_core,
        writes: b.writes - a.writes,
        fallbacks: b.fallbacks - a.fallbacks,
        emulated: b.emulated - a.emulated,
    }
}

/// CPU time of the calling thread, ms.
fn cpu_ms() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 * 1e3 + ts.tv_nsec as f64 / 1e6
}

/// Register then unregister the tracer: (wall ms, CPU ms) of each.
fn cycle_times() -> [(f64, f64); 2] {
    let (t, c) = (Instant::now(), cpu_ms());
    ftrace::register_ftrace_function(&TRACER).expect("register");
    let on = (t.elapsed().as_secs_f64() * 1e3, cpu_ms() - c);
    let (t, c) = (Instant::now(), cpu_ms());
    ftrace::unregister_ftrace_function(&TRACER).expect("unregister");
    [on, (t.elapsed().as_secs_f64() * 1e3, cpu_ms() - c)]
}

fn ms_stats(mut v: Vec<f64>) -> String {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    format!(
        "median {:.1} ms, min {:.1}, max {:.1}, mean {:.1}",
        v[v.len() / 2],
        v[0],
        v[v.len() - 1],
        mean
    )
}

fn main() {
    let n: usize = std::env::var("FTPROBE_SCALE_N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000);
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let (so, secs) = match scale::build(dir, n, scale::Flavour::Patchable) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("skipped: the fixture could not be built: {e}");
            return;
        }
    };
    if secs > 0.0 {
        println!("built {n} functions with gcc -O1 in {secs:.1} s");
    }
    let walk = scale::load(&so);
    let t = Instant::now();
    // SAFETY: single-threaded: the workers start after init.
    unsafe { ftrace::init() }.expect("ftrace::init");
    let init_ms = t.elapsed().as_secs_f64() * 1e3;
    let sites: Vec<u64> = ftrace::functions()
        .unwrap()
        .into_iter()
        .filter(|f| f.module == "libfxscale.so")
        .map(|f| f.ip)
        .collect();
    assert_eq!(sites.len(), n);
    println!("ftrace::init: {init_ms:.1} ms ({n} sites of the fixture)");

    let mut w = scale::Workers::start(THREADS, walk);
    let limit = Duration::from_secs(60);
    let (mut on, mut off) = (Vec::new(), Vec::new());
    let (mut on_cpu, mut off_cpu) = (Vec::new(), Vec::new());
    let (mut on_stats, mut off_stats) = (PokeStats::default(), PokeStats::default());
    let (mut emul_on, mut emul_off) = (0, 0);
    for cycle in 0..CYCLES {
        w.run_walks(THREADS as u64, limit);
        let (s0, t, c) = (text_poke::stats(), Instant::now(), cpu_ms());
        ftrace::register_ftrace_function(&TRACER).expect("register");
        on.push(t.elapsed().as_secs_f64() * 1e3);
        on_cpu.push(cpu_ms() - c);
        on_stats = diff(s0, text_poke::stats());
        emul_on += on_stats.emulated;
        let calls0 = w.stop();
        let hits0 = HITS.load(Ordering::Relaxed);
        assert!(sites.iter().all(|&ip| {
            // SAFETY: a site of the fixture: 5 readable bytes.
            (unsafe { std::ptr::read_volatile(ip as *const u8) }) == 0xe8
        }));
        w.resume();
        w.run_walks(THREADS as u64, limit);
        let calls1 = w.stop();
        assert_eq!(
            HITS.load(Ordering::Relaxed) - hits0,
            calls1 - calls0,
            "cycle {cycle}: callbacks = the threads' own calls"
        );
        w.resume();
        w.run_walks(1, limit);
        let (s0, t, c) = (text_poke::stats(), Instant::now(), cpu_ms());
        ftrace::unregister_ftrace_function(&TRACER).expect("unregister");
        off.push(t.elapsed().as_secs_f64() * 1e3);
        off_cpu.push(cpu_ms() - c);
        off_stats = diff(s0, text_poke::stats());
        emul_off += off_stats.emulated;
        w.stop();
        assert!(sites.iter().all(|&ip| {
            // SAFETY: as above.
            (unsafe { std::ptr::read_volatile(ip as *const [u8; 5]) }) == NOP5
        }));
        w.resume();
    }
    // The same with the threads stopped at their barrier: the cost of the calls themselves,
    // without 8 runnable threads sharing the CPUs with the caller.
    w.stop();
    let (mut idle_on, mut idle_off) = (Vec::new(), Vec::new());
    for _ in 0..CYCLES {
        let [a, b] = cycle_times();
        idle_on.push(a.0);
        idle_off.push(b.0);
    }
    w.resume();
    let calls = w.finish();
    println!("{n} sites, {THREADS} threads walking all of them, {CYCLES} cycles ({calls} calls):");
    println!("  enable  (register_ftrace_function):   {}", ms_stats(on));
    println!(
        "     its CPU time:                      {}",
        ms_stats(on_cpu)
    );
    println!("  disable (unregister_ftrace_function): {}", ms_stats(off));
    println!(
        "     its CPU time:                      {}",
        ms_stats(off_cpu)
    );
    println!("  threads stopped at a barrier instead:");
    println!(
        "  enable:                               {}",
        ms_stats(idle_on)
    );
    println!(
        "  disable:                              {}",
        ms_stats(idle_off)
    );
    for (name, s, e) in [
        ("enable", on_stats, emul_on),
        ("disable", off_stats, emul_off),
    ] {
        println!(
            "  {name}, each: {} batch, {} sites, {} bytes written on {} pages, {} membarrier \
             (SYNC_CORE), {} writes to /proc/self/mem ({} through an rwx window); hits of an int3 in flight emulated: {e} over the \
             {CYCLES} cycles",
            s.batches, s.sites, s.bytes, s.pages, s.sync_core, s.writes, s.fallbacks
        );
    }
}
