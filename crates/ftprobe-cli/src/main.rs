//! `ftprobe`: run a program with the agent and print its ftrace events (or record them, and
//! replay the recording), or list the functions a binary has ftrace sites in.

mod attach;
mod control;
mod dump;
mod export;
mod filter;
mod format;
mod graph;
mod heap;
mod merge;
mod output;
mod record;
mod recording;
mod replay;
mod report;
mod sdt;
mod session;
mod signals;
mod symbols;
mod trace;

use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand};

/// A bad option value, or options that do not go together, found after clap's own checks
/// (which exit with status 2): `ftprobe` exits with 2 for it too. Failures at run time (a
/// program that cannot be run, a recording that cannot be read, a probe the target cannot
/// arm) exit with 1. Probe definitions and filter globs the kernel's grammar refuses exit
/// with 1 as well: the kernel's write to `kprobe_events` or `set_ftrace_filter` fails
/// (EINVAL), with its `error_log` text.
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// `return Err(usage!(...))`: a [`UsageError`] with a formatted message.
#[macro_export]
macro_rules! usage {
    ($($t:tt)*) => {
        anyhow::Error::new($crate::UsageError(format!($($t)*)))
    };
}

/// The exit status for the error `e`: 2 for a usage error, else 1.
fn exit_status_of(e: &anyhow::Error) -> i32 {
    if e.downcast_ref::<UsageError>().is_some() {
        2
    } else {
        1
    }
}

#[derive(Parser)]
#[command(
    name = "ftprobe",
    version,
    about = "kprobes + ftrace for user-space processes"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run CMD with the function tracer and print its events in ftrace's `trace` format.
    Trace(Box<trace::TraceArgs>),
    /// Run CMD as `trace` does, but store its records unformatted in a data directory
    /// (default `ftprobe.data`) for `replay`.
    Record(Box<record::RecordArgs>),
    /// Print a recording as `trace` printed it live.
    Replay(replay::ReplayArgs),
    /// Sum a recording up per function (calls, total, self time) or per kprobe event.
    Report(report::ReportArgs),
    /// Export a recording: Chrome Trace Event JSON, folded stacks or a flame graph SVG.
    Dump(dump::DumpArgs),
    /// Load the agent into a running process and detach, leaving it idle (attach's
    /// mechanics alone, for tests).
    #[command(name = "attach-load", hide = true)]
    AttachLoad {
        /// The process.
        #[arg(short = 'p', long = "pid")]
        pid: i32,
        /// The agent library (default: as `trace`).
        #[arg(long = "agent", value_name = "PATH")]
        agent: Option<PathBuf>,
    },
    /// Send commands to a live session (`ftprobe trace --control`) of process PID: each
    /// CMD (or each line of standard input) in the kernel's tracefs language, e.g.
    /// `echo 1 > events/kprobes/ev/enable`, `cat kprobe_profile`; `help` lists them.
    Ctl {
        /// The traced program's pid.
        pid: u32,
        /// The commands (none: read them from standard input).
        cmds: Vec<String>,
    },
    /// List things in a binary.
    List {
        #[command(subcommand)]
        what: ListWhat,
    },
}

#[derive(Subcommand)]
enum ListWhat {
    /// Functions with an ftrace site (like `available_filter_functions`), with each site's
    /// kind, place, offset and how it was found.
    Functions {
        /// The executable or shared library.
        bin: PathBuf,
    },
    /// SDT markers (USDT, `<sys/sdt.h>`; `perf list sdt`) of a program and the libraries
    /// it links: `sdt_PROVIDER:NAME`, each copy's address, semaphore, object and
    /// arguments. Probe one with `-e 'p sdt_PROVIDER:NAME'`.
    Sdt {
        /// The executable or shared library.
        bin: PathBuf,
    },
}

/// Counts its bytes only with `FTPROBE_TEST_HEAP=1` (tests of what the CLI keeps per thread).
#[global_allocator]
static HEAP: heap::Counting = heap::Counting;

fn main() {
    heap::init_from_env();
    let cli = Cli::parse();
    let code = match run(cli) {
        Ok(code) => code,
        // The reader of the output went away (`| head`): what it wanted was written; end
        // quietly, as `trace` and `replay` do.
        Err(e)
            if e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            }) =>
        {
            0
        }
        Err(e) => {
            eprintln!("ftprobe: {e:#}");
            exit_status_of(&e)
        }
    };
    std::process::exit(code);
}

fn run(cli: Cli) -> Result<i32> {
    match cli.cmd {
        Cmd::Trace(args) => trace::run(*args),
        Cmd::Record(args) => record::run(*args),
        Cmd::Replay(args) => replay::run(args),
        Cmd::Report(args) => report::run(args),
        Cmd::Dump(args) => dump::run(args),
        Cmd::AttachLoad { pid, agent } => {
            let agent = session::agent_path(agent)?;
            let handle = attach::load_agent(pid, &agent)?;
            println!(
                "loaded {} into process {pid} (handle {handle:#x})",
                agent.display()
            );
            Ok(0)
        }
        Cmd::Ctl { pid, cmds } => control::ctl(pid, &cmds),
        Cmd::List {
            what: ListWhat::Functions { bin },
        } => {
            output::list_functions(&bin)?;
            Ok(0)
        }
        Cmd::List {
            what: ListWhat::Sdt { bin },
        } => {
            sdt::list(&bin)?;
            Ok(0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_errors_exit_with_2_and_others_with_1() {
        let e = usage!("bad {}", 1);
        assert_eq!((exit_status_of(&e), e.to_string()), (2, "bad 1".to_owned()));
        // A context on top keeps it a usage error.
        assert_eq!(exit_status_of(&e.context("reading the options")), 2);
        assert_eq!(exit_status_of(&anyhow::anyhow!("no such file")), 1);
    }
}
