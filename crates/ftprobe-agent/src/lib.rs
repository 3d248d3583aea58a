//! The preloaded agent (`LD_PRELOAD=libftprobe_agent.so`): runs the ftprobe engine inside the
//! traced process. It does nothing unless the `ftprobe` CLI started the process:
//!
//! - `FTPROBE_RING_FD`: the inherited memfd of the rings (see `ftprobe::ring`);
//! - `FTPROBE_CLI_PID`: the CLI's pid: only its direct child traces (a program the target
//!   execs inherits the environment, but not the objects table, so it must not write);
//! - `FTPROBE_FILTER`, `FTPROBE_NOTRACE`: newline-separated `set_ftrace_filter` patterns.
//!
//! Its constructor runs before `main` and before any thread exists, which is what
//! `ftrace::init` requires: it converts every site to NOP, publishes the loaded objects, and
//! registers the function tracer. Errors go to stderr prefixed `ftprobe-agent:`; the program
//! then runs untraced, never crashes because of the agent.

use std::os::fd::BorrowedFd;

use ftprobe::ring::SharedRings;
use ftprobe::{ftrace, function_tracer};

#[used]
#[link_section = ".init_array"]
static AGENT_INIT: extern "C" fn() = agent_init;

extern "C" fn agent_init() {
    let Ok(fd) = std::env::var("FTPROBE_RING_FD") else {
        return;
    };
    let cli_pid = std::env::var("FTPROBE_CLI_PID")
        .ok()
        .and_then(|p| p.parse::<i32>().ok());
    // SAFETY: getppid has no preconditions.
    if cli_pid != Some(unsafe { libc::getppid() }) {
        return;
    }
    if let Err(e) = start(&fd) {
        eprintln!("ftprobe-agent: {e:#}");
    }
}

fn patterns(var: &str) -> Vec<String> {
    std::env::var(var)
        .unwrap_or_default()
        .split('\n')
        .filter(|s| !s.trim().is_empty())
        .map(str::to_owned)
        .collect()
}

fn start(fd: &str) -> Result<(), Box<dyn std::error::Error>> {
    let fd: i32 = fd
        .parse()
        .map_err(|_| format!("FTPROBE_RING_FD={fd:?} is not a file descriptor"))?;
    // SAFETY: the CLI passed this fd open to us; it stays open for the life of the process
    // (we never close it) and the mapping outlives every use.
    let rings = SharedRings::attach(unsafe { BorrowedFd::borrow_raw(fd) })?;
    // SAFETY: we run from .init_array, before main: no other thread of the program exists.
    let skipped = unsafe { ftrace::init() }?;
    for e in skipped {
        eprintln!("ftprobe-agent: skipped an object: {e}");
    }
    let objects = ftrace::objects()?;
    let table: Vec<(u64, &[u8])> = objects
        .iter()
        .map(|o| (o.bias, o.path.as_os_str().as_encoded_bytes()))
        .collect();
    rings.set_objects(&table)?;
    function_tracer::start(
        Some(rings),
        &patterns("FTPROBE_FILTER"),
        &patterns("FTPROBE_NOTRACE"),
    )?;
    Ok(())
}
