//! Links libiberty's C++ demangler (`cplus_demangle_v3_callback`, the code `c++filt` and
//! `perf` use) from the system's `libiberty.a` (Debian: `libiberty-dev`). Without it, C++
//! names are demangled by the `cpp_demangle` crate, which gets some of them wrong or not at
//! all (`ftprobe::demangle` says which), and the build says so.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=FTPROBE_NO_LIBIBERTY");
    println!("cargo:rustc-check-cfg=cfg(ftprobe_libiberty)");
    if std::env::var_os("FTPROBE_NO_LIBIBERTY").is_some() {
        return;
    }
    match find_libiberty() {
        Some(lib) => {
            let dir = lib.parent().expect("a file has a directory");
            println!("cargo:rerun-if-changed={}", lib.display());
            println!("cargo:rustc-link-search=native={}", dir.display());
            println!("cargo:rustc-link-lib=static=iberty");
            println!("cargo:rustc-cfg=ftprobe_libiberty");
        }
        None => println!(
            "cargo:warning=libiberty.a not found (Debian: apt-get install libiberty-dev): \
             C++ names are demangled by the cpp_demangle crate, which gets some wrong"
        ),
    }
}

/// `libiberty.a` where the C compiler finds libraries (gcc prints the bare name when it
/// has none).
fn find_libiberty() -> Option<PathBuf> {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let out = Command::new(cc)
        .arg("-print-file-name=libiberty.a")
        .output()
        .ok()?;
    let path = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    (path.is_absolute() && path.is_file()).then_some(path)
}
