//! `ftprobe trace` end to end: fixtures in every site flavour and the real Lua build, run under
//! the CLI with the preloaded agent; exact counts against the fixtures' known call counts.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use ftprobe_dev::{fixture, lua, lua_script, rust_fixture, Flavour, LuaBuild, LUA_TABLES_CREATED};

fn ftprobe() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ftprobe"))
}

/// Run `ftprobe trace ARGS -o TMP -- CMD`; returns (the CLI's output, the trace text).
fn trace(args: &[&str], cmd: &[&str]) -> (Output, String) {
    let dir = std::env::temp_dir().join(format!("ftprobe-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out_file = dir.join(format!("trace-{}.txt", rand_suffix()));
    let out = ftprobe()
        .arg("trace")
        .args(args)
        .arg("-o")
        .arg(&out_file)
        .arg("--")
        .args(cmd)
        .output()
        .expect("run ftprobe");
    let text = std::fs::read_to_string(&out_file).unwrap_or_default();
    let _ = std::fs::remove_file(&out_file);
    (out, text)
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// Event lines (not `#` comments) whose function part is exactly `func_line`
/// (`work <-caller`).
fn count(text: &str, func_line: &str) -> usize {
    events(text)
        .filter(|l| l.split_once(": ").map(|x| x.1) == Some(func_line))
        .count()
}

fn events(text: &str) -> impl Iterator<Item = &str> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
}

fn untraced(cmd: &[&str]) -> Output {
    Command::new(cmd[0]).args(&cmd[1..]).output().unwrap()
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
        .find(|l| l.starts_with("work "))
        .unwrap_or_else(|| panic!("{list}"));
    let cols: Vec<&str> = work.split_whitespace().collect();
    assert_eq!(
        &cols[1..],
        ["work+0x0", "nop5", "entry", "__patchable_function_entries"]
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
    // libc.so.6 is stripped of its local symbols: main's caller prints as an address.
    assert!(
        events(&text).any(|l| l.split_once(": ").unwrap().1.starts_with("main <-0x7f")),
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
    let out = ftprobe()
        .args(["trace", "-o", "/dev/null", "--", "sh", "-c", "exit 3"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let out = ftprobe()
        .args([
            "trace",
            "-o",
            "/dev/null",
            "--",
            "sh",
            "-c",
            "kill -SEGV $$",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(128 + 11));
    let mut child = ftprobe()
        .args([
            "trace",
            "-o",
            "/dev/null",
            "--",
            "sh",
            "-c",
            "cat; echo err >&2",
        ])
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
    assert_eq!(out.stderr, b"err\n");
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
    // A glob that matches nothing: the agent says so and the program runs untraced.
    let (out, text) = trace(&["-F", "no_such_function"], &[exe, "3"]);
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "sum=15\n");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("ftprobe-agent: no function with an ftrace site matches \"no_such_function\""),
        "{err}"
    );
    assert_eq!(events(&text).count(), 0);
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
            .find(|l| l.starts_with("work "))
            .unwrap_or_else(|| panic!("{text}"));
        let cols: Vec<&str> = work.split_whitespace().collect();
        assert_eq!(
            cols[1],
            format!("work+{:#x}", fl.site_offset()),
            "{}",
            fl.name()
        );
        let kind = match (fl.site_len(), fl.has_record_section(), fl.name()) {
            (6, _, _) => "call*got",
            (_, _, n) if n.starts_with("patchable") => "nop1x5",
            (_, _, n) if n.contains("nop") => "nop5",
            _ => "call",
        };
        assert_eq!(cols[2], kind, "{}", fl.name());
        let source = if !fl.has_record_section() {
            "decoded"
        } else if fl.name().starts_with("patchable") {
            "__patchable_function_entries"
        } else {
            "__mcount_loc"
        };
        assert_eq!(cols[4], source, "{}", fl.name());
        assert!(
            !text.lines().any(|l| l.starts_with("leaf_unused ")) || text.contains("leaf_unused+")
        );
    }
    assert!(Path::new(env!("CARGO_BIN_EXE_ftprobe")).exists());
}
