// The site-flavour table, shared by `build.rs` (which compiles with these flags) and the
// library (which describes what the compiler left behind). `include!`d by both, so it has
// no inner attributes and no `use` of crate items.
//
// Every byte claim below was checked with `objdump -d` on gcc 12.2 (Debian 12); see
// FLAVOURS.md for the disassembly.

/// One way a compiler leaves an ftrace site at a function's entry (DESIGN.md section 2).
///
/// Objects are compiled with [`Flavour::cflags`] (plus `-O2 -g -fno-omit-frame-pointer` for
/// the C fixtures) and linked with [`Flavour::ldflags`], never with `-pg`: `__fentry__` and
/// `mcount` resolve to glibc's exported ones, which return at once while gmon is off.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Flavour {
    /// `-pg -mfentry -mnop-mcount -mrecord-mcount -fno-pie`, linked `-no-pie`:
    /// NOP5 `0f 1f 44 00 00` at entry, recorded in `__mcount_loc`.
    FentryNop,
    /// `-pg -mfentry -mrecord-mcount`, PIE: `ff 15 rel32` = `call *__fentry__@GOTPCREL(%rip)`
    /// at entry, recorded in `__mcount_loc`.
    FentryCallPieRecord,
    /// `-pg -mfentry`, PIE: `ff 15 rel32` at entry, no record section (find sites by decoding).
    FentryCallPie,
    /// `-pg -mfentry -fno-pie`, linked `-no-pie`: `e8 rel32` = `call __fentry__@plt` at entry,
    /// no record section.
    FentryCallNoPie,
    /// `-pg`, PIE: `ff 15 rel32` = `call *mcount@GOTPCREL(%rip)` after the prologue, no record.
    McountPie,
    /// `-pg -fno-pie`, linked `-no-pie`: `e8 rel32` = `call mcount@plt` after the prologue.
    McountNoPie,
    /// `-pg -mrecord-mcount`, PIE: `ff 15 rel32` after the prologue, recorded in `__mcount_loc`.
    McountPieRecord,
    /// `-fpatchable-function-entry=5`, PIE: five `90` at entry, recorded in
    /// `__patchable_function_entries`.
    Patchable,
    /// `-fpatchable-function-entry=5 -fcf-protection=full`, PIE: `endbr64` then five `90`.
    PatchableCet,
    /// `-pg -mfentry -mrecord-mcount -fcf-protection=full`, PIE: `endbr64` then `ff 15 rel32`.
    FentryCetPieRecord,
    /// `-pg -mfentry -mnop-mcount -mrecord-mcount -fcf-protection=full -fno-pie`, linked
    /// `-no-pie`: `endbr64` then NOP5.
    FentryCetNop,
}

/// The instruction the compiler put at a site, as it is in the file (before any patching).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SiteInsn {
    /// `0f 1f 44 00 00`: `nopl 0x0(%rax,%rax,1)`.
    Nop5,
    /// `90 90 90 90 90`: five one-byte NOPs.
    FiveNops,
    /// `ff 15 rel32`: `call *target@GOTPCREL(%rip)` (6 bytes).
    CallGotPcrel {
        /// The called symbol: `__fentry__` or `mcount`.
        target: &'static str,
    },
    /// `e8 rel32`: `call target@plt` (5 bytes).
    CallRel32 {
        /// The called symbol: `__fentry__` or `mcount`.
        target: &'static str,
    },
}

impl SiteInsn {
    /// The fixed leading bytes of the instruction (the whole of it for the NOP forms, the
    /// opcode for the calls, whose displacement depends on the layout).
    pub fn prefix(&self) -> &'static [u8] {
        match self {
            SiteInsn::Nop5 => &[0x0f, 0x1f, 0x44, 0x00, 0x00],
            SiteInsn::FiveNops => &[0x90; 5],
            SiteInsn::CallGotPcrel { .. } => &[0xff, 0x15],
            SiteInsn::CallRel32 { .. } => &[0xe8],
        }
    }

    /// Length in bytes of the original site (5 or 6).
    pub fn byte_len(&self) -> u64 {
        match self {
            SiteInsn::CallGotPcrel { .. } => 6,
            _ => 5,
        }
    }
}

/// `endbr64`, which `-fcf-protection` puts before the site.
pub const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];

/// `push %rbp; mov %rsp,%rbp`, the frame-pointer prologue before an `mcount` call.
pub const PUSH_RBP_MOV_RSP_RBP: [u8; 4] = [0x55, 0x48, 0x89, 0xe5];

impl Flavour {
    /// Every flavour, in declaration order.
    pub const ALL: [Flavour; 11] = [
        Flavour::FentryNop,
        Flavour::FentryCallPieRecord,
        Flavour::FentryCallPie,
        Flavour::FentryCallNoPie,
        Flavour::McountPie,
        Flavour::McountNoPie,
        Flavour::McountPieRecord,
        Flavour::Patchable,
        Flavour::PatchableCet,
        Flavour::FentryCetPieRecord,
        Flavour::FentryCetNop,
    ];

    /// Kebab-case name, used in fixture file names (`calls-fentry-nop`).
    pub fn name(&self) -> &'static str {
        match self {
            Flavour::FentryNop => "fentry-nop",
            Flavour::FentryCallPieRecord => "fentry-call-pie-record",
            Flavour::FentryCallPie => "fentry-call-pie",
            Flavour::FentryCallNoPie => "fentry-call-no-pie",
            Flavour::McountPie => "mcount-pie",
            Flavour::McountNoPie => "mcount-no-pie",
            Flavour::McountPieRecord => "mcount-pie-record",
            Flavour::Patchable => "patchable",
            Flavour::PatchableCet => "patchable-cet",
            Flavour::FentryCetPieRecord => "fentry-cet-pie-record",
            Flavour::FentryCetNop => "fentry-cet-nop",
        }
    }

    /// The gcc flags that make the sites (compile step only).
    ///
    /// `-fno-pie` comes last on purpose: where another tool adds `-fPIC` before these flags
    /// (the `cc` crate does), the last one wins, and gcc refuses `-mnop-mcount` with `-fPIC`.
    pub fn cflags(&self) -> &'static [&'static str] {
        match self {
            Flavour::FentryNop => &[
                "-pg",
                "-mfentry",
                "-mnop-mcount",
                "-mrecord-mcount",
                "-fno-pie",
            ],
            Flavour::FentryCallPieRecord => &["-pg", "-mfentry", "-mrecord-mcount"],
            Flavour::FentryCallPie => &["-pg", "-mfentry"],
            Flavour::FentryCallNoPie => &["-pg", "-mfentry", "-fno-pie"],
            Flavour::McountPie => &["-pg"],
            Flavour::McountNoPie => &["-pg", "-fno-pie"],
            Flavour::McountPieRecord => &["-pg", "-mrecord-mcount"],
            Flavour::Patchable => &["-fpatchable-function-entry=5"],
            Flavour::PatchableCet => &["-fpatchable-function-entry=5", "-fcf-protection=full"],
            Flavour::FentryCetPieRecord => {
                &["-pg", "-mfentry", "-mrecord-mcount", "-fcf-protection=full"]
            }
            Flavour::FentryCetNop => &[
                "-pg",
                "-mfentry",
                "-mnop-mcount",
                "-mrecord-mcount",
                "-fcf-protection=full",
                "-fno-pie",
            ],
        }
    }

    /// The flags for linking an executable (never `-pg`): `-no-pie` or nothing.
    pub fn ldflags(&self) -> &'static [&'static str] {
        if self.is_pie() {
            &[]
        } else {
            &["-no-pie"]
        }
    }

    /// Whether executables of this flavour are PIE (gcc's Debian default) rather than `-no-pie`.
    pub fn is_pie(&self) -> bool {
        !matches!(
            self,
            Flavour::FentryNop
                | Flavour::FentryCallNoPie
                | Flavour::McountNoPie
                | Flavour::FentryCetNop
        )
    }

    /// Whether `-fPIC` code (a shared library) can be built in this flavour.
    ///
    /// gcc 12 refuses `-mnop-mcount` with `-fPIC` ("not implemented for '-fPIC'"); the other
    /// `-fno-pie` flavours are left out too, since their point is non-PIC code.
    pub fn supports_pic(&self) -> bool {
        self.is_pie()
    }

    /// The instruction at the site, as compiled.
    pub fn site_insn(&self) -> SiteInsn {
        match self {
            Flavour::FentryNop | Flavour::FentryCetNop => SiteInsn::Nop5,
            Flavour::FentryCallPieRecord | Flavour::FentryCallPie | Flavour::FentryCetPieRecord => {
                SiteInsn::CallGotPcrel {
                    target: "__fentry__",
                }
            }
            Flavour::FentryCallNoPie => SiteInsn::CallRel32 {
                target: "__fentry__",
            },
            Flavour::McountPie | Flavour::McountPieRecord => {
                SiteInsn::CallGotPcrel { target: "mcount" }
            }
            Flavour::McountNoPie => SiteInsn::CallRel32 { target: "mcount" },
            Flavour::Patchable | Flavour::PatchableCet => SiteInsn::FiveNops,
        }
    }

    /// Whether `-fcf-protection=full` put `endbr64` at each function's entry.
    pub fn has_endbr(&self) -> bool {
        matches!(
            self,
            Flavour::PatchableCet | Flavour::FentryCetPieRecord | Flavour::FentryCetNop
        )
    }

    /// Whether the site is an `mcount` call placed after the prologue.
    pub fn is_mcount(&self) -> bool {
        matches!(
            self,
            Flavour::McountPie | Flavour::McountNoPie | Flavour::McountPieRecord
        )
    }

    /// Offset of the site from the function symbol in the fixtures' `work`: 0, 4 past
    /// `endbr64`, or 4 past `push %rbp; mov %rsp,%rbp` for `mcount`.
    ///
    /// For `mcount` the site follows the whole prologue, so in a function that also saves
    /// callee-saved registers it is further in (the fixtures' `caller` has it at +9).
    pub fn site_offset(&self) -> u64 {
        if self.has_endbr() || self.is_mcount() {
            4
        } else {
            0
        }
    }

    /// Number of original bytes at the site: 5, or 6 for `call *sym@GOTPCREL(%rip)`.
    pub fn site_len(&self) -> u64 {
        self.site_insn().byte_len()
    }

    /// The section listing the sites' addresses (link-time addresses: add the load bias in a
    /// PIE), or `None` where sites must be found by decoding.
    pub fn record_section(&self) -> Option<&'static str> {
        match self {
            Flavour::FentryNop
            | Flavour::FentryCallPieRecord
            | Flavour::McountPieRecord
            | Flavour::FentryCetPieRecord
            | Flavour::FentryCetNop => Some("__mcount_loc"),
            Flavour::Patchable | Flavour::PatchableCet => Some("__patchable_function_entries"),
            Flavour::FentryCallPie
            | Flavour::FentryCallNoPie
            | Flavour::McountPie
            | Flavour::McountNoPie => None,
        }
    }

    /// Whether a record section lists the sites (see [`Flavour::record_section`]).
    pub fn has_record_section(&self) -> bool {
        self.record_section().is_some()
    }
}
