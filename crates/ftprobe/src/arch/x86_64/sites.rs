//! What the compilers leave at a function's ftrace site on x86-64 (DESIGN.md section 2), how to
//! recognise it from its bytes, and how to find it by decoding when no record section exists.
//!
//! Everything here works on `&[u8]` and addresses in the file (svma): no memory of the running
//! process is touched, so it is unit-tested on hand-written byte strings.

use iced_x86::{
    Code, Decoder, DecoderOptions, FlowControl, Instruction, Mnemonic, OpKind, Register,
};

/// The bytes found at a site, before ftprobe converts it to its canonical NOP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SiteKind {
    /// `0f 1f 44 00 xx`: `nopl disp8(%rax,%rax,1)`. gcc `-mnop-mcount` writes displacement 0;
    /// LLVM (clang, rustc `-Zpatchable-function-entry=5`) writes 8. Any displacement is a NOP.
    Nop5,
    /// Five one-byte `90` NOPs: gcc `-fpatchable-function-entry=5`.
    Nops5,
    /// `e8 rel32`: `call __fentry__`/`call mcount`, non-PIE (5 bytes).
    CallRel32,
    /// `ff 15 rel32`: `call *__fentry__@GOTPCREL(%rip)`, PIE (6 bytes).
    CallGot,
    /// An LLVM XRay entry sled (`clang -fxray-instrument`): `eb 09` (`jmp .+11`) then a
    /// 9-byte NOP, 11 bytes. ftprobe patches its first 5 bytes to `call trampoline` and its
    /// trampoline resumes at the sled's end, so bytes 5..11 are never executed and the
    /// disabled sled is exactly what the compiler wrote.
    XraySled,
}

impl SiteKind {
    /// Length in bytes of what the compiler emitted.
    pub fn byte_len(self) -> u8 {
        match self {
            SiteKind::Nop5 | SiteKind::Nops5 | SiteKind::CallRel32 => 5,
            SiteKind::CallGot => 6,
            SiteKind::XraySled => XRAY_SLED_LEN as u8,
        }
    }

    /// Short name used by `ftprobe list functions`.
    pub fn name(self) -> &'static str {
        match self {
            SiteKind::Nop5 => "nop5",
            SiteKind::Nops5 => "nop1x5",
            SiteKind::CallRel32 => "call",
            SiteKind::CallGot => "call*got",
            SiteKind::XraySled => "xray-sled",
        }
    }
}

/// Where the site stands in its function.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SitePlace {
    /// The function's first instruction (`-mfentry`, patchable entry).
    Entry,
    /// Right after the function's `endbr64` (`-fcf-protection`), at `func+4`.
    AfterEndbr,
    /// After the frame-pointer prologue `push %rbp; mov %rsp,%rbp` (`-pg` without `-mfentry`):
    /// the caller's return address is then at `8(%rbp)`, not at the top of the stack.
    AfterPrologue,
    /// After `push %r10` at entry (or after `endbr64; push %r10`): gcc's nested functions
    /// save their static chain around the `__fentry__` call (`-pg -mfentry`), so the caller's
    /// return address is one word above the top of the stack.
    AfterPushR10,
}

impl SitePlace {
    /// Short name used by `ftprobe list functions`.
    pub fn name(self) -> &'static str {
        match self {
            SitePlace::Entry => "entry",
            SitePlace::AfterEndbr => "after-endbr",
            SitePlace::AfterPrologue => "after-prologue",
            SitePlace::AfterPushR10 => "after-push-r10",
        }
    }
}

/// `endbr64`.
pub const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];

/// `push %r10`.
pub const PUSH_R10: [u8; 2] = [0x41, 0x52];

/// Length of an XRay entry or tail sled on x86-64 (LLVM's `X86AsmPrinter::LowerPATCHABLE_*`):
/// `jmp .+11` and a 9-byte NOP; an exit sled is `ret` and a 10-byte NOP, also 11 bytes.
pub const XRAY_SLED_LEN: u64 = 11;

/// The first two bytes of an unpatched XRay entry or tail sled: `jmp .+11` (`eb 09`).
pub const XRAY_SLED_JMP: [u8; 2] = [0xeb, 0x09];

/// Whether `bytes` start with an unpatched XRay entry/tail sled: `eb 09` and a 9-byte NOP
/// (clang writes `66 0f 1f 84 00 00 02 00 00`, `nopw 0x200(%rax,%rax,1)`). Once the XRay
/// runtime has patched it (`XRAY_OPTIONS=patch_premain=true`, `__xray_patch()`) it starts
/// `41 ba` (`mov $id,%r10d`): not ours to patch.
pub fn is_xray_sled(bytes: &[u8]) -> bool {
    let Some(sled) = bytes.get(..XRAY_SLED_LEN as usize) else {
        return false;
    };
    if sled[..2] != XRAY_SLED_JMP {
        return false;
    }
    let insn = Decoder::with_ip(64, &sled[2..], 0, DecoderOptions::NONE).decode();
    insn.mnemonic() == Mnemonic::Nop && insn.len() == 9
}

/// Recognise the bytes at a recorded site. `None` if they are none of [`SiteKind`].
pub fn classify(bytes: &[u8]) -> Option<SiteKind> {
    if is_xray_sled(bytes) {
        return Some(SiteKind::XraySled);
    }
    match bytes {
        [0x0f, 0x1f, 0x44, 0x00, _, ..] => Some(SiteKind::Nop5),
        [0x90, 0x90, 0x90, 0x90, 0x90, ..] => Some(SiteKind::Nops5),
        [0xe8, _, _, _, _, ..] => Some(SiteKind::CallRel32),
        [0xff, 0x15, _, _, _, _, ..] => Some(SiteKind::CallGot),
        _ => None,
    }
}

/// Where a site at `site_off` bytes into a function whose code starts with `func_bytes` stands,
/// or `None` if that is not a place ftprobe can patch. gcc's `-pg` calls `mcount` after the
/// whole prologue, which may realign the stack or save registers first; any site that
/// straight-line code reaches after `mov %rsp,%rbp` is `AfterPrologue` (the function's frame
/// pointer then gives the caller's return address at `8(%rbp)`). A site right after a
/// `push %r10` that is the function's first instruction (after `endbr64`, if any) is
/// `AfterPushR10` (gcc `-mfentry` in a nested function).
pub fn place_of(func_bytes: &[u8], site_off: u64) -> Option<SitePlace> {
    let endbr = func_bytes.starts_with(&ENDBR64);
    let first = if endbr { ENDBR64.len() } else { 0 };
    match site_off {
        0 => return Some(SitePlace::Entry),
        4 if endbr => return Some(SitePlace::AfterEndbr),
        off if off == (first + PUSH_R10.len()) as u64
            && func_bytes[first..].starts_with(&PUSH_R10) =>
        {
            return Some(SitePlace::AfterPushR10)
        }
        _ => {}
    }
    let code = func_bytes.get(..site_off as usize)?;
    let mut dec = Decoder::with_ip(64, code, 0, DecoderOptions::NONE);
    let mut insn = Instruction::default();
    let mut frame_pointer = false;
    while dec.can_decode() {
        dec.decode_out(&mut insn);
        if insn.is_invalid()
            || matches!(
                insn.flow_control(),
                FlowControl::UnconditionalBranch | FlowControl::Return
            )
        {
            return None;
        }
        frame_pointer |= insn.mnemonic() == Mnemonic::Mov
            && insn.op0_register() == Register::RBP
            && insn.op1_register() == Register::RSP;
    }
    // The site must start on an instruction boundary of that straight-line code.
    (dec.position() as u64 == site_off && frame_pointer).then_some(SitePlace::AfterPrologue)
}

/// How far into a function decoding looks for the hook call, bytes. gcc puts `mcount` after
/// the prologue, which can be long (an `ms_abi` function saves ten xmm registers first).
pub const DECODE_WINDOW: usize = 256;

/// What a call found by decoding goes to, as the caller must resolve it to a name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallTarget {
    /// `e8 rel32`: the branch target (a function or a PLT entry).
    Direct(u64),
    /// `ff 15 rel32`: the address of the GOT slot the call reads.
    Got(u64),
}

/// Decode the start of a function (`func_bytes` at `func_svma`) looking for a call to the
/// profiling hook in the places compilers put it: first instruction, after `endbr64`, or after
/// `push %rbp; mov %rsp,%rbp`. `is_hook` says whether a call target is `__fentry__`/`mcount`.
/// Returns the site's offset from the function start, its kind and place.
pub fn find_by_decoding(
    func_bytes: &[u8],
    func_svma: u64,
    mut is_hook: impl FnMut(CallTarget) -> bool,
) -> Option<(u64, SiteKind, SitePlace)> {
    // The hook call is the function's first call: at entry, after endbr64, or after the
    // prologue. Decode straight-line code up to the first control transfer.
    let mut dec = Decoder::with_ip(64, func_bytes, func_svma, DecoderOptions::NONE);
    let mut insn = Instruction::default();
    while dec.can_decode() && dec.position() < DECODE_WINDOW {
        dec.decode_out(&mut insn);
        if insn.is_invalid() {
            return None;
        }
        let site_off = insn.ip() - func_svma;
        let target = match (insn.code(), insn.len()) {
            (Code::Call_rel32_64, 5) => CallTarget::Direct(insn.near_branch_target()),
            (Code::Call_rm64, 6)
                if insn.op0_kind() == OpKind::Memory && insn.memory_base() == Register::RIP =>
            {
                CallTarget::Got(insn.memory_displacement64())
            }
            // Past conditional branches (a stack-clash probe loop), not past a jump or return.
            _ if matches!(
                insn.flow_control(),
                FlowControl::UnconditionalBranch | FlowControl::Return | FlowControl::Interrupt
            ) || insn.is_invalid() =>
            {
                return None
            }
            _ => continue,
        };
        if !is_hook(target) {
            return None;
        }
        let kind = classify(&func_bytes[site_off as usize..][..insn.len()])?;
        let place = place_of(func_bytes, site_off)?;
        return Some((site_off, kind, place));
    }
    None
}

/// If the code at a PLT entry is `[endbr64;] [bnd] jmp *disp(%rip)`, the GOT slot it jumps
/// through.
pub fn plt_entry_got_slot(code: &[u8], svma: u64) -> Option<u64> {
    let (code, svma) = if code.starts_with(&ENDBR64) {
        (&code[4..], svma + 4)
    } else {
        (code, svma)
    };
    let mut dec = Decoder::with_ip(64, code, svma, DecoderOptions::NONE);
    let insn = dec.decode();
    (insn.mnemonic() == Mnemonic::Jmp
        && insn.op0_kind() == OpKind::Memory
        && insn.memory_base() == Register::RIP)
        .then(|| insn.memory_displacement64())
}

/// Names of the hooks compilers call from sites.
pub fn is_hook_name(name: &str) -> bool {
    let base = name.split('@').next().unwrap_or(name);
    matches!(base, "__fentry__" | "mcount" | "_mcount" | "__mcount")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_each_kind() {
        // nopl 0x0(%rax,%rax,1)
        assert_eq!(
            classify(&[0x0f, 0x1f, 0x44, 0x00, 0x00]),
            Some(SiteKind::Nop5)
        );
        // nop; nop; nop; nop; nop
        assert_eq!(classify(&[0x90; 5]), Some(SiteKind::Nops5));
        // call rel32
        assert_eq!(classify(&[0xe8, 0, 0, 0, 0]), Some(SiteKind::CallRel32));
        // call *0x0(%rip)
        assert_eq!(classify(&[0xff, 0x15, 0, 0, 0, 0]), Some(SiteKind::CallGot));
        // imul %esi,%edi
        assert_eq!(classify(&[0x0f, 0xaf, 0xfe, 0, 0]), None);
        // jmp .+11; nopw 0x200(%rax,%rax,1) (clang -fxray-instrument's entry sled)
        let sled = [
            0xeb, 0x09, 0x66, 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x02, 0x00, 0x00,
        ];
        assert_eq!(classify(&sled), Some(SiteKind::XraySled));
        // Only its first 5 bytes: not enough to tell.
        assert_eq!(classify(&sled[..5]), None);
        // mov $0x1,%r10d; call rel32 (the sled as the XRay runtime patches it): not a site.
        let patched = [0x41, 0xba, 1, 0, 0, 0, 0xe8, 0, 0, 0, 0];
        assert_eq!(classify(&patched), None);
        // jmp .+11; then something that is no 9-byte NOP: not a sled.
        let other = [
            0xeb, 0x09, 0x48, 0x89, 0xe5, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90,
        ];
        assert_eq!(classify(&other), None);
    }

    #[test]
    fn decode_fentry_call_got_after_endbr() {
        // endbr64; call *0x2fd6(%rip); imul %esi,%edi
        let code = [
            0xf3, 0x0f, 0x1e, 0xfa, 0xff, 0x15, 0xd6, 0x2f, 0, 0, 0x0f, 0xaf, 0xfe,
        ];
        let got = 0x1000 + 10 + 0x2fd6;
        let found = find_by_decoding(&code, 0x1000, |t| t == CallTarget::Got(got));
        assert_eq!(found, Some((4, SiteKind::CallGot, SitePlace::AfterEndbr)));
    }

    #[test]
    fn decode_mcount_after_prologue() {
        // push %rbp; mov %rsp,%rbp; call 0x2000; pop %rbp
        let code = [0x55, 0x48, 0x89, 0xe5, 0xe8, 0xf7, 0x0f, 0, 0, 0x5d];
        let found = find_by_decoding(&code, 0x1000, |t| t == CallTarget::Direct(0x2000));
        assert_eq!(
            found,
            Some((4, SiteKind::CallRel32, SitePlace::AfterPrologue))
        );
        // A call to something else is not a site.
        assert_eq!(find_by_decoding(&code, 0x1000, |_| false), None);
    }

    #[test]
    fn decode_mcount_after_longer_prologue() {
        // push %rbp; mov %rsp,%rbp; push %rbx; sub $0x8,%rsp; call *0x2fd6(%rip)
        let code = [
            0x55, 0x48, 0x89, 0xe5, 0x53, 0x48, 0x83, 0xec, 0x08, 0xff, 0x15, 0xd6, 0x2f, 0, 0,
        ];
        let got = 0x1000 + 15 + 0x2fd6;
        let found = find_by_decoding(&code, 0x1000, |t| t == CallTarget::Got(got));
        assert_eq!(
            found,
            Some((9, SiteKind::CallGot, SitePlace::AfterPrologue))
        );
        // Without a frame-pointer prologue a call at +5 is no site.
        assert_eq!(place_of(&[0x53, 0x48, 0x83, 0xec, 0x08], 5), None);
        // Not on an instruction boundary.
        assert_eq!(place_of(&code, 8), None);
    }

    #[test]
    fn decode_mcount_after_stack_realignment() {
        // lea 0x8(%rsp),%r10; and $-32,%rsp; push -0x8(%r10); push %rbp; mov %rsp,%rbp;
        // push %r10; call *0x0(%rip)
        let code = [
            0x4c, 0x8d, 0x54, 0x24, 0x08, 0x48, 0x83, 0xe4, 0xe0, 0x41, 0xff, 0x72, 0xf8, 0x55,
            0x48, 0x89, 0xe5, 0x41, 0x52, 0xff, 0x15, 0, 0, 0, 0,
        ];
        let got = 0x1000 + 25;
        let found = find_by_decoding(&code, 0x1000, |t| t == CallTarget::Got(got));
        assert_eq!(
            found,
            Some((19, SiteKind::CallGot, SitePlace::AfterPrologue))
        );
    }

    /// Regression: gcc's nested functions (`-pg -mfentry`) save the static chain first,
    /// `push %r10; call *__fentry__; pop %r10`, and the site at +2 was "no recognisable site".
    #[test]
    fn fentry_site_after_push_r10_in_a_nested_function() {
        // push %r10; call *0x2e38(%rip); pop %r10; push %rbp
        let code = [0x41, 0x52, 0xff, 0x15, 0x38, 0x2e, 0, 0, 0x41, 0x5a, 0x55];
        let got = 0x11a0 + 8 + 0x2e38;
        let found = find_by_decoding(&code, 0x11a0, |t| t == CallTarget::Got(got));
        assert_eq!(found, Some((2, SiteKind::CallGot, SitePlace::AfterPushR10)));
        // push %r10; nopl 0x0(%rax,%rax,1) (-mnop-mcount, listed in __mcount_loc)
        let nop = [0x41, 0x52, 0x0f, 0x1f, 0x44, 0, 0, 0x41, 0x5a];
        assert_eq!(place_of(&nop, 2), Some(SitePlace::AfterPushR10));
        // endbr64; push %r10; call rel32
        let cet = [0xf3, 0x0f, 0x1e, 0xfa, 0x41, 0x52, 0xe8, 0, 0, 0, 0];
        assert_eq!(place_of(&cet, 6), Some(SitePlace::AfterPushR10));
        // Another push first (push %r11) is not gcc's static-chain save.
        assert_eq!(place_of(&[0x41, 0x53, 0xe8, 0, 0, 0, 0], 2), None);
    }

    #[test]
    fn plt_entry() {
        // endbr64; bnd jmp *0x2f75(%rip)
        let code = [0xf3, 0x0f, 0x1e, 0xfa, 0xf2, 0xff, 0x25, 0x75, 0x2f, 0, 0];
        assert_eq!(
            plt_entry_got_slot(&code, 0x1050),
            Some(0x1050 + 11 + 0x2f75)
        );
    }
}
