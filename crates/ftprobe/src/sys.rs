//! The one choke point for system calls (STYLE.md item 5).
//!
//! Every call returns `Result<_, SyscallError>` naming the call, so callers can attach context
//! and tests can see which call failed. The functions marked *probe path* are async-signal-safe
//! (a raw syscall or a plain load); the others run on the control path only.

use std::io;

use crate::arch::x86_64::uaccess;

/// A failed system call: which call, and the `errno` it returned.
#[derive(Debug, thiserror::Error)]
#[error("{call} failed")]
pub struct SyscallError {
    /// The name of the call, e.g. `"mprotect"`.
    pub call: &'static str,
    /// The OS error (`errno`).
    #[source]
    pub source: io::Error,
}

impl SyscallError {
    fn last(call: &'static str) -> Self {
        SyscallError {
            call,
            source: io::Error::last_os_error(),
        }
    }

    /// The raw `errno`, if any.
    pub fn errno(&self) -> Option<i32> {
        self.source.raw_os_error()
    }
}

/// The C library's `sigaction`, found past any interposer (the agent exports its own
/// `sigaction` to keep ftprobe's SIGTRAP handler in place).
///
/// # Safety
/// As `sigaction(2)`: `act` and `old` null or valid.
pub unsafe fn real_sigaction(
    sig: libc::c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> libc::c_int {
    type F = unsafe extern "C" fn(
        libc::c_int,
        *const libc::sigaction,
        *mut libc::sigaction,
    ) -> libc::c_int;
    static REAL: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let mut f = REAL.load(std::sync::atomic::Ordering::Relaxed);
    if f == 0 {
        // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated name; looks up, changes nothing.
        f = unsafe { libc::dlsym(libc::RTLD_NEXT, c"sigaction".as_ptr()) } as usize;
        if f == 0 {
            return -1;
        }
        REAL.store(f, std::sync::atomic::Ordering::Relaxed);
    }
    // SAFETY: `f` is libc's sigaction, whose signature is F; the caller's contract.
    unsafe { std::mem::transmute::<usize, F>(f)(sig, act, old) }
}

/// Page size of this machine in bytes.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions and touches no memory of ours.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 {
        n as usize
    } else {
        4096
    }
}

/// `mprotect(addr, len, prot)`.
///
/// # Safety
/// Changing protections of memory that Rust code holds references into, or of code that is
/// running, is only sound if the caller knows no access is invalidated by the change (adding
/// `PROT_WRITE` to text, as [`crate::arch::x86_64::text_poke`] does, removes no permission).
pub unsafe fn mprotect(addr: usize, len: usize, prot: i32) -> Result<(), SyscallError> {
    fault::check("mprotect")?;
    // SAFETY: the caller upholds this function's contract (see # Safety).
    let r = unsafe { libc::mprotect(addr as *mut libc::c_void, len, prot) };
    if r == 0 {
        Ok(())
    } else {
        Err(SyscallError::last("mprotect"))
    }
}

/// Map `len` bytes of fresh anonymous memory at exactly `hint` if that range is free
/// (`MAP_FIXED_NOREPLACE`), else fail. Returns the address.
pub fn mmap_anon_at(hint: usize, len: usize, prot: i32) -> Result<usize, SyscallError> {
    fault::check("mmap")?;
    // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping, so no memory that anything
    // else uses can be affected; the new mapping is private and anonymous.
    let p = unsafe {
        libc::mmap(
            hint as *mut libc::c_void,
            len,
            prot,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(SyscallError::last("mmap"));
    }
    if p as usize != hint {
        // Kernels before 4.17 ignore MAP_FIXED_NOREPLACE and treat it as a hint.
        // SAFETY: p..p+len is the mapping just created, which nothing else references.
        unsafe { libc::munmap(p, len) };
        return Err(SyscallError {
            call: "mmap",
            source: io::Error::from_raw_os_error(libc::EEXIST),
        });
    }
    Ok(p as usize)
}

/// A whole file mapped read-only and private: ELF files are parsed in place instead of being
/// copied into the heap (the agent library alone is ~10 MB with its debug info). Unmapped on
/// drop. Not for use inside a traced process ([`crate::elf::ElfImage::open_symbols`]).
pub struct FileMap {
    ptr: *mut libc::c_void,
    len: usize,
}

impl FileMap {
    /// Map the file at `path`. An empty file maps as an empty slice.
    pub fn open(path: &std::path::Path) -> io::Result<FileMap> {
        use std::os::fd::AsRawFd;
        let file = std::fs::File::open(path)?;
        let len = usize::try_from(file.metadata()?.len())
            .map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
        if len == 0 {
            return Ok(FileMap {
                ptr: std::ptr::null_mut(),
                len: 0,
            });
        }
        // SAFETY: a new private read-only mapping of an open file; nothing else refers to the
        // range it returns. A file truncated meanwhile raises SIGBUS on access (as for any
        // mapped file): the reason this is not used inside traced processes.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(FileMap { ptr: p, len })
    }

    /// The file's bytes.
    pub fn bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: ptr..ptr+len is our readable mapping, alive until drop.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }
}

impl Drop for FileMap {
    fn drop(&mut self) {
        if self.len != 0 {
            // SAFETY: the mapping made in `open`; no borrow of `bytes()` outlives self.
            unsafe { libc::munmap(self.ptr, self.len) };
        }
    }
}

const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;
const MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE: libc::c_long = 1 << 5;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE: libc::c_long = 1 << 6;

fn membarrier(cmd: libc::c_long) -> Result<(), SyscallError> {
    fault::check("membarrier")?;
    // SAFETY: membarrier takes no pointers; flags 0 and cpu_id 0 are valid for every command.
    let r = unsafe {
        libc::syscall(
            libc::SYS_membarrier,
            cmd,
            0 as libc::c_long,
            0 as libc::c_long,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(SyscallError::last("membarrier"))
    }
}

/// Register this process for the expedited private membarrier commands used by
/// [`sync_core_all_threads`] and [`memory_barrier_all_threads`]. Needed once per process.
pub fn membarrier_register() -> Result<(), SyscallError> {
    membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE)?;
    membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED)
}

/// Make every running thread of this process execute a core-serializing instruction before
/// returning: the user-space form of the kernel's `text_poke_sync()` IPI.
pub fn sync_core_all_threads() -> Result<(), SyscallError> {
    membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE)
}

/// A full memory barrier on every running thread of this process (the heavy side of an
/// asymmetric fence: threads on the probe path use compiler barriers only).
pub fn memory_barrier_all_threads() -> Result<(), SyscallError> {
    membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)
}

/// The calling thread's id. *Probe path*: one raw syscall.
pub fn gettid() -> u32 {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { raw_syscall2(libc::SYS_gettid, 0, 0) as u32 }
}

/// The ids of the process's threads (`/proc/self/task`), read with `getdents64` on a
/// descriptor of our own: `std::fs::read_dir` would go through the C library's `opendir`,
/// which allocates with the program's `malloc`.
pub fn thread_ids() -> io::Result<Vec<u32>> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    // SAFETY: a NUL-terminated path; the descriptor is owned below.
    let fd = unsafe {
        libc::open(
            c"/proc/self/task".as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just opened and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut buf = vec![0u8; 8192];
    let mut ids = Vec::new();
    loop {
        // SAFETY: getdents64 writes at most buf.len() bytes into buf.
        let n = unsafe {
            libc::syscall(
                libc::SYS_getdents64,
                fd.as_raw_fd(),
                buf.as_mut_ptr(),
                buf.len(),
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n == 0 {
            return Ok(ids);
        }
        // struct linux_dirent64 { u64 d_ino; i64 d_off; u16 d_reclen; u8 d_type; char d_name[]; }
        let mut at = 0usize;
        while at + 19 < n as usize {
            let reclen = u16::from_le_bytes([buf[at + 16], buf[at + 17]]) as usize;
            let name = &buf[at + 19..at + reclen];
            let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
            if let Some(id) = std::str::from_utf8(name).ok().and_then(|s| s.parse().ok()) {
                ids.push(id);
            }
            at += reclen.max(1);
        }
    }
}

/// The calling process's id (its thread group id). *Probe path*: one raw syscall (glibc's
/// `getpid` may be interposed or cached across a raw `fork`).
pub fn getpid() -> u32 {
    // SAFETY: getpid has no arguments and cannot fail.
    unsafe { raw_syscall2(libc::SYS_getpid, 0, 0) as u32 }
}

/// Whether thread `tid` of this process no longer exists (`tgkill(pid, tid, 0)` fails with
/// ESRCH). *Probe path*: two raw syscalls.
#[inline(never)]
pub fn thread_gone(tid: u32) -> bool {
    // SAFETY: tgkill with signal 0 only checks that the thread exists and may be signalled.
    let r = unsafe { raw_syscall4(libc::SYS_tgkill, u64::from(getpid()), u64::from(tid), 0, 0) };
    r == -i64::from(libc::ESRCH)
}

/// The calling thread's name (`comm`, 16 bytes, NUL-padded). *Probe path*: one raw syscall.
#[inline(never)]
pub fn thread_comm() -> [u8; 16] {
    let mut buf = [0u8; 16];
    // SAFETY: PR_GET_NAME writes at most 16 bytes into the buffer, which is 16 bytes long.
    unsafe {
        raw_syscall2(
            libc::SYS_prctl,
            libc::PR_GET_NAME as u64,
            buf.as_mut_ptr() as u64,
        )
    };
    buf
}

/// Failure injection for tests of error paths (STYLE.md item 5: the choke point tests can fake).
///
/// `fail_nth("membarrier", 2)` makes the second `membarrier` call from now fail with `EIO`.
/// One armed fault at a time; control path only (the probe path makes no faultable call).
pub mod fault {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Mutex;

    static ARMED: Mutex<Option<&'static str>> = Mutex::new(None);
    static COUNTDOWN: AtomicU32 = AtomicU32::new(0);

    /// Arm: the `n`th (1-based) next call named `call` fails.
    pub fn fail_nth(call: &'static str, n: u32) {
        *ARMED.lock().unwrap_or_else(|e| e.into_inner()) = Some(call);
        COUNTDOWN.store(n, Ordering::SeqCst);
    }

    /// Disarm.
    pub fn clear() {
        *ARMED.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    pub(super) fn check(call: &'static str) -> Result<(), super::SyscallError> {
        let mut armed = ARMED.lock().unwrap_or_else(|e| e.into_inner());
        if *armed != Some(call) {
            return Ok(());
        }
        if COUNTDOWN.fetch_sub(1, Ordering::SeqCst) == 1 {
            *armed = None;
            return Err(super::SyscallError {
                call,
                source: std::io::Error::from_raw_os_error(libc::EIO),
            });
        }
        Ok(())
    }
}

/// A system call made with the `syscall` instruction: the kernel's return value (`-errno` on
/// failure), `errno` untouched. *Probe path*: a traced program must not see its `errno`
/// changed by a probe (the C library's wrappers set it on failure).
///
/// # Safety
/// As the system call `nr` with these arguments.
#[inline(always)]
pub unsafe fn raw_syscall6(nr: libc::c_long, a: [u64; 6]) -> i64 {
    let ret: i64;
    // SAFETY: the caller's contract; `syscall` clobbers rcx and r11 only.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") nr => ret,
            in("rdi") a[0],
            in("rsi") a[1],
            in("rdx") a[2],
            in("r10") a[3],
            in("r8") a[4],
            in("r9") a[5],
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        )
    };
    ret
}

/// [`raw_syscall6`] with two arguments.
///
/// # Safety
/// As [`raw_syscall6`].
#[inline(always)]
pub unsafe fn raw_syscall2(nr: libc::c_long, a0: u64, a1: u64) -> i64 {
    // SAFETY: the caller's contract.
    unsafe { raw_syscall6(nr, [a0, a1, 0, 0, 0, 0]) }
}

/// [`raw_syscall6`] with four arguments.
///
/// # Safety
/// As [`raw_syscall6`].
#[inline(always)]
pub unsafe fn raw_syscall4(nr: libc::c_long, a0: u64, a1: u64, a2: u64, a3: u64) -> i64 {
    // SAFETY: the caller's contract.
    unsafe { raw_syscall6(nr, [a0, a1, a2, a3, 0, 0]) }
}

/// This process's id. *Probe path*: one raw syscall.
#[inline(always)]
pub fn getpid_raw() -> i32 {
    // SAFETY: getpid has no arguments and cannot fail.
    unsafe { raw_syscall2(libc::SYS_getpid, 0, 0) as i32 }
}

/// `process_vm_readv` on this process, as a raw syscall: the bytes read, or a negative errno.
///
/// # Safety
/// `local` must point to `nlocal` iovecs describing writable memory of ours; `remote` to
/// `nremote` iovecs (only read by the kernel, which checks them).
#[inline(always)]
unsafe fn vm_read_self(
    local: *const libc::iovec,
    nlocal: u64,
    remote: *const libc::iovec,
    nremote: u64,
) -> i64 {
    // SAFETY: the caller's contract.
    unsafe {
        raw_syscall6(
            libc::SYS_process_vm_readv,
            [
                getpid_raw() as u64,
                local as u64,
                nlocal,
                remote as u64,
                nremote,
                0,
            ],
        )
    }
}

/// Read a word of this process's memory without faulting; `None` for a bad address.
/// *Probe path*, `errno` untouched. A plain load whose fault ftprobe's handler turns into
/// `None` when it can ([`uaccess::usable`]); else `process_vm_readv` on our own pid, which
/// returns an error for an unmapped address instead of raising SIGSEGV (one raw syscall,
/// ~0.3-1.3 µs).
#[inline]
pub fn read_u64_nofault(addr: u64) -> Option<u64> {
    Nofault::now().read_u64(addr)
}

/// How fault-safe reads are made, decided once (per probe hit: [`Nofault::now`] checks
/// the thread's state, a few loads): plain loads whose faults ftprobe's handler resumes
/// (`uaccess`), or `process_vm_readv`. The free functions ([`read_nofault`] and siblings)
/// decide at each call. *Probe path*.
#[derive(Clone, Copy, Debug)]
pub struct Nofault {
    loads: bool,
}

impl Nofault {
    /// By `process_vm_readv` (also for a caller that reads nothing).
    pub const SYSCALL: Nofault = Nofault { loads: false };

    /// The way that is safe on this thread now ([`uaccess::usable`]).
    #[inline]
    pub fn now() -> Nofault {
        Nofault {
            loads: uaccess::usable(),
        }
    }

    /// Whether reads are plain loads (not the system call).
    #[inline(always)]
    pub fn loads(self) -> bool {
        self.loads
    }

    /// [`read_u64_nofault`].
    #[inline]
    pub fn read_u64(self, addr: u64) -> Option<u64> {
        if self.loads {
            return uaccess::read_u64_nofault(addr);
        }
        read_u64_syscall(addr)
    }

    /// [`read_nofault`].
    #[inline]
    pub fn read(self, addr: u64, buf: &mut [u8]) -> usize {
        if self.loads {
            return uaccess::copy_nofault(addr, buf);
        }
        read_pieces_syscall(addr, buf)
    }

    /// [`strncpy_nofault`].
    #[inline]
    pub fn strncpy(self, addr: u64, buf: &mut [u8]) -> Option<usize> {
        if self.loads {
            return uaccess::strncpy_nofault(addr, buf);
        }
        let got = read_pieces_syscall(addr, buf);
        match buf[..got].iter().position(|&c| c == 0) {
            Some(nul) => Some(nul + 1),
            None if got == buf.len() => Some(got),
            None => None,
        }
    }

    /// [`strnlen_nofault`].
    #[inline]
    pub fn strnlen(self, addr: u64, max: usize) -> Option<usize> {
        if self.loads {
            return uaccess::strnlen_nofault(addr, max).map(|n| n.min(max));
        }
        strnlen_syscall(addr, max)
    }
}

/// [`read_u64_nofault`] by `process_vm_readv`. Out of line: its iovecs stay off the
/// callers' frames.
#[inline(never)]
fn read_u64_syscall(addr: u64) -> Option<u64> {
    let mut v = 0u64;
    let local = libc::iovec {
        iov_base: (&mut v as *mut u64).cast(),
        iov_len: 8,
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: 8,
    };
    // SAFETY: the local iovec covers `v`, 8 writable bytes; the remote one is only read by the
    // kernel, which checks it and fails with EFAULT rather than faulting us.
    let n = unsafe { vm_read_self(&local, 1, &remote, 1) };
    (n == 8).then_some(v)
}

/// Granularity at which [`read_nofault`] splits a read: `process_vm_readv` transfers
/// partially only at iovec boundaries (process_vm_readv(2)), so a read split at every 4 KiB
/// boundary returns the readable prefix of a range that runs into an unmapped page. (Larger
/// pages are multiples of it.)
const NOFAULT_PIECE: u64 = 4096;

/// Read `buf.len()` bytes of this process's memory at `addr` without faulting; returns how
/// many bytes, from the start, could be read (`buf.len()` when all of them). The range is
/// split at 4 KiB boundaries, so a range that runs into an unmapped page yields its mapped
/// prefix. *Probe path*: plain loads whose fault ftprobe's handler stops the copy at
/// ([`uaccess::usable`]); else one `process_vm_readv` per two 4 KiB pieces (one for up to
/// 4 KiB), 48 bytes of iovecs on the stack.
#[inline]
pub fn read_nofault(addr: u64, buf: &mut [u8]) -> usize {
    Nofault::now().read(addr, buf)
}

#[inline(never)]
fn read_pieces_syscall(addr: u64, buf: &mut [u8]) -> usize {
    read_pieces(addr, buf)
}

/// Copy the NUL-terminated string at `addr` into `buf`, NUL included, at most `buf.len()`
/// bytes (the kernel's `strncpy_from_user_nofault()`): the bytes copied (the last is the
/// NUL, unless all of `buf` was filled without one), or `None` when a byte before the NUL
/// (and before `buf.len()`) cannot be read. *Probe path*: as [`read_nofault`], but the
/// plain loads stop at the NUL (the system call reads all of `buf` that is mapped).
#[inline]
pub fn strncpy_nofault(addr: u64, buf: &mut [u8]) -> Option<usize> {
    Nofault::now().strncpy(addr, buf)
}

#[inline(always)]
fn read_pieces(addr: u64, buf: &mut [u8]) -> usize {
    let mut done = 0usize;
    while done < buf.len() {
        let at = addr.wrapping_add(done as u64);
        let left = buf.len() - done;
        let first = ((NOFAULT_PIECE - at % NOFAULT_PIECE) as usize).min(left);
        let second = (left - first).min(NOFAULT_PIECE as usize);
        let remote = [
            libc::iovec {
                iov_base: at as *mut libc::c_void,
                iov_len: first,
            },
            libc::iovec {
                iov_base: at.wrapping_add(first as u64) as *mut libc::c_void,
                iov_len: second,
            },
        ];
        let want = first + second;
        let local = libc::iovec {
            iov_base: buf[done..].as_mut_ptr().cast(),
            iov_len: want,
        };
        let pieces = if second == 0 { 1 } else { 2 };
        // SAFETY: the local iovec covers `want` bytes of `buf` from `done`, all writable and
        // in bounds (want <= left); the remote ones are only read by the kernel, which checks
        // them and fails with EFAULT rather than faulting us.
        let got = unsafe { vm_read_self(&local, 1, remote.as_ptr(), pieces) };
        if got <= 0 {
            break;
        }
        done += got as usize;
        if (got as usize) < want {
            break;
        }
    }
    done
}

/// The length of the NUL-terminated string at `addr`, NUL included, as the kernel's
/// `fetch_store_strlen()` counts it: at most `max` (a string with no NUL in its first `max`
/// bytes counts `max`); `None` when a byte before the NUL (and before `max`) cannot be read.
/// *Probe path*: plain loads, 8 bytes at a time, whose fault ftprobe's handler stops
/// ([`uaccess::usable`]); else 64 bytes at a time into a stack buffer, one
/// `process_vm_readv` each.
#[inline]
pub fn strnlen_nofault(addr: u64, max: usize) -> Option<usize> {
    Nofault::now().strnlen(addr, max)
}

#[inline(never)]
fn strnlen_syscall(addr: u64, max: usize) -> Option<usize> {
    let mut chunk = [0u8; 64];
    let mut len = 0usize;
    while len < max {
        let want = chunk.len().min(max - len);
        let got = read_pieces(addr.wrapping_add(len as u64), &mut chunk[..want]);
        if let Some(nul) = chunk[..got].iter().position(|&c| c == 0) {
            return Some(len + nul + 1);
        }
        if got < want {
            return None;
        }
        len += got;
    }
    Some(max)
}

/// Memory for an allocator that must work anywhere (the agent's global allocator): raw
/// `mmap`/`munmap`/`mremap` system calls, past any interposer of the libc wrappers. *Probe
/// path* safe (async-signal-safe, no lock): no fault injection, whose switch takes a lock.
pub mod raw_map {
    /// `mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS)`: fresh zeroed
    /// pages, or `None`.
    pub fn map(len: usize) -> Option<usize> {
        // Every argument a full register wide: the syscall's variadic arguments are read as
        // longs.
        // SAFETY: a new private anonymous mapping at an address the kernel picks touches no
        // existing memory.
        let p = unsafe {
            libc::syscall(
                libc::SYS_mmap,
                0usize,
                len,
                (libc::PROT_READ | libc::PROT_WRITE) as usize,
                (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as usize,
                -1isize,
                0usize,
            )
        };
        // The kernel returns -errno (-4095..-1) on failure; libc::syscall turns it into -1.
        (p != -1 && p != 0).then_some(p as usize)
    }

    /// `munmap(addr, len)`.
    ///
    /// # Safety
    /// `addr..addr + len` must be pages this process mapped with [`map`] and nothing uses
    /// any longer.
    pub unsafe fn unmap(addr: usize, len: usize) {
        // SAFETY: the caller's contract.
        unsafe { libc::syscall(libc::SYS_munmap, addr, len) };
    }

    /// `mremap(addr, old_len, new_len, MREMAP_MAYMOVE)`: the (maybe moved) mapping, or
    /// `None` (the old one is then unchanged).
    ///
    /// # Safety
    /// As [`unmap`] for `addr..addr + old_len`: the caller owns those pages, and uses only
    /// the returned address afterwards.
    pub unsafe fn remap(addr: usize, old_len: usize, new_len: usize) -> Option<usize> {
        // SAFETY: the caller's contract; MREMAP_MAYMOVE without MREMAP_FIXED never replaces
        // another mapping.
        let p = unsafe {
            libc::syscall(
                libc::SYS_mremap,
                addr,
                old_len,
                new_len,
                libc::MREMAP_MAYMOVE as usize,
            )
        };
        (p != -1).then_some(p as usize)
    }
}
