//! Every fixture runs and prints what it should, and every flavour's sites are the bytes
//! `Flavour` says, read back from the built files with binutils (`nm`, `objdump`).

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Output};

use ftprobe_dev::{
    fixture, fixture_lib, fxsites, lua, lua_script, target_dir, Flavour, KillOnDrop, LuaBuild,
    SiteInsn, ENDBR64, LUA_TABLES_CREATED, PROGRAMS, PUSH_RBP_MOV_RSP_RBP,
};

// ---------------------------------------------------------------------------------------
// helpers

fn run(path: &Path, args: &[&str]) -> Output {
    Command::new(path)
        .args(args)
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", path.display()))
}

/// Runs `path args`, expects exit 0 and nothing on stderr, returns stdout.
fn run_ok(path: &Path, args: &[&str]) -> String {
    let out = run(path, args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.is_empty(),
        "{} {args:?}: {}\n{stderr}",
        path.display(),
        out.status
    );
    String::from_utf8(out.stdout).expect("utf-8 stdout")
}

fn tool(cmd: &str, args: &[&str], file: &Path) -> String {
    let out = Command::new(cmd)
        .args(args)
        .arg(file)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd}: {e}"));
    assert!(out.status.success(), "{cmd} {args:?} {}", file.display());
    String::from_utf8(out.stdout).expect("utf-8")
}

/// Link-time address of a defined function symbol, from `nm`.
fn sym_addr(file: &Path, sym: &str) -> u64 {
    let nm = tool("nm", &[], file);
    nm.lines()
        .find_map(|l| {
            let mut it = l.split_whitespace();
            let (addr, kind, name) = (it.next()?, it.next()?, it.next()?);
            (name == sym && kind.eq_ignore_ascii_case("t")).then(|| u64::from_str_radix(addr, 16))
        })
        .unwrap_or_else(|| panic!("{sym} not in nm {}", file.display()))
        .expect("hex address")
}

/// The disassembly of `sym` from `objdump -d`: (address, bytes, text) per instruction line.
fn disasm(file: &Path, sym: &str) -> Vec<(u64, Vec<u8>, String)> {
    let text = tool("objdump", &["-d", &format!("--disassemble={sym}")], file);
    let mut insns = Vec::new();
    for line in text.lines() {
        // "  401180:\t0f 1f 44 00 00       \tnopl   0x0(%rax,%rax,1)"
        let mut cols = line.split('\t');
        let (Some(addr), Some(bytes)) = (cols.next(), cols.next()) else {
            continue;
        };
        let Some(addr) = addr.trim().strip_suffix(':') else {
            continue;
        };
        let Ok(addr) = u64::from_str_radix(addr, 16) else {
            continue;
        };
        let bytes = bytes
            .split_whitespace()
            .map(|b| u8::from_str_radix(b, 16).expect("hex byte"))
            .collect();
        insns.push((addr, bytes, cols.next().unwrap_or("").trim().to_string()));
    }
    assert!(
        !insns.is_empty(),
        "no disassembly of {sym} in {}",
        file.display()
    );
    insns
}

/// Link-time address and size of `section`, from `objdump -h`.
fn section_vma(file: &Path, section: &str) -> Option<(u64, u64)> {
    let headers = tool("objdump", &["-h", "-w"], file);
    headers.lines().find_map(|l| {
        // "Idx Name Size VMA LMA File-off Algn Flags"
        let cols: Vec<&str> = l.split_whitespace().collect();
        (cols.len() > 3 && cols[1] == section).then(|| {
            let hex = |s: &str| u64::from_str_radix(s, 16).expect("hex");
            (hex(cols[3]), hex(cols[2]))
        })
    })
}

/// The addresses listed in `section` as 8-byte words, or `None` if the file has no such
/// section. A word that the dynamic loader relocates (`R_X86_64_RELATIVE`, as in every PIE and
/// `.so`) is taken from the relocation's addend: GNU ld also writes it into the section, but
/// LLD (which rustc uses) leaves zeros there.
fn record_entries(file: &Path, section: &str) -> Option<Vec<u64>> {
    let (vma, size) = section_vma(file, section)?;
    let dump = tool("objdump", &["-s", "-j", section], file);
    let mut bytes = Vec::new();
    for line in dump.lines() {
        // " 200d a0110000 00000000 c0110000 00000000  ................"
        let Some(rest) = line.strip_prefix(' ') else {
            continue;
        };
        let Some((addr, data)) = rest.split_once(' ') else {
            continue;
        };
        if u64::from_str_radix(addr, 16).is_err() {
            continue;
        }
        // Four groups of 8 hex digits, each followed by a space, then the ASCII column.
        let hex: String = data
            .chars()
            .take(36)
            .filter(|c| !c.is_whitespace())
            .collect();
        for i in (0..hex.len()).step_by(2) {
            bytes.push(u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"));
        }
    }
    assert_eq!(bytes.len() as u64, size, "{section} of {}", file.display());
    assert_eq!(size % 8, 0, "{section} of {}", file.display());
    let mut entries: Vec<u64> = bytes
        .chunks(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect();
    for (offset, addend) in relative_relocs(file) {
        if (vma..vma + size).contains(&offset) {
            let slot = &mut entries[((offset - vma) / 8) as usize];
            assert!(
                *slot == 0 || *slot == addend,
                "{section}: {slot:#x} vs {addend:#x}"
            );
            *slot = addend;
        }
    }
    Some(entries)
}

/// (offset, addend) of every `R_X86_64_RELATIVE` dynamic relocation, from `readelf -rW`.
fn relative_relocs(file: &Path) -> Vec<(u64, u64)> {
    tool("readelf", &["-rW"], file)
        .lines()
        .filter_map(|l| {
            // "00000000000f1b80  0000000000000008 R_X86_64_RELATIVE                         8d160"
            let cols: Vec<&str> = l.split_whitespace().collect();
            (cols.len() == 4 && cols[2] == "R_X86_64_RELATIVE").then(|| {
                let hex = |s: &str| u64::from_str_radix(s, 16).expect("hex");
                (hex(cols[0]), hex(cols[3]))
            })
        })
        .collect()
}

/// Checks that `sym` in `file` has the flavour's site at the flavour's offset, and that the
/// record section (if any) lists it.
fn check_site(file: &Path, sym: &str, fl: Flavour) {
    let insns = disasm(file, sym);
    let text = insns
        .iter()
        .take(4)
        .map(|i| format!("{:x}: {}", i.0, i.2))
        .collect::<Vec<_>>()
        .join("; ");
    let ctx = format!("{sym} in {} ({fl:?}): {text}", file.display());
    let start = insns[0].0;
    // The first bytes of the function, across instructions.
    let bytes: Vec<u8> = insns
        .iter()
        .flat_map(|i| i.1.iter().copied())
        .take(16)
        .collect();

    if fl.has_endbr() {
        assert_eq!(bytes[..4], ENDBR64, "{ctx}");
    } else if fl.is_mcount() {
        assert_eq!(bytes[..4], PUSH_RBP_MOV_RSP_RBP, "{ctx}");
    }
    let site = insns
        .iter()
        .find(|i| i.0 == start + fl.site_offset())
        .unwrap_or_else(|| panic!("{ctx}: no instruction at +{}", fl.site_offset()));
    let insn = fl.site_insn();
    match insn {
        // objdump shows five `90` as five one-byte instructions.
        SiteInsn::FiveNops => {
            assert_eq!(bytes[fl.site_offset() as usize..][..5], [0x90; 5], "{ctx}")
        }
        _ => {
            assert_eq!(site.1.len() as u64, fl.site_len(), "{ctx}");
            assert!(site.1.starts_with(insn.prefix()), "{ctx}");
        }
    }
    if let SiteInsn::CallGotPcrel { target } | SiteInsn::CallRel32 { target } = insn {
        assert!(
            site.2.starts_with("call") && site.2.contains(target),
            "{ctx}"
        );
    }

    let addr = sym_addr(file, sym) + fl.site_offset();
    assert_eq!(
        addr,
        start + fl.site_offset(),
        "{ctx}: nm and objdump agree"
    );
    match fl.record_section() {
        Some(section) => {
            let entries =
                record_entries(file, section).unwrap_or_else(|| panic!("{ctx}: no {section}"));
            assert!(entries.contains(&addr), "{ctx}: {addr:#x} not in {section}");
        }
        None => {
            for section in ["__mcount_loc", "__patchable_function_entries"] {
                assert!(
                    record_entries(file, section).is_none(),
                    "{ctx}: has {section}"
                );
            }
        }
    }
}

/// Sum of `work(i, i + 1) = 3i + i + 1` for i in 0..n, as `caller(n)` computes it.
fn calls_sum(n: i64) -> i64 {
    (0..n).map(|i| 3 * i + (i + 1)).sum()
}

/// Sum over 4 threads t of `work(i, t) = 3i + t` for i in 0..n.
fn threads_total(n: i64) -> i64 {
    (0..4).flat_map(|t| (0..n).map(move |i| 3 * i + t)).sum()
}

fn fib(n: u64) -> u64 {
    if n < 2 {
        n
    } else {
        fib(n - 1) + fib(n - 2)
    }
}

// ---------------------------------------------------------------------------------------
// the C fixtures

#[test]
fn calls_prints_its_sum_in_every_flavour() {
    assert_eq!(calls_sum(7), 91);
    for fl in Flavour::ALL {
        let path = fixture("calls", fl).expect("calls builds in every flavour");
        assert_eq!(
            run_ok(&path, &["7"]),
            format!("sum={}\n", calls_sum(7)),
            "{fl:?}"
        );
        assert_eq!(
            run_ok(&path, &[]),
            format!("sum={}\n", calls_sum(10)),
            "{fl:?}"
        );
    }
}

#[test]
fn calls_lib_runs_where_pic_builds() {
    for fl in Flavour::ALL {
        let (Some(path), Some(lib)) = (fixture("calls_lib", fl), fixture_lib(fl)) else {
            assert!(!fl.supports_pic(), "{fl:?}");
            assert!(fixture("calls_lib", fl).is_none() && fixture_lib(fl).is_none());
            continue;
        };
        assert!(fl.supports_pic() && fl.is_pie(), "{fl:?}");
        assert!(lib.is_file(), "{}", lib.display());
        assert_eq!(
            run_ok(&path, &["7"]),
            format!("sum={}\n", calls_sum(7)),
            "{fl:?}"
        );
        // The main program has no sites of its own: only the library does.
        for section in ["__mcount_loc", "__patchable_function_entries"] {
            assert!(record_entries(&path, section).is_none(), "{fl:?} {section}");
        }
    }
}

#[test]
fn threads_prints_its_total_in_every_flavour() {
    assert_eq!(threads_total(1000), 6_000_000);
    for fl in Flavour::ALL {
        let path = fixture("threads", fl).expect("threads builds in every flavour");
        assert_eq!(
            run_ok(&path, &["3"]),
            format!("total={}\n", threads_total(3))
        );
        assert_eq!(
            run_ok(&path, &[]),
            format!("total={}\n", threads_total(1000))
        );
    }
}

#[test]
fn unknown_programs_are_none() {
    assert_eq!(fixture("cpp_fixture", Flavour::Patchable), None);
    for p in PROGRAMS {
        assert!(fixture(p, Flavour::Patchable).is_some(), "{p}");
    }
}

#[test]
fn sites_are_what_the_flavour_says() {
    for fl in Flavour::ALL {
        for prog in ["calls", "threads"] {
            let path = fixture(prog, fl).unwrap();
            for sym in ["work", "caller", "leaf_unused", "main"] {
                // `caller` and `main` have longer prologues: check only what holds for all.
                if fl.is_mcount() && sym != "work" && sym != "leaf_unused" {
                    continue;
                }
                check_site(&path, sym, fl);
            }
        }
        if let Some(lib) = fixture_lib(fl) {
            check_site(&lib, "work", fl);
            check_site(&lib, "leaf_unused", fl);
        }
    }
}

#[test]
fn record_sections_list_exactly_the_compiled_functions() {
    for fl in Flavour::ALL {
        let Some(section) = fl.record_section() else {
            continue;
        };
        // calls.c: work, caller, leaf_unused, main; nothing from crt files.
        let calls = fixture("calls", fl).unwrap();
        let entries: BTreeSet<u64> = record_entries(&calls, section)
            .unwrap()
            .into_iter()
            .collect();
        assert_eq!(entries.len(), 4, "{fl:?} {entries:x?}");
        for sym in ["work", "leaf_unused"] {
            assert!(entries.contains(&(sym_addr(&calls, sym) + fl.site_offset())));
        }
        if let Some(lib) = fixture_lib(fl) {
            assert_eq!(record_entries(&lib, section).unwrap().len(), 3, "{fl:?}");
        }
    }
}

#[test]
fn mcount_site_follows_the_whole_prologue() {
    // `caller` saves callee-saved registers after the frame pointer, so its mcount call is
    // further in than `work`'s: a probe at caller+0 is not on the site.
    for fl in [
        Flavour::McountPie,
        Flavour::McountNoPie,
        Flavour::McountPieRecord,
    ] {
        let path = fixture("calls", fl).unwrap();
        let insns = disasm(&path, "caller");
        let start = insns[0].0;
        let call = insns
            .iter()
            .find(|i| i.2.starts_with("call") && i.2.contains("mcount"))
            .expect("mcount call in caller");
        assert!(call.0 - start > fl.site_offset(), "{fl:?}: {insns:?}");
        assert_eq!(&insns[0].1[..], &[0x55], "{fl:?}: push %rbp first");
        if let Some(entries) = record_entries(&path, "__mcount_loc") {
            assert!(entries.contains(&call.0), "{fl:?}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// Lua

#[test]
fn lua_runs_the_three_scripts() {
    for b in LuaBuild::ALL {
        let lua = lua(b);
        let tables = format!("tables created: {LUA_TABLES_CREATED}\n");
        assert_eq!(run_ok(&lua, &[]), tables, "{b:?} bundled");
        let script = lua_script("tables.lua");
        assert_eq!(run_ok(&lua, &[script.to_str().unwrap()]), tables, "{b:?}");
        assert_eq!(
            run_ok(&lua, &[lua_script("empty.lua").to_str().unwrap()]),
            ""
        );
        let fib_lua = lua_script("fib.lua");
        let fib_lua = fib_lua.to_str().unwrap();
        assert_eq!(run_ok(&lua, &[fib_lua]), format!("fib(27) = {}\n", fib(27)));
        assert_eq!(
            run_ok(&lua, &[fib_lua, "12"]),
            format!("fib(12) = {}\n", fib(12))
        );
    }
}

#[test]
fn lua_reports_errors_with_status_1() {
    let dir = std::env::temp_dir().join(format!("ftprobe-dev-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.lua");
    std::fs::write(&bad, "error('boom from the script')\n").unwrap();
    for b in LuaBuild::ALL {
        for args in [vec![bad.to_str().unwrap()], vec!["/nonexistent/x.lua"]] {
            let out = run(&lua(b), &args);
            assert_eq!(out.status.code(), Some(1), "{b:?} {args:?}");
            assert!(out.stdout.is_empty());
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                stderr.contains("boom from the script") || stderr.contains("cannot open"),
                "{stderr}"
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn lua_functions_have_the_build_s_sites() {
    for b in LuaBuild::ALL {
        let fl = b.flavour();
        // Lua's own code (compiled by lua-src through the cc crate) and the driver's main.
        for sym in ["luaH_new", "luaV_execute", "lua_pcallk", "main"] {
            check_site(&lua(b), sym, fl);
        }
        let n = record_entries(&lua(b), fl.record_section().unwrap())
            .unwrap()
            .len();
        assert!(n > 500, "{b:?}: only {n} sites");
    }
}

/// Ground truth for `LUA_TABLES_CREATED`, independent of the script's own counter: gdb counts
/// the calls of `luaH_new` under tables.lua and under empty.lua. Skipped without gdb.
#[test]
fn lua_tables_created_matches_luah_new_calls() {
    if Command::new("gdb").arg("--version").output().is_err() {
        eprintln!("gdb not found: skipping the luaH_new ground-truth check");
        return;
    }
    let count = |lua: &Path, script: &str| -> u64 {
        let out = Command::new("gdb")
            .args([
                "-nx",
                "-q",
                "-batch",
                "-ex",
                "break luaH_new",
                "-ex",
                "ignore 1 100000000",
            ])
            .args(["-ex", "run", "-ex", "info breakpoints", "--args"])
            .arg(lua)
            .arg(lua_script(script))
            .output()
            .expect("gdb");
        let text = String::from_utf8_lossy(&out.stdout);
        let hits = text
            .lines()
            .find_map(|l| l.split("breakpoint already hit ").nth(1))
            .unwrap_or_else(|| panic!("no hit count:\n{text}"));
        hits.split_whitespace().next().unwrap().parse().unwrap()
    };
    for b in LuaBuild::ALL {
        let with = count(&lua(b), "tables.lua");
        let without = count(&lua(b), "empty.lua");
        assert_eq!(
            with - without,
            LUA_TABLES_CREATED,
            "{b:?}: {with} - {without}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// fxsites, KillOnDrop, target_dir

#[test]
fn fxsites_are_callable_and_patchable() {
    // SAFETY: plain C functions of integers, no pointers, no global state.
    let results = unsafe {
        [
            fxsites::fx_add(2, 3),
            fxsites::fx_mul(6, 7),
            fxsites::fx_leaf(9),
            fxsites::fx_twice(10),
            fxsites::fx_ret_42(),
        ]
    };
    assert_eq!(results, [5, 42, 10, 23, 42]);

    let exe = std::env::current_exe().unwrap();
    let funcs: [(&str, *const u8); 7] = [
        ("fx_add", fxsites::fx_add as *const u8),
        ("fx_mul", fxsites::fx_mul as *const u8),
        ("fx_leaf", fxsites::fx_leaf as *const u8),
        ("fx_twice", fxsites::fx_twice as *const u8),
        ("fx_ret_42", fxsites::fx_ret_42 as *const u8),
        ("fx_rbp_callee", fxsites::fx_rbp_callee as *const u8),
        ("fx_rbp_caller", fxsites::fx_rbp_caller as *const u8),
    ];
    // In the file: the linker kept __patchable_function_entries, and it lists exactly these
    // seven functions (nothing else in a Rust test executable has patchable entries).
    let entries: BTreeSet<u64> = record_entries(&exe, "__patchable_function_entries")
        .expect("the linker kept __patchable_function_entries")
        .into_iter()
        .collect();
    let link_addrs: BTreeSet<u64> = funcs.iter().map(|f| sym_addr(&exe, f.0)).collect();
    assert_eq!(entries, link_addrs);

    let bias = funcs[0].1 as u64 - sym_addr(&exe, "fx_add");
    let (vma, size) = section_vma(&exe, "__patchable_function_entries").unwrap();
    // SAFETY: the section is in a loaded PT_LOAD segment (flags WA) of this executable, at its
    // link-time address plus the load bias; `size` bytes, 8-aligned, no one writes it now.
    let live =
        unsafe { std::slice::from_raw_parts((vma + bias) as *const u64, (size / 8) as usize) };
    for (name, ptr) in funcs {
        // SAFETY: `ptr` is the entry of a function in this executable's mapped, readable text;
        // every one is longer than 5 bytes (five NOPs, then at least a `ret`).
        let code = unsafe { std::slice::from_raw_parts(ptr, 5) };
        assert_eq!(code, [0x90; 5], "{name}: nop;nop;nop;nop;nop in memory");
        // In memory, after relocation: the run-time addresses.
        assert!(
            live.contains(&(ptr as u64)),
            "{name} at {ptr:?} not in {live:x?}"
        );
    }
}

#[test]
fn kill_on_drop_kills_and_reaps() {
    // calls with a huge N runs for hours.
    let mut cmd = Command::new(fixture("calls", Flavour::Patchable).unwrap());
    cmd.arg("100000000000000");
    let child = KillOnDrop::spawn(&mut cmd).unwrap();
    let pid = child.id();
    let proc_dir = format!("/proc/{pid}");
    assert!(Path::new(&proc_dir).exists());
    drop(child);
    assert!(
        !Path::new(&proc_dir).exists(),
        "{pid} still there after drop"
    );
}

#[test]
fn target_dir_holds_this_test() {
    let dir = target_dir();
    assert!(dir.join("build").is_dir(), "{}", dir.display());
    let exe = std::env::current_exe().unwrap();
    assert!(
        exe.starts_with(&dir),
        "{} not under {}",
        exe.display(),
        dir.display()
    );
}
