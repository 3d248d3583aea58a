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
mod environ;
mod returns;
mod sigtrap;

use std::os::fd::BorrowedFd;

use ftprobe::events::error_log;
use ftprobe::ring::SharedRings;
use ftprobe::trace;
use ftprobe::trace_kprobe;
use ftprobe::{ftrace, function_graph, function_tracer, kprobes};

/// TEXT record kind: the armed-probes listing (`kprobes/list`).
pub const TEXT_KPROBES_LIST: u32 = 1;
/// TEXT record kind: a note for the trace's header (one line).
pub const TEXT_NOTE: u32 = 4;

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

/// Writes the agent's own messages to stderr with a raw `write` system call: a probe on
/// `libc:write` counts the program's writes, never the tracer's (`syscall` itself is on the
/// probe path's blacklist, so it is never probed).
fn say(args: std::fmt::Arguments<'_>) {
    let text = args.to_string();
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
    // SAFETY: getppid has no preconditions.
    let ours = cli_pid == Some(unsafe { libc::getppid() });
    let env = Env::take();
    if !ours {
        return;
    }
    // SAFETY: getpid has no preconditions.
    PID.store(
        unsafe { libc::getpid() },
        std::sync::atomic::Ordering::Relaxed,
    );
    if let Err(e) = start(&fd, &env) {
        // As for a definition that cannot be armed: the program does not run untraced as if
        // all were well.
        say!("ftprobe-agent: {e}: stopped before main, nothing traced");
        // SAFETY: _exit ends the process at once; main has not run, nothing to flush.
        unsafe { libc::_exit(1) };
    }
}

/// The agent's variables, read and removed from the environment.
struct Env {
    filter: Vec<String>,
    notrace: Vec<String>,
    function: bool,
    events: Vec<String>,
    /// `FTPROBE_TRACER=function_graph`.
    graph: bool,
    graph_function: Vec<String>,
    graph_notrace: Vec<String>,
    max_depth: Option<String>,
}

impl Env {
    fn take() -> Env {
        let lines = |var: &str| -> Vec<String> {
            std::env::var(var)
                .unwrap_or_default()
                .split('\n')
                .filter(|s| !s.trim().is_empty())
                .map(str::to_owned)
                .collect()
        };
        let env = Env {
            filter: lines("FTPROBE_FILTER"),
            notrace: lines("FTPROBE_NOTRACE"),
            function: std::env::var("FTPROBE_FUNCTION").is_ok_and(|v| v == "1"),
            events: lines("FTPROBE_EVENTS"),
            graph: std::env::var("FTPROBE_TRACER").is_ok_and(|v| v == "function_graph"),
            graph_function: lines("FTPROBE_GRAPH_FUNCTION"),
            graph_notrace: lines("FTPROBE_GRAPH_NOTRACE"),
            max_depth: std::env::var("FTPROBE_MAX_DEPTH").ok(),
        };
        // SAFETY (set_var/remove_var): we run from .init_array before main; no other thread
        // reads the environment concurrently (ftrace::init checks that we are alone).
        // Libraries the CLI preloaded before the agent (a sanitizer's runtime, which must come
        // first): taken out of LD_PRELOAD too, as the agent itself.
        let added = std::env::var("FTPROBE_PRELOADED").unwrap_or_default();
        let added: Vec<&str> = added.split(':').filter(|p| !p.is_empty()).collect();
        for var in [
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
        ] {
            // SAFETY: see above: constructor, single thread.
            unsafe { std::env::remove_var(var) };
        }
        if let Ok(preload) = std::env::var("LD_PRELOAD") {
            let rest: Vec<&str> = preload
                .split([':', ' '])
                .filter(|p| {
                    !p.is_empty() && !p.ends_with("libftprobe_agent.so") && !added.contains(p)
                })
                .collect();
            if rest.is_empty() {
                // SAFETY: see above: constructor, single thread.
                unsafe { std::env::remove_var("LD_PRELOAD") };
            } else {
                // SAFETY: see above: constructor, single thread.
                unsafe { environ::shorten(c"LD_PRELOAD", &rest.join(":")) };
            }
        }
        env
    }
}

fn start(fd: &str, env: &Env) -> Result<(), Box<dyn std::error::Error>> {
    let fd: i32 = fd
        .parse()
        .map_err(|_| format!("FTPROBE_RING_FD={fd:?} is not a file descriptor"))?;
    // SAFETY: the CLI passed this fd open to us and nothing else in the process knows it.
    let rings = SharedRings::attach(unsafe { BorrowedFd::borrow_raw(fd) });
    // SAFETY: the mapping (if any) does not need the fd; closing it frees the number.
    unsafe { libc::close(fd) };
    let rings = rings?;
    // Published first, so the CLI can symbolize and knows the agent ran even if init fails.
    // This library itself is left out: it has no sites, must not be probed, and parsing its
    // symbols (~10 MB of file, ~20k Rust names to demangle) would only slow every start.
    let own = own_load_base();
    let objects: Vec<_> = ftprobe::process::loaded_objects()
        .into_iter()
        .filter(|o| Some(o.bias) != own)
        .collect();
    let table: Vec<(u64, &[u8])> = objects
        .iter()
        .map(|o| (o.bias, o.path.as_os_str().as_encoded_bytes()))
        .collect();
    rings.set_objects(&table)?;
    trace::set_buffer(rings);
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
    // SAFETY: we run from .init_array, before main; ftrace::init refuses if other threads run.
    // The biases are the dynamic linker's own (dl_iterate_phdr).
    let skipped = unsafe { ftrace::init_objects(&objects) }?;
    sigtrap::start();
    for e in skipped {
        say!("ftprobe-agent: skipped an object: {e}");
    }
    // Return hooks in use (a return event, the function_graph tracer): longjmp, context
    // switches and unwinders must be followed (`start_return_hooks`).
    let mut returns_in_use = false;
    for (line, probe) in env.events.iter().enumerate() {
        // `ID<TAB>DEF` (the probes of one event share its id), or a bare DEF: id = line.
        let (id, cmd) = match probe.split_once('\t') {
            Some((id, cmd)) if id.parse::<u32>().is_ok() => (id.parse::<u32>().unwrap_or(0), cmd),
            _ => (line as u32, probe.as_str()),
        };
        match trace_kprobe::create(id, cmd) {
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
                say(format_args!("ftprobe-agent: {}", error_log(cmd, &e.err)));
                if let Some(d) = e.detail {
                    say!("  ({d})");
                }
                // Which program it was (a script or a shim runs its interpreter, which is
                // what the agent looked in).
                let exe = std::fs::read_link("/proc/self/exe").unwrap_or_default();
                // SAFETY: getpid has no preconditions.
                let pid = unsafe { libc::getpid() };
                say!("  (in {}, pid {pid}: stopped before main)", exe.display());
                // SAFETY: _exit ends the process at once; main has not run, nothing to flush.
                unsafe { libc::_exit(1) };
            }
        }
    }
    if env.events.is_empty() && ftrace::functions()?.is_empty() {
        return Err(
            "no function of this program or its libraries has an ftrace site: nothing to trace \
                    (build with -pg -mfentry, -pg, or -fpatchable-function-entry=5)"
                .into(),
        );
    }
    if !env.events.is_empty() {
        trace::write_text(TEXT_KPROBES_LIST, &kprobes::list());
    }
    // A `:mod:OBJ` filter whose object is not loaded (yet) selects nothing until it is
    // (dlopen): said in the trace's header rather than tracing nothing silently.
    if env.function || env.graph {
        for (opt, pats) in [("-F", &env.filter), ("-N", &env.notrace)] {
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
    if env.function {
        let unmatched = function_tracer::start(None, &env.filter, &env.notrace)?;
        if let Some(w) = unmatched.first() {
            // The kernel refuses such a write to set_ftrace_filter / set_ftrace_notrace with
            // EINVAL (ftrace_regex_write): refused here too, before main.
            return Err(format!("{w} (EINVAL, as the kernel's set_ftrace_filter)").into());
        }
    }
    if env.graph {
        let max_depth = match env.max_depth.as_deref().map(str::trim) {
            None | Some("") => 0,
            Some(v) => v
                .parse::<u32>()
                .map_err(|_| format!("FTPROBE_MAX_DEPTH={v:?} is not a number"))?,
        };
        let cfg = function_graph::GraphConfig {
            filter: env.filter.clone(),
            notrace: env.notrace.clone(),
            graph_function: env.graph_function.clone(),
            graph_notrace: env.graph_notrace.clone(),
            max_depth,
        };
        let unmatched = function_graph::start(None, &cfg).map_err(|e| match e {
            ftrace::FtraceError::NoMatch(_) => {
                format!("{e} (EINVAL, as the kernel's set_graph_function)")
            }
            e => e.to_string(),
        })?;
        if let Some(w) = unmatched.first() {
            return Err(format!("{w} (EINVAL, as the kernel's set_ftrace_filter)").into());
        }
        returns_in_use = true;
    }
    if returns_in_use {
        start_return_hooks();
    }
    // Objects loaded from now on (`dlopen`) are scanned before their initializers run.
    if let Err(e) = dlopen::init(&objects, own, !env.events.is_empty()) {
        say!("ftprobe-agent: objects loaded later with dlopen will not be traced: {e}");
    }
    if let Some(rings) = trace::buffer() {
        rings.set_armed();
    }
    Ok(())
}

/// Return hooks are in use: the interposers of longjmp, context switches and catches tell
/// the engine, and unwinders (C++ exceptions, Rust panics, pthread_exit, cancellation,
/// backtrace) get probes on libgcc_s's entry points that put back the real return addresses
/// (ftprobe::ftrace::fgraph_unwind). libgcc_s is loaded in every process: it is a
/// `DT_NEEDED` of this library (build.rs), so a C program that loads it itself only at its
/// first `pthread_exit` or `backtrace` has it, probed, before main.
fn start_return_hooks() {
    returns::start();
    let (_, errors) = ftprobe::ftrace::fgraph_unwind::arm_unwinder_probes();
    if !ftprobe::ftrace::has_module("libgcc_s.so.1") {
        say!(
            "ftprobe-agent: return hooks: libgcc_s.so.1 is not loaded: an exception, \
             pthread_exit or backtrace through a hooked call would find no caller"
        );
    }
    for e in errors {
        say!("ftprobe-agent: return hooks: an unwinder probe failed: {e}");
    }
}

/// The load base of this library (`dladdr` on one of its functions), which is its bias in
/// the objects table.
fn own_load_base() -> Option<u64> {
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
