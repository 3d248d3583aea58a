//! `struct kprobe` and `struct kretprobe` (include/linux/kprobes.h) over
//! [`ftprobe::kprobes`].

use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};

use ftprobe::ftrace::PtRegs;
use ftprobe::kprobes::{
    self as kp, Kprobe, KprobeError, KprobeTarget, Kretprobe, KretprobeInstance,
};
use libc::{c_char, c_int, c_uint, c_ulong};

use crate::error::{fail, str_arg};
use crate::regs::{c_regs, pt_regs};

/// The probe's object went away (kernel: `KPROBE_FLAG_GONE`).
pub const KPROBE_FLAG_GONE: u32 = 1;
/// Registered but its handlers do not run (kernel: `KPROBE_FLAG_DISABLED`). Set before
/// [`register_kprobe`] to register it disabled.
pub const KPROBE_FLAG_DISABLED: u32 = 2;
/// Jump-optimized (kernel: `KPROBE_FLAG_OPTIMIZED`).
pub const KPROBE_FLAG_OPTIMIZED: u32 = 4;
/// Served by ftrace: the address is an ftrace site, no trap (kernel: `KPROBE_FLAG_FTRACE`).
pub const KPROBE_FLAG_FTRACE: u32 = 8;

const _: () = assert!(
    KPROBE_FLAG_GONE == kp::KPROBE_FLAG_GONE
        && KPROBE_FLAG_DISABLED == kp::KPROBE_FLAG_DISABLED
        && KPROBE_FLAG_OPTIMIZED == kp::KPROBE_FLAG_OPTIMIZED
        && KPROBE_FLAG_FTRACE == kp::KPROBE_FLAG_FTRACE
);

/// `pre_handler(p, regs)`: runs before the probed instruction with `regs->ip` = the probed
/// address + 1, as after an int3. Returning non-zero means "I changed `regs->ip`": the
/// thread continues there and the post_handler does not run.
pub type kprobe_pre_handler_t =
    Option<unsafe extern "C" fn(p: *mut kprobe, regs: *mut pt_regs) -> c_int>;
/// `post_handler(p, regs, flags)`: runs after the probed instruction, `regs->ip` the next
/// one. `flags` is 0.
pub type kprobe_post_handler_t =
    Option<unsafe extern "C" fn(p: *mut kprobe, regs: *mut pt_regs, flags: c_ulong)>;

/// A probe (the kernel's `struct kprobe`). Zero-initialize it (`= {0}` or designated
/// initializers), set either `symbol_name` (+ `offset`) or `addr`, and the handlers; keep it
/// alive and in place while it is registered.
#[repr(C)]
pub struct kprobe {
    /// `"SYM"` or `"OBJ:SYM"` (OBJ: an object's file name, or that name before `.so`); C++
    /// functions by their demangled or mangled name. NULL to probe `addr`.
    pub symbol_name: *const c_char,
    /// Bytes from the start of `symbol_name` (or from `addr`).
    pub offset: c_uint,
    /// In: the address to probe when `symbol_name` is NULL. Out: the address probed, set by
    /// [`register_kprobe`] (after the ENDBR rule: `func+0` of a function starting with
    /// `endbr64` is `func+4`).
    pub addr: *mut c_void,
    /// Before the probed instruction, or NULL.
    pub pre_handler: kprobe_pre_handler_t,
    /// After it, or NULL. A probe with a post_handler on an ftrace site holds the site's
    /// IPMODIFY slot (one per site, -EBUSY for a second).
    pub post_handler: kprobe_post_handler_t,
    /// `KPROBE_FLAG_*`. In: `KPROBE_FLAG_DISABLED` registers it disabled. Out: the engine's
    /// flags, copied by every call of this API on the probe.
    pub flags: u32,
    /// Hits not handled because a probe was already running on the thread; counted in place
    /// (atomically) while registered.
    pub nmissed: c_ulong,
    /// The engine's; leave it NULL.
    pub ftprobe_private: *mut c_void,
}

/// `[OBJ:]SYM` and offset, or an address, as the engine's target (the kernel's
/// `_kprobe_addr()` rule: exactly one of `symbol_name` and `addr`, else -EINVAL).
///
/// # Safety
/// `symbol_name` is NULL or a NUL-terminated string.
unsafe fn target_of(
    symbol_name: *const c_char,
    offset: c_uint,
    addr: *mut c_void,
) -> Result<KprobeTarget, c_int> {
    match (symbol_name.is_null(), addr.is_null()) {
        (false, true) => {
            // SAFETY: forwarded contract.
            let s = unsafe { str_arg(symbol_name, "symbol_name") }?;
            // OBJ:SYM at a single ':' (a C++ name's "::" is not one).
            let split = s
                .char_indices()
                .find(|&(i, c)| c == ':' && !s[i + 1..].starts_with(':') && !s[..i].ends_with(':'));
            let (module, name) = match split {
                Some((i, _)) => (Some(s[..i].to_owned()), s[i + 1..].to_owned()),
                None => (None, s.to_owned()),
            };
            Ok(KprobeTarget::Symbol {
                module,
                name,
                offset: u64::from(offset),
            })
        }
        (true, false) => Ok(KprobeTarget::Addr(addr as u64 + u64::from(offset))),
        _ => Err(fail(
            libc::EINVAL,
            &"set exactly one of symbol_name and addr",
        )),
    }
}

fn kerr(e: KprobeError) -> c_int {
    fail(e.errno(), &e)
}

/// The engine probe of a registered (or once registered) C probe.
///
/// # Safety
/// `p` points to a live `struct kprobe`.
unsafe fn engine_of(p: *mut kprobe) -> Result<&'static Kprobe, c_int> {
    // SAFETY: the caller's contract.
    let e = unsafe { (*p).ftprobe_private } as *const Kprobe;
    if e.is_null() {
        return Err(fail(libc::EINVAL, &KprobeError::NotRegistered));
    }
    // SAFETY: set by `register_kprobe` from a leaked Box, never freed.
    Ok(unsafe { &*e })
}

/// Copy the engine's address and flags into the C struct.
///
/// # Safety
/// `p` points to a live `struct kprobe`.
unsafe fn sync_out(p: *mut kprobe, e: &Kprobe) {
    // SAFETY: the caller's contract.
    unsafe {
        (*p).addr = e.addr() as *mut c_void;
        (*p).flags = e.flags()
            & (KPROBE_FLAG_GONE
                | KPROBE_FLAG_DISABLED
                | KPROBE_FLAG_OPTIMIZED
                | KPROBE_FLAG_FTRACE);
    }
}

/// Probe path: the engine's pre_handler for a C probe.
fn pre_shim(e: &Kprobe, regs: &mut PtRegs) -> i32 {
    let p = e.data.load(Ordering::Relaxed) as *mut kprobe;
    // SAFETY: `data` is the registered C probe, alive while registered (the API's contract).
    match unsafe { (*p).pre_handler } {
        // SAFETY: the user's handler, called with its probe and the registers.
        Some(h) => unsafe { h(p, c_regs(regs)) },
        None => 0,
    }
}

/// Probe path: the engine's post_handler for a C probe.
fn post_shim(e: &Kprobe, regs: &mut PtRegs, flags: u64) {
    let p = e.data.load(Ordering::Relaxed) as *mut kprobe;
    // SAFETY: as in `pre_shim`.
    if let Some(h) = unsafe { (*p).post_handler } {
        // SAFETY: the user's handler, called with its probe and the registers.
        unsafe { h(p, c_regs(regs), flags as c_ulong) }
    }
}

/// Register and arm a probe (the kernel's `register_kprobe()`). Returns 0 or a negative
/// errno: -EINVAL (bad arguments, already registered, not an instruction boundary that can
/// be probed, blacklisted), -ENOENT (no such symbol or object), -EADDRNOTAVAIL (the symbol
/// is not unique), -EILSEQ (inside an ftrace site), -EBUSY (the site's IPMODIFY slot is
/// taken). On error nothing is armed.
///
/// Registering the same `struct kprobe` again after [`unregister_kprobe`] is allowed; each
/// registration makes a small engine object that is never freed (the probe path may still
/// read it).
///
/// # Safety
/// `p` is NULL or points to a `struct kprobe` that stays alive and in place until it is
/// unregistered and no handler runs any more; its handlers are async-signal-safe.
#[no_mangle]
pub unsafe extern "C" fn register_kprobe(p: *mut kprobe) -> c_int {
    if p.is_null() {
        return fail(libc::EINVAL, &"kprobe is NULL");
    }
    if let Err(r) = crate::ensure_init() {
        return r;
    }
    // SAFETY: `p` is live (the caller's contract).
    let c = unsafe { &*p };
    if !c.ftprobe_private.is_null() {
        // SAFETY: set by an earlier registration, never freed.
        let old = unsafe { &*(c.ftprobe_private as *const Kprobe) };
        if kp::is_registered(old) {
            return kerr(KprobeError::AlreadyRegistered);
        }
    }
    // SAFETY: `symbol_name` is a C string (the caller's contract).
    let target = match unsafe { target_of(c.symbol_name, c.offset, c.addr) } {
        Ok(t) => t,
        Err(e) => return e,
    };
    let disabled = c.flags & KPROBE_FLAG_DISABLED != 0;
    let e: &'static Kprobe = Box::leak(Box::new(Kprobe::new(
        target,
        c.pre_handler.map(|_| pre_shim as kp::KprobePreHandler),
        c.post_handler.map(|_| post_shim as kp::KprobePostHandler),
    )));
    e.data.store(p as u64, Ordering::Relaxed);
    // SAFETY: `nmissed` is an aligned `unsigned long` of the live C probe, written from now
    // on only through this atomic; the C probe outlives its registration (the contract).
    let nmissed: &'static AtomicU64 =
        unsafe { AtomicU64::from_ptr(std::ptr::addr_of_mut!((*p).nmissed).cast::<u64>()) };
    e.count_nmissed_in(nmissed);
    if let Err(err) = kp::register_kprobe(e) {
        return kerr(err);
    }
    // SAFETY: `p` is live.
    unsafe { (*p).ftprobe_private = e as *const Kprobe as *mut c_void };
    // The engine has no "register disabled": disable right after (a hit in between runs the
    // handlers).
    let r = if disabled {
        kp::disable_kprobe(e).map_or_else(kerr, |()| 0)
    } else {
        0
    };
    // SAFETY: `p` is live.
    unsafe { sync_out(p, e) };
    r
}

/// Disarm and remove a probe (the kernel's `unregister_kprobe()`, which returns nothing;
/// here 0 or -EINVAL when it is not registered). A handler already running on another thread
/// may still be finishing when this returns. When the probe was placed by `symbol_name`,
/// `addr` is set back to NULL, so the same struct can be registered again.
///
/// # Safety
/// `p` is NULL or points to a live `struct kprobe`.
#[no_mangle]
pub unsafe extern "C" fn unregister_kprobe(p: *mut kprobe) -> c_int {
    if p.is_null() {
        return fail(libc::EINVAL, &"kprobe is NULL");
    }
    // SAFETY: `p` is live.
    let e = match unsafe { engine_of(p) } {
        Ok(e) => e,
        Err(r) => return r,
    };
    if let Err(err) = kp::unregister_kprobe(e) {
        return kerr(err);
    }
    // SAFETY: `p` is live.
    unsafe {
        sync_out(p, e);
        if !(*p).symbol_name.is_null() {
            (*p).addr = std::ptr::null_mut();
        }
    }
    0
}

/// Stop a probe's handlers without unregistering it (the kernel's `disable_kprobe()`).
/// 0, or -EINVAL when it is not registered.
///
/// # Safety
/// `p` is NULL or points to a live `struct kprobe`.
#[no_mangle]
pub unsafe extern "C" fn disable_kprobe(p: *mut kprobe) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { set_enabled(p, false) }
}

/// Resume a disabled probe (the kernel's `enable_kprobe()`). 0, or -EINVAL when it is not
/// registered.
///
/// # Safety
/// `p` is NULL or points to a live `struct kprobe`.
#[no_mangle]
pub unsafe extern "C" fn enable_kprobe(p: *mut kprobe) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { set_enabled(p, true) }
}

/// # Safety
/// `p` is NULL or points to a live `struct kprobe`.
unsafe fn set_enabled(p: *mut kprobe, on: bool) -> c_int {
    if p.is_null() {
        return fail(libc::EINVAL, &"kprobe is NULL");
    }
    // SAFETY: `p` is live.
    let e = match unsafe { engine_of(p) } {
        Ok(e) => e,
        Err(r) => return r,
    };
    let r = if on {
        kp::enable_kprobe(e)
    } else {
        kp::disable_kprobe(e)
    };
    // SAFETY: `p` is live.
    unsafe { sync_out(p, e) };
    r.map_or_else(kerr, |()| 0)
}

/// Words of per-instance data a return probe has (`kretprobe_instance.data`).
pub const KRETPROBE_DATA_WORDS: usize = 4;
const _: () = assert!(KRETPROBE_DATA_WORDS == ftprobe::ftrace::fgraph::FGRAPH_DATA_WORDS);

/// One hooked call (the kernel's `struct kretprobe_instance`), on the handler's stack: valid
/// only during the handler.
#[repr(C)]
pub struct kretprobe_instance {
    /// The return probe (the kernel's `get_kretprobe(ri)`).
    pub rp: *mut kretprobe,
    /// The probed function (the address probed: its site, or its first byte).
    pub func: u64,
    /// Where the call returns to (0 in the entry handler, which runs before it is known).
    pub ret_addr: u64,
    /// What the entry handler leaves for the handler (`data_size` bytes of it are yours;
    /// zeroed before the entry handler).
    pub data: [u64; KRETPROBE_DATA_WORDS],
}

/// `handler(ri, regs)`: at return, `regs->ax`/`regs->dx` the return value, `regs->sp` the
/// stack pointer after the return, `regs->ip` where it returns to (changes to `regs` are not
/// applied). As `entry_handler`: at entry, the arguments in `regs`; non-zero drops this call
/// (no `handler` for it).
pub type kretprobe_handler_t =
    Option<unsafe extern "C" fn(ri: *mut kretprobe_instance, regs: *mut pt_regs) -> c_int>;

/// A return probe (the kernel's `struct kretprobe`): `kp.symbol_name` or `kp.addr` names a
/// function's entry (an offset is -EINVAL); `kp`'s handlers are the engine's, leave them
/// NULL.
#[repr(C)]
pub struct kretprobe {
    /// The entry probe: set its `symbol_name` or `addr`.
    pub kp: kprobe,
    /// At the function's return, or NULL.
    pub handler: kretprobe_handler_t,
    /// At its entry, or NULL.
    pub entry_handler: kretprobe_handler_t,
    /// Instances alive at once (0 or less: the kernel's default, `max(10, 2 * CPUs)`); a
    /// call beyond it counts in `nmissed`.
    pub maxactive: c_int,
    /// Calls not hooked, written by [`unregister_kretprobe`] (while registered:
    /// [`ftprobe_kretprobe_nmissed`]).
    pub nmissed: c_int,
    /// Bytes of `kretprobe_instance.data` used (at most `8 * KRETPROBE_DATA_WORDS`, else
    /// -EINVAL).
    pub data_size: usize,
    /// The engine's; leave it NULL.
    pub ftprobe_private: *mut c_void,
}

/// The C instance of an engine instance, and the C return probe.
fn c_instance(ri: &KretprobeInstance) -> kretprobe_instance {
    kretprobe_instance {
        rp: ri.rp.data.load(Ordering::Relaxed) as *mut kretprobe,
        func: ri.func,
        ret_addr: ri.ret_addr,
        data: ri.data,
    }
}

/// Probe path: the engine's entry handler for a C return probe.
fn entry_shim(ri: &mut KretprobeInstance, regs: &mut PtRegs) -> i32 {
    let mut c = c_instance(ri);
    // SAFETY: `c.rp` is the registered C return probe, alive while registered.
    let r = match unsafe { (*c.rp).entry_handler } {
        // SAFETY: the user's handler, with a live instance and the registers.
        Some(h) => unsafe { h(&mut c, c_regs(regs)) },
        None => 0,
    };
    ri.data = c.data;
    r
}

/// Probe path: the engine's return handler for a C return probe.
fn ret_shim(ri: &KretprobeInstance, regs: &PtRegs) -> i32 {
    let mut c = c_instance(ri);
    let mut regs = *regs;
    // SAFETY: as in `entry_shim`.
    match unsafe { (*c.rp).handler } {
        // SAFETY: the user's handler, with a live instance and a copy of the registers.
        Some(h) => unsafe { h(&mut c, c_regs(&mut regs)) },
        None => 0,
    }
}

/// Register a return probe (the kernel's `register_kretprobe()`). 0 or a negative errno as
/// [`register_kprobe`], and -EINVAL for a target that is not a function's entry. Copies
/// `kp.addr` (the address probed) and `kp.flags` back.
///
/// # Safety
/// `rp` is NULL or points to a `struct kretprobe` that stays alive and in place until it is
/// unregistered and no handler runs any more; its handlers are async-signal-safe.
#[no_mangle]
pub unsafe extern "C" fn register_kretprobe(rp: *mut kretprobe) -> c_int {
    if rp.is_null() {
        return fail(libc::EINVAL, &"kretprobe is NULL");
    }
    if let Err(r) = crate::ensure_init() {
        return r;
    }
    // SAFETY: `rp` is live (the caller's contract).
    let c = unsafe { &*rp };
    if !c.ftprobe_private.is_null() {
        // SAFETY: set by an earlier registration, never freed.
        let old = unsafe { &*(c.ftprobe_private as *const Kretprobe) };
        if kp::is_registered(&old.kp) {
            return kerr(KprobeError::AlreadyRegistered);
        }
    }
    if c.kp.pre_handler.is_some() || c.kp.post_handler.is_some() {
        return fail(
            libc::EINVAL,
            &"a kretprobe's kp handlers are the engine's: leave them NULL",
        );
    }
    if c.data_size > 8 * KRETPROBE_DATA_WORDS {
        return fail(
            libc::EINVAL,
            &format!(
                "data_size {} is more than the {} bytes of kretprobe_instance.data",
                c.data_size,
                8 * KRETPROBE_DATA_WORDS
            ),
        );
    }
    if c.kp.offset != 0 {
        return kerr(KprobeError::NotFunctionEntry(format!(
            "+{:#x}",
            c.kp.offset
        )));
    }
    // SAFETY: `symbol_name` is a C string (the caller's contract).
    let target = match unsafe { target_of(c.kp.symbol_name, 0, c.kp.addr) } {
        Ok(t) => t,
        Err(e) => return e,
    };
    let e: &'static Kretprobe = Box::leak(Box::new(Kretprobe::new(
        target,
        c.handler.map(|_| ret_shim as kp::KretprobeHandler),
        c.entry_handler
            .map(|_| entry_shim as kp::KretprobeEntryHandler),
        c.maxactive.max(0) as u32,
    )));
    e.data.store(rp as u64, Ordering::Relaxed);
    if let Err(err) = kp::register_kretprobe(e) {
        return kerr(err);
    }
    // SAFETY: `rp` is live.
    unsafe {
        (*rp).ftprobe_private = e as *const Kretprobe as *mut c_void;
        sync_out(std::ptr::addr_of_mut!((*rp).kp), &e.kp);
    }
    0
}

/// Calls a return probe did not hook (more than `maxactive` alive, a probe already running
/// on the thread, no room on the thread's shadow stack); 0 for one never registered.
///
/// # Safety
/// `rp` is NULL or points to a live `struct kretprobe`.
#[no_mangle]
pub unsafe extern "C" fn ftprobe_kretprobe_nmissed(rp: *const kretprobe) -> c_ulong {
    if rp.is_null() {
        return 0;
    }
    // SAFETY: `rp` is live.
    let e = unsafe { (*rp).ftprobe_private } as *const Kretprobe;
    if e.is_null() {
        return 0;
    }
    // SAFETY: set by `register_kretprobe` from a leaked Box, never freed.
    unsafe { &*e }.nmissed() as c_ulong
}

/// Remove a return probe (the kernel's `unregister_kretprobe()`, which returns nothing;
/// here 0 or a negative errno). Calls already hooked still return through the shadow stack;
/// their handler no longer runs. Writes `nmissed`; sets `kp.addr` back to NULL when the
/// probe was placed by `kp.symbol_name`.
///
/// # Safety
/// `rp` is NULL or points to a live `struct kretprobe`.
#[no_mangle]
pub unsafe extern "C" fn unregister_kretprobe(rp: *mut kretprobe) -> c_int {
    if rp.is_null() {
        return fail(libc::EINVAL, &"kretprobe is NULL");
    }
    // SAFETY: `rp` is live.
    let e = unsafe { (*rp).ftprobe_private } as *const Kretprobe;
    if e.is_null() {
        return kerr(KprobeError::NotRegistered);
    }
    // SAFETY: set by `register_kretprobe` from a leaked Box, never freed.
    let e: &'static Kretprobe = unsafe { &*e };
    if let Err(err) = kp::unregister_kretprobe(e) {
        return kerr(err);
    }
    // SAFETY: `rp` is live.
    unsafe {
        (*rp).nmissed = e.nmissed().min(c_int::MAX as u64) as c_int;
        sync_out(std::ptr::addr_of_mut!((*rp).kp), &e.kp);
        if !(*rp).kp.symbol_name.is_null() {
            (*rp).kp.addr = std::ptr::null_mut();
        }
    }
    0
}
