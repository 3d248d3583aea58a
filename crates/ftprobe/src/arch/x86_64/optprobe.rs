//! Jump-optimized kprobes (arch/x86/kernel/kprobes/opt.c): the detour buffer, its trampoline,
//! and the analysis that says whether the instructions under a probe may be replaced by a
//! `jmp rel32` at all. The policy (when to optimize, the threads' check, the switch) is
//! `kprobes::opt`'s.
//!
//! # The detour
//!
//! A probe at `addr` whose instructions `addr .. addr + len` (`len >= 5`, whole instructions)
//! are replaced by `jmp detour+8`:
//!
//! ```text
//! detour+0:   .quad op                  the probe's `OptProbe` (read by the trampoline)
//! detour+8:   lea  rsp, [rsp-128]       the red zone of the interrupted code stays intact
//!             push rax
//!             lahf; seto al             the arithmetic flags, in a form `sahf` restores
//!             push rax
//!             call opt_tramp            (the trampoline below: saves and calls)
//! detour+24:  pop  rax                  the return address: `op` is at [ret - 24]
//!             add  al, 0x7f; sahf       OF from al, SF ZF AF PF CF from ah
//!             pop  rax
//!             lea  rsp, [rsp+128]
//! detour+37:  the instructions of addr .. addr+len, relocated
//!             jmp  addr+len
//! ```
//!
//! `popfq` would restore the flags in one instruction but costs ~6 ns here (BENCHMARKS.md,
//! "optprobes"); `lahf`/`sahf` and `seto`/`add` cost under 1 ns. The direction flag, which
//! they do not carry, is restored by the trampoline (`std` when it was set).
//!
//! The trampoline is a copy of a template in a trampoline area (as the ftrace trampolines),
//! with the same first four and last six instructions, so `tramp_signals` holds a program's
//! signal while it runs exactly as for an ftrace trampoline. It saves every general register
//! into a [`PtRegs`](super::trampoline::PtRegs) (`flags` from `pushfq`, `sp` the stack pointer at the probe, `ip` left to
//! the callback), the vector registers the handlers might clobber (`xmm0-15`; `ymm0-15` when
//! the OS enables AVX; `zmm0-31` and `k0-7` by moves when it enables AVX-512 and the CPU has
//! AVX512BW, else the x87/SSE/AVX/AVX-512 state by `xsavec`/`xsave`, ~5x slower) then
//! `vzeroupper` (the handlers' SSE code would otherwise run with dirty upper
//! halves: a state-transition stall measured at ~150 ns a hit here), clears the direction
//! flag, calls `func(op, regs)`, and restores everything
//! from `regs` but `ip` and `sp` (the kernel's optprobes ignore a pre_handler's change of
//! `ip` too: Documentation/trace/kprobes.rst, "NOTE for geeks").
//!
//! # Relocation
//!
//! Each instruction of the range is planned by [`insn::plan`] for its address in the
//! detour (the int3 probe's relocation: RIP-relative operands fixed up), then:
//! - copied as it is, when the plan executes it out of line and may be boosted (the kernel's
//!   `can_boost`, which opt.c requires too);
//! - a relative `jmp`/`jcc` becomes its rel32 form to the same target;
//! - a `call` (relative or through a register) must be the range's last instruction (else the
//!   callee would return into the middle of the `jmp`) and becomes a push of the *original*
//!   return address and a `jmp` to the callee: nothing on the stack ever points into a
//!   detour, so unwinders, `backtrace()` and C++ exceptions see the program's own addresses;
//! - `ret` and `jmp reg` are copied; NOPs and `endbr64` are copied;
//! - anything else (`loop`, an instruction that may not be boosted, ...) refuses.
//!
//! # What refuses (the kernel's `can_optimize()` plus ours)
//! - the function's size is unknown, or the range runs past its end;
//! - the function does not decode to its end;
//! - a direct branch or call anywhere in the function targets `addr+1 .. addr+len`;
//! - the function has an indirect jump (a jump table may target the range);
//! - an instruction of the range as above.

use std::arch::global_asm;

use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction};

use super::insn::{self, Cond, Emulate, GpReg, XolPlan};
use super::trampoline::{fill_tls_placeholders, TLS_PLACEHOLDER};

/// Bytes of `jmp rel32`: the least an optimized range covers.
pub const JMP_LEN: usize = 5;
/// Where the detour's code starts (after the `op` word): the `jmp` at the probe targets it.
pub const DETOUR_CODE: u64 = 8;
/// The detour's return address from the trampoline, from the detour's start.
const DETOUR_RET: u64 = 24;
/// Where the relocated instructions start, from the detour's start.
pub const DETOUR_BODY: u64 = 37;
/// Offset of the `call rel32` in the detour.
const DETOUR_CALL: usize = 19;

/// The callback the trampoline calls: `func(op, regs)`, `op` the detour's first word.
pub type OptFunc = unsafe extern "C" fn(*const (), *mut super::trampoline::PtRegs);

/// Which registers beyond the general ones the trampoline saves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VectorSave {
    /// `xmm0-15` (no AVX enabled by the OS).
    Sse,
    /// `ymm0-15`.
    Avx,
    /// `xsave` of x87, SSE, AVX and AVX-512 state (AVX-512 enabled).
    Xsave,
    /// The same by `xsavec` (compacted, with the init optimization), where the CPU has it.
    XsaveC,
    /// AVX-512 with AVX512BW: `zmm0-31` and the 64-bit `k0-7` by plain moves, the state a
    /// handler's code may change (SSE/AVX code, and glibc's EVEX string functions, which use
    /// `ymm16-31` and mask registers); not the x87 state. `xsave`/`xrstor` of the same cost
    /// ~100-160 ns a hit on these VMs (BENCHMARKS.md), the moves a fraction of it.
    Avx512,
}

impl VectorSave {
    /// What this CPU and kernel need (XCR0), or `None` when `lahf`/`sahf` are missing in
    /// 64-bit mode (early x86-64 CPUs): no optimization then.
    pub fn detect() -> Option<VectorSave> {
        use core::arch::x86_64::{__cpuid, __cpuid_count, _xgetbv};
        let ext = __cpuid(0x8000_0001);
        if ext.ecx & 1 == 0 {
            return None;
        }
        let l1 = __cpuid_count(1, 0);
        let osxsave = l1.ecx & (1 << 27) != 0;
        if !osxsave {
            return Some(VectorSave::Sse);
        }
        // SAFETY: OSXSAVE is set, so xgetbv(0) is allowed.
        let xcr0 = unsafe { _xgetbv(0) };
        // CPUID.(EAX=0DH,ECX=1):EAX bit 1: XSAVEC.
        let xsavec = __cpuid_count(0xd, 1).eax & 2 != 0;
        // CPUID.(EAX=7,ECX=0):EBX bit 16 AVX512F, bit 30 AVX512BW (64-bit `kmovq`).
        let l7 = __cpuid_count(7, 0).ebx;
        let avx512bw = l7 & (1 << 16) != 0 && l7 & (1 << 30) != 0;
        Some(if xcr0 & 0xe6 == 0xe6 && avx512bw {
            VectorSave::Avx512
        } else if xcr0 & 0xe0 != 0 && xsavec {
            VectorSave::XsaveC
        } else if xcr0 & 0xe0 != 0 {
            VectorSave::Xsave
        } else if xcr0 & 0x4 != 0 {
            VectorSave::Avx
        } else {
            VectorSave::Sse
        })
    }
}

/// The trampoline's frame below the aligned stack pointer: PtRegs (168), padded to 192, then
/// the vector area.
const REGS: usize = 192;
const FRAME_SSE: usize = REGS + 16 * 16;
const FRAME_AVX: usize = REGS + 16 * 32;
/// x87+SSE+AVX+AVX-512 in the standard XSAVE format end at 2688 bytes.
const XSAVE_AREA: usize = 2688;
const FRAME_XSAVE: usize = REGS + XSAVE_AREA;
/// zmm0-31 (64 bytes each), then k0-7 (8 bytes each).
const FRAME_AVX512: usize = REGS + 32 * 64 + 8 * 8;

macro_rules! opt_template {
    ($name:literal, frame: $frame:expr, save: [$($save:tt)+], restore: [$($restore:tt)+]) => {
        global_asm!(
            ".pushsection .text.ftprobe_trampolines,\"ax\",@progbits",
            ".balign 16",
            concat!(".globl ", $name, "_start"),
            concat!(".hidden ", $name, "_start"),
            concat!($name, "_start:"),
            // The frame word, as every trampoline (`tramp_signals`).
            "push rbp",
            "mov rbp, rsp",
            "push qword ptr fs:[{tls}]",
            "mov qword ptr fs:[{tls}], rbp",
            // [rbp-16] flags; [rbp+8] our return address into the detour; [rbp+16] the
            // lahf/seto word; [rbp+24] the program's rax; [rbp+32] its rsp - 128.
            "pushfq",
            "cld",
            "sub rsp, {frame}",
            "and rsp, -64",
            "mov [rsp], r15",
            "mov [rsp + 8], r14",
            "mov [rsp + 16], r13",
            "mov [rsp + 24], r12",
            "mov [rsp + 40], rbx",
            "mov [rsp + 48], r11",
            "mov [rsp + 56], r10",
            "mov [rsp + 64], r9",
            "mov [rsp + 72], r8",
            "mov [rsp + 88], rcx",
            "mov [rsp + 96], rdx",
            "mov [rsp + 104], rsi",
            "mov [rsp + 112], rdi",
            $($save)+,
            "mov rax, [rbp]",
            "mov [rsp + 32], rax",
            "mov rax, [rbp + 24]",
            "mov [rsp + 80], rax",
            "mov qword ptr [rsp + 120], -1",
            "mov qword ptr [rsp + 128], 0",
            "mov qword ptr [rsp + 136], 0x33",
            "mov rax, [rbp - 16]",
            "mov [rsp + 144], rax",
            "lea rax, [rbp + 160]",
            "mov [rsp + 152], rax",
            "mov qword ptr [rsp + 160], 0x2b",
            // func(op, regs)
            "mov rdi, [rbp + 8]",
            "mov rdi, [rdi - {ret}]",
            "mov rsi, rsp",
            concat!("call [rip + ", $name, "_func]"),
            // regs.flags back: the word the detour's `add al, 0x7f; sahf` restores, and DF.
            "mov rax, [rsp + 144]",
            "mov ecx, eax",
            "shr ecx, 11",
            "and ecx, 1",
            "movzx edx, al",
            "shl edx, 8",
            "or edx, ecx",
            "mov word ptr [rbp + 16], dx",
            "test eax, 0x400",
            "jz 2f",
            "std",
            "2:",
            $($restore)+,
            "mov rax, [rsp + 32]",
            "mov [rbp], rax",
            "mov rax, [rsp + 80]",
            "mov [rbp + 24], rax",
            "mov r15, [rsp]",
            "mov r14, [rsp + 8]",
            "mov r13, [rsp + 16]",
            "mov r12, [rsp + 24]",
            "mov rbx, [rsp + 40]",
            "mov r11, [rsp + 48]",
            "mov r10, [rsp + 56]",
            "mov r9, [rsp + 64]",
            "mov r8, [rsp + 72]",
            "mov rcx, [rsp + 88]",
            "mov rdx, [rsp + 96]",
            "mov rsi, [rsp + 104]",
            "mov rdi, [rsp + 112]",
            "lea rsp, [rbp - 8]",
            "pop qword ptr fs:[{tls}]",
            "pop rbp",
            "test byte ptr fs:[{tls}], 1",
            "jnz 3f",
            "ret",
            "3:",
            "int3",
            ".balign 8",
            concat!($name, "_func: .quad 0"),
            concat!(".globl ", $name, "_end"),
            concat!(".hidden ", $name, "_end"),
            concat!($name, "_end:"),
            ".popsection",
            frame = const $frame,
            ret = const DETOUR_RET,
            tls = const TLS_PLACEHOLDER,
        );
    };
}

opt_template!("ftprobe_opt_sse", frame: FRAME_SSE,
    save: ["movaps [rsp + 192], xmm0
           movaps [rsp + 208], xmm1
           movaps [rsp + 224], xmm2
           movaps [rsp + 240], xmm3
           movaps [rsp + 256], xmm4
           movaps [rsp + 272], xmm5
           movaps [rsp + 288], xmm6
           movaps [rsp + 304], xmm7
           movaps [rsp + 320], xmm8
           movaps [rsp + 336], xmm9
           movaps [rsp + 352], xmm10
           movaps [rsp + 368], xmm11
           movaps [rsp + 384], xmm12
           movaps [rsp + 400], xmm13
           movaps [rsp + 416], xmm14
           movaps [rsp + 432], xmm15"],
    restore: ["movaps xmm0, [rsp + 192]
              movaps xmm1, [rsp + 208]
              movaps xmm2, [rsp + 224]
              movaps xmm3, [rsp + 240]
              movaps xmm4, [rsp + 256]
              movaps xmm5, [rsp + 272]
              movaps xmm6, [rsp + 288]
              movaps xmm7, [rsp + 304]
              movaps xmm8, [rsp + 320]
              movaps xmm9, [rsp + 336]
              movaps xmm10, [rsp + 352]
              movaps xmm11, [rsp + 368]
              movaps xmm12, [rsp + 384]
              movaps xmm13, [rsp + 400]
              movaps xmm14, [rsp + 416]
              movaps xmm15, [rsp + 432]"]);

opt_template!("ftprobe_opt_avx", frame: FRAME_AVX,
    save: ["vmovdqa [rsp + 192], ymm0
           vmovdqa [rsp + 224], ymm1
           vmovdqa [rsp + 256], ymm2
           vmovdqa [rsp + 288], ymm3
           vmovdqa [rsp + 320], ymm4
           vmovdqa [rsp + 352], ymm5
           vmovdqa [rsp + 384], ymm6
           vmovdqa [rsp + 416], ymm7
           vmovdqa [rsp + 448], ymm8
           vmovdqa [rsp + 480], ymm9
           vmovdqa [rsp + 512], ymm10
           vmovdqa [rsp + 544], ymm11
           vmovdqa [rsp + 576], ymm12
           vmovdqa [rsp + 608], ymm13
           vmovdqa [rsp + 640], ymm14
           vmovdqa [rsp + 672], ymm15
           vzeroupper"],
    restore: ["vmovdqa ymm0, [rsp + 192]
              vmovdqa ymm1, [rsp + 224]
              vmovdqa ymm2, [rsp + 256]
              vmovdqa ymm3, [rsp + 288]
              vmovdqa ymm4, [rsp + 320]
              vmovdqa ymm5, [rsp + 352]
              vmovdqa ymm6, [rsp + 384]
              vmovdqa ymm7, [rsp + 416]
              vmovdqa ymm8, [rsp + 448]
              vmovdqa ymm9, [rsp + 480]
              vmovdqa ymm10, [rsp + 512]
              vmovdqa ymm11, [rsp + 544]
              vmovdqa ymm12, [rsp + 576]
              vmovdqa ymm13, [rsp + 608]
              vmovdqa ymm14, [rsp + 640]
              vmovdqa ymm15, [rsp + 672]"]);

// The state by `$insn` (`xsave64` or `xsavec64`). xsave writes only XSTATE_BV of the header;
// xrstor faults unless the rest of it is zero. xrstor reads the format (standard or compacted)
// from XCOMP_BV.
macro_rules! xsave_template {
    ($name:literal, $insn:literal) => {
        opt_template!($name, frame: FRAME_XSAVE,
            save: [concat!("xor eax, eax
                   mov [rsp + 192 + 512], rax
                   mov [rsp + 192 + 520], rax
                   mov [rsp + 192 + 528], rax
                   mov [rsp + 192 + 536], rax
                   mov [rsp + 192 + 544], rax
                   mov [rsp + 192 + 552], rax
                   mov [rsp + 192 + 560], rax
                   mov [rsp + 192 + 568], rax
                   mov eax, 0xe7
                   xor edx, edx
                   ", $insn, " [rsp + 192]
                   vzeroupper")],
            restore: ["mov eax, 0xe7
                      xor edx, edx
                      xrstor64 [rsp + 192]"]);
    };
}
xsave_template!("ftprobe_opt_xsave", "xsave64");
xsave_template!("ftprobe_opt_xsavec", "xsavec64");

// zmm0-31 and k0-7 by moves (the frame is 64-byte aligned), then vzeroupper.
opt_template!("ftprobe_opt_avx512", frame: FRAME_AVX512,
    save: ["vmovdqa64 [rsp + 192], zmm0
           vmovdqa64 [rsp + 256], zmm1
           vmovdqa64 [rsp + 320], zmm2
           vmovdqa64 [rsp + 384], zmm3
           vmovdqa64 [rsp + 448], zmm4
           vmovdqa64 [rsp + 512], zmm5
           vmovdqa64 [rsp + 576], zmm6
           vmovdqa64 [rsp + 640], zmm7
           vmovdqa64 [rsp + 704], zmm8
           vmovdqa64 [rsp + 768], zmm9
           vmovdqa64 [rsp + 832], zmm10
           vmovdqa64 [rsp + 896], zmm11
           vmovdqa64 [rsp + 960], zmm12
           vmovdqa64 [rsp + 1024], zmm13
           vmovdqa64 [rsp + 1088], zmm14
           vmovdqa64 [rsp + 1152], zmm15
           vmovdqa64 [rsp + 1216], zmm16
           vmovdqa64 [rsp + 1280], zmm17
           vmovdqa64 [rsp + 1344], zmm18
           vmovdqa64 [rsp + 1408], zmm19
           vmovdqa64 [rsp + 1472], zmm20
           vmovdqa64 [rsp + 1536], zmm21
           vmovdqa64 [rsp + 1600], zmm22
           vmovdqa64 [rsp + 1664], zmm23
           vmovdqa64 [rsp + 1728], zmm24
           vmovdqa64 [rsp + 1792], zmm25
           vmovdqa64 [rsp + 1856], zmm26
           vmovdqa64 [rsp + 1920], zmm27
           vmovdqa64 [rsp + 1984], zmm28
           vmovdqa64 [rsp + 2048], zmm29
           vmovdqa64 [rsp + 2112], zmm30
           vmovdqa64 [rsp + 2176], zmm31
           kmovq [rsp + 2240], k0
           kmovq [rsp + 2248], k1
           kmovq [rsp + 2256], k2
           kmovq [rsp + 2264], k3
           kmovq [rsp + 2272], k4
           kmovq [rsp + 2280], k5
           kmovq [rsp + 2288], k6
           kmovq [rsp + 2296], k7
           vzeroupper"],
    restore: ["vmovdqa64 zmm0, [rsp + 192]
              vmovdqa64 zmm1, [rsp + 256]
              vmovdqa64 zmm2, [rsp + 320]
              vmovdqa64 zmm3, [rsp + 384]
              vmovdqa64 zmm4, [rsp + 448]
              vmovdqa64 zmm5, [rsp + 512]
              vmovdqa64 zmm6, [rsp + 576]
              vmovdqa64 zmm7, [rsp + 640]
              vmovdqa64 zmm8, [rsp + 704]
              vmovdqa64 zmm9, [rsp + 768]
              vmovdqa64 zmm10, [rsp + 832]
              vmovdqa64 zmm11, [rsp + 896]
              vmovdqa64 zmm12, [rsp + 960]
              vmovdqa64 zmm13, [rsp + 1024]
              vmovdqa64 zmm14, [rsp + 1088]
              vmovdqa64 zmm15, [rsp + 1152]
              vmovdqa64 zmm16, [rsp + 1216]
              vmovdqa64 zmm17, [rsp + 1280]
              vmovdqa64 zmm18, [rsp + 1344]
              vmovdqa64 zmm19, [rsp + 1408]
              vmovdqa64 zmm20, [rsp + 1472]
              vmovdqa64 zmm21, [rsp + 1536]
              vmovdqa64 zmm22, [rsp + 1600]
              vmovdqa64 zmm23, [rsp + 1664]
              vmovdqa64 zmm24, [rsp + 1728]
              vmovdqa64 zmm25, [rsp + 1792]
              vmovdqa64 zmm26, [rsp + 1856]
              vmovdqa64 zmm27, [rsp + 1920]
              vmovdqa64 zmm28, [rsp + 1984]
              vmovdqa64 zmm29, [rsp + 2048]
              vmovdqa64 zmm30, [rsp + 2112]
              vmovdqa64 zmm31, [rsp + 2176]
              kmovq k0, [rsp + 2240]
              kmovq k1, [rsp + 2248]
              kmovq k2, [rsp + 2256]
              kmovq k3, [rsp + 2264]
              kmovq k4, [rsp + 2272]
              kmovq k5, [rsp + 2280]
              kmovq k6, [rsp + 2288]
              kmovq k7, [rsp + 2296]"]);

extern "C" {
    static ftprobe_opt_sse_start: u8;
    static ftprobe_opt_sse_end: u8;
    static ftprobe_opt_avx_start: u8;
    static ftprobe_opt_avx_end: u8;
    static ftprobe_opt_xsave_start: u8;
    static ftprobe_opt_xsave_end: u8;
    static ftprobe_opt_xsavec_start: u8;
    static ftprobe_opt_xsavec_end: u8;
    static ftprobe_opt_avx512_start: u8;
    static ftprobe_opt_avx512_end: u8;
}

/// The trampoline's template for `v`, ending with its 8-byte `func` slot.
pub fn template(v: VectorSave) -> &'static [u8] {
    // SAFETY: each pair of symbols delimits one template in .text (global_asm above), start
    // before end; immutable code.
    unsafe {
        let (s, e): (*const u8, *const u8) = match v {
            VectorSave::Sse => (
                &raw const ftprobe_opt_sse_start,
                &raw const ftprobe_opt_sse_end,
            ),
            VectorSave::Avx => (
                &raw const ftprobe_opt_avx_start,
                &raw const ftprobe_opt_avx_end,
            ),
            VectorSave::Xsave => (
                &raw const ftprobe_opt_xsave_start,
                &raw const ftprobe_opt_xsave_end,
            ),
            VectorSave::XsaveC => (
                &raw const ftprobe_opt_xsavec_start,
                &raw const ftprobe_opt_xsavec_end,
            ),
            VectorSave::Avx512 => (
                &raw const ftprobe_opt_avx512_start,
                &raw const ftprobe_opt_avx512_end,
            ),
        };
        std::slice::from_raw_parts(s, e.offset_from(s) as usize)
    }
}

/// The trampoline's bytes for a copy: the template with its TLS offsets and `func` filled.
pub fn instantiate(v: VectorSave, func: OptFunc) -> Vec<u8> {
    let mut code = template(v).to_vec();
    let n = code.len();
    fill_tls_placeholders(&mut code[..n - 8]);
    code[n - 8..].copy_from_slice(&(func as usize as u64).to_le_bytes());
    code
}

/// Why a probe stays an int3 probe.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OptRefusal {
    /// The function's size is unknown: its end, and so the jumps into the range, are not.
    #[error("the function's size is unknown")]
    NoSize,
    /// Fewer than 5 bytes of whole instructions before the function's end.
    #[error("fewer than 5 bytes of instructions before the function's end")]
    TooShort,
    /// The function does not decode to its end at `at`.
    #[error("the function does not decode at {at:#x}")]
    Undecodable {
        /// Where decoding failed.
        at: u64,
    },
    /// A branch at `at` targets the middle of the range.
    #[error("the instruction at {at:#x} jumps into the replaced bytes")]
    JumpInto {
        /// The branch.
        at: u64,
    },
    /// A branch elsewhere in the object (another function, a `.cold` part) targets `target`
    /// in the middle of the range.
    #[error("a branch elsewhere in the object jumps to {target:#x}, inside the replaced bytes")]
    JumpFromElsewhere {
        /// The target.
        target: u64,
    },
    /// An indirect jump at `at` (a jump table, maybe into the range).
    #[error("indirect jump at {at:#x}")]
    IndirectJump {
        /// The jump.
        at: u64,
    },
    /// An instruction of the range that a detour cannot run.
    #[error("the instruction at {at:#x} cannot be relocated: {why}")]
    NotRelocatable {
        /// The instruction.
        at: u64,
        /// Why.
        why: String,
    },
}

/// Where a detour's instructions show in the program: `(pc, shown)` pairs sorted by `pc`.
pub type PcMap = Vec<(u64, u64)>;

/// One instruction of an optimized range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RangeInsn {
    /// Its address.
    pub addr: u64,
    /// Its length.
    pub len: u8,
}

/// The instructions that a `jmp rel32` at `addr` replaces, checked against the rules in the
/// module docs. `func_bytes` is the function's original code (int3s and jumps of other
/// probes replaced by the bytes they cover), `func_bytes.len()` its size.
pub fn analyze(func_bytes: &[u8], func_addr: u64, addr: u64) -> Result<Vec<RangeInsn>, OptRefusal> {
    if func_bytes.is_empty() {
        return Err(OptRefusal::NoSize);
    }
    let end = func_addr + func_bytes.len() as u64;
    let mut all: Vec<Instruction> = Vec::new();
    let mut dec = Decoder::with_ip(64, func_bytes, func_addr, DecoderOptions::NONE);
    while dec.can_decode() {
        let ip = dec.ip();
        let insn = dec.decode();
        if insn.is_invalid() {
            return Err(OptRefusal::Undecodable { at: ip });
        }
        all.push(insn);
    }
    let first = all
        .iter()
        .position(|i| i.ip() == addr)
        .ok_or(OptRefusal::Undecodable { at: addr })?;
    let mut range = Vec::new();
    let mut covered = 0usize;
    for i in &all[first..] {
        if covered >= JMP_LEN {
            break;
        }
        range.push(RangeInsn {
            addr: i.ip(),
            len: i.len() as u8,
        });
        covered += i.len();
    }
    if covered < JMP_LEN || addr + covered as u64 > end {
        return Err(OptRefusal::TooShort);
    }
    let (lo, hi) = (addr + 1, addr + covered as u64);
    for i in &all {
        match i.flow_control() {
            FlowControl::IndirectBranch => return Err(OptRefusal::IndirectJump { at: i.ip() }),
            FlowControl::UnconditionalBranch
            | FlowControl::ConditionalBranch
            | FlowControl::Call => {
                let t = i.near_branch_target();
                if t >= lo && t < hi {
                    return Err(OptRefusal::JumpInto { at: i.ip() });
                }
            }
            _ => {}
        }
    }
    for (k, r) in range.iter().enumerate() {
        let i = &all[first + k];
        let last = k + 1 == range.len();
        if matches!(
            i.flow_control(),
            FlowControl::Call | FlowControl::IndirectCall
        ) && !last
        {
            let after: usize = range[k + 1..].iter().map(|r| usize::from(r.len)).sum();
            let why = if k == 0 {
                format!(
                    "the probed instruction is a {}-byte call, shorter than the 5-byte jump \
                     that would replace it: the jump would also cover the {after} byte(s) \
                     after it, where its callee returns",
                    r.len
                )
            } else {
                format!(
                    "a {}-byte call among the replaced bytes (+{}), with {after} of them \
                     after it: its callee would return into the jump",
                    r.len,
                    r.addr - addr
                )
            };
            return Err(OptRefusal::NotRelocatable { at: r.addr, why });
        }
    }
    Ok(range)
}

/// Every direct branch and call target of a whole object's code (`code` at `at`), sorted,
/// by a linear sweep (an undecodable byte is skipped): what `analyze`, which decodes one
/// function, cannot see (glibc's `__mempcpy_avx_unaligned_erms` jumps to
/// `__memcpy_avx_unaligned_erms+3`; GCC's `.cold` parts jump back into their function).
/// Bytes that are data decode as something: at worst a target that refuses a range for
/// nothing.
pub fn branch_targets(code: &[u8], at: u64) -> Vec<u64> {
    let mut out = Vec::new();
    let mut dec = Decoder::with_ip(64, code, at, DecoderOptions::NONE);
    let mut i = Instruction::default();
    while dec.can_decode() {
        dec.decode_out(&mut i);
        if matches!(
            i.flow_control(),
            FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch | FlowControl::Call
        ) {
            out.push(i.near_branch_target());
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// The detour for `range` at `detour` (its first byte, where `op` goes), calling the
/// trampoline at `tramp`; and where each of its instructions shows in the program: `(pc,
/// shown)` pairs sorted by `pc`, a pc showing the `shown` of the last pair at or before it.
pub fn detour_bytes(
    func_bytes: &[u8],
    func_addr: u64,
    range: &[RangeInsn],
    detour: u64,
    tramp: u64,
    op: u64,
) -> Result<(Vec<u8>, PcMap), OptRefusal> {
    let addr = range[0].addr;
    let last = range[range.len() - 1];
    let next = last.addr + u64::from(last.len);
    let mut out: Vec<u8> = Vec::with_capacity(128);
    out.extend_from_slice(&op.to_le_bytes());
    out.extend_from_slice(&[0x48, 0x8d, 0x64, 0x24, 0x80]); // lea rsp, [rsp-128]
    out.push(0x50); // push rax
    out.push(0x9f); // lahf
    out.extend_from_slice(&[0x0f, 0x90, 0xc0]); // seto al
    out.push(0x50); // push rax
    debug_assert_eq!(out.len(), DETOUR_CALL);
    let call = rel32_insn(0xe8, detour + DETOUR_CALL as u64, tramp).ok_or_else(|| {
        OptRefusal::NotRelocatable {
            at: addr,
            why: "trampoline out of rel32 reach".into(),
        }
    })?;
    out.extend_from_slice(&call);
    debug_assert_eq!(out.len() as u64, DETOUR_RET);
    out.push(0x58); // pop rax
    out.extend_from_slice(&[0x04, 0x7f]); // add al, 0x7f
    out.push(0x9e); // sahf
    out.push(0x58); // pop rax
    out.extend_from_slice(&[0x48, 0x8d, 0xa4, 0x24, 0x80, 0, 0, 0]); // lea rsp, [rsp+128]
    debug_assert_eq!(out.len() as u64, DETOUR_BODY);
    let mut map = vec![(detour + DETOUR_CODE, addr)];
    let refuse = |at: u64, why: &str| OptRefusal::NotRelocatable {
        at,
        why: why.to_owned(),
    };
    for (k, r) in range.iter().enumerate() {
        let pc = detour + out.len() as u64;
        map.push((pc, r.addr));
        let is_last = k + 1 == range.len();
        let after = r.addr + u64::from(r.len);
        let plan = insn::plan(func_bytes, func_addr, r.addr, pc)
            .map_err(|e| refuse(r.addr, &e.to_string()))?;
        let orig = &func_bytes[(r.addr - func_addr) as usize..][..usize::from(r.len)];
        match plan {
            XolPlan::Xol {
                code, boostable, ..
            } => {
                if !boostable {
                    return Err(refuse(r.addr, "not boostable (the kernel's can_boost)"));
                }
                out.extend_from_slice(&code);
            }
            XolPlan::Emulate { insn: e, .. } => match e {
                Emulate::Nop | Emulate::Ret { .. } | Emulate::JmpReg { .. } => {
                    out.extend_from_slice(orig)
                }
                Emulate::JmpRel { target } => {
                    let j = rel32_insn(0xe9, pc, target)
                        .ok_or_else(|| refuse(r.addr, "jump target out of reach"))?;
                    out.extend_from_slice(&j);
                }
                Emulate::Jcc { cond, target } => {
                    let mut j = vec![0x0f, 0x80 | cond_code(cond)];
                    let rel = rel32(pc + 6, target)
                        .ok_or_else(|| refuse(r.addr, "jump target out of reach"))?;
                    j.extend_from_slice(&rel.to_le_bytes());
                    out.extend_from_slice(&j);
                }
                Emulate::CallRel { target } if is_last => {
                    push_imm64(&mut out, after);
                    let at = detour + out.len() as u64;
                    let j = rel32_insn(0xe9, at, target)
                        .ok_or_else(|| refuse(r.addr, "call target out of reach"))?;
                    out.extend_from_slice(&j);
                }
                Emulate::CallReg { reg } if is_last && reg != GpReg::Rsp => {
                    push_imm64(&mut out, after);
                    let n = reg.index() as u8;
                    if n >= 8 {
                        out.push(0x41);
                    }
                    out.extend_from_slice(&[0xff, 0xe0 | (n & 7)]);
                }
                _ => return Err(refuse(r.addr, "a branch a detour does not relocate")),
            },
        }
    }
    map.push((detour + out.len() as u64, next));
    let at = detour + out.len() as u64;
    let back = rel32_insn(0xe9, at, next).ok_or_else(|| refuse(addr, "jump back out of reach"))?;
    out.extend_from_slice(&back);
    Ok((out, map))
}

/// The arithmetic flags `sahf` loads from `ah` (SF, ZF, AF, PF, CF).
const SAHF_FLAGS: u64 = 0xd5;
/// The overflow flag, which the detour keeps in `al` (`seto`) and gives back by `add al, 0x7f`.
const OF: u64 = 0x800;

/// Probe path, a program's signal: for a context `off` bytes into a detour, at or before its
/// `call` of the trampoline (the hit not started), undo what the detour's own instructions
/// did (the red-zone skip, the saved `rax` and flags): the thread then stands as at the
/// probed instruction, with its own registers; the caller sets the PC there. Returns false
/// when `off` is not such a place, or the stack cannot be read (`g` unchanged).
pub fn undo_entry(off: u64, g: &mut [libc::greg_t; 23]) -> bool {
    let sp = g[libc::REG_RSP as usize] as u64;
    let read = |at: u64| crate::sys::read_u64_nofault(at);
    // Offsets: 8 lea rsp,[rsp-128]; 13 push rax; 14 lahf; 15 seto al; 18 push rax; 19 call.
    let (rax, sp) = match off {
        DETOUR_CODE => (None, sp),
        13 => (None, sp + 128),
        14 | 15 | 18 => (read(sp), sp + 136),
        19 => (read(sp + 8), sp + 144),
        _ => return false,
    };
    match (off, rax) {
        (DETOUR_CODE | 13, _) => {}
        (_, Some(v)) => g[libc::REG_RAX as usize] = v as libc::greg_t,
        (_, None) => return false,
    }
    g[libc::REG_RSP as usize] = sp as libc::greg_t;
    true
}

/// Probe path, a program's signal: for a context `off` bytes into a detour, after the
/// trampoline returned (the hit done) and before the relocated instructions, do what the
/// detour's remaining own instructions would (flags, `rax`, the red zone): the thread then
/// stands at the first relocated instruction (`DETOUR_BODY`, which the caller sets), with
/// its own registers. Returns false when `off` is not such a place, or the stack cannot be
/// read (`g` unchanged).
pub fn finish_exit(off: u64, g: &mut [libc::greg_t; 23]) -> bool {
    let sp = g[libc::REG_RSP as usize] as u64;
    let fl = g[libc::REG_EFL as usize] as u64;
    let rax = g[libc::REG_RAX as usize] as u64;
    let read = |at: u64| crate::sys::read_u64_nofault(at);
    // `v`: the saved word (ah = the arithmetic flags, al = OF).
    let restore = |v: u64, of: u64| (fl & !(SAHF_FLAGS | OF)) | ((v >> 8) & SAHF_FLAGS) | of;
    let of_in = |v: u64| if v & 0xff == 1 { OF } else { 0 };
    // Offsets: 24 pop rax; 25 add al,0x7f; 27 sahf; 28 pop rax; 29 lea rsp,[rsp+128]; 37.
    let (fl, rax, sp) = match off {
        DETOUR_RET => {
            let (Some(v), Some(orig)) = (read(sp), read(sp + 8)) else {
                return false;
            };
            (restore(v, of_in(v)), orig, sp + 144)
        }
        25 => match read(sp) {
            Some(orig) => (restore(rax, of_in(rax)), orig, sp + 136),
            None => return false,
        },
        27 => match read(sp) {
            Some(orig) => (restore(rax, fl & OF), orig, sp + 136),
            None => return false,
        },
        28 => match read(sp) {
            Some(orig) => (fl, orig, sp + 136),
            None => return false,
        },
        29 => (fl, rax, sp + 128),
        _ => return false,
    };
    g[libc::REG_EFL as usize] = fl as libc::greg_t;
    g[libc::REG_RAX as usize] = rax as libc::greg_t;
    g[libc::REG_RSP as usize] = sp as libc::greg_t;
    true
}

/// `lea rsp, [rsp-8]`: the first instruction of a relocated `call` (`push_imm64`).
const LEA_RSP_MINUS_8: [u8; 5] = [0x48, 0x8d, 0x64, 0x24, 0xf8];

/// Probe path, a program's signal: for a context at `pc` inside the relocated instruction
/// that starts at `start` in a detour, when that is a `call` relocated as several
/// instructions (the return address pushed by parts, then a `jmp`) and `pc` is past its
/// first: undo the push, and put the thread back at `start` (the relocated call runs again
/// from its beginning, writing the same return address). Returns whether it did.
pub fn undo_partial_call(start: u64, pc: u64, g: &mut [libc::greg_t; 23]) -> bool {
    let mut head = [0u8; 5];
    if pc <= start || crate::sys::read_nofault(start, &mut head) != 5 || head != LEA_RSP_MINUS_8 {
        return false;
    }
    g[libc::REG_RSP as usize] = (g[libc::REG_RSP as usize] as u64 + 8) as libc::greg_t;
    g[libc::REG_RIP as usize] = start as libc::greg_t;
    true
}

/// `lea rsp, [rsp-8]; mov dword [rsp], lo; mov dword [rsp+4], hi`: push a 64-bit value
/// without touching a register or the flags.
fn push_imm64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&LEA_RSP_MINUS_8);
    out.extend_from_slice(&[0xc7, 0x04, 0x24]);
    out.extend_from_slice(&(v as u32).to_le_bytes());
    out.extend_from_slice(&[0xc7, 0x44, 0x24, 0x04]);
    out.extend_from_slice(&((v >> 32) as u32).to_le_bytes());
}

fn cond_code(c: Cond) -> u8 {
    use Cond::*;
    match c {
        O => 0,
        No => 1,
        B => 2,
        Ae => 3,
        E => 4,
        Ne => 5,
        Be => 6,
        A => 7,
        S => 8,
        Ns => 9,
        P => 10,
        Np => 11,
        L => 12,
        Ge => 13,
        Le => 14,
        G => 15,
    }
}

fn rel32(next_ip: u64, target: u64) -> Option<i32> {
    i32::try_from(target.wrapping_sub(next_ip) as i64).ok()
}

/// A 5-byte `opcode rel32` at `at` to `target`.
pub fn rel32_insn(opcode: u8, at: u64, target: u64) -> Option<[u8; 5]> {
    let r = rel32(at + 5, target)?.to_le_bytes();
    Some([opcode, r[0], r[1], r[2], r[3]])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_keep_the_frame_word_where_tramp_signals_looks() {
        use super::super::tramp_signals::{classify, Place};
        for v in [
            VectorSave::Sse,
            VectorSave::Avx,
            VectorSave::Xsave,
            VectorSave::XsaveC,
            VectorSave::Avx512,
        ] {
            unsafe extern "C" fn f(_: *const (), _: *mut super::super::trampoline::PtRegs) {}
            let code = instantiate(v, f);
            let tls = super::super::tramp_signals::tls_offset();
            let read = |a: u64| code.get(a as usize).copied();
            assert_eq!(classify(&read, 0, tls), Place::Rewind(0), "{v:?}");
            // After the epilogue's `jnz 1; ret; int3` (where its trap reports the PC).
            let int3 = code
                .windows(4)
                .rposition(|w| w == [0x75, 0x01, 0xc3, 0xcc])
                .unwrap()
                + 4;
            assert_eq!(
                classify(&read, int3 as u64, tls),
                Place::DeferredTrap,
                "{v:?}"
            );
        }
    }

    /// A function `mov eax, 1 (5); add eax, edi (2); ret`: a probe at +0 replaces one
    /// instruction; at +5, `add` and `ret` (3 bytes) are too short.
    #[test]
    fn ranges_cover_five_bytes_of_whole_instructions() {
        let f = [0xb8, 1, 0, 0, 0, 0x01, 0xf8, 0xc3];
        let r = analyze(&f, 0x1000, 0x1000).unwrap();
        assert_eq!(
            r,
            vec![RangeInsn {
                addr: 0x1000,
                len: 5
            }]
        );
        assert_eq!(analyze(&f, 0x1000, 0x1005), Err(OptRefusal::TooShort));
    }

    #[test]
    fn a_jump_into_the_range_refuses() {
        // 0: push rbp; 1: mov rbp,rsp; 4: xor eax,eax; 6: jmp 1 (eb f9); 8: ret
        let f = [0x55, 0x48, 0x89, 0xe5, 0x31, 0xc0, 0xeb, 0xf9, 0xc3];
        assert_eq!(
            analyze(&f, 0x1000, 0x1000),
            Err(OptRefusal::JumpInto { at: 0x1006 })
        );
        // A jump to the probed address itself is fine: it lands on the jmp.
        let g = [0x55, 0x48, 0x89, 0xe5, 0x31, 0xc0, 0xeb, 0xf8, 0xc3];
        assert!(analyze(&g, 0x1000, 0x1000).is_ok());
    }

    #[test]
    fn an_indirect_jump_refuses_and_a_call_must_be_last() {
        // jmp *(%rax,%rcx,8) anywhere in the function
        let f = [0x55, 0x48, 0x89, 0xe5, 0xff, 0x24, 0xc8, 0xc3];
        assert_eq!(
            analyze(&f, 0x1000, 0x1000),
            Err(OptRefusal::IndirectJump { at: 0x1004 })
        );
        // push rbp; call rel32; ...: the call is the range's last instruction: fine
        let g = [0x55, 0xe8, 0, 0, 0, 0, 0x5d, 0xc3];
        assert!(analyze(&g, 0x1000, 0x1000).is_ok());
        // call *%rax (2); mov eax,1 (5): the call is not last. The reason names the probed
        // call and the bytes after it (review 14, F8).
        let h = [0xff, 0xd0, 0xb8, 1, 0, 0, 0, 0xc3];
        let Err(OptRefusal::NotRelocatable { at: 0x1000, why }) = analyze(&h, 0x1000, 0x1000)
        else {
            panic!("refused at the call");
        };
        assert_eq!(
            why,
            "the probed instruction is a 2-byte call, shorter than the 5-byte jump that would \
             replace it: the jump would also cover the 5 byte(s) after it, where its callee \
             returns"
        );
        // push rbp (1); call *0x10(%rax) (3); mov eax,1 (5): a call inside the range.
        let k = [0x55, 0xff, 0x50, 0x10, 0xb8, 1, 0, 0, 0, 0xc3];
        let Err(OptRefusal::NotRelocatable { at: 0x1001, why }) = analyze(&k, 0x1000, 0x1000)
        else {
            panic!("refused at the call");
        };
        assert_eq!(
            why,
            "a 3-byte call among the replaced bytes (+1), with 5 of them after it: its callee \
             would return into the jump"
        );
    }

    #[test]
    fn detours_push_the_original_return_address_and_jump_back() {
        // push rbp (1); call rel32 to 0x2000 (5); pop rbp; ret
        let rel = (0x2000i64 - 0x1006) as i32;
        let mut f = vec![0x55, 0xe8];
        f.extend_from_slice(&rel.to_le_bytes());
        f.extend_from_slice(&[0x5d, 0xc3]);
        let range = analyze(&f, 0x1000, 0x1000).unwrap();
        let (bytes, map) = detour_bytes(&f, 0x1000, &range, 0x9000, 0x9800, 0xabcd).unwrap();
        assert_eq!(&bytes[..8], &0xabcdu64.to_le_bytes());
        let body = DETOUR_BODY as usize;
        assert_eq!(bytes[body], 0x55);
        // push 0x1006 (the original return address), then jmp 0x2000
        assert_eq!(&bytes[body + 1..body + 6], &[0x48, 0x8d, 0x64, 0x24, 0xf8]);
        assert_eq!(&bytes[body + 9..body + 13], &0x1006u32.to_le_bytes());
        let j = body + 21;
        assert_eq!(bytes[j], 0xe9);
        let t = 0x9000 + j as u64 + 5;
        let r = i32::from_le_bytes(bytes[j + 1..j + 5].try_into().unwrap());
        assert_eq!(t.wrapping_add(r as i64 as u64), 0x2000);
        assert_eq!(map[0], (0x9008, 0x1000));
        assert_eq!(map[1], (0x9000 + body as u64, 0x1000));
        assert_eq!(map[2], (0x9000 + body as u64 + 1, 0x1001));
        assert_eq!(map.last().unwrap().1, 0x1006);
    }

    /// The detour's own instructions sit where `undo_entry` and `finish_exit` expect them.
    #[test]
    fn the_detour_own_instructions_are_where_the_signal_path_expects() {
        let f = [0xb8, 1, 0, 0, 0, 0xc3];
        let range = analyze(&f, 0x1000, 0x1000).unwrap();
        let (bytes, _) = detour_bytes(&f, 0x1000, &range, 0x9000, 0x9800, 0).unwrap();
        let code = &bytes[DETOUR_CODE as usize..DETOUR_BODY as usize];
        let mut dec = Decoder::with_ip(64, code, 0x9000 + DETOUR_CODE, DecoderOptions::NONE);
        let starts: Vec<u64> = dec.iter().map(|i| i.ip() - 0x9000).collect();
        assert_eq!(starts, [8, 13, 14, 15, 18, 19, 24, 25, 27, 28, 29]);
        assert_eq!(DETOUR_CALL as u64, 19);
        assert_eq!(DETOUR_RET, 24);
    }

    /// What the detour saved (rax, then ah = the arithmetic flags and al = OF), on a stack
    /// `sp0 - 144` (red zone and two words): `finish_exit` at its return address gives back
    /// the thread's rax, flags and stack pointer; `undo_entry` at its call likewise.
    #[test]
    fn the_signal_path_undoes_and_finishes_the_detour() {
        for (flags, of) in [
            (0x246u64, false),
            (0xa93, true),
            (0x202, true),
            (0x2d7, false),
        ] {
            let flags = flags | if of { OF } else { 0 };
            let rax = 0x1122_3344_5566_7788u64;
            let stack = vec![0u64; 24];
            let top = stack.as_ptr() as u64 + 8 * 20;
            let sp = top - 144;
            let put = |a: u64, v: u64| {
                // SAFETY: `a` is a word of `stack`, which lives to the end of the loop body.
                unsafe { std::ptr::write_volatile(a as *mut u64, v) }
            };
            put(sp + 8, rax);
            put(sp, (rax & !0xffff) | ((flags & 0xff) << 8) | u64::from(of));
            let mut g = [0 as libc::greg_t; 23];
            g[libc::REG_RSP as usize] = sp as i64;
            g[libc::REG_RAX as usize] = 0x77;
            g[libc::REG_EFL as usize] = 0x202 | 0x400; // DF set by the trampoline: kept
            assert!(finish_exit(DETOUR_RET, &mut g));
            assert_eq!(g[libc::REG_RSP as usize] as u64, top);
            assert_eq!(g[libc::REG_RAX as usize] as u64, rax);
            let got = g[libc::REG_EFL as usize] as u64;
            assert_eq!(
                got & (SAHF_FLAGS | OF),
                flags & (SAHF_FLAGS | OF),
                "{flags:#x}"
            );
            assert_eq!(got & 0x400, 0x400);
            // At the call: the same two words; at the first push, rax alone.
            let mut g = [0 as libc::greg_t; 23];
            g[libc::REG_RSP as usize] = sp as i64;
            g[libc::REG_RAX as usize] = 0x77;
            assert!(undo_entry(19, &mut g));
            assert_eq!(g[libc::REG_RSP as usize] as u64, top);
            assert_eq!(g[libc::REG_RAX as usize] as u64, rax);
            g[libc::REG_RSP as usize] = (sp + 8) as i64;
            g[libc::REG_RAX as usize] = 0x77;
            assert!(undo_entry(15, &mut g));
            assert_eq!(g[libc::REG_RSP as usize] as u64, top);
            assert_eq!(g[libc::REG_RAX as usize] as u64, rax);
            assert!(!undo_entry(20, &mut g) && !finish_exit(DETOUR_BODY, &mut g));
            drop(stack);
        }
    }
}
