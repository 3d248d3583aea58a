//! Text output: ftrace's `trace` format and the function listing.

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};
use ftprobe::elf::ElfImage;
use ftprobe::events::{FetchOp, ProbeDef};
use ftprobe::trace_kprobe::RECORD_HEAD_WORDS;

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
/// `print_kprobe_event()`): `EVENT: (sym+0xoff/0xsize) name=value ...`.
pub fn kprobe_event(def: &ProbeDef, words: &[u64], syms: &mut Symbols) -> String {
    let addr = words[1];
    let faults = words[2];
    let mut s = format!("{}: (", def.event);
    match syms.lookup_sized(addr) {
        Some((name, off, size)) => s.push_str(&format!("{name}+{off:#x}/{size:#x})")),
        None => s.push_str(&format!("{addr:#x})")),
    }
    let mut at = RECORD_HEAD_WORDS;
    for (i, a) in def.args.iter().enumerate() {
        let value = if a.fetch == FetchOp::Comm {
            // Two words: the thread's name at the hit, NUL-padded.
            let (Some(lo), Some(hi)) = (words.get(at), words.get(at + 1)) else {
                break;
            };
            at += 2;
            let mut b = [lo.to_le_bytes(), hi.to_le_bytes()].concat();
            b.truncate(b.iter().position(|&c| c == 0).unwrap_or(16));
            format!("\"{}\"", String::from_utf8_lossy(&b))
        } else {
            let Some(&raw) = words.get(at) else { break };
            at += 1;
            if i < 64 && faults & (1 << i) != 0 {
                "(fault)".to_owned()
            } else {
                a.ty.format(a.ty.extract_bitfield(raw))
            }
        };
        s.push_str(&format!(" {}={value}", a.name));
    }
    s.push('\n');
    s
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
        let site = format!("{}+{:#x}", f.name, s.svma - f.svma);
        writeln!(
            out,
            "{:<32} {:<26} {:<9} {:<15} {}",
            f.name,
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
