//! Issue 25, item 10: the CLI's modules depend one way. Every `crate::MODULE` a module's code
//! names (comments left out) is an edge; the graph of top-level modules (and of `export`'s
//! own) has no circle. A circle such as `record -> trace -> recording -> record` made every
//! change to one of them a change to all.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// (module, the modules its code names).
fn edges() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    let mut dirs = vec![src.clone()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                files.push(p);
            }
        }
    }
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(&src).unwrap().with_extension("");
        let parts: Vec<String> = rel
            .iter()
            .map(|c| c.to_string_lossy().into_owned())
            .filter(|c| c != "mod")
            .collect();
        let name = match parts.as_slice() {
            [m] if m == "main" => continue,
            // `export`'s modules are nodes of their own; attach's are attach.
            [m, sub] if m == "export" => format!("export::{sub}"),
            [m, ..] => m.clone(),
            [] => continue,
        };
        let text = std::fs::read_to_string(&f).unwrap();
        let deps = out.entry(name.clone()).or_default();
        for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
            for (at, _) in line.match_indices("crate::") {
                let rest = &line[at + "crate::".len()..];
                let m: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                let mut dep = m.clone();
                if m == "export" {
                    let sub: String = rest["export::".len().min(rest.len())..]
                        .chars()
                        .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                        .collect();
                    if ["chrome", "folded", "perfetto"].contains(&sub.as_str()) {
                        dep = format!("export::{sub}");
                    }
                }
                if !m.is_empty() && m != "usage" && dep != name {
                    deps.insert(dep);
                }
            }
        }
    }
    out
}

#[test]
fn the_cli_modules_depend_one_way() {
    let g = edges();
    assert!(g.len() > 15, "{g:?}");
    // Depth-first search for a back edge.
    fn visit(
        n: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) {
        if done.contains(n) {
            return;
        }
        if let Some(at) = path.iter().position(|p| p == n) {
            panic!("a circle: {} -> {n}", path[at..].join(" -> "));
        }
        path.push(n.to_owned());
        for d in g.get(n).into_iter().flatten() {
            visit(d, g, path, done);
        }
        path.pop();
        done.insert(n.to_owned());
    }
    let mut done = BTreeSet::new();
    for n in g.keys() {
        visit(n, &g, &mut Vec::new(), &mut done);
    }
    // The layering the docs give: the format and the session below the subcommands.
    for low in ["format", "session", "recording"] {
        for sub in ["trace", "record", "replay", "report", "dump"] {
            assert!(
                !g[low].contains(sub),
                "{low} names the subcommand {sub}: {:?}",
                g[low]
            );
        }
    }
}
