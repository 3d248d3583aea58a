//! `ftprobe trace`: spawn CMD with the agent preloaded and a rings memfd inherited, print the
//! events live while it runs, drain everything after it exits, print lost-event counts and
//! the kprobe profile, and exit with its status.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use ftprobe::events::{
    error_log, parse_probe_command, ProbeCommand, ProbeDef, ProbeError, ProbeErrorKind,
};
use ftprobe::ring::{Clock, RingConfig, SharedRings, MAX_EVENTS};
use ftprobe::trace::rtype;
use ftprobe::trace_kprobe;
use ftprobe::trace_kprobe::{RecordDecoder, RECORD_HEAD_WORDS};
use std::sync::atomic::Ordering;

use crate::output;

/// TEXT record kinds the agent writes (`ftprobe-agent`'s `TEXT_*`): the armed-probes
/// listing, `PID\tPATH` before an exec, `PID\tERRNO` when that exec failed.
const TEXT_KPROBES_LIST: u32 = 1;
const TEXT_EXEC: u32 = 2;
const TEXT_EXEC_FAILED: u32 = 3;
use crate::signals;
use crate::symbols::Symbols;

/// Arguments of `ftprobe trace`.
#[derive(Args)]
pub struct TraceArgs {
    /// Trace only functions matching GLOB (`set_ftrace_filter` syntax: `*`, `?`, `[..]`,
    /// leading `!` to remove, `:mod:OBJ`). Repeatable; none: every function with a site.
    #[arg(short = 'F', long = "filter", value_name = "GLOB")]
    filter: Vec<String>,
    /// Never trace functions matching GLOB (`set_ftrace_notrace`). Repeatable.
    #[arg(short = 'N', long = "notrace", value_name = "GLOB")]
    notrace: Vec<String>,
    /// A kprobe event in the kernel's `kprobe_events` syntax, e.g.
    /// `p:myprobe work a=$arg1 b=%si:u32`. Repeatable. With -e and no -F/-N only the events
    /// are traced (the function tracer is off).
    #[arg(
        short = 'e',
        long = "event",
        value_name = "DEF",
        allow_hyphen_values = true
    )]
    events: Vec<String>,
    /// The tracer: `function` (entries, `func <-parent`), `function_graph` (entries and
    /// returns as a call graph with durations) or `nop` (only the -e events). Default:
    /// `function`, or `nop` when only -e is given.
    #[arg(short = 't', long = "tracer", value_name = "TRACER")]
    tracer: Option<String>,
    /// function_graph: record only calls made inside functions matching GLOB, the graph
    /// starting at them (`set_graph_function`). Repeatable.
    #[arg(short = 'G', long = "graph-function", value_name = "GLOB")]
    graph_function: Vec<String>,
    /// function_graph: do not record functions matching GLOB nor anything they call
    /// (`set_graph_notrace`). Repeatable.
    #[arg(long = "graph-notrace", value_name = "GLOB")]
    graph_notrace: Vec<String>,
    /// function_graph: record calls only down to this depth (`max_graph_depth`; 0: no limit).
    #[arg(long = "max-depth", value_name = "N", default_value_t = 0)]
    max_depth: u32,
    /// A tracer option (`trace_options`), e.g. `funcgraph-retval`, `funcgraph-proc`,
    /// `nofuncgraph-cpu`. Repeatable.
    #[arg(short = 'O', long = "option", value_name = "OPT")]
    options: Vec<String>,
    /// Write the trace to FILE instead of standard output.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: Option<PathBuf>,
    /// Size of each thread's ring buffer, in KiB (a power of two, at least 4).
    #[arg(long = "buffer-size-kb", default_value_t = 16384)]
    buffer_size_kb: u32,
    /// Number of rings: at most this many threads record.
    #[arg(long = "rings", default_value_t = 64)]
    rings: u32,
    /// The agent library (default: libftprobe_agent.so next to this executable, or
    /// $FTPROBE_AGENT).
    #[arg(long = "agent", value_name = "PATH")]
    agent: Option<PathBuf>,
    /// The program and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    cmd: Vec<String>,
}

fn agent_path(explicit: Option<PathBuf>) -> Result<PathBuf> {
    if let Some(p) = explicit.or_else(|| std::env::var_os("FTPROBE_AGENT").map(PathBuf::from)) {
        return Ok(p);
    }
    let exe = std::env::current_exe().context("locating the ftprobe executable")?;
    let dir = exe.parent().context("ftprobe has no directory")?;
    // In a cargo target dir both `libftprobe_agent.so` and `deps/libftprobe_agent.so` may
    // exist, and `cargo test` refreshes only the second: take the newest.
    let newest = [
        dir.join("libftprobe_agent.so"),
        dir.join("deps/libftprobe_agent.so"),
        dir.join("../lib/libftprobe_agent.so"),
    ]
    .into_iter()
    .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
    .max_by_key(|(t, _)| *t);
    if let Some((_, p)) = newest {
        return Ok(p);
    }
    bail!(
        "cannot find libftprobe_agent.so next to {} (build it with `cargo build`, or pass --agent)",
        exe.display()
    )
}

/// The program `cmd` names, as exec would find it.
fn find_program(cmd: &str) -> Option<PathBuf> {
    if cmd.contains('/') {
        return Some(PathBuf::from(cmd));
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(cmd))
        .find(|p| p.is_file())
}

/// Refuse statically linked executables (`data`: the program's file at `prog`): no dynamic
/// loader, so no preloaded agent.
fn check_not_static(prog: &Path, data: &[u8]) -> Result<()> {
    if data.starts_with(b"\x7fELF") {
        use object::read::elf::{FileHeader, ProgramHeader};
        if let Ok(hdr) = object::elf::FileHeader64::<object::Endianness>::parse(data) {
            if let (Ok(e), true) = (
                hdr.endian(),
                hdr.e_type(object::Endianness::Little) != object::elf::ET_REL,
            ) {
                if let Ok(ph) = hdr.program_headers(e, data) {
                    if !ph.iter().any(|p| p.p_type(e) == object::elf::PT_INTERP)
                        && hdr.e_type(e) == object::elf::ET_EXEC
                    {
                        bail!(
                            "{} is statically linked: the agent is loaded by the dynamic loader \
                             (LD_PRELOAD), so it cannot run in it",
                            prog.display()
                        );
                    }
                }
            }
        }
    }
    Ok(())
}

/// The sanitizer runtimes the program whose file is `data` links (`DT_NEEDED` names: ASan's,
/// TSan's, HWASan's), which insist on being the first object in the process.
fn sanitizer_runtimes(data: &[u8]) -> Vec<String> {
    use object::read::elf::{Dyn, FileHeader, SectionHeader};

    let Ok(hdr) = object::elf::FileHeader64::<object::Endianness>::parse(data) else {
        return Vec::new();
    };
    let Ok(e) = hdr.endian() else {
        return Vec::new();
    };
    let Ok(sections) = hdr.sections(e, data) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for s in sections.iter() {
        let Ok(Some((dyns, link))) = s.dynamic(e, data) else {
            continue;
        };
        let Ok(strings) = sections.strings(e, data, link) else {
            continue;
        };
        for d in dyns {
            if d.tag32(e) == Some(object::elf::DT_NEEDED) {
                if let Ok(name) = d.string(e, strings) {
                    let name = String::from_utf8_lossy(name);
                    if ["libasan.so", "libtsan.so", "libhwasan.so"]
                        .iter()
                        .any(|r| name.starts_with(r))
                    {
                        out.push(name.into_owned());
                    }
                }
            }
        }
    }
    out
}

/// Parse the -e definitions as the kernel would and check that ftprobe can run them, before
/// running anything. `-:[GRP/]EVENT` removes an event defined by an earlier -e. As in the
/// kernel (trace_kprobe.c, `append_trace_kprobe`), a definition that names an existing
/// event adds a probe to it when its arguments have the same names and types
/// (DIFF_ARG_TYPE otherwise, at the first that differs) and its target is another one
/// (SAME_PROBE otherwise). Returns each event (by id: its definitions, and the first one
/// parsed, which gives the record layout).
fn parse_events(defs: &[String]) -> Result<Vec<(Vec<String>, ProbeDef)>> {
    let mut events: Vec<(Vec<String>, ProbeDef)> = Vec::new();
    if defs.len() > MAX_EVENTS {
        bail!("at most {MAX_EVENTS} kprobe events (-e) at once");
    }
    let refuse = |d: &str, kind: ProbeErrorKind, pos: usize| -> anyhow::Error {
        eprint!("ftprobe: {}", error_log(d, &ProbeError::new(kind, pos)));
        anyhow::anyhow!("invalid probe definition ({})", kind.name())
    };
    for d in defs {
        let removal = match parse_probe_command(d) {
            Ok(ProbeCommand::Remove { group, event }) => Some((group, event)),
            _ => None,
        };
        if let Some((group, event)) = removal {
            let before = events.len();
            events.retain(|(_, e)| {
                !(e.event == event && group.as_ref().is_none_or(|g| *g == e.group))
            });
            if events.len() == before {
                bail!("{d:?}: no such event to remove (ENOENT)");
            }
            continue;
        }
        match trace_kprobe::check(d) {
            Ok(def) => {
                let Some((defs, first)) = events
                    .iter_mut()
                    .find(|(_, e)| e.group == def.group && e.event == def.event)
                else {
                    events.push((vec![d.clone()], def));
                    continue;
                };
                if first.kind != def.kind {
                    return Err(refuse(d, ProbeErrorKind::DiffProbeType, 0));
                }
                // The first argument whose name or type differs, or the first one past the
                // shorter list (after the end when the new one is shorter).
                let differs = (0..def.args.len().max(first.args.len())).find(|&i| {
                    match (def.args.get(i), first.args.get(i)) {
                        (Some(a), Some(b)) => a.name != b.name || a.ty != b.ty,
                        _ => true,
                    }
                });
                if let Some(i) = differs {
                    let pos = def.args.get(i).map_or(d.trim_end().len() + 1, |a| a.pos);
                    return Err(refuse(d, ProbeErrorKind::DiffArgType, pos));
                }
                let same_args = |a: &ProbeDef| {
                    a.args
                        .iter()
                        .zip(&def.args)
                        .all(|(x, y)| x.fetch == y.fetch)
                };
                if defs.iter().any(|other| {
                    trace_kprobe::check(other)
                        .is_ok_and(|o| o.target == def.target && same_args(&o))
                }) {
                    return Err(refuse(d, ProbeErrorKind::SameProbe, 0));
                }
                defs.push(d.clone());
            }
            Err(e) => {
                eprint!("ftprobe: {}", error_log(d, &e.err));
                if let Some(detail) = &e.detail {
                    eprintln!("  ({detail})");
                }
                bail!("invalid probe definition ({})", e.err.kind.name());
            }
        }
    }
    Ok(events)
}

/// Run the command; returns the exit code to exit with.
pub fn run(args: TraceArgs) -> Result<i32> {
    // The clock's calibration spans the start-up below (20 ms in all, most of it overlapped).
    let clock_start = Clock::start_calibration();
    for p in args.filter.iter().chain(&args.notrace) {
        ftprobe::ftrace::glob::FilterEntry::parse(p)?;
    }
    for p in args.graph_function.iter().chain(&args.graph_notrace) {
        ftprobe::ftrace::glob::FilterEntry::parse(p)?;
    }
    let events = parse_events(&args.events)?;
    // The function tracer runs with -F/-N, or when no -e was given at all (-e then -:EVENT
    // leaves no event, and nothing is traced).
    let tracer: &'static str = match args.tracer.as_deref() {
        None if !args.filter.is_empty() || !args.notrace.is_empty() || args.events.is_empty() => {
            "function"
        }
        None => "nop",
        Some("function") => "function",
        Some("function_graph") => "function_graph",
        Some("nop") => "nop",
        Some(t) => bail!("no tracer {t:?} (available: function function_graph nop)"),
    };
    let graph = tracer == "function_graph";
    if !graph
        && (!args.graph_function.is_empty()
            || !args.graph_notrace.is_empty()
            || args.max_depth != 0)
    {
        bail!("-G, --graph-notrace and --max-depth are options of the function_graph tracer (-t function_graph)");
    }
    let mut graph_opts = crate::graph::Options::default();
    for o in &args.options {
        if let Err(e) = graph_opts.set(o) {
            bail!("{e}");
        }
    }
    let function = tracer == "function";
    // The program's file, read once (an unreadable one is left to exec to refuse).
    let prog_data = find_program(&args.cmd[0]).and_then(|p| Some((std::fs::read(&p).ok()?, p)));
    if let Some((data, prog)) = &prog_data {
        check_not_static(prog, data)?;
    }
    let agent = agent_path(args.agent)?
        .canonicalize()
        .context("agent library")?;
    let ring_bytes = args
        .buffer_size_kb
        .checked_mul(1024)
        .context("--buffer-size-kb too large")?;
    let (rings, fd) = SharedRings::create_uncalibrated(RingConfig {
        nr_rings: args.rings,
        ring_bytes,
    })?;
    let out: Box<dyn Write> = match &args.output {
        Some(p) => Box::new(BufWriter::new(
            File::create(p).with_context(|| format!("creating {}", p.display()))?,
        )),
        None => Box::new(BufWriter::new(std::io::stdout())),
    };
    // A sanitizer's runtime must be the first object loaded (ASan aborts otherwise: "ASan
    // runtime does not come first"): preload it before the agent; the agent takes both out
    // of LD_PRELOAD again.
    let runtimes = prog_data
        .as_ref()
        .map(|(data, _)| sanitizer_runtimes(data))
        .unwrap_or_default();
    drop(prog_data);
    let mut preload: Vec<String> = runtimes.clone();
    preload.push(agent.display().to_string());
    if let Ok(old) = std::env::var("LD_PRELOAD") {
        if !old.is_empty() {
            preload.push(old);
        }
    }
    let preload = preload.join(":");
    signals::catch_termination();
    // Orphaned descendants of the target become our children, so that the wait at the end
    // finds the forked ones still tracing (Linux 3.4+; without it, the wait finds none).
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    let child = Command::new(&args.cmd[0])
        .args(&args.cmd[1..])
        .env("LD_PRELOAD", preload)
        .env("FTPROBE_PRELOADED", runtimes.join(":"))
        .env("FTPROBE_RING_FD", fd.as_raw_fd().to_string())
        .env("FTPROBE_CLI_PID", std::process::id().to_string())
        .env("FTPROBE_FILTER", args.filter.join("\n"))
        .env("FTPROBE_NOTRACE", args.notrace.join("\n"))
        .env("FTPROBE_FUNCTION", if function { "1" } else { "0" })
        .env("FTPROBE_TRACER", tracer)
        .env("FTPROBE_GRAPH_FUNCTION", args.graph_function.join("\n"))
        .env("FTPROBE_GRAPH_NOTRACE", args.graph_notrace.join("\n"))
        .env("FTPROBE_MAX_DEPTH", args.max_depth.to_string())
        .env(
            "FTPROBE_EVENTS",
            // One line per probe, `ID<TAB>DEF`: the probes of one event share its id.
            events
                .iter()
                .enumerate()
                .flat_map(|(id, (defs, _))| defs.iter().map(move |d| format!("{id}\t{d}")))
                .collect::<Vec<_>>()
                .join("\n"),
        )
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            // As a shell (and `timeout`, `env`) says it: 127 not found, 126 not runnable.
            eprintln!("ftprobe: cannot run {:?}: {e}", args.cmd[0]);
            return Ok(if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            });
        }
    };
    drop(fd);
    // While the target starts: fault in the first pages of ring 0 (its first thread's, as a
    // rule), then finish calibrating the clock (only the text output needs it).
    let mut prefaulter = Prefaulter::new(&rings);
    prefaulter.first_ring(&rings);
    rings.set_clock(Clock::finish_calibration(clock_start));
    let exit = ExitWatch::new(child.id());
    let mut printer = Printer {
        out: Some(out),
        clock: rings.clock(),
        symbols: None,
        objects: Vec::new(),
        prefaulter,
        decoders: events.iter().map(|(_, d)| RecordDecoder::new(d)).collect(),
        events: events.into_iter().map(|(_, d)| d).collect(),
        batch: Vec::new(),
        arena: Vec::new(),
        tasks: Vec::new(),
        lines: Vec::new(),
        seen: Vec::new(),
        printed: 0,
        write_failed: false,
        abandoned: Vec::new(),
        execs: Vec::new(),
        tracer,
        started: false,
        graph: graph.then(|| {
            // SAFETY: sysconf has no memory effects.
            let ncpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }.max(1) as u32;
            crate::graph::Graph::new(graph_opts, ncpus)
        }),
        carry: Vec::new(),
        final_poll: false,
        task_ids: Vec::new(),
    };
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if let Some(sig) = signals::take_pending() {
            // SAFETY: kill has no memory effects; the pid is our child, not yet reaped.
            unsafe { libc::kill(child.id() as i32, sig) };
        }
        printer.poll(&rings);
        printer.flush();
        reap_orphans(child.id());
        exit.wait(Duration::from_millis(10));
    };
    // Forked children of the target keep tracing after it exits: wait for them (as uftrace
    // does), and say so; a termination signal stops the wait (their later events are then
    // missing, and the trace says whose).
    let mut told = false;
    let mut abandoned = Vec::new();
    loop {
        printer.poll(&rings);
        let live = live_writers();
        if live.is_empty() {
            break;
        }
        if signals::take_pending().is_some() {
            abandoned = live;
            break;
        }
        if !told {
            eprintln!(
                "ftprobe: {} exited; waiting for the forked processes still tracing ({}); Ctrl-C stops waiting",
                args.cmd[0],
                live.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
            );
            told = true;
        }
        printer.flush();
        std::thread::sleep(Duration::from_millis(10));
    }
    // What the last of them wrote between the poll above and its exit.
    printer.final_poll = true;
    printer.poll(&rings);
    printer.abandoned = abandoned;
    printer.finish(&rings);
    if let (Some(sig), true) = (status.signal(), printer.started) {
        // If it dies, the trace says how (the exit status alone is easy to miss).
        // SAFETY: strsignal returns a NUL-terminated string (static or per-thread); this
        // thread copies it at once.
        let name = unsafe { std::ffi::CStr::from_ptr(libc::strsignal(sig)) }
            .to_string_lossy()
            .into_owned();
        let core = if status.core_dumped() {
            ", core dumped"
        } else {
            ""
        };
        printer.write(|o| {
            writeln!(
                o,
                "# pid {} was killed by signal {sig} ({name}{core})",
                child.id()
            )?;
            o.flush()
        });
    }
    if status.signal() == Some(libc::SIGTRAP)
        && !rings.objects().is_empty()
        && rings.sigtrap_passed_pid() != child.id()
    {
        // ftprobe's handler never saw the trap that killed it (it notes the ones it passes to
        // the program's default action): SIGTRAP was blocked where the agent could not see.
        let why = "killed by a trap that ftprobe could not take (SIGTRAP was blocked, e.g. by \
                   a raw rt_sigprocmask system call)";
        eprintln!("ftprobe: {} was {why}", args.cmd[0]);
        printer.write(|o| {
            writeln!(o, "# the program was {why}")?;
            o.flush()
        });
    }
    if rings.objects().is_empty() {
        eprintln!(
            "ftprobe: the agent did not start in {}: nothing was traced (a setuid program, a \
             program that runs another without the environment, or one that stopped before \
             its libraries' constructors?)",
            args.cmd[0]
        );
    }
    let code = status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
    // A trace that could not be written is a failure even when the target succeeded.
    Ok(if printer.write_failed && code == 0 {
        1
    } else {
        code
    })
}

/// The target's forked descendants that still map this session's rings (they have not
/// exited or exec'd), whether or not they have written yet. ftprobe is their child
/// subreaper, so when their parent exits they become its children: they are found in
/// `/proc/self/task/*/children`, and the exited ones are reaped here. The rings are
/// recognised by the inode of their memfd, from our own mapping.
fn live_writers() -> Vec<u32> {
    // Reap orphans that already exited (the target itself was reaped by `try_wait`).
    // SAFETY: waitpid with a null status pointer only reaps.
    while unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) } > 0 {}
    let inode_of = |maps: &str| -> Option<String> {
        maps.lines()
            .find(|l| {
                l.ends_with("/memfd:ftprobe-rings (deleted)") || l.ends_with("/memfd:ftprobe-rings")
            })
            .and_then(|l| l.split_whitespace().nth(4))
            .map(str::to_owned)
    };
    let Some(ours) = std::fs::read_to_string("/proc/self/maps")
        .ok()
        .as_deref()
        .and_then(inode_of)
    else {
        return Vec::new();
    };
    let mut live: Vec<u32> = children()
        .into_iter()
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/maps"))
                .ok()
                .as_deref()
                .and_then(inode_of)
                .is_some_and(|i| i == ours)
        })
        .collect();
    live.sort_unstable();
    live.dedup();
    live
}

/// Our children (`/proc/self/task/*/children`): the target, and the orphans we reap as
/// child subreaper.
fn children() -> Vec<u32> {
    std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| {
            c.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// While the target runs: reap the orphans (its descendants whose parent exited) that have
/// exited, so they do not pile up as zombies under us; never the target itself.
fn reap_orphans(target: u32) {
    for pid in children().into_iter().filter(|&p| p != target) {
        // SAFETY: waitpid on one child of ours, with a null status pointer: only reaps.
        unsafe { libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), libc::WNOHANG) };
    }
}

/// How far ahead of a ring's head the CLI keeps its pages faulted in (first lap only).
const PREFAULT_AHEAD: u64 = 16 << 20;

/// Lines formatted between two prefault steps (~20 ms of formatting).
const PREFAULT_EVERY: usize = 1 << 16;

/// Keeps [`PREFAULT_AHEAD`] bytes of every claimed ring faulted in ahead of its producer, on
/// the ring's first lap: the pages are allocated and zeroed on the CLI's CPU, not in the
/// traced thread, which then takes a minor fault per page (several times cheaper here).
struct Prefaulter {
    /// Per ring, how many bytes of its data area have been faulted in.
    done: Vec<u64>,
    ring_bytes: u64,
}

impl Prefaulter {
    fn new(rings: &SharedRings) -> Prefaulter {
        Prefaulter {
            done: vec![0; rings.config().nr_rings as usize],
            ring_bytes: u64::from(rings.config().ring_bytes),
        }
    }

    /// Ring 0, before anything claimed it: the target's first thread takes it, as a rule.
    fn first_ring(&mut self, rings: &SharedRings) {
        self.advance(rings, 0, PREFAULT_AHEAD);
    }

    fn step(&mut self, rings: &SharedRings) {
        for i in 0..rings.claimed().min(rings.config().nr_rings) {
            let want = rings.head(i).unwrap_or(0).saturating_add(PREFAULT_AHEAD);
            self.advance(rings, i, want);
        }
    }

    fn advance(&mut self, rings: &SharedRings, i: u32, want: u64) {
        let Some(done) = self.done.get_mut(i as usize) else {
            return;
        };
        let want = want.min(self.ring_bytes);
        if want > *done {
            // On failure (an old kernel) stop trying for this ring.
            *done = if rings.prefault(i, *done, want - *done) {
                want
            } else {
                self.ring_bytes
            };
        }
    }
}

/// Waits up to a timeout for the child to exit, waking as soon as it does (a pidfd, Linux
/// 5.3+; without one, a plain sleep). Does not reap it.
struct ExitWatch(Option<OwnedFd>);

impl ExitWatch {
    fn new(pid: u32) -> ExitWatch {
        // SAFETY: pidfd_open takes a pid and flags, no pointers.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        // SAFETY: a non-negative return is a new file descriptor that we own.
        ExitWatch((fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as RawFd) }))
    }

    fn wait(&self, timeout: Duration) {
        let Some(fd) = &self.0 else {
            std::thread::sleep(timeout);
            return;
        };
        let mut p = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; poll writes only its revents. EINTR (a forwarded
        // signal) just returns early: the caller loops.
        unsafe { libc::poll(&mut p, 1, timeout.as_millis() as libc::c_int) };
    }
}

/// One record of a poll, its words in `Printer::arena`.
struct Event {
    ts: u64,
    ring: u32,
    aux: u32,
    rtype: u16,
    /// `arena[start..start + len]`: the record's payload (timestamp first).
    start: usize,
    len: usize,
}

struct Printer {
    /// `None` once the output is gone (a closed pipe): the program keeps running untraced.
    out: Option<Box<dyn Write>>,
    clock: Clock,
    symbols: Option<Symbols>,
    objects: Vec<(u64, Vec<u8>)>,
    events: Vec<ProbeDef>,
    /// Called at every poll and every [`PREFAULT_EVERY`] lines while formatting: a thread
    /// of its own would compete with the target for the CPU on small machines (measured: a
    /// slower whole run on 2 cores).
    prefaulter: Prefaulter,
    /// Per event, its record layout (worked out once, not per record).
    decoders: Vec<Option<RecordDecoder>>,
    batch: Vec<Event>,
    /// Payload words of the records in `batch`, reused from poll to poll.
    arena: Vec<u64>,
    /// `TASK-PID ` per ring (a thread's comm and tid are fixed when it claims its ring).
    tasks: Vec<Option<Vec<u8>>>,
    /// The text of a poll, reused.
    lines: Vec<u8>,
    /// Records seen per event id.
    seen: Vec<u64>,
    /// Event lines formatted (function and kprobe events).
    printed: u64,
    /// Writing the trace failed (not a closed pipe).
    write_failed: bool,
    /// Forked processes still writing when ftprobe stopped waiting for them.
    abandoned: Vec<u32>,
    /// Processes that exec'd (pid, the program they ran), as the agent noted it.
    execs: Vec<(u32, String)>,
    /// `# tracer:` in the header.
    tracer: &'static str,
    /// The agent armed everything and the header is out. Until then nothing is printed: a
    /// program stopped because something could not be armed leaves no trace-like output.
    started: bool,
    /// The function_graph tracer's layout and state, when it is the tracer.
    graph: Option<crate::graph::Graph>,
    /// function_graph: per ring, an entry that was the ring's last record at the end of a
    /// poll (rtype, aux, words), kept for the next poll, where the thread's next record
    /// tells whether it is a leaf.
    carry: Vec<Option<(u16, u32, Vec<u64>)>>,
    /// The last poll: nothing is kept for later.
    final_poll: bool,
    /// comm and tid per ring.
    task_ids: Vec<Option<(Vec<u8>, u32)>>,
}

impl Printer {
    fn write(&mut self, f: impl FnOnce(&mut dyn Write) -> std::io::Result<()>) {
        if let Some(o) = self.out.as_mut() {
            if let Err(e) = f(o.as_mut()) {
                // A closed pipe (`| head`) is the reader's choice; anything else loses the
                // trace: said now, and in the exit status.
                if e.kind() != std::io::ErrorKind::BrokenPipe {
                    let _ = writeln!(std::io::stderr(), "ftprobe: writing the trace: {e}");
                    self.write_failed = true;
                }
                self.out = None;
            }
        }
    }

    fn flush(&mut self) {
        self.write(|o| o.flush());
    }

    /// Drain every ring, merge the records by timestamp, print them.
    fn poll(&mut self, rings: &SharedRings) {
        if !self.started {
            if !rings.armed() {
                return;
            }
            self.started = true;
            let tracer = self.tracer;
            if self.graph.is_some() {
                // The column header comes with the first lines (it depends on how many
                // threads record).
                self.write(|o| {
                    writeln!(o, "# tracer: {tracer}")?;
                    writeln!(o, "#")
                });
            } else {
                self.write(|o| output::header(o, tracer));
            }
        }
        self.prefaulter.step(rings);
        self.batch.clear();
        self.arena.clear();
        // (pid, line) of the execs noted in this poll.
        let mut exec_notes: Vec<(u32, String)> = Vec::new();
        for i in 0..rings.claimed().min(rings.config().nr_rings) {
            let Some(mut r) = rings.reader(i) else {
                continue;
            };
            let batch = &mut self.batch;
            let arena = &mut self.arena;
            let mut texts = Vec::new();
            let first = batch.len();
            if self.carry.len() <= i as usize {
                self.carry.resize(i as usize + 1, None);
            }
            if let Some((rtype, aux, w)) = self.carry[i as usize].take() {
                batch.push(Event {
                    ts: w[0],
                    ring: i,
                    aux,
                    rtype,
                    start: arena.len(),
                    len: w.len(),
                });
                arena.extend_from_slice(&w);
            }
            r.drain_aux(|rtype, aux, w| match rtype {
                rtype::FUNC | rtype::KPROBE | rtype::FGRAPH_ENT | rtype::FGRAPH_RET
                    if !w.is_empty() =>
                {
                    batch.push(Event {
                        ts: w[0],
                        ring: i,
                        aux,
                        rtype,
                        start: arena.len(),
                        len: w.len(),
                    });
                    arena.extend_from_slice(w);
                }
                rtype::TEXT => texts.push((
                    aux,
                    w.iter()
                        .flat_map(|x| x.to_le_bytes())
                        .filter(|&b| b != 0)
                        .collect::<Vec<u8>>(),
                )),
                _ => {}
            });
            // function_graph: an entry that is the thread's last record so far waits for the
            // next poll (its return, if it is a leaf, is not written yet).
            if self.graph.is_some()
                && !self.final_poll
                && batch.len() > first
                && batch.last().is_some_and(|e| e.rtype == rtype::FGRAPH_ENT)
            {
                let e = batch.pop().expect("checked");
                let w = arena[e.start..e.start + e.len].to_vec();
                arena.truncate(e.start);
                self.carry[i as usize] = Some((e.rtype, e.aux, w));
            }
            for (kind, t) in texts {
                let text = String::from_utf8_lossy(&t).into_owned();
                match kind {
                    TEXT_KPROBES_LIST => self.write(|o| {
                        writeln!(o, "# kprobes/list:")?;
                        text.lines().try_for_each(|l| writeln!(o, "#   {l}"))
                    }),
                    TEXT_EXEC | TEXT_EXEC_FAILED => {
                        let (pid, rest) = text.split_once('\t').unwrap_or((&text, ""));
                        let pid: u32 = pid.parse().unwrap_or(0);
                        if kind == TEXT_EXEC {
                            self.execs.push((pid, rest.to_owned()));
                            exec_notes.push((
                                pid,
                                format!("# pid {pid} exec'd {rest}: not traced after exec\n"),
                            ));
                        } else if let Some(at) = self.execs.iter().rposition(|e| e.0 == pid) {
                            let (_, path) = self.execs.remove(at);
                            // Its "exec'd" line, if not printed yet, is replaced by this one.
                            if let Some(n) = exec_notes.iter().rposition(|n| n.0 == pid) {
                                exec_notes.remove(n);
                            }
                            let err = std::io::Error::from_raw_os_error(rest.parse().unwrap_or(0))
                                .to_string();
                            let err = err.split(" (os error").next().unwrap_or_default();
                            exec_notes.push((
                                pid,
                                format!(
                                    "# pid {pid}: exec of {path} failed ({err}); still traced\n"
                                ),
                            ));
                        }
                    }
                    _ => {}
                }
            }
        }
        // After this poll's events: an exec is the last thing its process did.
        let exec_notes = std::mem::take(&mut exec_notes);
        if self.batch.is_empty() {
            for (_, n) in &exec_notes {
                self.write(|o| o.write_all(n.as_bytes()));
            }
            return;
        }
        let objects = rings.objects();
        if self.symbols.is_none() || objects != self.objects {
            self.symbols = Some(Symbols::new(&objects));
            self.objects = objects;
        }
        // Each ring is in time order already; with one thread (or threads that never
        // overlapped in this poll) there is nothing to merge. The sort is stable: records of
        // one ring with equal timestamps keep their order.
        if !self.batch.windows(2).all(|p| p[0].ts <= p[1].ts) {
            self.batch.sort_by_key(|e| e.ts);
        }
        let nr_rings = rings.config().nr_rings as usize;
        if self.tasks.len() < nr_rings {
            self.tasks.resize(nr_rings, None);
        }
        if self.graph.is_some() {
            self.print_graph_batch(rings, exec_notes);
            return;
        }
        let lines = &mut self.lines;
        lines.clear();
        let syms = self.symbols.as_mut().expect("set above");
        for (n, e) in self.batch.iter().enumerate() {
            if n % PREFAULT_EVERY == PREFAULT_EVERY - 1 {
                self.prefaulter.step(rings);
            }
            let mark = lines.len();
            let task = self.tasks[e.ring as usize].get_or_insert_with(|| {
                let r = rings.reader(e.ring).expect("claimed ring");
                let c = r.comm();
                let n = c.iter().position(|&b| b == 0).unwrap_or(16);
                output::task_prefix(&c[..n], r.tid())
            });
            lines.extend_from_slice(task);
            output::push_cpu_time(lines, e.aux & 0xfff, self.clock.tsc_to_mono_ns(e.ts));
            let words = &self.arena[e.start..e.start + e.len];
            match e.rtype {
                rtype::FUNC if words.len() == 3 => {
                    // kernel/trace/trace_output.c, print_fn_trace(): no parent when it is 0.
                    syms.push_name(words[1], lines);
                    if words[2] != 0 {
                        lines.extend_from_slice(b" <-");
                        syms.push_return_name(words[2], lines);
                    }
                    lines.push(b'\n');
                    self.printed += 1;
                }
                rtype::KPROBE if words.len() >= RECORD_HEAD_WORDS => {
                    let id = (e.aux >> 12) as usize;
                    let Some(def) = self.events.get(id) else {
                        // Not an event of ours (a mismatched agent): no line.
                        lines.truncate(mark);
                        continue;
                    };
                    if self.seen.len() <= id {
                        self.seen.resize(id + 1, 0);
                    }
                    self.seen[id] += 1;
                    let decoder = self.decoders.get(id).and_then(Option::as_ref);
                    output::kprobe_event(lines, def, decoder, words, syms);
                    self.printed += 1;
                }
                _ => lines.push(b'\n'),
            }
        }
        let mut lines = std::mem::take(&mut self.lines);
        for (_, n) in &exec_notes {
            lines.extend_from_slice(n.as_bytes());
        }
        self.write(|o| o.write_all(&lines));
        self.lines = lines;
    }

    /// The function_graph tracer's lines for this poll's records (see [`crate::graph`]).
    fn print_graph_batch(&mut self, rings: &SharedRings, exec_notes: Vec<(u32, String)>) {
        let nr_rings = rings.config().nr_rings as usize;
        if self.task_ids.len() < nr_rings {
            self.task_ids.resize(nr_rings, None);
        }
        // Per record, the index of its thread's next record in the batch.
        let n = self.batch.len();
        let mut next_of = vec![usize::MAX; n];
        let mut last_seen = vec![usize::MAX; nr_rings];
        for k in (0..n).rev() {
            let r = self.batch[k].ring as usize;
            next_of[k] = last_seen[r];
            last_seen[r] = k;
        }
        let mut consumed = vec![false; n];
        let mut lines = std::mem::take(&mut self.lines);
        lines.clear();
        let graph = self.graph.as_mut().expect("graph tracer");
        graph.threads_seen(rings.claimed() as usize, &mut lines);
        let syms = self.symbols.as_mut().expect("set by poll");
        let clock = &self.clock;
        for k in 0..n {
            if consumed[k] {
                continue;
            }
            if k % PREFAULT_EVERY == PREFAULT_EVERY - 1 {
                self.prefaulter.step(rings);
            }
            let e = &self.batch[k];
            let (comm, tid) = self.task_ids[e.ring as usize].get_or_insert_with(|| {
                let r = rings.reader(e.ring).expect("claimed ring");
                let c = r.comm();
                let len = c.iter().position(|&b| b == 0).unwrap_or(16);
                (c[..len].to_vec(), r.tid())
            });
            let ctx = crate::graph::Ctx {
                cpu: e.aux & 0xfff,
                pid: *tid,
                comm,
            };
            let words = &self.arena[e.start..e.start + e.len];
            let depth = crate::graph::depth_of(e.aux);
            match e.rtype {
                rtype::FGRAPH_ENT if words.len() >= 2 => {
                    let func = words[1];
                    let leaf = next_of[k];
                    let ret = (leaf != usize::MAX).then(|| &self.batch[leaf]).filter(|r| {
                        r.rtype == rtype::FGRAPH_RET
                            && r.len >= 4
                            && crate::graph::Exit::from_aux(r.aux) == crate::graph::Exit::Returned
                            && self.arena[r.start + 1] == func
                    });
                    match ret {
                        Some(r) => {
                            let rw = &self.arena[r.start..r.start + r.len];
                            let ns = clock
                                .tsc_to_mono_ns(rw[0])
                                .saturating_sub(clock.tsc_to_mono_ns(rw[2]));
                            graph.leaf(&mut lines, ctx, func, depth, ns, rw[3], syms);
                            consumed[leaf] = true;
                        }
                        None => graph.nested(&mut lines, ctx, func, depth, syms),
                    }
                    self.printed += 1;
                }
                rtype::FGRAPH_RET if words.len() >= 4 => {
                    let ns = clock
                        .tsc_to_mono_ns(words[0])
                        .saturating_sub(clock.tsc_to_mono_ns(words[2]));
                    let exit = crate::graph::Exit::from_aux(e.aux);
                    graph.ret(&mut lines, ctx, words[1], depth, ns, words[3], exit, syms);
                    self.printed += 1;
                }
                rtype::KPROBE if words.len() >= RECORD_HEAD_WORDS => {
                    let id = (e.aux >> 12) as usize;
                    let Some(def) = self.events.get(id) else {
                        continue;
                    };
                    if self.seen.len() <= id {
                        self.seen.resize(id + 1, 0);
                    }
                    self.seen[id] += 1;
                    let decoder = self.decoders.get(id).and_then(Option::as_ref);
                    let mut text = Vec::new();
                    output::kprobe_event(&mut text, def, decoder, words, syms);
                    graph.comment(&mut lines, ctx, &text);
                    self.printed += 1;
                }
                _ => {}
            }
        }
        for (_, n) in &exec_notes {
            lines.extend_from_slice(n.as_bytes());
        }
        self.write(|o| o.write_all(&lines));
        self.lines = lines;
    }

    fn finish(&mut self, rings: &SharedRings) {
        if !self.started {
            return;
        }
        if let Some(g) = self.graph.as_mut() {
            // Nothing recorded: the column header still.
            let mut h = Vec::new();
            g.threads_seen(rings.claimed() as usize, &mut h);
            self.write(|o| o.write_all(&h));
        }
        let mut per_ring = Vec::new();
        let mut total = rings.lost_no_ring() + rings.lost_recursion();
        for i in 0..rings.claimed().min(rings.config().nr_rings) {
            let Some(r) = rings.reader(i) else { continue };
            if r.lost() > 0 {
                per_ring.push((r.tid(), r.lost()));
            }
            total += r.lost();
        }
        // Per event: (records dropped, nmissed), from the shared header: exact whether or
        // not the target reached its exit.
        let counters: Vec<(u64, u64)> = (0..self.events.len() as u32)
            .map(|id| {
                rings.event_counters(id).map_or((0, 0), |c| {
                    (
                        c.dropped.load(Ordering::Relaxed),
                        c.nmissed.load(Ordering::Relaxed),
                    )
                })
            })
            .collect();
        let events = self.events.clone();
        let seen = self.seen.clone();
        let abandoned = std::mem::take(&mut self.abandoned);
        let execs = self.execs.clone();
        let printed = self.printed;
        self.write(|o| {
            for pid in &abandoned {
                writeln!(o, "# pid {pid} was still running: its later events are not in this trace")?;
            }
            for (tid, n) in &per_ring {
                writeln!(o, "# tid {tid}: {n} events lost (ring full)")?;
            }
            if !per_ring.is_empty() {
                writeln!(
                    o,
                    "# a full ring drops the newest events: --buffer-size-kb N gives each thread a \
                     larger one (now {} KiB)",
                    rings.config().ring_bytes / 1024
                )?;
            }
            if rings.lost_no_ring() > 0 {
                writeln!(o, "# {} events lost: more threads than rings (--rings)", rings.lost_no_ring())?;
            }
            if rings.lost_recursion() > 0 {
                writeln!(
                    o,
                    "# {} events lost: the tracer was already running on the thread (a signal handler interrupted it)",
                    rings.lost_recursion()
                )?;
            }
            if rings.fgraph_overrun() > 0 {
                writeln!(
                    o,
                    "# {} calls not hooked: the shadow stack was full",
                    rings.fgraph_overrun()
                )?;
            }
            writeln!(o, "# lost events: {total}")?;
            output::entries(o, printed, total)?;
            if !events.is_empty() {
                writeln!(o, "# kprobe_profile:")?;
                for (id, def) in events.iter().enumerate() {
                    // Hits: records seen plus those the agent could not write.
                    let seen = seen.get(id).copied().unwrap_or(0);
                    let (dropped, missed) = counters[id];
                    writeln!(o, "#   {:<44} {:>15} {:>15}", def.event, seen + dropped, missed)?;
                }
            }
            for (pid, path) in &execs {
                writeln!(o, "# pid {pid}'s counts stop at its exec of {path} (not traced after exec)")?;
            }
            o.flush()
        });
    }
}
