//! ftprobe: the Linux kernel's kprobes + ftrace design for one user-space process on x86-64.
//!
//! Layers (DESIGN.md section 1): [`ftrace`] (sites, `ftrace_ops`, patching), [`arch`] (site
//! formats, NOPs, `text_poke`, trampolines), [`ring`] (per-thread ring buffers shared with the
//! CLI), [`elf`] (objects on disk), [`process`] (objects in this process), [`sys`] (syscalls).

pub mod agent_config;
pub mod arch;
pub mod control;
pub mod demangle;
pub mod elf;
pub mod events;
pub mod ftrace;
pub mod function_graph;
pub mod function_tracer;
pub mod kprobes;
mod probe_state;
pub mod process;
pub mod record;
pub mod ring;
pub mod sys;
pub mod trace;
pub mod trace_kprobe;
