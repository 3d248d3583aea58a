//! `--follow-exec` (issue 13, item 5): a program that replaces itself with `exec` is traced
//! on in its new image, as uftrace does by default and `perf`/`strace` do with `-f`.
//!
//! - At start (before the agent scrubs its variables from the environment) the session's
//!   settings are saved: every `FTPROBE_*` variable the CLI set, and the agent's path in
//!   `LD_PRELOAD`. The rings' memfd is kept open (it is closed otherwise), with `FD_CLOEXEC`
//!   set so that programs the traced one runs some other way never see it.
//! - The exec wrappers (`exec.rs`) ask [`prepare`] for the new image's environment: the
//!   program's own (its `envp`, or `environ`) minus any session variable, plus the saved
//!   ones, `LD_PRELOAD` with the agent first (then the program's own `LD_PRELOAD`, if any)
//!   and `FTPROBE_EXEC_PID` (this process's id: only the process that exec'd joins the
//!   session, never a child that inherits the environment of an image whose agent did not
//!   start). `FD_CLOEXEC` is cleared on the memfd just before the real call and set again if
//!   it returns ([`exec_failed`]). Built with the agent's allocator (lock-free, see `alloc`)
//!   and raw system calls: a `vfork` child may run it (its blocks are then left to the
//!   parent, a few hundred bytes per exec).
//! - The new image's agent joins the session: it appends its objects to the objects table
//!   (never replacing the table, which the old image's records still need), and writes a
//!   [`TEXT_IMAGE`] record (`PID\tTSC\tFIRST\tCOUNT\tEXE`: the image starts at TSC, with
//!   the COUNT objects from table index FIRST) from which the CLI symbolizes that pid's later records. Its threads
//!   claim rings as a forked child's do. A child it forks runs the same image: the
//!   interposed [`fork`] makes the child's first claimed ring start with the child's
//!   image (nothing is claimed in the child for it).
//! - Not followed (the exec note says why, and the program's environment is passed as it
//!   is): a statically linked file (no `PT_INTERP`: no dynamic loader to preload the agent),
//!   a setuid or setgid one (the loader ignores `LD_PRELOAD`), or the memfd is no longer
//!   open at its number (the program closed it). An image whose agent never reports in is
//!   found by the CLI (an exec noted as followed, and no [`TEXT_IMAGE`] from that pid after it).

use std::ffi::{c_char, CStr, CString};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::OnceLock;

use ftprobe::sys;
use ftprobe::trace;

/// TEXT record kind: `PID\tTSC\tFIRST\tCOUNT\tEXE`, an exec'd image's agent joined the
/// session.
pub const TEXT_IMAGE: u32 = 4;

/// The session's variables (all of the agent's but `FTPROBE_EXEC_PID`, which is per exec).
pub const SESSION_VARS: [&str; 14] = [
    "FTPROBE_CONTROL_FD",
    "FTPROBE_PRELOADED",
    "FTPROBE_RING_FD",
    "FTPROBE_CLI_PID",
    "FTPROBE_FILTER",
    "FTPROBE_NOTRACE",
    "FTPROBE_FUNCTION",
    "FTPROBE_EVENTS",
    "FTPROBE_TRACER",
    "FTPROBE_GRAPH_FUNCTION",
    "FTPROBE_GRAPH_NOTRACE",
    "FTPROBE_MAX_DEPTH",
    "FTPROBE_FOLLOW_EXEC",
    "FTPROBE_EXEC_PID",
];

/// What [`save`] kept for the exec'd images.
struct Saved {
    /// `NAME=value` of each session variable that was set (not `FTPROBE_EXEC_PID`, nor
    /// `FTPROBE_PRELOADED`: an exec'd program gets only the agent preloaded).
    vars: Vec<CString>,
    /// The agent's path, as `LD_PRELOAD` named it.
    agent: Vec<u8>,
}

static SAVED: OnceLock<Saved> = OnceLock::new();
/// The memfd kept open (-1: none), and its inode and device, to see that it is still ours.
static RING_FD: AtomicI32 = AtomicI32::new(-1);
static RING_INO: AtomicU64 = AtomicU64::new(0);
static RING_DEV: AtomicU64 = AtomicU64::new(0);
/// This image was exec'd by a followed process (`FTPROBE_EXEC_PID` is this pid).
static EXEC_IMAGE: AtomicI32 = AtomicI32::new(0);

/// Whether `FTPROBE_EXEC_PID` names this process: it is a followed exec's new image, and
/// joins the session whoever its parent is. Read before the variables are removed.
pub fn exec_pid_is_mine() -> bool {
    let mine = std::env::var("FTPROBE_EXEC_PID")
        .ok()
        .and_then(|p| p.parse::<u32>().ok())
        .is_some_and(|p| p == sys::getpid());
    if mine {
        EXEC_IMAGE.store(1, Ordering::Relaxed);
    }
    mine
}

/// This image is a followed exec's.
pub fn exec_image() -> bool {
    EXEC_IMAGE.load(Ordering::Relaxed) != 0
}

/// The session follows execs (`FTPROBE_FOLLOW_EXEC=1`, saved by [`save`]).
pub fn enabled() -> bool {
    SAVED.get().is_some()
}

/// At start, before the variables are removed (one thread): save the session's settings
/// when it follows execs.
pub fn save() {
    if std::env::var("FTPROBE_FOLLOW_EXEC").as_deref() != Ok("1") {
        return;
    }
    let vars = SESSION_VARS
        .iter()
        .filter(|v| {
            !matches!(
                **v,
                "FTPROBE_EXEC_PID" | "FTPROBE_PRELOADED" | "FTPROBE_CONTROL_FD"
            )
        })
        .filter_map(|v| {
            let value = std::env::var_os(v)?;
            let mut entry = v.as_bytes().to_vec();
            entry.push(b'=');
            entry.extend_from_slice(value.as_encoded_bytes());
            CString::new(entry).ok()
        })
        .collect();
    let agent = std::env::var("LD_PRELOAD")
        .unwrap_or_default()
        .split([':', ' '])
        .find(|p| p.ends_with("libftprobe_agent.so"))
        .unwrap_or_default()
        .as_bytes()
        .to_vec();
    if agent.is_empty() {
        return;
    }
    let _ = SAVED.set(Saved { vars, agent });
}

/// The rings' memfd `fd` is attached: keep it open for the exec'd images (with
/// `FD_CLOEXEC`) when the session follows execs. `false`: close it as usual.
pub fn keep_fd(fd: i32) -> bool {
    if !enabled() {
        return false;
    }
    let Some((dev, ino)) = fd_id(fd) else {
        return false;
    };
    // SAFETY: fcntl on a descriptor number, integer arguments only.
    if unsafe { sys::raw_syscall4(libc::SYS_fcntl, fd as u64, libc::F_SETFD as u64, 1, 0) } < 0 {
        return false;
    }
    RING_DEV.store(dev, Ordering::Relaxed);
    RING_INO.store(ino, Ordering::Relaxed);
    RING_FD.store(fd, Ordering::Relaxed);
    true
}

/// (device, inode) of the file open at `fd`, by a raw `fstat`.
fn fd_id(fd: i32) -> Option<(u64, u64)> {
    // SAFETY: a zeroed stat is a valid out-buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes one struct stat.
    let r = unsafe {
        sys::raw_syscall4(
            libc::SYS_fstat,
            fd as u64,
            &mut st as *mut libc::stat as u64,
            0,
            0,
        )
    };
    (r == 0).then_some((st.st_dev, st.st_ino))
}

/// The environment an exec wrapper passes on: the new image's, and what it holds.
pub struct Prepared {
    /// The `envp` array, NULL-terminated.
    pub envp: Vec<*const c_char>,
    /// The entries the array points to that were made here.
    _made: Vec<CString>,
}

/// Why an exec of `path` cannot be followed, if it cannot: its file, as the kernel would
/// run it (a `#!` script: its interpreter, one level).
fn refuse(path: &[u8]) -> Option<&'static str> {
    let fd = RING_FD.load(Ordering::Relaxed);
    if fd < 0 {
        return Some("the session's rings are not open in this process");
    }
    if fd_id(fd)
        != Some((
            RING_DEV.load(Ordering::Relaxed),
            RING_INO.load(Ordering::Relaxed),
        ))
    {
        return Some("the program closed ftprobe's ring descriptor");
    }
    let mut path = path.to_vec();
    for _ in 0..2 {
        let (mode, head) = read_head(&path)?;
        if mode & (libc::S_ISUID | libc::S_ISGID) != 0 {
            return Some("it is setuid or setgid: the dynamic loader ignores LD_PRELOAD");
        }
        if let Some(script) = head.strip_prefix(b"#!") {
            let line = script.split(|&b| b == b'\n').next().unwrap_or_default();
            let interp: Vec<u8> = line
                .iter()
                .copied()
                .skip_while(|b| *b == b' ' || *b == b'\t')
                .take_while(|b| *b != b' ' && *b != b'\t')
                .collect();
            path = interp;
            continue;
        }
        if elf_is_static(&head) {
            return Some("it is statically linked: no dynamic loader to preload the agent");
        }
        return None;
    }
    None
}

/// The mode of the file at `path` and its first bytes (up to 4 KiB), by raw system calls;
/// `None` when it cannot be read (exec will say why, or run it untested).
fn read_head(path: &[u8]) -> Option<(u32, Vec<u8>)> {
    let cpath = CString::new(path).ok()?;
    // SAFETY: openat with a NUL-terminated path.
    let fd = unsafe {
        sys::raw_syscall4(
            libc::SYS_openat,
            libc::AT_FDCWD as u64,
            cpath.as_ptr() as u64,
            (libc::O_RDONLY | libc::O_CLOEXEC) as u64,
            0,
        )
    };
    if fd < 0 {
        return None;
    }
    let fd = fd as i32;
    let mode = {
        // SAFETY: a zeroed stat is a valid out-buffer.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstat writes one struct stat.
        let r = unsafe {
            sys::raw_syscall4(
                libc::SYS_fstat,
                fd as u64,
                &mut st as *mut libc::stat as u64,
                0,
                0,
            )
        };
        if r == 0 {
            st.st_mode
        } else {
            0
        }
    };
    let mut buf = vec![0u8; 4096];
    // SAFETY: pread64 into a live buffer of that length.
    let n = unsafe {
        sys::raw_syscall4(
            libc::SYS_pread64,
            fd as u64,
            buf.as_mut_ptr() as u64,
            buf.len() as u64,
            0,
        )
    };
    // SAFETY: close of the descriptor opened above.
    unsafe { sys::raw_syscall4(libc::SYS_close, fd as u64, 0, 0, 0) };
    buf.truncate(n.max(0) as usize);
    Some((mode, buf))
}

/// An ELF executable without `PT_INTERP` (static, or static-pie): no dynamic loader. Program
/// headers past the bytes read count as dynamic (not refused).
fn elf_is_static(head: &[u8]) -> bool {
    if head.len() < 64 || !head.starts_with(b"\x7fELF") || head[4] != 2 {
        return false;
    }
    let u16_at = |o: usize| u16::from_le_bytes([head[o], head[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(head[0x20..0x28].try_into().expect("8 bytes")) as usize;
    let (phentsize, phnum) = (u16_at(0x36), u16_at(0x38));
    if phentsize < 4 || phoff.saturating_add(phentsize.saturating_mul(phnum)) > head.len() {
        return false;
    }
    !(0..phnum).any(|i| {
        let o = phoff + i * phentsize;
        u32::from_le_bytes(head[o..o + 4].try_into().expect("4 bytes")) == libc::PT_INTERP
    })
}

/// For an exec of `path` with the environment `envp` (`None`: `environ`): the new image's
/// environment, or why it is not followed. Only when the session follows execs and this
/// process traces (`None` otherwise: nothing to say).
///
/// # Safety
/// `envp` is null or a NULL-terminated array of C strings (as `execve` takes it).
pub unsafe fn prepare(
    path: &[u8],
    envp: Option<*const *const c_char>,
) -> Option<Result<Prepared, &'static str>> {
    let saved = SAVED.get()?;
    trace::buffer()?;
    if let Some(why) = refuse(path) {
        return Some(Err(why));
    }
    extern "C" {
        static environ: *const *const c_char;
    }
    let envp = match envp {
        Some(e) => e,
        // SAFETY: `environ` is the C library's; read once.
        None => unsafe { environ },
    };
    let mut out: Vec<*const c_char> = Vec::new();
    let mut user_preload: Option<&[u8]> = None;
    let mut p = envp;
    while !p.is_null() {
        // SAFETY: the caller's array, NULL-terminated.
        let e = unsafe { *p };
        if e.is_null() {
            break;
        }
        // SAFETY: an entry of that array, a C string.
        let bytes = unsafe { CStr::from_ptr(e) }.to_bytes();
        let name = bytes.split(|&b| b == b'=').next().unwrap_or_default();
        if name == b"LD_PRELOAD" {
            user_preload = Some(&bytes[name.len() + 1..]);
        } else if !SESSION_VARS.iter().any(|v| v.as_bytes() == name) {
            out.push(e);
        }
        // SAFETY: not past the NULL.
        p = unsafe { p.add(1) };
    }
    let mut made: Vec<CString> = Vec::with_capacity(saved.vars.len() + 2);
    let mut preload = b"LD_PRELOAD=".to_vec();
    preload.extend_from_slice(&saved.agent);
    if let Some(u) = user_preload.filter(|u| !u.is_empty()) {
        preload.push(b':');
        preload.extend_from_slice(u);
    }
    made.extend(CString::new(preload).ok());
    made.extend(CString::new(format!("FTPROBE_EXEC_PID={}", sys::getpid())).ok());
    out.extend(made.iter().map(|c| c.as_ptr()));
    out.extend(saved.vars.iter().map(|c| c.as_ptr()));
    out.push(std::ptr::null());
    // The memfd must be open in the new image.
    let fd = RING_FD.load(Ordering::Relaxed);
    // SAFETY: fcntl on our descriptor, integer arguments only.
    unsafe { sys::raw_syscall4(libc::SYS_fcntl, fd as u64, libc::F_SETFD as u64, 0, 0) };
    Some(Ok(Prepared {
        envp: out,
        _made: made,
    }))
}

/// A prepared exec returned (it failed): the memfd is close-on-exec again.
pub fn exec_failed() {
    let fd = RING_FD.load(Ordering::Relaxed);
    if fd >= 0 {
        // SAFETY: fcntl on our descriptor, integer arguments only.
        unsafe { sys::raw_syscall4(libc::SYS_fcntl, fd as u64, libc::F_SETFD as u64, 1, 0) };
    }
}

/// This image's `FIRST\tCOUNT\tEXE` (an exec'd image's), for its forked children.
static IMAGE: OnceLock<String> = OnceLock::new();

/// An exec'd image joined the session: its `count` objects start at table index `first`.
pub fn announce_image(first: usize, count: usize, tsc: u64) {
    let exe = std::fs::read_link("/proc/self/exe").unwrap_or_default();
    let image = IMAGE.get_or_init(|| format!("{first}\t{count}\t{}", exe.to_string_lossy()));
    trace::write_text(TEXT_IMAGE, &format!("{}\t{tsc}\t{image}", sys::getpid()));
}

static NEXT_FORK: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The C library's `fork`, looked up once (a `dlsym` may allocate: never at a fork).
fn next_fork() -> usize {
    // Relaxed: a cache; a racing lookup stores the same value.
    let mut f = NEXT_FORK.load(Ordering::Relaxed);
    if f == 0 {
        // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated name; a lookup only.
        f = unsafe { libc::dlsym(libc::RTLD_NEXT, c"fork".as_ptr()) } as usize;
        NEXT_FORK.store(f, Ordering::Relaxed);
    }
    f
}

/// Resolve the C library's `fork`: called when the agent starts.
pub fn init() {
    next_fork();
}

/// Interposed `fork(2)`. A forked child runs its parent's image: when that is an exec'd
/// image, the child's first claimed ring starts with a [`TEXT_IMAGE`] for the child's pid
/// (from before the fork), so the CLI names the child's records from it, having read it
/// before them (a note the parent wrote into its own ring could be read after the child's
/// records: the parent may not run again for a while). Built before the fork: the child
/// allocates nothing. Otherwise the C library's `fork`, nothing more.
///
/// # Safety
/// As `fork(2)`.
#[no_mangle]
pub unsafe extern "C" fn fork() -> libc::pid_t {
    let f = next_fork();
    if f == 0 {
        // SAFETY: this thread's errno.
        unsafe { *libc::__errno_location() = libc::ENOSYS };
        return -1;
    }
    // `\tTSC\tFIRST\tCOUNT\tEXE`, and room for the note's words (the pid first).
    let note = IMAGE
        .get()
        .filter(|_| trace::buffer().is_some())
        .map(|image| {
            let tail = format!("\t{}\t{image}", ftprobe::ring::read_tsc());
            let words = Vec::<u64>::with_capacity((tail.len() + 10).div_ceil(8));
            (tail, words)
        });
    // SAFETY: the C library's `fork`, of this type.
    let pid = unsafe { std::mem::transmute::<usize, unsafe extern "C" fn() -> libc::pid_t>(f)() };
    if let (Some((tail, mut words)), 0) = (note, pid) {
        // The pid's digits, formatted into a stack buffer (no allocation).
        let mut digits = std::io::Cursor::new([0u8; 10]);
        let _ = std::io::Write::write_fmt(&mut digits, format_args!("{}", sys::getpid()));
        let len = digits.position() as usize;
        let mut bytes = digits.get_ref()[..len]
            .iter()
            .chain(tail.as_bytes())
            .copied();
        // Within the capacity reserved: no allocation.
        while words.len() < words.capacity() {
            let mut w = [0u8; 8];
            w.iter_mut().zip(&mut bytes).for_each(|(d, b)| *d = b);
            words.push(u64::from_le_bytes(w));
        }
        // The child's: kept for its life (never freed, nothing allocated here).
        std::mem::forget(tail);
        trace::note_at_first_claim(TEXT_IMAGE, words.leak());
    }
    pid
}
