//! The signal frame a remote call returns through ([`super::Attached::call`]): what
//! `rt_sigreturn` reads on x86-64 (`struct rt_sigframe`: the return address, a `ucontext`
//! with the registers, the signal mask and a pointer to the FP/extended state, a
//! `siginfo`), laid out by hand so that the called function returns into a
//! `mov $15,%rax; syscall` and the thread resumes exactly where it was, whether or not
//! ftprobe is still there to put it back.
//!
//! Facts from the kernel's ABI (`<asm/sigcontext.h>`, `<asm/ucontext.h>`): `rt_sigreturn`
//! takes the frame at `rsp - 8` (the return address was popped), restores the general
//! registers, `rip`, the flags the user may change, `cs`/`ss`, the signal mask and the
//! alternate signal stack (`uc_stack`: an invalid one is refused and leaves the thread's as
//! it is), and the FP state from `fpstate`: an XSAVE image whose `sw_reserved` bytes carry
//! `FP_XSTATE_MAGIC1` and the sizes, followed by `FP_XSTATE_MAGIC2`, or a legacy FXSAVE
//! image (no magic: the extended components are reset). `orig_rax` becomes -1: nothing is
//! restarted by the kernel, so the frame's `rip`/`rax` re-issue an interrupted system call
//! themselves ([`resume_regs`]).

use super::ptrace::Regs;

/// `struct ucontext` flags: FP state is an XSAVE image, `ss` saved, restore `ss` as saved.
const UC_FP_XSTATE: u64 = 0x1;
const UC_SIGCONTEXT_SS: u64 = 0x2;
const UC_STRICT_RESTORE_SS: u64 = 0x4;
const FP_XSTATE_MAGIC1: u32 = 0x4650_5853;
const FP_XSTATE_MAGIC2: u32 = 0x4650_5845;
/// Where an FXSAVE image keeps the software bytes (`struct _fpx_sw_bytes`).
const SW_RESERVED: usize = 464;
const FXSAVE_LEN: usize = 512;
/// The return address (8), `struct ucontext` (304), `struct siginfo` (128).
pub const FRAME_LEN: u64 = 8 + 304 + 128;
/// Offsets in the frame.
const UC_FLAGS: usize = 8;
const UC_STACK_FLAGS: usize = 8 + 24;
const MCONTEXT: usize = 8 + 40;
const SIGMASK: usize = 8 + 296;
/// `uc_stack.ss_flags` that `sigaltstack` refuses (EINVAL): the thread's alternate stack
/// is left as it is.
const SS_FLAGS_INVALID: u32 = 0x7fff_fff0;

/// `-ERESTART_RESTARTBLOCK`.
const ERESTART_RESTARTBLOCK: i64 = -516;

/// The registers a thread stopped at `saved` resumes with when nothing is delivered to it:
/// a system call the stop interrupted (`rax` one of the `-ERESTART*`) is issued again
/// (`rip` back on the `syscall`, `rax` its number). `rt_sigreturn` makes every pending
/// restart block fail (`EINTR`), so a call that would resume through `restart_syscall`
/// (`nanosleep`, a `poll` or `futex` with a timeout) is issued again whole, with its own
/// arguments (still in their registers): it waits its full time again.
pub fn resume_regs(saved: &Regs) -> Regs {
    let mut r = *saved;
    let nr = saved.orig_rax as i64;
    let rax = saved.rax as i64;
    if nr >= 0 && (super::ERESTART.contains(&rax) || rax == ERESTART_RESTARTBLOCK) {
        r.rip = saved.rip.wrapping_sub(2);
        r.rax = saved.orig_rax;
    }
    r.orig_rax = u64::MAX;
    r
}

/// A frame and its FP state, for writing into the target.
#[derive(Debug)]
pub struct Frame {
    /// Where the frame starts (its return address): the called function's `rsp` on entry.
    pub addr: u64,
    pub bytes: Vec<u8>,
    /// Where the FP state starts (64-aligned).
    pub fp_addr: u64,
    pub fp: Vec<u8>,
}

/// The frame for a thread to resume with `resume`, `mask` and the extended state `xstate`
/// (`PTRACE_GETREGSET NT_X86_XSTATE`'s image, which carries the software bytes), placed
/// below `top`; the called function returns to `ret`.
pub fn build(resume: &Regs, mask: u64, xstate: &[u8], top: u64, ret: u64) -> Frame {
    let sw = |off: usize| -> u32 {
        xstate
            .get(SW_RESERVED + off..SW_RESERVED + off + 4)
            .map_or(0, |b| u32::from_le_bytes(b.try_into().unwrap()))
    };
    let xsave = xstate.len() > FXSAVE_LEN
        && sw(0) == FP_XSTATE_MAGIC1
        && sw(16) as usize == xstate.len()
        && sw(4) as usize == xstate.len() + 4;
    let mut fp;
    if xsave {
        fp = xstate.to_vec();
        fp.extend_from_slice(&FP_XSTATE_MAGIC2.to_le_bytes());
    } else {
        // The legacy image: x87 and SSE state; no magic (the rest is reset).
        fp = vec![0u8; FXSAVE_LEN];
        let n = xstate.len().min(FXSAVE_LEN);
        fp[..n].copy_from_slice(&xstate[..n]);
        fp[SW_RESERVED..FXSAVE_LEN].fill(0);
    }
    let fp_addr = (top - fp.len() as u64) & !63;
    // A function is entered with rsp = 8 mod 16 (its return address just pushed).
    let addr = ((fp_addr - FRAME_LEN) & !15) - 8;
    let mut b = vec![0u8; FRAME_LEN as usize];
    let mut put = |off: usize, v: &[u8]| b[off..off + v.len()].copy_from_slice(v);
    put(0, &ret.to_le_bytes());
    let flags = UC_SIGCONTEXT_SS | UC_STRICT_RESTORE_SS | if xsave { UC_FP_XSTATE } else { 0 };
    put(UC_FLAGS, &flags.to_le_bytes());
    put(UC_STACK_FLAGS, &SS_FLAGS_INVALID.to_le_bytes());
    let r = resume;
    let gprs = [
        r.r8, r.r9, r.r10, r.r11, r.r12, r.r13, r.r14, r.r15, r.rdi, r.rsi, r.rbp, r.rbx, r.rdx,
        r.rax, r.rcx, r.rsp, r.rip, r.eflags,
    ];
    for (i, v) in gprs.iter().enumerate() {
        put(MCONTEXT + 8 * i, &v.to_le_bytes());
    }
    // cs, gs, fs, ss (16 bits each).
    let segs = [r.cs, r.gs, r.fs, r.ss];
    for (i, v) in segs.iter().enumerate() {
        put(MCONTEXT + 144 + 2 * i, &(*v as u16).to_le_bytes());
    }
    // err, trapno, oldmask, cr2: not read back. fpstate:
    put(MCONTEXT + 184, &fp_addr.to_le_bytes());
    put(SIGMASK, &mask.to_le_bytes());
    Frame {
        addr,
        bytes: b,
        fp_addr,
        fp,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn regs() -> Regs {
        // SAFETY: user_regs_struct is plain integers; all-zero is valid.
        let mut r: Regs = unsafe { std::mem::zeroed() };
        r.rip = 0x401002;
        r.rax = (-512i64) as u64;
        r.orig_rax = 0;
        r.rsp = 0x7fff_0000_1000;
        r.cs = 0x33;
        r.ss = 0x2b;
        r.eflags = 0x246;
        r
    }

    #[test]
    fn an_interrupted_call_is_issued_again() {
        let r = resume_regs(&regs());
        assert_eq!((r.rip, r.rax, r.orig_rax), (0x401000, 0, u64::MAX));
        let mut s = regs();
        s.rax = (-516i64) as u64;
        s.orig_rax = 35;
        let r = resume_regs(&s);
        assert_eq!((r.rip, r.rax), (0x401000, 35));
        // Not in a system call, or one that completed: as it is.
        let mut s = regs();
        s.orig_rax = u64::MAX;
        s.rax = 7;
        let r = resume_regs(&s);
        assert_eq!((r.rip, r.rax), (0x401002, 7));
    }

    #[test]
    fn frame_layout() {
        let mut x = vec![0u8; 832];
        x[SW_RESERVED..SW_RESERVED + 4].copy_from_slice(&FP_XSTATE_MAGIC1.to_le_bytes());
        x[SW_RESERVED + 4..SW_RESERVED + 8].copy_from_slice(&836u32.to_le_bytes());
        x[SW_RESERVED + 16..SW_RESERVED + 20].copy_from_slice(&832u32.to_le_bytes());
        let top = 0x7fff_0000_0f00;
        let f = build(&resume_regs(&regs()), 0x5, &x, top, 0xdead);
        assert_eq!(f.addr % 16, 8);
        assert_eq!(f.fp_addr % 64, 0);
        assert!(f.addr + FRAME_LEN <= f.fp_addr);
        assert!(f.fp_addr + f.fp.len() as u64 <= top);
        assert_eq!(&f.fp[832..], &FP_XSTATE_MAGIC2.to_le_bytes());
        let q = |o: usize| u64::from_le_bytes(f.bytes[o..o + 8].try_into().unwrap());
        assert_eq!(q(0), 0xdead);
        assert_eq!(q(UC_FLAGS), 7);
        assert_eq!(q(MCONTEXT + 8 * 16), 0x401000, "rip");
        assert_eq!(q(MCONTEXT + 8 * 15), 0x7fff_0000_1000, "rsp");
        assert_eq!(q(MCONTEXT + 184), f.fp_addr);
        assert_eq!(q(SIGMASK), 0x5);
        assert_eq!(u16::from_le_bytes([f.bytes[MCONTEXT + 144], 0]), 0x33);
        // No XSAVE magic: the legacy image alone.
        let f = build(&regs(), 0, &x[..512], top, 1);
        assert_eq!(f.fp.len(), 512);
        let flags = u64::from_le_bytes(f.bytes[UC_FLAGS..UC_FLAGS + 8].try_into().unwrap());
        assert_eq!(flags & UC_FP_XSTATE, 0);
    }
}
