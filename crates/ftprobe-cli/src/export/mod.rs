//! The exports of a recording (`ftprobe dump`), one module each, below the subcommand: Chrome
//! JSON, folded stacks, Perfetto's protobuf trace.

pub mod chrome;
pub mod folded;
pub mod perfetto;

use crate::recording::Recording;

/// The name of process `pid` of the recording: the command for the target, else the comm of
/// its main thread (tid = pid) if it has a ring, else its first thread's.
pub fn process_name(rec: &Recording, pid: u32) -> String {
    if pid == rec.info.end.pid {
        return rec.info.command.join(" ");
    }
    let threads: Vec<(String, u32)> = rec
        .ring_ids()
        .into_iter()
        .filter(|&i| rec.pid_of(i) == pid)
        .map(|i| rec.thread(i))
        .collect();
    threads
        .iter()
        .find(|(_, tid)| *tid == pid)
        .or(threads.first())
        .map(|(comm, _)| comm.clone())
        .unwrap_or_default()
}
