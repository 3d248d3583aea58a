//! A signal frame built as the kernel builds one (arch/x86/kernel/signal.c, `get_sigframe`,
//! `x64_setup_rt_frame`), on the stack the kernel would have chosen for the program's
//! handler, when that is not the stack ftprobe's handler runs on.
//!
//! ftprobe's handlers are installed with `SA_ONSTACK`: on a thread with a signal stack the
//! kernel runs them there. A program's handler installed without `SA_ONSTACK` must run on
//! the interrupted stack instead. [`run_on_interrupted_stack`] copies the frame the kernel
//! gave ftprobe's handler below the interrupted stack pointer's red zone:
//!
//! ```text
//!   interrupted rsp - 128
//!   FP state (the kernel's xsave area, its size from the fxsave software bytes), 64-aligned
//!   trailer (signal, the caller's word)
//!   siginfo (128 bytes)
//!   the kernel's ucontext (304 bytes: flags, link, stack, sigcontext, first mask word)
//!   return address: `ftprobe_sigframe_return`                 <- rsp at the handler, 16n+8
//! ```
//!
//! and jumps to the program's handler there, as the kernel enters one. The handler returns
//! into `ftprobe_sigframe_return`, which calls the caller's `after` function with the frame,
//! then `rt_sigreturn` with this frame, as glibc's `__restore_rt` does: the context the handler
//! saw (and may have changed, FP state included) is the one the thread resumes with, and the
//! signal stack is restored from the frame. ftprobe's own frame on the signal stack is never
//! returned to: nothing in it is live any more, so a signal the handler takes on the signal
//! stack may overwrite it. (With `SS_AUTODISARM` the kernel disarms the signal stack on every
//! delivery, whichever stack the handler runs on: disarmed for ftprobe's handler, it is as
//! the program's would find it.)

use std::arch::global_asm;

/// Bytes of the kernel's `struct ucontext` on x86-64: `uc_flags`, `uc_link`, `uc_stack` (24),
/// `uc_mcontext` (`struct sigcontext`, 256), the first word of `uc_sigmask`. glibc's
/// `ucontext_t` starts with the same fields.
const KERNEL_UC: usize = 304;
const SIGINFO: usize = 128;
/// The kernel's red zone below the interrupted stack pointer (x86-64 ABI).
const RED_ZONE: u64 = 128;
/// The fxsave area's software bytes (`struct _fpx_sw_bytes`, at byte 464): `magic1` says
/// whether `extended_size` (the whole xsave area with its trailing magic) follows.
const FP_XSTATE_MAGIC1: u32 = 0x4650_5853;
const FXSAVE_SIZE: usize = 512;
/// `SS_AUTODISARM` (include/uapi/linux/signal.h; the libc crate does not have it).
const SS_AUTODISARM: libc::c_int = 1 << 31;

/// What the caller keeps in the frame for its `after` function.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Trailer {
    /// The signal delivered.
    pub sig: libc::c_int,
    /// The caller's word.
    pub word: u64,
    /// The caller's function, called with the frame after the handler returned.
    after: AfterFn,
}

/// Called (on the interrupted stack) after the program's handler returned, with the frame's
/// siginfo, ucontext and trailer; the thread then resumes from that ucontext.
pub type AfterFn = fn(*mut libc::siginfo_t, *mut libc::ucontext_t, &Trailer);

global_asm!(
    ".pushsection .text.ftprobe_sigframe,\"ax\",@progbits",
    ".balign 16",
    ".globl ftprobe_sigframe_enter",
    ".hidden ftprobe_sigframe_enter",
    // (rdi sig, rsi info, rdx uc, rcx handler, r8 frame): switch to the frame, enter the
    // handler as the kernel does (its return address at [rsp]).
    "ftprobe_sigframe_enter:",
    "mov rsp, r8",
    "jmp rcx",
    ".balign 16",
    ".globl ftprobe_sigframe_return",
    ".hidden ftprobe_sigframe_return",
    // The handler returned: rsp is the frame's ucontext.
    "ftprobe_sigframe_return:",
    "mov rbx, rsp",
    "mov rdi, rsp",
    "and rsp, -16",
    "call {after}",
    "mov rsp, rbx",
    "mov eax, 15", // rt_sigreturn
    "syscall",
    "ud2",
    ".popsection",
    after = sym after_handler,
);

extern "C" {
    fn ftprobe_sigframe_enter(
        sig: libc::c_int,
        info: *mut libc::siginfo_t,
        uc: *mut libc::ucontext_t,
        handler: usize,
        frame: u64,
    ) -> !;
    fn ftprobe_sigframe_return();
}

/// Called by `ftprobe_sigframe_return` with the frame's ucontext.
extern "C" fn after_handler(uc: *mut libc::ucontext_t) {
    let info = (uc as u64 + KERNEL_UC as u64) as *mut libc::siginfo_t;
    // SAFETY: the frame `run_on_interrupted_stack` built: the trailer follows the siginfo.
    let t = unsafe { *((info as u64 + SIGINFO as u64) as *const Trailer) };
    (t.after)(info, uc, &t);
}

/// Whether the kernel would run a handler of `flags` on another stack than the one ftprobe's
/// handler (`SA_ONSTACK`) runs on, given the context it interrupted: the action has no
/// `SA_ONSTACK`, the thread had a usable signal stack (`uc_stack`: the kernel saves the
/// thread's settings there, not whether the interrupted code was on it) that the interrupted
/// stack pointer was not on (the kernel's `on_sig_stack`: never with `SS_AUTODISARM`), and
/// this code runs on that signal stack.
pub fn needs_interrupted_stack(flags: libc::c_int, uc: &libc::ucontext_t) -> bool {
    if flags & libc::SA_ONSTACK != 0 {
        return false;
    }
    let st = &uc.uc_stack;
    if st.ss_size == 0 || st.ss_flags & libc::SS_DISABLE != 0 {
        return false;
    }
    let lo = st.ss_sp as u64;
    let on = |sp: u64| sp > lo && sp - lo <= st.ss_size as u64;
    let interrupted = uc.uc_mcontext.gregs[libc::REG_RSP as usize] as u64;
    if st.ss_flags & SS_AUTODISARM == 0 && on(interrupted) {
        return false;
    }
    on(crate::probe_state::stack_pointer())
}

/// Probe path: run `handler(sig, info, uc)` on the interrupted stack in a copy of the frame
/// (module docs), under the mask the thread has now; `after(info, uc, trailer)` runs when it
/// returns, then the thread resumes from the copy's context. Never returns.
///
/// # Safety
/// `info` and `uc` are the kernel's frame of the signal handler this is called from (on the
/// signal stack, [`needs_interrupted_stack`]); `handler` is the program's handler for `sig`.
pub unsafe fn run_on_interrupted_stack(
    sig: libc::c_int,
    info: *const libc::siginfo_t,
    uc: *const libc::ucontext_t,
    handler: usize,
    word: u64,
    after: AfterFn,
) -> ! {
    // SAFETY: the caller's contract: a valid ucontext.
    let u = unsafe { &*uc };
    let mut sp = (u.uc_mcontext.gregs[libc::REG_RSP as usize] as u64).wrapping_sub(RED_ZONE);
    let fp = u.uc_mcontext.fpregs as *const u8;
    let mut new_fp = 0u64;
    if !fp.is_null() {
        // SAFETY: the kernel's FP frame: an fxsave area whose software bytes say whether an
        // xsave extension follows.
        let size = unsafe {
            let magic = std::ptr::read_unaligned(fp.add(464) as *const u32);
            let ext = std::ptr::read_unaligned(fp.add(468) as *const u32) as usize;
            if magic == FP_XSTATE_MAGIC1 && ext >= FXSAVE_SIZE {
                ext
            } else {
                FXSAVE_SIZE
            }
        };
        sp = (sp - size as u64) & !63;
        // SAFETY: below the interrupted code's red zone: stack memory no live frame uses
        // (the kernel would have written its own frame there); `size` bytes of the kernel's
        // FP frame are readable.
        unsafe { std::ptr::copy_nonoverlapping(fp, sp as *mut u8, size) };
        new_fp = sp;
    }
    let frame_len = 8 + KERNEL_UC + SIGINFO + std::mem::size_of::<Trailer>();
    let frame = ((sp - frame_len as u64) & !15) - 8;
    let new_uc = frame + 8;
    let new_info = new_uc + KERNEL_UC as u64;
    let trailer = new_info + SIGINFO as u64;
    // SAFETY: [frame, frame + frame_len) is free stack below the FP copy (as above); the
    // sources are the kernel's frame; `fpregs` lies within the kernel's ucontext prefix.
    unsafe {
        std::ptr::write(
            frame as *mut u64,
            ftprobe_sigframe_return as *const () as u64,
        );
        std::ptr::copy_nonoverlapping(uc as *const u8, new_uc as *mut u8, KERNEL_UC);
        std::ptr::copy_nonoverlapping(info as *const u8, new_info as *mut u8, SIGINFO);
        let nu = new_uc as *mut libc::ucontext_t;
        std::ptr::addr_of_mut!((*nu).uc_mcontext.fpregs).write(new_fp as *mut _);
        std::ptr::write(trailer as *mut Trailer, Trailer { sig, word, after });
    }
    // SAFETY: the frame is complete; the handler is entered as the kernel enters one.
    unsafe {
        ftprobe_sigframe_enter(
            sig,
            new_info as *mut libc::siginfo_t,
            new_uc as *mut libc::ucontext_t,
            handler,
            frame,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_ucontext_is_glibcs_prefix() {
        // arch/x86/include/uapi/asm/ucontext.h and sigcontext.h: uc_sigmask follows a
        // 256-byte sigcontext at 40.
        assert_eq!(std::mem::offset_of!(libc::ucontext_t, uc_mcontext), 40);
        assert_eq!(std::mem::offset_of!(libc::ucontext_t, uc_sigmask), 296);
        assert_eq!(KERNEL_UC, 296 + 8);
        assert!(
            std::mem::offset_of!(libc::ucontext_t, uc_mcontext)
                + std::mem::offset_of!(libc::mcontext_t, fpregs)
                < KERNEL_UC
        );
    }
}
