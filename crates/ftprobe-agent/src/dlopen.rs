//! Objects loaded and unloaded while the program runs (`dlopen`, `dlmopen`, `dlclose`, and
//! the C library's own `dlopen`s: iconv modules, NSS, libgcc_s).
//!
//! The hook: the dynamic linker's debugger interface (`struct r_debug` in `<link.h>`). The
//! loader calls the empty function at `_r_debug.r_brk` (glibc's `_dl_debug_state`) around
//! every change of its object lists: `RT_ADD` before mapping new objects, `RT_CONSISTENT`
//! once they are mapped and listed (in `dlopen`, glibc's `dl_open_worker_begin`: before it
//! relocates them, makes them visible to `dlsym` and runs their initializers),
//! `RT_DELETE` before unmapping (their destructors have run) and `RT_CONSISTENT` again once
//! they are unmapped (also when a failed `dlopen` unloads what it mapped). This is what gdb breaks on, and the in-process analogue of
//! the kernel's module notifier (MODULE_STATE_COMING before the module's init, GOING).
//!
//! At start the agent replaces `_dl_debug_state`'s first instruction by a `jmp` to a stub
//! near ld.so that jumps to [`debug_state_hook`], an ordinary C-ABI function called with
//! the loader's lock held, on the thread that loads or unloads, and returning to the loader
//! as `_dl_debug_state` would have. Each call compares the loaded objects (`dl_iterate_phdr`
//! for the base namespace, the loader's `r_debug` chain for the others) with the last list: new ones are scanned and their sites converted
//! (`ftrace::load_objects`: no thread can run their code yet), pending and GONE kprobe events
//! that name them are armed (`trace_kprobe::objects_loaded`), and they are appended to the
//! rings' objects table for the CLI's symbols; objects no longer listed are unmapped
//! already: their probes become GONE and their sites are forgotten, never written
//! (`kprobes::objects_unloaded`). Because the comparison is of lists, calls where nothing
//! changed (`RT_ADD`, `RT_DELETE`) do nothing.
//!
//! Rejected: interposing `dlopen` (constructors run inside it, before it returns; and the
//! C library's internal loads do not go through the interposed symbol), `LD_AUDIT`'s
//! `la_objopen` (a second library the CLI would have to pass and hide from the program's
//! children, loaded in a namespace of its own with its own libc), an int3 kprobe on
//! `_dl_debug_state` (the work, which opens and parses files and patches code, would run in
//! the SIGTRAP handler with signals blocked), and glibc's SystemTap probes
//! (`reloc_complete`, `unmap_complete`: exact but NOPs that need an int3 too).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use ftprobe::process::LoadedObject;
use ftprobe::{ftrace, kprobes, trace, trace_kprobe};

/// `struct r_debug` of `<link.h>` (the fields of version 1, which every glibc has).
#[repr(C)]
struct RDebug {
    r_version: i32,
    r_map: *mut libc::c_void,
    r_brk: usize,
    r_state: i32,
    r_ldbase: usize,
}

extern "C" {
    /// The dynamic linker's debugger rendezvous (ld.so, `GLIBC_2.2.5`).
    static _r_debug: RDebug;
}

/// The objects as last seen (the agent left out).
static KNOWN: Mutex<Vec<LoadedObject>> = Mutex::new(Vec::new());
/// The agent's own load base, left out of every list.
static OWN_BASE: AtomicU64 = AtomicU64::new(u64::MAX);
/// A call of the hook is running (on the loader's lock: at most one thread); nested calls
/// (the hook's own work loading something) do nothing.
static BUSY: AtomicBool = AtomicBool::new(false);
/// kprobe events were asked for: the armed-probes listing is written again after a change.
static EVENTS: AtomicBool = AtomicBool::new(false);

/// The objects loaded now, the agent left out: the base namespace's (`dl_iterate_phdr`,
/// which reports only its caller's namespace), then those of the other namespaces
/// (`dlmopen`), from the loader's own lists.
fn loaded() -> Vec<LoadedObject> {
    let own = OWN_BASE.load(Ordering::Relaxed);
    let mut all = ftprobe::process::loaded_objects();
    all.extend(other_namespaces());
    all.retain(|o| o.bias != own);
    all
}

/// The public head of glibc's `struct link_map` (`<link.h>`).
#[repr(C)]
struct LinkMap {
    l_addr: u64,
    l_name: *const libc::c_char,
    l_ld: *const libc::c_void,
    l_next: *const LinkMap,
    l_prev: *const LinkMap,
}

/// The objects of the namespaces other than the base one. glibc 2.35 and later chain each
/// namespace's `r_debug` after `_r_debug` (`struct r_debug_extended`: `r_version` 2, the
/// next namespace's right after the version 1 fields); older ones have no such list.
fn other_namespaces() -> Vec<LoadedObject> {
    let mut out = Vec::new();
    // SAFETY: `_r_debug` is the loader's, and this runs in the loader's notification with
    // its lock held (or at start, single-threaded): the lists are consistent and stay so.
    let base = unsafe { &*std::ptr::addr_of!(_r_debug) };
    if base.r_version < 2 {
        return out;
    }
    // SAFETY: with r_version >= 2, `_r_debug` is the head of an `r_debug_extended`, whose
    // `r_next` pointer follows the version 1 fields.
    let mut next = unsafe { *(std::ptr::addr_of!(_r_debug).add(1) as *const *const RDebug) };
    let mut guard = 0;
    while !next.is_null() && guard < 64 {
        guard += 1;
        // SAFETY: a namespace's r_debug, linked by the loader (see above).
        let r = unsafe { &*next };
        let mut l = r.r_map as *const LinkMap;
        let mut n = 0;
        while !l.is_null() && n < 4096 {
            n += 1;
            // SAFETY: a link_map of that namespace's list.
            let m = unsafe { &*l };
            if !m.l_name.is_null() {
                // SAFETY: a NUL-terminated name owned by the loader.
                let name = unsafe { std::ffi::CStr::from_ptr(m.l_name) }.to_bytes();
                if name.starts_with(b"/") {
                    out.push(LoadedObject {
                        path: std::path::PathBuf::from(
                            <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(name),
                        ),
                        bias: m.l_addr,
                    });
                }
            }
            l = m.l_next;
        }
        // SAFETY: as above: the next `r_debug_extended` of the chain, or null.
        next = unsafe { *(next.add(1) as *const *const RDebug) };
    }
    out
}

/// Remember the objects ftrace was started with and install the hook. Called from the
/// agent's start, while only this thread runs.
/// `stopped_ips`: where the other threads of an attached process resume (none may be inside
/// the five bytes).
pub fn init(
    objects: &[LoadedObject],
    own_base: Option<u64>,
    events: bool,
    stopped_ips: &[u64],
) -> Result<(), String> {
    OWN_BASE.store(own_base.unwrap_or(u64::MAX), Ordering::Relaxed);
    EVENTS.store(events, Ordering::Relaxed);
    let mut known = objects.to_vec();
    known.extend(other_namespaces());
    *KNOWN.lock().unwrap_or_else(|e| e.into_inner()) = known;
    init_hook(stopped_ips)
}

/// An attach refused after ftrace was started with `objects` but before [`init`] ran:
/// a later session's [`sync_objects`] starts from them (not from nothing, which would
/// load them into ftrace a second time).
pub fn remember(objects: &[LoadedObject]) {
    let mut known = KNOWN.lock().unwrap_or_else(|e| e.into_inner());
    if known.is_empty() {
        *known = objects.to_vec();
        known.extend(other_namespaces());
    }
}

/// [`init`]'s hook in `_dl_debug_state`.
fn init_hook(stopped_ips: &[u64]) -> Result<(), String> {
    // SAFETY: `_r_debug` is ld.so's, initialized before any object's code runs; r_brk is
    // written once at start-up (read here by value).
    let brk = unsafe { std::ptr::addr_of!(_r_debug.r_brk).read_volatile() } as u64;
    if brk == 0 {
        return Err("the dynamic linker's r_debug has no r_brk".into());
    }
    let mut bytes = [0u8; 5];
    let unexpected = |bytes: [u8; 5]| {
        format!("_dl_debug_state at {brk:#x} holds {bytes:02x?}, not an empty function")
    };
    if ftprobe::sys::read_nofault(brk, &mut bytes) != 5 || !patchable(brk, &bytes) {
        return Err(unexpected(bytes));
    }
    if stopped_ips.iter().any(|&ip| ip > brk && ip < brk + 5) {
        return Err(format!(
            "a thread is stopped inside _dl_debug_state at {brk:#x}"
        ));
    }
    let target = debug_state_hook as extern "C" fn() as usize as u64;
    // `jmp *0(%rip)` + the hook's address: reaches it wherever the agent is mapped.
    let stub = ftrace::alloc_code_near(brk, 14, |_| {
        let mut code = vec![0xff, 0x25, 0, 0, 0, 0];
        code.extend_from_slice(&target.to_le_bytes());
        code
    })
    .map_err(|e| e.to_string())?;
    let rel = stub.wrapping_sub(brk + 5) as i64;
    let rel = i32::try_from(rel).map_err(|_| format!("no stub within reach of {brk:#x}"))?;
    let mut jmp = [0xe9, 0, 0, 0, 0];
    jmp[1..].copy_from_slice(&rel.to_le_bytes());
    ftrace::check_code(brk).map_err(|e| e.to_string())?;
    // SAFETY: only this thread runs (the agent's start), and no loader call is in progress
    // (the agent starts from an initializer, outside `_dl_debug_state`); the five bytes are
    // `_dl_debug_state`'s own (`endbr64; ret`, or `ret` and alignment padding nothing
    // executes), in ld.so's code.
    unsafe { ftprobe::arch::x86_64::text_poke::text_poke_early(brk, &jmp) }
        .map_err(|e| e.to_string())?;
    *HOOKED.lock().unwrap_or_else(|e| e.into_inner()) = Some((brk, bytes));
    Ok(())
}

/// `_dl_debug_state` and its own five bytes, while the hook is in place.
static HOOKED: std::sync::Mutex<Option<(u64, [u8; 5])>> = std::sync::Mutex::new(None);

/// Put `_dl_debug_state`'s own bytes back (an attached agent's detach: every other thread
/// is stopped; a thread stopped in the hook or its stub goes on there, they stay mapped).
pub fn unhook() {
    if let Some((brk, bytes)) = HOOKED.lock().unwrap_or_else(|e| e.into_inner()).take() {
        // SAFETY: every other thread is stopped by the CLI (the detach call), none inside
        // these five bytes (a `jmp` of ours: one instruction). A failed write leaves the
        // hook (its stub goes on calling into the agent, which stays mapped).
        let _ = unsafe { ftprobe::arch::x86_64::text_poke::text_poke_early(brk, &bytes) };
    }
}

/// Whether the 5 bytes at `addr` can take the `jmp`: `endbr64; ret`, or `ret` at a
/// 16-byte boundary followed by alignment padding (NOPs or int3), the rest of a 16-byte
/// block no other function starts in.
fn patchable(addr: u64, b: &[u8; 5]) -> bool {
    if *b == [0xf3, 0x0f, 0x1e, 0xfa, 0xc3] {
        return true;
    }
    b[0] == 0xc3 && addr % 16 == 0 && matches!(b[1], 0x66 | 0x0f | 0x90 | 0xcc | 0x2e)
}

/// Called by the dynamic linker (through the patched `_dl_debug_state`) at each change of
/// its object lists, with its lock held.
extern "C" fn debug_state_hook() {
    if BUSY.swap(true, Ordering::Acquire) {
        return;
    }
    // Keep errno: the loader's caller may be reporting one.
    // SAFETY: __errno_location returns this thread's errno slot.
    let errno = unsafe { *libc::__errno_location() };
    changed();
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
    BUSY.store(false, Ordering::Release);
}

/// An attached agent's later session: follow what was loaded and unloaded since the last
/// (every other thread is stopped by the CLI).
pub fn sync_objects() {
    changed();
}

/// Compare the loaded objects with the last list and follow the difference.
fn changed() {
    // The agent's work on the program's thread: its own calls (reading the new objects'
    // files) are not the program's events.
    let _busy = kprobes::KprobeBusy::begin();
    let now = loaded();
    let mut known = KNOWN.lock().unwrap_or_else(|e| e.into_inner());
    let added: Vec<LoadedObject> = now.iter().filter(|o| !known.contains(o)).cloned().collect();
    let removed: Vec<LoadedObject> = known.iter().filter(|o| !now.contains(o)).cloned().collect();
    if added.is_empty() && removed.is_empty() {
        return;
    }
    *known = now;
    drop(known);
    let mut relist = false;
    if !removed.is_empty() {
        match kprobes::objects_unloaded(&removed) {
            Ok(n) => relist |= n > 0,
            Err(e) => say!("ftprobe-agent: unloading objects: {e}"),
        }
    }
    if !added.is_empty() {
        // SAFETY: the loader calls this after mapping the new objects and before running
        // any of their initializers or returning their handle: no thread runs their code.
        match unsafe { ftrace::load_objects(&added) } {
            Ok(skipped) => {
                for e in skipped {
                    say!("ftprobe-agent: skipped an object: {e}");
                }
            }
            Err(e) => say!("ftprobe-agent: loading objects: {e}"),
        }
        if let Some(rings) = trace::buffer() {
            let table: Vec<(u64, &[u8])> = added
                .iter()
                .map(|o| (o.bias, o.path.as_os_str().as_encoded_bytes()))
                .collect();
            let n = rings.add_objects(&table);
            if n < table.len() {
                say!(
                    "ftprobe-agent: {} loaded object(s) do not fit in the objects table: their \
                     addresses will not be symbolized",
                    table.len() - n
                );
            }
        }
        let (armed, failed) = trace_kprobe::objects_loaded();
        relist |= armed > 0;
        for (tk, e) in failed {
            say!(
                "ftprobe-agent: {}/{}: not armed in the loaded object: {e}",
                tk.def.group,
                tk.def.event
            );
        }
    }
    if relist && EVENTS.load(Ordering::Relaxed) {
        trace::write_text_parts(
            crate::TEXT_KPROBES_LIST,
            crate::TEXT_KPROBES_LIST_MORE,
            &kprobes::list(),
        );
    }
}
