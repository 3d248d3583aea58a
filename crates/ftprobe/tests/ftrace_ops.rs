//! ftrace_ops on real sites: the `fx_*` functions of ftprobe-dev, compiled with
//! `-fpatchable-function-entry=5` and linked into this executable.
//!
//! `harness = false`: `ftrace::init` must run while the process is single-threaded, and the
//! cases share one process-wide ftrace state, so they run in order from `main`.

use std::sync::atomic::{AtomicU64, Ordering};

use ftprobe::arch::x86_64::nops::NOP5;
use ftprobe::ftrace::{
    self, FtraceError, FtraceOps, PtRegs, FTRACE_FL_DIRECT, FTRACE_FL_ENABLED,
    FTRACE_OPS_FL_IPMODIFY, FTRACE_OPS_FL_RECURSION, FTRACE_OPS_FL_SAVE_REGS,
};
use ftprobe_dev::fxsites::*;

mod common;
use common::CountingAlloc;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

fn addr(f: unsafe extern "C" fn(i64, i64) -> i64) -> u64 {
    f as *const () as u64
}
fn addr1(f: unsafe extern "C" fn(i64) -> i64) -> u64 {
    f as *const () as u64
}
fn addr0(f: unsafe extern "C" fn() -> i64) -> u64 {
    f as *const () as u64
}
fn bytes(at: u64) -> [u8; 5] {
    // SAFETY: `at` is the entry of one of our own functions: 5 mapped, readable bytes.
    unsafe { std::ptr::read_volatile(at as *const [u8; 5]) }
}
fn call_all() -> i64 {
    // SAFETY: plain C functions of ftprobe-dev with no preconditions.
    unsafe { fx_add(1, 2) + fx_mul(3, 4) + fx_twice(10) + fx_ret_42() }
}
/// 3 + 12 + 23 + 42
const ALL: i64 = 80;

macro_rules! counter_ops {
    ($ops:ident, $count:ident, $flags:expr) => {
        static $count: AtomicU64 = AtomicU64::new(0);
        static $ops: FtraceOps = {
            unsafe extern "C" fn cb(_ip: u64, _p: u64, _op: &FtraceOps, _r: &mut PtRegs) {
                $count.fetch_add(1, Ordering::Relaxed);
            }
            FtraceOps::new(cb, $flags)
        };
    };
}

counter_ops!(OPS_A, COUNT_A, 0);
counter_ops!(OPS_B, COUNT_B, 0);
counter_ops!(OPS_GLOB, COUNT_GLOB, 0);
counter_ops!(OPS_FAIL, COUNT_FAIL, 0);
counter_ops!(
    OPS_IPM2,
    COUNT_IPM2,
    FTRACE_OPS_FL_SAVE_REGS | FTRACE_OPS_FL_IPMODIFY
);
counter_ops!(OPS_BADFLAGS, COUNT_BADFLAGS, FTRACE_OPS_FL_IPMODIFY);

fn reset() {
    for c in [&COUNT_A, &COUNT_B, &COUNT_GLOB, &COUNT_FAIL, &COUNT_IPM2] {
        c.store(0, Ordering::Relaxed);
    }
}

fn sites_are_canonical_nops() {
    let funcs = ftrace::functions().unwrap();
    for f in ["fx_add", "fx_mul", "fx_leaf", "fx_twice", "fx_ret_42"] {
        let s = funcs
            .iter()
            .find(|s| s.name == f)
            .unwrap_or_else(|| panic!("{f} has a site"));
        assert_eq!(
            s.ip, s.func_addr,
            "{f}: patchable entry site is the first instruction"
        );
        assert_eq!(s.kind.name(), "nop1x5");
        // nop; nop; nop; nop; nop  ->  nopl 0x0(%rax,%rax,1)
        assert_eq!(bytes(s.ip), NOP5, "{f} converted to NOP5");
    }
    assert_eq!(call_all(), ALL);
}

fn two_ops_one_site() {
    reset();
    ftrace::ftrace_set_filter(&OPS_A, "fx_add", true).unwrap();
    ftrace::ftrace_set_filter(&OPS_B, "fx_add", true).unwrap();
    ftrace::register_ftrace_function(&OPS_A).unwrap();
    let r = ftrace::record(addr(fx_add)).unwrap();
    assert_eq!(r.flags & 0xff, 1);
    assert_ne!(r.flags & FTRACE_FL_DIRECT, 0, "one ops: direct trampoline");
    // call <trampoline>
    assert_eq!(bytes(addr(fx_add))[0], 0xe8);
    ftrace::register_ftrace_function(&OPS_B).unwrap();
    let r = ftrace::record(addr(fx_add)).unwrap();
    assert_eq!(r.flags & 0xff, 2);
    assert_eq!(r.flags & FTRACE_FL_DIRECT, 0, "two ops: list function");
    for _ in 0..10 {
        assert_eq!(call_all(), ALL);
    }
    assert_eq!(
        (
            COUNT_A.load(Ordering::Relaxed),
            COUNT_B.load(Ordering::Relaxed)
        ),
        (10, 10)
    );
    ftrace::unregister_ftrace_function(&OPS_A).unwrap();
    for _ in 0..5 {
        assert_eq!(call_all(), ALL);
    }
    assert_eq!(
        (
            COUNT_A.load(Ordering::Relaxed),
            COUNT_B.load(Ordering::Relaxed)
        ),
        (10, 15)
    );
    assert_ne!(
        ftrace::record(addr(fx_add)).unwrap().flags & FTRACE_FL_DIRECT,
        0
    );
    ftrace::unregister_ftrace_function(&OPS_B).unwrap();
    assert_eq!(call_all(), ALL);
    assert_eq!(
        (
            COUNT_A.load(Ordering::Relaxed),
            COUNT_B.load(Ordering::Relaxed)
        ),
        (10, 15)
    );
    assert_eq!(bytes(addr(fx_add)), NOP5);
    assert_eq!(
        ftrace::record(addr(fx_add)).unwrap().flags & (0xff | FTRACE_FL_ENABLED),
        0
    );
    assert!(matches!(
        ftrace::unregister_ftrace_function(&OPS_B),
        Err(FtraceError::NotRegistered)
    ));
}

fn filter_globs() {
    reset();
    let module = std::env::current_exe()
        .unwrap()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    // fx_* minus fx_mul, minus notrace fx_leaf: fx_add, fx_twice, fx_ret_42.
    ftrace::ftrace_set_filter(&OPS_GLOB, "fx_*", true).unwrap();
    ftrace::ftrace_set_filter(&OPS_GLOB, "!fx_mul", false).unwrap();
    ftrace::ftrace_set_notrace(&OPS_GLOB, "fx_l?af", true).unwrap();
    ftrace::register_ftrace_function(&OPS_GLOB).unwrap();
    assert_eq!(call_all(), ALL);
    assert_eq!(COUNT_GLOB.load(Ordering::Relaxed), 3);
    ftrace::unregister_ftrace_function(&OPS_GLOB).unwrap();

    // :mod: with this executable's name selects; another module's name matches nothing.
    ftrace::ftrace_set_filter(&OPS_GLOB, &format!("fx_[am]*:mod:{module}"), true).unwrap();
    ftrace::ftrace_set_notrace(&OPS_GLOB, "!fx_l?af", true).unwrap();
    let e = ftrace::ftrace_set_filter(&OPS_GLOB, "fx_add:mod:libc", false).unwrap_err();
    assert!(matches!(e, FtraceError::NoMatch(_)), "{e}");
    assert_eq!(e.errno(), libc::EINVAL);
    ftrace::register_ftrace_function(&OPS_GLOB).unwrap();
    // Filters cannot change while registered.
    assert!(matches!(
        ftrace::ftrace_set_filter(&OPS_GLOB, "fx_add", true),
        Err(FtraceError::OpsBusy)
    ));
    reset();
    assert_eq!(call_all(), ALL);
    assert_eq!(COUNT_GLOB.load(Ordering::Relaxed), 2, "fx_add and fx_mul");
    ftrace::unregister_ftrace_function(&OPS_GLOB).unwrap();
}

static REDIRECTS: AtomicU64 = AtomicU64::new(0);
unsafe extern "C" fn redirect_to_42(_ip: u64, _p: u64, _op: &FtraceOps, regs: &mut PtRegs) {
    REDIRECTS.fetch_add(1, Ordering::Relaxed);
    regs.ip = fx_ret_42 as *const () as u64;
}
static OPS_IPMODIFY: FtraceOps = FtraceOps::new(
    redirect_to_42,
    FTRACE_OPS_FL_SAVE_REGS | FTRACE_OPS_FL_IPMODIFY,
);

fn ipmodify_redirect_and_exclusive() {
    reset();
    ftrace::ftrace_set_filter(&OPS_IPMODIFY, "fx_mul", true).unwrap();
    ftrace::register_ftrace_function(&OPS_IPMODIFY).unwrap();
    // The body of fx_mul is skipped: fx_ret_42 runs in its place and returns to our caller.
    // SAFETY: plain C function.
    assert_eq!(unsafe { fx_mul(6, 7) }, 42);
    // SAFETY: plain C function.
    assert_eq!(unsafe { fx_mul(2, 2) }, 42);
    assert_eq!(REDIRECTS.load(Ordering::Relaxed), 2);
    // A second IPMODIFY ops on fx_mul: EBUSY; nothing of it is enabled.
    ftrace::ftrace_set_filter(&OPS_IPM2, "fx_[ma]*", true).unwrap();
    let e = ftrace::register_ftrace_function(&OPS_IPM2).unwrap_err();
    assert!(
        matches!(&e, FtraceError::IpmodifyBusy { func } if func == "fx_mul"),
        "{e}"
    );
    assert_eq!(e.errno(), libc::EBUSY);
    assert_eq!(bytes(addr(fx_add)), NOP5, "the refused ops enabled nothing");
    // SAFETY: plain C function.
    assert_eq!(unsafe { fx_add(1, 1) }, 2);
    assert_eq!(COUNT_IPM2.load(Ordering::Relaxed), 0);
    // IPMODIFY without SAVE_REGS: EINVAL.
    let e = ftrace::register_ftrace_function(&OPS_BADFLAGS).unwrap_err();
    assert!(matches!(e, FtraceError::IpmodifyWithoutRegs));
    ftrace::unregister_ftrace_function(&OPS_IPMODIFY).unwrap();
    // SAFETY: plain C function.
    let r = unsafe { fx_mul(6, 7) };
    assert_eq!(r, 42, "6*7 computed by fx_mul itself again");
    // SAFETY: plain C function.
    assert_eq!(unsafe { fx_mul(2, 3) }, 6);
    // Once the first is gone the second registers.
    ftrace::register_ftrace_function(&OPS_IPM2).unwrap();
    // SAFETY: plain C function.
    let r = unsafe { fx_mul(2, 3) };
    assert_eq!(r, 6, "a counting IPMODIFY ops leaves ip alone");
    assert_eq!(COUNT_IPM2.load(Ordering::Relaxed), 1);
    ftrace::unregister_ftrace_function(&OPS_IPM2).unwrap();
}

unsafe extern "C" fn set_rbp(_ip: u64, _parent: u64, _op: &FtraceOps, regs: &mut PtRegs) {
    regs.rbp = 0x5a5a_1234;
}
static OPS_SET_RBP: FtraceOps =
    FtraceOps::new(set_rbp, FTRACE_OPS_FL_SAVE_REGS | FTRACE_OPS_FL_IPMODIFY);

/// A SAVE_REGS callback's change to `regs.rbp` was lost: the trampoline's `pop %rbp` put
/// back the rbp it had saved, though every register is restored (PtRegs' docs).
fn save_regs_callback_changes_rbp() {
    ftrace::ftrace_set_filter(&OPS_SET_RBP, "fx_rbp_callee", true).unwrap();
    ftrace::register_ftrace_function(&OPS_SET_RBP).unwrap();
    // SAFETY: plain C function; it keeps its own rbp around the call.
    let seen = unsafe { fx_rbp_caller() };
    ftrace::unregister_ftrace_function(&OPS_SET_RBP).unwrap();
    assert_eq!(
        seen, 0x5a5a_1234,
        "the traced function runs with the callback's rbp"
    );
    // SAFETY: as above.
    let again = unsafe { fx_rbp_caller() };
    assert_ne!(again, 0x5a5a_1234, "and without the ops, its own");
}

static SEEN: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];
unsafe extern "C" fn record_regs(ip: u64, parent: u64, _op: &FtraceOps, regs: &mut PtRegs) {
    if ip == fx_mul as *const () as u64 {
        SEEN[0].store(regs.rdi, Ordering::Relaxed);
        SEEN[1].store(regs.rsi, Ordering::Relaxed);
        SEEN[2].store(parent, Ordering::Relaxed);
        SEEN[3].store(regs.ip, Ordering::Relaxed);
    }
}
static OPS_REGS: FtraceOps = FtraceOps::new(record_regs, FTRACE_OPS_FL_SAVE_REGS);
static OPS_ARGS: FtraceOps = FtraceOps::new(record_regs, 0);

#[inline(never)]
fn call_mul_from_here(a: i64, b: i64) -> (i64, u64) {
    // SAFETY: plain C function.
    let r = unsafe { fx_mul(std::hint::black_box(a), std::hint::black_box(b)) };
    (r, call_mul_from_here as *const () as u64)
}

fn regs_args_and_parent() {
    for ops in [&OPS_REGS, &OPS_ARGS] {
        ftrace::ftrace_set_filter(ops, "fx_mul", true).unwrap();
        ftrace::register_ftrace_function(ops).unwrap();
        let (r, me) = call_mul_from_here(11, 13);
        assert_eq!(r, 143);
        assert_eq!(SEEN[0].load(Ordering::Relaxed), 11, "regs.rdi = $arg1");
        assert_eq!(SEEN[1].load(Ordering::Relaxed), 13, "regs.rsi = $arg2");
        let parent = SEEN[2].load(Ordering::Relaxed);
        assert!(
            parent > me && parent < me + 4096,
            "parent_ip {parent:#x} is in our caller {me:#x}"
        );
        assert_eq!(
            SEEN[3].load(Ordering::Relaxed),
            addr(fx_mul) + 5,
            "regs.ip = site + 5"
        );
        ftrace::unregister_ftrace_function(ops).unwrap();
    }
}

static RECURSE_CALLS: AtomicU64 = AtomicU64::new(0);
unsafe extern "C" fn calls_traced(_ip: u64, _p: u64, _op: &FtraceOps, _r: &mut PtRegs) {
    RECURSE_CALLS.fetch_add(1, Ordering::Relaxed);
    // SAFETY: plain C function; it is traced by this very ops.
    unsafe { fx_leaf(1) };
}
static OPS_RECURSE: FtraceOps = FtraceOps::new(calls_traced, FTRACE_OPS_FL_RECURSION);

fn recursion_is_dropped_and_counted() {
    ftrace::ftrace_set_filter(&OPS_RECURSE, "fx_leaf", true).unwrap();
    // Direct trampoline (assist function)...
    ftrace::register_ftrace_function(&OPS_RECURSE).unwrap();
    // SAFETY: plain C function.
    assert_eq!(unsafe { fx_twice(5) }, 13);
    assert_eq!(RECURSE_CALLS.load(Ordering::Relaxed), 2);
    assert_eq!(
        OPS_RECURSE.missed(),
        2,
        "each callback's own fx_leaf call is a recursion"
    );
    // ...and through the list function, with a second ops on the same site: the RECURSION
    // ops is still guarded; OPS_A (no flag) is called for the callback's own fx_leaf call
    // too, as it would be through its direct trampoline.
    reset();
    ftrace::ftrace_set_filter(&OPS_A, "fx_leaf", true).unwrap();
    ftrace::register_ftrace_function(&OPS_A).unwrap();
    // SAFETY: plain C function.
    assert_eq!(unsafe { fx_twice(5) }, 13);
    assert_eq!(RECURSE_CALLS.load(Ordering::Relaxed), 4);
    assert_eq!(OPS_RECURSE.missed(), 4);
    assert_eq!(OPS_A.missed(), 0);
    assert_eq!(
        COUNT_A.load(Ordering::Relaxed),
        4,
        "2 calls + 2 from the other callback"
    );
    ftrace::unregister_ftrace_function(&OPS_A).unwrap();
    ftrace::unregister_ftrace_function(&OPS_RECURSE).unwrap();
}

/// A failed `unregister_ftrace_function` left the ops half-removed: marked unregistered,
/// out of the list function's table, its hash retired, while its sites (the batch had rolled
/// back) still called it through its direct trampoline. Now nothing changes on error.
fn failed_unregistration_leaves_the_ops_registered() {
    reset();
    ftrace::ftrace_set_filter(&OPS_A, "fx_add", true).unwrap();
    ftrace::register_ftrace_function(&OPS_A).unwrap();
    let bytes_before = bytes(addr(fx_add));
    ftprobe::sys::fault::fail_nth("membarrier", 2);
    let e = ftrace::unregister_ftrace_function(&OPS_A).unwrap_err();
    ftprobe::sys::fault::clear();
    assert!(
        matches!(e, FtraceError::Syscall(ref s) if s.call == "membarrier"),
        "{e}"
    );
    assert!(OPS_A.is_registered(), "still registered");
    assert_eq!(bytes(addr(fx_add)), bytes_before, "the site still calls it");
    // SAFETY: plain C function.
    assert_eq!(unsafe { fx_add(2, 3) }, 5);
    assert_eq!(COUNT_A.load(Ordering::Relaxed), 1);
    // With a second ops on the site, the list function must still find the first.
    ftrace::ftrace_set_filter(&OPS_B, "fx_add", true).unwrap();
    ftrace::register_ftrace_function(&OPS_B).unwrap();
    // SAFETY: plain C function.
    assert_eq!(unsafe { fx_add(2, 3) }, 5);
    assert_eq!(COUNT_A.load(Ordering::Relaxed), 2);
    assert_eq!(COUNT_B.load(Ordering::Relaxed), 1);
    ftrace::unregister_ftrace_function(&OPS_B).unwrap();
    // And unregistering works once the fault is gone.
    ftrace::unregister_ftrace_function(&OPS_A).unwrap();
    assert!(!OPS_A.is_registered());
    assert_eq!(bytes(addr(fx_add)), NOP5);
    // SAFETY: plain C function.
    assert_eq!(unsafe { fx_add(2, 3) }, 5);
    assert_eq!(COUNT_A.load(Ordering::Relaxed), 2);
}

fn failed_registration_leaves_sites_as_they_were() {
    reset();
    ftrace::ftrace_set_filter(&OPS_A, "fx_add", true).unwrap();
    ftrace::register_ftrace_function(&OPS_A).unwrap();
    let before: Vec<[u8; 5]> = [
        addr(fx_add),
        addr(fx_mul),
        addr1(fx_leaf),
        addr1(fx_twice),
        addr0(fx_ret_42),
    ]
    .iter()
    .map(|&a| bytes(a))
    .collect();
    let flags_before = ftrace::record(addr(fx_add)).unwrap().flags;
    // The second serialization of the batch fails: after int3 and the tail bytes were written.
    ftrace::ftrace_set_filter(&OPS_FAIL, "fx_*", true).unwrap();
    ftprobe::sys::fault::fail_nth("membarrier", 2);
    let e = ftrace::register_ftrace_function(&OPS_FAIL).unwrap_err();
    ftprobe::sys::fault::clear();
    assert!(
        matches!(e, FtraceError::Syscall(ref s) if s.call == "membarrier"),
        "{e}"
    );
    assert!(!OPS_FAIL.is_registered());
    let after: Vec<[u8; 5]> = [
        addr(fx_add),
        addr(fx_mul),
        addr1(fx_leaf),
        addr1(fx_twice),
        addr0(fx_ret_42),
    ]
    .iter()
    .map(|&a| bytes(a))
    .collect();
    assert_eq!(before, after, "every site holds what it held before");
    assert_eq!(ftrace::record(addr(fx_add)).unwrap().flags, flags_before);
    assert_eq!(call_all(), ALL);
    assert_eq!(COUNT_A.load(Ordering::Relaxed), 1);
    assert_eq!(COUNT_FAIL.load(Ordering::Relaxed), 0);
    // The same registration succeeds once the fault is gone.
    ftrace::register_ftrace_function(&OPS_FAIL).unwrap();
    assert_eq!(call_all(), ALL);
    assert_eq!(
        COUNT_FAIL.load(Ordering::Relaxed),
        6,
        "add, mul, twice, leaf x2, ret_42"
    );
    ftrace::unregister_ftrace_function(&OPS_FAIL).unwrap();
    ftrace::unregister_ftrace_function(&OPS_A).unwrap();
}

fn live_patching_under_threads() {
    // Two threads hammer fx_add while sites flip between NOP and call 200 times: every call
    // returns the right value and every hit of a registered ops is a real call.
    reset();
    ftrace::ftrace_set_filter(&OPS_B, "fx_add", true).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let workers: Vec<_> = (0..2)
        .map(|t| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    // SAFETY: plain C function.
                    assert_eq!(unsafe { fx_add(t, n as i64) }, t + n as i64);
                    n += 1;
                }
                n
            })
        })
        .collect();
    for _ in 0..200 {
        ftrace::register_ftrace_function(&OPS_B).unwrap();
        ftrace::unregister_ftrace_function(&OPS_B).unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let calls: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    assert!(COUNT_B.load(Ordering::Relaxed) <= calls);
    assert_eq!(bytes(addr(fx_add)), NOP5);
}

fn no_allocation_per_hit() {
    ftrace::ftrace_set_filter(&OPS_A, "fx_*", true).unwrap();
    ftrace::ftrace_set_filter(&OPS_B, "fx_add", true).unwrap();
    ftrace::register_ftrace_function(&OPS_A).unwrap();
    ftrace::register_ftrace_function(&OPS_B).unwrap();
    ftrace::ftrace_set_filter(&OPS_RECURSE, "fx_leaf", true).unwrap();
    ftrace::register_ftrace_function(&OPS_RECURSE).unwrap();
    call_all(); // first touch of thread-locals
    let before = common::allocations();
    for _ in 0..1000 {
        call_all();
    }
    assert_eq!(
        common::allocations() - before,
        0,
        "direct, list and assist paths allocate nothing"
    );
    for o in [&OPS_A, &OPS_B, &OPS_RECURSE] {
        ftrace::unregister_ftrace_function(o).unwrap();
    }
}

fn main() {
    // Quick tier only: this binary has no stress case (ftprobe_dev::tier).
    if !ftprobe_dev::tier::quick_tier_requested() {
        return;
    }
    // SAFETY: early in main (reading the arguments starts no thread): no other thread exists yet.
    let skipped = unsafe { ftrace::init() }.expect("ftrace::init");
    assert!(skipped.is_empty(), "{skipped:?}");
    let cases: &[(&str, fn())] = &[
        ("sites_are_canonical_nops", sites_are_canonical_nops),
        (
            "failed_registration_leaves_sites_as_they_were",
            failed_registration_leaves_sites_as_they_were,
        ),
        (
            "failed_unregistration_leaves_the_ops_registered",
            failed_unregistration_leaves_the_ops_registered,
        ),
        ("two_ops_one_site", two_ops_one_site),
        ("filter_globs", filter_globs),
        (
            "ipmodify_redirect_and_exclusive",
            ipmodify_redirect_and_exclusive,
        ),
        ("regs_args_and_parent", regs_args_and_parent),
        (
            "save_regs_callback_changes_rbp",
            save_regs_callback_changes_rbp,
        ),
        (
            "recursion_is_dropped_and_counted",
            recursion_is_dropped_and_counted,
        ),
        ("no_allocation_per_hit", no_allocation_per_hit),
        ("live_patching_under_threads", live_patching_under_threads),
    ];
    for (name, case) in cases {
        print!("test {name} ... ");
        case();
        println!("ok");
    }
    println!("\n{} passed, 0 failed", cases.len());
}
