//! kprobes on ftrace sites (arch/x86/kernel/kprobes/ftrace.c, `kprobe_ftrace_handler()`, and
//! `arm_kprobe_ftrace()` in kernel/kprobes.c).
//!
//! Two shared `ftrace_ops`, both SAVE_REGS: one for probes without a post_handler, one with
//! IPMODIFY for addresses where some enabled probe has a post_handler (the kernel's
//! `kprobe_ftrace_ops` and `kprobe_ipmodify_ops`). Each holds the armed addresses in its ip
//! filter; an ops is registered while it holds at least one address (an empty filter would
//! mean every function).
//!
//! Per-site trampolines: an address with exactly one enabled probe also gets a per-site
//! callback on its ops (`ftrace_set_direct_ip`) whose data is the probe itself. While that ops
//! is the site's only user, the site calls a trampoline of its own that hands the probe to
//! [`kprobe_ftrace_direct`]: no lookup of the address in the published probe list. Several
//! enabled probes, or another ops on the same site (the function tracer, a user's ops),
//! fall back to the shared path, [`kprobe_ftrace_handler`] looking the probes up by address;
//! switching between the two is a retarget of the site's call, live, in one `text_poke`
//! batch. The per-site callback is [`run_probes`] written for one probe: the same semantics.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use super::{published, Kprobe};
use crate::arch::x86_64::nops::SITE_LEN;
use crate::ftrace::{
    self as ft, FtraceDirectFunc, FtraceError, FtraceOps, PtRegs, FTRACE_OPS_FL_IPMODIFY,
    FTRACE_OPS_FL_SAVE_REGS,
};
use crate::probe_state::{self, Entry};

static KPROBE_FTRACE_OPS: FtraceOps =
    FtraceOps::new(kprobe_ftrace_handler, FTRACE_OPS_FL_SAVE_REGS);
static KPROBE_IPMODIFY_OPS: FtraceOps = FtraceOps::new(
    kprobe_ftrace_handler,
    FTRACE_OPS_FL_SAVE_REGS | FTRACE_OPS_FL_IPMODIFY,
);

/// What ftrace holds for kprobes, under the kprobes table lock (this mutex only orders
/// memory): per ops (index 1 is the IPMODIFY one), the addresses in its filter and the
/// per-site callbacks set on it (address -> the probe it carries).
struct Armed {
    ips: [BTreeSet<u64>; 2],
    direct: [BTreeMap<u64, usize>; 2],
}

/// Whether a site with one enabled probe gets a per-site trampoline ([`set_per_site`]).
static PER_SITE: AtomicBool = AtomicBool::new(true);

/// Turn per-site trampolines on or off (on by default) and re-arm every site address in
/// `probes` accordingly (the kernel's `debug.kprobes-optimization` sysctl plays this role for
/// optprobes). For comparisons (benchmarks) and tests: the shared path alone is what every
/// site used before per-site trampolines.
pub(super) fn set_per_site(
    probes: &BTreeMap<u64, Vec<&'static Kprobe>>,
    on: bool,
) -> Result<(), FtraceError> {
    PER_SITE.store(on, Ordering::Relaxed);
    let sites: Vec<u64> = {
        let armed = ARMED.lock().unwrap_or_else(|e| e.into_inner());
        armed.ips.iter().flatten().copied().collect()
    };
    for addr in sites {
        arm(probes, addr)?;
    }
    Ok(())
}

static ARMED: Mutex<Armed> = Mutex::new(Armed {
    ips: [BTreeSet::new(), BTreeSet::new()],
    direct: [BTreeMap::new(), BTreeMap::new()],
});

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
/// enabled, else in the IPMODIFY ops iff one has a post_handler; with a per-site trampoline
/// carrying the probe iff exactly one is enabled. On error nothing the probe path can see
/// changed.
pub(super) fn arm(
    probes: &BTreeMap<u64, Vec<&'static Kprobe>>,
    addr: u64,
) -> Result<(), FtraceError> {
    let here = probes.get(&addr).map(Vec::as_slice).unwrap_or(&[]);
    let mut enabled = here.iter().filter(|p| !p.is_disabled());
    let want = if here.iter().any(|p| !p.is_disabled()) {
        Some(wants_ipmodify(here))
    } else {
        None
    };
    let want_direct = match (enabled.next(), enabled.next()) {
        (Some(p), None) if PER_SITE.load(Ordering::Relaxed) => Some(*p as *const Kprobe as usize),
        _ => None,
    };
    let mut armed = ARMED.lock().unwrap_or_else(|e| e.into_inner());
    let have = (0..2)
        .find(|&i| armed.ips[i].contains(&addr))
        .map(|i| i == 1);
    // 1. The per-site callback on the ops the site goes to: while the site is in that ops
    // alone, this retargets its call between the shared and its own trampoline.
    if let Some(ipm) = want {
        let i = ipm as usize;
        if armed.direct[i].get(&addr).copied() != want_direct {
            set_direct(ops(ipm), addr, want_direct)?;
            match want_direct {
                Some(p) => armed.direct[i].insert(addr, p),
                None => armed.direct[i].remove(&addr),
            };
        }
    }
    // 2. Move between ops. Add to the new ops first: if that fails, the site is as it was.
    // While the site is in both ops, it calls the list function, and each handler only
    // serves the probes that belong to it (see the handler).
    if want != have {
        if let Some(ipm) = want {
            add(&mut armed.ips[ipm as usize], ops(ipm), addr)?;
        }
        if let Some(ipm) = have {
            remove(&mut armed.ips[ipm as usize], ops(ipm), addr)?;
        }
    }
    // 3. The ops the site left keeps no per-site callback for it (unused while the site is
    // not in its filter: nothing is patched).
    for ipm in [false, true] {
        if want != Some(ipm) && armed.direct[ipm as usize].contains_key(&addr) {
            set_direct(ops(ipm), addr, None)?;
            armed.direct[ipm as usize].remove(&addr);
        }
    }
    Ok(())
}

/// Forget the addresses in `ranges` (unloaded objects): ftrace already dropped them from
/// the ops' filters and per-site callbacks and unregistered an ops left without any
/// (`ft::unload_objects`).
pub(super) fn forget(ranges: &[(u64, u64)]) {
    let mut armed = ARMED.lock().unwrap_or_else(|e| e.into_inner());
    let gone = |a: u64| ranges.iter().any(|&(lo, hi)| a >= lo && a < hi);
    for set in armed.ips.iter_mut() {
        set.retain(|a| !gone(*a));
    }
    for map in armed.direct.iter_mut() {
        map.retain(|a, _| !gone(*a));
    }
}

fn set_direct(ops: &'static FtraceOps, addr: u64, probe: Option<usize>) -> Result<(), FtraceError> {
    ft::ftrace_set_direct_ip(
        ops,
        addr,
        probe.map(|p| (p as *const (), kprobe_ftrace_direct as FtraceDirectFunc)),
    )
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

/// Probe path: the ftrace callback of both ops on the shared path (`kprobe_ftrace_handler()`):
/// finds the probes at `ip` in the published list; when they are not the ops' (mid-move
/// between ops, see [`arm`]) it does nothing, else [`run_probes`].
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
    run_probes(ip, probes, is_ipmodify_ops, regs);
}

/// Probe path: the per-site callback of a site with one enabled probe, `data` that probe
/// (set by [`arm`]): [`run_probes`] for that probe alone, written for one probe (one load
/// of its flags, no loops). Its ops is the IPMODIFY one iff the probe has a post_handler
/// (`wants_ipmodify` of a single enabled probe), so the post_handler runs iff it has one.
unsafe extern "C" fn kprobe_ftrace_direct(
    ip: u64,
    _parent_ip: u64,
    data: *const (),
    regs: &mut PtRegs,
) {
    // SAFETY: `arm` sets the data of a per-site callback to a registered probe, which is
    // `&'static` (registration takes `&'static Kprobe`).
    let p: &'static Kprobe = unsafe { &*(data as *const Kprobe) };
    let t = probe_state::this_thread();
    let sp = probe_state::stack_pointer();
    let _ = t.enter(Entry::Here(sp));
    if p.is_disabled() {
        return;
    }
    let running = t.kprobe.get();
    if !running.is_null() {
        // The engine's own work (`KprobeBusy`) is not the program's: not counted at all.
        if running != probe_state::KPROBE_BUSY {
            p.note_missed();
        }
        return;
    }
    t.kprobe_sp.set(sp);
    t.kprobe.set(p as *const Kprobe);
    let orig_ip = regs.ip;
    regs.ip = ip + 1;
    let ip_changed = match p.pre_handler {
        Some(pre) => pre(p, regs) != 0,
        None => false,
    };
    if !ip_changed {
        if let Some(post) = p.post_handler {
            regs.ip = ip + SITE_LEN;
            post(p, regs, 0);
        }
        regs.ip = orig_ip;
    }
    t.kprobe.set(std::ptr::null());
    t.kprobe_sp.set(0);
}

/// Probe path: the kprobes at `ip` (`kprobe_ftrace_handler()`'s body):
///
/// - a kprobe already running on this thread (e.g. a handler called the probed function):
///   `nmissed += 1` on each enabled probe, nothing else;
/// - else `regs.ip = addr + 1` while the pre_handlers run (as after an int3), in registration
///   order, stopping at the first that returns non-zero (it changed `regs.ip`, which is kept);
///   otherwise, if the ops is the IPMODIFY one, `regs.ip = addr + 5` while the post_handlers
///   run; then the original `regs.ip` (the return address of the site's call) is restored.
///
/// Disabled probes are skipped. [`kprobe_ftrace_direct`] is this for one probe: keep them
/// in step.
#[inline(always)]
fn run_probes(ip: u64, probes: &[&'static Kprobe], is_ipmodify_ops: bool, regs: &mut PtRegs) {
    let Some(t) = super::hit_begin(probes) else {
        return;
    };
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
