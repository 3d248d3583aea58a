//! The kernel selftest kprobe_ftrace (tools/testing/selftests/ftrace/test.d/kprobe/
//! kprobe_ftrace.tc) as a test: a kprobe event and the function tracer on the same function
//! through five phases, with exact record counts in each (facts from the selftest; our code).
//! `harness = false`: ftrace::init needs a single thread.

use std::os::fd::AsFd;

use ftprobe::ftrace;
use ftprobe::function_tracer::{self, FUNCTION_OPS};
use ftprobe::kprobes;
use ftprobe::ring::{RingConfig, SharedRings};
use ftprobe::trace::{self, rtype};
use ftprobe::trace_kprobe;
use ftprobe_dev::fxsites::fx_add;

mod common;

#[global_allocator]
static ALLOC: common::CountingAlloc = common::CountingAlloc;

const CALLS: i64 = 7;

/// Call fx_add CALLS times, then count the new records: (kprobe events, function entries).
fn run_phase(reader: &SharedRings) -> (usize, usize) {
    for i in 0..CALLS {
        // SAFETY: plain C function.
        assert_eq!(unsafe { fx_add(i, 1) }, i + 1);
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

fn main() {
    // SAFETY: first thing in main, single-threaded.
    unsafe { ftrace::init() }.expect("ftrace::init");
    let (rings, fd) = SharedRings::create(RingConfig {
        nr_rings: 2,
        ring_bytes: 1 << 16,
        budget_bytes: 0,
    })
    .unwrap();
    let reader = SharedRings::attach(fd.as_fd()).unwrap();
    assert!(trace::set_buffer(rings));
    let n = CALLS as usize;

    // 1. kprobe event only.
    let tk = trace_kprobe::create(0, "p:testprobe fx_add").unwrap();
    assert_eq!(run_phase(&reader), (n, 0), "phase 1: kprobe only");
    // 2. the function tracer on the same function too.
    assert!(function_tracer::start(None, &["fx_add".to_owned()], &[])
        .unwrap()
        .is_empty());
    assert_eq!(run_phase(&reader), (n, n), "phase 2: both");
    // 3. kprobe disabled.
    kprobes::disable_kprobe(tk.kp).unwrap();
    assert_eq!(run_phase(&reader), (0, n), "phase 3: kprobe disabled");
    // 4. kprobe enabled again.
    kprobes::enable_kprobe(tk.kp).unwrap();
    assert_eq!(run_phase(&reader), (n, n), "phase 4: kprobe re-enabled");
    // 5. function tracer off.
    ftrace::unregister_ftrace_function(&FUNCTION_OPS).unwrap();
    assert_eq!(run_phase(&reader), (n, 0), "phase 5: tracer off");
    assert_eq!(tk.dropped(), 0);
    assert_eq!(tk.kp.nmissed(), 0);
    println!("test kprobe_ftrace_five_phases ... ok");

    // The recording paths allocate nothing per hit: a kprobe event with args and the function
    // tracer on one site (through the list function), records written into the ring.
    ftrace::register_ftrace_function(&FUNCTION_OPS).unwrap();
    let tk2 =
        trace_kprobe::create(1, "p:withargs fx_add a=$arg1 b=%si:u32 s=$stack0 c=$comm").unwrap();
    run_phase(&reader); // first touch: thread-locals
    let before = common::allocations();
    for i in 0..300 {
        // SAFETY: plain C function.
        unsafe { fx_add(i, 1) };
    }
    let allocs = common::allocations() - before;
    assert_eq!(allocs, 0, "allocations on the probe path");
    // 300 x (72 + 32) bytes fit in the 64 KiB ring: every hit was recorded.
    assert_eq!(tk2.dropped(), 0, "records dropped");
    println!("test recording_allocates_nothing_per_hit ... ok");

    // $comm is read at each hit (the kernel reads current->comm): rename the thread, hit.
    run_phase(&reader);
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes.
    unsafe {
        libc::prctl(
            libc::PR_SET_NAME,
            c"renamed-now".as_ptr() as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    // SAFETY: plain C function.
    unsafe { fx_add(1, 2) };
    let mut comm = None;
    for r in 0..reader.claimed() {
        reader.reader(r).unwrap().drain_aux(|t, aux, w| {
            if t == rtype::KPROBE && aux >> 12 == 1 {
                // tsc, addr, faults, a, b, s, comm (2 words)
                let bytes = [w[6].to_le_bytes(), w[7].to_le_bytes()].concat();
                comm = Some(
                    String::from_utf8_lossy(&bytes)
                        .trim_end_matches('\0')
                        .to_owned(),
                );
            }
        });
    }
    assert_eq!(comm.as_deref(), Some("renamed-now"));
    println!("test comm_is_read_at_each_hit ... ok\n\n3 passed, 0 failed");
}
