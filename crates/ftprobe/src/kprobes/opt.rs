//! optprobes (kernel/kprobes.c's optimizer, arch/x86/kernel/kprobes/opt.c): an int3 probe
//! whose instructions may be replaced by a `jmp` to a detour (`arch::x86_64::optprobe`) is
//! switched to it, and back to the int3 when that stops being safe.
//!
//! A probe is optimized when every probe at its address is enabled-or-disabled without a
//! post_handler (a post_handler needs the instruction stepped alone, as in the kernel),
//! optimization is on ([`set_optimization`], the
//! kernel's `debug.kprobes-optimization` sysctl; off from the start with the environment
//! variable `FTPROBE_KPROBES_OPTIMIZATION=0`), the range passes `optprobe::analyze`, no
//! other armed probe and no ftrace site is inside it, and no thread is inside it (below).
//! Unlike the kernel's delayed optimizer, the switch happens when the probe is armed; a probe
//! that could not be switched then (a thread in the way) stays an int3 probe until its
//! address is armed again or optimization is turned on again.
//!
//! # The switch (the kernel's `optimize_kprobe` / `text_poke_bp`)
//! The int3 is already in place. 1. The int3's hits are sent to the detour's relocated
//! instructions instead of the XOL slot (`int3::set_detour`), and every SIGTRAP handler that
//! may still hold the table before that is waited for (`int3::synchronize_traps`, a
//! user-space SRCU): from now on no thread that hits the probe steps into the bytes that
//! will be replaced. 2. Every other thread of the process is looked at:
//!    - a sleeping thread through `/proc/self/task/TID/syscall`, which gives its user `sp`
//!      and `pc`: the `pc` must not be in `addr+1 .. addr+len` nor in the probe's XOL slots
//!      (a thread that left the int3 through a slot before step 1 comes back at the second
//!      instruction), and no word of its stack from `sp` up (at most [`STACK_SCAN`] bytes)
//!      may point there (a signal frame of a handler that interrupted the range), except a
//!      SIGTRAP frame of this probe's own int3 and the frames of its handler below it;
//!    - a runnable thread (on CPU or preempted; the kernel shows no registers then) must
//!      use [`PROGRESS_NS`] of CPU time (`schedstat`) after it is first seen: wherever it
//!      was in the range, it has left it (a few instructions, and no way back in); unless
//!      it was seen asleep in the way (a handler that interrupted the range and sleeps by
//!      turns): then only a look at it asleep and clear lets it out;
//!    - a thread still in the way after [`BUSY_WAIT`]: no optimization.
//!
//! The kernel's equivalent is `synchronize_rcu_tasks()`. 3. Bytes 1..5 get the `jmp`'s rel32, every thread serializes (membarrier SYNC_CORE),
//! then byte 0 gets `e9`, serialize. Nothing may jump into the range (the function's and the
//! whole object's direct branches are checked) or return into it (a call in the range is
//! its last instruction), so no thread can reach the replaced bytes between 2 and 3.
//!
//! Unoptimizing writes the int3 back over `e9` (serialize), then the original bytes 1..5
//! (serialize), then sends the int3's hits to the XOL slot again. Detours and trampolines are
//! never freed (a thread may be in one) and are reused when the same instructions are
//! optimized again.
//!
//! # Limits
//! - The threads' check cannot see a signal frame on another signal stack than the one the
//!   thread is on, nor one of a runnable thread (a handler that interrupted the range
//!   before the int3 was armed and is still running), nor a `vfork` child running in the
//!   range; and an indirect jump of another object or a computed one (`jmp *%rax` elsewhere
//!   in the object) into the range is not seen (the kernel has the same blind spot).
//! - A fault in a relocated instruction other than the first is shown to the program at the
//!   detour's address (showing the original one would make a handler that returns run the
//!   replaced bytes); an asynchronous signal is shown at the original instruction.
//!
//! # A program's signals
//! A program's handler sees the thread as an int3 hit of the probe would let it (the
//! kernel's uprobes: `uprobe_deny_signal` holds signals while the probed instruction runs out
//! of line): in the trampoline (and the pre_handlers), the signal is held until it returns
//! (`tramp_signals`; the process's trampoline patterns are made with the first optprobe
//! trampoline); before the trampoline's call, the detour's own instructions are undone and
//! the thread stands at the probed instruction with its own registers (the hit happens when
//! the handler returns, never if it jumps out); after the call and before the first
//! relocated instruction has run, the detour's own instructions are done and that instruction
//! runs alone first (emulated, or from the probe's step slot with the signal held until its
//! trap), so a handler never sees a hit whose instruction has not run
//! ([`on_program_signal`]). In the relocated instructions the PC is shown at the original
//! ones; a call relocated as several instructions is put back at its start.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicPtr, AtomicU8, Ordering};
use std::sync::{Mutex, MutexGuard};

use super::{int3, published, Kprobe, KprobeError, KPROBE_FLAG_OPTIMIZED};
use crate::arch::x86_64::nops::INT3;
use crate::arch::x86_64::optprobe::{self as arch, VectorSave, DETOUR_BODY, DETOUR_CODE};
use crate::arch::x86_64::{text_poke, tramp_signals};
use crate::ftrace::{self as ft, PtRegs};
use crate::probe_state;

/// How long a thread that is on CPU is waited for, in total, before the switch gives up.
pub const BUSY_WAIT: std::time::Duration = std::time::Duration::from_millis(100);
/// How much of a thread's stack above its `sp` is scanned.
pub const STACK_SCAN: u64 = 1 << 20;

/// What the trampoline passes back: the probe's address.
struct OptProbe {
    addr: u64,
}

#[derive(Clone)]
struct Detour {
    start: u64,
    end: u64,
    /// `(pc, shown)` sorted by pc (see `optprobe::detour_bytes`).
    map: Vec<(u64, u64)>,
    /// How the first relocated instruction runs alone (`on_program_signal`).
    first: Option<int3::FirstInsn>,
}

/// The optimized addresses.
struct Optimized {
    /// The range's length.
    len: u64,
    /// The 5 original bytes the `jmp` replaced.
    orig: [u8; 5],
}

struct State {
    optimized: BTreeMap<u64, Optimized>,
    /// Detours made, by the address and the original bytes of its range.
    detours: BTreeMap<(u64, Vec<u8>), Detour>,
    all: Vec<Detour>,
    /// Trampoline copies.
    tramps: Vec<u64>,
    /// Why the last try to optimize an address failed.
    refused: BTreeMap<u64, String>,
    /// Per object (its text range): every direct branch target in it.
    targets: BTreeMap<(u64, u64), Vec<u64>>,
    #[allow(clippy::vec_box)]
    retired: Vec<Box<Vec<Detour>>>,
}

static STATE: Mutex<State> = Mutex::new(State {
    optimized: BTreeMap::new(),
    detours: BTreeMap::new(),
    all: Vec::new(),
    tramps: Vec::new(),
    refused: BTreeMap::new(),
    targets: BTreeMap::new(),
    retired: Vec::new(),
});
/// Every detour, sorted by start, for the signal handlers. Never freed.
static PUBLISHED: AtomicPtr<Vec<Detour>> = AtomicPtr::new(std::ptr::null_mut());
/// 0: not read yet, 1: on, 2: off.
static ENABLED: AtomicU8 = AtomicU8::new(0);
static VECTORS: std::sync::OnceLock<Option<VectorSave>> = std::sync::OnceLock::new();

fn lock() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether optimization is on (`debug.kprobes-optimization`).
pub fn optimization_enabled() -> bool {
    match ENABLED.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => {
            let off = std::env::var_os("FTPROBE_KPROBES_OPTIMIZATION").is_some_and(|v| v == "0");
            ENABLED.store(if off { 2 } else { 1 }, Ordering::Relaxed);
            // With it, optimization on or off, so the same calls in both.
            debug_refusals();
            !off
        }
    }
}

/// Whether refusals are printed (`FTPROBE_OPT_DEBUG`), read once, with
/// `FTPROBE_KPROBES_OPTIMIZATION`: `getenv` calls libc's `strlen`, which an armed probe may
/// be on (an event of the agent's own in the program's trace at each refusal, counts that
/// differed from the same probes' with optimization off).
fn debug_refusals() -> bool {
    static DEBUG: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *DEBUG.get_or_init(|| std::env::var_os("FTPROBE_OPT_DEBUG").is_some())
}

pub(super) fn set_enabled(on: bool) {
    ENABLED.store(if on { 1 } else { 2 }, Ordering::Relaxed);
}

/// Whether `addr` is optimized now.
pub(super) fn is_optimized(addr: u64) -> bool {
    lock().optimized.contains_key(&addr)
}

/// Why `addr` is not optimized, if a try failed (the last try's reason).
pub(super) fn refusal(addr: u64) -> Option<String> {
    let st = lock();
    if st.optimized.contains_key(&addr) {
        return None;
    }
    st.refused.get(&addr).cloned()
}

/// The optimized `jmp`s, with the bytes they replaced (for reading original code).
pub(super) fn jumps() -> Vec<(u64, [u8; 5])> {
    lock().optimized.iter().map(|(a, o)| (*a, o.orig)).collect()
}

/// The optimized ranges that contain `addr` past their first byte (an int3 there would land
/// inside their `jmp` or their replaced instructions).
pub(super) fn covering(addr: u64) -> Vec<u64> {
    lock()
        .optimized
        .range(..addr)
        .filter(|(a, o)| addr < **a + o.len)
        .map(|(a, _)| *a)
        .collect()
}

fn set_flag(probes: &[&'static Kprobe], on: bool) {
    for p in probes {
        if on {
            p.flags.fetch_or(KPROBE_FLAG_OPTIMIZED, Ordering::Relaxed);
        } else {
            p.flags.fetch_and(!KPROBE_FLAG_OPTIMIZED, Ordering::Relaxed);
        }
    }
}

/// Bring `addr` (an armed int3 probe's address, with `probes` registered there) in line with
/// the rules: optimize it when it may be, unoptimize it when it may not. A refusal to
/// optimize is not an error (the int3 probe stays); an error writing the code is.
pub(super) fn update(addr: u64, probes: &[&'static Kprobe]) -> Result<(), KprobeError> {
    let want = optimization_enabled()
        && probes.iter().any(|p| !p.is_disabled())
        && !probes
            .iter()
            .any(|p| !p.is_disabled() && p.post_handler.is_some());
    let is = is_optimized(addr);
    if want && !is {
        let r = try_optimize(addr);
        let mut st = lock();
        match r {
            Ok(()) => {
                st.refused.remove(&addr);
                set_flag(probes, true);
            }
            Err(e) => {
                set_flag(probes, false);
                if debug_refusals() {
                    eprintln!("optprobe {addr:#x}: {e}");
                }
                st.refused.insert(addr, e.to_string());
            }
        }
    } else if !want && is {
        unoptimize(addr)?;
        set_flag(probes, false);
    } else {
        set_flag(probes, is);
    }
    Ok(())
}

/// Why [`try_optimize`] left a probe as it was.
#[derive(Debug, thiserror::Error)]
pub(super) enum NotOptimized {
    #[error(transparent)]
    Refused(arch::OptRefusal),
    /// Another probe or an ftrace site inside the range.
    #[error("another probe or an ftrace site is inside the replaced bytes")]
    Occupied,
    /// A thread inside the range, or on CPU for [`BUSY_WAIT`].
    #[error("a thread was inside the replaced bytes (or on CPU too long to tell)")]
    ThreadInside,
    #[error(transparent)]
    Failed(KprobeError),
}

fn try_optimize(addr: u64) -> Result<(), NotOptimized> {
    let Some(v) = *VECTORS.get_or_init(VectorSave::detect) else {
        return Err(NotOptimized::Refused(arch::OptRefusal::NoSize));
    };
    let (func, _) = ft::symbol_at(addr).ok_or(NotOptimized::Occupied)?;
    if func.size == 0 {
        return Err(NotOptimized::Refused(arch::OptRefusal::NoSize));
    }
    let others: Vec<(u64, [u8; 5])> = jumps().into_iter().filter(|(a, _)| *a != addr).collect();
    let mut code = int3::function_code(&func, &others);
    code.truncate(func.size as usize);
    let range = arch::analyze(&code, func.addr, addr).map_err(NotOptimized::Refused)?;
    let last = range[range.len() - 1];
    let end = last.addr + u64::from(last.len);
    if !int3::armed_in(addr + 1, end).is_empty()
        || (addr..end).any(|a| ft::site_covering(a).is_some())
    {
        return Err(NotOptimized::Occupied);
    }
    if let Some(t) = jumps_into(addr + 1, end, &others) {
        return Err(NotOptimized::Refused(arch::OptRefusal::JumpFromElsewhere {
            target: t,
        }));
    }
    let off = (addr - func.addr) as usize;
    let range_bytes = code[off..off + (end - addr) as usize].to_vec();
    let mut orig = [0u8; 5];
    orig.copy_from_slice(&range_bytes[..5]);
    let first = int3::first_insn(addr);
    let detour = {
        let mut st = lock();
        match st.detours.get(&(addr, range_bytes.clone())) {
            Some(d) => d.clone(),
            None => {
                let d = make_detour(&mut st, v, &code, func.addr, &range, addr, first)?;
                st.detours.insert((addr, range_bytes), d.clone());
                st.all.push(d.clone());
                publish(&mut st);
                d
            }
        }
    };
    text_poke::install_fault_handlers(int3::abort_xol)
        .and_then(|_| text_poke::wrap_program_handlers(Some(int3::shown_pc)))
        .map_err(|e| NotOptimized::Failed(KprobeError::Ftrace(e.into())))?;
    if !int3::set_detour(addr, detour.start + DETOUR_BODY) {
        return Err(NotOptimized::Occupied);
    }
    // From here no SIGTRAP handler sends a thread to the slot (which comes back at the
    // second instruction).
    int3::synchronize_traps();
    let mut forbidden = vec![(addr + 1, end)];
    forbidden.extend(int3::slot_ranges(addr));
    if !threads_outside(&forbidden, addr + 1) {
        int3::set_detour(addr, 0);
        return Err(NotOptimized::ThreadInside);
    }
    let jmp = arch::rel32_insn(0xe9, addr, detour.start + DETOUR_CODE)
        .expect("a detour is allocated within rel32 reach of its probe");
    // SAFETY: addr holds the int3 of an armed probe; bytes 1..5 are inside the analysed range
    // (whole instructions of the function) that no thread is in and none can enter (checked
    // above); the code is writable (armed int3).
    let wrote = unsafe { text_poke::poke_behind_int3(addr, &jmp[1..]) }
        // SAFETY: as above: the jmp's first byte over the int3, its rel32 already in place.
        .and_then(|_| unsafe { text_poke::poke_byte(addr, jmp[0]) });
    if let Err(e) = wrote {
        // SAFETY: putting back what this function wrote behind the int3.
        let _ = unsafe { text_poke::poke_byte(addr, INT3) };
        // SAFETY: as above.
        let _ = unsafe { text_poke::poke_behind_int3(addr, &orig[1..]) };
        int3::set_detour(addr, 0);
        return Err(NotOptimized::Failed(KprobeError::Ftrace(e.into())));
    }
    lock().optimized.insert(
        addr,
        Optimized {
            len: end - addr,
            orig,
        },
    );
    Ok(())
}

fn make_detour(
    st: &mut State,
    v: VectorSave,
    code: &[u8],
    func_addr: u64,
    range: &[arch::RangeInsn],
    addr: u64,
    first: Option<int3::FirstInsn>,
) -> Result<Detour, NotOptimized> {
    let fail = |e: ft::FtraceError| NotOptimized::Failed(KprobeError::Ftrace(e));
    let op = Box::into_raw(Box::new(OptProbe { addr })) as u64;
    // The length does not depend on where the detour goes (within reach: sized as if at
    // the probe itself).
    let (probe_len, _) = arch::detour_bytes(code, func_addr, range, addr, addr, op)
        .map_err(NotOptimized::Refused)?;
    let len = probe_len.len();
    let tramp_len = arch::template(v).len();
    // The last trampoline copy made, else a new one near the probe; a new one when the last
    // is out of the detour's reach.
    let mut fresh = st.tramps.is_empty();
    loop {
        if fresh {
            // A program's signal in the trampoline is held until it returns, as in an
            // ftrace trampoline: the patterns `tramp_signals` matches are made before the
            // first copy exists (nothing else makes them when the process has no sites).
            tramp_signals::prepare();
            text_poke::set_signal_hook(on_program_signal);
            let t = ft::alloc_code_near(addr, tramp_len, |_| {
                arch::instantiate(v, optimized_callback)
            })
            .map_err(fail)?;
            st.tramps.push(t);
        }
        let tramp = *st.tramps.last().expect("one made above");
        let mut result = None;
        let start = ft::alloc_code_near(addr, len, |at| {
            match arch::detour_bytes(code, func_addr, range, at, tramp, op) {
                Ok((bytes, map)) => {
                    result = Some(Ok(map));
                    bytes
                }
                Err(e) => {
                    result = Some(Err(e));
                    vec![INT3; len]
                }
            }
        })
        .map_err(fail)?;
        match result.expect("alloc_code_near calls make") {
            Ok(map) => {
                return Ok(Detour {
                    start,
                    end: start + len as u64,
                    map,
                    first,
                })
            }
            Err(_) if !fresh => fresh = true,
            Err(e) => return Err(NotOptimized::Refused(e)),
        }
    }
}

fn publish(st: &mut State) {
    let mut all = st.all.clone();
    all.sort_unstable_by_key(|d| d.start);
    let p = Box::into_raw(Box::new(all));
    // Release pairs with the Acquire load in `detour_of`.
    let old = PUBLISHED.swap(p, Ordering::AcqRel);
    if !old.is_null() {
        // SAFETY: from Box::into_raw above; kept for readers, never freed.
        st.retired.push(unsafe { Box::from_raw(old) });
    }
}

/// Put the int3 back at an optimized `addr` (it stays an int3 probe).
pub(super) fn unoptimize(addr: u64) -> Result<(), KprobeError> {
    let Some(o) = lock().optimized.remove(&addr) else {
        int3::set_detour(addr, 0);
        return Ok(());
    };
    // SAFETY: addr holds the jmp this module wrote over an armed int3 probe's instruction;
    // int3 first (every thread serialized after it), then the original bytes behind it,
    // which no thread executes (hits of the int3 go on in the detour until set_detour(0)).
    let wrote = unsafe { text_poke::poke_byte(addr, INT3) }
        // SAFETY: as above.
        .and_then(|_| unsafe { text_poke::poke_behind_int3(addr, &o.orig[1..]) });
    if let Err(e) = wrote {
        lock().optimized.insert(addr, o);
        return Err(KprobeError::Ftrace(e.into()));
    }
    int3::set_detour(addr, 0);
    Ok(())
}

/// Forget the optimized addresses in `ranges` (objects unloaded: nothing to write).
pub(super) fn forget(ranges: &[(u64, u64)]) {
    let gone = |a: u64| ranges.iter().any(|&(lo, hi)| a >= lo && a < hi);
    let mut st = lock();
    st.optimized.retain(|a, _| !gone(*a));
    st.targets.retain(|t, _| !gone(t.0));
}

/// A direct branch target of the object containing `lo` in `lo..hi` (the object's code is
/// swept once, and kept).
fn jumps_into(lo: u64, hi: u64, jumps: &[(u64, [u8; 5])]) -> Option<u64> {
    let text = ft::text_range(lo)?;
    let mut st = lock();
    let targets = st.targets.entry(text).or_insert_with(|| {
        let code = int3::code_range(text.0, (text.1 - text.0) as usize, jumps);
        arch::branch_targets(&code, text.0)
    });
    let i = targets.partition_point(|&t| t < lo);
    targets.get(i).copied().filter(|&t| t < hi)
}

// ---- the threads' check ---------------------------------------------------------------

/// Whether every other thread is outside `forbidden` (see the module docs). A thread seen
/// inside is looked at again until [`BUSY_WAIT`] has passed (one leaving a slot or a trap
/// handler is out in microseconds; one stopped there is not). `trap_pc` (the probe's
/// address + 1) on a stack is the PC saved by the kernel for a SIGTRAP handler of the
/// probe's own int3 when its signal frame says so (SIGTRAP, `SI_KERNEL`): after
/// `synchronize_traps` such a handler sends its thread to the detour, not inside.
fn threads_outside(forbidden: &[(u64, u64)], trap_pc: u64) -> bool {
    let inside = |v: u64| forbidden.iter().any(|&(lo, hi)| v >= lo && v < hi);
    let me = crate::sys::gettid();
    let Ok(tids) = crate::sys::thread_ids() else {
        return false;
    };
    let mut maps: Option<Vec<(u64, u64)>> = None;
    let deadline = std::time::Instant::now() + BUSY_WAIT;
    let mut buf = vec![0u8; 64 * 1024];
    for tid in tids {
        if tid == me {
            continue;
        }
        let path = format!("/proc/self/task/{tid}/syscall");
        let sched = format!("/proc/self/task/{tid}/schedstat");
        let mut ran_from: Option<u64> = None;
        // Seen asleep in the way (its pc, or a signal frame on its stack, in the range): from
        // then on only a look at it asleep and clear lets it out (a handler that interrupted
        // the range and wakes now and then runs without leaving it).
        let mut seen_inside = false;
        // Until it has ended (None) or is out of the way.
        while let Some((sp, pc)) = thread_sp_pc(&path) {
            if sp == 0 && !seen_inside {
                // Runnable (on CPU or preempted): the kernel gives no registers. Once it has
                // run for PROGRESS of CPU time since first seen, it has left wherever it was
                // in the range (a few instructions, no way back in).
                let Some(ran) = run_ns(&sched) else {
                    break;
                };
                match ran_from {
                    Some(t) if ran >= t + PROGRESS_NS => break,
                    Some(_) => {}
                    None => ran_from = Some(ran),
                }
            }
            let clear = sp != 0 && !inside(pc) && {
                let maps = maps.get_or_insert_with(read_maps);
                match maps.iter().find(|&&(lo, hi)| sp >= lo && sp < hi) {
                    Some(&(_, top)) => !stack_points_inside(
                        sp,
                        top.min(sp.saturating_add(STACK_SCAN)),
                        &mut buf,
                        &inside,
                        trap_pc,
                    ),
                    None => false,
                }
            };
            if clear {
                break;
            }
            seen_inside |= sp != 0;
            if std::time::Instant::now() > deadline {
                if debug_refusals() {
                    eprintln!(
                        "optprobe: thread {tid} sp {sp:#x} pc {pc:#x} in the way: {:?}",
                        std::fs::read_to_string(&path)
                    );
                }
                return false;
            }
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    }
    true
}

/// CPU time a runnable thread must use after it is first seen before it counts as out of
/// the range.
const PROGRESS_NS: u64 = 20_000;

/// A thread's time on CPU (`schedstat`'s first field, ns).
fn run_ns(path: &str) -> Option<u64> {
    std::fs::read_to_string(path)
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A thread's user `sp` and `pc` while it sleeps (`(0, 0)` while it is runnable: the
/// kernel shows registers only of a task that is not `TASK_RUNNING`); `None` when it has
/// ended.
fn thread_sp_pc(path: &str) -> Option<(u64, u64)> {
    let s = std::fs::read_to_string(path).ok()?;
    if s.starts_with("running") {
        return Some((0, 0));
    }
    let f: Vec<&str> = s.split_whitespace().collect();
    let hex = |x: &str| u64::from_str_radix(x.trim_start_matches("0x"), 16).ok();
    match (
        f.len().checked_sub(2).and_then(|i| hex(f[i])),
        f.last().and_then(|x| hex(x)),
    ) {
        (Some(sp), Some(pc)) => Some((sp, pc)),
        _ => Some((0, 0)),
    }
}

/// Offsets in the kernel's x86-64 `struct rt_sigframe` from the saved `rip`
/// (`uc.uc_mcontext.rip` at 176) to `info.si_signo` (at 312) and `info.si_code` (320).
const FRAME_RIP_TO_SIGNO: u64 = 312 - 176;
const FRAME_RIP_TO_CODE: u64 = 320 - 176;
/// `si_code` of a trap raised by an `int3`.
const SI_KERNEL: i32 = 0x80;

fn stack_points_inside(
    sp: u64,
    top: u64,
    buf: &mut [u8],
    inside: &impl Fn(u64) -> bool,
    trap_pc: u64,
) -> bool {
    // The saved PC of a signal frame of the probe's own int3 (see `threads_outside`).
    let own_trap_frame = |pos: u64| {
        let word = |off: u64| crate::sys::read_u64_nofault(pos + off).map(|x| x as u32 as i32);
        crate::sys::read_u64_nofault(pos) == Some(trap_pc)
            && word(FRAME_RIP_TO_SIGNO) == Some(libc::SIGTRAP)
            && word(FRAME_RIP_TO_CODE) == Some(SI_KERNEL)
    };
    let mut at = sp & !7;
    'chunks: while at < top {
        let n = ((top - at) as usize).min(buf.len());
        let got = crate::sys::read_nofault(at, &mut buf[..n]);
        for (k, w) in buf[..got & !7].chunks_exact(8).enumerate() {
            let v = u64::from_le_bytes(w.try_into().expect("8 bytes"));
            if !inside(v) {
                continue;
            }
            let pos = at + 8 * k as u64;
            if own_trap_frame(pos) {
                continue;
            }
            // Below such a frame, in its handler's own frames (`regs.ip = addr + 1`, a
            // slot's address): that handler sends its thread to the detour. Go on above it.
            let mut q = pos + 8;
            while q < top.min(pos + HANDLER_FRAMES) && !own_trap_frame(q) {
                q += 8;
            }
            if q < top.min(pos + HANDLER_FRAMES) {
                at = q + 8;
                continue 'chunks;
            }
            if debug_refusals() {
                eprintln!("optprobe: stack word {v:#x} at {pos:#x} (sp {sp:#x})");
            }
            return true;
        }
        if got < n {
            break;
        }
        at += n as u64;
    }
    false
}

/// How far above a word the SIGTRAP frame of the handler that wrote it is looked for.
const HANDLER_FRAMES: u64 = 32 * 1024;

fn read_maps() -> Vec<(u64, u64)> {
    let Ok(s) = std::fs::read_to_string("/proc/self/maps") else {
        return Vec::new();
    };
    s.lines()
        .filter_map(|l| {
            let r = l.split_whitespace().next()?;
            let (a, b) = r.split_once('-')?;
            Some((
                u64::from_str_radix(a, 16).ok()?,
                u64::from_str_radix(b, 16).ok()?,
            ))
        })
        .collect()
}

// ---- probe path -----------------------------------------------------------------------

/// Probe path: the trampoline's callback (the kernel's `optimized_callback()`): as an int3
/// hit, without the trap. A kprobe already running on the thread counts `nmissed`; else the
/// pre_handlers run with `regs.ip = addr + 1`; a change of `regs.ip` is ignored, the other
/// registers are the thread's when the detour goes on.
unsafe extern "C" fn optimized_callback(op: *const (), regs: *mut PtRegs) {
    // SAFETY: `op` is the detour's first word, a leaked `OptProbe`; `regs` the trampoline's
    // frame on this thread's stack.
    let (op, regs) = unsafe { (&*(op as *const OptProbe), &mut *regs) };
    let Some(probes) = published().and_then(|l| l.get(op.addr)) else {
        return;
    };
    let Some(t) = super::hit_begin(probes) else {
        return;
    };
    regs.ip = op.addr + 1;
    for p in probes.iter().filter(|p| !p.is_disabled()) {
        t.kprobe.set(*p as *const Kprobe);
        if let Some(pre) = p.pre_handler {
            pre(p, regs);
        }
    }
    t.kprobe.set(std::ptr::null());
    t.kprobe_sp.set(0);
}

fn detour_of(pc: u64) -> Option<&'static Detour> {
    // Acquire pairs with the Release swap in `publish`.
    let p = PUBLISHED.load(Ordering::Acquire);
    if p.is_null() {
        return None;
    }
    // SAFETY: published tables are never freed.
    let all = unsafe { &*p };
    let i = all.partition_point(|d| d.start <= pc).checked_sub(1)?;
    let d = &all[i];
    (pc < d.end).then_some(d)
}

fn shown_in(d: &Detour, pc: u64) -> u64 {
    let i = d.map.partition_point(|&(at, _)| at <= pc);
    d.map[i.saturating_sub(1)].1
}

/// Probe path: the address an asynchronous signal's handler is shown for a pc in a detour.
pub(super) fn shown_pc(pc: u64) -> Option<u64> {
    detour_of(pc).map(|d| shown_in(d, pc))
}

/// Probe path: a program's asynchronous signal `sig` is about to be delivered to a thread
/// whose context `uc` is in a detour (`text_poke`'s wrapper asks, after `tramp_signals`,
/// which moves a context out of the trampoline to the detour's `call` or to its return
/// address). The program must see what an int3 hit of the probe would let it see (the
/// kernel's uprobes hold signals until the probed instruction has run out of line,
/// `uprobe_deny_signal`): the thread before the hit at the probed instruction, or after the
/// hit with the probed instruction done. So:
/// - before the trampoline's call: the detour's own instructions are undone and the thread
///   stands at the probed instruction with its own registers (the hit happens when the
///   handler returns there, or never if it jumps out);
/// - after the trampoline returned and before the first relocated instruction: the detour's
///   own instructions are done for the thread, and that instruction runs alone (emulated, or
///   from the probe's step slot with the signal held until its trap, which delivers it).
///
/// Returns whether the signal is held (the program's handler is not called now).
pub(crate) fn on_program_signal(
    sig: libc::c_int,
    info: *mut libc::siginfo_t,
    uc: &mut libc::ucontext_t,
) -> bool {
    let pc = uc.uc_mcontext.gregs[libc::REG_RIP as usize] as u64;
    let Some(d) = detour_of(pc) else {
        return false;
    };
    let off = pc - d.start;
    let g = &mut uc.uc_mcontext.gregs;
    if arch::undo_entry(off, g) {
        g[libc::REG_RIP as usize] = d.map[0].1 as libc::greg_t;
        return false;
    }
    if arch::finish_exit(off, g) {
        g[libc::REG_RIP as usize] = (d.start + DETOUR_BODY) as libc::greg_t;
    } else if off > DETOUR_BODY {
        // Inside a relocated instruction: a call relocated as several instructions is put
        // back at its start (the program sees the call not made); the first relocated
        // instruction's start is the place after the hit, handled below.
        let i = d.map.partition_point(|&(at, _)| at <= pc) - 1;
        if !arch::undo_partial_call(d.map[i].0, pc, g) || i != 1 {
            return false;
        }
    } else if off != DETOUR_BODY {
        return false;
    }
    // (The wrapper never sees the fault signals, nor SIGTRAP: a fault of the relocated
    // instruction is `fault_pc`'s.)
    let Some(first) = d.first else {
        return false;
    };
    let resume = d.map.get(2).map_or(d.end, |&(at, _)| at);
    if int3::run_alone(uc, d.map[0].1, first, resume, probe_state::bit(sig)) {
        tramp_signals::queue_again(sig, info);
        return true;
    }
    false
}

/// Probe path: the address a fault at `pc` in a detour is shown at: the probed instruction's
/// for a fault before the second relocated instruction (a handler that returns runs it
/// again, through the probe), else the detour's own.
pub(super) fn fault_pc(pc: u64) -> Option<u64> {
    let d = detour_of(pc)?;
    let second = d.map.get(2).map_or(u64::MAX, |&(at, _)| at);
    Some(if pc < second { d.map[0].1 } else { pc })
}
