//! The return trampoline (the kernel's `return_to_handler` in arch/x86/kernel/ftrace_64.S):
//! a hooked call's return address slot holds its address, so the traced function's `ret`
//! lands here with `rsp = retp + 8` and every register the caller may rely on live.
//!
//! It saves every general register but `rsp` (the caller's, kept) and `rip`, and `xmm0-15`
//! with legacy-SSE moves, which leave the upper halves of `ymm`/`zmm` registers untouched (the
//! Rust code it calls is built without AVX and calls no C library function, so nothing on the
//! return path touches them either); builds a [`PtRegs`](super::trampoline::PtRegs) (`sp` =
//! `retp + 8`, `rax`/`rdx` the return value) and calls the handler with `rsp` 16-aligned.
//! The handler writes the real return address into `regs.ip` and back into the slot
//! `[retp]`, which the trampoline's own frame uses as its return address: once written, a
//! frame-pointer unwinder (`rbp` chain: `[rbp]` the caller's `rbp`, `[rbp+8]` = `[retp]`) and
//! a DWARF unwinder (the CFI below: CFA = `retp + 8`, return address at CFA - 8, `rbp` at
//! CFA - 16) both see the real caller while the return callbacks run. The trampoline ends
//! by popping that slot and jumping to it: `rsp = retp + 8`, `rip` = the real return
//! address, as if the function had returned there. The flags are not preserved (dead after a `ret` by
//! the ABI). It leaves by `jmp` to that address, not `ret` (see the end of the code: the
//! return stack buffer stays balanced).

use std::arch::global_asm;

/// Frame below the saved `rbp`: PtRegs (168) + pad + xmm0-15 at 176.
const FRAME: usize = 176 + 16 * 16;

global_asm!(
    ".pushsection .text.ftprobe_return,\"ax\",@progbits",
    ".balign 16",
    ".globl ftprobe_return_trampoline",
    ".hidden ftprobe_return_trampoline",
    ".type ftprobe_return_trampoline,@function",
    "ftprobe_return_trampoline:",
    ".cfi_startproc",
    // Entered by `ret`: rsp = retp + 8, the caller's stack pointer. CFA = rsp; the return
    // address (the real one once the handler wrote it) at CFA - 8 = retp.
    ".cfi_def_cfa rsp, 0",
    "sub rsp, 8",
    ".cfi_def_cfa_offset 8",
    "push rbp",
    ".cfi_def_cfa_offset 16",
    ".cfi_offset rbp, -16",
    "mov rbp, rsp",
    ".cfi_def_cfa_register rbp",
    "sub rsp, {frame}",
    "and rsp, -16",
    "mov [rsp], r15",
    "mov [rsp + 8], r14",
    "mov [rsp + 16], r13",
    "mov [rsp + 24], r12",
    "mov [rsp + 40], rbx",
    "mov [rsp + 48], r11",
    "mov [rsp + 56], r10",
    "mov [rsp + 64], r9",
    "mov [rsp + 72], r8",
    "mov [rsp + 80], rax",
    "mov [rsp + 88], rcx",
    "mov [rsp + 96], rdx",
    "mov [rsp + 104], rsi",
    "mov [rsp + 112], rdi",
    "movaps [rsp + 176], xmm0",
    "movaps [rsp + 192], xmm1",
    "movaps [rsp + 208], xmm2",
    "movaps [rsp + 224], xmm3",
    "movaps [rsp + 240], xmm4",
    "movaps [rsp + 256], xmm5",
    "movaps [rsp + 272], xmm6",
    "movaps [rsp + 288], xmm7",
    "movaps [rsp + 304], xmm8",
    "movaps [rsp + 320], xmm9",
    "movaps [rsp + 336], xmm10",
    "movaps [rsp + 352], xmm11",
    "movaps [rsp + 368], xmm12",
    "movaps [rsp + 384], xmm13",
    "movaps [rsp + 400], xmm14",
    "movaps [rsp + 416], xmm15",
    // regs.rbp: the program's rbp (pushed above); regs.sp = retp + 8; regs.ip, orig_rax,
    // cs, flags, ss: 0 (the handler sets ip).
    "mov rax, [rbp]",
    "mov [rsp + 32], rax",
    "lea rax, [rbp + 16]",
    "mov [rsp + 152], rax",
    "xor eax, eax",
    "mov [rsp + 120], rax",
    "mov [rsp + 128], rax",
    "mov [rsp + 136], rax",
    "mov [rsp + 144], rax",
    "mov [rsp + 160], rax",
    "mov rdi, rsp",
    "call {handler}",
    "movaps xmm0, [rsp + 176]",
    "movaps xmm1, [rsp + 192]",
    "movaps xmm2, [rsp + 208]",
    "movaps xmm3, [rsp + 224]",
    "movaps xmm4, [rsp + 240]",
    "movaps xmm5, [rsp + 256]",
    "movaps xmm6, [rsp + 272]",
    "movaps xmm7, [rsp + 288]",
    "movaps xmm8, [rsp + 304]",
    "movaps xmm9, [rsp + 320]",
    "movaps xmm10, [rsp + 336]",
    "movaps xmm11, [rsp + 352]",
    "movaps xmm12, [rsp + 368]",
    "movaps xmm13, [rsp + 384]",
    "movaps xmm14, [rsp + 400]",
    "movaps xmm15, [rsp + 416]",
    "mov r15, [rsp]",
    "mov r14, [rsp + 8]",
    "mov r13, [rsp + 16]",
    "mov r12, [rsp + 24]",
    "mov rbx, [rsp + 40]",
    "mov r11, [rsp + 48]",
    "mov r10, [rsp + 56]",
    "mov r9, [rsp + 64]",
    "mov r8, [rsp + 72]",
    "mov rax, [rsp + 80]",
    "mov rcx, [rsp + 88]",
    "mov rdx, [rsp + 96]",
    "mov rsi, [rsp + 104]",
    "mov rdi, [rsp + 112]",
    "mov rsp, rbp",
    ".cfi_def_cfa rsp, 16",
    "pop rbp",
    ".cfi_def_cfa_offset 8",
    ".cfi_restore rbp",
    // To [retp], the real return address the handler wrote there, by an indirect `jmp`
    // rather than `ret`: the traced function's `ret` into this trampoline consumed the
    // return-stack-buffer entry of its call, so a `ret` here would be mispredicted and leave
    // the buffer one entry off for every return above (each mispredicted in turn); the
    // `jmp` is predicted by its last target and keeps the buffer balanced. The stack pointer
    // is the caller's first (`lea` leaves the flags), then the slot is read from just below
    // it: inside the red zone, which signal delivery skips. CFA = rsp, return address at
    // CFA - 8 still.
    "lea rsp, [rsp + 8]",
    ".cfi_def_cfa_offset 0",
    "jmp qword ptr [rsp - 8]",
    ".cfi_endproc",
    ".size ftprobe_return_trampoline, . - ftprobe_return_trampoline",
    ".globl ftprobe_return_trampoline_end",
    ".hidden ftprobe_return_trampoline_end",
    "ftprobe_return_trampoline_end:",
    ".popsection",
    frame = const FRAME,
    handler = sym crate::ftrace::fgraph::ftprobe_fgraph_return,
);

extern "C" {
    static ftprobe_return_trampoline: u8;
    static ftprobe_return_trampoline_end: u8;
}

/// The return trampoline's address (what hijacked return-address slots hold).
#[inline(always)]
pub fn address() -> u64 {
    &raw const ftprobe_return_trampoline as u64
}

/// The trampoline's code range `[start, end)`.
pub fn range() -> (u64, u64) {
    (
        &raw const ftprobe_return_trampoline as u64,
        &raw const ftprobe_return_trampoline_end as u64,
    )
}
