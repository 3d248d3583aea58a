//! The agent's side of the control channel (`ftprobe::control`): a thread of its own
//! ([`crate::control_thread`]) waits for the CLI's requests and carries each out while the
//! program's threads run, as a write to a tracefs file does in the kernel: kprobe events
//! added (disabled), removed, enabled and disabled, the function tracer's filters changed,
//! the tracer switched on or off, `tracing_on`, `kprobes/list` read. Every change of code
//! goes through the engine's batch `text_poke` protocol; nothing a thread may still run or
//! read is freed (retired hashes, removed events and trampolines stay allocated).

use std::ffi::c_void;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicU8, Ordering};

use ftprobe::control::{ControlArea, Reply, Request};
use ftprobe::events::error_log;
use ftprobe::ftrace::{self, fgraph, FtraceError, FtraceOps};
use ftprobe::{function_graph, function_tracer, kprobes, trace, trace_kprobe};

/// The tracer the session started with: 0 nop, 1 function, 2 function_graph.
static SESSION_TRACER: AtomicU8 = AtomicU8::new(0);

/// Start the control thread on the area in `fd` (closed once mapped). `graph`: the session's
/// tracer is function_graph (its filters are the graph ops').
pub(crate) fn start(fd: i32, function: bool, graph: bool) -> Result<(), String> {
    // SAFETY: the CLI passed this fd; nothing else in the process knows it.
    let area = ControlArea::attach(unsafe { BorrowedFd::borrow_raw(fd) });
    // SAFETY: the mapping (if any) does not need the fd.
    unsafe { libc::close(fd) };
    let area = area.map_err(|e| e.to_string())?;
    SESSION_TRACER.store(
        if graph { 2 } else { u8::from(function) },
        Ordering::Relaxed,
    );
    let area: &'static ControlArea = Box::leak(Box::new(area));
    // SAFETY: called from the agent's start (not the probe path); `control_main` never
    // returns and uses static TLS only.
    unsafe {
        crate::control_thread::spawn(control_main, area as *const ControlArea as *mut c_void)
    }?;
    Ok(())
}

extern "C" fn control_main(arg: *mut c_void) -> ! {
    // SAFETY: this thread's TLS is a copy of its creator's; nothing ran on it yet.
    unsafe { ftprobe::trace::reset_copied_thread_state() };
    // The agent's own thread: what it calls is never the program's (a probe on the C
    // library's `read` or `close` counts its calls missed, not as events).
    let _busy = ftprobe::kprobes::KprobeBusy::begin();
    // SAFETY: PR_SET_NAME reads a NUL-terminated name of at most 16 bytes.
    unsafe { libc::prctl(libc::PR_SET_NAME, c"ftprobe-ctl".as_ptr()) };
    // SAFETY: `start` leaked the area for the process's life.
    let area = unsafe { &*(arg as *const ControlArea) };
    area.set_agent_tid(ftprobe::sys::gettid());
    let mut seen = 0;
    while let Some((seq, req)) = area.next_request(seen) {
        seen = seq;
        let reply = match req {
            Ok(r) => handle(r),
            Err(e) => Reply {
                ok: false,
                text: e.to_string(),
            },
        };
        area.reply(seq, &reply);
    }
    // SAFETY: ends this thread only; its stack and TLS are never freed (nothing refers to
    // them once it is gone).
    unsafe { libc::syscall(libc::SYS_exit, 0) };
    #[allow(clippy::empty_loop)]
    loop {}
}

fn ok(text: impl Into<String>) -> Reply {
    Reply {
        ok: true,
        text: text.into(),
    }
}

fn fail(text: impl Into<String>) -> Reply {
    Reply {
        ok: false,
        text: text.into(),
    }
}

/// The ops whose filters `set_ftrace_filter` changes: the session's tracer's.
fn tracer_ops() -> &'static FtraceOps {
    if SESSION_TRACER.load(Ordering::Relaxed) == 2 {
        function_graph::GRAPH_OPS.ops()
    } else {
        &function_tracer::FUNCTION_OPS
    }
}

fn handle(req: Request) -> Reply {
    match req {
        Request::AddEvent { id, def } => match trace_kprobe::create_disabled(id, &def) {
            Ok(tk) => {
                if tk.rp.is_some() {
                    crate::start_return_hooks_once();
                }
                let note = match (tk.is_pending(), &tk.kp.target) {
                    (
                        true,
                        kprobes::KprobeTarget::Symbol {
                            module: Some(m), ..
                        },
                    ) => format!(
                        "{}/{}: {m} is not loaded: the probe is armed when it is\n",
                        tk.def.group, tk.def.event
                    ),
                    _ => String::new(),
                };
                ok(note)
            }
            Err(e) => {
                let mut text = error_log(&def, &e.err);
                if let Some(d) = e.detail {
                    text.push_str(&format!("  ({d})\n"));
                }
                fail(text)
            }
        },
        Request::RemoveEvent { id } => match trace_kprobe::remove(id) {
            Ok(()) => ok(""),
            Err(e) => fail(e.to_string()),
        },
        Request::EnableEvent { id, enable } => match trace_kprobe::enable(id, enable) {
            Ok(()) => ok(""),
            Err(e) => fail(e.to_string()),
        },
        Request::SetFilter {
            notrace,
            reset,
            patterns,
        } => match ftrace::ftrace_update_filter(tracer_ops(), &patterns, reset, notrace) {
            Ok(warnings) => ok(warnings
                .iter()
                .map(|w| format!("{w} (EINVAL: left out)\n"))
                .collect::<String>()),
            Err(e @ FtraceError::NoMatch(_)) => fail(format!("{e} (EINVAL)")),
            Err(e) => fail(e.to_string()),
        },
        Request::SetTracer { tracer } => set_tracer(&tracer),
        Request::TracingOn { on } => {
            trace::set_tracing_on(on);
            ok("")
        }
        Request::KprobesList => ok(kprobes::list()),
    }
}

/// `current_tracer`: `nop` stops the session's tracer, its name starts it again (with the
/// filters as they are now).
fn set_tracer(name: &str) -> Reply {
    let session = SESSION_TRACER.load(Ordering::Relaxed);
    let result = match (name, session) {
        ("nop", 2) => match fgraph::unregister_ftrace_graph(&function_graph::GRAPH_OPS) {
            Ok(()) | Err(FtraceError::NotRegistered) => Ok(()),
            Err(e) => Err(e),
        },
        ("nop", _) => match ftrace::unregister_ftrace_function(&function_tracer::FUNCTION_OPS) {
            Ok(()) | Err(FtraceError::NotRegistered) => Ok(()),
            Err(e) => Err(e),
        },
        ("function_graph", 2) => match fgraph::register_ftrace_graph(&function_graph::GRAPH_OPS) {
            Ok(()) | Err(FtraceError::AlreadyRegistered) => Ok(()),
            Err(e) => Err(e),
        },
        ("function", 0 | 1) => {
            match ftrace::register_ftrace_function(&function_tracer::FUNCTION_OPS) {
                Ok(()) | Err(FtraceError::AlreadyRegistered) => Ok(()),
                Err(e) => Err(e),
            }
        }
        _ => {
            return fail(format!(
                "{name}: this session's trace is laid out for {} (start it with -t {name})",
                ["nop", "function", "function_graph"][usize::from(session)]
            ))
        }
    };
    match result {
        Ok(()) => ok(""),
        Err(e) => fail(e.to_string()),
    }
}
