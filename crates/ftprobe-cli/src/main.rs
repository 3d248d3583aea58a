//! `ftprobe`: run a program with the agent and print its ftrace events (or record them, and
//! replay the recording), or list the functions a binary has ftrace sites in.

mod attach;
mod dump;
mod filter;
mod graph;
mod merge;
mod output;
mod perfetto;
mod record;
mod recording;
mod replay;
mod report;
mod session;
mod signals;
mod symbols;
mod trace;

use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand};

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
}

fn main() {
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
            1
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
        Cmd::List {
            what: ListWhat::Functions { bin },
        } => {
            output::list_functions(&bin)?;
            Ok(0)
        }
    }
}
