//! `ftprobe dump`: a recording ([`crate::recording`]) exported for other tools:
//! - `--chrome FILE`: Chrome's Trace Event Format (JSON, through `serde_json`), which
//!   chrome://tracing, ui.perfetto.dev and speedscope open: one complete event (`X`) per call
//!   of a function_graph recording, with `ts` and `dur` in microseconds (fractions for the
//!   nanoseconds); an instant event (`i`) per function-tracer entry and per kprobe event, a
//!   kprobe event's fetch args as its `args`; each thread's name as a metadata event (`M`).
//! - `--perfetto FILE`: Perfetto's native protobuf trace ([`crate::export::perfetto`]): a track per
//!   process and per thread, a begin and an end slice event per call, an instant event per
//!   function-tracer entry and per kprobe event.
//! - `--flame-graph FILE`: folded stacks (`a;b;c N`, one line per distinct stack, as
//!   Brendan Gregg's `stackcollapse` scripts write them), N the self time in ns of the calls
//!   with that stack, so that a stack's width is its total time; with `--svg` the flame graph
//!   drawn from them by the `inferno` crate.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use crate::export;
use crate::output::open_output;
use crate::recording::{DataDir, Recording, Selection};

/// Arguments of `ftprobe dump`.
#[derive(Args)]
pub struct DumpArgs {
    #[command(flatten)]
    data: DataDir,
    /// Write Chrome Trace Event JSON to FILE (`-` for standard output).
    #[arg(long, value_name = "FILE")]
    chrome: Option<PathBuf>,
    /// Write a Perfetto protobuf trace to FILE (`-` for standard output).
    #[arg(long, value_name = "FILE")]
    perfetto: Option<PathBuf>,
    /// Write folded stacks weighted by self time in ns to FILE (`-` for standard output).
    #[arg(long = "flame-graph", value_name = "FILE")]
    flame_graph: Option<PathBuf>,
    /// With --flame-graph: write an SVG flame graph instead of the folded stacks.
    #[arg(long, requires = "flame_graph")]
    svg: bool,
    #[command(flatten)]
    selection: Selection,
}

/// FILE, or standard output for `-`; its write errors name it.
fn output(path: &PathBuf) -> Result<Box<dyn Write>> {
    let inner = open_output((path.as_os_str() != "-").then_some(path))?;
    let name = if path.as_os_str() == "-" {
        "standard output".to_owned()
    } else {
        path.display().to_string()
    };
    Ok(Box::new(Named { inner, name }))
}

/// A writer whose errors say what was being written (their kind kept: a closed pipe is
/// still one).
struct Named {
    inner: Box<dyn Write>,
    name: String,
}

impl Named {
    fn named(&self, e: std::io::Error) -> std::io::Error {
        std::io::Error::new(e.kind(), format!("writing {}: {e}", self.name))
    }
}

impl Write for Named {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.inner.write(buf).map_err(|e| self.named(e))
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush().map_err(|e| self.named(e))
    }
}

/// Write what was asked; returns the exit code.
pub fn run(args: DumpArgs) -> Result<i32> {
    if args.chrome.is_none() && args.perfetto.is_none() && args.flame_graph.is_none() {
        return Err(crate::usage!(
            "nothing to dump: --chrome FILE, --perfetto FILE and/or --flame-graph FILE"
        ));
    }
    let stdout = [&args.chrome, &args.perfetto, &args.flame_graph]
        .iter()
        .filter(|p| p.as_ref().is_some_and(|p| p.as_os_str() == "-"))
        .count();
    if stdout > 1 {
        // A usage error, as clap's own (exit status 2).
        return Err(crate::usage!(
            "only one of --chrome, --perfetto and --flame-graph may write to standard output (-)"
        ));
    }
    let mut rec = Recording::open_filtered(&args.data.dir, args.selection.filters())?;
    if let Some(path) = &args.chrome {
        let mut o = output(path)?;
        export::chrome::write(&mut rec, &mut o)?;
        o.flush()?;
    }
    if let Some(path) = &args.perfetto {
        let mut o = output(path)?;
        export::perfetto::write(&mut rec, &mut o)?;
        o.flush()?;
    }
    if let Some(path) = &args.flame_graph {
        let stacks = export::folded::stacks(&mut rec)?;
        let lines: Vec<String> = stacks.iter().map(|(s, n)| format!("{s} {n}")).collect();
        let mut o = output(path)?;
        if args.svg {
            let mut opts = inferno::flamegraph::Options::default();
            opts.title = format!("ftprobe: {}", rec.info.command.join(" "));
            opts.count_name = "ns".to_owned();
            inferno::flamegraph::from_lines(&mut opts, lines.iter().map(String::as_str), &mut o)
                .context("drawing the flame graph")?;
        } else {
            for l in &lines {
                writeln!(o, "{l}")?;
            }
        }
        o.flush()?;
    }
    Ok(0)
}
