//! `ftprobe trace` end to end: fixtures in every site flavour and the real Lua build, run under
//! the CLI with the preloaded agent; exact counts against the fixtures' known call counts.

use std::path::Path;
use std::process::Stdio;

mod common;
use common::{events, ftprobe, trace, untraced};

use ftprobe_dev::{
    cxx_fixture, fixture, forks_fixture, lua, lua_script, mallocs_fixture, own_sigtrap_fixture,
    rust_fixture, sigcalls_fixture, spawns_fixture, Flavour, LuaBuild, LUA_TABLES_CREATED,
};

/// Event lines (not `#` comments) whose function part is exactly `func_line`
/// (`work <-caller`).
fn count(text: &str, func_line: &str) -> usize {
    events(text)
        .filter(|l| l.split_once(": ").map(|x| x.1) == Some(func_line))
        .count()
}

fn lost(text: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix("# lost events: "))
        .expect("lost-event line")
        .parse()
        .unwrap()
}

#[test]
fn every_flavour_counts_calls_and_parents_exactly() {
    for fl in Flavour::ALL {
        let exe = fixture("calls", fl).unwrap();
        let exe = exe.to_str().unwrap();
        let (out, text) = trace(&["-F", "work", "-F", "caller"], &[exe, "7"]);
        let plain = untraced(&[exe, "7"]);
        assert!(out.status.success(), "{}: {:?}", fl.name(), out);
        assert_eq!(
            out.stdout,
            plain.stdout,
            "{}: program output unchanged",
            fl.name()
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout), "sum=91\n");
        assert_eq!(count(&text, "work <-caller"), 7, "{}:\n{text}", fl.name());
        assert_eq!(count(&text, "caller <-main"), 1, "{}:\n{text}", fl.name());
        assert_eq!(
            events(&text).count(),
            8,
            "{}: nothing else traced:\n{text}",
            fl.name()
        );
        assert_eq!(lost(&text), 0);
    }
}

#[test]
fn rustc_patchable_function_entry_sites() {
    // rustc -Zpatchable-function-entry=5: one LLVM NOP5 at each entry of the crate's functions.
    let exe = rust_fixture();
    let exe = exe.to_str().unwrap();
    let list = ftprobe().args(["list", "functions", exe]).output().unwrap();
    let list = String::from_utf8_lossy(&list.stdout);
    let work = list
        .lines()
        .find(|l| l.ends_with(" work"))
        .unwrap_or_else(|| panic!("{list}"));
    let cols: Vec<&str> = work.split_whitespace().collect();
    assert_eq!(
        cols,
        [
            "+0x0",
            "nop5",
            "entry",
            "__patchable_function_entries",
            "work"
        ]
    );
    let (out, text) = trace(
        &["-F", "work", "-F", "caller", "-F", "run_calls"],
        &[exe, "6"],
    );
    assert_eq!(out.stdout, untraced(&[exe, "6"]).stdout);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "sum=66\n");
    assert_eq!(count(&text, "work <-caller"), 6, "{text}");
    assert_eq!(count(&text, "caller <-run_calls"), 1, "{text}");
    assert_eq!(events(&text).count(), 8, "{text}");
}

#[test]
fn shared_library_sites_are_traced() {
    let mut n = 0;
    for fl in Flavour::ALL {
        let Some(exe) = fixture("calls_lib", fl) else {
            continue;
        };
        n += 1;
        let exe = exe.to_str().unwrap();
        let (out, text) = trace(&["-F", "*:mod:libfxwork*"], &[exe, "5"]);
        assert_eq!(out.stdout, untraced(&[exe, "5"]).stdout);
        assert_eq!(count(&text, "work <-caller"), 5, "{}:\n{text}", fl.name());
        assert_eq!(count(&text, "caller <-main"), 1, "{}:\n{text}", fl.name());
        assert_eq!(
            events(&text).count(),
            6,
            "{}: only the library's functions:\n{text}",
            fl.name()
        );
    }
    assert_eq!(n, 7, "every PIC flavour has a library fixture");
}

#[test]
fn notrace_and_negated_filters() {
    let exe = fixture("calls", Flavour::FentryCallPieRecord).unwrap();
    let exe = exe.to_str().unwrap();
    // Everything but work: main and caller.
    let (_, text) = trace(&["-N", "work"], &[exe, "4"]);
    assert_eq!(count(&text, "work <-caller"), 0);
    assert_eq!(count(&text, "caller <-main"), 1);
    // libc.so.6 is stripped of its local symbols: main's caller prints as an address, or
    // by its name in the debug file when libc6-dbg is installed.
    assert!(
        events(&text).any(|l| {
            let f = l.split_once(": ").unwrap().1;
            f.starts_with("main <-0x7") || f == "main <-__libc_start_call_main"
        }),
        "{text}"
    );
    // Filter all, then remove caller and main with `!`.
    let (_, text) = trace(&["-F", "*", "-F", "!caller", "-F", "!main"], &[exe, "4"]);
    assert_eq!(count(&text, "work <-caller"), 4);
    assert_eq!(events(&text).count(), 4, "{text}");
}

#[test]
fn threads_get_their_own_rings() {
    let exe = fixture("threads", Flavour::Patchable).unwrap();
    let exe = exe.to_str().unwrap();
    let (out, text) = trace(&["-F", "work"], &[exe, "2000"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "total=24000000\n");
    assert_eq!(
        count(&text, "work <-thread_main"),
        4 * 2000,
        "exact total over 4 threads"
    );
    let mut pids: Vec<&str> = events(&text)
        .map(|l| {
            l.split_whitespace()
                .next()
                .unwrap()
                .rsplit('-')
                .next()
                .unwrap()
        })
        .collect();
    pids.sort();
    pids.dedup();
    assert_eq!(pids.len(), 4, "four threads, four pids: {pids:?}");
    assert_eq!(lost(&text), 0);
}

/// More threads than rings: what the rings hold plus what is reported lost is exactly what
/// the threads did. Regression: the main thread claimed a ring at exit just to write nothing
/// and counted one event lost when none was left (found by a user).
#[test]
fn lost_events_without_a_ring_are_counted_exactly() {
    let exe = fixture("threads", Flavour::Patchable).unwrap();
    let exe = exe.to_str().unwrap();
    for rings in ["1", "2", "4"] {
        let (out, text) = trace(&["-F", "work", "--rings", rings], &[exe, "500"]);
        assert!(out.status.success(), "{out:?}");
        let recorded = count(&text, "work <-thread_main");
        // Either kind of no ring: all owned by live threads, or some held by ended ones not
        // read yet (a thread may reach its first event after another one ended).
        let no_ring: u64 = text
            .lines()
            .filter_map(|l| {
                let (n, why) = l.strip_prefix("# ")?.split_once(" events lost: ")?;
                (why == "more threads at once than rings (--rings)"
                    || why.starts_with("no ring free, some held by ended threads"))
                .then(|| n.parse::<u64>().unwrap())
            })
            .sum();
        assert_eq!(
            recorded as u64 + no_ring,
            4 * 500,
            "--rings {rings}:\n{text}"
        );
        assert_eq!(lost(&text), no_ring, "--rings {rings}");
        assert_eq!(
            recorded,
            rings.parse::<usize>().unwrap() * 500,
            "--rings {rings}"
        );
    }
}

/// A forked child is traced, in a ring of its own, also when it outlives its parent.
/// Regression: ftprobe stopped when the parent exited and the child's later events were
/// silently missing (found by a user); it now waits for the forked processes that still
/// trace, and a termination signal during that wait says whose events are missing.
#[test]
fn forked_children_are_traced_and_waited_for() {
    let exe = forks_fixture();
    let exe = exe.to_str().unwrap();
    let args = |text: &str| -> Vec<String> {
        events(text)
            .filter(|l| l.ends_with("leaf <-main"))
            .map(|l| l.split_whitespace().next().unwrap().to_owned())
            .collect()
    };
    for mode in ["wait", "daemon"] {
        let (out, text) = trace(&["-F", "leaf"], &[exe, mode]);
        assert!(out.status.success(), "{mode}: {out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "forks done\n");
        let tasks = args(&text);
        assert_eq!(
            tasks.len(),
            8,
            "{mode}: 3 in the parent, 5 in the child:\n{text}"
        );
        let mut pids = tasks.clone();
        pids.dedup();
        assert_eq!(pids.len(), 2, "{mode}: parent then child: {tasks:?}");
        assert_eq!(lost(&text), 0, "{mode}");
        if mode == "daemon" {
            assert!(
                String::from_utf8_lossy(&out.stderr).contains("waiting for the forked processes"),
                "{out:?}"
            );
        }
    }
    // Interrupted while waiting: what was recorded is kept, the missing child is named. The
    // child (`hold`) calls `leaf` only once its standard input, a pipe of this test, ends:
    // after the SIGINT, which is sent once ftprobe says it waits (the parent exited).
    let file = std::env::temp_dir().join(format!("ftprobe-forks-{}.txt", std::process::id()));
    let mut child = ftprobe()
        .args(["trace", "-F", "leaf", "-o"])
        .arg(&file)
        .args(["--", exe, "hold"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let hold = child.stdin.take().unwrap();
    let mut said = String::new();
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    while !said.contains("waiting for the forked processes") {
        let mut line = String::new();
        let n = std::io::BufRead::read_line(&mut err, &mut line).unwrap();
        assert!(n > 0, "ftprobe ended without waiting: {said}");
        said += &line;
    }
    // SAFETY: kill has no memory effects; the pid is our child, not yet reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    assert!(child.wait().unwrap().success(), "{said}");
    drop(hold);
    let text = std::fs::read_to_string(&file).unwrap();
    let _ = std::fs::remove_file(&file);
    assert_eq!(args(&text).len(), 3, "the parent's:\n{text}");
    assert!(
        text.lines().any(|l| l.starts_with("# pid ")
            && l.ends_with(" was still running: its later events are not in this trace")),
        "{text}"
    );
}

/// A trace that cannot be written is an error in the exit status too (found by a user:
/// `-o /dev/full` printed the error and exited 0).
#[test]
fn a_trace_that_cannot_be_written_fails() {
    let exe = fixture("calls", Flavour::Patchable).unwrap();
    let out = ftprobe()
        .args(["trace", "-F", "work", "-o", "/dev/full", "--"])
        .args([exe.to_str().unwrap(), "2"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("writing the trace: No space left on device")
    );
    // A reader that stops early (`| head`) is not a trace error: no message, and the status
    // is the target's (which shares the pipe, so SIGPIPE ends it: 128 + 13).
    let mut child = ftprobe()
        .args(["trace", "-F", "work", "--"])
        .args([exe.to_str().unwrap(), "2000"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(128 + libc::SIGPIPE), "{out:?}");
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("writing the trace"),
        "{out:?}"
    );
}

/// The function tracer and a kprobe event on one thread, and a signal handler that calls
/// both traced functions while either is writing. Regression: the two wrote into the thread's
/// ring at once (one producer per ring), which corrupted records and lost events silently
/// (found by a user). Now every call is a record, a counted loss or a kprobe miss, exactly,
/// and every line is well formed.
#[test]
fn signal_handlers_interrupting_a_tracer_lose_nothing_silently() {
    let exe = sigcalls_fixture();
    let exe = exe.to_str().unwrap();
    for round in 0..3 {
        let (out, text) = trace(
            &[
                "--buffer-size-kb",
                "65536",
                "-F",
                "body",
                "-e",
                "p:w work x=%di",
            ],
            &[exe, "100000", "100"],
        );
        assert!(out.status.success(), "{out:?}");
        let said = String::from_utf8_lossy(&out.stdout);
        let calls = |name: &str| -> u64 {
            said.split_whitespace()
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                .unwrap()
                .parse()
                .unwrap()
        };
        let (work, body) = (calls("work"), calls("body"));
        let body_lines = (count(&text, "body <-work") + count(&text, "body <-on_alarm")) as u64;
        let w_lines = kprobe_lines(&text, "w").len() as u64;
        let profile: Vec<u64> = text
            .lines()
            .find(|l| l.starts_with("#   w "))
            .unwrap()
            .split_whitespace()
            .skip(2)
            .map(|n| n.parse().unwrap())
            .collect();
        let (hits, missed) = (profile[0], profile[1]);
        assert_eq!(
            hits + missed,
            work,
            "round {round}: the kprobe's hits and misses"
        );
        // Lost: the function tracer's drops and the event's (hits without a record).
        let w_dropped = hits - w_lines;
        assert_eq!(
            body_lines + lost(&text) - w_dropped,
            body,
            "round {round}: body:\n{said}"
        );
        for l in events(&text) {
            let (ctx, what) = l.split_once(": ").unwrap_or_else(|| panic!("{l}"));
            assert!(ctx.trim_start().starts_with("sigcalls-"), "{l}");
            assert!(
                what == "body <-work"
                    || what == "body <-on_alarm"
                    || (what.starts_with("w: (work+0x0/") && what.contains(") x=0x")),
                "round {round}: malformed line {l:?}"
            );
        }
    }
}

/// A thread that fills its ring: what the trace holds plus what it says was lost is exactly
/// what happened, and the exit counters still arrive. Regression: the agent's counters at
/// exit did not fit in the full ring, were counted as one more lost event, and the profile
/// showed `N+  -` as for a killed program (found by a user).
#[test]
fn a_full_ring_still_gets_the_exit_counters() {
    let exe = fixture("calls", Flavour::Patchable).unwrap();
    let n = 3_000_000;
    let (out, text) = trace(
        &["--buffer-size-kb", "4096", "-e", "p:w work x=%di"],
        &[exe.to_str().unwrap(), &n.to_string()],
    );
    assert!(out.status.success(), "{out:?}");
    let recorded = kprobe_lines(&text, "w").len() as u64;
    assert!(lost(&text) > 0, "the ring filled: {}", lost(&text));
    assert_eq!(recorded + lost(&text), n, "{}", &text[text.len() - 300..]);
    let profile = text.lines().find(|l| l.starts_with("#   w ")).unwrap();
    assert_eq!(
        profile.split_whitespace().skip(2).collect::<Vec<_>>(),
        [n.to_string().as_str(), "0"],
        "{profile}"
    );
}

/// A program that cannot be started: the shell's statuses, 127 (not found) and 126 (not
/// runnable), so scripts can tell them from the program's own failure (was 1).
#[test]
fn a_program_that_cannot_run_exits_126_or_127() {
    for (cmd, code) in [
        ("/no/such/program", 127),
        ("no-such-command-here", 127),
        ("/etc/passwd", 126),
    ] {
        let out = ftprobe().args(["trace", "--", cmd]).output().unwrap();
        assert_eq!(out.status.code(), Some(code), "{cmd}: {out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("cannot run"),
            "{cmd}"
        );
    }
}

#[test]
fn trace_line_format_is_ftraces() {
    let exe = fixture("calls", Flavour::FentryNop).unwrap();
    let (_, text) = trace(&["-F", "caller"], &[exe.to_str().unwrap(), "1"]);
    let line = events(&text).next().unwrap();
    // "  calls-fentry-no-1234    [001]   123.456789: caller <-main"
    let (ctx, func) = line.split_once(": ").unwrap();
    assert_eq!(func, "caller <-main");
    assert_eq!(
        &ctx[..16],
        " calls-fentry-no",
        "comm right-aligned in 16 columns"
    );
    let rest = &ctx[17..];
    let cpu_at = rest.find('[').unwrap();
    assert!(
        rest[..cpu_at].trim_end().parse::<u32>().is_ok(),
        "pid: {rest}"
    );
    assert_eq!(&rest[cpu_at + 4..cpu_at + 5], "]");
    let ts = rest[cpu_at + 5..].trim();
    let (s, us) = ts.split_once('.').unwrap();
    assert!(
        s.parse::<u64>().is_ok() && us.len() == 6 && us.parse::<u64>().is_ok(),
        "{ts}"
    );
    assert!(text.starts_with("# tracer: function\n"));
}

#[test]
fn lua_luah_new_counts_the_tables_the_script_creates() {
    for build in [LuaBuild::FentryNop, LuaBuild::Patchable] {
        let exe = lua(build);
        let exe = exe.to_str().unwrap();
        let script = lua_script("tables.lua");
        let empty = lua_script("empty.lua");
        let (out, text) = trace(&["-F", "luaH_new"], &[exe, script.to_str().unwrap()]);
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!("tables created: {LUA_TABLES_CREATED}\n")
        );
        let (_, base) = trace(&["-F", "luaH_new"], &[exe, empty.to_str().unwrap()]);
        let n = events(&text)
            .filter(|l| l.contains(": luaH_new <-"))
            .count();
        let b = events(&base)
            .filter(|l| l.contains(": luaH_new <-"))
            .count();
        assert_eq!(events(&text).count(), n, "only luaH_new is traced");
        assert!(b > 0, "the runtime itself creates tables");
        assert_eq!(
            n - b,
            LUA_TABLES_CREATED as usize,
            "{build:?}: one luaH_new per table the script made"
        );
        assert_eq!((lost(&text), lost(&base)), (0, 0));
    }
}

#[test]
fn exit_status_and_stdio_pass_through() {
    // sh has no ftrace site: a probe on a libc function (one it never calls) gives it something to trace.
    let out = ftprobe()
        .args(["trace", "-e", "p:g libc:getuid", "-o", "/dev/null", "--"])
        .args(["sh", "-c", "exit 3"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let out = ftprobe()
        .args(["trace", "-e", "p:g libc:getuid", "-o", "/dev/null", "--"])
        .args(["sh", "-c", "kill -SEGV $$"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(128 + 11));
    let mut child = ftprobe()
        .args(["trace", "-e", "p:g libc:getuid", "-o", "/dev/null", "--"])
        .args(["sh", "-c", "cat; echo err >&2"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"hello through stdin\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.stdout, b"hello through stdin\n");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "err\n");
    // Nothing to trace at all (sh has no ftrace site, and no -e): refused before main.
    let out = ftprobe()
        .args(["trace", "--", "sh", "-c", "echo ran"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "",
        "no header, and sh never ran"
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "ftprobe-agent: no function of this program or its libraries has an ftrace site: nothing \
         to trace (build with -pg -mfentry, -pg, or -fpatchable-function-entry=5): stopped \
         before main, nothing traced\n"
    );
}

#[test]
fn bad_filters_are_clear_errors() {
    let exe = fixture("calls", Flavour::Patchable).unwrap();
    let exe = exe.to_str().unwrap();
    let (out, _) = trace(&["-F", "work["], &[exe]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("invalid filter pattern \"work[\" at column 4"),
        "{err}"
    );
    // A glob that matches nothing: refused before main, as the kernel refuses the write to
    // set_ftrace_filter (EINVAL), alone or next to one that matches; no trace-like output
    // (issue 9, item 5).
    for filters in [
        &["-F", "no_such_function"][..],
        &["-F", "work", "-F", "no_such_function"],
    ] {
        let (out, text) = trace(filters, &[exe, "3"]);
        assert_eq!(out.status.code(), Some(1), "{filters:?}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "", "main never ran");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(
                "ftprobe-agent: no function with an ftrace site matches \"no_such_function\""
            ) && err.contains("stopped before main, nothing traced"),
            "{err}"
        );
        assert_eq!(text, "", "{filters:?}: nothing that looks like a trace");
    }
}

#[test]
fn list_functions_shows_each_flavours_site() {
    for fl in Flavour::ALL {
        let exe = fixture("calls", fl).unwrap();
        let out = ftprobe()
            .args(["list", "functions"])
            .arg(&exe)
            .output()
            .unwrap();
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        let work = text
            .lines()
            .find(|l| l.ends_with(" work"))
            .unwrap_or_else(|| panic!("{text}"));
        let cols: Vec<&str> = work.split_whitespace().collect();
        assert_eq!(
            cols[0],
            format!("+{:#x}", fl.site_offset()),
            "{}",
            fl.name()
        );
        let kind = match (fl.site_len(), fl.has_record_section(), fl.name()) {
            (6, _, _) => "call*got",
            (_, _, n) if n.starts_with("patchable") => "nop1x5",
            (_, _, n) if n.contains("nop") => "nop5",
            _ => "call",
        };
        assert_eq!(cols[1], kind, "{}", fl.name());
        let source = if !fl.has_record_section() {
            "decoded"
        } else if fl.name().starts_with("patchable") {
            "__patchable_function_entries"
        } else {
            "__mcount_loc"
        };
        assert_eq!(cols[3], source, "{}", fl.name());
    }
    assert!(Path::new(env!("CARGO_BIN_EXE_ftprobe")).exists());
}

/// The kprobe events of one run: (event name, args part after the `(sym+off/size)`).
fn kprobe_lines<'a>(text: &'a str, event: &str) -> Vec<&'a str> {
    let tag = format!(": {event}: (");
    events(text)
        .filter_map(|l| l.split_once(&tag).map(|(_, rest)| rest))
        .collect()
}

#[test]
fn kprobe_events_with_args_in_every_flavour() {
    for fl in Flavour::ALL {
        let exe = fixture("calls", fl).unwrap();
        let exe = exe.to_str().unwrap();
        // -pg: func+0 is an ordinary instruction; the site (mcount call) is at +4, where the
        // kernel's rule refuses $argN (not the function's entry): use the registers.
        let def = if fl.is_mcount() {
            format!("p:w work+{} arg1=%di arg2=%si", fl.site_offset())
        } else {
            "p:w work $arg1 $arg2".to_owned()
        };
        let (out, text) = trace(&["-e", &def], &[exe, "5"]);
        assert_eq!(out.stdout, untraced(&[exe, "5"]).stdout, "{}", fl.name());
        let lines = kprobe_lines(&text, "w");
        assert_eq!(lines.len(), 5, "{}:\n{text}", fl.name());
        let off = fl.site_offset();
        for (i, l) in lines.iter().enumerate() {
            // work(i, i + 1); the default type is x64.
            let want = format!("arg1={:#x} arg2={:#x}", i, i + 1);
            assert!(
                l.starts_with(&format!("work+{off:#x}/")),
                "{}: {l}",
                fl.name()
            );
            assert!(l.ends_with(&format!(") {want}")), "{}: {l}", fl.name());
        }
        assert_eq!(
            count(&text, "work <-caller"),
            0,
            "-e alone: no function tracer"
        );
        assert!(text.starts_with("# tracer: nop\n"));
        let profile = text
            .lines()
            .skip_while(|l| *l != "# kprobe_profile:")
            .nth(1)
            .unwrap();
        assert_eq!(
            profile.split_whitespace().collect::<Vec<_>>(),
            ["#", "w", "5", "0"],
            "{}",
            fl.name()
        );
    }
}

#[test]
fn kprobe_event_types_names_and_listing() {
    let exe = fixture("calls", Flavour::FentryCallPieRecord).unwrap();
    let exe = exe.to_str().unwrap();
    let (out, text) = trace(
        &[
            "-e",
            "p:grp/ev work a=%di:u8 b=$arg2:s32 sp=$stack k=\\-2:s64 c=$comm",
            "-e",
            "p caller n=%di:u64",
        ],
        &[exe, "3"],
    );
    assert!(out.status.success());
    let lines = kprobe_lines(&text, "ev");
    assert_eq!(lines.len(), 3, "{text}");
    assert!(lines[2].contains(") a=2 b=3 sp=0x7f"), "{}", lines[2]);
    assert!(
        lines[2].ends_with(" k=-2 c=\"calls-fentry-ca\""),
        "{}",
        lines[2]
    );
    let caller = kprobe_lines(&text, "p_caller_0");
    assert_eq!(caller.len(), 1, "{text}");
    assert!(
        caller[0].starts_with("caller+0x0/0x") && caller[0].ends_with(") n=3"),
        "{}",
        caller[0]
    );
    let list: Vec<&str> = text
        .lines()
        .skip_while(|l| *l != "# kprobes/list:")
        .skip(1)
        .take(2)
        .collect();
    assert!(
        list[0].contains("  k  work+0x0  calls-fentry-call-pie-record [FTRACE]"),
        "{list:?}"
    );
    assert!(
        list[1].contains("  k  caller+0x0  calls-fentry-call-pie-record [FTRACE]"),
        "{list:?}"
    );
}

#[test]
fn kprobe_and_function_tracer_on_one_site() {
    let exe = fixture("calls", Flavour::Patchable).unwrap();
    let exe = exe.to_str().unwrap();
    let (_, text) = trace(&["-e", "p:w work a=$arg1:u64", "-F", "work"], &[exe, "4"]);
    assert_eq!(kprobe_lines(&text, "w").len(), 4);
    assert_eq!(count(&text, "work <-caller"), 4);
    // In each pair, the kprobe event and the function entry carry the same timestamp order.
    let order: Vec<bool> = events(&text).map(|l| l.contains(": w: (")).collect();
    assert_eq!(order.len(), 8);
}

#[test]
fn malformed_and_unarmable_definitions_are_refused_with_a_caret() {
    let exe = fixture("calls", Flavour::Patchable).unwrap();
    let exe = exe.to_str().unwrap();
    // Parse errors: before anything runs, the kernel's text and caret.
    let (out, _) = trace(&["-e", "p work %zz"], &[exe]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty(), "the program did not run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with(
            "ftprobe: trace_kprobe: error: Invalid register name\n  Command: p work %zz\n"
        ),
        "{err}"
    );
    assert!(
        err.contains("\n                  ^\n"),
        "caret under %zz:\n{err}"
    );
    // Errors found in the target: inside a site, unknown symbol; the program does not run.
    for (def, text, col) in [
        ("p work+2", "Probe point is not an instruction boundary", 2),
        ("p no_such_fn", "Invalid probed address or symbol", 2),
    ] {
        let (out, _) = trace(&["-e", def], &[exe, "1"]);
        assert_eq!(out.status.code(), Some(1), "{def}");
        assert!(out.stdout.is_empty(), "{def}: main did not run");
        let err = String::from_utf8_lossy(&out.stderr);
        let want = format!(
            "ftprobe-agent: trace_kprobe: error: {text}\n  Command: {def}\n{}^\n",
            " ".repeat(11 + col)
        );
        assert!(err.starts_with(&want), "{def}:\n{err}\nwanted:\n{want}");
    }
}

#[test]
fn pg_func_plus_0_is_an_int3_probe() {
    // -pg: func+0 is `push %rbp`, an ordinary instruction: an int3 probe, not [FTRACE].
    let exe = fixture("calls", Flavour::McountPie).unwrap();
    let exe = exe.to_str().unwrap();
    let (out, text) = trace(&["-e", "p:w work a=$arg1 b=$arg2"], &[exe, "4"]);
    assert_eq!(out.stdout, untraced(&[exe, "4"]).stdout);
    let lines = kprobe_lines(&text, "w");
    assert_eq!(lines.len(), 4, "{text}");
    for (i, l) in lines.iter().enumerate() {
        assert!(
            l.starts_with("work+0x0/") && l.ends_with(&format!(") a={i:#x} b={:#x}", i + 1)),
            "{l}"
        );
    }
    let list = text
        .lines()
        .find(|l| l.contains("  k  work+0x0  "))
        .unwrap();
    assert!(!list.contains("[FTRACE]"), "{list}");
    // At the site (+4), $argN is refused as the kernel refuses it off a function's entry.
    let (out, _) = trace(&["-e", "p work+4 $arg1"], &[exe, "1"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("error: $arg* can be used only on function entry or exit"),
        "{err}"
    );
}

#[test]
fn lua_kprobe_with_args() {
    for build in [LuaBuild::FentryNop, LuaBuild::Patchable] {
        let exe = lua(build);
        let script = lua_script("tables.lua");
        let (_, text) = trace(
            &[
                "-e",
                "p:newtable luaH_new L=%di",
                "-e",
                "p:resize luaH_resize t=$arg2 asize=$arg3:u32 hsize=$arg4:u32",
            ],
            &[exe.to_str().unwrap(), script.to_str().unwrap()],
        );
        let (_, base) = trace(
            &["-e", "p:newtable luaH_new L=%di"],
            &[
                exe.to_str().unwrap(),
                lua_script("empty.lua").to_str().unwrap(),
            ],
        );
        let n = kprobe_lines(&text, "newtable").len() - kprobe_lines(&base, "newtable").len();
        assert_eq!(n as u64, LUA_TABLES_CREATED, "{build:?}");
        assert!(!kprobe_lines(&text, "resize").is_empty());
        assert!(kprobe_lines(&text, "resize")
            .iter()
            .all(|l| l.contains(" asize=") && l.contains(" hsize=")));
    }
}

/// Regression: a kprobe event's handler kept a 1 KiB argument buffer and a copy of `pt_regs`
/// on the stack (~1.7 KiB in all), and overflowed a small signal stack that the untraced
/// program fit in (found by a user). The probe path now needs ~500-650 bytes in the agent
/// `cargo build` makes, ~830 in the one `cargo test` builds (unwinding enabled); the kernel's
/// own signal frame takes ~3.4 KiB of the stack on this AVX-512 machine. ftprobe's wrapper of
/// the program's handler (it holds a signal that arrives in a trampoline) adds ~100 bytes.
#[test]
fn regression_probes_fit_on_a_small_signal_stack() {
    const BUDGET: usize = 1024 + 128;
    let exe = fixture("sigstack", Flavour::FentryCallPieRecord).unwrap();
    let exe = exe.to_str().unwrap();
    let used = common::signal_stack_used;
    let plain = used(&untraced(&[exe]));
    // The smallest page-multiple stack with BUDGET bytes to spare beyond what the program uses.
    let size = (plain + BUDGET).div_ceil(4096) * 4096;
    for args in [
        &["-F", "hf"][..],
        &["-e", "p hf x=%di y=$arg1 c=$comm"],
        &["-e", "p hf x=%di", "-F", "hf"],
    ] {
        let (out, text) = trace(args, &[exe]);
        assert!(out.status.success(), "{args:?}: {out:?}");
        let extra = used(&out) - plain;
        assert!(
            extra <= BUDGET,
            "{args:?}: the probe path used {extra} bytes of the signal stack"
        );
        assert_eq!(
            events(&text).count(),
            if args.len() == 4 { 4 } else { 2 },
            "{text}"
        );
        let (out, _) = trace(args, &[exe, &size.to_string()]);
        assert!(
            out.status.success(),
            "{args:?} on a {size}-byte signal stack: {:?}",
            out.status
        );
    }
}

#[test]
fn bitfields_removals_and_refusals_before_the_program_runs() {
    let exe = fixture("calls", Flavour::Patchable).unwrap();
    let exe = exe.to_str().unwrap();
    // work(i, i + 1): bits 1..3 of i + 1, and the low 4 bits as a u8 container.
    let (_, text) = trace(
        &["-e", "p:w work f=$arg2:b2@1/64 g=$arg2:b4@0/8"],
        &[exe, "6"],
    );
    let lines = kprobe_lines(&text, "w");
    let want: Vec<String> = (0..6u64)
        .map(|i| format!(" f={} g={}", ((i + 1) >> 1) & 3, (i + 1) & 15))
        .collect();
    for (l, w) in lines.iter().zip(&want) {
        assert!(l.ends_with(w.as_str()), "{l} vs {w}");
    }
    assert_eq!(lines.len(), 6);
    // -e '-:EVENT' removes an earlier -e; removing an unknown one is an error.
    let (out, text) = trace(
        &["-e", "p:w work", "-e", "p:c caller", "-e", "-:w"],
        &[exe, "2"],
    );
    assert!(out.status.success());
    assert_eq!(
        (
            kprobe_lines(&text, "w").len(),
            kprobe_lines(&text, "c").len()
        ),
        (0, 1)
    );
    let (out, _) = trace(&["-e", "-:nosuch"], &[exe]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no such event to remove"));
    // What ftprobe cannot run yet is refused by the CLI with the reason: nothing starts.
    let (def, why) = (
        "p work a=\\1:string[2]",
        "string arrays of an immediate are not supported",
    );
    let (out, text) = trace(&["-e", def], &[exe]);
    assert_eq!(out.status.code(), Some(1), "{def}");
    assert!(
        text.is_empty() && out.stdout.is_empty(),
        "{def}: nothing ran"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("This syntax is not supported by ftprobe"),
        "{def}: {err}"
    );
    assert!(err.contains(why), "{def}: {err}");
}

#[test]
fn library_symbols_by_alias_and_unknown_objects() {
    let exe = fixture("calls", Flavour::Patchable).unwrap();
    let exe = exe.to_str().unwrap();
    // glibc's printf is an alias of _IO_printf: found by that name, an int3 probe in libc.
    let (out, text) = trace(
        &["-e", "p:pf libc.so.6:printf", "-e", "p:pf2 libc:printf"],
        &[exe, "3"],
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "sum=15\n");
    assert_eq!(kprobe_lines(&text, "pf").len(), 1, "{text}");
    assert_eq!(kprobe_lines(&text, "pf2").len(), 1, "{text}");
    // An object not loaded (yet): the probe waits for it (tests/dlopen.rs), as the kernel's
    // probe on a module not loaded; the program runs.
    let (out, text) = trace(&["-e", "p:w nosuchlib:work"], &[exe, "3"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "sum=15\n");
    assert!(kprobe_lines(&text, "w").is_empty(), "{text}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("nosuchlib is not loaded"), "{err}");
}

#[test]
fn int3_probe_on_libc_malloc_in_unmodified_programs() {
    // A fixture built with no site flags mallocs known sizes.
    let exe = mallocs_fixture();
    let exe = exe.to_str().unwrap();
    let (out, text) = trace(
        &["-e", "p:libc/malloc libc.so.6:malloc size=%di:u64"],
        &[exe],
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "mallocs done\n");
    let sizes: Vec<u64> = kprobe_lines(&text, "malloc")
        .iter()
        .map(|l| l.rsplit_once(" size=").unwrap().1.parse().unwrap())
        .collect();
    // Regression: the agent's own allocations after arming were counted too (107 hits
    // where bpftrace counts the program's; found by a user). Now exactly the program's: the
    // four, then stdio's buffer for stdout (a pipe here: 4096 bytes).
    assert_eq!(sizes, [11, 222, 3333, 44444, 4096], "{text}");
    assert!(text
        .lines()
        .any(|l| l.contains("  k  malloc+0x0  libc.so.6 ") && !l.contains("[FTRACE]")));
    // And its four frees, not the agent's (the frees of the agent's own start-up were
    // counted too; the agent now never calls the C library's allocator; found by a user).
    let (out, text) = trace(&["-e", "p:f libc:free p=%di"], &[exe]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(kprobe_lines(&text, "f").len(), 4, "{text}");
    // And a system binary nobody rebuilt: ls, its output unchanged.
    let (out, text) = trace(&["-e", "p libc:malloc size=%di:u64"], &["ls", "/"]);
    assert!(out.status.success());
    assert_eq!(out.stdout, untraced(&["ls", "/"]).stdout);
    assert!(kprobe_lines(&text, "p_libc_malloc_0").len() > 5, "{text}");
}

/// glibc's `strlen` and `memcpy` are GNU indirect functions: the probe goes on the
/// implementation the dynamic linker picked for this machine. Regression: `strlen` was "not
/// found" and `memcpy` armed on an old compatibility version nothing calls, recording nothing
/// (found by a user).
#[test]
fn probes_on_indirect_functions_reach_the_implementation() {
    for f in ["strlen", "memcpy"] {
        let def = format!("p:{f} libc:{f} s=%di:x64");
        let (out, text) = trace(&["-e", &def], &["ls", "/"]);
        assert!(out.status.success(), "{f}: {out:?}");
        assert_eq!(out.stdout, untraced(&["ls", "/"]).stdout);
        // By the IFUNC's name, or the implementation's from libc's debug file (libc6-dbg).
        assert!(
            text.lines()
                .any(|l| l.contains(&format!("  k  {f}+0x0  libc.so.6"))
                    || (l.contains("  k  __") && l.contains("+0x0  libc.so.6"))),
            "{f}:\n{text}"
        );
        assert!(kprobe_lines(&text, f).len() > 3, "{f}: hits:\n{text}");
    }
}

#[test]
fn uprobe_style_path_offset_target() {
    // uprobe_events' PATH:OFFSET: malloc's file offset in libc, computed here from the ELF.
    let libc = "/lib/x86_64-linux-gnu/libc.so.6";
    let img = ftprobe::elf::ElfImage::open(Path::new(libc)).unwrap();
    let malloc = img.funcs_named("malloc").next().unwrap().svma;
    let seg = img
        .segments
        .iter()
        .find(|s| malloc >= s.svma && malloc - s.svma < s.filesz)
        .unwrap();
    let offset = malloc - seg.svma + seg.offset;
    let def = format!("p {libc}:{offset:#x} size=%di:u64");
    let exe = mallocs_fixture();
    let (out, text) = trace(&["-e", &def], &[exe.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let event = format!("p_libc_{offset:#x}");
    assert!(text.starts_with("# tracer: nop"), "{text}");
    let sizes: Vec<u64> = kprobe_lines(&text, &event)
        .iter()
        .map(|l| l.rsplit_once(" size=").unwrap().1.parse().unwrap())
        .collect();
    assert!(
        sizes.windows(4).any(|w| w == [11, 222, 3333, 44444]),
        "{sizes:?}\n{text}"
    );
    // A path that is not loaded: the kernel's FILE_NOT_FOUND, before main.
    let (out, _) = trace(
        &["-e", "p /no/such/lib.so:0x1000"],
        &[exe.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("error: Failed to find the given file"));
}

/// Regression: a program that installed its own SIGTRAP handler, ignored SIGTRAP or blocked
/// it was killed by the kernel at the next int3 probe hit (found by a user). The agent keeps
/// ftprobe's handler (the program's becomes the one ftprobe chains to) and SIGTRAP unblocked.
#[test]
fn regression_programs_that_own_sigtrap_survive_int3_probes() {
    let exe = own_sigtrap_fixture();
    let exe = exe.to_str().unwrap();
    for (mode, hits) in [("0", 5), ("1", 5), ("2", 4), ("3", 4), ("4", 4)] {
        let plain = untraced(&[exe, mode]);
        assert_eq!(plain.status.code(), Some(5));
        let (out, text) = trace(&["-e", "p:w work x=%di:s32"], &[exe, mode]);
        assert_eq!(out.status.code(), Some(5), "mode {mode}: {out:?}");
        assert_eq!(
            out.stdout, plain.stdout,
            "mode {mode}: the program's own handler still ran"
        );
        assert_eq!(kprobe_lines(&text, "w").len(), hits, "mode {mode}:\n{text}");
    }
}

/// Regression: an int3 probe on `execve` (or `dup2`, `sigprocmask`) killed every child that
/// `system()`, `popen()` and `posix_spawn()` started, silently (found by a user): glibc's
/// spawn child resets all signal handlers before it calls them, so the trap had no handler.
/// Such probes are now refused before `main`, by any of the function's names, and probes
/// elsewhere in libc leave the children alone.
#[test]
fn regression_int3_probes_on_the_spawn_childs_path_are_refused() {
    let exe = spawns_fixture();
    let exe = exe.to_str().unwrap();
    let want = "system=3 popen=from-popen spawn=4\n";
    assert_eq!(String::from_utf8_lossy(&untraced(&[exe]).stdout), want);
    for f in [
        "execve",
        "dup2",
        "sigprocmask",
        "pthread_sigmask",
        "_Exit",
        // posix_spawn's file actions (found by a user: killed the child).
        "__close_nocancel",
        "__open64_nocancel",
        "closefrom",
    ] {
        let def = format!("p libc:{f}");
        let (out, _) = trace(&["-e", &def], &[exe]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{def}: {out:?}");
        assert!(
            err.contains("an int3 probe there would kill them"),
            "{def}: {err}"
        );
        assert!(out.stdout.is_empty(), "{def}: main must not run: {out:?}");
    }
    // Two names of one function: the blacklist holds `sigaction`, the symbol is `__sigaction`.
    for f in ["sigaction", "__sigaction"] {
        let (out, _) = trace(&["-e", &format!("p libc:{f}")], &[exe]);
        assert_eq!(out.status.code(), Some(1), "{f}: {out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("blacklisted"),
            "{f}"
        );
    }
    let (out, text) = trace(&["-e", "p:ge libc:getenv"], &[exe]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), want);
    assert!(text.contains("# kprobes/list:"), "{text}");
}

#[test]
fn demangled_cxx_and_rust_names() {
    let exe = cxx_fixture();
    let exe = exe.to_str().unwrap();
    // Filters and output use demangled names; probes accept them (with '::').
    let (out, text) = trace(
        &[
            "-F",
            "ns::*",
            "-e",
            "p:get ns::K::get i=%si:s64",
            "-e",
            "p:tw ns::twice<long> x=%di:s64",
        ],
        &[exe, "3"],
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "cxx=606\n");
    assert_eq!(count(&text, "ns::K::get <-main"), 3, "{text}");
    assert_eq!(count(&text, "ns::twice<long> <-main"), 3, "{text}");
    let gets: Vec<&str> = kprobe_lines(&text, "get");
    assert_eq!(gets.len(), 3);
    assert!(
        gets[2].starts_with("ns::K::get+0x0/") && gets[2].ends_with(") i=2"),
        "{}",
        gets[2]
    );
    assert_eq!(kprobe_lines(&text, "tw").len(), 3);
    // A Rust function by its demangled path (calls-rs is built by rustc).
    let rs = rust_fixture();
    let (_, text) = trace(&["-e", "p:m calls_rs::main"], &[rs.to_str().unwrap(), "2"]);
    assert_eq!(kprobe_lines(&text, "m").len(), 1, "{text}");
    assert!(kprobe_lines(&text, "m")[0].starts_with("calls_rs::main+0x0/"));
}

/// The kernel's errors that only the target can raise, each with its text and caret (the
/// parse-level ones are the events module's table of 113 cases).
#[test]
fn engine_errors_have_the_kernels_names_and_carets() {
    let exe = fixture("calls", Flavour::FentryCallPieRecord).unwrap();
    let exe = exe.to_str().unwrap();
    for (def, text, col) in [
        // Inside the ftrace site (call *GOT, 6 bytes at work+0).
        ("p work+2", "Probe point is not an instruction boundary", 2),
        // Inside an instruction of a function with no site: decoded from its start.
        (
            "p libc:malloc+1",
            "Probe point is not an instruction boundary",
            2,
        ),
        ("p no_such_function", "Invalid probed address or symbol", 2),
        // Defined in both ld.so and libc.
        ("p _dl_catch_exception", "The symbol is not unique", 2),
        ("p /no/such/file:0x10", "Failed to find the given file", 2),
        ("p libc:syscall", "Failed to register probe event", 2),
    ] {
        let (out, _) = trace(&["-e", def], &[exe, "1"]);
        assert_eq!(out.status.code(), Some(1), "{def}");
        assert!(out.stdout.is_empty(), "{def}: main did not run");
        let err = String::from_utf8_lossy(&out.stderr);
        // PATH:OFFSET is uprobe_events syntax: the kernel logs it as trace_uprobe.
        let sub = if def.contains('/') {
            "trace_uprobe"
        } else {
            "trace_kprobe"
        };
        let want = format!(
            "{sub}: error: {text}\n  Command: {def}\n{}^\n",
            " ".repeat(11 + col)
        );
        assert!(err.contains(&want), "{def}:\n{err}\nwanted:\n{want}");
    }
    // A second probe on one event (the kernel appends it, trace_kprobe.c
    // append_trace_kprobe): refused when it is the same probe (SAME_PROBE, at the start) or
    // its arguments differ in name or type (DIFF_ARG_TYPE, under the first that differs), as
    // this kernel's uprobe_events refuses them; from the CLI, before anything runs.
    for (second, text, col) in [
        (
            "p:ev work a=%di",
            "There is already the exact same probe event",
            0,
        ),
        (
            "p:ev caller b=%di",
            "Argument type or name is different from existing probe",
            12,
        ),
        (
            "p:ev caller a=%di:u32",
            "Argument type or name is different from existing probe",
            12,
        ),
        (
            "p:ev caller",
            "Argument type or name is different from existing probe",
            12,
        ),
    ] {
        let (out, _) = trace(&["-e", "p:ev work a=%di", "-e", second], &[exe, "1"]);
        assert_eq!(out.status.code(), Some(1), "{second}");
        let err = String::from_utf8_lossy(&out.stderr);
        let want = format!(
            "trace_kprobe: error: {text}\n  Command: {second}\n{}^\n",
            " ".repeat(11 + col)
        );
        assert!(err.contains(&want), "{second}:\n{err}\nwanted:\n{want}");
    }
}
