//! The shared library's SONAME is `libftprobe.so`, the name it is installed under (the Rust
//! library is `ftprobe_c`, see Cargo.toml), so a program linked against it records that name.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libftprobe.so");
}
