//! `struct ftrace_ops` (include/linux/ftrace.h) over [`ftprobe::ftrace`].

use std::ffi::c_void;
use std::sync::atomic::Ordering;

use ftprobe::ftrace::{self as ft, FtraceError, FtraceOps, PtRegs};
use libc::{c_char, c_int, c_ulong};

use crate::error::fail;
use crate::regs::{c_regs, pt_regs};

/// Save every register for the callback (kernel: `FTRACE_OPS_FL_SAVE_REGS`); without it only
/// the argument registers, `bp`, `ip` and `sp` are filled (see `struct pt_regs`).
pub const FTRACE_OPS_FL_SAVE_REGS: c_ulong = 1;
/// The callback may change `regs->ip` (kernel: `FTRACE_OPS_FL_IPMODIFY`); needs SAVE_REGS;
/// one such ops per function (-EBUSY).
pub const FTRACE_OPS_FL_IPMODIFY: c_ulong = 2;
/// ftrace guards the callback against recursion on its thread (kernel:
/// `FTRACE_OPS_FL_RECURSION`); without it the callback must guard itself, as in the kernel.
pub const FTRACE_OPS_FL_RECURSION: c_ulong = 4;

const _: () = assert!(
    FTRACE_OPS_FL_SAVE_REGS == ft::FTRACE_OPS_FL_SAVE_REGS as c_ulong
        && FTRACE_OPS_FL_IPMODIFY == ft::FTRACE_OPS_FL_IPMODIFY as c_ulong
        && FTRACE_OPS_FL_RECURSION == ft::FTRACE_OPS_FL_RECURSION as c_ulong
);
const FLAGS_KNOWN: c_ulong =
    FTRACE_OPS_FL_SAVE_REGS | FTRACE_OPS_FL_IPMODIFY | FTRACE_OPS_FL_RECURSION;

/// The callback: `func(ip, parent_ip, op, regs)`. `ip` is the ftrace site's address (the
/// function's first instruction, or the one after `endbr64`), `parent_ip` the traced
/// function's return address (in its caller). (The kernel passes `struct ftrace_regs *`
/// since 5.11; here it is `struct pt_regs *`.)
pub type ftrace_func_t = Option<
    unsafe extern "C" fn(ip: c_ulong, parent_ip: c_ulong, op: *mut ftrace_ops, regs: *mut pt_regs),
>;

/// A callback on a set of functions (the kernel's `struct ftrace_ops`). Zero-initialize it,
/// set `func` (and `flags`, `private_`); keep it alive and in place from its first use until
/// it is unregistered and no callback runs any more. Functions are those with an ftrace site
/// (compiled with `-pg -mfentry`, `-fpatchable-function-entry=5` or
/// `__attribute__((patchable_function_entry(5, 0)))`).
#[repr(C)]
pub struct ftrace_ops {
    /// The callback (not NULL).
    pub func: ftrace_func_t,
    /// `FTRACE_OPS_FL_*`, read at the ops' first use ([`ftrace_set_filter`],
    /// [`ftrace_set_notrace`] or [`register_ftrace_function`]) and fixed from then on.
    pub flags: c_ulong,
    /// For the callback's own use (the kernel's `private`; `private_` in C, since `private`
    /// is a C++ keyword).
    pub private: *mut c_void,
    /// The engine's; leave it NULL.
    pub ftprobe_private: *mut c_void,
}

/// Probe path: the engine's callback for a C ops.
///
/// # Safety
/// Called by the engine only, for an ops made by [`engine_of`].
unsafe extern "C" fn func_shim(ip: u64, parent_ip: u64, op: &FtraceOps, regs: &mut PtRegs) {
    let c = op.private.load(Ordering::Relaxed) as *mut ftrace_ops;
    // SAFETY: `private` is the C ops, alive while registered (the API's contract).
    if let Some(f) = unsafe { (*c).func } {
        // SAFETY: the user's callback, with its ops and the registers.
        unsafe { f(ip as c_ulong, parent_ip as c_ulong, c, c_regs(regs)) }
    }
}

/// The engine ops of a C ops, made at its first use.
///
/// # Safety
/// `ops` is NULL or points to a live `struct ftrace_ops`.
unsafe fn engine_of(ops: *mut ftrace_ops) -> Result<&'static FtraceOps, c_int> {
    if ops.is_null() {
        return Err(fail(libc::EINVAL, &"ftrace_ops is NULL"));
    }
    // SAFETY: `ops` is live.
    let c = unsafe { &mut *ops };
    if c.func.is_none() {
        return Err(fail(libc::EINVAL, &"ftrace_ops.func is NULL"));
    }
    if c.flags & !FLAGS_KNOWN != 0 {
        return Err(fail(
            libc::EINVAL,
            &format!("unknown ftrace_ops flags {:#x}", c.flags & !FLAGS_KNOWN),
        ));
    }
    if !c.ftprobe_private.is_null() {
        // SAFETY: set below from a leaked Box, never freed.
        let e = unsafe { &*(c.ftprobe_private as *const FtraceOps) };
        if c_ulong::from(e.flags) != c.flags {
            return Err(fail(
                libc::EINVAL,
                &"ftrace_ops.flags changed after the ops was first used",
            ));
        }
        return Ok(e);
    }
    let e: &'static FtraceOps = Box::leak(Box::new(FtraceOps::new(func_shim, c.flags as u32)));
    e.private.store(ops as u64, Ordering::Relaxed);
    c.ftprobe_private = e as *const FtraceOps as *mut c_void;
    Ok(e)
}

fn ferr(e: FtraceError) -> c_int {
    fail(e.errno(), &e)
}

/// # Safety
/// As [`ftrace_set_filter`].
unsafe fn set(
    ops: *mut ftrace_ops,
    buf: *const c_char,
    len: c_int,
    reset: c_int,
    notrace: bool,
) -> c_int {
    if let Err(r) = crate::ensure_init() {
        return r;
    }
    // SAFETY: forwarded contract.
    let e = match unsafe { engine_of(ops) } {
        Ok(e) => e,
        Err(r) => return r,
    };
    if buf.is_null() || len < 0 {
        return fail(libc::EINVAL, &"filter: NULL buffer or negative length");
    }
    // SAFETY: `buf` holds `len` bytes (the caller's contract).
    let bytes = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len as usize) };
    let Ok(pattern) = std::str::from_utf8(bytes) else {
        return fail(libc::EINVAL, &"filter pattern is not UTF-8");
    };
    let r = if notrace {
        ft::ftrace_set_notrace(e, pattern, reset != 0)
    } else {
        ft::ftrace_set_filter(e, pattern, reset != 0)
    };
    r.map_or_else(ferr, |()| 0)
}

/// Add a pattern (with `reset` non-zero: replace the list) to the functions an unregistered
/// ops traces (the kernel's `ftrace_set_filter()`): `FUNC`, a glob (`*`, `?`, `[...]`),
/// `!PAT` (take functions out), `PAT:mod:OBJ`. `buf` holds `len` bytes (not necessarily
/// NUL-terminated; `strlen(buf)` for a C string). With no filter the ops traces every
/// function with a site. 0, -EINVAL (bad pattern, no function with a site matches), -EBUSY
/// (the ops is registered).
///
/// # Safety
/// `ops` is NULL or points to a live `struct ftrace_ops`; `buf` holds `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn ftrace_set_filter(
    ops: *mut ftrace_ops,
    buf: *const c_char,
    len: c_int,
    reset: c_int,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { set(ops, buf, len, reset, false) }
}

/// As [`ftrace_set_filter`], for the functions the ops does not trace (the kernel's
/// `ftrace_set_notrace()`): they win over the filter.
///
/// # Safety
/// As [`ftrace_set_filter`].
#[no_mangle]
pub unsafe extern "C" fn ftrace_set_notrace(
    ops: *mut ftrace_ops,
    buf: *const c_char,
    len: c_int,
    reset: c_int,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { set(ops, buf, len, reset, true) }
}

/// Start calling `ops->func` on the functions its filter selects (the kernel's
/// `register_ftrace_function()`). 0 or -EINVAL (not initialized and other threads run:
/// [`crate::ftprobe_init`], NULL func, IPMODIFY
/// without SAVE_REGS), -EBUSY (already registered, or another IPMODIFY ops holds one of its
/// functions), -ENOSPC (64 ops registered). On error nothing changed.
///
/// # Safety
/// `ops` is NULL or points to a `struct ftrace_ops` that stays alive and in place until it
/// is unregistered and no callback runs any more; the callback is async-signal-safe.
#[no_mangle]
pub unsafe extern "C" fn register_ftrace_function(ops: *mut ftrace_ops) -> c_int {
    if let Err(r) = crate::ensure_init() {
        return r;
    }
    // SAFETY: forwarded contract.
    match unsafe { engine_of(ops) } {
        Ok(e) => ft::register_ftrace_function(e).map_or_else(ferr, |()| 0),
        Err(r) => r,
    }
}

/// Stop calling `ops` (the kernel's `unregister_ftrace_function()`). A callback already
/// running on another thread may still be finishing when this returns. 0 or -ENODEV (not
/// registered). The ops keeps its filters and can be registered again.
///
/// # Safety
/// `ops` is NULL or points to a live `struct ftrace_ops`.
#[no_mangle]
pub unsafe extern "C" fn unregister_ftrace_function(ops: *mut ftrace_ops) -> c_int {
    if ops.is_null() {
        return fail(libc::EINVAL, &"ftrace_ops is NULL");
    }
    // SAFETY: `ops` is live.
    let e = unsafe { (*ops).ftprobe_private } as *const FtraceOps;
    if e.is_null() {
        return ferr(FtraceError::NotRegistered);
    }
    // SAFETY: set by `engine_of` from a leaked Box, never freed.
    ft::unregister_ftrace_function(unsafe { &*e }).map_or_else(ferr, |()| 0)
}
