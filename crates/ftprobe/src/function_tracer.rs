//! The function tracer (kernel/trace/trace_functions.c): an [`FtraceOps`] whose callback
//! writes one record per hit into the calling thread's ring.
//!
//! Record [`RTYPE_FUNC`], 4 words: header (with the CPU in its `aux` bits), raw TSC, `ip` (the
//! site), `parent_ip`. A thread claims its ring on its first hit (two raw syscalls: `gettid`,
//! `prctl(PR_GET_NAME)`); when no ring is free its hits are counted in the header's
//! `lost_no_ring`. Everything here is on the probe path: no allocation, no lock.

use std::cell::Cell;
use std::sync::OnceLock;

use crate::ftrace::{self, FtraceError, FtraceOps, PtRegs, FTRACE_OPS_FL_RECURSION};
use crate::ring::{self, RingWriter, SharedRings};
use crate::sys;

/// Record type of a function entry.
pub const RTYPE_FUNC: u16 = 1;

static RINGS: OnceLock<SharedRings> = OnceLock::new();

#[derive(Clone, Copy)]
enum ThreadRing {
    Unclaimed,
    Claimed(RingWriter<'static>),
    NoneFree,
}

thread_local! {
    /// Const-initialized, no destructor: no allocation on first touch.
    static RING: Cell<ThreadRing> = const { Cell::new(ThreadRing::Unclaimed) };
}

/// The ops; its filters are set by [`start`]. RECURSION: a traced function called from the
/// ring code itself is not recorded twice.
pub static FUNCTION_OPS: FtraceOps = FtraceOps::new(function_trace_call, FTRACE_OPS_FL_RECURSION);

/// Probe path: this thread's ring, claimed on first use.
#[inline]
fn this_thread_ring() -> Option<RingWriter<'static>> {
    match RING.get() {
        ThreadRing::Claimed(w) => Some(w),
        ThreadRing::NoneFree => None,
        ThreadRing::Unclaimed => {
            let rings = RINGS.get()?;
            let state = match rings.claim(sys::gettid(), sys::thread_comm()) {
                Some(w) => ThreadRing::Claimed(w),
                None => ThreadRing::NoneFree,
            };
            RING.set(state);
            match state {
                ThreadRing::Claimed(w) => Some(w),
                _ => None,
            }
        }
    }
}

/// Probe path: the callback.
unsafe extern "C" fn function_trace_call(
    ip: u64,
    parent_ip: u64,
    _op: &FtraceOps,
    _regs: &mut PtRegs,
) {
    let (tsc, cpu) = ring::read_tsc_cpu();
    match this_thread_ring() {
        Some(w) => {
            w.write3_aux(RTYPE_FUNC, cpu, tsc, ip, parent_ip);
        }
        None => {
            if let Some(r) = RINGS.get() {
                r.note_lost_no_ring();
            }
        }
    }
}

/// After `fork`, the child's only thread must not write into its parent's ring (one producer
/// per ring): it claims a ring of its own on its next hit.
extern "C" fn forget_ring_in_child() {
    RING.set(ThreadRing::Unclaimed);
}

/// Start the function tracer: records go into `rings`; `filter` and `notrace` are
/// `set_ftrace_filter` patterns (see [`ftrace::glob`]); an empty filter traces every function.
/// Call once, after [`ftrace::init`].
pub fn start(rings: SharedRings, filter: &[String], notrace: &[String]) -> Result<(), FtraceError> {
    if RINGS.set(rings).is_err() {
        return Err(FtraceError::AlreadyRegistered);
    }
    // SAFETY: registers a plain extern "C" callback; pthread_atfork has no other contract.
    unsafe { libc::pthread_atfork(None, None, Some(forget_ring_in_child)) };
    for (i, f) in filter.iter().enumerate() {
        ftrace::ftrace_set_filter(&FUNCTION_OPS, f, i == 0)?;
    }
    for (i, n) in notrace.iter().enumerate() {
        ftrace::ftrace_set_notrace(&FUNCTION_OPS, n, i == 0)?;
    }
    ftrace::register_ftrace_function(&FUNCTION_OPS)
}
