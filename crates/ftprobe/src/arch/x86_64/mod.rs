//! x86-64: sites, NOPs, live patching, trampolines (arch/x86/kernel/{ftrace.c,ftrace_64.S,
//! alternative.c} in the kernel).

pub mod code_write;
pub mod insn;
pub mod nops;
pub mod optprobe;
pub mod return_trampoline;
pub mod sigframe;
pub mod sites;
pub mod text_poke;
pub mod tramp_area;
pub mod tramp_signals;
pub mod trampoline;
pub mod uaccess;
