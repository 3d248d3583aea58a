//! The live-patching scale fixture (issue 13), shared by `tests/live_patch_scale.rs` and
//! `benches/live_patch_scale.rs`: a shared object of `n` generated C functions built at test
//! time (never by a normal build), `dlopen`ed before `ftrace::init`, and 8 threads that walk
//! through every one of its functions, counting their own calls.
//!
//! The functions form a binary tree: `fx_f<i>` adds one to the caller's counter and calls
//! `fx_f<2i+1>` and `fx_f<2i+2>` when they exist, so one walk from `fx_f0` makes exactly `n`
//! calls, each function once. Only `fx_f0` is exported; the rest are hidden (direct calls,
//! no PLT) but keep their symbols. The source is cut into chunks compiled in parallel
//! (gcc spends about 1 ms per function at -O1 here), and the built object is kept in the
//! target's tmp dir, keyed by `n`, the flavour and this generator's source, so a second run
//! does not compile again.

#![allow(dead_code)] // the test and the bench use different parts

use std::ffi::CString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// How the sites are made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavour {
    /// `-fpatchable-function-entry=5`: a 5-byte NOP at each entry.
    Patchable,
    /// `-pg -mfentry -mrecord-mcount`: a call to `__fentry__`, NOPed by `ftrace::init`.
    Fentry,
}

impl Flavour {
    fn flags(self) -> &'static [&'static str] {
        match self {
            Flavour::Patchable => &["-fpatchable-function-entry=5"],
            Flavour::Fentry => &["-pg", "-mfentry", "-mrecord-mcount"],
        }
    }
    fn name(self) -> &'static str {
        match self {
            Flavour::Patchable => "patchable",
            Flavour::Fentry => "fentry",
        }
    }
}

/// Functions per compiled chunk.
const CHUNK: usize = 5000;

/// The C source of functions `lo..hi` of an `n`-function tree.
fn chunk_source(n: usize, lo: usize, hi: usize) -> String {
    let mut s = String::with_capacity((hi - lo) * 120);
    for c in (2 * lo + 1)..(2 * hi + 1).min(n) {
        writeln!(s, "void fx_f{c}(unsigned long *);").unwrap();
    }
    for i in lo..hi {
        let vis = if i == 0 { "default" } else { "hidden" };
        write!(
            s,
            "__attribute__((noinline, visibility(\"{vis}\"))) void fx_f{i}(unsigned long *c) {{ ++*c;"
        )
        .unwrap();
        for c in [2 * i + 1, 2 * i + 2] {
            if c < n {
                write!(s, " fx_f{c}(c);").unwrap();
            }
        }
        s.push_str(" __asm__ volatile(\"\" ::: \"memory\"); }\n");
    }
    s
}

/// A shared object of `n` tree functions, built (or found built) in `dir`; `Err` says why not.
/// Returns the path and the seconds spent compiling (0 when it was already built).
pub fn build(dir: &Path, n: usize, flavour: Flavour) -> Result<(PathBuf, f64), String> {
    let chunks: Vec<(usize, usize)> = (0..n)
        .step_by(CHUNK)
        .map(|lo| (lo, (lo + CHUNK).min(n)))
        .collect();
    let sources: Vec<String> = chunks
        .iter()
        .map(|&(lo, hi)| chunk_source(n, lo, hi))
        .collect();
    // Keyed by what is compiled and how.
    let mut h = crc32fast::Hasher::new();
    sources.iter().for_each(|s| h.update(s.as_bytes()));
    h.update(flavour.flags().concat().as_bytes());
    let key = h.finalize();
    let out = dir.join(format!("scale-{}-{n}-{key:08x}", flavour.name()));
    let so = out.join("libfxscale.so");
    if so.exists() {
        return Ok((so, 0.0));
    }
    std::fs::create_dir_all(&out).map_err(|e| format!("{out:?}: {e}"))?;
    let t = Instant::now();
    let jobs = std::thread::available_parallelism().map_or(2, |p| p.get());
    let mut objs = Vec::new();
    for group in chunks.iter().zip(&sources).collect::<Vec<_>>().chunks(jobs) {
        let mut children = Vec::new();
        for &(&(lo, _), source) in group {
            let src = out.join(format!("f{lo}.c"));
            std::fs::write(&src, source).map_err(|e| e.to_string())?;
            let obj = out.join(format!("f{lo}.o"));
            let child = Command::new("gcc")
                .args(["-O1", "-fPIC", "-fno-ipa-icf", "-c"])
                .args(flavour.flags())
                .arg(&src)
                .arg("-o")
                .arg(&obj)
                .spawn()
                .map_err(|e| format!("gcc: {e}"))?;
            children.push(child);
            objs.push(obj);
        }
        for mut c in children {
            if !c.wait().is_ok_and(|s| s.success()) {
                return Err(format!("gcc {:?} failed", flavour.flags()));
            }
        }
    }
    let tmp = out.join("libfxscale.so.tmp");
    let ok = Command::new("gcc")
        .args(["-shared", "-o"])
        .arg(&tmp)
        .args(&objs)
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        return Err("gcc -shared failed".into());
    }
    std::fs::rename(&tmp, &so).map_err(|e| e.to_string())?;
    for o in &objs {
        let _ = std::fs::remove_file(o);
    }
    Ok((so, t.elapsed().as_secs_f64()))
}

/// The tree's root, `fx_f0`, from the object loaded with `dlopen`.
pub type Walk = unsafe extern "C" fn(*mut u64);

/// `dlopen` the object (before `ftrace::init`, which scans the objects loaded then) and
/// return its root.
pub fn load(so: &Path) -> Walk {
    let path = CString::new(so.to_str().unwrap()).unwrap();
    // SAFETY: generated plain functions, no constructors.
    let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW) };
    assert!(!h.is_null(), "dlopen {so:?}");
    // SAFETY: a handle from dlopen, a NUL-terminated name.
    let p = unsafe { libc::dlsym(h, c"fx_f0".as_ptr()) };
    assert!(!p.is_null(), "fx_f0");
    // SAFETY: fx_f0 is `void fx_f0(unsigned long *)`.
    unsafe { std::mem::transmute::<*mut libc::c_void, Walk>(p) }
}

/// Worker threads walking the tree, each counting its own calls, that the main thread can
/// stop at a known point (between two walks) and start again.
pub struct Workers {
    pause: Arc<AtomicBool>,
    exit: Arc<AtomicBool>,
    barrier: Arc<Barrier>,
    /// Each thread's calls so far (published before it stops).
    calls: Arc<Vec<AtomicU64>>,
    walks: Arc<AtomicU64>,
    handles: Vec<std::thread::JoinHandle<()>>,
    running: bool,
}

impl Workers {
    /// Start `threads` threads walking `walk` without pause.
    pub fn start(threads: usize, walk: Walk) -> Workers {
        let pause = Arc::new(AtomicBool::new(false));
        let exit = Arc::new(AtomicBool::new(false));
        let barrier = Arc::new(Barrier::new(threads + 1));
        let calls: Arc<Vec<AtomicU64>> =
            Arc::new((0..threads).map(|_| AtomicU64::new(0)).collect());
        let walks = Arc::new(AtomicU64::new(0));
        let handles = (0..threads)
            .map(|t| {
                let (pause, exit, barrier, calls, walks) = (
                    pause.clone(),
                    exit.clone(),
                    barrier.clone(),
                    calls.clone(),
                    walks.clone(),
                );
                std::thread::spawn(move || {
                    let mut mine = 0u64;
                    loop {
                        if pause.load(Ordering::Acquire) {
                            calls[t].store(mine, Ordering::Release);
                            barrier.wait(); // stopped
                            barrier.wait(); // started again
                            if exit.load(Ordering::Acquire) {
                                return;
                            }
                        }
                        // SAFETY: the generated root, `void fx_f0(unsigned long *)`.
                        unsafe { walk(&mut mine) };
                        walks.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        Workers {
            pause,
            exit,
            barrier,
            calls,
            walks,
            handles,
            running: true,
        }
    }

    /// Stop every thread between two walks; the sum of their calls so far.
    pub fn stop(&mut self) -> u64 {
        assert!(self.running);
        self.pause.store(true, Ordering::Release);
        self.barrier.wait();
        self.running = false;
        self.calls.iter().map(|c| c.load(Ordering::Acquire)).sum()
    }

    /// Let the stopped threads walk again.
    pub fn resume(&mut self) {
        assert!(!self.running);
        self.pause.store(false, Ordering::Release);
        self.barrier.wait();
        self.running = true;
    }

    /// Walks finished so far, all threads.
    pub fn walks(&self) -> u64 {
        self.walks.load(Ordering::Relaxed)
    }

    /// Wait until at least `more` walks have finished from now (or `limit` passed).
    pub fn run_walks(&self, more: u64, limit: Duration) {
        let (start, t) = (self.walks(), Instant::now());
        while self.walks() < start + more && t.elapsed() < limit {
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Stop and join every thread.
    pub fn finish(mut self) -> u64 {
        if self.running {
            self.stop();
        }
        let total = self.calls.iter().map(|c| c.load(Ordering::Acquire)).sum();
        self.exit.store(true, Ordering::Release);
        self.pause.store(false, Ordering::Release);
        self.barrier.wait();
        for h in self.handles.drain(..) {
            h.join().expect("worker");
        }
        total
    }
}
