//! What both benches share: the timed loop over `fx_add` and the median of runs.

#![allow(dead_code)] // each bench uses its own subset

use std::hint::black_box;
use std::time::Instant;

use ftprobe_dev::fxsites::fx_add;

/// ns per call of `fx_add` over `n` calls.
#[inline(never)]
pub fn loop_fx_add(n: i64) -> f64 {
    let t = Instant::now();
    let mut acc = 0;
    for i in 0..n {
        // SAFETY: plain C function.
        acc += unsafe { fx_add(black_box(i), 1) };
    }
    black_box(acc);
    t.elapsed().as_nanos() as f64 / n as f64
}

/// (median, min, max) of `runs` calls of `run`.
pub fn median_of(runs: usize, mut run: impl FnMut() -> f64) -> (f64, f64, f64) {
    let mut v: Vec<f64> = (0..runs).map(|_| run()).collect();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (v[runs / 2], v[0], v[runs - 1])
}
