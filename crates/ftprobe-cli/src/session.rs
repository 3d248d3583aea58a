//! A tracing session, shared by `ftprobe trace` and `ftprobe record`: check the options, spawn
//! CMD with the agent preloaded and a rings memfd inherited, drain the rings into a [`Sink`]
//! while it runs and after it exits (its forked children included), and hand the sink the
//! end of the run.
//!
//! The sinks read the rings through [`Source`], which a recording ([`crate::replay`]) also
//! implements: live `trace` and `replay` format through the same code.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use ftprobe::events::{parse_probe_command, ProbeCommand, ProbeDef};
use ftprobe::ring::{Clock, RingConfig, SharedRings, MAX_EVENTS};
use std::sync::atomic::Ordering;

use crate::attach::{self, Attached};
use crate::signals;

/// The options of a tracing session, shared by `ftprobe trace` and `ftprobe record`.
#[derive(Args, Clone)]
pub struct SessionArgs {
    /// Trace only functions matching GLOB (`set_ftrace_filter` syntax: `*`, `?`, `[..]`,
    /// leading `!` to remove, `:mod:OBJ`). Repeatable; none: every function with a site.
    #[arg(short = 'F', long = "filter", value_name = "GLOB")]
    pub filter: Vec<String>,
    /// Never trace functions matching GLOB (`set_ftrace_notrace`). Repeatable.
    #[arg(short = 'N', long = "notrace", value_name = "GLOB")]
    pub notrace: Vec<String>,
    /// A kprobe event in the kernel's `kprobe_events` syntax, e.g.
    /// `p:myprobe work a=$arg1 b=%si:u32`. Repeatable. With -e and no -F/-N only the events
    /// are traced (the function tracer is off).
    #[arg(
        short = 'e',
        long = "event",
        value_name = "DEF",
        allow_hyphen_values = true
    )]
    pub events: Vec<String>,
    /// The tracer: `function` (entries, `func <-parent`), `function_graph` (entries and
    /// returns as a call graph with durations) or `nop` (only the -e events). Default:
    /// `function`, or `nop` when only -e is given.
    #[arg(short = 't', long = "tracer", value_name = "TRACER")]
    pub tracer: Option<String>,
    /// function_graph: record only calls made inside functions matching GLOB, the graph
    /// starting at them (`set_graph_function`). Repeatable.
    #[arg(short = 'G', long = "graph-function", value_name = "GLOB")]
    pub graph_function: Vec<String>,
    /// function_graph: do not record functions matching GLOB nor anything they call
    /// (`set_graph_notrace`). Repeatable.
    #[arg(long = "graph-notrace", value_name = "GLOB")]
    pub graph_notrace: Vec<String>,
    /// function_graph: record calls only down to this depth (`max_graph_depth`; 0: no limit).
    #[arg(long = "max-depth", value_name = "N", default_value_t = 0)]
    pub max_depth: u32,
    /// A tracer option (`trace_options`), e.g. `funcgraph-retval`, `funcgraph-proc`,
    /// `nofuncgraph-cpu`. Repeatable.
    #[arg(short = 'O', long = "option", value_name = "OPT")]
    pub options: Vec<String>,
    /// Total size of the traced process's ring buffers, in KiB (at least 4). Each thread's
    /// ring starts at 16 KiB and doubles when it fills on its first lap, up to half of this,
    /// while the rings' sizes add up to at most this; its pages are touched only as records
    /// reach them (the default costs nothing until a thread writes faster than the CLI
    /// reads).
    #[arg(long = "buffer-size-kb", default_value_t = 524288)]
    pub buffer_size_kb: u32,
    /// Number of rings: the threads that own one at once, plus the threads that ended and
    /// whose ring ftprobe has not read to the end yet (it is then freed for another thread).
    /// Default: one per 16 KiB of --buffer-size-kb, at least 64 and at most 4096 (a ring
    /// costs 128 bytes and address space until a thread writes into it).
    #[arg(long = "rings", value_name = "N")]
    pub rings: Option<u32>,
    /// Follow exec: a traced process that replaces itself with `exec` is traced on in the new
    /// program (preloading the agent again, with these options); without it, the trace
    /// stops at the exec and says so.
    #[arg(long = "follow-exec")]
    pub follow_exec: bool,
    /// The agent library (default: libftprobe_agent.so next to this executable, or
    /// $FTPROBE_AGENT).
    #[arg(long = "agent", value_name = "PATH")]
    pub agent: Option<PathBuf>,
    /// Attach to the running process PID instead of running CMD (`trace` only): ftprobe
    /// loads its agent there with ptrace, traces until Ctrl-C, --duration or the process's
    /// exit, then puts every patched byte back and leaves the agent idle.
    #[arg(short = 'p', long = "pid", value_name = "PID", conflicts_with = "cmd")]
    pub pid: Option<i32>,
    /// Let the session be changed while the program runs, through `ftprobe ctl PID CMD`
    /// (PID: the program's), in the kernel's tracefs language: `echo 'p:ev func' >>
    /// kprobe_events`, `echo 1 > events/kprobes/ev/enable`, `echo 'fib*' >
    /// set_ftrace_filter`, `echo nop > current_tracer`, `echo 0 > tracing_on`, `cat
    /// kprobe_profile`, ... (`trace` only; the agent then runs a thread of its own in the
    /// program).
    #[arg(long = "control")]
    pub control: bool,
    /// As --control, and read such commands from standard input (replies on standard
    /// error).
    #[arg(long = "interactive")]
    pub interactive: bool,
    /// With -p: stop tracing after this many seconds.
    #[arg(long = "duration", value_name = "S", requires = "pid")]
    pub duration: Option<f64>,
    /// The program and its arguments.
    #[arg(last = true, required_unless_present = "pid", value_name = "CMD")]
    pub cmd: Vec<String>,
}

/// How many rings `--rings` not given means for a budget of `buffer_size_kb` KiB: one per
/// ring's initial size (so their initial sizes together stay within the budget), between
/// these bounds.
pub const DEFAULT_RINGS_MIN: u32 = 64;
pub const DEFAULT_RINGS_MAX: u32 = 4096;

impl SessionArgs {
    /// The number of rings: `--rings`, or the default for `--buffer-size-kb`.
    pub fn nr_rings(&self) -> u32 {
        self.rings.unwrap_or_else(|| {
            let init_kb = ftprobe::ring::INIT_RING_BYTES / 1024;
            (self.buffer_size_kb / init_kb).clamp(DEFAULT_RINGS_MIN, DEFAULT_RINGS_MAX)
        })
    }
}

/// The agent library: `--agent`, `$FTPROBE_AGENT`, or the newest next to this executable;
/// made absolute (a target resolves a relative path against its own directory).
pub fn agent_path(explicit: Option<PathBuf>) -> Result<PathBuf> {
    agent_path_found(explicit)?
        .canonicalize()
        .context("agent library")
}

fn agent_path_found(explicit: Option<PathBuf>) -> Result<PathBuf> {
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
    #[cfg(ftprobe_embedded_agent)]
    return embedded_agent();
    #[cfg(not(ftprobe_embedded_agent))]
    bail!(
        "cannot find libftprobe_agent.so next to {} or in ../lib (this is a debug build, which \
         does not carry the agent: build it with `cargo build`, or pass --agent)",
        exe.display()
    )
}

/// The agent a release build carries (build.rs), written out the first time a directory of
/// its own is needed: `$XDG_CACHE_HOME/ftprobe/agent-HASH/libftprobe_agent.so` (else
/// `~/.cache/...`, else `/tmp/ftprobe-UID/...`). The target loads code from there, so every
/// directory on the way that ftprobe makes is 0700, and one found must be the user's own and
/// writable by no one else.
#[cfg(ftprobe_embedded_agent)]
fn embedded_agent() -> Result<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
    const AGENT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libftprobe_agent.so"));
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .filter(|p| p.is_absolute())
        .map(|p| p.join("ftprobe"))
        .unwrap_or_else(|| PathBuf::from(format!("/tmp/ftprobe-{uid}")));
    let dir = base.join(concat!("agent-", env!("FTPROBE_EMBEDDED_AGENT_HASH")));
    // Each directory is checked before anything is made in it.
    for d in [&base, &dir] {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(d)
            .with_context(|| format!("creating {} for the agent", d.display()))?;
        let m = std::fs::symlink_metadata(d).with_context(|| format!("{}", d.display()))?;
        if !m.is_dir() || m.uid() != uid || m.mode() & 0o022 != 0 {
            bail!(
                "{} is not a directory of this user's that others cannot write: ftprobe \
                 will not load its agent from there (remove it, or pass --agent)",
                d.display()
            );
        }
    }
    let path = dir.join("libftprobe_agent.so");
    // Reused only if it is this agent, byte for byte (a damaged copy is written again).
    if std::fs::symlink_metadata(&path)
        .is_ok_and(|m| m.is_file() && m.uid() == uid && m.len() == AGENT.len() as u64)
        && std::fs::read(&path).is_ok_and(|b| b == AGENT)
    {
        return Ok(path);
    }
    let tmp = dir.join(format!(".libftprobe_agent.so.{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o700)
            .open(&tmp)?;
        std::io::Write::write_all(&mut f, AGENT)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)
    };
    if let Err(e) = write() {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("writing the agent to {}", path.display()));
    }
    Ok(path)
}

/// The files process `pid` maps (its program and libraries), for SDT markers.
fn sdt_objects_of_pid(pid: i32) -> Result<Vec<PathBuf>> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .with_context(|| format!("reading /proc/{pid}/maps"))?;
    let mut out: Vec<PathBuf> = Vec::new();
    for line in maps.lines() {
        if let Some(path) = line.split_ascii_whitespace().nth(5) {
            let p = PathBuf::from(path);
            if path.starts_with('/') && !out.contains(&p) && std::fs::metadata(&p).is_ok() {
                out.push(p);
            }
        }
    }
    Ok(out)
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
        match crate::control::place_def(events.iter().map(|(d, e)| (d.as_slice(), e)), d) {
            Ok((def, None)) => events.push((vec![d.clone()], def)),
            Ok((_, Some(i))) => events[i].0.push(d.clone()),
            Err(r) => {
                eprint!("ftprobe: {}", r.text);
                bail!("invalid probe definition ({})", r.kind);
            }
        }
    }
    Ok(events)
}

/// What a session runs, worked out from [`SessionArgs`] before anything runs.
pub struct Plan {
    pub args: SessionArgs,
    /// The calibration's first sample, taken first thing.
    clock_start: ftprobe::ring::ClockSample,
    /// Each event (by id): its definitions, and the first one parsed (the record layout).
    pub events: Vec<(Vec<String>, ProbeDef)>,
    /// `function`, `function_graph` or `nop`.
    pub tracer: &'static str,
    /// The function_graph layout's options (-O).
    pub graph_opts: crate::graph::Options,
}

/// Check the options; nothing runs yet.
pub fn prepare(args: SessionArgs) -> Result<Plan> {
    // The clock's calibration spans the start-up (20 ms in all, most of it overlapped).
    let clock_start = Clock::start_calibration();
    for p in args.filter.iter().chain(&args.notrace) {
        ftprobe::ftrace::glob::FilterEntry::parse(p)?;
    }
    for p in args.graph_function.iter().chain(&args.graph_notrace) {
        ftprobe::ftrace::glob::FilterEntry::parse(p)?;
    }
    // SDT markers (`sdt_PROVIDER:NAME`) become file-offset probes on each copy, found in
    // the program and the libraries it links (or the objects an attached process maps).
    let defs = crate::sdt::expand_defs(&args.events, || match (args.pid, args.cmd.first()) {
        (Some(pid), _) => sdt_objects_of_pid(pid),
        (None, Some(c)) => {
            let prog = find_program(c).with_context(|| format!("{c}: no such program"))?;
            crate::sdt::objects_of(&prog)
        }
        (None, None) => Ok(Vec::new()),
    })?;
    let events = parse_events(&defs)?;
    // The function tracer runs with -F/-N, or when no -e was given at all (-e then -:EVENT
    // leaves no event, and nothing is traced).
    let tracer: &'static str = match args.tracer.as_deref() {
        None if !args.filter.is_empty() || !args.notrace.is_empty() || args.events.is_empty() => {
            "function"
        }
        None => "nop",
        Some(t) => tracer_name(t)?,
    };
    if tracer != "function_graph"
        && (!args.graph_function.is_empty()
            || !args.graph_notrace.is_empty()
            || args.max_depth != 0)
    {
        return Err(crate::usage!("-G, --graph-notrace and --max-depth are options of the function_graph tracer (-t function_graph)"));
    }
    let mut graph_opts = crate::graph::Options::default();
    for o in &args.options {
        if let Err(e) = graph_opts.set(o) {
            return Err(crate::usage!("{e}"));
        }
    }
    if args.buffer_size_kb < 4 {
        return Err(crate::usage!("--buffer-size-kb must be at least 4"));
    }
    if (args.control || args.interactive) && args.follow_exec {
        return Err(crate::usage!(
            "--control and --interactive do not go with --follow-exec (the control \
             channel is the first program's)"
        ));
    }
    if args.pid.is_some() && args.follow_exec {
        return Err(crate::usage!(
            "--follow-exec does not apply to -p PID: an exec of an attached process is not \
             followed (the new program has no agent); ftprobe says when it execs and stops"
        ));
    }
    if args
        .rings
        .is_some_and(|n| !(1..=ftprobe::ring::MAX_RINGS).contains(&n))
    {
        return Err(crate::usage!(
            "--rings must be 1 to {}",
            ftprobe::ring::MAX_RINGS
        ));
    }
    Ok(Plan {
        args,
        clock_start,
        events,
        tracer,
        graph_opts,
    })
}

/// A tracer's name as the code spells it, or why there is no such tracer.
pub fn tracer_name(t: &str) -> Result<&'static str> {
    Ok(match t {
        "function" => "function",
        "function_graph" => "function_graph",
        "nop" => "nop",
        t => {
            return Err(crate::usage!(
                "no tracer {t:?} (available: function function_graph nop)"
            ))
        }
    })
}

/// The number of CPUs the function_graph layout sizes its CPU column for.
pub fn nr_cpus() -> u32 {
    // SAFETY: sysconf has no memory effects.
    unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }.max(1) as u32
}

/// The CPUs online now.
pub fn cpus_online() -> u32 {
    // SAFETY: sysconf has no memory effects.
    unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as u32
}

/// The rings of a session as the sinks read them: the live shared rings, or a recording.
pub trait Source {
    /// The agent armed everything: the trace is on.
    fn armed(&self) -> bool;
    fn clock(&self) -> Clock;
    /// The record streams: one per owner of a ring (a thread), numbered in the order they
    /// were seen. A ring owned by several threads one after the other (each freed when its
    /// thread ended and everything in it was read) gives one stream per thread.
    fn nr_rings(&self) -> u32;
    /// The streams seen so far (`nr_rings`).
    fn claimed(&self) -> u32;
    /// The streams that may still bring records, in increasing order, into `out` (cleared
    /// first). A live session lists the streams whose ring its owner still holds (or that
    /// were not read to the end): a stream that leaves the list brought everything it had, and
    /// a sink may drop what it keeps for it. A recording lists those not read to the end.
    fn active(&self, out: &mut Vec<u32>) {
        out.clear();
        out.extend((0..self.claimed().min(self.nr_rings())).filter(|&i| !self.done(i)));
    }
    /// Hand every record of stream `i` now available to `f` (rtype, aux, payload words), in
    /// the ring's order; `false` when the stream cannot be read.
    fn drain(&mut self, i: u32, f: impl FnMut(u16, u32, &[u64])) -> bool;
    /// Whether the last [`drain`](Self::drain) stopped at the size of its piece, so that the
    /// stream may still hold records it could have handed out (a live ring; never a
    /// recording's stream).
    fn drain_stopped_short(&self) -> bool {
        false
    }
    /// [`drain`](Self::drain), at most `max` records of a [`chunked`](Self::chunked) stream
    /// (a live one hands out what it has).
    fn drain_max(&mut self, i: u32, _max: usize, f: impl FnMut(u16, u32, &[u64])) -> bool {
        self.drain(i, f)
    }
    /// [`drain`](Self::drain) in bulk: the records as the ring holds them (header word
    /// `len | rtype << 16 | aux << 32`, `len` counting the header, then the payload), appended
    /// to `buf`; the number of records (0: nothing more now; a live stream is drained in
    /// pieces of a few MiB), `None` when the stream cannot be read.
    fn drain_raw(&mut self, i: u32, buf: &mut Vec<u64>) -> Option<usize> {
        let mut n = 0;
        let ok = self.drain(i, |rtype, aux, w| {
            buf.push(ring_record_header(rtype, aux, w.len()));
            buf.extend_from_slice(w);
            n += 1;
        });
        ok.then_some(n)
    }
    /// The comm (without its NULs) and tid of stream `i`'s thread.
    fn task(&self, i: u32) -> Option<(Vec<u8>, u32)>;
    /// The process id of stream `i`'s thread, when known.
    fn pid(&self, i: u32) -> Option<u32>;
    /// Records stream `i`'s ring lost (full) while the thread owned it.
    fn lost(&self, i: u32) -> u64;
    /// The threads that had no ring: (tid, events lost).
    fn lost_by_tid(&self) -> Vec<(u32, u64)>;
    /// The ring stream `i` was read from (live only).
    fn ring_index(&self, _i: u32) -> Option<u32> {
        None
    }
    /// The objects table: (load bias, the path to read the object's symbols from).
    fn objects(&self) -> Vec<(u64, Vec<u8>)>;
    /// When each entry of [`objects`](Self::objects) was added (raw TSC; 0: from the
    /// start); empty when not known (every entry from the start).
    fn object_load_times(&self) -> Vec<u64> {
        Vec::new()
    }
    /// A recording whose counters are not all known: why (its recorder did not finish, or
    /// stopped recording before the program ended). `None` live and for a whole recording.
    fn unfinished(&self) -> Option<String> {
        None
    }
    fn lost_no_ring(&self) -> u64;
    /// Of [`lost_no_ring`](Self::lost_no_ring): (events lost while some rings were held by
    /// ended threads not read yet, events of threads after they released their ring).
    fn lost_no_ring_kinds(&self) -> (u64, u64) {
        (0, 0)
    }
    fn lost_recursion(&self) -> u64;
    fn fgraph_overrun(&self) -> u64;
    /// Per kprobe event id: (records dropped, nmissed).
    fn event_counters(&self, id: u32) -> (u64, u64);
    /// The CPUs online (`#P:` of the entries line).
    fn cpus_online(&self) -> u32;
    /// Called every so many records while a sink formats: keeps the live rings' pages
    /// faulted in ahead of their producers.
    fn prefault(&mut self) {}
    /// A drain hands out a bounded chunk of the ring's records (a recording), not all that
    /// it holds (the live rings): a reader drains a ring when it needs more of it.
    fn chunked(&self) -> bool {
        false
    }
    /// Ring `i` will hand out no more records (a recording's ring read to its end).
    fn done(&self, _i: u32) -> bool {
        false
    }
}

/// The header word of a record as a ring holds it (and a recording stores it): `len` counts
/// the header word.
pub fn ring_record_header(rtype: u16, aux: u32, payload_words: usize) -> u64 {
    ((payload_words as u64 + 1) & 0xffff) | (u64::from(rtype) << 16) | (u64::from(aux) << 32)
}

/// One owner of a ring: a record stream. Kept for every thread seen (the trailer's and
/// `info.json`'s counts), so small and fixed: no allocation.
struct Stream {
    ring: u32,
    tid: u32,
    /// The thread's process (0: not said).
    pid: u32,
    comm: [u8; 16],
    comm_len: u8,
    /// The ring's `lost` when the ring was freed (then the stream is closed).
    lost: Option<u64>,
}

/// What [`Live`]'s drain of a ring takes at most (the rest at the next drain).
const LIVE_DRAIN_BYTES: u64 = 1 << 20;
/// The same for a raw drain (`record`, which writes each piece out before the next).
const LIVE_DRAIN_RAW_BYTES: u64 = 4 << 20;

/// The live shared rings, as streams (one per owner of a ring: [`Source::nr_rings`]).
pub struct Live<'a> {
    pub rings: &'a SharedRings,
    prefaulter: Prefaulter,
    streams: Vec<Stream>,
    /// Per ring, the stream of its owner now.
    open: Vec<Option<u32>>,
    /// Bytes of records drained so far (the poll's pace follows it).
    drained_bytes: u64,
    /// The words of a drain, kept from drain to drain.
    scratch: Vec<u64>,
    /// The last [`Source::drain`] stopped at [`LIVE_DRAIN_BYTES`].
    stopped_short: bool,
    /// At the last [`Live::free_drained`]: rings freed, and rings still held by ended
    /// threads.
    freed_now: u32,
    held_by_ended: u32,
    /// The traced process (the CLI's child, or the attached one), as this process sees it.
    target: u32,
    /// Per pid an agent wrote into a ring: whether it is the target or a descendant in this
    /// pid namespace, i.e. the same process here (looked at while it lived). Only for those
    /// is an ending ring's owner told gone.
    ours: std::cell::RefCell<HashMap<u32, bool>>,
}

/// Whether process `pid` (as this process sees it) is in this process's pid namespace.
fn same_pid_ns(pid: u32) -> bool {
    let ns = |p: &str| std::fs::read_link(format!("/proc/{p}/ns/pid")).ok();
    let own = ns("self");
    own.is_some() && own == ns(&pid.to_string())
}

/// Whether live process `pid` is `target` or a descendant of it, in this pid namespace.
fn descends_from(target: u32, pid: u32) -> bool {
    let mut p = pid;
    for _ in 0..64 {
        if !same_pid_ns(p) {
            return false;
        }
        if p == target {
            return true;
        }
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            return false;
        };
        match stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u32>().ok())
        {
            Some(ppid) if ppid > 1 => p = ppid,
            _ => return false,
        }
    }
    false
}

impl<'a> Live<'a> {
    pub fn new(rings: &'a SharedRings, target: u32) -> Live<'a> {
        Live {
            rings,
            prefaulter: Prefaulter::new(rings),
            streams: Vec::new(),
            open: vec![None; rings.config().nr_rings as usize],
            drained_bytes: 0,
            scratch: Vec::new(),
            stopped_short: false,
            freed_now: 0,
            held_by_ended: 0,
            target,
            ours: std::cell::RefCell::new(HashMap::new()),
        }
    }

    /// Whether thread `tid` of process `pid` (as the agent there saw them) has ended: `pid`
    /// is known to be the target or a descendant in this pid namespace (see `ours`), and
    /// `/proc/PID/task/TID` is gone. Never for a process of another namespace.
    fn owner_gone(&self, pid: u32, tid: u32) -> bool {
        let mut ours = self.ours.borrow_mut();
        let known = *ours
            .entry(pid)
            .or_insert_with(|| descends_from(self.target, pid));
        known && !Path::new(&format!("/proc/{pid}/task/{tid}")).exists()
    }

    /// Before a poll: a stream for each ring that has a new owner.
    pub fn refresh(&mut self) {
        for i in 0..self.rings.claimed() {
            if self.open[i as usize].is_some() {
                continue;
            }
            if let Some((tid, comm, _)) = self.rings.owner(i) {
                // While its process lives: whether it is one of ours (`owner_gone`).
                let pid = self.rings.owner_pid(i);
                if pid != 0 {
                    let target = self.target;
                    self.ours
                        .get_mut()
                        .entry(pid)
                        .or_insert_with(|| descends_from(target, pid));
                }
                let n = comm.iter().position(|&b| b == 0).unwrap_or(16);
                self.open[i as usize] = Some(self.streams.len() as u32);
                self.streams.push(Stream {
                    ring: i,
                    tid,
                    pid: self.rings.owner_pid(i),
                    comm,
                    comm_len: n as u8,
                    lost: None,
                });
            }
        }
    }

    /// After a poll: free the rings whose owner ended and that were read to the end, for
    /// other threads; their streams are closed.
    pub fn free_drained(&mut self) {
        self.freed_now = 0;
        self.held_by_ended = 0;
        for i in 0..self.rings.claimed() {
            let Some(s) = self.open[i as usize] else {
                continue;
            };
            let gone = |pid: u32, tid: u32| self.owner_gone(pid, tid);
            if let Some((_, _, lost)) = self.rings.free_released(i, gone) {
                self.streams[s as usize].lost = Some(lost);
                self.open[i as usize] = None;
                self.prefaulter.forget(i);
                self.freed_now += 1;
            } else if self.rings.owner(i).is_some_and(|o| o.2) {
                self.held_by_ended += 1;
            }
        }
    }

    /// After [`free_drained`](Self::free_drained): whether the next poll should come at
    /// once: rings were freed (threads end: more may end soon), or rings are held by ended
    /// threads not read to the end yet (new threads may find none free).
    fn churning(&self) -> bool {
        self.freed_now > 0 || self.held_by_ended > 0
    }

    /// The ring of stream `i` while it is open.
    fn ring_of(&self, i: u32) -> Option<u32> {
        let s = self.streams.get(i as usize)?;
        s.lost.is_none().then_some(s.ring)
    }
}

impl Source for Live<'_> {
    fn armed(&self) -> bool {
        self.rings.armed()
    }
    fn clock(&self) -> Clock {
        self.rings.clock()
    }
    fn nr_rings(&self) -> u32 {
        self.streams.len() as u32
    }
    fn claimed(&self) -> u32 {
        self.streams.len() as u32
    }
    fn active(&self, out: &mut Vec<u32>) {
        out.clear();
        out.extend(
            self.open
                .iter()
                .take(self.rings.claimed() as usize)
                .flatten(),
        );
        out.sort_unstable();
    }
    fn drain(&mut self, i: u32, mut f: impl FnMut(u16, u32, &[u64])) -> bool {
        self.stopped_short = false;
        if i as usize >= self.streams.len() {
            return false;
        }
        let Some(ring) = self.ring_of(i) else {
            // Closed: everything was read before its ring was freed.
            return true;
        };
        let Some(mut r) = self.rings.reader(ring) else {
            return false;
        };
        let mut bytes = 0;
        // In pieces: the CLI holds a piece of a ring, not the whole ring (the next poll comes
        // at once while a lot is coming).
        r.drain_aux_in_max(&mut self.scratch, LIVE_DRAIN_BYTES, |t, a, w| {
            bytes += 8 + 8 * w.len() as u64;
            f(t, a, w)
        });
        self.drained_bytes += bytes;
        // The reader stops only once a piece's bytes are taken (whole records).
        self.stopped_short = bytes >= LIVE_DRAIN_BYTES;
        true
    }
    fn drain_stopped_short(&self) -> bool {
        self.stopped_short
    }
    fn drain_raw(&mut self, i: u32, buf: &mut Vec<u64>) -> Option<usize> {
        if i as usize >= self.streams.len() {
            return None;
        }
        let Some(ring) = self.ring_of(i) else {
            return Some(0);
        };
        let mut r = self.rings.reader(ring)?;
        let before = buf.len();
        let n = r.drain_raw_max(buf, LIVE_DRAIN_RAW_BYTES);
        self.drained_bytes += 8 * (buf.len() - before) as u64;
        Some(n)
    }
    fn task(&self, i: u32) -> Option<(Vec<u8>, u32)> {
        let s = self.streams.get(i as usize)?;
        Some((s.comm[..usize::from(s.comm_len)].to_vec(), s.tid))
    }
    fn pid(&self, i: u32) -> Option<u32> {
        let s = self.streams.get(i as usize)?;
        (s.pid != 0).then_some(s.pid)
    }
    fn lost(&self, i: u32) -> u64 {
        let Some(s) = self.streams.get(i as usize) else {
            return 0;
        };
        match s.lost {
            Some(n) => n,
            None => self.rings.reader(s.ring).map_or(0, |r| r.lost()),
        }
    }
    fn lost_by_tid(&self) -> Vec<(u32, u64)> {
        self.rings.lost_by_tid()
    }
    fn ring_index(&self, i: u32) -> Option<u32> {
        Some(self.streams.get(i as usize)?.ring)
    }
    fn objects(&self) -> Vec<(u64, Vec<u8>)> {
        self.rings.objects()
    }
    fn object_load_times(&self) -> Vec<u64> {
        self.rings.object_load_times()
    }
    fn lost_no_ring(&self) -> u64 {
        self.rings.lost_no_ring()
    }
    fn lost_no_ring_kinds(&self) -> (u64, u64) {
        self.rings.lost_no_ring_kinds()
    }
    fn lost_recursion(&self) -> u64 {
        self.rings.lost_recursion()
    }
    fn fgraph_overrun(&self) -> u64 {
        self.rings.fgraph_overrun()
    }
    fn event_counters(&self, id: u32) -> (u64, u64) {
        self.rings.event_counters(id).map_or((0, 0), |c| {
            (
                c.dropped.load(Ordering::Relaxed),
                c.nmissed.load(Ordering::Relaxed),
            )
        })
    }
    fn prefault(&mut self) {
        self.prefaulter.step(self.rings);
    }
    fn cpus_online(&self) -> u32 {
        cpus_online()
    }
}

/// How a run ended, as a sink reports it.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct End {
    /// The target's pid.
    pub pid: u32,
    /// Its exit code, when it exited.
    pub code: Option<i32>,
    /// The signal that killed it, when one did.
    pub signal: Option<i32>,
    pub core_dumped: bool,
    /// It was killed by a SIGTRAP that ftprobe's handler never saw.
    pub sigtrap_untaken: bool,
    /// Forked processes still writing when ftprobe stopped waiting for them.
    pub abandoned: Vec<u32>,
}

impl End {
    /// The exit code ftprobe exits with for this run (128 + the signal, as a shell says it).
    pub fn exit_code(&self) -> i32 {
        self.code.unwrap_or_else(|| 128 + self.signal.unwrap_or(0))
    }
}

/// Where a session's records go: formatted (`trace`) or stored (`record`).
pub trait Sink {
    /// Take what the rings hold now. `final_poll`: the last time (nothing comes later).
    fn poll<S: Source>(&mut self, src: &mut S, final_poll: bool);
    fn flush(&mut self);
    /// After the last poll, with how the run ended.
    fn finish<S: Source>(&mut self, src: &mut S, end: &End) -> Result<()>;
    /// The output could not be written (the run then fails).
    fn failed(&self) -> bool;
    /// The session has a control channel: events it adds, and the profile it reads.
    fn set_live(&mut self, _live: std::sync::Arc<crate::control::LiveEvents>) {}
}

/// Run the plan's command (or attach to its process), feeding `sink`; returns the exit code
/// to exit with.
pub fn run<K: Sink>(plan: Plan, sink: &mut K) -> Result<i32> {
    if let Some(pid) = plan.args.pid {
        return run_attached(plan, pid, sink);
    }
    let Plan {
        args,
        clock_start,
        events,
        tracer,
        ..
    } = plan;
    let function = tracer == "function";
    // The program's file, read once (an unreadable one is left to exec to refuse).
    let prog_data = find_program(&args.cmd[0]).and_then(|p| Some((std::fs::read(&p).ok()?, p)));
    if let Some((data, prog)) = &prog_data {
        check_not_static(prog, data)?;
    }
    let agent = agent_path(args.agent.clone())?
        .canonicalize()
        .context("agent library")?;
    let (rings, fd) = SharedRings::create_uncalibrated(RingConfig::with_budget(
        args.nr_rings(),
        u64::from(args.buffer_size_kb) * 1024,
    ))?;
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
    // The control channel's area (`--control`): inherited by the program, as the rings'.
    let control = if args.control || args.interactive {
        let (area, cfd) = ftprobe::control::ControlArea::create()?;
        // SAFETY: F_SETFD on our own descriptor: the program inherits it.
        unsafe { libc::fcntl(cfd.as_raw_fd(), libc::F_SETFD, 0) };
        Some((area, cfd))
    } else {
        None
    };
    signals::catch_termination();
    // Orphaned descendants of the target become our children, so that the wait at the end
    // finds the forked ones still tracing (Linux 3.4+; without it, the wait finds none).
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    let mut command = Command::new(&args.cmd[0]);
    if let Some((_, cfd)) = &control {
        command.env("FTPROBE_CONTROL_FD", cfd.as_raw_fd().to_string());
    }
    // The program starts with the signal dispositions an exec from here gives: glibc's
    // posix_spawn (what `spawn` uses without this hook) sets the C library's internal
    // signals 32 and 33, which have handlers in this process, to SIG_IGN in the child, and
    // that survives the exec (`/proc/PID/status` showed them ignored). Here they go back to
    // the default, as an exec does for any handled signal (issue 26, item 11).
    // SAFETY: the hook runs in the forked child before exec and makes two rt_sigaction
    // system calls with a kernel-layout struct on its stack: async-signal-safe.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, || {
            for sig in [32, 33] {
                reset_handled_signal(sig);
            }
            Ok(())
        })
    };
    let child = command
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
            "FTPROBE_FOLLOW_EXEC",
            if args.follow_exec { "1" } else { "0" },
        )
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
    let (controller, _server) = match control {
        Some((area, cfd)) => {
            drop(cfd);
            let (c, s) = start_control(&args, area, &events, tracer, child.id(), sink)?;
            (Some(c), Some(s))
        }
        None => (None, None),
    };
    // While the target starts: fault in the first pages of ring 0 (its first thread's, as a
    // rule), then finish calibrating the clock (only the text output needs it).
    let mut live = Live::new(&rings, child.id());
    live.prefaulter.first_ring(&rings);
    rings.set_clock(Clock::finish_calibration(clock_start));
    let exit = ExitWatch::new(child.id());
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if let Some(sig) = signals::take_pending() {
            // SAFETY: kill has no memory effects; the pid is our child, not yet reaped.
            unsafe { libc::kill(child.id() as i32, sig) };
        }
        let before = live.drained_bytes;
        live.poll(sink, false);
        sink.flush();
        reap_orphans(child.id());
        // The pace: while the rings fill, poll again at once (a lot came) or soon; idle,
        // every 10 ms.
        // Threads ending (rings freed, or held by ended threads): every 1 ms, so that
        // their rings are free again before new threads need them.
        match live.drained_bytes - before {
            n if n >= BUSY_POLL_BYTES => {}
            0 if !live.churning() => exit.wait(Duration::from_millis(10)),
            _ => exit.wait(Duration::from_millis(1)),
        }
    };
    // Forked children of the target keep tracing after it exits: wait for them (as uftrace
    // does), and say so; a termination signal stops the wait (their later events are then
    // missing, and the trace says whose).
    let mut told = false;
    let mut abandoned = Vec::new();
    loop {
        live.poll(sink, false);
        let still = live_writers();
        if still.is_empty() {
            break;
        }
        if signals::take_pending().is_some() {
            abandoned = still;
            break;
        }
        if !told {
            eprintln!(
                "ftprobe: {} exited; waiting for the forked processes still tracing ({}); Ctrl-C stops waiting",
                args.cmd[0],
                still.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
            );
            told = true;
        }
        sink.flush();
        std::thread::sleep(Duration::from_millis(10));
    }
    // What the last of them wrote between the poll above and its exit.
    live.poll(sink, true);
    if let Some(ctl) = &controller {
        ctl.close();
    }
    // ftprobe's handler never saw the trap that killed it (it notes the ones it passes to
    // the program's default action): SIGTRAP was blocked where the agent could not see.
    let sigtrap_untaken = status.signal() == Some(libc::SIGTRAP)
        && !rings.objects().is_empty()
        && rings.sigtrap_passed_pid() != child.id();
    let end = End {
        pid: child.id(),
        code: status.code(),
        signal: status.signal(),
        core_dumped: status.core_dumped(),
        sigtrap_untaken,
        abandoned,
    };
    if sigtrap_untaken {
        eprintln!("ftprobe: {} was {SIGTRAP_UNTAKEN}", args.cmd[0]);
    }
    if rings.objects().is_empty() {
        eprintln!(
            "ftprobe: the agent did not start in {}: nothing was traced (a setuid program, a \
             program that runs another without the environment, or one that stopped before \
             its libraries' constructors?)",
            args.cmd[0]
        );
    }
    finish_counting_heap(sink, &mut live, &end)?;
    let code = end.exit_code();
    // A trace that could not be written is a failure even when the target succeeded.
    Ok(if sink.failed() && code == 0 { 1 } else { code })
}

/// With `FTPROBE_TEST_HEAP=1` (crate::heap), on stderr: the CLI's heap in use once the last
/// poll is done (what the sink keeps, per thread ever seen among it), then the most in use
/// while the sink finished (writing what it kept), above that:
/// `ftprobe: heap: N bytes in use before finishing, M more at most while finishing`.
fn finish_counting_heap<K: Sink, S: Source>(sink: &mut K, src: &mut S, end: &End) -> Result<()> {
    if !crate::heap::counting() {
        return sink.finish(src, end);
    }
    let before = crate::heap::in_use();
    crate::heap::reset_peak();
    let r = sink.finish(src, end);
    eprintln!(
        "ftprobe: heap: {before} bytes in use before finishing, {} more at most while finishing",
        crate::heap::peak() - before
    );
    r
}

/// The control channel's CLI side for the program `pid`: its controller (which `sink`
/// learns live events from), its socket, and `--interactive`'s reader.
fn start_control<K: Sink>(
    args: &SessionArgs,
    area: ftprobe::control::ControlArea,
    events: &[(Vec<String>, ProbeDef)],
    tracer: &'static str,
    pid: u32,
    sink: &mut K,
) -> Result<(
    std::sync::Arc<crate::control::Controller>,
    crate::control::Server,
)> {
    let ctl = std::sync::Arc::new(crate::control::Controller::new(
        area,
        events,
        tracer,
        &args.filter,
        &args.notrace,
    ));
    sink.set_live(ctl.live());
    let server = crate::control::Server::start(ctl.clone(), pid)?;
    if args.interactive {
        crate::control::serve_stdin(ctl.clone());
    }
    eprintln!(
        "ftprobe: control: ftprobe ctl {pid} 'CMD' (`help` lists them){}",
        if args.interactive {
            ", or commands on standard input"
        } else {
            ""
        }
    );
    Ok((ctl, server))
}

/// `trace -p PID`: load the agent into the running process `pid` and start it there
/// ([`crate::attach`]), drain its rings into `sink` until Ctrl-C, `--duration` or its exit,
/// then stop the agent (every patched byte back) and leave. Returns the exit code: 0.
fn run_attached<K: Sink>(plan: Plan, pid: i32, sink: &mut K) -> Result<i32> {
    use ftprobe::agent_config::{AgentConfig, AgentMessage, RingsFrom};
    let Plan {
        args,
        clock_start,
        events,
        tracer,
        ..
    } = plan;
    let agent = agent_path(args.agent.clone())?;
    if args.buffer_size_kb < 4 {
        bail!("--buffer-size-kb must be at least 4");
    }
    attach::check_target(pid)?;
    for other in attach::agent_mapped(pid) {
        if other != agent {
            bail!(
                "process {pid} already has another ftprobe agent loaded ({}): pass it with \
                 --agent",
                other.display()
            );
        }
    }
    let ring_config =
        RingConfig::with_budget(args.nr_rings(), u64::from(args.buffer_size_kb) * 1024);
    let mut config = AgentConfig {
        // Set below: the target's own memfd.
        rings: RingsFrom::Fd(-1),
        cli_pid: std::process::id(),
        function: tracer == "function",
        filter: args.filter.clone(),
        notrace: args.notrace.clone(),
        graph: tracer == "function_graph",
        graph_function: args.graph_function.clone(),
        graph_notrace: args.graph_notrace.clone(),
        max_depth: args.max_depth,
        events: events
            .iter()
            .enumerate()
            .flat_map(|(id, (defs, _))| defs.iter().map(move |d| (id as u32, d.clone())))
            .collect(),
        control: None,
    };
    // Before the attach: a pidfd says when the process ends (it is not our child: no wait).
    let exit = ExitWatch::new(pid as u32);
    signals::catch_termination();
    let mut made = None;
    let mut made_control = None;
    let attach_times = control(pid, &agent, |a| {
        // The rings live in a memfd the target makes (it then needs no access to our
        // process): we open it through /proc/PID/fd/N and lay it out; the agent maps it
        // from its own descriptor, which it closes.
        let m = a.memfd_create("ftprobe-rings", libc::MFD_ALLOW_SEALING | libc::MFD_CLOEXEC)?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/{pid}/fd/{m}"))
            .with_context(|| format!("opening process {pid}'s ring buffer"))?;
        let rings = SharedRings::create_on(std::os::fd::AsFd::as_fd(&file), ring_config)?;
        rings.set_clock(Clock::finish_calibration(clock_start));
        made = Some(rings);
        config.rings = RingsFrom::Fd(m);
        if args.control || args.interactive {
            let c = a.memfd_create("ftprobe-control", libc::MFD_CLOEXEC)?;
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(format!("/proc/{pid}/fd/{c}"))
                .with_context(|| format!("opening process {pid}'s control area"))?;
            made_control = Some(ftprobe::control::ControlArea::create_on(
                std::os::fd::AsFd::as_fd(&file),
            )?);
            config.control = Some(c);
        }
        Ok(AgentMessage::Attach {
            config: Box::new(config.clone()),
            stopped_ips: a.thread_ips()?,
            thread_pointers: a.thread_pointers()?,
            stopped_sps: a.thread_sps()?,
        })
    })
    .with_context(|| format!("starting the agent in process {pid}"))?;
    let rings = made.context("no ring buffer")?;
    let (controller, server) = match made_control {
        Some(area) => {
            let (c, s) = start_control(&args, area, &events, tracer, pid as u32, sink)?;
            (Some(c), Some(s))
        }
        None => (None, None),
    };
    eprintln!("ftprobe: tracing process {pid} (Ctrl-C to stop)");
    let mut live = Live::new(&rings, pid as u32);
    let deadline = args
        .duration
        .map(|s| std::time::Instant::now() + Duration::from_secs_f64(s.max(0.0)));
    let mut exited = false;
    let mut end = End {
        pid: pid as u32,
        ..End::default()
    };
    let mut next_exec_check = std::time::Instant::now();
    let mut first_drained = None;
    loop {
        if exit.exited() {
            exited = true;
            (end.code, end.signal) = attach::exit_status(pid);
            match (end.code, end.signal) {
                (Some(c), _) => eprintln!("ftprobe: process {pid} exited with status {c}"),
                (_, Some(sig)) => eprintln!(
                    "ftprobe: process {pid} was killed by signal {sig} ({})",
                    signal_name(sig)
                ),
                _ => eprintln!("ftprobe: process {pid} exited"),
            }
            break;
        }
        // An exec replaces the image, the agent and the rings' mapping with it: nothing is
        // traced any more.
        if std::time::Instant::now() >= next_exec_check {
            next_exec_check = std::time::Instant::now() + Duration::from_millis(100);
            if !attach::rings_mapped(pid) && !exit.exited() {
                // A process that is exiting has no mappings left (and no `exe`) before its
                // pidfd says so: that is its end, said above once it is complete, not an
                // exec (a process killed with big rings mapped was said to exec `?`).
                let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
                let mapped = std::fs::read_to_string(format!("/proc/{pid}/maps"))
                    .is_ok_and(|m| !m.is_empty());
                if exe.is_none() || !mapped {
                    // Looked at again soon; meanwhile the loop goes on (a zombie leader whose
                    // threads still run shows no mappings either).
                    next_exec_check = std::time::Instant::now() + Duration::from_millis(10);
                } else {
                    let exe = exe.map_or_else(|| "?".into(), |p| p.display().to_string());
                    eprintln!(
                        "ftprobe: process {pid} exec'd {exe}: the new program is not traced \
                         (--follow-exec does not apply to -p); tracing stops"
                    );
                    exited = true;
                    break;
                }
            }
        }
        if signals::take_pending().is_some()
            || deadline.is_some_and(|d| std::time::Instant::now() >= d)
        {
            break;
        }
        let before = live.drained_bytes;
        live.poll(sink, false);
        sink.flush();
        if live.drained_bytes > 0 {
            first_drained.get_or_insert_with(std::time::Instant::now);
        }
        match live.drained_bytes - before {
            n if n >= BUSY_POLL_BYTES => {}
            0 if !live.churning() => exit.wait(Duration::from_millis(10)),
            _ => exit.wait(Duration::from_millis(1)),
        }
    }
    // No command after this: the agent's control thread ends.
    drop(server);
    if let Some(ctl) = &controller {
        ctl.close();
    }
    let mut detach_times = None;
    // A detach that did not put everything back (it says what it left): exit 1.
    let mut detach_failed = false;
    if !exited {
        // Every site back to its NOP, every probe's byte back: the program runs as before.
        let detach_start = std::time::Instant::now();
        match control(pid, &agent, |a| {
            Ok(AgentMessage::Detach {
                stopped_ips: a.thread_ips()?,
                stopped_sps: a.thread_sps()?,
                thread_pointers: a.thread_pointers()?,
            })
        }) {
            Ok(t) => {
                let mut left = t.left.clone();
                detach_times = Some((detach_start, t));
                // Sites a thread was inside (a `-pg` PIE's 6-byte GOT calls): the threads
                // run a moment (no site calls a trampoline any more), then are stopped again
                // for them, a few times if need be.
                for _ in 0..RESTORE_TRIES {
                    if left.is_none() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(2));
                    left = match control(pid, &agent, |a| {
                        Ok(AgentMessage::RestoreSites {
                            stopped_ips: a.thread_ips()?,
                            stopped_sps: a.thread_sps()?,
                            thread_pointers: a.thread_pointers()?,
                        })
                    }) {
                        Ok(t) => t.left,
                        Err(e) => Some(format!("{e:#}")),
                    };
                }
                if let Some(text) = left {
                    if Path::new(&format!("/proc/{pid}")).exists() {
                        eprintln!("ftprobe: detaching from process {pid}: {text}");
                        detach_failed = true;
                    }
                }
            }
            Err(e) => {
                if Path::new(&format!("/proc/{pid}")).exists() {
                    eprintln!("ftprobe: stopping the agent in process {pid}: {e:#}");
                    detach_failed = true;
                }
            }
        }
    }
    live.poll(sink, true);
    if live.drained_bytes > 0 {
        // Tracing ended before a poll found any: the last one drained them.
        first_drained.get_or_insert_with(std::time::Instant::now);
    }
    if std::env::var_os("FTPROBE_TIMING").is_some_and(|v| v == "1") {
        eprintln!(
            "{}",
            attach_times.report(first_drained, detach_times.as_ref())
        );
    }
    finish_counting_heap(sink, &mut live, &end)?;
    Ok(if sink.failed() || detach_failed { 1 } else { 0 })
}

/// Set signal `sig` to SIG_DFL if it has a handler (not if it is ignored: an exec keeps that),
/// with the raw system call (glibc's `sigaction` refuses its internal signals 32 and 33).
/// Async-signal-safe: for a forked child before exec.
fn reset_handled_signal(sig: libc::c_int) {
    // The kernel's `struct sigaction` on x86-64: handler, flags, restorer, mask.
    let mut old = [0u64; 4];
    let dfl = [0u64; 4];
    // SAFETY: rt_sigaction with a NULL new action reads the current one into `old`, 32
    // bytes of our stack, with the kernel's 8-byte signal set.
    let r = unsafe {
        libc::syscall(
            libc::SYS_rt_sigaction,
            sig,
            std::ptr::null::<u64>(),
            old.as_mut_ptr(),
            8usize,
        )
    };
    if r == 0 && old[0] != libc::SIG_DFL as u64 && old[0] != libc::SIG_IGN as u64 {
        // SAFETY: as above; SIG_DFL with no flags and an empty mask.
        unsafe {
            libc::syscall(
                libc::SYS_rt_sigaction,
                sig,
                dfl.as_ptr(),
                std::ptr::null_mut::<u64>(),
                8usize,
            )
        };
    }
}

/// The name of signal `sig` (`strsignal`).
fn signal_name(sig: i32) -> String {
    // SAFETY: strsignal returns a NUL-terminated string (static or per-thread); this thread
    // copies it at once.
    unsafe { std::ffi::CStr::from_ptr(libc::strsignal(sig)) }
        .to_string_lossy()
        .into_owned()
}

/// Attach to `pid`, make sure the agent is loaded, send it the message `msg` builds (with
/// the stopped process in hand), and detach. The agent's messages are printed; its error
/// is ours. A refusal for now (the agent's answer 3: a thread stopped inside a site about
/// to be rewritten, e.g. within a run of one-byte NOPs) is tried again after the threads
/// ran a moment, [`RETRIES_FOR_NOW`] times at most, with a new message.
fn control(
    pid: i32,
    agent: &Path,
    mut msg: impl FnMut(&mut Attached) -> Result<ftprobe::agent_config::AgentMessage>,
) -> Result<ControlTimes> {
    let mut tries = 0;
    let (a, all_stopped, code, text) = loop {
        let mut a = Attached::attach(pid)?;
        let all_stopped = std::time::Instant::now();
        let handle = a.dlopen(agent)?;
        let entry = a.dlsym(handle, "ftprobe_agent_control")?;
        let bytes = ftprobe::agent_config::encode(&msg(&mut a)?);
        let (code, text) = a.call_with_output(entry, &bytes, 16 << 10)?;
        tries += 1;
        if code != 3 || tries == RETRIES_FOR_NOW {
            break (a, all_stopped, code, text);
        }
        a.detach()?;
        std::thread::sleep(Duration::from_millis(1));
    };
    let agent_done = std::time::Instant::now();
    let (first_stop, threads) = a.stop_stats();
    a.detach()?;
    let resumed = std::time::Instant::now();
    let text = String::from_utf8_lossy(&text);
    // 2: carried out, with sites left to put back (what the text says).
    let left = (code == 2).then(|| text.trim_end().to_owned());
    if code != 0 && code != 2 {
        bail!("{}", text.trim_end());
    }
    if !text.is_empty() && left.is_none() {
        eprint!("{text}");
    }
    Ok(ControlTimes {
        threads,
        first_stop,
        all_stopped,
        agent_done,
        resumed,
        left,
    })
}

/// How many times an attach is tried when the agent refuses it for now.
const RETRIES_FOR_NOW: usize = 50;

/// How many times a detach stops the threads again to put back sites a thread was inside.
const RESTORE_TRIES: usize = 20;

/// When the steps of one [`control`] ended: `FTPROBE_TIMING=1 ftprobe trace -p` prints them
/// (bench/attach.sh reads that line).
struct ControlTimes {
    threads: usize,
    /// The first thread seen stopped.
    first_stop: std::time::Instant,
    /// Every thread stopped.
    all_stopped: std::time::Instant,
    /// Sites the agent could not put back yet (its answer 2), as it says them.
    left: Option<String>,
    /// The agent's entry point returned (loaded if it was not, then started or stopped).
    agent_done: std::time::Instant,
    /// Every thread let go.
    resumed: std::time::Instant,
}

impl ControlTimes {
    /// One line, in ms from the first thread stopped: the attach's steps, the first records
    /// drained into the output, and the detach's steps (from its start).
    fn report(
        &self,
        first_drained: Option<std::time::Instant>,
        detach: Option<&(std::time::Instant, ControlTimes)>,
    ) -> String {
        let ms = |t: std::time::Instant, from: std::time::Instant| {
            format!(
                "{:.3}",
                t.saturating_duration_since(from).as_secs_f64() * 1e3
            )
        };
        let t0 = self.first_stop;
        let mut line = format!(
            "ftprobe: timing: threads={} all_stopped={} agent_started={} resumed={} \
             first_event={}",
            self.threads,
            ms(self.all_stopped, t0),
            ms(self.agent_done, t0),
            ms(self.resumed, t0),
            first_drained.map_or_else(|| "none".to_owned(), |t| ms(t, t0)),
        );
        if let Some((start, d)) = detach {
            line += &format!(
                " detach_stopped={} detach_agent_stopped={} detach_resumed={}",
                ms(d.all_stopped, *start),
                ms(d.agent_done, *start),
                ms(d.resumed, *start),
            );
        }
        line + " (ms)"
    }
}

/// A poll that drained this many bytes is followed by the next one at once.
const BUSY_POLL_BYTES: u64 = 1 << 20;

impl Live<'_> {
    /// One poll of `sink`: new owners, their records, then the rings read to the end that
    /// their owners released are freed.
    fn poll<K: Sink>(&mut self, sink: &mut K, final_poll: bool) {
        self.refresh();
        self.prefault();
        sink.poll(self, final_poll);
        self.free_drained();
    }
}

/// How a trace says that the program died of a SIGTRAP ftprobe's handler never saw.
pub const SIGTRAP_UNTAKEN: &str = "killed by a trap that ftprobe could not take (SIGTRAP was \
                                   blocked, e.g. by a raw rt_sigprocmask system call)";

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

/// How far ahead of a ring's head the CLI keeps its pages faulted in (first lap only): as
/// far as the ring has come, between these bounds, within the ring's size.
const PREFAULT_AHEAD_MIN: u64 = 16 << 10;
const PREFAULT_AHEAD_MAX: u64 = 16 << 20;

/// Lines formatted between two prefault steps (~20 ms of formatting).
pub const PREFAULT_EVERY: usize = 1 << 16;

/// Keeps the pages ahead of every owned ring's head faulted in on the ring's first lap: the
/// pages are allocated and zeroed on the CLI's CPU, not in the traced thread, which then
/// takes a minor fault per page (several times cheaper here). A thread that wrote little
/// gets little: the distance ahead doubles with what it wrote.
struct Prefaulter {
    /// Per ring, how many bytes of its data area have been faulted in.
    done: Vec<u64>,
}

impl Prefaulter {
    fn new(rings: &SharedRings) -> Prefaulter {
        Prefaulter {
            done: vec![0; rings.config().nr_rings as usize],
        }
    }

    /// Ring 0, before anything claimed it: the target's first thread takes it, as a rule.
    fn first_ring(&mut self, rings: &SharedRings) {
        let init = u64::from(rings.config().init_bytes());
        self.advance(rings, 0, PREFAULT_AHEAD_MIN, init);
    }

    fn step(&mut self, rings: &SharedRings) {
        for i in 0..rings.claimed().min(rings.config().nr_rings) {
            let Some(size) = rings.ring_size(i).filter(|&s| s != 0) else {
                continue;
            };
            let head = rings.head(i).unwrap_or(0);
            let ahead = head.clamp(PREFAULT_AHEAD_MIN, PREFAULT_AHEAD_MAX);
            self.advance(rings, i, head.saturating_add(ahead), u64::from(size));
        }
    }

    /// Ring `i` was freed (its pages are gone).
    fn forget(&mut self, i: u32) {
        if let Some(d) = self.done.get_mut(i as usize) {
            *d = 0;
        }
    }

    fn advance(&mut self, rings: &SharedRings, i: u32, want: u64, size: u64) {
        let Some(done) = self.done.get_mut(i as usize) else {
            return;
        };
        let want = want.min(size);
        if want > *done {
            // On failure (an old kernel) stop trying for this ring.
            *done = if rings.prefault(i, *done, want - *done) {
                want
            } else {
                u64::from(rings.config().ring_bytes)
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

    /// The process has exited (without a pidfd: it is gone from /proc, or a zombie).
    fn exited(&self) -> bool {
        match &self.0 {
            Some(fd) => {
                let mut p = libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd; poll writes only its revents.
                unsafe { libc::poll(&mut p, 1, 0) > 0 && p.revents & libc::POLLIN != 0 }
            }
            None => false,
        }
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
