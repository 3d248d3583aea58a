//! `fixture-path NAME`: print the path of a built fixture, for scripts and the README:
//! `lua-fentry-nop`, `lua-patchable`, `lua-script:tables.lua`, or `PROGRAM-FLAVOUR`
//! (e.g. `calls-mcount-pie`). `fixture-path --list` prints every name.

use ftprobe_dev::{fixture, lua, lua_script, Flavour, LuaBuild, PROGRAMS};

fn names() -> Vec<(String, std::path::PathBuf)> {
    let mut v: Vec<_> = LuaBuild::ALL
        .iter()
        .map(|b| (format!("lua-{}", b.flavour().name()), lua(*b)))
        .collect();
    for p in PROGRAMS {
        for fl in Flavour::ALL {
            if let Some(path) = fixture(p, fl) {
                v.push((format!("{p}-{}", fl.name()), path));
            }
        }
    }
    v
}

fn main() {
    let Some(name) = std::env::args().nth(1) else {
        eprintln!("usage: fixture-path NAME | --list");
        std::process::exit(2);
    };
    if name == "--list" {
        for (n, p) in names() {
            println!("{n}\t{}", p.display());
        }
        return;
    }
    if let Some(script) = name.strip_prefix("lua-script:") {
        println!("{}", lua_script(script).display());
        return;
    }
    match names().into_iter().find(|(n, _)| *n == name) {
        Some((_, p)) => println!("{}", p.display()),
        None => {
            eprintln!("fixture-path: no fixture named {name:?} (try --list)");
            std::process::exit(1);
        }
    }
}
