//! int3 kprobes on calls and jumps through memory (issue 14 item 3), on assembly functions
//! linked into this test (ftprobe-dev's `c/indirect_zoo.c`): the pre_handler sees
//! `regs.ip = addr + 1`, the post_handler the registers after the emulated instruction (the
//! target in `ip`, the return address pushed for a call), a hit from inside a handler counts
//! `nmissed` and still runs the instruction, as for the other emulated instructions.
//! `harness = false`: ftrace::init needs a single thread.

use std::sync::atomic::{AtomicU64, Ordering};

use ftprobe::ftrace::{self, PtRegs};
use ftprobe::kprobes::{self, Kprobe, KprobeTarget};
use ftprobe_dev::fxsites::izoo::*;

fn sym(name: &str, offset: u64) -> KprobeTarget {
    KprobeTarget::Symbol {
        module: None,
        name: name.to_owned(),
        offset,
    }
}
fn leak<T>(v: T) -> &'static T {
    Box::leak(Box::new(v))
}

/// What the handlers saw at their last call: pre ip, pre sp, post ip, post sp, the word at
/// post sp.
static SEEN: [AtomicU64; 5] = [const { AtomicU64::new(0) }; 5];
static PRE: AtomicU64 = AtomicU64::new(0);
static POST: AtomicU64 = AtomicU64::new(0);
fn reset() {
    PRE.store(0, Ordering::Relaxed);
    POST.store(0, Ordering::Relaxed);
}

fn pre(_p: &Kprobe, regs: &mut PtRegs) -> i32 {
    PRE.fetch_add(1, Ordering::Relaxed);
    SEEN[0].store(regs.ip, Ordering::Relaxed);
    SEEN[1].store(regs.sp, Ordering::Relaxed);
    0
}
fn post(_p: &Kprobe, regs: &mut PtRegs, _flags: u64) {
    POST.fetch_add(1, Ordering::Relaxed);
    SEEN[2].store(regs.ip, Ordering::Relaxed);
    SEEN[3].store(regs.sp, Ordering::Relaxed);
    // SAFETY: the stack of the thread the probe interrupted (this one), at its sp.
    SEEN[4].store(
        unsafe { std::ptr::read_volatile(regs.sp as *const u64) },
        Ordering::Relaxed,
    );
}
fn seen(i: usize) -> u64 {
    SEEN[i].load(Ordering::Relaxed)
}

static AREA_CALLS: AtomicU64 = AtomicU64::new(0);
extern "C" fn area(_obj: *const *const usize) -> i64 {
    AREA_CALLS.fetch_add(1, Ordering::Relaxed);
    42
}
extern "C" fn perimeter(_obj: *const *const usize) -> i64 {
    17
}
extern "C" fn plus7(x: i64) -> i64 {
    x + 7
}
static DECOY_CALLS: AtomicU64 = AtomicU64::new(0);
extern "C" fn decoy(x: i64) -> i64 {
    DECOY_CALLS.fetch_add(1, Ordering::Relaxed);
    -x
}

/// Two "classes": vtables with `area` or `perimeter` in slot 0, and one object of each.
fn objects() -> [(&'static *const usize, u64, i64); 2] {
    let vt_a: &'static [usize; 2] =
        leak([area as *const () as usize, perimeter as *const () as usize]);
    let vt_p: &'static [usize; 2] =
        leak([perimeter as *const () as usize, area as *const () as usize]);
    [
        (leak(vt_a.as_ptr()), area as *const () as u64, 42),
        (leak(vt_p.as_ptr()), perimeter as *const () as u64, 17),
    ]
}

fn virtual_call_with_pre_and_post_handlers() {
    let func = izoo_callv as *const () as u64;
    let p = leak(Kprobe::new(sym("izoo_callv", 7), Some(pre), Some(post)));
    kprobes::register_kprobe(p).unwrap();
    assert_eq!(p.addr(), func + 7);
    reset();
    for (i, (obj, callee, want)) in objects().into_iter().cycle().take(6).enumerate() {
        // SAFETY: obj points to a vtable whose slot 0 is an `extern "C" fn(obj) -> i64`.
        let got = unsafe { izoo_callv(obj) };
        assert_eq!(got, want, "call {i}");
        assert_eq!(seen(0), func + 8, "pre: ip = addr + 1");
        assert_eq!(
            seen(2),
            callee,
            "post: ip = the callee read from the vtable"
        );
        assert_eq!(seen(3), seen(1) - 8, "post: the return address pushed");
        assert_eq!(seen(4), func + 9, "post: the return address is addr + len");
    }
    assert_eq!(
        (PRE.load(Ordering::Relaxed), POST.load(Ordering::Relaxed)),
        (6, 6)
    );
    assert_eq!(p.nmissed(), 0);
    kprobes::unregister_kprobe(p).unwrap();
    let (obj, _, want) = objects()[0];
    // SAFETY: as above.
    assert_eq!(unsafe { izoo_callv(obj) }, want, "after unregister");
}

/// The object a re-entering pre_handler calls through, and what its calls returned.
static INNER_OBJ: AtomicU64 = AtomicU64::new(0);
static INNER_SUM: AtomicU64 = AtomicU64::new(0);
fn pre_calls_probed(_p: &Kprobe, _regs: &mut PtRegs) -> i32 {
    PRE.fetch_add(1, Ordering::Relaxed);
    let obj = INNER_OBJ.load(Ordering::Relaxed) as *const *const usize;
    // SAFETY: an object of `objects()`, as in the test below.
    let r = unsafe { izoo_callv(obj) };
    INNER_SUM.fetch_add(r as u64, Ordering::Relaxed);
    0
}

fn a_hit_from_a_handler_is_missed_and_still_calls() {
    let p = leak(Kprobe::new(
        sym("izoo_callv", 7),
        Some(pre_calls_probed),
        Some(post),
    ));
    kprobes::register_kprobe(p).unwrap();
    let [(a, _, 42), (b, _, 17)] = objects() else {
        unreachable!()
    };
    INNER_OBJ.store(b as *const _ as u64, Ordering::Relaxed);
    reset();
    AREA_CALLS.store(0, Ordering::Relaxed);
    for _ in 0..4 {
        // SAFETY: as above.
        assert_eq!(unsafe { izoo_callv(a) }, 42);
    }
    assert_eq!(PRE.load(Ordering::Relaxed), 4, "the program's calls only");
    assert_eq!(POST.load(Ordering::Relaxed), 4);
    assert_eq!(p.nmissed(), 4, "the handler's own call, once per hit");
    assert_eq!(
        INNER_SUM.load(Ordering::Relaxed),
        4 * 17,
        "the missed calls ran"
    );
    assert_eq!(AREA_CALLS.load(Ordering::Relaxed), 4);
    kprobes::unregister_kprobe(p).unwrap();
}

fn rsp_based_operand_is_read_before_the_push() {
    let func = izoo_callsp as *const () as u64;
    let p = leak(Kprobe::new(sym("izoo_callsp", 21), Some(pre), Some(post)));
    kprobes::register_kprobe(p).unwrap();
    reset();
    for x in 0..5 {
        // SAFETY: an assembly function of the zoo calling `plus7`.
        assert_eq!(unsafe { izoo_callsp(plus7, x, decoy) }, x + 7);
        assert_eq!(
            seen(2),
            plus7 as *const () as u64,
            "post: ip = the operand at the old rsp + 0x18"
        );
        assert_eq!(seen(4), func + 25);
    }
    assert_eq!(DECOY_CALLS.load(Ordering::Relaxed), 0);
    assert_eq!(
        (PRE.load(Ordering::Relaxed), POST.load(Ordering::Relaxed)),
        (5, 5)
    );
    kprobes::unregister_kprobe(p).unwrap();
}

fn jump_table_with_pre_and_post_handlers() {
    let func = izoo_jtab as *const () as u64;
    let p = leak(Kprobe::new(sym("izoo_jtab", 10), Some(pre), Some(post)));
    kprobes::register_kprobe(p).unwrap();
    reset();
    for i in [0, 1, 2, 2, 0] {
        // SAFETY: an assembly function of the zoo, i in 0..3.
        assert_eq!(unsafe { izoo_jtab(i) }, 100 * (i + 1));
        // The cases are `mov $imm32,%eax; ret` (6 bytes each) right after the 3-byte jmp.
        assert_eq!(seen(2), func + 13 + 6 * i as u64, "post: ip = table[{i}]");
        assert_eq!(seen(3), seen(1), "a jmp pushes nothing");
    }
    assert_eq!(
        (PRE.load(Ordering::Relaxed), POST.load(Ordering::Relaxed)),
        (5, 5)
    );
    kprobes::unregister_kprobe(p).unwrap();
}

fn main() {
    // Quick tier only: this binary has no stress case (ftprobe_dev::tier).
    if !ftprobe_dev::tier::quick_tier_requested() {
        return;
    }
    // SAFETY: early in main (reading the arguments starts no thread): single-threaded.
    unsafe { ftrace::init() }.expect("ftrace::init");
    let cases: &[(&str, fn())] = &[
        (
            "virtual_call_with_pre_and_post_handlers",
            virtual_call_with_pre_and_post_handlers,
        ),
        (
            "a_hit_from_a_handler_is_missed_and_still_calls",
            a_hit_from_a_handler_is_missed_and_still_calls,
        ),
        (
            "rsp_based_operand_is_read_before_the_push",
            rsp_based_operand_is_read_before_the_push,
        ),
        (
            "jump_table_with_pre_and_post_handlers",
            jump_table_with_pre_and_post_handlers,
        ),
    ];
    for (name, case) in cases {
        print!("test {name} ... ");
        case();
        println!("ok");
    }
    println!("\n{} passed, 0 failed", cases.len());
}
