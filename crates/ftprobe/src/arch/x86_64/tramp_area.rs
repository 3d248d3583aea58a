//! Executable memory for trampolines within `call rel32` reach (+-2 GiB) of the sites that call
//! them. Trampolines are never freed: a thread may be inside one at any time, and a handful of
//! pages per object is a small price for never having to prove quiescence.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::sys::{self, SyscallError};

/// Size of one area, bytes.
const AREA_SIZE: u64 = 64 * 1024;
/// How far from the object an area may be placed; well inside rel32 reach of every site.
const MAX_DISTANCE: u64 = 1 << 30;

/// A bump allocator over one `r-x` mapping near an object's code.
#[derive(Debug)]
pub struct TrampArea {
    base: u64,
    used: u64,
}

impl TrampArea {
    /// Map an area within 1 GiB of `[lo, hi)` (an object's code), in the free gap
    /// nearest to it according to `/proc/self/maps`; never over an existing mapping.
    pub fn near(lo: u64, hi: u64) -> Result<TrampArea, SyscallError> {
        // Never writable: code goes in through `code_write` (W^X).
        let prot = libc::PROT_READ | libc::PROT_EXEC;
        let mut last_err = None;
        // Another thread may map into a gap between our read of the maps and our mmap: retry.
        for _ in 0..8 {
            let maps =
                std::fs::read_to_string("/proc/self/maps").map_err(|source| SyscallError {
                    call: "open /proc/self/maps",
                    source,
                })?;
            let Some(addr) = free_gap_near(lo, hi, &parse_maps(&maps)) else {
                break;
            };
            match sys::mmap_anon_at(addr as usize, AREA_SIZE as usize, prot) {
                Ok(base) => {
                    register(base as u64);
                    return Ok(TrampArea {
                        base: base as u64,
                        used: 0,
                    });
                }
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
        let far = if site > self.base {
            site - self.base
        } else {
            self.base + AREA_SIZE - site
        };
        far < (1 << 31) - 4096
    }

    /// Whether `addr` lies inside this area.
    pub fn contains(&self, addr: u64) -> bool {
        addr >= self.base && addr < self.base + AREA_SIZE
    }

    /// Reserve `len` bytes, let `make` produce their contents for the address they will have,
    /// copy them in; `None` if the area is full.
    pub fn alloc_with(&mut self, len: usize, make: impl FnOnce(u64) -> Vec<u8>) -> Option<u64> {
        let at = self.base + self.used;
        if self.used + len as u64 > AREA_SIZE {
            return None;
        }
        let code = make(at);
        debug_assert!(code.len() <= len);
        self.alloc(&code[..code.len().min(len)])
    }

    /// Copy `code` into the area and return its address, or `None` if the area is full (or,
    /// should the write fail, as full: the next area is tried).
    pub fn alloc(&mut self, code: &[u8]) -> Option<u64> {
        let len = (code.len() as u64).div_ceil(16) * 16;
        if self.used + len > AREA_SIZE {
            return None;
        }
        let at = self.base + self.used;
        // SAFETY: [at, at+len) lies inside our own mapping, past every trampoline handed out
        // so far, so no thread executes it yet; the copy is published by the text_poke that
        // later points a site at it (its membarrier orders the stores before any execution).
        if unsafe { super::code_write::write(at, code) }.is_err() {
            self.used = AREA_SIZE;
            return None;
        }
        self.used += len;
        Some(at)
    }
}

/// Bases of every area mapped (areas are never unmapped), for [`area_of`]: a signal handler
/// asks whether a PC is in trampoline code without taking a lock.
static AREAS: [AtomicU64; MAX_AREAS] = [const { AtomicU64::new(0) }; MAX_AREAS];
static NR_AREAS: AtomicUsize = AtomicUsize::new(0);
/// Areas [`area_of`] knows; more are still usable, but a signal in them is not recognised
/// as one in a trampoline (see `arch::x86_64::tramp_signals`).
const MAX_AREAS: usize = 512;

fn register(base: u64) {
    // Relaxed: only the index is claimed here; the Release store below publishes the base.
    let i = NR_AREAS.fetch_add(1, Ordering::Relaxed);
    if let Some(slot) = AREAS.get(i) {
        // Release pairs with the Acquire loads in `area_of`.
        slot.store(base, Ordering::Release);
    }
}

/// `[base, base + AREA_SIZE)` of the trampoline area that holds `addr`, if any.
/// Async-signal-safe: loads only.
pub fn area_of(addr: u64) -> Option<(u64, u64)> {
    let base = addr & !(AREA_SIZE - 1);
    // Relaxed: an area registered after this load is one no thread of this signal ran in.
    let n = NR_AREAS.load(Ordering::Relaxed).min(MAX_AREAS);
    AREAS[..n]
        .iter()
        // Acquire pairs with the Release store in `register`.
        .any(|a| a.load(Ordering::Acquire) == base)
        .then_some((base, base + AREA_SIZE))
}

/// `[start, end)` of every mapping in a `/proc/PID/maps` text, sorted.
fn parse_maps(text: &str) -> Vec<(u64, u64)> {
    let mut v: Vec<(u64, u64)> = text
        .lines()
        .filter_map(|l| {
            let range = l.split_whitespace().next()?;
            let (a, b) = range.split_once('-')?;
            Some((
                u64::from_str_radix(a, 16).ok()?,
                u64::from_str_radix(b, 16).ok()?,
            ))
        })
        .collect();
    v.sort_unstable();
    v
}

/// The start of a free, [`AREA_SIZE`]-aligned range of [`AREA_SIZE`] bytes, at most
/// [`MAX_DISTANCE`] from `[lo, hi)`, as close to it as possible; `maps` sorted.
fn free_gap_near(lo: u64, hi: u64, maps: &[(u64, u64)]) -> Option<u64> {
    const MIN_ADDR: u64 = 0x10_0000;
    const MAX_ADDR: u64 = 0x7fff_ffff_0000;
    let mut best: Option<(u64, u64)> = None; // (distance, address)
    let mut consider = |gap_lo: u64, gap_hi: u64| {
        let gap_lo = gap_lo.max(MIN_ADDR).div_ceil(AREA_SIZE) * AREA_SIZE;
        let gap_hi = (gap_hi.min(MAX_ADDR) / AREA_SIZE) * AREA_SIZE;
        if gap_hi < gap_lo + AREA_SIZE {
            return;
        }
        // The candidate in the gap closest to the object: its top end below, its bottom above.
        let cand = if gap_hi <= lo {
            gap_hi - AREA_SIZE
        } else {
            gap_lo
        };
        let dist = if cand + AREA_SIZE <= lo {
            hi - cand
        } else {
            (cand + AREA_SIZE).saturating_sub(lo)
        };
        if dist <= MAX_DISTANCE && best.is_none_or(|(d, _)| dist < d) {
            best = Some((dist, cand));
        }
    };
    let mut prev_end = 0;
    for &(start, end) in maps {
        if start > prev_end {
            consider(prev_end, start);
        }
        prev_end = prev_end.max(end);
    }
    consider(prev_end, MAX_ADDR);
    best.map(|(_, a)| a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gap_nearest_the_object() {
        let maps = parse_maps(
            "00400000-00401000 r-xp 00000000 fe:00 1 /bin/x\n\
             7f0000000000-7f0040000000 rw-s 00000000 00:01 2 /memfd:rings\n\
             7f0040000000-7f0040010000 r-xp 00000000 fe:00 3 /lib/libx.so\n\
             7f0040020000-7f0040030000 r-xp 00000000 fe:00 4 /lib/liby.so\n",
        );
        // Between the two libraries there is exactly one area's room.
        assert_eq!(
            free_gap_near(0x7f00_4000_0000, 0x7f00_4001_0000, &maps),
            Some(0x7f00_4001_0000)
        );
        // The non-PIE executable: just below it.
        assert_eq!(free_gap_near(0x40_0000, 0x40_1000, &maps), Some(0x3f_0000));
        // Nothing free within reach.
        let full = [(0, 0x7fff_ffff_0000)];
        assert_eq!(free_gap_near(0x40_0000, 0x40_1000, &full), None);
    }
}
