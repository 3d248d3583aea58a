//! The probe-definition language of the kernel's `kprobe_events` and `uprobe_events` files
//! (Documentation/trace/kprobetrace.rst, uprobetracer.rst; kernel/trace/trace_kprobe.c,
//! trace_uprobe.c, trace_probe.c), parsed on `&str` with the kernel's error names, texts and
//! caret positions.
//!
//! ```text
//! p[:[GRP/][EVENT]] [OBJ:]SYM[+OFFS]|ADDR [FETCHARGS]        probe
//! r[MAXACTIVE][:[GRP/][EVENT]] [OBJ:]SYM[+0] [FETCHARGS]      return probe
//! p[:[GRP/][EVENT]] [OBJ:]SYM[+0]%return [FETCHARGS]         return probe
//! p|r[:[GRP/][EVENT]] PATH:OFFSET[%return][(REF_CTR_OFFSET)] [FETCHARGS]  uprobe-style
//! -:[GRP/]EVENT                                             remove
//!
//! FETCHARG: %REG  $argN  $stackN  $stack  $retval  $comm  \IMM  \"STR"  @ADDR
//!           @SYM[+|-OFFS]  @+OFFS (file offset, PATH:OFFSET probes)  +|-[u]OFFS(FETCHARG)
//! argument: [NAME=]FETCHARG[:TYPE]
//! TYPE:     u8..u64 s8..s64 x8..x64 char string ustring symbol symstr
//!           b<width>@<offset>/<container bits>   TYPE[N]
//! ```
//!
//! [`parse_probe_command`] parses one command into a [`ProbeCommand`]; `Display` on
//! [`ProbeDef`] prints it back as the kernel lists it. The parser raises every error the kernel
//! finds from the text alone; the engine raises the rest (symbol lookup, instruction
//! boundaries, existing events), with the same [`ProbeErrorKind`]s.
//!
//! # ftprobe's semantics of the kernel's flags
//!
//! The kernel parses fetch arguments under flags: a kprobe parses as kernel code
//! (`TPARG_FL_KERNEL`), a uprobe as user code (`TPARG_FL_USER`). ftprobe keeps that split:
//! `SYM`/`ADDR` targets follow the kprobe rules (`@SYM` allowed, `@+OFFS` refused,
//! `$stackN` limited to [`PARAM_MAX_STACK`], `$argN` at a function entry, the `symbol`
//! types), `PATH:OFFSET` targets follow the uprobe rules (`@+OFFS` allowed, `@SYM`, `$argN`
//! and the `symbol` types refused).

mod error;
mod fetch;
mod parse;
pub mod sdt;
#[cfg(test)]
mod tests;

use std::fmt;

pub use error::{error_log, error_log_at, ProbeError, ProbeErrorKind};
pub use fetch::{format_string, FetchOp, FetchType, Reg};
pub use parse::parse_probe_command;

/// Most fetch arguments in one definition (kernel `MAX_TRACE_ARGS`).
pub const MAX_TRACE_ARGS: usize = 128;
/// Longest argument expression after `NAME=`, in bytes (kernel `MAX_ARGSTR_LEN`).
pub const MAX_ARGSTR_LEN: usize = 63;
/// Most elements of `TYPE[N]` (kernel `MAX_ARRAY_LEN`).
pub const MAX_ARRAY_LEN: u32 = 64;
/// Longest argument NAME, in bytes (kernel `MAX_ARG_NAME_LEN`).
pub const MAX_ARG_NAME_LEN: usize = 32;
/// Group and event names must be shorter than this, in bytes (kernel `MAX_EVENT_NAME_LEN`,
/// kernel/trace/trace.h): at most 63 bytes.
pub const MAX_EVENT_NAME_LEN: usize = 64;
/// Most bytes of one fetched string, NUL included (kernel `MAX_STRING_SIZE` = `PATH_MAX`).
pub const MAX_STRING_SIZE: usize = 4096;
/// Instructions of one argument's fetch program, end marker included (kernel
/// `FETCH_INSN_MAX`). It bounds the nesting of dereferences: 14 around a register, 13 around
/// `@ADDR`, 12 around `@SYM`, one fewer for each instruction the type adds (an array's loop,
/// a bitfield's shift); more is [`ProbeErrorKind::TooManyOps`].
pub const FETCH_INSN_MAX: usize = 16;
/// Largest MAXACTIVE of `rN` (kernel `KRETPROBE_MAXACTIVE_MAX`, trace_kprobe.c).
pub const KRETPROBE_MAXACTIVE_MAX: u32 = 4096;
/// Largest N of `$stackN` and `$argN` on kprobe-style probes: the kernel's `PARAM_MAX_STACK`,
/// `THREAD_SIZE / sizeof(long)` with x86-64's 16 KiB kernel stacks. Kept for kernel
/// compatibility; uprobe-style probes have no limit but the `u32`.
pub const PARAM_MAX_STACK: u32 = 2048;
/// Default group of kprobe-style probes (kernel `KPROBE_EVENT_SYSTEM`).
pub const KPROBE_EVENT_SYSTEM: &str = "kprobes";
/// Default group of `PATH:OFFSET` probes (kernel `UPROBE_EVENT_SYSTEM`).
pub const UPROBE_EVENT_SYSTEM: &str = "uprobes";

/// One parsed command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeCommand {
    /// `p ...` or `r ...`: define a probe.
    Add(ProbeDef),
    /// `-:[GRP/]EVENT`: remove an event. `event` may be empty after a group (`-:GRP/`), which
    /// the kernel reads as every event of the group.
    Remove {
        /// The group, if given.
        group: Option<String>,
        /// The event name.
        event: String,
    },
}

/// A probe definition: what `p`/`r` commands define, and what the kernel lists back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeDef {
    /// Probe or return probe.
    pub kind: ProbeKind,
    /// The group (`kprobes` or `uprobes` when not given).
    pub group: String,
    /// The event name, given or made up as the kernel does (see [`parse_probe_command`]).
    pub event: String,
    /// Where the probe goes.
    pub target: ProbeTarget,
    /// The fetch arguments, in order.
    pub args: Vec<FetchArg>,
}

/// Probe or return probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeKind {
    /// `p`: runs when the target address is hit.
    Kprobe,
    /// `r`, or `p` on `SYM%return`: runs when the function returns.
    Kretprobe {
        /// `rN`: how many calls may be in flight at once (1..=4096); `None` for the default.
        /// Never set on `PATH:OFFSET` probes (uprobes have no MAXACTIVE).
        maxactive: Option<u32>,
    },
}

/// Where a probe goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeTarget {
    /// `[OBJ:]SYM[+OFFS]`: an offset into a function; OBJ names the object (the kernel's
    /// `MOD:`), e.g. `libc.so.6:malloc`.
    Symbol {
        /// The object, if given.
        obj: Option<String>,
        /// The symbol.
        sym: String,
        /// Bytes into the function (at most `u32::MAX`, as the kernel).
        offset: u64,
    },
    /// `ADDR`: an absolute address in the process.
    Address(u64),
    /// `PATH:OFFSET` (uprobe syntax; PATH has a `/`): a file offset in an object.
    FileOffset {
        /// The object's path.
        path: String,
        /// Offset in the file.
        offset: u64,
        /// `(REF_CTR_OFFSET)`: the file offset of a 16-bit reference counter (an SDT
        /// marker's semaphore) the engine increments while the probe is armed.
        ref_ctr_offset: Option<u64>,
    },
}

/// One fetch argument, `[NAME=]FETCHARG[:TYPE]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchArg {
    /// The name, given or `argN` (N = position, from 1) as the kernel.
    pub name: String,
    /// Where the value comes from.
    pub fetch: FetchOp,
    /// How it is stored and printed.
    pub ty: FetchType,
    /// Byte offset of the argument (its NAME, if any) in the command, for later errors.
    pub pos: usize,
}

impl FetchArg {
    /// The type an argument has when none is given: `string` for `$comm` and `\"STR"`,
    /// else `x64`.
    pub fn default_type(fetch: &FetchOp) -> FetchType {
        match fetch {
            FetchOp::Comm | FetchOp::ImmStr(_) => FetchType::String,
            _ => FetchType::X64,
        }
    }
}

impl fmt::Display for FetchArg {
    /// `NAME=FETCHARG[:TYPE]`; the type is left out when it is the default.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.name, self.fetch)?;
        if self.ty != FetchArg::default_type(&self.fetch) {
            write!(f, ":{}", self.ty)?;
        }
        Ok(())
    }
}

impl fmt::Display for ProbeTarget {
    /// As the kernel lists it: `SYM`, `SYM+OFFS` (decimal), `0x` and 16 hex digits for an
    /// address (the kernel prints `%p`, which it hashes; ftprobe prints the address),
    /// `PATH:0x` and 16 hex digits for a file offset.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProbeTarget::Symbol { obj, sym, offset } => {
                if let Some(obj) = obj {
                    write!(f, "{obj}:")?;
                }
                f.write_str(sym)?;
                if *offset != 0 {
                    write!(f, "+{offset}")?;
                }
                Ok(())
            }
            ProbeTarget::Address(a) => write!(f, "0x{a:016x}"),
            ProbeTarget::FileOffset {
                path,
                offset,
                ref_ctr_offset,
            } => {
                write!(f, "{path}:0x{offset:016x}")?;
                match ref_ctr_offset {
                    Some(r) => write!(f, "(0x{r:x})"),
                    None => Ok(()),
                }
            }
        }
    }
}

impl fmt::Display for ProbeDef {
    /// The line the kernel's `kprobe_events` (or `uprobe_events`) file shows for this probe,
    /// without the newline, e.g. `p:kprobes/p_work_0 work a=%di:u64` or
    /// `r:uprobes/p_bash_0x4245c0 /bin/bash:0x00000000004245c0`
    /// (trace_kprobe.c `trace_kprobe_show`, trace_uprobe.c `trace_uprobe_show`): `r` for
    /// every return probe (also `SYM%return`), MAXACTIVE after it, the group, the target,
    /// then each argument as `NAME=FETCHARG[:TYPE]`. The kernel repeats each argument as it
    /// was typed; ftprobe prints its canonical spelling, which parses back to the same
    /// definition.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            ProbeKind::Kprobe => f.write_str("p")?,
            ProbeKind::Kretprobe { maxactive } => {
                f.write_str("r")?;
                match (maxactive, &self.target) {
                    (_, ProbeTarget::FileOffset { .. }) | (None, _) => {}
                    (Some(n), _) => write!(f, "{n}")?,
                }
            }
        }
        write!(f, ":{}/{} {}", self.group, self.event, self.target)?;
        for a in &self.args {
            write!(f, " {a}")?;
        }
        Ok(())
    }
}
