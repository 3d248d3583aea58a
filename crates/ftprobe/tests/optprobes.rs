//! optprobes in one process: int3 probes replaced by a `jmp` to a detour, on functions
//! written in assembly below (so every offset is exact), checked against the functions' own
//! results and the callers' own counts, and the code bytes themselves (`e9` exactly while
//! `KPROBE_FLAG_OPTIMIZED` is set). `harness = false`: ftrace::init needs a single thread.

use std::arch::global_asm;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use ftprobe::ftrace::{self, PtRegs};
use ftprobe::kprobes::{self, Kprobe, KprobeTarget, KPROBE_FLAG_OPTIMIZED};
use ftprobe_dev::tier::{Selection, Tier};

global_asm!(
    ".text",
    // opt_flags(a, b) = (a < b) signed, computed by `setl` after the probe at +3: the flags
    // of the `cmp` must survive the detour.
    ".globl opt_flags",
    ".type opt_flags,@function",
    "opt_flags:",
    "cmp rdi, rsi",
    "mov rdx, rdi",
    "mov rcx, rsi",
    "mov eax, 0",
    "setl al",
    "ret",
    ".size opt_flags, .-opt_flags",
    // opt_vec(x) = x through the upper half of ymm9 (AVX2), probe at +10.
    ".globl opt_vec",
    ".type opt_vec,@function",
    "opt_vec:",
    "vmovq xmm8, rdi",
    "vpbroadcastq ymm9, xmm8",
    "mov rax, rdi",
    "mov rdx, rsi",
    "vextracti128 xmm10, ymm9, 1",
    "vmovq rax, xmm10",
    "vzeroupper",
    "ret",
    ".size opt_vec, .-opt_vec",
    // opt_zmm(x) = x through the top quarter of zmm20 plus x through k3 (AVX-512F/BW): the
    // registers glibc's EVEX string functions use; the probe at +11 (`mov rax, rdi`).
    ".globl opt_zmm",
    ".type opt_zmm,@function",
    "opt_zmm:",
    "vpbroadcastq zmm20, rdi",
    "kmovq k3, rdi",
    "mov rax, rdi",
    "mov rdx, rsi",
    "vextracti64x2 xmm21, zmm20, 3",
    "vmovq rax, xmm21",
    "kmovq rcx, k3",
    "add rax, rcx",
    "ret",
    ".size opt_zmm, .-opt_zmm",
    // opt_add(x) = x + 1; the stress test's and the interplay tests' function.
    ".globl opt_add",
    ".type opt_add,@function",
    "opt_add:",
    "mov rax, rdi",
    "add rax, 1",
    "mov rdx, rax",
    "ret",
    ".size opt_add, .-opt_add",
    // opt_jin(n): a loop whose back edge lands at +2, inside a probe's range at +0.
    ".globl opt_jin",
    ".type opt_jin,@function",
    "opt_jin:",
    "xor eax, eax",
    "2:",
    "add rax, 1",
    "cmp rax, rdi",
    "jl 2b",
    "ret",
    ".size opt_jin, .-opt_jin",
    // opt_jreg(x) = x + 1 through an indirect jump.
    ".globl opt_jreg",
    ".type opt_jreg,@function",
    "opt_jreg:",
    "mov rax, rdi",
    "lea rdx, [rip + 3f]",
    "jmp rdx",
    "3:",
    "add rax, 1",
    "ret",
    ".size opt_jreg, .-opt_jreg",
    // opt_callmid(f) = f() + 1: at +1 `xor eax, eax; call rdi; add eax, 1`, the call in the
    // middle of a probe's range (its return address, +5, inside it).
    ".globl opt_callmid",
    ".type opt_callmid,@function",
    "opt_callmid:",
    "push rbx",
    "xor eax, eax",
    "call rdi",
    "add eax, 1",
    "pop rbx",
    "ret",
    ".size opt_callmid, .-opt_callmid",
    // opt_calllast(f) = f() + 1: at +1 `mov rax, rdi; call rax`, the call last in the range.
    ".globl opt_calllast",
    ".type opt_calllast,@function",
    "opt_calllast:",
    "push rbx",
    "mov rax, rdi",
    "call rax",
    "add eax, 1",
    "pop rbx",
    "ret",
    ".size opt_calllast, .-opt_calllast",
    // opt_park(p, x) = *(u32 *)p + x: the load at +3 is inside a probe's range at +0.
    ".globl opt_park",
    ".type opt_park,@function",
    "opt_park:",
    "mov rdx, rsi",
    "mov eax, [rdi]",
    "add rax, rdx",
    "ret",
    ".size opt_park, .-opt_park",
);

extern "C" {
    fn opt_flags(a: i64, b: i64) -> i64;
    fn opt_vec(x: u64, y: u64) -> u64;
    fn opt_zmm(x: u64, y: u64) -> u64;
    fn opt_add(x: u64) -> u64;
    fn opt_jin(n: u64) -> u64;
    fn opt_jreg(x: u64) -> u64;
    fn opt_callmid(f: extern "C" fn() -> u32) -> u32;
    fn opt_calllast(f: extern "C" fn() -> u32) -> u32;
    fn opt_park(p: *const u32, x: u64) -> u64;
}

fn sym(name: &str, offset: u64) -> KprobeTarget {
    KprobeTarget::Symbol {
        module: None,
        name: name.to_owned(),
        offset,
    }
}
fn leak(p: Kprobe) -> &'static Kprobe {
    Box::leak(Box::new(p))
}
fn byte(at: u64) -> u8 {
    // SAFETY: an address inside one of the functions above: mapped code.
    unsafe { std::ptr::read_volatile(at as *const u8) }
}
fn code(at: u64, n: usize) -> Vec<u8> {
    (0..n as u64).map(|k| byte(at + k)).collect()
}
fn optimized(p: &Kprobe) -> bool {
    let flag = p.flags() & KPROBE_FLAG_OPTIMIZED != 0;
    assert_eq!(
        flag,
        byte(p.addr()) == 0xe9,
        "KPROBE_FLAG_OPTIMIZED {flag} but the code at {:#x} starts with {:#04x}",
        p.addr(),
        byte(p.addr())
    );
    let listed = kprobes::list()
        .lines()
        .any(|l| l.starts_with(&format!("{:016x}", p.addr())) && l.contains("[OPTIMIZED]"));
    assert_eq!(flag, listed, "kprobes/list:\n{}", kprobes::list());
    flag
}
fn count(p: &Kprobe, _regs: &mut PtRegs) -> i32 {
    p.data.fetch_add(1, Ordering::Relaxed);
    0
}

static SEEN: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];

/// pre_handler for opt_flags: regs.ip, the flags' "less" (SF != OF), then it clobbers the
/// flags and every vector register a Rust handler might, and changes rcx (kept) and ip
/// (ignored).
fn flags_pre(p: &Kprobe, regs: &mut PtRegs) -> i32 {
    p.data.fetch_add(1, Ordering::Relaxed);
    SEEN[0].store(regs.ip, Ordering::Relaxed);
    let sf = regs.flags >> 7 & 1;
    let of = regs.flags >> 11 & 1;
    SEEN[1].store(u64::from(sf != of), Ordering::Relaxed);
    SEEN[2].store(regs.sp, Ordering::Relaxed);
    regs.rcx = 0x1234;
    regs.ip = 0;
    // SAFETY: clobbers flags and xmm registers only, declared.
    unsafe {
        std::arch::asm!(
            "xor eax, eax", "cmp eax, 1", "pxor xmm0, xmm0", "pxor xmm8, xmm8",
            out("eax") _, out("xmm0") _, out("xmm8") _,
        )
    };
    0
}

fn flags_survive_and_regs_come_back() {
    let p = leak(Kprobe::new(sym("opt_flags", 3), Some(flags_pre), None));
    kprobes::register_kprobe(p).unwrap();
    assert!(optimized(p), "{:?}", kprobes::optimization_refused(p));
    let mut n = 0;
    for a in -3i64..=3 {
        for b in -3i64..=3 {
            // SAFETY: the assembly function above.
            let r = unsafe { opt_flags(a, b) };
            n += 1;
            assert_eq!(r, i64::from(a < b), "opt_flags({a}, {b})");
            assert_eq!(
                SEEN[1].load(Ordering::Relaxed),
                u64::from(a < b),
                "regs.flags"
            );
            assert_eq!(SEEN[0].load(Ordering::Relaxed), p.addr() + 1, "regs.ip");
        }
    }
    assert_eq!(p.data.load(Ordering::Relaxed), n);
    kprobes::unregister_kprobe(p).unwrap();
}

/// A handler that destroys ymm9 (and the upper halves of all: vzeroupper).
fn vec_pre(p: &Kprobe, _regs: &mut PtRegs) -> i32 {
    p.data.fetch_add(1, Ordering::Relaxed);
    // SAFETY: AVX2 checked by the caller; clobbers declared.
    unsafe {
        std::arch::asm!("vpcmpeqd ymm9, ymm9, ymm9", "vzeroupper", out("ymm9") _);
    }
    0
}

/// A handler that destroys zmm20 and k3 (as glibc's EVEX memcpy/strlen would).
fn zmm_pre(p: &Kprobe, _regs: &mut PtRegs) -> i32 {
    p.data.fetch_add(1, Ordering::Relaxed);
    // SAFETY: AVX-512F/BW checked by the caller; clobbers declared.
    unsafe {
        std::arch::asm!(
            "vpternlogd zmm20, zmm20, zmm20, 0xff",
            "kxnorq k3, k3, k3",
            out("zmm20") _,
            out("k3") _
        );
    }
    0
}

/// With AVX-512 the trampoline keeps zmm16-31 and the mask registers too.
fn avx512_registers_survive() {
    if !(std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw"))
    {
        println!("  skipped: no AVX-512F/BW");
        return;
    }
    let p = leak(Kprobe::new(sym("opt_zmm", 11), Some(zmm_pre), None));
    kprobes::register_kprobe(p).unwrap();
    assert!(optimized(p), "{:?}", kprobes::optimization_refused(p));
    for x in [1u64, 0xdead_beef, 1 << 40] {
        // SAFETY: the assembly function above; AVX-512F/BW present.
        let got = unsafe { opt_zmm(x, 0) };
        assert_eq!(got, 2 * x, "zmm20's top quarter and k3");
    }
    assert_eq!(p.data.load(Ordering::Relaxed), 3);
    kprobes::unregister_kprobe(p).unwrap();
}

fn vector_registers_survive() {
    if !std::arch::is_x86_feature_detected!("avx2") {
        println!("  skipped: no AVX2");
        return;
    }
    let p = leak(Kprobe::new(sym("opt_vec", 10), Some(vec_pre), None));
    kprobes::register_kprobe(p).unwrap();
    assert!(optimized(p), "{:?}", kprobes::optimization_refused(p));
    for x in [1u64, 0xdead_beef, u64::MAX] {
        // SAFETY: the assembly function above; AVX2 present.
        assert_eq!(unsafe { opt_vec(x, 0) }, x, "ymm9's upper half");
    }
    assert_eq!(p.data.load(Ordering::Relaxed), 3);
    kprobes::unregister_kprobe(p).unwrap();
}

/// Every refusal case stays an int3 probe, with the reason, and counts exactly.
fn refusals_stay_int3() {
    let before = code(opt_jin as *const () as u64, 16);
    let p = leak(Kprobe::new(sym("opt_jin", 0), Some(count), None));
    kprobes::register_kprobe(p).unwrap();
    assert!(!optimized(p));
    let why = kprobes::optimization_refused(p).unwrap();
    assert!(why.contains("jumps into"), "{why}");
    // SAFETY: the assembly functions above.
    assert_eq!(unsafe { opt_jin(10) }, 10);
    assert_eq!(p.data.load(Ordering::Relaxed), 1);
    kprobes::unregister_kprobe(p).unwrap();
    assert_eq!(code(opt_jin as *const () as u64, 16), before);

    let p = leak(Kprobe::new(sym("opt_jreg", 0), Some(count), None));
    kprobes::register_kprobe(p).unwrap();
    assert!(!optimized(p));
    let why = kprobes::optimization_refused(p).unwrap();
    assert!(why.contains("indirect jump"), "{why}");
    for x in 0..5 {
        // SAFETY: as above.
        assert_eq!(unsafe { opt_jreg(x) }, x + 1);
    }
    assert_eq!(p.data.load(Ordering::Relaxed), 5);
    kprobes::unregister_kprobe(p).unwrap();
}

static GATE: AtomicBool = AtomicBool::new(false);
static IN_CALLEE: AtomicBool = AtomicBool::new(false);
extern "C" fn blocking_callee() -> u32 {
    IN_CALLEE.store(true, Ordering::SeqCst);
    while !GATE.load(Ordering::SeqCst) {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    41
}

/// A call in the middle of the range (its return address inside): never optimized, and a
/// thread whose callee runs through the probe's arming returns correctly. A call at the
/// end of the range: optimized while a callee runs under it.
fn calls_in_the_range() {
    for (name, f, optimizable) in [
        (
            "opt_callmid",
            opt_callmid as unsafe extern "C" fn(_) -> _,
            false,
        ),
        ("opt_calllast", opt_calllast, true),
    ] {
        GATE.store(false, Ordering::SeqCst);
        IN_CALLEE.store(false, Ordering::SeqCst);
        // SAFETY: the assembly function above with a plain callee.
        let t = std::thread::spawn(move || unsafe { f(blocking_callee) });
        while !IN_CALLEE.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        let p = leak(Kprobe::new(sym(name, 1), Some(count), None));
        kprobes::register_kprobe(p).unwrap();
        assert_eq!(
            optimized(p),
            optimizable,
            "{name}: {:?}",
            kprobes::optimization_refused(p)
        );
        GATE.store(true, Ordering::SeqCst);
        assert_eq!(
            t.join().unwrap(),
            42,
            "{name}: the blocked call returned right"
        );
        // SAFETY: as above.
        assert_eq!(unsafe { f(blocking_callee) }, 42);
        assert_eq!(
            p.data.load(Ordering::Relaxed),
            1,
            "{name}: one hit after arming"
        );
        kprobes::unregister_kprobe(p).unwrap();
    }
}

static PARKED: AtomicBool = AtomicBool::new(false);
static RELEASE: AtomicBool = AtomicBool::new(false);
static PARK_PAGE: AtomicUsize = AtomicUsize::new(0);

extern "C" fn park_handler(_sig: i32, _info: *mut libc::siginfo_t, _uc: *mut libc::c_void) {
    PARKED.store(true, Ordering::SeqCst);
    while !RELEASE.load(Ordering::SeqCst) {
        // SAFETY: nanosleep is async-signal-safe.
        unsafe {
            libc::usleep(1000);
        }
    }
    // SAFETY: the page this test mapped; mprotect is async-signal-safe.
    unsafe {
        libc::mprotect(
            PARK_PAGE.load(Ordering::SeqCst) as *mut libc::c_void,
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
        )
    };
}

/// A thread stopped inside the range (a signal handler interrupted its second instruction
/// and waits): the probe stays int3 ("a thread was inside"); once the thread is out, turning
/// optimization on again optimizes it.
fn a_thread_parked_in_the_range_keeps_the_int3() {
    // SAFETY: a fresh anonymous page, PROT_NONE; a SIGSEGV action of the test's own.
    let page = unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = park_handler as *const () as usize;
        act.sa_flags = libc::SA_SIGINFO;
        assert_eq!(
            libc::sigaction(libc::SIGSEGV, &act, std::ptr::null_mut()),
            0
        );
        p as usize
    };
    PARK_PAGE.store(page, Ordering::SeqCst);
    // SAFETY: the assembly function; the load faults, the handler makes it readable.
    let t = std::thread::spawn(move || unsafe { opt_park(page as *const u32, 5) });
    while !PARKED.load(Ordering::SeqCst) {
        std::thread::yield_now();
    }
    let p = leak(Kprobe::new(sym("opt_park", 0), Some(count), None));
    kprobes::register_kprobe(p).unwrap();
    assert!(
        !optimized(p),
        "optimized while a thread is stopped in the range"
    );
    let why = kprobes::optimization_refused(p).unwrap();
    assert!(why.contains("thread"), "{why}");
    RELEASE.store(true, Ordering::SeqCst);
    assert_eq!(
        t.join().unwrap(),
        5,
        "the parked thread went on at its instruction"
    );
    kprobes::set_optimization(true).unwrap();
    assert!(optimized(p), "{:?}", kprobes::optimization_refused(p));
    // SAFETY: the page is readable now (and zero).
    assert_eq!(unsafe { opt_park(page as *const u32, 7) }, 7);
    assert_eq!(p.data.load(Ordering::Relaxed), 1);
    kprobes::unregister_kprobe(p).unwrap();
    // SAFETY: the default action back.
    unsafe { libc::signal(libc::SIGSEGV, libc::SIG_DFL) };
}

fn count_post(p: &Kprobe, _regs: &mut PtRegs, _f: u64) {
    p.data.fetch_add(1 << 32, Ordering::Relaxed);
}

/// A post_handler (needs the single step) and a probe inside the range unoptimize; their
/// removal optimizes again; every hit counted; the original bytes back at the end.
fn other_probes_unoptimize_and_reoptimize() {
    let f = opt_add as *const () as u64;
    let orig = code(f, 12);
    let call = |n: u64| {
        for x in 0..n {
            // SAFETY: the assembly function above.
            assert_eq!(unsafe { opt_add(x) }, x + 1);
        }
    };
    let a = leak(Kprobe::new(sym("opt_add", 0), Some(count), None));
    kprobes::register_kprobe(a).unwrap();
    assert!(optimized(a));
    call(3);
    let b = leak(Kprobe::new(
        sym("opt_add", 0),
        Some(count),
        Some(count_post),
    ));
    kprobes::register_kprobe(b).unwrap();
    assert!(
        !optimized(a) && !optimized(b),
        "a post_handler keeps the int3"
    );
    call(3);
    kprobes::unregister_kprobe(b).unwrap();
    assert!(optimized(a));
    assert_eq!(b.data.load(Ordering::Relaxed), 3 | 3 << 32);
    let c = leak(Kprobe::new(sym("opt_add", 3), Some(count), None));
    kprobes::register_kprobe(c).unwrap();
    assert!(!optimized(a), "a probe inside the range unoptimizes it");
    call(3);
    kprobes::unregister_kprobe(c).unwrap();
    assert!(optimized(a), "and its removal optimizes it again");
    call(3);
    assert_eq!(a.data.load(Ordering::Relaxed), 12);
    assert_eq!(c.data.load(Ordering::Relaxed), 3);
    kprobes::disable_kprobe(a).unwrap();
    assert!(!optimized(a));
    call(1);
    kprobes::enable_kprobe(a).unwrap();
    assert!(optimized(a));
    kprobes::unregister_kprobe(a).unwrap();
    assert_eq!(a.data.load(Ordering::Relaxed), 12);
    assert_eq!(code(f, 12), orig, "the original bytes back");
}

/// `switches` switches between optimized and int3 while 8 threads call the probed function:
/// every call counted once, no crash. How often a switch may optimize depends on where the
/// scheduler left the threads (one inside the replaced bytes, or on CPU too long to tell,
/// refuses it), so the counts say only that it did, at `min_on` tries or more; once the
/// threads are gone it must.
fn switches_under_eight_threads(switches: u32, min_on: u32) {
    let p = leak(Kprobe::new(sym("opt_add", 0), Some(count), None));
    kprobes::register_kprobe(p).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    // SAFETY: the assembly function above.
                    let r = unsafe { opt_add(n) };
                    assert_eq!(r, n + 1);
                    n += 1;
                }
                n
            })
        })
        .collect();
    let mut switched_on = 0;
    for i in 0..switches {
        let on = i % 2 == 0;
        kprobes::set_optimization(on).unwrap();
        let is = optimized(p);
        assert!(on || !is, "optimization off leaves the int3");
        if on && is {
            switched_on += 1;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let calls: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    let tries = switches / 2;
    println!("  {calls} calls, optimized in {switched_on} of {tries} tries");
    // With no thread left to be inside the range, optimization always succeeds.
    kprobes::set_optimization(false).unwrap();
    kprobes::set_optimization(true).unwrap();
    assert!(optimized(p), "optimized with no other thread running");
    kprobes::unregister_kprobe(p).unwrap();
    assert_eq!(
        p.data.load(Ordering::Relaxed),
        calls,
        "every call counted once"
    );
    assert!(
        switched_on >= min_on,
        "optimized in only {switched_on} of {tries} tries"
    );
}

/// The quick tier's run: 200 switches.
fn two_hundred_switches_under_eight_threads() {
    switches_under_eight_threads(200, 1);
}

/// The stress tier's run (`--ignored`): 10 000 switches (~4 minutes here).
fn ten_thousand_switches_under_eight_threads() {
    switches_under_eight_threads(10_000, 500);
}

fn main() {
    // SAFETY: early in main (reading the arguments starts no thread): single-threaded.
    unsafe { ftrace::init() }.expect("ftrace::init");
    kprobes::set_optimization(true).unwrap();
    let cases: &[(&str, fn())] = &[
        (
            "flags_survive_and_regs_come_back",
            flags_survive_and_regs_come_back,
        ),
        ("vector_registers_survive", vector_registers_survive),
        ("avx512_registers_survive", avx512_registers_survive),
        ("refusals_stay_int3", refusals_stay_int3),
        ("calls_in_the_range", calls_in_the_range),
        (
            "a_thread_parked_in_the_range_keeps_the_int3",
            a_thread_parked_in_the_range_keeps_the_int3,
        ),
        (
            "other_probes_unoptimize_and_reoptimize",
            other_probes_unoptimize_and_reoptimize,
        ),
        (
            "two_hundred_switches_under_eight_threads",
            two_hundred_switches_under_eight_threads,
        ),
    ];
    let stress: &[(&str, fn())] = &[(
        "ten_thousand_switches_under_eight_threads",
        ten_thousand_switches_under_eight_threads,
    )];
    let sel = Selection::from_args();
    let tiers =
        (cases.iter().map(|c| (c, Tier::Quick))).chain(stress.iter().map(|c| (c, Tier::Stress)));
    let mut failed = 0;
    for ((name, f), tier) in tiers {
        if !sel.runs(name, tier) {
            continue;
        }
        println!("test {name} ...");
        if std::panic::catch_unwind(f).is_err() {
            println!("test {name} ... FAILED");
            failed += 1;
        } else {
            println!("test {name} ... ok");
        }
    }
    println!("\n{} failed", failed);
    if failed != 0 {
        std::process::exit(1);
    }
}
