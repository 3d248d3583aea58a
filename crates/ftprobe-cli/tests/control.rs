//! The live control channel (`ftprobe trace --control`, `ftprobe ctl`, the Rust API
//! `ftprobe::control::client`): probes and filters changed while the program's threads run.
//!
//! Truth: the fixture's threads count their own calls in a shared file (each call gets its
//! sequence number as an argument), and the test reads those counters just before and just
//! after each change. A call that started after an enable's reply and ended before the next
//! disable was sent must be in the trace, exactly once; no call made before an enable was
//! sent or after a disable's reply may be.

#![allow(clippy::needless_range_loop)] // per-thread arrays indexed by thread number

mod common;

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use ftprobe::control::client::Session;

const THREADS: usize = 8;

/// 8 threads call `probed_a(t, seq)`, `probed_b(t, seq)` and `probed_c(t)` in a loop, then
/// publish `seq + 1` in the shared file (a page: stop flag, then per thread its tid and
/// its count). `probed_b`'s probe is an int3 one (inside the function), `probed_a`'s runs
/// on its ftrace site; the function tracer's filter moves between `probed_c` and
/// `probed_never` (never called).
const FIXTURE: &str = r#"
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/syscall.h>

struct shared { _Atomic long stop; _Atomic long ready; struct { _Atomic long tid; _Atomic long count; } t[8]; };
static struct shared *sh;
volatile long sink;

__attribute__((noinline)) void probed_a(long t, long seq) { sink += t + seq; }
__attribute__((noinline)) void probed_b(long t, long seq) { sink ^= t * seq; sink += 1; }
__attribute__((noinline)) void probed_c(long t) { sink += t; }
__attribute__((noinline)) void probed_d(long t) { sink -= t; }
__attribute__((noinline)) void probed_never(long t) { sink -= 2 * t; }

static void *worker(void *arg) {
    long t = (long)arg;
    atomic_store(&sh->t[t].tid, syscall(SYS_gettid));
    atomic_fetch_add(&sh->ready, 1);
    long seq = 0;
    while (!atomic_load_explicit(&sh->stop, memory_order_acquire)) {
        probed_a(t, seq);
        probed_b(t, seq);
        probed_c(t);
        probed_d(t);
        seq++;
        atomic_store_explicit(&sh->t[t].count, seq, memory_order_release);
        /* Tight, but not so tight that 10 000 changes make gigabytes of trace. */
        for (volatile int i = 0; i < 20000; i++) ;
    }
    return 0;
}

int main(int argc, char **argv) {
    int fd = open(argv[1], O_RDWR);
    sh = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (sh == MAP_FAILED) return 3;
    pthread_t th[8];
    for (long t = 0; t < 8; t++) pthread_create(&th[t], 0, worker, (void *)t);
    long total = 0;
    for (int t = 0; t < 8; t++) { pthread_join(th[t], 0); total += atomic_load(&sh->t[t].count); }
    printf("calls %ld\n", total);
    return 0;
}
"#;

/// The fixture's shared page, as the test maps it.
struct Shared {
    base: *mut i64,
}

/// A test that fails stops its program too (else it ran on, traced, its trace file growing
/// by gigabytes: found by a fresh user's run, issue 31).
impl Drop for Shared {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Shared {
    fn open(path: &Path) -> Shared {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap();
        // SAFETY: a shared mapping of the 4096-byte file, kept for the test's life.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&f),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        Shared { base: p.cast() }
    }
    fn word(&self, i: usize) -> &std::sync::atomic::AtomicI64 {
        // SAFETY: i < 512 words of the mapping; the fixture uses them atomically too.
        unsafe { &*(self.base.add(i) as *const std::sync::atomic::AtomicI64) }
    }
    fn stop(&self) {
        self.word(0).store(1, std::sync::atomic::Ordering::Release);
    }
    fn ready(&self) -> i64 {
        self.word(1).load(std::sync::atomic::Ordering::Acquire)
    }
    fn tid(&self, t: usize) -> i64 {
        self.word(2 + 2 * t)
            .load(std::sync::atomic::Ordering::Acquire)
    }
    fn counts(&self) -> [i64; THREADS] {
        std::array::from_fn(|t| {
            self.word(3 + 2 * t)
                .load(std::sync::atomic::Ordering::Acquire)
        })
    }
}

/// Build fixture `source` as `file` (gcc, `-pg -mfentry`), and make a fresh directory for
/// the test (`what`) holding the fixture's shared page, mapped.
fn setup(
    file: &str,
    source: &str,
    what: &str,
) -> (
    std::path::PathBuf,
    std::path::PathBuf,
    std::path::PathBuf,
    Shared,
) {
    let Some(exe) =
        common::build_at_test_time("cc", file, source, &["-O1", "-pg", "-mfentry", "-pthread"])
    else {
        panic!("cc could not build the fixture");
    };
    let dir = common::tmp_dir(what);
    let shm = dir.join("shared");
    std::fs::write(&shm, vec![0u8; 4096]).unwrap();
    let shared = Shared::open(&shm);
    (exe, dir, shm, shared)
}

/// A window of an event or filter: the counters before the enable was sent, after its
/// reply, before the disable was sent, after its reply.
#[derive(Clone, Copy)]
struct Window {
    sent_on: [i64; THREADS],
    on: [i64; THREADS],
    off: [i64; THREADS],
    done_off: [i64; THREADS],
}

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// 1 000 changes: the quick tier's run.
#[test]
fn a_thousand_changes_while_eight_threads_run() {
    changes_while_eight_threads_run(1_000);
}

/// 10 000 changes (~100 s here): the stress tier's run (`cargo test -- --ignored`).
#[test]
#[ignore = "stress tier: .ci/run runs it with --ignored"]
fn ten_thousand_changes_while_eight_threads_run() {
    changes_while_eight_threads_run(10_000);
}

fn changes_while_eight_threads_run(total: u32) {
    let (exe, dir, shm, shared) = setup("ctl_stress.c", FIXTURE, "control");
    let out = dir.join("trace.txt");
    let mut cli = common::ftprobe()
        .args(["trace", "--control", "-F", "probed_c", "-o"])
        .arg(&out)
        .args(["-e", "p:a probed_a t=%di:u32 s=%si:s64", "--"])
        .arg(&exe)
        .arg(&shm)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while shared.ready() < THREADS as i64 {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the fixture did not start"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let pid = pgrep_child(cli.id());
    let mut s = Session::connect(pid).expect("connect to the session");
    let mut send = |cmd: &str| {
        let r = s.send(cmd).expect("send");
        assert!(r.ok, "{cmd}: {}", r.text);
        r.text
    };
    // Event b is added live, on an instruction inside probed_b (an int3 probe), disabled.
    send("echo 'p:b probed_b+5 t=%di:u32 s=%si:s64' >> kprobe_events");
    // Event a was enabled at start: its first window opens before the threads ran.
    let zero = [0i64; THREADS];
    let mut open: HashMap<&str, ([i64; THREADS], [i64; THREADS])> = HashMap::new();
    open.insert("a", (zero, zero));
    open.insert("c", (zero, zero));
    let mut windows: HashMap<&str, Vec<Window>> = HashMap::new();
    let mut seed: u64 = std::env::var("FTPROBE_CONTROL_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x9e37_79b9_7f4a_7c15);
    eprintln!("seed {seed}");
    let names = ["a", "b", "c"];
    let mut changes = 0;
    while changes < total {
        let which = names[(xorshift(&mut seed) % 3) as usize];
        let before = shared.counts();
        let turning_on = !open.contains_key(which);
        let cmd = match (which, turning_on) {
            ("c", true) => "echo probed_c > set_ftrace_filter".to_owned(),
            // The filter moves to a function never called: probed_c is not traced.
            ("c", false) => "echo probed_never > set_ftrace_filter".to_owned(),
            (e, on) => format!("echo {} > events/kprobes/{e}/enable", u8::from(on)),
        };
        send(&cmd);
        let after = shared.counts();
        if turning_on {
            open.insert(which, (before, after));
        } else {
            let (sent_on, on) = open.remove(which).unwrap();
            windows.entry(which).or_default().push(Window {
                sent_on,
                on,
                off: before,
                done_off: after,
            });
        }
        changes += 1;
    }
    let profile = send("cat kprobe_profile");
    assert!(
        profile.contains(" a ") || profile.contains("  a"),
        "{profile}"
    );
    let end = [i64::MAX; THREADS];
    shared.stop();
    let final_counts = {
        let status = cli.wait().unwrap();
        let mut err = String::new();
        cli.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        assert!(status.success(), "ftprobe: {status}: {err}");
        shared.counts()
    };
    // Windows still open at the end run to the end.
    for (name, (sent_on, on)) in open {
        windows.entry(name).or_default().push(Window {
            sent_on,
            on,
            off: final_counts,
            done_off: end,
        });
    }
    let text = std::fs::read_to_string(&out).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        text.contains("# lost events: 0"),
        "events were lost: {}",
        tail(&text)
    );
    let tids: HashMap<i64, usize> = (0..THREADS).map(|t| (shared.tid(t), t)).collect();
    // Per event and thread: the sequence numbers recorded; per thread: probed_c's lines.
    let mut seqs: HashMap<(&str, usize), Vec<i64>> = HashMap::new();
    let mut c_lines = [0i64; THREADS];
    for line in common::events(&text) {
        let Some((task, rest)) = line.trim_start().split_once(' ') else {
            continue;
        };
        let tid: i64 = task.rsplit('-').next().unwrap().parse().unwrap();
        let Some(&t) = tids.get(&tid) else { continue };
        let body = rest.split_once(": ").map_or("", |(_, b)| b);
        for name in ["a", "b"] {
            if let Some(args) = body.strip_prefix(&format!("{name}: ")) {
                let field = |k: &str| -> i64 {
                    args.split_whitespace()
                        .find_map(|w| w.strip_prefix(k))
                        .unwrap_or_else(|| panic!("{line}"))
                        .parse()
                        .unwrap()
                };
                assert_eq!(field("t=") as usize, t, "{line}");
                seqs.entry((name, t)).or_default().push(field("s="));
            }
        }
        if body.contains(" <-") {
            assert!(body.starts_with("probed_c <-"), "not in the filter: {line}");
            c_lines[t] += 1;
        }
    }
    for name in ["a", "b"] {
        let ws = &windows[name];
        for t in 0..THREADS {
            let mut got = seqs.remove(&(name, t)).unwrap_or_default();
            let n = got.len();
            got.sort_unstable();
            got.dedup();
            assert_eq!(
                got.len(),
                n,
                "event {name}, thread {t}: a call recorded twice"
            );
            // Every call surely inside a window is there...
            let mut must = 0;
            for w in ws {
                for seq in (w.on[t] + 1)..w.off[t].min(final_counts[t]) {
                    must += 1;
                    assert!(
                        got.binary_search(&seq).is_ok(),
                        "event {name}, thread {t}: call {seq} made while enabled is missing"
                    );
                }
            }
            // ... and none outside every window.
            for seq in &got {
                assert!(
                    ws.iter()
                        .any(|w| *seq >= w.sent_on[t] && *seq <= w.done_off[t]),
                    "event {name}, thread {t}: call {seq} recorded while disabled (windows \
                     near it: {:?})",
                    ws.iter()
                        .filter(
                            |w| (w.sent_on[t] - seq).abs() < 50 || (w.done_off[t] - seq).abs() < 50
                        )
                        .map(|w| (w.sent_on[t], w.on[t], w.off[t], w.done_off[t]))
                        .collect::<Vec<_>>()
                );
            }
            assert!(
                must > 0 || ws.is_empty(),
                "event {name}: no call inside a window"
            );
        }
    }
    // The function tracer: probed_c's lines between the calls surely in and those possibly in.
    for t in 0..THREADS {
        let (mut lo, mut hi) = (0, 0);
        for w in &windows["c"] {
            lo += (w.off[t].min(final_counts[t]) - (w.on[t] + 1)).max(0);
            hi += w.done_off[t].min(final_counts[t]) + 1 - w.sent_on[t];
        }
        assert!(
            (lo..=hi).contains(&c_lines[t]),
            "thread {t}: {} probed_c lines, expected {lo}..={hi}",
            c_lines[t]
        );
    }
}

fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// The pid of the program `ftprobe` (pid `cli`) runs.
fn pgrep_child(cli: u32) -> u32 {
    let start = Instant::now();
    loop {
        let children =
            std::fs::read_to_string(format!("/proc/{cli}/task/{cli}/children")).unwrap_or_default();
        if let Some(p) = children.split_whitespace().next() {
            return p.parse().unwrap();
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no child of ftprobe"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `ftprobe ctl` from the command line, and `--interactive`: the same commands, their
/// errors in the kernel's words, and the program's output unchanged.
#[test]
fn ctl_and_interactive_commands() {
    let (exe, dir, shm, shared) = setup("ctl_cmds.c", FIXTURE, "control-ctl");
    let out = dir.join("trace.txt");
    let mut cli = common::ftprobe()
        .args([
            "trace",
            "--interactive",
            "-e",
            "p:a probed_a t=%di:u32",
            "-o",
        ])
        .arg(&out)
        .arg("--")
        .arg(&exe)
        .arg(&shm)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    while shared.ready() < THREADS as i64 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let pid = pgrep_child(cli.id());
    let ctl = |args: &[&str]| {
        let o = common::ftprobe()
            .arg("ctl")
            .arg(pid.to_string())
            .args(args)
            .output()
            .unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (code, o, _) = ctl(&["cat kprobe_events"]);
    assert_eq!((code, o.as_str()), (Some(0), "p:a probed_a t=%di:u32\n"));
    // The program runs an extra thread of the agent's, named so (it names itself before it
    // serves a command: read after the first answer, issue 31: read before, it could still
    // bear the program's name).
    let comms: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .map(|e| {
            std::fs::read_to_string(e.unwrap().path().join("comm"))
                .unwrap()
                .trim()
                .to_owned()
        })
        .collect();
    assert!(comms.iter().any(|c| c == "ftprobe-ctl"), "{comms:?}");
    assert_eq!(comms.len(), THREADS + 2, "{comms:?}");

    // A bad definition: the kernel's error_log text, exit 1.
    let (code, _, e) = ctl(&["echo 'p:x no_such_function' >> kprobe_events"]);
    assert_eq!(code, Some(1));
    assert!(
        e.contains("Failed to register probe event")
            || e.contains("BAD_PROBE_ADDR")
            || e.contains("Invalid probed address"),
        "{e}"
    );
    assert!(e.contains("Command: p:x no_such_function"), "{e}");
    let (_, log, _) = ctl(&["cat error_log"]);
    assert!(log.contains("no_such_function"), "{log}");
    // Removing an enabled event: EBUSY, as the kernel.
    let (code, _, e) = ctl(&["echo '-:a' >> kprobe_events"]);
    assert_eq!(code, Some(1));
    assert!(e.contains("EBUSY"), "{e}");
    // A filter glob that matches nothing: EINVAL, nothing changed.
    let (code, _, e) = ctl(&["echo 'zzz_nothing*' > set_ftrace_filter"]);
    assert_eq!(code, Some(1));
    assert!(e.contains("EINVAL"), "{e}");
    let (code, o, _) = ctl(&["cat kprobes/list"]);
    assert_eq!(code, Some(0));
    assert!(o.contains("probed_a+0x0") && o.contains("[FTRACE]"), "{o}");
    // Disable a, remove it, add it back: its list line goes and comes.
    let (code, _, e) = ctl(&[
        "echo 0 > events/kprobes/a/enable",
        "echo '-:a' >> kprobe_events",
    ]);
    assert_eq!(code, Some(0), "{e}");
    let (_, o, _) = ctl(&["cat kprobes/list"]);
    assert!(!o.contains("probed_a"), "{o}");
    // A multi-probe event added live: enabling it enables every probe (the kernel's
    // enable_trace_kprobe walks them all).
    let (code, _, e) = ctl(&[
        "echo 'p:m2 probed_c t=%di:u32' >> kprobe_events",
        "echo 'p:m2 probed_d t=%di:u32' >> kprobe_events",
        "echo 1 > events/kprobes/m2/enable",
    ]);
    assert_eq!(code, Some(0), "{e}");
    let (_, o, _) = ctl(&["cat kprobes/list"]);
    for f in ["probed_c+0x0", "probed_d+0x0"] {
        let line = o
            .lines()
            .find(|l| l.contains(f))
            .unwrap_or_else(|| panic!("{o}"));
        assert!(!line.contains("DISABLED"), "{o}");
    }
    let (code, _, _) = ctl(&["echo 0 > events/kprobes/m2/enable"]);
    assert_eq!(code, Some(0));
    // An empty command gets an error (not a wait), no session exits 2.
    let (code, _, e) = ctl(&[""]);
    assert_eq!(code, Some(1), "{e}");
    assert!(e.contains("empty command"), "{e}");
    let o = common::ftprobe()
        .args(["ctl", "999999", "cat tracing_on"])
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // From standard input (--interactive): replies on ftprobe's standard error.
    {
        use std::io::Write;
        let mut stdin = cli.stdin.take().unwrap();
        writeln!(stdin, "echo 'p:a2 probed_a t=%di:u32' >> kprobe_events").unwrap();
        writeln!(stdin, "echo 1 > events/kprobes/a2/enable").unwrap();
        writeln!(stdin, "cat events/kprobes/a2/enable").unwrap();
        drop(stdin);
    }
    let start = Instant::now();
    loop {
        let (_, o, _) = ctl(&["cat events/kprobes/a2/enable"]);
        if o == "1\n" {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "--interactive did not enable a2"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let before = shared.counts();
    std::thread::sleep(Duration::from_millis(200));
    let after = shared.counts();
    let (_, o, _) = ctl(&["echo 0 > tracing_on", "cat tracing_on"]);
    assert_eq!(o, "0\n");
    shared.stop();
    let status = cli.wait().unwrap();
    let mut err = String::new();
    cli.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(status.success(), "{err}");
    let mut stdout = String::new();
    cli.stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    let text = std::fs::read_to_string(&out).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    // The refused `p:x` never was an event: not in the final profile (issue 26, item 11:
    // it was, as `x 0 0`); the events that were, are.
    let profile: Vec<&str> = text
        .lines()
        .skip_while(|l| *l != "# kprobe_profile:")
        .skip(1)
        .take_while(|l| l.starts_with("#   "))
        .map(|l| l.split_whitespace().nth(1).unwrap())
        .collect();
    assert!(!profile.contains(&"x"), "{profile:?}");
    assert!(profile.contains(&"a2"), "{profile:?}");
    // a2's records: at least every call surely between its enable and tracing_on 0.
    let a2 = common::events(&text)
        .filter(|l| l.contains(" a2: "))
        .count() as i64;
    let surely: i64 = (0..THREADS)
        .map(|t| (after[t] - before[t] - 2).max(0))
        .sum();
    assert!(
        a2 >= surely && surely > 0,
        "a2: {a2} records, at least {surely} expected"
    );
    // Both of m2's probes wrote while it was enabled.
    for f in ["(probed_c+", "(probed_d+"] {
        assert!(
            common::events(&text).any(|l| l.contains(" m2: ") && l.contains(f)),
            "no m2 record at {f}"
        );
    }
    // The socket is gone with the session.
    assert!(!ftprobe::control::client::socket_path(pid).unwrap().exists());
}

/// A program with its own `malloc` family that counts the calls made by threads it did not
/// create (the agent's control thread would be one), and a worker calling `work` and
/// `malloc` until told to stop.
const GUEST_FIXTURE: &str = r#"
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <sys/prctl.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
static _Atomic long own_tids[4];
static _Atomic long foreign;
static _Atomic long mallocs;
static char foreign_comm[17];
static _Atomic int counting;
static void note(void) {
    if (!atomic_load(&counting)) return; /* the C library's start-up, before main */
    long tid = syscall(SYS_gettid);
    atomic_fetch_add(&mallocs, 1);
    for (int i = 0; i < 4; i++) if (atomic_load(&own_tids[i]) == tid) return;
    if (atomic_fetch_add(&foreign, 1) == 0) prctl(PR_GET_NAME, foreign_comm);
}
void *malloc(size_t n) { note(); return __libc_malloc(n); }
void *calloc(size_t a, size_t b) { note(); return __libc_calloc(a, b); }
void *realloc(void *p, size_t n) { note(); return __libc_realloc(p, n); }
void free(void *p) { if (p) note(); __libc_free(p); }

struct shared { _Atomic long stop; _Atomic long ready; _Atomic long count; };
static struct shared *sh;
volatile long sink;
char *volatile keep;
__attribute__((noinline)) long work(long i) { sink += i; return sink; }
__attribute__((noinline)) long helper(long i) { sink ^= i; return i * 2; }

static void *worker(void *arg) {
    atomic_store(&own_tids[1], syscall(SYS_gettid));
    atomic_store(&sh->ready, 1);
    long i = 0;
    while (!atomic_load(&sh->stop)) {
        char *p = malloc(32);
        memset(p, 1, 32);
        keep = p;
        work(i);
        helper(i);
        free(p);
        atomic_store(&sh->count, ++i);
        usleep(100);
    }
    return 0;
}

int main(int argc, char **argv) {
    atomic_store(&own_tids[0], syscall(SYS_gettid));
    atomic_store(&counting, 1);
    free(malloc(1));
    int fd = open(argv[1], O_RDWR);
    sh = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    pthread_t th;
    pthread_create(&th, 0, worker, 0);
    pthread_join(th, 0);
    printf("foreign %ld of %ld%s%s\n", atomic_load(&foreign), atomic_load(&mallocs),
           foreign_comm[0] ? " first by " : "", foreign_comm);
    return 0;
}
"#;

/// The agent's control thread is a guest: through additions, removals, enables, filter
/// changes and tracer switches, it never calls the program's allocator.
#[test]
fn the_control_thread_never_calls_the_programs_malloc() {
    let (exe, dir, shm, shared) = setup("ctl_guest.c", GUEST_FIXTURE, "control-guest");
    let out = dir.join("trace.txt");
    let cli = common::ftprobe()
        .args(["trace", "--control", "-F", "work", "-o"])
        .arg(&out)
        .arg("--")
        .arg(&exe)
        .arg(&shm)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    while shared.ready() == 0 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let pid = pgrep_child(cli.id());
    let mut s = Session::connect(pid).unwrap();
    let count = || shared.word(2).load(std::sync::atomic::Ordering::Acquire);
    for round in 0..20 {
        for cmd in [
            "echo 'p:h helper i=%di:s64' >> kprobe_events".to_owned(),
            "echo 'p:m libc:malloc n=%di:u64' >> kprobe_events".to_owned(),
            "echo 'r:wr work ret=$retval:s64' >> kprobe_events".to_owned(),
            "echo 1 > events/kprobes/enable".to_owned(),
            "cat kprobes/list".to_owned(),
            format!("echo 'helper work' > set_ftrace_filter{}", ""),
            "echo nop > current_tracer".to_owned(),
            "echo function > current_tracer".to_owned(),
            "cat kprobe_profile".to_owned(),
            "echo 0 > events/kprobes/enable".to_owned(),
            "echo > kprobe_events".to_owned(),
            "echo work > set_ftrace_filter".to_owned(),
        ] {
            let r = s.send(&cmd).unwrap();
            assert!(r.ok, "round {round}: {cmd}: {}", r.text);
        }
        let c = count();
        while count() < c + 3 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    shared.stop();
    let o = cli.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = std::fs::read_to_string(&out).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    // The program's own verdict (its stdout went through ftprobe's child stdout: the trace
    // went to a file, so the program's line is on ftprobe's stdout).
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.starts_with("foreign 0 of "), "{stdout}");
    // The events ran: malloc's probe saw the worker's 32-byte blocks, work returned.
    assert!(
        common::events(&text).any(|l| l.contains(" m: ") && l.contains("n=32")),
        "{}",
        tail(&text)
    );
    assert!(
        common::events(&text).any(|l| l.contains(" wr: ")),
        "{}",
        tail(&text)
    );
}

/// `trace -p PID --control`: the channel of an attached session, its thread gone with the
/// session, and a second session with its own.
#[test]
fn an_attached_session_is_controlled_too() {
    let (exe, dir, shm, shared) = setup("ctl_attach.c", GUEST_FIXTURE, "control-attach");
    let prog = std::process::Command::new(&exe)
        .arg(&shm)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    while shared.ready() == 0 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let pid = prog.id();
    // The program is stopped if an assertion fails.
    struct Kill(u32);
    impl Drop for Kill {
        fn drop(&mut self) {
            // SAFETY: kill(2) of our child (or of nothing, once it was reaped).
            unsafe { libc::kill(self.0 as i32, libc::SIGKILL) };
        }
    }
    let _kill = Kill(pid);
    let tasks = || {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .count()
    };
    assert_eq!(tasks(), 2);
    let count = || shared.word(2).load(std::sync::atomic::Ordering::Acquire);
    for session in 0..2 {
        let out = dir.join(format!("trace-{session}.txt"));
        let cli = common::ftprobe()
            .args([
                "trace",
                "-p",
                &pid.to_string(),
                "--control",
                "-e",
                "p:w work i=%di:s64",
                "-o",
            ])
            .arg(&out)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let start = Instant::now();
        let mut s = loop {
            if let Ok(s) = Session::connect(pid) {
                break s;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "no control socket"
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        let mut send = |cmd: &str| {
            let r = s.send(cmd).unwrap();
            assert!(r.ok, "{cmd}: {}", r.text);
            r.text
        };
        send("echo 'p:h helper i=%di:s64' >> kprobe_events");
        let sent_on = count();
        send("echo 1 > events/kprobes/h/enable");
        let (on, c0) = (count(), Instant::now());
        while count() < on + 20 {
            assert!(c0.elapsed() < Duration::from_secs(10));
            std::thread::sleep(Duration::from_millis(1));
        }
        let off = count();
        send("echo 0 > events/kprobes/enable");
        let off_done = count();
        assert_eq!(
            tasks(),
            3,
            "the agent's control thread runs while the session does"
        );
        // SAFETY: kill(2) with a live child's pid.
        unsafe { libc::kill(cli.id() as i32, libc::SIGINT) };
        let o = cli.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let text = std::fs::read_to_string(&out).unwrap();
        let h: Vec<i64> = common::events(&text)
            .filter_map(|l| l.split(" h: ").nth(1))
            .map(|a| a.rsplit("i=").next().unwrap().trim().parse().unwrap())
            .collect();
        // helper(a) runs while the count is a. Every call surely made while h was enabled
        // is there, none made after it was disabled.
        for a in (on + 1)..off {
            assert!(h.contains(&a), "session {session}: helper({a}) missing");
        }
        assert!(
            h.iter().all(|&a| a >= sent_on && a <= off_done),
            "session {session}: a call outside the window [{sent_on}, {off_done}]: {:?}",
            h.iter()
                .filter(|&&a| a < sent_on || a > off_done)
                .collect::<Vec<_>>()
        );
        // The session's thread is gone with it.
        let start = Instant::now();
        while tasks() != 2 {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "the control thread stayed"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    shared.stop();
    let o = prog.wait_with_output().unwrap();
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("foreign 0 of "));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 26, item 7: with `XDG_RUNTIME_DIR` unset the control socket was under the
/// predictable `/tmp/ftprobe-UID`, which another user could make first (then `trace
/// --control` failed). It is now under the user's own directories (`/run/user/UID`, or
/// `~/.cache/ftprobe/run`): a `/tmp/ftprobe-UID` of another user's changes nothing.
#[test]
fn another_users_tmp_directory_does_not_stop_a_control_session() {
    let (exe, dir, shm, shared) = setup("ctl_tmp.c", FIXTURE, "control-tmp");
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let squatted = std::path::PathBuf::from(format!("/tmp/ftprobe-{uid}"));
    let made_here = uid == 0 && !squatted.exists() && std::fs::create_dir(&squatted).is_ok();
    if made_here {
        // Another user's (nobody's), as an attacker's would be.
        std::os::unix::fs::chown(&squatted, Some(65534), Some(65534)).unwrap();
    }
    let home = dir.join("home");
    std::fs::create_dir(&home).unwrap();
    let out = dir.join("trace.txt");
    let mut cli = common::ftprobe()
        .args(["trace", "--control", "-e", "p:a probed_a", "-o"])
        .arg(&out)
        .arg("--")
        .arg(&exe)
        .arg(&shm)
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("XDG_CACHE_HOME")
        .env("HOME", &home)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    while shared.ready() < THREADS as i64 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let pid = pgrep_child(cli.id());
    let ctl = common::ftprobe()
        .arg("ctl")
        .arg(pid.to_string())
        .arg("cat kprobe_events")
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("XDG_CACHE_HOME")
        .env("HOME", &home)
        .output()
        .unwrap();
    // The socket is in a directory of the user's own, never under /tmp.
    let run_user = std::path::PathBuf::from(format!("/run/user/{uid}/ftprobe/ctl-{pid}"));
    let in_home = home.join(format!(".cache/ftprobe/run/ctl-{pid}"));
    let where_ = (run_user.exists(), in_home.exists());
    shared.stop();
    let status = cli.wait().unwrap();
    let mut err = String::new();
    cli.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    if made_here {
        let _ = std::fs::remove_dir(&squatted);
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(status.success(), "{err}");
    assert!(
        where_.0 || where_.1,
        "no socket in /run/user/{uid} nor in HOME"
    );
    assert_eq!(
        String::from_utf8_lossy(&ctl.stdout),
        "p:a probed_a\n",
        "{}",
        String::from_utf8_lossy(&ctl.stderr)
    );
}
