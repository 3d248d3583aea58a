//! Fault-safe reads of this process's memory with plain loads: the user-space form of the
//! kernel's `copy_from_user_nofault()`, `strncpy_from_user_nofault()` and
//! `strnlen_user_nofault()` (arch/x86/lib, and the exception table of arch/x86/mm/extable.c).
//!
//! Four small routines written in assembly read memory that may not be mapped. Each load
//! that may fault is listed in an exception table ([`fixup`]): an entry gives the load's
//! address and where to resume if it faults. ftprobe's SIGSEGV/SIGBUS handler
//! (`text_poke::fault_handler`) looks a fault's PC up in the table first, and resumes the
//! thread at the fixup, which returns an error (or, for the word-at-a-time loops, carries on
//! byte by byte up to the exact byte that faults). Every other fault is the program's.
//!
//! A fault is only survivable when the kernel can run ftprobe's handler: the handler must be
//! installed (it is, from [`enable`]: `text_poke::install_fault_signal_handlers`, kept in place
//! by the agent's `sigaction` interposers), and SIGSEGV and SIGBUS must not be blocked in the
//! thread (the kernel kills a thread that faults with the signal blocked,
//! `force_sig_info_to_task`). [`usable`] says whether both hold, from what ftprobe can know
//! without a system call:
//!
//! - [`enable`] checked with the kernel that ftprobe's handler is the one for both signals;
//! - no handler the program installed blocks them while it runs (its `sa_mask`), as far as
//!   the agent's `sigaction` interposer saw ([`note_action`]);
//! - the thread's mask, asked of the kernel once and cached until the program changes it
//!   through an interposed call ([`forget_thread_mask`]);
//! - the thread is not on its signal stack (a fault there needs room for a second signal
//!   frame, which a small `sigaltstack` may not have: the probe path's stack budget on a
//!   signal stack stays what it was).
//!
//! Otherwise the callers (`sys::read_nofault` and its siblings) read with
//! `process_vm_readv`, as before. Not seen, and so not covered: a raw `rt_sigaction` or
//! `rt_sigprocmask` system call that replaces ftprobe's handler or blocks the fault signals
//! after [`enable`], and a handler that unblocks them for a moment its `rt_sigreturn` undoes.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::probe_state;
use crate::sys;

// Register use (SysV): arguments in rdi, rsi, rdx; results in rax (and rdx); rcx, r8-r11
// are scratch. Every load that may fault has a local label and an `ftprobe_ex_table`
// entry: two 32-bit offsets, each relative to its own field (no relocation needed), of the
// load and of its fixup. A word load that faults within one 4 KiB page (the smallest unit of
// protection) faults at its first byte: its fixup gives up at once; only a word that
// straddles a page boundary is retried byte by byte (each fault is a signal: ~1-2 us).
std::arch::global_asm!(
    r#"
    .pushsection .text.ftprobe_uaccess,"ax",@progbits

    // u64 ftprobe_copy_nofault(void *dst, const void *src, u64 len): the bytes NOT copied
    // (0: all). 16 bytes at a time (SSE2, xmm0 clobbered) while 16 or more are left, then
    // words while 8 or more are; a block or a word that faults across a page boundary goes
    // on word by word, then byte by byte, and the tail byte by byte, so the bytes before the
    // first bad one are copied.
    .p2align 4
    .globl ftprobe_copy_nofault
    .hidden ftprobe_copy_nofault
    .type ftprobe_copy_nofault,@function
ftprobe_copy_nofault:
    mov %rdx, %rcx
    cmp $16, %rcx
    jb .Lcopy_wcheck
.Lcopy_blocks:
.Lcopy_vload:
    movdqu (%rsi), %xmm0
    movdqu %xmm0, (%rdi)
    add $16, %rsi
    add $16, %rdi
    sub $16, %rcx
    cmp $16, %rcx
    jae .Lcopy_blocks
.Lcopy_wcheck:
    cmp $8, %rcx
    jb .Lcopy_tail
.Lcopy_words:
.Lcopy_wload:
    movq (%rsi), %rax
    movq %rax, (%rdi)
    add $8, %rsi
    add $8, %rdi
    sub $8, %rcx
    cmp $8, %rcx
    jae .Lcopy_words
.Lcopy_tail:
    test %rcx, %rcx
    jz .Lcopy_done
.Lcopy_bytes:
.Lcopy_bload:
    movb (%rsi), %al
    movb %al, (%rdi)
    inc %rsi
    inc %rdi
    dec %rcx
    jnz .Lcopy_bytes
.Lcopy_done:
    mov %rcx, %rax
    ret
.Lcopy_wfault:
    mov %rsi, %rax
    and $4095, %eax
    cmp $4088, %eax
    jbe .Lcopy_done
    jmp .Lcopy_bytes
.Lcopy_vfault:
    // Within one page: its first byte is bad. Across two: the words find where.
    mov %rsi, %rax
    and $4095, %eax
    cmp $4080, %eax
    jbe .Lcopy_done
    jmp .Lcopy_wcheck
    .size ftprobe_copy_nofault, . - ftprobe_copy_nofault

    // (u64 value, u64 faulted) ftprobe_read_u64_nofault(const u64 *src): in rax, rdx.
    .p2align 4
    .globl ftprobe_read_u64_nofault
    .hidden ftprobe_read_u64_nofault
    .type ftprobe_read_u64_nofault,@function
ftprobe_read_u64_nofault:
    xor %edx, %edx
.Lu64_load:
    movq (%rdi), %rax
    ret
.Lu64_fault:
    xor %eax, %eax
    mov $1, %edx
    ret
    .size ftprobe_read_u64_nofault, . - ftprobe_read_u64_nofault

    // i64 ftprobe_strncpy_nofault(char *dst, const char *src, u64 count): copies up to and
    // including the first NUL, at most `count` bytes; the bytes copied, or -1 if a byte
    // before the NUL (and before `count`) cannot be read. 16 bytes at a time (SSE2; xmm0,
    // xmm1 clobbered) while 16 or more are left and the 16 lie in one page (so a load faults
    // only where its first byte is unreadable); the block with the NUL is stored whole (the
    // bytes after the NUL, up to `count`, are then not the caller's any more). Near a page's
    // end, a word; the rest byte by byte (a word that faults across a page boundary too).
    .p2align 4
    .globl ftprobe_strncpy_nofault
    .hidden ftprobe_strncpy_nofault
    .type ftprobe_strncpy_nofault,@function
ftprobe_strncpy_nofault:
    xor %ecx, %ecx
    pxor %xmm0, %xmm0
.Lsc_blocks:
    mov %rdx, %rax
    sub %rcx, %rax
    cmp $16, %rax
    jb .Lsc_word
    lea (%rsi,%rcx), %eax
    and $4095, %eax
    cmp $4080, %eax
    ja .Lsc_word
.Lsc_vload:
    movdqu (%rsi,%rcx), %xmm1
    movdqu %xmm1, (%rdi,%rcx)
    pcmpeqb %xmm0, %xmm1
    pmovmskb %xmm1, %eax
    test %eax, %eax
    jnz .Lsc_vfound
    add $16, %rcx
    jmp .Lsc_blocks
.Lsc_vfound:
    bsf %eax, %eax
    lea 1(%rcx,%rax), %rax
    ret
.Lsc_word:
    mov %rdx, %rax
    sub %rcx, %rax
    cmp $8, %rax
    jb .Lsc_bytes
.Lsc_wload:
    movq (%rsi,%rcx), %rax
    movabs $0x0101010101010101, %r8
    mov %rax, %r10
    sub %r8, %r10
    mov %rax, %r11
    not %r11
    and %r11, %r10
    movabs $0x8080808080808080, %r9
    test %r9, %r10
    jnz .Lsc_bytes
    movq %rax, (%rdi,%rcx)
    add $8, %rcx
    jmp .Lsc_blocks
.Lsc_bytes:
    cmp %rdx, %rcx
    jae .Lsc_done
.Lsc_bload:
    movb (%rsi,%rcx), %al
    movb %al, (%rdi,%rcx)
    inc %rcx
    test %al, %al
    jnz .Lsc_bytes
.Lsc_done:
    mov %rcx, %rax
    ret
.Lsc_fault:
    mov $-1, %rax
    ret
.Lsc_wfault:
    lea (%rsi,%rcx), %rax
    and $4095, %eax
    cmp $4088, %eax
    jbe .Lsc_fault
    jmp .Lsc_bytes
    .size ftprobe_strncpy_nofault, . - ftprobe_strncpy_nofault

    // u64 ftprobe_strnlen_nofault(const char *src, u64 count): the string's length with
    // its NUL if the NUL is in the first `count` bytes, `count + 1` if it is not, 0 if a
    // byte before the NUL (and before `count`) cannot be read. 16 bytes at a time (SSE2),
    // each load 16-byte aligned: a load never spans two pages, so it faults only where the
    // bytes from its start are unreadable (the first one holds `src`, whose own page it is
    // in: it faults only when `src` cannot be read). The bytes of the first block before
    // `src` are dropped from its mask. xmm0 and xmm1 are clobbered (caller-saved).
    .p2align 4
    .globl ftprobe_strnlen_nofault
    .hidden ftprobe_strnlen_nofault
    .type ftprobe_strnlen_nofault,@function
ftprobe_strnlen_nofault:
    mov %rdi, %r8
    and $-16, %r8
    mov %edi, %ecx
    and $15, %ecx
    pxor %xmm0, %xmm0
.Lsl_vload0:
    movdqa (%r8), %xmm1
    pcmpeqb %xmm0, %xmm1
    pmovmskb %xmm1, %edx
    shr %cl, %edx
    test %edx, %edx
    jnz .Lsl_found0
    // Bytes looked at from `src`.
    mov $16, %eax
    sub %ecx, %eax
.Lsl_next:
    cmp %rsi, %rax
    jae .Lsl_long
    add $16, %r8
.Lsl_vload:
    movdqa (%r8), %xmm1
    pcmpeqb %xmm0, %xmm1
    pmovmskb %xmm1, %edx
    test %edx, %edx
    jnz .Lsl_found
    add $16, %rax
    jmp .Lsl_next
.Lsl_found0:
    bsf %edx, %eax
    jmp .Lsl_check
.Lsl_found:
    bsf %edx, %edx
    add %rdx, %rax
.Lsl_check:
    // The NUL's index from `src`: within `count`, or not.
    cmp %rsi, %rax
    jae .Lsl_long
    inc %rax
    ret
.Lsl_long:
    lea 1(%rsi), %rax
    ret
.Lsl_fault:
    xor %eax, %eax
    ret
    .size ftprobe_strnlen_nofault, . - ftprobe_strnlen_nofault

    .popsection

    .pushsection .rodata.ftprobe_ex_table,"a",@progbits
    .p2align 2
    .globl ftprobe_ex_table
    .hidden ftprobe_ex_table
ftprobe_ex_table:
    .long .Lcopy_vload - ., .Lcopy_vfault - .
    .long .Lcopy_wload - ., .Lcopy_wfault - .
    .long .Lcopy_bload - ., .Lcopy_done - .
    .long .Lu64_load - ., .Lu64_fault - .
    .long .Lsc_vload - ., .Lsc_fault - .
    .long .Lsc_wload - ., .Lsc_wfault - .
    .long .Lsc_bload - ., .Lsc_fault - .
    .long .Lsl_vload0 - ., .Lsl_fault - .
    .long .Lsl_vload - ., .Lsl_fault - .
    .popsection
"#,
    options(att_syntax)
);

/// One entry of the exception table: the faulting load and its fixup, each as an offset
/// from the field itself.
#[repr(C)]
struct ExTableEntry {
    insn: i32,
    fixup: i32,
}

/// Entries in `ftprobe_ex_table` (the asm above).
const EX_TABLE_LEN: usize = 9;

/// The two words a `(u64, u64)` return comes back in (rax, rdx).
#[repr(C)]
struct ValueFault {
    value: u64,
    faulted: u64,
}

extern "C" {
    fn ftprobe_copy_nofault(dst: *mut u8, src: u64, len: u64) -> u64;
    fn ftprobe_read_u64_nofault(src: u64) -> ValueFault;
    fn ftprobe_strncpy_nofault(dst: *mut u8, src: u64, count: u64) -> i64;
    fn ftprobe_strnlen_nofault(src: u64, count: u64) -> u64;
    static ftprobe_ex_table: [ExTableEntry; EX_TABLE_LEN];
}

/// Probe path (the fault handler): where to resume a thread that faulted at `pc`, if `pc`
/// is a load of the routines above (the kernel's `fixup_exception()`).
pub fn fixup(pc: u64) -> Option<u64> {
    // SAFETY: the table is EX_TABLE_LEN entries of two i32 in read-only data (the asm above).
    let table = unsafe { &*std::ptr::addr_of!(ftprobe_ex_table) };
    table.iter().find_map(|e| {
        let at = |field: &i32| (field as *const i32 as u64).wrapping_add(*field as i64 as u64);
        (at(&e.insn) == pc).then(|| at(&e.fixup))
    })
}

/// The process's `sigaction` calls keep ftprobe's fault handler in place ([`set_handlers_kept`]).
static HANDLERS_KEPT: AtomicBool = AtomicBool::new(false);
/// [`enable`] ran and found ftprobe's handler in place for SIGSEGV and SIGBUS.
static ENABLED: AtomicBool = AtomicBool::new(false);
/// Bit `sig - 1`: the program's action for `sig` blocks SIGSEGV or SIGBUS while its handler
/// runs ([`note_action`]).
static BLOCKING_HANDLERS: AtomicU64 = AtomicU64::new(0);

/// The fault signals whose being blocked would make a fault fatal.
const FAULT_BITS: u64 = probe_state::bit(libc::SIGSEGV) | probe_state::bit(libc::SIGBUS);

/// Thread mask states in `ThreadState::fault_mask`.
pub(crate) const MASK_UNKNOWN: u8 = 0;
const MASK_UNBLOCKED: u8 = 1;
const MASK_BLOCKED: u8 = 2;

/// Say that the program's `sigaction` calls (and the rest of the `signal` family) go through
/// interposers that keep ftprobe's fault handler installed and tell [`note_action`] what the
/// program installs, and that its mask changes are reported ([`forget_thread_mask`]): the
/// preloaded agent does (`sigtrap.rs`). Without it, [`enable`] leaves the reads on the system
/// call: a program that installs its own SIGSEGV handler would take ftprobe's place.
pub fn set_handlers_kept() {
    // Release pairs with the Acquire load in `enable`.
    HANDLERS_KEPT.store(true, Ordering::Release);
}

/// Make fault-safe reads use plain loads from now on: install ftprobe's SIGSEGV and SIGBUS
/// handler (if not yet) and check with the kernel that it is the one in place; look at the
/// masks of the handlers the program has installed ([`note_action`]). Returns whether the
/// fast reads are on (never before [`set_handlers_kept`]). Not on the probe path (system
/// calls).
pub fn enable() -> bool {
    if ENABLED.load(Ordering::Acquire) {
        return true;
    }
    if !HANDLERS_KEPT.load(Ordering::Acquire) {
        return false;
    }
    if super::text_poke::install_fault_signal_handlers().is_err() {
        return false;
    }
    for sig in [libc::SIGSEGV, libc::SIGBUS] {
        // SAFETY: a zeroed sigaction is valid; sigaction only writes it.
        let mut cur: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: reads the kernel's action for `sig` into our struct.
        if unsafe { sys::real_sigaction(sig, std::ptr::null(), &mut cur) } != 0
            || !super::text_poke::is_fault_handler(cur.sa_sigaction)
        {
            return false;
        }
    }
    for sig in 1..=64 {
        if [libc::SIGSEGV, libc::SIGBUS, libc::SIGKILL, libc::SIGSTOP].contains(&sig) {
            continue;
        }
        // SAFETY: as above.
        let mut cur: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { sys::real_sigaction(sig, std::ptr::null(), &mut cur) } == 0 {
            note_action(sig, &cur);
        }
    }
    // Release pairs with the Acquire load in `usable`.
    ENABLED.store(true, Ordering::Release);
    true
}

/// Whether [`enable`] turned the plain loads on.
pub fn enabled() -> bool {
    // Acquire pairs with the Release store in `enable`.
    ENABLED.load(Ordering::Acquire)
}

/// The program installed `act` for `sig` (the agent's `sigaction` interposer, after the
/// call succeeded): while a handler whose mask holds SIGSEGV or SIGBUS is installed, reads
/// take the system call (a probe hit inside that handler could not survive a fault).
/// ftprobe's own handlers (the fault signals, SIGTRAP) never block them.
pub fn note_action(sig: libc::c_int, act: &libc::sigaction) {
    if !(1..=64).contains(&sig) || sig == libc::SIGSEGV || sig == libc::SIGBUS {
        return;
    }
    let mut mask = act.sa_mask;
    let handler = act.sa_sigaction != libc::SIG_DFL && act.sa_sigaction != libc::SIG_IGN;
    let blocks = handler && *probe_state::mask_word(&mut mask) & FAULT_BITS != 0;
    let b = probe_state::bit(sig);
    // Relaxed: a hint read by `usable`; the interposer's own thread sees its store, other
    // threads run the handler only after the kernel's sigaction, which orders it.
    if blocks {
        BLOCKING_HANDLERS.fetch_or(b, Ordering::Relaxed);
    } else {
        BLOCKING_HANDLERS.fetch_and(!b, Ordering::Relaxed);
    }
}

/// This thread's mask may have changed (an interposed `sigprocmask`, `pthread_sigmask`,
/// `siglongjmp`, `setcontext`..., or ftprobe's delivery of a fault signal to the program's
/// handler): ask the kernel again at the next read. Async-signal-safe.
pub fn forget_thread_mask() {
    probe_state::this_thread().fault_mask.set(MASK_UNKNOWN);
}

/// Probe path: whether a read may use the plain loads now (module docs).
#[inline]
pub fn usable() -> bool {
    // Acquire pairs with the Release store in `enable`; Relaxed: see `note_action`.
    if !ENABLED.load(Ordering::Acquire) || BLOCKING_HANDLERS.load(Ordering::Relaxed) != 0 {
        return false;
    }
    let st = probe_state::this_thread();
    let unblocked = match st.fault_mask.get() {
        MASK_UNBLOCKED => true,
        MASK_BLOCKED => false,
        _ => {
            let blocked = thread_blocks_faults();
            st.fault_mask.set(if blocked {
                MASK_BLOCKED
            } else {
                MASK_UNBLOCKED
            });
            !blocked
        }
    };
    if !unblocked {
        return false;
    }
    // The signal stack as last seen (`fgraph_unwind::alt_stack`'s cache), inline: one
    // thread-state lookup for the whole check; the kernel is asked out of line.
    match st.alt_stack.get() {
        (true, lo, hi) => {
            let sp = probe_state::stack_pointer();
            !(lo < hi && sp > lo && sp <= hi)
        }
        (false, ..) => !on_signal_stack(),
    }
}

/// Whether this thread runs on its signal stack (`sigaltstack`, as `fgraph_unwind` keeps
/// it): a fault there would push a second signal frame (~3 KiB with AVX-512 state) onto a
/// stack that may be small (MINSIGSTKSZ is 2 KiB); the probe path keeps to its budget there
/// (tests/fetchargs.rs, `strings_and_arrays_fit_on_a_small_signal_stack`) by the system
/// call, which needs no frame.
/// Out of line: its frame (and `alt_stack`'s) is gone before the read's.
#[inline(never)]
fn on_signal_stack() -> bool {
    let sp: u64;
    // SAFETY: reads the stack pointer; no other effect.
    unsafe {
        std::arch::asm!("mov {}, rsp", out(reg) sp, options(nomem, nostack, preserves_flags))
    };
    crate::ftrace::fgraph_unwind::alt_stack().is_some_and(|(lo, hi)| sp > lo && sp <= hi)
}

/// Whether this thread's mask blocks SIGSEGV or SIGBUS: one `rt_sigprocmask` (unknown:
/// blocked).
#[cold]
#[inline(never)]
fn thread_blocks_faults() -> bool {
    let mut cur = 0u64;
    // SAFETY: rt_sigprocmask(SIG_BLOCK, NULL, &cur, 8) only writes 8 bytes to `cur`.
    let r = unsafe {
        sys::raw_syscall4(
            libc::SYS_rt_sigprocmask,
            libc::SIG_BLOCK as u64,
            0,
            &mut cur as *mut u64 as u64,
            8,
        )
    };
    r != 0 || cur & FAULT_BITS != 0
}

/// Probe path: copy `buf.len()` bytes from `src` with plain loads; the bytes copied from
/// the start (fewer when a byte cannot be read: the first bad one and after are not).
/// Only when [`usable`].
#[inline]
pub fn copy_nofault(src: u64, buf: &mut [u8]) -> usize {
    // SAFETY: `buf` is writable for its length; loads from `src` that fault are resumed at
    // their fixup by ftprobe's handler ([`usable`] holds).
    let left = unsafe { ftprobe_copy_nofault(buf.as_mut_ptr(), src, buf.len() as u64) };
    buf.len() - left as usize
}

/// Probe path: the word at `src`, or `None` if any of its bytes cannot be read. Only when
/// [`usable`].
#[inline]
pub fn read_u64_nofault(src: u64) -> Option<u64> {
    // SAFETY: reads only; a fault is resumed at the fixup ([`usable`] holds).
    let r = unsafe { ftprobe_read_u64_nofault(src) };
    (r.faulted == 0).then_some(r.value)
}

/// Probe path: copy the string at `src` into `buf`, up to and including its NUL, at most
/// `buf.len()` bytes: the bytes copied (the last is the NUL unless all of `buf` was
/// filled), or `None` when a byte before the NUL cannot be read. Only when [`usable`].
#[inline]
pub fn strncpy_nofault(src: u64, buf: &mut [u8]) -> Option<usize> {
    // SAFETY: `buf` is writable for its length, and at most that many bytes are stored; a
    // fault is resumed at the fixup ([`usable`] holds).
    let n = unsafe { ftprobe_strncpy_nofault(buf.as_mut_ptr(), src, buf.len() as u64) };
    usize::try_from(n).ok()
}

/// Probe path: the length of the string at `src` with its NUL when the NUL is in the first
/// `max` bytes, `max + 1` when it is not, `None` when a byte before the NUL cannot be read.
/// Only when [`usable`].
#[inline]
pub fn strnlen_nofault(src: u64, max: usize) -> Option<usize> {
    // SAFETY: reads only; a fault is resumed at the fixup ([`usable`] holds).
    let n = unsafe { ftprobe_strnlen_nofault(src, max as u64) };
    (n != 0).then_some(n as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two pages, the second unmapped: (base, end of the first).
    fn page_then_hole() -> (u64, u64) {
        let page = sys::page_size();
        // SAFETY: a fresh private anonymous mapping of two pages.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                2 * page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        // SAFETY: the second page of our own mapping.
        let r = unsafe { libc::munmap((p as usize + page) as *mut _, page) };
        assert_eq!(r, 0);
        (p as u64, p as u64 + page as u64)
    }

    #[test]
    fn loads_resume_at_their_fixup() {
        // This test binary installs no signal action of its own.
        set_handlers_kept();
        assert!(enable(), "ftprobe's fault handler in place");
        assert!(usable());
        let (base, end) = page_then_hole();
        // SAFETY: the last 20 bytes of the first page: "0123456789abcdefghi\0" at end-20,
        // then "xyz" (no NUL) in the last 3 bytes.
        unsafe {
            let s = b"0123456789abcdefghi\0";
            std::ptr::copy_nonoverlapping(s.as_ptr(), (end - 23) as *mut u8, 20);
            std::ptr::copy_nonoverlapping(b"xyz".as_ptr(), (end - 3) as *mut u8, 3);
        }
        let mut buf = [0u8; 64];
        // Whole, partial at the mapping's end (word and byte paths), nothing.
        assert_eq!(copy_nofault(end - 23, &mut buf[..20]), 20);
        assert_eq!(&buf[..20], b"0123456789abcdefghi\0");
        assert_eq!(copy_nofault(end - 23, &mut buf[..40]), 23);
        assert_eq!(copy_nofault(end - 5, &mut buf[..3]), 3);
        assert_eq!(copy_nofault(end, &mut buf[..8]), 0);
        assert_eq!(copy_nofault(0, &mut buf[..1]), 0);
        assert_eq!(copy_nofault(end - 1, &mut buf[..0]), 0);
        // Words: aligned, across the end, NULL, non-canonical.
        assert_eq!(
            read_u64_nofault(end - 8),
            Some(u64::from_le_bytes(*b"fghi\0xyz"))
        );
        assert_eq!(read_u64_nofault(end - 4), None);
        assert_eq!(read_u64_nofault(0), None);
        assert_eq!(read_u64_nofault(0x8000_0000_0000_0000), None);
        // Strings: found (word and byte paths), cut at the buffer, running into the hole.
        assert_eq!(strnlen_nofault(end - 23, 4096), Some(20));
        assert_eq!(strnlen_nofault(end - 23, 5), Some(6));
        assert_eq!(strnlen_nofault(end - 3, 4096), None);
        assert_eq!(strnlen_nofault(end - 3, 3), Some(4));
        assert_eq!(strnlen_nofault(8, 16), None);
        let mut out = [0xaau8; 32];
        assert_eq!(strncpy_nofault(end - 23, &mut out), Some(20));
        assert_eq!(&out[..20], b"0123456789abcdefghi\0");
        assert_eq!(out[20], 0xaa, "nothing stored after the NUL");
        assert_eq!(strncpy_nofault(end - 23, &mut out[..8]), Some(8));
        assert_eq!(strncpy_nofault(end - 3, &mut out), None);
        assert_eq!(strncpy_nofault(0, &mut out), None);
        // SAFETY: the first page of the mapping made above.
        unsafe { libc::munmap(base as *mut _, sys::page_size()) };
    }

    /// The string routines against a byte-by-byte model, at every alignment: strings of
    /// every length up to 40 bytes that end (NUL or not) before the unmapped page or run into
    /// it, each with limits below, at and above its length; and copies that run into it.
    #[test]
    fn string_reads_match_a_byte_model_at_every_alignment() {
        set_handlers_kept();
        assert!(enable());
        let (base, end) = page_then_hole();
        // The model: the bytes are readable below `end`; the NUL (if any) at `nul`.
        let model_strnlen = |src: u64, nul: Option<u64>, count: usize| -> Option<usize> {
            for i in 0..count as u64 {
                if src + i >= end {
                    return None;
                }
                if Some(src + i) == nul {
                    return Some(i as usize + 1);
                }
            }
            Some(count + 1)
        };
        for back in 1..=64u64 {
            let src = end - back;
            for len in 0..=40u64 {
                // `len` bytes of 'x' then the NUL, where it fits before `end`.
                // SAFETY: the bytes from end - 80 to end are in the mapped first page.
                unsafe { std::ptr::write_bytes((end - 80) as *mut u8, b'y', 80) };
                let nul = (src + len < end).then_some(src + len);
                // SAFETY: as above (src >= end - 64, src + len < end when written).
                unsafe {
                    std::ptr::write_bytes(src as *mut u8, b'x', (len.min(back)) as usize);
                    if let Some(n) = nul {
                        *(n as *mut u8) = 0;
                    }
                }
                for count in [0, 1, len as usize, len as usize + 1, 16, 17, 100, 4096] {
                    let want = model_strnlen(src, nul, count);
                    let got = strnlen_nofault(src, count);
                    assert_eq!(got, want, "strnlen(end - {back}, {count}), length {len}");
                    let mut out = [0xaau8; 128];
                    let cap = count.min(out.len() - 16);
                    let copied = strncpy_nofault(src, &mut out[..cap]);
                    let want_copy = match model_strnlen(src, nul, cap) {
                        Some(n) if n <= cap => Some(n),
                        Some(_) => Some(cap),
                        None => None,
                    };
                    assert_eq!(
                        copied, want_copy,
                        "strncpy(end - {back}, {cap}), length {len}"
                    );
                    // The bytes copied are the string's; nothing is stored past `cap`.
                    if let Some(n) = copied {
                        // SAFETY: `n` bytes from `src` were readable (just copied).
                        let s = unsafe { std::slice::from_raw_parts(src as *const u8, n) };
                        assert_eq!(&out[..n], s, "strncpy(end - {back}, {cap}) bytes");
                    }
                    assert!(out[cap..].iter().all(|&b| b == 0xaa), "past {cap}");
                }
            }
        }
        // Copies of every length up to 80 from every start in the last 64 bytes: the bytes
        // before the hole, exactly.
        // SAFETY: the last 128 bytes of the mapped first page.
        unsafe {
            for i in 0..128u64 {
                *((end - 128 + i) as *mut u8) = i as u8;
            }
        }
        for back in 1..=64u64 {
            let src = end - back;
            for len in 0..=80usize {
                let mut out = [0xaau8; 96];
                let got = copy_nofault(src, &mut out[..len]);
                let want = len.min(back as usize);
                assert_eq!(got, want, "copy(end - {back}, {len})");
                for (i, &b) in out[..want].iter().enumerate() {
                    assert_eq!(
                        b,
                        (128 - back as usize + i) as u8,
                        "byte {i} of end - {back}"
                    );
                }
                assert!(out[want..].iter().all(|&b| b == 0xaa), "nothing after");
            }
        }
        // An aligned start whose first block is unreadable, and NULL.
        assert_eq!(strnlen_nofault(end, 16), None);
        assert_eq!(strnlen_nofault(0, 16), None);
        // SAFETY: the first page of the mapping made above.
        unsafe { libc::munmap(base as *mut _, sys::page_size()) };
    }
}
