//! Preparing the instruction under an int3 probe for out-of-line execution (DESIGN.md 3.2).
//!
//! When an int3 probe traps, the displaced instruction must still take effect. Like the kernel's
//! kprobes (arch/x86/kernel/kprobes/core.c: `can_probe`, `__copy_instruction`,
//! `prepare_emulation`, `can_boost`, `prepare_singlestep`) this module decides, from the bytes
//! alone, one of three things:
//!
//! * **emulate** it in the trap handler: relative, register-indirect and memory-indirect
//!   branches and calls, returns, `loop`/`jrcxz`, NOPs. These change `rip` in ways that a copy running elsewhere
//!   would get wrong, and emulating them costs nothing;
//! * **execute a copy** in an XOL slot within +-2 GB of the probe, with a RIP-relative
//!   displacement rewritten so the copy reads the same memory; the slot ends with a `jmp` back
//!   (*boosted*, no second trap) or an `int3` (second trap, post_handler);
//! * **refuse** it with a reason.
//!
//! Everything here works on `&[u8]` and addresses; nothing in the running process is touched
//! (STYLE.md 3), so it is unit-tested on hand-assembled byte strings.
//!
//! # Rules and where they come from
//!
//! | instruction | here | kernel source |
//! |---|---|---|
//! | `call rel32`, `jmp rel8/rel32`, `jcc rel8/rel32` | emulated | kprobes `prepare_emulation` (e8, e9, eb, 70-7f, 0f 80-8f); uprobes `branch_setup_xol_ops` |
//! | `loop`, `loope`, `loopne`, `jrcxz`, `jecxz` | emulated | kprobes `prepare_emulation` (e0-e3) |
//! | `ret`, `ret imm16` | emulated | kprobes `prepare_emulation` (c2, c3) |
//! | `call reg`, `jmp reg` | emulated | kprobes `prepare_emulation` (ff /2, ff /4 with mod = 3) |
//! | NOPs (`90`, `66 90`, `0f 1f /0`), `endbr64`/`endbr32` | emulated as "skip" | uprobes `branch_setup_xol_ops` (x86_nops, `90`) |
//! | `call`/`jmp` through memory (`ff /2`, `ff /4`: vtables, `-fno-plt` GOT calls, jump tables) | emulated: the target is read fault-safely in the handler; if that read fails the instruction runs from a *fault slot* (below) | kprobes `prepare_emulation`: memory operand is -EOPNOTSUPP ("TODO"); uprobes accepts them (`branch_setup_xol_ops` leaves them to XOL with a scratch register and fixes the return address) |
//! | the same with an `fs`/`gs` prefix or an address-size prefix (67) | refused | the emulation reads without a segment base; kprobes `prepare_emulation` refuses `addr_bytes != 8` |
//! | far `call`/`jmp`/`ret`, `iret` | refused | kprobes `prepare_emulation` (9a, ea, ff /3, ff /5, cf); it emulates `lret` as a near `ret`, which we do not copy |
//! | `int3`, `int n`, `int1`, `ud0/1/2` | refused | kprobes `can_probe` (`is_exception_insn`), `__copy_instruction` (int3) |
//! | `syscall`, `sysenter`, `sysret`, `sysexit` | refused | uprobes `good_2byte_insns` (0f 05, 0f 34, 0f 07, 0f 35): uprobes does not probe a `syscall` in user space, and neither do we |
//! | `xbegin`, `xend`, `xabort` | refused | uprobes refuses the 0f 01 group (`xend`); the int3 itself aborts a transaction |
//! | `mov ss`, `pop ss` | refused | `insn_masking_exception` in both kprobes and uprobes |
//! | VMX/SVM (`vmcall`, ...), privileged and IOPL instructions (`hlt`, `cli`, `in`, ...) | refused | kprobes `prepare_emulation` (0f 01 /0 mod = 3); uprobes `good_insns_64` (f4, fa, fb, e4-e7, ec-ef, 6c-6f) |
//! | a branch with an operand-size prefix (`66 e8 ...`) | refused | uprobes `branch_setup_xol_ops`: Intel ignores 66 there, AMD truncates `rip` to 16 bits |
//! | `lock`-prefixed instructions | executed out of line | kprobes accepts them; uprobes refuses `lock` (`is_prefix_bad`) without a technical reason given: the copy performs the same locked access, nothing depends on `rip` |
//! | segment prefixes `es/cs/ss/ds` (also branch hints and `notrack`) | accepted | kprobes accepts them; uprobes `is_prefix_bad` refuses them; they are no-ops in 64-bit mode |
//! | everything else that decodes | executed out of line | |
//!
//! **Boosting** (a `jmp` back instead of a second trap) follows the kernel's `can_boost`: not for
//! an instruction with a `cs` (2e) or address-size (67) prefix, not for the one-byte opcodes it
//! lists (62, 9a, cc-ce, d6, x87 d8-df, f1, f4; the shift group c0/c1/d0-d3 with /6; group 3
//! f6/f7 with /1; group 4 fe other than /0 and /1; group 5 ff other than /0, /1, /4), not for
//! three-byte opcodes (0f 38, 0f 3a), and for two-byte opcodes only those in its
//! `twobyte_is_boostable` table ([`twobyte_boostable`]). Branches are never boosted because they
//! are emulated. Where the kernel differs, on purpose:
//! * its `case 0xf0 ... 0xf3` (LOCK/REP) never matches because its decoder has already consumed
//!   those bytes as prefixes, so the kernel does boost `lock cmpxchg` and `rep movs`; so do we;
//! * VEX/EVEX/XOP instructions are boostable (the kernel reads their opcode byte as a one-byte
//!   opcode, so e.g. `vzeroupper` (VEX 77) falls into its `jcc` case by accident);
//! * the kernel only boosts copies of at most 11 bytes (its slot is 16 bytes); our slot is sized
//!   by [`slot_len`];
//! * the kernel never boosts on a preemptible kernel (a task could sleep inside the slot); here
//!   the caller waits for quiescence before freeing a slot (DESIGN.md section 4);
//! * we do not boost when the `jmp rel32` back cannot reach `addr + len` from the slot.
//!
//! **Fault slots.** An emulated `call *mem` / `jmp *mem` computes the operand's address from
//! the interrupted registers and reads the target without faulting. When the read fails (or
//! the target is not canonical: #GP at the instruction, before any push), the program must
//! get exactly the fault the instruction would have raised: the handler sends the
//! thread to a slot holding the instruction itself ([`mem_branch_copy`], RIP-relative fixed
//! up) followed by a `jmp addr+len`; the copy faults at the slot's first byte and the fault
//! handler shows it at the probed instruction, as for any XOL slot. One race is left: memory
//! mapped by another thread between the read and the copy's own access makes the copy
//! succeed; a `call` then returns into the slot's `jmp` (the callee sees the slot as its
//! return address) and on to `addr + len`, and post_handlers do not run for that hit.
//!
//! A probe with a post_handler is never boosted: [`XolPlan::Xol`]'s `boostable` says whether it
//! *may* be, the caller decides.
//!
//! Not handled here, the caller's business: the ENDBR at a function's entry (the kernel moves a
//! probe at `func+0` to `func+4`, `arch_adjust_kprobe_addr`), and CET shadow stacks (an emulated
//! `call`/`ret` does not update the shadow stack, so probes on them must be refused in a process
//! that has one enabled).

use iced_x86::{
    Code, ConditionCode, Decoder, DecoderOptions, EncodingKind, FlowControl, Instruction, Mnemonic,
    OpKind, Register,
};

/// Length of the `jmp rel32` that ends a boosted slot.
const JMP_REL32_LEN: usize = 5;
/// Length of the `int3` that ends a slot that is not boosted.
const INT3_LEN: usize = 1;

/// What to do with the instruction at a probe address once its int3 has trapped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum XolPlan {
    /// Execute a copy in an XOL slot: `code` is the instruction relocated for the slot address
    /// (RIP-relative displacement fixed up), `len` its original length (the copy has the same
    /// length). If `boostable` the slot may end with a `jmp rel32` back to `addr + len` (no
    /// second trap); else the slot ends with an `int3` and the trap handler moves ip to
    /// `addr + len` (plus the post_handler). See [`slot_bytes`].
    Xol {
        /// The instruction's bytes, displacement rewritten for the slot address given to [`plan`].
        code: Vec<u8>,
        /// Length of the original (and of the copied) instruction, 1..=15.
        len: u8,
        /// The copy may be followed by a `jmp` back instead of an `int3` (kernel `can_boost`).
        boostable: bool,
    },
    /// Emulated in the trap handler, no slot: the handler applies `insn` to the registers.
    Emulate {
        /// What the instruction does to `rip`, `rsp`, `rcx` and the stack.
        insn: Emulate,
        /// Length of the original instruction: `addr + len` is the fall-through address.
        len: u8,
    },
}

impl XolPlan {
    /// Length in bytes of the probed instruction.
    pub fn insn_len(&self) -> u8 {
        match self {
            XolPlan::Xol { len, .. } | XolPlan::Emulate { len, .. } => *len,
        }
    }
}

/// An instruction the trap handler emulates. Every target is absolute, computed for the probe
/// address given to [`plan`]; `addr + len` below is the instruction's fall-through address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Emulate {
    /// `call rel32`: push `addr + len`; `rip = target`.
    CallRel {
        /// The callee.
        target: u64,
    },
    /// `jmp rel8`/`jmp rel32`: `rip = target`.
    JmpRel {
        /// Where it jumps.
        target: u64,
    },
    /// `jcc rel8`/`jcc rel32`: `rip = if cond.holds(rflags) { target } else { addr + len }`.
    Jcc {
        /// The condition.
        cond: Cond,
        /// Where it jumps when `cond` holds.
        target: u64,
    },
    /// `loop`, `loope`, `loopne`, `jrcxz`, `jecxz`: see [`LoopKind::step`] for `rcx` and the
    /// decision; `rip = if taken { target } else { addr + len }`.
    Loop {
        /// Which of the five.
        kind: LoopKind,
        /// Where it jumps when taken.
        target: u64,
        /// The count register is `ecx` (address-size prefix 67), not `rcx`.
        addr32: bool,
    },
    /// `ret` / `ret imm16`: `rip = [rsp]; rsp += 8 + pop`.
    Ret {
        /// Bytes of arguments popped after the return address (`ret imm16`), 0 for `ret`.
        pop: u16,
    },
    /// `call reg`: push `addr + len`; `rip = reg` (read before the push: `call rsp` jumps to the
    /// old `rsp`).
    CallReg {
        /// The register holding the callee.
        reg: GpReg,
    },
    /// `jmp reg`: `rip = reg`.
    JmpReg {
        /// The register holding the target.
        reg: GpReg,
    },
    /// `call *mem`: read the callee at [`MemOperand::address`] (from the registers before
    /// the push: `call *0x18(%rsp)` reads the old `rsp + 0x18`) without faulting; push
    /// `addr + len`; `rip = callee`. When the read fails the instruction is run from its
    /// fault slot instead, so the program gets the fault it would have had (see
    /// [`mem_branch_copy`]).
    CallMem {
        /// The operand holding the callee.
        mem: MemOperand,
    },
    /// `jmp *mem`: `rip = [mem]`, read as for [`Emulate::CallMem`].
    JmpMem {
        /// The operand holding the target.
        mem: MemOperand,
    },
    /// `rip = addr + len`: the instruction has no effect (a NOP or ENDBR), no slot needed.
    Nop,
}

/// The memory operand of an emulated `call *mem` / `jmp *mem`: `[base + index * scale +
/// disp]`, 64-bit addressing (an address-size prefix is refused), no segment base (`fs`/`gs`
/// prefixes are refused). A RIP-relative operand has neither register and its `disp` is the
/// absolute address, resolved at plan time from the probed instruction's address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemOperand {
    /// The base register, if any.
    pub base: Option<GpReg>,
    /// The index register, if any.
    pub index: Option<GpReg>,
    /// The index's scale: 1, 2, 4 or 8.
    pub scale: u8,
    /// The displacement, sign-extended (two's complement), or the absolute address of a
    /// RIP-relative operand.
    pub disp: u64,
}

impl MemOperand {
    /// The effective address for the register values `reg` gives (wrapping, as the CPU).
    pub fn address(&self, mut reg: impl FnMut(GpReg) -> u64) -> u64 {
        let mut ea = self.disp;
        if let Some(b) = self.base {
            ea = ea.wrapping_add(reg(b));
        }
        if let Some(i) = self.index {
            ea = ea.wrapping_add(reg(i).wrapping_mul(u64::from(self.scale)));
        }
        ea
    }
}

/// The sixteen `jcc` conditions, in opcode order (`70`+n, `0f 80`+n).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cond {
    /// Overflow: OF.
    O,
    /// Not overflow: !OF.
    No,
    /// Below (unsigned <), carry: CF.
    B,
    /// Above or equal (unsigned >=), no carry: !CF.
    Ae,
    /// Equal, zero: ZF.
    E,
    /// Not equal, not zero: !ZF.
    Ne,
    /// Below or equal (unsigned <=): CF | ZF.
    Be,
    /// Above (unsigned >): !CF & !ZF.
    A,
    /// Sign: SF.
    S,
    /// Not sign: !SF.
    Ns,
    /// Parity even: PF.
    P,
    /// Parity odd: !PF.
    Np,
    /// Less (signed <): SF != OF.
    L,
    /// Greater or equal (signed >=): SF == OF.
    Ge,
    /// Less or equal (signed <=): ZF | SF != OF.
    Le,
    /// Greater (signed >): !ZF & SF == OF.
    G,
}

/// RFLAGS bits read by [`Cond::holds`] and [`LoopKind::step`].
pub mod rflags {
    /// Carry flag.
    pub const CF: u64 = 1 << 0;
    /// Parity flag.
    pub const PF: u64 = 1 << 2;
    /// Zero flag.
    pub const ZF: u64 = 1 << 6;
    /// Sign flag.
    pub const SF: u64 = 1 << 7;
    /// Overflow flag.
    pub const OF: u64 = 1 << 11;
}

impl Cond {
    /// Whether the condition holds for these RFLAGS (Intel SDM vol. 2, "Jcc").
    pub fn holds(self, rflags: u64) -> bool {
        let f = |bit: u64| rflags & bit != 0;
        let (cf, pf, zf, sf, of) = (
            f(rflags::CF),
            f(rflags::PF),
            f(rflags::ZF),
            f(rflags::SF),
            f(rflags::OF),
        );
        match self {
            Cond::O => of,
            Cond::No => !of,
            Cond::B => cf,
            Cond::Ae => !cf,
            Cond::E => zf,
            Cond::Ne => !zf,
            Cond::Be => cf || zf,
            Cond::A => !cf && !zf,
            Cond::S => sf,
            Cond::Ns => !sf,
            Cond::P => pf,
            Cond::Np => !pf,
            Cond::L => sf != of,
            Cond::Ge => sf == of,
            Cond::Le => zf || sf != of,
            Cond::G => !zf && sf == of,
        }
    }

    fn from_iced(cc: ConditionCode) -> Option<Cond> {
        Some(match cc {
            ConditionCode::o => Cond::O,
            ConditionCode::no => Cond::No,
            ConditionCode::b => Cond::B,
            ConditionCode::ae => Cond::Ae,
            ConditionCode::e => Cond::E,
            ConditionCode::ne => Cond::Ne,
            ConditionCode::be => Cond::Be,
            ConditionCode::a => Cond::A,
            ConditionCode::s => Cond::S,
            ConditionCode::ns => Cond::Ns,
            ConditionCode::p => Cond::P,
            ConditionCode::np => Cond::Np,
            ConditionCode::l => Cond::L,
            ConditionCode::ge => Cond::Ge,
            ConditionCode::le => Cond::Le,
            ConditionCode::g => Cond::G,
            ConditionCode::None => return None,
        })
    }
}

/// The `loop` family (opcodes e0-e3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LoopKind {
    /// `loopne`/`loopnz` (e0): decrement the count, taken if it is not 0 and ZF is clear.
    Loopne,
    /// `loope`/`loopz` (e1): decrement the count, taken if it is not 0 and ZF is set.
    Loope,
    /// `loop` (e2): decrement the count, taken if it is not 0.
    Loop,
    /// `jrcxz` / `jecxz` (e3): taken if the count is 0; the count is not changed.
    Jrcxz,
}

impl LoopKind {
    /// Emulates the instruction on `rcx` and `rflags`: returns whether the branch is taken and
    /// the new `rcx`. The count is `rcx`, or `ecx` when `addr32` (then only the low 32 bits
    /// change, as in the kernel's `kprobe_emulate_loop`). The decision is made on the count
    /// *after* the decrement (Intel SDM vol. 2, "LOOP/LOOPcc"; the kernel's
    /// `kprobe_emulate_loop` tests the value before it, which differs for a count of 1). Flags
    /// are not changed.
    pub fn step(self, rcx: u64, rflags: u64, addr32: bool) -> (bool, u64) {
        let mask = if addr32 {
            u64::from(u32::MAX)
        } else {
            u64::MAX
        };
        let count = rcx & mask;
        if self == LoopKind::Jrcxz {
            return (count == 0, rcx);
        }
        let count = count.wrapping_sub(1) & mask;
        let new_rcx = (rcx & !mask) | count;
        let zf = rflags & rflags::ZF != 0;
        let taken = count != 0
            && match self {
                LoopKind::Loopne => !zf,
                LoopKind::Loope => zf,
                LoopKind::Loop | LoopKind::Jrcxz => true,
            };
        (taken, new_rcx)
    }
}

/// [`LoopKind::step`] on a register in place: updates `rcx`, returns whether the branch is taken.
pub fn loop_taken(kind: LoopKind, addr32: bool, rcx: &mut u64, rflags: u64) -> bool {
    let (taken, new_rcx) = kind.step(*rcx, rflags, addr32);
    *rcx = new_rcx;
    taken
}

/// A 64-bit general-purpose register.
///
/// [`GpReg::index`] is the hardware encoding number (ModRM.rm + 8 * REX.B): `rax` 0, `rcx` 1,
/// `rdx` 2, `rbx` 3, `rsp` 4, `rbp` 5, `rsi` 6, `rdi` 7, `r8`..`r15` 8..15, the declaration
/// order below, the order of the kernel's `addrmode_regoffs`. [`GpReg::greg_index`] is the
/// index into `ucontext_t.uc_mcontext.gregs` (glibc `REG_*`), for a SIGTRAP handler.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GpReg {
    /// `rax`
    Rax,
    /// `rcx`
    Rcx,
    /// `rdx`
    Rdx,
    /// `rbx`
    Rbx,
    /// `rsp`
    Rsp,
    /// `rbp`
    Rbp,
    /// `rsi`
    Rsi,
    /// `rdi`
    Rdi,
    /// `r8`
    R8,
    /// `r9`
    R9,
    /// `r10`
    R10,
    /// `r11`
    R11,
    /// `r12`
    R12,
    /// `r13`
    R13,
    /// `r14`
    R14,
    /// `r15`
    R15,
}

impl GpReg {
    /// All sixteen, in encoding order: `GpReg::ALL[r.index()] == r`.
    pub const ALL: [GpReg; 16] = [
        GpReg::Rax,
        GpReg::Rcx,
        GpReg::Rdx,
        GpReg::Rbx,
        GpReg::Rsp,
        GpReg::Rbp,
        GpReg::Rsi,
        GpReg::Rdi,
        GpReg::R8,
        GpReg::R9,
        GpReg::R10,
        GpReg::R11,
        GpReg::R12,
        GpReg::R13,
        GpReg::R14,
        GpReg::R15,
    ];

    /// Hardware encoding number 0..16, to index a `[u64; 16]` kept in encoding order.
    pub fn index(self) -> usize {
        self as usize
    }

    /// Index of this register in `ucontext_t.uc_mcontext.gregs` on x86-64 Linux.
    pub fn greg_index(self) -> usize {
        let r = match self {
            GpReg::Rax => libc::REG_RAX,
            GpReg::Rcx => libc::REG_RCX,
            GpReg::Rdx => libc::REG_RDX,
            GpReg::Rbx => libc::REG_RBX,
            GpReg::Rsp => libc::REG_RSP,
            GpReg::Rbp => libc::REG_RBP,
            GpReg::Rsi => libc::REG_RSI,
            GpReg::Rdi => libc::REG_RDI,
            GpReg::R8 => libc::REG_R8,
            GpReg::R9 => libc::REG_R9,
            GpReg::R10 => libc::REG_R10,
            GpReg::R11 => libc::REG_R11,
            GpReg::R12 => libc::REG_R12,
            GpReg::R13 => libc::REG_R13,
            GpReg::R14 => libc::REG_R14,
            GpReg::R15 => libc::REG_R15,
        };
        r as usize
    }

    fn from_iced(r: Register) -> Option<GpReg> {
        let n = r.number().checked_sub(Register::RAX.number())?;
        if r.is_gpr64() {
            GpReg::ALL.get(n).copied()
        } else {
            None
        }
    }
}

/// Why an address cannot be prepared for an int3 probe.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InsnError {
    /// The address is not where an instruction starts when the function is decoded from its
    /// first byte, or is outside the function (the kernel's `can_probe`, -EILSEQ).
    #[error("Probe point is not an instruction boundary")]
    NotBoundary,
    /// The bytes at `at` do not decode as an x86-64 instruction (or are cut off by the end of
    /// the function), so the instruction boundaries up to the probe are unknown.
    #[error("undecodable instruction at {at:#x}")]
    Undecodable {
        /// Address of the instruction that does not decode.
        at: u64,
    },
    /// The instruction decodes but cannot be probed; `why` names the rule and its source.
    #[error("cannot probe `{mnemonic}`: {why}")]
    Refused {
        /// The instruction's mnemonic, lower case (`call`, `syscall`, ...).
        mnemonic: String,
        /// The reason, with the kernel source of the rule.
        why: &'static str,
    },
    /// The instruction's RIP-relative operand at `target` cannot be reached with a 32-bit
    /// displacement from the slot (the kernel's "new displacement does not fit into s32").
    #[error("RIP-relative operand at {target:#x} is out of rel32 reach of the XOL slot")]
    OutOfReach {
        /// The operand's absolute address.
        target: u64,
    },
}

/// Decode the function `func_bytes` (at address `func_addr`) from its start and check that
/// `addr` is an instruction boundary (the kernel's `can_probe`); then plan that instruction for
/// a slot at `slot_addr`.
///
/// `func_bytes` must be the original code: where another probe has already written its int3,
/// pass the saved byte (the kernel's `recover_probed_instruction`).
pub fn plan(
    func_bytes: &[u8],
    func_addr: u64,
    addr: u64,
    slot_addr: u64,
) -> Result<XolPlan, InsnError> {
    let found = find(func_bytes, func_addr, addr)?;
    classify(&found, slot_addr)
}

/// Every instruction boundary of a function, from its first byte up to the end of `func_bytes`
/// or up to the first undecodable instruction (excluded).
pub fn boundaries(func_bytes: &[u8], func_addr: u64) -> Vec<u64> {
    let mut dec = Decoder::with_ip(64, func_bytes, func_addr, DecoderOptions::NONE);
    let mut insn = Instruction::default();
    let mut out = Vec::new();
    while dec.can_decode() {
        dec.decode_out(&mut insn);
        if insn.is_invalid() {
            break;
        }
        out.push(insn.ip());
    }
    out
}

/// Bytes a slot needs for a plan: the copy plus 5 for the `jmp rel32` back when boostable, or
/// plus 1 for the `int3`; 0 for an emulated instruction (no slot).
pub fn slot_len(plan: &XolPlan) -> usize {
    match plan {
        XolPlan::Xol {
            code, boostable, ..
        } => code.len() + if *boostable { JMP_REL32_LEN } else { INT3_LEN },
        XolPlan::Emulate { .. } => 0,
    }
}

/// The slot's contents for `slot_addr` (the one given to [`plan`]) and the probed `addr`: the
/// copy, then `jmp rel32` to `addr + len` (boostable) or `int3`. Empty for an emulated
/// instruction.
///
/// A caller that has a post_handler wants the `int3` even for a boostable plan: it passes the
/// plan with `boostable` set to false.
///
/// # Panics
///
/// If the plan is boostable and `addr + len` is not within rel32 reach of the slot, which
/// [`plan`] has checked unless `slot_addr` or `addr` differ from the ones it was given.
pub fn slot_bytes(plan: &XolPlan, addr: u64, slot_addr: u64) -> Vec<u8> {
    let XolPlan::Xol {
        code,
        len,
        boostable,
    } = plan
    else {
        return Vec::new();
    };
    let mut out = Vec::with_capacity(slot_len(plan));
    out.extend_from_slice(code);
    if *boostable {
        let jmp_end = slot_addr.wrapping_add((code.len() + JMP_REL32_LEN) as u64);
        let rel = rel32(jmp_end, addr.wrapping_add(u64::from(*len))).unwrap_or_else(|| {
            panic!("slot {slot_addr:#x}: jmp back to {addr:#x}+{len} out of rel32 reach")
        });
        out.push(0xe9);
        out.extend_from_slice(&rel.to_le_bytes());
    } else {
        out.push(0xcc);
    }
    out
}

/// `target - next_ip` as a rel32, if it fits.
fn rel32(next_ip: u64, target: u64) -> Option<i32> {
    i32::try_from(target.wrapping_sub(next_ip) as i64).ok()
}

/// The instruction found at the probe address, with what the decoder knew about its layout.
struct Found<'a> {
    insn: Instruction,
    /// Its bytes, `insn.len()` of them.
    bytes: &'a [u8],
    /// Offset of the displacement within `bytes`, and its size (0 if none).
    displ_offset: usize,
    displ_size: usize,
}

/// Decodes from the function start up to `addr` (the kernel's `can_probe`).
fn find(func_bytes: &[u8], func_addr: u64, addr: u64) -> Result<Found<'_>, InsnError> {
    let offset = addr.checked_sub(func_addr).ok_or(InsnError::NotBoundary)?;
    if offset >= func_bytes.len() as u64 {
        return Err(InsnError::NotBoundary);
    }
    let mut dec = Decoder::with_ip(64, func_bytes, func_addr, DecoderOptions::NONE);
    let mut insn = Instruction::default();
    while dec.can_decode() && dec.ip() <= addr {
        let ip = dec.ip();
        dec.decode_out(&mut insn);
        if insn.is_invalid() {
            return Err(InsnError::Undecodable { at: ip });
        }
        if ip == addr {
            let co = dec.get_constant_offsets(&insn);
            let start = (ip - func_addr) as usize;
            return Ok(Found {
                insn,
                bytes: &func_bytes[start..start + insn.len()],
                displ_offset: co.displacement_offset(),
                displ_size: co.displacement_size(),
            });
        }
    }
    Err(InsnError::NotBoundary)
}

/// The instruction's legacy prefixes (and REX), and for a legacy-encoded instruction its opcode.
struct RawOpcode {
    has_66: bool,
    has_67: bool,
    has_2e: bool,
    /// Opcode map: 1 = one-byte, 2 = 0f xx, 3 = 0f 38 xx / 0f 3a xx, 0 = VEX/EVEX/XOP.
    map: u8,
    /// The opcode byte in its map.
    opcode: u8,
    /// ModRM.reg of the byte after the opcode (meaningful only for opcodes with a ModRM).
    modrm_reg: u8,
}

impl RawOpcode {
    fn parse(bytes: &[u8], encoding: EncodingKind) -> RawOpcode {
        let mut raw = RawOpcode {
            has_66: false,
            has_67: false,
            has_2e: false,
            map: 0,
            opcode: 0,
            modrm_reg: 0,
        };
        let mut i = 0;
        while let Some(&b) = bytes.get(i) {
            match b {
                0x66 => raw.has_66 = true,
                0x67 => raw.has_67 = true,
                0x2e => raw.has_2e = true,
                0x26 | 0x36 | 0x3e | 0x64 | 0x65 | 0xf0 | 0xf2 | 0xf3 | 0x40..=0x4f => {}
                _ => break,
            }
            i += 1;
        }
        if encoding != EncodingKind::Legacy {
            return raw;
        }
        let at = |k: usize| bytes.get(k).copied().unwrap_or(0);
        let (map, op_at) = match (at(i), at(i + 1)) {
            (0x0f, 0x38 | 0x3a) => (3, i + 2),
            (0x0f, _) => (2, i + 1),
            _ => (1, i),
        };
        raw.map = map;
        raw.opcode = at(op_at);
        raw.modrm_reg = (at(op_at + 1) >> 3) & 7;
        raw
    }

    /// The kernel's `can_boost` for an instruction executed out of line (see the module docs).
    fn boostable(&self) -> bool {
        if self.has_2e || self.has_67 {
            return false;
        }
        match self.map {
            0 => true,
            1 => one_byte_boostable(self.opcode, self.modrm_reg),
            2 => twobyte_boostable(self.opcode),
            _ => false,
        }
    }
}

/// `can_boost` for one-byte opcodes. Branches (70-7f, e0-e3, e8, e9, eb) are listed for
/// completeness; they are emulated and never reach this.
fn one_byte_boostable(opcode: u8, reg: u8) -> bool {
    match opcode {
        0x62 | 0x70..=0x7f | 0x9a | 0xcc..=0xce | 0xd6 | 0xd8..=0xdf => false,
        0xe0..=0xe3 | 0xe8 | 0xe9 | 0xeb | 0xf1 | 0xf4 => false,
        // Shift group 2: /6 is SAL on AMD and reserved on Intel.
        0xc0 | 0xc1 | 0xd0..=0xd3 => reg != 6,
        // Group 3: /1 is TEST on AMD and reserved on Intel.
        0xf6 | 0xf7 => reg != 1,
        // Group 4: only INC and DEC.
        0xfe => reg <= 1,
        // Group 5: INC, DEC, and JMP near indirect.
        0xff => matches!(reg, 0 | 1 | 4),
        _ => true,
    }
}

/// The two-byte opcodes (`0f xx`) that the kernel's `twobyte_is_boostable` table marks
/// boostable; the rest (reserved opcodes, `jcc`, the opcode-extension groups, `syscall`,
/// `cpuid`, most SSE) are not.
pub fn twobyte_boostable(op: u8) -> bool {
    matches!(
        op,
        0x02 | 0x03
            | 0x06
            | 0x08
            | 0x09
            | 0x1f
            | 0x20..=0x23
            | 0x31
            | 0x40..=0x4f
            | 0x60..=0x6b
            | 0x6e
            | 0x6f
            | 0x74..=0x77
            | 0x7e
            | 0x7f
            | 0x90..=0x9f
            | 0xa0
            | 0xa1
            | 0xa3..=0xa5
            | 0xa8
            | 0xa9
            | 0xab..=0xad
            | 0xaf
            | 0xb0..=0xb7
            | 0xbb..=0xbf
            | 0xc0
            | 0xc1
            | 0xc8..=0xcf
            | 0xd1..=0xd3
            | 0xd5
            | 0xd8
            | 0xd9
            | 0xdb..=0xdd
            | 0xdf
            | 0xe1
            | 0xe2
            | 0xe5
            | 0xe8
            | 0xe9
            | 0xeb..=0xed
            | 0xef
            | 0xf1..=0xf3
            | 0xf5
            | 0xf8..=0xfa
            | 0xfc..=0xfe
    )
}

fn mnemonic_name(insn: &Instruction) -> String {
    format!("{:?}", insn.mnemonic()).to_lowercase()
}

fn refuse(insn: &Instruction, why: &'static str) -> InsnError {
    InsnError::Refused {
        mnemonic: mnemonic_name(insn),
        why,
    }
}

const WHY_INT3: &str = "an int3 is already there, someone else's breakpoint \
                        (kernel __copy_instruction refuses 0xcc)";
const WHY_INT: &str = "software interrupt (kernel can_probe: INT and UD are not probed; \
                       uprobes good_insns_64 refuses cc, cd, f1)";
const WHY_UD: &str = "raises #UD on purpose (kernel can_probe: is_exception_insn)";
const WHY_RTM: &str = "RTM: the probe's int3 aborts the transaction, xend/xabort outside one \
                       fault (uprobes refuses the 0f 01 group, xend included)";
const WHY_SYSCALL: &str = "system call entry: uprobes refuses syscall and sysenter \
                           (good_2byte_insns 0f 05, 0f 34); rcx would hold the slot address";
const WHY_SYSRET: &str = "return from the kernel, privileged \
                          (uprobes good_2byte_insns 0f 07, 0f 35)";
const WHY_IRET: &str = "iret loads cs, ss and rflags from the stack \
                        (kernel prepare_emulation refuses 0xcf)";
const WHY_FAR: &str = "far transfer loads cs (kernel prepare_emulation refuses 9a, ea, \
                       ff /3, ff /5)";
const WHY_FAR_RET: &str = "far return loads cs (the kernel emulates lret as a near ret, \
                           which is wrong for user space; refused)";
const WHY_CALL_MEM: &str = "indirect call through a memory operand this emulation cannot \
                            address";
const WHY_JMP_MEM: &str = "indirect jmp through a memory operand this emulation cannot \
                           address";
const WHY_66_BRANCH: &str = "operand-size prefix on a branch: Intel ignores it, AMD \
                             truncates rip to 16 bits (uprobes branch_setup_xol_ops refuses it)";
const WHY_SEG_INDIRECT: &str = "fs/gs segment prefix on an indirect branch through memory: \
                                the emulation reads without the segment base (uprobes runs \
                                these out of line; refused here)";
const WHY_67_INDIRECT: &str = "address-size prefix on an indirect branch (kernel \
                               prepare_emulation refuses addr_bytes != 8)";
const WHY_VM: &str = "virtualization instruction (kernel prepare_emulation refuses VMX \
                      0f 01 /0)";
const WHY_BRANCH: &str = "control transfer that is not emulated";
const WHY_PRIVILEGED: &str = "privileged or IOPL instruction, faults in user space (uprobes \
                              good_insns_64: hlt, cli, sti, in, out, ins, outs)";
const WHY_MOV_SS: &str = "loading ss delays interrupts and traps past the next instruction \
                          (insn_masking_exception, kernel and uprobes)";

/// Decides what to do with the instruction (the kernel's `prepare_emulation`, `can_boost`,
/// `__copy_instruction` and uprobes' `uprobe_init_insn`, `branch_setup_xol_ops`).
fn classify(found: &Found<'_>, slot_addr: u64) -> Result<XolPlan, InsnError> {
    let insn = &found.insn;
    let raw = RawOpcode::parse(found.bytes, insn.encoding());
    let len = insn.len() as u8;
    let emulate = |e: Emulate| Ok(XolPlan::Emulate { insn: e, len });
    let flow = insn.flow_control();

    match flow {
        FlowControl::Exception => return Err(refuse(insn, WHY_UD)),
        FlowControl::Interrupt if insn.mnemonic() == Mnemonic::Int3 => {
            return Err(refuse(insn, WHY_INT3))
        }
        FlowControl::Interrupt => return Err(refuse(insn, WHY_INT)),
        FlowControl::XbeginXabortXend => return Err(refuse(insn, WHY_RTM)),
        _ => {}
    }
    match insn.mnemonic() {
        Mnemonic::Xbegin | Mnemonic::Xend | Mnemonic::Xabort => return Err(refuse(insn, WHY_RTM)),
        Mnemonic::Syscall | Mnemonic::Sysenter => return Err(refuse(insn, WHY_SYSCALL)),
        Mnemonic::Sysret | Mnemonic::Sysretq | Mnemonic::Sysexit | Mnemonic::Sysexitq => {
            return Err(refuse(insn, WHY_SYSRET))
        }
        Mnemonic::Iret | Mnemonic::Iretd | Mnemonic::Iretq => return Err(refuse(insn, WHY_IRET)),
        Mnemonic::Nop | Mnemonic::Endbr64 | Mnemonic::Endbr32 => return emulate(Emulate::Nop),
        _ => {}
    }
    if flow != FlowControl::Next {
        if insn.is_jmp_far()
            || insn.is_call_far()
            || insn.is_jmp_far_indirect()
            || insn.is_call_far_indirect()
        {
            return Err(refuse(insn, WHY_FAR));
        }
        if matches!(
            insn.code(),
            Code::Retfq
                | Code::Retfq_imm16
                | Code::Retfd
                | Code::Retfd_imm16
                | Code::Retfw
                | Code::Retfw_imm16
        ) {
            return Err(refuse(insn, WHY_FAR_RET));
        }
        if raw.has_66 {
            return Err(refuse(insn, WHY_66_BRANCH));
        }
        return branch(insn, &raw).map(|e| XolPlan::Emulate { insn: e, len });
    }
    if insn.is_privileged() {
        return Err(refuse(insn, WHY_PRIVILEGED));
    }
    if matches!(
        insn.code(),
        Code::Mov_Sreg_rm16 | Code::Mov_Sreg_r32m16 | Code::Mov_Sreg_r64m16
    ) && insn.op0_register() == Register::SS
        || insn.code() == Code::Popw_SS
    {
        return Err(refuse(insn, WHY_MOV_SS));
    }

    let mut code = found.bytes.to_vec();
    if insn.is_ip_rel_memory_operand() {
        relocate(found, slot_addr, &mut code)?;
    }
    let jmp_end = slot_addr.wrapping_add((code.len() + JMP_REL32_LEN) as u64);
    let next = found.insn.next_ip();
    let boostable = raw.boostable() && rel32(jmp_end, next).is_some();
    Ok(XolPlan::Xol {
        code,
        len,
        boostable,
    })
}

/// Emulation of a branch, call or return (everything not refused before with flow control
/// other than `Next`).
fn branch(insn: &Instruction, raw: &RawOpcode) -> Result<Emulate, InsnError> {
    let target = insn.near_branch_target();
    let rel64 = insn.op0_kind() == OpKind::NearBranch64;
    let code = insn.code();
    let e = match code {
        Code::Call_rel32_64 => Emulate::CallRel { target },
        Code::Jmp_rel8_64 | Code::Jmp_rel32_64 => Emulate::JmpRel { target },
        Code::Retnq => Emulate::Ret { pop: 0 },
        Code::Retnq_imm16 => Emulate::Ret {
            pop: insn.immediate16(),
        },
        Code::Call_rm64 | Code::Jmp_rm64 => {
            let call = code == Code::Call_rm64;
            if raw.has_67 {
                return Err(refuse(insn, WHY_67_INDIRECT));
            }
            if insn.op0_kind() == OpKind::Memory {
                let mem = mem_operand(insn)?;
                return Ok(if call {
                    Emulate::CallMem { mem }
                } else {
                    Emulate::JmpMem { mem }
                });
            }
            if insn.op0_kind() != OpKind::Register {
                return Err(refuse(insn, if call { WHY_CALL_MEM } else { WHY_JMP_MEM }));
            }
            let reg =
                GpReg::from_iced(insn.op0_register()).ok_or_else(|| refuse(insn, WHY_BRANCH))?;
            if call {
                Emulate::CallReg { reg }
            } else {
                Emulate::JmpReg { reg }
            }
        }
        _ if insn.is_jcc_short_or_near() && rel64 => match Cond::from_iced(insn.condition_code()) {
            Some(cond) => Emulate::Jcc { cond, target },
            None => return Err(refuse(insn, WHY_BRANCH)),
        },
        _ => match loop_kind(code) {
            Some((kind, addr32)) if rel64 => Emulate::Loop {
                kind,
                target,
                addr32,
            },
            _ => {
                let why = match insn.mnemonic() {
                    Mnemonic::Vmcall
                    | Mnemonic::Vmmcall
                    | Mnemonic::Vmlaunch
                    | Mnemonic::Vmresume
                    | Mnemonic::Vmrun => WHY_VM,
                    _ if insn.is_privileged() => WHY_PRIVILEGED,
                    _ => WHY_BRANCH,
                };
                return Err(refuse(insn, why));
            }
        },
    };
    Ok(e)
}

/// The memory operand of `call *mem` / `jmp *mem` (64-bit addressing, checked by the caller).
fn mem_operand(insn: &Instruction) -> Result<MemOperand, InsnError> {
    let call = insn.code() == Code::Call_rm64;
    let other = || refuse(insn, if call { WHY_CALL_MEM } else { WHY_JMP_MEM });
    if matches!(insn.segment_prefix(), Register::FS | Register::GS) {
        return Err(refuse(insn, WHY_SEG_INDIRECT));
    }
    if insn.is_ip_rel_memory_operand() {
        if insn.memory_base() != Register::RIP {
            return Err(other());
        }
        return Ok(MemOperand {
            base: None,
            index: None,
            scale: 1,
            disp: insn.ip_rel_memory_address(),
        });
    }
    let reg = |r: Register| -> Result<Option<GpReg>, InsnError> {
        match r {
            Register::None => Ok(None),
            r => GpReg::from_iced(r).map(Some).ok_or_else(other),
        }
    };
    Ok(MemOperand {
        base: reg(insn.memory_base())?,
        index: reg(insn.memory_index())?,
        scale: insn.memory_index_scale() as u8,
        disp: insn.memory_displacement64(),
    })
}

/// The bytes of the `call *mem` / `jmp *mem` at `addr` for its *fault slot* at `slot_addr`:
/// the instruction as it is, a RIP-relative displacement rewritten so the copy reads the same
/// memory. The caller appends a `jmp addr+len`. An emulated memory branch runs from that slot
/// only when the handler's read of its operand failed: the copy then faults at its first
/// byte, as the original would have, and the fault is shown at `addr` (uprobes'
/// `arch_uprobe_abort_xol`); a `call` whose read succeeds there after all returns to the
/// slot's `jmp` and on to `addr + len`.
pub fn mem_branch_copy(
    func_bytes: &[u8],
    func_addr: u64,
    addr: u64,
    slot_addr: u64,
) -> Result<Vec<u8>, InsnError> {
    let found = find(func_bytes, func_addr, addr)?;
    let mut code = found.bytes.to_vec();
    if found.insn.is_ip_rel_memory_operand() {
        relocate(&found, slot_addr, &mut code)?;
    }
    Ok(code)
}

/// The `loop` family in 64-bit mode: kind, and whether the count is `ecx`.
fn loop_kind(code: Code) -> Option<(LoopKind, bool)> {
    Some(match code {
        Code::Loopne_rel8_64_RCX => (LoopKind::Loopne, false),
        Code::Loopne_rel8_64_ECX => (LoopKind::Loopne, true),
        Code::Loope_rel8_64_RCX => (LoopKind::Loope, false),
        Code::Loope_rel8_64_ECX => (LoopKind::Loope, true),
        Code::Loop_rel8_64_RCX => (LoopKind::Loop, false),
        Code::Loop_rel8_64_ECX => (LoopKind::Loop, true),
        Code::Jrcxz_rel8_64 => (LoopKind::Jrcxz, false),
        Code::Jecxz_rel8_64 => (LoopKind::Jrcxz, true),
        _ => return None,
    })
}

/// Rewrites the disp32 of a RIP-relative operand so the copy at `slot_addr` addresses the same
/// memory (the kernel's `__copy_instruction`). Any immediate after the displacement is left as
/// it is; the copy has the same length, so its next ip is `slot_addr + len`.
fn relocate(found: &Found<'_>, slot_addr: u64, code: &mut [u8]) -> Result<(), InsnError> {
    let insn = &found.insn;
    let target = insn.ip_rel_memory_address();
    let slot_next = slot_addr.wrapping_add(insn.len() as u64);
    let disp = if insn.memory_base() == Register::EIP {
        // `[eip+disp32]` (address-size prefix): the address wraps at 4 GiB, so any disp32 does.
        (target as u32).wrapping_sub(slot_next as u32) as i32
    } else {
        rel32(slot_next, target).ok_or(InsnError::OutOfReach { target })?
    };
    let (off, size) = (found.displ_offset, found.displ_size);
    assert_eq!(size, 4, "a RIP-relative operand always has a disp32");
    code[off..off + 4].copy_from_slice(&disp.to_le_bytes());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::{Formatter, IntelFormatter};

    /// Intel-syntax disassembly of the one instruction in `bytes` at `ip`, RIP-relative operands
    /// shown as `[rip+disp]`.
    fn dis(bytes: &[u8], ip: u64) -> String {
        let mut dec = Decoder::with_ip(64, bytes, ip, DecoderOptions::NONE);
        let insn = dec.decode();
        assert_eq!(
            insn.len(),
            bytes.len(),
            "{bytes:02x?} is not one instruction"
        );
        let mut f = IntelFormatter::new();
        f.options_mut().set_rip_relative_addresses(true);
        f.options_mut().set_hex_prefix("0x");
        f.options_mut().set_hex_suffix("");
        f.options_mut().set_uppercase_hex(false);
        f.options_mut().set_branch_leading_zeros(false);
        f.options_mut().set_space_after_operand_separator(true);
        f.options_mut().set_show_branch_size(false);
        let mut s = String::new();
        f.format(&insn, &mut s);
        s
    }

    /// Plans a function made of the single instruction `bytes`, at `addr`.
    fn plan1(bytes: &[u8], addr: u64, slot: u64) -> Result<XolPlan, InsnError> {
        plan(bytes, addr, addr, slot)
    }

    fn emulated(bytes: &[u8], addr: u64) -> Emulate {
        match plan1(bytes, addr, addr + 0x1000) {
            Ok(XolPlan::Emulate { insn, len }) => {
                assert_eq!(usize::from(len), bytes.len());
                insn
            }
            other => panic!("{}: {other:?}", dis(bytes, addr)),
        }
    }

    fn refused(bytes: &[u8]) -> &'static str {
        match plan1(bytes, 0x401000, 0x402000) {
            Err(InsnError::Refused { why, .. }) => why,
            other => panic!("{bytes:02x?}: {other:?}"),
        }
    }

    const A: u64 = 0x401000;

    #[test]
    fn relative_calls_and_jumps_are_emulated_with_absolute_targets() {
        let call = [0xe8, 0xfb, 0x0f, 0x00, 0x00];
        assert_eq!(dis(&call, A), "call 0x402000");
        assert_eq!(emulated(&call, A), Emulate::CallRel { target: 0x402000 });

        let call_back = [0xe8, 0xf6, 0xff, 0xff, 0xff];
        assert_eq!(dis(&call_back, A), "call 0x400ffb");
        assert_eq!(
            emulated(&call_back, A),
            Emulate::CallRel { target: 0x400ffb }
        );

        let jmp32 = [0xe9, 0x00, 0x01, 0x00, 0x00];
        assert_eq!(dis(&jmp32, A), "jmp 0x401105");
        assert_eq!(emulated(&jmp32, A), Emulate::JmpRel { target: 0x401105 });

        let jmp8_self = [0xeb, 0xfe];
        assert_eq!(dis(&jmp8_self, A), "jmp 0x401000");
        assert_eq!(emulated(&jmp8_self, A), Emulate::JmpRel { target: A });

        let je8 = [0x74, 0x10];
        assert_eq!(dis(&je8, A), "je 0x401012");
        let target = 0x401012;
        assert_eq!(
            emulated(&je8, A),
            Emulate::Jcc {
                cond: Cond::E,
                target
            }
        );

        let jne32 = [0x0f, 0x85, 0x00, 0x10, 0x00, 0x00];
        assert_eq!(dis(&jne32, A), "jne 0x402006");
        let (cond, target) = (Cond::Ne, 0x402006);
        assert_eq!(emulated(&jne32, A), Emulate::Jcc { cond, target });

        let jg8_back = [0x7f, 0x80];
        assert_eq!(dis(&jg8_back, A), "jg 0x400f82");
        let (cond, target) = (Cond::G, 0x400f82);
        assert_eq!(emulated(&jg8_back, A), Emulate::Jcc { cond, target });

        // A branch hint prefix (3e, "taken") does not matter to an emulation.
        let jb_hint = [0x3e, 0x72, 0x05];
        assert_eq!(dis(&jb_hint, A), "hint-taken jb 0x401008");
        let (cond, target) = (Cond::B, 0x401008);
        assert_eq!(emulated(&jb_hint, A), Emulate::Jcc { cond, target });
    }

    #[test]
    fn every_jcc_opcode_maps_to_its_condition() {
        let conds = [
            Cond::O,
            Cond::No,
            Cond::B,
            Cond::Ae,
            Cond::E,
            Cond::Ne,
            Cond::Be,
            Cond::A,
            Cond::S,
            Cond::Ns,
            Cond::P,
            Cond::Np,
            Cond::L,
            Cond::Ge,
            Cond::Le,
            Cond::G,
        ];
        for (n, &cond) in conds.iter().enumerate() {
            let short = [0x70 + n as u8, 0x02]; // jcc 0x401004
            let near = [0x0f, 0x80 + n as u8, 0x02, 0, 0, 0]; // jcc 0x401008
            let target = A + 4;
            assert_eq!(emulated(&short, A), Emulate::Jcc { cond, target });
            let target = A + 8;
            assert_eq!(emulated(&near, A), Emulate::Jcc { cond, target });
        }
    }

    #[test]
    fn loops_are_emulated() {
        let cases: [(&[u8], &str, LoopKind, u64, bool); 6] = [
            (
                &[0xe2, 0xfc],
                "loop 0x400ffe",
                LoopKind::Loop,
                0x400ffe,
                false,
            ),
            (&[0xe1, 0xfe], "loope 0x401000", LoopKind::Loope, A, false),
            (
                &[0xe0, 0x10],
                "loopne 0x401012",
                LoopKind::Loopne,
                0x401012,
                false,
            ),
            (
                &[0xe3, 0x05],
                "jrcxz 0x401007",
                LoopKind::Jrcxz,
                0x401007,
                false,
            ),
            (
                &[0x67, 0xe2, 0xfc],
                "addr32 loop 0x400fff",
                LoopKind::Loop,
                0x400fff,
                true,
            ),
            (
                &[0x67, 0xe3, 0x05],
                "jecxz 0x401008",
                LoopKind::Jrcxz,
                0x401008,
                true,
            ),
        ];
        for (bytes, text, kind, target, addr32) in cases {
            assert_eq!(dis(bytes, A), text);
            let want = Emulate::Loop {
                kind,
                target,
                addr32,
            };
            assert_eq!(emulated(bytes, A), want, "{text}");
        }
    }

    #[test]
    fn loop_step_decrements_then_tests() {
        use rflags::ZF;
        // loop: 1 -> 0 falls through, 2 -> 1 is taken, 0 -> u64::MAX is taken.
        assert_eq!(LoopKind::Loop.step(1, 0, false), (false, 0));
        assert_eq!(LoopKind::Loop.step(2, 0, false), (true, 1));
        assert_eq!(LoopKind::Loop.step(0, 0, false), (true, u64::MAX));
        // ecx: only the low half counts and changes.
        assert_eq!(
            LoopKind::Loop.step(0xdead_0000_0000_0001, 0, true),
            (false, 0xdead_0000_0000_0000)
        );
        assert_eq!(
            LoopKind::Loop.step(0xdead_0000_0000_0000, 0, true),
            (true, 0xdead_0000_ffff_ffff)
        );
        assert_eq!(LoopKind::Loope.step(5, ZF, false), (true, 4));
        assert_eq!(LoopKind::Loope.step(5, 0, false), (false, 4));
        assert_eq!(LoopKind::Loopne.step(5, 0, false), (true, 4));
        assert_eq!(LoopKind::Loopne.step(5, ZF, false), (false, 4));
        assert_eq!(LoopKind::Loopne.step(1, 0, false), (false, 0));
        // jrcxz / jecxz do not change the count.
        assert_eq!(LoopKind::Jrcxz.step(0, 0, false), (true, 0));
        assert_eq!(LoopKind::Jrcxz.step(7, 0, false), (false, 7));
        assert_eq!(LoopKind::Jrcxz.step(1 << 32, 0, true), (true, 1 << 32));
        assert_eq!(LoopKind::Jrcxz.step(1 << 32, 0, false), (false, 1 << 32));
        // In place, as the trap handler uses it.
        let mut rcx = 3;
        assert!(loop_taken(LoopKind::Loop, false, &mut rcx, 0));
        assert!(loop_taken(LoopKind::Loop, false, &mut rcx, 0));
        assert!(!loop_taken(LoopKind::Loop, false, &mut rcx, 0));
        assert_eq!(rcx, 0);
    }

    #[test]
    fn returns_and_register_branches_are_emulated() {
        assert_eq!(dis(&[0xc3], A), "ret");
        assert_eq!(emulated(&[0xc3], A), Emulate::Ret { pop: 0 });
        let ret16 = [0xc2, 0x10, 0x00];
        assert_eq!(dis(&ret16, A), "ret 0x10");
        assert_eq!(emulated(&ret16, A), Emulate::Ret { pop: 0x10 });
        // bnd ret (MPX prefix, ignored).
        assert_eq!(dis(&[0xf2, 0xc3], A), "bnd ret");
        assert_eq!(emulated(&[0xf2, 0xc3], A), Emulate::Ret { pop: 0 });

        let cases: [(&[u8], &str, Emulate); 5] = [
            (
                &[0xff, 0xd0],
                "call rax",
                Emulate::CallReg { reg: GpReg::Rax },
            ),
            (
                &[0x41, 0xff, 0xd3],
                "call r11",
                Emulate::CallReg { reg: GpReg::R11 },
            ),
            (
                &[0xff, 0xe1],
                "jmp rcx",
                Emulate::JmpReg { reg: GpReg::Rcx },
            ),
            (
                &[0x41, 0xff, 0xe7],
                "jmp r15",
                Emulate::JmpReg { reg: GpReg::R15 },
            ),
            // CET switch-table jump: notrack (3e) does not matter to an emulation.
            (
                &[0x3e, 0xff, 0xe0],
                "notrack jmp rax",
                Emulate::JmpReg { reg: GpReg::Rax },
            ),
        ];
        for (bytes, text, want) in cases {
            assert_eq!(dis(bytes, A), text);
            assert_eq!(emulated(bytes, A), want, "{text}");
        }
    }

    #[test]
    fn branches_through_memory_are_emulated_with_their_operand() {
        let m = |base, index, scale, disp| MemOperand {
            base,
            index,
            scale,
            disp,
        };
        use GpReg::*;
        let cases: [(&[u8], &str, bool, MemOperand); 10] = [
            // A virtual call: `mov (%rdi),%rax; call *(%rax)`.
            (
                &[0xff, 0x10],
                "call qword ptr [rax]",
                true,
                m(Some(Rax), None, 1, 0),
            ),
            (
                &[0xff, 0x50, 0x08],
                "call qword ptr [rax+8]",
                true,
                m(Some(Rax), None, 1, 8),
            ),
            (
                &[0xff, 0x57, 0x18],
                "call qword ptr [rdi+0x18]",
                true,
                m(Some(Rdi), None, 1, 0x18),
            ),
            // -fno-plt: `call *foo@GOTPCREL(%rip)`, resolved to the absolute GOT slot
            // (0x401006 + 0x2fe2).
            (
                &[0xff, 0x15, 0xe2, 0x2f, 0x00, 0x00],
                "call qword ptr [rip+0x2fe2]",
                true,
                m(None, None, 1, 0x403fe8),
            ),
            // A negative displacement, sign-extended.
            (
                &[0xff, 0x25, 0xf0, 0xff, 0xff, 0xff],
                "jmp qword ptr [rip-0x10]",
                false,
                m(None, None, 1, 0x400ff6),
            ),
            // rsp as the base (SIB): read before the push.
            (
                &[0xff, 0x54, 0x24, 0x18],
                "call qword ptr [rsp+0x18]",
                true,
                m(Some(Rsp), None, 1, 0x18),
            ),
            // A jump table, with and without CET's notrack.
            (
                &[0xff, 0x24, 0xc8],
                "jmp qword ptr [rax+rcx*8]",
                false,
                m(Some(Rax), Some(Rcx), 8, 0),
            ),
            (
                &[0x3e, 0xff, 0x24, 0xc5, 0xf8, 0xff, 0xff, 0xff],
                "notrack jmp qword ptr [rax*8-8]",
                false,
                m(None, Some(Rax), 8, (-8i64) as u64),
            ),
            // REX.B and REX.X: r13 base (needs a disp8), r14 index.
            (
                &[0x43, 0xff, 0x54, 0x75, 0x00],
                "call qword ptr [r13+r14*2]",
                true,
                m(Some(R13), Some(R14), 2, 0),
            ),
            // A ds prefix is a no-op in 64-bit mode.
            (
                &[0x3e, 0xff, 0x12],
                "notrack call qword ptr [rdx]",
                true,
                m(Some(Rdx), None, 1, 0),
            ),
        ];
        for (bytes, text, call, mem) in cases {
            assert_eq!(dis(bytes, A), text);
            let want = if call {
                Emulate::CallMem { mem }
            } else {
                Emulate::JmpMem { mem }
            };
            assert_eq!(emulated(bytes, A), want, "{text}");
            // No slot of its own: the fault slot is the caller's (mem_branch_copy).
            assert_eq!(slot_len(&plan1(bytes, A, A + 0x1000).unwrap()), 0);
        }
        // The effective address from register values.
        let regs = |r: GpReg| match r {
            Rax => 0x1000,
            Rcx => 3,
            Rsp => 0x7ff0,
            _ => 0,
        };
        assert_eq!(m(Some(Rax), Some(Rcx), 8, 0).address(regs), 0x1018);
        assert_eq!(m(Some(Rsp), None, 1, 0x18).address(regs), 0x8008);
        assert_eq!(m(Some(Rax), None, 1, (-8i64) as u64).address(regs), 0xff8);
        assert_eq!(m(None, None, 1, 0x403fe8).address(regs), 0x403fe8);
        assert_eq!(m(None, Some(Rcx), 8, u64::MAX).address(regs), 23);
    }

    #[test]
    fn fault_slot_copy_reads_the_same_memory() {
        // 401000: ff 15 e2 2f 00 00   call *0x2fe2(%rip)   (reads 0x403fe8)
        let call = [0xff, 0x15, 0xe2, 0x2f, 0x00, 0x00];
        let slot = 0x500000;
        let copy = mem_branch_copy(&call, A, A, slot).unwrap();
        // 500000: ff 15 e2 3f f0 ff   call *-0xfc01e(%rip) (reads 0x403fe8)
        assert_eq!(copy, [0xff, 0x15, 0xe2, 0x3f, 0xf0, 0xff]);
        assert_eq!(dis(&copy, slot), "call qword ptr [rip-0xfc01e]");
        let d = Decoder::with_ip(64, &copy, slot, DecoderOptions::NONE).decode();
        assert_eq!(d.ip_rel_memory_address(), 0x403fe8);
        // Register operands are copied as they are.
        let jt = [0x3e, 0xff, 0x24, 0xc8];
        assert_eq!(mem_branch_copy(&jt, A, A, slot).unwrap(), jt);
        // Out of rel32 reach, and not a boundary.
        assert_eq!(
            mem_branch_copy(&call, A, A, 0x7f00_0000_0000),
            Err(InsnError::OutOfReach { target: 0x403fe8 })
        );
        assert_eq!(
            mem_branch_copy(&call, A, A + 1, slot),
            Err(InsnError::NotBoundary)
        );
    }

    #[test]
    fn nops_and_endbr_need_no_slot() {
        let cases: [(&[u8], &str); 5] = [
            (&[0x90], "nop"),
            (&[0x66, 0x90], "xchg ax, ax"),
            (&[0x0f, 0x1f, 0x44, 0x00, 0x00], "nop [rax+rax]"),
            (
                &[0x66, 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00],
                "nop [rax+rax]",
            ),
            (&[0xf3, 0x0f, 0x1e, 0xfa], "endbr64"),
        ];
        for (bytes, text) in cases {
            assert_eq!(dis(bytes, A), text);
            assert_eq!(emulated(bytes, A), Emulate::Nop, "{text}");
            let p = plan1(bytes, A, A + 0x1000).unwrap();
            assert_eq!(slot_len(&p), 0);
            assert!(slot_bytes(&p, A, A + 0x1000).is_empty());
        }
        // `41 90` is `xchg eax, r8d`, not a NOP: executed out of line.
        assert_eq!(dis(&[0x41, 0x90], A), "xchg r8d, eax");
        assert!(matches!(
            plan1(&[0x41, 0x90], A, A + 0x1000),
            Ok(XolPlan::Xol { .. })
        ));
    }

    #[test]
    fn cond_matches_flags_of_a_real_subtraction() {
        // Flags of `cmp a, b` (8-bit), computed independently of `Cond::holds`.
        fn cmp_flags(a: u8, b: u8) -> u64 {
            let r = a.wrapping_sub(b);
            let mut f = 0;
            if a < b {
                f |= rflags::CF;
            }
            if r.count_ones() % 2 == 0 {
                f |= rflags::PF;
            }
            if r == 0 {
                f |= rflags::ZF;
            }
            if r & 0x80 != 0 {
                f |= rflags::SF;
            }
            if (a as i8).checked_sub(b as i8).is_none() {
                f |= rflags::OF;
            }
            f
        }
        let values = [0u8, 1, 2, 0x7e, 0x7f, 0x80, 0x81, 0xfe, 0xff];
        for a in values {
            for b in values {
                let f = cmp_flags(a, b);
                let (sa, sb) = (a as i8, b as i8);
                let r = a.wrapping_sub(b);
                let ctx = format!("cmp {a:#x}, {b:#x}: flags {f:#x}");
                assert_eq!(Cond::B.holds(f), a < b, "{ctx}");
                assert_eq!(Cond::Ae.holds(f), a >= b, "{ctx}");
                assert_eq!(Cond::E.holds(f), a == b, "{ctx}");
                assert_eq!(Cond::Ne.holds(f), a != b, "{ctx}");
                assert_eq!(Cond::Be.holds(f), a <= b, "{ctx}");
                assert_eq!(Cond::A.holds(f), a > b, "{ctx}");
                assert_eq!(Cond::L.holds(f), sa < sb, "{ctx}");
                assert_eq!(Cond::Ge.holds(f), sa >= sb, "{ctx}");
                assert_eq!(Cond::Le.holds(f), sa <= sb, "{ctx}");
                assert_eq!(Cond::G.holds(f), sa > sb, "{ctx}");
                assert_eq!(Cond::S.holds(f), (r as i8) < 0, "{ctx}");
                assert_eq!(Cond::Ns.holds(f), (r as i8) >= 0, "{ctx}");
                assert_eq!(Cond::O.holds(f), sa.checked_sub(sb).is_none(), "{ctx}");
                assert_eq!(Cond::P.holds(f), r.count_ones() % 2 == 0, "{ctx}");
            }
        }
    }

    #[test]
    fn cond_pairs_are_complements_for_every_flag_combination() {
        let bits = [rflags::CF, rflags::PF, rflags::ZF, rflags::SF, rflags::OF];
        let pairs = [
            (Cond::O, Cond::No),
            (Cond::B, Cond::Ae),
            (Cond::E, Cond::Ne),
            (Cond::Be, Cond::A),
            (Cond::S, Cond::Ns),
            (Cond::P, Cond::Np),
            (Cond::L, Cond::Ge),
            (Cond::Le, Cond::G),
        ];
        for combo in 0..32u32 {
            let mut f = 0x202; // reserved bit 1 and IF, which no condition reads
            for (i, bit) in bits.iter().enumerate() {
                if combo & (1 << i) != 0 {
                    f |= bit;
                }
            }
            for (c, not_c) in pairs {
                assert_ne!(c.holds(f), not_c.holds(f), "{c:?}/{not_c:?} at {f:#x}");
            }
            let has = |b: u64| f & b != 0;
            assert_eq!(Cond::O.holds(f), has(rflags::OF));
            assert_eq!(Cond::B.holds(f), has(rflags::CF));
            assert_eq!(Cond::E.holds(f), has(rflags::ZF));
            assert_eq!(Cond::S.holds(f), has(rflags::SF));
            assert_eq!(Cond::P.holds(f), has(rflags::PF));
            assert_eq!(Cond::Be.holds(f), has(rflags::CF) || has(rflags::ZF));
            assert_eq!(Cond::L.holds(f), has(rflags::SF) != has(rflags::OF));
            assert_eq!(
                Cond::Le.holds(f),
                has(rflags::ZF) || has(rflags::SF) != has(rflags::OF)
            );
        }
    }

    /// Plans `bytes` at `addr` for `slot`, expects a copy, and checks that the copy at `slot`
    /// addresses what the original at `addr` does.
    fn relocated(bytes: &[u8], addr: u64, slot: u64) -> (Vec<u8>, bool) {
        let p = plan1(bytes, addr, slot).unwrap();
        let XolPlan::Xol {
            code,
            len,
            boostable,
        } = p
        else {
            panic!("{}: {p:?}", dis(bytes, addr));
        };
        assert_eq!(usize::from(len), bytes.len());
        assert_eq!(code.len(), bytes.len());
        let mut dec = Decoder::with_ip(64, bytes, addr, DecoderOptions::NONE);
        let orig = dec.decode();
        let off = dec.get_constant_offsets(&orig).displacement_offset();
        let copy = Decoder::with_ip(64, &code, slot, DecoderOptions::NONE).decode();
        assert_eq!(copy.code(), orig.code());
        assert_eq!(copy.ip_rel_memory_address(), orig.ip_rel_memory_address());
        // Only the disp32 differs: prefixes, opcode, ModRM before it, any immediate after it.
        assert_eq!(code[..off], bytes[..off]);
        assert_eq!(code[off + 4..], bytes[off + 4..]);
        (code, boostable)
    }

    #[test]
    fn rip_relative_load_is_relocated_or_out_of_reach() {
        let mov = [0x48, 0x8b, 0x05, 0x00, 0x10, 0x00, 0x00];
        assert_eq!(dis(&mov, 0x400000), "mov rax, [rip+0x1000]"); // reads 0x401007
        assert_eq!(
            plan1(&mov, 0x400000, 0x7f00_0000_0000),
            Err(InsnError::OutOfReach { target: 0x401007 })
        );
        let (code, boostable) = relocated(&mov, 0x400000, 0x500000);
        assert_eq!(code, [0x48, 0x8b, 0x05, 0x00, 0x10, 0xf0, 0xff]);
        assert_eq!(dis(&code, 0x500000), "mov rax, [rip-0xff000]"); // still 0x401007
        assert!(boostable);

        // Just in reach: disp = i32::MAX and i32::MIN (the same mov at 0x8_0000_0000, reading
        // 0x8_0000_1007).
        let (addr, target) = (0x8_0000_0000, 0x8_0000_1007);
        let slot = target - 7 - i32::MAX as u64;
        let (code, _) = relocated(&mov, addr, slot);
        assert_eq!(&code[3..], &i32::MAX.to_le_bytes());
        assert_eq!(
            plan1(&mov, addr, slot - 1),
            Err(InsnError::OutOfReach { target })
        );
        let slot = target - 7 + (1u64 << 31);
        let (code, _) = relocated(&mov, addr, slot);
        assert_eq!(&code[3..], &i32::MIN.to_le_bytes());
        assert_eq!(
            plan1(&mov, addr, slot + 1),
            Err(InsnError::OutOfReach { target })
        );
    }

    #[test]
    fn rip_relative_operand_forms_keep_their_effective_address() {
        let slot = 0x7f00_1000;
        let cases: [(&[u8], &str, &str); 6] = [
            (
                &[0x48, 0x8d, 0x0d, 0xf0, 0xff, 0xff, 0xff],
                "lea rcx, [rip-0x10]",
                "lea rcx, [rip-0x7ec00010]",
            ),
            // The immediate comes after the displacement and must survive.
            (
                &[0x83, 0x3d, 0x10, 0x00, 0x00, 0x00, 0x05],
                "cmp dword ptr [rip+0x10], 5",
                "cmp dword ptr [rip-0x7ebffff0], 5",
            ),
            (
                &[0x81, 0x05, 0x00, 0x02, 0x00, 0x00, 0x78, 0x56, 0x34, 0x12],
                "add dword ptr [rip+0x200], 0x12345678",
                "add dword ptr [rip-0x7ebffe00], 0x12345678",
            ),
            (
                &[0xf3, 0x0f, 0x10, 0x05, 0x00, 0x01, 0x00, 0x00],
                "movss xmm0, [rip+0x100]",
                "movss xmm0, [rip-0x7ebfff00]",
            ),
            (
                &[0xc5, 0xfa, 0x10, 0x0d, 0x00, 0x01, 0x00, 0x00],
                "vmovss xmm1, [rip+0x100]",
                "vmovss xmm1, [rip-0x7ebfff00]",
            ),
            (
                &[0xf0, 0x48, 0x0f, 0xb1, 0x0d, 0x08, 0x00, 0x00, 0x00],
                "lock cmpxchg [rip+8], rcx",
                "lock cmpxchg [rip-0x7ebffff8], rcx",
            ),
        ];
        for (bytes, text, copy_text) in cases {
            assert_eq!(dis(bytes, A), text);
            let (code, _) = relocated(bytes, A, slot);
            assert_eq!(dis(&code, slot), copy_text);
        }
    }

    #[test]
    fn eip_relative_wraps_and_is_always_in_reach() {
        let mov = [0x67, 0x8b, 0x05, 0x00, 0x10, 0x00, 0x00];
        assert_eq!(dis(&mov, A), "mov eax, [eip+0x1000]"); // reads 0x402007
        let slot = 0x7f00_0000_0000;
        let (code, boostable) = relocated(&mov, A, slot);
        assert_eq!(dis(&code, slot), "mov eax, [eip+0x402000]");
        assert!(!boostable, "address-size prefix: kernel can_boost says no");
    }

    #[test]
    fn refused_classes_say_why() {
        let cases: [(&[u8], &str, &str); 24] = [
            (&[0xcc], "int3", WHY_INT3),
            (
                &[0x64, 0xff, 0x10],
                "call qword ptr fs:[rax]",
                WHY_SEG_INDIRECT,
            ),
            (
                &[0x65, 0xff, 0x24, 0x25, 0x10, 0, 0, 0],
                "jmp qword ptr gs:[0x10]",
                WHY_SEG_INDIRECT,
            ),
            (&[0x67, 0xff, 0x10], "call qword ptr [eax]", WHY_67_INDIRECT),
            (
                &[0x67, 0xff, 0x25, 0x10, 0, 0, 0],
                "jmp qword ptr [eip+0x10]",
                WHY_67_INDIRECT,
            ),
            (&[0xcd, 0x80], "int 0x80", WHY_INT),
            (&[0xf1], "int1", WHY_INT),
            (&[0x0f, 0x0b], "ud2", WHY_UD),
            (&[0x48, 0xcf], "iretq", WHY_IRET),
            (&[0xcf], "iretd", WHY_IRET),
            (&[0x0f, 0x05], "syscall", WHY_SYSCALL),
            (&[0x0f, 0x34], "sysenter", WHY_SYSCALL),
            (&[0x48, 0x0f, 0x07], "sysretq", WHY_SYSRET),
            (&[0xff, 0x18], "call far fword ptr [rax]", WHY_FAR),
            (&[0xff, 0x28], "jmp far fword ptr [rax]", WHY_FAR),
            (&[0xcb], "ret far", WHY_FAR_RET),
            (
                &[0xc7, 0xf8, 0x10, 0x00, 0x00, 0x00],
                "xbegin 0x401016",
                WHY_RTM,
            ),
            (&[0x0f, 0x01, 0xd5], "xend", WHY_RTM),
            (&[0xc6, 0xf8, 0xff], "xabort 0xff", WHY_RTM),
            (&[0xf4], "hlt", WHY_PRIVILEGED),
            (&[0xfa], "cli", WHY_PRIVILEGED),
            (&[0x8e, 0xd0], "mov ss, ax", WHY_MOV_SS),
            (
                &[0x66, 0xe8, 0x00, 0x00, 0x00, 0x00],
                "call 0x401006",
                WHY_66_BRANCH,
            ),
            (&[0x0f, 0x01, 0xc1], "vmcall", WHY_VM),
        ];
        for (bytes, text, why) in cases {
            assert_eq!(dis(bytes, A), text);
            assert_eq!(refused(bytes), why, "{text}");
        }
        let err = plan1(&[0x0f, 0x05], A, A + 0x1000).unwrap_err();
        assert!(
            err.to_string().starts_with("cannot probe `syscall`: "),
            "{err}"
        );
        // `into` does not exist in 64-bit mode.
        assert_eq!(
            plan1(&[0xce], A, A + 0x1000),
            Err(InsnError::Undecodable { at: A })
        );
    }

    /// A small function (gcc -O2 -fcf-protection, frame pointer):
    ///
    /// ```text
    /// 401000: f3 0f 1e fa              endbr64
    /// 401004: 55                       push rbp
    /// 401005: 48 89 e5                 mov rbp, rsp
    /// 401008: 8b 05 f2 0f 00 00        mov eax, [rip+0xff2]
    /// 40100e: 85 c0                    test eax, eax
    /// 401010: 74 02                    je 0x401014
    /// 401012: 5d                       pop rbp
    /// 401013: c3                       ret
    /// 401014: e8 e7 ff ff ff           call 0x401000
    /// 401019: 5d                       pop rbp
    /// 40101a: c3                       ret
    /// ```
    const FUNC: [u8; 27] = [
        0xf3, 0x0f, 0x1e, 0xfa, 0x55, 0x48, 0x89, 0xe5, 0x8b, 0x05, 0xf2, 0x0f, 0x00, 0x00, 0x85,
        0xc0, 0x74, 0x02, 0x5d, 0xc3, 0xe8, 0xe7, 0xff, 0xff, 0xff, 0x5d, 0xc3,
    ];

    #[test]
    fn boundaries_of_a_small_function() {
        let b = boundaries(&FUNC, A);
        let offsets: Vec<u64> = b.iter().map(|x| x - A).collect();
        assert_eq!(
            offsets,
            [0, 4, 5, 8, 0xe, 0x10, 0x12, 0x13, 0x14, 0x19, 0x1a]
        );
        let texts: Vec<String> = b
            .windows(2)
            .map(|w| {
                let (s, e) = ((w[0] - A) as usize, (w[1] - A) as usize);
                dis(&FUNC[s..e], w[0])
            })
            .collect();
        assert_eq!(
            texts,
            [
                "endbr64",
                "push rbp",
                "mov rbp, rsp",
                "mov eax, [rip+0xff2]",
                "test eax, eax",
                "je 0x401014",
                "pop rbp",
                "ret",
                "call 0x401000",
                "pop rbp",
            ]
        );
        // Every boundary can be planned; everything in between is refused.
        let slot = 0x500000;
        for off in 0..FUNC.len() as u64 {
            let r = plan(&FUNC, A, A + off, slot);
            if b.contains(&(A + off)) {
                assert!(r.is_ok(), "+{off:#x}: {r:?}");
            } else {
                assert_eq!(r, Err(InsnError::NotBoundary), "+{off:#x}");
            }
        }
        let p = |off: u64| plan(&FUNC, A, A + off, slot).unwrap();
        assert_eq!(
            p(0x10),
            XolPlan::Emulate {
                insn: Emulate::Jcc {
                    cond: Cond::E,
                    target: 0x401014
                },
                len: 2
            }
        );
        assert_eq!(
            p(0x14),
            XolPlan::Emulate {
                insn: Emulate::CallRel { target: A },
                len: 5
            }
        );
        assert!(matches!(
            p(8),
            XolPlan::Xol {
                len: 6,
                boostable: true,
                ..
            }
        ));
    }

    #[test]
    fn not_a_boundary_and_undecodable() {
        let err = plan(&FUNC, A, A + 6, 0x500000).unwrap_err();
        assert_eq!(err, InsnError::NotBoundary);
        assert_eq!(
            err.to_string(),
            "Probe point is not an instruction boundary"
        );
        // Outside the function.
        assert_eq!(plan(&FUNC, A, A - 1, 0x500000), Err(InsnError::NotBoundary));
        let end = A + FUNC.len() as u64;
        assert_eq!(plan(&FUNC, A, end, 0x500000), Err(InsnError::NotBoundary));

        // 401000: 55        push rbp
        // 401001: 06        (invalid in 64-bit mode: was push es)
        // 401002: c3        ret
        let bad = [0x55, 0x06, 0xc3];
        assert_eq!(
            plan(&bad, A, A + 2, 0x500000),
            Err(InsnError::Undecodable { at: A + 1 })
        );
        assert_eq!(boundaries(&bad, A), [A]);
        // Cut off by the end of the function: 48 8b 05 00 10 (mov rax, [rip+...] truncated).
        let cut = [0x48, 0x8b, 0x05, 0x00, 0x10];
        assert_eq!(
            plan(&cut, A, A, 0x500000),
            Err(InsnError::Undecodable { at: A })
        );
    }

    #[test]
    fn boostable_follows_the_kernel_can_boost() {
        let slot = 0x500000;
        let cases: [(&[u8], &str, bool); 18] = [
            (&[0x48, 0x89, 0xe5], "mov rbp, rsp", true),
            (&[0x55], "push rbp", true),
            (&[0x48, 0x83, 0xec, 0x10], "sub rsp, 0x10", true),
            (&[0xf7, 0xf1], "div ecx", true),
            (&[0x48, 0x0f, 0xaf, 0xc1], "imul rax, rcx", true),
            (&[0x0f, 0x44, 0xc1], "cmove eax, ecx", true),
            (&[0xff, 0xc0], "inc eax", true),
            (&[0xc5, 0xf8, 0x77], "vzeroupper", true),
            // The kernel's LOCK/REP case never matches a prefix: it boosts these.
            (
                &[0xf0, 0x48, 0x0f, 0xb1, 0x0a],
                "lock cmpxchg [rdx], rcx",
                true,
            ),
            (&[0xf3, 0x48, 0xa5], "rep movsq [rdi], [rsi]", true),
            (&[0x0f, 0xa2], "cpuid", false),
            (&[0x0f, 0x10, 0x07], "movups xmm0, [rdi]", false),
            (&[0x66, 0x0f, 0x38, 0x00, 0xc1], "pshufb xmm0, xmm1", false),
            (&[0xd9, 0xc9], "fxch" /* st(0), st(1) */, false),
            (
                &[0xd1, 0xf0],
                "shl eax, 1", /* d1 /6, SAL alias */
                false,
            ),
            (&[0xf7, 0xc8, 0x01, 0, 0, 0], "test eax, 1", false),
            (&[0xff, 0xf0], "push rax", false),
            (&[0x2e, 0x48, 0x89, 0xe5], "mov rbp, rsp", false),
        ];
        for (bytes, text, want) in cases {
            assert_eq!(dis(bytes, A), text, "{bytes:02x?}");
            match plan1(bytes, A, slot) {
                Ok(XolPlan::Xol {
                    code, boostable, ..
                }) => {
                    assert_eq!(code, bytes, "{text}: no RIP-relative operand, copied as is");
                    assert_eq!(boostable, want, "{text}");
                }
                other => panic!("{text}: {other:?}"),
            }
        }
    }

    #[test]
    fn slot_contents_end_with_jmp_back_or_int3() {
        // 401005: 48 89 e5   mov rbp, rsp
        let mov = [0x48, 0x89, 0xe5];
        let (addr, slot) = (0x401005, 0x500000);
        let p = plan1(&mov, addr, slot).unwrap();
        assert_eq!(slot_len(&p), 3 + 5);
        let s = slot_bytes(&p, addr, slot);
        // 500000: 48 89 e5         mov rbp, rsp
        // 500003: e9 00 10 f0 ff   jmp 0x401008
        assert_eq!(s, [0x48, 0x89, 0xe5, 0xe9, 0x00, 0x10, 0xf0, 0xff]);
        assert_eq!(dis(&s[3..], slot + 3), "jmp 0x401008");

        let XolPlan::Xol { code, len, .. } = p else {
            unreachable!()
        };
        let no_boost = XolPlan::Xol {
            code,
            len,
            boostable: false,
        };
        assert_eq!(slot_len(&no_boost), 3 + 1);
        // 500000: 48 89 e5   mov rbp, rsp
        // 500003: cc         int3
        assert_eq!(slot_bytes(&no_boost, addr, slot), [0x48, 0x89, 0xe5, 0xcc]);

        // A slot beyond rel32 reach of the jmp back: copy allowed, boost not.
        let far = 0x7f00_0000_0000;
        let p = plan1(&mov, addr, far).unwrap();
        assert!(matches!(
            p,
            XolPlan::Xol {
                boostable: false,
                ..
            }
        ));
        assert_eq!(slot_bytes(&p, addr, far), [0x48, 0x89, 0xe5, 0xcc]);
    }

    #[test]
    fn relocated_slot_runs_the_same_access_and_jumps_back() {
        // 400000: 83 3d 10 00 00 00 05   cmp dword ptr [rip+0x10], 5   (reads 0x400017)
        let cmp = [0x83, 0x3d, 0x10, 0x00, 0x00, 0x00, 0x05];
        let (addr, slot) = (0x400000, 0x3ff000);
        let p = plan1(&cmp, addr, slot).unwrap();
        let s = slot_bytes(&p, addr, slot);
        assert_eq!(s.len(), slot_len(&p));
        // 3ff000: 83 3d 10 10 00 00 05   cmp dword ptr [rip+0x1010], 5 (reads 0x400017)
        // 3ff007: e9 fb 0f 00 00         jmp 0x400007
        assert_eq!(
            s,
            [0x83, 0x3d, 0x10, 0x10, 0x00, 0x00, 0x05, 0xe9, 0xfb, 0x0f, 0x00, 0x00]
        );
        assert_eq!(dis(&s[..7], slot), "cmp dword ptr [rip+0x1010], 5");
        assert_eq!(dis(&s[7..], slot + 7), "jmp 0x400007");
    }

    #[test]
    fn gp_reg_indices() {
        for (i, r) in GpReg::ALL.iter().enumerate() {
            assert_eq!(r.index(), i);
        }
        assert_eq!(GpReg::Rax.greg_index(), 13);
        assert_eq!(GpReg::R8.greg_index(), 0);
        assert_eq!(GpReg::Rsp.greg_index(), 15);
        assert_eq!(GpReg::from_iced(Register::R13), Some(GpReg::R13));
        assert_eq!(GpReg::from_iced(Register::EAX), None);
    }
}
