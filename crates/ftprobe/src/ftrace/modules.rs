//! Objects loaded and unloaded while the program runs: the kernel's `ftrace_module_init()` +
//! `ftrace_module_enable()` (a module's sites are found and converted to NOP before its init
//! code runs, then the registered ops that want them are applied) and `ftrace_release_mod()`
//! (a going module's records are dropped; its text is never written again).
//!
//! Other threads run meanwhile. What the probe path reads is replaced, never changed in
//! place: each registered ops gets a new hash and the site table a new copy, published with
//! a Release store; the old ones are kept (`State::retired`, and leaked site tables), so a
//! reader that loaded a pointer before the swap still reads live memory.

use super::*;

/// Find the sites of objects loaded after [`init`] (`dlopen`), convert them to NOP, and
/// patch those that registered ops want (their filters are applied again: a glob, or a
/// `:mod:` pattern naming an object that was not loaded yet, now selects the new
/// functions). Objects that cannot be read are skipped and returned as errors, as in
/// [`init`].
///
/// # Safety
/// No thread may run code of these objects until this returns: true in the dynamic linker's
/// notification after it mapped them and before it runs their initializers and returns
/// their handle from `dlopen` (the agent's `_dl_debug_state` hook). Every object's bias must
/// be its real load bias.
pub unsafe fn load_objects(objs: &[LoadedObject]) -> Result<Vec<FtraceError>, FtraceError> {
    let mut g = lock();
    let st = g.as_mut().ok_or(FtraceError::NotInitialized)?;
    let mut skipped = Vec::new();
    let mut sites: Vec<(u64, RecMeta)> = Vec::new();
    let mut exits = Vec::new();
    let first = st.objects.len();
    for lo in objs {
        match scan_object(lo, st.objects.len()) {
            Ok((o, s, x)) => {
                st.objects.push(o);
                sites.extend(s);
                exits.extend(x);
            }
            Err(e) => skipped.push(e),
        }
    }
    // The trampoline areas of unloaded objects that a new object's whole code can reach go
    // to it (they are never unmapped): a program that loads and unloads a library in a loop
    // reuses them instead of mapping an area per load (and `tramp_area::area_of` knows a
    // bounded number of areas).
    for ni in first..st.objects.len() {
        let (lo, hi) = st.objects[ni].text;
        if hi <= lo {
            continue;
        }
        let mut moved = Vec::new();
        for o in st.objects[..first].iter_mut().filter(|o| o.gone) {
            let (reach, keep): (Vec<TrampArea>, Vec<TrampArea>) = std::mem::take(&mut o.areas)
                .into_iter()
                .partition(|a| a.reachable_from(lo) && a.reachable_from(hi - 1));
            o.areas = keep;
            moved.extend(reach);
        }
        st.objects[ni].areas.extend(moved);
    }
    if sites.is_empty() && exits.is_empty() {
        // Nothing to convert, and no filter selects anything new (`hash_of`: a `:mod:`
        // pattern still matching no site selects nothing).
        return Ok(skipped);
    }
    let mut idle: Vec<(u64, [u8; 6], usize)> = sites
        .iter()
        .filter_map(|(ip, m)| super::idle_bytes(m).map(|(b, n)| (*ip, b, n)))
        .collect();
    idle.sort_unstable_by_key(|c| c.0);
    let changes: Vec<(u64, &[u8])> = idle.iter().map(|(ip, b, n)| (*ip, &b[..*n])).collect();
    // SAFETY: the sites are in the objects' code that, by this function's contract, no
    // thread runs yet, as at init. A CallGot site is 6 bytes, all of its own instruction.
    // An XRay sled is left as it is.
    unsafe { text_poke::text_poke_early_many(&changes)? };
    // Other threads have not run this code, but a core may hold stale instructions of what
    // was mapped there before (an object unloaded): serialize every thread before the code
    // is handed out, as `text_poke_batch` does between its steps.
    crate::sys::sync_core_all_threads()?;
    // Merge the new records into the sorted parallel vectors.
    let mut all: Vec<(DynFtrace, RecMeta, String, [u8; 5])> = std::mem::take(&mut st.records)
        .into_iter()
        .zip(std::mem::take(&mut st.meta))
        .zip(std::mem::take(&mut st.display))
        .zip(std::mem::take(&mut st.current))
        .map(|(((r, m), d), c)| (r, m, d, c))
        .collect();
    for (ip, m) in sites {
        let flags = if m.place == SitePlace::AfterPrologue {
            FTRACE_FL_AFTER_PROLOGUE
        } else {
            0
        };
        let o = &st.objects[m.obj];
        let display = crate::elf::display_name(&o.image.funcs()[m.func].name);
        let nop = m.nop;
        all.push((DynFtrace { ip, flags }, m, display, nop));
    }
    all.sort_by_key(|e| e.0.ip);
    for (r, m, d, c) in all {
        st.records.push(r);
        st.meta.push(m);
        st.display.push(d);
        st.current.push(c);
    }
    let mut x: Vec<(xray::XrayExit, [u8; 5])> = std::mem::take(&mut st.xray_exits)
        .into_iter()
        .zip(std::mem::take(&mut st.xray_current))
        .collect();
    x.extend(exits.into_iter().map(|e| {
        let orig = e.orig;
        (e, orig)
    }));
    x.sort_by_key(|e| e.0.addr);
    (st.xray_exits, st.xray_current) = x.into_iter().unzip();
    st.republish_site_table();
    st.rehash_registered();
    st.update_sites()?;
    Ok(skipped)
}

/// Forget objects that were unloaded (`dlclose`, after the dynamic linker unmapped them):
/// their records, XRay sleds and resolved indirect functions go; their code is never read
/// nor written (it is not mapped any more). Addresses in an ops' filter that were sites of
/// these objects are removed; an ops whose filter was only such addresses (kprobes' ops) is
/// unregistered rather than left with an empty filter, which would select every function.
/// Returns the executable ranges `(start, end)` of the objects forgotten.
pub fn unload_objects(objs: &[LoadedObject]) -> Result<Vec<(u64, u64)>, FtraceError> {
    let mut g = lock();
    let st = g.as_mut().ok_or(FtraceError::NotInitialized)?;
    let mut gone = Vec::new();
    let mut ranges = Vec::new();
    for (i, o) in st.objects.iter_mut().enumerate() {
        if !o.gone
            && objs
                .iter()
                .any(|lo| lo.bias == o.bias && lo.path == o.image.path)
        {
            o.gone = true;
            gone.push(i);
            ranges.push(o.text);
        }
    }
    if gone.is_empty() {
        return Ok(ranges);
    }
    let in_gone = |a: u64| ranges.iter().any(|&(lo, hi)| a >= lo && a < hi);
    let keep: Vec<bool> = st.meta.iter().map(|m| !gone.contains(&m.obj)).collect();
    let mut k = keep.iter();
    st.records.retain(|_| *k.next().expect("parallel"));
    let mut k = keep.iter();
    st.meta.retain(|_| *k.next().expect("parallel"));
    let mut k = keep.iter();
    st.display.retain(|_| *k.next().expect("parallel"));
    let mut k = keep.iter();
    st.current.retain(|_| *k.next().expect("parallel"));
    let keep: Vec<bool> = st
        .xray_exits
        .iter()
        .map(|e| !gone.contains(&e.obj))
        .collect();
    let mut k = keep.iter();
    st.xray_exits.retain(|_| *k.next().expect("parallel"));
    let mut k = keep.iter();
    st.xray_current.retain(|_| *k.next().expect("parallel"));
    st.ifunc_impls.retain(|s| !in_gone(s.addr));
    // Addresses of gone sites leave every registered ops' filter.
    let mut emptied = Vec::new();
    for &op in &st.registered {
        let mut f = op.lock_filters();
        let had = f.ips.len();
        f.ips.retain(|ip| !in_gone(*ip));
        f.direct.retain(|ip, _| !in_gone(*ip));
        if had > 0 && f.ips.is_empty() && f.filter.is_empty() && f.notrace.is_empty() {
            emptied.push(op);
        }
    }
    for op in emptied {
        st.registered.retain(|o| !std::ptr::eq(*o, op));
        if let Some(slot) = OPS_LIST
            .iter()
            .find(|s| std::ptr::eq(s.load(Ordering::Relaxed), op))
        {
            slot.store(std::ptr::null_mut(), Ordering::Release);
        }
        op.registered.store(false, Ordering::Relaxed);
        st.retire_hash(op);
    }
    st.republish_site_table();
    st.rehash_registered();
    st.update_sites()?;
    Ok(ranges)
}

impl State {
    /// Publish a new probe-path site table for the current records.
    fn republish_site_table(&mut self) {
        let mut nohijack: Vec<u64> = self.xray_exits.iter().map(|e| e.entry_ip).collect();
        nohijack.sort_unstable();
        nohijack.dedup();
        publish_site_table(&self.records, &self.meta, &self.objects, &nohijack);
    }

    /// Give every registered ops the hash its filters select among the current records.
    fn rehash_registered(&mut self) {
        for i in 0..self.registered.len() {
            let op = self.registered[i];
            let hash = self.hash_of(op);
            // Release pairs with the Acquire load in `FtraceOps::wants`.
            let prev = op
                .hash
                .swap(Box::into_raw(Box::new(hash)), Ordering::AcqRel);
            if !prev.is_null() {
                // SAFETY: prev came from Box::into_raw; `retired` keeps it for readers that
                // loaded it before the swap.
                self.retired.push(unsafe { Box::from_raw(prev) });
            }
        }
    }
}
