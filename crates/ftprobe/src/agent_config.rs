//! What the `ftprobe` CLI tells the agent: one typed message, encoded and decoded here only
//! (JSON, with a version), shared by the CLI and the agent.
//!
//! A program started by `ftprobe trace` gets its configuration in `FTPROBE_*` environment
//! variables, which the agent turns into an [`AgentConfig`] at its constructor. A program
//! attached to (`ftprobe trace -p PID`) gets an [`AgentMessage`] through the agent's
//! exported entry `ftprobe_agent_control`, which the CLI calls inside the target.

use serde::{Deserialize, Serialize};

/// The protocol's version: a message of another version is refused.
pub const VERSION: u32 = 2;

/// Where the agent finds the rings' memfd.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RingsFrom {
    /// A file descriptor of the process: inherited (a program started by the CLI), or
    /// made by the process at the CLI's call (attach). The agent closes it once mapped.
    Fd(i32),
}

/// A tracing session's configuration: what the `FTPROBE_*` variables carry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentConfig {
    pub rings: RingsFrom,
    /// The CLI's pid.
    pub cli_pid: u32,
    /// Run the function tracer.
    pub function: bool,
    /// `set_ftrace_filter` / `set_ftrace_notrace` patterns.
    pub filter: Vec<String>,
    pub notrace: Vec<String>,
    /// Run the function_graph tracer, with its `set_graph_function`, `set_graph_notrace`
    /// and `max_graph_depth` (0: no limit).
    pub graph: bool,
    pub graph_function: Vec<String>,
    pub graph_notrace: Vec<String>,
    pub max_depth: u32,
    /// kprobe probe definitions, each with its event's id (the probes of one event share it).
    pub events: Vec<(u32, String)>,
    /// The control channel's memfd (`ftprobe::control`): the agent starts its control
    /// thread on it once the session runs.
    #[serde(default)]
    pub control: Option<i32>,
}

/// A message to an attached agent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AgentMessage {
    /// Start tracing. Every other thread of the process is stopped: `stopped_ips` are where
    /// they resume, `thread_pointers` their `%fs` bases, `stopped_sps` their stack pointers
    /// (the calling thread's included; empty: not known).
    Attach {
        config: Box<AgentConfig>,
        stopped_ips: Vec<u64>,
        thread_pointers: Vec<u64>,
        #[serde(default)]
        stopped_sps: Vec<u64>,
    },
    /// Stop tracing: every site back to the bytes it held at the first attach (its NOP, or
    /// a `-pg` build's call), every probe's byte restored; the agent stays loaded, idle.
    /// Every other thread is stopped: `stopped_ips` are where they resume (the calling
    /// thread's included), `stopped_sps` their stack pointers then, `thread_pointers` their
    /// `%fs` bases (all in the same order).
    Detach {
        stopped_ips: Vec<u64>,
        stopped_sps: Vec<u64>,
        thread_pointers: Vec<u64>,
    },
    /// After a detach that left sites as NOPs (its answer 2: a thread was inside a
    /// trampoline), the threads having run since: put them back now (as `Detach`).
    RestoreSites {
        stopped_ips: Vec<u64>,
        stopped_sps: Vec<u64>,
        thread_pointers: Vec<u64>,
    },
}

#[derive(Serialize, Deserialize)]
struct Envelope {
    version: u32,
    message: AgentMessage,
}

/// The message's bytes, NUL-terminated (a C string for the agent's entry).
pub fn encode(message: &AgentMessage) -> Vec<u8> {
    let mut v = serde_json::to_vec(&Envelope {
        version: VERSION,
        message: message.clone(),
    })
    .expect("a message always encodes");
    v.push(0);
    v
}

/// The message in `bytes` (without its NUL), or why not.
pub fn decode(bytes: &[u8]) -> Result<AgentMessage, String> {
    #[derive(Deserialize)]
    struct Version {
        version: u32,
    }
    let v: Version =
        serde_json::from_slice(bytes).map_err(|e| format!("not an agent message: {e}"))?;
    if v.version != VERSION {
        return Err(format!(
            "the CLI speaks agent protocol {}, this agent {VERSION}: use the agent built with \
             this ftprobe (--agent)",
            v.version
        ));
    }
    let e: Envelope =
        serde_json::from_slice(bytes).map_err(|e| format!("not an agent message: {e}"))?;
    Ok(e.message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_decodes_to_itself() {
        let m = AgentMessage::Attach {
            stopped_sps: vec![0x7ffd_0000_1000],
            config: Box::new(AgentConfig {
                rings: RingsFrom::Fd(7),
                cli_pid: 1,
                function: true,
                filter: vec!["work*".into(), "!x\ny".into()],
                notrace: vec![],
                graph: false,
                graph_function: vec![],
                graph_notrace: vec!["a\tb".into()],
                max_depth: 3,
                control: Some(9),
                events: vec![(0, "p:e work a=$arg1".into()), (0, "p:e caller".into())],
            }),
            stopped_ips: vec![0x401000, u64::MAX],
            thread_pointers: vec![0x7f00_0000_0740],
        };
        let b = encode(&m);
        assert_eq!(b.last(), Some(&0));
        assert_eq!(decode(&b[..b.len() - 1]), Ok(m));
        assert_eq!(
            decode(
                encode(&AgentMessage::Detach {
                    stopped_ips: vec![1, 2],
                    stopped_sps: vec![3, 4],
                    thread_pointers: vec![5, 6],
                })[..]
                    .split_last()
                    .unwrap()
                    .1
            ),
            Ok(AgentMessage::Detach {
                stopped_ips: vec![1, 2],
                stopped_sps: vec![3, 4],
                thread_pointers: vec![5, 6],
            })
        );
    }

    #[test]
    fn another_version_is_refused() {
        let e = decode(br#"{"version":99,"message":"Detach"}"#).unwrap_err();
        assert!(e.contains("protocol 99"), "{e}");
        assert!(decode(b"FTPROBE_FILTER=x").is_err());
    }
}
