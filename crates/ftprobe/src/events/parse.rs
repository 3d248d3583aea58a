//! The parser: the kernel's `trace_kprobe_create_internal()` (trace_kprobe.c),
//! `__trace_uprobe_create()` (trace_uprobe.c) and `traceprobe_parse_probe_arg()` with its
//! helpers (trace_probe.c), rewritten on `&str`, checks in the kernel's order so that a command
//! with several mistakes reports the one the kernel reports.
//!
//! Positions follow the kernel's `__trace_probe_log_err(offset, err)`: the command is split into
//! words (`argv`), each check names a word and an offset in it. Here they are byte offsets into
//! the command as given. Two kernel quirks are kept on purpose, so that carets land where the
//! kernel puts them:
//! - inside `+uOFFS(...)` and `-uOFFS(...)` the kernel counts the inner argument from one byte
//!   before it (it drops the `u` from its copy before measuring);
//! - type errors found after the fetch argument is parsed (`BAD_STRING`, `BAD_SYMSTRING`,
//!   `BAD_BITFIELD`, `TOO_MANY_OPS` of the store) are measured from the start of the outermost
//!   dereference's inner argument when the argument is a dereference (the kernel's
//!   `ctx->offset` is left there).

use super::error::{ProbeError, ProbeErrorKind as E};
use super::fetch::{FetchOp, FetchType, Reg};
use super::{
    FetchArg, ProbeCommand, ProbeDef, ProbeKind, ProbeTarget, FETCH_INSN_MAX, KPROBE_EVENT_SYSTEM,
    KRETPROBE_MAXACTIVE_MAX, MAX_ARGSTR_LEN, MAX_ARG_NAME_LEN, MAX_ARRAY_LEN, MAX_EVENT_NAME_LEN,
    MAX_TRACE_ARGS, PARAM_MAX_STACK, UPROBE_EVENT_SYSTEM,
};

type Result<T> = std::result::Result<T, ProbeError>;

/// Index of the end marker in a fetch program (`code[FETCH_INSN_MAX - 1]` in the kernel): an
/// instruction may not land there.
const END: usize = FETCH_INSN_MAX - 1;

/// Field names an argument may not take (kernel `reserved_field_names`, trace_probe.c).
const RESERVED_FIELD_NAMES: [&str; 8] = [
    "common_type",
    "common_flags",
    "common_preempt_count",
    "common_pid",
    "common_tgid",
    "__probe_ip",
    "__probe_ret_ip",
    "__probe_func",
];

/// Parses one `kprobe_events`/`uprobe_events` command.
///
/// Everything from the first `#` on is a comment (the kernel strips it when the command is
/// written to the file). Words are separated by white space as the kernel's `argv_split`.
///
/// Event names made up when none is given, as the kernel: `p_SYM_OFFS` / `r_SYM_OFFS` (OFFS in
/// decimal, `OBJ:` included, e.g. `p_work_0`, `p_libc_so_6_malloc_0`), `p_0x` + 16 hex digits
/// for an address (the kernel hashes the address there; ftprobe uses it as it is), and
/// `p_TAIL_0xOFFS` for `PATH:OFFSET`, TAIL being the file name up to its first `.`, `-` or `_`
/// (always `p`, also for return probes, as the kernel). Names are cut to 63 bytes. The kernel
/// turns `:`, `.` and `*` into `_`; ftprobe turns every byte that cannot be in a C identifier
/// into `_`, so that a listed definition always parses back (user-space object and symbol
/// names have `-`, `+`, `@`).
///
/// Where ftprobe differs from the kernel's parser, on purpose:
/// - `OBJ:SYM+OFFS`: the `+`/`-` of the offset is looked for after `OBJ:` (the kernel looks
///   in the whole word; kernel module names have no `-`, library names do);
/// - the symbol's existence is the engine's check; the parser refuses only an empty symbol or
///   one that starts with a digit ([`E::BadProbeAddr`]);
/// - a return probe must be on `SYM` or `SYM+0` (the kernel also accepts `SYM+4` after an
///   `endbr64`, which only the engine can see);
/// - `$retval` and `$argN` work on return probes on an address too (the kernel sets its
///   return flag only for symbol targets);
/// - `PATH:OFFSET` probes read `[GRP/]EVENT` after `rMAXACTIVE:` too, and drop MAXACTIVE
///   (the kernel's uprobe parser only reads a name right after `p:`/`r:`);
/// - commands the kernel refuses without a log entry get [`E::BadCommand`],
///   [`E::NotSupported`], [`E::BadProbeAddr`] (missing target) or [`E::BadUprobeOffs`]
///   (`PATH:` followed by no number).
pub fn parse_probe_command(cmd: &str) -> Result<ProbeCommand> {
    let words = split_words(strip_comment(cmd));
    let Some(&(p0, w0)) = words.first() else {
        return Err(ProbeError::new(E::BadCommand, 0));
    };
    match w0.as_bytes()[0] {
        b'-' => parse_remove(&words),
        b'p' | b'r' => Parser::new(&words).parse().map(ProbeCommand::Add),
        _ => Err(ProbeError::new(E::BadCommand, p0)),
    }
}

/// The command without its `#` comment.
pub(super) fn strip_comment(cmd: &str) -> &str {
    cmd.find('#').map_or(cmd, |i| &cmd[..i])
}

/// White space as the kernel's `isspace()`.
fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// The words of `s` with their byte offsets.
pub(super) fn split_words(s: &str) -> Vec<(usize, &str)> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if is_space(b[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && !is_space(b[i]) {
            i += 1;
        }
        out.push((start, &s[start..i]));
    }
    out
}

/// `-:[GRP/]EVENT` (kernel `dyn_event_release()`, trace_dynevent.c).
fn parse_remove(words: &[(usize, &str)]) -> Result<ProbeCommand> {
    let (p0, w0) = words[0];
    if w0.as_bytes().get(1) != Some(&b':') {
        return Err(ProbeError::new(E::BadCommand, p0 + 1));
    }
    let spec = &w0[2..];
    let (group, event) = match spec.find('/') {
        Some(i) => (Some(&spec[..i]), &spec[i + 1..]),
        None => (None, spec),
    };
    if group == Some("") {
        return Err(ProbeError::new(E::NoGroupName, p0 + 2));
    }
    if group.is_none() && event.is_empty() {
        return Err(ProbeError::new(E::NoEventName, p0 + 2));
    }
    if let Some(&(p1, _)) = words.get(1) {
        // The kernel matches the rest against the probes of a multi-probe event.
        return Err(ProbeError::new(E::NotSupported, p1));
    }
    Ok(ProbeCommand::Remove {
        group: group.map(str::to_string),
        event: event.to_string(),
    })
}

/// The last instruction of a fetch program after the load and dereference stages: what the
/// kernel's `finalize_fetch_insn()` checks types against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Last {
    Reg,
    Stack,
    StackP,
    Retval,
    Imm,
    Comm,
    /// `$argN` at a function entry.
    Arg,
    /// `$argN` on a return probe (kernel `FETCH_OP_EDATA`, saved at entry).
    EData,
    /// `\"STR"`.
    Data,
    Deref,
    UDeref,
}

/// The store instruction the kernel picks (`FETCH_OP_ST_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Store {
    Raw,
    Mem,
    UMem,
    String,
    UString,
    SymStr,
}

struct Parser<'a> {
    words: &'a [(usize, &'a str)],
    /// kprobe-style target (kernel `TPARG_FL_KERNEL`), else `PATH:OFFSET` (`TPARG_FL_USER`).
    kernel: bool,
    /// Return probe (`TPARG_FL_RETURN`).
    ret: bool,
    /// The probe is at a function entry (`TPARG_FL_FENTRY`).
    fentry: bool,
    /// Where the target word starts (errors the kernel finds at registration point there).
    target_pos: usize,
    /// The first error the kernel would only find at registration, after every argument
    /// parsed.
    deferred: Option<ProbeError>,
}

impl<'a> Parser<'a> {
    fn new(words: &'a [(usize, &'a str)]) -> Self {
        Parser {
            words,
            kernel: true,
            ret: false,
            fentry: false,
            target_pos: 0,
            deferred: None,
        }
    }

    /// `tparg_is_function_entry()`.
    fn at_entry(&self) -> bool {
        self.kernel && self.fentry && !self.ret
    }

    /// `tparg_is_function_return()`.
    fn at_exit(&self) -> bool {
        self.kernel && self.ret
    }

    fn defer(&mut self, kind: E) {
        if self.deferred.is_none() {
            self.deferred = Some(ProbeError::new(kind, self.target_pos));
        }
    }

    fn parse(mut self) -> Result<ProbeDef> {
        let (p0, w0) = self.words[0];
        let b0 = w0.as_bytes();
        self.ret = b0[0] == b'r';
        let Some(&(p1, w1)) = self.words.get(1) else {
            // The kernel gives up without a log entry; the caret goes after the command.
            return Err(ProbeError::new(E::BadProbeAddr, p0 + w0.len() + 1));
        };
        // `[GRP/][EVENT]` starts after the first ':' past the command letter.
        let colon = w0[1..].find(':').map(|i| i + 1);

        let mut maxactive = None;
        if b0.get(1).is_some_and(u8::is_ascii_digit) {
            if !self.ret {
                return Err(ProbeError::new(E::BadMaxactType, p0 + 1));
            }
            let digits = &w0[1..colon.unwrap_or(w0.len())];
            let bad = ProbeError::new(E::BadMaxact, p0 + 1);
            if digits.len() > MAX_EVENT_NAME_LEN - 1 {
                return Err(bad);
            }
            let n = kstrtouint(digits, 0).filter(|&n| n != 0).ok_or(bad)?;
            if n > KRETPROBE_MAXACTIVE_MAX {
                return Err(ProbeError::new(E::MaxactTooBig, p0 + 1));
            }
            maxactive = Some(n);
        }

        self.target_pos = p1;
        let target = if let Some(addr) = kstrtoull(w1, 0) {
            ProbeTarget::Address(addr)
        } else if w1.contains('/') && w1.contains(':') {
            self.kernel = false;
            self.file_target(p1, w1)?
        } else {
            self.symbol_target(p1, w1)?
        };

        let (group, event) = match colon {
            Some(c) => parse_event_name(&w0[c + 1..], p0 + c + 1)?,
            None => (None, None),
        };
        let group = group.unwrap_or(if self.kernel {
            KPROBE_EVENT_SYSTEM
        } else {
            UPROBE_EVENT_SYSTEM
        });
        let event = match event {
            Some(e) => e.to_string(),
            None => self.auto_event_name(&target),
        };

        let args = &self.words[2..];
        if self.kernel {
            self.scan_var_args(args)?;
        }
        if args.len() > MAX_TRACE_ARGS {
            return Err(ProbeError::new(E::TooManyArgs, args[0].0));
        }
        let mut parsed: Vec<FetchArg> = Vec::with_capacity(args.len());
        for (i, &(p, a)) in args.iter().enumerate() {
            let arg = self.parse_arg(i, p, a, &parsed)?;
            parsed.push(arg);
        }
        if let Some(e) = self.deferred {
            return Err(e);
        }

        let kind = if self.ret {
            ProbeKind::Kretprobe {
                maxactive: if self.kernel { maxactive } else { None },
            }
        } else {
            ProbeKind::Kprobe
        };
        Ok(ProbeDef {
            kind,
            group: group.to_string(),
            event,
            target,
            args: parsed,
        })
    }

    /// `TEXT[%return]`: TEXT, noting a return probe; any other `%` suffix is BAD_ADDR_SUFFIX
    /// (`pos` is TEXT's position in the command).
    fn strip_return<'t>(&mut self, text: &'t str, pos: usize) -> Result<&'t str> {
        match text.find('%') {
            Some(i) if &text[i..] == "%return" => {
                self.ret = true;
                Ok(&text[..i])
            }
            Some(i) => Err(ProbeError::new(E::BadAddrSuffix, pos + i)),
            None => Ok(text),
        }
    }

    /// `PATH:OFFSET[%return][(REF_CTR_OFFSET)]` (kernel `__trace_uprobe_create()`); PATH is
    /// the engine's. The reference counter (an SDT marker's semaphore) is parsed first and
    /// must end the word, as in the kernel: `%return` comes before it.
    fn file_target(&mut self, p1: usize, w1: &str) -> Result<ProbeTarget> {
        let colon = w1.rfind(':').unwrap_or_default();
        let (path, mut spec) = (&w1[..colon], &w1[colon + 1..]);
        let spec_pos = p1 + colon + 1;
        let mut ref_ctr_offset = None;
        if let Some(open) = spec.find('(') {
            let Some(close) = spec[open..].find(')').map(|c| open + c) else {
                return Err(ProbeError::new(E::RefcntOpenBrace, spec_pos + spec.len()));
            };
            if close + 1 != spec.len() {
                return Err(ProbeError::new(E::BadRefcntSuffix, spec_pos + close + 1));
            }
            let n = kstrtoull(&spec[open + 1..close], 0)
                .ok_or(ProbeError::new(E::BadRefcnt, spec_pos + open + 1))?;
            ref_ctr_offset = Some(n);
            spec = &spec[..open];
        }
        if !spec.as_bytes().first().is_some_and(u8::is_ascii_digit) {
            return Err(ProbeError::new(E::BadUprobeOffs, spec_pos));
        }
        let num = self.strip_return(spec, spec_pos)?;
        let offset = kstrtoull(num, 0).ok_or(ProbeError::new(E::BadUprobeOffs, spec_pos))?;
        Ok(ProbeTarget::FileOffset {
            path: path.to_string(),
            offset,
            ref_ctr_offset,
        })
    }

    /// `[OBJ:]SYM[+OFFS][%return]` (kernel `trace_kprobe_create_internal()`).
    fn symbol_target(&mut self, p1: usize, w1: &str) -> Result<ProbeTarget> {
        let s = self.strip_return(w1, p1)?;
        let bad = ProbeError::new(E::BadProbeAddr, p1);
        // OBJ:SYM splits at a single ':'; a '::' belongs to a demangled C++/Rust name
        // (`ns::K::get`, `libfoo.so:ns::K::get`).
        let b = s.as_bytes();
        let single = (0..b.len())
            .find(|&i| b[i] == b':' && b.get(i + 1) != Some(&b':') && (i == 0 || b[i - 1] != b':'))
            .map(|i| (i, ':'));
        let (obj, rest) = match single {
            Some((i, _)) => (Some(&s[..i]), &s[i + 1..]),
            None => (None, s),
        };
        let (sym, offset) = match rest.find(['+', '-']) {
            Some(i) => {
                let off = kstrtoll(&rest[i..], 0).ok_or(bad)?;
                let off = u32::try_from(off).map_err(|_| bad)?;
                (&rest[..i], u64::from(off))
            }
            None => (rest, 0),
        };
        if obj == Some("") || sym.is_empty() || sym.as_bytes()[0].is_ascii_digit() {
            return Err(bad);
        }
        if self.ret && offset != 0 {
            return Err(ProbeError::new(E::BadRetprobe, p1));
        }
        self.fentry = !self.ret && offset == 0;
        Ok(ProbeTarget::Symbol {
            obj: obj.map(str::to_string),
            sym: sym.to_string(),
            offset,
        })
    }

    /// The kernel's name for an event defined without one.
    fn auto_event_name(&self, target: &ProbeTarget) -> String {
        let c = if self.ret { 'r' } else { 'p' };
        let name = match target {
            ProbeTarget::Symbol { obj, sym, offset } => match obj {
                Some(obj) => format!("{c}_{obj}:{sym}_{offset}"),
                None => format!("{c}_{sym}_{offset}"),
            },
            ProbeTarget::Address(a) => format!("{c}_0x{a:016x}"),
            ProbeTarget::FileOffset { path, offset, .. } => {
                let base = path.rsplit('/').next().unwrap_or_default();
                let tail = base.find(['.', '-', '_']).map_or(base, |i| &base[..i]);
                format!("p_{tail}_0x{offset:x}")
            }
        };
        let mut out: String = name
            .bytes()
            .enumerate()
            .map(|(i, b)| {
                if i == 0 || b.is_ascii_alphanumeric() || b == b'_' {
                    char::from(b)
                } else {
                    '_'
                }
            })
            .collect();
        out.truncate(MAX_EVENT_NAME_LEN - 1);
        out
    }

    /// The kernel's look at `$arg`-words before parsing (`argv_has_var_arg()`): `$argN` and
    /// `$arg*` only at a function entry or exit, `$arg*` once, and `$arg*` needs BTF.
    fn scan_var_args(&self, args: &[(usize, &str)]) -> Result<()> {
        let mut star = false;
        let mut last = 0;
        for &(p, a) in args {
            let Some(rest) = a.strip_prefix("$arg") else {
                continue;
            };
            last = p;
            if !self.at_entry() && !self.at_exit() {
                return Err(ProbeError::new(E::NofentryArgs, p));
            }
            match rest.as_bytes().first() {
                Some(d) if d.is_ascii_digit() => continue,
                Some(b'*') => {}
                _ => return Err(ProbeError::new(E::BadVar, p)),
            }
            if star {
                return Err(ProbeError::new(E::DoubleArgs, p));
            }
            star = true;
        }
        if star {
            return Err(ProbeError::new(E::NosupBtfarg, last));
        }
        Ok(())
    }

    /// One `[NAME=]FETCHARG[:TYPE]` word at byte `p` (kernel `traceprobe_parse_probe_arg()`
    /// and `traceprobe_parse_probe_arg_body()`).
    fn parse_arg(&mut self, i: usize, p: usize, a: &str, prev: &[FetchArg]) -> Result<FetchArg> {
        let at = |kind: E, off: usize| ProbeError::new(kind, p + off);
        let (name, body_off) = match a.find('=') {
            Some(e) if e > MAX_ARG_NAME_LEN => return Err(at(E::ArgNameTooLong, 0)),
            Some(0) => return Err(at(E::NoArgName, 0)),
            Some(e) => (a[..e].to_string(), e + 1),
            None => (format!("arg{}", i + 1), 0),
        };
        if !is_good_name(&name) {
            return Err(at(E::BadArgName, 0));
        }
        if RESERVED_FIELD_NAMES.contains(&name.as_str()) || prev.iter().any(|x| x.name == name) {
            return Err(at(E::UsedArgName, 0));
        }
        let body = &a[body_off..];
        if body.len() > MAX_ARGSTR_LEN {
            return Err(at(E::ArgTooLong, body_off));
        }
        if body.is_empty() {
            return Err(at(E::NoArgBody, body_off));
        }

        // The type, `parse_probe_arg_type()`; offsets below are into `body`.
        let (fetch_txt, type_txt) = match body.find(':') {
            Some(c) => (&body[..c], Some((&body[c + 1..], c + 1))),
            None => (body, None),
        };
        let type_off = type_txt.map_or(0, |(_, o)| o);
        let mut count = None;
        let mut tname = None;
        if let Some((t, t_off)) = type_txt {
            let mut name = t;
            if let Some(lb) = t.find('[') {
                let inner = &t[lb + 1..];
                let inner_off = body_off + t_off + lb + 1;
                let Some(rb) = inner.find(']') else {
                    return Err(at(E::ArrayNoClose, body_off + body.len()));
                };
                if rb + 1 != inner.len() {
                    return Err(at(E::BadArraySuffix, inner_off + rb + 1));
                }
                let n = kstrtouint(&inner[..rb], 0)
                    .filter(|&n| n != 0)
                    .ok_or(at(E::BadArrayNum, inner_off))?;
                if n > MAX_ARRAY_LEN {
                    return Err(at(E::ArrayTooBig, inner_off));
                }
                count = Some(n);
                name = &t[..lb];
            }
            tname = Some(name);
        }
        let (base, bitfield) =
            if matches!(fetch_txt, "$comm" | "$COMM") || fetch_txt.starts_with("\\\"") {
                if count.is_some() || tname.is_some_and(|t| t != "string") {
                    return Err(at(E::NeedStringType, body_off + type_off));
                }
                (FetchType::String, false)
            } else {
                find_fetch_type(tname, self.kernel).ok_or(at(E::BadType, body_off + type_off))?
            };

        // The fetch program.
        let mut code = 0;
        let (fetch, last, fin_pos) = self.parse_fetch(fetch_txt, p + body_off, &mut code)?;

        // `finalize_fetch_insn()`: the store, the bitfield, the array loop.
        let type_pos = fin_pos + type_off;
        let too_many = ProbeError::new(E::TooManyOps, fin_pos);
        let store = if base.is_string() {
            if base == FetchType::Symstr {
                if !matches!(
                    last,
                    Last::Reg | Last::Stack | Last::Retval | Last::Arg | Last::Deref
                ) {
                    return Err(ProbeError::new(E::BadSymstring, type_pos));
                }
            } else if !matches!(
                last,
                Last::Deref | Last::UDeref | Last::Imm | Last::Comm | Last::Data
            ) {
                return Err(ProbeError::new(E::BadString, type_pos));
            }
            let bump = base == FetchType::Symstr
                || matches!(last, Last::Imm | Last::Comm | Last::Data)
                || count.is_some();
            if bump {
                bump_code(&mut code, too_many)?;
            }
            if base == FetchType::Ustring || (!bump && last == Last::UDeref) {
                Store::UString
            } else if base == FetchType::Symstr {
                Store::SymStr
            } else {
                Store::String
            }
        } else if last == Last::Deref {
            Store::Mem
        } else if last == Last::UDeref {
            Store::UMem
        } else {
            bump_code(&mut code, too_many)?;
            Store::Raw
        };

        let mut ty = base;
        if bitfield {
            let bad = ProbeError::new(E::BadBitfield, type_pos);
            let bits = 8 * ty.size() as u64;
            let (width, offset) = parse_bitfield(tname.unwrap_or_default(), bits).ok_or(bad)?;
            bump_code(&mut code, bad)?;
            ty = FetchType::Bitfield {
                base: Box::new(ty),
                width,
                offset,
            };
        }
        if let Some(len) = count {
            if !matches!(store, Store::Mem | Store::String | Store::UString) {
                return Err(ProbeError::new(E::BadString, type_pos));
            }
            bump_code(&mut code, too_many)?;
            ty = FetchType::Array {
                elem: Box::new(ty),
                len,
            };
        }
        Ok(FetchArg {
            name,
            fetch,
            ty,
            pos: p,
        })
    }

    /// A fetch argument at byte `pos` (kernel `parse_probe_arg()`, recursive for
    /// dereferences). `code` is the index of the program's current instruction. Returns the
    /// operation, the last instruction, and where the kernel's `ctx->offset` is left.
    fn parse_fetch(
        &mut self,
        s: &str,
        pos: usize,
        code: &mut usize,
    ) -> Result<(FetchOp, Last, usize)> {
        let at = |kind: E| ProbeError::new(kind, pos);
        let b = s.as_bytes();
        let (op, last) = match b.first() {
            Some(b'$') => self.parse_var(&s[1..], pos)?,
            Some(b'%') => {
                let r = Reg::from_name(&s[1..]).ok_or(at(E::BadRegName))?;
                (FetchOp::Reg(r), Last::Reg)
            }
            Some(b'@') => self.parse_mem(s, pos, code)?,
            Some(b'+' | b'-') => return self.parse_deref(s, pos, code),
            Some(b'\\') if b.get(1) == Some(&b'"') => {
                // A lone `\"` too: the opening quote does not close the string (this
                // kernel's error_log says IMMSTR_NO_CLOSE, caret just after the quote).
                let st = &s[2..];
                let Some(text) = st.strip_suffix('"') else {
                    return Err(ProbeError::new(E::ImmstrNoClose, pos + 2 + st.len()));
                };
                (FetchOp::ImmStr(text.to_string()), Last::Data)
            }
            Some(b'\\') => {
                let v = str_to_immediate(&s[1..]).ok_or(ProbeError::new(E::BadImm, pos + 1))?;
                (FetchOp::Imm(v), Last::Imm)
            }
            // A BTF variable (a function parameter by name): ftprobe reads no BTF.
            Some(c) if c.is_ascii_alphabetic() || *c == b'_' => return Err(at(E::NosupBtfarg)),
            _ => return Err(at(E::BadFetchArg)),
        };
        Ok((op, last, pos))
    }

    /// `$VAR` (kernel `parse_probe_vars()`); `v` is after the `$`, `pos` at the `$`.
    fn parse_var(&self, v: &str, pos: usize) -> Result<(FetchOp, Last)> {
        let at = |kind: E| ProbeError::new(kind, pos);
        if let Some(rest) = v.strip_prefix("retval") {
            if !self.ret {
                return Err(at(E::RetvalOnProbe));
            }
            if !rest.is_empty() {
                // `$retval->field` and the like are BTF accesses.
                return Err(at(E::NosupBtfarg));
            }
            return Ok((FetchOp::Retval, Last::Retval));
        }
        if let Some(rest) = v.strip_prefix("stack") {
            if rest.is_empty() {
                return Ok((FetchOp::StackPtr, Last::StackP));
            }
            if !rest.as_bytes()[0].is_ascii_digit() {
                return Err(at(E::BadVar));
            }
            let n = kstrtoull(rest, 10).ok_or(at(E::BadVar))?;
            if self.kernel && n > u64::from(PARAM_MAX_STACK) {
                return Err(at(E::BadStackNum));
            }
            let n = u32::try_from(n).map_err(|_| at(E::BadStackNum))?;
            return Ok((FetchOp::Stack(n), Last::Stack));
        }
        if v == "comm" || v == "COMM" {
            return Ok((FetchOp::Comm, Last::Comm));
        }
        if let Some(rest) = v.strip_prefix("arg") {
            let n = kstrtoull(rest, 10).ok_or(at(E::BadVar))?;
            if n == 0 || n > u64::from(PARAM_MAX_STACK) {
                return Err(at(E::BadArgNum));
            }
            let n = n as u32;
            if self.at_entry() {
                return Ok((FetchOp::Arg(n), Last::Arg));
            }
            if self.at_exit() {
                return Ok((FetchOp::Arg(n), Last::EData));
            }
            return Err(at(E::NofentryArgs));
        }
        Err(at(E::BadVar))
    }

    /// `@ADDR`, `@+OFFS`, `@SYM[+|-OFFS]`.
    fn parse_mem(&mut self, s: &str, pos: usize, code: &mut usize) -> Result<(FetchOp, Last)> {
        let at = |kind: E| ProbeError::new(kind, pos);
        let op = match s.as_bytes().get(1) {
            Some(d) if d.is_ascii_digit() => {
                let a = kstrtoull(&s[1..], 0).ok_or(at(E::BadMemAddr))?;
                FetchOp::Mem(a)
            }
            Some(b'+') => {
                if self.kernel {
                    return Err(at(E::FileOnKprobe));
                }
                let o = kstrtoll(&s[2..], 0).ok_or(at(E::BadFileOffs))?;
                FetchOp::FileOffset(o)
            }
            _ => {
                if !self.kernel {
                    return Err(at(E::SymOnUprobe));
                }
                // The kernel keeps the symbol as text (one more instruction) and resolves it
                // at registration, where a bad offset or an unknown symbol fails.
                bump_code(code, at(E::TooManyOps))?;
                let t = &s[1..];
                let (name, offset) = match t.find(['+', '-']) {
                    Some(i) => {
                        let off = kstrtoll(&t[i..], 0);
                        if off.is_none() {
                            self.defer(E::FailRegProbe);
                        }
                        (&t[..i], off.unwrap_or_default())
                    }
                    None => (t, 0),
                };
                if name.is_empty() {
                    self.defer(E::BadProbeAddr);
                }
                FetchOp::Sym {
                    name: name.to_string(),
                    offset,
                }
            }
        };
        bump_code(code, at(E::TooManyOps))?;
        Ok((op, Last::Deref))
    }

    /// `+|-[u]OFFS(FETCHARG)`.
    fn parse_deref(
        &mut self,
        s: &str,
        pos: usize,
        code: &mut usize,
    ) -> Result<(FetchOp, Last, usize)> {
        let at = |kind: E| ProbeError::new(kind, pos);
        let b = s.as_bytes();
        let user = b.get(1) == Some(&b'u');
        let rest = &s[if user { 2 } else { 1 }..];
        let paren = rest.find('(').ok_or(at(E::DerefNeedBrace))?;
        let num = &rest[..paren];
        let offset = if b[0] == b'-' {
            kstrtoll(&format!("-{num}"), 0)
        } else {
            kstrtoll(num, 0)
        }
        .ok_or(at(E::BadDerefOffs))?;
        // The kernel's arithmetic: right for `+OFFS(` and `-OFFS(`, one byte short with `u`.
        let inner_pos = pos + paren + 2;
        let inner_all = &rest[paren + 1..];
        let rp = inner_all.rfind(')').ok_or(ProbeError::new(
            E::DerefOpenBrace,
            inner_pos + inner_all.len(),
        ))?;
        let (inner, last, _) = self.parse_fetch(&inner_all[..rp], inner_pos, code)?;
        if matches!(last, Last::Comm | Last::Data) {
            return Err(ProbeError::new(E::CommCantDeref, inner_pos));
        }
        bump_code(code, ProbeError::new(E::TooManyOps, inner_pos))?;
        let op = FetchOp::Deref {
            offset,
            user,
            inner: Box::new(inner),
        };
        Ok((op, if user { Last::UDeref } else { Last::Deref }, inner_pos))
    }
}

/// Moves to the next instruction of a fetch program; `err` if that is the end marker.
fn bump_code(code: &mut usize, err: ProbeError) -> Result<()> {
    *code += 1;
    if *code == END {
        return Err(err);
    }
    Ok(())
}

/// `[GRP/][EVENT]` or `GRP.EVENT` at byte `pos` (kernel `traceprobe_parse_event_name()`).
/// Returns the group, if any, and the event, `None` for `GRP/` (name made up).
fn parse_event_name(s: &str, pos: usize) -> Result<(Option<&str>, Option<&str>)> {
    let slash = s.find('/').or_else(|| s.find('.'));
    let (mut group, mut event, mut ev_pos) = (None, s, pos);
    if let Some(i) = slash {
        if i == 0 {
            return Err(ProbeError::new(E::NoGroupName, pos));
        }
        if i + 1 > MAX_EVENT_NAME_LEN {
            return Err(ProbeError::new(E::GroupTooLong, pos));
        }
        if !is_good_system_name(&s[..i]) {
            return Err(ProbeError::new(E::BadGroupName, pos));
        }
        group = Some(&s[..i]);
        event = &s[i + 1..];
        ev_pos = pos + i + 1;
    }
    if event.is_empty() {
        if slash.is_some() {
            return Ok((group, None));
        }
        return Err(ProbeError::new(E::NoEventName, ev_pos));
    }
    if event.len() >= MAX_EVENT_NAME_LEN {
        return Err(ProbeError::new(E::EventTooLong, ev_pos));
    }
    if !is_good_name(event) {
        return Err(ProbeError::new(E::BadEventName, ev_pos));
    }
    Ok((group, Some(event)))
}

/// A C identifier (kernel `is_good_name()`): event and argument names.
fn is_good_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && (b[0].is_ascii_alphabetic() || b[0] == b'_')
        && b[1..]
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || *c == b'_')
}

/// A C identifier in which `-` is allowed too (kernel `is_good_system_name()`): groups.
fn is_good_system_name(s: &str) -> bool {
    let b = s.as_bytes();
    let ok = |c: u8, first: bool| {
        c == b'_' || c == b'-' || c.is_ascii_alphabetic() || (!first && c.is_ascii_digit())
    };
    !b.is_empty() && ok(b[0], true) && b[1..].iter().all(|&c| ok(c, false))
}

/// The type named `name` (`x64` for none), and whether it is a bitfield's container (kernel
/// `find_fetch_type()`): `b...` types name their container after the `/`. `kernel` false
/// refuses the `symbol` types (uprobes).
fn find_fetch_type(name: Option<&str>, kernel: bool) -> Option<(FetchType, bool)> {
    let Some(t) = name else {
        return Some((FetchType::X64, false));
    };
    if !kernel && (t == "symbol" || t == "symstr") {
        return None;
    }
    if t.starts_with('b') {
        let slash = t.find('/')?;
        let container = match kstrtoull(&t[slash + 1..], 0)? {
            8 => FetchType::U8,
            16 => FetchType::U16,
            32 => FetchType::U32,
            64 => FetchType::U64,
            _ => return None,
        };
        return Some((container, true));
    }
    let ty = match t {
        "u8" => FetchType::U8,
        "u16" => FetchType::U16,
        "u32" => FetchType::U32,
        "u64" => FetchType::U64,
        "s8" => FetchType::S8,
        "s16" => FetchType::S16,
        "s32" => FetchType::S32,
        "s64" => FetchType::S64,
        "x8" => FetchType::X8,
        "x16" => FetchType::X16,
        "x32" => FetchType::X32,
        "x64" => FetchType::X64,
        "char" => FetchType::Char,
        "string" => FetchType::String,
        "ustring" => FetchType::Ustring,
        "symbol" => FetchType::Symbol,
        "symstr" => FetchType::Symstr,
        _ => return None,
    };
    Some((ty, false))
}

/// `b<width>@<offset>/...` against a container of `bits` (kernel
/// `__parse_bitfield_probe_arg()`, numbers read as `simple_strtoul()`).
fn parse_bitfield(t: &str, bits: u64) -> Option<(u8, u8)> {
    let (width, n1) = simple_strtoul(&t[1..], 0);
    let rest = t[1 + n1..].strip_prefix('@')?;
    if width == 0 {
        return None;
    }
    let (offset, n2) = simple_strtoul(rest, 0);
    if n2 == 0 || rest.as_bytes().get(n2) != Some(&b'/') {
        return None;
    }
    if width.checked_add(offset)? > bits {
        return None;
    }
    Some((width as u8, offset as u8))
}

/// `\IMM` (kernel `str_to_immediate()`): a number, `-N` or `+N`.
fn str_to_immediate(s: &str) -> Option<u64> {
    match s.as_bytes().first()? {
        d if d.is_ascii_digit() => kstrtoull(s, 0),
        b'-' => kstrtoll(s, 0).map(|v| v as u64),
        b'+' => kstrtoll(&s[1..], 0).map(|v| v as u64),
        _ => None,
    }
}

// Numbers, as the kernel's lib/kstrtox.c and lib/vsprintf.c read them.

/// Base 0 picks 16 after `0x` followed by a hex digit, 8 after a leading `0`, else 10;
/// returns the base and how many prefix bytes to skip (kernel
/// `_parse_integer_fixup_radix()`).
fn fixup_radix(s: &[u8], base: u32) -> (u32, usize) {
    let has_0x = s.first() == Some(&b'0') && s.get(1).map(u8::to_ascii_lowercase) == Some(b'x');
    let base = match base {
        0 if has_0x && s.get(2).is_some_and(u8::is_ascii_hexdigit) => 16,
        0 if s.first() == Some(&b'0') => 8,
        0 => 10,
        b => b,
    };
    (base, if base == 16 && has_0x { 2 } else { 0 })
}

/// Digits of `base` at the start of `s`: value (wrapped on overflow), digits read,
/// overflowed.
fn parse_digits(s: &[u8], base: u32) -> (u64, usize, bool) {
    let (mut v, mut n, mut overflow) = (0u64, 0, false);
    for &c in s {
        let Some(d) = char::from(c).to_digit(16).filter(|&d| d < base) else {
            break;
        };
        match v
            .checked_mul(u64::from(base))
            .and_then(|x| x.checked_add(u64::from(d)))
        {
            Some(x) => v = x,
            None => {
                overflow = true;
                v = v.wrapping_mul(u64::from(base)).wrapping_add(u64::from(d));
            }
        }
        n += 1;
    }
    (v, n, overflow)
}

/// The kernel's `_kstrtoull()`: the whole string is one number (one trailing newline
/// allowed), no sign.
fn kstrtoull_unsigned(s: &[u8], base: u32) -> Option<u64> {
    let (base, skip) = fixup_radix(s, base);
    let (v, n, overflow) = parse_digits(&s[skip..], base);
    if overflow || n == 0 {
        return None;
    }
    match &s[skip + n..] {
        [] | [b'\n'] => Some(v),
        _ => None,
    }
}

/// The kernel's `kstrtoull()` (also `kstrtoul()` on 64-bit): an optional `+`, then
/// `_kstrtoull()`.
fn kstrtoull(s: &str, base: u32) -> Option<u64> {
    let b = s.as_bytes();
    kstrtoull_unsigned(b.strip_prefix(b"+").unwrap_or(b), base)
}

/// The kernel's `kstrtoll()` (also `kstrtol()` on 64-bit): `-` then an unsigned number, or
/// [`kstrtoull`], within `i64`.
fn kstrtoll(s: &str, base: u32) -> Option<i64> {
    match s.as_bytes().strip_prefix(b"-") {
        Some(rest) => {
            let v = kstrtoull_unsigned(rest, base)?;
            match v.cmp(&(1 << 63)) {
                std::cmp::Ordering::Greater => None,
                _ => Some((v as i64).wrapping_neg()),
            }
        }
        None => i64::try_from(kstrtoull(s, base)?).ok(),
    }
}

/// The kernel's `kstrtouint()`.
fn kstrtouint(s: &str, base: u32) -> Option<u32> {
    u32::try_from(kstrtoull(s, base)?).ok()
}

/// The kernel's `simple_strtoul()`: the number at the start of `s` (wrapping on overflow)
/// and how many bytes it took, radix prefix included.
fn simple_strtoul(s: &str, base: u32) -> (u64, usize) {
    let b = s.as_bytes();
    let (base, skip) = fixup_radix(b, base);
    let (v, n, _) = parse_digits(&b[skip..], base);
    (v, skip + n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kstrtox() {
        assert_eq!(kstrtoull("0x1f", 0), Some(0x1f));
        assert_eq!(kstrtoull("0X1F", 0), Some(0x1f));
        assert_eq!(kstrtoull("017", 0), Some(15));
        assert_eq!(kstrtoull("0", 0), Some(0));
        assert_eq!(kstrtoull("+12", 0), Some(12));
        assert_eq!(kstrtoull("12\n", 0), Some(12));
        assert_eq!(kstrtoull("0x", 0), None);
        assert_eq!(kstrtoull("09", 0), None);
        assert_eq!(kstrtoull("", 0), None);
        assert_eq!(kstrtoull("-1", 0), None);
        assert_eq!(kstrtoull("18446744073709551615", 0), Some(u64::MAX));
        assert_eq!(kstrtoull("18446744073709551616", 0), None);
        assert_eq!(kstrtoull("12345678abcde", 0), None);
        assert_eq!(kstrtoll("-9223372036854775808", 0), Some(i64::MIN));
        assert_eq!(kstrtoll("-9223372036854775809", 0), None);
        assert_eq!(kstrtoll("9223372036854775808", 0), None);
        assert_eq!(kstrtoll("-0x10", 0), Some(-16));
        assert_eq!(kstrtoll("+-5", 0), None);
        assert_eq!(kstrtoll("-+5", 0), None);
        assert_eq!(kstrtouint("4294967296", 0), None);
        assert_eq!(simple_strtoul("10@a/16", 0), (10, 2));
        assert_eq!(simple_strtoul("0x8/32", 0), (8, 3));
        assert_eq!(simple_strtoul("a/16", 0), (0, 0));
        assert_eq!(simple_strtoul("0x/8", 0), (0, 1));
    }

    #[test]
    fn names() {
        assert!(is_good_name("_a1"));
        assert!(!is_good_name("1a"));
        assert!(!is_good_name("a-b"));
        assert!(!is_good_name(""));
        assert!(is_good_system_name("my-group"));
        assert!(is_good_system_name("-x"));
        assert!(!is_good_system_name("foo.1"));
        assert!(!is_good_system_name("1x"));
    }

    #[test]
    fn words() {
        assert_eq!(
            split_words(" p\tfoo \x0b a=1 "),
            vec![(1, "p"), (3, "foo"), (9, "a=1")]
        );
        assert_eq!(strip_comment("p foo # bar"), "p foo ");
    }
}
