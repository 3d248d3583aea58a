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
    println!("test comm_is_read_at_each_hit ... ok");

    kprobes::unregister_kprobe(tk.kp).unwrap();
    kprobes::unregister_kprobe(tk2.kp).unwrap();
    ftrace::unregister_ftrace_function(&FUNCTION_OPS).unwrap();
    fast_programs_write_the_general_programs_records(&reader);
    println!("test fast_programs_write_the_general_programs_records ... ok\n\n4 passed, 0 failed");
}

/// A word and a string the `@SYM` fetch args read.
#[no_mangle]
#[used]
static FTPROBE_TEST_WORD: u64 = 0x0102_0304_0506_0708;
#[no_mangle]
#[used]
static FTPROBE_TEST_STR: [u8; 6] = *b"global";

/// The same call site for every hit (`+0(%sp)` is its return address).
#[inline(never)]
fn hit(a: u64, b: u64) {
    // SAFETY: plain C function.
    std::hint::black_box(unsafe { fx_add(a as i64, b as i64) });
}

/// The records of `id` drained from every ring, without their timestamp (word 0).
fn records_of(reader: &SharedRings, id: u32) -> Vec<Vec<u64>> {
    let mut out = Vec::new();
    for r in 0..reader.claimed() {
        reader.reader(r).unwrap().drain_aux(|t, aux, w| {
            if t == rtype::KPROBE && aux >> 12 == id {
                out.push(w[1..].to_vec());
            }
        });
    }
    out
}

/// An event whose every argument is a register, one load at a register or an address plus
/// an offset, or the string there runs its short program (`write_fast_record`): its records
/// are word for word those of the general program, on good memory, NULL, a `PROT_NONE` page,
/// an unmapped page, a word and a string that run into the `PROT_NONE` page, and a string
/// longer than `MAX_STRING_SIZE`; its strings copied in one pass or measured first. The plain loads with their fault fixups (this program
/// installs no signal action and changes no mask, as the agent's interposers ensure in a
/// traced program).
fn fast_programs_write_the_general_programs_records(reader: &SharedRings) {
    use ftprobe::arch::x86_64::uaccess;
    use ftprobe::trace_kprobe::ArgValue;
    uaccess::set_handlers_kept();
    let def = "p:fast fx_add a=+0(%di):u64 b=+8(%di):x32 c=+12(%di):s16 d=+14(%di):u8 \
               e=+0(%si):string f=$arg1 g=@FTPROBE_TEST_WORD:u64 h=@FTPROBE_TEST_STR:string \
               i=+0(%sp):x64 j=+u0(%si):ustring k=+15(%di):b4@2/8 l=%si";
    let tk = trace_kprobe::create(7, def).unwrap();
    assert_eq!(tk.program(), "fast", "{def}");
    assert!(uaccess::enabled(), "plain loads on");
    // Three pages: data, PROT_NONE, unmapped.
    let page = 4096u64;
    // SAFETY: a fresh private anonymous mapping, changed below only by this test.
    let base = unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            3 * page as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        assert_eq!(libc::mprotect(p.cast::<u8>().add(4096).cast(), 4096, 0), 0);
        assert_eq!(libc::munmap(p.cast::<u8>().add(8192).cast(), 4096), 0);
        p as u64
    };
    let (none, unmapped) = (base + page, base + 2 * page);
    let put = |at: u64, bytes: &[u8]| {
        // SAFETY: `at..at + len` is in the data page (the callers' offsets).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), at as *mut u8, bytes.len()) }
    };
    put(base, &0x1122_3344_5566_7788u64.to_le_bytes());
    put(base + 8, &0xdead_beefu32.to_le_bytes());
    put(base + 12, &(-2i16).to_le_bytes());
    put(base + 14, &[0xab, 0b0001_0100]);
    put(base + 64, b"hello, fast path\0");
    // A string without a NUL before the PROT_NONE page, a struct that runs into it.
    let edge = none - 5;
    put(edge, b"abcde");
    let long: Vec<u8> = std::iter::repeat_n(b'x', 5000).chain([0]).collect();
    let cases: [(u64, u64); 7] = [
        (base, base + 64),
        (0, 0),
        (none, none),
        (unmapped, unmapped),
        (none - 12, edge),
        (base, long.as_ptr() as u64),
        (base + 64, base),
    ];
    // The short program with its strings in one pass and in two, and the general one.
    let mut fast = Vec::new();
    let mut two_pass = Vec::new();
    let mut general = Vec::new();
    for (a, b) in cases {
        hit(a, b);
        fast.extend(records_of(reader, 7));
        trace_kprobe::set_one_pass_strings(false);
        hit(a, b);
        two_pass.extend(records_of(reader, 7));
        trace_kprobe::set_one_pass_strings(true);
        trace_kprobe::set_fast_programs(false);
        hit(a, b);
        general.extend(records_of(reader, 7));
        trace_kprobe::set_fast_programs(true);
    }
    assert_eq!(fast.len(), cases.len(), "a record per hit");
    assert_eq!(fast, general, "the same records");
    assert_eq!(two_pass, general, "the same records");
    // The first case, against what this test wrote.
    let mut words = vec![0u64];
    words.extend(&fast[0]);
    let v = trace_kprobe::decode_args(&tk.def, &words).unwrap();
    let str_of = |s: &[u8]| ArgValue::Str(Some(s.to_vec()));
    assert_eq!(v[0], ArgValue::Scalar(0x1122_3344_5566_7788));
    assert_eq!(v[1], ArgValue::Scalar(0xdead_beef));
    assert_eq!(v[2], ArgValue::Scalar(0xfffe));
    assert_eq!(v[3], ArgValue::Scalar(0xab));
    assert_eq!(v[4], str_of(b"hello, fast path"));
    assert_eq!(v[5], ArgValue::Scalar(base));
    assert_eq!(v[6], ArgValue::Scalar(0x0102_0304_0506_0708));
    assert_eq!(v[7], str_of(b"global"));
    assert_eq!(v[9], str_of(b"hello, fast path"));
    assert_eq!(v[10], ArgValue::Scalar(0b0001_0100));
    assert_eq!(v[11], ArgValue::Scalar(base + 64));
    // NULL: every load faults, the strings have no data; the registers and globals stay.
    words.truncate(1);
    words.extend(&fast[1]);
    let v = trace_kprobe::decode_args(&tk.def, &words).unwrap();
    for i in [0, 1, 2, 3, 10] {
        assert_eq!(v[i], ArgValue::Fault, "arg {i} of NULL");
    }
    assert_eq!(v[4], ArgValue::Str(None));
    assert_eq!(v[7], str_of(b"global"));
    // 12 bytes before the PROT_NONE page: the u64 and the u32 are read (the u64's last byte
    // is the string's `a`), the s16 and after fault; the string that runs into it has no
    // data.
    words.truncate(1);
    words.extend(&fast[4]);
    let v = trace_kprobe::decode_args(&tk.def, &words).unwrap();
    assert_eq!(v[0], ArgValue::Scalar(u64::from(b'a') << 56));
    assert_eq!(
        v[1],
        ArgValue::Scalar(u64::from(u32::from_le_bytes(*b"bcde")))
    );
    assert_eq!((&v[2], &v[3]), (&ArgValue::Fault, &ArgValue::Fault));
    assert_eq!(v[4], ArgValue::Str(None));
    // The string longer than MAX_STRING_SIZE is cut to MAX_STRING_SIZE - 1 bytes.
    words.truncate(1);
    words.extend(&fast[5]);
    let v = trace_kprobe::decode_args(&tk.def, &words).unwrap();
    assert_eq!(v[4], str_of(&long[..ftprobe::events::MAX_STRING_SIZE - 1]));
    kprobes::unregister_kprobe(tk.kp).unwrap();
}
