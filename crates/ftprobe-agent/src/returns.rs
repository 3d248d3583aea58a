//! The agent's part of return hooks under what programs do (the cases are described in
//! `ftprobe::ftrace::fgraph_unwind`): it sees longjmp targets and context switches through
//! the interposers of `sigtrap`, and tells the engine.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use ftprobe::ftrace::fgraph_unwind;
use ftprobe::ftrace::PtRegs;
use ftprobe::kprobes::{Kprobe, KprobePreHandler};

/// Return hooks are on (the function_graph tracer runs).
static ON: AtomicBool = AtomicBool::new(false);

/// The next `__cxa_begin_catch` and `_Unwind_DeleteException` (libstdc++'s, libgcc_s's), 0
/// when absent.
static NEXT_BEGIN_CATCH: AtomicUsize = AtomicUsize::new(0);
static NEXT_DELETE_EXCEPTION: AtomicUsize = AtomicUsize::new(0);

/// Called once return hooks are registered.
pub fn start() {
    // Looked up now, in the constructor, so that the interposers do not call into the
    // dynamic linker later; only where a loaded object can define them: a failed `dlsym`
    // allocates its error message with the program's `malloc` (a C program has no C++
    // runtime), and the agent never calls the program's allocator.
    if loaded(&[b"libstdc++.so", b"libc++abi.so", b"libc++.so"]) {
        next(&NEXT_BEGIN_CATCH, c"__cxa_begin_catch");
    }
    if loaded(&[b"libgcc_s.so", b"libunwind.so"]) {
        next(&NEXT_DELETE_EXCEPTION, c"_Unwind_DeleteException");
    }
    ON.store(true, Ordering::Release);
}

/// Whether an object whose file name starts with one of `prefixes` is loaded
/// (`dl_iterate_phdr`: the loader's list, read without allocating).
fn loaded(prefixes: &[&[u8]]) -> bool {
    struct Ask<'a> {
        prefixes: &'a [&'a [u8]],
        found: bool,
    }
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: `data` is the `Ask` passed below, alive for the whole iteration.
        let ask = unsafe { &mut *(data as *mut Ask<'_>) };
        // SAFETY: the loader passes a valid dl_phdr_info whose dlpi_name is null or a
        // NUL-terminated path.
        let name = unsafe { (*info).dlpi_name };
        if name.is_null() {
            return 0;
        }
        // SAFETY: as above.
        let path = unsafe { std::ffi::CStr::from_ptr(name) }.to_bytes();
        let base = path.rsplit(|&b| b == b'/').next().unwrap_or(path);
        if ask.prefixes.iter().any(|p| base.starts_with(p)) {
            ask.found = true;
            return 1;
        }
        0
    }
    let mut ask = Ask {
        prefixes,
        found: false,
    };
    // SAFETY: the callback only reads what the loader hands it and writes `ask`.
    unsafe { libc::dl_iterate_phdr(Some(each), &mut ask as *mut Ask<'_> as *mut libc::c_void) };
    ask.found
}

// The landing points after an unwind: a C++ `catch` calls `__cxa_begin_catch`, a catch of
// a foreign exception (Rust's `catch_unwind` of a C++ one) frees it with
// `_Unwind_DeleteException` (a Rust panic caught in Rust is seen at `_Unwind_SetIP` only,
// by the engine's probe). Each stub passes its
// caller's stack pointer (the catching frame's, `rsp + 8` at entry) to the engine, which
// hijacks again the calls that are still live and closes the ones the unwind removed
// (`fgraph_unwind::unwinder_landed`), then goes on to the real function.
/// Interposed `__cxa_begin_catch` (see above).
///
/// # Safety
/// As libstdc++'s.
#[no_mangle]
#[unsafe(naked)]
pub unsafe extern "C" fn __cxa_begin_catch() {
    core::arch::naked_asm!("lea rsi, [rsp + 8]", "jmp {f}", f = sym begin_catch);
}

/// Interposed `_Unwind_DeleteException` (see above).
///
/// # Safety
/// As libgcc_s's.
#[no_mangle]
#[unsafe(naked)]
pub unsafe extern "C" fn _Unwind_DeleteException() {
    core::arch::naked_asm!("lea rsi, [rsp + 8]", "jmp {f}", f = sym delete_exception);
}

/// The next definition of `name`, cached in `cache` (resolved in [`start`] when return hooks
/// are on, else on first use: these interposers exist whether or not they are).
fn next(cache: &AtomicUsize, name: &std::ffi::CStr) -> usize {
    let f = cache.load(Ordering::Relaxed);
    if f != 0 {
        return f;
    }
    // Called by an interposer: a C++ runtime or an unwinder is loaded (its code calls us),
    // so the lookup succeeds.
    // SAFETY: dlsym(RTLD_NEXT, name) with a NUL-terminated name.
    let f = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) } as usize;
    cache.store(f, Ordering::Relaxed);
    f
}

/// `__cxa_begin_catch(exc)` called from a frame whose stack pointer is `caller_sp`.
unsafe extern "C" fn begin_catch(exc: *mut libc::c_void, caller_sp: u64) -> *mut libc::c_void {
    if on() {
        fgraph_unwind::unwinder_landed(caller_sp - 8);
    }
    let f = next(&NEXT_BEGIN_CATCH, c"__cxa_begin_catch");
    if f == 0 {
        // SAFETY: abort has no preconditions; only C++ code calls this, and it brings the
        // C++ runtime that defines it.
        unsafe { libc::abort() };
    }
    type F = unsafe extern "C" fn(*mut libc::c_void) -> *mut libc::c_void;
    // SAFETY: libstdc++'s __cxa_begin_catch, of type F.
    unsafe { std::mem::transmute::<usize, F>(f)(exc) }
}

/// `_Unwind_DeleteException(exc)` called from a frame whose stack pointer is `caller_sp`.
unsafe extern "C" fn delete_exception(exc: *mut libc::c_void, caller_sp: u64) {
    if on() {
        fgraph_unwind::unwinder_landed(caller_sp - 8);
    }
    let f = next(&NEXT_DELETE_EXCEPTION, c"_Unwind_DeleteException");
    if f == 0 {
        return;
    }
    type F = unsafe extern "C" fn(*mut libc::c_void);
    // SAFETY: libgcc_s's _Unwind_DeleteException, of type F.
    unsafe { std::mem::transmute::<usize, F>(f)(exc) }
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
    let target = demangle(mangled_sp);
    // First the probe path's guards of the frames left (a handler that interrupted a
    // return hook and jumps out of it): the exits below are then written as events.
    ftprobe::before_longjmp(target);
    if on() {
        fgraph_unwind::longjmp_unwind(target);
    }
}

/// An attached agent's probes on the C library's entry points that its interposers cover
/// when preloaded (`sigtrap`): `longjmp`, `_longjmp` and `siglongjmp` are one function in
/// glibc; `__longjmp_chk` is `longjmp` under `_FORTIFY_SOURCE`.
pub const LIBC_PROBES: [(&str, &str, KprobePreHandler); 4] = [
    ("libc.so.6", "siglongjmp", longjmp_pre_handler),
    ("libc.so.6", "__longjmp_chk", longjmp_pre_handler),
    ("libc.so.6", "setcontext", setcontext_pre_handler),
    ("libc.so.6", "swapcontext", swapcontext_pre_handler),
];

/// At a `longjmp(env, val)` (`rdi`: the `jmp_buf`, whose word 6 is the mangled stack
/// pointer): as [`before_longjmp`], for the thread whose stack pointer is `regs.sp`. The
/// probe path's own guards are not repaired here (this runs inside it): a jump out of a
/// signal handler that interrupted ftprobe's code is the preloaded agent's case only.
fn longjmp_pre_handler(_p: &Kprobe, regs: &mut PtRegs) -> i32 {
    if on() && regs.rdi != 0 {
        // SAFETY: the `jmp_buf` the program passes to `longjmp`, which reads this word
        // right after (a bad one faults there as here). A plain load: a fault-proof read
        // costs a system call when no fetch arg made plain loads safe (`uaccess`).
        let mangled = unsafe { std::ptr::read_volatile((regs.rdi + 6 * 8) as *const u64) };
        fgraph_unwind::longjmp_unwind_from(regs.sp, demangle(mangled));
    }
    0
}

/// At `setcontext(ucp)`.
fn setcontext_pre_handler(_p: &Kprobe, regs: &mut PtRegs) -> i32 {
    // SAFETY: the `ucontext_t` the program passes to `setcontext`, which reads it right
    // after (as in `longjmp_pre_handler`); null is let through.
    unsafe { before_context_switch(regs.rdi as *const libc::ucontext_t) };
    0
}

/// At `swapcontext(oucp, ucp)`.
fn swapcontext_pre_handler(_p: &Kprobe, regs: &mut PtRegs) -> i32 {
    // SAFETY: as in `setcontext_pre_handler`, for `swapcontext`'s `ucp`.
    unsafe { before_context_switch(regs.rsi as *const libc::ucontext_t) };
    0
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
