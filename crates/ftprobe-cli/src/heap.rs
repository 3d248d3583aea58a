//! The CLI's heap, counted when `FTPROBE_TEST_HEAP=1` (read first thing in `main`): bytes in
//! use and their high-water mark, for tests of what the CLI keeps per thread. Unlike the
//! process's peak RSS, these do not depend on how far the CLI fell behind the program (what
//! piles up then is bounded by design, e.g. `record`'s streams kept in memory, and freed as
//! it catches up; glibc may keep the pages), so the tests that compare runs can be exact
//! whatever else the machine is doing. Off, an allocation pays one relaxed load.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering::Relaxed};

/// The system allocator, counting while [`ON`].
pub struct Counting;

static ON: AtomicBool = AtomicBool::new(false);
/// Bytes allocated minus bytes freed since counting started (signed: a block allocated
/// before may be freed after).
static IN_USE: AtomicIsize = AtomicIsize::new(0);
/// The most [`IN_USE`] was since the last [`reset_peak`].
static PEAK: AtomicIsize = AtomicIsize::new(0);

fn add(n: isize) {
    let now = IN_USE.fetch_add(n, Relaxed) + n;
    PEAK.fetch_max(now, Relaxed);
}

// SAFETY: every call is forwarded unchanged to `System`, which upholds GlobalAlloc's
// contract; the counting touches only atomics (no allocation, no lock).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: the caller's layout contract is System's.
        let p = unsafe { System.alloc(l) };
        if !p.is_null() && ON.load(Relaxed) {
            add(l.size() as isize);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        // SAFETY: as in `alloc`.
        let p = unsafe { System.alloc_zeroed(l) };
        if !p.is_null() && ON.load(Relaxed) {
            add(l.size() as isize);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: p came from System with layout l (every allocation here goes to System).
        unsafe { System.dealloc(p, l) };
        if ON.load(Relaxed) {
            add(-(l.size() as isize));
        }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: p came from System with layout l; the caller's contract for new_size.
        let q = unsafe { System.realloc(p, l, new_size) };
        if !q.is_null() && ON.load(Relaxed) {
            add(new_size as isize - l.size() as isize);
        }
        q
    }
}

/// Start counting if `FTPROBE_TEST_HEAP=1` (first thing in `main`).
pub fn init_from_env() {
    if std::env::var_os("FTPROBE_TEST_HEAP").is_some_and(|v| v == "1") {
        ON.store(true, Relaxed);
    }
}

/// Whether the heap is counted.
pub fn counting() -> bool {
    ON.load(Relaxed)
}

/// Bytes in use now (since counting started).
pub fn in_use() -> isize {
    IN_USE.load(Relaxed)
}

/// The high-water mark since the last [`reset_peak`] (or the start).
pub fn peak() -> isize {
    PEAK.load(Relaxed)
}

/// Start a new high-water mark from the bytes in use now.
pub fn reset_peak() {
    PEAK.store(IN_USE.load(Relaxed), Relaxed);
}
