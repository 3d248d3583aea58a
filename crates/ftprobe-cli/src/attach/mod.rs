//! Attaching to a running process (`ftprobe trace -p PID`): stop every thread with ptrace,
//! make one of them call a function of the target (its own `dlopen`, then the agent's entry
//! points), put everything back as it was, and let the threads go.
//!
//! - **Stopping**: `PTRACE_SEIZE` + `PTRACE_INTERRUPT` each thread of `/proc/PID/task`,
//!   wait for its stop, and scan the list again until it brings no new thread (a stopped
//!   thread creates none, so the set is complete once a scan finds only stopped threads).
//!   A thread reports an interrupt stop, a group-stop (the process was stopped: it stops
//!   again when we detach), or a signal-delivery-stop (a signal was on its way: it is
//!   delivered at detach, with its own `siginfo`, as it would have been).
//! - **A remote call** ([`Attached::call`]): the calling thread's registers
//!   (`PTRACE_GETREGS`), extended state (`PTRACE_GETREGSET NT_X86_XSTATE`) and signal mask
//!   are saved; its arguments are copied below its stack's red zone, and below them a
//!   signal frame ([`sigframe`]) holding that saved state as the thread resumes; `rip` is
//!   the function, `orig_rax` -1 (no system call to restart), and every signal but
//!   those a fault or trap raises is blocked (nothing of the program's runs on this
//!   thread meanwhile, and a signal that arrives stays pending for later). The function returns into
//!   `rt_sigreturn` with that frame: through a return stub (`mov %rax,-8(%rsp)`, then
//!   glibc's `__restore_rt` sequence) on a page of its own that the first attach maps
//!   (calling `mmap` through the C library's `__restore_rt` itself), so that **whether or
//!   not ftprobe is still alive, the thread resumes exactly where it was**. While ftprobe
//!   lives, it follows the call from syscall-stop to syscall-stop, reads the result the
//!   stub left in the frame at the `rt_sigreturn`'s entry, skips that system call and puts
//!   the thread back by ptrace into an interrupt stop with its registers, extended state
//!   and mask as they were (a restart block, which `rt_sigreturn` would cancel, is kept).
//! - **System calls in progress**: a thread interrupted in a blocking call is stopped with
//!   `rax` = `-ERESTARTSYS` (or another `-ERESTART*`) and `orig_rax` = the call. Restoring
//!   those registers before it leaves its stop lets the kernel restart the call when the
//!   thread resumes (as for any stop without a handler to run): the program never sees
//!   `EINTR`.
//! - **Detaching**: `PTRACE_DETACH` with signal 0, or with the signal a thread was about to
//!   take when it stopped.
//!
//! Every ptrace request goes through [`ptrace`], the module's system-call choke point.

pub mod ptrace;
mod sigframe;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use ptrace::{Mem, Regs, Stop};

/// `-ERESTARTSYS`, `-ERESTARTNOINTR`, `-ERESTARTNOHAND`, `-ERESTART_RESTARTBLOCK`: a system
/// call that a stop interrupted and that the kernel restarts when the thread resumes.
const ERESTART: [i64; 4] = [-512, -513, -514, -516];
/// How long a thread may take to report its stop, and a remote call to return.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);
const CALL_TIMEOUT: Duration = Duration::from_secs(20);
/// `RTLD_NOW`.
const RTLD_NOW: u64 = 2;

/// What a process's `/proc/PID/status` says about it (the lines attach needs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Status {
    pub name: String,
    pub tracer_pid: i32,
    /// 0: off, 1: strict, 2: filter.
    pub seccomp: u32,
    /// Real uid.
    pub uid: u32,
    /// Ignored signals (bit n - 1 for signal n).
    pub sig_ign: u64,
    /// Permitted and effective capabilities (bit n for capability n).
    pub cap_prm: u64,
    pub cap_eff: u64,
    /// A kernel thread (`Kthread: 1`, Linux 6.0+).
    pub kthread: bool,
}

impl Status {
    pub fn parse(text: &str) -> Status {
        let mut s = Status::default();
        for line in text.lines() {
            let Some((key, value)) = line.split_once(':') else {
                continue;
            };
            let value = value.trim();
            match key {
                "Name" => s.name = value.to_owned(),
                "TracerPid" => s.tracer_pid = value.parse().unwrap_or(0),
                "Seccomp" => s.seccomp = value.parse().unwrap_or(0),
                "Uid" => {
                    s.uid = value
                        .split_whitespace()
                        .next()
                        .and_then(|u| u.parse().ok())
                        .unwrap_or(0)
                }
                "SigIgn" => s.sig_ign = u64::from_str_radix(value, 16).unwrap_or(0),
                "CapPrm" => s.cap_prm = u64::from_str_radix(value, 16).unwrap_or(0),
                "CapEff" => s.cap_eff = u64::from_str_radix(value, 16).unwrap_or(0),
                "Kthread" => s.kthread = value == "1",
                _ => {}
            }
        }
        s
    }

    fn read(path: &str) -> Option<Status> {
        std::fs::read_to_string(path)
            .ok()
            .map(|t| Status::parse(&t))
    }
}

/// What `kernel.yama.ptrace_scope` at `scope` means for attaching to another process, and
/// what would allow it; `None` for 0 (classic permissions).
pub fn yama_message(scope: u32) -> Option<String> {
    const ALTERNATIVES: &str = "or start the program under ftprobe instead \
                                (`ftprobe trace -- PROGRAM ...`), which needs no ptrace";
    Some(match scope {
        0 => return None,
        1 => format!(
            "kernel.yama.ptrace_scope is 1 (restricted ptrace): only a parent process, or \
             one the program named with prctl(PR_SET_PTRACER), may attach. To allow it: \
             `sysctl kernel.yama.ptrace_scope=0`, or run ftprobe with CAP_SYS_PTRACE (as \
             root), {ALTERNATIVES}"
        ),
        2 => format!(
            "kernel.yama.ptrace_scope is 2 (admin-only attach): only a process with \
             CAP_SYS_PTRACE may attach. To allow it: run ftprobe with CAP_SYS_PTRACE (as \
             root), or `sysctl kernel.yama.ptrace_scope=1` (then 0 for a process that is not \
             ftprobe's child), {ALTERNATIVES}"
        ),
        3 => format!(
            "kernel.yama.ptrace_scope is 3 (no attach): no process may attach with ptrace \
             until the next reboot (the setting cannot be lowered); {ALTERNATIVES}"
        ),
        n => format!("kernel.yama.ptrace_scope is {n} (unknown): attaching is refused"),
    })
}

/// Why `PTRACE_SEIZE` of `pid` failed with EPERM: the target's owner `target_uid` against
/// ours (`own_euid`), Yama's `ptrace_scope` (`None`: no Yama).
pub fn eperm_message(
    pid: i32,
    target_uid: Option<u32>,
    own_euid: u32,
    yama: Option<u32>,
) -> String {
    let mut why = Vec::new();
    if let Some(uid) = target_uid.filter(|&u| u != own_euid && own_euid != 0) {
        why.push(format!(
            "process {pid} belongs to uid {uid} and ftprobe runs as uid {own_euid}: attaching \
             to another user's process needs CAP_SYS_PTRACE (run ftprobe as root), or run \
             ftprobe as that user"
        ));
    }
    if let Some(m) = yama.and_then(yama_message) {
        why.push(m);
    }
    if why.is_empty() {
        why.push(format!(
            "process {pid} cannot be traced by this user (a setuid or otherwise non-dumpable \
             program, or a security module's policy): run ftprobe with CAP_SYS_PTRACE (as \
             root), or start the program under ftprobe (`ftprobe trace -- PROGRAM ...`)"
        ));
    }
    format!(
        "cannot attach to process {pid}: Operation not permitted (EPERM): {}",
        why.join("; ")
    )
}

/// `CAP_SYS_PTRACE`'s bit in a capability set.
const CAP_SYS_PTRACE: u32 = 19;

/// Why `PTRACE_SEIZE` of `pid` failed with EPERM although ftprobe has `CAP_SYS_PTRACE`
/// (`own`: ftprobe's status, `target`: the process's): the kernel's commoncap check passes
/// then, so it is another user namespace the capability does not reach, or a security
/// module; and it says which capabilities the target holds that ftprobe does not (a
/// container's bounding set, `CapBnd`, drops some: its root cannot trace the host's).
pub fn privileged_eperm_message(pid: i32, target: &Status, own: &Status) -> String {
    let missing: Vec<String> = (0..64)
        .filter(|b| target.cap_prm & !own.cap_eff & (1u64 << b) != 0)
        .map(cap_name)
        .collect();
    let mut text = format!(
        "cannot attach to process {pid} ({}): Operation not permitted (EPERM), although \
         ftprobe has CAP_SYS_PTRACE",
        target.name
    );
    if !missing.is_empty() {
        text.push_str(&format!(
            "; the process holds capabilities ftprobe lacks ({}): it belongs to a more \
             privileged context (ftprobe runs in a container, or a user namespace, whose \
             root cannot trace it)",
            missing.join(", ")
        ));
    } else {
        text.push_str(
            ": it is in a user namespace ftprobe's capability does not reach, or a security \
             module (AppArmor, SELinux) refuses it",
        );
    }
    text.push_str("; start the program under ftprobe instead (`ftprobe trace -- PROGRAM ...`)");
    text
}

/// The name of capability `bit` (`capabilities(7)`), or `cap_N`.
fn cap_name(bit: u32) -> String {
    const NAMES: [&str; 41] = [
        "CAP_CHOWN",
        "CAP_DAC_OVERRIDE",
        "CAP_DAC_READ_SEARCH",
        "CAP_FOWNER",
        "CAP_FSETID",
        "CAP_KILL",
        "CAP_SETGID",
        "CAP_SETUID",
        "CAP_SETPCAP",
        "CAP_LINUX_IMMUTABLE",
        "CAP_NET_BIND_SERVICE",
        "CAP_NET_BROADCAST",
        "CAP_NET_ADMIN",
        "CAP_NET_RAW",
        "CAP_IPC_LOCK",
        "CAP_IPC_OWNER",
        "CAP_SYS_MODULE",
        "CAP_SYS_RAWIO",
        "CAP_SYS_CHROOT",
        "CAP_SYS_PTRACE",
        "CAP_SYS_PACCT",
        "CAP_SYS_ADMIN",
        "CAP_SYS_BOOT",
        "CAP_SYS_NICE",
        "CAP_SYS_RESOURCE",
        "CAP_SYS_TIME",
        "CAP_SYS_TTY_CONFIG",
        "CAP_MKNOD",
        "CAP_LEASE",
        "CAP_AUDIT_WRITE",
        "CAP_AUDIT_CONTROL",
        "CAP_SETFCAP",
        "CAP_MAC_OVERRIDE",
        "CAP_MAC_ADMIN",
        "CAP_SYSLOG",
        "CAP_WAKE_ALARM",
        "CAP_BLOCK_SUSPEND",
        "CAP_AUDIT_READ",
        "CAP_PERFMON",
        "CAP_BPF",
        "CAP_CHECKPOINT_RESTORE",
    ];
    NAMES
        .get(bit as usize)
        .map_or_else(|| format!("cap_{bit}"), |n| (*n).to_owned())
}

/// Yama's `ptrace_scope`, when the kernel has Yama.
fn yama_scope() -> Option<u32> {
    std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The threads of `pid` (`/proc/PID/task`), but those already exited (zombies).
fn list_tasks(pid: i32) -> Result<Vec<i32>> {
    let dir = std::fs::read_dir(format!("/proc/{pid}/task"))
        .with_context(|| format!("no process with pid {pid}"))?;
    let mut tids = Vec::new();
    for e in dir.flatten() {
        let Some(tid) = e.file_name().to_str().and_then(|t| t.parse::<i32>().ok()) else {
            continue;
        };
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        // `tid (comm) S ...`: the state follows the last ')'.
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().next())
            .unwrap_or("");
        if state == "Z" || state == "X" {
            continue;
        }
        tids.push(tid);
    }
    tids.sort_unstable();
    Ok(tids)
}

/// Refuse, before touching it, a target that cannot be attached: none, ourselves, traced
/// by someone else, or in strict seccomp mode.
pub fn check_target(pid: i32) -> Result<Status> {
    if pid <= 0 || !Path::new(&format!("/proc/{pid}")).exists() {
        bail!("no process with pid {pid}");
    }
    if pid as u32 == std::process::id() {
        bail!("process {pid} is ftprobe itself");
    }
    let status = Status::read(&format!("/proc/{pid}/status"))
        .ok_or_else(|| anyhow!("no process with pid {pid}"))?;
    if status.kthread {
        bail!(
            "process {pid} ({}) is a kernel thread: it runs no user-space program to trace",
            status.name
        );
    }
    for tid in list_tasks(pid)? {
        let Some(t) = Status::read(&format!("/proc/{pid}/task/{tid}/status")) else {
            continue;
        };
        if t.tracer_pid != 0 {
            let tracer = std::fs::read_to_string(format!("/proc/{}/comm", t.tracer_pid))
                .map(|c| c.trim().to_owned())
                .unwrap_or_else(|_| "?".into());
            bail!(
                "process {pid} ({}) is already traced by process {} ({tracer}): a thread has \
                 one tracer at a time (detach the debugger or tracer first)",
                status.name,
                t.tracer_pid
            );
        }
        if t.seccomp == 1 {
            bail!(
                "process {pid} ({}) runs in strict seccomp mode (thread {tid}): it may only \
                 read, write and exit, so loading ftprobe's agent would kill it; not touched",
                status.name
            );
        }
    }
    Ok(status)
}

/// How a thread was stopped when we took it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Taken {
    /// `PTRACE_INTERRUPT`'s stop.
    Interrupt,
    /// A group-stop (the process is stopped).
    GroupStop,
    /// A signal-delivery-stop: the thread was about to take this signal.
    Signal(i32),
}

/// What a remote call changes, saved before the first and put back after each.
#[derive(Clone)]
struct Saved {
    regs: Regs,
    xstate: Vec<u8>,
    mask: u64,
}

struct Tracee {
    tid: i32,
    taken: Taken,
    saved: Option<Saved>,
}

/// Every thread of a process, stopped under our ptrace.
pub struct Attached {
    pid: i32,
    threads: Vec<Tracee>,
    /// The thread that makes the remote calls (index in `threads`).
    caller: usize,
    mem: Mem,
    /// Where the last call's blobs were copied.
    last_blobs: Vec<u64>,
    /// The return stub's page in the target, once found or made.
    stub: Option<u64>,
    detached: bool,
    /// The calling thread took a CPU-time timer's signal during a call of this stop (its own
    /// handler ran, and that handler's `rt_sigreturn` cancelled the restart block of a
    /// system call the stop interrupted): the system call is then issued again whole at
    /// every later hand-back (they all put back the registers saved at the first call).
    cpu_signal_taken: bool,
    /// When the first thread was seen stopped (`FTPROBE_TIMING`'s start).
    first_stop: Instant,
}

impl Attached {
    /// Check `pid` ([`check_target`]), then seize and stop every thread. When a call that
    /// an earlier ftprobe started and did not see end (it was killed) is still running in
    /// a thread (a `dlopen` or the agent's start, which may hold a lock the next call
    /// needs), the threads are let go and stopped again until it has ended
    /// ([`ORPHAN_WAIT`] at most).
    pub fn attach(pid: i32) -> Result<Attached> {
        let deadline = Instant::now() + ORPHAN_WAIT;
        loop {
            let mut a = Attached::attach_once(pid)?;
            let Some((tid, cli)) = a.orphan_call() else {
                return Ok(a);
            };
            if Instant::now() >= deadline {
                bail!(
                    "a call into process {pid} that ftprobe process {cli} started (it did not \
                     see it end: it was killed) is still running in thread {tid} after {} s: \
                     try again when it has ended",
                    ORPHAN_WAIT.as_secs()
                );
            }
            a.detach()?;
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn attach_once(pid: i32) -> Result<Attached> {
        let status = check_target(pid)?;
        let mut threads: Vec<Tracee> = Vec::new();
        let mut detach_on_error = DetachGuard(Vec::new());
        let mut first_stop = None;
        loop {
            let new: Vec<i32> = list_tasks(pid)?
                .into_iter()
                .filter(|t| !threads.iter().any(|x| x.tid == *t))
                .collect();
            if new.is_empty() {
                break;
            }
            let mut seized = Vec::new();
            for tid in new {
                match ptrace::seize(tid) {
                    Ok(()) => {}
                    // The thread exited meanwhile.
                    Err(e) if e.errno() == Some(libc::ESRCH) => continue,
                    Err(e) if e.errno() == Some(libc::EPERM) => {
                        // Became a zombie meanwhile: nothing to stop.
                        if !list_tasks(pid)?.contains(&tid) {
                            continue;
                        }
                        // SAFETY: geteuid has no preconditions.
                        let euid = unsafe { libc::geteuid() };
                        let own = Status::read("/proc/self/status").unwrap_or_default();
                        if own.cap_eff & (1 << CAP_SYS_PTRACE) != 0 {
                            bail!(privileged_eperm_message(pid, &status, &own));
                        }
                        bail!(eperm_message(pid, Some(status.uid), euid, yama_scope()));
                    }
                    Err(e) => return Err(e).context(format!("attaching to process {pid}")),
                }
                detach_on_error.0.push((tid, 0));
                ptrace::interrupt(tid)?;
                seized.push(tid);
            }
            for tid in seized {
                match wait_stop(tid, STOP_TIMEOUT)? {
                    Some(taken) => {
                        first_stop.get_or_insert_with(Instant::now);
                        if let Taken::Signal(sig) = taken {
                            // Detached with it, should anything fail from here.
                            for t in detach_on_error.0.iter_mut().filter(|t| t.0 == tid) {
                                t.1 = sig;
                            }
                        }
                        threads.push(Tracee {
                            tid,
                            taken,
                            saved: None,
                        })
                    }
                    None => detach_on_error.0.retain(|t| t.0 != tid),
                }
            }
        }
        if threads.is_empty() {
            bail!("process {pid} has no thread left to attach to");
        }
        let caller = pick_caller(pid, &threads);
        if let Taken::Signal(sig) = threads[caller].taken {
            // Every thread was about to take a signal: this one takes it now (its handler
            // is entered, or its default action taken) and stops again, so that the calls
            // start from a stop that holds no signal (one ftprobe's death would lose).
            let tid = threads[caller].tid;
            ptrace::interrupt(tid)?;
            ptrace::cont(tid, sig)?;
            threads[caller].taken = loop {
                match wait_stop(tid, STOP_TIMEOUT)? {
                    Some(Taken::Signal(s)) => ptrace::cont(tid, s)?,
                    Some(t) => break t,
                    None => bail!("process {pid} ended during the attach"),
                }
            };
            for t in detach_on_error.0.iter_mut().filter(|t| t.0 == tid) {
                t.1 = 0;
            }
        }
        let mem = Mem::open(threads[caller].tid)?;
        detach_on_error.0.clear();
        Ok(Attached {
            pid,
            threads,
            caller,
            mem,
            last_blobs: Vec::new(),
            stub: None,
            detached: false,
            cpu_signal_taken: false,
            first_stop: first_stop.unwrap_or_else(Instant::now),
        })
    }

    /// A call made through the return stub by an earlier ftprobe that is still running:
    /// its thread and that ftprobe's pid. A call is marked in the stub page ([`mark_call`])
    /// before its thread starts it and unmarked once the thread is handed back; a mark
    /// left by a killed ftprobe names a call still running while its thread's stack is
    /// below the call's frame and the frame's return address is still the stub's (the
    /// stub writes the result over it when the call returns). A stale mark is cleared.
    fn orphan_call(&mut self) -> Option<(i32, u32)> {
        let stub = find_stub(self.pid, &self.mem)?;
        // Found once: the calls of this attach use it.
        self.stub = Some(stub);
        let mut m = [0u8; 32];
        self.mem.read(stub + MARK_OFF, &mut m).ok()?;
        let word = |i: usize| u64::from_le_bytes(m[i * 8..i * 8 + 8].try_into().unwrap());
        if word(0) != MARK_MAGIC {
            return None;
        }
        let (tid, frame, cli) = (word(1) as i32, word(2), word(3) as u32);
        let running = self.threads.iter().any(|t| t.tid == tid)
            && ptrace::get_regs(tid).is_ok_and(|r| r.rsp < frame)
            && {
                let mut ret = [0u8; 8];
                self.mem.read(frame, &mut ret).is_ok() && u64::from_le_bytes(ret) == stub
            };
        if running {
            return Some((tid, cli));
        }
        let _ = self.mem.write(stub + MARK_OFF, &[0u8; 32]);
        None
    }

    /// When the first thread was seen stopped, and how many threads are held.
    pub fn stop_stats(&self) -> (Instant, usize) {
        (self.first_stop, self.threads.len())
    }

    /// Every stopped thread's instruction pointer as the program will see it on resume
    /// (the saved one for the calling thread).
    pub fn thread_ips(&self) -> Result<Vec<u64>> {
        self.threads
            .iter()
            .map(|t| -> Result<u64> {
                Ok(match &t.saved {
                    Some(s) => s.regs.rip,
                    None => ptrace::get_regs(t.tid)?.rip,
                })
            })
            .collect()
    }

    /// Every stopped thread's stack pointer where it resumes.
    pub fn thread_sps(&self) -> Result<Vec<u64>> {
        self.threads
            .iter()
            .map(|t| -> Result<u64> {
                Ok(match &t.saved {
                    Some(s) => s.regs.rsp,
                    None => ptrace::get_regs(t.tid)?.rsp,
                })
            })
            .collect()
    }

    /// Every stopped thread's thread pointer (`%fs` base).
    pub fn thread_pointers(&self) -> Result<Vec<u64>> {
        self.threads
            .iter()
            .map(|t| -> Result<u64> {
                Ok(match &t.saved {
                    Some(s) => s.regs.fs_base,
                    None => ptrace::get_regs(t.tid)?.fs_base,
                })
            })
            .collect()
    }

    /// Call `func(args...)` on the calling thread; `blobs` are copied into its stack first
    /// and their addresses replace the arguments `args[i] == BLOB(j)` ([`blob`]). Returns
    /// `rax`.
    pub fn call(&mut self, func: u64, args: &[u64], blobs: &[&[u8]]) -> Result<u64> {
        let stub = self.stub()?;
        self.call_through(func, args, blobs, stub, true)
    }

    /// The return stub's address in the target: found (an earlier attach mapped it) or
    /// mapped now (`mmap` called through the C library's `__restore_rt`, the result seen in
    /// `/proc/PID/maps`) and written.
    fn stub(&mut self) -> Result<u64> {
        if let Some(s) = self.stub {
            return Ok(s);
        }
        if let Some(s) = find_stub(self.pid, &self.mem) {
            self.stub = Some(s);
            return Ok(s);
        }
        let tid = self.threads[self.caller].tid;
        let restorer = find_restorer(tid, &self.mem)?;
        let addr = free_page(tid)?;
        let mmap = target_symbol(tid, "mmap")?;
        // PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, fd -1.
        self.call_through(
            mmap,
            &[addr, STUB_PAGE, 5, 0x02 | 0x20 | 0x10_0000, u64::MAX, 0],
            &[],
            restorer,
            false,
        )?;
        let mapped = anon_exec_pages(tid).contains(&addr);
        if !mapped {
            bail!(
                "could not map ftprobe's return page in process {} at {addr:#x} (mmap with \
                 MAP_FIXED_NOREPLACE refused: a seccomp filter or a security module?)",
                self.pid
            );
        }
        kill_point();
        self.mem.write(addr, &stub_bytes())?;
        kill_point();
        self.stub = Some(addr);
        Ok(addr)
    }

    /// [`Attached::call`] returning to `ret`: the return stub (`stub`: the result is read
    /// from the frame) or the C library's `__restore_rt` (the result is lost: 0).
    ///
    /// The thread's saved state is written as a signal frame ([`sigframe`]) below the
    /// blobs, and the function returns into `rt_sigreturn` with it: if ftprobe dies at any
    /// point of the call, the thread resumes exactly where it was. While ftprobe lives,
    /// the thread is followed from syscall-stop to syscall-stop (`PTRACE_SYSCALL`) to that
    /// `rt_sigreturn`'s entry, where [`Attached::hand_back`] puts the thread back
    /// without it.
    fn call_through(
        &mut self,
        func: u64,
        args: &[u64],
        blobs: &[&[u8]],
        ret: u64,
        stub: bool,
    ) -> Result<u64> {
        assert!(args.len() <= 6);
        let t = &mut self.threads[self.caller];
        let tid = t.tid;
        if t.saved.is_none() {
            t.saved = Some(Saved {
                regs: ptrace::get_regs(tid)?,
                xstate: ptrace::get_xstate(tid)?,
                mask: ptrace::get_sigmask(tid)?,
            });
        }
        let saved = t.saved.as_ref().expect("saved above");
        let mut regs = saved.regs;
        // Below the red zone, 16-aligned.
        let mut sp = (regs.rsp - 128 - 256) & !15;
        let mut blob_addrs = Vec::new();
        for b in blobs {
            sp = (sp - b.len() as u64) & !15;
            self.mem.write(sp, b)?;
            blob_addrs.push(sp);
        }
        self.last_blobs = blob_addrs.clone();
        let frame = sigframe::build(
            &sigframe::resume_regs(&saved.regs),
            saved.mask,
            &saved.xstate,
            sp,
            ret,
        );
        self.mem.write(frame.fp_addr, &frame.fp)?;
        self.mem.write(frame.addr, &frame.bytes)?;
        let args: Vec<u64> = args
            .iter()
            .map(|&a| match blob_index(a) {
                Some(j) => blob_addrs[j],
                None => a,
            })
            .collect();
        let mut a = [0u64; 6];
        a[..args.len()].copy_from_slice(&args);
        regs.rdi = a[0];
        regs.rsi = a[1];
        regs.rdx = a[2];
        regs.rcx = a[3];
        regs.r8 = a[4];
        regs.r9 = a[5];
        regs.rax = 0;
        regs.orig_rax = u64::MAX;
        regs.rip = func;
        regs.rsp = frame.addr;
        if stub {
            kill_point();
            mark_call(&self.mem, ret, tid, frame.addr)?;
        }
        // The ABI's direction flag is clear at a call.
        regs.eflags &= !0x400;
        ptrace::trace_sysgood(tid)?;
        ptrace::set_regs(tid, &regs)?;
        // Nothing of the program's runs on this thread meanwhile (a signal stays pending).
        // The synchronous signals stay open: a fault or trap in the call is delivered, not
        // forced (the kernel resets the action of a forced blocked signal to its default,
        // process-wide: the agent's SIGTRAP handler would be lost).
        // The CPU-time timers' signals the thread takes stay open too (below).
        kill_point();
        ptrace::set_sigmask(
            tid,
            !(SYNCHRONOUS_SIGNALS | (CPU_TIME_SIGNALS & !saved.mask)),
        )?;
        kill_point();
        ptrace::syscall(tid, 0)?;
        let end = Ending {
            rip: ret + if stub { STUB_SYSCALL_END } else { RESTORER_LEN },
            rsp: frame.addr + 8,
        };
        match self.finish_call(tid, func, end) {
            Ok(()) => {
                let rax = if stub {
                    let mut b = [0u8; 8];
                    self.mem.read(frame.addr, &mut b)?;
                    u64::from_le_bytes(b)
                } else {
                    0
                };
                self.hand_back(tid)?;
                if stub {
                    kill_point();
                    self.mem.write(ret + MARK_OFF, &[0u8; 32])?;
                }
                Ok(rax)
            }
            Err(e) => {
                // Put everything back (the thread is in a ptrace-stop that is not a
                // syscall-stop).
                if let Some(saved) = &self.threads[self.caller].saved {
                    let _ = ptrace::set_regs(tid, &saved.regs)
                        .and_then(|()| ptrace::set_xstate(tid, &saved.xstate))
                        .and_then(|()| ptrace::set_sigmask(tid, saved.mask));
                }
                if stub {
                    let _ = self.mem.write(ret + MARK_OFF, &[0u8; 32]);
                }
                Err(e)
            }
        }
    }

    /// The call's thread is at its `rt_sigreturn`'s entry: skip the system call, put the
    /// state the frame holds back by ptrace (the mask and extended state first: should
    /// ftprobe die before the registers are written, the `rt_sigreturn` still runs), and
    /// bring the thread into an interrupt stop with its registers as they were when it
    /// was taken (an interrupted system call is then restarted by the kernel as after any
    /// stop, its restart block intact).
    fn hand_back(&mut self, tid: i32) -> Result<()> {
        let saved = self.threads[self.caller]
            .saved
            .clone()
            .expect("a call saved them");
        kill_point();
        ptrace::set_sigmask(tid, saved.mask)?;
        kill_point();
        ptrace::set_xstate(tid, &saved.xstate)?;
        kill_point();
        // orig_rax -1: the rt_sigreturn is not made; the thread goes on as it would.
        ptrace::set_regs(tid, &sigframe::resume_regs(&saved.regs))?;
        kill_point();
        ptrace::interrupt(tid)?;
        kill_point();
        ptrace::cont(tid, 0)?;
        // A restart block a handler's `rt_sigreturn` cancelled cannot be kept: the
        // interrupted call is issued again (`resume_regs`), not failed with EINTR.
        // Sticky for the thread's whole stop: every later call's hand-back too (they all
        // put back the registers saved at the first one).
        let reissue = self.cpu_signal_taken;
        let back = if reissue {
            sigframe::resume_regs(&saved.regs)
        } else {
            saved.regs
        };
        loop {
            match ptrace::wait(tid, false)? {
                Some(Stop::Event { .. } | Stop::OtherEvent) => {
                    kill_point();
                    ptrace::set_regs(tid, &back)?;
                    kill_point();
                    return Ok(());
                }
                Some(Stop::Syscall) | None => ptrace::cont(tid, 0)?,
                Some(Stop::Signal(sig)) => {
                    // A signal that came during the call (blocked then): delivered now,
                    // as it would have been; the thread stops at its handler (or its
                    // group-stop), and that is its state from now on. A CPU-time timer's
                    // (raised by the call's own time) runs before the interrupted system
                    // call is issued again, which it does not fail.
                    let cpu = matches!(sig, libc::SIGPROF | libc::SIGVTALRM);
                    let regs = if cpu {
                        sigframe::resume_regs(&saved.regs)
                    } else {
                        back
                    };
                    ptrace::set_regs(tid, &regs)?;
                    ptrace::interrupt(tid)?;
                    ptrace::cont(tid, sig)?;
                    self.threads[self.caller].saved = None;
                    self.cpu_signal_taken = false;
                    loop {
                        match ptrace::wait(tid, false)? {
                            Some(Stop::Event { .. } | Stop::OtherEvent) => return Ok(()),
                            Some(Stop::Signal(s)) => ptrace::cont(tid, s)?,
                            Some(Stop::Syscall) | None => ptrace::cont(tid, 0)?,
                            Some(Stop::Exited(_) | Stop::Killed(_)) => {
                                self.detached = true;
                                bail!("process {} ended during the attach", self.pid)
                            }
                        }
                    }
                }
                Some(Stop::Exited(_) | Stop::Killed(_)) => {
                    self.detached = true;
                    bail!("process {} ended during the attach", self.pid)
                }
            }
        }
    }

    /// Call `func(msg, out, out_len)` (an agent entry): `msg` is copied in, `out` is a
    /// zeroed buffer of `out_len` bytes on the thread's stack. Returns the call's `int`
    /// result and the string it left in `out`.
    pub fn call_with_output(
        &mut self,
        func: u64,
        msg: &[u8],
        out_len: usize,
    ) -> Result<(i32, Vec<u8>)> {
        let out = vec![0u8; out_len];
        let rax = self.call(func, &[blob(0), blob(1), out_len as u64], &[msg, &out])?;
        let text = self.mem.read_cstr(self.last_blobs[1], out_len);
        Ok((rax as i32, text))
    }

    /// Follow the call to its `rt_sigreturn` (`end`); the thread is then in that
    /// syscall-entry stop.
    fn finish_call(&mut self, tid: i32, func: u64, end: Ending) -> Result<()> {
        let start = Instant::now();
        // The call stops at each of its system calls (PTRACE_SYSCALL), a few microseconds
        // apart: the next stop is looked for at once (yielding the CPU) for a while after
        // the last one, and only then every 200 us (the call may block: a lock, I/O).
        let mut last_stop = Instant::now();
        loop {
            let stop = match ptrace::wait(tid, true)? {
                Some(s) => {
                    last_stop = Instant::now();
                    s
                }
                None if last_stop.elapsed() < Duration::from_millis(2) => {
                    std::thread::yield_now();
                    continue;
                }
                None => {
                    if start.elapsed() > CALL_TIMEOUT {
                        // Stop it where it is; registers are put back by the caller. What
                        // the call was doing is left half done.
                        let _ = ptrace::interrupt(tid);
                        let _ = wait_stop(tid, STOP_TIMEOUT);
                        let at = ptrace::get_regs(tid).map_or(String::new(), |r| {
                            format!(" (at {:#x}, system call {})", r.rip, r.orig_rax as i64)
                        });
                        bail!(
                            "the call into process {} (function at {func:#x}, thread {tid}) \
                             did not return within {} s{at}: another thread, stopped by \
                             ftprobe, may hold a lock it needs",
                            self.pid,
                            CALL_TIMEOUT.as_secs()
                        );
                    }
                    std::thread::sleep(Duration::from_micros(200));
                    continue;
                }
            };
            kill_point();
            match stop {
                Stop::Syscall => {
                    let r = ptrace::get_regs(tid)?;
                    if r.orig_rax == libc::SYS_rt_sigreturn as u64
                        && r.rip == end.rip
                        && r.rsp == end.rsp
                    {
                        return Ok(());
                    }
                    ptrace::syscall(tid, 0)?;
                }
                Stop::Signal(libc::SIGSEGV) => {
                    let regs = ptrace::get_regs(tid)?;
                    bail!(
                        "process {} crashed (SIGSEGV at {:#x}) in ftprobe's call of the function \
                         at {func:#x}",
                        self.pid,
                        regs.rip
                    );
                }
                // SIGSTOP cannot be blocked: delivered now (the process stops; this thread
                // goes on with the call after its group-stop). A SIGTRAP is a probe of the
                // agent's, hit by the call itself (the agent's handler takes it). SIGPROF
                // and SIGVTALRM are the process's CPU-time timers, raised by this thread's
                // own time: the program's handler runs here, as during any of its calls.
                Stop::Signal(sig @ (libc::SIGPROF | libc::SIGVTALRM)) => {
                    self.cpu_signal_taken = true;
                    ptrace::syscall(tid, sig)?
                }
                Stop::Signal(sig @ (libc::SIGSTOP | libc::SIGTRAP)) => ptrace::syscall(tid, sig)?,
                Stop::Signal(sig) => {
                    let regs = ptrace::get_regs(tid)?;
                    bail!(
                        "process {} took signal {sig} at {:#x} in ftprobe's call of the function \
                         at {func:#x}",
                        self.pid,
                        regs.rip
                    );
                }
                // Our interrupt still pending, or a group-stop: go on with the call.
                Stop::Event { .. } | Stop::OtherEvent => ptrace::syscall(tid, 0)?,
                Stop::Exited(code) => {
                    self.detached = true;
                    bail!(
                        "process {} exited (status {code}) during the attach",
                        self.pid
                    )
                }
                Stop::Killed(sig) => {
                    self.detached = true;
                    bail!(
                        "process {} was killed by signal {sig} during the attach",
                        self.pid
                    )
                }
            }
        }
    }

    /// `dlopen(path, RTLD_NOW)` in the target; returns the handle, or the loader's message.
    pub fn dlopen(&mut self, path: &Path) -> Result<u64> {
        let tid = self.threads[self.caller].tid;
        let dlopen = target_symbol(tid, "dlopen")?;
        let mut p = path.as_os_str().as_encoded_bytes().to_vec();
        p.push(0);
        let handle = self.call(dlopen, &[blob(0), RTLD_NOW], &[&p])?;
        if handle == 0 {
            let why = match target_symbol(tid, "dlerror") {
                Ok(f) => {
                    let msg = self.call(f, &[], &[])?;
                    String::from_utf8_lossy(&self.mem.read_cstr(msg, 1024)).into_owned()
                }
                Err(_) => "no message".into(),
            };
            bail!(
                "dlopen of {} in process {} failed: {why}",
                path.display(),
                self.pid
            );
        }
        Ok(handle)
    }

    /// `memfd_create(name, flags)` in the target: the new descriptor's number there.
    pub fn memfd_create(&mut self, name: &str, flags: u32) -> Result<i32> {
        let tid = self.threads[self.caller].tid;
        let f = target_symbol(tid, "memfd_create")?;
        let mut n = name.as_bytes().to_vec();
        n.push(0);
        let fd = self.call(f, &[blob(0), u64::from(flags)], &[&n])? as i32;
        if fd < 0 {
            bail!("memfd_create failed in process {}", self.pid);
        }
        Ok(fd)
    }

    /// `dlsym(handle, name)` in the target.
    pub fn dlsym(&mut self, handle: u64, name: &str) -> Result<u64> {
        let tid = self.threads[self.caller].tid;
        let dlsym = target_symbol(tid, "dlsym")?;
        let mut n = name.as_bytes().to_vec();
        n.push(0);
        let f = self.call(dlsym, &[handle, blob(0)], &[&n])?;
        if f == 0 {
            bail!(
                "{name} not found in the agent loaded into process {}",
                self.pid
            );
        }
        Ok(f)
    }

    /// Let every thread go: each with the signal it was about to take, if any.
    pub fn detach(mut self) -> Result<()> {
        self.detach_all()
    }

    fn detach_all(&mut self) -> Result<()> {
        if self.detached {
            return Ok(());
        }
        self.detached = true;
        if die_at() == Some(0) {
            eprintln!(
                "ftprobe: kill points: {}",
                KILL_POINTS.load(std::sync::atomic::Ordering::Relaxed)
            );
        }
        let mut first_err = None;
        for t in &self.threads {
            // A sleep the stop interrupted that the kernel would resume through its restart
            // block (`nanosleep`, a `poll` or `futex` with a timeout) is issued again whole
            // instead: a signal the thread takes as it leaves the stop (the profiling timer's,
            // whose expiry ftprobe's own work in the process brought closer, found on the
            // first thread to run) would otherwise fail it with EINTR.
            if !matches!(t.taken, Taken::Signal(_)) {
                if let Ok(r) = ptrace::get_regs(t.tid) {
                    if r.orig_rax as i64 >= 0 && r.rax as i64 == -516 {
                        let _ = ptrace::set_regs(t.tid, &sigframe::resume_regs(&r));
                    }
                }
            }
            let r = match t.taken {
                // Still in the signal-delivery-stop it was taken in (the calling thread
                // never is: see `attach`).
                Taken::Signal(sig) => ptrace::detach(t.tid, sig),
                _ => ptrace::detach(t.tid, 0),
            };
            match r {
                Ok(()) => {}
                // Exited meanwhile.
                Err(e) if e.errno() == Some(libc::ESRCH) => {}
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        if let Err(e) = self.detach_all() {
            eprintln!("ftprobe: detaching from process {}: {e:#}", self.pid);
        }
    }
}

/// Threads seized before an error, with the signal each was about to take (0: none):
/// detached again when it drops (unless cleared).
struct DetachGuard(Vec<(i32, i32)>);

impl Drop for DetachGuard {
    fn drop(&mut self) {
        for &(tid, sig) in &self.0 {
            // Stopped or not yet (an interrupt pending): PTRACE_DETACH needs a stop, so
            // wait for it first.
            if ptrace::detach(tid, sig).is_err() {
                let sig = match wait_stop(tid, STOP_TIMEOUT) {
                    Ok(Some(Taken::Signal(s))) => s,
                    _ => sig,
                };
                let _ = ptrace::detach(tid, sig);
            }
        }
    }
}

/// A point of an attach where ftprobe may be killed (after a ptrace request took effect,
/// before the next). With `FTPROBE_TEST_DIE_AT=N` (tests), ftprobe kills itself with
/// SIGKILL at the Nth; with `FTPROBE_TEST_DIE_AT=0`, it says how many it passed when each
/// attach lets the process go.
fn kill_point() {
    let Some(at) = die_at() else {
        return;
    };
    let n = KILL_POINTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
    if n == at {
        ptrace::die();
    }
}

static KILL_POINTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn die_at() -> Option<u64> {
    static AT: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *AT.get_or_init(|| {
        std::env::var("FTPROBE_TEST_DIE_AT")
            .ok()
            .and_then(|v| v.parse().ok())
    })
}

/// The signals a fault or a trap raises (bit `n - 1` for signal `n`), open during a call.
const SYNCHRONOUS_SIGNALS: u64 = 1 << (libc::SIGTRAP - 1)
    | 1 << (libc::SIGSEGV - 1)
    | 1 << (libc::SIGBUS - 1)
    | 1 << (libc::SIGILL - 1)
    | 1 << (libc::SIGFPE - 1);

/// The signals of the process's CPU-time timers (`ITIMER_PROF`, as gprof's runtime sets it,
/// and `ITIMER_VIRTUAL`), open during a call unless the calling thread blocks them. The
/// kernel gives such a signal to the thread whose CPU time raised it, unless that thread
/// blocks it (`complete_signal()` in kernel/signal.c); during a call that thread is the
/// calling one (the others are stopped). Blocked there, it waited process-wide for the first
/// thread to run, and a sleeping thread released at the same moment (by ftprobe's death:
/// issue 26, item 4) took it and failed its `nanosleep` with EINTR.
const CPU_TIME_SIGNALS: u64 = 1 << (libc::SIGPROF - 1) | 1 << (libc::SIGVTALRM - 1);

/// Where a call ends: the `rt_sigreturn` system call's `rip` (after the `syscall`
/// instruction) and `rsp` (the frame's `ucontext`).
struct Ending {
    rip: u64,
    rsp: u64,
}

/// `mov $15,%rax; syscall` (`rt_sigreturn`): glibc's `__restore_rt`.
const RESTORER: [u8; 9] = [0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05];
const RESTORER_LEN: u64 = RESTORER.len() as u64;
/// Where in the stub page a call in progress is marked ([`mark_call`]): the magic, the
/// thread, the call's frame and the calling ftprobe's pid, 8 bytes each.
const MARK_OFF: u64 = 2048;
const MARK_MAGIC: u64 = u64::from_le_bytes(*b"ftpcall1");

/// Mark the call about to start in `tid` with its frame at `frame`, in the stub page at
/// `stub` (see `Attached::orphan_call`).
fn mark_call(mem: &Mem, stub: u64, tid: i32, frame: u64) -> Result<()> {
    let mut m = Vec::with_capacity(32);
    m.extend_from_slice(&MARK_MAGIC.to_le_bytes());
    m.extend_from_slice(&(tid as u64).to_le_bytes());
    m.extend_from_slice(&frame.to_le_bytes());
    m.extend_from_slice(&u64::from(std::process::id()).to_le_bytes());
    Ok(mem.write(stub + MARK_OFF, &m)?)
}

/// How long an attach waits for a call an earlier, killed ftprobe left running.
const ORPHAN_WAIT: Duration = Duration::from_secs(10);
/// The return stub's page size, and where its `syscall` ends.
const STUB_PAGE: u64 = 4096;
const STUB_SYSCALL_END: u64 = 5 + RESTORER_LEN;
/// Recognizes the stub page of an earlier attach.
const STUB_MAGIC: &[u8] = b"\0ftprobe attach return stub 1\0";

/// The return stub: `mov %rax,-8(%rsp)` (the result into the frame's return-address
/// slot, where ftprobe reads it), then `rt_sigreturn`; then its magic.
fn stub_bytes() -> Vec<u8> {
    let mut b = vec![0x48, 0x89, 0x44, 0x24, 0xf8];
    b.extend_from_slice(&RESTORER);
    b.extend_from_slice(STUB_MAGIC);
    b
}

/// The start of every anonymous, executable, one-page private mapping of `pid`.
fn anon_exec_pages(pid: i32) -> Vec<u64> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    maps.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() != 5 || f[1] != "r-xp" {
                return None;
            }
            let (s, e) = f[0].split_once('-')?;
            let (s, e) = (
                u64::from_str_radix(s, 16).ok()?,
                u64::from_str_radix(e, 16).ok()?,
            );
            (e - s == STUB_PAGE).then_some(s)
        })
        .collect()
}

/// The return stub an earlier attach left in `pid`.
fn find_stub(pid: i32, mem: &Mem) -> Option<u64> {
    let want = stub_bytes();
    anon_exec_pages(pid).into_iter().find(|&a| {
        let mut b = vec![0u8; want.len()];
        mem.read(a, &mut b).is_ok() && b == want
    })
}

/// A `__restore_rt` (`mov $15,%rax; syscall`) in the C library's code mapped in `tid`.
fn find_restorer(tid: i32, mem: &Mem) -> Result<u64> {
    let maps = std::fs::read_to_string(format!("/proc/{tid}/maps"))
        .with_context(|| format!("reading /proc/{tid}/maps"))?;
    let libc: Vec<String> = libc_objects(&parse_maps(&maps))
        .into_iter()
        .map(|(_, p)| p)
        .collect();
    for l in maps.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() < 6 || !f[1].contains('x') || !libc.iter().any(|p| *p == f[5..].join(" ")) {
            continue;
        }
        let Some((s, e)) = f[0].split_once('-') else {
            continue;
        };
        let (Ok(s), Ok(e)) = (u64::from_str_radix(s, 16), u64::from_str_radix(e, 16)) else {
            continue;
        };
        let mut text = vec![0u8; (e - s) as usize];
        if mem.read(s, &mut text).is_err() {
            continue;
        }
        if let Some(i) = text.windows(RESTORER.len()).position(|w| w == RESTORER) {
            return Ok(s + i as u64);
        }
    }
    bail!(
        "no `mov $15,%rax; syscall` (glibc's __restore_rt) in process {tid}'s C library: \
         ftprobe cannot call into it safely"
    )
}

/// A free page of `tid`'s address space for the return stub: the highest one below its
/// C library with a free page on each side (not in the gap below the main stack, which
/// is its room to grow).
fn free_page(tid: i32) -> Result<u64> {
    let maps = std::fs::read_to_string(format!("/proc/{tid}/maps"))
        .with_context(|| format!("reading /proc/{tid}/maps"))?;
    let mut ranges: Vec<(u64, u64, bool)> = maps
        .lines()
        .filter_map(|l| {
            let (s, e) = l.split_whitespace().next()?.split_once('-')?;
            Some((
                u64::from_str_radix(s, 16).ok()?,
                u64::from_str_radix(e, 16).ok()?,
                l.ends_with("[stack]"),
            ))
        })
        .collect();
    ranges.sort_unstable();
    let base = libc_objects(&parse_maps(&maps))
        .first()
        .map(|o| o.0)
        .context("no C library mapped")?;
    for w in ranges.windows(2).rev() {
        let ((_, below_end, _), (above, _, stack)) = (w[0], w[1]);
        if above <= base && !stack && above - below_end >= 4 * STUB_PAGE {
            return Ok(above - 2 * STUB_PAGE);
        }
    }
    bail!("no free page in process {tid} for ftprobe's return stub")
}

/// Marks argument `j` of [`Attached::call`] as the address of blob `j`.
pub fn blob(j: usize) -> u64 {
    BLOB_MARK | j as u64
}

/// A non-canonical address: never a real argument of ours.
const BLOB_MARK: u64 = 0xb10b_0000_0000_0000;

fn blob_index(a: u64) -> Option<usize> {
    (a & 0xffff_ffff_0000_0000 == BLOB_MARK).then_some((a & 0xffff) as usize)
}

/// Wait until `tid` reports its first stop after `PTRACE_INTERRUPT`; `None` when it exited.
fn wait_stop(tid: i32, timeout: Duration) -> Result<Option<Taken>> {
    let start = Instant::now();
    loop {
        match ptrace::wait(tid, true)? {
            None if start.elapsed() > timeout => bail!(
                "thread {tid} did not stop within {} s (in an uninterruptible sleep?)",
                timeout.as_secs()
            ),
            None => std::thread::sleep(Duration::from_micros(200)),
            Some(Stop::Event { sig: libc::SIGTRAP }) => return Ok(Some(Taken::Interrupt)),
            Some(Stop::Event { .. }) => return Ok(Some(Taken::GroupStop)),
            Some(Stop::Signal(sig)) => return Ok(Some(Taken::Signal(sig))),
            Some(Stop::OtherEvent) => return Ok(Some(Taken::Interrupt)),
            // Followed by PTRACE_SYSCALL (a call timed out): on to the interrupt.
            Some(Stop::Syscall) => ptrace::cont(tid, 0)?,
            Some(Stop::Exited(_) | Stop::Killed(_)) => return Ok(None),
        }
    }
}

/// The thread to make the calls: one blocked in a system call other than `futex` (it holds
/// no lock of the program's as a rule), the main thread first; else one taken by an
/// interrupt or group-stop; else the first.
fn pick_caller(pid: i32, threads: &[Tracee]) -> usize {
    let in_syscall = |t: &Tracee| {
        ptrace::get_regs(t.tid).is_ok_and(|r| {
            (r.orig_rax as i64) >= 0
                && r.orig_rax != libc::SYS_futex as u64
                && ERESTART.contains(&(r.rax as i64))
        })
    };
    let by_main_first = |pred: &dyn Fn(&Tracee) -> bool| {
        threads
            .iter()
            .position(|t| t.tid == pid && pred(t))
            .or_else(|| threads.iter().position(pred))
    };
    by_main_first(&|t| t.taken == Taken::Interrupt && in_syscall(t))
        .or_else(|| by_main_first(&|t| !matches!(t.taken, Taken::Signal(_))))
        .unwrap_or(0)
}

/// One mapped object of a process (`/proc/PID/maps`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub offset: u64,
    pub path: String,
}

/// The file-backed mappings of `/proc/PID/maps`'s text.
pub fn parse_maps(text: &str) -> Vec<Mapping> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let range = f.next()?;
            let _perms = f.next()?;
            let offset = u64::from_str_radix(f.next()?, 16).ok()?;
            let _dev = f.next()?;
            let _inode = f.next()?;
            let path = f.collect::<Vec<_>>().join(" ");
            if !path.starts_with('/') {
                return None;
            }
            let (s, _end) = range.split_once('-')?;
            Some(Mapping {
                start: u64::from_str_radix(s, 16).ok()?,
                offset,
                path,
            })
        })
        .collect()
}

/// The C library's objects (where `dlopen` is: libc.so.6 since glibc 2.34, libdl.so.2
/// before), with their load addresses (the mapping of file offset 0).
fn libc_objects(maps: &[Mapping]) -> Vec<(u64, String)> {
    let mut out: Vec<(u64, String)> = Vec::new();
    for want in ["libc.so", "libc-2.", "libdl.so", "libdl-2."] {
        for m in maps {
            let base = m.path.rsplit('/').next().unwrap_or("");
            if base.starts_with(want) && m.offset == 0 && !out.iter().any(|(_, p)| *p == m.path) {
                out.push((m.start, m.path.clone()));
            }
        }
    }
    out
}

/// The address of the C library's function `name` in process (thread) `tid`.
fn target_symbol(tid: i32, name: &str) -> Result<u64> {
    use object::{Object, ObjectSegment, ObjectSymbol};
    let maps = std::fs::read_to_string(format!("/proc/{tid}/maps"))
        .with_context(|| format!("reading /proc/{tid}/maps"))?;
    let objects = libc_objects(&parse_maps(&maps));
    if objects.is_empty() {
        bail!(
            "process {tid} has no C library mapped (a statically linked program?): ftprobe \
             cannot load its agent into it"
        );
    }
    for (start, path) in &objects {
        // Through the target's root: the path is the one it sees.
        let file = std::fs::read(format!("/proc/{tid}/root{path}"))
            .or_else(|_| std::fs::read(path))
            .with_context(|| format!("reading {path}"))?;
        let obj = object::File::parse(&*file).with_context(|| format!("parsing {path}"))?;
        let first = obj
            .segments()
            .map(|s| s.address() & !0xfff)
            .min()
            .unwrap_or(0);
        for s in obj.dynamic_symbols() {
            if s.is_definition() && s.name() == Ok(name) {
                return Ok(start - first + s.address());
            }
        }
    }
    bail!(
        "{name} not found in the target's C library ({}): glibc before 2.34 has it in \
         libdl.so.2, which the program does not load",
        objects
            .iter()
            .map(|(_, p)| p.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// How process `pid` (not our child) ended, while it is a zombie its parent has not reaped
/// yet (`/proc/PID/stat`'s exit code): (exit status, killing signal); neither once it is
/// gone.
pub fn exit_status(pid: i32) -> (Option<i32>, Option<i32>) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, r)| r.split_whitespace().collect())
        .unwrap_or_default();
    // The 3rd field is the state, the 52nd the exit code (as waitpid's status).
    if fields.first() != Some(&"Z") {
        return (None, None);
    }
    match fields.get(49).and_then(|c| c.parse::<i32>().ok()) {
        Some(w) if w & 0x7f == 0 => (Some((w >> 8) & 0xff), None),
        Some(w) => (None, Some(w & 0x7f)),
        None => (None, None),
    }
}

/// Whether `pid` maps ftprobe's rings (an attached session's memfd): not after an exec.
pub fn rings_mapped(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .is_ok_and(|m| m.lines().any(|l| l.contains("/memfd:ftprobe-rings")))
}

/// The agent objects mapped in `pid` (paths of mappings named `libftprobe_agent.so`).
pub fn agent_mapped(pid: i32) -> Vec<PathBuf> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    let mut out: Vec<PathBuf> = parse_maps(&maps)
        .into_iter()
        .filter(|m| m.path.ends_with("/libftprobe_agent.so") && m.offset == 0)
        .map(|m| PathBuf::from(m.path))
        .collect();
    out.dedup();
    out
}

/// `ftprobe attach-load`: load the agent into process `pid` and let it go (the attach
/// mechanics alone; the agent stays idle).
pub fn load_agent(pid: i32, agent: &Path) -> Result<u64> {
    for other in agent_mapped(pid) {
        if other != agent {
            bail!(
                "process {pid} already has another ftprobe agent loaded ({}): pass it with \
                 --agent",
                other.display()
            );
        }
    }
    let mut a = Attached::attach(pid)?;
    let handle = a.dlopen(agent)?;
    a.detach()?;
    Ok(handle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yama_messages_say_what_allows_attach() {
        assert_eq!(yama_message(0), None);
        let m1 = yama_message(1).unwrap();
        assert!(m1.contains("ptrace_scope is 1"), "{m1}");
        assert!(m1.contains("sysctl kernel.yama.ptrace_scope=0"), "{m1}");
        assert!(m1.contains("CAP_SYS_PTRACE"), "{m1}");
        assert!(m1.contains("ftprobe trace --"), "{m1}");
        let m2 = yama_message(2).unwrap();
        assert!(m2.contains("ptrace_scope is 2"), "{m2}");
        assert!(m2.contains("CAP_SYS_PTRACE"), "{m2}");
        assert!(m2.contains("ftprobe trace --"), "{m2}");
        let m3 = yama_message(3).unwrap();
        assert!(m3.contains("ptrace_scope is 3"), "{m3}");
        assert!(m3.contains("until the next reboot"), "{m3}");
        assert!(m3.contains("ftprobe trace --"), "{m3}");
        assert!(!m3.contains("sysctl"), "{m3}");
    }

    /// Issue 26, item 11: as root, `trace -p 1` (a container's host init holds
    /// CAP_SYS_RESOURCE, which the container's root lacks) and `-p 2` (kthreadd) said "run
    /// ftprobe with CAP_SYS_PTRACE (as root)".
    #[test]
    fn a_refusal_under_cap_sys_ptrace_says_why_not_to_run_as_root() {
        let own = Status {
            cap_eff: 0x1_feff_ffff,
            ..Status::default()
        };
        let init = Status {
            name: "init".into(),
            cap_prm: 0x1_ffff_ffff,
            ..Status::default()
        };
        let m = privileged_eperm_message(1, &init, &own);
        assert!(m.contains("although ftprobe has CAP_SYS_PTRACE"), "{m}");
        assert!(m.contains("CAP_SYS_RESOURCE"), "{m}");
        assert!(!m.contains("as root"), "{m}");
        let same = privileged_eperm_message(1, &own, &own);
        assert!(same.contains("security module"), "{same}");
        let k = Status::parse("Name:\tkthreadd\nKthread:\t1\nCapPrm:\t000001ffffffffff\n");
        assert!(k.kthread);
        assert_eq!(k.cap_prm, 0x1ff_ffff_ffff);
        if std::fs::read_to_string("/proc/2/status").is_ok_and(|t| t.contains("Kthread:\t1")) {
            let e = check_target(2).unwrap_err().to_string();
            assert!(e.contains("is a kernel thread"), "{e}");
        }
    }

    #[test]
    fn eperm_message_names_the_cause() {
        let other_user = eperm_message(42, Some(1000), 65534, None);
        assert!(other_user.contains("belongs to uid 1000"), "{other_user}");
        assert!(other_user.contains("runs as uid 65534"), "{other_user}");
        assert!(other_user.contains("EPERM"), "{other_user}");
        let yama = eperm_message(42, Some(1000), 1000, Some(1));
        assert!(!yama.contains("belongs to"), "{yama}");
        assert!(yama.contains("ptrace_scope is 1"), "{yama}");
        let neither = eperm_message(42, Some(1000), 1000, Some(0));
        assert!(neither.contains("non-dumpable"), "{neither}");
    }

    #[test]
    fn status_lines() {
        let s = Status::parse(
            "Name:\tcat\nUmask:\t0022\nState:\tS (sleeping)\nTracerPid:\t123\n\
             Uid:\t1000\t1000\t1000\t1000\nSigIgn:\t0000000000000400\nSeccomp:\t1\n",
        );
        assert_eq!(
            s,
            Status {
                name: "cat".into(),
                tracer_pid: 123,
                seccomp: 1,
                uid: 1000,
                sig_ign: 1 << (libc::SIGSEGV - 1),
                ..Status::default()
            }
        );
    }

    #[test]
    fn maps_and_libc() {
        let maps = parse_maps(
            "7f0000000000-7f0000028000 r--p 00000000 08:01 123 /usr/lib/x86_64-linux-gnu/libc.so.6\n\
             7f0000028000-7f000019d000 r-xp 00028000 08:01 123 /usr/lib/x86_64-linux-gnu/libc.so.6\n\
             7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]\n\
             7f1000000000-7f1000001000 r--p 00000000 08:01 9 /tmp/a b/libdl.so.2\n",
        );
        assert_eq!(maps.len(), 3);
        assert_eq!(
            libc_objects(&maps),
            vec![
                (
                    0x7f00_0000_0000,
                    "/usr/lib/x86_64-linux-gnu/libc.so.6".into()
                ),
                (0x7f10_0000_0000, "/tmp/a b/libdl.so.2".into()),
            ]
        );
    }

    #[test]
    fn blob_marks() {
        assert_eq!(blob_index(blob(3)), Some(3));
        assert_eq!(blob_index(0x7fff_0000_1000), None);
        assert_eq!(blob_index(RTLD_NOW), None);
    }
}
