//! `ftprobe report`: a recording ([`crate::recording`]) summed up per function, as
//! `uftrace report` does: for a function_graph recording, per function its calls, total
//! time (entry to return), self time (less its callees' time), and the average, minimum and
//! maximum of its total; for a function-tracer recording (entries only), calls per function;
//! for kprobe events, hits per event and, with `--hist ARG`, a log2 histogram of a numeric
//! fetch arg laid out as bpftrace's `hist()`.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use ftprobe::events::FetchType;
use ftprobe::record::Record;
use ftprobe::trace_kprobe::RecordDecoder;
use rustc_hash::FxHashMap;

use crate::output::open_output;
use crate::recording::{DataDir, Recording};
use crate::symbols::name_of;

/// Arguments of `ftprobe report`.
#[derive(Args)]
pub struct ReportArgs {
    #[command(flatten)]
    data: DataDir,
    /// Sort the functions by this column (largest first; `func`: by name).
    #[arg(short = 's', long = "sort", value_enum, default_value = "total")]
    sort: SortKey,
    /// One table per thread.
    #[arg(long)]
    task: bool,
    /// A log2 histogram of the kprobe events' fetch arg ARG (bpftrace's `hist()`).
    #[arg(long, value_name = "ARG")]
    hist: Option<String>,
    /// Write the report to FILE instead of standard output.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: Option<PathBuf>,
    #[command(flatten)]
    selection: crate::recording::Selection,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum SortKey {
    Total,
    #[value(name = "self")]
    SelfTime,
    Call,
    Avg,
    Func,
}

/// One function's line.
#[derive(Default, Clone)]
struct Stat {
    calls: u64,
    total: u64,
    self_ns: u64,
    min: u64,
    max: u64,
    /// Calls that did not return (counted with their time to the cut).
    cut: u64,
    /// Calls whose return was lost in a gap (`[LOST N EVENTS]`): their time is unknown,
    /// they are in no column.
    lost_return: u64,
}

impl Stat {
    /// One call of `dur` ns (`self_ns` of its own); `nested`: made while the same function
    /// was already on the thread's stack (a recursive call), whose time is already in the
    /// outer call's, so it adds to the calls and self time but not to the total, as
    /// uftrace's report.
    fn add(&mut self, dur: u64, self_ns: u64, cut: bool, nested: bool) {
        if self.calls == 0 || dur < self.min {
            self.min = dur;
        }
        self.max = self.max.max(dur);
        self.calls += 1;
        if !nested {
            self.total += dur;
        }
        self.self_ns += self_ns;
        self.cut += u64::from(cut);
    }
    fn avg(&self) -> u64 {
        self.total.checked_div(self.calls).unwrap_or(0)
    }
}

/// A time as uftrace prints one: three digits, three decimals and the unit (`  1.753 us`).
pub fn time(ns: u64) -> String {
    const UNITS: [&str; 4] = ["ns", "us", "ms", " s"];
    let (mut t, mut rem, mut unit) = (ns, 0, 0);
    while t >= 1000 && unit < UNITS.len() - 1 {
        rem = t % 1000;
        t /= 1000;
        unit += 1;
    }
    format!("{t:>3}.{rem:03} {}", UNITS[unit])
}

/// A report row's identity: a function of a file `(0, name, Some((file, function)))`, or
/// an address no symbol covers `(addr, name, None)` (see `Symbols::function_of`).
type Key = (u64, String, Option<(usize, usize)>);

/// The lines of `stats`, sorted by `key`.
fn sorted(mut v: Vec<(String, Stat)>, key: SortKey) -> Vec<(String, Stat)> {
    v.sort_by(|(na, a), (nb, b)| {
        let by = match key {
            SortKey::Total => b.total.cmp(&a.total),
            SortKey::SelfTime => b.self_ns.cmp(&a.self_ns),
            SortKey::Call => b.calls.cmp(&a.calls),
            SortKey::Avg => b.avg().cmp(&a.avg()),
            SortKey::Func => std::cmp::Ordering::Equal,
        };
        by.then_with(|| na.cmp(nb))
    });
    v
}

fn graph_table(o: &mut dyn Write, stats: Vec<(String, Stat)>, key: SortKey) -> Result<()> {
    writeln!(
        o,
        "  Total time   Self time       Calls     Average     Minimum     Maximum  Function"
    )?;
    writeln!(
        o,
        "  ==========  ==========  ==========  ==========  ==========  ==========  ===================="
    )?;
    let lines = sorted(stats, key);
    // A function whose every call lost its return has no line, only its note below.
    for (name, s) in lines.iter().filter(|(_, s)| s.calls > 0) {
        writeln!(
            o,
            "  {}  {}  {:>10}  {}  {}  {}  {name}",
            time(s.total),
            time(s.self_ns),
            s.calls,
            time(s.avg()),
            time(s.min),
            time(s.max)
        )?;
    }
    for (name, s) in &lines {
        if s.lost_return > 0 {
            writeln!(
                o,
                "# {name}: {} calls whose return was lost in a gap (not in the times above)",
                s.lost_return
            )?;
        }
        if s.cut > 0 {
            writeln!(
                o,
                "# {name}: {} of its calls did not return (cut off: counted to the cut)",
                s.cut
            )?;
        }
    }
    Ok(())
}

fn count_table(
    o: &mut dyn Write,
    col: &str,
    head: &str,
    stats: Vec<(String, Stat)>,
    key: SortKey,
) -> Result<()> {
    writeln!(o, "  {col:>10}  {head}")?;
    writeln!(o, "  ==========  ====================")?;
    // By count, largest first, unless sorted by name (there are no times to sort by).
    let key = if key == SortKey::Func {
        key
    } else {
        SortKey::Call
    };
    for (name, s) in sorted(stats, key) {
        writeln!(o, "  {:>10}  {name}", s.calls)?;
    }
    Ok(())
}

/// A bucket's bound as bpftrace labels it (`1K`, `2M`, ...).
fn bound(n: i128) -> String {
    const UNITS: [&str; 7] = ["", "K", "M", "G", "T", "P", "E"];
    let (mut n, mut u) = (n, 0);
    while n >= 1024 && n % 1024 == 0 && u < UNITS.len() - 1 {
        n /= 1024;
        u += 1;
    }
    format!("{n}{}", UNITS[u])
}

/// The buckets of a log2 histogram ([`hist`]).
pub const BUCKETS: usize = 2 + 128;

/// The bucket of `v`: 0 negative; 1 zero; 2 + k: [2^k, 2^(k+1)).
pub fn bucket(v: i128) -> usize {
    if v < 0 {
        0
    } else if v == 0 {
        1
    } else {
        2 + (127 - v.leading_zeros()) as usize
    }
}

/// bpftrace's log2 histogram of `values`: buckets `(..., 0)`, `[0]`, `[1]`, then `[2^k,
/// 2^(k+1))`, from the first non-empty bucket to the last, with a bar of up to 52 `@`.
#[cfg(test)]
pub fn hist(o: &mut dyn Write, title: &str, values: &[i128]) -> Result<()> {
    let mut counts = vec![0u64; BUCKETS];
    for &v in values {
        counts[bucket(v)] += 1;
    }
    hist_counts(o, title, &counts)
}

/// [`hist`] of the counts per bucket (the values themselves are not kept).
pub fn hist_counts(o: &mut dyn Write, title: &str, counts: &[u64]) -> Result<()> {
    writeln!(o, "@{title}:")?;
    let (Some(first), Some(last)) = (
        counts.iter().position(|&c| c > 0),
        counts.iter().rposition(|&c| c > 0),
    ) else {
        writeln!(o)?;
        return Ok(());
    };
    let max = *counts.iter().max().expect("not empty");
    for (b, &c) in counts.iter().enumerate().take(last + 1).skip(first) {
        let label = match b {
            0 => "(..., 0)".to_owned(),
            1 => "[0]".to_owned(),
            2 => "[1]".to_owned(),
            k => format!("[{}, {})", bound(1 << (k - 2)), bound(1 << (k - 1))),
        };
        let bar = "@".repeat((c * 52 / max) as usize);
        writeln!(o, "{label:<16}{c:>8} |{bar:<52}|")?;
    }
    Ok(())
}

/// Whether a fetch arg of type `ty` prints as a number (decimal or hex).
fn numeric(ty: &FetchType) -> bool {
    use FetchType::*;
    match ty {
        U8 | U16 | U32 | U64 | S8 | S16 | S32 | S64 | X8 | X16 | X32 | X64 => true,
        Bitfield { .. } => true,
        Char | String | Ustring | Symbol | Symstr | Array { .. } => false,
    }
}

/// A fetch arg's text as `trace` prints it, as a number (decimal, or `0x` hex).
fn number(text: &str) -> Option<i128> {
    match text.strip_prefix("0x") {
        Some(h) => i128::from_str_radix(h, 16).ok(),
        None => text.parse().ok(),
    }
}

/// Print the report; returns the exit code.
pub fn run(args: ReportArgs) -> Result<i32> {
    let mut rec = Recording::open_filtered(&args.data.dir, args.selection.filters())?;
    let events = rec.events()?;
    let decoders: Vec<Option<RecordDecoder>> = events.iter().map(RecordDecoder::new).collect();
    // Load times in CLOCK_MONOTONIC ns: a call is named among the objects loaded by its
    // entry (a library unloaded and another loaded at the same address each name their own).
    let mut syms = rec.symbols_by_ns();
    let mut out = open_output(args.output.as_ref())?;
    let o: &mut dyn Write = &mut out;
    let tracer = rec.info.tracer.clone();
    let tracer = tracer.as_str();
    if let Some(arg) = &args.hist {
        if !events.iter().any(|d| d.args.iter().any(|a| &a.name == arg)) {
            bail!("no recorded kprobe event has a fetch arg named {arg:?}");
        }
        // A histogram is of numbers: a string (or symbol, char, array) arg has none.
        if let Some(a) = events
            .iter()
            .flat_map(|d| &d.args)
            .find(|a| &a.name == arg && !numeric(&a.ty))
        {
            bail!(
                "fetch arg {arg:?} is not numeric (its type is {}): no histogram of it",
                a.ty.name().unwrap_or("an array")
            );
        }
    }
    // Per group (all threads, or one per thread): the function stats (by function: two
    // functions of the same name are two rows), the kprobe hits per event id, the hist
    // counts per bucket per event id.
    // A function is its address and its name: the name as the stream's process image gives
    // it (`--follow-exec`: two images may have different functions at one address).
    type Group = (String, FxHashMap<Key, Stat>, Vec<u64>, Vec<Vec<u64>>);
    let mut groups: Vec<Group> = Vec::new();
    let ring_ids: Vec<u32> = rec.ring_ids();
    for &i in &ring_ids {
        if groups.is_empty() || args.task {
            let (comm, tid) = rec.thread(i);
            groups.push((
                format!("# task {tid} ({comm})"),
                FxHashMap::default(),
                vec![0; events.len()],
                vec![vec![0; BUCKETS]; events.len()],
            ));
        }
        let (_, stats, hits, values) = groups.last_mut().expect("pushed");
        rec.select_stream(&mut syms, i);
        // This stream's function names, by view and address.
        // A row per function: one of a file (whatever its load's address), else one
        // address no symbol covers.
        let mut named: FxHashMap<(usize, u64), Key> = FxHashMap::default();
        let mut key = |syms: &mut crate::symbols::Symbols, f: u64| {
            named
                .entry((syms.view(), f))
                .or_insert_with(|| match syms.function_of(f) {
                    Some(func) => (0, name_of(syms, f), Some(func)),
                    None => (f, name_of(syms, f), None),
                })
                .clone()
        };
        if tracer == "function_graph" {
            let mut at = rec.stream_selector(i);
            rec.calls(i, |c, open| {
                at(&mut syms, c.start_ns);
                if c.lost_return {
                    // Its time is unknown: left out of the times, said below the table.
                    stats.entry(key(&mut syms, c.func)).or_default().lost_return += 1;
                    return;
                }
                let nested = open.contains(&c.func);
                stats
                    .entry(key(&mut syms, c.func))
                    .or_default()
                    .add(c.dur_ns, c.self_ns, c.cut, nested);
            })?;
            rec.select_stream(&mut syms, i);
        }
        let mut at = rec.stream_selector(i);
        let clock = crate::session::Source::clock(&rec);
        rec.for_each(i, &mut |rt, aux, w| match Record::decode(rt, aux, w) {
            Some(Record::Func { ip, ts, .. }) if tracer == "function" => {
                at(&mut syms, clock.tsc_to_mono_ns(ts));
                stats
                    .entry(key(&mut syms, ip))
                    .or_default()
                    .add(0, 0, false, false);
            }
            Some(Record::Kprobe { event, words, .. }) => {
                let id = event as usize;
                let Some(def) = events.get(id) else { return };
                hits[id] += 1;
                if let Some(arg) = &args.hist {
                    let dec = decoders.get(id).and_then(Option::as_ref);
                    let v = crate::output::kprobe_args(def, dec, words, &mut syms)
                        .into_iter()
                        .find(|(n, _)| n == arg)
                        .and_then(|(_, t)| number(&t));
                    if let Some(v) = v {
                        values[id][bucket(v)] += 1;
                    }
                }
            }
            _ => {}
        })?;
    }
    let dir = args.data.dir.display();
    writeln!(o, "# ftprobe report of {dir} ({tracer})")?;
    // What the numbers below miss, first, so that they are never silently low.
    // Saturating: a damaged recording's counts may be anything.
    let lost: u64 = rec
        .info
        .rings
        .iter()
        .map(|r| r.lost)
        .chain([rec.info.lost_no_ring, rec.info.lost_recursion])
        .fold(0, u64::saturating_add);
    if lost > 0 {
        writeln!(o, "# {lost} events lost: the numbers below miss them")?;
    }
    if rec.info.fgraph_overrun > 0 {
        writeln!(
            o,
            "# {} calls not hooked (the shadow stack was full): the numbers below miss them",
            rec.info.fgraph_overrun
        )?;
    }
    for (title, stats, hits, values) in groups {
        if args.task {
            writeln!(o, "{title}")?;
        }
        // Functions of two files with one name (two libraries loaded one after the other,
        // maybe at one address) are two rows, each named with its file, as perf report's
        // Shared Object column tells them apart.
        let mut files_of: FxHashMap<&str, Vec<usize>> = FxHashMap::default();
        for (_, name, func) in stats.keys() {
            let v = files_of.entry(name.as_str()).or_default();
            if let Some((file, _)) = func {
                if !v.contains(file) {
                    v.push(*file);
                }
            }
        }
        let shared: Vec<String> = files_of
            .into_iter()
            .filter(|(_, v)| v.len() > 1)
            .map(|(n, _)| n.to_owned())
            .collect();
        let stats: Vec<(String, Stat)> = stats
            .into_iter()
            .map(|((_, name, func), s)| match func {
                Some((f, _)) if shared.contains(&name) => {
                    // The object's own file name (the recording holds a copy named after
                    // its build-id).
                    let copy = syms.file_path(f);
                    let file = rec
                        .info
                        .objects
                        .iter()
                        .find(|o| o.copy.as_deref().is_some_and(|c| copy.ends_with(c)))
                        .map_or_else(|| copy.to_string_lossy().into_owned(), |o| o.path.clone());
                    let file = file.rsplit('/').next().unwrap_or(&file).to_owned();
                    (format!("{name} [{file}]"), s)
                }
                _ => (name, s),
            })
            .collect();
        match tracer {
            "function_graph" => graph_table(o, stats, args.sort)?,
            "function" => count_table(o, "Calls", "Function", stats, args.sort)?,
            _ => {}
        }
        if !events.is_empty() {
            let ev: Vec<(String, Stat)> = events
                .iter()
                .zip(&hits)
                .map(|(d, &n)| {
                    (
                        d.event.clone(),
                        Stat {
                            calls: n,
                            ..Stat::default()
                        },
                    )
                })
                .collect();
            if tracer != "nop" {
                writeln!(o)?;
            }
            count_table(o, "Hits", "Event", ev, args.sort)?;
            if let Some(arg) = &args.hist {
                for (d, v) in events.iter().zip(&values) {
                    if d.args.iter().any(|a| &a.name == arg) {
                        writeln!(o)?;
                        hist_counts(o, &format!("{}.{arg}", d.event), v)?;
                    }
                }
            }
        }
        writeln!(o)?;
    }
    if !args.task {
        for (id, d) in events.iter().enumerate() {
            let (dropped, _) = rec
                .info
                .event_counters
                .get(id)
                .map_or((0, 0), |c| (c[0], c[1]));
            if dropped > 0 {
                writeln!(
                    o,
                    "# {}: {dropped} more hits not recorded (ring full)",
                    d.event
                )?;
            }
        }
    }
    out.flush()?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::{hist, time};

    #[test]
    fn times_as_uftrace_prints_them() {
        assert_eq!(time(350), "350.000 ns");
        assert_eq!(time(1753), "  1.753 us");
        assert_eq!(time(10_293_000), " 10.293 ms");
        assert_eq!(time(2_500_000_000), "  2.500  s");
    }

    #[test]
    fn hist_buckets_as_bpftrace() {
        let mut out = Vec::new();
        hist(&mut out, "x", &[0, 1, 2, 3, 5, 1024, 1500, -4]).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "@x:");
        assert!(
            lines[1].starts_with("(..., 0)               1 |@"),
            "{text}"
        );
        assert!(lines[2].starts_with("[0]                    1 |"), "{text}");
        assert!(lines[4].starts_with("[2, 4)                 2 |"), "{text}");
        assert!(lines[5].starts_with("[4, 8)                 1 |"), "{text}");
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("[1K, 2K)               2 |")),
            "{text}"
        );
        // The largest bucket's bar is 52 wide.
        assert!(text.contains(&format!("|{}|", "@".repeat(52))), "{text}");
    }
}
