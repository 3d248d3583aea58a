//! kprobe events' memory fetch args, strings, symbols and arrays end to end: the `fetchargs`
//! fixture (see `crates/ftprobe-dev/c/fetchargs.c`) calls `take(t, s, arr)` four times with
//! known data, on the heap, on the stack, and through NULL and wild pointers; each test runs
//! it under `ftprobe trace -e DEF` and checks every value of every hit exactly, as the kernel
//! prints it.

use ftprobe_dev::{fixture, Flavour};

mod common;
use common::{trace, untraced};

/// The length of the long string the fixture passes in its third call.
const LONG_LEN: usize = 5000;
/// The kernel's MAX_STRING_SIZE: a fetched string keeps at most this many bytes, NUL included.
const MAX_STRING_SIZE: usize = 4096;

fn exe() -> String {
    fixture("fetchargs", Flavour::FentryNop)
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned()
}

/// The arguments part (after `(take+0x0/0x..) `) of each hit of `event`.
fn args_of(text: &str, event: &str) -> Vec<String> {
    let tag = format!(": {event}: (take+0x0/0x");
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once(&tag))
        .map(|(_, rest)| rest.split_once(") ").map_or("", |x| x.1).to_owned())
        .collect()
}

/// Trace one event on the fixture; checks that the program ran as without ftprobe (same
/// output, exit 0) and returns the arguments of its four hits.
fn hits(def: &str) -> Vec<String> {
    let exe = exe();
    let (out, text) = trace(&["-e", def], &[&exe]);
    let plain = untraced(&[&exe]);
    assert!(out.status.success(), "{def}: {out:?}");
    assert_eq!(
        out.stdout, plain.stdout,
        "{def}: the program's output is unchanged"
    );
    assert!(text.contains("# lost events: 0\n"), "{text}");
    let name = def[2..].split_whitespace().next().unwrap();
    let hits = args_of(&text, name);
    assert_eq!(hits.len(), 4, "{def}:\n{text}");
    hits
}

/// The address of a global of the fixture, as it prints it (`NAME=0x...`).
fn global_addr(name: &str) -> String {
    let plain = untraced(&[&exe()]);
    let out = String::from_utf8_lossy(&plain.stdout).into_owned();
    out.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("{out}"))
        .to_owned()
}

#[test]
fn struct_fields_and_nested_dereferences() {
    let h = hits("p:a take id=+0(%di):u32 neg=+4(%di):s32 b=+8(+16(%di)):s64 a=+0(+16($arg1)):x8");
    assert_eq!(
        h,
        [
            "id=100 neg=-5 b=-123456789 a=0x7",
            "id=101 neg=-6 b=-2 a=0x8",
            // t = NULL, then t = 0xdead: every read faults, the program runs on; a number
            // that could not be read prints 0, as the kernel prints its zeroed field.
            "id=0 neg=0 b=0 a=0x0",
            "id=0 neg=0 b=0 a=0x0",
        ]
    );
}

#[test]
fn strings_from_heap_stack_and_inside_structs() {
    let h = hits("p:s take s=+0($arg2):string name=+24(%di):string u=+0(%si):ustring");
    assert_eq!(
        h[0],
        r#"s="heap string 0" name="heap-thing" u="heap string 0""#
    );
    assert_eq!(
        h[1],
        r#"s="stack string 1" name="stack-thing" u="stack string 1""#
    );
    assert_eq!(h[3], r#"s="global-name" name=(fault) u="global-name""#);
    // The 5000-byte string is cut as strncpy_from_kernel_nofault() cuts it: 4095 bytes.
    let x = "x".repeat(MAX_STRING_SIZE - 1);
    assert_eq!(h[2], format!(r#"s="{x}" name=(fault) u="{x}""#));
    const { assert!(LONG_LEN > MAX_STRING_SIZE) };
}

#[test]
fn string_at_null_and_wild_pointers_is_a_fault() {
    // The kernel's syntax for "the string arg1 points to"; on calls 0 and 1 that is the bytes
    // of `id` (100 = 'd', 101 = 'e', then NUL).
    let h = hits("p:n take t=+0($arg1):string");
    assert_eq!(h, ["t=\"d\"", "t=\"e\"", "t=(fault)", "t=(fault)"]);
}

#[test]
fn arrays_chars_and_symbols() {
    let h = hits(
        "p:r take arr=+0($arg3):u64[4] vals=+40(%di):s64[4] c=+24(%di):char[4] \
         x=+0(%dx):x16[3] fn=+8(%di):symbol fs=+8(%di):symstr",
    );
    // helper's size is its symbol's (FentryNop: 16 bytes).
    let size = "0x10";
    assert_eq!(
        h[0],
        format!(
            "arr={{1,2,3,4}} vals={{10,20,30,40}} c={{'h','e','a','p'}} x={{0x1,0x0,0x0}} \
             fn=helper+0x0/{size} fs=\"helper+0x0/{size}\""
        )
    );
    assert_eq!(
        h[1],
        format!(
            "arr={{5,6,7,8}} vals={{-1,-2,-3,-4}} c={{'s','t','a','c'}} x={{0x5,0x0,0x0}} \
             fn=helper+0x0/{size} fs=\"helper+0x0/{size}\""
        )
    );
    assert_eq!(
        h[2],
        "arr={0,0,0,0} vals={0,0,0,0} c={'\0','\0','\0','\0'} x={0x0,0x0,0x0} fn=0x0 \
         fs=(fault)"
    );
    assert_eq!(
        h[3],
        "arr={1,2,3,4} vals={0,0,0,0} c={'\0','\0','\0','\0'} x={0x1,0x0,0x0} fn=0x0 \
         fs=(fault)"
    );
}

#[test]
fn globals_by_symbol_and_address_and_immediates() {
    let gvar = global_addr("gvar");
    let def = format!(
        "p:g take g=@gvar g8=@gvar+8:u64 gm=@gvar-0:s64 ga=@{gvar} ga8=+8(\\{gvar}):u64 \
         gn=@gname:string gw=@gwords:string[3] h=\\\"hello\" c=$comm"
    );
    let h = hits(&def);
    let want = "g=0x1122334455667788 g8=42 gm=1234605616436508552 ga=0x1122334455667788 \
                ga8=42 gn=\"global-name\" gw={\"alpha\",\"beta\",(fault)} h=\"hello\" \
                c=\"fetchargs-fentr\"";
    for l in &h {
        assert_eq!(l, want);
    }
}

#[test]
fn more_than_64_arguments_have_their_own_fault_bits() {
    // 69 arguments: the last one's fault bit is in the mask's second word.
    let mut def = String::from("p:m take");
    for i in 0..68 {
        def.push_str(&format!(" i{i}=\\{i}:u8"));
    }
    def.push_str(" last=+0(%di):u32");
    let h = hits(&def);
    let imms: String = (0..68).map(|i| format!("i{i}={i} ")).collect();
    assert_eq!(h[0], format!("{imms}last=100"));
    assert_eq!(h[2], format!("{imms}last=0"));
}

#[test]
fn refusals_name_the_kernel_error_and_nothing_runs() {
    let exe = exe();
    // The kernel refuses a string type on a value that is not memory: `$arg2:string` must be
    // written `+0($arg2):string`.
    let (out, text) = trace(&["-e", "p take $arg2:string"], &[&exe]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text.is_empty() && out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with(
            "ftprobe: trace_kprobe: error: String accepts only memory argument\n  \
             Command: p take $arg2:string\n"
        ),
        "{err}"
    );
    assert!(
        err.contains(&format!("\n{}^\n", " ".repeat(11 + 13))),
        "caret under the type:\n{err}"
    );
    // The kernel has no symstr arrays either.
    let (out, _) = trace(&["-e", "p take +0(%di):symstr[2]"], &[&exe]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("error: String accepts only memory argument"),
        "{err}"
    );
    // Not supported (the kernel's fetch of it fails): refused by the CLI before anything runs.
    let def = "p take \\4096:string[2]";
    let (out, text) = trace(&["-e", def], &[&exe]);
    assert_eq!(out.status.code(), Some(1), "{def}");
    assert!(text.is_empty() && out.stdout.is_empty(), "{def}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("This syntax is not supported by ftprobe"),
        "{def}: {err}"
    );
    assert!(
        err.contains("string arrays of an immediate are not supported"),
        "{def}: {err}"
    );
    // An unknown symbol is found by the agent, as the kernel finds it at registration,
    // before main runs; the caret is under the argument (the kernel's is at the target).
    let (out, _) = trace(&["-e", "p take x=@no_such_global"], &[&exe]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty(), "main did not run");
    let err = String::from_utf8_lossy(&out.stderr);
    let want = format!(
        "ftprobe-agent: trace_kprobe: error: Invalid probed address or symbol\n  \
         Command: p take x=@no_such_global\n{}^\n",
        " ".repeat(11 + "p take x=".len())
    );
    assert!(err.starts_with(&want), "{err}\nwanted:\n{want}");
    assert!(
        err.contains("@no_such_global: no data or function symbol"),
        "{err}"
    );
}

/// The probe path reads strings and arrays straight into the ring: its stack use stays
/// within the budget that `trace.rs` checks for scalar arguments (1 KiB of a signal stack,
/// plus the ~100 bytes of ftprobe's wrapper of the program's handler, which holds a signal
/// that arrives in a trampoline: `tramp_signals`).
#[test]
fn strings_and_arrays_fit_on_a_small_signal_stack() {
    const BUDGET: usize = 1024 + 128;
    let exe = fixture("sigstack", Flavour::FentryCallPieRecord).unwrap();
    let exe = exe.to_str().unwrap();
    let used = common::signal_stack_used;
    let plain = used(&untraced(&[exe]));
    // The general per-argument program, and the short one of an event of registers, single
    // loads and strings (`write_fast_record`, its string lengths on the stack).
    let general = "p hf s=+0($stack):string a=+0($stack):u64[8] p=+0(+0($stack)):string[2] \
                   y=+0($stack):symstr c=$comm";
    let short = "p hf s=+0($stack):string t=+8($stack):string v=+0($stack):u64 \
                 w=+8($stack):u32 r=%di";
    for def in [general, short] {
        let (out, text) = trace(&["-e", def], &[exe]);
        assert!(out.status.success(), "{out:?}");
        let extra = used(&out) - plain;
        assert!(
            extra <= BUDGET,
            "{def}: the probe path used {extra} bytes of the signal stack"
        );
        assert_eq!(
            text.lines().filter(|l| l.contains(": p_hf_0: (")).count(),
            2,
            "{text}"
        );
        let size = (plain + BUDGET).div_ceil(4096) * 4096;
        let (out, _) = trace(&["-e", def], &[exe, &size.to_string()]);
        assert!(
            out.status.success(),
            "{def}: on a {size}-byte signal stack: {:?}",
            out.status
        );
    }
}
