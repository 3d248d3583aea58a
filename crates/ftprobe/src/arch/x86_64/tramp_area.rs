//! Executable memory for trampolines within `call rel32` reach (+-2 GiB) of the sites that call
//! them. Trampolines are never freed: a thread may be inside one at any time, and a handful of
//! pages per object is a small price for never having to prove quiescence.

use crate::sys::{self, SyscallError};

/// Size of one area, bytes.
const AREA_SIZE: u64 = 64 * 1024;
/// How far from the object an area may be placed; well inside rel32 reach of every site.
const MAX_DISTANCE: u64 = 1 << 30;

/// A bump allocator over one RWX mapping near an object's code.
#[derive(Debug)]
pub struct TrampArea {
    base: u64,
    used: u64,
}

impl TrampArea {
    /// Map an area within [`MAX_DISTANCE`] of `[lo, hi)` (an object's code): first below `lo`,
    /// then above `hi`, stepping one area at a time; never over an existing mapping.
    pub fn near(lo: u64, hi: u64) -> Result<TrampArea, SyscallError> {
        let prot = libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC;
        let mut last_err = None;
        let below = (1..MAX_DISTANCE / AREA_SIZE)
            .map(|i| (lo & !(AREA_SIZE - 1)).checked_sub(i * AREA_SIZE))
            .take_while(|a| a.is_some_and(|a| a >= 0x10_0000))
            .flatten();
        let above = (0..MAX_DISTANCE / AREA_SIZE)
            .map(|i| hi.div_ceil(AREA_SIZE) * AREA_SIZE + (i + 16) * AREA_SIZE);
        for addr in below.chain(above).take(4096) {
            match sys::mmap_anon_at(addr as usize, AREA_SIZE as usize, prot) {
                Ok(base) => return Ok(TrampArea { base: base as u64, used: 0 }),
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or(SyscallError {
            call: "mmap",
            source: std::io::Error::from_raw_os_error(libc::ENOMEM),
        }))
    }

    /// Whether a call from `site` can reach every byte of this area.
    pub fn reachable_from(&self, site: u64) -> bool {
        let far = if site > self.base { site - self.base } else { self.base + AREA_SIZE - site };
        far < (1 << 31) - 4096
    }

    /// Copy `code` into the area and return its address, or `None` if the area is full.
    pub fn alloc(&mut self, code: &[u8]) -> Option<u64> {
        let len = (code.len() as u64).div_ceil(16) * 16;
        if self.used + len > AREA_SIZE {
            return None;
        }
        let at = self.base + self.used;
        // SAFETY: [at, at+len) lies inside our own RWX mapping, past every trampoline handed out
        // so far, so no thread executes it yet; the copy is published by the text_poke that
        // later points a site at it (its membarrier orders the stores before any execution).
        unsafe { std::ptr::copy_nonoverlapping(code.as_ptr(), at as *mut u8, code.len()) };
        self.used += len;
        Some(at)
    }
}
