//! SDT marker arguments (`<sys/sdt.h>`'s `STAP_PROBE*` operands, as an [`SdtNote`] gives
//! them) turned into fetch arguments of the probe language, as perf does for
//! `perf probe sdt_PROVIDER:NAME` (tools/perf/util/probe-file.c `synthesize_sdt_probe_arg()`,
//! tools/perf/arch/x86/util/perf_regs.c `arch_sdt_arg_parse_op()`).
//!
//! An argument is `[SIZE@]OPERAND` (systemtap's SDT notes: SIZE is the byte count, negative
//! for a signed value): `-4@%edi`, `8@-8(%rbp)`, `4@$5`. Operands: a register of any width
//! (`%rdi`, `%edi`, `%di`, `%dil`), a memory operand `DISP(%REG)` or `(%REG)`, an immediate
//! `$N`. The width of a sub-register is the SIZE's business: the fetch reads the whole
//! 64-bit register and the type keeps its low bytes. A RIP-relative operand naming a symbol
//! (`foo(%rip)`, `foo+8(%rip)`, `8+foo(%rip)`) reads the symbol's memory through the
//! uprobe fetch `@+OFFS`, OFFS being where the symbol would be in the file were the object
//! mapped as one piece with its text (what the caller's `sym` gives: the kernel's
//! `translate_user_vaddr()` puts `@+OFFS` at the probe's address minus the probe's offset
//! plus OFFS). Not convertible (perf skips those too): the high-byte registers (`%ah`),
//! index addressing (`(%rax,%rbx,8)`), numeric RIP-relative displacements, symbolic
//! displacements off other registers, symbolic constants.
//!
//! [`SdtNote`]: crate::elf::SdtNote

use std::fmt;

/// One marker argument as a fetch argument: `FETCHARG` and its type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SdtArg {
    /// The fetch argument, e.g. `%di`, `-8(%bp)`, `\5`.
    pub fetch: String,
    /// The type from SIZE (`s32` for `-4@`), `None` without a SIZE (the default `x64`).
    pub ty: Option<&'static str>,
}

impl fmt::Display for SdtArg {
    /// `FETCHARG[:TYPE]`, as it goes into a definition.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.fetch)?;
        if let Some(t) = self.ty {
            write!(f, ":{t}")?;
        }
        Ok(())
    }
}

/// The arguments of a marker: each operand of `args` (space-separated) converted, or why it
/// cannot be. `sym` gives a symbol's `@+OFFS` value for RIP-relative operands.
pub fn sdt_args(args: &str, sym: &dyn Fn(&str) -> Option<i64>) -> Vec<Result<SdtArg, String>> {
    args.split_ascii_whitespace()
        .map(|a| sdt_arg(a, sym))
        .collect()
}

/// A RIP-relative displacement `SYM`, `SYM+N`, `SYM-N` or `N+SYM` as (SYM, N).
fn sym_disp(disp: &str) -> Option<(&str, i64)> {
    let num = |n: &str| -> Option<i64> {
        let (neg, d) = match n.strip_prefix('-') {
            Some(d) => (true, d),
            None => (false, n.strip_prefix('+').unwrap_or(n)),
        };
        let v = match d.strip_prefix("0x") {
            Some(h) => i64::from_str_radix(h, 16).ok()?,
            None => d.parse().ok()?,
        };
        Some(if neg { -v } else { v })
    };
    let is_sym = |s: &str| {
        s.bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_' || b == b'.')
    };
    if is_sym(disp) {
        match disp.find(['+', '-']) {
            Some(i) => Some((&disp[..i], num(&disp[i..])?)),
            None => Some((disp, 0)),
        }
    } else {
        let (n, s) = disp.split_once('+')?;
        is_sym(s).then_some(())?;
        Some((s, num(n)?))
    }
}

/// The type of an SDT argument size (bytes, negative when signed).
fn size_type(size: &str) -> Option<&'static str> {
    Some(match size {
        "1" => "u8",
        "-1" => "s8",
        "2" => "u16",
        "-2" => "s16",
        "4" => "u32",
        "-4" => "s32",
        "8" => "u64",
        "-8" => "s64",
        _ => return None,
    })
}

/// The 64-bit register (the probe language's name) that `name` (without `%`) is or is a
/// part of; `None` for the high-byte registers and names that are no x86-64 GPR.
fn gpr(name: &str) -> Option<&'static str> {
    const LEGACY: [(&str, [&str; 4]); 8] = [
        ("ax", ["rax", "eax", "ax", "al"]),
        ("bx", ["rbx", "ebx", "bx", "bl"]),
        ("cx", ["rcx", "ecx", "cx", "cl"]),
        ("dx", ["rdx", "edx", "dx", "dl"]),
        ("si", ["rsi", "esi", "si", "sil"]),
        ("di", ["rdi", "edi", "di", "dil"]),
        ("bp", ["rbp", "ebp", "bp", "bpl"]),
        ("sp", ["rsp", "esp", "sp", "spl"]),
    ];
    if let Some((r, _)) = LEGACY.iter().find(|(_, names)| names.contains(&name)) {
        return Some(r);
    }
    const NUMBERED: [&str; 8] = ["r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15"];
    NUMBERED.into_iter().find(|r| {
        name.strip_prefix(r)
            .is_some_and(|suffix| ["", "d", "w", "b", "l"].contains(&suffix))
    })
}

fn reg_operand(r: &str) -> Result<&'static str, String> {
    let name = r
        .strip_prefix('%')
        .ok_or_else(|| format!("{r:?}: not a register"))?;
    if ["ah", "bh", "ch", "dh"].contains(&name) {
        return Err(format!("{r}: a high-byte register"));
    }
    if name == "rip" || name == "eip" {
        return Err(format!("{r}: RIP-relative operand"));
    }
    gpr(name).ok_or_else(|| format!("{r}: unknown register"))
}

/// Whether `s` is a (signed) decimal or `0x` hexadecimal number.
fn is_number(s: &str) -> bool {
    let d = s.strip_prefix(['-', '+']).unwrap_or(s);
    match d.strip_prefix("0x").or_else(|| d.strip_prefix("0X")) {
        Some(h) => !h.is_empty() && h.bytes().all(|b| b.is_ascii_hexdigit()),
        None => !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()),
    }
}

/// One `[SIZE@]OPERAND`; `sym` as for [`sdt_args`].
pub fn sdt_arg(op: &str, sym: &dyn Fn(&str) -> Option<i64>) -> Result<SdtArg, String> {
    // A SIZE is digits (and a sign) before the first '@'; an operand has no '@'.
    let (ty, operand) = match op.split_once('@') {
        Some((size, operand)) => (
            Some(size_type(size).ok_or_else(|| format!("{op}: size {size} is not 1, 2, 4 or 8"))?),
            operand,
        ),
        None => (None, op),
    };
    let fetch = if let Some(imm) = operand.strip_prefix('$') {
        if !is_number(imm) {
            return Err(format!("{op}: a symbolic constant"));
        }
        format!("\\{imm}")
    } else if operand.starts_with('%') {
        format!("%{}", reg_operand(operand)?)
    } else if let Some(open) = operand.find('(') {
        let inner = operand[open + 1..]
            .strip_suffix(')')
            .ok_or_else(|| format!("{op}: no ')' at the end"))?;
        if inner.contains(',') {
            return Err(format!("{op}: index addressing"));
        }
        let disp = &operand[..open];
        if inner == "%rip" {
            let (name, n) = sym_disp(disp)
                .ok_or_else(|| format!("{op}: RIP-relative operand without a symbol"))?;
            let at = sym(name).ok_or_else(|| format!("{op}: no symbol {name}"))?;
            return Ok(SdtArg {
                fetch: format!("@+{}", at + n),
                ty,
            });
        }
        let base = reg_operand(inner)?;
        let disp = if disp.is_empty() { "0" } else { disp };
        if !is_number(disp) {
            return Err(format!("{op}: a symbolic displacement"));
        }
        // `+OFFS(%REG)` / `-OFFS(%REG)` (`-` is the probe language's too).
        let signed = if disp.starts_with(['-', '+']) {
            disp.to_owned()
        } else {
            format!("+{disp}")
        };
        format!("{signed}(%{base})")
    } else {
        return Err(format!("{op}: an operand of no known form"));
    };
    Ok(SdtArg { fetch, ty })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `foo` is at 0x4010 (a `@+OFFS` value), nothing else.
    fn sym(name: &str) -> Option<i64> {
        (name == "foo").then_some(0x4010)
    }

    fn ok(op: &str) -> String {
        sdt_arg(op, &sym).unwrap().to_string()
    }

    #[test]
    fn operands_become_fetch_args() {
        // Operands as gcc 12 writes them for <sys/sdt.h> markers.
        assert_eq!(ok("-4@%edi"), "%di:s32");
        assert_eq!(ok("4@%esi"), "%si:u32");
        assert_eq!(ok("8@%rax"), "%ax:u64");
        assert_eq!(ok("-8@%r12"), "%r12:s64");
        assert_eq!(ok("-4@%r9d"), "%r9:s32");
        assert_eq!(ok("2@%r10w"), "%r10:u16");
        assert_eq!(ok("-1@%al"), "%ax:s8");
        assert_eq!(ok("1@%sil"), "%si:u8");
        assert_eq!(ok("1@%r8b"), "%r8:u8");
        assert_eq!(ok("8@-8(%rbp)"), "-8(%bp):u64");
        assert_eq!(ok("-4@16(%rsp)"), "+16(%sp):s32");
        assert_eq!(ok("8@(%rbx)"), "+0(%bx):u64");
        assert_eq!(ok("8@0x10(%rdi)"), "+0x10(%di):u64");
        assert_eq!(ok("-4@$5"), "\\5:s32");
        assert_eq!(ok("-4@$-5"), "\\-5:s32");
        assert_eq!(ok("%rdi"), "%di");
        assert_eq!(ok("-4@foo(%rip)"), "@+16400:s32");
        assert_eq!(ok("8@foo+8(%rip)"), "@+16408:u64");
        assert_eq!(ok("8@8+foo(%rip)"), "@+16408:u64");
        assert_eq!(ok("8@foo-0x10(%rip)"), "@+16384:u64");
    }

    #[test]
    fn unconvertible_operands_say_why() {
        for (op, why) in [
            ("8@16(%rip)", "RIP-relative operand without a symbol"),
            ("8@bar(%rip)", "no symbol bar"),
            ("8@%rip", "RIP-relative"),
            ("1@%ah", "high-byte"),
            ("8@(%rax,%rbx,8)", "index addressing"),
            ("3@%eax", "size 3"),
            ("8@%xmm0", "unknown register"),
            ("8@$foo", "symbolic constant"),
            ("8@foo(%rbx)", "symbolic displacement"),
        ] {
            let e = sdt_arg(op, &sym).unwrap_err();
            assert!(e.contains(why), "{op}: {e}");
        }
        assert_eq!(sdt_args("-4@%edi  8@%rsi", &sym).len(), 2);
        assert!(sdt_args("", &sym).is_empty());
    }
}
