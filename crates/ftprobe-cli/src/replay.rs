//! `ftprobe replay`: print a recording ([`crate::record`]) as `ftprobe trace` printed it live,
//! through the same [`Printer`]: the recording is a [`Source`] like the live rings.
//!
//! The records are handed to the printer in windows of time: each poll takes, from every ring,
//! the records up to the timestamp that bounds the next [`CHUNK`] records of some ring, so
//! the threads are merged by timestamp across the whole recording and a poll stays bounded.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use ftprobe::ring::Clock;
use ftprobe::trace::rtype;
use ftprobe::trace_kprobe;

use crate::record::{Info, FORMAT};
use crate::session::{self, Sink, Source};
use crate::trace::{open_output, Printer};

/// Records per ring that bound a poll's time window.
const CHUNK: usize = 1 << 16;

/// Arguments of `ftprobe replay`.
#[derive(Args)]
pub struct ReplayArgs {
    /// The recording's data directory (`-i DIR` too).
    #[arg(
        short = 'd',
        short_alias = 'i',
        long = "data",
        value_name = "DIR",
        default_value = "ftprobe.data"
    )]
    dir: PathBuf,
    /// A tracer option (`trace_options`), applied after the recorded ones, e.g.
    /// `funcgraph-retval`, `nofuncgraph-cpu`. Repeatable.
    #[arg(short = 'O', long = "option", value_name = "OPT")]
    options: Vec<String>,
    /// Write the trace to FILE instead of standard output.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: Option<PathBuf>,
}

/// A record of a ring file: rtype, aux, its payload in the ring's `words`.
struct Rec {
    rtype: u16,
    aux: u32,
    start: usize,
    len: usize,
}

struct Ring {
    words: Vec<u64>,
    recs: Vec<Rec>,
    /// The next record to hand out.
    cursor: usize,
}

impl Ring {
    /// The timestamp of record `k`, for the records that have one (first payload word).
    fn ts(&self, k: usize) -> Option<u64> {
        let r = &self.recs[k];
        matches!(
            r.rtype,
            rtype::FUNC | rtype::KPROBE | rtype::FGRAPH_ENT | rtype::FGRAPH_RET
        )
        .then(|| self.words.get(r.start).copied())
        .flatten()
        .filter(|_| r.len > 0)
    }
}

/// Parse a ring file.
fn load_ring(data: &[u8]) -> Result<Ring> {
    if data.len() % 8 != 0 {
        bail!("{} bytes: not whole words", data.len());
    }
    let words: Vec<u64> = data
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect();
    let mut recs = Vec::new();
    let mut at = 0;
    while at < words.len() {
        let h = words[at];
        let len = ((h >> 16) & 0xffff) as usize;
        if at + 1 + len > words.len() {
            bail!("a record at word {at} runs past the end");
        }
        recs.push(Rec {
            rtype: (h & 0xffff) as u16,
            aux: (h >> 32) as u32,
            start: at + 1,
            len,
        });
        at += 1 + len;
    }
    Ok(Ring {
        words,
        recs,
        cursor: 0,
    })
}

/// A recording, as a [`Source`].
struct Recording {
    info: Info,
    /// By ring index (`None`: no file).
    rings: Vec<Option<Ring>>,
    /// The objects table, the paths those of the copies.
    objects: Vec<(u64, Vec<u8>)>,
    /// The current window's end: records with a timestamp up to it are handed out.
    until: u64,
}

impl Recording {
    fn open(dir: &std::path::Path) -> Result<Recording> {
        let path = dir.join("info.json");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {} (not a recording?)", path.display()))?;
        let info: Info =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        if info.format != FORMAT {
            bail!(
                "{}: format {} (this ftprobe reads {FORMAT})",
                path.display(),
                info.format
            );
        }
        let n = info.claimed.min(info.nr_rings) as usize;
        let mut rings = Vec::with_capacity(n);
        for i in 0..n {
            let Some(r) = info.rings.iter().find(|r| r.index as usize == i) else {
                rings.push(None);
                continue;
            };
            let file = dir.join(&r.file);
            let ring = match std::fs::read(&file) {
                Ok(data) => load_ring(&data).with_context(|| format!("{}", file.display()))?,
                // A ring with no record has no file.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && r.records == 0 => {
                    load_ring(&[])?
                }
                Err(e) => return Err(e).with_context(|| format!("reading {}", file.display())),
            };
            rings.push(Some(ring));
        }
        let objects = info
            .objects
            .iter()
            .map(|o| {
                let p = o.copy.as_ref().map_or_else(
                    // Not copied: the original, if it is still there.
                    || PathBuf::from(&o.path),
                    |c| dir.join(c),
                );
                (o.bias, p.into_os_string().into_encoded_bytes())
            })
            .collect();
        Ok(Recording {
            info,
            rings,
            objects,
            until: 0,
        })
    }

    /// Set the next window; `true` when it is the last (it takes everything left).
    fn next_window(&mut self) -> bool {
        let mut until = u64::MAX;
        for r in self.rings.iter().flatten() {
            let k = r.cursor + CHUNK;
            if let Some(ts) = (k..r.recs.len()).find_map(|k| r.ts(k)) {
                until = until.min(ts);
            }
        }
        self.until = until;
        until == u64::MAX
    }
}

impl Source for Recording {
    fn armed(&self) -> bool {
        self.info.armed
    }
    fn clock(&self) -> Clock {
        Clock::from_parts(self.info.clock)
    }
    fn nr_rings(&self) -> u32 {
        self.info.nr_rings
    }
    fn claimed(&self) -> u32 {
        self.info.claimed
    }
    fn drain(&mut self, i: u32, mut f: impl FnMut(u16, u32, &[u64])) -> bool {
        let until = self.until;
        let Some(Some(r)) = self.rings.get_mut(i as usize) else {
            return false;
        };
        while r.cursor < r.recs.len() {
            if r.ts(r.cursor).is_some_and(|ts| ts > until) {
                break;
            }
            let rec = &r.recs[r.cursor];
            f(rec.rtype, rec.aux, &r.words[rec.start..rec.start + rec.len]);
            r.cursor += 1;
        }
        true
    }
    fn task(&self, i: u32) -> Option<(Vec<u8>, u32)> {
        let r = self.info.rings.iter().find(|r| r.index == i)?;
        let comm = r
            .comm_bytes
            .clone()
            .unwrap_or_else(|| r.comm.clone().into_bytes());
        Some((comm, r.tid))
    }
    fn lost(&self, i: u32) -> u64 {
        self.info
            .rings
            .iter()
            .find(|r| r.index == i)
            .map_or(0, |r| r.lost)
    }
    fn objects(&self) -> Vec<(u64, Vec<u8>)> {
        self.objects.clone()
    }
    fn cpus_online(&self) -> u32 {
        self.info.cpus_online
    }
    fn lost_no_ring(&self) -> u64 {
        self.info.lost_no_ring
    }
    fn lost_recursion(&self) -> u64 {
        self.info.lost_recursion
    }
    fn fgraph_overrun(&self) -> u64 {
        self.info.fgraph_overrun
    }
    fn event_counters(&self, id: u32) -> (u64, u64) {
        self.info
            .event_counters
            .get(id as usize)
            .map_or((0, 0), |c| (c[0], c[1]))
    }
}

/// Print the recording; returns the exit code (1 when the output could not be written).
pub fn run(args: ReplayArgs) -> Result<i32> {
    let mut rec = Recording::open(&args.dir)?;
    let tracer = session::tracer_name(&rec.info.tracer)?;
    let mut events = Vec::new();
    for defs in &rec.info.events {
        let first = defs.first().context("an event with no definition")?;
        match trace_kprobe::check(first) {
            Ok(d) => events.push(d),
            Err(e) => bail!("recorded event {first:?}: {}", e.err.kind.name()),
        }
    }
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
