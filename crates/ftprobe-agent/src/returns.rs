//! The agent's part of return hooks under what programs do (the cases are described in
//! `ftprobe::ftrace::fgraph_unwind`): it sees longjmp targets and context switches through
//! the interposers of `sigtrap`, and tells the engine.

use std::sync::atomic::{AtomicBool, Ordering};

use ftprobe::ftrace::fgraph_unwind;

/// Return hooks are on (the function_graph tracer runs).
static ON: AtomicBool = AtomicBool::new(false);

/// Called once return hooks are registered.
pub fn start() {
    ON.store(true, Ordering::Release);
}

/// Whether return hooks are on.
#[inline]
pub fn on() -> bool {
    ON.load(Ordering::Acquire)
}

/// glibc's pointer guard (`%fs:0x30`, `tcbhead_t.pointer_guard`).
fn pointer_guard() -> u64 {
    let g: u64;
    // SAFETY: reads one word of this thread's TCB (glibc keeps the pointer guard at
    // %fs:0x30 on x86-64); no other effect.
    unsafe {
        std::arch::asm!("mov {}, fs:[0x30]", out(reg) g, options(nostack, readonly, preserves_flags))
    };
    g
}

/// glibc's `PTR_DEMANGLE` on x86-64: rotate right by 0x11, then xor with the pointer guard.
fn demangle(v: u64) -> u64 {
    v.rotate_right(0x11) ^ pointer_guard()
}

/// Before a longjmp whose `jmp_buf` saved the (mangled) stack pointer `mangled_sp`.
pub fn before_longjmp(mangled_sp: u64) {
    if on() {
        fgraph_unwind::longjmp_unwind(demangle(mangled_sp));
    }
}

/// Before `setcontext`/`swapcontext` to `ucp`: the stack it runs on (set by the program for
/// `makecontext`) becomes a known stack.
///
/// # Safety
/// `ucp` is null or a valid `ucontext_t`.
pub unsafe fn before_context_switch(ucp: *const libc::ucontext_t) {
    if !on() || ucp.is_null() {
        return;
    }
    // SAFETY: the caller's contract.
    let st = unsafe { &(*ucp).uc_stack };
    if !st.ss_sp.is_null() && st.ss_size > 0 {
        let lo = st.ss_sp as u64;
        fgraph_unwind::note_stack(lo, lo + st.ss_size as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    extern "C" {
        fn _setjmp(env: *mut [u64; 25]) -> libc::c_int;
    }

    #[test]
    fn jmp_buf_stack_pointer_demangles_to_the_callers() {
        let mut env = [0u64; 25];
        // SAFETY: a jmp_buf-sized buffer (200 bytes) of our own; no longjmp to it follows.
        unsafe { _setjmp(&mut env) };
        let sp = demangle(env[6]);
        let here = &env as *const _ as u64;
        // The saved stack pointer is this frame's (the buffer lives in it): within a few KiB.
        assert!(sp < here + 4096 && sp + 4096 > here, "{sp:#x} vs {here:#x}");
    }
}
