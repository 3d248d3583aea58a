//! Text output: ftrace's `trace` format and the function listing.

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};
use ftprobe::elf::ElfImage;
use ftprobe::events::{FetchType, ProbeDef};
use ftprobe::trace_kprobe::{ArgValue, RecordDecoder};

use crate::symbols::{push_hex, push_unknown_addr, Symbols};

/// The `TASK-PID ` part of a line of ftrace's `trace` file (kernel/trace/trace_output.c,
/// `trace_print_context()`, `"%16s-%-7d "`): comm right-aligned in 16 bytes (bytes, as C
/// counts them, not characters), pid left-aligned in 7 columns. Fixed per thread, so made once
/// per ring.
pub fn task_prefix(comm: &[u8], pid: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(32);
    out.extend(std::iter::repeat_n(
        b' ',
        16usize.saturating_sub(comm.len()),
    ));
    out.extend_from_slice(comm);
    out.extend_from_slice(format!("-{pid:<7} ").as_bytes());
    out
}

/// Appends the `[CPU]  TIMESTAMP: ` part that follows [`task_prefix`], as the kernel's
/// `trace_print_context()` with the `irq-info` option off: `"[%03d] "`, then
/// `trace_print_time()`'s `" %5lu.%06lu"` (seconds right-aligned in 5 columns, so two spaces
/// after `]`), then `": "`. Byte for byte
/// `format!("[{cpu:03}]  {:5}.{:06}: ", ts_ns / 1e9, ts_ns % 1e9 / 1e3)`.
pub fn push_cpu_time(out: &mut Vec<u8>, cpu: u32, ts_ns: u64) {
    let mut buf = itoa::Buffer::new();
    out.push(b'[');
    let c = buf.format(cpu);
    out.extend(std::iter::repeat_n(b'0', 3usize.saturating_sub(c.len())));
    out.extend_from_slice(c.as_bytes());
    out.extend_from_slice(b"]  ");
    let s = buf.format(ts_ns / 1_000_000_000);
    out.extend(std::iter::repeat_n(b' ', 5usize.saturating_sub(s.len())));
    out.extend_from_slice(s.as_bytes());
    out.push(b'.');
    let us = buf.format(ts_ns % 1_000_000_000 / 1000);
    out.extend(std::iter::repeat_n(b'0', 6 - us.len()));
    out.extend_from_slice(us.as_bytes());
    out.extend_from_slice(b": ");
}

/// The header ftrace prints above a trace (`function` or `nop` tracer), as the kernel's
/// `trace` file with `noirq-info` (kernel/trace/trace.c, `print_func_help_header()`), less
/// its `# entries-in-buffer/entries-written` line and the `#` after it: those counts are only
/// known at the end, where [`entries`] prints the line.
pub fn header(out: &mut dyn Write, tracer: &str) -> std::io::Result<()> {
    writeln!(out, "# tracer: {tracer}")?;
    writeln!(out, "#")?;
    writeln!(out, "#           TASK-PID     CPU#     TIMESTAMP  FUNCTION")?;
    writeln!(out, "#              | |         |         |         |")
}

/// The kernel's `# entries-in-buffer/entries-written: E/W   #P:N` line (`print_event_info()`):
/// the events printed, the events the program recorded or tried to (printed + lost), and the
/// CPUs online.
pub fn entries(out: &mut dyn Write, printed: u64, lost: u64, cpus: u32) -> std::io::Result<()> {
    writeln!(
        out,
        "# entries-in-buffer/entries-written: {printed}/{}   #P:{cpus}",
        printed.saturating_add(lost)
    )
}

/// The rest of a kprobe event line as the kernel prints it (trace_kprobe.c,
/// `print_kprobe_event()`, trace_probe.c `print_probe_args()`): `EVENT: (sym+0xoff/0xsize)
/// name=value ...`. Values as the kernel's print functions: integers as [`FetchType::format`],
/// `char` as `'c'`, strings (`string`, `ustring`, `$comm`, `\"STR"`) as `"text"` with nothing
/// escaped, `symbol` as `%pS` (`sym+0xoff/0xsize`, the bare address when no function covers
/// it), `symstr` as that text in quotes, arrays as `{a,b,c}`, and for what could not be read
/// `(fault)` (a string) or the value 0 (a number, as the kernel's zeroed field).
pub fn kprobe_event(
    out: &mut Vec<u8>,
    def: &ProbeDef,
    decoder: Option<&RecordDecoder>,
    addr: u64,
    words: &[u64],
    syms: &mut Symbols,
) {
    out.extend_from_slice(def.event.as_bytes());
    out.extend_from_slice(b": (");
    // A return event (trace_kprobe.c, `print_kretprobe_event()`): `(ret_ip <- func)`, the
    // return address with its offset, the function by its name alone.
    let ret_ip = decoder.and_then(|d| d.ret_ip(def, words));
    // seq_print_ip_sym() with sym-offset: `sym+0xoff/0xsize`, else `0x%08lx`.
    match syms.lookup_sized(ret_ip.unwrap_or(addr)) {
        Some(_) => push_symbolized(out, ret_ip.unwrap_or(addr), syms),
        None => push_unknown_addr(out, ret_ip.unwrap_or(addr)),
    }
    if ret_ip.is_some() {
        out.extend_from_slice(b" <- ");
        syms.push_name(addr, out);
    }
    out.push(b')');
    if let Some(values) = decoder.and_then(|d| d.decode(def, words)) {
        for (a, v) in def.args.iter().zip(&values) {
            out.push(b' ');
            out.extend_from_slice(a.name.as_bytes());
            out.push(b'=');
            out.extend_from_slice(&format_value(&a.ty, v, syms));
        }
    }
    out.push(b'\n');
}

/// The fetch args of a record of `def`'s event: (name, value as `trace` prints it, but a
/// string's or a character's without its quotes: the exports' values are the values, which
/// their formats quote as they need); empty when the record does not decode.
pub fn kprobe_args(
    def: &ProbeDef,
    decoder: Option<&RecordDecoder>,
    words: &[u64],
    syms: &mut Symbols,
) -> Vec<(String, String)> {
    let Some(values) = decoder.and_then(|d| d.decode(def, words)) else {
        return Vec::new();
    };
    def.args
        .iter()
        .zip(&values)
        .map(|(a, v)| {
            let text = format_value(&a.ty, v, syms);
            let inner = match &text[..] {
                [b'"', mid @ .., b'"'] | [b'\'', mid @ .., b'\''] => mid,
                t => t,
            };
            (a.name.clone(), String::from_utf8_lossy(inner).into_owned())
        })
        .collect()
}

/// An address as the kernel's `%pS`: `sym+0xoff/0xsize`, or `0x%lx` when no function of the
/// target covers it.
fn push_symbolized(out: &mut Vec<u8>, addr: u64, syms: &mut Symbols) {
    match syms.lookup_sized(addr) {
        Some((name, off, size)) => {
            out.extend_from_slice(name.as_bytes());
            out.push(b'+');
            push_hex(out, off);
            out.push(b'/');
            push_hex(out, size);
        }
        None => push_hex(out, addr),
    }
}

fn symbolize(addr: u64, syms: &mut Symbols) -> String {
    let mut out = Vec::new();
    push_symbolized(&mut out, addr, syms);
    String::from_utf8_lossy(&out).into_owned()
}

/// One value of type `ty` (an array's element type for its elements), as bytes: a `char` is
/// its byte as is, as the kernel's `%c` prints it (not a Unicode character).
fn format_scalar(ty: &FetchType, raw: u64, syms: &mut Symbols) -> Vec<u8> {
    match ty {
        FetchType::Symbol => symbolize(raw, syms).into_bytes(),
        // The kernel stores sprint_symbol()'s text and prints it as a string.
        FetchType::Symstr => format!("\"{}\"", symbolize(raw, syms)).into_bytes(),
        FetchType::Char => vec![b'\'', raw as u8, b'\''],
        _ => ty.format(ty.extract_bitfield(raw)).into_bytes(),
    }
}

/// A fetched string as the kernel's `"%s"` prints it: its bytes as they are, up to the first
/// NUL (no UTF-8 replacement: the reader gets the program's bytes), or `(fault)`.
fn format_string_bytes(bytes: Option<&[u8]>) -> Vec<u8> {
    match bytes {
        None => b"(fault)".to_vec(),
        Some(b) => {
            let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
            let mut out = Vec::with_capacity(end + 2);
            out.push(b'"');
            out.extend_from_slice(&b[..end]);
            out.push(b'"');
            out
        }
    }
}

/// `{a,b,c}`.
fn braced(parts: Vec<Vec<u8>>) -> Vec<u8> {
    let mut out = vec![b'{'];
    out.extend_from_slice(&parts.join(&b',')[..]);
    out.push(b'}');
    out
}

/// One decoded argument of type `ty`, as the bytes the kernel would print.
fn format_value(ty: &FetchType, v: &ArgValue, syms: &mut Symbols) -> Vec<u8> {
    match v {
        // The kernel prints `(fault)` for a string it could not read, and the zero its
        // record holds for a number (checked against this kernel's uprobes: `+0(%di):u32`
        // on a NULL `%di` prints `0`).
        ArgValue::Fault => match ty {
            FetchType::Array { elem, len } if !elem.is_string() => {
                let zero = format_scalar(elem, 0, syms);
                braced(vec![zero; *len as usize])
            }
            FetchType::Array { .. } => b"(fault)".to_vec(),
            t if t.is_string() => b"(fault)".to_vec(),
            t => format_scalar(t, 0, syms),
        },
        ArgValue::Scalar(raw) => format_scalar(ty, *raw, syms),
        ArgValue::Str(b) => format_string_bytes(b.as_deref()),
        ArgValue::Array(elems) => {
            let elem = match ty {
                FetchType::Array { elem, .. } => elem,
                t => t,
            };
            braced(
                elems
                    .iter()
                    .map(|&e| format_scalar(elem, e, syms))
                    .collect(),
            )
        }
        ArgValue::Strs(list) => braced(
            list.iter()
                .map(|b| format_string_bytes(b.as_deref()))
                .collect(),
        ),
    }
}

/// `ftprobe list functions BIN`: one line per site, the function's name last (C++ and Rust
/// names are long and may hold spaces), the other columns as wide as their widest value.
/// SITE is the site's offset in the function: `FUNCTION+SITE` is the probe target that rides
/// ftrace. A reader that stops early (`| head`) ends the listing quietly, with status 0.
pub fn list_functions(bin: &Path) -> Result<()> {
    let img = ElfImage::open(bin).with_context(|| format!("reading {}", bin.display()))?;
    // With XRay sleds (clang -fxray-instrument), two more columns: the function's entry and
    // exit (return and tail-call) sleds in xray_instr_map.
    let xray = !img.xray.is_empty();
    let distinct = crate::symbols::Distinct::new(&img);
    let rows: Vec<Vec<String>> = img
        .sites
        .iter()
        .map(|s| {
            let f = &img.funcs()[s.func];
            let mut row = vec![
                format!("+{:#x}", s.svma - f.svma),
                s.kind.name().to_owned(),
                s.place.name().to_owned(),
                s.source.name().to_owned(),
            ];
            if xray {
                let (entry, exit) = img.xray_counts(f.svma);
                row.extend([entry.to_string(), exit.to_string()]);
            }
            row.push(
                distinct
                    .get(s.func)
                    .map_or_else(|| ftprobe::elf::display_name(&f.name), str::to_owned),
            );
            row
        })
        .collect();
    let mut titles = vec!["# SITE", "KIND", "PLACE", "FOUND IN"];
    if xray {
        titles.extend(["XRAY-ENTRY", "XRAY-EXIT"]);
    }
    titles.push("FUNCTION");
    let mut widths: Vec<usize> = titles.iter().map(|t| t.len()).collect();
    for r in &rows {
        for (w, v) in widths.iter_mut().zip(r) {
            *w = (*w).max(v.len());
        }
    }
    let line = |out: &mut dyn Write, cols: &[&str]| -> std::io::Result<()> {
        let (last, rest) = cols.split_last().expect("a FUNCTION column");
        for (c, w) in rest.iter().zip(&widths) {
            write!(out, "{c:<w$}  ")?;
        }
        writeln!(out, "{last}")
    };
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let written = (|| -> std::io::Result<()> {
        writeln!(
            out,
            "# {} functions with an ftrace site in {}",
            img.sites.len(),
            bin.display()
        )?;
        line(&mut out, &titles)?;
        for r in &rows {
            let cols: Vec<&str> = r.iter().map(String::as_str).collect();
            line(&mut out, &cols)?;
        }
        if !img.rejected.is_empty() {
            writeln!(
                out,
                "# {} recorded addresses hold no recognisable site (not patchable):",
                img.rejected.len()
            )?;
            for a in &img.rejected {
                writeln!(out, "#   {a:#x}")?;
            }
        }
        out.flush()
    })();
    match written {
        // The reader had enough (`| head`), as `ftprobe trace` takes it: not an error.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            // The BufWriter would try again when dropped: forget what it holds.
            let _ = out.into_parts();
            Ok(())
        }
        r => Ok(r.context("writing the listing")?),
    }
}

/// `PIPE_BUF` (pipe(7)): a `write` of at most this many bytes to a pipe is atomic, never
/// interleaved with another process's write to the same pipe.
pub const PIPE_BUF: usize = 4096;

/// A writer for a pipe the traced program writes to as well (`ftprobe trace | grep ...`,
/// the program's own stdout inherited): each `write(2)` is whole lines of at most
/// [`PIPE_BUF`] bytes, so the program's writes of at most `PIPE_BUF` bytes land between
/// trace lines, never inside one (a line longer than `PIPE_BUF` goes in pieces). Buffers at
/// most `PIPE_BUF` bytes plus the current write.
pub struct PipeLines<W: Write> {
    inner: W,
    buf: Vec<u8>,
}

impl<W: Write> PipeLines<W> {
    pub fn new(inner: W) -> PipeLines<W> {
        PipeLines {
            inner,
            buf: Vec::with_capacity(2 * PIPE_BUF),
        }
    }

    /// Write the buffered whole lines in writes of at most `PIPE_BUF` bytes, each ending at
    /// a line end when one is in reach; with `all`, the last partial line too.
    fn drain(&mut self, all: bool) -> std::io::Result<()> {
        let mut at = 0;
        while self.buf.len() - at >= PIPE_BUF || (all && at < self.buf.len()) {
            let window = &self.buf[at..self.buf.len().min(at + PIPE_BUF)];
            let n = match window.iter().rposition(|&b| b == b'\n') {
                Some(i) => i + 1,
                // A line longer than PIPE_BUF (or the last, partial one): as it comes.
                None => window.len(),
            };
            self.inner.write_all(&window[..n])?;
            at += n;
        }
        self.buf.drain(..at);
        Ok(())
    }
}

impl<W: Write> Write for PipeLines<W> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= PIPE_BUF {
            self.drain(false)?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.drain(true)?;
        self.inner.flush()
    }
}

impl<W: Write> Drop for PipeLines<W> {
    fn drop(&mut self) {
        let _ = self.flush();
    }
}

/// The trace's output: FILE, or standard output (none, or `-`). When standard output is a
/// pipe, whole lines of at most `PIPE_BUF` bytes per write ([`PipeLines`]): the traced
/// program inherits the same pipe, and its own lines must not land inside trace lines.
pub fn open_output(path: Option<&std::path::PathBuf>) -> Result<Box<dyn Write>> {
    use std::os::fd::AsFd;
    use std::os::unix::fs::FileTypeExt;
    Ok(match path.filter(|p| p.as_os_str() != "-") {
        Some(p) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
        )),
        None => {
            let pipe = std::io::stdout()
                .as_fd()
                .try_clone_to_owned()
                .map(std::fs::File::from)
                .ok()
                .filter(|f| f.metadata().is_ok_and(|m| m.file_type().is_fifo()));
            match pipe {
                Some(f) => Box::new(PipeLines::new(f)),
                None => Box::new(std::io::BufWriter::new(std::io::stdout())),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::{header, push_cpu_time, task_prefix, PipeLines, PIPE_BUF};
    use crate::symbols::push_unknown_addr;
    use std::io::Write;

    /// The hand-written formatting is byte for byte the kernel's printf formats
    /// (`"%16s-%-7d "`, `"[%03d] "`, `" %5lu.%06lu"`, `": "`).
    #[test]
    fn context_as_format() {
        for (comm, cpu, ts) in [
            ("lua-patchable", 0, 0),
            ("a", 1, 9_232_652_648_123),
            ("sixteen-chars-xx", 12, 999_999_999),
            ("seventeen-chars-x", 123, 123_456_789_000_001),
            ("x", 4095, u64::MAX),
        ] {
            let mut out = task_prefix(comm.as_bytes(), 3337);
            push_cpu_time(&mut out, cpu, ts);
            let want = format!(
                "{:>16}-{:<7} [{cpu:03}]  {:5}.{:06}: ",
                comm,
                3337,
                ts / 1_000_000_000,
                ts % 1_000_000_000 / 1000
            );
            assert_eq!(String::from_utf8(out).unwrap(), want);
        }
        // C pads bytes, not characters: a comm of 2 two-byte characters gets 12 spaces.
        assert_eq!(
            task_prefix("éé".as_bytes(), 1),
            b"            \xc3\xa9\xc3\xa9-1       "
        );
        // Pids wider than 7 columns push the rest along, as %-7d does.
        assert_eq!(task_prefix(b"p", 12_345_678), b"               p-12345678 ");
    }

    /// Regression (found by a user): one space between `]` and the timestamp, and a header
    /// that put TIMESTAMP 3 columns left of the kernel's. The reference is this kernel's
    /// (6.18) `trace` file for a uprobe event (irq-info off), as read on these VMs; ftprobe's
    /// header leaves out the entries line and the `#` after it (printed at the end).
    #[test]
    fn line_and_header_match_the_kernels_reference() {
        let kernel_header = "# tracer: nop\n#\n\
            # entries-in-buffer/entries-written: 3/3   #P:2\n#\n\
            #           TASK-PID     CPU#     TIMESTAMP  FUNCTION\n\
            #              | |         |         |         |\n";
        let kernel_line =
            "         i9calls-21400   [001]    681.624983: ev: (0x55d1c24ed1a0) a=0x0 b=0x1\n";
        let mut ours = Vec::new();
        header(&mut ours, "nop").unwrap();
        let without_entries: Vec<&str> = kernel_header
            .lines()
            .enumerate()
            .filter(|(i, _)| !matches!(i, 2 | 3))
            .map(|(_, l)| l)
            .collect();
        assert_eq!(
            String::from_utf8(ours).unwrap(),
            without_entries.join("\n") + "\n"
        );
        let mut line = task_prefix(b"i9calls", 21400);
        push_cpu_time(&mut line, 1, 681_624_983_512);
        line.extend_from_slice(b"ev: (");
        push_unknown_addr(&mut line, 0x55d1c24ed1a0);
        line.extend_from_slice(b") a=0x0 b=0x1\n");
        assert_eq!(String::from_utf8(line).unwrap(), kernel_line);
    }

    /// The kernel's `0x%08lx` for an address without a symbol, `0` for a null one.
    #[test]
    fn unknown_addresses_as_the_kernel() {
        for (addr, want) in [
            (0, "0"),
            (0x401136, "0x00401136"),
            (0x7f12_3456_789a, "0x7f123456789a"),
        ] {
            let mut out = Vec::new();
            push_unknown_addr(&mut out, addr);
            assert_eq!(String::from_utf8(out).unwrap(), want);
        }
    }

    /// Every write a [`PipeLines`] makes is at most `PIPE_BUF` bytes and ends at a line end,
    /// unless a line is longer than that; the bytes come out whole and in order.
    #[test]
    fn pipe_lines_write_whole_lines_of_at_most_pipe_buf() {
        struct Writes(Vec<Vec<u8>>);
        impl Write for Writes {
            fn write(&mut self, d: &[u8]) -> std::io::Result<usize> {
                self.0.push(d.to_vec());
                Ok(d.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        // Lines of 1 to 9000 bytes (some longer than PIPE_BUF), fed in chunks of odd sizes.
        let mut text = Vec::new();
        let mut seed = 7u64;
        for i in 0..3000 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let len = if i % 500 == 0 {
                9000
            } else {
                (seed >> 33) as usize % 300
            };
            text.extend(std::iter::repeat_n(b'a' + (i % 26) as u8, len));
            text.push(b'\n');
        }
        text.extend_from_slice(b"partial");
        let mut w = PipeLines::new(Writes(Vec::new()));
        let mut at = 0;
        let mut step = 1;
        while at < text.len() {
            let n = step.min(text.len() - at);
            w.write_all(&text[at..at + n]).unwrap();
            at += n;
            step = step * 3 % 7919 + 1;
        }
        w.flush().unwrap();
        let writes = std::mem::take(&mut w.inner.0);
        assert_eq!(writes.concat(), text, "whole and in order");
        let last = writes.len() - 1;
        for (k, wr) in writes.iter().enumerate() {
            assert!(wr.len() <= PIPE_BUF, "write {k}: {} bytes", wr.len());
            let ends_line = wr.last() == Some(&b'\n');
            // A piece of a line longer than PIPE_BUF (no line end in it) is the only other
            // kind, and the last, partial line at the flush.
            assert!(
                ends_line || k == last || !wr.contains(&b'\n'),
                "write {k} ends inside a line that fits"
            );
        }
    }
}
