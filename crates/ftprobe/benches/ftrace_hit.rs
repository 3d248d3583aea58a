//! ns per hit of the ftrace layer on a real site (`fx_add`, `-fpatchable-function-entry=5`):
//! untraced (NOP5), an empty callback through its direct trampoline, an empty callback with
//! SAVE_REGS, two empty callbacks through the list function, the function tracer recording
//! (tsc, ip, parent_ip) into a ring, a kprobe on the site with an empty pre_handler, and a
//! kprobe event recording two arguments; each kprobe row twice: through the site's per-site
//! trampoline (the default for a site with one probe) and through the shared kprobes ops
//! with its lookup by address (`kprobes::set_per_site_trampolines(false)`); and events whose
//! fetch args read memory (a `u64`, a 32-byte string: copied in one pass, measured first,
//! and by the general program) next to the register-only events of the same record size, in
//! interleaved rounds, with the medians of the rounds' differences: once with records
//! streaming into a 128 MiB ring (as a traced program's thread writes them), once into a
//! 1 MiB ring drained every 2048 calls (it stays in cache: what the programs cost alone).
//! Each other figure is the median of 11 runs of 2M calls, minus the untraced median of the
//! same run.
//!
//! `cargo bench -p ftprobe --bench ftrace_hit`

use std::hint::black_box;
use std::time::Instant;

use ftprobe::ftrace::{self, FtraceOps, PtRegs, FTRACE_OPS_FL_SAVE_REGS};
use ftprobe::function_tracer;
use ftprobe::kprobes::{self, Kprobe, KprobeTarget};
use ftprobe::ring::{RingConfig, SharedRings};
use ftprobe::{trace, trace_kprobe};

const N: i64 = 2_000_000;
const RUNS: usize = 11;
/// The fetch rows' interleaved rounds, and calls in each: short rounds, many of them, so
/// that this VM's bursts of noise fall on every row alike.
const FETCH_ROUNDS: usize = 41;
const FETCH_N: i64 = 400_000;

unsafe extern "C" fn empty(_ip: u64, _p: u64, _op: &FtraceOps, _r: &mut PtRegs) {}
static EMPTY: FtraceOps = FtraceOps::new(empty, 0);
static EMPTY2: FtraceOps = FtraceOps::new(empty, 0);
static EMPTY_REGS: FtraceOps = FtraceOps::new(empty, FTRACE_OPS_FL_SAVE_REGS);

mod common;

/// The string of the string fetch arg row: 32 characters and the NUL, aligned as a C
/// compiler aligns such a global array (bench/hit.c's `hit_str`: 32 bytes on x86-64).
#[repr(C, align(32))]
pub struct BenchStr([u8; 33]);
#[no_mangle]
#[used]
pub static FTPROBE_BENCH_STR: BenchStr = BenchStr(*b"0123456789abcdef0123456789abcdef\0");

fn loop_once() -> f64 {
    common::loop_fx_add(N)
}

fn median(mut between: impl FnMut()) -> (f64, f64, f64) {
    common::median_of(RUNS, || {
        between();
        loop_once()
    })
}

/// One round of a fetch row: its event created as event `id` (then the next id), `measure`
/// run with the row's programs (short or general, strings in one pass or measured first),
/// the event removed.
fn fetch_round(
    id: &mut u32,
    (def, fast, one_pass): (&str, bool, bool),
    measure: impl FnOnce() -> f64,
) -> f64 {
    let tk = trace_kprobe::create(*id, def).unwrap();
    *id += 1;
    trace_kprobe::set_fast_programs(fast);
    trace_kprobe::set_one_pass_strings(one_pass);
    let ns = measure();
    trace_kprobe::set_fast_programs(true);
    trace_kprobe::set_one_pass_strings(true);
    kprobes::unregister_kprobe(tk.kp).unwrap();
    ns
}

fn main() {
    // SAFETY: first thing in main, single-threaded.
    unsafe { ftrace::init() }.expect("init");
    let (rings, _fd) = SharedRings::create(RingConfig {
        nr_rings: 4,
        ring_bytes: 1 << 28,
        // The main thread's ring grows to 128 MiB (2M records of 48 bytes); the fetch rows'
        // second thread's stays within 1 MiB, to wrap in this CPU's L2 (4 MiB).
        budget_bytes: (1 << 27) + (1 << 20),
    })
    .unwrap();
    let mut rows = Vec::new();
    let base = median(|| {});
    rows.push(("untraced (NOP5 site)", base));
    for (name, ops) in [
        ("empty callback, direct trampoline", &EMPTY),
        ("empty callback, SAVE_REGS", &EMPTY_REGS),
    ] {
        ftrace::ftrace_set_filter(ops, "fx_add", true).unwrap();
        ftrace::register_ftrace_function(ops).unwrap();
        rows.push((name, median(|| {})));
        ftrace::unregister_ftrace_function(ops).unwrap();
    }
    ftrace::ftrace_set_filter(&EMPTY, "fx_add", true).unwrap();
    ftrace::ftrace_set_filter(&EMPTY2, "fx_add", true).unwrap();
    ftrace::register_ftrace_function(&EMPTY).unwrap();
    ftrace::register_ftrace_function(&EMPTY2).unwrap();
    rows.push(("2 empty callbacks, list function", median(|| {})));
    ftrace::unregister_ftrace_function(&EMPTY).unwrap();
    ftrace::unregister_ftrace_function(&EMPTY2).unwrap();

    // Site kprobe with an empty pre_handler.
    fn empty_pre(_p: &Kprobe, _r: &mut PtRegs) -> i32 {
        0
    }
    let kp: &'static Kprobe = Box::leak(Box::new(Kprobe::new(
        KprobeTarget::Symbol {
            module: None,
            name: "fx_add".into(),
            offset: 0,
        },
        Some(empty_pre),
        None,
    )));
    kprobes::register_kprobe(kp).unwrap();
    let direct = ftrace::record(kp.addr()).unwrap().flags & ftrace::FTRACE_FL_TRAMP != 0;
    assert!(direct, "one probe on the site: per-site trampoline");
    rows.push(("kprobe on the site, per-site trampoline", median(|| {})));
    kprobes::set_per_site_trampolines(false).unwrap();
    rows.push(("kprobe on the site, shared path (lookup)", median(|| {})));
    kprobes::set_per_site_trampolines(true).unwrap();
    kprobes::unregister_kprobe(kp).unwrap();

    // Records go into a 256 MiB ring, drained between runs (as the CLI does).
    let reader_view = SharedRings::attach(std::os::fd::AsFd::as_fd(&_fd)).unwrap();
    trace::set_buffer(rings);
    let tk = trace_kprobe::create(0, "p:ev fx_add a=$arg1 b=$arg2").unwrap();
    let mut records = 0usize;
    let ev = median(|| {
        if let Some(mut r) = reader_view.reader(0) {
            records += r.drain(|_, _| {});
        }
    });
    rows.push(("kprobe event, 2 args (48 B), per-site", ev));
    kprobes::set_per_site_trampolines(false).unwrap();
    let ev = median(|| {
        if let Some(mut r) = reader_view.reader(0) {
            records += r.drain(|_, _| {});
        }
    });
    rows.push(("kprobe event, 2 args (48 B), shared path", ev));
    kprobes::set_per_site_trampolines(true).unwrap();
    kprobes::unregister_kprobe(tk.kp).unwrap();
    if let Some(mut r) = reader_view.reader(0) {
        records += r.drain(|_, _| {});
    }
    // Fetch args that read memory (plain loads, faults resumed by ftprobe's handler), each
    // next to the register-only event of the same record size (issue 14: <= 10 ns above it),
    // and the same events through the general per-argument program (the short programs off:
    // what they save). Interleaved: each round runs every event once (created, timed,
    // removed), so that a burst of noise on this VM falls on all of them; the differences
    // are the medians of the per-round differences.
    // This program installs no signal action and changes no mask: ftprobe's fault handler
    // stays in place, as the agent's interposers keep it in a traced program.
    ftprobe::arch::x86_64::uaccess::set_handlers_kept();
    // (row, definition, short program, strings in one pass)
    let fetch_rows: [(&str, &str, bool, bool); 7] = [
        (
            "kprobe event, 2 register args (48 B)",
            "p:ev2 fx_add a=$arg1 b=%si",
            true,
            true,
        ),
        (
            "kprobe event, 2 args, a u64 read (48 B)",
            "p:evu fx_add a=$arg1 v=+0(%sp):u64",
            true,
            true,
        ),
        (
            "  the same, general program",
            "p:evu fx_add a=$arg1 v=+0(%sp):u64",
            false,
            true,
        ),
        (
            "kprobe event, 7 register args (88 B)",
            "p:ev7 fx_add a=%di b=%si c=%dx d=%cx e=%r8 f=%r9 g=%ax",
            true,
            true,
        ),
        (
            "kprobe event, 2 args, a 32-byte string (88 B)",
            "p:evs fx_add a=$arg1 s=@FTPROBE_BENCH_STR:string",
            true,
            true,
        ),
        (
            "  the same, string measured first",
            "p:evs fx_add a=$arg1 s=@FTPROBE_BENCH_STR:string",
            true,
            false,
        ),
        (
            "  the same, general program",
            "p:evs fx_add a=$arg1 s=@FTPROBE_BENCH_STR:string",
            false,
            true,
        ),
    ];
    let mut samples = vec![Vec::new(); fetch_rows.len()];
    let mut id = 1;
    for _ in 0..FETCH_ROUNDS {
        for (k, &(_, def, fast, one_pass)) in fetch_rows.iter().enumerate() {
            samples[k].push(fetch_round(&mut id, (def, fast, one_pass), || {
                common::loop_fx_add(FETCH_N)
            }));
            if let Some(mut r) = reader_view.reader(0) {
                records += r.drain(|_, _| {});
            }
        }
    }
    let stats = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        (v[v.len() / 2], v[0], v[v.len() - 1])
    };
    for (k, (name, ..)) in fetch_rows.iter().enumerate() {
        rows.push((name, stats(&samples[k])));
    }
    let diff_rows = |samples: &[Vec<f64>]| {
        let diff = |a: usize, b: usize| {
            let d: Vec<f64> = samples[a]
                .iter()
                .zip(&samples[b])
                .map(|(x, y)| x - y)
                .collect();
            stats(&d)
        };
        [
            ("u64 read - 2 register args", diff(1, 0)),
            ("32-byte string - 7 register args", diff(4, 3)),
            ("  measured first - 7 register args", diff(5, 3)),
            ("32-byte string - 2 register args", diff(4, 0)),
        ]
    };
    let fetch_diffs = diff_rows(&samples);

    // The same rows with a ring that stays in cache: a second thread (its own ring, which the
    // budget keeps within 1 MiB) calls in batches of 2048, drained between batches (only the
    // batches are timed). Above, each record goes to memory no cache holds (the ring is
    // 128 MiB): that cost is the same for rows of one record size but varies with this VM's
    // memory traffic; here the rows differ by the work of their programs alone.
    const BATCH: i64 = 2048;
    const BATCHES: usize = 100;
    let l2_samples = std::thread::scope(|sc| {
        sc.spawn(|| {
            let mut samples = vec![Vec::new(); fetch_rows.len()];
            let mut drained = 0usize;
            let mut drain = || {
                for i in 0..reader_view.claimed() {
                    if let Some(mut r) = reader_view.reader(i) {
                        drained += r.drain(|_, _| {});
                    }
                }
            };
            for _ in 0..FETCH_ROUNDS {
                for (k, &(_, def, fast, one_pass)) in fetch_rows.iter().enumerate() {
                    let ns = fetch_round(&mut id, (def, fast, one_pass), || {
                        let mut ns = 0.0;
                        for _ in 0..BATCHES {
                            ns += common::loop_fx_add(BATCH);
                            drain();
                        }
                        ns / BATCHES as f64
                    });
                    samples[k].push(ns);
                    drain();
                }
            }
            (samples, drained)
        })
        .join()
        .unwrap()
    });
    records += l2_samples.1;
    let l2_samples = l2_samples.0;
    let l2_size = reader_view.ring_size(1).unwrap_or(0);
    assert!(
        l2_size <= 1 << 20,
        "the second ring stayed small: {l2_size}"
    );
    let mut l2_rows = Vec::new();
    for (k, (name, ..)) in fetch_rows.iter().enumerate() {
        l2_rows.push((*name, stats(&l2_samples[k])));
    }
    let l2_diffs = diff_rows(&l2_samples);

    function_tracer::start(None, &["fx_add".to_owned()], &[]).unwrap();
    let rec = median(|| {
        if let Some(mut r) = reader_view.reader(0) {
            records += r.drain(|_, _| {});
        }
    });
    rows.push(("function tracer, event recorded (32 B)", rec));
    ftrace::unregister_ftrace_function(&function_tracer::FUNCTION_OPS).unwrap();
    let lost: u64 = (0..reader_view.claimed())
        .filter_map(|i| reader_view.reader(i))
        .map(|r| r.lost())
        .sum();
    assert_eq!(lost, 0, "the rings held every event");

    // The timestamp alone, for reference: what every recorded event pays on this machine.
    let mut ts = Vec::new();
    for _ in 0..RUNS {
        let t = Instant::now();
        let mut acc = 0u64;
        for _ in 0..N {
            let (tsc, cpu) = ftprobe::ring::read_tsc_cpu();
            acc = acc.wrapping_add(tsc ^ cpu as u64);
        }
        black_box(acc);
        ts.push(t.elapsed().as_nanos() as f64 / N as f64);
    }
    ts.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!(
        "{:<42} {:>10} {:>10} {:>16}",
        "ftrace_hit (ns per call of fx_add)", "median", "per hit", "min-max"
    );
    for (name, (m, lo, hi)) in rows {
        println!(
            "{name:<42} {m:>10.2} {:>10.2} {lo:>7.2}-{hi:<7.2}",
            m - base.0
        );
    }
    println!(
        "{:<42} {:>10.2} {:>10} {:>7.2}-{:<7.2}",
        "timestamp alone (rdtsc + cpu), no call",
        ts[RUNS / 2],
        "-",
        ts[0],
        ts[RUNS - 1]
    );
    for (name, (m, lo, hi)) in fetch_diffs {
        println!(
            "{name:<42} {:>10} {m:>10.2} {lo:>7.2}-{hi:<7.2}",
            "(rounds)"
        );
    }
    println!("fetch rows, ring in cache ({} KiB)", l2_size >> 10);
    for (name, (m, lo, hi)) in l2_rows {
        println!(
            "{name:<42} {m:>10.2} {:>10.2} {lo:>7.2}-{hi:<7.2}",
            m - base.0
        );
    }
    for (name, (m, lo, hi)) in l2_diffs {
        println!(
            "{name:<42} {:>10} {m:>10.2} {lo:>7.2}-{hi:<7.2}",
            "(rounds)"
        );
    }
    println!("({RUNS} runs of {N} calls; 'per hit' = median minus the untraced median; the fetch rows in {FETCH_ROUNDS} interleaved rounds of {FETCH_N} calls, their differences the medians of the rounds'; {records} records drained)");
}
