//! The ring's probe path (`claim`, `write`, `write3`, `note_lost_no_ring`) must not allocate:
//! it runs in signal handlers and trampolines (DESIGN.md section 5, STYLE.md item 7). A counting
//! global allocator checks it; it needs a test binary of its own.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use ftprobe::ring::{read_tsc, RingConfig, SharedRings};

struct CountingAlloc;

thread_local! {
    /// Allocations made by this thread. Const-initialized: touching it does not allocate.
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards every call unchanged to `System`; the counter has no effect on memory.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

fn allocs() -> u64 {
    ALLOCS.with(Cell::get)
}

#[test]
fn probe_path_does_not_allocate() {
    let (rings, _fd) = SharedRings::create(RingConfig {
        nr_rings: 2,
        ring_bytes: 4096,
        budget_bytes: 0,
    })
    .expect("create");

    let before = allocs();
    let w = rings
        .claim(7, *b"probe\0\0\0\0\0\0\0\0\0\0\0")
        .expect("ring");
    let mut written = 0u32;
    // Through several wraps' worth of attempts, most of them dropped on a full ring.
    for i in 0..10_000u64 {
        written += u32::from(w.write(1, &[i, i + 1, i + 2, i + 3, i + 4]));
        written += u32::from(w.write3(2, read_tsc(), i, i));
        written += u32::from(w.write(3, &[]));
    }
    let _ = rings.claim(8, [0; 16]).expect("second ring");
    assert!(rings.claim(9, [0; 16]).is_none());
    let slot = rings.lost_slot(9);
    rings.note_lost_no_ring(slot);
    // Nested writers (a section and writes in it), a release.
    let level = w.begin();
    assert_eq!(level, 0);
    written += u32::from(w.in_section().write3(2, 0, 0, 0));
    w.commit();
    rings.release(w);
    let after = allocs();

    assert_eq!(after - before, 0, "the probe path allocated");
    assert!(written > 0);
    let r = rings.reader(0).expect("reader");
    assert_eq!(u64::from(written) + r.lost(), 30_001);
    assert_eq!(rings.lost_no_ring(), 1);
}
