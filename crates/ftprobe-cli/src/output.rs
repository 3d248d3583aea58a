//! Text output: ftrace's `trace` format and the function listing.

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};
use ftprobe::elf::ElfImage;
use ftprobe::events::{format_string, FetchType, ProbeDef};
use ftprobe::trace_kprobe::{ArgValue, RecordDecoder};

use crate::symbols::{push_hex, Symbols};

/// The `TASK-PID ` part of a line of ftrace's `trace` file (kernel/trace/trace_output.c,
/// `trace_print_context()`): comm right-aligned in 16 columns, pid left-aligned in 7. Fixed
/// per thread, so made once per ring.
pub fn task_prefix(comm: &str, pid: u32) -> Vec<u8> {
    format!("{comm:>16}-{pid:<7} ").into_bytes()
}

/// Appends the `[CPU] TIMESTAMP: ` part that follows [`task_prefix`]: the CPU in at least 3
/// digits, zero-padded, then seconds (right-aligned in 5 columns) `.` microseconds (6 digits).
/// Byte for byte `format!("[{cpu:03}] {:5}.{:06}: ", ts_ns / 1e9, ts_ns % 1e9 / 1e3)`.
pub fn push_cpu_time(out: &mut Vec<u8>, cpu: u32, ts_ns: u64) {
    let mut buf = itoa::Buffer::new();
    out.push(b'[');
    let c = buf.format(cpu);
    out.extend(std::iter::repeat_n(b'0', 3usize.saturating_sub(c.len())));
    out.extend_from_slice(c.as_bytes());
    out.extend_from_slice(b"] ");
    let s = buf.format(ts_ns / 1_000_000_000);
    out.extend(std::iter::repeat_n(b' ', 5usize.saturating_sub(s.len())));
    out.extend_from_slice(s.as_bytes());
    out.push(b'.');
    let us = buf.format(ts_ns % 1_000_000_000 / 1000);
    out.extend(std::iter::repeat_n(b'0', 6 - us.len()));
    out.extend_from_slice(us.as_bytes());
    out.extend_from_slice(b": ");
}

/// The header ftrace prints above a trace (`function` or `nop` tracer).
pub fn header(out: &mut dyn Write, tracer: &str) -> std::io::Result<()> {
    writeln!(out, "# tracer: {tracer}")?;
    writeln!(out, "#")?;
    writeln!(out, "#           TASK-PID     CPU#  TIMESTAMP  FUNCTION")?;
    writeln!(out, "#              | |         |       |         |")
}

/// The rest of a kprobe event line as the kernel prints it (trace_kprobe.c,
/// `print_kprobe_event()`, trace_probe.c `print_probe_args()`): `EVENT: (sym+0xoff/0xsize)
/// name=value ...`. Values as the kernel's print functions: integers as [`FetchType::format`],
/// `char` as `'c'`, strings (`string`, `ustring`, `$comm`, `\"STR"`) as `"text"` with nothing
/// escaped, `symbol` as `%pS` (`sym+0xoff/0xsize`, the bare address when no function covers
/// it), `symstr` as that text in quotes, arrays as `{a,b,c}`, and `(fault)` for what could not
/// be read.
pub fn kprobe_event(
    out: &mut Vec<u8>,
    def: &ProbeDef,
    decoder: Option<&RecordDecoder>,
    words: &[u64],
    syms: &mut Symbols,
) {
    let addr = words[1];
    out.extend_from_slice(def.event.as_bytes());
    out.extend_from_slice(b": (");
    push_symbolized(out, addr, syms);
    out.push(b')');
    if let Some(values) = decoder.and_then(|d| d.decode(def, words)) {
        for (a, v) in def.args.iter().zip(&values) {
            out.push(b' ');
            out.extend_from_slice(a.name.as_bytes());
            out.push(b'=');
            out.extend_from_slice(format_value(&a.ty, v, syms).as_bytes());
        }
    }
    out.push(b'\n');
}

/// An address as the kernel's `%pS`: `sym+0xoff/0xsize`, or `0x...` when no function of the
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

/// One value of type `ty` (an array's element type for its elements).
fn format_scalar(ty: &FetchType, raw: u64, syms: &mut Symbols) -> String {
    match ty {
        FetchType::Symbol => symbolize(raw, syms),
        // The kernel stores sprint_symbol()'s text and prints it as a string.
        FetchType::Symstr => format!("\"{}\"", symbolize(raw, syms)),
        _ => ty.format(ty.extract_bitfield(raw)),
    }
}

/// One decoded argument of type `ty`.
fn format_value(ty: &FetchType, v: &ArgValue, syms: &mut Symbols) -> String {
    match v {
        ArgValue::Fault => "(fault)".to_owned(),
        ArgValue::Scalar(raw) => format_scalar(ty, *raw, syms),
        ArgValue::Str(b) => format_string(b.as_deref()),
        ArgValue::Array(elems) => {
            let elem = match ty {
                FetchType::Array { elem, .. } => elem,
                t => t,
            };
            let parts: Vec<String> = elems
                .iter()
                .map(|&e| format_scalar(elem, e, syms))
                .collect();
            format!("{{{}}}", parts.join(","))
        }
        ArgValue::Strs(list) => {
            let parts: Vec<String> = list.iter().map(|b| format_string(b.as_deref())).collect();
            format!("{{{}}}", parts.join(","))
        }
    }
}

/// `ftprobe list functions BIN`.
pub fn list_functions(bin: &Path) -> Result<()> {
    let img = ElfImage::open(bin).with_context(|| format!("reading {}", bin.display()))?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    writeln!(
        out,
        "# {} functions with an ftrace site in {}",
        img.sites.len(),
        bin.display()
    )?;
    writeln!(out, "# FUNCTION                       SITE                       KIND      PLACE           FOUND IN")?;
    for s in &img.sites {
        let f = &img.funcs[s.func];
        let name = ftprobe::elf::display_name(&f.name);
        let site = format!("{name}+{:#x}", s.svma - f.svma);
        writeln!(
            out,
            "{:<32} {:<26} {:<9} {:<15} {}",
            name,
            site,
            s.kind.name(),
            s.place.name(),
            s.source.name()
        )?;
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
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{push_cpu_time, task_prefix};

    /// The hand-written formatting is byte for byte the `format!` it replaces.
    #[test]
    fn context_as_format() {
        for (cpu, ts) in [
            (0, 0),
            (1, 9_232_652_648_123),
            (12, 999_999_999),
            (123, 123_456_789_000_001),
            (4095, u64::MAX),
        ] {
            let mut out = task_prefix("lua-patchable", 3337);
            push_cpu_time(&mut out, cpu, ts);
            let want = format!(
                "{:>16}-{:<7} [{cpu:03}] {:5}.{:06}: ",
                "lua-patchable",
                3337,
                ts / 1_000_000_000,
                ts % 1_000_000_000 / 1000
            );
            assert_eq!(String::from_utf8(out).unwrap(), want);
        }
    }
}
