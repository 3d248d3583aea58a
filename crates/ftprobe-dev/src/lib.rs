//! Test fixtures for ftprobe, compiled from source by `build.rs` at build time.
//!
//! - C programs in every ftrace site flavour ([`Flavour`], DESIGN.md section 2), found with
//!   [`fixture`]: `calls`, `threads`, and `calls_lib` (whose `work`/`caller` live in
//!   [`fixture_lib`]);
//! - Lua 5.4 from the `lua-src` crate's sources in two flavours ([`lua`]), with the scripts
//!   in `lua/` ([`lua_script`]);
//! - [`fxsites`]: C functions with patchable entries linked into every test executable that
//!   depends on this crate;
//! - [`KillOnDrop`], so a failing test leaves no child behind;
//! - [`target_dir`], to find the other crates' build outputs;
//! - [`tier`]: the quick and stress tiers of the `harness = false` test binaries.
//!
//! The exact outputs the fixtures print are documented on [`fixture`]; FLAVOURS.md shows the
//! disassembly of each flavour.

use std::ops::{Deref, DerefMut};
use std::path::PathBuf;
use std::process::{Child, Command};

include!("flavour.rs");

pub mod tier;

/// The C fixture programs, each built in every flavour (`calls_lib` only where
/// [`Flavour::supports_pic`]).
pub const PROGRAMS: [&str; 3] = ["calls", "calls_lib", "threads"];

const FIXTURES_DIR: &str = env!("FTPROBE_DEV_FIXTURES_DIR");
const LUA_DIR: &str = env!("FTPROBE_DEV_LUA_DIR");
const TARGET_DIR: &str = env!("FTPROBE_DEV_TARGET_DIR");

/// Path of a C fixture program built in `flavour`, or `None` if `program` is unknown or not
/// buildable in that flavour.
///
/// All of them define `long work(long a, long b)` (returns `3a + b`), `long caller(long n)`
/// (sums `work(i, i + 1)` for `i` in `0..n`) and `int leaf_unused(int)` (never called):
///
/// - `calls [N]` (N = 10 by default): `main` calls `caller(N)` once, which calls `work` N
///   times; prints `sum=<2N^2 - N>` and exits 0.
/// - `calls_lib [N]`: the same, but `work`/`caller` are in [`fixture_lib`] (found through
///   `RUNPATH=$ORIGIN`) and the main program has no sites. Only where
///   [`Flavour::supports_pic`].
/// - `sigstack [SIZE]` (only [`Flavour::FentryCallPieRecord`]): a signal handler on a
///   painted alternate stack calls `hf`; prints `used N`, the bytes of that stack used. With
///   SIZE (a multiple of 4096) the stack has a guard page below it.
/// - `fetchargs` (only [`Flavour::FentryNop`], not PIE; it has no `work`): calls
///   `take(struct thing *, const char *, long *)` four times with the data described at the
///   top of `c/fetchargs.c` (heap, stack, NULL and wild pointers, a 5000-byte string); prints
///   `gvar=0x.. gname=0x.. gwords=0x..` (its globals' addresses), then `calls=4`.
/// - `threads [N]` (N = 1000 by default): 4 threads released together by a barrier; thread
///   `t` calls `work(i, t)` for `i` in `0..N` (from `thread_main`); prints `total=<6N^2>`.
/// - `nested [N]` (N = 5 by default; it has no `work`): `main` calls `foo(N, 3)`, which calls
///   its GCC nested function `foo_internal` (symbol `foo_internal.0`) N times; prints
///   `calls=<N>` (foo_internal's own count), then `sum=<3N(N-1)/2>`. With `-mfentry` the
///   site follows `push %r10` (the static chain), at `foo_internal.0+2`.
pub fn fixture(program: &str, flavour: Flavour) -> Option<PathBuf> {
    match program {
        "sigstack" if flavour == Flavour::FentryCallPieRecord => {}
        "fetchargs" if flavour == Flavour::FentryNop => {}
        "calls" | "threads" | "nested" => {}
        "calls_lib" if flavour.supports_pic() => {}
        _ => return None,
    }
    Some(PathBuf::from(FIXTURES_DIR).join(format!("{program}-{}", flavour.name())))
}

/// Path of `mallocs`, built with no site flags: calls `malloc` with 11, 222, 3333 and 44444
/// bytes in that order, frees them, prints `mallocs done`.
pub fn mallocs_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("mallocs")
}

/// Path of `libc_calls [N]` (N = 20 by default, at most 1000), built with no site flags:
/// `malloc` of N blocks of `2000 + 16 i` bytes kept until the end (each call reaches libc's
/// internal `_int_malloc(arena, bytes)`),
/// N calls of `strlen` (an indirect function) and of `strtol`, one `qsort` of N ints, N calls
/// of `long bare(long x)` (`x + 1`, in assembly: no symbol size, no `.eh_frame` entry); prints
/// `calls=N sum=<S>`, S depending only on N.
pub fn libc_calls_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("libc_calls")
}

/// Path of `sdt N` (no site flags; `c/sdt.c`, `c/sdt_sema.c`): SDT markers
/// (`<sys/sdt.h>`) of provider `ftp`: `args` (a negative int, a char, a long, the constant 5,
/// a string), `inlined` (three copies), `guarded` (with a semaphore: it runs only while a
/// tracer holds it), `mem` (a memory operand), `global` (RIP-relative operands, in `.data`
/// and `.bss`) and `noargs`, each hit N times (`inlined` 3N); prints each round's `args`
/// and `global` values and its own counts (`inlined=3N guarded=G noargs=N`). `sdt -`: prints
/// `ready`, then runs one round per line of standard input, answering each with
/// `done guarded=G` (the guarded marker's runs so far): a target to attach to.
pub fn sdt_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("sdt")
}

/// Path of `sdt_throw N` (C++, no SDT of its own; `c/sdt_throw.cc`): throws and catches N
/// exceptions, so that libstdc++'s `libstdcxx:throw` and `libstdcxx:catch` markers fire;
/// prints each thrown object's address (`thrown I obj=0x...`) and `caught=N`.
pub fn sdt_throw_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("sdt_throw")
}

/// Path of `optlibc N [FUNC OFF...]` (no site flags, single-threaded; `c/optlibc.c`): N
/// rounds of calls of libc's `malloc`, `free`, `memcpy`, `memmove` and `strlen` (through
/// `dlsym`: the implementations this CPU uses), the same calls in every run; prints
/// `optlibc rounds=N sum=S`; `main` first calls `optlibc_begin` (empty: a probe there marks
/// where the program's own calls start). With FUNC (`malloc`, `memcpy`, `strlen`) and hex offsets, then
/// prints `code FUNC+0xOFF XX` on stderr for each: the first byte of its own code there.
pub fn optlibc_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("optlibc")
}

/// Path of `optrefuse MODE N` (no site flags; `c/optrefuse.c`): functions in assembly whose
/// probes an optimizer must refuse (a jump into the range, a jump table, a call that is not
/// the range's last instruction while its callee runs in a thread), beside `ref_plain`,
/// whose probe at +5 it may optimize; each mode prints the functions' own counts.
pub fn optrefuse_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("optrefuse")
}

/// Path of `optunwind N` (C++, `-rdynamic`, no site flags; `c/optunwind.cc`): `mid` (+8)
/// and `mid_direct` (+1), in assembly with CFI, call through a range that ends with the
/// call a function that throws or prints a `backtrace()`; prints the backtraces and
/// `calls=N caught=K sum=S`.
pub fn optunwind_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("optunwind")
}

/// Path of `spawns`, built with no site flags: runs `system("exit 3")`,
/// `popen("echo from-popen")` and `posix_spawn` of `sh -c "exit 4"`; prints
/// `system=3 popen=from-popen spawn=4`.
pub fn spawns_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("spawns")
}

/// Path of `forks MODE` (`-fpatchable-function-entry=5`): the parent calls `leaf` 3 times and
/// forks a child that calls it 5 times (arguments 100..105); with `daemon` the parent
/// returns at once and the child calls `leaf` 300 ms later; with `hold` the same, but the
/// child calls `leaf` once its standard input ends; with `wait` the parent waits for it. The
/// parent prints `forks done`.
pub fn forks_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("forks")
}

/// Path of `sigcalls N US` (`-fpatchable-function-entry=5`): `main` calls `work(i)` N times
/// (`work` calls `body`), and a SIGALRM handler every US µs calls `body` and `work` too;
/// prints `work=<calls> body=<calls>` as the functions counted them.
pub fn sigcalls_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("sigcalls")
}

/// Path of `rings MODE N K` (`-fpatchable-function-entry=5`, `-pthread`): `together`, N
/// threads behind a barrier each calling `ring_work` K times; `oneafter`, N threads one after
/// another (2 ms apart), thread t calling it K + t % 7 times. Each thread prints
/// `tid=<tid> calls=<calls>`, main `total=<calls>`, then (`together`) `VmRSS=<kB>
/// RssShmem=<kB>` as they were when every thread had made its calls and still held its ring,
/// and `VmHWM=<kB>` (the peak) at the end.
pub fn rings_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("rings")
}

/// Path of `fgraph_exc N` (C++, `-pg -mfentry -mrecord-mcount`, `-rdynamic`): N rounds of
/// exceptions through traced frames (caught higher up, rethrown, a destructor calling a
/// traced function during the unwind, a catch that returns without another traced call),
/// then `backtrace()` under three traced frames. Prints `bt: bt bt_mid bt_top main (deep)`,
/// `sum=S`, then its own call tree: `E depth name` per traced entry in order, `U name` per
/// call an exception cut off.
pub fn fgraph_exc_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("fgraph_exc")
}

/// Path of `fgraph_jmp N` (`-fpatchable-function-entry=5`, `_FORTIFY_SOURCE`): N rounds of
/// `longjmp` (`__longjmp_chk`) and `_longjmp` out of a recursion, and `siglongjmp` out of a
/// SIGUSR1 handler raised under traced frames. Prints `sum=S`, then `E depth name` per entry
/// of `down`, `leaf`, `handler`, `spin` in order and `J n` per jump (n calls cut off).
pub fn fgraph_jmp_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("fgraph_jmp")
}

/// Path of `fgraph_thr N` (C; sites by `patchable_function_entry` attribute only;
/// `-pthread`, not linked with libgcc_s): a thread that calls `pthread_exit` under N+3
/// traced frames, then one cancelled there, a cleanup handler in one frame calling traced
/// functions. Prints per thread `T name`, then `E depth name` per traced entry in order and
/// `U name` per call the unwind cut off, in the order their frames went.
pub fn fgraph_thr_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("fgraph_thr")
}

/// Path of `fgraph_sig SCALE` (C; sites by attribute only): four rounds of a recursion
/// (100 to 500 deep, times SCALE) whose bottom a timer signal interrupts; the SIGALRM
/// handler recurses and raises SIGUSR1 (whose handler calls a traced function), on the
/// thread's stack or on the signal stack, and in two rounds leaves by `siglongjmp`. Prints
/// `sum=S`, then `E depth name` per traced entry in order and `L name` per call a
/// siglongjmp cut off (deepest first).
pub fn fgraph_sig_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("fgraph_sig")
}

/// Path of `fgraph_co N` (C; sites by attribute only): three `makecontext` generators of
/// N, N+1, N+2 values, each yielding from inside traced calls, resumed round-robin by `main`
/// through `swapcontext`. Prints `E depth name` per traced entry in order (one depth count
/// per stack), then `sum=S`.
pub fn fgraph_co_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("fgraph_co")
}

/// Path of `fgraph_deep N` (C; sites by attribute only, none in `main`): a recursion N deep
/// (`leaf` every 100 levels), then `forker` forks: the child calls traced functions, prints
/// `T child` and its tree, and calls exit(0) inside `child_exit`; the parent waits, then
/// prints `T parent`, its tree and `rec=R child=0`, and calls exit(3) inside `finisher`.
/// Trees: `E depth name` per traced entry in order.
pub fn fgraph_deep_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("fgraph_deep")
}

/// Path of `report_tree` (C; sites by attribute only, `-pthread`): a known call tree, `a`
/// 3 times from `main` and once from the thread `worker`, each `a` calls `b` twice, each `b`
/// calls `c` twice. Prints `T name a=A b=B c=C` per thread (its own counts), then `C x` for
/// every argument `c` was called with.
pub fn report_tree_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("report_tree")
}

/// Path of `naps` (C; sites by attribute only): `main` calls `outer` then `nap(10)`;
/// `outer` calls `quick`, `nap(50)`, `nap(1)`, `quick`; `nap(ms)` calls `quick` and sleeps
/// `ms` milliseconds; `quick` takes well under a microsecond. Prints `quick=5`.
pub fn naps_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("naps")
}

/// Path of `gaps BURST AFTER` (C; sites by attribute only): a gap in its thread's ring at
/// a known place. Run by `ftprobe trace`/`record` (its parent) with a small ring: it stops
/// the CLI (SIGSTOP), calls `gap_burst(BURST)` (which
/// calls `gap_leaf` BURST times: the ring fills, the rest is dropped), resumes the CLI and
/// waits until it read the ring to its end, then calls `gap_after` AFTER times.
/// Prints `calls=C` (its traced calls) and `burst=B after=A`.
pub fn gaps_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("gaps")
}

/// Path of `pingpong ROUNDS BURST` (C; sites by attribute only, `-pthread`): the threads
/// `ping` (main) and `pong` take turns ROUNDS times each (default 20000) through pipes,
/// calling `ping` and `pong` BURST times (default 1) on their turns, so their events
/// alternate every few microseconds. Prints `ping=N pong=N` (the calls).
pub fn pingpong_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("pingpong")
}

/// Path of `churn WAVES PER GAP_MS ITERS [together]` (`-fpatchable-function-entry=5`,
/// `-pthread`): WAVES waves of PER threads, each created and joined, GAP_MS ms apart; each
/// thread calls `churn_worker` once, `churn_mid` ITERS times and `churn_leaf` 3 x ITERS times
/// (`together`: the threads of a wave are all alive at once, waiting at a barrier after their
/// first event). Each thread prints `tid=<tid> calls=<its traced calls>`, main
/// `workers=<W> mid=<M> leaf=<L>` (the functions' own counts).
pub fn churn_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("churn")
}

/// Path of `tsd_exit [THREADS]` (`-fpatchable-function-entry=5`, `-pthread`): threads whose
/// `pthread_key` destructor calls `work` 10 times in each of two destructor rounds after the
/// thread's own call; prints `work=<its count>`.
pub fn tsd_exit_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("tsd_exit")
}

/// Path of `attach_target` (C, `-pg -mfentry -mnop-mcount -mrecord-mcount`, not PIE,
/// `-pthread`), a running program for `trace -p`: four threads besides main (a nanosleep
/// loop, a blocked pipe read, a busy loop calling `attach_loop`, a thread signalling itself
/// with SIGUSR1), `ready` once they all run; stdin commands `window N` (exactly N calls of
/// `attach_window`, then `window N done`), `nap MS` (one nanosleep in main, MS < 1000, then
/// `nap done`) and `quit` (prints
/// `eintr=0 bad=0 selfsig=ok reader=1 busy=yes` when nothing went wrong). `attach_target
/// prof`: the same with `ITIMER_PROF` every 1 ms of CPU time and a SIGPROF handler, as
/// gprof's runtime. `attach_target strict`: `ready`, then strict seccomp, one byte of stdin,
/// `bye`. See `c/attach_target.c`.
pub fn attach_target_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("attach_target")
}

/// Path of `procs_tree` (C; sites by attribute only, `-pthread`): a known call tree in two
/// threads of the program and two of its forked child (`a` calls `b` `x % 3 + 1` times, `b`
/// calls `c` twice). Prints `T pid tid name a=A b=B c=C` per thread (its own ids, name and
/// counts).
pub fn procs_tree_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("procs_tree")
}

/// Path of `fgraph_swstk below|above` (C; sites by attribute only, `-pthread`): a thread's
/// traced `switcher` moves rsp to a buffer by inline asm and calls traced functions there,
/// three times; the buffer is static data (`below` the thread's stack) or the upper half of
/// the mapping whose lower half is the thread's stack (`above`). Prints `E depth name` per
/// traced entry in order (its own nesting), then `sum=S`.
pub fn fgraph_swstk_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("fgraph_swstk")
}

/// The Rust panic fixture, built by the tests with rustc: (the directory holding
/// `libfxpanic.a`, the C half with sites, and the path of `rust/fgraph_panic.rs`).
pub fn fgraph_panic_parts() -> (PathBuf, PathBuf) {
    (
        PathBuf::from(FIXTURES_DIR),
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("rust/fgraph_panic.rs"),
    )
}

/// Path of `cxx N` (C++, `-pg -mfentry -mrecord-mcount` sites): `main` calls
/// `ns::K::get(i)` and `ns::twice<long>(...)` N times (default 3); prints `cxx=<sum>`
/// (`sum` of `2 * (100 + i)`).
pub fn cxx_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("cxx")
}

/// Path of `names` (C++ and C, `-pg -mfentry -mrecord-mcount` sites; c/names_ov.cc): `f(int)`
/// called 3 times and `f(double)` once; `top` calls `mid` 4 times, each `mid` calls `leaf`
/// twice; two static C functions named `helper` (names_st_a.c, names_st_b.c) called once and
/// twice. Prints `names f=12 chain=26 st=54`.
pub fn names_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("names")
}

/// Path of `ctors` (no sites), linked with `libfxctors.so` (`-pg -mfentry`, PIC): the
/// library's constructor calls `lib_traced` twice and starts a thread that calls
/// `thread_work` 4 times; its destructor calls `lib_traced` three times; `main` calls it once,
/// joins the thread and prints `ctors main done thread_work=4` with `printf` (flushed by
/// `exit`, after every destructor); the destructor writes `lib_traced calls=6` to stderr.
pub fn ctors_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("ctors")
}

/// Path of `cxx_stl N` (C++ at `-O0`, `-pg -mfentry -mrecord-mcount` sites): grows a
/// `std::vector<std::string>` to N strings (default 9) and runs `std::fill` on an array and a
/// vector of a struct, so that libstdc++ templates with hard names (`std::__relocate_a_1<...>`,
/// `std::__fill_a1<...>`) are functions of the program; prints `cxx_stl=<N> <1 + N> <3 + N>`.
pub fn cxx_stl_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("cxx_stl")
}

/// Path of `noreturn N` (`-fpatchable-function-entry=5`): `main` calls `work(N)` (default 1,
/// returns `3N + 1`) and ends with a call to `finish`, a `noreturn` function that prints
/// `noreturn=<3N + 1>` and exits 0; that call is `main`'s last instruction, so `finish`'s
/// return address is one past `main`'s end.
pub fn noreturn_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("noreturn")
}

/// Path of `execs MODE` (`-fpatchable-function-entry=5`): calls `work` twice, fails to
/// `execv` a path that does not exist, calls `work` once more, writes `execs sum=21` to
/// stderr (4 + 7 + 10), then execs `/bin/sh -c 'exit 7'` through the function MODE names (`execve`,
/// `execv`, `execvp`, `execvpe`, `execl`, `execle`, `execlp`, `fexecve`, `execveat`): exit
/// status 7.
pub fn execs_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("execs")
}

/// Path of `exec_a [MODE PROG ARGS...]` (`-pg -mfentry -mnop-mcount`, -no-pie, like
/// `exec_b`: their functions' addresses overlap): calls `ea_one` 3 times and `ea_two` 5
/// times, prints `exec_a ea_one=3 ea_two=5 ea_thread=T` and its environment entries that
/// start with `FTPROBE_` or `LD_PRELOAD` (`exec_a env ENTRY`); MODE `exec` then execs PROG
/// ARGS (`execv`); MODE `threads` first starts 3 threads that call `ea_thread` once each
/// (T = 3) and wait forever, then execs PROG ARGS from the main thread; MODE `closefds`
/// closes every descriptor from 3 to 1023, then execs PROG ARGS; MODE `vfork`: a `vfork`
/// child execs PROG ARGS, then this process calls `ea_one` twice more, prints
/// `exec_a ea_one=5 ea_two=5 ea_thread=0` and exits with the child's status.
pub fn exec_a_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("exec_a")
}

/// Path of `exec_b [N [fork]]` (see [`exec_a_fixture`]): calls `eb_alpha` N times (default
/// 4) and `eb_beta` 2N times, prints `exec_b eb_alpha=N eb_beta=2N` and its environment
/// entries that start with `FTPROBE_` or `LD_PRELOAD` (`exec_b env ENTRY`), exits 3; with
/// `fork`, a forked child does all that and the parent exits with its status.
pub fn exec_b_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("exec_b")
}

/// Path of `exec_b_static`: [`exec_b_fixture`] linked statically.
pub fn exec_b_static_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("exec_b_static")
}

/// Path of `own_sigtrap MODE` (no site flags): handles (0: signal, 1: sigaction), ignores
/// (2) or blocks (3: sigprocmask, 4: every signal in a thread) SIGTRAP itself, calls `work`
/// (1 + 3 times, + once from its handler in modes 0 and 1), prints `mode=M s=S traps=T`,
/// exits 5.
pub fn own_sigtrap_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("own_sigtrap")
}

/// Path of `indirect [N]` / `indirect faults N` (no site flags, `c/indirect.c`): indirect
/// calls and jumps through memory at known offsets (`callv+7` `call *(%rax)`, `ops_call+4`
/// `call *0x18(%rdi)`, `gotcall+4` `call *labs@GOTPCREL(%rip)`, `jtab+10`
/// `jmp *(%rax,%rcx,8)`, `jtab_nt+10` its `notrack` form, `callsp+21` `call *0x18(%rsp)`),
/// each called N times (default 5), the counts and results printed; `faults N`: N calls of
/// `callv` through a NULL vtable pointer, a PROT_NONE vtable, a NULL vtable entry, a
/// PROT_EXEC vtable (faults where protection keys make it execute-only) and a non-canonical
/// vtable entry, each fault caught by its SIGSEGV handler (`si_code`, `si_addr`, the PC and
/// the return address printed) and left by `siglongjmp`. Exits 3.
pub fn indirect_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("indirect")
}

/// Path of `indirect_cxx [N]` (C++, `-fno-devirtualize`, no site flags,
/// `c/indirect_cxx.cc`): N shapes of three classes; `total` (extern "C") makes one virtual
/// call per shape (`call *OFF(%reg)` through the vtable) and is called 3 times; prints
/// `virtual_calls=3N rect=R square=S tri=T sum=X`. Exits 3.
pub fn indirect_cxx_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("indirect_cxx")
}

/// Path of `own_malloc [N]` (`-fpatchable-function-entry=5`): defines its own `malloc`,
/// `calloc`, `realloc`, `free` (and the aligned ones) over a static arena, handing out blocks
/// 8 bytes past a 16-byte boundary; counts every call, and the calls made before `main` or
/// from `libftprobe_agent.so` (by return address); `main` calls `work(i)` N times (default
/// 10; each: 2 mallocs, one of them by libc's `strdup`, a calloc, a realloc, 3 frees); prints
/// `mallocs=M callocs=C reallocs=R frees=F aligned=A before_main=B agent_calls=X sum=S`, and
/// on stderr any call made after that line.
pub fn own_malloc_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("own_malloc")
}

/// Path of `libc_mallocs [N]` (no site flags): installs a SIGTRAP handler (`sigaction`) and a
/// SIGUSR1 one (`signal`), calls libc's `malloc` N times (default 7) and `free` N - 1 times;
/// prints `mallocs=M frees=F`, its own counts (and allocates nothing else: no stdio).
pub fn libc_mallocs_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("libc_mallocs")
}

/// Path of `sigmasks VARIANT [N]` (no site flags, so a probe on its `on_usr1` is an int3
/// probe): the SIGUSR1 handler `on_usr1` runs N times (default 5) under a mask that holds
/// SIGTRAP, set up the way VARIANT says (`fill`, `trap`, `jmp`, `swapctx`, `setctx`,
/// `sigset`, `signal`, `suspend`, `ppoll`, `pselect`, `epoll`, `thread`, `early`; see the
/// top of `c/sigmasks.c`; `early` uses SIGUSR2, whose action the constructor of the library
/// it links, `libsigearly.so`, installed before the agent's); it and `main` call `write`
/// 2N + 1 times; prints `VARIANT handled=H writes=W trap_in_sa_mask=T` (T: whether
/// `sigaction` reads back SIGTRAP in the action's mask, 1 for `fill`, `trap` and `early`). `raw` blocks SIGTRAP with a raw `rt_sigprocmask` syscall
/// before the same work; `selftrap` does the work, then kills itself with `raise(SIGTRAP)`.
pub fn sigmasks_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("sigmasks")
}

/// Path of `nofault MODE [N]` (`-fpatchable-function-entry=5`, see `c/nofault.c`): bad
/// pointers (NULL, unmapped, `PROT_NONE`, a string running into a hole, non-canonical, past a
/// file's end) passed to `take(t, s, p)`, which never reads through them; and the program's
/// own faults (`handler`, `altstack`, `overflow`, `die`) next to those calls.
pub fn nofault_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("nofault")
}

/// [`nofault_fixture`] built without site flags: a probe on `take` is an int3 probe.
pub fn nofault_int3_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("nofault_int3")
}

/// Path of `sigjmp_ret [JUMPS]` (no site flags, see `c/sigjmp_ret.c`): a 500 us SIGALRM
/// whose handler `on_alrm` leaves by `siglongjmp`, JUMPS times (default 200), out of a loop
/// calling `hot`; prints `hot_calls=C returned=R jumps=J handler_calls=H`.
pub fn sigjmp_ret_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("sigjmp_ret")
}

/// Path of `coswitch [N]` (no site flags, see `c/coswitch.c`): main's `resume` and a
/// generator's `yield` switch with `swapcontext` N times (default 20000); prints
/// `resumes=R yields=Y`.
pub fn coswitch_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("coswitch")
}

/// Path of `probepath MODE [ARGS]` (`-fpatchable-function-entry=5`, see
/// `c/probepath.c`): what a probe must not change in a program (errno, SIGTRAP dispositions
/// and flags, faults in XOL slots, non-local exits out of signal handlers, a slow `dlopen`).
pub fn probepath_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("probepath")
}

/// Path of `signals MODE [ARGS]` (`-fpatchable-function-entry=5`, see `c/signals.c`): how
/// the program's own signal handlers see it (the stack a handler runs on, the interrupted PC
/// an asynchronous signal's handler sees).
pub fn signals_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("signals")
}

/// Path of `dlopen_main` (`c/dlopen_main.c`): `cycle LIB N M` loads, calls, unloads and
/// loads again a library with `dlopen`; `threads LIB LIB2 K R` loads and unloads LIB2 while
/// a second thread calls into LIB. Prints its own counts.
pub fn dlopen_main_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("dlopen_main")
}

/// Path of `libdlfix.so` (`c/dlopen_lib.c`): `dl_work`, called 3 times by its constructor.
pub fn dlfix_lib() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("libdlfix.so")
}

/// Path of `libdlplain.so`: `libdlfix.so` built without sites (plain `-O2 -fPIC`).
pub fn dlplain_lib() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("libdlplain.so")
}

/// Path of `libdlfix2.so`: `libdlfix.so` with `dl2_work` and `dl2_ctor` instead.
pub fn dlfix2_lib() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("libdlfix2.so")
}

/// Path of `libslowctor.so`, whose constructor sleeps 1 s (`probepath dlopen LIB`).
pub fn slowctor_lib() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("libslowctor.so")
}

/// Path of `calls-rs`: the `calls` fixture written in Rust and compiled by rustc with
/// `-Zpatchable-function-entry=5` (one LLVM NOP5 per function, `__patchable_function_entries`).
/// `calls-rs N`: `run_calls` calls `caller(N)` once, which calls `work(i, i + 1)` N times;
/// prints `sum=<2N^2 - N>`.
pub fn rust_fixture() -> PathBuf {
    PathBuf::from(FIXTURES_DIR).join("calls-rs")
}

/// Path of `libfxwork-<flavour>.so` (`work`, `caller`, `leaf_unused` with the flavour's sites
/// plus `-fPIC`), loaded by `calls_lib-<flavour>`; `None` where [`Flavour::supports_pic`] is
/// false.
pub fn fixture_lib(flavour: Flavour) -> Option<PathBuf> {
    flavour
        .supports_pic()
        .then(|| PathBuf::from(FIXTURES_DIR).join(format!("libfxwork-{}.so", flavour.name())))
}

/// The two flavours Lua 5.4 is built in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LuaBuild {
    /// [`Flavour::FentryNop`]: NOP5 at every entry, `__mcount_loc`, `-no-pie`.
    FentryNop,
    /// [`Flavour::Patchable`]: five `90` at every entry, `__patchable_function_entries`, PIE.
    Patchable,
}

impl LuaBuild {
    /// Both builds.
    pub const ALL: [LuaBuild; 2] = [LuaBuild::FentryNop, LuaBuild::Patchable];

    /// The site flavour of every function in this build (Lua's and the driver's).
    pub fn flavour(&self) -> Flavour {
        match self {
            LuaBuild::FentryNop => Flavour::FentryNop,
            LuaBuild::Patchable => Flavour::Patchable,
        }
    }
}

/// Path of the Lua 5.4 interpreter built in `build` (`lua-fentry-nop` or `lua-patchable`).
///
/// Usage: `lua-X [SCRIPT.lua [ARGS...]]`. It opens the standard libraries, sets `arg`, and
/// runs SCRIPT, or with no argument the bundled `tables.lua`; on error it prints the message
/// to stderr and exits 1. Both ways compile one chunk and make one `arg` table, so internal
/// call counts (e.g. `luaH_new`) under `tables.lua` minus those under `empty.lua` are the
/// script's own: [`LUA_TABLES_CREATED`].
pub fn lua(build: LuaBuild) -> PathBuf {
    PathBuf::from(LUA_DIR).join(format!("lua-{}", build.flavour().name()))
}

/// What `tables.lua` prints (`tables created: 1112`): the number of table constructors it
/// executes.
pub const LUA_TABLES_CREATED: u64 = 1112;

/// Absolute path of `crates/ftprobe-dev/lua/<name>`: `tables.lua`, `empty.lua`, or `fib.lua`
/// (`fib.lua [N]`, N = 27 by default, prints `fib(N) = <value>`, 196418 for 27), or
/// `opcodes.lua` (`opcodes.lua [N]`: N rounds, 3 by default, of code that runs most of the
/// VM's opcodes, metamethods, coroutines and errors; prints `opcodes <checksum>`).
pub fn lua_script(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("lua")
        .join(name)
}

/// The cargo profile directory (`<target-dir>/<profile>`, e.g. `target/debug`) this crate was
/// built into, where the agent `.so` and the `ftprobe` binary land.
///
/// Derived at build time from OUT_DIR (`<target-dir>/<profile>/build/ftprobe-dev-<hash>/out`);
/// `FTPROBE_TARGET_DIR` in the environment at run time overrides it (for a separate
/// `build-dir`, or a tree that was moved).
pub fn target_dir() -> PathBuf {
    match std::env::var_os("FTPROBE_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => PathBuf::from(TARGET_DIR),
    }
}

/// C functions with `-fpatchable-function-entry=5` sites (five `90` at each entry, listed in
/// `__patchable_function_entries`), compiled from `c/fxsites.c` with `-O2 -fPIC` into
/// `libfxsites.a` and linked into this crate, so any test executable depending on it has them.
pub mod fxsites {
    extern "C" {
        /// Returns `a + b`.
        pub fn fx_add(a: i64, b: i64) -> i64;
        /// Returns `a * b`.
        pub fn fx_mul(a: i64, b: i64) -> i64;
        /// Returns `x + 1`.
        pub fn fx_leaf(x: i64) -> i64;
        /// Calls `fx_leaf(x)` then `fx_leaf(x + 1)` and returns their sum, `2x + 3`.
        pub fn fx_twice(x: i64) -> i64;
        /// Returns 42 (for tests that redirect the instruction pointer).
        pub fn fx_ret_42() -> i64;
        /// Returns the `rbp` it runs with (after its site).
        pub fn fx_rbp_callee() -> i64;
        /// Calls `fx_rbp_callee` with its own `rbp` saved around the call; returns what it
        /// returned.
        pub fn fx_rbp_caller() -> i64;
        /// `a + b`, compiled with `-fpatchable-function-entry=5 -fcf-protection=full`:
        /// `endbr64`, then the site at +4.
        pub fn fx_cet_add(a: i64, b: i64) -> i64;
        /// `a * b`, as `fx_cet_add`.
        pub fn fx_cet_mul(a: i64, b: i64) -> i64;
        /// `a + b`, compiled with `-pg` (no `-mfentry`, no record section): `push %rbp;
        /// mov %rsp,%rbp; call *mcount@GOTPCREL(%rip)`, the site at +4, found by decoding.
        pub fn fx_pg_add(a: i64, b: i64) -> i64;
        /// `a * b`, as `fx_pg_add`.
        pub fn fx_pg_mul(a: i64, b: i64) -> i64;
    }

    /// Calls and jumps through memory (`c/indirect_zoo.c`, assembly, no sites), for int3
    /// kprobes on them.
    pub mod izoo {
        extern "C" {
            /// `(*obj)[0](obj)`: a virtual call, `call *(%rax)` at +7.
            pub fn izoo_callv(obj: *const *const usize) -> i64;
            /// `f(x)` through `call *0x18(%rsp)` at +21, with `decoy` at `0x10(%rsp)`.
            pub fn izoo_callsp(
                f: extern "C" fn(i64) -> i64,
                x: i64,
                decoy: extern "C" fn(i64) -> i64,
            ) -> i64;
            /// `100 * (i + 1)` for `i` in 0..3, through `jmp *(%rax,%rcx,8)` at +10.
            pub fn izoo_jtab(i: i64) -> i64;
        }
    }

    /// The instruction zoo (`c/insn_zoo.c`, assembly, no sites): one function per class of
    /// instruction an int3 kprobe emulates or refuses.
    pub mod zoo {
        extern "C" {
            /// `x < 10 ? 1 : x < 100 ? 2 : 3`: `jl` rel8 and rel32.
            pub fn zoo_jcc(x: i64) -> i64;
            /// `n` (n >= 1): `loop`.
            pub fn zoo_loop(n: i64) -> i64;
            /// `n == 0 ? 0 : 5`: `jrcxz`.
            pub fn zoo_jrcxz(n: i64) -> i64;
            /// `x + 3`: `call rel32`, `call *%rbx`, `jmp rel8`, `jmp *%rax`.
            pub fn zoo_calls(x: i64) -> i64;
            /// `x`: `ret $8` in `zoo_retimm_inner`, `push imm`, `call`.
            pub fn zoo_retimm(x: i64) -> i64;
            /// `ret $8` with a word pushed by `zoo_retimm`.
            pub fn zoo_retimm_inner(x: i64) -> i64;
            /// `x + 7`, through `cpuid` at +3 (not boostable: its slot ends with a trap).
            pub fn zoo_cpuid(x: i64) -> i64;
            /// `zoo_data + 1` (42): RIP-relative `mov` and `cmpq $imm` after the displacement.
            pub fn zoo_riprel() -> i64;
            /// Never called: `syscall` and `int3` (refused), `call *mem` and `jmp *mem`.
            pub fn zoo_refused();
        }
    }
}

/// The fgraph (return hook) tests' functions (`c/fxgraph.c`, in `libfxsites.a`): compiled
/// with `-O2 -fipa-ra`, sites (`patchable_function_entry(5, 0)`) only on the functions that
/// are hooked, so their callers keep values in caller-saved registers across them.
pub mod fxgraph {
    /// `struct fxg_pair`: two return words (rax, rdx).
    #[repr(C)]
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct FxgPair {
        /// `3x`.
        pub a: i64,
        /// `5x`.
        pub b: i64,
    }

    extern "C" {
        /// `x + 1` (site).
        pub fn fxg_leaf(x: i64) -> i64;
        /// `fxg_leaf(x) + fxg_leaf(2x)` (site).
        pub fn fxg_mid(x: i64) -> i64;
        /// The sum of `fxg_mid(i)` for `i` in `0..n` (site).
        pub fn fxg_top(n: i64) -> i64;
        /// `1 + 2 + ... + n`, by recursion `n` deep (site).
        pub fn fxg_recurse(n: i64) -> i64;
        /// `{3x, 5x}` in rax:rdx (site).
        pub fn fxg_pair(x: i64) -> FxgPair;
        /// `fxg_leaf(2x)` by a tail call (`jmp`; site).
        pub fn fxg_tail(x: i64) -> i64;
        /// No site; keeps eight integers in caller-saved registers across calls of
        /// `fxg_ipa_leaf` (site, touches rdi and rax only).
        pub fn fxg_ipa_int(a: i64, b: i64, c: i64, d: i64, e: i64, f: i64) -> i64;
        /// No site; keeps doubles in xmm registers across calls of `fxg_ipa_fleaf` (site).
        #[allow(clippy::too_many_arguments)]
        pub fn fxg_ipa_float(a: f64, b: f64, c: f64, d: f64, e: f64, f: f64, g: f64, h: f64)
            -> f64;
        /// A site and a `ret`: touches no register.
        pub fn fxg_nop();
        /// Loads patterns into every register, calls `fxg_nop`, stores them into `out` (80
        /// words: 15 GPRs rax rbx rcx rdx rsi rdi rbp r8..r15 at 0..15, xmm0-15 at 16..48,
        /// with `avx != 0` the upper halves of ymm0-15 at 48..80).
        pub fn fxg_regs_harness(out: *mut u64, avx: i32);
        /// AVX2 only: 1 when a `__m256` returned in ymm0 by a hooked function, and one kept in
        /// a ymm register across a hooked call, are intact.
        pub fn fxg_m256_check() -> i32;
        /// `fork()` inside a hooked function: -7 in the child, the child's pid in the parent.
        pub fn fxg_fork() -> i64;
        /// Calls `cb` with its own return-address slot while it runs; returns what `cb` does
        /// (site).
        pub fn fxg_with_slot(cb: unsafe extern "C" fn(*mut *mut core::ffi::c_void) -> i64) -> i64;
    }
}

/// A spawned child that is killed (SIGKILL) and reaped when dropped, so a failing test leaves
/// no process behind.
#[derive(Debug)]
pub struct KillOnDrop(pub Child);

impl KillOnDrop {
    /// Spawns `cmd`.
    pub fn spawn(cmd: &mut Command) -> std::io::Result<KillOnDrop> {
        cmd.spawn().map(KillOnDrop)
    }
}

impl Deref for KillOnDrop {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl DerefMut for KillOnDrop {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // Errors mean it has already exited (kill) or been reaped (wait): nothing to do.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
