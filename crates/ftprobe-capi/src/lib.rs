//! The C API of ftprobe's in-process engine: `libftprobe.so`, `libftprobe.a` and
//! `include/ftprobe.h` (generated from this crate by cbindgen, see `cbindgen.toml`).
//!
//! Thin `extern "C"` wrappers over [`ftprobe::kprobes`] and [`ftprobe::ftrace`], with the
//! kernel's names and struct shapes (`struct kprobe`, `struct kretprobe`, `struct
//! ftrace_ops`, `struct pt_regs`) and the kernel's negative errno values; no probe logic of
//! their own. Each C struct gets an engine object (made at registration, never freed: the
//! probe path may still read it, as the engine's own objects) whose handlers are the shims
//! here: they find the C struct and call the C handler.
//!
//! Rules of the handlers (the probe path), as in the kernel: they run in the probed thread,
//! possibly inside a signal handler (int3 probes are served by a SIGTRAP handler) or with
//! another probe's handler interrupted on the same thread, so they must be
//! async-signal-safe: no `malloc`, no locks, no stdio, nothing `signal-safety(7)` does not
//! list. Atomics (`__atomic_*`, `<stdatomic.h>`) are fine.

#![allow(non_camel_case_types)]

mod error;
mod ftrace;
mod kprobes;
mod regs;

pub use error::*;
pub use ftrace::*;
pub use kprobes::*;
pub use regs::*;

/// Find the ftrace sites of every loaded object and convert them to NOPs (the engine's
/// `ftrace::init`), while the process has one thread (the start of `main`): sites are
/// rewritten with plain stores. As the kernel's API has no such call, the first
/// registration or filter call does it when it was not done and the process has one thread;
/// a program that creates threads first must call it before them (that call then fails
/// with -EINVAL, and its text names `ftprobe_init()`).
///
/// Returns 0, or a negative errno: -EINVAL when other threads already run or it ran
/// already (the text says which, [`ftprobe_last_error`]). Objects that cannot be read are
/// skipped (their functions cannot be traced); that is not an error.
#[no_mangle]
pub extern "C" fn ftprobe_init() -> libc::c_int {
    // SAFETY: the caller's contract, documented above: no other thread runs.
    match unsafe { ::ftprobe::ftrace::init() } {
        Ok(_skipped) => 0,
        Err(e) => error::fail(e.errno(), &e),
    }
}

/// Initialise on first use ([`ftprobe_init`]'s documentation): 0, or the failing call's
/// negative errno with its text (other threads run: call `ftprobe_init()` before them).
pub(crate) fn ensure_init() -> Result<(), libc::c_int> {
    use ::ftprobe::ftrace::{self, FtraceError};
    if ftrace::is_initialized() {
        return Ok(());
    }
    // SAFETY: `init` checks that no other thread runs (refused otherwise); this thread is
    // the only one, so none can start meanwhile.
    match unsafe { ftrace::init() } {
        Ok(_) | Err(FtraceError::AlreadyInitialized) => Ok(()),
        Err(FtraceError::ThreadsRunning(n)) => Err(error::fail(
            libc::EINVAL,
            &format!(
                "ftprobe is not initialized, and with {n} other thread(s) running it cannot \
                 be now (sites are rewritten with plain stores): call ftprobe_init() at the \
                 start of main, before any thread is created"
            ),
        )),
        Err(e) => Err(error::fail(e.errno(), &e)),
    }
}
