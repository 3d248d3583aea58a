//! The function tracer (kernel/trace/trace_functions.c): an [`FtraceOps`] whose callback
//! writes one record per hit into the calling thread's ring.
//!
//! Record [`RTYPE_FUNC`], 4 words: header (with the CPU in its `aux` bits), raw TSC, `ip` (the
//! site), `parent_ip`, into this thread's ring of the [`trace`] buffer. Everything here is on
//! the probe path: no allocation, no lock.

use crate::ftrace::{self, FtraceError, FtraceOps, PtRegs, FTRACE_OPS_FL_RECURSION};
use crate::ring::SharedRings;
use crate::trace;

/// Record type of a function entry.
pub const RTYPE_FUNC: u16 = trace::rtype::FUNC;

/// The ops; its filters are set by [`start`]. RECURSION: a traced function called from the
/// ring code itself is not recorded twice.
pub static FUNCTION_OPS: FtraceOps = FtraceOps::new(function_trace_call, FTRACE_OPS_FL_RECURSION);

/// Probe path: the callback.
unsafe extern "C" fn function_trace_call(
    ip: u64,
    parent_ip: u64,
    _op: &FtraceOps,
    _regs: &mut PtRegs,
) {
    let (tsc, cpu) = trace::clock();
    if let Some(w) = trace::this_thread_ring() {
        w.write3_aux(RTYPE_FUNC, cpu, tsc, ip, parent_ip);
    }
}

/// Start the function tracer: records go into `rings`; `filter` and `notrace` are
/// `set_ftrace_filter` patterns (see [`ftrace::glob`]); an empty filter traces every function.
/// Call once, after [`ftrace::init`]; `rings` becomes the trace buffer if none is set yet.
pub fn start(
    rings: Option<SharedRings>,
    filter: &[String],
    notrace: &[String],
) -> Result<(), FtraceError> {
    if let Some(r) = rings {
        trace::set_buffer(r);
    }
    for (i, f) in filter.iter().enumerate() {
        ftrace::ftrace_set_filter(&FUNCTION_OPS, f, i == 0)?;
    }
    for (i, n) in notrace.iter().enumerate() {
        ftrace::ftrace_set_notrace(&FUNCTION_OPS, n, i == 0)?;
    }
    ftrace::register_ftrace_function(&FUNCTION_OPS)
}
