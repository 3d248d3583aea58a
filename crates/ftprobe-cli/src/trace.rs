//! `ftprobe trace`: spawn CMD with the agent preloaded and a rings memfd inherited, print the
//! events live while it runs, drain everything after it exits, print lost-event counts, and exit
//! with its status.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use ftprobe::function_tracer::RTYPE_FUNC;
use ftprobe::ring::{Clock, RingConfig, SharedRings};

use crate::output;
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
    for cand in [
        dir.join("libftprobe_agent.so"),
        dir.join("deps/libftprobe_agent.so"),
        dir.join("../lib/libftprobe_agent.so"),
    ] {
        if cand.exists() {
            return Ok(cand);
        }
    }
    bail!(
        "cannot find libftprobe_agent.so next to {} (build it with `cargo build`, or pass --agent)",
        exe.display()
    )
}

/// Run the command; returns the exit code to exit with.
pub fn run(args: TraceArgs) -> Result<i32> {
    for p in args.filter.iter().chain(&args.notrace) {
        ftprobe::ftrace::glob::FilterEntry::parse(p)?;
    }
    let agent = agent_path(args.agent)?
        .canonicalize()
        .context("agent library")?;
    let ring_bytes = args
        .buffer_size_kb
        .checked_mul(1024)
        .context("--buffer-size-kb too large")?;
    let (rings, fd) = SharedRings::create(RingConfig {
        nr_rings: args.rings,
        ring_bytes,
    })?;
    let mut out: Box<dyn Write> = match &args.output {
        Some(p) => Box::new(BufWriter::new(
            File::create(p).with_context(|| format!("creating {}", p.display()))?,
        )),
        None => Box::new(BufWriter::new(std::io::stdout())),
    };
    let preload = match std::env::var("LD_PRELOAD") {
        Ok(old) if !old.is_empty() => format!("{}:{old}", agent.display()),
        _ => agent.display().to_string(),
    };
    let mut child = Command::new(&args.cmd[0])
        .args(&args.cmd[1..])
        .env("LD_PRELOAD", preload)
        .env("FTPROBE_RING_FD", fd.as_raw_fd().to_string())
        .env("FTPROBE_CLI_PID", std::process::id().to_string())
        .env("FTPROBE_FILTER", args.filter.join("\n"))
        .env("FTPROBE_NOTRACE", args.notrace.join("\n"))
        .spawn()
        .with_context(|| format!("cannot run {:?}", args.cmd[0]))?;
    drop(fd);
    output::function_header(&mut out)?;
    let mut printer = Printer {
        clock: rings.clock(),
        symbols: None,
        batch: Vec::new(),
    };
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        printer.poll(&rings, &mut out)?;
        out.flush()?;
        std::thread::sleep(Duration::from_millis(10));
    };
    printer.poll(&rings, &mut out)?;
    printer.print_lost(&rings, &mut out)?;
    out.flush()?;
    Ok(status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)))
}

struct Event {
    ts: u64,
    ring: u32,
    cpu: u32,
    ip: u64,
    parent: u64,
}

struct Printer {
    clock: Clock,
    symbols: Option<Symbols>,
    batch: Vec<Event>,
}

impl Printer {
    /// Drain every ring, merge the records by timestamp, print them.
    fn poll(&mut self, rings: &SharedRings, out: &mut dyn Write) -> Result<()> {
        self.batch.clear();
        for i in 0..rings.claimed().min(rings.config().nr_rings) {
            let Some(mut r) = rings.reader(i) else {
                continue;
            };
            let batch = &mut self.batch;
            r.drain_aux(|rtype, cpu, w| {
                if rtype == RTYPE_FUNC && w.len() == 3 {
                    batch.push(Event {
                        ts: w[0],
                        ring: i,
                        cpu,
                        ip: w[1],
                        parent: w[2],
                    });
                }
            });
        }
        if self.batch.is_empty() {
            return Ok(());
        }
        if self.symbols.as_ref().is_none_or(Symbols::is_empty) {
            self.symbols = Some(Symbols::new(&rings.objects()));
        }
        let syms = self.symbols.as_mut().expect("set above");
        self.batch.sort_by_key(|e| e.ts);
        let mut comms: Vec<Option<(String, u32)>> = vec![None; rings.config().nr_rings as usize];
        for e in &self.batch {
            let (comm, tid) = comms[e.ring as usize].get_or_insert_with(|| {
                let r = rings.reader(e.ring).expect("claimed ring");
                let c = r.comm();
                let n = c.iter().position(|&b| b == 0).unwrap_or(16);
                (String::from_utf8_lossy(&c[..n]).into_owned(), r.tid())
            });
            output::context(out, comm, *tid, e.cpu, self.clock.tsc_to_mono_ns(e.ts))?;
            let f = syms.name(e.ip);
            let p = syms.name(e.parent);
            writeln!(out, "{f} <-{p}")?;
        }
        Ok(())
    }

    fn print_lost(&self, rings: &SharedRings, out: &mut dyn Write) -> Result<()> {
        let mut total = rings.lost_no_ring();
        for i in 0..rings.claimed().min(rings.config().nr_rings) {
            let Some(r) = rings.reader(i) else { continue };
            if r.lost() > 0 {
                writeln!(
                    out,
                    "# tid {}: {} events lost (ring full)",
                    r.tid(),
                    r.lost()
                )?;
            }
            total += r.lost();
        }
        if rings.lost_no_ring() > 0 {
            writeln!(
                out,
                "# {} events lost: more threads than rings (--rings)",
                rings.lost_no_ring()
            )?;
        }
        writeln!(out, "# lost events: {total}")?;
        Ok(())
    }
}
