//! The function_graph tracer (kernel/trace/trace_functions_graph.c), engine side: a graph
//! user ([`FgraphOps`]) that writes one [`rtype::FGRAPH_ENT`]
//! record at each traced call's entry and one
//! [`rtype::FGRAPH_RET`] at its end (return, or the unwind,
//! longjmp or loss that ended it), into the thread's ring. The CLI prints ftrace's
//! function_graph layout from them.
//!
//! Records: [`crate::record`] (their layouts, and their decoder). `depth` is the tracer's
//! own: 0 for the outermost recorded call of the thread (the graph function with
//! [`GraphConfig::graph_function`]).
//!
//! Semantics of the kernel's controls:
//! - `set_ftrace_filter` / `set_ftrace_notrace`: which functions are hooked at all (the
//!   user's ftrace ops filter);
//! - `set_graph_function`: only calls made while one of these functions is on the thread's
//!   call chain are recorded; outside, calls are not even hooked;
//! - `set_graph_notrace`: these functions and everything they call are not recorded (the
//!   function itself is hooked, unrecorded, so that its callees see it);
//! - `max_graph_depth`: calls at depth >= N are not recorded (0: no limit).
//!
//! Per-call data words: `[flags, depth, calltime, 0]`, flags bit 0: recorded, bit 1: under a
//! `set_graph_notrace` function; calltime: 0, or for the thread's first recorded call the
//! time after ftprobe's one-time set-up (its duration starts there).

use std::sync::OnceLock;

use crate::ftrace::fgraph::{self, FgraphEnt, FgraphOps, FgraphRet, FGRAPH_DATA_WORDS};
use crate::ftrace::{self, FtraceError, PtRegs};
use crate::ring::SharedRings;
use crate::trace::{self, rtype};

const RECORDED: u64 = 1;
const NOTRACE: u64 = 2;

/// The tracer's controls (see the module docs).
#[derive(Clone, Debug, Default)]
pub struct GraphConfig {
    /// `set_ftrace_filter` patterns (none: every function with a site).
    pub filter: Vec<String>,
    /// `set_ftrace_notrace` patterns.
    pub notrace: Vec<String>,
    /// `set_graph_function` patterns.
    pub graph_function: Vec<String>,
    /// `set_graph_notrace` patterns.
    pub graph_notrace: Vec<String>,
    /// `max_graph_depth` (0: no limit).
    pub max_depth: u32,
}

/// The controls as the probe path reads them.
struct Active {
    /// Sorted function starts of `set_graph_function` (empty: no restriction).
    graph_function: Vec<u64>,
    /// Sorted function starts of `set_graph_notrace`.
    graph_notrace: Vec<u64>,
    max_depth: u32,
}

static ACTIVE: OnceLock<Active> = OnceLock::new();

/// The graph user; its filter is set by [`start`].
pub static GRAPH_OPS: FgraphOps = FgraphOps::new(graph_entry, graph_return);

/// Probe path: at a hooked call's entry.
unsafe fn graph_entry(
    ent: &FgraphEnt,
    gops: &FgraphOps,
    regs: &mut PtRegs,
    data: &mut [u64; FGRAPH_DATA_WORDS],
) -> bool {
    let Some(a) = ACTIVE.get() else { return false };
    let parent = fgraph::parent_data_of(ent.thread(), gops, regs_retp_hint(regs));
    let depth = match parent {
        Some(p) if p[0] & NOTRACE != 0 => return false,
        Some(p) => p[1] + 1,
        None => {
            if !a.graph_function.is_empty() && a.graph_function.binary_search(&ent.func).is_err() {
                return false;
            }
            0
        }
    };
    if a.max_depth != 0 && depth >= a.max_depth as u64 {
        return false;
    }
    if !a.graph_notrace.is_empty() && a.graph_notrace.binary_search(&ent.func).is_ok() {
        data[0] = NOTRACE;
        data[1] = depth;
        return true;
    }
    data[1] = depth;
    // The thread's first record claims its ring and faults in its first pages (tens of
    // microseconds): a one-time set-up of ftprobe's, not part of this call. Its duration
    // then starts after it (`data[2]`, the calltime that `graph_return` reports).
    let setup = matches!(
        ent.thread().ring.get(),
        crate::probe_state::ThreadRing::Unclaimed
    );
    let mut recorded = false;
    let mut start = 0;
    trace::with_ring_guarded_of(ent.thread(), |w| {
        // The shadow stack's calltime is the record's time: one clock read per event. On the
        // thread's first record, the time once its ring is claimed, which the return reports
        // too (`data[2]`): the entry and the return then agree on when the call began.
        let cpu = trace::cpu();
        let aux = crate::record::fgraph_ent_aux(cpu, depth as u32);
        if setup {
            // The time once the record's first word was stored: the ring's first page
            // faulted in, not charged to the call.
            recorded = w.write_with(rtype::FGRAPH_ENT, aux, 2, |b| {
                start = crate::ring::read_tsc();
                b[0].store(start, std::sync::atomic::Ordering::Relaxed);
                b[1].store(ent.func, std::sync::atomic::Ordering::Relaxed);
            });
        } else {
            start = ent.calltime;
            recorded = w.write_n_aux(rtype::FGRAPH_ENT, aux, [start, ent.func]);
        }
    });
    // A call whose entry was not recorded (ring full, a write in progress) is still hooked,
    // so that its callees see their depth, but records no exit either.
    data[0] = if recorded { RECORDED } else { 0 };
    if setup {
        data[2] = start;
    }
    true
}

/// The slot of the call being entered is not in `PtRegs`; any address at or below the
/// current stack pointer serves as "below every live caller" for [`fgraph::parent_data`].
#[inline(always)]
fn regs_retp_hint(_regs: &PtRegs) -> u64 {
    crate::probe_state::stack_pointer()
}

/// Probe path: at a hooked call's end.
unsafe fn graph_return(
    ret: &FgraphRet,
    _gops: &FgraphOps,
    _regs: &PtRegs,
    data: &[u64; FGRAPH_DATA_WORDS],
) {
    if data[0] & RECORDED == 0 {
        return;
    }
    let depth = data[1] as u32;
    trace::with_ring_guarded_of(ret.thread(), |w| {
        // Its rettime likewise.
        let cpu = trace::cpu();
        let aux = crate::record::fgraph_ret_aux(cpu, ret.exit, depth);
        // data[2]: the call's start taken after this thread's ring claim (its first record),
        // else the shadow stack's calltime.
        let calltime = if data[2] != 0 { data[2] } else { ret.calltime };
        w.write_n_aux(
            rtype::FGRAPH_RET,
            aux,
            [ret.rettime, ret.func, calltime, ret.retval],
        );
    });
}

/// Start the function_graph tracer. `rings` becomes the trace buffer if none is set yet.
/// As for [`crate::function_tracer::start`], filter and notrace patterns that match nothing
/// are returned as warnings (every filter pattern failing is an error); a
/// `set_graph_function` or `set_graph_notrace` pattern that matches nothing is an error.
/// Call once, after [`ftrace::init`].
pub fn start(
    rings: Option<SharedRings>,
    cfg: &GraphConfig,
) -> Result<Vec<FtraceError>, FtraceError> {
    if let Some(r) = rings {
        trace::set_buffer(r);
    }
    let ops = GRAPH_OPS.ops();
    let mut warnings = Vec::new();
    let mut set = 0;
    for f in &cfg.filter {
        match ftrace::ftrace_set_filter(ops, f, set == 0) {
            Ok(()) => set += 1,
            Err(e @ FtraceError::NoMatch(_)) => warnings.push(e),
            Err(e) => return Err(e),
        }
    }
    if !cfg.filter.is_empty() && set == 0 {
        return Err(warnings.pop().expect("every filter pattern failed"));
    }
    let mut set = 0;
    for n in &cfg.notrace {
        match ftrace::ftrace_set_notrace(ops, n, set == 0) {
            Ok(()) => set += 1,
            Err(e @ FtraceError::NoMatch(_)) => warnings.push(e),
            Err(e) => return Err(e),
        }
    }
    let active = Active {
        graph_function: if cfg.graph_function.is_empty() {
            Vec::new()
        } else {
            ftrace::select_functions(&cfg.graph_function)?
        },
        graph_notrace: if cfg.graph_notrace.is_empty() {
            Vec::new()
        } else {
            ftrace::select_functions(&cfg.graph_notrace)?
        },
        max_depth: cfg.max_depth,
    };
    let _ = ACTIVE.set(active);
    fgraph::register_ftrace_graph(&GRAPH_OPS)?;
    Ok(warnings)
}
