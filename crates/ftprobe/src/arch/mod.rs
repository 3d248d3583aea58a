//! Architecture back ends, picked in one place (STYLE.md item 6).
//!
//! An architecture module provides, under the same names:
//! - `sites`: what compilers leave at ftrace sites, recognition by bytes and by decoding;
//! - `nops`: the canonical NOP of a site, the patched call, `SITE_LEN`;
//! - `text_poke`: rewriting live code (`text_poke_early`, `text_poke_batch`), the trap handler
//!   that emulates sites in flight;
//! - `trampoline`: trampoline templates, `PtRegs`, the callback type;
//! - `tramp_area`: executable memory within call reach of a site.
//!
//! Only x86-64 exists today.

pub mod x86_64;
