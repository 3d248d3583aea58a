//! Return hooks (fgraph) in process, on the `fxg_*` functions of ftprobe-dev (`c/fxgraph.c`,
//! sites by attribute, built with `-O2 -fipa-ra`) and the `fx_cet_*` / `fx_pg_*` ones (sites
//! after `endbr64` and after the `-pg` prologue).
//!
//! `harness = false`: `ftrace::init` must run while the process is single-threaded, and the
//! cases share one process-wide ftrace state, so they run in order from `main`.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use ftprobe::ftrace::fgraph::{
    self, FgraphEnt, FgraphExit, FgraphOps, FgraphRet, FGRAPH_CAPACITY, FGRAPH_DATA_WORDS,
};
use ftprobe::ftrace::{self, PtRegs};
use ftprobe_dev::fxgraph::*;
use ftprobe_dev::fxsites::{fx_add, fx_cet_add, fx_pg_add};

fn addr<T>(f: T) -> u64
where
    T: Copy,
{
    // SAFETY: only used with function items/pointers (one word).
    unsafe { std::mem::transmute_copy::<T, usize>(&f) as u64 }
}

// ---- the users -------------------------------------------------------------------------

/// One user's counts: entries and returns by exit, data mismatches.
struct Counts {
    entries: AtomicU64,
    returned: AtomicU64,
    other_exit: AtomicU64,
    bad_data: AtomicU64,
}

impl Counts {
    const fn new() -> Counts {
        Counts {
            entries: AtomicU64::new(0),
            returned: AtomicU64::new(0),
            other_exit: AtomicU64::new(0),
            bad_data: AtomicU64::new(0),
        }
    }
    fn reset(&self) {
        for c in [
            &self.entries,
            &self.returned,
            &self.other_exit,
            &self.bad_data,
        ] {
            c.store(0, Ordering::SeqCst);
        }
    }
    fn get(&self) -> (u64, u64, u64, u64) {
        (
            self.entries.load(Ordering::SeqCst),
            self.returned.load(Ordering::SeqCst),
            self.other_exit.load(Ordering::SeqCst),
            self.bad_data.load(Ordering::SeqCst),
        )
    }
}

static A: Counts = Counts::new();
static B: Counts = Counts::new();
static C: Counts = Counts::new();

/// A log of user A's events on the main thread: (func, depth, 0 entry / 1 return), packed.
const LOG_LEN: usize = 4096;
static LOG: [AtomicU64; LOG_LEN] = [const { AtomicU64::new(0) }; LOG_LEN];
static LOG_AT: AtomicUsize = AtomicUsize::new(0);
static LOGGING: AtomicBool = AtomicBool::new(false);
/// Last return values user A saw (rax, rdx) and the real return address.
static LAST_RET: [AtomicU64; 3] = [const { AtomicU64::new(0) }; 3];

fn log(func: u64, depth: u32, kind: u64) {
    if LOGGING.load(Ordering::Relaxed) {
        let i = LOG_AT.fetch_add(1, Ordering::Relaxed);
        if i < LOG_LEN {
            LOG[i].store(func << 16 | (depth as u64) << 1 | kind, Ordering::Relaxed);
        }
    }
}

fn take_log() -> Vec<(u64, u32, u64)> {
    let n = LOG_AT.swap(0, Ordering::SeqCst).min(LOG_LEN);
    LOG[..n]
        .iter()
        .map(|w| {
            let w = w.load(Ordering::SeqCst);
            (w >> 16, ((w >> 1) & 0x7fff) as u32, w & 1)
        })
        .collect()
}

unsafe fn a_entry(
    ent: &FgraphEnt,
    _g: &FgraphOps,
    _r: &mut PtRegs,
    data: &mut [u64; FGRAPH_DATA_WORDS],
) -> bool {
    A.entries.fetch_add(1, Ordering::Relaxed);
    *data = [ent.func ^ 0xA, ent.depth as u64, ent.calltime, 0xAAAA];
    log(ent.func, ent.depth, 0);
    true
}

unsafe fn a_return(
    ret: &FgraphRet,
    _g: &FgraphOps,
    regs: &PtRegs,
    data: &[u64; FGRAPH_DATA_WORDS],
) {
    if ret.exit == FgraphExit::Returned {
        A.returned.fetch_add(1, Ordering::Relaxed);
    } else {
        A.other_exit.fetch_add(1, Ordering::Relaxed);
    }
    if *data != [ret.func ^ 0xA, ret.depth as u64, ret.calltime, 0xAAAA]
        || ret.rettime < ret.calltime
        || regs.ip != ret.ret
        || regs.sp != ret.retp + 8
    {
        A.bad_data.fetch_add(1, Ordering::Relaxed);
    }
    LAST_RET[0].store(ret.retval, Ordering::Relaxed);
    LAST_RET[1].store(ret.retval2, Ordering::Relaxed);
    LAST_RET[2].store(ret.ret, Ordering::Relaxed);
    log(ret.func, ret.depth, 1);
}

unsafe fn b_entry(
    ent: &FgraphEnt,
    _g: &FgraphOps,
    _r: &mut PtRegs,
    data: &mut [u64; FGRAPH_DATA_WORDS],
) -> bool {
    B.entries.fetch_add(1, Ordering::Relaxed);
    // B's data differs from A's in every word.
    *data = [
        ent.func ^ 0xB,
        !ent.calltime,
        0xBBBB,
        ent.depth as u64 + 100,
    ];
    true
}

unsafe fn b_return(ret: &FgraphRet, _g: &FgraphOps, _r: &PtRegs, data: &[u64; FGRAPH_DATA_WORDS]) {
    if ret.exit == FgraphExit::Returned {
        B.returned.fetch_add(1, Ordering::Relaxed);
    } else {
        B.other_exit.fetch_add(1, Ordering::Relaxed);
    }
    if *data
        != [
            ret.func ^ 0xB,
            !ret.calltime,
            0xBBBB,
            ret.depth as u64 + 100,
        ]
    {
        B.bad_data.fetch_add(1, Ordering::Relaxed);
    }
}

unsafe fn c_entry(
    ent: &FgraphEnt,
    _g: &FgraphOps,
    _r: &mut PtRegs,
    data: &mut [u64; FGRAPH_DATA_WORDS],
) -> bool {
    C.entries.fetch_add(1, Ordering::Relaxed);
    data[0] = ent.func;
    true
}

unsafe fn c_return(ret: &FgraphRet, _g: &FgraphOps, _r: &PtRegs, data: &[u64; FGRAPH_DATA_WORDS]) {
    if ret.exit == FgraphExit::Returned {
        C.returned.fetch_add(1, Ordering::Relaxed);
    }
    if data[0] != ret.func {
        C.bad_data.fetch_add(1, Ordering::Relaxed);
    }
}

static USER_A: FgraphOps = FgraphOps::new(a_entry, a_return);
static USER_B: FgraphOps = FgraphOps::new(b_entry, b_return);
static USER_C: FgraphOps = FgraphOps::new(c_entry, c_return);

fn reset() {
    A.reset();
    B.reset();
    C.reset();
    take_log();
}

// ---- the cases -------------------------------------------------------------------------

fn nesting_and_exact_counts_with_two_users() {
    reset();
    LOGGING.store(true, Ordering::SeqCst);
    // SAFETY: plain C function.
    let r = unsafe { fxg_top(3) };
    LOGGING.store(false, Ordering::SeqCst);
    // mid(i) = (i + 1) + (2i + 1)
    assert_eq!(r, (0..3).map(|i| 3 * i + 2).sum::<i64>());
    // A: every fxg_* function; B: fxg_mid and fxg_leaf.
    assert_eq!(A.get(), (1 + 3 + 6, 10, 0, 0));
    assert_eq!(B.get(), (3 + 6, 9, 0, 0));
    let (top, mid, leaf) = (
        addr(fxg_top as unsafe extern "C" fn(i64) -> i64),
        addr(fxg_mid as unsafe extern "C" fn(i64) -> i64),
        addr(fxg_leaf as unsafe extern "C" fn(i64) -> i64),
    );
    let mut want = vec![(top, 0, 0)];
    for _ in 0..3 {
        want.extend([
            (mid, 1, 0),
            (leaf, 2, 0),
            (leaf, 2, 1),
            (leaf, 2, 0),
            (leaf, 2, 1),
            (mid, 1, 1),
        ]);
    }
    want.push((top, 0, 1));
    assert_eq!(take_log(), want);
    assert_eq!(fgraph::thread_depth(), 0, "every entry popped");
    println!("ok nesting_and_exact_counts_with_two_users");
}

fn recursion_deeper_than_the_shadow_stack_counts_overruns() {
    reset();
    let before = USER_A.overrun();
    let n = 3 * FGRAPH_CAPACITY as i64;
    // SAFETY: plain C function; 3072 frames of a few words each.
    let r = unsafe { fxg_recurse(n) };
    assert_eq!(r, n * (n + 1) / 2);
    let hooked = FGRAPH_CAPACITY as u64;
    assert_eq!(A.get(), (hooked, hooked, 0, 0));
    // n + 1 calls: fxg_recurse(n) down to fxg_recurse(0).
    assert_eq!(USER_A.overrun() - before, n as u64 + 1 - hooked);
    assert_eq!(fgraph::thread_depth(), 0);
    // And the stack works again afterwards.
    // SAFETY: plain C function.
    assert_eq!(unsafe { fxg_recurse(10) }, 55);
    assert_eq!(A.get().1, hooked + 11);
    println!("ok recursion_deeper_than_the_shadow_stack_counts_overruns");
}

fn return_values_in_rax_and_rdx_reach_the_caller_and_retfunc() {
    reset();
    // SAFETY: plain C function.
    let p = unsafe { fxg_pair(7) };
    assert_eq!(p, FxgPair { a: 21, b: 35 });
    assert_eq!(A.get(), (1, 1, 0, 0));
    assert_eq!(LAST_RET[0].load(Ordering::SeqCst), 21);
    assert_eq!(LAST_RET[1].load(Ordering::SeqCst), 35);
    println!("ok return_values_in_rax_and_rdx_reach_the_caller_and_retfunc");
}

const GPR_WANT: [u64; 15] = [
    0x0102030405060708,
    0x1213141516171819,
    0x232425262728292a,
    0x3435363738393a3b,
    0x45464748494a4b4c,
    0x565758595a5b5c5d,
    0x6768696a6b6c6d6e,
    0x7778797a7b7c7d7e,
    0x88898a8b8c8d8e8f,
    0x999a9b9c9d9e9fa0,
    0xaaabacadaeafb0b1,
    0xbbbcbdbebfc0c1c2,
    0xcccdcecfd0d1d2d3,
    0xdddedfe0e1e2e3e4,
    0xeeeff0f1f2f3f4f5,
];

fn harness(avx: bool) -> [u64; 80] {
    let mut out = [0u64; 80];
    // SAFETY: 80 writable words; the harness restores every callee-saved register.
    unsafe { fxg_regs_harness(out.as_mut_ptr(), avx as i32) };
    out
}

fn check_harness(out: &[u64; 80], avx: bool) {
    const NAMES: [&str; 15] = [
        "rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "r8", "r9", "r10", "r11", "r12", "r13",
        "r14", "r15",
    ];
    for (i, name) in NAMES.iter().enumerate() {
        assert_eq!(out[i], GPR_WANT[i], "{name} changed across the hooked call");
    }
    for x in 0..16u64 {
        let want = 0x0101010101010101u64 * (0x20 + x);
        assert_eq!(
            (out[16 + 2 * x as usize], out[17 + 2 * x as usize]),
            (want, want),
            "xmm{x} changed across the hooked call"
        );
        if avx {
            let want = 0x0101010101010101u64 * (0x60 + x);
            assert_eq!(
                (out[48 + 2 * x as usize], out[49 + 2 * x as usize]),
                (want, want),
                "ymm{x}'s upper half changed across the hooked call"
            );
        }
    }
}

fn every_register_survives_the_return_trampoline(unhooked: (i64, f64)) {
    reset();
    let avx = std::arch::is_x86_feature_detected!("avx");
    check_harness(&harness(false), false);
    assert_eq!(A.get(), (1, 1, 0, 0), "fxg_nop was hooked and returned");
    if avx {
        check_harness(&harness(true), true);
        assert_eq!(A.get().1, 2);
    }
    // Compiler output that relies on IPA-RA: caller-saved registers live across the call.
    // SAFETY: plain C functions.
    let (i, f) = unsafe {
        (
            fxg_ipa_int(1, 2, 3, 4, 5, 6),
            fxg_ipa_float(1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5, 8.5),
        )
    };
    assert_eq!((i, f), unhooked);
    assert_eq!(A.get().1, 1 + avx as u64 + 6, "the leaves were hooked");
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2.
        let ok = unsafe { fxg_m256_check() };
        assert_eq!(ok, 1, "__m256 in ymm0 / kept in ymm1");
        println!("ok every_register_survives_the_return_trampoline (with AVX2)");
    } else {
        println!("ok every_register_survives_the_return_trampoline (no AVX2: ymm case skipped)");
    }
}

fn tail_call_closes_both_calls_in_order() {
    reset();
    LOGGING.store(true, Ordering::SeqCst);
    // SAFETY: plain C function.
    let r = unsafe { fxg_tail(5) };
    LOGGING.store(false, Ordering::SeqCst);
    assert_eq!(r, 11);
    let tail = addr(fxg_tail as unsafe extern "C" fn(i64) -> i64);
    let leaf = addr(fxg_leaf as unsafe extern "C" fn(i64) -> i64);
    assert_eq!(
        take_log(),
        vec![(tail, 0, 0), (leaf, 1, 0), (leaf, 1, 1), (tail, 0, 1)]
    );
    assert_eq!(A.get(), (2, 2, 0, 0));
    assert_eq!(fgraph::thread_depth(), 0);
    println!("ok tail_call_closes_both_calls_in_order");
}

fn threads_each_have_their_own_shadow_stack() {
    reset();
    let n = 4;
    let per = 2000i64;
    let hs: Vec<_> = (0..n)
        .map(|_| {
            std::thread::spawn(move || {
                // SAFETY: plain C function.
                let r = unsafe { fxg_top(per) };
                (r, fgraph::thread_depth())
            })
        })
        .collect();
    let want = (0..per).map(|i| 3 * i + 2).sum::<i64>();
    for h in hs {
        assert_eq!(h.join().unwrap(), (want, 0));
    }
    let calls = n * (1 + 3 * per as u64);
    assert_eq!(A.get(), (calls, calls, 0, 0));
    println!("ok threads_each_have_their_own_shadow_stack");
}

fn fork_inside_a_hooked_function_returns_in_both() {
    reset();
    // SAFETY: fork in a single-threaded process (the threads above were joined); the child
    // only checks and _exits.
    let r = unsafe { fxg_fork() };
    if r == -7 {
        // The child: it returned through its copy of the shadow stack.
        let ok = A.get() == (1, 1, 0, 0) && fgraph::thread_depth() == 0;
        // SAFETY: _exit in the child.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    assert!(r > 0, "fork failed: {r}");
    let mut status = 0;
    // SAFETY: waits for our child.
    assert_eq!(unsafe { libc::waitpid(r as i32, &mut status, 0) }, r as i32);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{status:#x}"
    );
    assert_eq!(A.get(), (1, 1, 0, 0));
    println!("ok fork_inside_a_hooked_function_returns_in_both");
}

static SLOT_SEEN: [AtomicU64; 2] = [const { AtomicU64::new(0) }; 2];

unsafe extern "C" fn look_at_slot(slot: *mut *mut core::ffi::c_void) -> i64 {
    // SAFETY: fxg_with_slot passes its own live return-address slot.
    let v = unsafe { *slot } as u64;
    SLOT_SEEN[0].store(v, Ordering::SeqCst);
    SLOT_SEEN[1].store(
        fgraph::ftrace_graph_ret_addr(v, slot as *const u64),
        Ordering::SeqCst,
    );
    5
}

#[inline(never)]
fn call_with_slot() -> i64 {
    // SAFETY: plain C function with a callback of the right type.
    let r = unsafe { fxg_with_slot(look_at_slot) };
    std::hint::black_box(r)
}

fn ftrace_graph_ret_addr_gives_the_real_return_address(unhooked_slot: u64) {
    reset();
    assert_eq!(call_with_slot(), 5);
    assert_eq!(
        SLOT_SEEN[0].load(Ordering::SeqCst),
        fgraph::return_trampoline(),
        "the slot is hijacked while the call runs"
    );
    assert_eq!(SLOT_SEEN[1].load(Ordering::SeqCst), unhooked_slot);
    assert_eq!(LAST_RET[2].load(Ordering::SeqCst), unhooked_slot);
    // Not the trampoline: unchanged.
    assert_eq!(
        fgraph::ftrace_graph_ret_addr(0x1234, std::ptr::null()),
        0x1234
    );
    println!("ok ftrace_graph_ret_addr_gives_the_real_return_address");
}

fn sites_after_endbr_and_after_the_prologue_find_their_slot() {
    reset();
    // SAFETY: plain C functions.
    let r = unsafe { (fx_cet_add(2, 3), fx_pg_add(4, 5)) };
    assert_eq!(r, (5, 9));
    assert_eq!(C.get(), (2, 2, 0, 0));
    println!("ok sites_after_endbr_and_after_the_prologue_find_their_slot");
}

fn unregistered_users_stop_hooking() {
    fgraph::unregister_ftrace_graph(&USER_B).unwrap();
    reset();
    // SAFETY: plain C function.
    unsafe { fxg_top(2) };
    assert_eq!(A.get(), (7, 7, 0, 0));
    assert_eq!(B.get(), (0, 0, 0, 0));
    assert!(matches!(
        fgraph::unregister_ftrace_graph(&USER_B),
        Err(ftrace::FtraceError::NotRegistered)
    ));
    println!("ok unregistered_users_stop_hooking");
}

fn main() {
    // Quick tier only: this binary has no stress case (ftprobe_dev::tier).
    if !ftprobe_dev::tier::quick_tier_requested() {
        return;
    }
    // SAFETY: early in main (reading the arguments starts no thread): no other thread runs.
    let skipped = unsafe { ftrace::init() }.expect("ftrace init");
    let _ = skipped;
    // Ground truth, untraced.
    // SAFETY: plain C functions.
    let unhooked = unsafe {
        (
            fxg_ipa_int(1, 2, 3, 4, 5, 6),
            fxg_ipa_float(1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5, 8.5),
        )
    };
    call_with_slot();
    let unhooked_slot = SLOT_SEEN[0].load(Ordering::SeqCst);
    check_harness(&harness(false), false);

    ftrace::ftrace_set_filter(USER_A.ops(), "fxg_*", true).unwrap();
    ftrace::ftrace_set_filter(USER_B.ops(), "fxg_mid", true).unwrap();
    ftrace::ftrace_set_filter(USER_B.ops(), "fxg_leaf", false).unwrap();
    ftrace::ftrace_set_filter(USER_C.ops(), "fx_cet_add", true).unwrap();
    ftrace::ftrace_set_filter(USER_C.ops(), "fx_pg_add", false).unwrap();
    fgraph::register_ftrace_graph(&USER_A).unwrap();
    fgraph::register_ftrace_graph(&USER_B).unwrap();
    fgraph::register_ftrace_graph(&USER_C).unwrap();

    nesting_and_exact_counts_with_two_users();
    recursion_deeper_than_the_shadow_stack_counts_overruns();
    return_values_in_rax_and_rdx_reach_the_caller_and_retfunc();
    every_register_survives_the_return_trampoline(unhooked);
    tail_call_closes_both_calls_in_order();
    ftrace_graph_ret_addr_gives_the_real_return_address(unhooked_slot);
    sites_after_endbr_and_after_the_prologue_find_their_slot();
    fork_inside_a_hooked_function_returns_in_both();
    threads_each_have_their_own_shadow_stack();
    unregistered_users_stop_hooking();
    cost_per_hooked_call();
}

/// Not a check: the cost of entry + exit through the shadow stack with one user whose
/// callbacks count (printed for the record; BENCHMARKS.md has the real benchmark).
fn cost_per_hooked_call() {
    let n = 1_000_000;
    let time = |f: &dyn Fn()| {
        let t = std::time::Instant::now();
        f();
        t.elapsed().as_nanos() as f64 / n as f64
    };
    let leaf = |i: i64| {
        // SAFETY: plain C function.
        std::hint::black_box(unsafe { fxg_leaf(i) })
    };
    let add = |i: i64| {
        // SAFETY: plain C function.
        std::hint::black_box(unsafe { fx_add(i, 1) })
    };
    let hooked = time(&|| {
        (0..n).for_each(|i| {
            leaf(i);
        })
    });
    let plain = time(&|| {
        (0..n).for_each(|i| {
            add(i);
        })
    });
    println!(
        "cost: {:.1} ns per hooked call (entry + return, one counting user; {:.1} ns unhooked)",
        hooked - plain,
        plain
    );
}
