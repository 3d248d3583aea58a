//! Per-site trampolines for kprobes on ftrace sites: a site whose only user is one enabled
//! kprobe calls a trampoline of its own (the record's `FTRACE_FL_TRAMP`, and a call target no
//! other site shares); a second probe, another `ftrace_ops` (a counting one, or the function
//! tracer, its records counted) or disabling the probe moves the site to the shared path or
//! to its NOP, and undoing it returns to the same per-site trampoline. Every hit counts exactly, checked
//! against the calling threads' own counters: per phase with the threads stopped between
//! phases, and across hundreds of live switches while threads call the function throughout.
//! The existing kprobes tests (one probe per site) run through the per-site path too.
//! `harness = false`: ftrace::init needs a single thread.

use std::cell::Cell;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use ftprobe::ftrace::{self, FtraceOps, PtRegs, FTRACE_FL_ENABLED, FTRACE_FL_TRAMP};
use ftprobe::function_tracer::{self, FUNCTION_OPS};
use ftprobe::kprobes::{self, Kprobe, KprobeTarget};
use ftprobe::ring::{RingConfig, SharedRings};
use ftprobe::trace::{self, rtype};
use ftprobe_dev::fxsites::{fx_add, fx_mul};

const THREADS: usize = 4;

fn leak(p: Kprobe) -> &'static Kprobe {
    Box::leak(Box::new(p))
}

fn probe(name: &str, post: bool) -> &'static Kprobe {
    leak(Kprobe::new(
        KprobeTarget::Symbol {
            module: None,
            name: name.to_owned(),
            offset: 0,
        },
        Some(count_pre),
        post.then_some(count_post as _),
    ))
}

/// Counts in `data`: pre_handler hits in the low 32 bits, post_handler hits above.
fn count_pre(p: &Kprobe, regs: &mut PtRegs) -> i32 {
    assert_eq!(regs.ip, p.addr() + 1, "pre_handler: regs.ip = addr + 1");
    p.data.fetch_add(1, Ordering::Relaxed);
    0
}
fn count_post(p: &Kprobe, regs: &mut PtRegs, _flags: u64) {
    assert_eq!(regs.ip, p.addr() + 5, "post_handler: regs.ip = addr + 5");
    p.data.fetch_add(1 << 32, Ordering::Relaxed);
}
fn pre_hits(p: &Kprobe) -> u64 {
    p.data.load(Ordering::Relaxed) & 0xffff_ffff
}
fn post_hits(p: &Kprobe) -> u64 {
    p.data.load(Ordering::Relaxed) >> 32
}

static OPS_HITS: AtomicU64 = AtomicU64::new(0);
unsafe extern "C" fn count_ops(_ip: u64, _parent: u64, _op: &FtraceOps, _r: &mut PtRegs) {
    OPS_HITS.fetch_add(1, Ordering::Relaxed);
}
static COUNT_OPS: FtraceOps = FtraceOps::new(count_ops, 0);

/// (per-site trampoline?, call target) of the site at `ip`.
fn site(ip: u64) -> (bool, Option<u64>) {
    let r = ftrace::record(ip).expect("a site");
    (r.flags & FTRACE_FL_TRAMP != 0, ftrace::site_call_target(ip))
}

/// THREADS threads call fx_mul `calls` times each; returns the calls made (their own counts).
fn run_threads(calls: u64) -> u64 {
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            std::thread::spawn(move || {
                let mut n = 0u64;
                for i in 0..calls as i64 {
                    // SAFETY: a plain C function of two integers.
                    assert_eq!(unsafe { fx_mul(i, t as i64 + 1) }, i * (t as i64 + 1));
                    n += 1;
                }
                n
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).sum()
}

fn phases(reader: &SharedRings) {
    let p1 = probe("fx_mul", false);
    kprobes::register_kprobe(p1).unwrap();
    let ip = p1.addr();
    let (tramp, t1) = site(ip);
    assert!(tramp, "one probe: per-site trampoline");
    let t1 = t1.expect("the site calls a trampoline");
    // Another site's single probe gets a trampoline of its own.
    let other = probe("fx_add", false);
    kprobes::register_kprobe(other).unwrap();
    let (tramp_other, t_other) = site(other.addr());
    assert!(tramp_other);
    assert_ne!(t_other, Some(t1), "each site its own trampoline");
    // SAFETY: a plain C function.
    assert_eq!(unsafe { fx_add(2, 3) }, 5);
    assert_eq!(pre_hits(other), 1);
    kprobes::unregister_kprobe(other).unwrap();

    // Expected hits of p1, of the second probe, of the counting ops.
    let (e1, e2, eops) = (Cell::new(0u64), Cell::new(0u64), Cell::new(0u64));
    let check = |what: &str, p2: Option<&Kprobe>, ops: bool| {
        let n = run_threads(5_000);
        e1.set(e1.get() + n);
        if p2.is_some() {
            e2.set(e2.get() + n);
        }
        if ops {
            eops.set(eops.get() + n);
        }
        assert_eq!(pre_hits(p1), e1.get(), "{what}: p1");
        if let Some(p2) = p2 {
            assert_eq!(pre_hits(p2), e2.get(), "{what}: p2");
        }
        assert_eq!(OPS_HITS.load(Ordering::Relaxed), eops.get(), "{what}: ops");
    };
    check("p1 alone", None, false);

    // A second probe: the shared path (lookup by address), both counted.
    let p2 = probe("fx_mul", false);
    kprobes::register_kprobe(p2).unwrap();
    let (tramp, t) = site(ip);
    assert!(
        !tramp && t.is_some() && t != Some(t1),
        "two probes: shared path"
    );
    check("p1 + p2", Some(p2), false);
    // p2 disabled: p1 alone is enabled again, back on its own trampoline.
    kprobes::disable_kprobe(p2).unwrap();
    assert_eq!(site(ip), (true, Some(t1)), "p2 disabled: per-site again");
    check("p1, p2 disabled", None, false);
    kprobes::enable_kprobe(p2).unwrap();
    assert!(!site(ip).0);
    check("p1 + p2 enabled again", Some(p2), false);
    kprobes::unregister_kprobe(p2).unwrap();
    assert_eq!(
        site(ip),
        (true, Some(t1)),
        "p2 removed: the same per-site trampoline"
    );
    check("p1 alone again", None, false);

    // Another ftrace_ops on the site: the list function, both counted.
    ftrace::ftrace_set_filter(&COUNT_OPS, "fx_mul", true).unwrap();
    ftrace::register_ftrace_function(&COUNT_OPS).unwrap();
    let (tramp, t) = site(ip);
    assert!(!tramp && t != Some(t1), "probe + ops: shared path");
    check("p1 + ops", None, true);
    ftrace::unregister_ftrace_function(&COUNT_OPS).unwrap();
    assert_eq!(site(ip), (true, Some(t1)), "ops removed: per-site again");
    check("p1 after ops", None, false);

    // The function tracer, recording into the rings: one record per call, and p1's hits.
    function_tracer::start(None, &["fx_mul".to_owned()], &[]).unwrap();
    assert!(!site(ip).0, "probe + function tracer: shared path");
    let n = run_threads(5_000);
    e1.set(e1.get() + n);
    assert_eq!(pre_hits(p1), e1.get(), "p1 + function tracer: p1");
    let mut funcs = 0u64;
    for r in 0..reader.claimed() {
        reader.reader(r).unwrap().drain(|t, _| {
            if t == rtype::FUNC {
                funcs += 1;
            }
        });
    }
    assert_eq!(funcs, n, "p1 + function tracer: the tracer's records");
    ftrace::unregister_ftrace_function(&FUNCTION_OPS).unwrap();
    assert_eq!(site(ip), (true, Some(t1)));

    // p1 disabled: the site is a NOP; enabled: the same trampoline.
    kprobes::disable_kprobe(p1).unwrap();
    assert_eq!(site(ip), (false, None));
    let n = run_threads(1_000);
    assert!(n > 0);
    assert_eq!(pre_hits(p1), e1.get(), "disabled: no hit");
    kprobes::enable_kprobe(p1).unwrap();
    assert_eq!(site(ip), (true, Some(t1)));
    check("p1 enabled again", None, false);

    // Per-site trampolines turned off and on: the shared path, then the same trampoline.
    kprobes::set_per_site_trampolines(false).unwrap();
    assert!(!site(ip).0);
    check("per-site off", None, false);
    kprobes::set_per_site_trampolines(true).unwrap();
    assert_eq!(site(ip), (true, Some(t1)));
    assert_eq!(p1.nmissed(), 0);
    kprobes::unregister_kprobe(p1).unwrap();
    assert_eq!(site(ip), (false, None));
    assert_eq!(
        ftrace::record(ip).unwrap().flags & (FTRACE_FL_ENABLED | FTRACE_FL_TRAMP),
        0
    );

    // A single probe with a post_handler: a per-site trampoline on the IPMODIFY ops, with
    // the post_handler emulated (regs.ip = addr + 5, checked in count_post).
    let pp = probe("fx_mul", true);
    kprobes::register_kprobe(pp).unwrap();
    assert!(site(ip).0, "a probe with a post_handler alone: per-site");
    let n = run_threads(2_000);
    assert_eq!((pre_hits(pp), post_hits(pp)), (n, n));
    // Next to a probe without one: shared path on the IPMODIFY ops, both exact.
    let q = probe("fx_mul", false);
    kprobes::register_kprobe(q).unwrap();
    assert!(!site(ip).0);
    let m = run_threads(2_000);
    assert_eq!((pre_hits(pp), post_hits(pp)), (n + m, n + m));
    assert_eq!(pre_hits(q), m);
    kprobes::unregister_kprobe(pp).unwrap();
    assert!(site(ip).0, "q alone: per-site on the ordinary ops");
    let k = run_threads(2_000);
    assert_eq!(pre_hits(q), m + k);
    kprobes::unregister_kprobe(q).unwrap();
    println!("test phases_switch_between_per_site_and_shared ... ok");
}

/// p1 stays registered while threads call fx_mul throughout and the site switches hundreds
/// of times between its own trampoline and the shared path (a second probe, a counting ops,
/// p2 disabled and enabled): p1 counts every call exactly, never twice, never missed.
fn live_switches() {
    let p1 = probe("fx_mul", false);
    kprobes::register_kprobe(p1).unwrap();
    let ip = p1.addr();
    let t1 = site(ip).1;
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    // SAFETY: a plain C function of two integers.
                    assert_eq!(unsafe { fx_mul(n as i64, 3) }, 3 * n as i64);
                    n += 1;
                }
                (t, n)
            })
        })
        .collect();
    let p2 = probe("fx_mul", false);
    OPS_HITS.store(0, Ordering::Relaxed);
    for round in 0..300 {
        match round % 3 {
            0 => {
                kprobes::register_kprobe(p2).unwrap();
                assert!(!site(ip).0);
                kprobes::disable_kprobe(p2).unwrap();
                assert_eq!(site(ip), (true, t1));
                kprobes::enable_kprobe(p2).unwrap();
                kprobes::unregister_kprobe(p2).unwrap();
            }
            1 => {
                ftrace::register_ftrace_function(&COUNT_OPS).unwrap();
                assert!(!site(ip).0);
                ftrace::unregister_ftrace_function(&COUNT_OPS).unwrap();
            }
            _ => {
                kprobes::set_per_site_trampolines(false).unwrap();
                kprobes::set_per_site_trampolines(true).unwrap();
            }
        }
        assert_eq!(
            site(ip),
            (true, t1),
            "round {round}: back on p1's trampoline"
        );
        std::thread::yield_now();
    }
    stop.store(true, Ordering::Relaxed);
    let calls: u64 = threads.into_iter().map(|t| t.join().unwrap().1).sum();
    kprobes::unregister_kprobe(p1).unwrap();
    assert!(calls > 0);
    assert_eq!(pre_hits(p1), calls, "p1 counted every call exactly once");
    assert_eq!(p1.nmissed(), 0);
    assert!(pre_hits(p2) <= calls && OPS_HITS.load(Ordering::Relaxed) <= calls);
    println!(
        "test live_switches_under_threads ... ok ({calls} calls, p2 {} hits, ops {} hits)",
        pre_hits(p2),
        OPS_HITS.load(Ordering::Relaxed)
    );
}

/// pre_handler that calls the probed function: the inner hit finds a kprobe running on the
/// thread and counts `nmissed` (the kernel's `kprobe_ftrace_handler()`).
fn calls_probed(p: &Kprobe, _regs: &mut PtRegs) -> i32 {
    p.data.fetch_add(1, Ordering::Relaxed);
    // SAFETY: a plain C function of two integers.
    assert_eq!(unsafe { fx_mul(3, 4) }, 12);
    0
}

/// pre_handler that claims it changed regs.ip (returns 1) without changing it: regs.ip
/// stays at addr + 1, where a real int3 would leave it, and no post_handler runs.
fn claims_ip_changed(p: &Kprobe, regs: &mut PtRegs) -> i32 {
    assert_eq!(regs.ip, p.addr() + 1);
    p.data.fetch_add(1, Ordering::Relaxed);
    regs.ip = p.addr() + 5;
    1
}

/// The kernel's `kprobe_ftrace_handler()` semantics the same on both paths: recursion
/// counted in `nmissed`, a pre_handler's non-zero return skipping the post_handler.
fn same_semantics_on_both_paths() {
    for per_site in [true, false] {
        kprobes::set_per_site_trampolines(per_site).unwrap();
        let p = leak(Kprobe::new(
            KprobeTarget::Symbol {
                module: None,
                name: "fx_mul".to_owned(),
                offset: 0,
            },
            Some(calls_probed),
            None,
        ));
        kprobes::register_kprobe(p).unwrap();
        assert_eq!(site(p.addr()).0, per_site);
        for i in 0..10 {
            // SAFETY: a plain C function of two integers.
            assert_eq!(unsafe { fx_mul(i, 2) }, 2 * i);
        }
        kprobes::unregister_kprobe(p).unwrap();
        assert_eq!(pre_hits(p), 10, "per_site {per_site}: the outer calls");
        assert_eq!(
            p.nmissed(),
            10,
            "per_site {per_site}: the handler's own calls"
        );

        let q = leak(Kprobe::new(
            KprobeTarget::Symbol {
                module: None,
                name: "fx_mul".to_owned(),
                offset: 0,
            },
            Some(claims_ip_changed),
            Some(count_post as _),
        ));
        kprobes::register_kprobe(q).unwrap();
        assert_eq!(site(q.addr()).0, per_site);
        // regs.ip = addr + 5 kept: the thread resumes after the site, the body runs.
        // SAFETY: a plain C function of two integers.
        assert_eq!(unsafe { fx_mul(6, 7) }, 42);
        kprobes::unregister_kprobe(q).unwrap();
        assert_eq!((pre_hits(q), post_hits(q)), (1, 0), "per_site {per_site}");
    }
    kprobes::set_per_site_trampolines(true).unwrap();
    println!("test same_semantics_on_both_paths ... ok");
}

fn main() {
    // Quick tier only: this binary has no stress case (ftprobe_dev::tier).
    if !ftprobe_dev::tier::quick_tier_requested() {
        return;
    }
    // SAFETY: early in main (reading the arguments starts no thread): single-threaded.
    unsafe { ftrace::init() }.expect("ftrace::init");
    // Rings for the function tracer's records (only its phase writes any).
    let (rings, fd) = SharedRings::create(RingConfig {
        nr_rings: 8,
        ring_bytes: 1 << 22,
        budget_bytes: 0,
    })
    .unwrap();
    let reader = SharedRings::attach(fd.as_fd()).unwrap();
    assert!(trace::set_buffer(rings));
    phases(&reader);
    same_semantics_on_both_paths();
    live_switches();
}
