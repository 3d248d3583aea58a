//! A program's signal that arrives while its thread runs an ftrace trampoline (or a callback
//! the trampoline called) is held until the trampoline is done, then delivered as if it had
//! arrived at the instruction the trampoline returns to.
//!
//! Why: a handler that leaves by `siglongjmp` (a timeout on a loop of traced calls) would
//! otherwise cut a hit anywhere in ftprobe's code, after some of its events were written and
//! before others, with nothing left to say which; and the handler would see a PC inside
//! ftprobe. The kernel never has this problem: its ftrace callbacks run with preemption
//! off, and a signal is only delivered on the way back to user space.
//!
//! How: every trampoline keeps a per-thread *frame word* (a TLS word, initial-exec, at a
//! fixed offset from `%fs`): its prologue saves the word at `[rbp - 8]` and stores its own
//! `rbp` in it; its epilogue puts the saved word back, then tests the word's bit 0 and, when
//! set, ends with an `int3` instead of its `ret`. ftprobe's wrapper of the program's
//! handlers (`text_poke`) asks [`on_program_signal`] first:
//! - the PC is in the trampoline's first four instructions (nothing of the hit done yet):
//!   the thread is put back at the site, the call not taken, and the handler runs now (the
//!   hit happens when the handler returns; never, if it jumps out);
//! - the PC is after the epilogue's restore of the frame word (the hit is complete): the
//!   return is done for the thread, and the handler runs now, at the return address;
//! - otherwise, when the frame word points at a live trampoline frame above the interrupted
//!   stack pointer: the signal is *deferred*. The outermost trampoline frame's saved word
//!   gets bit 0, the thread's mask before the signal is kept in TLS, the signal is blocked in
//!   the interrupted context and queued again to the thread with its own `siginfo`
//!   (`rt_tgsigqueueinfo`, allowed for the own process with any `si_code`), and the handler
//!   is not called. When the outermost trampoline returns, its `int3` reaches ftprobe's
//!   SIGTRAP handler ([`on_trap`]): it does the return, clears the bit and restores the kept
//!   mask in the context, so the kernel delivers the held signal as the handler returns, at
//!   the return address, with the program's own action (flags, mask, stack), as it would have.
//!
//! A deferral costs a trap (~2 us here); a hit without a signal pays two TLS stores, one TLS
//! load and a test. Signals whose handler ftprobe does not wrap (one installed with a raw
//! `rt_sigaction` system call) are not held. The function_graph return trampoline is not
//! covered yet.

use std::arch::{asm, global_asm};

use super::tramp_area;
use crate::sys;

// The frame word (offset 0), the kept mask (offset 8) and the trap word (offset 16: see
// [`trap_in_progress`]). Initial-exec TLS: a fixed offset from the thread pointer in every thread
// (the linker marks the object STATIC_TLS, so even a `dlopen`ed copy gets a static TLS
// block, or fails to load).
global_asm!(
    ".pushsection .tbss,\"awT\",@nobits",
    ".balign 16",
    ".globl ftprobe_tramp_frame",
    ".hidden ftprobe_tramp_frame",
    ".type ftprobe_tramp_frame,@object",
    ".size ftprobe_tramp_frame,32",
    "ftprobe_tramp_frame: .zero 32",
    ".popsection",
);

/// The trap word's offset from the frame word's.
pub(super) const TRAP_WORD: i32 = 16;
/// How far below the trap word a context may stand and still be inside ftprobe's SIGTRAP
/// handler (its frames and a probe handler's are far smaller).
const TRAP_FRAME_SPAN: u64 = 1 << 20;

// ftprobe's SIGTRAP handler is entered through `ftprobe_sigtrap_entry` (`text_poke`), which
// keeps the previous trap word on the stack and puts its own stack pointer in the word for
// the whole of the handler's work; its last instructions put the previous word back.
extern "C" {
    static ftprobe_sigtrap_entry: u8;
    static ftprobe_sigtrap_push: u8;
    static ftprobe_sigtrap_set: u8;
    static ftprobe_sigtrap_ret: u8;
}

/// Probe path (the wrapper of the program's handlers): whether the interrupted context (PC
/// `pc`, stack pointer `sp`) is inside ftprobe's SIGTRAP handler: at the entry's first three
/// instructions (the word not set yet: the kernel delivers a pending signal together with
/// the trap, its frame above the SIGTRAP one, interrupting the handler's first
/// instruction), at its last (`ret`, the word given back), on the restorer it returns into,
/// or anywhere the trap word covers.
///
/// Why: the SIGTRAP handler runs with asynchronous signals open (`SA_NODEFER`, an empty
/// `sa_mask`). Blocking them there, as before, made the kernel route a process-directed
/// signal (`SIGPROF` of the CPU time the handler's thread used) to another thread, whose
/// `nanosleep` then failed with `EINTR` (issue 26, item 1): the kernel picks the thread that
/// caused a timer signal, or the thread group leader for a `kill`, only if that thread does
/// not block it (`complete_signal()` in kernel/signal.c). Instead, a program's signal that
/// arrives inside the handler is held by ftprobe's wrapper of the program's handlers and
/// delivered to the same thread when the handler returns ([`hold_if_in_trap`]). A trap word
/// left by a handler that a non-local jump left (`longjmp` from a handler ftprobe does not
/// wrap) is cleared by [`before_longjmp`], and is not taken for live when `sp` is above it.
pub fn trap_in_progress(pc: u64, sp: u64) -> bool {
    let entry = &raw const ftprobe_sigtrap_entry as u64;
    let push = &raw const ftprobe_sigtrap_push as u64;
    let set = &raw const ftprobe_sigtrap_set as u64;
    let ret = &raw const ftprobe_sigtrap_ret as u64;
    if pc == entry || pc == push || pc == set || pc == ret || at_trap_sigreturn(pc, sp) {
        return true;
    }
    let word = tls_load(tls_offset() + TRAP_WORD);
    word != 0 && sp <= word && word - sp < TRAP_FRAME_SPAN
}

/// `mov $15,%rax; syscall`: the C library's signal restorer (`__restore_rt`), which the
/// SIGTRAP handler returns into.
const RESTORER: [u8; 9] = [0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05];
/// Where a signal frame's `siginfo` lies above the restorer's stack pointer (the return
/// address popped): after `struct ucontext` (x86-64 `struct rt_sigframe`).
const SIGINFO_IN_FRAME: u64 = 304;

/// Whether the PC is on the restorer of a SIGTRAP frame of an int3 (`si_code` SI_KERNEL):
/// the SIGTRAP handler has returned and its `rt_sigreturn` is about to restore the
/// program's context. A signal held there is delivered right after, at the program's PC.
fn at_trap_sigreturn(pc: u64, sp: u64) -> bool {
    let at = |start: u64| {
        let (Some(a), Some(b)) = (
            sys::read_u64_nofault(start),
            sys::read_u64_nofault(start.wrapping_add(1)),
        ) else {
            return false;
        };
        a.to_le_bytes() == RESTORER[..8] && b.to_le_bytes()[7] == RESTORER[8]
    };
    if !(at(pc) || at(pc.wrapping_sub(7))) {
        return false;
    }
    let Some(w) = sys::read_u64_nofault(sp.wrapping_add(SIGINFO_IN_FRAME)) else {
        return false;
    };
    let Some(c) = sys::read_u64_nofault(sp.wrapping_add(SIGINFO_IN_FRAME + 8)) else {
        return false;
    };
    w as u32 as i32 == libc::SIGTRAP && c as u32 as i32 == libc::SI_KERNEL
}

/// Probe path: the SIGTRAP handler hands a trap that is not ftprobe's to the program's
/// action: from here on it is the program's handler running, not ftprobe's (its signals are
/// not held); the trap word is the one before this handler's (kept at the word's address).
pub fn suspend_trap() {
    let at = tls_offset() + TRAP_WORD;
    let word = tls_load(at);
    if word != 0 {
        let outer = sys::read_u64_nofault(word).unwrap_or(0);
        tls_store(at, outer);
    }
}

/// Before a non-local jump to `target_sp`: a trap word of a frame the jump leaves is cleared.
pub fn before_longjmp(target_sp: u64) {
    let at = tls_offset() + TRAP_WORD;
    let word = tls_load(at);
    if word != 0 && target_sp > word {
        tls_store(at, 0);
    }
}

/// Probe path: if the program's signal `sig` interrupted ftprobe's SIGTRAP handler (context
/// `uc`, [`trap_in_progress`]), hold it: blocked in that context and queued again to this
/// thread with its own `siginfo`, it is delivered when the SIGTRAP handler returns and the
/// program's mask comes back. Whether it was held.
pub fn hold_if_in_trap(
    sig: libc::c_int,
    info: *mut libc::siginfo_t,
    uc: &mut libc::ucontext_t,
) -> bool {
    let sp = *reg(uc, libc::REG_RSP) as u64;
    let pc = *reg(uc, libc::REG_RIP) as u64;
    if !trap_in_progress(pc, sp) {
        return false;
    }
    *mask_word(uc) |= crate::probe_state::bit(sig);
    queue_again(sig, info);
    true
}

/// The frame word's offset from the thread pointer (`%fs` base), the same in every thread.
pub fn tls_offset() -> i32 {
    let off: i64;
    // SAFETY: loads the GOT entry the linker filled with the TLS offset (initial-exec model);
    // no other memory access.
    unsafe {
        asm!(
            "mov {}, qword ptr [rip + ftprobe_tramp_frame@GOTTPOFF]",
            out(reg) off,
            options(nostack, readonly, preserves_flags)
        )
    };
    off as i32
}

fn tls_load(at: i32) -> u64 {
    let v: u64;
    // SAFETY: reads this thread's own TLS word at a link-time offset of its static TLS block.
    unsafe {
        asm!("mov {v}, qword ptr fs:[{o}]", o = in(reg) at as i64, v = out(reg) v,
             options(nostack, readonly, preserves_flags))
    };
    v
}

fn tls_store(at: i32, v: u64) {
    // SAFETY: writes this thread's own TLS word at a link-time offset of its static TLS block.
    unsafe {
        asm!("mov qword ptr fs:[{o}], {v}", o = in(reg) at as i64, v = in(reg) v,
             options(nostack, preserves_flags))
    };
}

/// This thread's frame word: the innermost running trampoline frame's `rbp` (0: none), bit 0
/// set after the outermost frame restored it when a signal is held.
pub fn frame_word() -> u64 {
    tls_load(tls_offset())
}

/// Where a PC is, for a trampoline's copy (the patterns below, with the frame word's offset).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// Not at an instruction these patterns know.
    Elsewhere,
    /// At the prologue's instruction N (0-3): the hit has not started; undo N instructions.
    Rewind(u8),
    /// At the epilogue's restore of the frame word: the frame is still running.
    Running,
    /// At the epilogue's `pop rbp`: the hit is complete.
    PopRbpReturn,
    /// At the epilogue's test, `jnz`, `ret` or `int3`: the hit is complete.
    Return,
    /// Just after the epilogue's `int3` (the trap's PC): the held signals' delivery point.
    DeferredTrap,
}

const OP_PUSH_RBP: &[u8] = &[0x55];
const OP_MOV_RBP_RSP: &[u8] = &[0x48, 0x89, 0xe5];
const OP_POP_RBP: &[u8] = &[0x5d];
const OP_JNZ_1: &[u8] = &[0x75, 0x01];
const OP_RET: &[u8] = &[0xc3];
const OP_INT3: &[u8] = &[0xcc];

/// The instructions of the prologue and of the epilogue, as the templates assemble them.
fn sequences(tls: i32) -> [[Vec<u8>; 6]; 2] {
    let t = tls.to_le_bytes();
    let with = |op: &[u8], tail: &[u8]| [op, &t[..], tail].concat();
    [
        [
            OP_PUSH_RBP.to_vec(),
            OP_MOV_RBP_RSP.to_vec(),
            with(&[0x64, 0xff, 0x34, 0x25], &[]), // push qword ptr fs:[tls]
            with(&[0x64, 0x48, 0x89, 0x2c, 0x25], &[]), // mov fs:[tls], rbp
            Vec::new(),
            Vec::new(),
        ],
        [
            with(&[0x64, 0x8f, 0x04, 0x25], &[]), // pop qword ptr fs:[tls]
            OP_POP_RBP.to_vec(),
            with(&[0x64, 0xf6, 0x04, 0x25], &[0x01]), // test byte ptr fs:[tls], 1
            OP_JNZ_1.to_vec(),
            OP_RET.to_vec(),
            OP_INT3.to_vec(),
        ],
    ]
}

/// Where `pc` is (module docs), reading code bytes with `read` (`None`: not readable).
/// Allocates: the probe path uses patterns made ahead (`prepare`).
pub fn classify(read: &impl Fn(u64) -> Option<u8>, pc: u64, tls: i32) -> Place {
    Patterns::new(tls).classify(read, pc)
}

/// The two sequences flattened, with each instruction's offset: made once, outside any
/// signal handler.
struct Patterns {
    prologue: ([u8; 32], usize, [usize; 5]),
    epilogue: ([u8; 32], usize, [usize; 7]),
}

impl Patterns {
    fn new(tls: i32) -> Patterns {
        let [pro, epi] = sequences(tls);
        let flat = |seq: &[Vec<u8>]| -> ([u8; 32], usize, Vec<usize>) {
            let mut b = [0u8; 32];
            let mut offs = vec![0];
            let mut n = 0;
            for op in seq.iter().filter(|o| !o.is_empty()) {
                b[n..n + op.len()].copy_from_slice(op);
                n += op.len();
                offs.push(n);
            }
            (b, n, offs)
        };
        let (pb, pn, po) = flat(&pro);
        let (eb, en, eo) = flat(&epi);
        Patterns {
            prologue: (pb, pn, po.try_into().expect("4 instructions")),
            epilogue: (eb, en, eo.try_into().expect("6 instructions")),
        }
    }

    /// Whether `bytes[..n]` is at `start`.
    fn matches(read: &impl Fn(u64) -> Option<u8>, start: u64, bytes: &[u8]) -> bool {
        bytes
            .iter()
            .enumerate()
            .all(|(i, &b)| read(start.wrapping_add(i as u64)) == Some(b))
    }

    fn classify(&self, read: &impl Fn(u64) -> Option<u8>, pc: u64) -> Place {
        let (pb, pn, po) = &self.prologue;
        for (k, &off) in po[..4].iter().enumerate() {
            if Self::matches(read, pc.wrapping_sub(off as u64), &pb[..*pn]) {
                return Place::Rewind(k as u8);
            }
        }
        let (eb, en, eo) = &self.epilogue;
        for (k, &off) in eo.iter().enumerate() {
            if Self::matches(read, pc.wrapping_sub(off as u64), &eb[..*en]) {
                return match k {
                    0 => Place::Running,
                    1 => Place::PopRbpReturn,
                    2..=5 => Place::Return,
                    _ => Place::DeferredTrap,
                };
            }
        }
        Place::Elsewhere
    }
}

/// The patterns for this process's offset, made by [`prepare`] before any trampoline runs.
static PATTERNS: std::sync::OnceLock<Patterns> = std::sync::OnceLock::new();

/// Make the patterns the signal path uses (call before the first trampoline is installed).
pub fn prepare() {
    PATTERNS.get_or_init(|| Patterns::new(tls_offset()));
}

/// Where `pc` is, if it lies in a trampoline area (probe path: loads only).
fn place_of(pc: u64) -> Place {
    let (Some(p), Some((lo, hi))) = (PATTERNS.get(), tramp_area::area_of(pc)) else {
        return Place::Elsewhere;
    };
    let read = |a: u64| {
        // SAFETY: [lo, hi) is a trampoline area: mapped for the process's life, readable.
        (a >= lo && a < hi).then(|| unsafe { std::ptr::read_volatile(a as *const u8) })
    };
    p.classify(&read, pc)
}

/// What the wrapper of a program's handler does after [`on_program_signal`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Call the program's handler now (the context may have been moved out of a trampoline).
    Deliver,
    /// The signal is held until the trampoline returns: do not call the handler. When the
    /// program's action has `SA_RESETHAND`, the kernel reset it for this delivery: the
    /// caller installs it again, so that the held delivery finds it.
    Deferred,
}

fn reg(uc: &mut libc::ucontext_t, r: libc::c_int) -> &mut i64 {
    &mut uc.uc_mcontext.gregs[r as usize]
}

fn mask_word(uc: &mut libc::ucontext_t) -> &mut u64 {
    crate::probe_state::mask_word(&mut uc.uc_sigmask)
}

/// Probe path: the program's handler for `sig` is about to run on this thread, interrupted
/// in context `uc` (module docs).
pub fn on_program_signal(
    sig: libc::c_int,
    info: *mut libc::siginfo_t,
    uc: &mut libc::ucontext_t,
) -> Verdict {
    let pc = *reg(uc, libc::REG_RIP) as u64;
    let sp = *reg(uc, libc::REG_RSP) as u64;
    let word = frame_word();
    match place_of(pc) {
        Place::Rewind(k) => {
            let Some(ret) = rewind(uc, k, sp) else {
                return Verdict::Deliver;
            };
            *reg(uc, libc::REG_RIP) = ret.wrapping_sub(5) as i64;
            Verdict::Deliver
        }
        Place::PopRbpReturn => {
            if let Some(rbp) = sys::read_u64_nofault(sp) {
                *reg(uc, libc::REG_RBP) = rbp as i64;
                *reg(uc, libc::REG_RSP) = sp.wrapping_add(8) as i64;
                complete_return(uc);
            }
            Verdict::Deliver
        }
        Place::Return => {
            complete_return(uc);
            Verdict::Deliver
        }
        Place::Running => defer(sig, info, uc, word),
        Place::DeferredTrap | Place::Elsewhere => {
            let frame = word & !7;
            if frame != 0 && sp < frame && is_trampoline_frame(frame) {
                defer(sig, info, uc, word)
            } else {
                Verdict::Deliver
            }
        }
    }
}

/// Undo the prologue's first `k` instructions in `uc`; returns the trampoline's return
/// address (the site + 5).
fn rewind(uc: &mut libc::ucontext_t, k: u8, sp: u64) -> Option<u64> {
    let at = |i: u64| sys::read_u64_nofault(sp.wrapping_add(8 * i));
    let (ret, pops, rbp) = match k {
        0 => (at(0)?, 1, None),
        1 => (at(1)?, 2, None),
        2 => (at(1)?, 2, Some(at(0)?)),
        _ => (at(2)?, 3, Some(at(1)?)),
    };
    if let Some(rbp) = rbp {
        *reg(uc, libc::REG_RBP) = rbp as i64;
    }
    *reg(uc, libc::REG_RSP) = sp.wrapping_add(8 * pops) as i64;
    Some(ret)
}

/// Do the trampoline's `ret` for the thread (its stack pointer at the return address); when
/// signals were held for it, give the context the kept mask (they are delivered as this
/// handler returns).
fn complete_return(uc: &mut libc::ucontext_t) {
    let sp = *reg(uc, libc::REG_RSP) as u64;
    let Some(ret) = sys::read_u64_nofault(sp) else {
        return;
    };
    *reg(uc, libc::REG_RIP) = ret as i64;
    *reg(uc, libc::REG_RSP) = sp.wrapping_add(8) as i64;
    let off = tls_offset();
    let word = tls_load(off);
    if word & 1 != 0 {
        tls_store(off, word & !1);
        *mask_word(uc) = tls_load(off + 8);
    }
}

/// Whether `frame` (a frame word) is a running trampoline's frame: its return address is
/// after a `call` to a trampoline's first instruction.
fn is_trampoline_frame(frame: u64) -> bool {
    let Some(ret) = sys::read_u64_nofault(frame.wrapping_add(8)) else {
        return false;
    };
    let mut call = [0u8; 5];
    if sys::read_nofault(ret.wrapping_sub(5), &mut call) != 5 || call[0] != 0xe8 {
        return false;
    }
    let rel = i32::from_le_bytes([call[1], call[2], call[3], call[4]]);
    place_of(ret.wrapping_add(rel as i64 as u64)) == Place::Rewind(0)
}

/// Hold `sig` until the outermost running trampoline returns (module docs).
fn defer(
    sig: libc::c_int,
    info: *mut libc::siginfo_t,
    uc: &mut libc::ucontext_t,
    word: u64,
) -> Verdict {
    // The outermost frame: follow the saved words (each frame's at [rbp - 8]).
    let mut frame = word & !7;
    let mut slot = None;
    for _ in 0..64 {
        if frame == 0 {
            break;
        }
        let Some(saved) = sys::read_u64_nofault(frame.wrapping_sub(8)) else {
            break;
        };
        if saved & !7 == 0 {
            slot = Some((frame.wrapping_sub(8), saved));
            break;
        }
        frame = saved & !7;
    }
    let Some((slot, saved)) = slot else {
        return Verdict::Deliver;
    };
    let off = tls_offset();
    if saved & 1 == 0 {
        tls_store(off + 8, *mask_word(uc));
        // SAFETY: `slot` is the outermost running trampoline frame's saved word on this
        // thread's stack (read just above): the epilogue pops it into the frame word.
        unsafe { std::ptr::write_volatile(slot as *mut u64, saved | 1) };
    }
    *mask_word(uc) |= crate::probe_state::bit(sig);
    queue_again(sig, info);
    Verdict::Deferred
}

/// Probe path: block `sig` in the running handler (it may run with `SA_NODEFER`) and queue
/// it again to this thread with its own `siginfo`: it waits until the interrupted context's
/// mask, which the caller made block it, is restored without it.
pub fn queue_again(sig: libc::c_int, info: *mut libc::siginfo_t) {
    let set = crate::probe_state::bit(sig);
    // SAFETY: rt_sigprocmask(SIG_BLOCK, &set, NULL, 8) reads 8 bytes of our own local.
    unsafe {
        sys::raw_syscall4(
            libc::SYS_rt_sigprocmask,
            libc::SIG_BLOCK as u64,
            &set as *const u64 as u64,
            0,
            8,
        )
    };
    // SAFETY: getpid/gettid take no arguments; rt_tgsigqueueinfo reads the kernel's siginfo
    // of this delivery (valid for the handler's duration).
    let r = unsafe {
        let pid = sys::raw_syscall6(libc::SYS_getpid, [0; 6]);
        let tid = sys::raw_syscall6(libc::SYS_gettid, [0; 6]);
        sys::raw_syscall4(
            libc::SYS_rt_tgsigqueueinfo,
            pid as u64,
            tid as u64,
            sig as u64,
            info as u64,
        )
    };
    if r != 0 {
        // SAFETY: as above, with the plain tgkill.
        unsafe {
            let pid = sys::raw_syscall6(libc::SYS_getpid, [0; 6]);
            let tid = sys::raw_syscall6(libc::SYS_gettid, [0; 6]);
            sys::raw_syscall6(
                libc::SYS_tgkill,
                [pid as u64, tid as u64, sig as u64, 0, 0, 0],
            );
        }
    }
}

/// Probe path: ftprobe's SIGTRAP handler asks whether this trap is a trampoline's `int3` that
/// ends a frame with signals held; if so, does the return and restores the kept mask in the
/// context (the held signals are delivered as the SIGTRAP handler returns).
pub fn on_trap(uc: &mut libc::ucontext_t) -> bool {
    let pc = *reg(uc, libc::REG_RIP) as u64;
    if place_of(pc) != Place::DeferredTrap {
        return false;
    }
    let off = tls_offset();
    let word = tls_load(off);
    tls_store(off, word & !1);
    let sp = *reg(uc, libc::REG_RSP) as u64;
    if let Some(ret) = sys::read_u64_nofault(sp) {
        *reg(uc, libc::REG_RIP) = ret as i64;
        *reg(uc, libc::REG_RSP) = sp.wrapping_add(8) as i64;
    }
    *mask_word(uc) = tls_load(off + 8);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_frame_word_is_per_thread_at_one_offset() {
        let off = tls_offset();
        assert!(
            off < 0,
            "variant II TLS lies below the thread pointer: {off}"
        );
        tls_store(off, 0x1230);
        let other = std::thread::spawn(move || {
            let before = tls_load(off);
            tls_store(off, 8);
            before
        })
        .join()
        .unwrap();
        assert_eq!(other, 0, "a new thread starts with no frame");
        assert_eq!(frame_word(), 0x1230);
        tls_store(off, 0);
    }
}
