//! The function tracer (kernel/trace/trace_functions.c): an [`FtraceOps`] whose callback
//! writes one record per hit into the calling thread's ring.
//!
//! Record [`RTYPE_FUNC`], 4 words: header (with the CPU in its `aux` bits), raw TSC, `ip` (the
//! site), `parent_ip`, into this thread's ring of the [`trace`] buffer. Everything here is on
//! the probe path: no allocation, no lock.

use crate::ftrace::{self, FtraceError, FtraceOps, PtRegs};
use crate::ring::SharedRings;
use crate::trace;

/// Record type of a function entry.
pub const RTYPE_FUNC: u16 = trace::rtype::FUNC;

/// The ops; its filters are set by [`start`]. It guards itself against recursion (a signal
/// handler that interrupts the callback and calls traced functions, or a traced function
/// called from the ring code) and counts what it drops in the buffer's `lost_recursion`, so
/// the CLI can report it. Through the list function (another ops on the same site) the list
/// function's guard drops instead and counts in [`FtraceOps::missed`], which the agent adds
/// to `lost_recursion` at exit.
pub static FUNCTION_OPS: FtraceOps = FtraceOps::new(function_trace_call, 0);

/// Probe path: the callback.
unsafe extern "C" fn function_trace_call(
    ip: u64,
    parent_ip: u64,
    _op: &FtraceOps,
    _regs: &mut PtRegs,
) {
    trace::with_ring_guarded(|w| {
        let (tsc, cpu) = trace::clock();
        w.write3_aux(RTYPE_FUNC, crate::record::func_aux(cpu), tsc, ip, parent_ip);
    });
}

/// Start the function tracer. `rings` becomes the trace buffer if none is set yet. `filter`
/// and `notrace` are `set_ftrace_filter` patterns (see [`ftrace::glob`]); no filter traces
/// every function. As when writing to the kernel's `set_ftrace_filter`, a pattern that
/// matches no function is refused alone and the others stay: such patterns are returned as
/// warnings. If every `filter` pattern was refused nothing is traced (an error), rather than
/// everything. Call once, after [`ftrace::init`].
pub fn start(
    rings: Option<SharedRings>,
    filter: &[String],
    notrace: &[String],
) -> Result<Vec<FtraceError>, FtraceError> {
    if let Some(r) = rings {
        trace::set_buffer(r);
    }
    let mut warnings = Vec::new();
    let mut set = 0;
    for f in filter {
        match ftrace::ftrace_set_filter(&FUNCTION_OPS, f, set == 0) {
            Ok(()) => set += 1,
            Err(e @ FtraceError::NoMatch(_)) => warnings.push(e),
            Err(e) => return Err(e),
        }
    }
    if !filter.is_empty() && set == 0 {
        return Err(warnings.pop().expect("every filter pattern failed"));
    }
    let mut set = 0;
    for n in notrace {
        match ftrace::ftrace_set_notrace(&FUNCTION_OPS, n, set == 0) {
            Ok(()) => set += 1,
            Err(e @ FtraceError::NoMatch(_)) => warnings.push(e),
            Err(e) => return Err(e),
        }
    }
    ftrace::register_ftrace_function(&FUNCTION_OPS)?;
    Ok(warnings)
}
