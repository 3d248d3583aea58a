//! kprobe events (kernel/trace/trace_kprobe.c): a definition in the `kprobe_events` language
//! becomes a [`Kprobe`] whose pre_handler fetches the event's arguments from the registers,
//! the stack and memory, and writes one record into this thread's ring.
//!
//! Supported: `p` probes (on ftrace sites, and int3 probes on any instruction boundary), and
//! return probes (`r[MAXACTIVE] SYM`, `p SYM%return`) through a [`Kretprobe`]; every fetch arg
//! (`%REG`, `$argN`, `$stackN`, `$stack`, `$comm`, `\IMM`, `\"STR"`, `@ADDR`, `@SYM[+|-OFFS]`,
//! `@+OFFS` (`PATH:OFFSET` probes), `+|-[u]OFFS(FETCHARG)`, and `$retval` in return probes)
//! with every type (integers, `char`, `string`, `ustring`, `symbol`, `symstr`, bitfields,
//! `TYPE[N]`). In a return probe `$argN` is saved at the function's entry (up to four different
//! N) and everything else, dereferences included, is read at the return, as the kernel does
//! since 6.10; `$retval` is `rax`. Refused with `NOT_SUPPORTED` at their position: `\IMM:string[N]`
//! (the kernel's array loop goes back to the instruction before the store, which is the
//! immediate, not a dereference, and the fetch fails with -EILSEQ).
//!
//! # Fetching
//!
//! An argument compiles to the kernel's fetch program (trace_probe.c `parse_probe_arg()`,
//! `finalize_fetch_insn()`), flattened: a base value (`%REG`, `$argN`, `$stackN`, `$stack`,
//! `\IMM`; `@ADDR` and `@SYM+OFFS` are the immediate address followed by a dereference, the
//! symbol resolved when the event is created), dereferences `val = *(u64 *)(val + OFFS)`
//! innermost first, then the store. As in the kernel the outermost dereference becomes the
//! store: `+8(+16(%di)):s64` loads the word at `%di+16`, then stores the 8 bytes at that
//! value `+8`; `+0(%di):string` stores the string at `%di`; `+0(%di):string[N]` reads N
//! pointers at `%di`, `%di+8`, ... and stores the string each points to; `symstr` keeps its
//! dereference (it symbolizes the loaded value). Every memory read is fault-safe
//! ([`sys::read_nofault`], [`sys::read_u64_nofault`], [`sys::strncpy_nofault`]: plain loads
//! whose faults ftprobe's handler resumes, `arch::x86_64::uaccess`, or `process_vm_readv`
//! where that is not safe): a bad pointer marks the argument `(fault)` and the program runs on. In one process user and kernel memory are the same:
//! `ustring` and `+uOFFS` read as `string` and `+OFFS`.
//!
//! # Record layout
//!
//! Record [`rtype::KPROBE`] (its header decoded by [`crate::record::Record::decode`], the
//! arguments by [`RecordDecoder`]), aux = CPU | event id << 12. Words:
//!
//! ```text
//!  0              tsc
//!  1              probe address (a return event: the function's probed address)
//!  2 .. 2+M       fault mask, M = max(1, ceil(nargs / 64)) words (record_head_words): bit
//!                 i % 64 of word i / 64 is set when argument i could not be fetched
//!  2+M            a return event only: the address the function returned to
//!  fixed part     per argument, in order:
//!    u*, s*, x*, char, bitfield, symbol, symstr   1 word, the value in its low bytes (a
//!                                                 bitfield: its container; symstr: the address)
//!    TYPE[N] of those                             ceil(N * size / 8) words: the N elements
//!                                                 packed as in memory, the rest zero
//!    string, ustring                              1 data_loc word
//!    string[N], ustring[N]                        N data_loc words
//!    $comm                                        2 words: the thread's name, NUL-padded
//!    \"STR"                                       none (the text is the definition's)
//!  data area      the strings' bytes, each with its NUL, back to back, padded to a word
//!
//!  data_loc: bits 0..32 byte offset in the data area | bits 32..64 length, NUL included;
//!            length 0: the string could not be read (printed `(fault)`, as the kernel's
//!            zero-length data_loc)
//! ```
//!
//! Strings are variable-length, and the ring needs a record's size before it is written:
//! like the kernel (`__get_data_size()` then `store_trace_args()`), the probe path measures
//! every string first ([`sys::strnlen_nofault`], at most [`MAX_STRING_SIZE`] bytes, NUL
//! included), reserves the sum (capped so the record stays within [`MAX_RECORD_WORDS`]),
//! then reads each string straight into the ring, bounded by `MAX_STRING_SIZE` and the room
//! left. A string with no NUL in its first `MAX_STRING_SIZE` bytes is cut to
//! `MAX_STRING_SIZE - 1` bytes and a NUL (`strncpy_from_kernel_nofault()`); one that grew
//! between the passes is cut to the room left, and the later ones get what remains, as the
//! kernel's shrinking `maxlen` does. No allocation, no lock; the stack holds one 128-byte
//! buffer while measuring.

use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::Mutex;

use crate::events::{
    parse_probe_command, FetchArg, FetchOp, FetchType, ProbeCommand, ProbeDef, ProbeError,
    ProbeErrorKind, ProbeKind, ProbeTarget, Reg, MAX_STRING_SIZE, MAX_TRACE_ARGS,
};
use crate::ftrace::{self as ft, PtRegs, FTRACE_FL_AFTER_PROLOGUE};
use crate::kprobes::{self, Kprobe, KprobeError, KprobeTarget, Kretprobe, KretprobeInstance};
use crate::ring::{EventCounters, MAX_RECORD_WORDS};
use crate::sys;
use crate::trace::{self, rtype};

/// Words before the arguments in a record of an event with at most 64 arguments: tsc,
/// address, fault mask. See [`record_head_words`].
pub const RECORD_HEAD_WORDS: usize = 3;

/// Most words of a fault mask.
const MAX_MASK_WORDS: usize = MAX_TRACE_ARGS.div_ceil(64);

/// Words before the arguments in a record of an event with `nargs` arguments: tsc, address,
/// and one fault-mask word per 64 arguments (at least one).
pub const fn record_head_words(nargs: usize) -> usize {
    let m = nargs.div_ceil(64);
    2 + if m == 0 { 1 } else { m }
}

/// A kprobe event: its definition, its probe, its counters.
pub struct TraceKprobe {
    /// Index of the event in the session (the record's event id).
    pub id: u32,
    /// The definition.
    pub def: ProbeDef,
    /// The probe (for a return event, its kretprobe's entry probe).
    pub kp: &'static Kprobe,
    /// A return event's kretprobe.
    pub rp: Option<&'static Kretprobe>,
    /// A return event's `$argN` saved at entry, by slot.
    entry_args: Vec<u32>,
    args: Vec<Fetch>,
    /// [`record_head_words`] of the event.
    head_words: usize,
    /// Words of the fixed part (every argument's words; the data area excluded).
    fixed_words: usize,
    /// Some argument is a string read from memory: records have a data area.
    dynamic: bool,
    /// Arguments that are one string ([`Store::Str`]).
    strings: usize,
    /// Some argument reads memory ([`Fetch::reads_memory`]).
    reads_memory: bool,
    /// Every argument is a register's value (`%REG`, `$arg1`-`$arg6`, no dereference, no
    /// array) of an entry event: the `pt_regs` word of each, which `write_event` copies
    /// straight into the record (nothing can fault: the mask is 0), without the general
    /// per-argument program. The record is the same.
    regs_only: Option<Box<[u8]>>,
    /// Otherwise, every argument of an entry event (at most 64) is a register's value, one
    /// load of at most 8 bytes at a register or an address plus an offset (`+8(%di):u32`,
    /// `@var:u64`), or the string there (`+0(%si):string`, `@name:string`): the short
    /// program `write_event` runs instead of the general one (no chain of dereferences, no
    /// array). The record is the same.
    fast: Option<Box<[FastArg]>>,
    /// Whether the site stands after the prologue (stack arguments are above `rbp`); set
    /// each time the probe is armed (its object may be loaded later).
    after_prologue: AtomicBool,
    /// Not armed: its object (`OBJ:SYM`) is not loaded yet ([`objects_loaded`] arms it).
    pending: AtomicBool,
    /// `PATH:OFFSET(REF_CTR_OFFSET)`: the address of the 16-bit reference counter (an SDT
    /// marker's semaphore) in the program's data.
    ref_ctr: Option<u64>,
    /// This probe holds one count of `ref_ctr` (it is armed and enabled).
    ref_ctr_held: AtomicBool,
    dropped: AtomicU64,
    /// The event's counters in the trace buffer's shared header, when there is one: the
    /// reader gets `dropped` and `nmissed` from there, even if this process never exits.
    shared: Option<&'static EventCounters>,
}

impl TraceKprobe {
    /// Take (`true`) or give back this probe's count of its reference counter, once each:
    /// the kernel's uprobes add 1 to the counter when they install the breakpoint and take
    /// it back when they remove it (kernel/events/uprobes.c `update_ref_ctr()`), so that a
    /// marker guarded by `if (PROVIDER_NAME_ENABLED())` runs while it is probed. The agent
    /// runs in the program: the counter is the program's own variable, changed with an
    /// atomic add (another probe, or the program, may change it meanwhile).
    fn hold_ref_ctr(&self, on: bool) {
        let Some(addr) = self.ref_ctr else {
            return;
        };
        if self.ref_ctr_held.swap(on, Ordering::AcqRel) == on {
            return;
        }
        // SAFETY: `addr` is in a writable segment of a loaded object and 2-byte aligned
        // (checked when the event was created); an object is not unloaded while a probe in
        // it is registered. `AtomicU16` has the layout of `u16`.
        let ctr = unsafe { AtomicU16::from_ptr(addr as *mut u16) };
        if on {
            ctr.fetch_add(1, Ordering::SeqCst);
        } else {
            ctr.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Hits whose record could not be written (ring full, no ring for the thread). The
    /// event's hits (`kprobe_profile`'s first column) are its records plus these: the probe
    /// path counts nothing else, since an atomic increment per hit (the kernel uses a per-CPU
    /// counter) cost ~14 ns here.
    pub fn dropped(&self) -> u64 {
        self.dropped_counter().load(Ordering::Relaxed)
    }

    /// Which program a hit of this event runs while short programs are on
    /// ([`set_fast_programs`]): `"registers"`, `"fast"` or `"general"`.
    pub fn program(&self) -> &'static str {
        match (&self.regs_only, &self.fast, self.rp) {
            (_, _, Some(_)) => "general",
            (Some(_), _, None) => "registers",
            (None, Some(_), None) => "fast",
            (None, None, None) => "general",
        }
    }

    /// Probe path: how this hit reads memory, if the event reads any.
    #[inline(always)]
    fn nofault(&self) -> sys::Nofault {
        if self.reads_memory {
            sys::Nofault::now()
        } else {
            sys::Nofault::SYSCALL
        }
    }

    fn dropped_counter(&self) -> &AtomicU64 {
        self.shared.map_or(&self.dropped, |c| &c.dropped)
    }
}

/// Where an argument's value starts: the kernel's first fetch instruction.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Base {
    Reg(Reg),
    Arg(u32),
    Stack(u32),
    StackPtr,
    Imm(u64),
    /// `@SYM+OFFS` before [`create`] resolves it into an [`Base::Imm`].
    Sym {
        name: String,
        offset: i64,
    },
    /// `@+OFFS` (a `PATH:OFFSET` probe) before [`create`] resolves it into an
    /// [`Base::Imm`].
    FileOff(i64),
    /// `$comm` and `\"STR"`: no value (their store says what is stored).
    None,
    /// `$retval` (a return probe): `rax` at the return.
    Retval,
    /// `$argN` of a return probe: the value saved at the function's entry, in this slot of
    /// the call's instance data.
    Entry(u8),
}

/// How an argument is stored in the record (the kernel's store instruction), see the module
/// docs for the words each takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Store {
    /// The value itself.
    Raw,
    /// `count` elements of `size` bytes at value + `off`, packed.
    Mem { off: i64, size: u32, count: u32 },
    /// The string at value + `off`.
    Str { off: i64 },
    /// `count` strings, pointed to by the words at value + `off`, + 8, ...
    StrArray { off: i64, count: u32 },
    /// `$comm`: the thread's name.
    Comm,
    /// `\"STR"`: nothing (the text is in the definition).
    Const,
}

impl Store {
    /// Words in the record's fixed part.
    fn words(self) -> usize {
        match self {
            Store::Raw | Store::Str { .. } => 1,
            Store::Mem { size, count, .. } => (size as usize * count as usize).div_ceil(8),
            Store::StrArray { count, .. } => count as usize,
            Store::Comm => 2,
            Store::Const => 0,
        }
    }

    /// Stores strings in the data area.
    fn is_dynamic(self) -> bool {
        matches!(self, Store::Str { .. } | Store::StrArray { .. })
    }
}

/// One argument's compiled fetch program.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Fetch {
    base: Base,
    /// Offsets of the dereferences between the base and the store, innermost first.
    derefs: Box<[i64]>,
    store: Store,
}

impl Fetch {
    /// Whether the argument reads memory on a hit: a dereference, a store from memory, a
    /// stack slot (`$stackN`, `$argN` for N > 6).
    fn reads_memory(&self) -> bool {
        !self.derefs.is_empty()
            || matches!(
                self.store,
                Store::Mem { .. } | Store::Str { .. } | Store::StrArray { .. }
            )
            || matches!(self.base, Base::Stack(_))
            || matches!(self.base, Base::Arg(n) if n > 6)
    }
}

/// `op` as a base and its dereferences (appended to `derefs`, innermost first); `Err` names
/// what is not supported.
fn flatten(op: &FetchOp, derefs: &mut Vec<i64>) -> Result<Base, &'static str> {
    Ok(match op {
        FetchOp::Reg(r) => Base::Reg(*r),
        FetchOp::Arg(n) => Base::Arg(*n),
        FetchOp::Stack(n) => Base::Stack(*n),
        FetchOp::StackPtr => Base::StackPtr,
        FetchOp::Imm(v) => Base::Imm(*v),
        FetchOp::Comm | FetchOp::ImmStr(_) => Base::None,
        // The kernel: FETCH_OP_IMM of the address, then FETCH_OP_DEREF with offset 0.
        FetchOp::Mem(a) => {
            derefs.push(0);
            Base::Imm(*a)
        }
        FetchOp::Sym { name, offset } => {
            derefs.push(0);
            Base::Sym {
                name: name.clone(),
                offset: *offset,
            }
        }
        FetchOp::Deref { offset, inner, .. } => {
            let b = flatten(inner, derefs)?;
            derefs.push(*offset);
            b
        }
        FetchOp::Retval => Base::Retval,
        // The kernel: FETCH_OP_FOFFS, then FETCH_OP_DEREF with offset 0.
        FetchOp::FileOffset(o) => {
            derefs.push(0);
            Base::FileOff(*o)
        }
    })
}

/// Compile one argument; `Err` names what ftprobe does not support.
fn compile_arg(a: &FetchArg) -> Result<Fetch, &'static str> {
    let mut derefs = Vec::new();
    let base = flatten(&a.fetch, &mut derefs)?;
    let (elem, count) = match &a.ty {
        FetchType::Array { elem, len } => (&**elem, Some(*len)),
        t => (t, None),
    };
    let store = match (&a.fetch, elem) {
        (FetchOp::Comm, _) => Store::Comm,
        (FetchOp::ImmStr(_), _) => Store::Const,
        (_, FetchType::String | FetchType::Ustring) => match (derefs.pop(), count) {
            (Some(off), Some(count)) => Store::StrArray { off, count },
            (Some(off), None) => Store::Str { off },
            // `\ADDR:string`: the string at the immediate address.
            (None, None) => Store::Str { off: 0 },
            (None, Some(_)) => {
                return Err(
                    "string arrays of an immediate are not supported (the kernel's \
                            array loop re-runs the immediate as a store and fails)",
                )
            }
        },
        // The parser refuses them (BAD_STRING), as the kernel.
        (_, FetchType::Symstr) if count.is_some() => return Err("symstr arrays are not supported"),
        // The kernel keeps symstr's dereference: it symbolizes the loaded word.
        (_, FetchType::Symstr) => match derefs.pop() {
            Some(off) => Store::Mem {
                off,
                size: 8,
                count: 1,
            },
            None => Store::Raw,
        },
        _ => match derefs.pop() {
            Some(off) => Store::Mem {
                off,
                size: elem.size() as u32,
                count: count.unwrap_or(1),
            },
            None if count.is_none() => Store::Raw,
            // The parser refuses arrays of registers (BAD_STRING), as the kernel.
            None => return Err("arrays of a value that is not in memory are not supported"),
        },
    };
    Ok(Fetch {
        base,
        derefs: derefs.into_boxed_slice(),
        store,
    })
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

fn compile(def: &ProbeDef) -> Result<Vec<Fetch>, EventError> {
    let mut args: Vec<Fetch> = def
        .args
        .iter()
        .map(|a| {
            compile_arg(a).map_err(|what| EventError {
                err: ProbeError::new(ProbeErrorKind::NotSupported, a.pos),
                detail: Some(what.to_owned()),
            })
        })
        .collect::<Result<_, _>>()?;
    if let ProbeKind::Kretprobe { .. } = def.kind {
        // `$argN` of a return probe is saved at the function's entry and read at its
        // return (the kernel since 6.10, `store_trace_entry_data()`): each distinct N takes
        // a word of the call's instance data; dereferences happen at the return.
        let mut saved: Vec<u32> = Vec::new();
        for (f, a) in args.iter_mut().zip(&def.args) {
            if let Base::Arg(n) = f.base {
                let slot = match saved.iter().position(|&m| m == n) {
                    Some(k) => k,
                    None if saved.len() < ENTRY_WORDS => {
                        saved.push(n);
                        saved.len() - 1
                    }
                    None => {
                        return Err(EventError {
                            err: ProbeError::new(ProbeErrorKind::TooManyArgs, a.pos),
                            detail: Some(format!(
                                "a return probe saves at most {ENTRY_WORDS} different $argN \
                                 at the function's entry"
                            )),
                        })
                    }
                };
                f.base = Base::Entry(slot as u8);
            }
        }
    }
    Ok(args)
}

/// Words of entry data a return event keeps per call: its `$argN` values.
const ENTRY_WORDS: usize = crate::ftrace::fgraph::FGRAPH_DATA_WORDS;

/// The `$argN` (1-based) a return event saves at entry, by slot.
fn entry_args(args: &[Fetch], def: &ProbeDef) -> Vec<u32> {
    let mut out: Vec<u32> = Vec::new();
    for (f, a) in args.iter().zip(&def.args) {
        if let Base::Entry(k) = f.base {
            let mut d = Vec::new();
            if let Ok(Base::Arg(n)) = flatten(&a.fetch, &mut d) {
                if out.len() <= k as usize {
                    out.resize(k as usize + 1, 0);
                }
                out[k as usize] = n;
            }
        }
    }
    out
}

/// Parse a definition and check that ftprobe can run it, without arming anything: what the
/// CLI does before starting the program.
pub fn check(cmd: &str) -> Result<ProbeDef, EventError> {
    let def = match parse_probe_command(cmd).map_err(|err| parse_error(cmd, err))? {
        ProbeCommand::Add(d) => d,
        ProbeCommand::Remove { .. } => {
            return Err(EventError {
                err: ProbeError::new(ProbeErrorKind::NotSupported, 0),
                detail: None,
            })
        }
    };
    compile(&def)?;
    Ok(def)
}

/// A parse error of `cmd`, with a hint where the kernel's text alone misleads: `OBJ:0xOFF`
/// with an object's short name is the kernel's `MOD:SYM` with a symbol that cannot be one
/// (BAD_PROBE_ADDR, as the kernel), where the uprobe_events form `PATH:0xOFF` was meant.
fn parse_error(cmd: &str, err: ProbeError) -> EventError {
    let target = cmd.split_whitespace().nth(1).unwrap_or("");
    let short_obj_offset = target.split_once(':').filter(|(obj, off)| {
        !obj.contains('/')
            && off
                .strip_prefix("0x")
                .is_some_and(|h| !h.is_empty() && h.bytes().all(|b| b.is_ascii_hexdigit()))
    });
    let detail = match (err.kind, short_obj_offset) {
        (ProbeErrorKind::BadProbeAddr, Some((obj, off))) => Some(format!(
            "a file offset needs the object's path: PATH:{off}, as in uprobe_events \
             (/path/to/{obj}:{off}); {obj}:SYMBOL names a symbol"
        )),
        _ => None,
    };
    EventError { err, detail }
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
    let _busy = crate::probe_state::KprobeBusy::begin();
    create_with(id, cmd, true)
}

/// [`create`] an event disabled, as a write to the kernel's `kprobe_events` does: its probe
/// is registered (its address checked, an int3 probe's instruction decoded) but not armed
/// until [`enable`].
pub fn create_disabled(id: u32, cmd: &str) -> Result<&'static TraceKprobe, EventError> {
    let _busy = crate::probe_state::KprobeBusy::begin();
    create_with(id, cmd, false)
}

/// Every probe of event `id` (an event may have several: the kernel's multi-probe events).
fn probes_of(id: u32) -> Vec<&'static TraceKprobe> {
    EVENTS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .copied()
        .filter(|tk| tk.id == id)
        .collect()
}

/// Enable or disable event `id` (`events/GRP/EVENT/enable`): each of its probes is armed
/// or disarmed through the batch `text_poke` protocol. A pending probe (its object not
/// loaded) keeps the state for when it is armed.
pub fn enable(id: u32, on: bool) -> Result<(), KprobeError> {
    let _busy = crate::probe_state::KprobeBusy::begin();
    let probes = probes_of(id);
    if probes.is_empty() {
        return Err(KprobeError::NotRegistered);
    }
    for tk in probes {
        if tk.is_pending() {
            if on {
                tk.kp
                    .flags
                    .fetch_and(!kprobes::KPROBE_FLAG_DISABLED, Ordering::Relaxed);
            } else {
                tk.kp
                    .flags
                    .fetch_or(kprobes::KPROBE_FLAG_DISABLED, Ordering::Relaxed);
            }
            continue;
        }
        if on {
            kprobes::enable_kprobe(tk.kp)?;
        } else {
            kprobes::disable_kprobe(tk.kp)?;
        }
        tk.hold_ref_ctr(on);
    }
    Ok(())
}

/// Remove event `id` (`-:EVENT` in `kprobe_events`): each of its probes is unregistered
/// (its bytes back). The event's memory is kept (a thread may still run its handler).
pub fn remove(id: u32) -> Result<(), KprobeError> {
    let _busy = crate::probe_state::KprobeBusy::begin();
    let probes: Vec<&'static TraceKprobe> = {
        let mut events = EVENTS.lock().unwrap_or_else(|e| e.into_inner());
        let (gone, kept) = events.iter().partition(|tk| tk.id == id);
        *events = kept;
        gone
    };
    if probes.is_empty() {
        return Err(KprobeError::NotRegistered);
    }
    let mut result = Ok(());
    for tk in probes {
        if tk.is_pending() {
            continue;
        }
        let r = match tk.rp {
            None => kprobes::unregister_kprobe(tk.kp),
            Some(rp) => kprobes::unregister_kretprobe(rp),
        };
        if r.is_ok() {
            tk.hold_ref_ctr(false);
        }
        if let Err(e) = r {
            EVENTS.lock().unwrap_or_else(|e| e.into_inner()).push(tk);
            result = Err(e);
        }
    }
    result
}

fn create_with(id: u32, cmd: &str, enabled: bool) -> Result<&'static TraceKprobe, EventError> {
    let plain = |err| EventError { err, detail: None };
    let def = match parse_probe_command(cmd).map_err(|err| parse_error(cmd, err))? {
        ProbeCommand::Add(d) => d,
        ProbeCommand::Remove { .. } => {
            return Err(plain(ProbeError::new(ProbeErrorKind::NotSupported, 0)))
        }
    };
    let mut args = compile(&def)?;
    let at = target_pos(cmd);
    // The kernel resolves `@SYM` when it registers the event, before the probe, and fails
    // with -ENOENT, logged as BAD_PROBE_ADDR at the target (trace_kprobe.c): it no longer
    // knows which argument failed. ftprobe does, and puts the caret under its `@SYM`.
    resolve_symbols(&mut args).map_err(|(i, name)| EventError {
        err: ProbeError::new(
            ProbeErrorKind::BadProbeAddr,
            sym_pos(cmd, def.args[i].pos, &name).unwrap_or(at),
        ),
        detail: Some(format!(
            "@{name}: no data or function symbol {name:?} in the loaded objects"
        )),
    })?;
    let target = match &def.target {
        ProbeTarget::Symbol { obj, sym, offset } => KprobeTarget::Symbol {
            module: obj.clone(),
            name: sym.clone(),
            offset: *offset,
        },
        ProbeTarget::Address(a) => KprobeTarget::Addr(*a),
        // uprobe_events' PATH:OFFSET: a file offset in a loaded object.
        ProbeTarget::FileOffset { path, offset, .. } => {
            match ft::addr_of_file_offset(path, *offset) {
                Ok(a) => KprobeTarget::Addr(a),
                Err(_) => {
                    return Err(EventError {
                        err: ProbeError::new(ProbeErrorKind::FileNotFound, target_pos(cmd)),
                        detail: Some(format!(
                    "{path}: not a loaded object, or no loadable segment holds offset {offset:#x}"
                )),
                    })
                }
            }
        }
    };
    // The reference counter (trace_uprobe.c `ref_ctr_offset`, kernel/events/uprobes.c
    // `update_ref_ctr()`): a file offset in the same object, in a writable segment, a 16-bit
    // counter (systemtap's SDT semaphores are `unsigned short`), naturally aligned.
    let ref_ctr = match &def.target {
        ProbeTarget::FileOffset {
            path,
            ref_ctr_offset: Some(r),
            ..
        } => match ft::data_addr_of_file_offset(path, *r) {
            Ok(a) if a % 2 == 0 => Some(a),
            _ => {
                // The caret under the counter's offset, after the `(`.
                let at = target_pos(cmd);
                let at = at + cmd[at..].find('(').map_or(0, |i| i + 1);
                return Err(EventError {
                    err: ProbeError::new(ProbeErrorKind::BadRefcnt, at),
                    detail: Some(format!(
                        "{path}: no writable, 2-byte aligned counter at file offset {r:#x}"
                    )),
                });
            }
        },
        _ => None,
    };
    // `@+OFFS` of a `PATH:OFFSET` probe: an address in the probed object, at the same
    // distance from the probe as OFFS from the probe's file offset (trace_uprobe.c
    // `translate_user_vaddr()`: `bp_addr - offset + file_offset`).
    if let (KprobeTarget::Addr(a), ProbeTarget::FileOffset { offset, .. }) = (&target, &def.target)
    {
        for f in args.iter_mut() {
            if let Base::FileOff(o) = f.base {
                f.base = Base::Imm(a.wrapping_sub(*offset).wrapping_add(o as u64));
            }
        }
    }
    let reg_err = |e: KprobeError| {
        let kind = match &e {
            KprobeError::NoSymbol(_)
            | KprobeError::NoObject(_)
            | KprobeError::OffsetOutside { .. }
            | KprobeError::SizeUnknown { .. } => ProbeErrorKind::BadProbeAddr,
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
    // `OBJ:SYM` of an object not loaded yet: kept, and armed when the object is loaded (the
    // kernel's trace_kprobe: "This probe might be able to register after target module is
    // loaded. Continue.", then `trace_kprobe_module_callback()`).
    let pending = match kprobes::resolve(&target) {
        Ok(_) => false,
        Err(KprobeError::NoObject(_))
            if matches!(
                &target,
                KprobeTarget::Symbol {
                    module: Some(_),
                    ..
                }
            ) =>
        {
            true
        }
        Err(e) => return Err(reg_err(e)),
    };
    let maxactive = match def.kind {
        ProbeKind::Kretprobe { maxactive } => Some(maxactive.unwrap_or(0)),
        _ => None,
    };
    if args.iter().any(Fetch::reads_memory) {
        // Memory is read with plain loads whose faults ftprobe's SIGSEGV/SIGBUS handler
        // turns into `(fault)`; when that handler cannot be made the one in place, reads
        // stay on `process_vm_readv` (slower, as safe).
        crate::arch::x86_64::uaccess::enable();
    }
    let entry = entry_args(&args, &def);
    let (kp, rp): (&'static Kprobe, Option<&'static Kretprobe>) = match maxactive {
        None => (
            Box::leak(Box::new(Kprobe::new(target, Some(kprobe_dispatcher), None))),
            None,
        ),
        Some(m) => {
            let rp: &'static Kretprobe = Box::leak(Box::new(Kretprobe::new(
                target,
                Some(kretprobe_dispatcher),
                (!entry.is_empty()).then_some(kretprobe_entry_handler as _),
                m,
            )));
            (&rp.kp, Some(rp))
        }
    };
    let shared = trace::buffer().and_then(|b| b.event_counters(id));
    let tk: &'static TraceKprobe = Box::leak(Box::new(TraceKprobe {
        id,
        kp,
        rp,
        entry_args: entry,
        head_words: record_head_words(args.len()) + usize::from(rp.is_some()),
        fixed_words: args.iter().map(|a| a.store.words()).sum(),
        dynamic: args.iter().any(|a| a.store.is_dynamic()),
        strings: args
            .iter()
            .filter(|a| matches!(a.store, Store::Str { .. }))
            .count(),
        reads_memory: args.iter().any(Fetch::reads_memory),
        regs_only: if rp.is_none() { regs_only(&args) } else { None },
        fast: if rp.is_none() { fast_args(&args) } else { None },
        args,
        after_prologue: AtomicBool::new(false),
        pending: AtomicBool::new(pending),
        ref_ctr,
        ref_ctr_held: AtomicBool::new(false),
        dropped: AtomicU64::new(0),
        shared,
        def,
    }));
    if let Some(c) = shared {
        kp.count_nmissed_in(&c.nmissed);
        if let Some(rp) = rp {
            rp.count_overrun_in(&c.nmissed);
        }
    }
    match rp {
        None => kp
            .data
            .store(tk as *const TraceKprobe as u64, Ordering::Relaxed),
        Some(rp) => rp
            .data
            .store(tk as *const TraceKprobe as u64, Ordering::Relaxed),
    }
    if !enabled {
        kp.flags
            .fetch_or(kprobes::KPROBE_FLAG_DISABLED, Ordering::Relaxed);
    }
    if !pending {
        arm(tk).map_err(|e| match e {
            KprobeError::NotFunctionEntry(_) => EventError {
                err: ProbeError::new(ProbeErrorKind::BadRetprobe, at),
                detail: Some(e.to_string()),
            },
            e => reg_err(e),
        })?;
        tk.hold_ref_ctr(enabled);
    }
    EVENTS.lock().unwrap_or_else(|e| e.into_inner()).push(tk);
    Ok(tk)
}

/// Unregister the probe of every event [`create`] made (an attached agent's detach): each
/// armed probe's bytes are put back; the events are forgotten. Returns the failures.
pub fn unregister_all() -> Vec<KprobeError> {
    let events = std::mem::take(&mut *EVENTS.lock().unwrap_or_else(|e| e.into_inner()));
    let mut failed = Vec::new();
    for tk in events {
        if tk.is_pending() {
            continue;
        }
        let r = match tk.rp {
            None => kprobes::unregister_kprobe(tk.kp),
            Some(rp) => kprobes::unregister_kretprobe(rp),
        };
        if r.is_ok() {
            tk.hold_ref_ctr(false);
        }
        if let Err(e) = r {
            failed.push(e);
        }
    }
    failed
}

/// Every event [`create`] made, for [`objects_loaded`].
static EVENTS: Mutex<Vec<&'static TraceKprobe>> = Mutex::new(Vec::new());

/// Register the event's probe (its kretprobe for a return event).
fn arm(tk: &'static TraceKprobe) -> Result<(), KprobeError> {
    let target = &tk.kp.target;
    let addr = kprobes::resolve(target)?.addr;
    // A return probe's entry probe runs at the function's entry: its `$argN` are read there
    // by the SysV rule for an entry (after_prologue is for `p` probes on `-pg` sites).
    let after_prologue = tk.rp.is_none()
        && ft::record(addr).is_some_and(|r| r.flags & FTRACE_FL_AFTER_PROLOGUE != 0);
    tk.after_prologue.store(after_prologue, Ordering::Relaxed);
    match tk.rp {
        None => kprobes::register_kprobe(tk.kp),
        Some(rp) => kprobes::register_kretprobe(rp),
    }
}

impl TraceKprobe {
    /// Whether the event waits for its object to be loaded (not armed).
    pub fn is_pending(&self) -> bool {
        self.pending.load(Ordering::Relaxed)
    }
}

/// Objects were loaded (`dlopen`, after `ft::load_objects`): arm the events that name one of
/// them (`OBJ:SYM`) and wait for it (pending), or whose probe is GONE (their object was
/// unloaded, and is loaded again): a GONE probe is unregistered and registered again, as the
/// kernel's `trace_kprobe_module_callback()` does on MODULE_STATE_COMING. Returns the events
/// armed, and those that could not be (with why).
pub fn objects_loaded() -> (usize, Vec<(&'static TraceKprobe, KprobeError)>) {
    let _busy = crate::probe_state::KprobeBusy::begin();
    let events: Vec<&'static TraceKprobe> =
        EVENTS.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let mut armed = 0;
    let mut failed = Vec::new();
    for tk in events {
        let KprobeTarget::Symbol {
            module: Some(m), ..
        } = &tk.kp.target
        else {
            continue;
        };
        let gone = tk.kp.flags() & kprobes::KPROBE_FLAG_GONE != 0;
        if !(tk.is_pending() || gone) || !ft::has_module(m) {
            continue;
        }
        if gone {
            let r = match tk.rp {
                None => kprobes::unregister_kprobe(tk.kp),
                Some(rp) => kprobes::unregister_kretprobe(rp),
            };
            if let Err(e) = r {
                failed.push((tk, e));
                continue;
            }
        }
        // Pending until armed: a failure leaves it waiting for the next load.
        tk.pending.store(true, Ordering::Relaxed);
        match arm(tk) {
            Ok(()) => {
                tk.pending.store(false, Ordering::Relaxed);
                armed += 1;
            }
            Err(e) => failed.push((tk, e)),
        }
    }
    (armed, failed)
}

/// Byte offset in `cmd` of `@NAME` in the argument that starts at `arg_pos` (the `@` of
/// `a=@name`, `+8(@name+4)`).
fn sym_pos(cmd: &str, arg_pos: usize, name: &str) -> Option<usize> {
    let word = cmd.get(arg_pos..)?;
    let word = &word[..word
        .find(|c: char| c.is_ascii_whitespace())
        .unwrap_or(word.len())];
    let at = format!("@{name}");
    word.match_indices(&at)
        .map(|(i, _)| i)
        .find(|&i| {
            // Not a longer name that starts the same.
            !word[i + at.len()..]
                .starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_' || c == '.')
        })
        .map(|i| arg_pos + i)
}

/// Resolve every `@SYM+OFFS` base into the symbol's address plus the offset, as the kernel's
/// `kallsyms_lookup_name()`: the first definition of a data or function symbol of that name,
/// objects in load order (the program first), `.symtab` before `.dynsym`. `Err`: the first
/// argument (its index) whose name no loaded object defines, and the name.
fn resolve_symbols(args: &mut [Fetch]) -> Result<(), (usize, String)> {
    use object::{Object, ObjectSymbol};
    let mut todo: Vec<(usize, &mut Fetch)> = args
        .iter_mut()
        .enumerate()
        .filter(|(_, f)| matches!(f.base, Base::Sym { .. }))
        .collect();
    if todo.is_empty() {
        return Ok(());
    }
    for o in ft::objects().unwrap_or_default() {
        let Ok(data) = std::fs::read(&o.path) else {
            continue;
        };
        let Ok(file) = object::File::parse(&*data) else {
            continue;
        };
        todo.retain_mut(|(_, f)| {
            let Base::Sym { name, offset } = &f.base else {
                return false;
            };
            let found = file
                .symbols()
                .chain(file.dynamic_symbols())
                .find(|s| s.is_definition() && s.name() == Ok(name.as_str()));
            match found {
                Some(s) => {
                    let addr = s.address().wrapping_add(o.bias);
                    f.base = Base::Imm(addr.wrapping_add(*offset as u64));
                    false
                }
                None => true,
            }
        });
        if todo.is_empty() {
            return Ok(());
        }
    }
    match &todo[0] {
        (
            i,
            Fetch {
                base: Base::Sym { name, .. },
                ..
            },
        ) => Err((*i, name.clone())),
        _ => Ok(()),
    }
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

/// The `pt_regs` word of each argument when every one is a register's value with nothing
/// to dereference (see `TraceKprobe::regs_only`).
fn regs_only(args: &[Fetch]) -> Option<Box<[u8]>> {
    const ARG_REGS: [Reg; 6] = [Reg::Di, Reg::Si, Reg::Dx, Reg::Cx, Reg::R8, Reg::R9];
    args.iter()
        .map(|f| {
            if f.store != Store::Raw || !f.derefs.is_empty() {
                return None;
            }
            let r = match f.base {
                Base::Reg(r) => r,
                Base::Arg(n @ 1..=6) => ARG_REGS[n as usize - 1],
                _ => return None,
            };
            u8::try_from(r.pt_regs_offset() / 8).ok()
        })
        .collect()
}

/// Whether events run their short programs ([`TraceKprobe::regs_only`],
/// [`TraceKprobe::fast`]) where they have one.
static FAST_PROGRAMS: AtomicBool = AtomicBool::new(true);

/// Make every event run the general per-argument program (`false`), or the short ones where
/// an event has one (`true`, the default). The records are the same either way: for tests
/// and benchmarks that compare the two.
pub fn set_fast_programs(on: bool) {
    FAST_PROGRAMS.store(on, Ordering::Relaxed);
}

/// Whether the short programs copy strings in one pass where the ring has the room
/// (`write_fast_record`).
static ONE_PASS_STRINGS: AtomicBool = AtomicBool::new(true);

/// Make the short programs measure strings before copying them (`false`: the kernel's two
/// passes), or copy them in one pass into room that shrinks to them where the ring has it
/// (`true`, the default). The records are the same either way: for tests and benchmarks.
pub fn set_one_pass_strings(on: bool) {
    ONE_PASS_STRINGS.store(on, Ordering::Relaxed);
}

/// Where a [`FastArg`]'s address starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FastBase {
    /// A `pt_regs` word.
    Reg(u8),
    Imm(u64),
}

/// One argument of [`TraceKprobe::fast`]: what it stores is what the general program
/// (`store_arg`) stores for the same [`Fetch`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FastArg {
    /// A `pt_regs` word ([`Store::Raw`], no dereference).
    Reg(u8),
    /// `size` bytes (at most 8) at the base + `off`, in one word ([`Store::Mem`] of one
    /// element, the base's value its address).
    Load { base: FastBase, off: i64, size: u8 },
    /// The string at the base + `off` ([`Store::Str`]).
    Str { base: FastBase, off: i64 },
}

/// Most strings of an event with a [`TraceKprobe::fast`] program (their lengths are kept
/// on the stack between the two passes).
const FAST_STRINGS: usize = 8;

/// The [`FastArg`]s of `args`, when every one has one, there are at most 64 (one
/// fault-mask word) and at most [`FAST_STRINGS`] strings.
fn fast_args(args: &[Fetch]) -> Option<Box<[FastArg]>> {
    const ARG_REGS: [Reg; 6] = [Reg::Di, Reg::Si, Reg::Dx, Reg::Cx, Reg::R8, Reg::R9];
    let strings = args
        .iter()
        .filter(|f| matches!(f.store, Store::Str { .. }))
        .count();
    if args.len() > 64 || strings > FAST_STRINGS {
        return None;
    }
    let word = |r: Reg| u8::try_from(r.pt_regs_offset() / 8).ok();
    args.iter()
        .map(|f| {
            if !f.derefs.is_empty() {
                return None;
            }
            let base = match f.base {
                Base::Reg(r) => FastBase::Reg(word(r)?),
                Base::Arg(n @ 1..=6) => FastBase::Reg(word(ARG_REGS[n as usize - 1])?),
                Base::StackPtr => FastBase::Reg(word(Reg::Sp)?),
                Base::Imm(v) => FastBase::Imm(v),
                _ => return None,
            };
            Some(match (f.store, base) {
                (Store::Raw, FastBase::Reg(i)) => FastArg::Reg(i),
                (
                    Store::Mem {
                        off,
                        size,
                        count: 1,
                    },
                    _,
                ) if size <= 8 => FastArg::Load {
                    base,
                    off,
                    size: size as u8,
                },
                (Store::Str { off }, _) => FastArg::Str { base, off },
                _ => return None,
            })
        })
        .collect()
}

/// Probe path: read argument `n` (1-based) by the SysV ABI at function entry.
fn fetch_arg(n: u32, regs: &PtRegs, after_prologue: bool, mem: sys::Nofault) -> Option<u64> {
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
            return mem.read_u64(base + 8 * (n as u64 - 7));
        }
    })
}

/// Where a hit's values come from: the registers (at the probed instruction, or at the
/// return for a return event), whether the site stands after the prologue, and a return
/// event's values saved at entry.
#[derive(Clone, Copy)]
struct At<'a> {
    regs: &'a PtRegs,
    after_prologue: bool,
    entry: &'a [u64],
    /// How this hit reads memory (decided once per hit).
    mem: sys::Nofault,
}

/// Probe path: an argument's value before its store: the base, then the dereferences.
/// `None` when a read faulted (or for `$comm` and `\"STR"`, which have no value).
#[inline(always)]
fn fetch_value(f: &Fetch, at: At<'_>) -> Option<u64> {
    let regs = at.regs;
    let mut v = match f.base {
        Base::Reg(r) => reg_value(regs, r),
        Base::Arg(k) => fetch_arg(k, regs, at.after_prologue, at.mem)?,
        Base::Retval => regs.rax,
        Base::Entry(k) => at.entry.get(k as usize).copied()?,
        Base::Stack(k) => at.mem.read_u64(regs.sp.wrapping_add(8 * u64::from(k)))?,
        Base::StackPtr => regs.sp,
        Base::Imm(v) => v,
        Base::Sym { .. } | Base::FileOff(_) | Base::None => return None,
    };
    for &off in f.derefs.iter() {
        v = at.mem.read_u64(v.wrapping_add(off as u64))?;
    }
    Some(v)
}

/// Probe path, first pass: the bytes the event's strings need in the data area (each
/// string's length with its NUL, at most `MAX_STRING_SIZE`; 0 for one that cannot be read).
/// Out of line: its 128-byte buffer stays off the dispatcher's frame.
#[inline(never)]
fn strings_size(tk: &TraceKprobe, at_: At<'_>) -> usize {
    let mut total = 0usize;
    for f in tk.args.iter() {
        let (off, count, array) = match f.store {
            Store::Str { off } => (off, 1, false),
            Store::StrArray { off, count } => (off, count, true),
            _ => continue,
        };
        let Some(v) = fetch_value(f, at_) else {
            continue;
        };
        let at = v.wrapping_add(off as u64);
        for k in 0..u64::from(count) {
            let addr = if array {
                match at_.mem.read_u64(at.wrapping_add(8 * k)) {
                    Some(p) => p,
                    None => continue,
                }
            } else {
                at
            };
            total += at_.mem.strnlen(addr, MAX_STRING_SIZE).unwrap_or(0);
        }
    }
    total
}

/// Probe path: run `f` on the bytes of `words`, record slots this thread reserved and has
/// not published.
#[inline(always)]
fn with_bytes<R>(words: &[AtomicU64], f: impl FnOnce(&mut [u8]) -> R) -> R {
    // SAFETY: AtomicU64 has the size and alignment of u64 and is an UnsafeCell, so writing
    // its bytes through a pointer derived from a shared reference is allowed; the slots are
    // reserved for this thread's record and unpublished (the reader reads nothing before the
    // Release store of `head`), and no `&AtomicU64` into them is used while the slice lives.
    let bytes = unsafe {
        std::slice::from_raw_parts_mut(words.as_ptr().cast::<u8>().cast_mut(), words.len() * 8)
    };
    f(bytes)
}

/// Probe path: read the string at `addr` into `data[*used..]`, bounded by `MAX_STRING_SIZE`
/// and the room left; returns its data_loc (0 when it cannot be read or there is no room).
#[inline(never)]
fn store_string(data: &mut [u8], used: &mut usize, addr: u64, mem: sys::Nofault) -> u64 {
    store_string_by(data, used, |buf| mem.strncpy(addr, buf))
}

/// [`store_string`] with the copy `strncpy(buf)` (the bytes copied, NUL included if one was
/// found; `None`: unreadable).
#[inline(always)]
fn store_string_by(
    data: &mut [u8],
    used: &mut usize,
    strncpy: impl FnOnce(&mut [u8]) -> Option<usize>,
) -> u64 {
    let start = *used;
    let cap = MAX_STRING_SIZE.min(data.len().saturating_sub(start));
    let Some(buf) = data.get_mut(start..start + cap).filter(|b| !b.is_empty()) else {
        return 0;
    };
    let len = match strncpy(buf) {
        Some(n) if buf[n - 1] == 0 => n,
        // No NUL in the first `cap` bytes: cut, as strncpy_from_kernel_nofault().
        Some(_) => {
            buf[cap - 1] = 0;
            cap
        }
        None => return 0,
    };
    *used += len;
    (start as u64) | ((len as u64) << 32)
}

/// Probe path: [`store_string`] of a string the first pass found `len` bytes long, NUL
/// included (0: unreadable): those bytes (at most `MAX_STRING_SIZE` and the room left)
/// but the last copied, and a NUL after them (the string's own, or the cut of a string
/// longer than the room or changed since the first pass, as `strncpy_from_kernel_nofault()`
/// cuts). One read of known length instead of a second scan for the NUL.
#[inline(always)]
fn store_string_of_len(
    data: &mut [u8],
    used: &mut usize,
    addr: u64,
    len: usize,
    mem: sys::Nofault,
) -> u64 {
    let start = *used;
    let want = len.min(MAX_STRING_SIZE.min(data.len().saturating_sub(start)));
    let Some(buf) = data.get_mut(start..start + want).filter(|b| !b.is_empty()) else {
        return 0;
    };
    let (bytes, nul) = buf.split_at_mut(want - 1);
    if mem.read(addr, bytes) < bytes.len() {
        return 0;
    }
    nul[0] = 0;
    *used += want;
    (start as u64) | ((want as u64) << 32)
}

/// Probe path, second pass: store argument `f` at `slots[at..]` (its fixed words) and its
/// strings in `data`. Returns false when it faulted as a whole.
#[inline(always)]
fn store_arg(
    f: &Fetch,
    at: At<'_>,
    slots: &[AtomicU64],
    data: &mut [u8],
    used: &mut usize,
) -> bool {
    let put = |i: usize, v: u64| {
        if let Some(s) = slots.get(i) {
            s.store(v, Ordering::Relaxed);
        }
    };
    match f.store {
        Store::Const => true,
        Store::Comm => {
            // The thread's name now, as the kernel reads current->comm per hit.
            let c = sys::thread_comm();
            put(0, u64::from_le_bytes(c[..8].try_into().unwrap_or_default()));
            put(1, u64::from_le_bytes(c[8..].try_into().unwrap_or_default()));
            true
        }
        Store::Raw => {
            let v = fetch_value(f, at);
            put(0, v.unwrap_or(0));
            v.is_some()
        }
        Store::Mem { off, size, count } => {
            let words = slots.get(..f.store.words()).unwrap_or_default();
            // Zeroed first: the elements may not fill the last word.
            for w in words {
                w.store(0, Ordering::Relaxed);
            }
            let Some(v) = fetch_value(f, at) else {
                return false;
            };
            let len = size as usize * count as usize;
            let got = with_bytes(words, |b| {
                at.mem.read(v.wrapping_add(off as u64), &mut b[..len])
            });
            if got < len {
                for w in words {
                    w.store(0, Ordering::Relaxed);
                }
                return false;
            }
            true
        }
        Store::Str { off } => {
            let loc = fetch_value(f, at).map_or(0, |v| {
                store_string(data, used, v.wrapping_add(off as u64), at.mem)
            });
            put(0, loc);
            true
        }
        Store::StrArray { off, count } => {
            let Some(v) = fetch_value(f, at) else {
                for k in 0..count as usize {
                    put(k, 0);
                }
                return false;
            };
            let mem = at.mem;
            let at = v.wrapping_add(off as u64);
            for k in 0..count as usize {
                let loc = mem
                    .read_u64(at.wrapping_add(8 * k as u64))
                    .map_or(0, |p| store_string(data, used, p, mem));
                put(k, loc);
            }
            true
        }
    }
}

/// Probe path: the pre_handler of every `p` event.
fn kprobe_dispatcher(p: &Kprobe, regs: &mut PtRegs) -> i32 {
    // SAFETY: `data` holds the leaked TraceKprobe set before the probe was registered.
    let tk = unsafe { &*(p.data.load(Ordering::Relaxed) as *const TraceKprobe) };
    let at = At {
        regs,
        after_prologue: tk.after_prologue.load(Ordering::Relaxed),
        entry: &[],
        mem: tk.nofault(),
    };
    write_event(tk, at, p.addr(), None);
    0
}

/// Probe path: a return event's entry handler: saves its `$argN` in the call's instance.
fn kretprobe_entry_handler(ri: &mut KretprobeInstance, regs: &mut PtRegs) -> i32 {
    // SAFETY: the kretprobe's `data` holds the leaked TraceKprobe, set before registration.
    let tk = unsafe { &*(ri.rp.data.load(Ordering::Relaxed) as *const TraceKprobe) };
    let mem = if tk.entry_args.iter().any(|&n| n > 6) {
        sys::Nofault::now()
    } else {
        sys::Nofault::SYSCALL
    };
    for (slot, &n) in ri.data.iter_mut().zip(&tk.entry_args) {
        // An argument on the stack that cannot be read is saved as 0.
        *slot = fetch_arg(n, regs, false, mem).unwrap_or(0);
    }
    0
}

/// Probe path: a return event's handler, at the function's return.
fn kretprobe_dispatcher(ri: &KretprobeInstance, regs: &PtRegs) -> i32 {
    // SAFETY: as in `kretprobe_entry_handler`.
    let tk = unsafe { &*(ri.rp.data.load(Ordering::Relaxed) as *const TraceKprobe) };
    let at = At {
        regs,
        after_prologue: false,
        entry: &ri.data[..tk.entry_args.len().min(ri.data.len())],
        mem: tk.nofault(),
    };
    write_event(tk, at, ri.func, Some(ri.ret_addr));
    0
}

/// Probe path: one record of `tk`'s event at `addr` (a return event's: the function, and
/// `ret_ip` where it returned to, the last word of the head).
#[inline(always)]
fn write_event(tk: &TraceKprobe, at: At<'_>, addr: u64, ret_ip: Option<u64>) {
    let section = trace::event_section();
    let Some(w) = section.as_ref().and_then(trace::EventSection::writer) else {
        tk.dropped_counter().fetch_add(1, Ordering::Relaxed);
        return;
    };
    let (tsc, cpu) = trace::clock();
    let (head, fixed) = (tk.head_words, tk.fixed_words);
    let mask_words = head - 2 - usize::from(ret_ip.is_some());
    // The strings' bytes, capped so that the record (its header word included) fits.
    let room = MAX_RECORD_WORDS.saturating_sub(1 + head + fixed) * 8;
    let fast_ok = ret_ip.is_none() && FAST_PROGRAMS.load(Ordering::Relaxed);
    if let (Some(words), true) = (tk.regs_only.as_deref(), fast_ok) {
        let written = write_regs_record(w, tk, at.regs, words, (tsc, cpu, addr));
        drop(section);
        if !written {
            tk.dropped_counter().fetch_add(1, Ordering::Relaxed);
        }
        return;
    }
    if let (Some(fast), true) = (tk.fast.as_deref(), fast_ok) {
        let written = write_fast_record(w, tk, at, fast, (tsc, cpu, addr));
        drop(section);
        if !written {
            tk.dropped_counter().fetch_add(1, Ordering::Relaxed);
        }
        return;
    }
    let data_bytes = if tk.dynamic {
        strings_size(tk, at).min(room)
    } else {
        0
    };
    // Stored straight into the ring: a stack buffer for 128 arguments overflowed small
    // stacks (a sigaltstack of a few KiB).
    let written = w.write_with(
        rtype::KPROBE,
        crate::record::kprobe_aux(cpu, tk.id),
        head + fixed + data_bytes.div_ceil(8),
        |slots| {
            slots[0].store(tsc, Ordering::Relaxed);
            slots[1].store(addr, Ordering::Relaxed);
            if let Some(r) = ret_ip {
                slots[head - 1].store(r, Ordering::Relaxed);
            }
            let (fixed_slots, data_slots) = slots.split_at(slots.len().min(head + fixed));
            zero_last(data_slots);
            with_bytes(data_slots, |data| {
                let data = data.get_mut(..data_bytes).unwrap_or_default();
                let mut used = 0usize;
                let mut faults = [0u64; MAX_MASK_WORDS];
                let mut pos = head;
                for (i, f) in tk.args.iter().enumerate() {
                    let words = f.store.words();
                    let arg_slots = fixed_slots.get(pos..pos + words).unwrap_or_default();
                    let ok = store_arg(f, at, arg_slots, data, &mut used);
                    if !ok {
                        if let Some(m) = faults.get_mut(i / 64) {
                            *m |= 1 << (i % 64);
                        }
                    }
                    pos += words;
                }
                for (k, m) in faults.iter().take(mask_words).enumerate() {
                    fixed_slots[2 + k].store(*m, Ordering::Relaxed);
                }
            });
        },
    );
    drop(section);
    if !written {
        tk.dropped_counter().fetch_add(1, Ordering::Relaxed);
    }
}

/// Probe path: the record of an event whose arguments are all registers (`regs_only`): the
/// head (tsc, address, a zero fault mask), then each argument's `pt_regs` word. Out of line,
/// so that its frame and the general path's are not added up in the dispatcher's.
#[inline(never)]
fn write_regs_record(
    w: crate::ring::SectionWriter<'static>,
    tk: &TraceKprobe,
    regs: &PtRegs,
    words: &[u8],
    (tsc, cpu, addr): (u64, u32, u64),
) -> bool {
    const N: usize = std::mem::size_of::<PtRegs>() / 8;
    // SAFETY: PtRegs is repr(C) and made only of u64 fields: the layout of [u64; N].
    let regs = unsafe { &*(regs as *const PtRegs as *const [u64; N]) };
    let head = tk.head_words;
    w.write_with(
        rtype::KPROBE,
        crate::record::kprobe_aux(cpu, tk.id),
        head + words.len(),
        |slots| {
            slots[0].store(tsc, Ordering::Relaxed);
            slots[1].store(addr, Ordering::Relaxed);
            // The fault mask: a register cannot fault.
            for s in slots.iter().take(head).skip(2) {
                s.store(0, Ordering::Relaxed);
            }
            for (s, &i) in slots.iter().skip(head).zip(words) {
                s.store(
                    regs.get(i as usize).copied().unwrap_or(0),
                    Ordering::Relaxed,
                );
            }
        },
    )
}

/// Probe path: the record of an event with a [`TraceKprobe::fast`] program: the head (tsc,
/// address, the fault mask), each argument's word, the strings' bytes; as the general path
/// writes it. Three forms, each out of line (as [`write_regs_record`]) with a small frame:
/// no strings; strings copied in one pass (with plain loads); strings measured first.
#[inline(always)]
fn write_fast_record(
    w: crate::ring::SectionWriter<'static>,
    tk: &TraceKprobe,
    at: At<'_>,
    fast: &[FastArg],
    hit: (u64, u32, u64),
) -> bool {
    if !tk.dynamic {
        write_fast_fixed(w, tk, at, fast, hit)
    } else if at.mem.loads() && ONE_PASS_STRINGS.load(Ordering::Relaxed) {
        write_fast_one_pass(w, tk, at, fast, hit)
    } else {
        write_fast_two_pass(w, tk, at, fast, hit)
    }
}

/// The `pt_regs` of a hit as words, and the start address of a [`FastBase`] plus `off`.
#[inline(always)]
fn fast_regs(regs: &PtRegs) -> &[u64; PT_REGS_WORDS] {
    // SAFETY: PtRegs is repr(C) and made only of u64 fields: the layout of [u64; N].
    unsafe { &*(regs as *const PtRegs as *const [u64; PT_REGS_WORDS]) }
}

const PT_REGS_WORDS: usize = std::mem::size_of::<PtRegs>() / 8;

#[inline(always)]
fn fast_start(regs: &[u64; PT_REGS_WORDS], base: FastBase, off: i64) -> u64 {
    let v = match base {
        FastBase::Reg(i) => regs.get(usize::from(i)).copied().unwrap_or(0),
        FastBase::Imm(v) => v,
    };
    v.wrapping_add(off as u64)
}

/// Probe path: the word of a [`FastArg`] that is not a string; `None` when its load faulted.
#[inline(always)]
fn fast_value(regs: &[u64; PT_REGS_WORDS], a: FastArg, mem: sys::Nofault) -> Option<u64> {
    match a {
        FastArg::Reg(i) => Some(regs.get(usize::from(i)).copied().unwrap_or(0)),
        FastArg::Load { base, off, size: 8 } => mem.read_u64(fast_start(regs, base, off)),
        FastArg::Load { base, off, size } => {
            let mut b = [0u8; 8];
            let len = usize::from(size);
            (mem.read(fast_start(regs, base, off), &mut b[..len]) == len)
                .then(|| u64::from_le_bytes(b))
        }
        FastArg::Str { .. } => None,
    }
}

/// [`write_fast_record`] of an event without strings.
#[inline(never)]
fn write_fast_fixed(
    w: crate::ring::SectionWriter<'static>,
    tk: &TraceKprobe,
    at: At<'_>,
    fast: &[FastArg],
    (tsc, cpu, addr): (u64, u32, u64),
) -> bool {
    let regs = fast_regs(at.regs);
    let head = tk.head_words;
    w.write_with(
        rtype::KPROBE,
        crate::record::kprobe_aux(cpu, tk.id),
        head + fast.len(),
        |slots| {
            slots[0].store(tsc, Ordering::Relaxed);
            slots[1].store(addr, Ordering::Relaxed);
            let mut mask = 0u64;
            for (k, (&a, slot)) in fast.iter().zip(slots.iter().skip(head)).enumerate() {
                let v = fast_value(regs, a, at.mem);
                slot.store(v.unwrap_or(0), Ordering::Relaxed);
                mask |= u64::from(v.is_none()) << k;
            }
            // The fault mask: one word (at most 64 arguments; the head is 3 words).
            slots[2].store(mask, Ordering::Relaxed);
        },
    )
}

/// [`write_fast_record`] with its strings copied in one pass, each up to its NUL, straight
/// into room for the most the record can hold (`MAX_STRING_SIZE` each, as the general
/// program cuts them), which then shrinks to what they took
/// ([`try_write_shrinking`](crate::ring::RingWriter::try_write_shrinking)). The kernel, and
/// [`write_fast_two_pass`], measure each string first to size the record: that pass is saved,
/// and its latency (the record's size no longer waits for it). Where the ring has no such
/// room as it is (its end, its first lap's growth, a full ring, drops to mark), nothing is
/// written and [`write_fast_two_pass`] writes the record. Only with plain loads (the system
/// call would read all of that room). The signal stack's budget holds: on a signal stack
/// reads go through the system call, and so straight to [`write_fast_two_pass`].
#[inline(never)]
fn write_fast_one_pass(
    w: crate::ring::SectionWriter<'static>,
    tk: &TraceKprobe,
    at: At<'_>,
    fast: &[FastArg],
    hit: (u64, u32, u64),
) -> bool {
    let (tsc, cpu, addr) = hit;
    let regs = fast_regs(at.regs);
    let head = tk.head_words;
    let fixed_words = head + fast.len();
    let room = MAX_RECORD_WORDS.saturating_sub(1 + fixed_words) * 8;
    let most = (tk.strings * MAX_STRING_SIZE).min(room);
    w.try_write_shrinking(
        rtype::KPROBE,
        crate::record::kprobe_aux(cpu, tk.id),
        fixed_words + most.div_ceil(8),
        |slots| {
            slots[0].store(tsc, Ordering::Relaxed);
            slots[1].store(addr, Ordering::Relaxed);
            let (fixed, data_slots) = slots.split_at(slots.len().min(fixed_words));
            let mut mask = 0u64;
            let used = with_bytes(data_slots, |data| {
                let data = data.get_mut(..most).unwrap_or_default();
                let mut used = 0usize;
                for (k, (&a, slot)) in fast.iter().zip(fixed.iter().skip(head)).enumerate() {
                    let v = match a {
                        // As `store_arg`: a string that cannot be read has data_loc 0 and
                        // no fault bit.
                        FastArg::Str { base, off } => {
                            Some(copy_string(data, &mut used, fast_start(regs, base, off)))
                        }
                        _ => fast_value(regs, a, at.mem),
                    };
                    slot.store(v.unwrap_or(0), Ordering::Relaxed);
                    mask |= u64::from(v.is_none()) << k;
                }
                used
            });
            slots[2].store(mask, Ordering::Relaxed);
            // The last word's bytes after the strings are 0.
            if used % 8 != 0 {
                if let Some(last) = data_slots.get(used / 8) {
                    let keep = u64::MAX >> (64 - 8 * (used % 8));
                    last.store(last.load(Ordering::Relaxed) & keep, Ordering::Relaxed);
                }
            }
            fixed_words + used.div_ceil(8)
        },
    )
    .is_some()
        || write_fast_two_pass(w, tk, at, fast, hit)
}

/// Probe path, plain loads only: [`store_string`] inline, for [`write_fast_one_pass`].
#[inline(always)]
fn copy_string(data: &mut [u8], used: &mut usize, addr: u64) -> u64 {
    store_string_by(data, used, |buf| {
        crate::arch::x86_64::uaccess::strncpy_nofault(addr, buf)
    })
}

/// [`write_fast_record`] with the kernel's two passes: the strings' lengths first
/// (`fetch_store_strlen()`), each kept for the copy, their sum capped so that the record
/// fits; then the record of that size.
#[inline(never)]
fn write_fast_two_pass(
    w: crate::ring::SectionWriter<'static>,
    tk: &TraceKprobe,
    at: At<'_>,
    fast: &[FastArg],
    (tsc, cpu, addr): (u64, u32, u64),
) -> bool {
    let regs = fast_regs(at.regs);
    let head = tk.head_words;
    let mut lens = [0u16; FAST_STRINGS];
    let room = MAX_RECORD_WORDS.saturating_sub(1 + head + fast.len()) * 8;
    let mut total = 0usize;
    let strs = fast.iter().filter_map(|a| match *a {
        FastArg::Str { base, off } => Some(fast_start(regs, base, off)),
        _ => None,
    });
    for (len, addr) in lens.iter_mut().zip(strs) {
        let n = at.mem.strnlen(addr, MAX_STRING_SIZE).unwrap_or(0);
        *len = n as u16;
        total += n;
    }
    let data_bytes = total.min(room);
    w.write_with(
        rtype::KPROBE,
        crate::record::kprobe_aux(cpu, tk.id),
        head + fast.len() + data_bytes.div_ceil(8),
        |slots| {
            slots[0].store(tsc, Ordering::Relaxed);
            slots[1].store(addr, Ordering::Relaxed);
            let (fixed, data_slots) = slots.split_at(slots.len().min(head + fast.len()));
            zero_last(data_slots);
            let mut mask = 0u64;
            with_bytes(data_slots, |data| {
                let data = data.get_mut(..data_bytes).unwrap_or_default();
                let mut used = 0usize;
                let mut lens = lens.iter();
                for (k, (&a, slot)) in fast.iter().zip(fixed.iter().skip(head)).enumerate() {
                    let v = match a {
                        // As `store_arg`: a string that cannot be read has data_loc 0 and
                        // no fault bit.
                        FastArg::Str { base, off } => Some(store_string_of_len(
                            data,
                            &mut used,
                            fast_start(regs, base, off),
                            lens.next().map_or(0, |&n| usize::from(n)),
                            at.mem,
                        )),
                        _ => fast_value(regs, a, at.mem),
                    };
                    slot.store(v.unwrap_or(0), Ordering::Relaxed);
                    mask |= u64::from(v.is_none()) << k;
                }
            });
            // The fault mask: one word (at most 64 arguments; the head is 3 words).
            slots[2].store(mask, Ordering::Relaxed);
        },
    )
}

/// Probe path: zero a record's last data word before its strings are stored: the bytes
/// after them in it are then 0, not what the ring held before (the same record from every
/// program).
#[inline(always)]
fn zero_last(data_slots: &[AtomicU64]) {
    if let Some(last) = data_slots.last() {
        last.store(0, Ordering::Relaxed);
    }
}

/// One argument of a record, decoded (see the module docs for the layout).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ArgValue {
    /// It could not be fetched: the kernel's `(fault)`.
    Fault,
    /// A value of an integer, `char`, bitfield (the container, field not yet extracted),
    /// `symbol` or `symstr` (the address) type, in its low bytes.
    Scalar(u64),
    /// `TYPE[N]` of such a type: the N elements.
    Array(Vec<u64>),
    /// A string: its bytes before the NUL; `None` when it could not be read.
    Str(Option<Vec<u8>>),
    /// `string[N]`: N strings.
    Strs(Vec<Option<Vec<u8>>>),
}

/// The arguments of a record of `def`'s event, in order; `None` when `words` is too short for
/// the definition (not a record of this event).
pub fn decode_args(def: &ProbeDef, words: &[u64]) -> Option<Vec<ArgValue>> {
    RecordDecoder::new(def)?.decode(def, words)
}

/// The record layout of one definition, worked out once: a reader decoding many records of
/// the same event keeps one ([`RecordDecoder::decode`] is [`decode_args`] without compiling
/// the fetch args again for every record).
#[derive(Clone, Debug)]
pub struct RecordDecoder {
    head: usize,
    stores: Vec<Store>,
    fixed: usize,
}

impl RecordDecoder {
    /// `None` if an argument of `def` does not compile (it could not have been recorded).
    pub fn new(def: &ProbeDef) -> Option<RecordDecoder> {
        let stores: Vec<Store> = def
            .args
            .iter()
            .map(|a| compile_arg(a).map(|f| f.store).ok())
            .collect::<Option<_>>()?;
        Some(RecordDecoder {
            head: record_head_words(def.args.len())
                + usize::from(matches!(def.kind, ProbeKind::Kretprobe { .. })),
            fixed: stores.iter().map(|s| s.words()).sum(),
            stores,
        })
    }

    /// A return event's record: where the function returned to (the last word of the
    /// head). `None` for other events, or a record too short.
    pub fn ret_ip(&self, def: &ProbeDef, words: &[u64]) -> Option<u64> {
        matches!(def.kind, ProbeKind::Kretprobe { .. })
            .then(|| words.get(self.head - 1).copied())
            .flatten()
    }

    /// [`decode_args`] of `words`, a record of `def` (the definition this decoder was made
    /// from).
    pub fn decode(&self, def: &ProbeDef, words: &[u64]) -> Option<Vec<ArgValue>> {
        decode_with(def, words, self.head, &self.stores, self.fixed)
    }
}

fn decode_with(
    def: &ProbeDef,
    words: &[u64],
    head: usize,
    stores: &[Store],
    fixed: usize,
) -> Option<Vec<ArgValue>> {
    let bytes = |w: &[u64]| -> Vec<u8> { w.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let data = bytes(words.get(head + fixed..)?);
    let string = |loc: u64| -> Option<Vec<u8>> {
        let (start, len) = ((loc & 0xffff_ffff) as usize, (loc >> 32) as usize);
        let s = data
            .get(start..start.checked_add(len)?)
            .filter(|_| len > 0)?;
        let end = s.iter().position(|&c| c == 0).unwrap_or(s.len());
        Some(s[..end].to_vec())
    };
    let mut out = Vec::with_capacity(def.args.len());
    let mut at = head;
    for (i, (a, &store)) in def.args.iter().zip(stores).enumerate() {
        let w = words.get(at..at + store.words())?;
        at += store.words();
        if words
            .get(2 + i / 64)
            .is_some_and(|m| m & (1 << (i % 64)) != 0)
        {
            out.push(ArgValue::Fault);
            continue;
        }
        out.push(match store {
            Store::Raw => ArgValue::Scalar(w[0]),
            Store::Mem { size, count, .. } => {
                let b = bytes(w);
                let elems: Vec<u64> = b
                    .chunks_exact(size as usize)
                    .take(count as usize)
                    .map(|e| {
                        let mut v = [0u8; 8];
                        v[..e.len()].copy_from_slice(e);
                        u64::from_le_bytes(v)
                    })
                    .collect();
                if matches!(a.ty, FetchType::Array { .. }) {
                    ArgValue::Array(elems)
                } else {
                    ArgValue::Scalar(elems.first().copied().unwrap_or(0))
                }
            }
            Store::Str { .. } => ArgValue::Str(string(w[0])),
            Store::StrArray { .. } => ArgValue::Strs(w.iter().map(|&l| string(l)).collect()),
            Store::Comm => {
                let mut b = bytes(w);
                b.truncate(b.iter().position(|&c| c == 0).unwrap_or(b.len()));
                ArgValue::Str(Some(b))
            }
            Store::Const => match &a.fetch {
                FetchOp::ImmStr(t) => ArgValue::Str(Some(t.as_bytes().to_vec())),
                _ => ArgValue::Str(None),
            },
        });
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arg(cmd: &str) -> FetchArg {
        match parse_probe_command(cmd).unwrap() {
            ProbeCommand::Add(d) => d.args.into_iter().next().unwrap(),
            ProbeCommand::Remove { .. } => unreachable!(),
        }
    }

    fn prog(cmd: &str) -> Fetch {
        compile_arg(&arg(cmd)).unwrap()
    }

    #[test]
    fn programs_are_the_kernels_flattened() {
        // +8(+16(%di)):s64: REG di, DEREF 16, ST_MEM 8 (size 8).
        let f = prog("p f +8(+16(%di)):s64");
        assert_eq!(f.base, Base::Reg(Reg::Di));
        assert_eq!(&*f.derefs, &[16]);
        assert_eq!(
            f.store,
            Store::Mem {
                off: 8,
                size: 8,
                count: 1
            }
        );
        // @ADDR: IMM, then the dereference that becomes the store.
        let f = prog("p f @0x1000:u16");
        assert_eq!((f.base, &*f.derefs), (Base::Imm(0x1000), &[][..]));
        assert_eq!(
            f.store,
            Store::Mem {
                off: 0,
                size: 2,
                count: 1
            }
        );
        // @SYM-8 keeps the symbol until create resolves it.
        let f = prog("p f @jiffies-8");
        assert_eq!(
            f.base,
            Base::Sym {
                name: "jiffies".into(),
                offset: -8
            }
        );
        // Strings: the outermost dereference is the string's address.
        assert_eq!(prog("p f +4(%si):string").store, Store::Str { off: 4 });
        assert_eq!(prog("p f +u4(%si):ustring").store, Store::Str { off: 4 });
        assert_eq!(prog("p f \\0x1000:string").store, Store::Str { off: 0 });
        let f = prog("p f +8(+0(%dx)):string[3]");
        assert_eq!(&*f.derefs, &[0]);
        assert_eq!(f.store, Store::StrArray { off: 8, count: 3 });
        // symstr keeps its dereference: it symbolizes the loaded word.
        assert_eq!(
            prog("p f +8(%di):symstr").store,
            Store::Mem {
                off: 8,
                size: 8,
                count: 1
            }
        );
        assert_eq!(prog("p f %di:symstr").store, Store::Raw);
        // Arrays of scalars are packed; bitfields read their container.
        let f = prog("p f +0(%di):b4@8/32[5]");
        assert_eq!(
            f.store,
            Store::Mem {
                off: 0,
                size: 4,
                count: 5
            }
        );
        assert_eq!(f.store.words(), 3);
        assert_eq!(prog("p f $comm").store, Store::Comm);
        assert_eq!(prog("p f \\\"hi\"").store.words(), 0);
        assert!(compile_arg(&arg("p f \\1:string[2]")).is_err());
    }

    #[test]
    fn head_words_grow_with_the_fault_mask() {
        assert_eq!(record_head_words(0), RECORD_HEAD_WORDS);
        assert_eq!(record_head_words(64), 3);
        assert_eq!(record_head_words(65), 4);
        assert_eq!(record_head_words(MAX_TRACE_ARGS), 2 + MAX_MASK_WORDS);
    }

    #[test]
    fn decodes_every_layout() {
        let def = match parse_probe_command(
            "p f a=%di:s8 b=+0(%di):u16[3] c=+0(%si):string d=+0(%dx):string[2] e=$comm \
             g=\\\"hi\" h=+0(%di):u32",
        )
        .unwrap()
        {
            ProbeCommand::Add(d) => d,
            ProbeCommand::Remove { .. } => unreachable!(),
        };
        let loc = |off: u64, len: u64| off | len << 32;
        let mut words = vec![
            1,
            2,
            1 << 6, // h faulted
            0xff,
            0x0003_0002_0001, // three u16 packed
            loc(0, 4),        // "abc"
            loc(4, 3),        // "xy"
            0,                // an unreadable string
            u64::from_le_bytes(*b"comm-nam"),
            u64::from_le_bytes(*b"e\0\0\0\0\0\0\0"),
            0,
        ];
        words.push(u64::from_le_bytes(*b"abc\0xy\0\0"));
        let v = decode_args(&def, &words).unwrap();
        assert_eq!(
            v,
            [
                ArgValue::Scalar(0xff),
                ArgValue::Array(vec![1, 2, 3]),
                ArgValue::Str(Some(b"abc".to_vec())),
                ArgValue::Strs(vec![Some(b"xy".to_vec()), None]),
                ArgValue::Str(Some(b"comm-name".to_vec())),
                ArgValue::Str(Some(b"hi".to_vec())),
                ArgValue::Fault,
            ]
        );
        assert_eq!(decode_args(&def, &words[..8]), None, "too short");
    }

    /// A read that runs into an unmapped page returns the mapped prefix; a string that
    /// runs into it without a NUL is a fault.
    #[test]
    fn nofault_reads_stop_at_an_unmapped_page() {
        // SAFETY: a fresh private mapping of two pages, the second made inaccessible; only
        // this test uses it, and it unmaps it at the end.
        let page = unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                8192,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            assert_eq!(libc::mprotect(p.cast::<u8>().add(4096).cast(), 4096, 0), 0);
            p as u64
        };
        let end = page + 4096;
        // SAFETY: the last 6 bytes of the mapped first page.
        unsafe { std::ptr::copy_nonoverlapping(b"ab\0xyz".as_ptr(), (end - 6) as *mut u8, 6) };
        let mut buf = [0u8; 16];
        assert_eq!(sys::read_nofault(end - 6, &mut buf), 6);
        assert_eq!(&buf[..6], b"ab\0xyz");
        assert_eq!(sys::read_nofault(end, &mut buf), 0);
        assert_eq!(sys::strnlen_nofault(end - 6, MAX_STRING_SIZE), Some(3));
        assert_eq!(sys::strnlen_nofault(end - 3, MAX_STRING_SIZE), None);
        assert_eq!(sys::strnlen_nofault(end - 3, 2), Some(2), "cut at max");
        assert_eq!(sys::strnlen_nofault(8, 16), None, "NULL page");
        // By system call, and with plain loads when this process has them.
        for mem in [sys::Nofault::SYSCALL, sys::Nofault::now()] {
            let mut data = [0xaau8; 8];
            let mut used = 0;
            assert_eq!(store_string(&mut data, &mut used, end - 6, mem), 3 << 32);
            assert_eq!((&data[..3], used), (&b"ab\0"[..], 3));
            assert_eq!(store_string(&mut data, &mut used, end - 3, mem), 0, "fault");
            // Cut to the room left, with a NUL.
            let mut small = [0xaau8; 2];
            let mut used = 0;
            assert_eq!(store_string(&mut small, &mut used, end - 3, mem), 2 << 32);
            assert_eq!(small, *b"x\0");
        }
        // SAFETY: the mapping made above, no longer used.
        unsafe { libc::munmap(page as *mut libc::c_void, 8192) };
    }
}
