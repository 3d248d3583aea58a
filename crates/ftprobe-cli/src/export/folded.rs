//! Folded stacks (`dump --flame-graph`): `a;b;c N` per distinct stack, N its self time in
//! ns (see [`crate::dump`]).

use anyhow::{bail, Result};
use rustc_hash::FxHashMap;

use crate::recording::Recording;
use crate::symbols::name_of;

/// Folded stacks of a function_graph recording: (stack, self ns), sorted by stack.
pub fn stacks(rec: &mut Recording) -> Result<Vec<(String, u64)>> {
    if rec.info.tracer != "function_graph" {
        bail!(
            "a flame graph needs a function_graph recording (this one is {}): record with -t function_graph",
            rec.info.tracer
        );
    }
    let mut syms = rec.symbols();
    let mut stacks: FxHashMap<String, u64> = FxHashMap::default();
    let ids: Vec<u32> = rec.ring_ids();
    for i in ids {
        rec.select_stream(&mut syms, i);
        rec.calls(i, |c, callers| {
            // A call whose return was lost in a gap has no known time.
            if c.self_ns == 0 || c.lost_return {
                return;
            }
            let mut s = String::new();
            for &f in callers {
                s.push_str(&name_of(&mut syms, f));
                s.push(';');
            }
            s.push_str(&name_of(&mut syms, c.func));
            *stacks.entry(s).or_default() += c.self_ns;
        })?;
    }
    let mut v: Vec<(String, u64)> = stacks.into_iter().collect();
    v.sort();
    Ok(v)
}
