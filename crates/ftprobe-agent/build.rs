//! libgcc_s.so.1 is a `DT_NEEDED` of the agent, whatever the Rust standard library links:
//! return hooks put probes on its unwinder entry points before `main`, and a C program
//! loads it only at its first `pthread_exit`, cancellation or `backtrace()` (too late to
//! restore the return addresses of the calls hooked meanwhile). Loaded by the dynamic linker
//! with the agent, it never goes through the program's `malloc` at an odd time.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--push-state,--no-as-needed,-lgcc_s,--pop-state");
}
