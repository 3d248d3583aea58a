//! ftrace trampolines (the kernel's `ftrace_caller` / `ftrace_regs_caller` in
//! arch/x86/kernel/ftrace_64.S), as position-independent templates copied into executable
//! pages within rel32 reach of the sites that call them.
//!
//! Each copy ends with two data slots, `ops` and `func`; the copy calls
//! `func(ip, parent_ip, ops, regs)` where `ip` is the site address, `parent_ip` the caller of
//! the traced function, and `regs` a [`PtRegs`] on the trampoline's stack. After `func`
//! returns, the copy returns to `regs.ip` (initially the return address `site + 5`): a
//! callback with IPMODIFY changes where the traced thread continues.
//!
//! Eight templates: {argument registers, full register set} x {site at entry (`parent_ip` at the
//! top of the caller's stack), site after `push %r10` (a gcc nested function: `parent_ip` one
//! word above the top), site after `push %rbp; mov %rsp,%rbp` (`parent_ip` at `8(%rbp)`), an
//! XRay entry sled (`parent_ip` at the top; returns to the sled's end, `site + 11`)}. The
//! argument variant saves what a call may carry in: `rdi rsi rdx rcx r8 r9`,
//! `rax` (vector count of varargs), `r10` (static chain), `xmm0-7`, and restores them all, so
//! any callback is safe to run (saving `xmm0-7` costs ~3 ns a hit here, see BENCHMARKS.md;
//! without it a callback that uses SSE would corrupt the traced function's float arguments).
//! The full variant also saves `rbx rbp r12-r15 r11` and reads the flags (`pushfq`).
//!
//! Stack: the template pushes `rbp`, aligns `rsp` down to 16 and builds the frame below, so a
//! frame-pointer unwinder walks through it; nothing is written above the return address.
//! Between the pushed `rbp` and the frame it keeps the thread's trampoline frame word (a TLS
//! word that points at the innermost running trampoline frame), and it ends with a check of
//! that word: `arch::x86_64::tramp_signals` uses both to hold a program's signal until the
//! trampoline is done, so that no program handler runs (and jumps out) in the middle of a hit.

use std::arch::global_asm;

use super::sites::SitePlace;

/// Registers as the kernel's `struct pt_regs` (arch/x86/include/asm/ptrace.h), same order.
///
/// With the argument-register trampolines only `rdi rsi rdx rcx r8 r9 rax r10 rbp ip sp` are
/// filled and the other fields are unspecified; with SAVE_REGS every field is filled (`cs`,
/// `ss` and `orig_rax` are 0). Changes a callback makes to the saved registers (IPMODIFY) are
/// restored into the thread, except `flags`, `sp`, `cs`, `ss` and `orig_rax`: flags are dead
/// at a call site by the ABI, and `popfq` alone would cost ~14 ns here.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct PtRegs {
    pub r15: u64,
    pub r14: u64,
    pub r13: u64,
    pub r12: u64,
    pub rbp: u64,
    pub rbx: u64,
    pub r11: u64,
    pub r10: u64,
    pub r9: u64,
    pub r8: u64,
    pub rax: u64,
    pub rcx: u64,
    pub rdx: u64,
    pub rsi: u64,
    pub rdi: u64,
    pub orig_rax: u64,
    /// Where the thread continues when the trampoline returns.
    pub ip: u64,
    pub cs: u64,
    pub flags: u64,
    /// The stack pointer at the site (before the call to the trampoline).
    pub sp: u64,
    pub ss: u64,
}

/// Size of the trampoline frame: PtRegs (168) + pad + xmm0-7 at 176, 16-aligned.
const FRAME: usize = 304;
const _: () = assert!(std::mem::size_of::<PtRegs>() == 168 && FRAME == 176 + 8 * 16);

/// The callback a trampoline calls: `func(ip, parent_ip, ops, regs)`.
pub type TrampolineFunc = unsafe extern "C" fn(u64, u64, *const (), *mut PtRegs);

/// The placeholder of the trampoline frame word's TLS offset in the templates
/// ([`Variant::instantiate`] writes the real one, `tramp_signals::tls_offset`).
pub(crate) const TLS_PLACEHOLDER: u32 = 0x5a5a_5a5a;

macro_rules! trampoline_template {
    ($name:literal, prologue: $prologue:literal, parent: $parent:literal,
     save: $save:literal, restore: $restore:literal) => {
        trampoline_template!($name, prologue: $prologue, parent: $parent, save: $save,
                             restore: $restore, resume: "");
    };
    ($name:literal, prologue: $prologue:literal, parent: $parent:literal,
     save: $save:literal, restore: $restore:literal, resume: $resume:literal) => {
        global_asm!(
            ".pushsection .text.ftprobe_trampolines,\"ax\",@progbits",
            ".balign 16",
            concat!(".globl ", $name, "_start"),
            concat!(".hidden ", $name, "_start"),
            concat!($name, "_start:"),
            "push rbp",
            "mov rbp, rsp",
            // The thread's frame word (`tramp_signals`): the enclosing trampoline frame's
            // word saved at [rbp - 8], this frame's rbp in its place.
            "push qword ptr fs:[{tls}]",
            "mov qword ptr fs:[{tls}], rbp",
            $prologue,
            "sub rsp, {frame}",
            "and rsp, -16",
            "mov [rsp + 112], rdi",
            "mov [rsp + 104], rsi",
            "mov [rsp + 96], rdx",
            "mov [rsp + 88], rcx",
            "mov [rsp + 80], rax",
            "mov [rsp + 72], r8",
            "mov [rsp + 64], r9",
            "mov [rsp + 56], r10",
            "movaps [rsp + 176], xmm0",
            "movaps [rsp + 192], xmm1",
            "movaps [rsp + 208], xmm2",
            "movaps [rsp + 224], xmm3",
            "movaps [rsp + 240], xmm4",
            "movaps [rsp + 256], xmm5",
            "movaps [rsp + 272], xmm6",
            "movaps [rsp + 288], xmm7",
            $save,
            // regs.rbp: the traced function's rbp, which our prologue pushed
            "mov rax, [rbp]",
            "mov [rsp + 32], rax",
            // regs.ip: our return address, site + 5
            "mov rax, [rbp + 8]",
            "mov [rsp + 128], rax",
            // regs.sp: the stack pointer at the site
            "lea rdx, [rbp + 16]",
            "mov [rsp + 152], rdx",
            // func(ip = site, parent_ip, ops, regs)
            "lea rdi, [rax - 5]",
            $parent,
            concat!("mov rdx, [rip + ", $name, "_ops]"),
            "mov rcx, rsp",
            concat!("call [rip + ", $name, "_func]"),
            // return to regs.ip, which an IPMODIFY callback may have changed
            "mov rax, [rsp + 128]",
            $resume,
            "mov [rbp + 8], rax",
            $restore,
            "movaps xmm0, [rsp + 176]",
            "movaps xmm1, [rsp + 192]",
            "movaps xmm2, [rsp + 208]",
            "movaps xmm3, [rsp + 224]",
            "movaps xmm4, [rsp + 240]",
            "movaps xmm5, [rsp + 256]",
            "movaps xmm6, [rsp + 272]",
            "movaps xmm7, [rsp + 288]",
            "mov rdi, [rsp + 112]",
            "mov rsi, [rsp + 104]",
            "mov rdx, [rsp + 96]",
            "mov rcx, [rsp + 88]",
            "mov rax, [rsp + 80]",
            "mov r8, [rsp + 72]",
            "mov r9, [rsp + 64]",
            "mov r10, [rsp + 56]",
            "lea rsp, [rbp - 8]",
            "pop qword ptr fs:[{tls}]",
            "pop rbp",
            // A signal deferred while this frame ran (`tramp_signals`; flags are dead at a
            // call site): ftprobe's SIGTRAP handler returns for us with the program's mask.
            "test byte ptr fs:[{tls}], 1",
            "jnz 3f",
            "ret",
            "3:",
            "int3",
            ".balign 8",
            concat!($name, "_ops: .quad 0"),
            concat!($name, "_func: .quad 0"),
            concat!(".globl ", $name, "_end"),
            concat!(".hidden ", $name, "_end"),
            concat!($name, "_end:"),
            ".popsection",
            frame = const FRAME,
            tls = const TLS_PLACEHOLDER,
        );
    };
}

macro_rules! args_template {
    ($name:literal, $parent:literal) => {
        trampoline_template!($name, prologue: "", parent: $parent, save: "", restore: "");
    };
}

macro_rules! regs_template {
    ($name:literal, $parent:literal) => {
        regs_template!($name, $parent, "");
    };
    ($name:literal, $parent:literal, $resume:literal) => {
        trampoline_template!(
            $name,
            prologue: "pushfq",
            parent: $parent,
            save: "mov [rsp + 40], rbx
                   mov [rsp + 48], r11
                   mov [rsp + 24], r12
                   mov [rsp + 16], r13
                   mov [rsp + 8], r14
                   mov [rsp], r15
                   mov rax, [rbp - 16]
                   mov [rsp + 144], rax
                   xor eax, eax
                   mov [rsp + 120], rax
                   mov [rsp + 136], rax
                   mov [rsp + 160], rax",
            restore: "mov rax, [rsp + 32]
                      mov [rbp], rax
                      mov rbx, [rsp + 40]
                      mov r11, [rsp + 48]
                      mov r12, [rsp + 24]
                      mov r13, [rsp + 16]
                      mov r14, [rsp + 8]
                      mov r15, [rsp]",
            resume: $resume
        );
    };
}

// Site at entry: [rbp+8] is our return address, [rbp+16] the traced function's.
args_template!("ftprobe_tramp_args_entry", "mov rsi, [rbp + 16]");
regs_template!("ftprobe_tramp_regs_entry", "mov rsi, [rbp + 16]");
// Site after `push %r10` (gcc's nested functions save the static chain before calling
// `__fentry__`): [rbp+16] is the saved r10, [rbp+24] the traced function's return address.
args_template!("ftprobe_tramp_args_push", "mov rsi, [rbp + 24]");
regs_template!("ftprobe_tramp_regs_push", "mov rsi, [rbp + 24]");
// Site after `push %rbp; mov %rsp,%rbp`: the traced function's frame is at [rbp].
args_template!(
    "ftprobe_tramp_args_prologue",
    "mov rsi, [rbp]\nmov rsi, [rsi + 8]"
);
regs_template!(
    "ftprobe_tramp_regs_prologue",
    "mov rsi, [rbp]\nmov rsi, [rsi + 8]"
);
// An XRay entry sled (at entry or after endbr64: parent at the top): the site's call covers
// the sled's first 5 bytes and the rest of it (the tail of its 9-byte NOP) is no instruction
// boundary, so the copy resumes at the sled's end, site + 11, unless a callback moved
// regs.ip elsewhere.
const _: () = assert!(super::sites::XRAY_SLED_LEN == 5 + 6);
trampoline_template!("ftprobe_tramp_args_xray", prologue: "", parent: "mov rsi, [rbp + 16]",
                     save: "", restore: "",
                     resume: "cmp rax, [rbp + 8]\njne 2f\nadd rax, 6\n2:");
regs_template!(
    "ftprobe_tramp_regs_xray",
    "mov rsi, [rbp + 16]",
    "cmp rax, [rbp + 8]\njne 2f\nadd rax, 6\n2:"
);

extern "C" {
    static ftprobe_tramp_args_entry_start: u8;
    static ftprobe_tramp_args_entry_end: u8;
    static ftprobe_tramp_regs_entry_start: u8;
    static ftprobe_tramp_regs_entry_end: u8;
    static ftprobe_tramp_args_prologue_start: u8;
    static ftprobe_tramp_args_prologue_end: u8;
    static ftprobe_tramp_regs_prologue_start: u8;
    static ftprobe_tramp_regs_prologue_end: u8;
    static ftprobe_tramp_args_push_start: u8;
    static ftprobe_tramp_args_push_end: u8;
    static ftprobe_tramp_regs_push_start: u8;
    static ftprobe_tramp_regs_push_end: u8;
    static ftprobe_tramp_args_xray_start: u8;
    static ftprobe_tramp_args_xray_end: u8;
    static ftprobe_tramp_regs_xray_start: u8;
    static ftprobe_tramp_regs_xray_end: u8;
}

/// Where the traced function's return address (`parent_ip`) is when its site calls the
/// trampoline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ParentAt {
    /// At the top of the stack: the site is the first instruction (or follows `endbr64`).
    Top,
    /// One word above the top: the site follows `push %r10` (gcc nested functions).
    AbovePushR10,
    /// At `8(%rbp)`: the site follows the frame-pointer prologue (`-pg` mcount).
    Frame,
}

impl ParentAt {
    /// For a site at `place`.
    pub fn of(place: SitePlace) -> ParentAt {
        match place {
            SitePlace::Entry | SitePlace::AfterEndbr => ParentAt::Top,
            SitePlace::AfterPushR10 => ParentAt::AbovePushR10,
            SitePlace::AfterPrologue => ParentAt::Frame,
        }
    }

    /// Every value.
    pub const ALL: [ParentAt; 3] = [ParentAt::Top, ParentAt::AbovePushR10, ParentAt::Frame];
}

/// Which template.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Variant {
    /// Save the full register set (SAVE_REGS) instead of the argument registers.
    pub save_regs: bool,
    /// Where the site finds `parent_ip`.
    pub parent: ParentAt,
    /// The site is an XRay entry sled (parent at the top): return to the sled's end,
    /// `site + 11`, not `site + 5`.
    pub xray: bool,
}

impl Variant {
    /// The template's code bytes, ending with the two 8-byte slots `ops`, `func`.
    pub fn template(self) -> &'static [u8] {
        // SAFETY: each pair of symbols delimits one template in .text (defined above with
        // global_asm), start before end; the bytes are code, immutable for the program's life.
        unsafe {
            let (s, e): (*const u8, *const u8) = match (self.save_regs, self.parent) {
                // An XRay sled is at the function's entry (or after endbr64): the
                // sites layer gives it no other place.
                (false, _) if self.xray => (
                    &raw const ftprobe_tramp_args_xray_start,
                    &raw const ftprobe_tramp_args_xray_end,
                ),
                (true, _) if self.xray => (
                    &raw const ftprobe_tramp_regs_xray_start,
                    &raw const ftprobe_tramp_regs_xray_end,
                ),
                (false, ParentAt::Top) => (
                    &raw const ftprobe_tramp_args_entry_start,
                    &raw const ftprobe_tramp_args_entry_end,
                ),
                (true, ParentAt::Top) => (
                    &raw const ftprobe_tramp_regs_entry_start,
                    &raw const ftprobe_tramp_regs_entry_end,
                ),
                (false, ParentAt::AbovePushR10) => (
                    &raw const ftprobe_tramp_args_push_start,
                    &raw const ftprobe_tramp_args_push_end,
                ),
                (true, ParentAt::AbovePushR10) => (
                    &raw const ftprobe_tramp_regs_push_start,
                    &raw const ftprobe_tramp_regs_push_end,
                ),
                (false, ParentAt::Frame) => (
                    &raw const ftprobe_tramp_args_prologue_start,
                    &raw const ftprobe_tramp_args_prologue_end,
                ),
                (true, ParentAt::Frame) => (
                    &raw const ftprobe_tramp_regs_prologue_start,
                    &raw const ftprobe_tramp_regs_prologue_end,
                ),
            };
            std::slice::from_raw_parts(s, e.offset_from(s) as usize)
        }
    }

    /// The template's bytes with its two slots and the frame word's TLS offset filled: what to
    /// copy into a trampoline page.
    pub fn instantiate(self, ops: *const (), func: TrampolineFunc) -> Vec<u8> {
        let mut code = self.template().to_vec();
        let n = code.len();
        fill_tls_placeholders(&mut code[..n - 16]);
        code[n - 16..n - 8].copy_from_slice(&(ops as u64).to_le_bytes());
        code[n - 8..].copy_from_slice(&(func as usize as u64).to_le_bytes());
        code
    }
}

/// Write the frame word's TLS offset over every [`TLS_PLACEHOLDER`] in a template's code
/// (not its data slots).
pub(crate) fn fill_tls_placeholders(code: &mut [u8]) {
    let tls = super::tramp_signals::tls_offset().to_le_bytes();
    let mut at = 0;
    while let Some(i) = find(&code[at..], &TLS_PLACEHOLDER.to_le_bytes()) {
        code[at + i..at + i + 4].copy_from_slice(&tls);
        at += i + 4;
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_keep_the_frame_word_where_tramp_signals_looks() {
        use super::super::tramp_signals::{classify, Place};
        for save_regs in [false, true] {
            for (parent, xray) in ParentAt::ALL
                .map(|p| (p, false))
                .into_iter()
                .chain([(ParentAt::Top, true)])
            {
                let v = Variant {
                    save_regs,
                    parent,
                    xray,
                };
                let code = v.instantiate(std::ptr::null(), dummy);
                let tls = super::super::tramp_signals::tls_offset();
                let n = code.len() - 16;
                let count = code[..n]
                    .windows(4)
                    .filter(|w| *w == tls.to_le_bytes())
                    .count();
                assert_eq!(count, 4, "{v:?}: four uses of the frame word");
                let read = |a: u64| code.get(a as usize).copied();
                let insns: Vec<iced_x86::Instruction> =
                    iced_x86::Decoder::with_ip(64, &code[..n], 0, 0)
                        .into_iter()
                        .collect();
                let places: Vec<Place> =
                    insns.iter().map(|i| classify(&read, i.ip(), tls)).collect();
                assert_eq!(
                    places[..4],
                    [
                        Place::Rewind(0),
                        Place::Rewind(1),
                        Place::Rewind(2),
                        Place::Rewind(3)
                    ],
                    "{v:?}"
                );
                let int3 = insns
                    .iter()
                    .position(|i| i.mnemonic() == iced_x86::Mnemonic::Int3)
                    .expect("the epilogue ends with int3");
                assert_eq!(
                    places[int3 - 5..=int3],
                    [
                        Place::Running,
                        Place::PopRbpReturn,
                        Place::Return,
                        Place::Return,
                        Place::Return,
                        Place::Return
                    ],
                    "{v:?}: pop fs, pop rbp, test, jnz, ret, int3"
                );
                assert!(
                    places[4..int3 - 5].iter().all(|p| *p == Place::Elsewhere),
                    "{v:?}: the body is known by the frame word, not by pattern"
                );
                let n = insns[int3].ip() + 1;
                assert_eq!(
                    classify(&read, n as u64, tls),
                    Place::DeferredTrap,
                    "after the int3"
                );
            }
        }
    }

    unsafe extern "C" fn dummy(_: u64, _: u64, _: *const (), _: *mut PtRegs) {}

    #[test]
    fn templates_end_with_slots_and_are_position_independent() {
        for save_regs in [false, true] {
            for (parent, xray) in ParentAt::ALL
                .map(|p| (p, false))
                .into_iter()
                .chain([(ParentAt::Top, true)])
            {
                let v = Variant {
                    save_regs,
                    parent,
                    xray,
                };
                let t = v.template();
                assert!(t.len() > 100 && t.len() < 512, "{v:?}: {} bytes", t.len());
                assert_eq!(&t[t.len() - 16..], &[0u8; 16], "{v:?}: slots start zeroed");
                // Every rip-relative reference of the code points into the template itself.
                let code = &t[..t.len() - 16];
                let mut dec = iced_x86::Decoder::with_ip(64, code, 0, 0);
                for insn in &mut dec {
                    assert!(!insn.is_invalid(), "{v:?}: undecodable at {:#x}", insn.ip());
                    if insn.is_ip_rel_memory_operand() {
                        let t_addr = insn.ip_rel_memory_address();
                        assert!(t_addr >= code.len() as u64 && t_addr < t.len() as u64);
                    }
                    assert!(!insn.is_call_near() || insn.is_call_near_indirect());
                }
            }
        }
    }
}
