//! Objects loaded and unloaded after `ftrace::init`, the engine's side of the agent's
//! `dlopen` hook (`ftrace::load_objects`, `kprobes::objects_unloaded`,
//! `trace_kprobe::objects_loaded`), in process: a `:mod:` filter and a kprobe event that name
//! `libdlfix.so` before it is loaded, two load periods, and what is left between them.
//! `harness = false`: ftrace::init needs a single thread. Here the library's constructor runs
//! before the engine is told (no hook): only the calls made after `load_objects` count.

use std::ffi::CString;
use std::os::fd::AsFd;

use std::sync::atomic::{AtomicU64, Ordering};

use ftprobe::ftrace::{self, FtraceOps, PtRegs};
use ftprobe::function_tracer;
use ftprobe::kprobes::{self, KPROBE_FLAG_GONE};
use ftprobe::process::{loaded_objects, LoadedObject};
use ftprobe::ring::{RingConfig, SharedRings};
use ftprobe::trace::{self, rtype};
use ftprobe::trace_kprobe;
use ftprobe_dev::fxsites::fx_add;

/// Call `fx_add` `n` times and `dl_work` (if given) `m` times, then count the new records:
/// (kprobe events, function entries).
fn run(
    reader: &SharedRings,
    n: i64,
    work: Option<extern "C" fn(i64) -> i64>,
    m: i64,
) -> (usize, usize) {
    for i in 0..n {
        // SAFETY: plain C function.
        assert_eq!(unsafe { fx_add(i, 1) }, i + 1);
    }
    if let Some(w) = work {
        for i in 0..m {
            assert_eq!(w(i), 2 * i + 1);
        }
    }
    let (mut k, mut f) = (0, 0);
    for r in 0..reader.claimed() {
        reader.reader(r).unwrap().drain(|t, _| match t {
            rtype::KPROBE => k += 1,
            rtype::FUNC => f += 1,
            _ => {}
        });
    }
    (k, f)
}

/// `dlopen` the library and tell the engine (what the agent's hook does): the objects that
/// appeared, and `dl_work`.
fn load(
    path: &CString,
) -> (
    *mut libc::c_void,
    Vec<LoadedObject>,
    extern "C" fn(i64) -> i64,
) {
    let before = loaded_objects();
    // SAFETY: a NUL-terminated path; the library's constructor only calls its own function.
    let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW) };
    assert!(!h.is_null(), "dlopen {path:?}");
    let new: Vec<LoadedObject> = loaded_objects()
        .into_iter()
        .filter(|o| !before.contains(o))
        .collect();
    assert_eq!(new.len(), 1, "{new:?}");
    // SAFETY: only this thread runs; the library's code runs only when called below.
    let skipped = unsafe { ftrace::load_objects(&new) }.unwrap();
    assert!(skipped.is_empty(), "{skipped:?}");
    // SAFETY: a handle from dlopen, a NUL-terminated name.
    let f = unsafe { libc::dlsym(h, c"dl_work".as_ptr()) };
    assert!(!f.is_null());
    // SAFETY: dl_work is `long dl_work(long)`.
    let work = unsafe { std::mem::transmute::<*mut libc::c_void, extern "C" fn(i64) -> i64>(f) };
    (h, new, work)
}

/// The site of `name` and the number of ops that want it.
fn refs(name: &str) -> (u64, u64) {
    let f = ftrace::functions()
        .unwrap()
        .into_iter()
        .find(|f| f.name == name)
        .unwrap_or_else(|| panic!("{name} has a site"));
    (f.ip, f.flags & ftrace::FTRACE_FL_REF_MASK)
}

/// An ops that must never be called (its filter selects nothing).
static ZLIB_OPS: FtraceOps = FtraceOps::new(never, 0);

static NEVER_CALLED: AtomicU64 = AtomicU64::new(0);

unsafe extern "C" fn never(_ip: u64, _parent: u64, _op: &FtraceOps, _regs: &mut PtRegs) {
    NEVER_CALLED.fetch_add(1, Ordering::Relaxed);
}

fn main() {
    // Quick tier only: this binary has no stress case (ftprobe_dev::tier).
    if !ftprobe_dev::tier::quick_tier_requested() {
        return;
    }
    // SAFETY: early in main (reading the arguments starts no thread): single-threaded.
    unsafe { ftrace::init() }.expect("ftrace::init");
    let (rings, fd) = SharedRings::create(RingConfig {
        nr_rings: 2,
        ring_bytes: 1 << 16,
        budget_bytes: 0,
    })
    .unwrap();
    let reader = SharedRings::attach(fd.as_fd()).unwrap();
    assert!(trace::set_buffer(rings));
    let lib = ftprobe_dev::dlfix_lib();
    let path = CString::new(lib.to_str().unwrap()).unwrap();

    // Before the library exists: the event waits, the filter (its only pattern) selects
    // nothing rather than every function.
    let tk = trace_kprobe::create(0, "p:dw libdlfix.so:dl_work").unwrap();
    assert!(tk.is_pending());
    assert!(!kprobes::is_registered(tk.kp));
    let warnings =
        function_tracer::start(None, &["dl_work:mod:libdlfix.so".to_owned()], &[]).unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(
        refs("fx_add").1,
        0,
        "a pending :mod: filter selects nothing"
    );
    assert_eq!(run(&reader, 5, None, 0), (0, 0), "nothing before the load");

    // An ops whose only filter names a library loaded below that has no site (libz): it
    // still selects nothing once the library is there, through every later change.
    ftrace::ftrace_set_filter(&ZLIB_OPS, "*:mod:libz.so.1", true).unwrap();
    ftrace::register_ftrace_function(&ZLIB_OPS).unwrap();
    let before = loaded_objects();
    // SAFETY: a NUL-terminated name; libz has no constructor that matters here.
    let z = unsafe { libc::dlopen(c"libz.so.1".as_ptr(), libc::RTLD_NOW) };
    assert!(!z.is_null(), "dlopen libz.so.1");
    let new: Vec<LoadedObject> = loaded_objects()
        .into_iter()
        .filter(|o| !before.contains(o))
        .collect();
    assert_eq!(new.len(), 1, "{new:?}");
    // SAFETY: only this thread runs.
    unsafe { ftrace::load_objects(&new) }.unwrap();
    assert_eq!(
        refs("fx_add").1,
        0,
        "a :mod: filter of an object without sites"
    );

    for period in 1..=2 {
        let (h, new, work) = load(&path);
        assert_eq!(
            trace_kprobe::objects_loaded().0,
            1,
            "period {period}: armed"
        );
        assert!(!tk.is_pending());
        assert_eq!(tk.kp.flags() & KPROBE_FLAG_GONE, 0);
        assert_eq!(
            refs("dl_work").1,
            2,
            "the function tracer and the kprobe ops"
        );
        assert!(kprobes::list().contains("dl_work+0x0  libdlfix.so [FTRACE]"));
        assert_eq!(run(&reader, 3, Some(work), 7), (7, 7), "period {period}");

        // SAFETY: a handle from dlopen; nothing of the library is used after this.
        assert_eq!(unsafe { libc::dlclose(h) }, 0);
        assert!(
            loaded_objects().iter().all(|o| !new.contains(o)),
            "unmapped"
        );
        assert_eq!(kprobes::objects_unloaded(&new).unwrap(), 1);
        assert_ne!(tk.kp.flags() & KPROBE_FLAG_GONE, 0, "GONE");
        let list = kprobes::list();
        assert!(
            list.contains("dl_work+0x0  libdlfix.so [GONE][FTRACE]"),
            "{list}"
        );
        assert!(
            ftrace::functions()
                .unwrap()
                .iter()
                .all(|f| f.name != "dl_work"),
            "its sites are forgotten"
        );
        // The kprobe ops held only dl_work: unregistered, not left with an empty filter
        // (every function); the function tracer's filter waits again.
        assert_eq!(refs("fx_add").1, 0, "period {period}: nothing widened");
        assert_eq!(
            run(&reader, 4, None, 0),
            (0, 0),
            "period {period}: unloaded"
        );
    }
    // A load/unload loop with the probe and the filter armed each time: the trampoline areas
    // of an unloaded library are reused by the next load, not one more mapping per load.
    // Bytes of anonymous RWX mappings (trampoline areas; adjacent ones merge into one line).
    let maps = || -> u64 {
        std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .filter(|l| l.split_whitespace().nth(1) == Some("rwxp"))
            .filter(|l| l.split_whitespace().nth(5).is_none())
            .map(|l| {
                let (lo, hi) = l
                    .split_whitespace()
                    .next()
                    .unwrap()
                    .split_once('-')
                    .unwrap();
                u64::from_str_radix(hi, 16).unwrap() - u64::from_str_radix(lo, 16).unwrap()
            })
            .sum()
    };
    let before = maps();
    for _ in 0..100 {
        let (h, new, work) = load(&path);
        assert_eq!(trace_kprobe::objects_loaded().0, 1);
        assert_eq!(run(&reader, 0, Some(work), 2), (2, 2));
        // SAFETY: a handle from dlopen; nothing of the library is used after this.
        assert_eq!(unsafe { libc::dlclose(h) }, 0);
        assert_eq!(kprobes::objects_unloaded(&new).unwrap(), 1);
    }
    let after = maps();
    assert!(
        after <= before + 4 * 65536,
        "trampoline areas: {before} bytes before 100 loads, {after} after"
    );
    assert_eq!(NEVER_CALLED.load(Ordering::Relaxed), 0);
    println!("modules: ok");
}
