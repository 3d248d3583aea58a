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

/// Before a non-local jump (`longjmp`, `siglongjmp`, `_longjmp`, `__longjmp_chk`) that sets
/// this thread's stack pointer to `target_sp` (the agent's interposers call it with the
/// `jmp_buf`'s stack pointer): the probe path's per-thread state held by the frames the
/// jump leaves is released (a signal handler that interrupted the probe path and jumps out
/// of it). Async-signal-safe.
pub fn before_longjmp(target_sp: u64) {
    probe_state::before_longjmp(target_sp);
}
