//! Issue 25, item 3: ftprobe can be installed. `cargo install --path crates/ftprobe-cli` and a
//! copy of the installed binary elsewhere both trace a program (the release binary carries the
//! agent and writes it out, 0700, in the user's cache), `scripts/install.sh PREFIX` installs
//! the binary beside its agent and the C API, and no installed file carries debug info.
//! Release builds take minutes: the stress tier (`.ci/run` runs it with `--ignored`).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::tmp_dir;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A target directory of its own (kept between runs: a warm rebuild takes seconds).
fn target_dir() -> PathBuf {
    repo().join("target/install-test")
}

fn cargo() -> Command {
    let mut c = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    c.env("CARGO_TARGET_DIR", target_dir()).current_dir(repo());
    c
}

fn run_ok(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `ftprobe trace -F churn_mid -- churn 1 3 0 4` with `exe` (the user's cache at `cache`): the
/// number of `churn_mid` calls traced, and the number the program made.
fn traced_mid_calls(exe: &Path, cache: &Path) -> (usize, u64) {
    let churn = ftprobe_dev::churn_fixture();
    let out = Command::new(exe)
        .env_remove("FTPROBE_AGENT")
        .env("XDG_CACHE_HOME", cache)
        .args(["trace", "-F", "churn_mid", "--"])
        .arg(&churn)
        .args(["1", "3", "0", "4"])
        .output()
        .unwrap();
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{exe:?}: {}\n{se}\n{so}", out.status);
    let traced = so.lines().filter(|l| l.contains(": churn_mid <-")).count();
    let said = so
        .lines()
        .find_map(|l| l.split_once("mid=").map(|(_, r)| r))
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no counts from churn: {so}"));
    (traced, said)
}

/// The names of `path`'s debug sections (`.debug_*`, `.zdebug_*`).
fn debug_sections(path: &Path) -> Vec<String> {
    use object::{Object, ObjectSection};
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    file.sections()
        .filter_map(|s| s.name().ok().map(str::to_owned))
        .filter(|n| n.starts_with(".debug_") || n.starts_with(".zdebug_"))
        .collect()
}

#[test]
#[ignore = "stress tier: release builds (minutes); .ci/run runs it with --ignored"]
fn cargo_install_and_a_copied_binary_trace_a_program() {
    let tmp = tmp_dir("install");
    let root = tmp.join("root");
    run_ok(
        cargo()
            .args([
                "install",
                "--quiet",
                "--path",
                "crates/ftprobe-cli",
                "--root",
            ])
            .arg(&root),
    );
    let exe = root.join("bin/ftprobe");
    assert!(
        !root.join("lib").exists(),
        "cargo install puts only the binary"
    );
    assert_eq!(debug_sections(&exe), Vec::<String>::new());

    let cache = tmp.join("cache");
    let (traced, said) = traced_mid_calls(&exe, &cache);
    assert_eq!(traced as u64, said);
    // The agent it wrote out: private, no debug info, and reused by the next run.
    let dirs: Vec<PathBuf> = std::fs::read_dir(cache.join("ftprobe"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    let agent = dirs[0].join("libftprobe_agent.so");
    for d in [cache.join("ftprobe"), dirs[0].clone()] {
        let mode = std::fs::metadata(&d).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "{}", d.display());
    }
    assert_eq!(debug_sections(&agent), Vec::<String>::new());
    let written = std::fs::metadata(&agent).unwrap().modified().unwrap();

    // A copy elsewhere, with nothing beside it.
    let copy = tmp.join("elsewhere/ftprobe");
    std::fs::create_dir_all(copy.parent().unwrap()).unwrap();
    std::fs::copy(&exe, &copy).unwrap();
    let (traced, said) = traced_mid_calls(&copy, &cache);
    assert_eq!(traced as u64, said);
    assert_eq!(
        std::fs::metadata(&agent).unwrap().modified().unwrap(),
        written,
        "the agent written out once is reused"
    );

    // A cache directory others may write to is refused, with the reason.
    let open = tmp.join("open");
    std::fs::create_dir_all(open.join("ftprobe")).unwrap();
    std::fs::set_permissions(open.join("ftprobe"), std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = Command::new(&copy)
        .env_remove("FTPROBE_AGENT")
        .env("XDG_CACHE_HOME", &open)
        .args(["trace", "--", "/bin/true"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("others cannot write"),
        "{err}"
    );

    // scripts/install.sh: the binary finds the agent in ../lib, the C API is there too.
    let prefix = tmp.join("prefix");
    run_ok(
        Command::new(repo().join("scripts/install.sh"))
            .env("CARGO_TARGET_DIR", target_dir())
            .arg(&prefix),
    );
    for f in [
        "bin/ftprobe",
        "lib/libftprobe_agent.so",
        "lib/libftprobe.so",
        "include/ftprobe.h",
    ] {
        assert!(prefix.join(f).exists(), "{f}");
    }
    for f in ["bin/ftprobe", "lib/libftprobe_agent.so"] {
        assert_eq!(debug_sections(&prefix.join(f)), Vec::<String>::new(), "{f}");
    }
    let cache2 = tmp.join("cache2");
    let (traced, said) = traced_mid_calls(&prefix.join("bin/ftprobe"), &cache2);
    assert_eq!(traced as u64, said);
    assert!(
        !cache2.exists(),
        "the installed agent is used, none written out"
    );
    let _ = std::fs::remove_dir_all(&tmp);
}

/// Issue 25, item 2: a build without libiberty stops and says what to install (a build that
/// fell back to another demangler printed other names from the same source, and kept them
/// after libiberty was installed). Here the C compiler says it has no `libiberty.a`.
#[test]
#[ignore = "stress tier: a build of the engine (minutes); .ci/run runs it with --ignored"]
fn a_build_without_libiberty_stops_and_says_what_to_install() {
    let tmp = tmp_dir("nolib");
    let cc = tmp.join("cc-without-libiberty");
    std::fs::write(
        &cc,
        "#!/bin/sh\n[ \"$1\" = -print-file-name=libiberty.a ] && { echo libiberty.a; exit 0; }\n\
         exec cc \"$@\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&cc, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = cargo()
        .env("CARGO_TARGET_DIR", repo().join("target/nolib-test"))
        .env("CC", &cc)
        .env_remove("FTPROBE_NO_LIBIBERTY")
        .args(["build", "--quiet", "-p", "ftprobe"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("libiberty.a not found") && err.contains("apt-get install libiberty-dev"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&tmp);
}
