//! Errors of the probe-definition language, with the kernel's names and texts, and the
//! tracefs `error_log` layout that shows them.
//!
//! The kernel keeps one table of probe errors (the `ERRORS` list in kernel/trace/trace_probe.h):
//! an upper-case NAME (`TP_ERR_<NAME>` in C) and a fixed English text. [`ProbeErrorKind`] is that
//! table, in the kernel's order, plus two kinds of ftprobe's own for commands the kernel turns
//! down with a bare `-EINVAL` and no log entry. Each variant says who raises it: the parser
//! ([`super::parse_probe_command`]) or the engine, which owns the checks that need the target
//! process (symbol lookup, instruction boundaries, existing events, files on disk).

use std::fmt;

macro_rules! probe_errors {
    ($( $(#[$doc:meta])* $variant:ident = $name:literal, $text:literal; )*) => {
        /// What went wrong in a probe definition.
        ///
        /// [`name`](Self::name) is the kernel's NAME, `Display` its text.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum ProbeErrorKind {
            $( $(#[$doc])* $variant, )*
        }

        impl ProbeErrorKind {
            /// Every kind, in the kernel's order (ftprobe's own two last).
            pub const ALL: &'static [ProbeErrorKind] = &[ $( ProbeErrorKind::$variant, )* ];

            /// The kernel's NAME of this error, e.g. `"BAD_INSN_BNDRY"`.
            pub const fn name(self) -> &'static str {
                match self { $( ProbeErrorKind::$variant => $name, )* }
            }

            /// The kernel's text of this error, e.g. `"Probe point is not an instruction
            /// boundary"` (also what `Display` prints).
            pub const fn text(self) -> &'static str {
                match self { $( ProbeErrorKind::$variant => $text, )* }
            }
        }
    };
}

probe_errors! {
    /// Engine: the uprobe's file does not exist.
    FileNotFound = "FILE_NOT_FOUND", "Failed to find the given file";
    /// Engine: the uprobe's file is not a regular file.
    NoRegularFile = "NO_REGULAR_FILE", "Not a regular file";
    /// Reserved: uprobe reference counters (`PATH:OFFS(REF)`) are not supported (see
    /// [`ProbeErrorKind::NotSupported`]).
    BadRefcnt = "BAD_REFCNT", "Invalid reference counter offset";
    /// Reserved: reference counters are not supported.
    RefcntOpenBrace = "REFCNT_OPEN_BRACE", "Reference counter brace is not closed";
    /// Reserved: reference counters are not supported.
    BadRefcntSuffix = "BAD_REFCNT_SUFFIX", "Reference counter has wrong suffix";
    /// Parser: the offset of `PATH:OFFSET` is not a number.
    BadUprobeOffs = "BAD_UPROBE_OFFS", "Invalid uprobe offset";
    /// Parser: `pN` (MAXACTIVE on a non-return probe). Older kernels named it
    /// `MAXACT_NO_KPROBE`, "Maxactive is not for kprobe".
    BadMaxactType = "BAD_MAXACT_TYPE", "Maxactive is only for function exit";
    /// Parser: MAXACTIVE is not a number, or 0.
    BadMaxact = "BAD_MAXACT", "Invalid maxactive number";
    /// Parser: MAXACTIVE above [`super::KRETPROBE_MAXACTIVE_MAX`].
    MaxactTooBig = "MAXACT_TOO_BIG", "Maxactive is too big";
    /// Parser (bad `SYM+OFFS` syntax, no target) and engine (symbol not found).
    BadProbeAddr = "BAD_PROBE_ADDR", "Invalid probed address or symbol";
    /// Engine: the symbol names several functions; an address is needed.
    NonUniqSymbol = "NON_UNIQ_SYMBOL", "The symbol is not unique";
    /// Parser: a return probe on `SYM+OFFS` with OFFS other than 0.
    BadRetprobe = "BAD_RETPROBE", "Retprobe address must be an function entry";
    /// Reserved: tracepoint probes (`t:`) are not supported.
    NoTracepoint = "NO_TRACEPOINT", "Tracepoint is not found";
    /// Reserved: tracepoint probes (`t:`) are not supported.
    BadTpName = "BAD_TP_NAME", "Invalid character in tracepoint name";
    /// Parser: a `%` suffix other than `%return`.
    BadAddrSuffix = "BAD_ADDR_SUFFIX", "Invalid probed address suffix";
    /// Parser: `p:/EVENT` (empty group).
    NoGroupName = "NO_GROUP_NAME", "Group name is not specified";
    /// Parser: group of [`super::MAX_EVENT_NAME_LEN`] bytes or more.
    GroupTooLong = "GROUP_TOO_LONG", "Group name is too long";
    /// Parser: the group is not a C identifier (`-` is allowed too).
    BadGroupName = "BAD_GROUP_NAME", "Group name must follow the same rules as C identifiers";
    /// Parser: `p: SYM` (empty event without a group).
    NoEventName = "NO_EVENT_NAME", "Event name is not specified";
    /// Parser: event of [`super::MAX_EVENT_NAME_LEN`] bytes or more.
    EventTooLong = "EVENT_TOO_LONG", "Event name is too long";
    /// Parser: the event is not a C identifier.
    BadEventName = "BAD_EVENT_NAME", "Event name must follow the same rules as C identifiers";
    /// Engine: another event (of another kind) has this group/event.
    EventExist = "EVENT_EXIST", "Given group/event name is already used by another event";
    /// Parser: `$retval` on a probe that is not a return probe.
    RetvalOnProbe = "RETVAL_ON_PROBE", "$retval is not available on probe";
    /// Reserved: needs BTF (type information), which ftprobe does not read.
    NoRetval = "NO_RETVAL", "This function returns 'void' type";
    /// Parser: `$stackN` with N above [`super::PARAM_MAX_STACK`].
    BadStackNum = "BAD_STACK_NUM", "Invalid stack number";
    /// Parser: `$argN` with N = 0 or above [`super::PARAM_MAX_STACK`].
    BadArgNum = "BAD_ARG_NUM", "Invalid argument number";
    /// Parser: an unknown `$` variable. (Older kernels spelled it "valiable"; this is
    /// the text of the 6.18 kernel these VMs run, checked in its error_log.)
    BadVar = "BAD_VAR", "Invalid $-variable specified";
    /// Parser: `%NAME` that is not an x86-64 register of [`super::Reg`].
    BadRegName = "BAD_REG_NAME", "Invalid register name";
    /// Parser: `@ADDR` that is not a number.
    BadMemAddr = "BAD_MEM_ADDR", "Invalid memory address";
    /// Parser: `\IMM` that is not a number.
    BadImm = "BAD_IMM", "Invalid immediate value";
    /// Parser: `\"STR` without the closing quote.
    ImmstrNoClose = "IMMSTR_NO_CLOSE", "String is not closed with '\"'";
    /// Parser: `@+OFFS` (file offset) on a kprobe.
    FileOnKprobe = "FILE_ON_KPROBE", "File offset is not available with kprobe";
    /// Parser: `@+OFFS` on a uprobe with OFFS not a number.
    BadFileOffs = "BAD_FILE_OFFS", "Invalid file offset value";
    /// Parser: `@SYM` on a uprobe.
    SymOnUprobe = "SYM_ON_UPROBE", "Symbol is not available with uprobe";
    /// Parser: the fetch program needs more than [`super::FETCH_INSN_MAX`] instructions.
    TooManyOps = "TOO_MANY_OPS", "Dereference is too much nested";
    /// Parser: `+OFFS` without `(`.
    DerefNeedBrace = "DEREF_NEED_BRACE", "Dereference needs a brace";
    /// Parser: `+OFFS(` with OFFS not a number.
    BadDerefOffs = "BAD_DEREF_OFFS", "Invalid dereference offset";
    /// Parser: `+OFFS(` without `)`.
    DerefOpenBrace = "DEREF_OPEN_BRACE", "Dereference brace is not closed";
    /// Parser: `+OFFS($comm)` or `+OFFS(\"STR")`.
    CommCantDeref = "COMM_CANT_DEREF", "$comm can not be dereferenced";
    /// Parser: a fetch argument that starts with none of `$ % @ + - \` nor a letter.
    BadFetchArg = "BAD_FETCH_ARG", "Invalid fetch argument";
    /// Parser: `TYPE[N` without `]`.
    ArrayNoClose = "ARRAY_NO_CLOSE", "Array is not closed";
    /// Parser: text after `TYPE[N]`.
    BadArraySuffix = "BAD_ARRAY_SUFFIX", "Array has wrong suffix";
    /// Parser: N of `TYPE[N]` is not a number, or 0.
    BadArrayNum = "BAD_ARRAY_NUM", "Invalid array size";
    /// Parser: N of `TYPE[N]` above [`super::MAX_ARRAY_LEN`].
    ArrayTooBig = "ARRAY_TOO_BIG", "Array number is too big";
    /// Parser: an unknown type name.
    BadType = "BAD_TYPE", "Unknown type is specified";
    /// Parser: a string type on a value that is not memory (or an array of a non-memory
    /// value).
    BadString = "BAD_STRING", "String accepts only memory argument";
    /// Parser: `symstr` on data or user memory.
    BadSymstring = "BAD_SYMSTRING", "Symbol String doesn't accept data/userdata";
    /// Parser: a malformed `b<width>@<offset>/<size>` or a field past its container.
    BadBitfield = "BAD_BITFIELD", "Invalid bitfield";
    /// Parser: NAME of `NAME=` longer than [`super::MAX_ARG_NAME_LEN`].
    ArgNameTooLong = "ARG_NAME_TOO_LONG", "Argument name is too long";
    /// Parser: `=FETCHARG` (empty NAME).
    NoArgName = "NO_ARG_NAME", "Argument name is not specified";
    /// Parser: NAME is not a C identifier.
    BadArgName = "BAD_ARG_NAME", "Argument name must follow the same rules as C identifiers";
    /// Parser: NAME used twice, or reserved (`common_pid`, `__probe_ip`, ...).
    UsedArgName = "USED_ARG_NAME", "This argument name is already used";
    /// Parser: the argument after `NAME=` is longer than [`super::MAX_ARGSTR_LEN`].
    ArgTooLong = "ARG_TOO_LONG", "Argument expression is too long";
    /// Parser: `NAME=` with nothing after it.
    NoArgBody = "NO_ARG_BODY", "No argument expression";
    /// Engine: the probe address is inside an instruction (or inside an ftrace site).
    BadInsnBndry = "BAD_INSN_BNDRY", "Probe point is not an instruction boundary";
    /// Engine (registration failed), and the parser for `@SYM+OFFS` with a malformed OFFS,
    /// which the kernel only finds when it resolves the symbol at registration.
    FailRegProbe = "FAIL_REG_PROBE", "Failed to register probe event";
    /// Engine: appending a return probe to an event of plain probes, or the reverse.
    DiffProbeType = "DIFF_PROBE_TYPE", "Probe type is different from existing probe";
    /// Engine: appending a probe whose arguments differ from the event's.
    DiffArgType = "DIFF_ARG_TYPE", "Argument type or name is different from existing probe";
    /// Engine: appending a probe identical to one the event has.
    SameProbe = "SAME_PROBE", "There is already the exact same probe event";
    /// Reserved: event probes (`e:`) are not supported.
    NoEventInfo = "NO_EVENT_INFO", "This requires both group and event name to attach";
    /// Reserved: event probes (`e:`) are not supported.
    BadAttachEvent = "BAD_ATTACH_EVENT", "Attached event does not exist";
    /// Reserved: event probes (`e:`) are not supported.
    BadAttachArg = "BAD_ATTACH_ARG", "Attached event does not have this field";
    /// Reserved: event probes (`e:`) are not supported.
    NoEpFilter = "NO_EP_FILTER", "No filter rule after 'if'";
    /// Parser: a BTF argument (a bare name, `$retval->x`, `$arg*`): ftprobe reads no BTF.
    NosupBtfarg = "NOSUP_BTFARG", "BTF is not available or not supported";
    /// Reserved: needs BTF.
    NoBtfarg = "NO_BTFARG", "This variable is not found at this probe point";
    /// Reserved: needs BTF.
    NoBtfEntry = "NO_BTF_ENTRY", "No BTF entry for this probe point";
    /// Reserved: needs BTF.
    BadVarArgs = "BAD_VAR_ARGS", "$arg* must be an independent parameter without name etc.";
    /// Parser: `$argN` or `$arg*` on a probe that is neither at a function entry
    /// (`SYM` or `SYM+0`) nor a return probe on a symbol.
    NofentryArgs = "NOFENTRY_ARGS", "$arg* can be used only on function entry or exit";
    /// Parser: `$arg*` twice.
    DoubleArgs = "DOUBLE_ARGS", "$arg* can be used only once in the parameters";
    /// Reserved: needs BTF.
    Args2long = "ARGS_2LONG", "$arg* failed because the argument list is too long";
    /// Reserved: needs BTF.
    Argidx2big = "ARGIDX_2BIG", "$argN index is too big";
    /// Reserved: needs BTF.
    NoPtrStrct = "NO_PTR_STRCT", "This is not a pointer to union/structure.";
    /// Reserved: needs BTF.
    NosupDatArg = "NOSUP_DAT_ARG", "Non pointer structure/union argument is not supported.";
    /// Reserved: needs BTF.
    BadHyphen = "BAD_HYPHEN", "Failed to parse single hyphen. Forgot '>'?";
    /// Reserved: needs BTF.
    NoBtfField = "NO_BTF_FIELD", "This field is not found.";
    /// Reserved: needs BTF.
    BadBtfTid = "BAD_BTF_TID", "Failed to get BTF type info.";
    /// Reserved: needs BTF.
    BadType4str = "BAD_TYPE4STR", "This type does not fit for string.";
    /// Parser: `$comm` or `\"STR"` with a type other than `string`, or as an array.
    NeedStringType = "NEED_STRING_TYPE", "$comm and immediate-string only accepts string type";
    /// Parser: more than [`super::MAX_TRACE_ARGS`] fetch arguments.
    TooManyArgs = "TOO_MANY_ARGS", "Too many arguments are specified";
    /// Engine: a return probe needs more entry-argument slots than it has.
    TooManyEargs = "TOO_MANY_EARGS", "Too many entry arguments specified";
    /// Reserved: watch probes (`w:`, linux-next) are not supported.
    BadAccessFmt = "BAD_ACCESS_FMT", "Access memory address requires @";
    /// Reserved: watch probes are not supported.
    BadAccessType = "BAD_ACCESS_TYPE", "Bad memory access type";
    /// Reserved: watch probes are not supported.
    BadAccessLen = "BAD_ACCESS_LEN", "This memory access length is not supported";
    /// Reserved: watch probes are not supported.
    BadAccessAddr = "BAD_ACCESS_ADDR", "Invalid access memory address";
    /// ftprobe's own, parser: a command that starts with none of `p`, `r`, `-:`, or an empty
    /// one. The kernel returns `-EINVAL` and logs nothing.
    BadCommand = "BAD_COMMAND", "Command must start with 'p', 'r' or '-:'";
    /// ftprobe's own, parser: kernel syntax ftprobe does not implement (uprobe reference
    /// counters `PATH:OFFS(REF)`, probe arguments after `-:EVENT`).
    NotSupported = "NOT_SUPPORTED", "This syntax is not supported by ftprobe";
}

impl fmt::Display for ProbeErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.text())
    }
}

/// An error in a probe command: what, and where the kernel puts the caret.
///
/// `pos` is a byte offset into the command as given to [`super::parse_probe_command`] (a
/// caret under `cmd[pos]`). The kernel counts positions in the command re-joined from its
/// words with single spaces; [`error_log`] converts. A position one past the last word and a
/// space (`cmd.trim_end().len() + 1`) means "after the end", as the kernel does for a missing
/// word. For errors the engine raises, the engine picks `pos` (the kernel puts
/// [`ProbeErrorKind::BadInsnBndry`] and [`ProbeErrorKind::BadProbeAddr`] under the probe
/// target, [`ProbeErrorKind::SameProbe`] at the start).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{kind}")]
pub struct ProbeError {
    /// What went wrong.
    pub kind: ProbeErrorKind,
    /// Byte offset into the command.
    pub pos: usize,
}

impl ProbeError {
    /// An error of `kind` at byte `pos` of the command.
    pub const fn new(kind: ProbeErrorKind, pos: usize) -> Self {
        ProbeError { kind, pos }
    }
}

/// `CMD_PREFIX` of kernel/trace/trace.c: what precedes the command in the log.
const CMD_PREFIX: &str = "  Command: ";

/// The kernel's `error_log` entry for `err` in `cmd`, without the timestamp:
///
/// ```text
/// trace_kprobe: error: Invalid register name
///   Command: p vfs_read %none_reg
///                       ^
/// ```
///
/// As the kernel, the command is shown as its words joined by single spaces (comments after
/// `#` dropped) and the caret is moved along. The location is `trace_uprobe` when the probe
/// target is a `PATH:OFFSET` (the kernel's rule: the target has both `/` and `:`), else
/// `trace_kprobe`. See [`error_log_at`] for the line with the timestamp.
pub fn error_log(cmd: &str, err: &ProbeError) -> String {
    let (joined, pos) = normalize(cmd, err.pos);
    let mut out = format!("{}: error: {}\n", subsystem(cmd), err.kind.text());
    out.push_str(CMD_PREFIX);
    out.push_str(&joined);
    out.push('\n');
    out.extend(std::iter::repeat_n(' ', CMD_PREFIX.len() + pos));
    out.push_str("^\n");
    out
}

/// [`error_log`] with the kernel's leading `[%5llu.%06u] ` timestamp (seconds and
/// microseconds of `timestamp_ns`, the kernel's `local_clock()` in the kernel).
pub fn error_log_at(timestamp_ns: u64, cmd: &str, err: &ProbeError) -> String {
    let secs = timestamp_ns / 1_000_000_000;
    let usecs = (timestamp_ns % 1_000_000_000) / 1000;
    format!("[{secs:5}.{usecs:06}] {}", error_log(cmd, err))
}

/// Where the kernel's log says the error comes from.
fn subsystem(cmd: &str) -> &'static str {
    let words = super::parse::split_words(super::parse::strip_comment(cmd));
    match words.get(1) {
        Some(&(_, w)) if w.contains('/') && w.contains(':') => "trace_uprobe",
        _ => "trace_kprobe",
    }
}

/// The command re-joined from its words (kernel: `argv_split` then `__trace_probe_log_err`),
/// and `pos` moved from `cmd` into it.
fn normalize(cmd: &str, pos: usize) -> (String, usize) {
    let words = super::parse::split_words(super::parse::strip_comment(cmd));
    let mut joined = String::new();
    let mut new_pos = None;
    for &(start, w) in &words {
        if !joined.is_empty() {
            joined.push(' ');
        }
        if new_pos.is_none() && pos <= start + w.len() {
            new_pos = Some(joined.len() + pos.saturating_sub(start));
        }
        joined.push_str(w);
    }
    // Past the last word: the kernel puts the caret after it and one space.
    let new_pos = match new_pos {
        Some(p) => p,
        None if words.is_empty() => 0,
        None => joined.len() + 1,
    };
    (joined, new_pos)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn names_and_texts_are_unique() {
        let names: HashSet<_> = ProbeErrorKind::ALL.iter().map(|k| k.name()).collect();
        let texts: HashSet<_> = ProbeErrorKind::ALL.iter().map(|k| k.text()).collect();
        assert_eq!(names.len(), ProbeErrorKind::ALL.len());
        assert_eq!(texts.len(), ProbeErrorKind::ALL.len());
        assert_eq!(ProbeErrorKind::ALL.len(), 86);
    }

    #[test]
    fn kernel_texts() {
        let k = ProbeErrorKind::BadInsnBndry;
        assert_eq!(k.name(), "BAD_INSN_BNDRY");
        assert_eq!(k.to_string(), "Probe point is not an instruction boundary");
        assert_eq!(
            ProbeErrorKind::ImmstrNoClose.text(),
            "String is not closed with '\"'"
        );
        assert_eq!(
            ProbeErrorKind::BadVar.text(),
            "Invalid $-variable specified"
        );
        let e = ProbeError::new(ProbeErrorKind::BadRegName, 11);
        assert_eq!(e.to_string(), "Invalid register name");
    }

    #[test]
    fn error_log_layout() {
        let cmd = "p vfs_read %none_reg";
        let e = ProbeError::new(ProbeErrorKind::BadRegName, 11);
        assert_eq!(
            error_log(cmd, &e),
            "trace_kprobe: error: Invalid register name\n\
             \x20 Command: p vfs_read %none_reg\n\
             \x20                     ^\n"
        );
        // The selftests' rule: the last line is 13 + pos bytes ("  Command: " and "^\n").
        let log = error_log(cmd, &e);
        assert_eq!(log.lines().last().unwrap().len() + 1, 13 + 11);
        assert_eq!(
            error_log_at(5_348_887_237_123, cmd, &e)
                .lines()
                .next()
                .unwrap(),
            "[ 5348.887237] trace_kprobe: error: Invalid register name"
        );
    }

    #[test]
    fn error_log_joins_words_and_moves_the_caret() {
        let cmd = "  p   vfs_read\t %none_reg   # comment";
        let e = ProbeError::new(ProbeErrorKind::BadRegName, cmd.find('%').unwrap());
        let log = error_log(cmd, &e);
        let lines: Vec<_> = log.lines().collect();
        assert_eq!(lines[1], "  Command: p vfs_read %none_reg");
        assert_eq!(lines[2].len(), "  Command: p vfs_read ^".len());
        // After the end: one past the last word and a space.
        let e = ProbeError::new(ProbeErrorKind::BadProbeAddr, 3);
        let log = error_log("p  ", &e);
        assert_eq!(log.lines().nth(2).unwrap(), format!("{}^", " ".repeat(13)));
    }

    #[test]
    fn error_log_names_uprobes() {
        let e = ProbeError::new(ProbeErrorKind::BadUprobeOffs, 11);
        let log = error_log("p /bin/sh:0xzz", &e);
        assert!(log.starts_with("trace_uprobe: error: Invalid uprobe offset\n"));
    }
}
