//! Live patching at scale (issue 13): the function tracer enabled and disabled on every site
//! of a generated shared object while 8 threads run through all of its functions.
//!
//! The object (`tests/scale`) has 10 000 functions built with `-fpatchable-function-entry=5`
//! and 2 000 built with `-pg -mfentry -mrecord-mcount` (one object each, both loaded, so the
//! same batches patch both kinds of site). 20 cycles: register the ops while the threads run;
//! stop them between two walks; every site is a call; let them walk again and stop them:
//! the callback counted exactly the calls the threads counted themselves; unregister while
//! they run; stop: every site is the canonical NOP; let them walk: no callback. No thread
//! may crash meanwhile (one that hit a half-written site would). The 100 000-function
//! timing is `benches/live_patch_scale.rs`.
//!
//! `harness = false`: `ftrace::init` needs a single thread.

mod scale;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ftprobe::arch::x86_64::nops::NOP5;
use ftprobe::arch::x86_64::text_poke;
use ftprobe::ftrace::{self, FtraceOps, PtRegs};

const THREADS: usize = 8;
const CYCLES: usize = 20;
const N_PATCHABLE: usize = 10_000;
const N_FENTRY: usize = 2_000;

/// The fixture's sites: [lo, hi] of their addresses (the callback counts hits in it only).
static LO: AtomicU64 = AtomicU64::new(u64::MAX);
static HI: AtomicU64 = AtomicU64::new(0);
static HITS: AtomicU64 = AtomicU64::new(0);

unsafe extern "C" fn count(ip: u64, _parent: u64, _op: &FtraceOps, _regs: &mut PtRegs) {
    if (LO.load(Ordering::Relaxed)..=HI.load(Ordering::Relaxed)).contains(&ip) {
        HITS.fetch_add(1, Ordering::Relaxed);
    }
}

static TRACER: FtraceOps = FtraceOps::new(count, 0);

fn site_bytes(ip: u64) -> [u8; 5] {
    // SAFETY: a site of the loaded fixture: 5 readable bytes of code.
    unsafe { std::ptr::read_volatile(ip as *const [u8; 5]) }
}

fn main() {
    // Quick tier only: this binary has no stress case (ftprobe_dev::tier).
    if !ftprobe_dev::tier::quick_tier_requested() {
        return;
    }
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let mut walks = Vec::new();
    let mut sos = Vec::new();
    for (n, flavour) in [
        (N_PATCHABLE, scale::Flavour::Patchable),
        (N_FENTRY, scale::Flavour::Fentry),
    ] {
        match scale::build(dir, n, flavour) {
            Ok((so, secs)) => {
                if secs > 0.0 {
                    eprintln!("built {n} functions ({flavour:?}) in {secs:.1} s");
                }
                walks.push((n as u64, scale::load(&so)));
                sos.push(so);
            }
            Err(e) => {
                eprintln!("skipped: the {flavour:?} fixture could not be built: {e}");
                return;
            }
        }
    }
    // SAFETY: single-threaded: the workers start after init.
    let skipped = unsafe { ftrace::init() }.expect("ftrace::init");
    assert!(skipped.is_empty(), "{skipped:?}");
    let sites: Vec<u64> = ftrace::functions()
        .unwrap()
        .into_iter()
        .filter(|f| f.module == "libfxscale.so")
        .map(|f| f.ip)
        .collect();
    let per_call: u64 = walks.iter().map(|w| w.0).sum();
    assert_eq!(
        sites.len() as u64,
        per_call,
        "one site per generated function"
    );
    LO.store(sites[0], Ordering::Relaxed);
    HI.store(*sites.last().unwrap(), Ordering::Relaxed);
    // Both objects in one walk: a thread runs the patchable tree, then the fentry tree.
    static ROOTS: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];
    ROOTS[0].store(walks[0].1 as usize as u64, Ordering::Relaxed);
    ROOTS[1].store(walks[1].1 as usize as u64, Ordering::Relaxed);
    unsafe extern "C" fn both(c: *mut u64) {
        for r in &ROOTS {
            // SAFETY: a generated root, `void fx_f0(unsigned long *)`.
            unsafe { std::mem::transmute::<u64, scale::Walk>(r.load(Ordering::Relaxed))(c) };
        }
    }
    for &ip in &sites {
        assert_eq!(site_bytes(ip), NOP5, "{ip:#x} after init");
    }

    let mut w = scale::Workers::start(THREADS, both);
    let limit = Duration::from_secs(30);
    let start = text_poke::stats();
    for cycle in 0..CYCLES {
        w.run_walks(THREADS as u64, limit);
        ftrace::register_ftrace_function(&TRACER).expect("register");
        let calls0 = w.stop();
        let hits0 = HITS.load(Ordering::Relaxed);
        for &ip in &sites {
            assert_eq!(site_bytes(ip)[0], 0xe8, "cycle {cycle}: {ip:#x} is a call");
        }
        w.resume();
        w.run_walks(2 * THREADS as u64, limit);
        let calls1 = w.stop();
        let hits1 = HITS.load(Ordering::Relaxed);
        assert!(calls1 > calls0, "cycle {cycle}: the threads walked");
        assert_eq!(
            hits1 - hits0,
            calls1 - calls0,
            "cycle {cycle}: callbacks while enabled = the threads' own calls"
        );
        w.resume();
        ftrace::unregister_ftrace_function(&TRACER).expect("unregister");
        let calls2 = w.stop();
        let hits2 = HITS.load(Ordering::Relaxed);
        for &ip in &sites {
            assert_eq!(
                site_bytes(ip),
                NOP5,
                "cycle {cycle}: {ip:#x} is the NOP again"
            );
        }
        w.resume();
        w.run_walks(THREADS as u64, limit);
        let calls3 = w.stop();
        assert!(calls3 > calls2, "cycle {cycle}: the threads walked");
        assert_eq!(
            HITS.load(Ordering::Relaxed),
            hits2,
            "cycle {cycle}: no callback while disabled"
        );
        w.resume();
    }
    let total = w.finish();
    let s = text_poke::stats();
    for &ip in &sites {
        assert_eq!(site_bytes(ip), NOP5, "{ip:#x} after the last disable");
    }
    let batches = s.batches - start.batches;
    assert_eq!(
        batches,
        2 * CYCLES as u64,
        "one batch per register/unregister"
    );
    assert_eq!(s.sites - start.sites, 2 * CYCLES as u64 * per_call);
    assert_eq!(
        s.sync_core - start.sync_core,
        3 * batches,
        "3 membarriers a batch"
    );
    assert_eq!(s.fallbacks, start.fallbacks, "no rwx window while patching");
    // Each batch's three phases write each run of nearby sites at once: far fewer writes
    // than sites (12 000 sites on a few dozen pages).
    assert!(
        s.writes - start.writes <= 3 * batches * 200,
        "{} writes for {batches} batches",
        s.writes - start.writes
    );
    let page = ftprobe::sys::page_size() as u64;
    let mut pages: Vec<u64> = sites
        .iter()
        .flat_map(|ip| [ip / page, (ip + 4) / page])
        .collect();
    pages.dedup();
    assert_eq!(
        s.pages - start.pages,
        2 * CYCLES as u64 * pages.len() as u64,
        "each batch writes on the pages of the sites, each once"
    );
    println!(
        "live_patch_scale: {} sites ({N_PATCHABLE} patchable + {N_FENTRY} fentry), {THREADS} \
         threads, {CYCLES} cycles: {total} calls, {} hits, {} sites emulated in flight: ok",
        per_call,
        HITS.load(Ordering::Relaxed),
        s.emulated - start.emulated
    );
}
