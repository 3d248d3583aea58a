//! The one choke point for attach's system calls: every `ptrace` request, `waitpid` on a
//! tracee, and the target's memory (`/proc/PID/mem`). Each call returns a
//! [`PtraceError`] naming the request and the thread; nothing else in `attach` is `unsafe`.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// Requests (`<sys/ptrace.h>`, `<linux/ptrace.h>`), as the raw system call takes them.
const PTRACE_CONT: libc::c_long = 7;
const PTRACE_SYSCALL: libc::c_long = 24;
const PTRACE_SETOPTIONS: libc::c_long = 0x4200;
/// `PTRACE_O_TRACESYSGOOD`: syscall-stops report `SIGTRAP | 0x80`.
const PTRACE_O_TRACESYSGOOD: usize = 1;
const PTRACE_DETACH: libc::c_long = 17;
const PTRACE_GETREGS: libc::c_long = 12;
const PTRACE_SETREGS: libc::c_long = 13;
const PTRACE_GETREGSET: libc::c_long = 0x4204;
const PTRACE_SETREGSET: libc::c_long = 0x4205;
const PTRACE_SEIZE: libc::c_long = 0x4206;
const PTRACE_INTERRUPT: libc::c_long = 0x4207;
const PTRACE_GETSIGMASK: libc::c_long = 0x420a;
const PTRACE_SETSIGMASK: libc::c_long = 0x420b;
/// The regset of the extended state (`XSAVE` area: x87, SSE, AVX, ...), `<elf.h>`.
const NT_X86_XSTATE: usize = 0x202;
/// `status >> 16` of a stop reported for `PTRACE_INTERRUPT` or a group-stop under
/// `PTRACE_SEIZE`.
pub const PTRACE_EVENT_STOP: i32 = 128;
/// An XSAVE area is at most a few KiB (AMX: ~11 KiB); the kernel shortens the iovec to it.
const XSTATE_MAX: usize = 16 << 10;

/// A failed attach system call: which, on which thread, and why.
#[derive(Debug)]
pub struct PtraceError {
    pub call: &'static str,
    pub tid: i32,
    pub source: io::Error,
}

impl PtraceError {
    pub fn errno(&self) -> Option<i32> {
        self.source.raw_os_error()
    }
}

impl std::fmt::Display for PtraceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} on thread {}: {}", self.call, self.tid, self.source)
    }
}

impl std::error::Error for PtraceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

pub type Result<T> = std::result::Result<T, PtraceError>;

/// The general registers (`struct user_regs_struct`).
pub type Regs = libc::user_regs_struct;

fn raw(call: &'static str, req: libc::c_long, tid: i32, addr: usize, data: usize) -> Result<()> {
    // SAFETY: every caller below passes, for requests that read or write memory, a pointer
    // to a live object of the size the request uses; the others take integers only.
    let r = unsafe { libc::syscall(libc::SYS_ptrace, req, tid as libc::c_long, addr, data) };
    if r == -1 {
        Err(PtraceError {
            call,
            tid,
            source: io::Error::last_os_error(),
        })
    } else {
        Ok(())
    }
}

/// `PTRACE_SEIZE` without options: the thread keeps running.
pub fn seize(tid: i32) -> Result<()> {
    raw("PTRACE_SEIZE", PTRACE_SEIZE, tid, 0, 0)
}

/// `PTRACE_INTERRUPT`: the thread stops with `PTRACE_EVENT_STOP` (or reports another stop
/// first).
pub fn interrupt(tid: i32) -> Result<()> {
    raw("PTRACE_INTERRUPT", PTRACE_INTERRUPT, tid, 0, 0)
}

/// `PTRACE_CONT`, delivering `sig` (0: none) from a signal-delivery-stop.
pub fn cont(tid: i32, sig: i32) -> Result<()> {
    raw("PTRACE_CONT", PTRACE_CONT, tid, 0, sig as usize)
}

/// `PTRACE_SYSCALL`: as [`cont`], and the thread stops again at its next system call's
/// entry or exit ([`Stop::Syscall`]).
pub fn syscall(tid: i32, sig: i32) -> Result<()> {
    raw("PTRACE_SYSCALL", PTRACE_SYSCALL, tid, 0, sig as usize)
}

/// `PTRACE_SETOPTIONS PTRACE_O_TRACESYSGOOD`: syscall-stops are told from a real SIGTRAP.
pub fn trace_sysgood(tid: i32) -> Result<()> {
    raw(
        "PTRACE_SETOPTIONS",
        PTRACE_SETOPTIONS,
        tid,
        0,
        PTRACE_O_TRACESYSGOOD,
    )
}

/// Kill ftprobe itself with SIGKILL (the tests' stand-in for a user's `kill -9` at a
/// chosen point of an attach: [`super::kill_point`]).
pub fn die() -> ! {
    // SAFETY: kill has no memory effects.
    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    unreachable!("SIGKILL returned")
}

/// `PTRACE_DETACH`, delivering `sig` (0: none) from a signal-delivery-stop.
pub fn detach(tid: i32, sig: i32) -> Result<()> {
    raw("PTRACE_DETACH", PTRACE_DETACH, tid, 0, sig as usize)
}

pub fn get_regs(tid: i32) -> Result<Regs> {
    // SAFETY: user_regs_struct is plain integers; all-zero is valid.
    let mut r: Regs = unsafe { std::mem::zeroed() };
    raw(
        "PTRACE_GETREGS",
        PTRACE_GETREGS,
        tid,
        0,
        &mut r as *mut Regs as usize,
    )?;
    Ok(r)
}

pub fn set_regs(tid: i32, r: &Regs) -> Result<()> {
    raw(
        "PTRACE_SETREGS",
        PTRACE_SETREGS,
        tid,
        0,
        r as *const Regs as usize,
    )
}

/// The thread's whole extended state (`PTRACE_GETREGSET NT_X86_XSTATE`), as the kernel
/// lays it out (its length is the kernel's).
pub fn get_xstate(tid: i32) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; XSTATE_MAX];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    raw(
        "PTRACE_GETREGSET(NT_X86_XSTATE)",
        PTRACE_GETREGSET,
        tid,
        NT_X86_XSTATE,
        &mut iov as *mut libc::iovec as usize,
    )?;
    buf.truncate(iov.iov_len);
    Ok(buf)
}

pub fn set_xstate(tid: i32, state: &[u8]) -> Result<()> {
    let mut buf = state.to_vec();
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    raw(
        "PTRACE_SETREGSET(NT_X86_XSTATE)",
        PTRACE_SETREGSET,
        tid,
        NT_X86_XSTATE,
        &mut iov as *mut libc::iovec as usize,
    )
}

/// The thread's blocked signals (bit `n - 1` for signal `n`).
pub fn get_sigmask(tid: i32) -> Result<u64> {
    let mut mask = 0u64;
    raw(
        "PTRACE_GETSIGMASK",
        PTRACE_GETSIGMASK,
        tid,
        8,
        &mut mask as *mut u64 as usize,
    )?;
    Ok(mask)
}

pub fn set_sigmask(tid: i32, mask: u64) -> Result<()> {
    raw(
        "PTRACE_SETSIGMASK",
        PTRACE_SETSIGMASK,
        tid,
        8,
        &mask as *const u64 as usize,
    )
}

/// What `waitpid` reported for a tracee.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// `PTRACE_EVENT_STOP`: an interrupt (`sig` SIGTRAP) or a group-stop (`sig` the stop
    /// signal).
    Event { sig: i32 },
    /// Another `PTRACE_EVENT_*` (none is asked for).
    OtherEvent,
    /// A syscall-stop (entry or exit), once [`trace_sysgood`] was set.
    Syscall,
    /// A signal-delivery-stop: the thread is about to take `sig`.
    Signal(i32),
    /// The thread (the process) exited with this status.
    Exited(i32),
    /// Killed by this signal.
    Killed(i32),
}

/// `waitpid(tid, __WALL)`; `None` when `nohang` and nothing happened yet.
///
/// A signal-delivery-stop is only looked at (`waitid` with `WNOWAIT`), not reaped: reaping
/// it clears the signal the thread holds, which the kernel then drops if ftprobe dies
/// before it continues the thread with it. The caller must continue (or detach) the thread
/// before waiting for it again.
pub fn wait(tid: i32, nohang: bool) -> Result<Option<Stop>> {
    let fail = |call| PtraceError {
        call,
        tid,
        source: io::Error::last_os_error(),
    };
    // SAFETY: siginfo_t is plain data; all-zero is valid.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let flags = libc::__WALL
        | libc::WEXITED
        | libc::WSTOPPED
        | libc::WNOWAIT
        | if nohang { libc::WNOHANG } else { 0 };
    loop {
        // SAFETY: waitid writes the siginfo we own.
        let r = unsafe { libc::waitid(libc::P_PID, tid as libc::id_t, &mut info, flags) };
        if r == 0 {
            break;
        }
        if io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return Err(fail("waitid"));
        }
    }
    // SAFETY: waitid filled a SIGCHLD siginfo (or left it zeroed: no child changed state).
    let (pid, code, st) = unsafe { (info.si_pid(), info.si_code, info.si_status()) };
    if pid == 0 {
        return Ok(None);
    }
    if code == libc::CLD_TRAPPED && st >> 8 == 0 && st != libc::SIGTRAP | 0x80 {
        return Ok(Some(Stop::Signal(st & 0xff)));
    }
    let mut status = 0;
    loop {
        // SAFETY: waitpid writes the status word we own.
        let r = unsafe { libc::waitpid(tid, &mut status, libc::__WALL) };
        if r != -1 {
            break;
        }
        if io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return Err(fail("waitpid"));
        }
    }
    Ok(Some(if libc::WIFEXITED(status) {
        Stop::Exited(libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        Stop::Killed(libc::WTERMSIG(status))
    } else {
        let sig = libc::WSTOPSIG(status);
        match status >> 16 {
            0 if sig == libc::SIGTRAP | 0x80 => Stop::Syscall,
            0 => Stop::Signal(sig),
            PTRACE_EVENT_STOP => Stop::Event { sig },
            _ => Stop::OtherEvent,
        }
    }))
}

/// The target's memory through `/proc/PID/mem`: readable and writable (even read-only
/// pages) by its tracer.
pub struct Mem {
    file: File,
    pid: i32,
}

impl Mem {
    pub fn open(pid: i32) -> Result<Mem> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/{pid}/mem"))
            .map_err(|source| PtraceError {
                call: "open /proc/PID/mem",
                tid: pid,
                source,
            })?;
        Ok(Mem { file, pid })
    }

    pub fn write(&self, addr: u64, data: &[u8]) -> Result<()> {
        self.file
            .write_all_at(data, addr)
            .map_err(|source| PtraceError {
                call: "write /proc/PID/mem",
                tid: self.pid,
                source,
            })
    }

    /// `buf.len()` bytes at `addr` (all of them, or an error).
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> Result<()> {
        self.file
            .read_exact_at(buf, addr)
            .map_err(|source| PtraceError {
                call: "read /proc/PID/mem",
                tid: self.pid,
                source,
            })
    }

    /// A NUL-terminated string at `addr`, at most `max` bytes.
    pub fn read_cstr(&self, addr: u64, max: usize) -> Vec<u8> {
        let mut out = Vec::new();
        let mut chunk = [0u8; 64];
        while out.len() < max {
            // A string may end just before an unmapped page: read what is readable.
            let n = match self.file.read_at(&mut chunk, addr + out.len() as u64) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if let Some(z) = chunk[..n].iter().position(|&b| b == 0) {
                out.extend_from_slice(&chunk[..z]);
                return out;
            }
            out.extend_from_slice(&chunk[..n]);
        }
        out
    }
}
