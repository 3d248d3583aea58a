//! Text output: ftrace's `trace` format and the function listing.

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};
use ftprobe::elf::ElfImage;

/// The `TASK-PID [CPU] TIMESTAMP:` prefix of a line of ftrace's `trace` file
/// (kernel/trace/trace_output.c, `trace_print_context()`): comm right-aligned in 16 columns,
/// pid left-aligned in 7, CPU in 3 digits, seconds.microseconds.
pub fn context(
    out: &mut (impl Write + ?Sized),
    comm: &str,
    pid: u32,
    cpu: u32,
    ts_ns: u64,
) -> std::io::Result<()> {
    write!(
        out,
        "{comm:>16}-{pid:<7} [{cpu:03}] {:5}.{:06}: ",
        ts_ns / 1_000_000_000,
        ts_ns % 1_000_000_000 / 1000
    )
}

/// The header ftrace prints above the function tracer's output.
pub fn function_header(out: &mut (impl Write + ?Sized)) -> std::io::Result<()> {
    writeln!(out, "# tracer: function")?;
    writeln!(out, "#")?;
    writeln!(out, "#           TASK-PID     CPU#  TIMESTAMP  FUNCTION")?;
    writeln!(out, "#              | |         |       |         |")
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
