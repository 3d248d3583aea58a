//! `struct pt_regs`: the engine's [`PtRegs`] with the kernel's field names
//! (arch/x86/include/asm/ptrace.h), in the same order, so a `&mut PtRegs` is passed to C as
//! a `struct pt_regs *` unchanged.

use std::mem::{offset_of, size_of};

use ftprobe::ftrace::PtRegs;

/// The registers at a probe (the kernel's x86-64 `struct pt_regs`, same fields in the same
/// order).
///
/// In a kprobe handler every field is filled. In an `ftrace_ops` callback without
/// `FTRACE_OPS_FL_SAVE_REGS` only `di si dx cx r8 r9 ax r10 bp ip sp` are: the arguments,
/// the frame pointer, where the thread continues and the stack pointer at the site. `cs`,
/// `ss` and `orig_ax` are 0. Changes to the registers are written back into the thread
/// (except `flags`, `sp`, `cs`, `ss`, `orig_ax`) where the engine says so: a kprobe
/// pre_handler that returns non-zero continues at `ip`; an `ftrace_ops` with
/// `FTRACE_OPS_FL_IPMODIFY` may change `ip`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct pt_regs {
    pub r15: u64,
    pub r14: u64,
    pub r13: u64,
    pub r12: u64,
    pub bp: u64,
    pub bx: u64,
    pub r11: u64,
    pub r10: u64,
    pub r9: u64,
    pub r8: u64,
    pub ax: u64,
    pub cx: u64,
    pub dx: u64,
    pub si: u64,
    pub di: u64,
    pub orig_ax: u64,
    /// Where the thread continues.
    pub ip: u64,
    pub cs: u64,
    pub flags: u64,
    /// The stack pointer.
    pub sp: u64,
    pub ss: u64,
}

macro_rules! same_offsets {
    ($($c:ident = $r:ident),* $(,)?) => {
        const _: () = assert!(size_of::<pt_regs>() == size_of::<PtRegs>());
        $(const _: () = assert!(offset_of!(pt_regs, $c) == offset_of!(PtRegs, $r));)*
    };
}

same_offsets!(
    r15 = r15,
    r14 = r14,
    r13 = r13,
    r12 = r12,
    bp = rbp,
    bx = rbx,
    r11 = r11,
    r10 = r10,
    r9 = r9,
    r8 = r8,
    ax = rax,
    cx = rcx,
    dx = rdx,
    si = rsi,
    di = rdi,
    orig_ax = orig_rax,
    ip = ip,
    cs = cs,
    flags = flags,
    sp = sp,
    ss = ss,
);

/// The engine's registers as the C struct (same layout, checked above).
pub(crate) fn c_regs(regs: &mut PtRegs) -> *mut pt_regs {
    regs as *mut PtRegs as *mut pt_regs
}
