//! kprobes on ftrace sites, on real functions linked into this test (ftprobe-dev's fxsites):
//! patchable entries (`fx_*`), `endbr64` + patchable entry (`fx_cet_*`), and `-pg` with mcount
//! after the prologue (`fx_pg_*`). `harness = false`: ftrace::init needs a single thread.

use std::sync::atomic::{AtomicU64, Ordering};

use ftprobe::arch::x86_64::nops::NOP5;
use ftprobe::ftrace::{self, FtraceOps, PtRegs};
use ftprobe::kprobes::{
    self, Kprobe, KprobeError, KprobeTarget, KPROBE_FLAG_DISABLED, KPROBE_FLAG_FTRACE,
};
use ftprobe_dev::fxsites::*;

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
fn bytes(at: u64) -> [u8; 5] {
    // SAFETY: the entry of one of our own functions: 5 mapped bytes.
    unsafe { std::ptr::read_volatile(at as *const [u8; 5]) }
}
fn fn_addr(f: unsafe extern "C" fn(i64, i64) -> i64) -> u64 {
    f as *const () as u64
}

/// pre_handler: counts in `data` (low 32 bits) and remembers regs.ip, rdi, rsi.
static LAST: [AtomicU64; 3] = [const { AtomicU64::new(0) }; 3];
fn count_pre(p: &Kprobe, regs: &mut PtRegs) -> i32 {
    p.data.fetch_add(1, Ordering::Relaxed);
    LAST[0].store(regs.ip, Ordering::Relaxed);
    LAST[1].store(regs.rdi, Ordering::Relaxed);
    LAST[2].store(regs.rsi, Ordering::Relaxed);
    0
}
static POST_IP: AtomicU64 = AtomicU64::new(0);
fn count_post(p: &Kprobe, regs: &mut PtRegs, _flags: u64) {
    p.data.fetch_add(1 << 32, Ordering::Relaxed);
    POST_IP.store(regs.ip, Ordering::Relaxed);
}
fn hits(p: &Kprobe) -> (u64, u64) {
    let d = p.data.load(Ordering::Relaxed);
    (d & 0xffff_ffff, d >> 32)
}

fn probe_on_a_site_sees_args_and_addr_plus_one() {
    let p = leak(Kprobe::new(sym("fx_add", 0), Some(count_pre), None));
    kprobes::register_kprobe(p).unwrap();
    assert_eq!(p.addr(), fn_addr(fx_add));
    assert_ne!(p.flags() & KPROBE_FLAG_FTRACE, 0);
    for i in 0..5 {
        // SAFETY: plain C function.
        let r = unsafe { fx_add(i, 100) };
        assert_eq!(r, i + 100, "the function still runs");
    }
    assert_eq!(hits(p), (5, 0));
    assert_eq!(
        LAST[0].load(Ordering::Relaxed),
        p.addr() + 1,
        "regs.ip = addr + 1 in pre_handler"
    );
    assert_eq!(
        (
            LAST[1].load(Ordering::Relaxed),
            LAST[2].load(Ordering::Relaxed)
        ),
        (4, 100)
    );
    let list = kprobes::list();
    let line = list.lines().find(|l| l.contains("fx_add+0x0")).unwrap();
    assert!(
        line.starts_with(&format!("{:016x}  k  fx_add+0x0  kprobes-", p.addr())),
        "{line}"
    );
    assert!(line.ends_with(" [FTRACE]"), "{line}");
    kprobes::unregister_kprobe(p).unwrap();
    assert_eq!(bytes(p.addr()), NOP5, "site back to NOP");
    // SAFETY: plain C function.
    unsafe { fx_add(1, 1) };
    assert_eq!(hits(p), (5, 0));
    assert!(matches!(
        kprobes::unregister_kprobe(p),
        Err(KprobeError::NotRegistered)
    ));
}

fn post_handler_sees_addr_plus_site_len() {
    let p = leak(Kprobe::new(
        sym("fx_mul", 0),
        Some(count_pre),
        Some(count_post),
    ));
    kprobes::register_kprobe(p).unwrap();
    // SAFETY: plain C function.
    assert_eq!(unsafe { fx_mul(6, 7) }, 42);
    assert_eq!(hits(p), (1, 1));
    assert_eq!(
        POST_IP.load(Ordering::Relaxed),
        p.addr() + 5,
        "regs.ip = addr + 5 in post_handler"
    );
    let rec = ftrace::record(p.addr()).unwrap();
    assert_ne!(
        rec.flags & ftrace::FTRACE_FL_IPMODIFY,
        0,
        "probes with a post_handler use the IPMODIFY ops"
    );
    kprobes::unregister_kprobe(p).unwrap();
}

fn redirect(_p: &Kprobe, regs: &mut PtRegs) -> i32 {
    regs.ip = fx_ret_42 as *const () as u64;
    1
}

fn pre_handler_that_changes_ip_skips_the_body() {
    let p = leak(Kprobe::new(
        sym("fx_mul", 0),
        Some(redirect),
        Some(count_post),
    ));
    kprobes::register_kprobe(p).unwrap();
    // SAFETY: plain C function.
    let r = unsafe { fx_mul(2, 3) };
    assert_eq!(r, 42, "fx_ret_42 ran instead of fx_mul's body");
    assert_eq!(hits(p).1, 0, "no post_handler after a non-zero pre_handler");
    kprobes::unregister_kprobe(p).unwrap();
    // SAFETY: plain C function.
    assert_eq!(unsafe { fx_mul(2, 3) }, 6);
}

fn endbr_func_plus_0_and_plus_4_are_the_site() {
    let base = fn_addr(fx_cet_add);
    // endbr64
    assert_eq!(bytes(base)[..4], [0xf3, 0x0f, 0x1e, 0xfa]);
    let p0 = leak(Kprobe::new(sym("fx_cet_add", 0), Some(count_pre), None));
    let p4 = leak(Kprobe::new(sym("fx_cet_add", 4), Some(count_pre), None));
    kprobes::register_kprobe(p0).unwrap();
    kprobes::register_kprobe(p4).unwrap();
    assert_eq!((p0.addr(), p4.addr()), (base + 4, base + 4));
    // SAFETY: plain C function.
    assert_eq!(unsafe { fx_cet_add(2, 2) }, 4);
    assert_eq!((hits(p0).0, hits(p4).0), (1, 1), "one aggregate, both run");
    assert_eq!(LAST[0].load(Ordering::Relaxed), base + 5);
    // Inside the site: func+5..func+8.
    for off in 5..9 {
        let e = kprobes::register_kprobe(leak(Kprobe::new(
            sym("fx_cet_add", off),
            Some(count_pre),
            None,
        )))
        .unwrap_err();
        assert!(matches!(e, KprobeError::NotInsnBoundary), "+{off}: {e}");
        assert_eq!(e.to_string(), "Probe point is not an instruction boundary");
        assert_eq!(e.errno(), libc::EILSEQ);
    }
    kprobes::unregister_kprobe(p0).unwrap();
    kprobes::unregister_kprobe(p4).unwrap();
}

fn inside_a_site_is_refused() {
    for off in 1..5 {
        let e =
            kprobes::register_kprobe(leak(Kprobe::new(sym("fx_add", off), Some(count_pre), None)))
                .unwrap_err();
        assert!(
            matches!(e, KprobeError::NotInsnBoundary),
            "fx_add+{off}: {e}"
        );
    }
    assert_eq!(bytes(fn_addr(fx_add)), NOP5, "nothing armed");
}

/// The engine linked into this program (as the C API's `libftprobe.a` is): its own functions
/// are refused (a probe there traps inside the probe path: a crash, found through the C API),
/// by their Rust names; the program's functions in the same object are not.
fn the_engine_own_code_is_refused_where_it_is_linked() {
    let own: fn() -> String = kprobes::list;
    let at = own as *const () as u64;
    let e = kprobes::register_kprobe(leak(Kprobe::new(
        KprobeTarget::Addr(at),
        Some(count_pre),
        None,
    )))
    .unwrap_err();
    assert!(matches!(e, KprobeError::Blacklisted(_)), "{e}");
    assert!(e.to_string().contains("ftprobe::kprobes::list+0x0"), "{e}");
    let p = leak(Kprobe::new(sym("fx_pg_add", 0), Some(count_pre), None));
    kprobes::register_kprobe(p).unwrap();
    kprobes::unregister_kprobe(p).unwrap();
}

fn pg_func_plus_0_is_an_int3_probe_and_plus_4_the_site() {
    let base = fn_addr(fx_pg_add);
    // push %rbp; mov %rsp,%rbp
    assert_eq!(bytes(base)[..4], [0x55, 0x48, 0x89, 0xe5]);
    let p0 = leak(Kprobe::new(
        sym("fx_pg_add", 0),
        Some(count_pre),
        Some(count_post),
    ));
    kprobes::register_kprobe(p0).unwrap();
    assert_eq!(
        p0.flags() & KPROBE_FLAG_FTRACE,
        0,
        "func+0 of a -pg function is no site"
    );
    assert_eq!(bytes(base)[0], 0xcc, "int3 armed");
    // SAFETY: plain C function.
    assert_eq!(unsafe { fx_pg_add(20, 22) }, 42);
    assert_eq!(hits(p0), (1, 1));
    assert_eq!(
        LAST[0].load(Ordering::Relaxed),
        base + 1,
        "regs.ip = addr + 1 after int3"
    );
    assert_eq!(
        POST_IP.load(Ordering::Relaxed),
        base + 1,
        "post: after the 1-byte push"
    );
    assert!(kprobes::list()
        .lines()
        .any(|l| l.contains("fx_pg_add+0x0") && !l.contains("[FTRACE]")));
    kprobes::unregister_kprobe(p0).unwrap();
    assert_eq!(
        bytes(base)[..4],
        [0x55, 0x48, 0x89, 0xe5],
        "original byte back"
    );
    let p = leak(Kprobe::new(
        sym("fx_pg_add", 4),
        Some(count_pre),
        Some(count_post),
    ));
    kprobes::register_kprobe(p).unwrap();
    assert_ne!(p.flags() & KPROBE_FLAG_FTRACE, 0);
    // SAFETY: plain C function.
    assert_eq!(unsafe { fx_pg_add(20, 22) }, 42);
    assert_eq!(hits(p), (1, 1));
    assert_eq!(LAST[0].load(Ordering::Relaxed), base + 5);
    assert_eq!(
        (
            LAST[1].load(Ordering::Relaxed),
            LAST[2].load(Ordering::Relaxed)
        ),
        (20, 22)
    );
    assert_eq!(POST_IP.load(Ordering::Relaxed), base + 9);
    kprobes::unregister_kprobe(p).unwrap();
}

/// The kernel's insn_boundary idea: a probe on every instruction boundary of a function in
/// turn (int3 everywhere but the site), with pre and post handlers; the function's results
/// and the exact hit counts.
fn run_twice() -> i64 {
    // SAFETY: plain C function.
    unsafe { fx_twice(5) }
}
fn run_pg_mul() -> i64 {
    // SAFETY: plain C function.
    unsafe { fx_pg_mul(6, 7) }
}
fn run_cet_mul() -> i64 {
    // SAFETY: plain C function.
    unsafe { fx_cet_mul(6, 7) }
}

fn int3_probe_on_every_boundary() {
    type Case = (&'static str, u64, fn() -> i64);
    let cases: [Case; 3] = [
        ("fx_twice", fx_twice as *const () as u64, run_twice),
        ("fx_pg_mul", fn_addr(fx_pg_mul), run_pg_mul),
        ("fx_cet_mul", fn_addr(fx_cet_mul), run_cet_mul),
    ];
    for (name, addr, run) in cases {
        let want = run();
        let func = ftrace::find_symbol(None, name).unwrap().remove(0);
        // SAFETY: the function's own bytes, `size` long.
        let code =
            unsafe { std::slice::from_raw_parts(addr as *const u8, func.size as usize) }.to_vec();
        let site = ftrace::site_covering_func(&func);
        let mut probed = 0;
        for b in ftprobe::arch::x86_64::insn::boundaries(&code, addr) {
            if site.is_some_and(|s| b > s && b < s + 5) {
                continue;
            }
            let off = b - addr;
            let p = leak(Kprobe::new(
                sym(name, off),
                Some(count_pre),
                Some(count_post),
            ));
            match kprobes::register_kprobe(p) {
                Ok(()) => {}
                // func+0 with endbr64 is the site at +4 (registered through it).
                Err(e) => panic!("{name}+{off:#x}: {e}"),
            }
            for _ in 0..3 {
                assert_eq!(run(), want, "{name}+{off:#x}: result unchanged");
            }
            assert_eq!(
                hits(p),
                (3, 3),
                "{name}+{off:#x}: pre and post on each of 3 calls"
            );
            kprobes::unregister_kprobe(p).unwrap();
            probed += 1;
        }
        // SAFETY: the function's own bytes, as above.
        let now = unsafe { std::slice::from_raw_parts(addr as *const u8, code.len()) };
        assert_eq!(&code[..], now, "{name} restored");
        assert!(probed >= 4, "{name}: {probed} boundaries");
    }
}

/// Every instruction class an int3 probe emulates (call/jmp rel and through a register, jcc
/// rel8/rel32, loop, jrcxz, ret, ret imm16) or runs out of line with a RIP-relative operand
/// (an immediate after the displacement too), probed at every boundary of the zoo's
/// functions in turn, and every refused class (syscall, int3, ud2).
fn int3_every_instruction_class() {
    use ftprobe::arch::x86_64::insn::{self, Emulate, XolPlan};
    use ftprobe_dev::fxsites::zoo::*;
    fn calls3() -> i64 {
        // SAFETY: assembly functions of the zoo, no preconditions (likewise below).
        unsafe { zoo_jcc(5) + zoo_jcc(50) * 10 + zoo_jcc(500) * 100 }
    }
    fn loops() -> i64 {
        // SAFETY: an assembly function of the zoo, no preconditions.
        unsafe { zoo_loop(7) }
    }
    fn jrcxz() -> i64 {
        // SAFETY: an assembly function of the zoo, no preconditions.
        unsafe { zoo_jrcxz(0) * 10 + zoo_jrcxz(3) }
    }
    fn callz() -> i64 {
        // SAFETY: an assembly function of the zoo, no preconditions.
        unsafe { zoo_calls(10) }
    }
    fn retimm() -> i64 {
        // SAFETY: an assembly function of the zoo, no preconditions.
        unsafe { zoo_retimm(9) }
    }
    fn riprel() -> i64 {
        // SAFETY: an assembly function of the zoo, no preconditions.
        unsafe { zoo_riprel() }
    }
    type Case = (&'static str, fn() -> i64, i64, u64);
    let cases: [Case; 7] = [
        ("zoo_jcc", calls3, 1 + 20 + 300, 3),
        ("zoo_loop", loops, 7, 1),
        ("zoo_jrcxz", jrcxz, 5, 2),
        ("zoo_calls", callz, 13, 1),
        ("zoo_retimm", retimm, 9, 1),
        ("zoo_retimm_inner", retimm, 9, 1),
        ("zoo_riprel", riprel, 42, 1),
    ];
    let mut seen = std::collections::BTreeSet::new();
    for (name, run, want, calls) in cases {
        assert_eq!(run(), want, "{name} untraced");
        let func = ftrace::find_symbol(None, name).unwrap().remove(0);
        // SAFETY: the function's own bytes.
        let code =
            unsafe { std::slice::from_raw_parts(func.addr as *const u8, func.size as usize) }
                .to_vec();
        for b in insn::boundaries(&code, func.addr) {
            let off = b - func.addr;
            let class = match insn::plan(&code, func.addr, b, b) {
                Ok(XolPlan::Emulate { insn, .. }) => match insn {
                    Emulate::CallRel { .. } => "call rel",
                    Emulate::JmpRel { .. } => "jmp rel",
                    Emulate::Jcc { .. } => "jcc",
                    Emulate::Loop { .. } => "loop/jrcxz",
                    Emulate::Ret { pop: 0 } => "ret",
                    Emulate::Ret { .. } => "ret imm16",
                    Emulate::CallReg { .. } => "call reg",
                    Emulate::JmpReg { .. } => "jmp reg",
                    Emulate::CallMem { .. } => "call mem",
                    Emulate::JmpMem { .. } => "jmp mem",
                    Emulate::Nop => "nop",
                },
                Ok(XolPlan::Xol { .. }) => "xol",
                Err(_) => {
                    // ud2 in zoo_calls: never executed, refused.
                    let e = kprobes::register_kprobe(leak(Kprobe::new(
                        sym(name, off),
                        Some(count_pre),
                        None,
                    )));
                    assert!(matches!(e, Err(KprobeError::Insn(_))), "{name}+{off:#x}");
                    seen.insert("refused");
                    continue;
                }
            };
            seen.insert(class);
            let p = leak(Kprobe::new(
                sym(name, off),
                Some(count_pre),
                Some(count_post),
            ));
            kprobes::register_kprobe(p).unwrap_or_else(|e| panic!("{name}+{off:#x}: {e}"));
            let got = run();
            kprobes::unregister_kprobe(p).unwrap();
            assert_eq!(got, want, "{name}+{off:#x} ({class}): result");
            let (pre, post) = hits(p);
            assert_eq!(
                pre, post,
                "{name}+{off:#x} ({class}): every pre has its post"
            );
            assert!(
                pre >= 1 && pre <= 7 * calls,
                "{name}+{off:#x} ({class}): {pre} hits"
            );
        }
    }
    for class in [
        "call rel",
        "jmp rel",
        "jcc",
        "loop/jrcxz",
        "ret",
        "ret imm16",
        "call reg",
        "jmp reg",
        "xol",
    ] {
        assert!(seen.contains(class), "{class} exercised: {seen:?}");
    }
    // The refused classes, each with its reason.
    let func = ftrace::find_symbol(None, "zoo_refused").unwrap().remove(0);
    // SAFETY: the function's own bytes.
    let code =
        unsafe { std::slice::from_raw_parts(func.addr as *const u8, func.size as usize) }.to_vec();
    let mut refused = Vec::new();
    for b in insn::boundaries(&code, func.addr) {
        let p = leak(Kprobe::new(
            sym("zoo_refused", b - func.addr),
            Some(count_pre),
            None,
        ));
        match kprobes::register_kprobe(p) {
            Ok(()) => kprobes::unregister_kprobe(p).unwrap(),
            Err(KprobeError::Insn(e)) => refused.push(e.to_string()),
            Err(e) => panic!("{e}"),
        }
    }
    // call *mem and jmp *mem are emulated now (tests/indirect_probes.rs in ftprobe-cli).
    assert_eq!(refused.len(), 2, "syscall, int3: {refused:?}");
    let _ = zoo_refused as unsafe extern "C" fn();
    let _ = zoo_retimm_inner as unsafe extern "C" fn(i64) -> i64;
}

static THREAD_HITS: AtomicU64 = AtomicU64::new(0);
fn thread_pre(_p: &Kprobe, _regs: &mut PtRegs) -> i32 {
    THREAD_HITS.fetch_add(1, Ordering::Relaxed);
    0
}

fn int3_probe_hammered_by_eight_threads() {
    // fx_pg_mul+0: push %rbp, boosted (no post_handler).
    let p = leak(Kprobe::new(sym("fx_pg_mul", 0), Some(thread_pre), None));
    kprobes::register_kprobe(p).unwrap();
    let per_thread = 20_000;
    let threads: Vec<_> = (0..8)
        .map(|t| {
            std::thread::spawn(move || {
                for i in 0..per_thread {
                    // SAFETY: plain C function.
                    assert_eq!(unsafe { fx_pg_mul(t, i) }, t * i);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(THREAD_HITS.load(Ordering::Relaxed), 8 * per_thread as u64);
    assert_eq!(p.nmissed(), 0);
    kprobes::unregister_kprobe(p).unwrap();
}

/// The program's handler of SIGUSR2 (installed at the start of `main`, before `ftrace::init`,
/// so that ftprobe wraps it): its runs, its thread, and whether the pre_handler that sent
/// the signal had finished.
static PSIG_RUNS: AtomicU64 = AtomicU64::new(0);
static PSIG_TID: AtomicU64 = AtomicU64::new(0);
static PSIG_AFTER_PRE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static PRE_DONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_sigusr2(_sig: i32) {
    PSIG_RUNS.fetch_add(1, Ordering::Relaxed);
    // SAFETY: gettid has no preconditions.
    PSIG_TID.store(unsafe { libc::gettid() } as u64, Ordering::Relaxed);
    PSIG_AFTER_PRE.store(PRE_DONE.load(Ordering::Relaxed), Ordering::Relaxed);
}

fn install_sigusr2() {
    // SAFETY: a zeroed sigaction is valid; the handler is an extern "C" fn of ours.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigusr2 as *const () as usize;
        assert_eq!(libc::sigaction(libc::SIGUSR2, &sa, std::ptr::null_mut()), 0);
    }
}

/// pre_handler: a process-directed SIGUSR2 (`kill`: the kernel offers it to the thread group
/// leader first, this thread) from inside the int3 hit, then 50 ms more in the hit.
fn kill_pre(_p: &Kprobe, _regs: &mut PtRegs) -> i32 {
    // SAFETY: kill and getpid have no memory arguments.
    unsafe { libc::kill(libc::getpid(), libc::SIGUSR2) };
    // Long enough for any other thread the kernel woke for it to take it (no system call).
    let t = std::time::Instant::now();
    while t.elapsed() < std::time::Duration::from_millis(50) {
        std::hint::spin_loop();
    }
    PRE_DONE.store(true, Ordering::Relaxed);
    0
}

/// Issue 26, item 1: a process-directed signal generated while a thread is inside ftprobe's
/// SIGTRAP handler (gprof's SIGPROF of the CPU time it uses, here a `kill` from its
/// pre_handler) went to another thread, because the handler blocked every asynchronous
/// signal: a thread sleeping in `nanosleep` took it and failed with EINTR. The kernel now
/// finds the hitting thread willing (`complete_signal()`), ftprobe holds the signal until
/// the hit is done and delivers it there: the sleeper sleeps on.
fn a_process_signal_raised_in_an_int3_hit_is_taken_by_that_thread() {
    use std::sync::atomic::AtomicI64;
    static SLEPT: AtomicI64 = AtomicI64::new(-1);
    static SLEEPER: AtomicI64 = AtomicI64::new(0);
    kprobes::set_optimization(false).unwrap();
    let sleeper = std::thread::spawn(|| {
        // SAFETY: gettid has no preconditions.
        SLEEPER.store(unsafe { libc::gettid() } as i64, Ordering::Relaxed);
        let ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 400_000_000,
        };
        // SAFETY: nanosleep reads our timespec; no remainder asked.
        let r = unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
        let err = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        SLEPT.store(if r == 0 { 0 } else { err as i64 }, Ordering::Relaxed);
    });
    // The sleeper is in its nanosleep (glibc's is `clock_nanosleep`, system call 230, in
    // /proc/self/task/TID/syscall).
    loop {
        let tid = SLEEPER.load(Ordering::Relaxed);
        if tid != 0 {
            let sc = std::fs::read_to_string(format!("/proc/self/task/{tid}/syscall"))
                .unwrap_or_default();
            if sc.starts_with("230 ") {
                break;
            }
        }
        assert_eq!(
            SLEPT.load(Ordering::Relaxed),
            -1,
            "the sleeper was not seen asleep"
        );
        std::thread::yield_now();
    }
    let p = leak(Kprobe::new(sym("fx_pg_mul", 0), Some(kill_pre), None));
    kprobes::register_kprobe(p).unwrap();
    // SAFETY: plain C function.
    assert_eq!(unsafe { fx_pg_mul(6, 7) }, 42);
    kprobes::unregister_kprobe(p).unwrap();
    sleeper.join().unwrap();
    assert_eq!(PSIG_RUNS.load(Ordering::Relaxed), 1, "the handler ran once");
    // SAFETY: gettid has no preconditions.
    let me = unsafe { libc::gettid() } as u64;
    assert_eq!(
        PSIG_TID.load(Ordering::Relaxed),
        me,
        "taken by the thread that hit the probe (the sleeper is {})",
        SLEEPER.load(Ordering::Relaxed)
    );
    assert!(
        PSIG_AFTER_PRE.load(Ordering::Relaxed),
        "delivered after the hit, not inside the pre_handler"
    );
    assert_eq!(
        SLEPT.load(Ordering::Relaxed),
        0,
        "the sleeper's nanosleep was not interrupted (an errno)"
    );
    kprobes::set_optimization(true).unwrap();
}

/// `unregister_kprobe` of a non-boosted int3 probe killed a multithreaded process: a thread
/// still in the slot hit the slot's final `int3` after the probe had left the table, and the
/// trap went to SIGTRAP's default action (3 runs of 3). The slot's trap is now recognised by
/// the slot. 10 000 register/unregister cycles on `cpuid` under a thread that runs it.
fn unregister_while_a_thread_is_in_the_slot() {
    use ftprobe_dev::fxsites::zoo::zoo_cpuid;
    use std::sync::atomic::AtomicBool;
    static STOP: AtomicBool = AtomicBool::new(false);
    static RUNS: AtomicU64 = AtomicU64::new(0);
    let p = leak(Kprobe::new(
        sym("zoo_cpuid", 3),
        Some(thread_pre),
        Some(count_post),
    ));
    let runner = std::thread::spawn(|| {
        let mut i = 0i64;
        while !STOP.load(Ordering::Relaxed) {
            // SAFETY: plain assembly function of ftprobe-dev.
            assert_eq!(unsafe { zoo_cpuid(i) }, i + 7);
            i += 1;
            RUNS.fetch_add(1, Ordering::Relaxed);
        }
    });
    let before = THREAD_HITS.load(Ordering::Relaxed);
    for _ in 0..10_000 {
        kprobes::register_kprobe(p).unwrap();
        std::hint::spin_loop();
        kprobes::unregister_kprobe(p).unwrap();
    }
    STOP.store(true, Ordering::Relaxed);
    runner.join().unwrap();
    assert!(RUNS.load(Ordering::Relaxed) > 0);
    assert!(
        THREAD_HITS.load(Ordering::Relaxed) > before,
        "the thread went through the probe"
    );
    // Still works afterwards, with its post_handler.
    kprobes::register_kprobe(p).unwrap();
    let (pre0, post0) = (
        THREAD_HITS.load(Ordering::Relaxed),
        p.data.load(Ordering::Relaxed),
    );
    // SAFETY: as above.
    assert_eq!(unsafe { zoo_cpuid(1) }, 8);
    assert_eq!(THREAD_HITS.load(Ordering::Relaxed), pre0 + 1);
    assert_eq!(
        p.data.load(Ordering::Relaxed) >> 32,
        (post0 >> 32) + 1,
        "post_handler ran"
    );
    kprobes::unregister_kprobe(p).unwrap();
}

fn calls_probed(p: &Kprobe, _regs: &mut PtRegs) -> i32 {
    p.data.fetch_add(1, Ordering::Relaxed);
    // SAFETY: plain C function; it is the probed function itself.
    unsafe { fx_leaf(1) };
    0
}

fn recursion_into_the_probed_function_is_missed() {
    let p = leak(Kprobe::new(sym("fx_leaf", 0), Some(calls_probed), None));
    kprobes::register_kprobe(p).unwrap();
    // SAFETY: plain C function.
    assert_eq!(unsafe { fx_twice(1) }, 5);
    assert_eq!(hits(p).0, 2, "the two real calls");
    assert_eq!(p.nmissed(), 2, "the handler's own call, once per hit");
    kprobes::unregister_kprobe(p).unwrap();
}

fn stop(p: &Kprobe, _regs: &mut PtRegs) -> i32 {
    p.data.fetch_add(1, Ordering::Relaxed);
    // Returning non-zero claims ip was changed: leave it where a real int3 would have.
    1
}

fn two_kprobes_on_one_address() {
    let a = leak(Kprobe::new(sym("fx_add", 0), Some(count_pre), None));
    let b = leak(Kprobe::new(
        KprobeTarget::Addr(fn_addr(fx_add)),
        Some(count_pre),
        None,
    ));
    kprobes::register_kprobe(a).unwrap();
    kprobes::register_kprobe(b).unwrap();
    // SAFETY: plain C function.
    unsafe { fx_add(1, 2) };
    assert_eq!((hits(a).0, hits(b).0), (1, 1));
    let list = kprobes::list();
    assert_eq!(
        list.lines().filter(|l| l.contains("fx_add+0x0")).count(),
        2,
        "{list}"
    );
    // Disable one: the other still runs, the listing says so.
    kprobes::disable_kprobe(a).unwrap();
    // SAFETY: plain C function.
    unsafe { fx_add(1, 2) };
    assert_eq!((hits(a).0, hits(b).0), (1, 2));
    assert_ne!(a.flags() & KPROBE_FLAG_DISABLED, 0);
    assert!(kprobes::list().contains("[DISABLED][FTRACE]"));
    kprobes::enable_kprobe(a).unwrap();
    kprobes::unregister_kprobe(b).unwrap();
    kprobes::unregister_kprobe(a).unwrap();
}

fn first_nonzero_pre_handler_stops_the_rest() {
    // `stop` returns 1 with regs.ip = addr + 1; give it a valid ip by redirecting instead.
    let first = leak(Kprobe::new(sym("fx_mul", 0), Some(redirect), None));
    let second = leak(Kprobe::new(sym("fx_mul", 0), Some(stop), None));
    kprobes::register_kprobe(first).unwrap();
    kprobes::register_kprobe(second).unwrap();
    // SAFETY: plain C function.
    assert_eq!(unsafe { fx_mul(3, 3) }, 42);
    assert_eq!(second.data.load(Ordering::Relaxed), 0, "not reached");
    kprobes::unregister_kprobe(first).unwrap();
    kprobes::unregister_kprobe(second).unwrap();
}

static TRACER_HITS: AtomicU64 = AtomicU64::new(0);
unsafe extern "C" fn tracer(_ip: u64, _p: u64, _op: &FtraceOps, _r: &mut PtRegs) {
    TRACER_HITS.fetch_add(1, Ordering::Relaxed);
}
static TRACER: FtraceOps = FtraceOps::new(tracer, 0);

fn kprobe_and_function_tracer_coexist() {
    ftrace::ftrace_set_filter(&TRACER, "fx_add", true).unwrap();
    let p = leak(Kprobe::new(sym("fx_add", 0), Some(count_pre), None));
    kprobes::register_kprobe(p).unwrap();
    ftrace::register_ftrace_function(&TRACER).unwrap();
    // SAFETY: plain C function.
    unsafe { fx_add(1, 2) };
    assert_eq!((hits(p).0, TRACER_HITS.load(Ordering::Relaxed)), (1, 1));
    kprobes::disable_kprobe(p).unwrap();
    // SAFETY: plain C function.
    unsafe { fx_add(1, 2) };
    assert_eq!((hits(p).0, TRACER_HITS.load(Ordering::Relaxed)), (1, 2));
    kprobes::enable_kprobe(p).unwrap();
    ftrace::unregister_ftrace_function(&TRACER).unwrap();
    // SAFETY: plain C function.
    unsafe { fx_add(1, 2) };
    assert_eq!((hits(p).0, TRACER_HITS.load(Ordering::Relaxed)), (2, 2));
    kprobes::unregister_kprobe(p).unwrap();
}

fn failed_arming_enables_nothing() {
    let p = leak(Kprobe::new(sym("fx_twice", 0), Some(count_pre), None));
    ftprobe::sys::fault::fail_nth("membarrier", 1);
    let e = kprobes::register_kprobe(p).unwrap_err();
    ftprobe::sys::fault::clear();
    assert!(matches!(e, KprobeError::Ftrace(_)), "{e}");
    assert_eq!(bytes(fx_twice as *const () as u64), NOP5);
    assert!(!kprobes::list().contains("fx_twice"));
    // SAFETY: plain C function.
    assert_eq!(unsafe { fx_twice(1) }, 5);
    assert_eq!(hits(p).0, 0);
    kprobes::register_kprobe(p).unwrap();
    // SAFETY: plain C function.
    assert_eq!(unsafe { fx_twice(1) }, 5);
    assert_eq!(hits(p).0, 1);
    kprobes::unregister_kprobe(p).unwrap();
}

fn bad_targets() {
    let e =
        kprobes::register_kprobe(leak(Kprobe::new(sym("no_such_fn", 0), None, None))).unwrap_err();
    assert!(
        matches!(e, KprobeError::NoSymbol(_)) && e.errno() == libc::ENOENT,
        "{e}"
    );
    let e =
        kprobes::register_kprobe(leak(Kprobe::new(sym("fx_add", 4096), None, None))).unwrap_err();
    assert!(matches!(e, KprobeError::OffsetOutside { .. }), "{e}");
}

fn main() {
    // Quick tier only: this binary has no stress case (ftprobe_dev::tier).
    if !ftprobe_dev::tier::quick_tier_requested() {
        return;
    }
    install_sigusr2();
    // SAFETY: early in main (reading the arguments starts no thread): single-threaded.
    unsafe { ftrace::init() }.expect("ftrace::init");
    let cases: &[(&str, fn())] = &[
        (
            "probe_on_a_site_sees_args_and_addr_plus_one",
            probe_on_a_site_sees_args_and_addr_plus_one,
        ),
        (
            "post_handler_sees_addr_plus_site_len",
            post_handler_sees_addr_plus_site_len,
        ),
        (
            "pre_handler_that_changes_ip_skips_the_body",
            pre_handler_that_changes_ip_skips_the_body,
        ),
        (
            "endbr_func_plus_0_and_plus_4_are_the_site",
            endbr_func_plus_0_and_plus_4_are_the_site,
        ),
        ("inside_a_site_is_refused", inside_a_site_is_refused),
        (
            "the_engine_own_code_is_refused_where_it_is_linked",
            the_engine_own_code_is_refused_where_it_is_linked,
        ),
        (
            "pg_func_plus_0_is_an_int3_probe_and_plus_4_the_site",
            pg_func_plus_0_is_an_int3_probe_and_plus_4_the_site,
        ),
        ("int3_probe_on_every_boundary", int3_probe_on_every_boundary),
        ("int3_every_instruction_class", int3_every_instruction_class),
        (
            "recursion_into_the_probed_function_is_missed",
            recursion_into_the_probed_function_is_missed,
        ),
        ("two_kprobes_on_one_address", two_kprobes_on_one_address),
        (
            "first_nonzero_pre_handler_stops_the_rest",
            first_nonzero_pre_handler_stops_the_rest,
        ),
        (
            "kprobe_and_function_tracer_coexist",
            kprobe_and_function_tracer_coexist,
        ),
        (
            "failed_arming_enables_nothing",
            failed_arming_enables_nothing,
        ),
        ("bad_targets", bad_targets),
        // Last: it starts threads (ftrace::init is long done, nothing else patches meanwhile).
        (
            "a_process_signal_raised_in_an_int3_hit_is_taken_by_that_thread",
            a_process_signal_raised_in_an_int3_hit_is_taken_by_that_thread,
        ),
        (
            "int3_probe_hammered_by_eight_threads",
            int3_probe_hammered_by_eight_threads,
        ),
        (
            "unregister_while_a_thread_is_in_the_slot",
            unregister_while_a_thread_is_in_the_slot,
        ),
    ];
    for (name, case) in cases {
        print!("test {name} ... ");
        case();
        println!("ok");
    }
    println!("\n{} passed, 0 failed", cases.len());
}
