//! Termination signals sent to `ftprobe` while its target runs (Ctrl-C, `kill`): recorded and
//! forwarded to the target, so that ftprobe keeps draining the rings until the target has
//! exited and nothing recorded is lost.

use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};

static PENDING: AtomicI32 = AtomicI32::new(0);
static RECEIVED: AtomicU32 = AtomicU32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    PENDING.store(sig, Ordering::Relaxed);
    RECEIVED.fetch_add(1, Ordering::Relaxed);
}

/// How many termination signals came so far (a second Ctrl-C stops the last print-out).
pub fn received() -> u32 {
    RECEIVED.load(Ordering::Relaxed)
}

/// Catch SIGINT, SIGTERM, SIGHUP and SIGQUIT from now on.
pub fn catch_termination() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    }
}

/// The last signal received since the previous call, if any.
pub fn take_pending() -> Option<i32> {
    match PENDING.swap(0, Ordering::Relaxed) {
        0 => None,
        s => Some(s),
    }
}
