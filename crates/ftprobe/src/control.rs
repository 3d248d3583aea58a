//! The control channel of a live session: the CLI's requests to the agent while the program
//! runs (add, remove, enable and disable kprobe events, change the function tracer's
//! filters, switch it on or off, `tracing_on`, read `kprobes/list`), as typed messages,
//! encoded and decoded here only (JSON), shared by the CLI and the agent.
//!
//! # Transport
//!
//! A memfd the CLI makes ([`ControlArea::create`]), inherited by the program like the
//! rings' (`FTPROBE_CONTROL_FD`), mapped shared by both. One request at a time:
//!
//! ```text
//! offset  size      field
//! 0       8         magic "FTPCTL01"
//! 8       4         req_seq   (u32, futex): the CLI bumps it after writing a request
//! 12      4         done_seq  (u32, futex): the agent sets it to req_seq after its reply
//! 16      4         req_len   (bytes of the request)
//! 20      4         reply_len (bytes of the reply)
//! 24      4         agent_tid (the agent's control thread, once it runs; 0 before)
//! 28      4         closed    (1: the CLI is gone or the session ended)
//! 64      64 KiB    request   (JSON of a `Request`)
//! 64 KiB+64  1 MiB  reply     (JSON of a `Reply`)
//! ```
//!
//! The agent's control thread waits on `req_seq` (a shared futex), carries the request out
//! while the program's threads run (every change goes through the batch `text_poke`
//! protocol, as a tracefs write does in the kernel), writes the reply, publishes
//! `done_seq` and wakes the CLI.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What the CLI asks the agent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// `kprobe_events` `p:`/`r:` definition: create event `id`, disabled (the kernel's
    /// semantics of a write to `kprobe_events`; `enable` arms it).
    AddEvent { id: u32, def: String },
    /// `-:EVENT`: unregister event `id` (disabled first by the CLI's rule: the kernel refuses
    /// with EBUSY while it is enabled).
    RemoveEvent { id: u32 },
    /// `events/GRP/EVENT/enable`.
    EnableEvent { id: u32, enable: bool },
    /// `set_ftrace_filter` (`notrace`: `set_ftrace_notrace`) of the session's tracer:
    /// `reset` replaces the list (`>`), else appends (`>>`); `!PAT` removes. An empty
    /// `patterns` with `reset` clears the list.
    SetFilter {
        notrace: bool,
        reset: bool,
        patterns: Vec<String>,
    },
    /// `current_tracer`: `nop`, `function` or `function_graph`.
    SetTracer { tracer: String },
    /// `tracing_on`: stop or start writing events into the rings (callbacks still run).
    TracingOn { on: bool },
    /// Read `kprobes/list`.
    KprobesList,
}

/// The agent's answer: `ok`, and the text (the error, as the kernel's `error_log` line
/// where the kernel has one, or the file read).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reply {
    pub ok: bool,
    pub text: String,
}

const MAGIC: &[u8; 8] = b"FTPCTL01";
const OFF_REQ_SEQ: usize = 8;
const OFF_DONE_SEQ: usize = 12;
const OFF_REQ_LEN: usize = 16;
const OFF_REPLY_LEN: usize = 20;
const OFF_AGENT_TID: usize = 24;
const OFF_CLOSED: usize = 28;
const HEADER: usize = 64;
/// Largest request (bytes of JSON).
pub const REQUEST_MAX: usize = 64 << 10;
/// Largest reply (bytes of JSON); a longer reply's text is cut.
pub const REPLY_MAX: usize = 1 << 20;
const SIZE: usize = HEADER + REQUEST_MAX + REPLY_MAX;

/// Why a request could not be carried.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("the control area: {0}")]
    Io(#[from] std::io::Error),
    #[error("not a control area (bad magic)")]
    BadMagic,
    #[error("the request is {0} bytes, more than {REQUEST_MAX}")]
    TooLarge(usize),
    #[error("the agent did not answer within {0:?} (is the program stopped?)")]
    Timeout(Duration),
    #[error("the session ended")]
    Closed,
    #[error("a malformed message: {0}")]
    Malformed(String),
}

/// The shared control area, mapped.
pub struct ControlArea {
    base: *mut u8,
}

// SAFETY: the mapping is shared memory accessed through atomics (header) and by the one
// side whose turn it is (request, reply), as the protocol in the module docs says.
unsafe impl Send for ControlArea {}
// SAFETY: as above.
unsafe impl Sync for ControlArea {}

impl ControlArea {
    /// A new area in a memfd (CLOEXEC cleared by the caller that passes it on).
    pub fn create() -> Result<(ControlArea, OwnedFd), ControlError> {
        // SAFETY: memfd_create with a NUL-terminated name; the fd returned is ours.
        let raw = unsafe { libc::memfd_create(c"ftprobe-control".as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        // SAFETY: a fresh descriptor nobody else owns.
        let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) };
        // SAFETY: ftruncate of our own memfd.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), SIZE as libc::off_t) } != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        let area = Self::map(fd.as_fd())?;
        // SAFETY: the mapping is SIZE bytes, writable; nobody else knows it yet.
        unsafe { std::ptr::copy_nonoverlapping(MAGIC.as_ptr(), area.base, 8) };
        Ok((area, fd))
    }

    /// Lay out a new area in `fd`, a memfd another process made (an attached program's).
    pub fn create_on(fd: BorrowedFd<'_>) -> Result<ControlArea, ControlError> {
        // SAFETY: ftruncate of a descriptor we hold.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), SIZE as libc::off_t) } != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        let area = Self::map(fd)?;
        // SAFETY: the mapping is SIZE bytes, writable; the agent reads it only once told.
        unsafe { std::ptr::copy_nonoverlapping(MAGIC.as_ptr(), area.base, 8) };
        Ok(area)
    }

    /// Map the area in `fd` (the agent's side); checks the magic.
    pub fn attach(fd: BorrowedFd<'_>) -> Result<ControlArea, ControlError> {
        let area = Self::map(fd)?;
        // SAFETY: the mapping is at least 8 bytes.
        let magic = unsafe { std::slice::from_raw_parts(area.base, 8) };
        if magic != MAGIC {
            return Err(ControlError::BadMagic);
        }
        Ok(area)
    }

    fn map(fd: BorrowedFd<'_>) -> Result<ControlArea, ControlError> {
        // SAFETY: a fresh shared mapping of the whole file; no existing memory is touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error().into());
        }
        Ok(ControlArea { base: p.cast() })
    }

    fn word(&self, off: usize) -> &AtomicU32 {
        // SAFETY: `off` is a 4-aligned header offset inside the mapping, which lives as long
        // as `self` (it is never unmapped while a reference exists: `Drop` needs `self`).
        unsafe { &*(self.base.add(off) as *const AtomicU32) }
    }

    /// The agent's control thread's tid, once it runs.
    pub fn agent_tid(&self) -> u32 {
        self.word(OFF_AGENT_TID).load(Ordering::Acquire)
    }

    /// Whether the session ended ([`ControlArea::close`]).
    pub fn closed(&self) -> bool {
        self.word(OFF_CLOSED).load(Ordering::Acquire) != 0
    }

    /// The CLI's side: the session ends; a waiting agent thread is woken and stops.
    pub fn close(&self) {
        self.word(OFF_CLOSED).store(1, Ordering::Release);
        self.word(OFF_REQ_SEQ).fetch_add(1, Ordering::AcqRel);
        futex_wake(self.word(OFF_REQ_SEQ));
    }

    /// The CLI's side: send `req` and wait up to `timeout` for the reply.
    pub fn call(&self, req: &Request, timeout: Duration) -> Result<Reply, ControlError> {
        if self.closed() {
            return Err(ControlError::Closed);
        }
        let bytes = serde_json::to_vec(req).map_err(|e| ControlError::Malformed(e.to_string()))?;
        if bytes.len() > REQUEST_MAX {
            return Err(ControlError::TooLarge(bytes.len()));
        }
        // SAFETY: the request buffer is REQUEST_MAX bytes at HEADER; the agent reads it only
        // after req_seq changes (Release below).
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.base.add(HEADER), bytes.len())
        };
        self.word(OFF_REQ_LEN)
            .store(bytes.len() as u32, Ordering::Relaxed);
        let seq = self
            .word(OFF_REQ_SEQ)
            .fetch_add(1, Ordering::AcqRel)
            .wrapping_add(1);
        futex_wake(self.word(OFF_REQ_SEQ));
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let done = self.word(OFF_DONE_SEQ).load(Ordering::Acquire);
            if done == seq {
                break;
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return Err(ControlError::Timeout(timeout));
            }
            futex_wait(
                self.word(OFF_DONE_SEQ),
                done,
                Some((deadline - now).min(Duration::from_millis(100))),
            );
        }
        let len = (self.word(OFF_REPLY_LEN).load(Ordering::Relaxed) as usize).min(REPLY_MAX);
        // SAFETY: the reply buffer is REPLY_MAX bytes after the request buffer; the agent
        // wrote it before its Release store of done_seq, which we loaded with Acquire.
        let reply = unsafe { std::slice::from_raw_parts(self.base.add(HEADER + REQUEST_MAX), len) };
        serde_json::from_slice(reply).map_err(|e| ControlError::Malformed(e.to_string()))
    }

    /// The agent's side: wait for the next request after `seen` (the last `req_seq`
    /// served). Returns the new sequence number and the request, or `None` once the
    /// session ended.
    pub fn next_request(&self, seen: u32) -> Option<(u32, Result<Request, ControlError>)> {
        loop {
            if self.closed() {
                return None;
            }
            let seq = self.word(OFF_REQ_SEQ).load(Ordering::Acquire);
            if seq != seen {
                let len =
                    (self.word(OFF_REQ_LEN).load(Ordering::Relaxed) as usize).min(REQUEST_MAX);
                // SAFETY: the CLI wrote the request before its Release increment of
                // req_seq, loaded with Acquire above; it writes no other until our reply.
                let bytes = unsafe { std::slice::from_raw_parts(self.base.add(HEADER), len) };
                let req = serde_json::from_slice(bytes)
                    .map_err(|e| ControlError::Malformed(e.to_string()));
                return Some((seq, req));
            }
            futex_wait(self.word(OFF_REQ_SEQ), seq, None);
        }
    }

    /// The agent's side: the reply to request `seq`.
    pub fn reply(&self, seq: u32, reply: &Reply) {
        let mut bytes = serde_json::to_vec(reply).unwrap_or_default();
        if bytes.len() > REPLY_MAX {
            let mut cut = reply.clone();
            cut.text.truncate(REPLY_MAX / 2);
            cut.text.push_str("\n(cut)\n");
            bytes = serde_json::to_vec(&cut).unwrap_or_default();
        }
        // SAFETY: the reply buffer is REPLY_MAX bytes; the CLI reads it only after done_seq
        // changes (Release below).
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.base.add(HEADER + REQUEST_MAX),
                bytes.len(),
            )
        };
        self.word(OFF_REPLY_LEN)
            .store(bytes.len() as u32, Ordering::Relaxed);
        self.word(OFF_DONE_SEQ).store(seq, Ordering::Release);
        futex_wake(self.word(OFF_DONE_SEQ));
    }

    /// The agent's side: its control thread runs.
    pub fn set_agent_tid(&self, tid: u32) {
        self.word(OFF_AGENT_TID).store(tid, Ordering::Release);
        futex_wake(self.word(OFF_AGENT_TID));
    }

    /// The CLI's side: wait up to `timeout` for the agent's control thread.
    pub fn wait_agent(&self, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if self.agent_tid() != 0 {
                return true;
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return false;
            }
            futex_wait(
                self.word(OFF_AGENT_TID),
                0,
                Some((deadline - now).min(Duration::from_millis(50))),
            );
        }
    }
}

impl Drop for ControlArea {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, SIZE bytes; no reference outlives `self`.
        unsafe { libc::munmap(self.base.cast(), SIZE) };
    }
}

/// FUTEX_WAIT on a shared word (not FUTEX_PRIVATE: the CLI and the agent are two
/// processes), while it holds `val`, up to `timeout`.
fn futex_wait(word: &AtomicU32, val: u32, timeout: Option<Duration>) {
    let ts = timeout.map(|d| libc::timespec {
        tv_sec: d.as_secs() as libc::time_t,
        tv_nsec: d.subsec_nanos() as libc::c_long,
    });
    let tsp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: FUTEX_WAIT reads the word (a live u32) and the timespec (live or null).
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            val,
            tsp,
            0usize,
            0u32,
        )
    };
}

/// FUTEX_WAKE every waiter on a shared word.
fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE only uses the word's address as a key.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            0usize,
            0usize,
            0u32,
        )
    };
}

/// The control socket of a live session: `ftprobe trace --control` serves it while the
/// program runs, one text command per line (the tracefs writes and reads a user of the
/// kernel's tracer knows: `echo 1 > events/kprobes/EV/enable`, `cat kprobe_profile`, ...),
/// one JSON [`Reply`] per line back. Only the session's own user may connect (the socket's
/// directory is private to that user, and the server checks the peer's credentials).
pub mod client {
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    use std::os::unix::net::UnixStream;
    use std::path::PathBuf;

    use super::Reply;

    /// The directories a control socket may be in, best first: `$XDG_RUNTIME_DIR/ftprobe`;
    /// with that unset, `/run/user/UID/ftprobe` (systemd's runtime directory of the user,
    /// when there is one, private to the user); then `$XDG_CACHE_HOME/ftprobe/run` (else
    /// `~/.cache/ftprobe/run`). None under a directory every user may write (`/tmp`), where
    /// another user could make it first and so refuse every session (issue 26, item 7).
    fn candidates() -> Vec<PathBuf> {
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        let abs = |v: Option<std::ffi::OsString>| {
            v.filter(|d| !d.is_empty())
                .map(PathBuf::from)
                .filter(|p| p.is_absolute())
        };
        let mut out = Vec::new();
        if let Some(d) = abs(std::env::var_os("XDG_RUNTIME_DIR")) {
            out.push(d.join("ftprobe"));
        } else {
            let run = PathBuf::from(format!("/run/user/{uid}"));
            if std::fs::symlink_metadata(&run)
                .is_ok_and(|m| m.is_dir() && m.uid() == uid && m.permissions().mode() & 0o077 == 0)
            {
                out.push(run.join("ftprobe"));
            }
        }
        let cache = abs(std::env::var_os("XDG_CACHE_HOME"))
            .or_else(|| abs(std::env::var_os("HOME")).map(|h| h.join(".cache")));
        if let Some(c) = cache {
            out.push(c.join("ftprobe").join("run"));
        }
        out
    }

    /// Whether `dir` is a directory of this user's that no one else may enter.
    fn is_private(dir: &std::path::Path) -> std::io::Result<()> {
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        let m = std::fs::symlink_metadata(dir)?;
        if !m.is_dir() || m.uid() != uid || m.permissions().mode() & 0o077 != 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!(
                    "{}: not a directory private to this user (uid {uid}, mode 0700)",
                    dir.display()
                ),
            ));
        }
        Ok(())
    }

    /// The longest socket path (`sockaddr_un`'s 108 bytes with the NUL), for `ctl-PID`.
    const MAX_PATH: usize = 107 - "ctl-4294967295".len() - 1;

    /// The directory of this user's control sockets: the first of the places above that is,
    /// or can be made (mode 0700), private to this user.
    pub fn socket_dir() -> std::io::Result<PathBuf> {
        let mut why = Vec::new();
        for dir in candidates() {
            if dir.as_os_str().len() > MAX_PATH {
                why.push(format!("{}: too long for a socket's path", dir.display()));
                continue;
            }
            let made = std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&dir);
            match made.and_then(|()| is_private(&dir)) {
                Ok(()) => return Ok(dir),
                Err(e) => why.push(e.to_string()),
            }
        }
        if why.is_empty() {
            why.push("neither XDG_RUNTIME_DIR nor HOME is set".into());
        }
        Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("no directory for the control socket: {}", why.join("; ")),
        ))
    }

    /// The control socket of the session tracing process `pid`: where a session serves it
    /// (in one of the places above that is private to this user), else where a new one
    /// would.
    pub fn socket_path(pid: u32) -> std::io::Result<PathBuf> {
        let name = format!("ctl-{pid}");
        for dir in candidates() {
            let p = dir.join(&name);
            if std::fs::symlink_metadata(&p).is_ok() && is_private(&dir).is_ok() {
                return Ok(p);
            }
        }
        Ok(socket_dir()?.join(name))
    }

    /// A connection to the session tracing process `pid`.
    pub struct Session {
        reader: BufReader<UnixStream>,
        writer: UnixStream,
    }

    impl Session {
        /// Connect to the session tracing `pid` (started with `ftprobe trace --control`).
        pub fn connect(pid: u32) -> std::io::Result<Session> {
            let path = socket_path(pid)?;
            let s = UnixStream::connect(&path).map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!(
                        "no control session for process {pid} ({}: {e}; start it with \
                         `ftprobe trace --control`)",
                        path.display()
                    ),
                )
            })?;
            Ok(Session {
                reader: BufReader::new(s.try_clone()?),
                writer: s,
            })
        }

        /// Send one command (one line, e.g. `echo 0 > tracing_on`); returns the reply.
        pub fn send(&mut self, command: &str) -> std::io::Result<Reply> {
            let line = command.replace('\n', " ");
            self.writer.write_all(line.as_bytes())?;
            self.writer.write_all(b"\n")?;
            let mut reply = String::new();
            if self.reader.read_line(&mut reply)? == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the session ended",
                ));
            }
            serde_json::from_str(&reply)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
        }
    }
}
