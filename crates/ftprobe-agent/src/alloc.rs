//! The agent's own global allocator, over `mmap`: the agent never calls the program's
//! `malloc` (DESIGN.md section 5). A program may define its own allocator (8-byte-aligned
//! blocks, counting, hooks), and probes on `libc:malloc` must count the program's calls only.
//!
//! - Size classes: 16 to 128 bytes in steps of 16, then powers of two up to 64 KiB. Each class
//!   has a free list, refilled with a fresh 64 KiB (or 4-block) slab from `mmap`; blocks are
//!   never returned to the kernel. A block of a power-of-two class is aligned to its size (up
//!   to a page): slabs are page-aligned and carved at multiples of the block size.
//! - Larger blocks, or alignments above a page, get mappings of their own (`munmap`ed on free,
//!   `mremap`ed on realloc).
//! - Free lists are lock-free (Treiber) stacks whose head packs the block address with a
//!   generation tag, bumped by every push and pop (no ABA). No lock anywhere: an allocation
//!   from a signal handler that interrupted one on the same thread cannot deadlock, so the
//!   allocator is async-signal-safe (the probe path still allocates nothing).
//!
//! ```text
//! head (u64): | tag: 20 bits | block address >> 4: 44 bits |   (user addresses < 2^48)
//! free block: | next block address (usize) | ...                                   |
//! ```
//!
//! ~16,000 small allocations at start-up: a pop or push is one CAS; a refill is one `mmap`.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use ftprobe::sys::raw_map;

/// The agent's global allocator.
pub struct AgentAlloc;

#[global_allocator]
static AGENT_ALLOC: AgentAlloc = AgentAlloc;

const PAGE: usize = 4096;
/// Classes of 16, 32, ..., 128 bytes.
const SMALL_CLASSES: usize = 8;
const SMALL_MAX: usize = 128;
/// Then 256, 512, ..., 64 KiB.
const POW2_MIN_SHIFT: u32 = 8;
const POW2_MAX_SHIFT: u32 = 16;
const CLASSES: usize = SMALL_CLASSES + (POW2_MAX_SHIFT - POW2_MIN_SHIFT + 1) as usize;
/// Largest block served from a class; above, a mapping of its own.
const CLASS_MAX: usize = 1 << POW2_MAX_SHIFT;
/// Smallest slab mapped for a class.
const SLAB_MIN: usize = 64 << 10;

const ADDR_BITS: u32 = 44;
const ADDR_MASK: u64 = (1 << ADDR_BITS) - 1;

/// One free list per class; see the module docs for the head's layout.
static HEADS: [AtomicU64; CLASSES] = [const { AtomicU64::new(0) }; CLASSES];
/// Bytes mapped for slabs and for blocks of their own (statistics, for tests).
static MAPPED: AtomicUsize = AtomicUsize::new(0);

/// The class serving `layout`, or `None` for a mapping of its own.
fn class_of(layout: Layout) -> Option<usize> {
    let (size, align) = (layout.size().max(1), layout.align());
    if align > PAGE {
        return None;
    }
    if align <= 16 && size <= SMALL_MAX {
        return Some(size.div_ceil(16) - 1);
    }
    // A power of two at least as large as the alignment: blocks are aligned to their size.
    let p = size.max(align).next_power_of_two();
    if p <= SMALL_MAX {
        // 16, 32, 64 or 128: blocks at multiples of their size in a page-aligned slab.
        return Some(p / 16 - 1);
    }
    if p > CLASS_MAX {
        return None;
    }
    Some(SMALL_CLASSES + (p.trailing_zeros().max(POW2_MIN_SHIFT) - POW2_MIN_SHIFT) as usize)
}

/// Block size of class `c`.
fn class_size(c: usize) -> usize {
    if c < SMALL_CLASSES {
        (c + 1) * 16
    } else {
        1 << (POW2_MIN_SHIFT as usize + c - SMALL_CLASSES)
    }
}

/// A head word. `addr` may be garbage in `pop` (a link read from a block another thread
/// took meanwhile): masked, and the CAS that would publish it then fails on the tag.
fn pack(addr: usize, tag: u64) -> u64 {
    (tag << ADDR_BITS) | ((addr as u64 >> 4) & ADDR_MASK)
}

fn unpack(head: u64) -> (usize, u64) {
    (((head & ADDR_MASK) << 4) as usize, head >> ADDR_BITS)
}

/// The link word at the start of a free block.
///
/// # Safety
/// `block` is a block of a slab (mapped for good, 16-aligned, at least 16 bytes).
unsafe fn link<'a>(block: usize) -> &'a AtomicUsize {
    // SAFETY: the caller's contract: mapped, aligned for a usize, never unmapped. Reading it
    // while another thread owns the block (a pop that lost its race) reads some value and the
    // CAS then fails; the memory stays mapped.
    unsafe { &*(block as *const AtomicUsize) }
}

/// Push the chain `first..=last` (linked through their first words) onto class `c`.
///
/// # Safety
/// The blocks are free blocks of class `c` that nothing else references.
unsafe fn push_chain(c: usize, first: usize, last: usize) {
    debug_assert!(first % 16 == 0 && (first as u64 >> 4) <= ADDR_MASK);
    let head = &HEADS[c];
    // Relaxed: the Release CAS below publishes the link and the block's emptiness.
    let mut cur = head.load(Ordering::Relaxed);
    loop {
        let (top, tag) = unpack(cur);
        // SAFETY: `last` is ours until the CAS publishes it (the caller's contract).
        unsafe { link(last) }.store(top, Ordering::Relaxed);
        // Release pairs with the Acquire load/CAS in `pop`: a popper sees `last`'s link.
        match head.compare_exchange_weak(
            cur,
            pack(first, (tag + 1) & (u64::MAX >> ADDR_BITS)),
            Ordering::Release,
            Ordering::Relaxed,
        ) {
            Ok(_) => return,
            Err(now) => cur = now,
        }
    }
}

/// Pop a block of class `c`, or 0 when its list is empty.
fn pop(c: usize) -> usize {
    let head = &HEADS[c];
    // Acquire pairs with the Release CAS in `push_chain`.
    let mut cur = head.load(Ordering::Acquire);
    loop {
        let (top, tag) = unpack(cur);
        if top == 0 {
            return 0;
        }
        // SAFETY: `top` was pushed as a block of this class (slabs are never unmapped). If
        // another thread popped it meanwhile, the tag has changed and the CAS fails.
        let next = unsafe { link(top) }.load(Ordering::Relaxed);
        match head.compare_exchange_weak(
            cur,
            pack(next, (tag + 1) & (u64::MAX >> ADDR_BITS)),
            Ordering::Acquire,
            Ordering::Acquire,
        ) {
            Ok(_) => return top,
            Err(now) => cur = now,
        }
    }
}

/// Map a slab for class `c`, keep its first block and push the others. 0 when out of memory.
fn refill(c: usize) -> usize {
    let size = class_size(c);
    let slab_len = SLAB_MIN.max(4 * size);
    let Some(slab) = raw_map::map(slab_len) else {
        return 0;
    };
    MAPPED.fetch_add(slab_len, Ordering::Relaxed);
    let n = slab_len / size;
    for i in 1..n - 1 {
        let b = slab + i * size;
        // SAFETY: a block of the slab just mapped, which only this call knows.
        unsafe { link(b) }.store(b + size, Ordering::Relaxed);
    }
    // SAFETY: blocks 1..n of the new slab, linked above, known to nobody else.
    unsafe { push_chain(c, slab + size, slab + (n - 1) * size) };
    slab
}

/// Length of the mapping of a block of its own.
fn own_len(layout: Layout) -> usize {
    layout.size().max(1).next_multiple_of(PAGE)
}

/// A mapping of its own for `layout`, aligned as it asks; zeroed. Null when out of memory.
fn map_own(layout: Layout) -> *mut u8 {
    let len = own_len(layout);
    let align = layout.align();
    if align <= PAGE {
        let Some(p) = raw_map::map(len) else {
            return std::ptr::null_mut();
        };
        MAPPED.fetch_add(len, Ordering::Relaxed);
        return p as *mut u8;
    }
    // Over-allocate, then unmap the parts before and after the aligned range.
    let Some(total) = len.checked_add(align) else {
        return std::ptr::null_mut();
    };
    let Some(p) = raw_map::map(total) else {
        return std::ptr::null_mut();
    };
    let start = p.next_multiple_of(align);
    // SAFETY: both ranges are parts of the mapping just made, outside the range kept.
    unsafe {
        if start > p {
            raw_map::unmap(p, start - p);
        }
        let end = start + len;
        if p + total > end {
            raw_map::unmap(end, p + total - end);
        }
    }
    MAPPED.fetch_add(len, Ordering::Relaxed);
    start as *mut u8
}

// SAFETY: every block handed out is `layout.size()` bytes or more, aligned to
// `layout.align()` (module docs), and owned by one caller until it is given back; blocks of a
// class return to that class's list, which only ever holds free blocks.
unsafe impl GlobalAlloc for AgentAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match class_of(layout) {
            Some(c) => {
                let b = pop(c);
                let b = if b != 0 { b } else { refill(c) };
                b as *mut u8
            }
            None => map_own(layout),
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if class_of(layout).is_none() {
            // Fresh pages are zero.
            return map_own(layout);
        }
        // SAFETY: the caller's contract (a non-zero-size layout), forwarded.
        let p = unsafe { self.alloc(layout) };
        if !p.is_null() {
            // SAFETY: `p` is a block of at least `layout.size()` bytes, ours.
            unsafe { std::ptr::write_bytes(p, 0, layout.size()) };
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        match class_of(layout) {
            // SAFETY: the caller gives back a block `alloc` returned for this layout, so of
            // this class, and no longer uses it.
            Some(c) => unsafe { push_chain(c, ptr as usize, ptr as usize) },
            None => {
                // SAFETY: a mapping of its own made by `map_own` for this layout.
                unsafe { raw_map::unmap(ptr as usize, own_len(layout)) };
                MAPPED.fetch_sub(own_len(layout), Ordering::Relaxed);
            }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract: new_size rounded to the alignment does not overflow.
        let new = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        match (class_of(layout), class_of(new)) {
            (Some(a), Some(b)) if a == b => return ptr,
            (None, None) if layout.align() <= PAGE => {
                let (old_len, new_len) = (own_len(layout), own_len(new));
                if old_len == new_len {
                    return ptr;
                }
                // SAFETY: a mapping of its own (the caller's contract), moved as a whole.
                return match unsafe { raw_map::remap(ptr as usize, old_len, new_len) } {
                    Some(p) => {
                        MAPPED.fetch_add(new_len, Ordering::Relaxed);
                        MAPPED.fetch_sub(old_len, Ordering::Relaxed);
                        p as *mut u8
                    }
                    None => std::ptr::null_mut(),
                };
            }
            _ => {}
        }
        // SAFETY: `new` is a valid non-zero-size layout (the caller's contract).
        let p = unsafe { self.alloc(new) };
        if !p.is_null() {
            // SAFETY: both blocks hold at least the smaller size; they are distinct.
            unsafe { std::ptr::copy_nonoverlapping(ptr, p, layout.size().min(new_size)) };
            // SAFETY: the old block, given back once.
            unsafe { self.dealloc(ptr, layout) };
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(size: usize, align: usize) -> Layout {
        Layout::from_size_align(size, align).unwrap()
    }

    #[test]
    fn classes_fit_and_align() {
        for align in [1, 2, 4, 8, 16, 32, 64, 128, 256, 4096] {
            for size in (1..300).chain([511, 512, 513, 4095, 4096, 4097, 65535, 65536]) {
                let l = layout(size, align);
                if let Some(c) = class_of(l) {
                    let s = class_size(c);
                    assert!(s >= size, "{size}/{align}: class of {s}");
                    assert!(
                        s.is_power_of_two() && s >= align || align <= 16,
                        "{size}/{align}: class of {s}"
                    );
                }
            }
        }
        assert_eq!(class_of(layout(1, 1)), Some(0));
        assert_eq!(class_of(layout(128, 8)), Some(7));
        assert_eq!(class_of(layout(129, 8)), Some(8));
        assert_eq!(class_size(CLASSES - 1), CLASS_MAX);
        assert_eq!(class_of(layout(CLASS_MAX, 8)), Some(CLASSES - 1));
        assert_eq!(class_of(layout(CLASS_MAX + 1, 8)), None);
        assert_eq!(class_of(layout(8, 8192)), None);
    }

    #[test]
    fn blocks_are_aligned_and_distinct() {
        let a = AgentAlloc;
        for (size, align) in [
            (1, 1),
            (24, 8),
            (48, 16),
            (40, 32),
            (100, 64),
            (3000, 8),
            (5000, 4096),
            (70_000, 8),
            (10, 16384),
        ] {
            let l = layout(size, align);
            // SAFETY: non-zero-size layouts; every block is written within its size and
            // given back once with its layout.
            unsafe {
                let blocks: Vec<*mut u8> = (0..50).map(|_| a.alloc(l)).collect();
                for (i, &b) in blocks.iter().enumerate() {
                    assert!(!b.is_null());
                    assert_eq!(b as usize % align, 0, "{size}/{align}");
                    std::ptr::write_bytes(b, i as u8, size);
                }
                for (i, &b) in blocks.iter().enumerate() {
                    let s = std::slice::from_raw_parts(b, size);
                    assert!(s.iter().all(|&x| x == i as u8), "{size}/{align}: overlap");
                }
                for &b in &blocks {
                    a.dealloc(b, l);
                }
            }
        }
    }

    #[test]
    fn zeroed_and_realloc_keep_contents() {
        let a = AgentAlloc;
        // SAFETY: valid layouts; blocks used within their sizes and given back once.
        unsafe {
            let l = layout(64, 8);
            let p = a.alloc(l);
            std::ptr::write_bytes(p, 0xaa, 64);
            a.dealloc(p, l);
            let z = a.alloc_zeroed(l);
            assert!(std::slice::from_raw_parts(z, 64).iter().all(|&x| x == 0));
            let mut p = z;
            let mut size = 64;
            std::ptr::write_bytes(p, 7, size);
            // Through the classes, then into mappings of their own, and back down.
            for new in [100, 200, 5000, 60_000, 200_000, 1_000_000, 300, 20] {
                p = a.realloc(p, layout(size, 8), new);
                assert!(!p.is_null());
                let kept = size.min(new);
                assert!(std::slice::from_raw_parts(p, kept).iter().all(|&x| x == 7));
                std::ptr::write_bytes(p, 7, new);
                size = new;
            }
            a.dealloc(p, layout(size, 8));
            let big = layout(3 << 20, 8);
            let z = a.alloc_zeroed(big);
            assert!(std::slice::from_raw_parts(z, 3 << 20)
                .iter()
                .all(|&x| x == 0));
            a.dealloc(z, big);
        }
    }

    /// Several threads allocating and freeing the same classes at once: no block is handed
    /// out twice (each thread stamps its blocks and checks the stamps before freeing them).
    #[test]
    fn threads_share_the_free_lists() {
        let threads: Vec<_> = (0..4u8)
            .map(|t| {
                std::thread::spawn(move || {
                    let a = AgentAlloc;
                    for round in 0..200 {
                        let sizes = [16, 32, 48, 256, 1024];
                        // SAFETY: valid layouts; blocks used within their sizes, freed once.
                        unsafe {
                            let blocks: Vec<(*mut u8, Layout)> = (0..40)
                                .map(|i| {
                                    let l = layout(sizes[i % sizes.len()], 8);
                                    let p = a.alloc(l);
                                    std::ptr::write_bytes(p, t.wrapping_add(round as u8), l.size());
                                    (p, l)
                                })
                                .collect();
                            for &(p, l) in &blocks {
                                let s = std::slice::from_raw_parts(p, l.size());
                                assert!(s.iter().all(|&x| x == t.wrapping_add(round as u8)));
                                a.dealloc(p, l);
                            }
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }

    /// A signal handler that allocates while the interrupted code is inside the allocator on
    /// the same thread (where a lock would deadlock): a timer signal to this thread every
    /// 50 µs, each handler allocating and freeing blocks of the class the thread loops on.
    #[test]
    fn allocating_in_a_signal_handler_does_not_deadlock() {
        static IN_HANDLER: AtomicUsize = AtomicUsize::new(0);
        extern "C" fn on_timer(_: libc::c_int) {
            let a = AgentAlloc;
            let l = Layout::from_size_align(32, 8).unwrap();
            // SAFETY: a valid layout; the block is given back at once.
            unsafe {
                let p = a.alloc(l);
                assert!(!p.is_null());
                a.dealloc(p, l);
            }
            IN_HANDLER.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: installs a handler for SIGALRM that only uses the lock-free allocator and an
        // atomic; the timer signals this thread only, and is deleted before returning.
        let timer = unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_timer as *const () as usize;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigaction(libc::SIGALRM, &sa, std::ptr::null_mut());
            let mut sev: libc::sigevent = std::mem::zeroed();
            sev.sigev_notify = libc::SIGEV_THREAD_ID;
            sev.sigev_signo = libc::SIGALRM;
            sev.sigev_notify_thread_id = libc::gettid();
            let mut timer: libc::timer_t = std::mem::zeroed();
            assert_eq!(
                libc::timer_create(libc::CLOCK_MONOTONIC, &mut sev, &mut timer),
                0
            );
            let every = libc::timespec {
                tv_sec: 0,
                tv_nsec: 50_000,
            };
            let spec = libc::itimerspec {
                it_interval: every,
                it_value: every,
            };
            libc::timer_settime(timer, 0, &spec, std::ptr::null_mut());
            timer
        };
        let a = AgentAlloc;
        let l = layout(32, 8);
        let start = std::time::Instant::now();
        while IN_HANDLER.load(Ordering::Relaxed) < 2000 && start.elapsed().as_secs() < 30 {
            // SAFETY: a valid layout; the blocks are given back at once.
            unsafe {
                let p = a.alloc(l);
                let q = a.alloc(l);
                a.dealloc(p, l);
                a.dealloc(q, l);
            }
        }
        // SAFETY: the timer made above; no signal comes after its deletion.
        unsafe { libc::timer_delete(timer) };
        assert!(IN_HANDLER.load(Ordering::Relaxed) >= 2000);
    }

    #[test]
    fn a_start_up_of_small_allocations_maps_little() {
        // ~16,000 small allocations, as the agent's start-up makes, kept alive: a few MiB of
        // slabs, not a mapping each.
        let before = MAPPED.load(Ordering::Relaxed);
        let v: Vec<Box<[u8]>> = (0..16_000)
            .map(|i| vec![1u8; 8 + i % 120].into_boxed_slice())
            .collect();
        let mapped = MAPPED.load(Ordering::Relaxed).saturating_sub(before);
        assert!(v.iter().all(|b| b[0] == 1));
        // Other tests run at the same time: allow for them.
        assert!(mapped < 16 << 20, "{mapped} bytes mapped");
    }
}
