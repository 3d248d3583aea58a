//! The C API as a C or C++ program uses it: install it (scripts/install-capi.sh, with the
//! libraries this `cargo test` built) into a fresh prefix, build the examples
//! (examples/c/kprobe_self.c, examples/cxx/kprobe_self.cc) with `-Wall -Wextra -Werror`
//! against the installed header and library through pkg-config, shared and static, run
//! them, and check what they print against counts worked out here from N (the programs
//! check their handlers against their own calls too, and exit 1 on a mismatch).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Calls of each probed function in the examples' main loop.
const N: u64 = 500;

fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The directory cargo put this build's libraries in: `target/<profile>/deps` (where `cargo
/// test` leaves them, beside this test binary), or `target/<profile>` (where `cargo build`
/// copies them).
fn built_libdir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("target/<profile>/deps").to_path_buf();
    let libs = ["libftprobe_c.so", "libftprobe_c.a"];
    let candidates = [
        deps.clone(),
        deps.parent().expect("target/<profile>").to_path_buf(),
    ];
    candidates
        .iter()
        .find(|d| libs.iter().all(|l| d.join(l).is_file()))
        .unwrap_or_else(|| {
            panic!(
                "libftprobe_c.so and .a in none of {candidates:?} (cargo builds the cdylib and \
                 staticlib with the tests)"
            )
        })
        .clone()
}

/// The prefix the C API is installed into, once per test process.
fn prefix() -> &'static Path {
    static PREFIX: OnceLock<PathBuf> = OnceLock::new();
    PREFIX.get_or_init(|| {
        // One fixed directory, emptied first: the libraries are large (the static one
        // ~100 MB in a debug build), so runs do not pile up copies.
        let prefix = Path::new(env!("CARGO_TARGET_TMPDIR")).join("capi-prefix");
        let _ = std::fs::remove_dir_all(&prefix);
        let script = crate_dir().join("../../scripts/install-capi.sh");
        let out = Command::new("bash")
            .arg(&script)
            .arg(&prefix)
            .env("FTPROBE_CAPI_LIBDIR", built_libdir())
            .output()
            .expect("run install-capi.sh");
        assert!(
            out.status.success(),
            "install-capi.sh failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        for f in [
            "include/ftprobe.h",
            "lib/libftprobe.so",
            "lib/libftprobe.a",
            "lib/pkgconfig/ftprobe.pc",
            "lib/pkgconfig/ftprobe-static.pc",
        ] {
            assert!(prefix.join(f).is_file(), "{f} not installed");
        }
        prefix
    })
}

/// `pkg-config ARGS` against the installed prefix, split into words.
fn pkg_config(args: &[&str]) -> Vec<String> {
    let out = Command::new("pkg-config")
        .args(args)
        .env("PKG_CONFIG_PATH", prefix().join("lib/pkgconfig"))
        .output()
        .expect("run pkg-config (Debian: apt-get install pkg-config)");
    assert!(
        out.status.success(),
        "pkg-config {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("UTF-8")
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

#[derive(Clone, Copy, Debug)]
enum Lang {
    C,
    Cxx,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Link {
    Shared,
    Static,
}

/// Build the example for `lang` linked `link`-ly; returns the program.
fn build(lang: Lang, link: Link) -> PathBuf {
    let (compiler, src, std) = match lang {
        Lang::C => ("gcc", "examples/c/kprobe_self.c", "-std=gnu11"),
        Lang::Cxx => ("g++", "examples/cxx/kprobe_self.cc", "-std=c++17"),
    };
    let flags = match link {
        Link::Shared => pkg_config(&["--cflags", "--libs", "ftprobe"]),
        Link::Static => pkg_config(&["--static", "--cflags", "--libs", "ftprobe-static"]),
    };
    let exe = prefix().join(format!("kprobe_self-{lang:?}-{link:?}"));
    let out = Command::new(compiler)
        .args([std, "-O2", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg(crate_dir().join(src))
        .args(&flags)
        .output()
        .expect("run the compiler");
    assert!(
        out.status.success(),
        "{compiler} {src} {flags:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // readelf says how it was linked: the shared build needs libftprobe.so (by its SONAME),
    // the static one does not.
    let dynamic = Command::new("readelf")
        .arg("-d")
        .arg(&exe)
        .output()
        .expect("run readelf");
    let needs_lib = String::from_utf8_lossy(&dynamic.stdout).contains("[libftprobe.so]");
    assert_eq!(
        needs_lib,
        link == Link::Shared,
        "{exe:?} NEEDED libftprobe.so"
    );
    exe
}

/// What the example prints for N calls: its own arithmetic, done here independently.
fn expected(n: u64) -> String {
    let s1 = n * (n + 1) / 2;
    format!(
        "register_kprobe(no_such_function_here) = -{enoent} (-ENOENT)\n\
         register_kprobe(symbol_name and addr) = -{einval} (-EINVAL)\n\
         add_site: ftrace, mul_plain: int3\n\
         kprobe add_site: hits={} sum_di={} sum_si={} nmissed=0\n\
         kprobe mul_plain: pre={} post={} sum_di={} nmissed=0\n\
         kretprobe sub_plain: entries={n} returns={n} sum_ax={} nmissed=0\n\
         ftrace_ops: traced_a={n} traced_b=0 other=0\n\
         ok\n",
        // N calls, none while disabled, one after enable_kprobe: add_site(1, 1).
        n + 1,
        s1 + 1,
        2 * s1 + 1,
        // N calls, and mul_plain(1000, 1) after registering the same struct again.
        n + 1,
        n + 1,
        s1 + 1000,
        // sub_plain(10 i, i) = 9 i.
        9 * s1,
        enoent = libc_errno("ENOENT"),
        einval = libc_errno("EINVAL"),
    )
}

/// The errno values from the system's header, through the C compiler (not from Rust's libc
/// crate, which the library itself uses).
fn libc_errno(name: &str) -> i32 {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "printf '#include <errno.h>\\n{name}\\n' | gcc -E -P -x c - | tail -n1"
        ))
        .output()
        .expect("run gcc -E");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{name}: {:?}", String::from_utf8_lossy(&out.stdout)))
}

fn run(lang: Lang, link: Link) {
    let exe = build(lang, link);
    let out = Command::new(&exe)
        .arg(N.to_string())
        .env("LD_LIBRARY_PATH", prefix().join("lib"))
        .output()
        .expect("run the example");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{exe:?} exited {:?}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout, expected(N), "{exe:?}");
}

#[test]
fn c_shared() {
    run(Lang::C, Link::Shared);
}

#[test]
fn c_static() {
    run(Lang::C, Link::Static);
}

#[test]
fn cxx_shared() {
    run(Lang::Cxx, Link::Shared);
}

#[test]
fn cxx_static() {
    run(Lang::Cxx, Link::Static);
}

/// A program that registers a kprobe with no `ftprobe_init()` call (as kernel code does:
/// the kernel's API has none): with `thread` as its argument it creates a thread first.
const NO_INIT: &str = r#"
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <ftprobe.h>
__attribute__((noipa)) long plain(long x) { return x * 3; }
static unsigned long hits;
static int pre(struct kprobe *p, struct pt_regs *regs) {
    (void)p; (void)regs;
    __atomic_fetch_add(&hits, 1, __ATOMIC_RELAXED);
    return 0;
}
static void *idle(void *a) { (void)a; pause(); return 0; }
int main(int argc, char **argv) {
    pthread_t t;
    if (argc > 1 && !strcmp(argv[1], "thread")) pthread_create(&t, 0, idle, 0);
    struct kprobe kp = {.symbol_name = "plain", .pre_handler = pre};
    int r = register_kprobe(&kp);
    if (r) {
        printf("register_kprobe = %d (%s): %s\n", r, r == -EINVAL ? "-EINVAL" : "?",
               ftprobe_last_error());
        return 0;
    }
    long s = 0;
    for (long i = 0; i < 1000; i++) s += plain(i);
    printf("hits=%lu s=%ld\n", __atomic_load_n(&hits, __ATOMIC_RELAXED), s);
    return 0;
}
"#;

/// Issue 26, item 11: the first registration initialises ftprobe when the process has one
/// thread (it said "call ftrace::init first", a Rust name); with a thread running it is
/// refused, and the text names `ftprobe_init()`.
#[test]
fn registration_without_ftprobe_init() {
    let src = prefix().join("no_init.c");
    std::fs::write(&src, NO_INIT).unwrap();
    let exe = prefix().join("no_init");
    let flags = pkg_config(&["--cflags", "--libs", "ftprobe"]);
    let out = Command::new("gcc")
        .args(["-O2", "-pthread", "-o"])
        .arg(&exe)
        .arg(&src)
        .args(&flags)
        .output()
        .expect("run gcc");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = |args: &[&str]| {
        let o = Command::new(&exe)
            .args(args)
            .env("LD_LIBRARY_PATH", prefix().join("lib"))
            .output()
            .expect("run no_init");
        assert!(o.status.success(), "{o:?}");
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    assert_eq!(run(&[]), format!("hits=1000 s={}\n", 3 * 999 * 1000 / 2));
    let refused = run(&["thread"]);
    assert!(
        refused.starts_with("register_kprobe = ") && refused.contains("(-EINVAL)"),
        "{refused}"
    );
    assert!(
        refused.contains("call ftprobe_init() at the start of main"),
        "{refused}"
    );
    assert!(!refused.contains("ftrace::init"), "{refused}");
}
