//! Text output: ftrace's `trace` format and the function listing.

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};
use ftprobe::elf::ElfImage;
use ftprobe::events::{format_string, FetchType, ProbeDef};
use ftprobe::trace_kprobe::{decode_args, ArgValue};

use crate::symbols::Symbols;

/// The `TASK-PID [CPU] TIMESTAMP: ` prefix of a line of ftrace's `trace` file
/// (kernel/trace/trace_output.c, `trace_print_context()`): comm right-aligned in 16 columns,
/// pid left-aligned in 7, CPU in 3 digits, seconds.microseconds.
pub fn context(comm: &str, pid: u32, cpu: u32, ts_ns: u64) -> String {
    format!(
        "{comm:>16}-{pid:<7} [{cpu:03}] {:5}.{:06}: ",
        ts_ns / 1_000_000_000,
        ts_ns % 1_000_000_000 / 1000
    )
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
pub fn kprobe_event(def: &ProbeDef, words: &[u64], syms: &mut Symbols) -> String {
    let addr = words[1];
    let mut s = format!("{}: ({})", def.event, symbolize(addr, syms));
    if let Some(values) = decode_args(def, words) {
        for (a, v) in def.args.iter().zip(&values) {
            s.push_str(&format!(" {}={}", a.name, format_value(&a.ty, v, syms)));
        }
    }
    s.push('\n');
    s
}

/// An address as the kernel's `%pS`: `sym+0xoff/0xsize`, or `0x...` when no function of the
/// target covers it.
fn symbolize(addr: u64, syms: &mut Symbols) -> String {
    match syms.lookup_sized(addr) {
        Some((name, off, size)) => format!("{name}+{off:#x}/{size:#x}"),
        None => format!("{addr:#x}"),
    }
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
