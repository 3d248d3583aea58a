//! `ftprobe replay`: print a recording ([`crate::record`]) as `ftprobe trace` printed it live,
//! through the same [`Printer`]: the recording is a [`Source`] like the live rings.
//!
//! The records are handed to the printer in windows of time: each poll takes, from every ring,
//! the records up to the timestamp that bounds the next `CHUNK` records of some ring, so
//! the threads are merged by timestamp across the whole recording and a poll stays bounded.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;

use crate::recording::{DataDir, Recording};
use crate::session::{self, Sink};
use crate::trace::{open_output, Printer};

/// Arguments of `ftprobe replay`.
#[derive(Args)]
pub struct ReplayArgs {
    #[command(flatten)]
    data: DataDir,
    /// A tracer option (`trace_options`), applied after the recorded ones, e.g.
    /// `funcgraph-retval`, `nofuncgraph-cpu`. Repeatable.
    #[arg(short = 'O', long = "option", value_name = "OPT")]
    options: Vec<String>,
    /// Write the trace to FILE instead of standard output.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: Option<PathBuf>,
}

/// Print the recording; returns the exit code (1 when the output could not be written).
pub fn run(args: ReplayArgs) -> Result<i32> {
    let mut rec = Recording::open(&args.data.dir)?;
    let tracer = session::tracer_name(&rec.info.tracer)?;
    let events = rec.events()?;
    let mut graph_opts = crate::graph::Options::default();
    for o in rec.info.options.iter().chain(&args.options) {
        if let Err(e) = graph_opts.set(o) {
            bail!("{e}");
        }
    }
    let ncpus = rec.info.ncpus;
    let mut printer = Printer::new(
        open_output(args.output.as_ref())?,
        tracer,
        events,
        (tracer == "function_graph").then_some((graph_opts, ncpus)),
    );
    if rec.info.armed {
        loop {
            let last = rec.next_window();
            printer.poll(&mut rec, last);
            printer.flush();
            if last {
                break;
            }
        }
    }
    let end = rec.info.end.clone();
    printer.finish(&mut rec, &end)?;
    printer.flush();
    Ok(i32::from(printer.failed()))
}
