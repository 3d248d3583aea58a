//! The preloaded agent (`LD_PRELOAD=libftprobe_agent.so`): runs the ftprobe engine inside the
//! traced process. It does nothing unless the `ftprobe` CLI started the process:
//!
//! - `FTPROBE_RING_FD`: the inherited memfd of the rings (see `ftprobe::ring`);
//! - `FTPROBE_CLI_PID`: the CLI's pid: only its direct child traces;
//! - `FTPROBE_FILTER`, `FTPROBE_NOTRACE`: newline-separated `set_ftrace_filter` patterns;
//! - `FTPROBE_FUNCTION`: `1` to run the function tracer;
//! - `FTPROBE_TRACER`: `function_graph` to run the function_graph tracer (with
//!   `FTPROBE_GRAPH_FUNCTION`, `FTPROBE_GRAPH_NOTRACE`: newline-separated
//!   `set_graph_function` / `set_graph_notrace` patterns, and `FTPROBE_MAX_DEPTH`:
//!   `max_graph_depth`);
//! - `FTPROBE_EVENTS`: newline-separated kprobe probe definitions, `ID<TAB>DEF` (the probes of
//!   one event share its id).
//!
//! Its constructor runs before `main` and before any thread exists, which is what
//! `ftrace::init` requires: it converts every site to NOP, publishes the loaded objects,
//! creates the kprobe events, writes the armed-probes listing for the CLI and registers the
//! function tracer. Then it removes its variables and itself from the environment and closes
//! the memfd (the mapping stays), so the program and what it runs see what they would see
//! untraced. Problems go to stderr prefixed `ftprobe-agent:`. A probe definition that cannot
//! be armed stops the process before `main` (exit status 1), as perf or bpftrace refuse to
//! start; any other problem leaves the program running untraced.

mod alloc;
mod attach;
mod control;
mod control_thread;
mod environ;
mod returns;
mod sigtrap;

use std::os::fd::BorrowedFd;

use ftprobe::agent_config::{AgentConfig, RingsFrom};
use ftprobe::events::error_log;
use ftprobe::ring::SharedRings;
use ftprobe::trace;
use ftprobe::trace_kprobe;
use ftprobe::{ftrace, function_graph, function_tracer, kprobes};

/// TEXT record kind: the armed-probes listing (`kprobes/list`).
pub const TEXT_KPROBES_LIST: u32 = 1;
/// TEXT record kind: the listing's next part (a listing longer than one record is cut at line
/// ends: the reader prints the parts under one header).
pub const TEXT_KPROBES_LIST_MORE: u32 = 6;
/// TEXT record kind: a note for the trace's header (one line).
pub const TEXT_NOTE: u32 = 5;

#[used]
#[link_section = ".init_array"]
static AGENT_INIT: extern "C" fn() = agent_init;

#[used]
#[link_section = ".fini_array"]
static AGENT_FINI: extern "C" fn() = agent_fini;

/// The pid the agent started in: a forked child's exit must not report the parent's counts.
static PID: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

mod early;
mod exec;
mod follow;

/// Writes the agent's own messages to stderr with a raw `write` system call: a probe on
/// `libc:write` counts the program's writes, never the tracer's (`syscall` itself is on the
/// probe path's blacklist, so it is never probed).
fn say(args: std::fmt::Arguments<'_>) {
    let text = args.to_string();
    // While the CLI's call into an attached process runs: its messages go back to the CLI.
    if let Ok(mut g) = CAPTURE.try_lock() {
        if let Some(buf) = g.as_mut() {
            buf.push_str(&text);
            return;
        }
    }
    let mut rest = text.as_bytes();
    while !rest.is_empty() {
        // SAFETY: write(2) of a live buffer to fd 2.
        let n = unsafe { libc::syscall(libc::SYS_write, 2, rest.as_ptr(), rest.len()) };
        if n <= 0 {
            break;
        }
        rest = &rest[n as usize..];
    }
}

/// Where [`say`] writes while [`attach::ftprobe_agent_control`] runs (`None`: stderr).
static CAPTURE: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// `eprintln!` through [`say`].
macro_rules! say {
    ($($t:tt)*) => { crate::say(format_args!("{}\n", format_args!($($t)*))) };
}

mod dlopen;

/// The agent's constructor. As a rule the agent has started already, from the first
/// initializer of another object ([`early`]); else (no other object has an initializer, or
/// the loader did not run the relocation-time resolver) it starts here.
extern "C" fn agent_init() {
    early::unhook_all();
    if early::claim_start() {
        start_agent();
    }
    // Keeps the IFUNC (and its relocation) in the library.
    let _ = early::resolver_ran();
}

/// Start the agent: once, before any initializer of the program's objects when possible.
fn start_agent() {
    // Its own calls of the C library, once the first probes are armed, are not the
    // program's events (`KprobeBusy`).
    let _busy = ftprobe::kprobes::KprobeBusy::begin();
    sigtrap::init();
    exec::init();
    init();
}

/// [`agent_init`]'s work; everything it allocates is freed before it returns.
fn init() {
    let Ok(fd) = std::env::var("FTPROBE_RING_FD") else {
        return;
    };
    let cli_pid = std::env::var("FTPROBE_CLI_PID")
        .ok()
        .and_then(|p| p.parse::<i32>().ok());
    // A followed exec's new image joins whoever its parent is (`follow`).
    // SAFETY: getppid has no preconditions.
    let ours = follow::exec_pid_is_mine() || cli_pid == Some(unsafe { libc::getppid() });
    let config = config_from_env(&fd, cli_pid.unwrap_or(0));
    if !ours {
        return;
    }
    // SAFETY: getpid has no preconditions.
    PID.store(
        unsafe { libc::getpid() },
        std::sync::atomic::Ordering::Relaxed,
    );
    match config.and_then(|c| start(&c, &Mode::Preloaded).map(|()| c)) {
        Ok(c) => {
            if let Some(fd) = c.control {
                if let Err(e) = control::start(fd, c.function, c.graph) {
                    say!("ftprobe-agent: no control channel: {e}");
                }
            }
        }
        Err(e) if follow::enabled() => {
            // --follow-exec: this image may exec one that can be traced (a shell script).
            if let StartError::Probe(text) = &e {
                say(format_args!("{text}"));
            }
            let exe = std::fs::read_link("/proc/self/exe").unwrap_or_default();
            let why = match &e {
                StartError::Probe(_) => "a probe cannot be armed here".to_owned(),
                StartError::Other(e) => e.to_string(),
            };
            say!(
                "ftprobe-agent: {why}: nothing traced in {} (--follow-exec: its exec is followed)",
                exe.display()
            );
        }
        Err(StartError::Probe(text)) => {
            say(format_args!("{text}"));
            // Which program it was (a script or a shim runs its interpreter, which is
            // what the agent looked in).
            let exe = std::fs::read_link("/proc/self/exe").unwrap_or_default();
            // SAFETY: getpid has no preconditions.
            let pid = unsafe { libc::getpid() };
            say!("  (in {}, pid {pid}: stopped before main)", exe.display());
            // SAFETY: _exit ends the process at once; main has not run, nothing to flush.
            unsafe { libc::_exit(1) };
        }
        Err(StartError::Other(e)) => {
            // As for a definition that cannot be armed: the program does not run untraced
            // as if all were well.
            say!("ftprobe-agent: {e}: stopped before main, nothing traced");
            // SAFETY: _exit ends the process at once; main has not run, nothing to flush.
            unsafe { libc::_exit(1) };
        }
    }
}

/// The agent's variables, read and removed from the environment, as a configuration (the
/// one an attaching CLI sends).
fn config_from_env(fd: &str, cli_pid: i32) -> Result<AgentConfig, StartError> {
    let lines = |var: &str| -> Vec<String> {
        std::env::var(var)
            .unwrap_or_default()
            .split('\n')
            .filter(|s| !s.trim().is_empty())
            .map(str::to_owned)
            .collect()
    };
    let events = lines("FTPROBE_EVENTS")
        .into_iter()
        .enumerate()
        .map(|(line, probe)| {
            // `ID<TAB>DEF` (the probes of one event share its id), or a bare DEF: id = line.
            match probe.split_once('\t') {
                Some((id, cmd)) if id.parse::<u32>().is_ok() => {
                    (id.parse::<u32>().unwrap_or(0), cmd.to_owned())
                }
                _ => (line as u32, probe),
            }
        })
        .collect();
    let max_depth = std::env::var("FTPROBE_MAX_DEPTH").ok();
    let fd_num = fd.parse::<i32>().ok();
    let config = AgentConfig {
        rings: RingsFrom::Fd(fd_num.unwrap_or(-1)),
        cli_pid: cli_pid as u32,
        filter: lines("FTPROBE_FILTER"),
        notrace: lines("FTPROBE_NOTRACE"),
        function: std::env::var("FTPROBE_FUNCTION").is_ok_and(|v| v == "1"),
        events,
        graph: std::env::var("FTPROBE_TRACER").is_ok_and(|v| v == "function_graph"),
        graph_function: lines("FTPROBE_GRAPH_FUNCTION"),
        graph_notrace: lines("FTPROBE_GRAPH_NOTRACE"),
        max_depth: 0,
        control: std::env::var("FTPROBE_CONTROL_FD")
            .ok()
            .and_then(|v| v.parse::<i32>().ok()),
    };
    // SAFETY (environ::remove, environ::shorten): we run from .init_array before main; no other thread
    // reads the environment concurrently (ftrace::init checks that we are alone).
    // Libraries the CLI preloaded before the agent (a sanitizer's runtime, which must come
    // first): taken out of LD_PRELOAD too, as the agent itself.
    let added = std::env::var("FTPROBE_PRELOADED").unwrap_or_default();
    let added: Vec<&str> = added.split(':').filter(|p| !p.is_empty()).collect();
    follow::save();
    for var in follow::SESSION_VARS {
        // SAFETY: see above: constructor, single thread; the agent keeps no pointer into
        // the environment (what it needs was copied above and by `follow::save`).
        unsafe { environ::remove(var) };
    }
    if let Ok(preload) = std::env::var("LD_PRELOAD") {
        let rest: Vec<&str> = preload
            .split([':', ' '])
            .filter(|p| !p.is_empty() && !p.ends_with("libftprobe_agent.so") && !added.contains(p))
            .collect();
        if rest.is_empty() {
            // SAFETY: see above: constructor, single thread (the dynamic loader read
            // LD_PRELOAD before any constructor ran).
            unsafe { environ::remove("LD_PRELOAD") };
        } else {
            // SAFETY: see above: constructor, single thread.
            unsafe { environ::shorten("LD_PRELOAD", &rest.join(":")) };
        }
    }
    if fd_num.is_none() {
        return Err(format!("FTPROBE_RING_FD={fd:?} is not a file descriptor").into());
    }
    let max_depth = match max_depth.as_deref().map(str::trim) {
        None | Some("") => 0,
        Some(v) => v
            .parse::<u32>()
            .map_err(|_| format!("FTPROBE_MAX_DEPTH={v:?} is not a number"))?,
    };
    Ok(AgentConfig {
        max_depth,
        ..config
    })
}

/// How the agent came into the process.
pub(crate) enum Mode {
    /// Preloaded by `ftprobe trace`: its constructor runs before `main`, alone.
    Preloaded,
    /// Loaded by an attaching CLI: every other thread is stopped, at these instruction
    /// pointers.
    Attached { stopped_ips: Vec<u64> },
}

/// Why [`start`] failed.
pub(crate) enum StartError {
    /// A probe definition that cannot be armed: the kernel's error log text (with its
    /// caret line and detail).
    Probe(String),
    Other(Box<dyn std::error::Error>),
}

impl<E: Into<Box<dyn std::error::Error>>> From<E> for StartError {
    fn from(e: E) -> StartError {
        StartError::Other(e.into())
    }
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::Probe(t) => f.write_str(t.trim_end()),
            StartError::Other(e) => write!(f, "{e}"),
        }
    }
}

/// Map the rings' memfd as the configuration says (the descriptor is closed again: the
/// mapping stays).
pub(crate) fn open_rings(from: &RingsFrom) -> Result<SharedRings, StartError> {
    let RingsFrom::Fd(fd) = *from;
    // SAFETY: the CLI passed (or had us make) this fd and nothing else in the process
    // knows it.
    let rings = SharedRings::attach(unsafe { BorrowedFd::borrow_raw(fd) });
    // --follow-exec keeps the preloaded agent's descriptor for the images it execs.
    if !(rings.is_ok() && follow::keep_fd(fd)) {
        // SAFETY: the mapping (if any) does not need the fd; closing it frees the number.
        unsafe { libc::close(fd) };
    }
    Ok(rings?)
}

/// The loaded objects but the agent (which has no sites, must not be probed, and whose
/// symbols would only slow every start), and the agent's load base.
pub(crate) fn loaded_objects() -> (Option<u64>, Vec<ftprobe::process::LoadedObject>) {
    let own = own_load_base();
    let objects = ftprobe::process::loaded_objects()
        .into_iter()
        .filter(|o| Some(o.bias) != own)
        .collect();
    (own, objects)
}

/// `objects` as the rings' objects table holds them: (load bias, path).
pub(crate) fn objects_table(objects: &[ftprobe::process::LoadedObject]) -> Vec<(u64, &[u8])> {
    objects
        .iter()
        .map(|o| (o.bias, o.path.as_os_str().as_encoded_bytes()))
        .collect()
}

fn start(config: &AgentConfig, mode: &Mode) -> Result<(), StartError> {
    let rings = open_rings(&config.rings)?;
    let tsc = ftprobe::ring::read_tsc();
    // Published first, so the CLI can symbolize and knows the agent ran even if init fails.
    // This library itself is left out: it has no sites, must not be probed, and parsing its
    // symbols (~10 MB of file, ~20k Rust names to demangle) would only slow every start.
    let (own, objects) = loaded_objects();
    let table = objects_table(&objects);
    // A followed exec: the old image's objects stay (its records need them).
    let exec_image = matches!(mode, Mode::Preloaded) && follow::exec_image();
    let mut image = None;
    if exec_image {
        let first = rings.objects().len();
        image = Some((first, rings.add_objects(&table)));
    } else {
        rings.set_objects(&table)?;
    }
    match mode {
        Mode::Preloaded => {
            if !trace::set_buffer(rings) {
                return Err("the agent's rings are set already".into());
            }
            if let Some((first, count)) = image {
                follow::announce_image(first, count, tsc);
            }
        }
        // An attach that failed before ftrace was initialized may have set one.
        Mode::Attached { .. } => trace::replace_buffer(rings),
    }
    let skipped = match mode {
        Mode::Preloaded => {
            say_early_status();
            // Loaded at startup, the agent's TLS block is static too: the probe path finds
            // its thread state at a fixed offset from the thread pointer, without a
            // `__tls_get_addr` call per hit (two per kprobe event).
            trace::fix_thread_state_offset();
            // SAFETY: we run from .init_array, before main; ftrace::init refuses if other
            // threads run. The biases are the dynamic linker's own (dl_iterate_phdr).
            unsafe { ftrace::init_objects(&objects) }?
        }
        Mode::Attached { stopped_ips } => {
            // A dlopened agent: the probe path finds its thread state without
            // `__tls_get_addr` (DEVELOPERS.md, "Attach").
            trace::fix_thread_state_offset();
            // SAFETY: every other thread is stopped by the CLI's ptrace until this returns,
            // at these instruction pointers (the CLI's call, DESIGN.md section 7).
            unsafe { ftrace::init_objects_stopped(&objects, stopped_ips) }.inspect_err(|e| {
                if matches!(e, ftrace::FtraceError::ThreadInSite { .. }) {
                    attach::refused_for_now();
                }
            })?
        }
    };
    sigtrap::start();
    // Fetch args read memory with plain loads once an event needs it (`uaccess`): preloaded,
    // the interposers keep ftprobe's fault handler and see the program's actions and masks;
    // attached, they do not (README: what a program that changes them later risks).
    ftprobe::arch::x86_64::uaccess::set_handlers_kept();
    for e in skipped {
        say!("ftprobe-agent: skipped an object: {e}");
    }
    let ips: &[u64] = match mode {
        Mode::Preloaded => &[],
        Mode::Attached { stopped_ips } => stopped_ips,
    };
    arm(config, &objects, own, ips)
}

/// Once ftrace is initialized and the trace buffer set: create the kprobe events, start
/// the tracers, follow later `dlopen`s, and say the trace is on. `objects`: the loaded
/// objects (without the agent, whose load base is `own`); `stopped_ips`: where the other
/// threads of an attached process resume.
pub(crate) fn arm(
    config: &AgentConfig,
    objects: &[ftprobe::process::LoadedObject],
    own: Option<u64>,
    stopped_ips: &[u64],
) -> Result<(), StartError> {
    // Return hooks in use (a return event, the function_graph tracer): longjmp, context
    // switches and unwinders must be followed (`start_return_hooks`).
    let mut returns_in_use = false;
    for (id, cmd) in &config.events {
        match trace_kprobe::create(*id, cmd) {
            Ok(tk) => {
                returns_in_use |= tk.rp.is_some();
                if let (
                    true,
                    kprobes::KprobeTarget::Symbol {
                        module: Some(m), ..
                    },
                ) = (tk.is_pending(), &tk.kp.target)
                {
                    say!(
                        "ftprobe-agent: {}/{}: {m} is not loaded: the probe is armed when it is",
                        tk.def.group,
                        tk.def.event
                    );
                }
            }
            Err(e) => {
                let mut text = format!("ftprobe-agent: {}", error_log(cmd, &e.err));
                if let Some(d) = e.detail {
                    text.push_str(&format!("  ({d})\n"));
                }
                return Err(StartError::Probe(text));
            }
        }
    }
    // A `:mod:OBJ` filter of an object not loaded yet selects the sites it will have (the
    // kernel keeps such a filter for a module loaded later): the program itself may have
    // none (its only sites in a library it `dlopen`s).
    let for_later = (config.function || config.graph)
        && config.filter.iter().any(|p| {
            ftrace::glob::FilterEntry::parse(p)
                .is_ok_and(|e| !e.negate && e.names_a_module() && !ftrace::filter_module_loaded(&e))
        });
    if config.events.is_empty() && ftrace::functions()?.is_empty() && !for_later {
        return Err(
            "no function of this program or its libraries has an ftrace site: nothing to trace \
                    (build with -pg -mfentry, -pg, or -fpatchable-function-entry=5)"
                .into(),
        );
    }
    if !config.events.is_empty() {
        trace::write_text_parts(TEXT_KPROBES_LIST, TEXT_KPROBES_LIST_MORE, &kprobes::list());
    }
    // A `:mod:OBJ` filter whose object is not loaded (yet) selects nothing until it is
    // (dlopen): said in the trace's header rather than tracing nothing silently.
    if config.function || config.graph {
        for (opt, pats) in [("-F", &config.filter), ("-N", &config.notrace)] {
            for p in pats.iter() {
                if let Ok(e) = ftrace::glob::FilterEntry::parse(p) {
                    if !e.negate && !ftrace::filter_module_loaded(&e) {
                        trace::write_text(
                            TEXT_NOTE,
                            &format!(
                                "{opt} {p}: no object it names is loaded (yet): it selects \
                                 nothing until one is (dlopen)"
                            ),
                        );
                    }
                }
            }
        }
    }
    if config.function {
        let unmatched = function_tracer::start(None, &config.filter, &config.notrace)?;
        // --follow-exec: a pattern may be for another program of the exec chain.
        if let Some(w) = unmatched.first().filter(|_| !follow::enabled()) {
            // The kernel refuses such a write to set_ftrace_filter / set_ftrace_notrace with
            // EINVAL (ftrace_regex_write): refused here too, before main.
            return Err(format!("{w} (EINVAL, as the kernel's set_ftrace_filter)").into());
        }
    }
    if config.graph {
        let cfg = function_graph::GraphConfig {
            filter: config.filter.clone(),
            notrace: config.notrace.clone(),
            graph_function: config.graph_function.clone(),
            graph_notrace: config.graph_notrace.clone(),
            max_depth: config.max_depth,
        };
        let unmatched = function_graph::start(None, &cfg).map_err(|e| match e {
            ftrace::FtraceError::NoMatch(_) => {
                format!("{e} (EINVAL, as the kernel's set_graph_function)")
            }
            e => e.to_string(),
        })?;
        if let Some(w) = unmatched.first().filter(|_| !follow::enabled()) {
            return Err(format!("{w} (EINVAL, as the kernel's set_ftrace_filter)").into());
        }
        returns_in_use = true;
    }
    if returns_in_use {
        start_return_hooks();
    }
    // Objects loaded from now on (`dlopen`) are scanned before their initializers run.
    if let Err(e) = dlopen::init(objects, own, !config.events.is_empty(), stopped_ips) {
        say!("ftprobe-agent: objects loaded later with dlopen will not be traced: {e}");
    }
    if let Some(rings) = trace::buffer() {
        rings.set_armed();
    }
    Ok(())
}

/// What the preloaded agent tells about its start: which objects' constructors ran before it.
fn say_early_status() {
    let (resolved, unhooked) = early::status();
    if !resolved {
        say!(
            "ftprobe-agent: started after the other libraries' constructors (the loader did not \
             run the agent's relocation-time hook): their calls are not traced"
        );
    } else if unhooked > 0 {
        say!(
            "ftprobe-agent: {unhooked} libraries past the first {} run their constructors \
             before the agent starts: calls made there are not traced",
            early::MAX_HOOKS
        );
    }
    let preinit = early::executable_preinit_functions();
    if preinit > 0 {
        say!(
            "ftprobe-agent: the executable's {preinit} .preinit_array function(s) ran before any \
             library was initialized, so before the agent: calls made there are not traced"
        );
    }
}

/// Return hooks are in use: the interposers of longjmp, context switches and catches tell
/// the engine, and unwinders (C++ exceptions, Rust panics, pthread_exit, cancellation,
/// backtrace) get probes on libgcc_s's entry points that put back the real return addresses
/// (ftprobe::ftrace::fgraph_unwind). libgcc_s is loaded in every process: it is a
/// `DT_NEEDED` of this library (build.rs), so a C program that loads it itself only at its
/// first `pthread_exit` or `backtrace` has it, probed, before main.
/// [`start_return_hooks`] once (a return event added by the control channel).
pub(crate) fn start_return_hooks_once() {
    if !RETURN_HOOKS.load(std::sync::atomic::Ordering::Relaxed) {
        start_return_hooks();
    }
}

/// [`start_return_hooks`] ran (and the unwinder probes were not taken out since).
static RETURN_HOOKS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The unwinder probes were taken out (an attached session's end): the next return event
/// added over the control channel arms them again.
pub(crate) fn return_hooks_stopped() {
    RETURN_HOOKS.store(false, std::sync::atomic::Ordering::Relaxed);
}

fn start_return_hooks() {
    RETURN_HOOKS.store(true, std::sync::atomic::Ordering::Relaxed);
    returns::start();
    // Attached, the C library's `longjmp` and context switches are not interposed: probes
    // on them tell the engine instead.
    let extra = if attach::attached() {
        &returns::LIBC_PROBES[..]
    } else {
        &[]
    };
    let (_, errors) = ftprobe::ftrace::fgraph_unwind::arm_unwinder_probes(extra);
    if !ftprobe::ftrace::has_module("libgcc_s.so.1") {
        say!(
            "ftprobe-agent: return hooks: libgcc_s.so.1 is not loaded: an exception, \
             pthread_exit or backtrace through a hooked call would find no caller"
        );
    }
    for e in errors {
        say!(
            "ftprobe-agent: return hooks: a probe of the unwinder's or the C library's failed: {e}"
        );
    }
}

/// The load base of this library (`dladdr` on one of its functions), which is its bias in
/// the objects table.
pub(crate) fn own_load_base() -> Option<u64> {
    // SAFETY: a zeroed Dl_info is valid; dladdr only writes it.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: the address is a function of this library; dladdr reads the linker's tables.
    let ok = unsafe { libc::dladdr(agent_init as *const libc::c_void, &mut info) };
    (ok != 0 && !info.dli_fbase.is_null()).then_some(info.dli_fbase as u64)
}

/// At exit: the function tracer's drops in the list function, for the CLI. It changes
/// nothing else: probes stay armed through the destructors that run after this one and
/// through libc's own exit work (stdio's flush), and kprobe events keep their counters in
/// the rings' shared header, which the CLI reads after the process is gone.
extern "C" fn agent_fini() {
    // SAFETY: getpid has no preconditions.
    if PID.load(std::sync::atomic::Ordering::Relaxed) != unsafe { libc::getpid() } {
        return;
    }
    let Some(buf) = trace::buffer() else { return };
    buf.note_lost_recursion(function_tracer::FUNCTION_OPS.missed());
    buf.note_lost_recursion(function_graph::GRAPH_OPS.missed());
}
