//! XRay sleds patched and put back in process: a shared object built here with clang
//! `-fxray-instrument` (skipped, saying why, without clang), loaded with `dlopen` before
//! `ftrace::init`. Its functions' bytes are read before ftprobe touches them; after the
//! function tracer and then a graph user have come and gone, every byte is what clang wrote.
//!
//! `harness = false`: `ftrace::init` needs a single thread.

use std::ffi::CString;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

use ftprobe::elf::{ElfImage, XrayKind};
use ftprobe::ftrace::fgraph::{self, FgraphEnt, FgraphExit, FgraphOps, FgraphRet};
use ftprobe::ftrace::{self, FtraceOps, PtRegs};

const SOURCE: &str = r#"
__attribute__((noinline)) long xr_leaf(long x) { __asm__ volatile("" ::: "memory"); return x * 3 + 1; }
__attribute__((noinline)) long xr_tail(long x) { return xr_leaf(x + 1); }
"#;

/// Bytes read from each function's start: both functions (and their sleds) fit.
const SNAP: usize = 48;

fn build() -> Option<PathBuf> {
    let dir = std::env::temp_dir().join(format!("ftprobe-xray-sleds-{}", std::process::id()));
    std::fs::create_dir_all(&dir).ok()?;
    let src = dir.join("xr.c");
    std::fs::write(&src, SOURCE).ok()?;
    let so = dir.join("libxr.so");
    Command::new("clang")
        .args(["-O2", "-fPIC", "-shared", "-fxray-instrument"])
        .args(["-fxray-instruction-threshold=1", "-fnoxray-link-deps"])
        .arg(&src)
        .arg("-o")
        .arg(&so)
        .status()
        .is_ok_and(|s| s.success())
        .then_some(so)
}

static HITS: AtomicU64 = AtomicU64::new(0);

unsafe extern "C" fn count(_ip: u64, _parent: u64, _op: &FtraceOps, _regs: &mut PtRegs) {
    HITS.fetch_add(1, Ordering::SeqCst);
}

static FUNCTION: FtraceOps = FtraceOps::new(count, 0);

static ENTRIES: AtomicU64 = AtomicU64::new(0);
static RETURNS: AtomicU64 = AtomicU64::new(0);
/// The last return: function, return value.
static LAST: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

unsafe fn g_entry(
    _e: &FgraphEnt,
    _g: &FgraphOps,
    _r: &mut PtRegs,
    _d: &mut [u64; fgraph::FGRAPH_DATA_WORDS],
) -> bool {
    ENTRIES.fetch_add(1, Ordering::SeqCst);
    true
}

unsafe fn g_ret(
    r: &FgraphRet,
    _g: &FgraphOps,
    _regs: &PtRegs,
    _d: &[u64; fgraph::FGRAPH_DATA_WORDS],
) {
    if r.exit == FgraphExit::Returned {
        RETURNS.fetch_add(1, Ordering::SeqCst);
    }
    LAST[0].store(r.func, Ordering::SeqCst);
    LAST[1].store(r.retval, Ordering::SeqCst);
}

static GRAPH: FgraphOps = FgraphOps::new(g_entry, g_ret);

fn snapshot(at: u64) -> [u8; SNAP] {
    // SAFETY: the start of a function of the loaded object, which is longer than SNAP with
    // the function after it (checked against the sled map below).
    unsafe { std::ptr::read_unaligned(at as *const [u8; SNAP]) }
}

fn main() {
    // Quick tier only: this binary has no stress case (ftprobe_dev::tier).
    if !ftprobe_dev::tier::quick_tier_requested() {
        return;
    }
    let Some(so) = build() else {
        eprintln!("skipped: clang -fxray-instrument could not build the shared object");
        return;
    };
    let path = CString::new(so.to_str().unwrap()).unwrap();
    // SAFETY: a library of two plain functions and no constructors.
    let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW) };
    assert!(!h.is_null(), "dlopen {so:?}");
    let sym = |n: &str| {
        let c = CString::new(n).unwrap();
        // SAFETY: a handle from dlopen, a NUL-terminated name.
        let p = unsafe { libc::dlsym(h, c.as_ptr()) };
        assert!(!p.is_null(), "{n}");
        p as u64
    };
    let (leaf, tail) = (sym("xr_leaf"), sym("xr_tail"));
    // SAFETY: the functions' C signature.
    let call = |f: u64, x: i64| unsafe {
        std::mem::transmute::<u64, unsafe extern "C" fn(i64) -> i64>(f)(x)
    };
    let before = [snapshot(leaf), snapshot(tail)];

    // SAFETY: first thing in main after dlopen: single-threaded.
    unsafe { ftrace::init() }.expect("ftrace::init");
    assert_eq!(
        [snapshot(leaf), snapshot(tail)],
        before,
        "init leaves XRay sleds alone"
    );

    // The sleds, from the file, where they are loaded.
    let img = ElfImage::open(&so).unwrap();
    let bias = ftrace::objects()
        .unwrap()
        .into_iter()
        .find(|o| o.path == so)
        .expect("the library is one of ftrace's objects")
        .bias;
    let sleds: Vec<(u64, XrayKind)> = img.xray.iter().map(|s| (s.svma + bias, s.kind)).collect();
    let exits: Vec<u64> = sleds
        .iter()
        .filter(|s| s.1.is_exit())
        .map(|s| s.0)
        .collect();
    assert_eq!(
        sleds.iter().filter(|s| s.1.is_entry()).count(),
        2,
        "{sleds:?}"
    );
    assert_eq!(
        exits.len(),
        2,
        "an exit sled in xr_leaf, a tail sled in xr_tail"
    );
    for &(a, _) in &sleds {
        assert!(
            (a >= leaf && a + 11 <= leaf + SNAP as u64)
                || (a >= tail && a + 11 <= tail + SNAP as u64),
            "sled {a:#x} inside the snapshots"
        );
    }
    let byte = |a: u64| {
        // SAFETY: a sled address, in mapped code.
        unsafe { std::ptr::read_volatile(a as *const u8) }
    };

    // 1. The function tracer: the entry sleds call the trampoline, the rest of each sled
    //    stays as it was; one hit per call.
    ftrace::ftrace_set_filter(&FUNCTION, "xr_*", true).unwrap();
    ftrace::register_ftrace_function(&FUNCTION).unwrap();
    // call rel32 over `jmp .+11`; the sled's last 6 bytes untouched.
    assert_eq!((byte(leaf), byte(tail)), (0xe8, 0xe8));
    assert_eq!(snapshot(leaf)[5..11], before[0][5..11]);
    assert_eq!(snapshot(tail)[5..11], before[1][5..11]);
    // Exit sleds are not patched for the function tracer.
    assert!(exits.iter().all(|&e| [0xc3, 0xeb].contains(&byte(e))));
    assert_eq!((call(leaf, 4), call(tail, 4)), (13, 16));
    // xr_leaf; xr_tail, which jumps to xr_leaf.
    assert_eq!(HITS.load(Ordering::SeqCst), 3);
    ftrace::unregister_ftrace_function(&FUNCTION).unwrap();
    assert_eq!(
        [snapshot(leaf), snapshot(tail)],
        before,
        "disabled: clang's bytes"
    );

    // 2. A graph user: entry sleds and exit sleds patched, entries and returns paired at the
    //    sleds with the return value.
    ftrace::ftrace_set_filter(GRAPH.ops(), "xr_*", true).unwrap();
    fgraph::register_ftrace_graph(&GRAPH).unwrap();
    assert!(
        exits.iter().all(|&e| byte(e) == 0xe9),
        "exit sleds jump to their stubs"
    );
    assert_eq!(call(leaf, 5), 16);
    assert_eq!(
        (
            ENTRIES.load(Ordering::SeqCst),
            RETURNS.load(Ordering::SeqCst)
        ),
        (1, 1)
    );
    assert_eq!(
        (
            LAST[0].load(Ordering::SeqCst),
            LAST[1].load(Ordering::SeqCst)
        ),
        (leaf, 16)
    );
    // xr_tail closes at its tail sled, then xr_leaf runs and returns to xr_tail's caller.
    assert_eq!(call(tail, 5), 19);
    assert_eq!(
        (
            ENTRIES.load(Ordering::SeqCst),
            RETURNS.load(Ordering::SeqCst)
        ),
        (3, 3)
    );
    assert_eq!(
        (
            LAST[0].load(Ordering::SeqCst),
            LAST[1].load(Ordering::SeqCst)
        ),
        (leaf, 19)
    );
    fgraph::unregister_ftrace_graph(&GRAPH).unwrap();
    assert_eq!(
        [snapshot(leaf), snapshot(tail)],
        before,
        "disabled: clang's bytes"
    );
    assert_eq!(call(tail, 1), 7);
    assert_eq!(ENTRIES.load(Ordering::SeqCst), 3, "nothing hooked any more");
    println!("xray_sleds: ok");
}
