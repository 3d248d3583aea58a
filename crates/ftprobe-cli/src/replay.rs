//! `ftprobe replay`: print a recording ([`crate::record`]) as `ftprobe trace` printed it live,
//! through the same [`Printer`]: the recording is a [`Source`](crate::session::Source) like
//! the live rings.
//!
//! Each ring file is read in chunks ([`crate::recording::CHUNK`] records) through the
//! filters ([`crate::filter`]), and the printer merges the rings by timestamp (a k-way merge,
//! [`crate::merge`]): memory is O(rings x chunk), whatever the recording's size.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use ftprobe::ftrace::glob::FilterEntry;

use crate::filter::{parse_duration, parse_glob, Filters};
use crate::output::open_output;
use crate::recording::{DataDir, Recording, Selection};
use crate::session::{self, Sink, Source};
use crate::trace::Printer;

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
    /// Only functions matching GLOB (`set_ftrace_filter` syntax); in a function_graph
    /// recording, the matching functions and everything they call (as `set_graph_function`),
    /// the graph starting at them. Repeatable.
    #[arg(short = 'F', long = "filter", value_name = "GLOB", value_parser = parse_glob)]
    filter: Vec<FilterEntry>,
    /// Hide functions matching GLOB; in a function_graph recording, with everything they
    /// call. Repeatable.
    #[arg(short = 'N', long = "notrace", value_name = "GLOB", value_parser = parse_glob)]
    notrace: Vec<FilterEntry>,
    /// function_graph: only calls down to depth N (after -F: below the matching call; 1:
    /// only the outermost calls).
    #[arg(long = "max-depth", value_name = "N", default_value_t = 0)]
    max_depth: u32,
    /// function_graph: hide calls shorter than DUR (`10us`, `1.5ms`, `2s`; uftrace's `-t`).
    #[arg(long = "min-duration", value_name = "DUR", value_parser = parse_duration)]
    min_duration: Option<u64>,
    #[command(flatten)]
    selection: Selection,
}

/// Print the recording; returns the exit code (1 when the output could not be written).
pub fn run(args: ReplayArgs) -> Result<i32> {
    let filters = Filters {
        filter: args.filter.clone(),
        notrace: args.notrace.clone(),
        max_depth: args.max_depth,
        min_duration_ns: args.min_duration.unwrap_or(0),
        ..args.selection.filters()
    };
    let mut rec = Recording::open_filtered(&args.data.dir, filters)?;
    // A recording's own tracer that this build does not know: the recording is bad (1).
    let tracer = session::tracer_name(&rec.info.tracer)
        .map_err(|e| anyhow::anyhow!("{}: {e}", args.data.dir.display()))?;
    if tracer != "function_graph" && (args.max_depth > 0 || args.min_duration.is_some()) {
        return Err(crate::usage!(
            "--max-depth and --min-duration are for function_graph recordings (this one is {tracer})"
        ));
    }
    let events = rec.events()?;
    let mut graph_opts = crate::graph::Options::default();
    for o in rec.info.options.iter().chain(&args.options) {
        if let Err(e) = graph_opts.set(o) {
            return Err(crate::usage!("{e}"));
        }
    }
    let ncpus = rec.info.ncpus;
    let mut printer = Printer::new(
        open_output(args.output.as_ref())?,
        tracer,
        events,
        (tracer == "function_graph").then_some((graph_opts, ncpus)),
    );
    // The images processes exec'd into, also when --tid leaves out the thread whose TEXT
    // record announced one.
    printer.add_images(&rec.info.images);
    if rec.info.armed {
        let n = rec.claimed().min(rec.nr_rings());
        loop {
            let last = (0..n).all(|i| rec.done(i));
            printer.poll(&mut rec, last);
            printer.flush();
            if last {
                break;
            }
        }
    }
    if let Some(e) = rec.take_error() {
        return Err(e);
    }
    let end = rec.info.end.clone();
    printer.finish(&mut rec, &end)?;
    printer.flush();
    Ok(i32::from(printer.failed()))
}
