//! kprobe events (kernel/trace/trace_kprobe.c): a definition in the `kprobe_events` language
//! becomes a [`Kprobe`] whose pre_handler fetches the event's arguments from the registers
//! and the stack and writes one record into this thread's ring.
//!
//! Record [`rtype::KPROBE`]: aux = CPU | event id << 12; words: tsc, probe address, a bitmask
//! of arguments whose memory read faulted (printed `(fault)`), then one word per argument
//! (two for `$comm`: the thread's name, NUL-padded, read at the hit).
//!
//! Supported today: `p` probes on ftrace sites; fetch args `%REG`, `$argN`, `$stackN`,
//! `$stack`, `$comm`, `\IMM` with the integer and `char` types and bitfields. The rest of the
//! grammar parses (see [`crate::events`]) and is refused here with `NOT_SUPPORTED` at its
//! position: return probes, `PATH:OFFSET` targets, memory dereferences and strings come with
//! the int3 and fetch-arg work.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::events::{
    parse_probe_command, FetchOp, FetchType, ProbeCommand, ProbeDef, ProbeError, ProbeErrorKind,
    ProbeKind, ProbeTarget, MAX_TRACE_ARGS,
};
use crate::ftrace::{self as ft, PtRegs, FTRACE_FL_AFTER_PROLOGUE};
use crate::kprobes::{self, Kprobe, KprobeError, KprobeTarget};
use crate::trace::{self, rtype};

/// Words before the arguments in a record: tsc, address, fault mask.
pub const RECORD_HEAD_WORDS: usize = 3;

/// A kprobe event: its definition, its probe, its counters.
pub struct TraceKprobe {
    /// Index of the event in the session (the record's event id).
    pub id: u32,
    /// The definition.
    pub def: ProbeDef,
    /// The probe.
    pub kp: &'static Kprobe,
    args: Vec<Fetch>,
    /// Whether the site stands after the prologue (stack arguments are above `rbp`).
    after_prologue: bool,
    dropped: AtomicU64,
}

impl TraceKprobe {
    /// Hits whose record could not be written (ring full, no ring for the thread). The
    /// event's hits (`kprobe_profile`'s first column) are its records plus these: the probe
    /// path counts nothing else, since an atomic increment per hit (the kernel uses a per-CPU
    /// counter) cost ~14 ns here.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

#[derive(Clone, Copy)]
enum Fetch {
    Reg(crate::events::Reg),
    Arg(u32),
    Stack(u32),
    StackPtr,
    Imm(u64),
    /// `$comm`: the thread's name, 16 bytes in two words.
    Comm,
}

impl Fetch {
    /// Words this argument takes in a record.
    fn words(&self) -> usize {
        match self {
            Fetch::Comm => 2,
            _ => 1,
        }
    }
}

/// Byte offset of the probe target in a command: its second word.
fn target_pos(cmd: &str) -> usize {
    let mut in_word = false;
    let mut words = 0;
    for (i, c) in cmd.char_indices() {
        let ws = c.is_ascii_whitespace();
        if !ws && !in_word {
            words += 1;
            if words == 2 {
                return i;
            }
        }
        in_word = !ws;
    }
    0
}

fn compile(def: &ProbeDef, cmd: &str) -> Result<Vec<Fetch>, EventError> {
    let not_yet = |pos: usize, what: &str| EventError {
        err: ProbeError::new(ProbeErrorKind::NotSupported, pos),
        detail: Some(format!("{what} are not implemented yet")),
    };
    if let ProbeKind::Kretprobe { .. } = def.kind {
        return Err(not_yet(0, "return probes (r, SYM%return)"));
    }
    if let ProbeTarget::FileOffset { .. } = def.target {
        return Err(not_yet(
            target_pos(cmd),
            "PATH:OFFSET probes (they need int3 probes)",
        ));
    }
    def.args
        .iter()
        .map(|a| {
            let scalar = !matches!(
                a.ty,
                FetchType::String
                    | FetchType::Ustring
                    | FetchType::Symbol
                    | FetchType::Symstr
                    | FetchType::Array { .. }
            );
            match &a.fetch {
                FetchOp::Comm if a.ty == FetchType::String => Ok(Fetch::Comm),
                _ if !scalar => Err(not_yet(a.pos, "string, symbol and array types")),
                FetchOp::Reg(r) => Ok(Fetch::Reg(*r)),
                FetchOp::Arg(n) => Ok(Fetch::Arg(*n)),
                FetchOp::Stack(n) => Ok(Fetch::Stack(*n)),
                FetchOp::StackPtr => Ok(Fetch::StackPtr),
                FetchOp::Imm(v) => Ok(Fetch::Imm(*v)),
                _ => Err(not_yet(
                    a.pos,
                    "memory fetch args (@ADDR, @SYM, +OFFS(...)) and immediate strings",
                )),
            }
        })
        .collect()
}

/// Parse a definition and check that ftprobe can run it, without arming anything: what the
/// CLI does before starting the program.
pub fn check(cmd: &str) -> Result<ProbeDef, EventError> {
    let def = match parse_probe_command(cmd).map_err(|err| EventError { err, detail: None })? {
        ProbeCommand::Add(d) => d,
        ProbeCommand::Remove { .. } => {
            return Err(EventError {
                err: ProbeError::new(ProbeErrorKind::NotSupported, 0),
                detail: None,
            })
        }
    };
    compile(&def, cmd)?;
    Ok(def)
}

/// Why an event could not be created: the kernel-style error, and ftprobe's detail.
#[derive(Debug)]
pub struct EventError {
    /// Name, text and caret position.
    pub err: ProbeError,
    /// What exactly (e.g. which symbol, where the site is).
    pub detail: Option<String>,
}

impl std::fmt::Display for EventError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.err.kind)?;
        if let Some(d) = &self.detail {
            write!(f, " ({d})")?;
        }
        Ok(())
    }
}

/// Parse, compile and register a `p` definition as event `id`. Needs [`ft::init`] done and a
/// trace buffer set ([`trace::set_buffer`]) for records to be written.
pub fn create(id: u32, cmd: &str) -> Result<&'static TraceKprobe, EventError> {
    let plain = |err| EventError { err, detail: None };
    let def = match parse_probe_command(cmd).map_err(plain)? {
        ProbeCommand::Add(d) => d,
        ProbeCommand::Remove { .. } => {
            return Err(plain(ProbeError::new(ProbeErrorKind::NotSupported, 0)))
        }
    };
    let args = compile(&def, cmd)?;
    let target = match &def.target {
        ProbeTarget::Symbol { obj, sym, offset } => KprobeTarget::Symbol {
            module: obj.clone(),
            name: sym.clone(),
            offset: *offset,
        },
        ProbeTarget::Address(a) => KprobeTarget::Addr(*a),
        ProbeTarget::FileOffset { .. } => unreachable!("refused by compile"),
    };
    let at = target_pos(cmd);
    let reg_err = |e: KprobeError| {
        let kind = match &e {
            KprobeError::NoSymbol(_)
            | KprobeError::NoObject(_)
            | KprobeError::OffsetOutside { .. } => ProbeErrorKind::BadProbeAddr,
            KprobeError::NotUnique { .. } => ProbeErrorKind::NonUniqSymbol,
            KprobeError::NotInsnBoundary
            | KprobeError::Insn(crate::arch::x86_64::insn::InsnError::NotBoundary) => {
                ProbeErrorKind::BadInsnBndry
            }
            _ => ProbeErrorKind::FailRegProbe,
        };
        // The detail only where it adds to the kernel's text.
        let detail = (e.to_string() != kind.text()).then(|| e.to_string());
        EventError {
            err: ProbeError::new(kind, at),
            detail,
        }
    };
    let addr = kprobes::resolve(&target).map_err(reg_err)?.addr;
    let after_prologue = ft::record(addr).is_some_and(|r| r.flags & FTRACE_FL_AFTER_PROLOGUE != 0);
    let kp: &'static Kprobe =
        Box::leak(Box::new(Kprobe::new(target, Some(kprobe_dispatcher), None)));
    let tk: &'static TraceKprobe = Box::leak(Box::new(TraceKprobe {
        id,
        def,
        kp,
        args,
        after_prologue,
        dropped: AtomicU64::new(0),
    }));
    kp.data
        .store(tk as *const TraceKprobe as u64, Ordering::Relaxed);
    kprobes::register_kprobe(kp).map_err(reg_err)?;
    Ok(tk)
}

/// Probe path: a register out of `regs` by its offset. (`Reg::value`'s match compiles to a
/// copy of all of `pt_regs` onto the stack here: 200 bytes of frame, which small signal
/// stacks cannot spare.)
#[inline(always)]
fn reg_value(regs: &PtRegs, r: crate::events::Reg) -> u64 {
    const WORDS: usize = std::mem::size_of::<PtRegs>() / 8;
    // SAFETY: PtRegs is repr(C) and made only of u64 fields, so it has the layout of
    // [u64; WORDS]; the reference is valid for the call.
    let words = unsafe { &*(regs as *const PtRegs as *const [u64; WORDS]) };
    words.get(r.pt_regs_offset() / 8).copied().unwrap_or(0)
}

/// Probe path: read argument `n` (1-based) by the SysV ABI at function entry.
fn fetch_arg(n: u32, regs: &PtRegs, after_prologue: bool) -> Option<u64> {
    Some(match n {
        1 => regs.rdi,
        2 => regs.rsi,
        3 => regs.rdx,
        4 => regs.rcx,
        5 => regs.r8,
        6 => regs.r9,
        _ => {
            // At entry arg 7 is just above the return address; after `push %rbp; mov
            // %rsp,%rbp` it is at 16(%rbp).
            let base = if after_prologue {
                regs.rbp + 16
            } else {
                regs.sp + 8
            };
            return crate::sys::read_u64_nofault(base + 8 * (n as u64 - 7));
        }
    })
}

/// Probe path: the pre_handler of every kprobe event.
fn kprobe_dispatcher(p: &Kprobe, regs: &mut PtRegs) -> i32 {
    // SAFETY: `data` holds the leaked TraceKprobe set before the probe was registered.
    let tk = unsafe { &*(p.data.load(Ordering::Relaxed) as *const TraceKprobe) };
    let Some(w) = trace::this_thread_ring() else {
        tk.dropped.fetch_add(1, Ordering::Relaxed);
        return 0;
    };
    let (tsc, cpu) = trace::clock();
    let n = tk
        .args
        .iter()
        .map(|a| a.words())
        .sum::<usize>()
        .min(MAX_TRACE_ARGS * 2);
    // Stored straight into the ring: a stack buffer for 128 arguments overflowed small
    // stacks (a sigaltstack of a few KiB).
    let written = w.write_with(
        rtype::KPROBE,
        cpu | (tk.id << 12),
        RECORD_HEAD_WORDS + n,
        |slots| {
            slots[0].store(tsc, Ordering::Relaxed);
            slots[1].store(p.addr(), Ordering::Relaxed);
            let mut faults = 0u64;
            let mut at = RECORD_HEAD_WORDS;
            for (i, a) in tk.args.iter().enumerate() {
                let v = match *a {
                    Fetch::Reg(r) => Some(reg_value(regs, r)),
                    Fetch::Arg(k) => fetch_arg(k, regs, tk.after_prologue),
                    Fetch::Stack(k) => crate::sys::read_u64_nofault(regs.sp + 8 * k as u64),
                    Fetch::StackPtr => Some(regs.sp),
                    Fetch::Imm(v) => Some(v),
                    Fetch::Comm => {
                        // The thread's name now, as the kernel reads current->comm per hit.
                        let c = crate::sys::thread_comm();
                        if let Some(s) = slots.get(at) {
                            s.store(
                                u64::from_le_bytes(c[..8].try_into().unwrap_or_default()),
                                Ordering::Relaxed,
                            );
                        }
                        at += 1;
                        Some(u64::from_le_bytes(c[8..].try_into().unwrap_or_default()))
                    }
                };
                if v.is_none() && i < 64 {
                    faults |= 1 << i;
                }
                if let Some(s) = slots.get(at) {
                    s.store(v.unwrap_or(0), Ordering::Relaxed);
                }
                at += 1;
            }
            slots[2].store(faults, Ordering::Relaxed);
        },
    );
    if !written {
        tk.dropped.fetch_add(1, Ordering::Relaxed);
    }
    0
}
