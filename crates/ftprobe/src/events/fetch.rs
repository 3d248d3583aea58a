//! Fetch arguments: where a value comes from ([`FetchOp`]), the registers it may name
//! ([`Reg`]), and how it is stored and printed ([`FetchType`]).
//!
//! Facts from kernel/trace/trace_probe.c (the type table `probe_fetch_types` and the print
//! formats), kernel/trace/trace_probe_tmpl.h (arrays print as `{a,b,c}`) and
//! arch/x86/kernel/ptrace.c (`regoffset_table`, the names `%REG` accepts on x86-64).

use std::fmt;

use crate::arch::x86_64::trampoline::PtRegs;

/// An x86-64 register as `%REG` names it: exactly the names the kernel's
/// `regs_query_register_offset()` accepts on x86-64 (no `rax`, no `eax`, no `fs`/`gs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum Reg {
    R15,
    R14,
    R13,
    R12,
    Bp,
    Bx,
    R11,
    R10,
    R9,
    R8,
    Ax,
    Cx,
    Dx,
    Si,
    Di,
    OrigAx,
    Ip,
    Cs,
    Flags,
    Sp,
    Ss,
}

impl Reg {
    /// Every register, in `struct pt_regs` order.
    pub const ALL: [Reg; 21] = [
        Reg::R15,
        Reg::R14,
        Reg::R13,
        Reg::R12,
        Reg::Bp,
        Reg::Bx,
        Reg::R11,
        Reg::R10,
        Reg::R9,
        Reg::R8,
        Reg::Ax,
        Reg::Cx,
        Reg::Dx,
        Reg::Si,
        Reg::Di,
        Reg::OrigAx,
        Reg::Ip,
        Reg::Cs,
        Reg::Flags,
        Reg::Sp,
        Reg::Ss,
    ];

    /// The name after `%`, e.g. `"di"`, `"r8"`, `"orig_ax"`.
    pub const fn name(self) -> &'static str {
        match self {
            Reg::R15 => "r15",
            Reg::R14 => "r14",
            Reg::R13 => "r13",
            Reg::R12 => "r12",
            Reg::Bp => "bp",
            Reg::Bx => "bx",
            Reg::R11 => "r11",
            Reg::R10 => "r10",
            Reg::R9 => "r9",
            Reg::R8 => "r8",
            Reg::Ax => "ax",
            Reg::Cx => "cx",
            Reg::Dx => "dx",
            Reg::Si => "si",
            Reg::Di => "di",
            Reg::OrigAx => "orig_ax",
            Reg::Ip => "ip",
            Reg::Cs => "cs",
            Reg::Flags => "flags",
            Reg::Sp => "sp",
            Reg::Ss => "ss",
        }
    }

    /// The register named `name` (without `%`); exact, case-sensitive match as the kernel.
    pub fn from_name(name: &str) -> Option<Reg> {
        Reg::ALL.into_iter().find(|r| r.name() == name)
    }

    /// Byte offset of the register's field in `struct pt_regs` (x86-64), which is also
    /// [`PtRegs`] and the first 21 words of `struct user_regs_struct`.
    pub const fn pt_regs_offset(self) -> usize {
        8 * self as usize
    }

    /// The register's value in `regs`.
    pub const fn value(self, regs: &PtRegs) -> u64 {
        match self {
            Reg::R15 => regs.r15,
            Reg::R14 => regs.r14,
            Reg::R13 => regs.r13,
            Reg::R12 => regs.r12,
            Reg::Bp => regs.rbp,
            Reg::Bx => regs.rbx,
            Reg::R11 => regs.r11,
            Reg::R10 => regs.r10,
            Reg::R9 => regs.r9,
            Reg::R8 => regs.r8,
            Reg::Ax => regs.rax,
            Reg::Cx => regs.rcx,
            Reg::Dx => regs.rdx,
            Reg::Si => regs.rsi,
            Reg::Di => regs.rdi,
            Reg::OrigAx => regs.orig_rax,
            Reg::Ip => regs.ip,
            Reg::Cs => regs.cs,
            Reg::Flags => regs.flags,
            Reg::Sp => regs.sp,
            Reg::Ss => regs.ss,
        }
    }
}

impl fmt::Display for Reg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.name())
    }
}

/// Where a fetch argument's value comes from. `Display` prints the canonical spelling, which
/// parses back to the same value (numbers in the shorter of decimal and hex).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FetchOp {
    /// `%REG`: a register at the probe.
    Reg(Reg),
    /// `$argN` (N >= 1): the Nth integer argument of the function by the SysV ABI. On a
    /// return probe, the value at function entry (kernel: stored by the entry handler).
    Arg(u32),
    /// `$stackN`: the Nth word on the stack at the probe (N >= 0).
    Stack(u32),
    /// `$stack`: the stack pointer at the probe.
    StackPtr,
    /// `$retval`: the return value (`%ax`), return probes only.
    Retval,
    /// `$comm`: the thread's name (`comm`), a string.
    Comm,
    /// `\IMM`: an immediate value (`\-1` is stored as its two's complement).
    Imm(u64),
    /// `\"STR"`: an immediate string.
    ImmStr(String),
    /// `@ADDR`: the word at an absolute address.
    Mem(u64),
    /// `@SYM[+|-OFFS]`: the word at a data symbol plus an offset (kprobe-style probes).
    Sym {
        /// The symbol.
        name: String,
        /// Bytes added to the symbol's address.
        offset: i64,
    },
    /// `@+OFFS`: the word at a file offset of the probed object (uprobe-style probes only,
    /// kernel `FETCH_OP_FOFFS`).
    FileOffset(i64),
    /// `+|-[u]OFFS(FETCHARG)`: the word at the value of `inner` plus `offset`.
    Deref {
        /// Bytes added to the inner value.
        offset: i64,
        /// `u`: read user memory (kernel `FETCH_OP_UDEREF`). In one process all memory is
        /// the process's; the flag is kept so that definitions print back unchanged.
        user: bool,
        /// The address.
        inner: Box<FetchOp>,
    },
}

/// `v` in the shorter of decimal and `0x` hex (decimal on a tie).
fn num(v: u64) -> String {
    let dec = v.to_string();
    let hex = format!("{v:#x}");
    if hex.len() < dec.len() {
        hex
    } else {
        dec
    }
}

/// `v` with its sign first (`-8`, `8`), magnitude as [`num`].
fn signed(v: i64) -> String {
    if v < 0 {
        format!("-{}", num(v.unsigned_abs()))
    } else {
        num(v.unsigned_abs())
    }
}

impl fmt::Display for FetchOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FetchOp::Reg(r) => write!(f, "{r}"),
            FetchOp::Arg(n) => write!(f, "$arg{n}"),
            FetchOp::Stack(n) => write!(f, "$stack{n}"),
            FetchOp::StackPtr => f.write_str("$stack"),
            FetchOp::Retval => f.write_str("$retval"),
            FetchOp::Comm => f.write_str("$comm"),
            FetchOp::Imm(v) if (*v as i64) < 0 => write!(f, "\\{}", signed(*v as i64)),
            FetchOp::Imm(v) => write!(f, "\\{}", num(*v)),
            FetchOp::ImmStr(s) => write!(f, "\\\"{s}\""),
            FetchOp::Mem(a) => write!(f, "@{}", num(*a)),
            FetchOp::Sym { name, offset } => match offset {
                0 => write!(f, "@{name}"),
                o if *o < 0 => write!(f, "@{name}{}", signed(*o)),
                o => write!(f, "@{name}+{}", signed(*o)),
            },
            FetchOp::FileOffset(o) => write!(f, "@+{}", signed(*o)),
            FetchOp::Deref {
                offset,
                user,
                inner,
            } => {
                let sign = if *offset < 0 { '-' } else { '+' };
                let u = if *user { "u" } else { "" };
                write!(f, "{sign}{u}{}({inner})", num(offset.unsigned_abs()))
            }
        }
    }
}

/// How a fetched value is stored and printed (`FETCHARG:TYPE`; `x64` when no type is given,
/// `string` for `$comm` and `\"STR"`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum FetchType {
    U8,
    U16,
    U32,
    U64,
    S8,
    S16,
    S32,
    S64,
    X8,
    X16,
    X32,
    X64,
    /// One byte printed as a character, `'c'`.
    Char,
    /// A NUL-terminated string read from memory.
    String,
    /// A NUL-terminated string read from user memory.
    Ustring,
    /// An address (u64) printed as `symbol+offset/size` (kernel `%pS`).
    Symbol,
    /// An address turned into its `symbol+offset/size` text when fetched, stored as a string.
    Symstr,
    /// `b<width>@<offset>/<container bits>`: `width` bits starting at bit `offset` of a
    /// `base` container (`U8`..`U64`), printed as an unsigned decimal.
    Bitfield {
        base: Box<FetchType>,
        width: u8,
        offset: u8,
    },
    /// `TYPE[len]`: `len` (1..=64) consecutive elements from memory, printed `{a,b,c}`.
    Array {
        elem: Box<FetchType>,
        len: u32,
    },
}

impl FetchType {
    /// The kernel's name of a non-bitfield, non-array type (`"u8"`, `"string"`, ...).
    pub fn name(&self) -> Option<&'static str> {
        Some(match self {
            FetchType::U8 => "u8",
            FetchType::U16 => "u16",
            FetchType::U32 => "u32",
            FetchType::U64 => "u64",
            FetchType::S8 => "s8",
            FetchType::S16 => "s16",
            FetchType::S32 => "s32",
            FetchType::S64 => "s64",
            FetchType::X8 => "x8",
            FetchType::X16 => "x16",
            FetchType::X32 => "x32",
            FetchType::X64 => "x64",
            FetchType::Char => "char",
            FetchType::String => "string",
            FetchType::Ustring => "ustring",
            FetchType::Symbol => "symbol",
            FetchType::Symstr => "symstr",
            FetchType::Bitfield { .. } | FetchType::Array { .. } => return None,
        })
    }

    /// Bytes the value takes in a record: the scalar's size, 4 for string types (the
    /// kernel's `__data_loc` word; the text follows the fixed part), the container for a
    /// bitfield, `len` elements for an array.
    pub fn size(&self) -> usize {
        match self {
            FetchType::U8 | FetchType::S8 | FetchType::X8 | FetchType::Char => 1,
            FetchType::U16 | FetchType::S16 | FetchType::X16 => 2,
            FetchType::U32 | FetchType::S32 | FetchType::X32 => 4,
            FetchType::U64 | FetchType::S64 | FetchType::X64 | FetchType::Symbol => 8,
            FetchType::String | FetchType::Ustring | FetchType::Symstr => 4,
            FetchType::Bitfield { base, .. } => base.size(),
            FetchType::Array { elem, len } => elem.size() * *len as usize,
        }
    }

    /// Signed types (`s8`..`s64`). The kernel also marks string types signed; that flag
    /// only matters for its format files.
    pub fn is_signed(&self) -> bool {
        matches!(
            self,
            FetchType::S8 | FetchType::S16 | FetchType::S32 | FetchType::S64
        )
    }

    /// String types: `string`, `ustring`, `symstr` (the value is text, not a number).
    pub fn is_string(&self) -> bool {
        matches!(
            self,
            FetchType::String | FetchType::Ustring | FetchType::Symstr
        )
    }

    /// For a bitfield, the field out of the container value `raw` (the kernel's
    /// `FETCH_OP_MOD_BF`: shift left then right within the container); other types return
    /// `raw` unchanged.
    pub fn extract_bitfield(&self, raw: u64) -> u64 {
        match self {
            FetchType::Bitfield {
                base,
                width,
                offset,
            } => {
                let bits = 8 * base.size() as u32;
                let (w, o) = (u32::from(*width), u32::from(*offset));
                let container = if bits == 64 {
                    raw
                } else {
                    raw & ((1u64 << bits) - 1)
                };
                // Keep bits [o, o + w) of the container.
                let lshift = 64 - (o + w);
                (container << lshift) >> (64 - w)
            }
            _ => raw,
        }
    }

    /// One value as the kernel's `trace` output prints it: `u*` as `%u`, `s*` as `%d` (sign
    /// extended from the type's size), `x*` as `0x%x` (no padding), `char` as `'%c'`. `raw`
    /// holds the value in its low bytes; higher bytes are ignored.
    ///
    /// A bitfield prints its already extracted field (see [`extract_bitfield`]) as its
    /// container, an array prints one element as its element type. `symbol` prints the bare
    /// address as `0x%lx`, as the kernel's `%pS` does when no symbol covers it: the caller
    /// symbolizes. String types are not one number: they print `raw` as `0x%lx`; use
    /// [`format_string`] for their text.
    ///
    /// [`extract_bitfield`]: Self::extract_bitfield
    pub fn format(&self, raw: u64) -> String {
        match self {
            FetchType::U8 => (raw as u8).to_string(),
            FetchType::U16 => (raw as u16).to_string(),
            FetchType::U32 => (raw as u32).to_string(),
            FetchType::U64 => raw.to_string(),
            FetchType::S8 => (raw as i8).to_string(),
            FetchType::S16 => (raw as i16).to_string(),
            FetchType::S32 => (raw as i32).to_string(),
            FetchType::S64 => (raw as i64).to_string(),
            FetchType::X8 => format!("{:#x}", raw as u8),
            FetchType::X16 => format!("{:#x}", raw as u16),
            FetchType::X32 => format!("{:#x}", raw as u32),
            FetchType::X64 => format!("{raw:#x}"),
            FetchType::Char => format!("'{}'", char::from(raw as u8)),
            FetchType::Symbol | FetchType::String | FetchType::Ustring | FetchType::Symstr => {
                format!("{raw:#x}")
            }
            FetchType::Bitfield { base, .. } => base.format(raw),
            FetchType::Array { elem, .. } => elem.format(raw),
        }
    }

    /// An array's elements as the kernel prints them, `{a,b,c}` (each as [`format`]); for a
    /// non-array type, the first element alone.
    ///
    /// [`format`]: Self::format
    pub fn format_array(&self, elems: &[u64]) -> String {
        match self {
            FetchType::Array { elem, .. } => {
                let parts: Vec<String> = elems.iter().map(|&e| elem.format(e)).collect();
                format!("{{{}}}", parts.join(","))
            }
            _ => elems.first().map_or_else(String::new, |&e| self.format(e)),
        }
    }
}

/// A fetched string as the kernel prints it: `"text"` in double quotes (bytes up to the
/// first NUL, invalid UTF-8 replaced), or `(fault)` when it could not be read (`None`).
pub fn format_string(bytes: Option<&[u8]>) -> String {
    match bytes {
        None => "(fault)".to_string(),
        Some(b) => {
            let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
            format!("\"{}\"", String::from_utf8_lossy(&b[..end]))
        }
    }
}

impl fmt::Display for FetchType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FetchType::Bitfield {
                base,
                width,
                offset,
            } => write!(f, "b{width}@{offset}/{}", 8 * base.size()),
            FetchType::Array { elem, len } => write!(f, "{elem}[{len}]"),
            scalar => f.write_str(scalar.name().unwrap_or_default()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    #[test]
    fn reg_offsets_match_pt_regs_and_user_regs_struct() {
        let field = [
            offset_of!(PtRegs, r15),
            offset_of!(PtRegs, r14),
            offset_of!(PtRegs, r13),
            offset_of!(PtRegs, r12),
            offset_of!(PtRegs, rbp),
            offset_of!(PtRegs, rbx),
            offset_of!(PtRegs, r11),
            offset_of!(PtRegs, r10),
            offset_of!(PtRegs, r9),
            offset_of!(PtRegs, r8),
            offset_of!(PtRegs, rax),
            offset_of!(PtRegs, rcx),
            offset_of!(PtRegs, rdx),
            offset_of!(PtRegs, rsi),
            offset_of!(PtRegs, rdi),
            offset_of!(PtRegs, orig_rax),
            offset_of!(PtRegs, ip),
            offset_of!(PtRegs, cs),
            offset_of!(PtRegs, flags),
            offset_of!(PtRegs, sp),
            offset_of!(PtRegs, ss),
        ];
        for (r, off) in Reg::ALL.into_iter().zip(field) {
            assert_eq!(r.pt_regs_offset(), off, "{r}");
        }
        // Independent ground truth: glibc's user_regs_struct has the same first 21 words.
        assert_eq!(
            Reg::Di.pt_regs_offset(),
            offset_of!(libc::user_regs_struct, rdi)
        );
        assert_eq!(
            Reg::Bp.pt_regs_offset(),
            offset_of!(libc::user_regs_struct, rbp)
        );
        assert_eq!(
            Reg::Ip.pt_regs_offset(),
            offset_of!(libc::user_regs_struct, rip)
        );
        assert_eq!(
            Reg::Ss.pt_regs_offset(),
            offset_of!(libc::user_regs_struct, ss)
        );
        assert_eq!(
            Reg::OrigAx.pt_regs_offset(),
            offset_of!(libc::user_regs_struct, orig_rax)
        );
    }

    #[test]
    fn reg_names_and_values() {
        assert_eq!(Reg::from_name("di"), Some(Reg::Di));
        assert_eq!(Reg::from_name("orig_ax"), Some(Reg::OrigAx));
        for bad in ["rdi", "DI", "eax", "fs", "gs", "r16", ""] {
            assert_eq!(Reg::from_name(bad), None, "{bad}");
        }
        let regs = PtRegs {
            rdi: 7,
            r8: 8,
            flags: 0x246,
            ..PtRegs::default()
        };
        assert_eq!(Reg::Di.value(&regs), 7);
        assert_eq!(Reg::R8.value(&regs), 8);
        assert_eq!(Reg::Flags.value(&regs), 0x246);
    }

    #[test]
    fn formats_as_the_kernel_prints() {
        assert_eq!(FetchType::U8.format(0x1ff), "255");
        assert_eq!(FetchType::U64.format(u64::MAX), "18446744073709551615");
        assert_eq!(FetchType::S8.format(0xff), "-1");
        assert_eq!(FetchType::S16.format(0x8000), "-32768");
        assert_eq!(FetchType::S32.format(0xffff_fffe), "-2");
        assert_eq!(FetchType::S64.format(5), "5");
        assert_eq!(FetchType::X8.format(0x1ab), "0xab");
        assert_eq!(FetchType::X32.format(0), "0x0");
        assert_eq!(FetchType::X64.format(0xdead_beef_0000), "0xdeadbeef0000");
        assert_eq!(FetchType::Char.format(b'A' as u64), "'A'");
        assert_eq!(FetchType::Symbol.format(0x401000), "0x401000");
        let arr = FetchType::Array {
            elem: Box::new(FetchType::X16),
            len: 3,
        };
        assert_eq!(arr.format_array(&[1, 0x20, 0xffff]), "{0x1,0x20,0xffff}");
        assert_eq!(format_string(Some(b"hello\0junk")), "\"hello\"");
        assert_eq!(format_string(None), "(fault)");
    }

    #[test]
    fn bitfields() {
        // b4@8/32: bits 8..12 of a u32.
        let bf = FetchType::Bitfield {
            base: Box::new(FetchType::U32),
            width: 4,
            offset: 8,
        };
        assert_eq!(bf.extract_bitfield(0xffff_fa55), 0xa);
        assert_eq!(bf.format(bf.extract_bitfield(0x0000_0c00)), "12");
        assert_eq!(bf.to_string(), "b4@8/32");
        assert_eq!(bf.size(), 4);
        let full = FetchType::Bitfield {
            base: Box::new(FetchType::U64),
            width: 64,
            offset: 0,
        };
        assert_eq!(full.extract_bitfield(u64::MAX), u64::MAX);
        let top = FetchType::Bitfield {
            base: Box::new(FetchType::U8),
            width: 1,
            offset: 7,
        };
        // The container is one byte: bits above it are not part of the field.
        assert_eq!(top.extract_bitfield(0x180), 1);
        assert_eq!(top.extract_bitfield(0x17f), 0);
    }

    #[test]
    fn displays_parse_back() {
        let d = FetchOp::Deref {
            offset: -8,
            user: true,
            inner: Box::new(FetchOp::Reg(Reg::Si)),
        };
        assert_eq!(d.to_string(), "-u8(%si)");
        assert_eq!(FetchOp::Imm(u64::MAX).to_string(), "\\-1");
        assert_eq!(FetchOp::Imm(1234).to_string(), "\\1234");
        assert_eq!(
            FetchOp::Mem(0x7fff_0000_1000).to_string(),
            "@0x7fff00001000"
        );
        let s = FetchOp::Sym {
            name: "jiffies".into(),
            offset: -16,
        };
        assert_eq!(s.to_string(), "@jiffies-16");
        assert_eq!(FetchOp::FileOffset(0x4000).to_string(), "@+16384");
        assert_eq!(
            FetchOp::FileOffset(-0x7fff_0000_0000).to_string(),
            "@+-0x7fff00000000"
        );
        let arr = FetchType::Array {
            elem: Box::new(FetchType::U32),
            len: 4,
        };
        assert_eq!(arr.to_string(), "u32[4]");
        assert_eq!(arr.size(), 16);
    }
}
