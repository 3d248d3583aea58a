//! kprobes on ftrace sites (arch/x86/kernel/kprobes/ftrace.c, `kprobe_ftrace_handler()`, and
//! `arm_kprobe_ftrace()` in kernel/kprobes.c).
//!
//! Two shared `ftrace_ops`, both SAVE_REGS: one for probes without a post_handler, one with
//! IPMODIFY for addresses where some enabled probe has a post_handler (the kernel's
//! `kprobe_ftrace_ops` and `kprobe_ipmodify_ops`). Each holds the armed addresses in its ip
//! filter; an ops is registered while it holds at least one address (an empty filter would
//! mean every function).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use super::{published, Kprobe};
use crate::arch::x86_64::nops::SITE_LEN;
use crate::ftrace::{
    self as ft, FtraceError, FtraceOps, PtRegs, FTRACE_OPS_FL_IPMODIFY, FTRACE_OPS_FL_SAVE_REGS,
};
use crate::probe_state::{self, Entry};

static KPROBE_FTRACE_OPS: FtraceOps =
    FtraceOps::new(kprobe_ftrace_handler, FTRACE_OPS_FL_SAVE_REGS);
static KPROBE_IPMODIFY_OPS: FtraceOps = FtraceOps::new(
    kprobe_ftrace_handler,
    FTRACE_OPS_FL_SAVE_REGS | FTRACE_OPS_FL_IPMODIFY,
);

/// Addresses each ops holds, under the kprobes table lock (this mutex only orders memory).
static ARMED: Mutex<[BTreeSet<u64>; 2]> = Mutex::new([BTreeSet::new(), BTreeSet::new()]);

fn ops(ipmodify: bool) -> &'static FtraceOps {
    if ipmodify {
        &KPROBE_IPMODIFY_OPS
    } else {
        &KPROBE_FTRACE_OPS
    }
}

/// Probe path: whether the probes at an address need the IPMODIFY ops.
fn wants_ipmodify(probes: &[&Kprobe]) -> bool {
    probes
        .iter()
        .any(|p| !p.is_disabled() && p.post_handler.is_some())
}

/// Make ftrace's state for `addr` match the probes registered there: in no ops when none is
/// enabled, else in the IPMODIFY ops iff one has a post_handler. On error nothing changed.
pub(super) fn arm(
    probes: &BTreeMap<u64, Vec<&'static Kprobe>>,
    addr: u64,
) -> Result<(), FtraceError> {
    let here = probes.get(&addr).map(Vec::as_slice).unwrap_or(&[]);
    let want = if here.iter().any(|p| !p.is_disabled()) {
        Some(wants_ipmodify(here))
    } else {
        None
    };
    let mut armed = ARMED.lock().unwrap_or_else(|e| e.into_inner());
    let have = (0..2).find(|&i| armed[i].contains(&addr)).map(|i| i == 1);
    if want == have {
        return Ok(());
    }
    // Add to the new ops first: if that fails, nothing changed. While the site is in both
    // ops, each handler only serves the probes that belong to it (see the handler).
    if let Some(ipm) = want {
        add(&mut armed[ipm as usize], ops(ipm), addr)?;
    }
    if let Some(ipm) = have {
        remove(&mut armed[ipm as usize], ops(ipm), addr)?;
    }
    Ok(())
}

/// Forget the addresses in `ranges` (unloaded objects): ftrace already dropped them from
/// the ops' filters and unregistered an ops left without any (`ft::unload_objects`).
pub(super) fn forget(ranges: &[(u64, u64)]) {
    let mut armed = ARMED.lock().unwrap_or_else(|e| e.into_inner());
    for set in armed.iter_mut() {
        set.retain(|a| !ranges.iter().any(|&(lo, hi)| *a >= lo && *a < hi));
    }
}

fn add(set: &mut BTreeSet<u64>, ops: &'static FtraceOps, addr: u64) -> Result<(), FtraceError> {
    ft::ftrace_set_filter_ip(ops, addr, false, false)?;
    if set.is_empty() {
        if let Err(e) = ft::register_ftrace_function(ops) {
            ft::ftrace_set_filter_ip(ops, addr, true, false)?;
            return Err(e);
        }
    }
    set.insert(addr);
    Ok(())
}

fn remove(set: &mut BTreeSet<u64>, ops: &'static FtraceOps, addr: u64) -> Result<(), FtraceError> {
    if set.len() == 1 {
        ft::unregister_ftrace_function(ops)?;
    }
    ft::ftrace_set_filter_ip(ops, addr, true, false)?;
    set.remove(&addr);
    Ok(())
}

/// Probe path: the ftrace callback of both ops (`kprobe_ftrace_handler()`).
///
/// - not the ops these probes belong to (mid-move between ops): nothing;
/// - a kprobe already running on this thread (e.g. a handler called the probed function):
///   `nmissed += 1` on each enabled probe, nothing else;
/// - else `regs.ip = addr + 1` while the pre_handlers run (as after an int3), in registration
///   order, stopping at the first that returns non-zero (it changed `regs.ip`, which is kept);
///   otherwise, if any has a post_handler, `regs.ip = addr + 5` while they run; then the
///   original `regs.ip` (the return address of the site's call) is restored.
unsafe extern "C" fn kprobe_ftrace_handler(
    ip: u64,
    _parent_ip: u64,
    op: &FtraceOps,
    regs: &mut PtRegs,
) {
    let Some(probes) = published().and_then(|l| l.get(ip)) else {
        return;
    };
    let is_ipmodify_ops = op.flags & FTRACE_OPS_FL_IPMODIFY != 0;
    if wants_ipmodify(probes) != is_ipmodify_ops {
        return;
    }
    let t = probe_state::this_thread();
    let sp = probe_state::stack_pointer();
    let _ = t.enter(Entry::Here(sp));
    if !t.kprobe.get().is_null() {
        for p in probes.iter().filter(|p| !p.is_disabled()) {
            p.note_missed();
        }
        return;
    }
    t.kprobe_sp.set(sp);
    let orig_ip = regs.ip;
    regs.ip = ip + 1;
    let mut ip_changed = false;
    for p in probes.iter().filter(|p| !p.is_disabled()) {
        t.kprobe.set(*p as *const Kprobe);
        if let Some(pre) = p.pre_handler {
            if pre(p, regs) != 0 {
                ip_changed = true;
                break;
            }
        }
    }
    if !ip_changed {
        if is_ipmodify_ops {
            regs.ip = ip + SITE_LEN;
            for p in probes.iter().filter(|p| !p.is_disabled()) {
                if let Some(post) = p.post_handler {
                    t.kprobe.set(*p as *const Kprobe);
                    post(p, regs, 0);
                }
            }
        }
        regs.ip = orig_ip;
    }
    t.kprobe.set(std::ptr::null());
    t.kprobe_sp.set(0);
}
