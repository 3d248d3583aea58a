//! The agent in a process the CLI attached to (`ftprobe trace -p PID`): loaded by the
//! target's own `dlopen`, it does nothing at its constructor (no `FTPROBE_*` variables).
//! The CLI then calls [`ftprobe_agent_control`] on one thread of the target while it holds
//! every other thread stopped, with a typed message (`ftprobe::agent_config`): `Attach`
//! runs the same start as the preloaded agent's constructor ([`crate::start`]) with the
//! configuration it carries.
//!
//! Not available to an attached agent: the interposers of the preloaded one (a `dlopen`ed
//! library's definitions do not take precedence over the C library's for the program): the
//! program's own SIGTRAP actions and masks are not filtered (`sigtrap`) and `exec` leaves no
//! note. For return hooks, probes take the interposers' place: on the C library's `longjmp`
//! and context switches (`returns::LIBC_PROBES`) and on the unwinder's functions (C++
//! catches are seen at `_Unwind_SetIP`).

use std::ffi::{c_char, CStr};
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use ftprobe::agent_config::{self, AgentMessage};

use ftprobe::agent_config::AgentConfig;

use crate::{start, Mode, StartError, CAPTURE, PID};

/// An attach ran (successfully or not) in this process.
static ATTACHED: AtomicBool = AtomicBool::new(false);
/// Whether this agent was loaded by an attach (not preloaded).
pub(crate) fn attached() -> bool {
    ATTACHED.load(Ordering::Acquire)
}

/// A session is on (between its attach and its detach).
static TRACING: AtomicBool = AtomicBool::new(false);
/// The CLI that owns the session: its pid (as this process's pid namespace numbers it)
/// and its start time (`/proc/PID/stat`'s 22nd field, clock ticks since boot); pid 0: none
/// known (the CLI was gone, or is in a pid namespace this process does not see).
static OWNER_PID: AtomicU32 = AtomicU32::new(0);
static OWNER_START: AtomicU64 = AtomicU64::new(0);

/// The start time of process `pid` (`/proc/PID/stat` field 22), if it exists.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ...`: the fields after the last ')' start at the 3rd.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()
}

/// The CLI making this call: this thread's tracer (`TracerPid`, 0 when it is gone or not
/// in this pid namespace), with its start time, read while it is.
fn calling_cli() -> (u32, u64) {
    let status = std::fs::read_to_string("/proc/thread-self/status").unwrap_or_default();
    let pid: u32 = status
        .lines()
        .find_map(|l| l.strip_prefix("TracerPid:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    match (pid, start_time(pid)) {
        (0, _) | (_, None) => (0, 0),
        (pid, Some(start)) => (pid, start),
    }
}

/// Whether the session's CLI still lives: its pid names the same process as when it
/// attached (none known: gone).
fn owner_alive() -> bool {
    let pid = OWNER_PID.load(Ordering::Relaxed);
    pid != 0 && start_time(pid) == Some(OWNER_START.load(Ordering::Relaxed))
}

/// A later session (the agent was attached before and detached): ftrace is initialized
/// and its sites are NOP; the new session's rings replace the old ones (every thread's
/// claim on them is dropped: `thread_pointers`), the objects loaded or unloaded since are
/// followed, then the session's events and tracers start as in the first.
fn again(
    config: &AgentConfig,
    stopped_ips: &[u64],
    stopped_sps: &[u64],
    thread_pointers: &[u64],
) -> Result<(), StartError> {
    // The sites the last detach put back are NOPs again, as at the first attach.
    cli_holds_threads()?;
    // SAFETY: the CLI's call: every other thread is stopped, at `stopped_ips`.
    let left = unsafe { ftprobe::ftrace::convert_found_sites(stopped_ips)? };
    if let Some(ip) = left.first() {
        refused_for_now();
        return Err(format!(
            "a thread is stopped inside the site at {ip:#x} (and {} more): try again",
            left.len() - 1
        )
        .into());
    }
    let rings = crate::open_rings(&config.rings)?;
    let (own, objects) = crate::loaded_objects();
    rings.set_objects(&crate::objects_table(&objects))?;
    ftprobe::trace::replace_buffer(rings);
    for &tp in thread_pointers {
        // SAFETY: the CLI stopped every other thread (this one makes the call); `tp` is a
        // live thread's %fs base, and the offset was fixed by the first attach.
        unsafe { ftprobe::trace::forget_thread_ring(tp) };
    }
    free_old_rings(stopped_ips, stopped_sps, thread_pointers);
    // Objects loaded or unloaded since the last session (the loader hook was off).
    crate::dlopen::sync_objects();
    crate::arm(config, &objects, own, stopped_ips)
}

/// Unmap the rings of the sessions before this one (their pages and their address space)
/// when that is provably safe: no thread claims one any more (`again` dropped every
/// claim), and no thread is stopped inside ftprobe's code (its instruction pointer in the
/// agent's text or in an anonymous executable mapping: trampolines, slots, return
/// trampolines) or inside the probe path (a writer section open, a callback or kprobe
/// running). Else they stay, and the next attach tries again.
fn free_old_rings(stopped_ips: &[u64], stopped_sps: &[u64], thread_pointers: &[u64]) {
    let code = ftprobe_code();
    if code.is_empty() {
        return;
    }
    let in_code = |ip: u64| code.iter().any(|&(a, b)| ip >= a && ip < b);
    if stopped_ips.iter().any(|&ip| in_code(ip)) {
        return;
    }
    // Two addresses are on one stack when one mapping holds both (thread stacks are
    // mappings of their own, apart by guard pages).
    let maps = mappings();
    let mapping_of = |a: u64| maps.iter().position(|&(lo, hi)| a >= lo && a < hi);
    let same_stack = |a: u64, b: u64| mapping_of(a).is_some() && mapping_of(a) == mapping_of(b);
    let in_probe_path = |i: usize, tp: u64| match stopped_sps.get(i) {
        // SAFETY: as in `again`: every other thread is stopped, `tp` a live thread's, `sp`
        // its stack pointer.
        Some(&sp) if stopped_sps.len() == thread_pointers.len() => unsafe {
            ftprobe::trace::thread_in_probe_path_at(tp, sp, same_stack)
        },
        // SAFETY: as above.
        _ => unsafe { ftprobe::trace::thread_in_probe_path(tp) },
    };
    if thread_pointers
        .iter()
        .enumerate()
        .any(|(i, &tp)| in_probe_path(i, tp))
    {
        return;
    }
    // Every other thread is still in its ptrace stop now, after the claims were dropped and
    // the checks made: so they held still throughout (a thread its tracer let go never
    // stops again until another attaches). Were ftprobe killed meanwhile, they run: then
    // nothing is freed.
    if !others_stopped() {
        return;
    }
    // SAFETY: every claim was dropped (`again`), no thread is in ftprobe's code or the
    // probe path (checked above), and all of them but this one are stopped by the CLI
    // until this call returns.
    unsafe { ftprobe::trace::free_retired_buffers() };
}

/// Refused unless the CLI making this call still holds every other thread stopped: the
/// sites' bytes (a run of one-byte NOPs, a `-pg` build's call) may only be rewritten then.
/// A CLI killed during its call lets the threads go, and the call goes on in its thread
/// (found with `trace -p` killed during function_graph sessions on a busy program built with
/// `-fpatchable-function-entry=5`: the program then died of SIGILL or SIGSEGV, about once in
/// 70 kills); such a call now changes no site (the next attach sees the session gone).
fn cli_holds_threads() -> Result<(), String> {
    // The threads' states, not this thread's tracer: a CLI in another pid namespace has no
    // pid here.
    if !others_stopped() {
        return Err(
            "the ftprobe that made this call is gone (the threads run again): no site changed"
                .into(),
        );
    }
    Ok(())
}

/// Whether every thread of the process but this one is in a ptrace stop (`t`) or ended.
fn others_stopped() -> bool {
    // SAFETY: gettid has no preconditions.
    let me = unsafe { libc::gettid() };
    // Not std::fs::read_dir: the C library's opendir would call the program's malloc.
    let Ok(tids) = ftprobe::sys::thread_ids() else {
        return false;
    };
    tids.into_iter().all(|tid| {
        if tid as i32 == me {
            return true;
        }
        let stat =
            std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap_or_default();
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().next())
            .unwrap_or("");
        matches!(state, "t" | "Z" | "X")
    })
}

/// Every mapping of this process, as `(start, end)`.
fn mappings() -> Vec<(u64, u64)> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    maps.lines()
        .filter_map(|l| {
            let (a, b) = l.split_whitespace().next()?.split_once('-')?;
            Some((
                u64::from_str_radix(a, 16).ok()?,
                u64::from_str_radix(b, 16).ok()?,
            ))
        })
        .collect()
}

/// ftprobe's executable memory in this process: the agent's text and the anonymous
/// executable mappings (trampolines, slots, return trampolines), as `(start, end)`.
fn ftprobe_code() -> Vec<(u64, u64)> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    maps.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let ours = f.len() == 5
                || f.get(5)
                    .is_some_and(|p| p.ends_with("/libftprobe_agent.so"));
            if f.len() < 5 || !f[1].contains('x') || !ours {
                return None;
            }
            let (a, b) = f[0].split_once('-')?;
            Some((
                u64::from_str_radix(a, 16).ok()?,
                u64::from_str_radix(b, 16).ok()?,
            ))
        })
        .collect()
}

/// The stack pointers of the stopped threads that may be inside a trampoline (their `ip`
/// in ftprobe's code, or their probe-path state busy): the stacks a detach looks at for a
/// return into a site (`ftrace::restore_found_sites`). `None` when the lists do not match.
fn stacks_inside(stopped: &Stopped) -> Option<Vec<u64>> {
    let n = stopped.ips.len();
    if stopped.sps.len() != n || stopped.tps.len() != n {
        return None;
    }
    let code = ftprobe_code();
    let in_code = |ip: u64| code.iter().any(|&(a, b)| ip >= a && ip < b);
    Some(
        (0..n)
            .filter(|&i| {
                in_code(stopped.ips[i])
                    // SAFETY: every other thread is stopped, `tp` a live thread's %fs base.
                    || unsafe { ftprobe::trace::thread_in_probe_path(stopped.tps[i]) }
            })
            .map(|i| stopped.sps[i])
            .collect(),
    )
}

/// Where the stopped threads are (each list in the same order; empty when not known).
struct Stopped<'a> {
    ips: &'a [u64],
    sps: &'a [u64],
    tps: &'a [u64],
}

/// A refused attach: the descriptors the CLI made in this process for the session (the
/// rings' memfd, the control channel's) are closed, not left to the program.
fn close_session_fds(config: &AgentConfig) {
    let agent_config::RingsFrom::Fd(fd) = config.rings;
    for fd in std::iter::once(fd).chain(config.control) {
        // SAFETY: descriptors the CLI created in this process for this session, which
        // nothing else uses.
        unsafe { libc::close(fd) };
    }
}

/// Rings memfds of earlier attaches whose CLI died before the agent mapped them (a
/// SIGKILL during the attach): the agent closes every rings descriptor it maps, so any
/// other open one that nothing maps is such a leftover (found by a fresh user's review: one
/// descriptor per killed attach, for good).
fn close_stale_rings_fds(config: &AgentConfig) {
    let agent_config::RingsFrom::Fd(own) = config.rings;
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    // The rings memfds mapped in this process, by inode: one mapped is in use (by the
    // agent, or by the program if it is itself an ftprobe reading its child's rings).
    let mapped: Vec<u64> = std::fs::read_to_string("/proc/self/maps")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("memfd:ftprobe-rings"))
        .filter_map(|l| l.split_whitespace().nth(4)?.parse().ok())
        .collect();
    let stale: Vec<i32> = dir
        .flatten()
        .filter_map(|e| {
            let fd: i32 = e.file_name().to_str()?.parse().ok()?;
            let target = std::fs::read_link(e.path()).ok()?;
            let t = target.to_string_lossy();
            let rings = t == "/memfd:ftprobe-rings (deleted)" || t == "/memfd:ftprobe-rings";
            if !rings || fd == own || Some(fd) == config.control {
                return None;
            }
            let ino = std::fs::metadata(e.path()).ok()?.ino();
            (!mapped.contains(&ino)).then_some(fd)
        })
        .collect();
    for fd in stale {
        // SAFETY: a rings memfd no session uses (see above).
        unsafe { libc::close(fd) };
    }
}

/// The call's refusal is for now only: a stopped thread is where a site is about to be
/// rewritten (inside a run of one-byte NOPs, say); once the threads have run a moment, the
/// same message will do (the answer 3).
static REFUSED_FOR_NOW: AtomicBool = AtomicBool::new(false);

/// Mark this call's refusal as one for now ([`REFUSED_FOR_NOW`]).
pub(crate) fn refused_for_now() {
    REFUSED_FOR_NOW.store(true, Ordering::Relaxed);
}

/// Hooked calls the last detach or `RestoreSites` left returning through the trampoline.
static RETURNS_LEFT: AtomicU64 = AtomicU64::new(0);

/// Calls still running through the return trampoline return straight to their callers (an
/// exception can then unwind through them: issue 26, item 5); those of threads stopped in
/// ftprobe's code keep their hook (the trampoline stays mapped) until a `RestoreSites`
/// finds them out of it. Unknown stacks: all are left.
fn unhook_returns(stopped: &Stopped) {
    let keep = stacks_inside(stopped);
    // SAFETY: the CLI's call: every other thread is stopped; the graph users are gone (the
    // detach unregistered them first); a thread in the middle of an fgraph event is one
    // `stacks_inside` keeps (unknown stacks: every hooked call is left).
    let left = unsafe { ftprobe::ftrace::fgraph::unhook_returns(keep.as_deref()) }.1;
    RETURNS_LEFT.store(left as u64, Ordering::Relaxed);
}

/// The sites the last detach or `RestoreSites` could not put back yet.
static SITES_LEFT: std::sync::Mutex<Vec<u64>> = std::sync::Mutex::new(Vec::new());

/// Put back the bytes the sites held at the first attach (`ftrace::restore_found_sites`);
/// those that cannot be yet go to [`SITES_LEFT`].
fn restore_sites(stopped: &Stopped) -> Result<(), String> {
    cli_holds_threads()?;
    let stacks = stacks_inside(stopped);
    // SAFETY: the CLI's call: every other thread is stopped, at `stopped.ips`.
    match unsafe { ftprobe::ftrace::restore_found_sites(stopped.ips, stacks.as_deref()) } {
        Ok(left) => {
            *SITES_LEFT.lock().unwrap_or_else(|e| e.into_inner()) = left;
            Ok(())
        }
        Err(ftprobe::ftrace::FtraceError::NotInitialized) => Ok(()),
        Err(e) => Err(format!("putting back the sites' bytes: {e}")),
    }
}

/// The CLI's call: `msg` is a NUL-terminated encoded [`AgentMessage`]; the agent's messages
/// (and the error, if any) are written into `out` (`out_len` bytes, NUL-terminated).
/// Returns 0 when the message was carried out, 1 otherwise, 2 when it was but sites are
/// left to put back (a detach whose threads were inside a trampoline: the CLI lets them run
/// and sends `RestoreSites`), 3 when it was refused for now only (a thread is stopped inside
/// a site about to be rewritten: the CLI lets the threads run a moment and sends it again;
/// nothing was armed).
///
/// # Safety
/// `msg` is a NUL-terminated string and `out` is writable for `out_len` bytes. Called by
/// the CLI while every other thread of the process is stopped.
#[no_mangle]
pub unsafe extern "C" fn ftprobe_agent_control(
    msg: *const c_char,
    out: *mut u8,
    out_len: usize,
) -> i32 {
    // The agent's work on a thread of the program's: not the program's events.
    let _busy = ftprobe::kprobes::KprobeBusy::begin();
    if let Ok(mut g) = CAPTURE.lock() {
        *g = Some(String::new());
    }
    // SAFETY: the caller's contract: a NUL-terminated string.
    let bytes = unsafe { CStr::from_ptr(msg) }.to_bytes();
    let decoded = agent_config::decode(bytes);
    // Only the end of a session reports the calls it left hooked.
    let ending = matches!(
        decoded,
        Ok(AgentMessage::Detach { .. } | AgentMessage::RestoreSites { .. })
    );
    REFUSED_FOR_NOW.store(false, Ordering::Relaxed);
    let result = decoded.and_then(handle);
    let left = std::mem::take(&mut *SITES_LEFT.lock().unwrap_or_else(|e| e.into_inner()));
    let returns_left = if ending {
        RETURNS_LEFT.load(Ordering::Relaxed)
    } else {
        0
    };
    let mut text = CAPTURE
        .lock()
        .ok()
        .and_then(|mut g| g.take())
        .unwrap_or_default();
    let code = match result {
        // Carried out, but sites wait to be put back (`RestoreSites` later).
        Ok(()) if !left.is_empty() || returns_left > 0 => {
            if !left.is_empty() {
                text.push_str(&format!(
                    "{} site(s) left as NOPs instead of the bytes found at the attach (a thread \
                     is stopped inside, or may return into, the trampoline it calls): {}",
                    left.len(),
                    left.iter()
                        .map(|ip| format!("{ip:#x}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            if returns_left > 0 {
                if !text.is_empty() && !text.ends_with('\n') {
                    text.push('\n');
                }
                text.push_str(&format!(
                    "{returns_left} call(s) left returning through ftprobe's return trampoline \
                     (a thread is stopped in ftprobe's code)"
                ));
            }
            2
        }
        Ok(()) => 0,
        Err(e) => {
            text.push_str(&e);
            if REFUSED_FOR_NOW.load(Ordering::Relaxed) {
                3
            } else {
                1
            }
        }
    };
    if out_len > 0 {
        let n = text.len().min(out_len - 1);
        // SAFETY: the caller's contract: `out` is writable for `out_len` bytes; n < out_len.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), out, n);
            *out.add(n) = 0;
        }
    }
    code
}

fn handle(msg: AgentMessage) -> Result<(), String> {
    match msg {
        AgentMessage::Attach {
            config,
            stopped_ips,
            thread_pointers,
            stopped_sps,
        } => {
            if ftprobe::trace::buffer().is_some() && !ATTACHED.load(Ordering::Relaxed) {
                close_session_fds(&config);
                return Err(
                    "this process is traced already: it was started under `ftprobe trace`".into(),
                );
            }
            // First, while the CLI surely lives (it is making this call).
            let owner = calling_cli();
            if TRACING.load(Ordering::Acquire) {
                let owner = OWNER_PID.load(Ordering::Relaxed);
                if owner_alive() {
                    close_session_fds(&config);
                    return Err(format!(
                        "another ftprobe (process {owner}) is attached to this process"
                    ));
                }
                // Its CLI is gone (killed): its session is ended first, every byte back,
                // as its own detach would have.
                TRACING.store(false, Ordering::Release);
                detach(&Stopped {
                    ips: &stopped_ips,
                    sps: &stopped_sps,
                    tps: &thread_pointers,
                })
                .map_err(|e| {
                    format!("ending the session of ftprobe process {owner}, which is gone: {e}")
                })?;
                crate::say(format_args!(
                    "ftprobe-agent: the session of ftprobe process {owner}, which is gone, was \
                     ended first\n"
                ));
            }
            close_stale_rings_fds(&config);
            // SAFETY: getpid has no preconditions.
            PID.store(unsafe { libc::getpid() }, Ordering::Relaxed);
            ATTACHED.store(true, Ordering::Release);
            // A session before this one initialized ftrace (an attach that failed before
            // that, e.g. on the rings, starts from the beginning again).
            let ips = stopped_ips.clone();
            let r = if ftprobe::ftrace::functions().is_ok() {
                again(&config, &stopped_ips, &stopped_sps, &thread_pointers)
            } else {
                cli_holds_threads()
                    .map_err(StartError::from)
                    .and_then(|()| start(&config, &Mode::Attached { stopped_ips }))
            };
            if let Err(e) = r {
                // Refused (a probe that cannot be armed, ...): whatever this attach armed
                // is undone before the CLI lets the threads go.
                let mut text = e.to_string();
                if ftprobe::ftrace::functions().is_ok() {
                    // Nothing was loaded since ftrace was started (no thread runs).
                    crate::dlopen::remember(&crate::loaded_objects().1);
                    if let Err(u) = detach(&Stopped {
                        ips: &ips,
                        sps: &[],
                        tps: &[],
                    }) {
                        text.push_str(&format!("\n(undoing the attach: {u})"));
                    }
                }
                return Err(text);
            }
            // Sites the end of a gone session could not put back were made NOPs again by
            // this session's start: nothing is left to say (an answer 2 would hide the
            // message that the gone session was ended).
            SITES_LEFT.lock().unwrap_or_else(|e| e.into_inner()).clear();
            OWNER_PID.store(owner.0, Ordering::Relaxed);
            OWNER_START.store(owner.1, Ordering::Relaxed);
            TRACING.store(true, Ordering::Release);
            if let Some(fd) = config.control {
                // The control channel (`trace -p PID --control`): a thread of the agent's,
                // running once the CLI lets the program go; it ends with the session.
                if let Err(e) = crate::control::start(fd, config.function, config.graph) {
                    crate::say(format_args!("ftprobe-agent: no control channel: {e}\n"));
                }
            }
            Ok(())
        }
        AgentMessage::RestoreSites {
            stopped_ips,
            stopped_sps,
            thread_pointers,
        } => {
            if TRACING.load(Ordering::Acquire) {
                return Err("the agent is tracing: sites are put back at its detach".into());
            }
            let stopped = Stopped {
                ips: &stopped_ips,
                sps: &stopped_sps,
                tps: &thread_pointers,
            };
            if RETURNS_LEFT.load(Ordering::Relaxed) > 0 {
                unhook_returns(&stopped);
                if RETURNS_LEFT.load(Ordering::Relaxed) == 0 {
                    let errors = ftprobe::ftrace::fgraph_unwind::disarm_unwinder_probes();
                    crate::return_hooks_stopped();
                    if let Some(e) = errors.first() {
                        return Err(format!("removing the unwinder probes: {e}"));
                    }
                }
            }
            restore_sites(&stopped)
        }
        AgentMessage::Detach {
            stopped_ips,
            stopped_sps,
            thread_pointers,
        } => {
            if !TRACING.swap(false, Ordering::AcqRel) {
                return Err("the agent is not tracing".into());
            }
            detach(&Stopped {
                ips: &stopped_ips,
                sps: &stopped_sps,
                tps: &thread_pointers,
            })
        }
    }
}

/// Stop everything the attach started: the tracers' ops unregistered (their sites back to
/// NOP by the batch protocol), every kprobe (events and the unwinder's) unregistered (its
/// byte back), `_dl_debug_state` back, then every site back to the bytes the first attach
/// found there (`ftrace::restore_found_sites`; the other threads are stopped at
/// `stopped`; without their stacks, 6-byte GOT call sites stay NOPs). Trampolines, slots
/// and rings stay mapped (a thread may still be in one), unused. An error says what was
/// left and where.
fn detach(stopped: &Stopped) -> Result<(), String> {
    use ftprobe::ftrace::{self, FtraceError};
    let mut errors = Vec::new();
    for r in [
        ftrace::unregister_ftrace_function(&ftprobe::function_tracer::FUNCTION_OPS),
        ftrace::fgraph::unregister_ftrace_graph(&ftprobe::function_graph::GRAPH_OPS),
    ] {
        match r {
            Ok(()) | Err(FtraceError::NotRegistered) => {}
            Err(e) => errors.push(e.to_string()),
        }
    }
    // The next session sets its own filters.
    for ops in [
        &ftprobe::function_tracer::FUNCTION_OPS,
        ftprobe::function_graph::GRAPH_OPS.ops(),
    ] {
        if let Err(e) = ftrace::ftrace_reset_filters(ops) {
            errors.push(e.to_string());
        }
    }
    errors.extend(
        ftprobe::trace_kprobe::unregister_all()
            .into_iter()
            .map(|e| e.to_string()),
    );
    // The unwinder probes go once no call returns through the trampoline any more (an
    // exception thrown through such a call needs them); else at a later `RestoreSites`.
    unhook_returns(stopped);
    if RETURNS_LEFT.load(Ordering::Relaxed) == 0 {
        errors.extend(
            ftrace::fgraph_unwind::disarm_unwinder_probes()
                .into_iter()
                .map(|e| e.to_string()),
        );
        crate::return_hooks_stopped();
    }
    crate::dlopen::unhook();
    if let Err(e) = restore_sites(stopped) {
        errors.push(e);
    }
    // A session's `tracing_on 0` (control channel) does not outlive it.
    ftprobe::trace::set_tracing_on(true);
    if errors.is_empty() {
        Ok(())
    } else {
        Err(format!("stopping the agent: {}", errors.join("; ")))
    }
}
