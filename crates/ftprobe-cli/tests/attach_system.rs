//! `ftprobe trace -p PID` on an unmodified system program (issue 13): Python's
//! `http.server`, serving files of a temporary directory to clients of this test, attached
//! twice with int3 kprobes on the C library's `write` and `send`, and detached twice.
//! (`send`: Python's sockets send through the C library's `send`, the `sendto` system call,
//! never `write`; `write` sees only the server's log lines on its standard error.)
//!
//! The truths the trace is checked against are outside ftprobe:
//! - the files served (every response's body must be byte-identical to its file);
//! - the server's own log lines on its standard error (one `write(2, line)` per request:
//!   `BaseHTTPRequestHandler.log_message`), read from its pipe;
//! - the response headers as the client received them (one `sendall` of the whole header
//!   block: `end_headers`), so one `send` of exactly that length;
//! - the server's body copy: `shutil.copyfileobj` in chunks of `shutil.COPY_BUFSIZE` (asked
//!   of the same Python), one `send` each (a blocking TCP socket: `sendall` sends each
//!   chunk in one call unless a signal interrupts it, and no ptrace stop happens during
//!   the requests the exact counts are about);
//! - the server's socket for each of the test's own traced requests, found in
//!   `/proc/net/tcp` (by the client's port) and `/proc/PID/fd` (by the socket's inode)
//!   while the connection is open.
//!
//! (`strace -f -e trace=write,sendto -p` of the same server, run outside this test, shows
//! the same pattern: `write(2, <log line>)`, `sendto(fd, <headers>)`, then one `sendto`
//! per 64 KiB chunk. strace cannot run here at the same time: one tracer per thread.)
//!
//! A second client thread fetches another file in a loop the whole time, across both
//! attaches and detaches: each of its responses must be byte-identical too, and the number
//! of its requests the trace shows must lie between those it made entirely inside the
//! traced window and those that overlapped the attach-to-exit span of `ftprobe trace`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod common;
use common::ftprobe;

use ftprobe_dev::KillOnDrop;

/// The probes: the C library's `write` and `send`, with their descriptor and length.
const PROBES: [&str; 2] = [
    "p:w libc:write fd=%di:s32 n=%dx:u64",
    "p:s libc:send fd=%di:s32 n=%dx:u64",
];

/// The real interpreter behind `python3` (a pyenv shim or the like is a script that execs
/// it: the pid we attach to must be the interpreter's), or `None` when there is none.
fn python() -> Option<String> {
    let o = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .ok()?;
    let exe = String::from_utf8(o.stdout).ok()?.trim().to_owned();
    (o.status.success() && !exe.is_empty()).then_some(exe)
}

/// `shutil.COPY_BUFSIZE` of that Python: the size of the body chunks it sends.
fn copy_bufsize(python: &str) -> usize {
    let o = Command::new(python)
        .args(["-c", "import shutil; print(shutil.COPY_BUFSIZE)"])
        .output()
        .unwrap();
    String::from_utf8(o.stdout).unwrap().trim().parse().unwrap()
}

/// `python3 -u -m http.server 0 --bind 127.0.0.1 --directory DIR`, past its first line.
struct Server {
    child: KillOnDrop,
    port: u16,
    stdout: BufReader<std::process::ChildStdout>,
    /// Every line of its standard error so far.
    log: Arc<Mutex<Vec<String>>>,
    log_reader: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    fn start(python: &str, dir: &std::path::Path) -> Server {
        let mut cmd = Command::new(python);
        cmd.args(["-u", "-m", "http.server", "0", "--bind", "127.0.0.1"])
            .arg("--directory")
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: signal(2) is async-signal-safe; the closure touches nothing else. Python
        // installs its SIGINT handler (KeyboardInterrupt) only if SIGINT is not ignored, as
        // it is when the test runs as a background job of a non-interactive shell.
        unsafe {
            cmd.pre_exec(|| {
                libc::signal(libc::SIGINT, libc::SIG_DFL);
                Ok(())
            });
        }
        let mut child = KillOnDrop::spawn(&mut cmd).expect("start python3 -m http.server");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let err = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let log_w = Arc::clone(&log);
        let log_reader = std::thread::spawn(move || {
            for l in BufReader::new(err).lines() {
                log_w.lock().unwrap().push(l.unwrap());
            }
        });
        // "Serving HTTP on 127.0.0.1 port 43921 (http://127.0.0.1:43921/) ..."
        let mut first = String::new();
        stdout.read_line(&mut first).unwrap();
        let port = first
            .split_once(" port ")
            .and_then(|(_, r)| r.split_whitespace().next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in {first:?}"));
        Server {
            child,
            port,
            stdout,
            log,
            log_reader: Some(log_reader),
        }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn log_lines(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }
}

/// One response: its header block (status line to the blank line, included) and body.
struct Response {
    headers: Vec<u8>,
    body: Vec<u8>,
}

fn read_response(mut s: TcpStream) -> Response {
    let mut all = Vec::new();
    s.read_to_end(&mut all).unwrap();
    let end = all
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a header block")
        + 4;
    let body = all.split_off(end);
    assert!(
        all.starts_with(b"HTTP/1.0 200 OK\r\n"),
        "{}",
        String::from_utf8_lossy(&all)
    );
    Response { headers: all, body }
}

fn request(s: &mut TcpStream, path: &str) {
    s.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes())
        .unwrap();
}

/// `GET path` (HTTP/1.0: the server closes the connection after the response).
fn get(port: u16, path: &str) -> Response {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    request(&mut s, path);
    read_response(s)
}

/// The inode of the TCP socket of this network namespace whose local port is `local` and
/// remote port `remote` (`remote` 0: a listening socket), once it has one (a connection in
/// the accept queue has none yet).
fn tcp_inode(local: u16, remote: u16) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let port = |a: &str| u16::from_str_radix(a.rsplit_once(':').unwrap().1, 16).unwrap();
    text.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let inode: u64 = f[9].parse().unwrap();
        (port(f[1]) == local && port(f[2]) == remote && inode != 0).then_some(inode)
    })
}

/// The descriptor of `pid` open on the socket `inode`.
fn fd_of_socket(pid: i32, inode: u64) -> Option<i32> {
    let want = format!("socket:[{inode}]");
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .find(|e| std::fs::read_link(e.path()).is_ok_and(|t| t.to_str() == Some(&*want)))
        .and_then(|e| e.file_name().to_str()?.parse().ok())
}

/// `GET path`, and the server's descriptor for this connection (found while it is open,
/// before the request is sent: the server's thread for it waits for the request line).
fn get_with_server_fd(server: &Server, path: &str) -> (Response, i32) {
    let mut s = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    let mine = s.local_addr().unwrap().port();
    let mut fd = None;
    // Accepted by the server's main thread soon; not a timing expectation: a bound against
    // a hang.
    for _ in 0..10_000 {
        fd = tcp_inode(server.port, mine).and_then(|i| fd_of_socket(server.pid(), i));
        if fd.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let fd = fd.expect("the server's socket of our connection");
    request(&mut s, path);
    (read_response(s), fd)
}

/// The bytes of every executable file mapping of `pid` (but the agent's): (start, path,
/// bytes).
fn code_bytes(pid: i32) -> Vec<(u64, String, Vec<u8>)> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let mut out = Vec::new();
    for l in maps.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() < 6 || !f[1].contains('x') || !f[5].starts_with('/') {
            continue;
        }
        if f[5].ends_with("/libftprobe_agent.so") {
            continue;
        }
        let (s, e) = f[0].split_once('-').unwrap();
        let (s, e) = (
            u64::from_str_radix(s, 16).unwrap(),
            u64::from_str_radix(e, 16).unwrap(),
        );
        out.push((s, f[5].to_owned(), read_mem(pid, s, (e - s) as usize)));
    }
    out
}

fn read_mem(pid: i32, addr: u64, len: usize) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut buf = vec![0u8; len];
    mem.read_exact_at(&mut buf, addr).unwrap();
    buf
}

/// The same address ranges read again (whatever the mappings' permissions and splits have
/// become): every byte as before.
fn assert_code_unchanged(pid: i32, before: &[(u64, String, Vec<u8>)], when: &str) {
    for (start, path, b) in before {
        let a = read_mem(pid, *start, b.len());
        if let Some(i) = (0..b.len()).find(|&i| b[i] != a[i]) {
            panic!(
                "{when}: {path} at {:#x} changed: {:02x?} -> {:02x?}",
                start + i as u64,
                &b[i..(i + 8).min(b.len())],
                &a[i..(i + 8).min(b.len())]
            );
        }
    }
}

/// The addresses of the probed functions in the target (from the trace's `kprobes/list`).
fn probed_addresses(text: &str) -> Vec<u64> {
    text.lines()
        .skip_while(|l| !l.starts_with("# kprobes/list:"))
        .skip(1)
        .take_while(|l| l.starts_with("#   "))
        .filter_map(|l| {
            u64::from_str_radix(l.trim_start_matches('#').split_whitespace().next()?, 16).ok()
        })
        .collect()
}

fn tracer_pids(pid: i32) -> Vec<i32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .filter_map(|t| {
            let s = std::fs::read_to_string(t.path().join("status")).ok()?;
            s.lines()
                .find_map(|l| l.strip_prefix("TracerPid:"))?
                .trim()
                .parse()
                .ok()
        })
        .collect()
}

fn agent_loads(pid: i32) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap()
        .lines()
        .filter(|l| {
            l.ends_with("/libftprobe_agent.so") && l.split_whitespace().nth(2) == Some("00000000")
        })
        .count()
}

/// One kprobe event line: (event name, fd, n).
fn parse_event(line: &str) -> Option<(char, i32, u64)> {
    let (_, rest) = line.split_once("]  ")?;
    let (_, rest) = rest.split_once(": ")?;
    let name = rest.chars().next()?;
    let fd = rest
        .split_once(" fd=")?
        .1
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let n = rest
        .split_once(" n=")?
        .1
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some((name, fd, n))
}

/// The background client's requests: when each began and ended.
type Spans = Arc<Mutex<Vec<(Instant, Instant)>>>;

/// One traced window: when `trace -p` was started, when it said it was tracing, when it
/// was sent SIGINT, when it exited; its stderr and trace.
struct Window {
    started: Instant,
    tracing: Instant,
    interrupted: Instant,
    exited: Instant,
    stderr: String,
    text: String,
}

/// `ftprobe trace -p PID -e PROBES -o FILE`; `during` runs once it says it is tracing, then
/// SIGINT.
fn trace_window(pid: i32, out_dir: &std::path::Path, during: impl FnOnce()) -> Window {
    let out_file = out_dir.join("trace.txt");
    let started = Instant::now();
    let mut cli = KillOnDrop::spawn(
        ftprobe()
            .args(["trace", "-p", &pid.to_string()])
            .args(PROBES.iter().flat_map(|p| ["-e", p]))
            .arg("-o")
            .arg(&out_file)
            .stderr(Stdio::piped()),
    )
    .unwrap();
    let mut err = BufReader::new(cli.stderr.take().unwrap());
    let mut stderr = String::new();
    let mut tracing = None;
    let mut interrupted = None;
    if common::wait_until_tracing(&mut err, &mut stderr) {
        tracing = Some(Instant::now());
        during();
        interrupted = Some(Instant::now());
        common::interrupt(&cli);
    }
    err.read_to_string(&mut stderr).unwrap();
    let status = cli.wait().unwrap();
    let exited = Instant::now();
    assert!(status.success(), "{status}: {stderr}");
    let text = std::fs::read_to_string(&out_file).unwrap();
    std::fs::remove_file(&out_file).unwrap();
    Window {
        started,
        tracing: tracing.unwrap_or_else(|| panic!("never traced: {stderr}")),
        interrupted: interrupted.unwrap(),
        exited,
        stderr,
        text,
    }
}

#[test]
fn python_http_server_is_traced_twice_and_left_as_it_was() {
    let Some(python) = python() else {
        eprintln!("skipped: no python3 (the test attaches to `python3 -m http.server`)");
        return;
    };
    let chunk = copy_bufsize(&python);
    let dir = common::tmp_dir("http-server");
    let files = dir.join("files");
    std::fs::create_dir(&files).unwrap();
    // Contents no two positions of which are alike for long (a byte pattern of a simple
    // generator): a misplaced chunk shows.
    let pattern = |len: usize, seed: u64| -> Vec<u8> {
        let mut x = seed;
        (0..len)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (x >> 56) as u8
            })
            .collect()
    };
    // The big file: three whole chunks and a tail of a length no other send has.
    const TAIL: usize = 4321;
    let big = pattern(3 * chunk + TAIL, 1);
    let small = pattern(1000, 2);
    std::fs::write(files.join("big.bin"), &big).unwrap();
    std::fs::write(files.join("small.txt"), &small).unwrap();

    let mut server = Server::start(&python, &files);
    let pid = server.pid();
    let port = server.port;

    // Before anything is attached: the responses, and the header lengths to expect.
    let r = get(port, "/big.bin");
    assert!(r.body == big);
    let big_headers = r.headers.len() as u64;
    let r = get(port, "/small.txt");
    assert!(r.body == small);
    let small_headers = r.headers.len() as u64;
    let distinct = [big_headers, small_headers, chunk as u64, TAIL as u64, 1000];
    for (i, a) in distinct.iter().enumerate() {
        assert!(
            !distinct[i + 1..].contains(a),
            "the test needs distinct send lengths: {distinct:?}"
        );
    }

    // The background client: from now until the end.
    let stop = Arc::new(AtomicBool::new(false));
    let spans: Spans = Arc::new(Mutex::new(Vec::new()));
    let client = {
        let (stop, spans, small) = (Arc::clone(&stop), Arc::clone(&spans), small.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let t0 = Instant::now();
                let r = get(port, "/small.txt");
                let t1 = Instant::now();
                assert!(
                    r.body == small,
                    "a response of the background client differs"
                );
                assert_eq!(r.headers.len() as u64, small_headers);
                spans.lock().unwrap().push((t0, t1));
            }
        })
    };
    // A few of its requests before the first attach.
    while spans.lock().unwrap().len() < 20 {
        std::thread::sleep(Duration::from_millis(1));
    }

    // Every code byte of the program (python3, libpython, libc, the loader, extension
    // modules) before the first attach.
    let before = code_bytes(pid);
    let mut log_lines_seen = 0;
    for round in 0..2 {
        // The test's own requests in the window: sequential, each one's server descriptor
        // found while its connection was open.
        const M: usize = 5;
        let mut fds = Vec::new();
        let w = trace_window(pid, &dir, || {
            for _ in 0..M {
                let (r, fd) = get_with_server_fd(&server, "/big.bin");
                assert!(r.body == big, "round {round}: a traced response differs");
                assert_eq!(r.headers.len() as u64, big_headers);
                fds.push(fd);
            }
        });
        let events: Vec<(char, i32, u64)> = common::events(&w.text)
            .map(|l| parse_event(l).unwrap_or_else(|| panic!("round {round}: {l:?}")))
            .collect();
        assert!(
            w.text.contains("# lost events: 0\n"),
            "round {round}: {}",
            w.text
        );

        // The sends of the test's requests, in order: headers, whole chunks, the tail, each
        // on the server's socket of that request.
        let expected: Vec<(char, i32, u64)> = fds
            .iter()
            .flat_map(|&fd| {
                [big_headers]
                    .into_iter()
                    .chain([chunk as u64; 3])
                    .chain([TAIL as u64])
                    .map(move |n| ('s', fd, n))
            })
            .collect();
        let big_sends: Vec<(char, i32, u64)> = events
            .iter()
            .copied()
            .filter(|&(e, _, n)| {
                e == 's' && (n == big_headers || n == chunk as u64 || n == TAIL as u64)
            })
            .collect();
        assert_eq!(big_sends, expected, "round {round}: {}", w.stderr);

        // The server's log lines: one write(2) each, of the line's length.
        let log = server.log_lines();
        let new_log = &log[log_lines_seen..];
        log_lines_seen = log.len();
        let len_of = |path: &str| -> u64 {
            let l = new_log
                .iter()
                .find(|l| l.contains(&format!("\"GET {path} HTTP/1.0\" 200 -")))
                .unwrap_or_else(|| panic!("no log line for {path}: {new_log:?}"));
            l.len() as u64 + 1
        };
        let (big_line, small_line) = (len_of("/big.bin"), len_of("/small.txt"));
        assert_ne!(big_line, small_line);
        let big_writes = events
            .iter()
            .filter(|&&(e, fd, n)| e == 'w' && fd == 2 && n == big_line)
            .count();
        assert_eq!(big_writes, M, "round {round}");

        // The background client's requests: between those made entirely while traced and
        // those that overlapped `trace -p` at all.
        let (inside, overlapping) = {
            let spans = spans.lock().unwrap();
            (
                spans
                    .iter()
                    .filter(|(t0, t1)| *t0 > w.tracing && *t1 < w.interrupted)
                    .count(),
                spans
                    .iter()
                    .filter(|(t0, t1)| *t1 > w.started && *t0 < w.exited)
                    .count(),
            )
        };
        let count =
            |want: &dyn Fn(&(char, i32, u64)) -> bool| events.iter().filter(|e| want(e)).count();
        let small_bodies = count(&|&(e, _, n)| e == 's' && n == 1000);
        let small_hdrs = count(&|&(e, _, n)| e == 's' && n == small_headers);
        let small_writes = count(&|&(e, fd, n)| e == 'w' && fd == 2 && n == small_line);
        for (what, c) in [
            ("bodies", small_bodies),
            ("headers", small_hdrs),
            ("log writes", small_writes),
        ] {
            assert!(
                inside <= c && c <= overlapping,
                "round {round}: background {what} traced {c}, made {inside} inside the window, \
                 {overlapping} overlapping it"
            );
        }
        // Nothing else: every event is one of those.
        let listener = tcp_inode(port, 0)
            .and_then(|i| fd_of_socket(pid, i))
            .unwrap();
        for &(e, fd, n) in &events {
            match e {
                's' => {
                    assert!(fd > 2 && fd != listener, "round {round}: send on fd {fd}");
                    assert!(
                        [big_headers, chunk as u64, TAIL as u64, small_headers, 1000].contains(&n),
                        "round {round}: a send of {n}"
                    );
                }
                'w' => assert!(
                    fd == 2 && (n == big_line || n == small_line),
                    "round {round}: write({fd}, {n})"
                ),
                _ => panic!("round {round}: event {e}"),
            }
        }
        eprintln!(
            "round {round}: {} events, background requests traced {small_bodies} (made {inside} \
             inside the window, {overlapping} overlapping it)",
            events.len()
        );

        // Detached: nobody traces it, the agent is loaded once, and every code byte is as
        // before the first attach (the probed functions' first bytes among them).
        assert!(tracer_pids(pid).iter().all(|&p| p == 0), "round {round}");
        assert_eq!(agent_loads(pid), 1, "round {round}");
        let probed = probed_addresses(&w.text);
        assert_eq!(probed.len(), 2, "{}", w.text);
        for a in &probed {
            assert!(
                before
                    .iter()
                    .any(|(s, _, b)| *s <= *a && *a < s + b.len() as u64),
                "probed address {a:#x} is in the code read before"
            );
        }
        assert_code_unchanged(pid, &before, &format!("after detach {round}"));

        // Untraced again: the same responses.
        for _ in 0..3 {
            assert!(get(port, "/big.bin").body == big);
        }
    }

    // The server runs on; stop it as its user would (Ctrl-C): it says so and exits 0.
    stop.store(true, Ordering::Relaxed);
    client.join().expect("the background client");
    let requests_made = 2 + 2 * (5 + 3) + spans.lock().unwrap().len();
    // SAFETY: kill has no memory effects; the pid is our live child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    let mut rest = String::new();
    server.stdout.read_to_string(&mut rest).unwrap();
    let status = server.child.wait().unwrap();
    server.log_reader.take().unwrap().join().unwrap();
    assert!(
        rest.contains("Keyboard interrupt received, exiting."),
        "{rest:?}"
    );
    assert_eq!(status.code(), Some(0), "{status}");
    // Its log: every request once, all answered 200, nothing else but its last words.
    let log = server.log_lines();
    let answered = log
        .iter()
        .filter(|l| l.ends_with("HTTP/1.0\" 200 -"))
        .count();
    assert_eq!(answered, requests_made, "{log:?}");
    assert!(
        log.iter()
            .all(|l| l.ends_with("HTTP/1.0\" 200 -") || l.is_empty()),
        "{log:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
