//! The `function_graph` tracer's text layout, as the kernel prints its `trace` file
//! (kernel/trace/trace_functions_graph.c; duration marks from trace_output.c,
//! `trace_find_mark()`):
//!
//! ```text
//! # tracer: function_graph
//! #
//! # CPU  DURATION                  FUNCTION CALLS
//! # |     |   |                     |   |   |   |
//!  1)               |  main() {
//!  1)   0.120 us    |    leaf();
//!  1) + 12.400 us   |  }
//! ```
//!
//! Per line: the CPU (`funcgraph-cpu`, on), the thread (`funcgraph-proc`: `comm-pid`
//! centred in 14 columns, then ` | `; on by itself once a second thread records), the
//! duration with its mark (`funcgraph-duration`, `funcgraph-overhead`: `+` > 10 us, `!` >
//! 100 us, `#` > 1 ms, `*` > 10 ms, `@` > 100 ms, `$` > 1 s), then the call indented two
//! columns per depth. A call whose return is the thread's next record is a leaf on one line,
//! `func();`; otherwise `func() {` and, on its return, `}` with the duration. The closing
//! line names the function (`} /* func */`) when its entry is not the one open at that depth
//! (lost or filtered), always with `funcgraph-tail`. `funcgraph-retval` adds the return
//! value (`/* ret=0x2a */`, or `ret=-22` when it looks like an error code, as the kernel's
//! `print_graph_retval()`). A pid change on a CPU prints the kernel's context-switch banner.
//!
//! ftprobe's own addition: a call that never returned, because its frame was unwound by an
//! exception, left by `longjmp`, or found gone, is closed where that was seen, marked
//! `} /* func: unwound */`, `/* func: longjmp */` or `/* func: lost */`. After a gap in a
//! thread's records (`COMM-TID [LOST N EVENTS]`, printed by the caller), the calls that the
//! thread's next record shows gone (open at its depth or deeper) returned in the gap: they
//! are closed before that record's line as `} /* func: return lost */`, with no duration
//! (it is unknown).

use std::collections::HashMap;

use ftprobe::ftrace::fgraph::FgraphExit;

use crate::symbols::Symbols;

/// How a call ended (the engine's `FgraphExit`, in the return record's `aux`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    Returned,
    Unwound,
    Longjmp,
    Lost,
}

impl From<FgraphExit> for Exit {
    fn from(e: FgraphExit) -> Exit {
        match e {
            FgraphExit::Returned => Exit::Returned,
            FgraphExit::Unwound => Exit::Unwound,
            FgraphExit::Longjmp => Exit::Longjmp,
            FgraphExit::Lost => Exit::Lost,
        }
    }
}

impl Exit {
    fn mark(self) -> &'static str {
        match self {
            Exit::Returned => "",
            Exit::Unwound => ": unwound",
            Exit::Longjmp => ": longjmp",
            Exit::Lost => ": lost",
        }
    }
}

/// The tracer's options (`trace_options` of the function_graph tracer).
#[derive(Clone, Copy, Debug)]
pub struct Options {
    pub cpu: bool,
    /// `None`: on once a second thread records.
    pub proc_: Option<bool>,
    pub duration: bool,
    pub overhead: bool,
    pub retval: bool,
    pub retval_hex: bool,
    pub tail: bool,
    /// `funcgraph-abstime`: each line starts with its record's timestamp, as the function
    /// tracer prints it (`SECONDS.MICROS`).
    pub abstime: bool,
}

impl Default for Options {
    fn default() -> Options {
        // The kernel's defaults: CPU, overhead, duration.
        Options {
            cpu: true,
            proc_: None,
            duration: true,
            overhead: true,
            retval: false,
            retval_hex: false,
            tail: false,
            abstime: false,
        }
    }
}

impl Options {
    /// Apply one `-O` option: `funcgraph-X` or `nofuncgraph-X`.
    pub fn set(&mut self, opt: &str) -> Result<(), String> {
        let (on, name) = match opt.strip_prefix("no") {
            Some(n) => (false, n),
            None => (true, opt),
        };
        match name {
            "funcgraph-cpu" => self.cpu = on,
            "funcgraph-proc" => self.proc_ = Some(on),
            "funcgraph-duration" => self.duration = on,
            "funcgraph-overhead" => self.overhead = on,
            "funcgraph-retval" => self.retval = on,
            "funcgraph-retval-hex" => self.retval_hex = on,
            "funcgraph-tail" => self.tail = on,
            "funcgraph-abstime" => self.abstime = on,
            _ => {
                return Err(format!(
                    "unknown option {opt:?} (function_graph options: funcgraph-cpu, \
                     funcgraph-proc, funcgraph-duration, funcgraph-overhead, \
                     funcgraph-retval, funcgraph-retval-hex, funcgraph-tail, funcgraph-abstime; \
                     `no` before one \
                     turns it off)"
                ))
            }
        }
        Ok(())
    }
}

/// Who a line is about.
#[derive(Clone, Copy)]
pub struct Ctx<'a> {
    pub cpu: u32,
    /// The record's timestamp (CLOCK_MONOTONIC ns), for `funcgraph-abstime`: an entry's
    /// (also on a leaf's line), a return's, an event's.
    pub ts_ns: u64,
    pub pid: u32,
    pub comm: &'a [u8],
}

#[derive(Default)]
struct Thread {
    /// The function open at each depth (`enter_funcs`), 0 when none.
    open: Vec<u64>,
    /// Where comments (kprobe events) indent, as the kernel's per-CPU `depth`.
    depth: i64,
    /// A gap (lost events) came since the thread's last line.
    gap: bool,
}

/// The printer's state across polls.
pub struct Graph {
    pub opts: Options,
    proc_on: bool,
    cpu_width: usize,
    last_pid: HashMap<u32, u32>,
    threads: HashMap<u32, Thread>,
    /// Each thread's comm, for the context-switch banner.
    comms: HashMap<u32, Vec<u8>>,
    /// The column header is out.
    header_done: bool,
}

/// `trace_find_mark()`: the mark for a duration in ns.
pub fn mark(ns: u64) -> u8 {
    match ns {
        n if n > 1_000_000_000 => b'$',
        n if n > 100_000_000 => b'@',
        n if n > 10_000_000 => b'*',
        n if n > 1_000_000 => b'#',
        n if n > 100_000 => b'!',
        n if n > 10_000 => b'+',
        _ => b' ',
    }
}

/// `trace_print_graph_duration()`: microseconds with up to three decimals, seven digits in
/// all at most, then ` us `, padded to 8 columns before it.
pub fn push_duration(out: &mut Vec<u8>, ns: u64) {
    let us = (ns / 1000).to_string();
    out.extend_from_slice(us.as_bytes());
    let mut len = us.len();
    if len < 7 {
        // The kernel's snprintf into min(5, 8 - len) bytes: at most 3 digits, fewer as the
        // integer part grows.
        let digits = (8 - len).min(5) - 1;
        let frac = format!("{:03}", ns % 1000);
        let frac = &frac[..digits.min(frac.len())];
        out.push(b'.');
        out.extend_from_slice(frac.as_bytes());
        len += frac.len() + 1;
    }
    out.extend_from_slice(b" us ");
    out.extend(std::iter::repeat_n(b' ', 8usize.saturating_sub(len)));
}

impl Graph {
    pub fn new(opts: Options, ncpus: u32) -> Graph {
        Graph {
            opts,
            proc_on: opts.proc_.unwrap_or(false),
            cpu_width: ncpus.saturating_sub(1).to_string().len(),
            last_pid: HashMap::new(),
            threads: HashMap::new(),
            comms: HashMap::new(),
            header_done: false,
        }
    }

    /// Thread `pid` ended and all its lines are out: forget its state. The comms kept are
    /// those of the CPUs' last lines (the only ones a context-switch banner names; a thread
    /// puts its own back with its next line).
    pub fn forget_thread(&mut self, pid: u32) {
        self.threads.remove(&pid);
        let last = &self.last_pid;
        self.comms.retain(|p, _| last.values().any(|l| l == p));
    }

    /// Before a poll's lines: `n` threads have recorded so far. A second thread turns the
    /// TASK/PID column on (unless an option set it); the column header is printed before the
    /// first lines, and again (after a `#` line) when the column turns on later.
    pub fn threads_seen(&mut self, n: usize, out: &mut Vec<u8>) {
        let turn_on = self.opts.proc_.is_none() && !self.proc_on && n > 1;
        if turn_on {
            self.proc_on = true;
        }
        if !self.header_done || turn_on {
            if self.header_done {
                out.extend_from_slice(b"#\n");
            }
            self.header(out);
            self.header_done = true;
        }
    }

    /// The column header (`__print_graph_headers_flags()`).
    pub fn header(&self, out: &mut Vec<u8>) {
        out.push(b'#');
        if self.opts.abstime {
            out.extend_from_slice(b"     TIME       ");
        }
        if self.opts.cpu {
            out.extend_from_slice(b" CPU");
        }
        if self.proc_on {
            out.extend_from_slice(b"  TASK/PID       ");
        }
        if self.opts.duration {
            out.extend_from_slice(b"  DURATION   ");
        }
        out.extend_from_slice(b"               FUNCTION CALLS\n");
        out.push(b'#');
        if self.opts.abstime {
            out.extend_from_slice(b"      |         ");
        }
        if self.opts.cpu {
            out.extend_from_slice(b" |  ");
        }
        if self.proc_on {
            out.extend_from_slice(b"   |    |        ");
        }
        if self.opts.duration {
            out.extend_from_slice(b"   |   |      ");
        }
        out.extend_from_slice(b"               |   |   |   |\n");
    }

    fn push_cpu(&self, out: &mut Vec<u8>, cpu: u32) {
        let c = cpu.to_string();
        out.push(b' ');
        out.extend(std::iter::repeat_n(
            b' ',
            self.cpu_width.saturating_sub(c.len()),
        ));
        out.extend_from_slice(c.as_bytes());
        out.extend_from_slice(b") ");
    }

    /// `print_graph_proc()`: `comm-pid` (comm cut to 7 bytes) centred in 14 columns.
    fn push_proc(out: &mut Vec<u8>, comm: &[u8], pid: u32) {
        let comm = &comm[..comm.len().min(7)];
        let pid = pid.to_string();
        let len = comm.len() + pid.len() + 1;
        let spaces = 14usize.saturating_sub(len);
        out.extend(std::iter::repeat_n(b' ', spaces / 2));
        out.extend_from_slice(comm);
        out.push(b'-');
        out.extend_from_slice(pid.as_bytes());
        out.extend(std::iter::repeat_n(b' ', spaces - spaces / 2));
    }

    /// `print_graph_prologue()`: the context-switch banner when the CPU's last pid changed,
    /// then CPU and TASK/PID.
    fn prologue(&mut self, out: &mut Vec<u8>, ctx: Ctx<'_>) {
        let prev = self.last_pid.insert(ctx.cpu, ctx.pid);
        self.comms
            .entry(ctx.pid)
            .or_insert_with(|| ctx.comm.to_vec());
        if let Some(prev) = prev.filter(|&p| p != ctx.pid) {
            out.extend_from_slice(b" ------------------------------------------\n");
            self.push_cpu(out, ctx.cpu);
            // `<...>` as the kernel prints a comm it does not know.
            let comm = self
                .comms
                .get(&prev)
                .cloned()
                .unwrap_or_else(|| b"<...>".to_vec());
            Self::push_proc(out, &comm, prev);
            out.extend_from_slice(b" => ");
            Self::push_proc(out, ctx.comm, ctx.pid);
            out.extend_from_slice(b"\n ------------------------------------------\n\n");
        }
        if self.opts.abstime {
            // `print_graph_abs_time()`: seconds (5 columns at least) and microseconds, the
            // function tracer's TIMESTAMP, then a bar.
            let s = (ctx.ts_ns / 1_000_000_000).to_string();
            out.extend(std::iter::repeat_n(b' ', 5usize.saturating_sub(s.len())));
            out.extend_from_slice(s.as_bytes());
            out.extend_from_slice(
                format!(".{:06} |  ", ctx.ts_ns % 1_000_000_000 / 1000).as_bytes(),
            );
        }
        if self.opts.cpu {
            self.push_cpu(out, ctx.cpu);
        }
        if self.proc_on {
            Self::push_proc(out, ctx.comm, ctx.pid);
            out.extend_from_slice(b" | ");
        }
    }

    /// `print_graph_duration()`: a duration, or `None` for the blank column of an entry.
    fn push_duration_column(&self, out: &mut Vec<u8>, ns: Option<u64>) {
        if !self.opts.duration {
            return;
        }
        match ns {
            None => out.extend_from_slice(b"              |  "),
            Some(ns) => {
                if self.opts.overhead {
                    out.push(mark(ns));
                    out.push(b' ');
                } else {
                    out.extend_from_slice(b"  ");
                }
                push_duration(out, ns);
                out.extend_from_slice(b"|  ");
            }
        }
    }

    fn push_retval(&self, out: &mut Vec<u8>, retval: u64) {
        // print_graph_retval(): an error code (a negative errno, as 64 or as 32 bits) in
        // decimal, anything else in hex.
        let as_err = if retval & (1 << 31) != 0 && retval >> 32 == 0 {
            retval as u32 as i32 as i64
        } else {
            retval as i64
        };
        if !self.opts.retval_hex && retval != 0 && (-4095..0).contains(&as_err) {
            out.extend_from_slice(format!(" ret={as_err}").as_bytes());
        } else {
            out.extend_from_slice(format!(" ret={retval:#x}").as_bytes());
        }
    }

    /// A line up to its call: the prologue, the duration column (blank for `None`), the
    /// indentation of `depth`.
    fn line_start(&mut self, out: &mut Vec<u8>, ctx: Ctx<'_>, ns: Option<u64>, depth: u32) {
        self.prologue(out, ctx);
        self.push_duration_column(out, ns);
        Self::indent(out, depth);
    }

    fn indent(out: &mut Vec<u8>, depth: u32) {
        out.extend(std::iter::repeat_n(b' ', depth as usize * 2));
    }

    fn thread(&mut self, pid: u32) -> &mut Thread {
        self.threads.entry(pid).or_default()
    }

    /// Thread `pid`'s records have a gap here (its `[LOST N EVENTS]` line is out): its
    /// next line closes the calls that returned in it.
    pub fn gap(&mut self, pid: u32) {
        self.thread(pid).gap = true;
    }

    /// After a gap, before the thread's next line at `depth`: close the calls open at depth
    /// `from` and deeper (they returned in the gap), deepest first, without a duration.
    fn close_gap(&mut self, out: &mut Vec<u8>, ctx: Ctx<'_>, from: u32, syms: &mut Symbols) {
        let t = self.thread(ctx.pid);
        if !std::mem::take(&mut t.gap) {
            return;
        }
        let from = from as usize;
        let closed: Vec<(u32, u64)> = t
            .open
            .iter_mut()
            .enumerate()
            .skip(from)
            .filter(|(_, f)| **f != 0)
            .map(|(d, f)| (d as u32, std::mem::replace(f, 0)))
            .collect();
        for &(d, func) in closed.iter().rev() {
            self.line_start(out, ctx, None, d);
            out.extend_from_slice(b"} /* ");
            syms.push_name(func, out);
            out.extend_from_slice(b": return lost */\n");
        }
    }

    /// A call and its return, on one line (`print_graph_entry_leaf()`).
    #[allow(clippy::too_many_arguments)]
    pub fn leaf(
        &mut self,
        out: &mut Vec<u8>,
        ctx: Ctx<'_>,
        func: u64,
        depth: u32,
        ns: u64,
        retval: u64,
        syms: &mut Symbols,
    ) {
        self.close_gap(out, ctx, depth, syms);
        let t = self.thread(ctx.pid);
        t.depth = i64::from(depth) - 1;
        if let Some(f) = t.open.get_mut(depth as usize) {
            *f = 0;
        }
        self.line_start(out, ctx, Some(ns), depth);
        syms.push_name(func, out);
        out.extend_from_slice(b"();");
        if self.opts.retval {
            out.extend_from_slice(b" /*");
            self.push_retval(out, retval);
            out.extend_from_slice(b" */");
        }
        out.push(b'\n');
    }

    /// A call whose return comes later (`print_graph_entry_nested()`).
    pub fn nested(
        &mut self,
        out: &mut Vec<u8>,
        ctx: Ctx<'_>,
        func: u64,
        depth: u32,
        syms: &mut Symbols,
    ) {
        self.close_gap(out, ctx, depth, syms);
        let t = self.thread(ctx.pid);
        t.depth = i64::from(depth);
        let d = depth as usize;
        if t.open.len() <= d {
            t.open.resize(d + 1, 0);
        }
        t.open[d] = func;
        self.line_start(out, ctx, None, depth);
        syms.push_name(func, out);
        out.extend_from_slice(b"() {\n");
    }

    /// A return (`print_graph_return()`), or the end of a call that did not return.
    #[allow(clippy::too_many_arguments)]
    pub fn ret(
        &mut self,
        out: &mut Vec<u8>,
        ctx: Ctx<'_>,
        func: u64,
        depth: u32,
        ns: u64,
        retval: u64,
        exit: Exit,
        syms: &mut Symbols,
    ) {
        self.close_gap(out, ctx, depth + 1, syms);
        let t = self.thread(ctx.pid);
        t.depth = i64::from(depth) - 1;
        let matched = match t.open.get_mut(depth as usize) {
            Some(f) => std::mem::replace(f, 0) == func,
            None => false,
        };
        self.line_start(out, ctx, Some(ns), depth);
        if self.opts.retval && exit == Exit::Returned {
            out.extend_from_slice(b"} /* ");
            syms.push_name(func, out);
            self.push_retval(out, retval);
            out.extend_from_slice(b" */");
        } else if matched && !self.opts.tail && exit == Exit::Returned {
            out.push(b'}');
        } else {
            out.extend_from_slice(b"} /* ");
            syms.push_name(func, out);
            out.extend_from_slice(exit.mark().as_bytes());
            out.extend_from_slice(b" */");
        }
        out.push(b'\n');
    }

    /// Another event (a kprobe event) inside the graph, as a comment
    /// (`print_graph_comment()`): `/* text */`, indented one level below the open call.
    pub fn comment(&mut self, out: &mut Vec<u8>, ctx: Ctx<'_>, text: &[u8]) {
        let depth = self.thread(ctx.pid).depth;
        self.prologue(out, ctx);
        self.push_duration_column(out, None);
        if depth > 0 {
            out.extend(std::iter::repeat_n(b' ', (depth as usize + 1) * 2));
        }
        out.extend_from_slice(b"/* ");
        out.extend_from_slice(text.strip_suffix(b"\n").unwrap_or(text));
        out.extend_from_slice(b" */\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dur(ns: u64) -> String {
        let mut v = Vec::new();
        push_duration(&mut v, ns);
        String::from_utf8(v).unwrap()
    }

    #[test]
    fn durations_are_printed_as_the_kernel_prints_them() {
        // Values worked out from trace_print_graph_duration()'s rules by hand.
        assert_eq!(dur(123), "0.123 us    ");
        assert_eq!(dur(1_234), "1.234 us    ");
        assert_eq!(dur(12_345), "12.345 us   ");
        assert_eq!(dur(123_456), "123.456 us  ");
        assert_eq!(dur(1_234_567), "1234.567 us ");
        assert_eq!(dur(12_345_678), "12345.67 us ");
        assert_eq!(dur(123_456_789), "123456.7 us ");
        assert_eq!(dur(1_234_567_891), "1234567 us  ");
        assert_eq!(dur(0), "0.000 us    ");
    }

    #[test]
    fn marks_follow_trace_find_mark() {
        assert_eq!(mark(10_000), b' ');
        assert_eq!(mark(10_001), b'+');
        assert_eq!(mark(100_001), b'!');
        assert_eq!(mark(1_000_001), b'#');
        assert_eq!(mark(10_000_001), b'*');
        assert_eq!(mark(100_000_001), b'@');
        assert_eq!(mark(1_000_000_001), b'$');
    }

    #[test]
    fn header_and_lines_have_the_kernels_columns() {
        let mut g = Graph::new(Options::default(), 2);
        let mut out = Vec::new();
        g.header(&mut out);
        assert_eq!(
            String::from_utf8_lossy(&out),
            "# CPU  DURATION                  FUNCTION CALLS\n\
             # |     |   |                     |   |   |   |\n"
        );
        let mut syms = Symbols::with_images(&[], &[]);
        let ctx = Ctx {
            cpu: 1,
            ts_ns: 0,
            pid: 7,
            comm: b"prog",
        };
        out.clear();
        g.nested(&mut out, ctx, 0x1000, 0, &mut syms);
        g.leaf(&mut out, ctx, 0x2000, 1, 120, 0, &mut syms);
        g.ret(
            &mut out,
            ctx,
            0x1000,
            0,
            12_400,
            0,
            Exit::Returned,
            &mut syms,
        );
        g.nested(&mut out, ctx, 0x3000, 0, &mut syms);
        g.ret(&mut out, ctx, 0x3000, 0, 2_000, 0, Exit::Unwound, &mut syms);
        let text = String::from_utf8_lossy(&out);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], " 1)               |  0x00001000() {");
        assert_eq!(lines[1], " 1)   0.120 us    |    0x00002000();");
        assert_eq!(lines[2], " 1) + 12.400 us   |  }");
        assert_eq!(lines[4], " 1)   2.000 us    |  } /* 0x00003000: unwound */");
    }

    /// After a gap, the calls the next record shows gone (at its depth or deeper) are
    /// closed before it, without a duration; a call open above that depth stays open.
    #[test]
    fn a_gap_closes_the_calls_that_returned_in_it() {
        let mut g = Graph::new(Options::default(), 2);
        let mut syms = Symbols::with_images(&[], &[]);
        let ctx = Ctx {
            cpu: 1,
            ts_ns: 0,
            pid: 7,
            comm: b"prog",
        };
        let mut out = Vec::new();
        g.nested(&mut out, ctx, 0x1000, 0, &mut syms);
        g.nested(&mut out, ctx, 0x2000, 1, &mut syms);
        g.nested(&mut out, ctx, 0x3000, 2, &mut syms);
        g.gap(7);
        out.clear();
        g.leaf(&mut out, ctx, 0x4000, 1, 500, 0, &mut syms);
        g.ret(
            &mut out,
            ctx,
            0x1000,
            0,
            9_000,
            0,
            Exit::Returned,
            &mut syms,
        );
        let text = String::from_utf8_lossy(&out);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                " 1)               |      } /* 0x00003000: return lost */",
                " 1)               |    } /* 0x00002000: return lost */",
                " 1)   0.500 us    |    0x00004000();",
                " 1)   9.000 us    |  }",
            ]
        );
    }

    #[test]
    fn proc_column_and_retval() {
        let opts = Options {
            proc_: Some(true),
            retval: true,
            ..Options::default()
        };
        let mut g = Graph::new(opts, 12);
        let mut out = Vec::new();
        g.header(&mut out);
        let mut syms = Symbols::with_images(&[], &[]);
        let ctx = Ctx {
            cpu: 3,
            ts_ns: 0,
            pid: 1234,
            comm: b"averylongname",
        };
        g.leaf(&mut out, ctx, 0x10, 0, 1000, (-22i64) as u64, &mut syms);
        g.leaf(&mut out, ctx, 0x10, 0, 1000, 42, &mut syms);
        g.leaf(&mut out, ctx, 0x10, 0, 1000, 0xffff_ffea, &mut syms);
        let text = String::from_utf8_lossy(&out);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "# CPU  TASK/PID         DURATION                  FUNCTION CALLS"
        );
        // comm cut to 7 bytes, "averylo-1234" (12) centred in 14, then " | ".
        assert_eq!(
            lines[2],
            "  3)  averylo-1234  |   1.000 us    |  0x00000010(); /* ret=-22 */"
        );
        assert_eq!(
            lines[3],
            "  3)  averylo-1234  |   1.000 us    |  0x00000010(); /* ret=0x2a */"
        );
        // A 32-bit -22 (an int return) is an error code too.
        assert_eq!(
            lines[4],
            "  3)  averylo-1234  |   1.000 us    |  0x00000010(); /* ret=-22 */"
        );
    }

    #[test]
    fn abstime_column_as_the_kernel_lays_it_out() {
        let mut opts = Options::default();
        opts.set("funcgraph-abstime").unwrap();
        let mut g = Graph::new(opts, 2);
        let mut out = Vec::new();
        g.header(&mut out);
        let mut syms = Symbols::with_images(&[], &[]);
        let ctx = Ctx {
            cpu: 1,
            ts_ns: 2_733_260_590_123,
            pid: 7,
            comm: b"prog",
        };
        g.leaf(&mut out, ctx, 0x2000, 0, 120, 0, &mut syms);
        let text = String::from_utf8_lossy(&out);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "#     TIME        CPU  DURATION                  FUNCTION CALLS"
        );
        assert_eq!(
            lines[1],
            "#      |          |     |   |                     |   |   |   |"
        );
        assert_eq!(
            lines[2],
            " 2733.260590 |   1)   0.120 us    |  0x00002000();"
        );
    }
}
