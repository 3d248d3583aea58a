//! Writing code that stays `r-x`: every store ftprobe makes into code (sites, int3 probes,
//! optprobe jumps, trampolines, XOL slots) goes through this module, as a write to
//! `/proc/self/mem`, whose `FOLL_FORCE` access writes a page the process maps without
//! `PROT_WRITE` (a private page gets its own copy first, as for a debugger's breakpoint).
//! No mapping of the process is ever writable and executable (W^X), during a session or
//! after it: the program's text, its libraries', ld.so's and ftprobe's trampoline areas
//! keep the protection the loader or `mmap` gave them (issue 26, item 3).
//!
//! Cost: one `pwrite` is ~1.5 us here (the kernel pins the page and maps it), against a
//! plain store. A batch of sites writes each run of nearby changes in one call: changes
//! less than [`COALESCE_GAP`] bytes apart are joined, the bytes between them written with
//! the values they hold (only ftprobe writes code, under one lock, so they do not change
//! meanwhile; rewriting an instruction's own bytes is harmless to a thread executing it).
//!
//! Where the kernel refuses such writes (`proc_mem.force_override=never`, a kernel built
//! with `CONFIG_PROC_MEM_NO_FORCE`), the write falls back to making the pages `rwx` for
//! the store and `r-x` again right after, counted in [`fallbacks`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use crate::sys::{self, SyscallError};

/// Changes closer than this are written in one `pwrite` (copying 4 KiB costs less than a
/// system call).
pub const COALESCE_GAP: u64 = 4096;

/// `/proc/self/mem` could not be opened (no `/proc`): every write takes the fallback.
static NO_MEM: AtomicBool = AtomicBool::new(false);
/// Serializes every writer of code (a read of the bytes between two changes and its write).
static LOCK: Mutex<()> = Mutex::new(());
static STAT_WRITES: AtomicU64 = AtomicU64::new(0);
static STAT_FALLBACKS: AtomicU64 = AtomicU64::new(0);

/// `pwrite` calls made to `/proc/self/mem` so far.
pub fn writes() -> u64 {
    // Relaxed: a statistic.
    STAT_WRITES.load(Ordering::Relaxed)
}

/// Writes made through a transient `rwx` window because `/proc/self/mem` refused them.
pub fn fallbacks() -> u64 {
    // Relaxed: a statistic.
    STAT_FALLBACKS.load(Ordering::Relaxed)
}

/// `/proc/self/mem`, open for one operation (under [`LOCK`]): a descriptor kept open would
/// be the program's to see, and to close (a daemon's `close_range`), after which its number
/// could name a file of the program's that the next code write would land in.
struct Mem(i32);

impl Mem {
    fn open() -> Option<Mem> {
        // Relaxed: a hint; a failed open says it again.
        if NO_MEM.load(Ordering::Relaxed) {
            return None;
        }
        // SAFETY: a NUL-terminated path; O_CLOEXEC: a child the program forks meanwhile
        // does not inherit it.
        let fd = unsafe { libc::open(c"/proc/self/mem".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd < 0 {
            NO_MEM.store(true, Ordering::Relaxed);
            return None;
        }
        Some(Mem(fd))
    }
}

impl Drop for Mem {
    fn drop(&mut self) {
        // SAFETY: the descriptor this value opened, closed once.
        unsafe { libc::close(self.0) };
    }
}

/// Write `bytes` at `addr` through `/proc/self/mem`; false if the kernel refused.
fn pwrite_mem(mem: &Option<Mem>, addr: u64, bytes: &[u8]) -> Result<bool, SyscallError> {
    let Some(Mem(fd)) = *mem else {
        return Ok(false);
    };
    let mut done = 0;
    while done < bytes.len() {
        // Relaxed: a statistic.
        STAT_WRITES.fetch_add(1, Ordering::Relaxed);
        // SAFETY: reads `bytes[done..]`, ours; the file offset is the address written.
        let n = unsafe {
            libc::pwrite(
                fd,
                bytes[done..].as_ptr().cast(),
                bytes.len() - done,
                (addr + done as u64) as libc::off_t,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                // The kernel does not let /proc/PID/mem write through the protection.
                Some(libc::EIO | libc::EPERM | libc::EACCES) if done == 0 => return Ok(false),
                _ => {
                    return Err(SyscallError {
                        call: "pwrite /proc/self/mem",
                        source: e,
                    })
                }
            }
        }
        if n == 0 {
            return Err(SyscallError {
                call: "pwrite /proc/self/mem",
                source: std::io::Error::from_raw_os_error(libc::EFAULT),
            });
        }
        done += n as usize;
    }
    Ok(true)
}

/// The fallback: the pages `rwx` for the store, `r-x` again after.
///
/// # Safety
/// As [`write()`]; the pages must be `r-x` code.
unsafe fn write_through_window(addr: u64, bytes: &[u8]) -> Result<(), SyscallError> {
    // Relaxed: a statistic.
    STAT_FALLBACKS.fetch_add(1, Ordering::Relaxed);
    let page = sys::page_size() as u64;
    let lo = addr & !(page - 1);
    let hi = (addr + bytes.len() as u64).div_ceil(page) * page;
    let rwx = libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC;
    // SAFETY: the caller's range is mapped code of this process; adding PROT_WRITE
    // invalidates no access.
    unsafe { sys::mprotect(lo as usize, (hi - lo) as usize, rwx)? };
    for (i, b) in bytes.iter().enumerate() {
        // SAFETY: writable now; the caller's contract on what may be written there.
        unsafe { std::ptr::write_volatile((addr + i as u64) as *mut u8, *b) };
    }
    // SAFETY: as above; back to what the code had.
    unsafe {
        sys::mprotect(
            lo as usize,
            (hi - lo) as usize,
            libc::PROT_READ | libc::PROT_EXEC,
        )
    }
}

/// Write `bytes` at `addr` in code mapped `r-x` (or readable and executable in any way),
/// without making it writable.
///
/// # Safety
/// `addr..addr + bytes.len()` must be mapped code of this process, and the new bytes must
/// be safe to execute for any thread that may reach them (the caller's protocol: an int3
/// first, a site no thread runs yet, ...).
pub unsafe fn write(addr: u64, bytes: &[u8]) -> Result<(), SyscallError> {
    if bytes.is_empty() {
        return Ok(());
    }
    let _held = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let mem = Mem::open();
    if pwrite_mem(&mem, addr, bytes)? {
        return Ok(());
    }
    // SAFETY: the caller's contract.
    unsafe { write_through_window(addr, bytes) }
}

/// Write many changes (`(address, bytes)`), joining those less than [`COALESCE_GAP`] apart
/// into one write (changes at one place: the later one's bytes win).
///
/// # Safety
/// As [`write()`], for each change; the bytes between two joined changes are mapped too
/// (they are, when both lie in one object's text or one trampoline area: the callers' case;
/// a gap that is not mapped is never joined, see below).
pub unsafe fn write_many(changes: &[(u64, &[u8])]) -> Result<(), SyscallError> {
    let _held = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let mem = Mem::open();
    let page = sys::page_size() as u64;
    // By address; changes at one place keep their order, the later one's bytes written last
    // (the callers give them sorted and apart; this holds whatever they give).
    let mut sorted: Vec<(u64, &[u8])> = changes
        .iter()
        .copied()
        .filter(|c| !c.1.is_empty())
        .collect();
    sorted.sort_by_key(|c| c.0);
    let changes = &sorted[..];
    let mut buf: Vec<u8> = Vec::new();
    let mut i = 0;
    while i < changes.len() {
        let start = changes[i].0;
        let mut end = start + changes[i].1.len() as u64;
        let mut j = i + 1;
        // Join while the next change overlaps or is near, on a page this run covers or the
        // next one (a run never spans a page it does not write on: every page it reads is
        // mapped).
        while j < changes.len() {
            let (a, b) = changes[j];
            let next_page = (end - 1) / page + 1;
            if a.saturating_sub(end) >= COALESCE_GAP || a / page > next_page {
                break;
            }
            end = end.max(a + b.len() as u64);
            j += 1;
        }
        if j == i + 1 {
            let (a, b) = changes[i];
            if !pwrite_mem(&mem, a, b)? {
                // SAFETY: the caller's contract.
                unsafe { write_through_window(a, b)? };
            }
        } else {
            buf.clear();
            buf.resize((end - start) as usize, 0);
            // SAFETY: [start, end) covers the changes' bytes and those between them, on
            // pages that hold a change (mapped, readable code: the caller's contract).
            unsafe {
                std::ptr::copy_nonoverlapping(start as *const u8, buf.as_mut_ptr(), buf.len())
            };
            for &(a, b) in &changes[i..j] {
                let o = (a - start) as usize;
                buf[o..o + b.len()].copy_from_slice(b);
            }
            if !pwrite_mem(&mem, start, &buf)? {
                for &(a, b) in &changes[i..j] {
                    // SAFETY: the caller's contract.
                    unsafe { write_through_window(a, b)? };
                }
            }
        }
        i = j;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn maps_line(addr: u64) -> String {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        maps.lines()
            .find(|l| {
                let (r, _) = l.split_once(' ').unwrap();
                let (s, e) = r.split_once('-').unwrap();
                let (s, e) = (
                    u64::from_str_radix(s, 16).unwrap(),
                    u64::from_str_radix(e, 16).unwrap(),
                );
                addr >= s && addr < e
            })
            .unwrap()
            .to_owned()
    }

    #[test]
    fn code_is_written_and_stays_r_x() {
        let len = 4 * 4096;
        let base = sys::mmap_anon_at(0x7e00_0000_0000, len, libc::PROT_READ | libc::PROT_EXEC)
            .or_else(|_| {
                sys::mmap_anon_at(0x7d00_0000_0000, len, libc::PROT_READ | libc::PROT_EXEC)
            })
            .unwrap() as u64;
        let before = writes();
        // SAFETY: our own r-x mapping, which no thread executes.
        unsafe { write(base + 10, &[0xcc]).unwrap() };
        // Three changes on pages 0 and 1 (joined: one write), one on page 3 (alone).
        let changes: [(u64, &[u8]); 4] = [
            (base + 100, &[1, 2, 3, 4]),
            (base + 4000, &[5]),
            (base + 4096 + 8, &[6, 7]),
            (base + 3 * 4096 + 1, &[8]),
        ];
        // SAFETY: as above.
        unsafe { write_many(&changes).unwrap() };
        // SAFETY: reads our own mapping.
        let got =
            |a: u64, n: usize| unsafe { std::slice::from_raw_parts(a as *const u8, n) }.to_vec();
        assert_eq!(got(base + 10, 1), [0xcc]);
        assert_eq!(got(base + 100, 4), [1, 2, 3, 4]);
        assert_eq!(
            got(base + 104, 1),
            [0],
            "bytes between joined changes unchanged"
        );
        assert_eq!(got(base + 4000, 1), [5]);
        assert_eq!(got(base + 4096 + 8, 2), [6, 7]);
        assert_eq!(got(base + 3 * 4096 + 1, 1), [8]);
        assert_eq!(writes() - before, 3, "one, then two runs");
        assert_eq!(fallbacks(), 0, "this kernel lets /proc/self/mem write");
        for page in 0..4 {
            let l = maps_line(base + page * 4096);
            assert!(l.contains(" r-xp "), "{l}");
        }
        // SAFETY: our own mapping, unmapped once.
        unsafe { libc::munmap(base as *mut _, len) };
    }
}
