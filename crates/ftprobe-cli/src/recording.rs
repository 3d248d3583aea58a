//! Reading a recording ([`crate::record`]): its `info.json` and ring files, as a [`Source`]
//! for `ftprobe replay`'s printer, and as per-thread record streams and calls for `ftprobe
//! report` and `ftprobe dump`. One decoder of the files for every reader of a recording.
//!
//! [`Recording::calls`] rebuilds a thread's calls from its function_graph records: an entry
//! opens a frame, the return with the same function closes it (its duration is the return's
//! timestamp less its `calltime`, as `trace` prints it). A call whose return says it was cut
//! off (unwound, longjmp, lost), and a call still open at the thread's last record, counts
//! with its time to the cut and is marked `cut`. A call's self time is its duration less its
//! children's.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use ftprobe::events::ProbeDef;
use ftprobe::ring::Clock;
use ftprobe::trace::rtype;
use ftprobe::trace_kprobe;

use crate::graph::Exit;
use crate::record::{Info, FORMAT};
use crate::session::Source;
use crate::symbols::Symbols;

/// The `-d DIR` (or `-i DIR`) of the commands that read a recording.
#[derive(clap::Args)]
pub struct DataDir {
    /// The recording's data directory (`-i DIR` too).
    #[arg(
        short = 'd',
        short_alias = 'i',
        long = "data",
        value_name = "DIR",
        default_value = "ftprobe.data"
    )]
    pub dir: PathBuf,
}

/// Records per ring that bound a poll's time window (replay).
const CHUNK: usize = 1 << 16;

/// A record of a ring file: rtype, aux, its payload in the ring's `words`.
struct Rec {
    rtype: u16,
    aux: u32,
    start: usize,
    len: usize,
}

pub struct Ring {
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

/// Parse a ring file of a recording of `format` (2: header words as in the rings, `len`
/// counting the header; 1: `rtype | payload words << 16 | aux << 32`).
fn load_ring(data: &[u8], format: u32) -> Result<Ring> {
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
        let (rtype, len) = if format == 1 {
            ((h & 0xffff) as u16, ((h >> 16) & 0xffff) as usize)
        } else {
            let len = (h & 0xffff) as usize;
            if len == 0 {
                bail!("a record at word {at} has no length");
            }
            (((h >> 16) & 0xffff) as u16, len - 1)
        };
        if at + 1 + len > words.len() {
            bail!("a record at word {at} runs past the end");
        }
        recs.push(Rec {
            rtype,
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
pub struct Recording {
    pub info: Info,
    /// By ring index (`None`: no file).
    rings: Vec<Option<Ring>>,
    /// The objects table, the paths those of the copies.
    objects: Vec<(u64, Vec<u8>)>,
    /// The current window's end: records with a timestamp up to it are handed out.
    until: u64,
}

impl Recording {
    pub fn open(dir: &std::path::Path) -> Result<Recording> {
        let path = dir.join("info.json");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {} (not a recording?)", path.display()))?;
        let info: Info =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        if info.format != FORMAT && info.format != 1 {
            bail!(
                "{}: format {} (this ftprobe reads 1 and {FORMAT})",
                path.display(),
                info.format
            );
        }
        let n = if info.format == 1 {
            info.claimed.min(info.nr_rings)
        } else {
            info.claimed
        } as usize;
        let mut rings = Vec::with_capacity(n);
        for i in 0..n {
            let Some(r) = info.rings.iter().find(|r| r.index as usize == i) else {
                rings.push(None);
                continue;
            };
            let file = dir.join(&r.file);
            let ring = match std::fs::read(&file) {
                Ok(data) => {
                    load_ring(&data, info.format).with_context(|| format!("{}", file.display()))?
                }
                // A ring with no record has no file.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && r.records == 0 => {
                    load_ring(&[], info.format)?
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
    pub fn next_window(&mut self) -> bool {
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
        self.rings.len() as u32
    }
    fn claimed(&self) -> u32 {
        self.rings.len() as u32
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
    fn lost_by_tid(&self) -> Vec<(u32, u64)> {
        self.info
            .lost_by_tid
            .iter()
            .map(|&[t, n]| (t as u32, n))
            .collect()
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

impl Ring {
    /// Its records in order: (rtype, aux, payload words).
    pub fn records(&self) -> impl Iterator<Item = (u16, u32, &[u64])> {
        self.recs
            .iter()
            .map(|r| (r.rtype, r.aux, &self.words[r.start..r.start + r.len]))
    }
}

/// A call rebuilt from function_graph records.
#[derive(Clone, Copy, Debug)]
pub struct Call {
    pub func: u64,
    /// Its entry, CLOCK_MONOTONIC ns.
    pub start_ns: u64,
    pub dur_ns: u64,
    /// `dur_ns` less its children's.
    pub self_ns: u64,
    /// It did not return: cut off (unwound, longjmp, lost) or still open at the end.
    pub cut: bool,
}

/// A frame of [`Recording::calls`]'s stack.
struct Frame {
    func: u64,
    start_ns: u64,
    child_ns: u64,
}

impl Recording {
    /// The rings, by index, that have records.
    pub fn rings(&self) -> impl Iterator<Item = (u32, &Ring)> {
        self.rings
            .iter()
            .enumerate()
            .filter_map(|(i, r)| Some((i as u32, r.as_ref()?)))
    }

    /// The kprobe events' definitions, by id.
    pub fn events(&self) -> Result<Vec<ProbeDef>> {
        let mut events = Vec::new();
        for defs in &self.info.events {
            let first = defs.first().context("an event with no definition")?;
            match trace_kprobe::check(first) {
                Ok(d) => events.push(d),
                Err(e) => bail!("recorded event {first:?}: {}", e.err.kind.name()),
            }
        }
        Ok(events)
    }

    /// A symbolizer over the recorded objects (their copies).
    pub fn symbols(&self) -> Symbols {
        Symbols::new(&self.objects)
    }

    /// The thread of ring `i`: its comm (lossy) and tid.
    pub fn thread(&self, i: u32) -> (String, u32) {
        let (comm, tid) = self.task(i).unwrap_or_default();
        (String::from_utf8_lossy(&comm).into_owned(), tid)
    }

    /// The calls of ring `i`'s thread, in the order they end: `f(call, callers)`, the callers
    /// outermost first.
    pub fn calls(&self, i: u32, mut f: impl FnMut(&Call, &[u64])) {
        let Some(Some(ring)) = self.rings.get(i as usize) else {
            return;
        };
        let clock = self.clock();
        let mut stack: Vec<Frame> = Vec::new();
        let mut funcs: Vec<u64> = Vec::new();
        let mut last_ns = 0;
        // Close the frames above `depth` at `end_ns` (cut), then hand out `call` if any.
        fn close(
            stack: &mut Vec<Frame>,
            funcs: &mut Vec<u64>,
            depth: usize,
            end_ns: u64,
            f: &mut impl FnMut(&Call, &[u64]),
        ) {
            while stack.len() > depth {
                let fr = stack.pop().expect("len > depth");
                funcs.pop();
                let dur_ns = end_ns.saturating_sub(fr.start_ns);
                let call = Call {
                    func: fr.func,
                    start_ns: fr.start_ns,
                    dur_ns,
                    self_ns: dur_ns.saturating_sub(fr.child_ns),
                    cut: true,
                };
                if let Some(p) = stack.last_mut() {
                    p.child_ns += dur_ns;
                }
                f(&call, funcs);
            }
        }
        for (rt, aux, w) in ring.records() {
            match rt {
                rtype::FGRAPH_ENT if w.len() >= 2 => {
                    let ns = clock.tsc_to_mono_ns(w[0]);
                    last_ns = last_ns.max(ns);
                    stack.push(Frame {
                        func: w[1],
                        start_ns: ns,
                        child_ns: 0,
                    });
                    funcs.push(w[1]);
                }
                rtype::FGRAPH_RET if w.len() >= 4 => {
                    let end_ns = clock.tsc_to_mono_ns(w[0]);
                    last_ns = last_ns.max(end_ns);
                    let start_ns = clock.tsc_to_mono_ns(w[2]);
                    let func = w[1];
                    // Its entry's frame; frames above it never returned (cut at this return).
                    let child_ns = match stack.iter().rposition(|fr| fr.func == func) {
                        Some(p) => {
                            close(&mut stack, &mut funcs, p + 1, end_ns, &mut f);
                            funcs.pop();
                            stack.pop().map_or(0, |fr| fr.child_ns)
                        }
                        // Its entry is not in the recording: a call under the open frames.
                        None => 0,
                    };
                    let dur_ns = end_ns.saturating_sub(start_ns);
                    let call = Call {
                        func,
                        start_ns,
                        dur_ns,
                        self_ns: dur_ns.saturating_sub(child_ns),
                        cut: Exit::from_aux(aux) != Exit::Returned,
                    };
                    if let Some(p) = stack.last_mut() {
                        p.child_ns += dur_ns;
                    }
                    f(&call, &funcs);
                }
                rtype::FUNC | rtype::KPROBE if !w.is_empty() => {
                    last_ns = last_ns.max(clock.tsc_to_mono_ns(w[0]));
                }
                _ => {}
            }
        }
        close(&mut stack, &mut funcs, 0, last_ns, &mut f);
    }
}
