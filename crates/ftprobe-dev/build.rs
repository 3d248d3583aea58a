//! Builds the fixtures from source into OUT_DIR (see src/lib.rs for the layout):
//!
//! - `fixtures/{calls,threads}-<flavour>` for every flavour, `fixtures/libfxwork-<flavour>.so`
//!   and `fixtures/calls_lib-<flavour>` for the flavours that support `-fPIC`;
//! - `libfxsites.a` (patchable entries), linked into this crate;
//! - `lua/lua-fentry-nop` and `lua/lua-patchable`: Lua 5.4 from the `lua-src` crate.
//!
//! Everything is compiled with the system `cc` (gcc); nothing prebuilt is used.

use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

#[allow(dead_code)]
mod flavour {
    include!("src/flavour.rs");
}
use flavour::Flavour;

/// Flags for every C fixture, besides the flavour's own.
const BASE_CFLAGS: &[&str] = &["-O2", "-g", "-fno-omit-frame-pointer"];

/// The C compiler: always the system `cc`, because the flavours' flags are gcc's.
const CC: &str = "cc";

fn main() {
    let manifest_dir =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    let c_dir = manifest_dir.join("c");
    let lua_dir = manifest_dir.join("lua");

    for f in [
        "build.rs",
        "src/flavour.rs",
        "c/work.c",
        "c/calls.c",
        "c/calls_lib_main.c",
        "c/threads.c",
        "c/fxsites.c",
        "c/fxsites_more.c",
        "c/fxgraph.c",
        "c/fgraph_exc.cc",
        "c/fgraph_jmp.c",
        "c/fgraph_thr.c",
        "c/fgraph_sig.c",
        "c/fgraph_co.c",
        "c/fgraph_deep.c",
        "c/fgraph_swstk.c",
        "c/fgraph_panic.c",
        "c/report_tree.c",
        "c/naps.c",
        "c/pingpong.c",
        "c/gaps.c",
        "c/procs_tree.c",
        "c/sigstack.c",
        "c/mallocs.c",
        "c/spawns.c",
        "c/forks.c",
        "c/sigcalls.c",
        "c/rings.c",
        "c/insn_zoo.c",
        "c/own_sigtrap.c",
        "c/ctors.c",
        "c/execs.c",
        "c/exec_a.c",
        "c/exec_b.c",
        "c/ctors_lib.c",
        "c/own_malloc.c",
        "c/libc_mallocs.c",
        "c/sigmasks.c",
        "c/nofault.c",
        "c/sigearly.c",
        "c/slowctor.c",
        "c/dlopen_lib.c",
        "c/dlopen_main.c",
        "c/probepath.c",
        "c/sigjmp_ret.c",
        "c/coswitch.c",
        "c/signals.c",
        "c/cxx.cc",
        "c/cxx_stl.cc",
        "c/names_ov.cc",
        "c/names_st_a.c",
        "c/names_st_b.c",
        "c/noreturn.c",
        "c/fetchargs.c",
        "c/attach_target.c",
        "c/nested.c",
        "c/libc_calls.c",
        "c/lua_driver.c",
        "c/optlibc.c",
        "c/optrefuse.c",
        "c/optunwind.cc",
        "c/indirect.c",
        "c/indirect_zoo.c",
        "c/indirect_cxx.cc",
        "c/sdt.c",
        "c/sdt_sema.c",
        "c/sdt_throw.cc",
        "lua/tables.lua",
        "rust/calls_rs.rs",
    ] {
        println!("cargo:rerun-if-changed={f}");
    }

    let fixtures = out_dir.join("fixtures");
    let objs = out_dir.join("obj");
    fs::create_dir_all(&fixtures).expect("create fixtures dir");
    fs::create_dir_all(&objs).expect("create obj dir");

    // The C fixtures in a second thread while Lua builds here (Lua is most of the time).
    std::thread::scope(|s| {
        s.spawn(|| {
            build_c_fixtures(&c_dir, &objs, &fixtures);
            build_fxsites(&c_dir, &objs, &out_dir);
            build_rust_fixture(&manifest_dir.join("rust/calls_rs.rs"), &fixtures);
        });
        build_lua(&c_dir, &lua_dir, &out_dir);
    });

    println!(
        "cargo:rustc-env=FTPROBE_DEV_FIXTURES_DIR={}",
        fixtures.display()
    );
    println!(
        "cargo:rustc-env=FTPROBE_DEV_TARGET_DIR={}",
        target_dir(&out_dir).display()
    );
}

/// `calls-rs`: the `calls` fixture in Rust with `-Zpatchable-function-entry=5` (stable rustc
/// accepts -Z flags with RUSTC_BOOTSTRAP=1), built by the same rustc that builds this crate.
fn build_rust_fixture(src: &Path, fixtures: &Path) {
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    run(Command::new(rustc)
        .env("RUSTC_BOOTSTRAP", "1")
        .args([
            "--edition=2021",
            "-Zpatchable-function-entry=5",
            "-Copt-level=2",
        ])
        .args(["--crate-name", "calls_rs", "-o"])
        .arg(fixtures.join("calls-rs"))
        .arg(src));
}

/// `calls`, `threads`, `nested` and `calls_lib` (+ `libfxwork`) in every flavour they build in.
fn build_c_fixtures(c_dir: &Path, objs: &Path, fixtures: &Path) {
    // calls_lib's main has no sites; one object serves every flavour.
    let lib_main = objs.join("calls_lib_main.o");
    compile(
        &c_dir.join("calls_lib_main.c"),
        &lib_main,
        &[BASE_CFLAGS],
        &[],
    );

    // fgraph (return hooks) fixtures: fgraph_exc, C++ exceptions through hooked frames
    // (-rdynamic: its backtrace() names its frames with dladdr); fgraph_jmp, longjmp,
    // _longjmp, siglongjmp from a handler and (_FORTIFY_SOURCE) __longjmp_chk.
    run(Command::new("g++")
        .args(BASE_CFLAGS)
        .args(["-pg", "-mfentry", "-mrecord-mcount", "-rdynamic"])
        .arg(c_dir.join("fgraph_exc.cc"))
        .arg("-o")
        .arg(fixtures.join("fgraph_exc")));
    // optunwind: exceptions and backtrace() through optimized probes (-rdynamic: backtrace
    // names the program's frames); no site flags.
    run(Command::new("g++")
        .args(BASE_CFLAGS)
        .arg("-rdynamic")
        .arg(c_dir.join("optunwind.cc"))
        .arg("-o")
        .arg(fixtures.join("optunwind")));
    let jmp = objs.join("fgraph_jmp.o");
    compile(
        &c_dir.join("fgraph_jmp.c"),
        &jmp,
        &[
            BASE_CFLAGS,
            &["-D_FORTIFY_SOURCE=2", "-fpatchable-function-entry=5"],
        ],
        &[],
    );
    link(&[&jmp], &fixtures.join("fgraph_jmp"), &[&[]]);
    // libfxpanic.a: the C half (sites by attribute, unwind tables) of the Rust panic fixture
    // `rust/fgraph_panic.rs`, which the tests build with the stable rustc.
    let panic = objs.join("fgraph_panic.o");
    compile(
        &c_dir.join("fgraph_panic.c"),
        &panic,
        &[BASE_CFLAGS, &["-fexceptions"]],
        &[],
    );
    let lib = fixtures.join("libfxpanic.a");
    let _ = fs::remove_file(&lib);
    run(Command::new("ar").arg("crs").arg(&lib).arg(&panic));

    // C++ with -mfentry sites: cxx, for demangled names; cxx_stl, libstdc++ templates kept
    // out of line (-O0), for names that are hard to demangle.
    let fl = Flavour::FentryCallPieRecord;
    for (name, opt) in [
        ("cxx", BASE_CFLAGS),
        ("cxx_stl", &["-O0", "-g", "-fno-omit-frame-pointer"][..]),
    ] {
        let obj = objs.join(format!("{name}.o"));
        run(Command::new("g++")
            .args(opt)
            .args(fl.cflags())
            .arg("-c")
            .arg(c_dir.join(format!("{name}.cc")))
            .arg("-o")
            .arg(&obj));
        run(Command::new("g++")
            .arg(&obj)
            .args(fl.ldflags())
            .arg("-o")
            .arg(fixtures.join(name)));
    }

    // indirect_cxx: C++ virtual calls kept indirect (-fno-devirtualize), no site flags.
    let obj = objs.join("indirect_cxx.o");
    run(Command::new("g++")
        .args(BASE_CFLAGS)
        .arg("-fno-devirtualize")
        .arg("-c")
        .arg(c_dir.join("indirect_cxx.cc"))
        .arg("-o")
        .arg(&obj));
    run(Command::new("g++")
        .arg(&obj)
        .arg("-o")
        .arg(fixtures.join("indirect_cxx")));

    // names: C++ overloads and two static C functions of the same name (-mfentry sites),
    // for the readers' names.
    let mut names_objs = Vec::new();
    for src in ["names_ov.cc", "names_st_a.c", "names_st_b.c"] {
        let obj = objs.join(format!("{src}.o"));
        run(Command::new(if src.ends_with(".cc") { "g++" } else { CC })
            .args(BASE_CFLAGS)
            .args(fl.cflags())
            .arg("-c")
            .arg(c_dir.join(src))
            .arg("-o")
            .arg(&obj));
        names_objs.push(obj);
    }
    run(Command::new("g++")
        .args(&names_objs)
        .args(fl.ldflags())
        .arg("-o")
        .arg(fixtures.join("names")));

    // Programs of one C file each. own_sigtrap: no site flags; a program that handles,
    // ignores or blocks SIGTRAP itself. mallocs: no site flags at all, like a program nobody
    // rebuilt. spawns: no site flags; system(), popen() and posix_spawn(). forks: patchable
    // entries; a forked child that outlives its parent. sigcalls: patchable entries; a
    // signal handler that calls traced functions. own_malloc: patchable entries; its own
    // malloc family, 8-byte-aligned. libc_mallocs: no site flags; counts its calls of libc's
    // malloc and free. sigmasks: no site flags; signal handlers under masks that hold
    // SIGTRAP. noreturn: patchable entries; main ends with a call to a noreturn function.
    // execs: patchable entries; a failed exec, then an exec through each member of the
    // family. libc_calls: no site flags; calls into libc's internal functions
    // (stripped-library probes). rings: patchable entries; threads for the ring buffers'
    // tests.
    let patchable = Flavour::Patchable;
    // libsigearly.so, for sigmasks: a library constructor that installs a signal action
    // before the agent's constructor runs.
    let early = objs.join("sigearly.o");
    compile(
        &c_dir.join("sigearly.c"),
        &early,
        &[BASE_CFLAGS, &["-fPIC"]],
        &[],
    );
    link(
        &[&early],
        &fixtures.join("libsigearly.so"),
        &[&["-shared", "-Wl,-soname,libsigearly.so"]],
    );
    // libslowctor.so, for probepath's dlopen mode: a constructor that sleeps 1 s.
    let slow = objs.join("slowctor.o");
    compile(
        &c_dir.join("slowctor.c"),
        &slow,
        &[BASE_CFLAGS, &["-fPIC"]],
        &[],
    );
    link(
        &[&slow],
        &fixtures.join("libslowctor.so"),
        &[&["-shared", "-Wl,-soname,libslowctor.so"]],
    );
    // dlopen_main and the libraries it loads with dlopen (libdlfix.so, libdlfix2.so): sites
    // by -fpatchable-function-entry=5.
    // libdlplain.so: the same library built with no site at all (its symbols are read only
    // when a probe names it).
    for (lib, sites, defs) in [
        ("dlfix", patchable.cflags(), &[][..]),
        (
            "dlfix2",
            patchable.cflags(),
            &["-DWORK=dl2_work", "-DCTOR=dl2_ctor"][..],
        ),
        ("dlplain", &[][..], &[][..]),
    ] {
        let obj = objs.join(format!("{lib}.o"));
        compile(
            &c_dir.join("dlopen_lib.c"),
            &obj,
            &[BASE_CFLAGS, sites, &["-fPIC"], defs],
            &[],
        );
        link(
            &[&obj],
            &fixtures.join(format!("lib{lib}.so")),
            &[&["-shared", &format!("-Wl,-soname,lib{lib}.so")]],
        );
    }
    let fixtures_dir = format!("-L{}", fixtures.display());
    let sigmasks_ld = [
        "-pthread",
        &fixtures_dir,
        "-lsigearly",
        "-Wl,-rpath,$ORIGIN",
    ];
    for (name, cflags, ldflags) in [
        ("own_sigtrap", &[][..], &["-pthread"][..]),
        ("mallocs", &[], &[]),
        ("spawns", &[], &[]),
        ("forks", patchable.cflags(), patchable.ldflags()),
        ("sigcalls", patchable.cflags(), patchable.ldflags()),
        // rings: threads together or one after another, each calling a traced function.
        ("rings", patchable.cflags(), &["-pthread"]),
        ("own_malloc", patchable.cflags(), patchable.ldflags()),
        ("libc_mallocs", &[], &[]),
        ("sigmasks", &[], &sigmasks_ld),
        ("noreturn", patchable.cflags(), patchable.ldflags()),
        ("execs", patchable.cflags(), patchable.ldflags()),
        ("libc_calls", &[], &[]),
        ("probepath", patchable.cflags(), &["-pthread"]),
        // sigjmp_ret: a timer handler leaves by siglongjmp, maybe out of a return hook.
        ("sigjmp_ret", &[], &[]),
        // coswitch: main and a generator switch with swapcontext, many times.
        ("coswitch", &[], &[]),
        ("dlopen_main", patchable.cflags(), &["-pthread", "-ldl"]),
        ("signals", patchable.cflags(), &[]),
        // fgraph (return hooks), sites by attribute: fgraph_thr, pthread_exit and
        // cancellation under traced frames; fgraph_sig, signal handlers at depth.
        ("fgraph_thr", &[], &["-pthread"]),
        // fgraph_co: swapcontext/makecontext coroutines.
        ("fgraph_sig", &[], &[]),
        ("fgraph_co", &[], &[]),
        // fgraph_deep: recursion deeper than the shadow stack, fork and exit in traced calls.
        ("fgraph_deep", &[], &[]),
        // fgraph_swstk: a stack switched by hand (inline asm).
        ("fgraph_swstk", &[], &["-pthread"]),
        // report_tree: a known call tree in two threads (report, dump).
        ("report_tree", &[], &["-pthread"]),
        // naps: calls of known durations (replay --min-duration).
        ("naps", &[], &[]),
        // pingpong: two threads whose events alternate (the live trace's merge).
        ("pingpong", &[], &["-pthread"]),
        // gaps: a gap in its ring at a known place (LOST marks).
        ("gaps", &[], &[]),
        // procs_tree: a known call tree in two processes of two threads (dump's pids).
        ("procs_tree", &[], &["-pthread"]),
        // churn: waves of short-lived threads (rings freed and claimed again, thread churn).
        ("churn", patchable.cflags(), &["-pthread"]),
        // tsd_exit: pthread_key destructors that call a traced function at threads' ends.
        ("tsd_exit", patchable.cflags(), &["-pthread"]),
        // optlibc, optrefuse: optprobes (libc's functions; asm functions an optimizer must
        // refuse, beside one it may optimize).
        ("optlibc", &[], &["-ldl"]),
        ("optrefuse", &[], &["-pthread"]),
        // indirect: no site flags; calls and jumps through memory (vtables, a GOT call,
        // jump tables, an rsp-based operand) and faults through bad pointers.
        ("indirect", &[], &[]),
        // nofault: bad pointers for fetch args, and the program's own faults (sites by
        // patchable entries; nofault_int3 below: the same without, for int3 probes).
        ("nofault", patchable.cflags(), &["-pthread"]),
    ] {
        let obj = objs.join(format!("{name}.o"));
        compile(
            &c_dir.join(format!("{name}.c")),
            &obj,
            &[BASE_CFLAGS, cflags],
            &[],
        );
        link(&[&obj], &fixtures.join(name), &[ldflags]);
    }
    // sdt: SDT markers (<sys/sdt.h>, Debian's systemtap-sdt-dev), one with a semaphore
    // (sdt_sema.c); sdt_throw: C++ exceptions, for libstdc++'s own markers.
    let sdt = objs.join("sdt.o");
    let sema = objs.join("sdt_sema.o");
    compile(&c_dir.join("sdt.c"), &sdt, &[BASE_CFLAGS], &[]);
    compile(&c_dir.join("sdt_sema.c"), &sema, &[BASE_CFLAGS], &[]);
    link(&[&sdt, &sema], &fixtures.join("sdt"), &[&[]]);
    run(Command::new("g++")
        .args(BASE_CFLAGS)
        .arg(c_dir.join("sdt_throw.cc"))
        .arg("-o")
        .arg(fixtures.join("sdt_throw")));
    let obj = objs.join("nofault_int3.o");
    compile(&c_dir.join("nofault.c"), &obj, &[BASE_CFLAGS], &[]);
    link(&[&obj], &fixtures.join("nofault_int3"), &[&["-pthread"]]);
    // attach_target: a running multithreaded program for `trace -p` (NOP5 sites in
    // __mcount_loc).
    let fl = Flavour::FentryNop;
    let obj = objs.join("attach_target.o");
    compile(
        &c_dir.join("attach_target.c"),
        &obj,
        &[BASE_CFLAGS, fl.cflags()],
        &[],
    );
    link(
        &[&obj],
        &fixtures.join("attach_target"),
        &[fl.ldflags(), &["-pthread"]],
    );

    // exec_a, exec_b (--follow-exec): `-pg -mfentry -mnop-mcount` and -no-pie, so that
    // both load at the same address and their functions' addresses overlap; exec_b_static:
    // exec_b linked statically (an exec that cannot be followed).
    let fl = Flavour::FentryNop;
    for name in ["exec_a", "exec_b"] {
        let obj = objs.join(format!("{name}.o"));
        compile(
            &c_dir.join(format!("{name}.c")),
            &obj,
            &[BASE_CFLAGS, fl.cflags()],
            &[],
        );
        link(
            &[&obj],
            &fixtures.join(name),
            &[fl.ldflags(), &["-pthread"]],
        );
    }
    link(
        &[&objs.join("exec_b.o")],
        &fixtures.join("exec_b_static"),
        &[&["-static"]],
    );

    // ctors + libfxctors: a `-pg -mfentry` library whose constructor and destructor call
    // its traced function; the program has no sites.
    let fl = Flavour::FentryCallPie;
    let obj = objs.join("ctors_lib.o");
    compile(
        &c_dir.join("ctors_lib.c"),
        &obj,
        &[BASE_CFLAGS, fl.cflags(), &["-fPIC"]],
        &[],
    );
    link(
        &[&obj],
        &fixtures.join("libfxctors.so"),
        &[&["-shared", "-Wl,-soname,libfxctors.so"]],
    );
    let obj = objs.join("ctors.o");
    compile(&c_dir.join("ctors.c"), &obj, &[BASE_CFLAGS], &[]);
    link(
        &[&obj],
        &fixtures.join("ctors"),
        &[&[
            &format!("-L{}", fixtures.display()),
            "-lfxctors",
            "-pthread",
            "-Wl,-rpath,$ORIGIN",
        ]],
    );

    // sigstack: one flavour is enough (the probe path's stack use does not depend on it).
    let fl = Flavour::FentryCallPieRecord;
    let obj = objs.join("sigstack.o");
    compile(
        &c_dir.join("sigstack.c"),
        &obj,
        &[BASE_CFLAGS, fl.cflags()],
        &[],
    );
    link(
        &[&obj],
        &fixtures.join(format!("sigstack-{}", fl.name())),
        &[fl.ldflags()],
    );

    // fetchargs: one flavour, not PIE, so its globals' addresses are known before it runs.
    let fl = Flavour::FentryNop;
    let obj = objs.join("fetchargs.o");
    compile(
        &c_dir.join("fetchargs.c"),
        &obj,
        &[BASE_CFLAGS, fl.cflags()],
        &[],
    );
    link(
        &[&obj],
        &fixtures.join(format!("fetchargs-{}", fl.name())),
        &[fl.ldflags()],
    );

    for fl in Flavour::ALL {
        let name = fl.name();
        for (prog, libs) in [
            ("calls", &[][..]),
            ("threads", &["-pthread"][..]),
            ("nested", &[][..]),
        ] {
            let obj = objs.join(format!("{prog}-{name}.o"));
            compile(
                &c_dir.join(format!("{prog}.c")),
                &obj,
                &[BASE_CFLAGS, fl.cflags()],
                &[],
            );
            link(
                &[&obj],
                &fixtures.join(format!("{prog}-{name}")),
                &[fl.ldflags(), libs],
            );
        }

        if fl.supports_pic() {
            let obj = objs.join(format!("fxwork-{name}.o"));
            compile(
                &c_dir.join("work.c"),
                &obj,
                &[BASE_CFLAGS, fl.cflags(), &["-fPIC"]],
                &[],
            );
            let soname = format!("libfxwork-{name}.so");
            link(
                &[&obj],
                &fixtures.join(&soname),
                &[&["-shared", &format!("-Wl,-soname,{soname}")]],
            );
            link(
                &[&lib_main],
                &fixtures.join(format!("calls_lib-{name}")),
                &[&[
                    &format!("-L{}", fixtures.display()),
                    &format!("-lfxwork-{name}"),
                    "-Wl,-rpath,$ORIGIN",
                ]],
            );
        }
    }
}

/// `libfxsites.a`, linked into this crate for `ftprobe_dev::fxsites`.
fn build_fxsites(c_dir: &Path, objs: &Path, out_dir: &Path) {
    let obj = objs.join("fxsites.o");
    compile(
        &c_dir.join("fxsites.c"),
        &obj,
        &[&["-O2", "-fPIC", "-fpatchable-function-entry=5"]],
        &[],
    );
    let cet = objs.join("fxsites_cet.o");
    compile(
        &c_dir.join("fxsites_more.c"),
        &cet,
        &[&[
            "-O2",
            "-fPIC",
            "-fpatchable-function-entry=5",
            "-fcf-protection=full",
            "-DFX(n)=fx_cet_##n",
        ]],
        &[],
    );
    let pg = objs.join("fxsites_pg.o");
    compile(
        &c_dir.join("fxsites_more.c"),
        &pg,
        &[&[
            "-O2",
            "-fPIC",
            "-pg",
            "-fcf-protection=none",
            "-DFX(n)=fx_pg_##n",
        ]],
        &[],
    );
    // The fgraph tests' functions: sites by attribute only, so that IPA-RA stays on.
    let graph = objs.join("fxgraph.o");
    compile(
        &c_dir.join("fxgraph.c"),
        &graph,
        &[&["-O2", "-g", "-fPIC", "-fipa-ra", "-fno-omit-frame-pointer"]],
        &[],
    );
    let zoo = objs.join("insn_zoo.o");
    compile(&c_dir.join("insn_zoo.c"), &zoo, &[&["-O2", "-fPIC"]], &[]);
    // Calls and jumps through memory, for the engine's int3 kprobe tests.
    let izoo = objs.join("indirect_zoo.o");
    compile(
        &c_dir.join("indirect_zoo.c"),
        &izoo,
        &[&["-O2", "-fPIC"]],
        &[],
    );
    let lib = out_dir.join("libfxsites.a");
    let _ = fs::remove_file(&lib);
    run(Command::new("ar")
        .arg("crs")
        .arg(&lib)
        .arg(&obj)
        .arg(&cet)
        .arg(&pg)
        .arg(&graph)
        .arg(&zoo)
        .arg(&izoo));
    println!("cargo:rustc-link-search=native={}", out_dir.display());
    println!("cargo:rustc-link-lib=static=fxsites");
}

/// The two Lua builds. `lua_src::Build` compiles the Lua 5.4 sources with the `cc` crate, which
/// appends `CFLAGS_<target>` after its own flags (`-fPIC` among them), so the flavour's trailing
/// `-fno-pie` wins where it has one.
fn build_lua(c_dir: &Path, lua_dir: &Path, out_dir: &Path) {
    let header = out_dir.join("lua-gen");
    fs::create_dir_all(&header).expect("create lua-gen dir");
    let script = fs::read(lua_dir.join("tables.lua")).expect("read lua/tables.lua");
    fs::write(
        header.join("tables_lua.h"),
        c_string_array("tables_lua", &script),
    )
    .expect("write tables_lua.h");

    let target = env::var("TARGET").expect("TARGET");
    let cflags_var = format!("CFLAGS_{target}");
    let bin_dir = out_dir.join("lua");
    fs::create_dir_all(&bin_dir).expect("create lua dir");

    for (name, fl) in [
        ("fentry-nop", Flavour::FentryNop),
        ("patchable", Flavour::Patchable),
    ] {
        // The other thread only spawns processes through `std::process::Command`, which
        // reads the environment under std's lock, as `set_var` writes it; and the compilers it
        // runs do not read CFLAGS.
        env::set_var(&cflags_var, fl.cflags().join(" "));
        let artifacts = lua_src::Build::new()
            .out_dir(out_dir.join(format!("lua-src-{name}")))
            .opt_level("2")
            .debug(false)
            .build(lua_src::Lua54);
        env::remove_var(&cflags_var);

        let obj = out_dir.join("obj").join(format!("lua_driver-{name}.o"));
        compile(
            &c_dir.join("lua_driver.c"),
            &obj,
            &[&["-O2"], fl.cflags()],
            &[artifacts.include_dir(), &header],
        );
        let lib_dir = format!("-L{}", artifacts.lib_dir().display());
        let libs: Vec<String> = artifacts.libs().iter().map(|l| format!("-l{l}")).collect();
        let libs: Vec<&str> = libs.iter().map(String::as_str).collect();
        link(
            &[&obj],
            &bin_dir.join(format!("lua-{name}")),
            &[fl.ldflags(), &[&lib_dir], &libs, &["-lm", "-ldl"]],
        );
    }
    println!("cargo:rustc-env=FTPROBE_DEV_LUA_DIR={}", bin_dir.display());
}

/// `static const char NAME[] = "...";` holding `bytes`.
fn c_string_array(name: &str, bytes: &[u8]) -> String {
    let mut s = format!("static const char {name}[] =\n\"");
    for &b in bytes {
        match b {
            b'\n' => s.push_str("\\n\"\n\""),
            b'"' => s.push_str("\\\""),
            b'\\' => s.push_str("\\\\"),
            b'?' => s.push_str("\\?"), // no trigraphs
            0x20..=0x7e => s.push(b as char),
            _ => write!(s, "\\{b:03o}").expect("write to String"),
        }
    }
    s.push_str("\";\n");
    s
}

/// `target/<profile>`: OUT_DIR is `<target>/<profile>/build/<pkg>-<hash>/out`.
fn target_dir(out_dir: &Path) -> PathBuf {
    out_dir
        .ancestors()
        .nth(3)
        .expect("OUT_DIR has the form <target>/<profile>/build/<pkg>-<hash>/out")
        .to_path_buf()
}

fn compile(src: &Path, obj: &Path, flag_sets: &[&[&str]], includes: &[&Path]) {
    let mut cmd = Command::new(CC);
    for flags in flag_sets {
        cmd.args(*flags);
    }
    for inc in includes {
        cmd.arg("-I").arg(inc);
    }
    cmd.arg("-c").arg(src).arg("-o").arg(obj);
    run(&mut cmd);
}

/// Links with `cc`, never with `-pg` (no gcrt1.o, no gmon.out).
fn link(objs: &[&Path], out: &Path, flag_sets: &[&[&str]]) {
    let mut cmd = Command::new(CC);
    cmd.args(objs).arg("-o").arg(out);
    for flags in flag_sets {
        cmd.args(*flags);
    }
    run(&mut cmd);
}

fn run(cmd: &mut Command) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    if !out.status.success() {
        panic!(
            "{cmd:?} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
