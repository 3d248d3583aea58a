//! What the readers of a recording keep of it (`replay`, `report`, `dump`): threads
//! (`--tid`), a time range (`--time-range A~B`, uftrace's syntax), and for `replay` function
//! globs (`-F`, `-N`), `--max-depth` and `--min-duration` (uftrace's `-t`).
//!
//! Filters work per thread, on its records in order ([`ThreadFilter`]), before the threads
//! are merged, so that the function_graph layout sees the records a tracer with the same
//! filter would have written (a call whose callees are all hidden is a leaf, `func();`).
//! Their state is bounded: a depth or two, and for `--min-duration` the calls not yet known
//! to be long enough (at most the thread's depth, and the kprobe events inside them).

use std::path::PathBuf;
use std::str::FromStr;

use ftprobe::elf::ElfImage;
use ftprobe::ftrace::glob::{self, FilterEntry};
use ftprobe::record::{self, depth_of, rtype, Record};
use ftprobe::ring::Clock;
use rustc_hash::FxHashMap;

use crate::symbols::Symbols;

/// A point of `--time-range`: a timestamp as printed (`SECONDS.MICROS`), or a time with a
/// unit (`ns`, `us`, `ms`, `s`) after the recording's first record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimePoint {
    Abs(u64),
    Rel(u64),
}

/// `A~B`, either side may be empty.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimeRange {
    pub from: Option<TimePoint>,
    pub to: Option<TimePoint>,
}

/// A duration with a unit: `10us`, `1.5ms`, `2s`, `300ns` (no unit: ns).
pub fn parse_duration(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let mult: f64 = match unit {
        "" | "ns" => 1.0,
        "us" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        "m" => 60e9,
        _ => return Err(format!("unknown unit {unit:?} (ns, us, ms, s, m)")),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a number with a unit (e.g. 10us)"))?;
    let ns = (v * mult).round();
    // Checked: `as u64` would silently saturate a huge value at u64::MAX.
    if !(0.0..u64::MAX as f64).contains(&ns) {
        return Err(format!("{s:?} is too large (at most about 584 years)"));
    }
    Ok(ns as u64)
}

fn parse_point(s: &str) -> Result<Option<TimePoint>, String> {
    let s = s.trim();
    if s.is_empty() {
        return Ok(None);
    }
    if s.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        // As `trace` prints it: seconds and microseconds (more decimals are taken too).
        let (sec, frac) = s.split_once('.').unwrap_or((s, ""));
        let sec: u64 = sec
            .parse()
            .map_err(|_| format!("{s:?} is not a timestamp (SECONDS.MICROS as printed)"))?;
        if frac.len() > 9 {
            return Err(format!("{s:?}: at most 9 decimals"));
        }
        let frac_ns: u64 = if frac.is_empty() {
            0
        } else {
            format!("{frac:0<9}")
                .parse()
                .map_err(|_| format!("{s:?}"))?
        };
        let ns = sec
            .checked_mul(1_000_000_000)
            .and_then(|n| n.checked_add(frac_ns))
            .ok_or_else(|| format!("{s:?} is too large a timestamp"))?;
        return Ok(Some(TimePoint::Abs(ns)));
    }
    parse_duration(s).map(|ns| Some(TimePoint::Rel(ns)))
}

impl FromStr for TimeRange {
    type Err = String;
    fn from_str(s: &str) -> Result<TimeRange, String> {
        let (a, b) = s
            .split_once('~')
            .ok_or_else(|| "expected START~END (either side may be empty)".to_owned())?;
        let r = TimeRange {
            from: parse_point(a)?,
            to: parse_point(b)?,
        };
        if r.from.is_none() && r.to.is_none() {
            return Err("an empty range: give START, END or both".to_owned());
        }
        match (r.from, r.to) {
            (Some(TimePoint::Abs(_)), Some(TimePoint::Rel(_)))
            | (Some(TimePoint::Rel(_)), Some(TimePoint::Abs(_))) => Err(
                "START and END mix a timestamp (SECONDS.MICROS, as printed) and a time after \
                 the first record (with a unit, e.g. 10ms): give both in one form"
                    .to_owned(),
            ),
            (Some(TimePoint::Abs(a)), Some(TimePoint::Abs(b)))
            | (Some(TimePoint::Rel(a)), Some(TimePoint::Rel(b)))
                if a > b =>
            {
                Err("START is after END".to_owned())
            }
            _ => Ok(r),
        }
    }
}

/// `--tid TID[,TID]`.
pub fn parse_tids(s: &str) -> Result<Vec<u32>, String> {
    s.split(',')
        .map(|t| {
            t.trim()
                .parse::<u32>()
                .map_err(|_| format!("{t:?} is not a thread id"))
        })
        .collect()
}

/// A function glob of `-F`/`-N` (`set_ftrace_filter` syntax, without `:mod:`), checked by
/// clap.
pub fn parse_glob(s: &str) -> Result<FilterEntry, String> {
    if s.contains(":mod:") {
        return Err("a function glob here: `:mod:` is for trace and record".to_owned());
    }
    FilterEntry::parse(s).map_err(|e| e.to_string())
}

/// The filters of one reading of a recording.
#[derive(Clone, Default)]
pub struct Filters {
    /// Only these threads (empty: all).
    pub tids: Vec<u32>,
    pub range: Option<TimeRange>,
    pub filter: Vec<FilterEntry>,
    pub notrace: Vec<FilterEntry>,
    /// function_graph: only calls down to this depth (0: no limit).
    pub max_depth: u32,
    /// function_graph: hide calls shorter than this (ns).
    pub min_duration_ns: u64,
}

impl Filters {
    /// Whether the records of thread `tid` are read at all.
    pub fn thread(&self, tid: u32) -> bool {
        self.tids.is_empty() || self.tids.contains(&tid)
    }

    /// The time range in CLOCK_MONOTONIC ns, `start_ns` being the recording's first record.
    pub fn range_ns(&self, start_ns: u64) -> (u64, u64) {
        let ns = |p: TimePoint| match p {
            TimePoint::Abs(n) => n,
            TimePoint::Rel(n) => start_ns.saturating_add(n),
        };
        match self.range {
            None => (0, u64::MAX),
            Some(r) => (
                r.from.map_or(0, ns),
                // `B` as printed covers its whole microsecond.
                r.to.map_or(u64::MAX, |p| match p {
                    TimePoint::Abs(n) => n.saturating_add(999),
                    TimePoint::Rel(n) => start_ns.saturating_add(n),
                }),
            ),
        }
    }

    fn by_name(&self) -> bool {
        !self.filter.is_empty() || !self.notrace.is_empty()
    }
}

/// Whether functions pass `-F` and `-N`, by address (cached), with `set_ftrace_filter`'s
/// rules as `trace` applies them ([`ftprobe::ftrace::glob`]): in order, a match adds, a `!`
/// match removes; a filter that selects no function with an ftrace site (`-F foo -F '!foo'`,
/// `-F '!foo'`) means every function.
pub struct Names {
    /// None: no -F/-N (nothing is looked up).
    syms: Option<Symbols>,
    /// `-F` selects no function of the recording's objects: every function passes.
    filter_all: bool,
    /// By symbolizer view (the objects loaded when the record was written) and address.
    cache: FxHashMap<(usize, u64), (bool, bool)>,
}

impl Names {
    pub fn new(syms: Option<Symbols>) -> Names {
        Names {
            syms,
            filter_all: false,
            cache: FxHashMap::default(),
        }
    }

    /// The names of a recording read through `f`: the functions with an ftrace site in its
    /// objects (`objects`: bias and path, as recorded) are those `trace` would have filtered.
    /// A pattern (not `!`) that matches none of them is refused, as `trace` refuses it (the
    /// kernel's EINVAL).
    pub fn with_filters(
        syms: Symbols,
        objects: &[(u64, Vec<u8>)],
        f: &Filters,
    ) -> Result<Names, String> {
        let images: Vec<ElfImage> = objects
            .iter()
            .filter_map(|(_, p)| {
                let path = PathBuf::from(String::from_utf8_lossy(p).into_owned());
                ElfImage::open(&path).ok()
            })
            .collect();
        // Each function with a site: (symbol, shown name).
        let mut funcs: Vec<(&str, String)> = Vec::new();
        for img in &images {
            let mut last = usize::MAX;
            for site in &img.sites {
                if site.func != last {
                    last = site.func;
                    let sym = img.funcs()[site.func].name.as_str();
                    funcs.push((sym, ftprobe::elf::display_name(sym)));
                }
            }
        }
        for (opt, list) in [("-F", &f.filter), ("-N", &f.notrace)] {
            if let Some(e) = list.iter().find(|e| {
                !e.negate
                    && !funcs
                        .iter()
                        .any(|(sym, shown)| e.matches_function(sym, shown, ""))
            }) {
                return Err(format!(
                    "{opt} {:?}: no function with an ftrace site in the recording matches it \
                     (trace refuses it: EINVAL, as the kernel's set_ftrace_filter)",
                    e.text
                ));
            }
        }
        let filter_all = !funcs
            .iter()
            .any(|(sym, shown)| glob::in_set(&f.filter, |e| e.matches_function(sym, shown, "")));
        Ok(Names {
            syms: Some(syms),
            filter_all,
            cache: FxHashMap::default(),
        })
    }

    /// (matches -F, matches -N) for the function at `addr` in a record of process `pid`
    /// written at `tsc` (raw TSC; `None`: a record without one, named in the last view): a
    /// library loaded where an unloaded one was names only the records written after its
    /// load, in `replay -F` as in `replay`'s lines.
    fn check(&mut self, f: &Filters, pid: u32, tsc: Option<u64>, addr: u64) -> (bool, bool) {
        let all = f.filter.is_empty() || self.filter_all;
        let Some(syms) = self.syms.as_mut() else {
            return (all, false);
        };
        if let Some(tsc) = tsc {
            syms.select(pid, tsc);
        }
        let key = (syms.view(), addr);
        if let Some(&v) = self.cache.get(&key) {
            return v;
        }
        let v = match syms.names_at(addr) {
            Some((sym, shown)) => (
                all || glob::in_set(&f.filter, |e| e.matches_function(sym, &shown, "")),
                glob::in_set(&f.notrace, |e| e.matches_function(sym, &shown, "")),
            ),
            // No symbol: named by its address, which no pattern matches.
            None => (all, false),
        };
        self.cache.insert(key, v);
        v
    }

    /// Whether `-F` lets every function through (none given, or it selects none).
    fn filter_all(&self, f: &Filters) -> bool {
        f.filter.is_empty() || self.filter_all
    }
}

/// A record on its way through a [`ThreadFilter`].
type Owned = (u16, u32, Vec<u64>);

/// The per-thread state of the filters.
#[derive(Default)]
pub struct ThreadFilter {
    /// function_graph -F: the depth of the matching call the thread is in.
    region: Option<u32>,
    /// function_graph -N: the depth of the hidden call the thread is in.
    hidden: Option<u32>,
    /// --min-duration: calls not yet known to be long enough (entries), and the kprobe
    /// events inside them, oldest first.
    pending: Vec<Owned>,
    /// A record past the end of the time range was seen: the thread went on after it (its
    /// calls still open then are cut at the range's end, not at its last record in it).
    pub past_range: bool,
}

/// What [`ThreadFilter::push`] needs besides the record.
pub struct Ctx<'a> {
    pub filters: &'a Filters,
    pub names: &'a mut Names,
    pub clock: &'a Clock,
    pub graph: bool,
    /// The time range, CLOCK_MONOTONIC ns.
    pub range: (u64, u64),
    /// The process whose records these are (the objects its image had when each was
    /// written name them).
    pub pid: u32,
}

impl ThreadFilter {
    /// Take one record of the thread, hand on what is kept (in order) to `out`.
    pub fn push(
        &mut self,
        cx: &mut Ctx<'_>,
        rt: u16,
        mut aux: u32,
        w: &[u64],
        out: &mut dyn FnMut(u16, u32, &[u64]),
    ) {
        let f = cx.filters;
        if let Some(ts) = record::timestamp(rt, w) {
            let ns = cx.clock.tsc_to_mono_ns(ts);
            if ns > cx.range.1 {
                self.past_range = true;
                return;
            }
            if ns < cx.range.0 {
                return;
            }
        }
        if f.by_name() {
            if cx.graph {
                match self.graph_names(cx, rt, aux, w) {
                    Some(a) => aux = a,
                    None => return,
                }
            } else if let Some(Record::Func { ip: addr, .. } | Record::Kprobe { addr, .. }) =
                Record::decode(rt, aux, w)
            {
                let (inf, inn) = cx.names.check(f, cx.pid, record::timestamp(rt, w), addr);
                if !inf || inn {
                    return;
                }
            }
        }
        if cx.graph
            && f.max_depth > 0
            && matches!(rt, rtype::FGRAPH_ENT | rtype::FGRAPH_RET)
            && depth_of(aux) >= f.max_depth
        {
            return;
        }
        if cx.graph && f.min_duration_ns > 0 {
            self.min_duration(cx, rt, aux, w, out);
        } else {
            out(rt, aux, w);
        }
    }

    /// function_graph -F/-N: `None` to drop the record, else its aux (the depth made
    /// relative to the -F call).
    fn graph_names(&mut self, cx: &mut Ctx<'_>, rt: u16, aux: u32, w: &[u64]) -> Option<u32> {
        let f = cx.filters;
        let d = depth_of(aux);
        match Record::decode(rt, aux, w) {
            Some(Record::GraphEntry { func, .. }) => {
                if let Some(h) = self.hidden {
                    if d > h {
                        return None;
                    }
                    // Its return was never seen: the hidden call is over.
                    self.hidden = None;
                }
                if self.region.is_some_and(|b| d <= b) {
                    self.region = None;
                }
                let (inf, inn) = cx.names.check(f, cx.pid, record::timestamp(rt, w), func);
                if inn {
                    self.hidden = Some(d);
                    return None;
                }
                if !cx.names.filter_all(f) && self.region.is_none() {
                    if !inf {
                        return None;
                    }
                    self.region = Some(d);
                }
            }
            Some(Record::GraphReturn { .. }) => {
                if let Some(h) = self.hidden {
                    if d >= h {
                        if d == h {
                            self.hidden = None;
                        }
                        return None;
                    }
                    self.hidden = None;
                }
                if !cx.names.filter_all(f) {
                    let b = self.region?;
                    if d < b {
                        self.region = None;
                        return None;
                    }
                    if d == b {
                        self.region = None;
                    }
                    return Some(record::with_depth(aux, d - b));
                }
            }
            _ if rt == rtype::KPROBE
                && (self.hidden.is_some()
                    || (!cx.names.filter_all(f) && self.region.is_none())) =>
            {
                return None;
            }
            _ => {}
        }
        Some(match self.region {
            Some(b) if matches!(rt, rtype::FGRAPH_ENT | rtype::FGRAPH_RET) => {
                record::with_depth(aux, d.saturating_sub(b))
            }
            _ => aux,
        })
    }

    /// --min-duration: hold an entry until its call is known to be long enough (its
    /// return says so, or the thread's records went on past the duration); a short call
    /// is dropped with its entry, a long one handed on with everything kept inside it.
    fn min_duration(
        &mut self,
        cx: &mut Ctx<'_>,
        rt: u16,
        aux: u32,
        w: &[u64],
        out: &mut dyn FnMut(u16, u32, &[u64]),
    ) {
        let min = cx.filters.min_duration_ns;
        if let Some(ts) = record::timestamp(rt, w) {
            let now = cx.clock.tsc_to_mono_ns(ts);
            // The innermost pending entry at least `min` old: it and the calls around it
            // are long enough, with the events before the next pending entry.
            let old = self.pending.iter().rposition(|(t, a, pw)| {
                matches!(Record::decode(*t, *a, pw), Some(Record::GraphEntry { ts, .. })
                    if now.saturating_sub(cx.clock.tsc_to_mono_ns(ts)) >= min)
            });
            if let Some(k) = old {
                let end = self.pending[k + 1..]
                    .iter()
                    .position(|(t, _, _)| *t == rtype::FGRAPH_ENT)
                    .map_or(self.pending.len(), |p| k + 1 + p);
                for (t, a, pw) in self.pending.drain(..end) {
                    out(t, a, &pw);
                }
            }
        }
        match Record::decode(rt, aux, w) {
            Some(Record::GraphEntry { .. }) => self.pending.push((rt, aux, w.to_vec())),
            Some(Record::GraphReturn {
                ts,
                func,
                calltime,
                depth: d,
                ..
            }) => {
                // Entries deeper than this return never returned: short, dropped.
                while let Some(p) = self
                    .pending
                    .iter()
                    .rposition(|(t, a, _)| *t == rtype::FGRAPH_ENT && depth_of(*a) > d)
                {
                    self.pending.remove(p);
                }
                let open = self.pending.iter().rposition(|(t, a, pw)| {
                    matches!(Record::decode(*t, *a, pw),
                        Some(Record::GraphEntry { func: f, depth, .. }) if depth == d && f == func)
                });
                if let Some(p) = open {
                    // Still pending, so shorter than `min`: dropped with its entry (the
                    // events inside stay, inside the call around it).
                    self.pending.remove(p);
                    return;
                }
                let dur = cx
                    .clock
                    .tsc_to_mono_ns(ts)
                    .saturating_sub(cx.clock.tsc_to_mono_ns(calltime));
                if dur >= min {
                    out(rt, aux, w);
                }
            }
            _ if self.pending.is_empty() => out(rt, aux, w),
            _ => self.pending.push((rt, aux, w.to_vec())),
        }
    }

    /// The thread has no more records: hand on what is held (calls still open at the end
    /// are kept, as their length is not known).
    pub fn finish(&mut self, out: &mut dyn FnMut(u16, u32, &[u64])) {
        for (t, a, w) in self.pending.drain(..) {
            out(t, a, &w);
        }
        self.region = None;
        self.hidden = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Push `recs` (rtype, depth, words) through a filter with `filters`; what comes out,
    /// as (rtype, depth, first payload words).
    fn run(filters: &Filters, recs: &[(u16, u32, Vec<u64>)]) -> Vec<(u16, u32, u64)> {
        // One TSC tick per ns.
        let clock = Clock::from_parts([0, 0, 1 << 32]);
        let mut names = Names::new(None);
        let mut cx = Ctx {
            filters,
            names: &mut names,
            clock: &clock,
            graph: true,
            range: filters.range_ns(0),
            pid: 1,
        };
        let mut f = ThreadFilter::default();
        let mut out = Vec::new();
        let mut sink = |rt: u16, aux: u32, w: &[u64]| out.push((rt, depth_of(aux), w[0]));
        for (rt, d, w) in recs {
            f.push(&mut cx, *rt, d << 16, w, &mut sink);
        }
        f.finish(&mut sink);
        out
    }

    #[test]
    fn min_duration_drops_short_calls_and_keeps_the_events_inside_them() {
        let (ent, ret, kp) = (rtype::FGRAPH_ENT, rtype::FGRAPH_RET, rtype::KPROBE);
        let recs = vec![
            (ent, 0, vec![0, 0xa]),
            (ent, 1, vec![10, 0xb]),
            (kp, 0, vec![15, 0x1]),
            (ret, 1, vec![20, 0xb, 10, 0]),
            (ent, 1, vec![30, 0xc]),
            (ret, 1, vec![500, 0xc, 30, 0]),
            (ret, 0, vec![1000, 0xa, 0, 0]),
            // Still open at the end: kept.
            (ent, 0, vec![2000, 0xd]),
        ];
        let f = Filters {
            min_duration_ns: 100,
            ..Filters::default()
        };
        assert_eq!(
            run(&f, &recs),
            vec![
                (ent, 0, 0),
                (kp, 0, 15),
                (ent, 1, 30),
                (ret, 1, 500),
                (ret, 0, 1000),
                (ent, 0, 2000),
            ]
        );
        // The time range cuts by timestamp; max-depth by depth.
        let f = Filters {
            range: Some("10ns~600ns".parse().unwrap()),
            max_depth: 1,
            ..Filters::default()
        };
        assert_eq!(run(&f, &recs), vec![(kp, 0, 15)]);
    }

    #[test]
    fn time_ranges_as_uftrace_writes_them() {
        let r: TimeRange = "11439.845101~11439.9".parse().unwrap();
        assert_eq!(r.from, Some(TimePoint::Abs(11_439_845_101_000)));
        assert_eq!(r.to, Some(TimePoint::Abs(11_439_900_000_000)));
        let r: TimeRange = "10ms~".parse().unwrap();
        assert_eq!(r.from, Some(TimePoint::Rel(10_000_000)));
        assert_eq!(r.to, None);
        let r: TimeRange = "~1.5s".parse().unwrap();
        assert_eq!(r.to, Some(TimePoint::Rel(1_500_000_000)));
        assert!("10ms".parse::<TimeRange>().is_err());
        assert!("~".parse::<TimeRange>().is_err());
        assert!("10xs~".parse::<TimeRange>().is_err());
        assert!("20ms~10ms".parse::<TimeRange>().is_err());
        assert!("5.2~5.1".parse::<TimeRange>().is_err());
        assert_eq!(parse_duration("10us"), Ok(10_000));
        assert_eq!(parse_duration("250"), Ok(250));
        assert!(parse_duration("us").is_err());
        // Mixed forms are refused, not read as one of them.
        let mixed = "11439.845101~10ms".parse::<TimeRange>().unwrap_err();
        assert!(mixed.contains("mix a timestamp"), "{mixed}");
        assert!("10ms~11439.9".parse::<TimeRange>().is_err());
        // Huge values are errors, never a silent overflow or saturation.
        assert!("99999999999999999999.5~".parse::<TimeRange>().is_err());
        assert!("18446744073.709551616~".parse::<TimeRange>().is_err());
        assert!(parse_duration("99999999999999999999s").is_err());
        assert!(parse_duration("18446744073709551616").is_err());
        assert_eq!(parse_duration("1.5ms"), Ok(1_500_000));
        assert_eq!(parse_tids("12,34"), Ok(vec![12, 34]));
        assert!(parse_tids("12,x").is_err());
    }
}
