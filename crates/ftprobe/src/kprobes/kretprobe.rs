//! kretprobes (kernel/kprobes.c, `register_kretprobe()`, `pre_handler_kretprobe()`): a kprobe
//! on a function's entry whose pre_handler hooks the call's return on the thread's fgraph
//! shadow stack ([`crate::ftrace::fgraph`]), shared with the function_graph tracer.
//!
//! - The entry probe is an ordinary kprobe: through ftrace on a site (`func+0` maps to the
//!   site, as for `p` probes), an int3 probe otherwise (a function of any object).
//! - `entry_handler(ri, regs)` runs at entry with the instance's data words zeroed; a
//!   non-zero return drops the instance (no `handler` for this call), as in the kernel.
//! - `handler(ri, regs)` runs when the function returns: `regs.rax`/`regs.rdx` are the
//!   return value, `regs.sp` the stack pointer after the return, `regs.ip` and
//!   `ri.ret_addr` where it returns to. A call that never returns (its frame unwound by an
//!   exception, left by `longjmp`) gets no `handler`, as a kernel kretprobe instance that is
//!   recycled.
//! - `maxactive`: instances alive at once (0: the kernel's default, `max(10, 2 * CPUs)`);
//!   a call beyond that is not hooked and counts in [`Kretprobe::nmissed`], as in the
//!   kernel. So does a call the shadow stack has no room for.
//! - Only function entries: a target with an offset, or an address that is not a
//!   function's start, is refused (the kernel's -EINVAL, `BAD_RETPROBE` in `error_log`).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::{register_kprobe, unregister_kprobe, Kprobe, KprobeError, KprobeTarget};
use crate::arch::x86_64::sites::SitePlace;
use crate::ftrace::fgraph::{self, FgraphEnt, FgraphExit, FgraphOps, FgraphRet, FGRAPH_DATA_WORDS};
use crate::ftrace::{self as ft, PtRegs};

/// `handler(ri, regs)`, at the function's return.
pub type KretprobeHandler = fn(ri: &KretprobeInstance, regs: &PtRegs) -> i32;
/// `entry_handler(ri, regs)`, at its entry; non-zero: this call is not hooked.
pub type KretprobeEntryHandler = fn(ri: &mut KretprobeInstance, regs: &mut PtRegs) -> i32;

/// One hooked call (`struct kretprobe_instance`).
pub struct KretprobeInstance {
    /// The kretprobe.
    pub rp: &'static Kretprobe,
    /// The probed function (the address probed: its site, or its first byte).
    pub func: u64,
    /// Where the call returns to (0 in the entry handler, which runs before it is known).
    pub ret_addr: u64,
    /// Per-instance data: what the entry handler leaves for the handler.
    pub data: [u64; FGRAPH_DATA_WORDS],
}

/// A return probe (`struct kretprobe`). Made in a `static`, or leaked: registration needs
/// `&'static`.
pub struct Kretprobe {
    /// The entry probe: its target is the function (offset 0).
    pub kp: Kprobe,
    /// At return.
    pub handler: Option<KretprobeHandler>,
    /// At entry.
    pub entry_handler: Option<KretprobeEntryHandler>,
    /// Instances alive at once; 0: the default.
    pub maxactive: u32,
    /// For the handlers' own use.
    pub data: AtomicU64,
    gops: FgraphOps,
    active: AtomicU32,
    limit: AtomicU32,
}

impl Kretprobe {
    /// A return probe on `target`, not yet registered.
    pub const fn new(
        target: KprobeTarget,
        handler: Option<KretprobeHandler>,
        entry_handler: Option<KretprobeEntryHandler>,
        maxactive: u32,
    ) -> Kretprobe {
        Kretprobe {
            kp: Kprobe::new(target, Some(pre_handler_kretprobe), None),
            handler,
            entry_handler,
            maxactive,
            data: AtomicU64::new(0),
            gops: FgraphOps::new(kretprobe_entry, kretprobe_return),
            active: AtomicU32::new(0),
            limit: AtomicU32::new(0),
        }
    }

    /// Also count the calls the shadow stack had no room for in `counter` from now on (as
    /// [`Kprobe::count_nmissed_in`] counts the entry probe's misses).
    pub fn count_overrun_in(&self, counter: &'static AtomicU64) {
        self.gops.count_overrun_in(counter);
    }

    /// Calls not hooked: more than `maxactive` alive or a probe already running on the
    /// thread (both counted in the entry probe's `nmissed`, as the kernel adds them up), or
    /// no room on the thread's shadow stack.
    pub fn nmissed(&self) -> u64 {
        self.kp.nmissed() + self.gops.overrun()
    }

    /// Instances alive now.
    pub fn active(&self) -> u32 {
        self.active.load(Ordering::Relaxed)
    }

    /// The `maxactive` in force (the default worked out).
    pub fn maxactive_in_force(&self) -> u32 {
        self.limit.load(Ordering::Relaxed)
    }
}

/// The kernel's default `maxactive` (`max(10, 2 * num_possible_cpus())`).
fn default_maxactive() -> u32 {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    (2 * cpus).max(10)
}

/// Register a return probe (`register_kretprobe()`). On error nothing is armed.
pub fn register_kretprobe(rp: &'static Kretprobe) -> Result<(), KprobeError> {
    let _busy = crate::probe_state::KprobeBusy::begin();
    if let KprobeTarget::Symbol { offset, .. } = &rp.kp.target {
        if *offset != 0 {
            return Err(KprobeError::NotFunctionEntry(format!(
                "{:?}+{offset:#x}",
                rp.kp.target
            )));
        }
    }
    let r = super::resolve(&rp.kp.target)?;
    // func+0, or the site func+0 maps to (after ENDBR).
    let entry_ok = r.addr == r.func.addr || (r.ftrace && r.addr == r.func.addr + 4);
    if !entry_ok {
        return Err(KprobeError::NotFunctionEntry(format!("{:#x}", r.addr)));
    }
    let limit = if rp.maxactive == 0 {
        default_maxactive()
    } else {
        rp.maxactive
    };
    rp.limit.store(limit, Ordering::Relaxed);
    rp.gops
        .private
        .store(rp as *const Kretprobe as u64, Ordering::Relaxed);
    rp.kp
        .data
        .store(rp as *const Kretprobe as u64, Ordering::Relaxed);
    fgraph::register_fgraph_user(&rp.gops).map_err(KprobeError::Ftrace)?;
    rp.kp
        .flags
        .fetch_or(super::KPROBE_FLAG_KRETPROBE, Ordering::Relaxed);
    if let Err(e) = register_kprobe(&rp.kp) {
        let _ = fgraph::unregister_ftrace_graph(&rp.gops);
        return Err(e);
    }
    Ok(())
}

/// Disarm a return probe (`unregister_kretprobe()`). Calls already hooked still return
/// through the shadow stack; their handler no longer runs.
pub fn unregister_kretprobe(rp: &'static Kretprobe) -> Result<(), KprobeError> {
    let _busy = crate::probe_state::KprobeBusy::begin();
    unregister_kprobe(&rp.kp)?;
    fgraph::unregister_ftrace_graph(&rp.gops).map_err(KprobeError::Ftrace)
}

/// Probe path: the entry probe's pre_handler.
fn pre_handler_kretprobe(p: &Kprobe, regs: &mut PtRegs) -> i32 {
    // SAFETY: `data` holds the &'static Kretprobe this kprobe is the field of, set before
    // registration.
    let rp: &'static Kretprobe = unsafe { &*(p.data.load(Ordering::Relaxed) as *const Kretprobe) };
    let addr = p.addr();
    // The return address: at the top of the stack at a function's first instruction; at a
    // site after `push %r10` one word above.
    let retp = if p.flags() & super::KPROBE_FLAG_FTRACE != 0 {
        match ft::site_info(addr).map(|(_, place, _)| place) {
            Some(SitePlace::AfterPushR10) => regs.sp + 8,
            _ => regs.sp,
        }
    } else {
        regs.sp
    };
    // SAFETY: retp is the live return-address slot of the call being entered.
    unsafe { fgraph::function_graph_enter_user(&rp.gops, addr, retp as *mut u64, regs) };
    0
}

fn rp_of(gops: &FgraphOps) -> &'static Kretprobe {
    // SAFETY: `private` holds the &'static Kretprobe this FgraphOps is the field of, set
    // before it was registered.
    unsafe { &*(gops.private.load(Ordering::Relaxed) as *const Kretprobe) }
}

/// Probe path: the graph user's entry callback.
unsafe fn kretprobe_entry(
    ent: &FgraphEnt,
    gops: &FgraphOps,
    regs: &mut PtRegs,
    data: &mut [u64; FGRAPH_DATA_WORDS],
) -> bool {
    let rp = rp_of(gops);
    if rp.active.fetch_add(1, Ordering::Relaxed) >= rp.limit.load(Ordering::Relaxed) {
        rp.active.fetch_sub(1, Ordering::Relaxed);
        rp.kp.note_missed();
        return false;
    }
    if let Some(h) = rp.entry_handler {
        let mut ri = KretprobeInstance {
            rp,
            func: ent.func,
            ret_addr: 0,
            data: [0; FGRAPH_DATA_WORDS],
        };
        if h(&mut ri, regs) != 0 {
            rp.active.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        *data = ri.data;
    }
    true
}

/// Probe path: the graph user's return callback.
unsafe fn kretprobe_return(
    ret: &FgraphRet,
    gops: &FgraphOps,
    regs: &PtRegs,
    data: &[u64; FGRAPH_DATA_WORDS],
) {
    let rp = rp_of(gops);
    rp.active.fetch_sub(1, Ordering::Relaxed);
    if ret.exit != FgraphExit::Returned {
        return;
    }
    if let Some(h) = rp.handler {
        // A tail-called function's own return address is the trampoline (it returns for
        // the function that jumped to it): the real one is that caller's.
        let ret_addr = fgraph::ftrace_graph_ret_addr(ret.ret, ret.retp as *const u64);
        let ri = KretprobeInstance {
            rp,
            func: ret.func,
            ret_addr,
            data: *data,
        };
        h(&ri, regs);
    }
}
