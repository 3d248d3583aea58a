//! A Rust program whose panics unwind through hooked C frames (fgraph, issue 11), built at
//! test time with the stable rustc against `c/fgraph_panic.c` (a static library). Round i:
//! `fx_outer` -> `fx_mid` -> Rust `cb`, which panics when i % 3 == 1, or calls `fx_inner`
//! whose callback `cb2` panics when i % 3 == 2; `catch_unwind` catches every panic. The
//! panic hook prints the message and (with RUST_BACKTRACE=1) a backtrace through the hooked
//! frames to stderr. Prints `ok i v` / `caught i`, then the C side's call tree.

use std::ffi::{c_char, c_int, CStr};

type Cb = extern "C-unwind" fn(c_int) -> c_int;

extern "C-unwind" {
    fn fx_outer(n: c_int, cb: Cb) -> c_int;
    fn fx_inner(n: c_int, cb: Cb) -> c_int;
}
extern "C" {
    fn fx_depth() -> c_int;
    fn fx_cut_to(d: c_int);
    fn fx_log() -> *const c_char;
}

extern "C-unwind" fn cb2(n: c_int) -> c_int {
    if n % 3 == 2 {
        panic!("cb2 panics at {n}");
    }
    n * 3
}

extern "C-unwind" fn cb(n: c_int) -> c_int {
    if n % 3 == 1 {
        panic!("cb panics at {n}");
    }
    // SAFETY: the C function with its callback.
    unsafe { fx_inner(n, cb2) }
}

fn main() {
    let n: c_int = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(6);
    for i in 0..n {
        // SAFETY: plain C calls.
        let d = unsafe { fx_depth() };
        // SAFETY: the C function with a callback that may unwind ("C-unwind").
        match std::panic::catch_unwind(|| unsafe { fx_outer(i, cb) }) {
            Ok(v) => println!("ok {i} {v}"),
            Err(_) => {
                println!("caught {i}");
                // SAFETY: plain C call.
                unsafe { fx_cut_to(d) };
            }
        }
    }
    // SAFETY: a NUL-terminated static buffer.
    let log = unsafe { CStr::from_ptr(fx_log()) };
    print!("{}", log.to_string_lossy());
}
