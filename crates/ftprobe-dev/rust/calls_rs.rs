//! The `calls` fixture in Rust, compiled by build.rs with
//! `RUSTC_BOOTSTRAP=1 rustc -Zpatchable-function-entry=5 -C opt-level=2`: LLVM puts one NOP5 at
//! every function entry of this crate and lists it in `__patchable_function_entries`.
//! `calls-rs N` calls `caller(N)` once from `run_calls`, which calls `work` N times; prints
//! `sum=<2N^2 - N>`.

use std::hint::black_box;

#[no_mangle]
#[inline(never)]
pub extern "C" fn work(a: i64, b: i64) -> i64 {
    black_box(a * 3 + b)
}

#[no_mangle]
#[inline(never)]
pub extern "C" fn caller(n: i64) -> i64 {
    (0..n).map(|i| work(black_box(i), i + 1)).sum()
}

#[no_mangle]
#[inline(never)]
pub extern "C" fn run_calls(n: i64) -> i64 {
    caller(black_box(n))
}

fn main() {
    let n = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(10);
    println!("sum={}", run_calls(n));
}
