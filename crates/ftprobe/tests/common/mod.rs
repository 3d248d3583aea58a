//! A global allocator that counts allocations (blazesym `tests/allocs.rs` idea).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

static ALLOCS: AtomicU64 = AtomicU64::new(0);

/// Counts every allocation, then forwards to the system allocator.
pub struct CountingAlloc;

// SAFETY: forwards every call unchanged to System, which upholds GlobalAlloc's contract.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same layout contract as our caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: p was allocated by System.alloc with l.
        unsafe { System.dealloc(p, l) }
    }
}

/// Allocations so far, all threads.
pub fn allocations() -> u64 {
    ALLOCS.load(Ordering::Relaxed)
}
