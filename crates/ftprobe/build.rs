//! Links libiberty's C++ demangler (`cplus_demangle_v3_callback`, the code `c++filt` and
//! `perf` use) from the system's `libiberty.a` (Debian: `libiberty-dev`). Without it the build
//! stops and says what to install: a build that fell back silently to the `cpp_demangle`
//! crate (which gets some names wrong or not at all) printed other names from the same
//! source, and kept doing so after libiberty was installed. `FTPROBE_NO_LIBIBERTY=1` asks for
//! that crate explicitly.

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
        None => {
            eprintln!(
                "error: libiberty.a not found (the C compiler's -print-file-name=libiberty.a).\n\
                 ftprobe demangles C++ names with libiberty's demangler, as c++filt does.\n\
                 Install it (Debian: apt-get install libiberty-dev, or scripts/deps.sh build),\n\
                 or build with FTPROBE_NO_LIBIBERTY=1 for the cpp_demangle crate, which gets\n\
                 some names wrong."
            );
            std::process::exit(1);
        }
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
