//! Live control of a `trace --control` session: text commands in the tracefs language
//! (`echo DEF >> kprobe_events`, `echo 1 > events/GRP/EVENT/enable`, `echo 'fib*' >
//! set_ftrace_filter`, `echo nop > current_tracer`, `echo 0 > tracing_on`, `cat
//! kprobe_profile`, ...), from `--interactive` (standard input) or `ftprobe ctl PID`
//! (the session's socket, `ftprobe::control::client`). Each command that changes the
//! program becomes one typed request to the agent's control thread (`ftprobe::control`),
//! carried out while the program runs. The CLI keeps the names (event ids), the
//! `error_log`, and the `kprobe_profile` counts the trace's printer publishes.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use ftprobe::control::{ControlArea, Reply, Request};
use ftprobe::events::{
    error_log, parse_probe_command, ProbeCommand, ProbeDef, ProbeError, ProbeErrorKind,
};
use ftprobe::trace_kprobe;

/// What the printer and the controller share: events added while the session runs (the
/// printer takes them before it reads the records that use them) and the profile counts.
#[derive(Default)]
pub struct LiveEvents {
    added: Mutex<(Vec<(u32, ProbeDef)>, u64)>,
    taken: Condvar,
    /// Events whose add the agent refused: they never were, and leave the profile.
    refused: Mutex<Vec<u32>>,
    /// Per event id: (records seen, dropped, nmissed).
    profile: Mutex<Vec<(u64, u64, u64)>>,
}

impl LiveEvents {
    /// The printer's side: the events added since the last call.
    pub fn take_added(&self) -> Vec<(u32, ProbeDef)> {
        let mut g = self.added.lock().unwrap_or_else(|e| e.into_inner());
        let v = std::mem::take(&mut g.0);
        g.1 += 1;
        self.taken.notify_all();
        v
    }

    /// The printer's side: the ids of the events that were refused.
    pub fn refused(&self) -> Vec<u32> {
        self.refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The printer's side: the counts after a poll.
    pub fn publish_profile(&self, p: Vec<(u64, u64, u64)>) {
        *self.profile.lock().unwrap_or_else(|e| e.into_inner()) = p;
    }

    /// Add an event and wait (up to a second) until the printer took it.
    fn add(&self, id: u32, def: ProbeDef) {
        let mut g = self.added.lock().unwrap_or_else(|e| e.into_inner());
        g.0.push((id, def));
        let gen = g.1;
        let _ = self
            .taken
            .wait_timeout_while(g, Duration::from_secs(1), |g| g.1 == gen);
    }
}

/// An event of the session.
struct Event {
    defs: Vec<String>,
    def: ProbeDef,
    enabled: bool,
    /// Removed (`-:EVENT`): its id is never reused.
    removed: bool,
}

struct State {
    events: Vec<Event>,
    /// The `error_log` (its last 8 entries, as the kernel keeps a few).
    error_log: Vec<String>,
    /// The session's tracer, and whether it runs (`current_tracer` is it or `nop`).
    tracer: &'static str,
    tracer_on: bool,
    tracing_on: bool,
    filter: Vec<String>,
    notrace: Vec<String>,
}

/// The controller of one session.
pub struct Controller {
    area: ControlArea,
    live: Arc<LiveEvents>,
    state: Mutex<State>,
}

/// How long a request may take in the agent (a program stopped by a debugger answers
/// nothing).
const TIMEOUT: Duration = Duration::from_secs(10);

/// The tracefs directories a user may write in front of a file name.
const TRACEFS: [&str; 2] = ["/sys/kernel/tracing/", "/sys/kernel/debug/tracing/"];

impl Controller {
    /// A controller on `area` for a session started with `events` (all enabled), `tracer`
    /// and its filters.
    pub fn new(
        area: ControlArea,
        events: &[(Vec<String>, ProbeDef)],
        tracer: &'static str,
        filter: &[String],
        notrace: &[String],
    ) -> Controller {
        Controller {
            area,
            live: Arc::new(LiveEvents::default()),
            state: Mutex::new(State {
                events: events
                    .iter()
                    .map(|(defs, def)| Event {
                        defs: defs.clone(),
                        def: def.clone(),
                        enabled: true,
                        removed: false,
                    })
                    .collect(),
                error_log: Vec::new(),
                tracer: if tracer == "nop" { "function" } else { tracer },
                tracer_on: tracer != "nop",
                tracing_on: true,
                filter: filter.to_vec(),
                notrace: notrace.to_vec(),
            }),
        }
    }

    pub fn live(&self) -> Arc<LiveEvents> {
        self.live.clone()
    }

    /// The session ends: the agent's thread stops waiting (after the command in flight,
    /// if any).
    pub fn close(&self) {
        let _st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        self.area.close();
    }

    fn call(&self, req: &Request) -> Reply {
        match self.area.call(req, TIMEOUT) {
            Ok(r) => r,
            Err(e) => Reply {
                ok: false,
                text: e.to_string(),
            },
        }
    }

    /// Carry out one command line; returns the reply (the text of a read, or the error).
    pub fn run(&self, line: &str) -> Reply {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let r = match parse(line) {
            Ok(Cmd::Cat(file)) => self.cat(&st, &file),
            Ok(Cmd::Write {
                file,
                value,
                append,
            }) => self.write(&mut st, &file, &value, append),
            Ok(Cmd::Help) => ok(HELP),
            Err(e) => Err(e),
        };
        match r {
            Ok(r) => r,
            Err(text) => {
                st.error_log.push(text.clone());
                let n = st.error_log.len();
                if n > 8 {
                    st.error_log.drain(..n - 8);
                }
                Reply { ok: false, text }
            }
        }
    }

    fn cat(&self, st: &State, file: &str) -> Result<Reply, String> {
        let text = match file {
            "kprobe_events" => st
                .events
                .iter()
                .filter(|e| !e.removed)
                .flat_map(|e| e.defs.iter().map(|d| format!("{d}\n")))
                .collect(),
            "kprobes/list" => {
                let r = self.call(&Request::KprobesList);
                if !r.ok {
                    return Err(r.text);
                }
                r.text
            }
            "kprobe_profile" => {
                let p = self.live.profile.lock().unwrap_or_else(|e| e.into_inner());
                st.events
                    .iter()
                    .enumerate()
                    .filter(|(_, e)| !e.removed)
                    .map(|(id, e)| {
                        let (seen, dropped, missed) = p.get(id).copied().unwrap_or_default();
                        format!(
                            "  {:<44} {:>15} {:>15}\n",
                            e.def.event,
                            seen + dropped,
                            missed
                        )
                    })
                    .collect()
            }
            "error_log" => st.error_log.concat(),
            "current_tracer" => format!("{}\n", if st.tracer_on { st.tracer } else { "nop" }),
            "tracing_on" => format!("{}\n", u8::from(st.tracing_on)),
            "set_ftrace_filter" => lines(&st.filter),
            "set_ftrace_notrace" => lines(&st.notrace),
            f => match event_path(f) {
                Some((g, e, "enable")) => {
                    let on = st
                        .events
                        .iter()
                        .filter(|ev| !ev.removed && matches(ev, g, e))
                        .map(|ev| ev.enabled)
                        .collect::<Vec<_>>();
                    if on.is_empty() {
                        return Err(format!("cat {f}: no such event (ENOENT)\n"));
                    }
                    // The kernel's `X` when some are on and some off.
                    match (on.iter().all(|&b| b), on.iter().any(|&b| b)) {
                        (true, _) => "1\n".into(),
                        (false, true) => "X\n".into(),
                        _ => "0\n".into(),
                    }
                }
                _ => return Err(format!("cat {f}: no such file (ENOENT)\n")),
            },
        };
        ok(text)
    }

    fn write(
        &self,
        st: &mut State,
        file: &str,
        value: &str,
        append: bool,
    ) -> Result<Reply, String> {
        match file {
            "kprobe_events" => self.write_kprobe_events(st, value, append),
            "set_ftrace_filter" | "set_ftrace_notrace" => {
                let notrace = file == "set_ftrace_notrace";
                let patterns: Vec<String> = value.split_whitespace().map(str::to_owned).collect();
                for p in &patterns {
                    if let Err(e) = ftprobe::ftrace::glob::FilterEntry::parse(p) {
                        return Err(format!("{file}: {e} (EINVAL)\n"));
                    }
                }
                let r = self.call(&Request::SetFilter {
                    notrace,
                    reset: !append,
                    patterns: patterns.clone(),
                });
                if !r.ok {
                    return Err(format!("{file}: {}\n", r.text.trim_end()));
                }
                let list = if notrace {
                    &mut st.notrace
                } else {
                    &mut st.filter
                };
                if !append {
                    list.clear();
                }
                list.extend(patterns);
                Ok(r)
            }
            "current_tracer" => {
                let name = value.trim();
                let r = self.call(&Request::SetTracer {
                    tracer: name.to_owned(),
                });
                if !r.ok {
                    return Err(format!("current_tracer: {}\n", r.text.trim_end()));
                }
                st.tracer_on = name != "nop";
                Ok(r)
            }
            "tracing_on" => {
                let on = bool_value(file, value)?;
                let r = self.call(&Request::TracingOn { on });
                if r.ok {
                    st.tracing_on = on;
                }
                Ok(r)
            }
            f => match event_path(f) {
                Some((g, e, "enable")) => {
                    let on = bool_value(f, value)?;
                    let ids: Vec<usize> = (0..st.events.len())
                        .filter(|&i| !st.events[i].removed && matches(&st.events[i], g, e))
                        .collect();
                    if ids.is_empty() {
                        return Err(format!("{f}: no such event (ENOENT)\n"));
                    }
                    for id in ids {
                        if st.events[id].enabled == on {
                            continue;
                        }
                        let r = self.call(&Request::EnableEvent {
                            id: id as u32,
                            enable: on,
                        });
                        if !r.ok {
                            return Err(format!("{f}: {}\n", r.text.trim_end()));
                        }
                        st.events[id].enabled = on;
                    }
                    ok("")
                }
                _ => Err(format!(
                    "{f}: no such file, or not writable here (ENOENT)\n"
                )),
            },
        }
    }

    fn write_kprobe_events(
        &self,
        st: &mut State,
        value: &str,
        append: bool,
    ) -> Result<Reply, String> {
        let value = value.trim();
        if !append {
            // `>`: every event goes first (EBUSY if one is enabled, as in the kernel).
            if st.events.iter().any(|e| !e.removed && e.enabled) {
                return Err(
                    "kprobe_events: an event is enabled: disable it first (EBUSY)\n".into(),
                );
            }
            for id in 0..st.events.len() {
                if !st.events[id].removed {
                    let r = self.call(&Request::RemoveEvent { id: id as u32 });
                    if !r.ok {
                        return Err(format!("kprobe_events: {}\n", r.text.trim_end()));
                    }
                    st.events[id].removed = true;
                }
            }
            if value.is_empty() {
                return ok("");
            }
        }
        if let Ok(ProbeCommand::Remove { group, event }) = parse_probe_command(value) {
            let ids: Vec<usize> = (0..st.events.len())
                .filter(|&i| {
                    let e = &st.events[i];
                    !e.removed
                        && e.def.event == event
                        && group.as_ref().is_none_or(|g| *g == e.def.group)
                })
                .collect();
            if ids.is_empty() {
                return Err(format!("kprobe_events: {value}: no such event (ENOENT)\n"));
            }
            if ids.iter().any(|&i| st.events[i].enabled) {
                return Err(format!(
                    "kprobe_events: {value}: the event is enabled: disable it first (EBUSY)\n"
                ));
            }
            for id in ids {
                let r = self.call(&Request::RemoveEvent { id: id as u32 });
                if !r.ok {
                    return Err(format!("kprobe_events: {}\n", r.text.trim_end()));
                }
                st.events[id].removed = true;
            }
            return ok("");
        }
        let live = st
            .events
            .iter()
            .enumerate()
            .filter(|(_, e)| !e.removed)
            .collect::<Vec<_>>();
        let placed = place_def(live.iter().map(|(_, e)| (e.defs.as_slice(), &e.def)), value)
            .map_err(|r| r.text)?;
        let (def, id) = match placed {
            (def, None) => {
                if st.events.len() >= ftprobe::ring::MAX_EVENTS {
                    return Err(format!(
                        "kprobe_events: at most {} events in a session (ENOSPC)\n",
                        ftprobe::ring::MAX_EVENTS
                    ));
                }
                (def, st.events.len())
            }
            (def, Some(i)) => (def, live[i].0),
        };
        let new = id == st.events.len();
        if new {
            // The printer knows the event before the agent can write a record of it.
            self.live.add(id as u32, def.clone());
        }
        let r = self.call(&Request::AddEvent {
            id: id as u32,
            def: value.to_owned(),
        });
        if !r.ok {
            if new {
                // Keep the id taken (the printer knows it); the event is gone, and never was
                // in the profile.
                self.live
                    .refused
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(id as u32);
                st.events.push(Event {
                    defs: vec![value.to_owned()],
                    def,
                    enabled: false,
                    removed: true,
                });
            }
            return Err(r.text);
        }
        if new {
            st.events.push(Event {
                defs: vec![value.to_owned()],
                def,
                enabled: false,
                removed: false,
            });
        } else {
            st.events[id].defs.push(value.to_owned());
            if st.events[id].enabled {
                // One more probe of an enabled event: enabled too.
                let r = self.call(&Request::EnableEvent {
                    id: id as u32,
                    enable: true,
                });
                if !r.ok {
                    return Err(r.text);
                }
            }
        }
        Ok(r)
    }
}

fn ok(text: impl Into<String>) -> Result<Reply, String> {
    Ok(Reply {
        ok: true,
        text: text.into(),
    })
}

fn lines(v: &[String]) -> String {
    v.iter().map(|p| format!("{p}\n")).collect()
}

fn bool_value(file: &str, value: &str) -> Result<bool, String> {
    match value.trim() {
        "1" => Ok(true),
        "0" => Ok(false),
        v => Err(format!("{file}: {v:?}: 0 or 1 (EINVAL)\n")),
    }
}

/// `events/enable` (every event), `events/GRP/enable`, `events/GRP/EVENT/enable`:
/// (group, event, file).
fn event_path(f: &str) -> Option<(Option<&str>, Option<&str>, &str)> {
    let rest = f.strip_prefix("events/")?;
    let parts: Vec<&str> = rest.split('/').collect();
    match parts.as_slice() {
        [file] => Some((None, None, file)),
        [g, file] => Some((Some(g), None, file)),
        [g, e, file] => Some((Some(g), Some(e), file)),
        _ => None,
    }
}

fn matches(e: &Event, group: Option<&str>, event: Option<&str>) -> bool {
    group.is_none_or(|g| g == e.def.group) && event.is_none_or(|n| n == e.def.event)
}

enum Cmd {
    Cat(String),
    Write {
        file: String,
        value: String,
        append: bool,
    },
    Help,
}

const HELP: &str = "\
commands (the kernel's tracefs files; values in quotes as in a shell):
  echo 'p:[GRP/]EVENT SYM [ARGS]' >> kprobe_events   add an event (disabled)
  echo '-:[GRP/]EVENT' >> kprobe_events               remove a disabled event
  echo 1 > events/GRP/EVENT/enable                    enable (0: disable); also
                                                      events/GRP/enable, events/enable
  echo 'GLOB ...' > set_ftrace_filter                 replace the filter (>> adds, !GLOB removes,
                                                      an empty value: every function)
  echo 'GLOB ...' > set_ftrace_notrace
  echo nop > current_tracer                           stop the tracer (its name starts it again)
  echo 0 > tracing_on                                 stop writing events (1: write again)
  cat kprobe_events | kprobes/list | kprobe_profile | error_log | current_tracer |
      tracing_on | set_ftrace_filter | set_ftrace_notrace | events/GRP/EVENT/enable
";

/// One command line: `echo [-n] VALUE > FILE`, `echo VALUE >> FILE`, `cat FILE`, `help`.
fn parse(line: &str) -> Result<Cmd, String> {
    let words = split(line).map_err(|e| format!("{line}: {e}\n"))?;
    let strip = |f: &str| -> String {
        TRACEFS
            .iter()
            .find_map(|d| f.strip_prefix(d))
            .unwrap_or(f)
            .to_owned()
    };
    match words.first().map(|(w, _)| w.as_str()) {
        Some("help") => Ok(Cmd::Help),
        Some("cat") if words.len() == 2 => Ok(Cmd::Cat(strip(&words[1].0))),
        Some("echo") => {
            let at = words
                .iter()
                .position(|(w, quoted)| !quoted && (w == ">" || w == ">>"))
                .ok_or_else(|| format!("{line}: no `> FILE` or `>> FILE`\n"))?;
            if at + 2 != words.len() {
                return Err(format!("{line}: one file after `{}`\n", words[at].0));
            }
            let mut value = &words[1..at];
            if value.first().is_some_and(|(w, q)| !q && w == "-n") {
                value = &value[1..];
            }
            Ok(Cmd::Write {
                file: strip(&words[at + 1].0),
                value: value
                    .iter()
                    .map(|(w, _)| w.as_str())
                    .collect::<Vec<_>>()
                    .join(" "),
                append: words[at].0 == ">>",
            })
        }
        Some(w) => Err(format!(
            "{w}: unknown command (echo VALUE > FILE, echo VALUE >> FILE, cat FILE, help)\n"
        )),
        None => Err("an empty command\n".into()),
    }
}

/// Shell-like words: `'...'` and `"..."` quote (with `\"` and `\\` in double quotes), `>`
/// and `>>` are words of their own when unquoted. Each word says whether any of it was
/// quoted.
fn split(line: &str) -> Result<Vec<(String, bool)>, String> {
    let mut words = Vec::new();
    let mut cur: Option<(String, bool)> = None;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' => {
                if let Some(w) = cur.take() {
                    words.push(w);
                }
            }
            '>' => {
                if let Some(w) = cur.take() {
                    words.push(w);
                }
                if chars.peek() == Some(&'>') {
                    chars.next();
                    words.push((">>".into(), false));
                } else {
                    words.push((">".into(), false));
                }
            }
            '\'' => {
                let w = cur.get_or_insert_with(|| (String::new(), true));
                w.1 = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => w.0.push(c),
                        None => return Err("an unterminated '".into()),
                    }
                }
            }
            '"' => {
                let w = cur.get_or_insert_with(|| (String::new(), true));
                w.1 = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c @ ('"' | '\\' | '$' | '`')) => w.0.push(c),
                            Some(c) => {
                                w.0.push('\\');
                                w.0.push(c);
                            }
                            None => return Err("an unterminated \"".into()),
                        },
                        Some(c) => w.0.push(c),
                        None => return Err("an unterminated \"".into()),
                    }
                }
            }
            '\\' => {
                let w = cur.get_or_insert_with(|| (String::new(), false));
                if let Some(c) = chars.next() {
                    w.0.push(c);
                }
            }
            c => cur.get_or_insert_with(|| (String::new(), false)).0.push(c),
        }
    }
    if let Some(w) = cur.take() {
        words.push(w);
    }
    Ok(words)
}

/// Serve `ctl` clients on the session's socket until the process ends (the listener is
/// removed by [`Server::drop`]).
pub struct Server {
    path: PathBuf,
}

impl Server {
    /// Listen on the control socket for process `pid`; each connection is served on a
    /// thread of its own (commands run one at a time).
    pub fn start(ctl: Arc<Controller>, pid: u32) -> anyhow::Result<Server> {
        let path = ftprobe::control::client::socket_path(pid)?;
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path)?;
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                if !same_user(&conn) {
                    continue;
                }
                let ctl = ctl.clone();
                std::thread::spawn(move || serve(&ctl, conn));
            }
        });
        Ok(Server { path })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The peer runs as our user (SO_PEERCRED).
fn same_user(s: &UnixStream) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: a zeroed ucred is valid; getsockopt writes at most `len` bytes into it.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: as above; the fd is the live socket's.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    // SAFETY: getuid has no preconditions.
    r == 0 && cred.uid == unsafe { libc::getuid() }
}

fn serve(ctl: &Controller, conn: UnixStream) {
    let Ok(w) = conn.try_clone() else { return };
    let mut w = std::io::BufWriter::new(w);
    for line in BufReader::new(conn).lines() {
        let Ok(line) = line else { return };
        // An empty line too gets its reply (an error): the client waits for one.
        let reply = ctl.run(&line);
        let Ok(mut json) = serde_json::to_vec(&reply) else {
            return;
        };
        json.push(b'\n');
        if w.write_all(&json).and_then(|()| w.flush()).is_err() {
            return;
        }
    }
}

/// `--interactive`: commands from standard input, replies on standard error.
pub fn serve_stdin(ctl: Arc<Controller>) {
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        for line in stdin.lock().lines() {
            let Ok(line) = line else { return };
            if line.trim().is_empty() {
                continue;
            }
            let r = ctl.run(&line);
            let mut e = std::io::stderr().lock();
            if r.ok {
                let _ = e.write_all(r.text.as_bytes());
            } else {
                let _ = write!(e, "ftprobe: {}", r.text);
                if !r.text.ends_with('\n') {
                    let _ = writeln!(e);
                }
            }
        }
    });
}

/// `ftprobe ctl PID [CMD ...]`: send each command (or each line of standard input) to the
/// session tracing PID; print each reply's text (an error's on standard error). Returns
/// the exit code: 0 when every command succeeded, 1 otherwise.
pub fn ctl(pid: u32, commands: &[String]) -> anyhow::Result<i32> {
    // No session: exit 2, as for a usage error (a refused command exits 1).
    let mut s =
        ftprobe::control::client::Session::connect(pid).map_err(|e| crate::usage!("{e}"))?;
    let mut code = 0;
    let mut one = |cmd: &str| -> anyhow::Result<()> {
        let r = s
            .send(cmd)
            .map_err(|e| anyhow::anyhow!("{e}: the session ended (did process {pid} exit?)"))?;
        if r.ok {
            let mut o = std::io::stdout().lock();
            o.write_all(r.text.as_bytes())?;
            o.flush()?;
        } else {
            eprint!("ftprobe: {}", r.text);
            if !r.text.ends_with('\n') {
                eprintln!();
            }
            code = 1;
        }
        Ok(())
    };
    if commands.is_empty() {
        for line in std::io::stdin().lock().lines() {
            let line = line?;
            if !line.trim().is_empty() {
                one(&line)?;
            }
        }
    } else {
        for c in commands {
            one(c)?;
        }
    }
    Ok(code)
}

/// A probe definition refused: the kernel's `error_log` text, and its error's name.
pub struct DefRefused {
    pub text: String,
    pub kind: &'static str,
}

/// Where probe definition `d` goes among the events `events` (each: its definitions and
/// the first one parsed), as a write to `kprobe_events` places it: a new event (`None`), or
/// one more probe of event `i` (`Some(i)`, the same group/event name, kind and arguments).
pub fn place_def<'a>(
    events: impl Iterator<Item = (&'a [String], &'a ProbeDef)>,
    d: &str,
) -> std::result::Result<(ProbeDef, Option<usize>), DefRefused> {
    let refuse = |kind: ProbeErrorKind, pos: usize| DefRefused {
        text: error_log(d, &ProbeError::new(kind, pos)),
        kind: kind.name(),
    };
    let def = match trace_kprobe::check(d) {
        Ok(def) => def,
        Err(e) => {
            let mut text = error_log(d, &e.err);
            if let Some(detail) = &e.detail {
                text.push_str(&format!("  ({detail})\n"));
            }
            return Err(DefRefused {
                text,
                kind: e.err.kind.name(),
            });
        }
    };
    let Some((i, (defs, first))) = events
        .enumerate()
        .find(|(_, (_, e))| e.group == def.group && e.event == def.event)
    else {
        return Ok((def, None));
    };
    if first.kind != def.kind {
        return Err(refuse(ProbeErrorKind::DiffProbeType, 0));
    }
    // The first argument whose name or type differs, or the first one past the shorter
    // list (after the end when the new one is shorter).
    let differs = (0..def.args.len().max(first.args.len())).find(|&i| {
        match (def.args.get(i), first.args.get(i)) {
            (Some(a), Some(b)) => a.name != b.name || a.ty != b.ty,
            _ => true,
        }
    });
    if let Some(i) = differs {
        let pos = def.args.get(i).map_or(d.trim_end().len() + 1, |a| a.pos);
        return Err(refuse(ProbeErrorKind::DiffArgType, pos));
    }
    let same_args = |a: &ProbeDef| {
        a.args
            .iter()
            .zip(&def.args)
            .all(|(x, y)| x.fetch == y.fetch)
    };
    if defs.iter().any(|other| {
        trace_kprobe::check(other).is_ok_and(|o| o.target == def.target && same_args(&o))
    }) {
        return Err(refuse(ProbeErrorKind::SameProbe, 0));
    }
    Ok((def, Some(i)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_parse_as_a_shell_would() {
        match parse("echo 'p:a/b work x=%di' >> /sys/kernel/tracing/kprobe_events").unwrap() {
            Cmd::Write {
                file,
                value,
                append,
            } => {
                assert_eq!(file, "kprobe_events");
                assert_eq!(value, "p:a/b work x=%di");
                assert!(append);
            }
            _ => panic!("not a write"),
        }
        match parse("echo 0>tracing_on").unwrap() {
            Cmd::Write {
                file,
                value,
                append,
            } => {
                assert_eq!(
                    (file.as_str(), value.as_str(), append),
                    ("tracing_on", "0", false)
                );
            }
            _ => panic!("not a write"),
        }
        match parse("echo \"fib* work\" > set_ftrace_filter").unwrap() {
            Cmd::Write { value, .. } => assert_eq!(value, "fib* work"),
            _ => panic!("not a write"),
        }
        // A quoted `>` is part of the value.
        match parse("echo '>' > x").unwrap() {
            Cmd::Write { file, value, .. } => {
                assert_eq!((file.as_str(), value.as_str()), ("x", ">"))
            }
            _ => panic!("not a write"),
        }
        assert!(matches!(parse("cat kprobe_profile"), Ok(Cmd::Cat(f)) if f == "kprobe_profile"));
        assert!(parse("echo 1").is_err());
        assert!(parse("echo 'x > y").is_err());
        assert!(parse("rm kprobe_events").is_err());
    }

    #[test]
    fn event_paths() {
        assert_eq!(event_path("events/enable"), Some((None, None, "enable")));
        assert_eq!(
            event_path("events/kprobes/enable"),
            Some((Some("kprobes"), None, "enable"))
        );
        assert_eq!(
            event_path("events/kprobes/ev/enable"),
            Some((Some("kprobes"), Some("ev"), "enable"))
        );
        assert_eq!(event_path("kprobe_events"), None);
    }
}
