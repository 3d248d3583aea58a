//! The agent's own thread, made without the program's `pthread_create` (which would
//! `calloc` the new thread's DTV from the program's allocator and list the thread in the
//! program's thread list): a raw `clone` of this process's thread group, on a stack and a
//! thread-local block the agent maps itself.
//!
//! Its thread-local block is a copy of the creating thread's static TLS block and thread
//! descriptor (glibc's `struct pthread`, x86-64 TLS variant II: the static blocks below the
//! thread pointer, the descriptor at it), fixed up so that glibc and the agent's Rust code
//! see a thread of their own:
//!
//! - the descriptor's `tcb` and `self` words (thread pointer + 0 and + 16) point at the copy;
//! - its `tid` (offset from glibc's `_thread_db_pthread_tid`) is written by the kernel at
//!   clone (`CLONE_CHILD_SETTID`): glibc's recursive locks (the loader's) own by tid;
//! - its DTV is the agent's own, every entry unallocated and its generation the largest
//!   number: `__tls_get_addr` then never updates it (no `malloc`, no `free`) and finds a
//!   static module's block from this thread's pointer (`tls_get_addr_tail`). The agent's
//!   own TLS is static (preloaded, or `DF_STATIC_TLS` when `dlopen`ed), as is libc's;
//! - the probe path's per-thread state starts fresh ([`ftprobe::trace::reset_copied_thread_state`]).
//!
//! The thread blocks every asynchronous signal (the program's process-directed signals go to
//! its own threads) but the CPU-time timers' (SIGPROF, SIGVTALRM: raised by its own time,
//! the kernel gives them to it, and the program's handler runs there), never the synchronous
//! ones (a trap blocked when forced would reset
//! its action to the default, for the whole process). It lives until the process exits or
//! execs; nothing of it is freed.

use std::ffi::c_void;

/// glibc's descriptor layout, read from its `libthread_db` descriptors.
struct Layout {
    /// `sizeof(struct pthread)`.
    pthread_size: usize,
    /// `offsetof(struct pthread, tid)`.
    tid_offset: usize,
    /// `_dl_get_tls_static_info`: the static TLS size (descriptor included) and alignment.
    static_size: usize,
    static_align: usize,
}

fn layout() -> Result<Layout, String> {
    let sym = |name: &std::ffi::CStr| {
        // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name.
        let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
        (!p.is_null()).then_some(p)
    };
    let size = sym(c"_thread_db_sizeof_pthread")
        .ok_or("the C library has no _thread_db_sizeof_pthread (not glibc 2.34 or later?)")?;
    let tid =
        sym(c"_thread_db_pthread_tid").ok_or("the C library has no _thread_db_pthread_tid")?;
    let info =
        sym(c"_dl_get_tls_static_info").ok_or("the loader has no _dl_get_tls_static_info")?;
    // SAFETY: glibc's descriptors: a u32 size, and {bits, count, offset} u32 triples.
    let (pthread_size, tid_desc) = unsafe {
        (
            *(size as *const u32) as usize,
            std::ptr::read(tid as *const [u32; 3]),
        )
    };
    if tid_desc[0] != 32 {
        return Err(format!("unexpected tid descriptor {tid_desc:?}"));
    }
    let (mut static_size, mut static_align) = (0usize, 0usize);
    // SAFETY: `void _dl_get_tls_static_info(size_t *, size_t *)`, GLIBC_PRIVATE.
    unsafe {
        let f: extern "C" fn(*mut usize, *mut usize) = std::mem::transmute(info);
        f(&mut static_size, &mut static_align);
    }
    if pthread_size == 0 || pthread_size > 16 << 10 || static_size < pthread_size {
        return Err(format!(
            "unexpected TLS layout: struct pthread {pthread_size} bytes, static TLS {static_size}"
        ));
    }
    Ok(Layout {
        pthread_size,
        tid_offset: tid_desc[2] as usize,
        static_size,
        static_align: static_align.max(64),
    })
}

/// The thread pointer (`%fs:0`, the descriptor's `tcb` word).
fn thread_pointer() -> usize {
    let tp: usize;
    // SAFETY: reads %fs:0, the TCB's self pointer (x86-64 TLS variant II).
    unsafe {
        std::arch::asm!("mov {}, qword ptr fs:[0]", out(reg) tp,
                        options(nostack, readonly, preserves_flags))
    };
    tp
}

const STACK: usize = 512 << 10;
/// DTV entries (`dtv_t`, 16 bytes each) of the thread's own DTV.
const DTV_ENTRIES: usize = 4096;
/// `TLS_DTV_UNALLOCATED`.
const UNALLOCATED: usize = usize::MAX;

fn map(len: usize) -> Result<*mut u8, String> {
    // SAFETY: a fresh private anonymous mapping.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(format!("mmap: {}", std::io::Error::last_os_error()));
    }
    Ok(p.cast())
}

/// Start `entry(arg)` on a new thread of this process (module docs). Returns its tid.
///
/// # Safety
/// Called from a thread of the program (its TLS is copied) that is not on the probe path.
/// `entry` never returns (it ends with `SYS_exit`) and touches only static TLS.
pub unsafe fn spawn(
    entry: extern "C" fn(*mut c_void) -> !,
    arg: *mut c_void,
) -> Result<i32, String> {
    let l = layout()?;
    let tp = thread_pointer();
    let below = l.static_size - l.pthread_size;
    // The copy: [tp - below, tp + pthread_size), the new thread pointer congruent to the old
    // one modulo the static blocks' alignment.
    let align = l.static_align.max(4096);
    let tls_len = below + l.pthread_size + 2 * align;
    let tls = map(tls_len)?;
    let mut new_tp = tls as usize + below + align;
    new_tp += (tp.wrapping_sub(new_tp)) % align;
    // SAFETY: both ranges are the static TLS of a live thread (ours, as glibc laid it out)
    // and our fresh mapping, which holds it (tls_len leaves `align` of room either side).
    unsafe {
        std::ptr::copy_nonoverlapping(
            (tp - below) as *const u8,
            (new_tp - below) as *mut u8,
            below + l.pthread_size,
        )
    };
    let dtv = map((DTV_ENTRIES + 2) * 16)? as *mut usize;
    // SAFETY: the DTV mapping holds DTV_ENTRIES + 2 entries of two words; the descriptor's
    // words are in the copy made above.
    unsafe {
        // dtv[-1].counter: the length; dtv[0].counter: the generation.
        *dtv = DTV_ENTRIES;
        *dtv.add(2) = usize::MAX;
        for i in 1..=DTV_ENTRIES {
            *dtv.add(2 + 2 * i) = UNALLOCATED;
            *dtv.add(2 + 2 * i + 1) = 0;
        }
        let d = new_tp as *mut usize;
        *d = new_tp; // header.tcb
        *d.add(1) = dtv.add(2) as usize; // header.dtv: points at dtv[0]
        *d.add(2) = new_tp; // header.self
        *((new_tp + l.tid_offset) as *mut i32) = 0;
    }
    let stack = map(STACK + 4096)?;
    // SAFETY: the stack's lowest page becomes its guard.
    unsafe { libc::mprotect(stack.cast(), 4096, libc::PROT_NONE) };
    let top = (stack as usize + STACK + 4096) & !15;
    // The child pops `entry` then `arg`.
    // SAFETY: two words below the top of our fresh stack.
    unsafe {
        *((top - 16) as *mut usize) = entry as usize;
        *((top - 8) as *mut usize) = arg as usize;
    }
    // Every asynchronous signal blocked in the child (it inherits the mask at clone).
    // SAFETY: sigset operations on local sets; rt_sigprocmask of this thread.
    let old = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        for s in [
            libc::SIGTRAP,
            libc::SIGSEGV,
            libc::SIGBUS,
            libc::SIGILL,
            libc::SIGFPE,
            libc::SIGSYS,
        ] {
            libc::sigdelset(&mut all, s);
        }
        // The CPU-time timers' signals stay as the calling thread has them: the kernel gives
        // one to the thread whose time raised it unless that thread blocks it, and this
        // thread's time (a control command's work) blocked here sent gprof's SIGPROF to a
        // sleeping thread of the program, failing its `nanosleep` with EINTR.
        let mut cur: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut cur);
        for s in [libc::SIGPROF, libc::SIGVTALRM] {
            if libc::sigismember(&cur, s) == 0 {
                libc::sigdelset(&mut all, s);
            }
        }
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        old
    };
    let flags = (libc::CLONE_VM
        | libc::CLONE_FS
        | libc::CLONE_FILES
        | libc::CLONE_SIGHAND
        | libc::CLONE_THREAD
        | libc::CLONE_SYSVSEM
        | libc::CLONE_SETTLS
        | libc::CLONE_CHILD_SETTID) as u64;
    let ctid = (new_tp + l.tid_offset) as u64;
    let ret: i64;
    // SAFETY: clone(flags, stack, ptid, ctid, tls): the child starts on its own stack with
    // its own thread pointer; it pops `entry` and `arg` and calls `entry`, which never
    // returns (the `ud2` is never reached). The parent continues with rax = the tid.
    unsafe {
        std::arch::asm!(
            "syscall",
            "test rax, rax",
            "jnz 2f",
            "xor ebp, ebp",
            "pop rax",
            "pop rdi",
            "call rax",
            "ud2",
            "2:",
            inlateout("rax") libc::SYS_clone => ret,
            in("rdi") flags,
            in("rsi") (top - 16) as u64,
            in("rdx") 0u64,
            in("r10") ctid,
            in("r8") new_tp as u64,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
    }
    if ret < 0 {
        return Err(format!(
            "clone: {}",
            std::io::Error::from_raw_os_error(-ret as i32)
        ));
    }
    Ok(ret as i32)
}
