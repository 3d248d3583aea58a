//! SDT markers (USDT, `<sys/sdt.h>`): `ftprobe list sdt` and probe definitions on markers,
//! as perf's `perf list sdt` and `perf probe sdt_PROVIDER:NAME`
//! (tools/perf/util/probe-file.c, probe-event.c, symbol-elf.c).
//!
//! A definition whose target is `[OBJ:]sdt_PROVIDER:NAME` or `[OBJ:]%sdt_PROVIDER:NAME` is
//! expanded here, before the kernel-language parser sees it, into one uprobe-style
//! definition per copy of the marker (a marker inlined in several places has several):
//! `p:GRP/EVENT PATH:0xFILE_OFFSET[(0xSEMAPHORE_OFFSET)] ARGS`, which the engine registers
//! as one event with several probes (the kernel's multi-probe events) and whose semaphore
//! it counts while armed (the kernel's uprobe `ref_ctr_offset`). Unnamed events are
//! `sdt_PROVIDER/NAME`, as perf names them. Arguments: `$argN` (from 1) is the marker's Nth
//! operand converted to a fetch argument (see [`ftprobe::events::sdt`]), typed by its
//! size when no type follows; without arguments every operand is fetched as `argN`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use ftprobe::elf::{offset_of_svma, sdt_notes, segments_of, SdtNote};
use ftprobe::events::sdt::{sdt_args, SdtArg};
use ftprobe::events::{error_log, ProbeError, ProbeErrorKind};

/// One copy of a marker, in an object.
pub struct Marker {
    /// The object's file.
    pub path: PathBuf,
    /// The note.
    pub note: SdtNote,
    /// The file offset of the marker's `nop`.
    pub offset: u64,
    /// The file offset of its semaphore, when it has one.
    pub sem_offset: Option<u64>,
    /// Its operands as fetch arguments, or why one cannot be.
    pub args: Vec<Result<SdtArg, String>>,
}

/// The markers of one object file.
pub fn markers_of(path: &Path) -> Result<Vec<Marker>> {
    let data = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let notes =
        sdt_notes(&data).map_err(|e| anyhow::anyhow!("{}: SDT notes: {e}", path.display()))?;
    let segments = segments_of(&data);
    // Symbols for RIP-relative operands (`foo(%rip)`), read only when one has them.
    let symbols: std::collections::HashMap<String, u64> =
        if notes.iter().any(|n| n.args.contains("(%rip)")) {
            use object::{Object, ObjectSymbol};
            object::File::parse(&*data)
                .map(|f| {
                    f.symbols()
                        .chain(f.dynamic_symbols())
                        .filter(|s| s.is_definition())
                        .filter_map(|s| Some((s.name().ok()?.to_owned(), s.address())))
                        .collect()
                })
                .unwrap_or_default()
        } else {
            Default::default()
        };
    Ok(notes
        .into_iter()
        .filter_map(|note| {
            let offset = offset_of_svma(&segments, note.pc)?;
            let sem_offset = (note.semaphore != 0)
                .then(|| offset_of_svma(&segments, note.semaphore))
                .flatten();
            // `@+OFFS` puts OFFS at the probe's address minus its file offset: a symbol's
            // OFFS is its address minus the marker's address plus the marker's offset.
            let sym = |name: &str| -> Option<i64> {
                let a = *symbols.get(name)?;
                Some(a.wrapping_sub(note.pc).wrapping_add(offset) as i64)
            };
            let args = sdt_args(&note.args, &sym);
            Some(Marker {
                path: path.to_owned(),
                note,
                offset,
                sem_offset,
                args,
            })
        })
        .collect())
}

/// `prog` and the shared libraries it links, as the dynamic linker finds them (its
/// `--list` mode, what `ldd` runs; the program's own code does not run).
pub fn objects_of(prog: &Path) -> Result<Vec<PathBuf>> {
    let mut out = vec![prog.to_owned()];
    let data = std::fs::read(prog).with_context(|| format!("reading {}", prog.display()))?;
    let Some(interp) = interpreter(&data) else {
        return Ok(out);
    };
    let list = std::process::Command::new(&interp)
        .arg("--list")
        .arg(prog)
        .output()
        .with_context(|| format!("running {interp} --list {}", prog.display()))?;
    for line in String::from_utf8_lossy(&list.stdout).lines() {
        // `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)`, or
        // `/lib64/ld-linux-x86-64.so.2 (0x...)`.
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.trim(),
            None => line.trim(),
        };
        let path = path.split(" (").next().unwrap_or_default();
        if path.starts_with('/') && !out.iter().any(|p| p == Path::new(path)) {
            out.push(PathBuf::from(path));
        }
    }
    Ok(out)
}

/// The `PT_INTERP` of an executable.
fn interpreter(data: &[u8]) -> Option<String> {
    use object::read::elf::{FileHeader, ProgramHeader};
    let hdr = object::elf::FileHeader64::<object::Endianness>::parse(data).ok()?;
    let e = hdr.endian().ok()?;
    let ph = hdr
        .program_headers(e, data)
        .ok()?
        .iter()
        .find(|p| p.p_type(e) == object::elf::PT_INTERP)?;
    let bytes = ph.data(e, data).ok()?;
    let bytes = bytes.split(|&b| b == 0).next()?;
    Some(String::from_utf8_lossy(bytes).into_owned())
}

/// `ftprobe list sdt BIN`: the markers of BIN and the libraries it links, one line per copy,
/// as `perf list sdt` names them (`sdt_PROVIDER:NAME`), with the object, the marker's
/// address and file offset, its semaphore and its arguments.
pub fn list(bin: &Path) -> Result<()> {
    use std::io::Write;
    let objects = objects_of(bin)?;
    let mut rows: Vec<[String; 5]> = Vec::new();
    for o in &objects {
        for m in markers_of(o)? {
            rows.push([
                format!("sdt_{}:{}", m.note.provider, m.note.name),
                format!("{:#x}", m.note.pc),
                if m.note.semaphore != 0 {
                    format!("{:#x}", m.note.semaphore)
                } else {
                    "-".into()
                },
                o.display().to_string(),
                m.note.args.clone(),
            ]);
        }
    }
    let titles = ["# EVENT", "ADDRESS", "SEMAPHORE", "OBJECT", "ARGUMENTS"];
    let mut widths: Vec<usize> = titles.iter().map(|t| t.len()).collect();
    for r in &rows {
        for (w, v) in widths.iter_mut().zip(r) {
            *w = (*w).max(v.len());
        }
    }
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    writeln!(
        out,
        "# {} SDT markers [SDT event] in {} and the libraries it links",
        rows.len(),
        bin.display()
    )?;
    let cols: Vec<String> = titles.iter().map(|s| s.to_string()).collect();
    for r in std::iter::once(cols.as_slice()).chain(rows.iter().map(|r| r.as_slice())) {
        let (last, rest) = r.split_last().expect("columns");
        let mut line = String::new();
        for (c, w) in rest.iter().zip(&widths) {
            line.push_str(&format!("{c:<w$}  "));
        }
        line.push_str(last);
        writeln!(out, "{}", line.trim_end())?;
    }
    out.flush()?;
    Ok(())
}

/// An SDT target word: `[OBJ:][%]sdt_PROVIDER:NAME` as (OBJ, PROVIDER, NAME).
fn sdt_target(w: &str) -> Option<(Option<&str>, &str, &str)> {
    let (obj, rest) = match w.find("sdt_") {
        Some(0) => (None, w),
        Some(1) if w.starts_with('%') => (None, &w[1..]),
        Some(i) => {
            let before = &w[..i];
            let obj = before
                .strip_suffix(":%")
                .or_else(|| before.strip_suffix(':'))?;
            (Some(obj), &w[i..])
        }
        None => return None,
    };
    let (provider, name) = rest.strip_prefix("sdt_")?.split_once(':')?;
    if provider.is_empty() || name.is_empty() || name.contains([':', '%', '+']) {
        return None;
    }
    Some((obj, provider, name))
}

/// Words of a command with their byte offsets (white space separates them, as the
/// kernel's `argv_split`).
fn words(s: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in s.char_indices() {
        match (c.is_ascii_whitespace(), start) {
            (true, Some(b)) => {
                out.push((b, &s[b..i]));
                start = None;
            }
            (false, None) => start = Some(i),
            _ => {}
        }
    }
    if let Some(b) = start {
        out.push((b, &s[b..]));
    }
    out
}

/// A refused definition, in the `error_log` layout with a detail line.
fn refuse(d: &str, kind: ProbeErrorKind, pos: usize, detail: &str) -> anyhow::Error {
    eprintln!(
        "ftprobe: {}  ({detail})",
        error_log(d, &ProbeError::new(kind, pos))
    );
    anyhow::anyhow!("invalid probe definition ({})", kind.name())
}

/// `$argN` in `word` replaced by the marker's operand N (from 1); when `word` is a bare
/// `[NAME=]$argN`, the operand's type follows.
fn substitute(word: &str, args: &[Result<SdtArg, String>]) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = word;
    let mut last: Option<&SdtArg> = None;
    let bare = {
        let body = word.split_once('=').map_or(word, |(_, b)| b);
        body.strip_prefix("$arg")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    while let Some(i) = rest.find("$arg") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 4..];
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            out.push_str("$arg");
            rest = after;
            continue;
        }
        let n: usize = after[..digits]
            .parse()
            .map_err(|_| "bad $argN".to_owned())?;
        let a = match n.checked_sub(1).and_then(|i| args.get(i)) {
            Some(Ok(a)) => a,
            Some(Err(why)) => return Err(format!("$arg{n}: {why}")),
            None => return Err(format!("$arg{n}: the marker has {} arguments", args.len())),
        };
        out.push_str(&a.fetch);
        last = Some(a);
        rest = &after[digits..];
    }
    out.push_str(rest);
    if let (true, Some(SdtArg { ty: Some(t), .. })) = (bare, last) {
        out.push(':');
        out.push_str(t);
    }
    Ok(out)
}

/// Expand every SDT definition of `defs` (see the module's doc); the others are kept as
/// they are. `objects` gives the files to look in (called once, when some definition names
/// a marker).
pub fn expand_defs(
    defs: &[String],
    objects: impl FnOnce() -> Result<Vec<PathBuf>>,
) -> Result<Vec<String>> {
    let mut objects = Some(objects);
    let mut markers: Option<Vec<Marker>> = None;
    let mut out = Vec::new();
    for d in defs {
        let text = d.split('#').next().unwrap_or_default();
        let w = words(text);
        let Some((&(_, w0), &(p1, w1))) = w.first().zip(w.get(1)) else {
            out.push(d.clone());
            continue;
        };
        let Some((obj, provider, name)) = sdt_target(w1) else {
            out.push(d.clone());
            continue;
        };
        if !w0.starts_with('p') {
            return Err(refuse(
                d,
                ProbeErrorKind::BadRetprobe,
                p1,
                "an SDT marker is a point in a function: no return probe on it",
            ));
        }
        if markers.is_none() {
            let files = (objects.take().expect("objects asked for once"))()?;
            let mut all = Vec::new();
            for f in files {
                all.extend(markers_of(&f)?);
            }
            markers = Some(all);
        }
        let found: Vec<&Marker> = markers
            .as_deref()
            .unwrap_or_default()
            .iter()
            .filter(|m| m.note.provider == provider && m.note.name == name)
            .filter(|m| {
                obj.is_none_or(|o| {
                    let file = m.path.file_name().unwrap_or_default().to_string_lossy();
                    ftprobe::ftrace::module_matches(o, &file)
                })
            })
            .collect();
        if found.is_empty() {
            return Err(refuse(
                d,
                ProbeErrorKind::BadProbeAddr,
                p1,
                &format!(
                    "no SDT marker {provider}:{name} in {}the program or the libraries it links",
                    obj.map(|o| format!("{o} of ")).unwrap_or_default()
                ),
            ));
        }
        // `p[:[GRP/][EVENT]]`: perf's names where none is given.
        let (group, event) = match w0.split_once(':') {
            Some((_, n)) => match n.split_once('/') {
                Some((g, e)) => (
                    if g.is_empty() {
                        format!("sdt_{provider}")
                    } else {
                        g.to_owned()
                    },
                    if e.is_empty() {
                        name.to_owned()
                    } else {
                        e.to_owned()
                    },
                ),
                None if n.is_empty() => (format!("sdt_{provider}"), name.to_owned()),
                None => (format!("sdt_{provider}"), n.to_owned()),
            },
            None => (format!("sdt_{provider}"), name.to_owned()),
        };
        for m in found {
            let args = &m.args;
            // An absolute path: the parser takes `PATH:OFFSET` for a word with a `/`.
            let path = m.path.canonicalize().unwrap_or_else(|_| m.path.clone());
            let mut def = format!("p:{group}/{event} {}:{:#x}", path.display(), m.offset);
            if let Some(s) = m.sem_offset {
                def.push_str(&format!("({s:#x})"));
            }
            if w.len() > 2 {
                for &(p, a) in &w[2..] {
                    let a = substitute(a, args)
                        .map_err(|why| refuse(d, ProbeErrorKind::BadVar, p, &why))?;
                    def.push(' ');
                    def.push_str(&a);
                }
            } else {
                for (i, a) in args.iter().enumerate() {
                    match a {
                        Ok(a) => def.push_str(&format!(" arg{}={a}", i + 1)),
                        Err(why) => eprintln!(
                            "ftprobe: {d:?}: argument {} of {provider}:{name} is not fetched ({why})",
                            i + 1
                        ),
                    }
                }
            }
            out.push(def);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets() {
        assert_eq!(
            sdt_target("sdt_libc:setjmp"),
            Some((None, "libc", "setjmp"))
        );
        assert_eq!(
            sdt_target("%sdt_libc:setjmp"),
            Some((None, "libc", "setjmp"))
        );
        assert_eq!(
            sdt_target("libc.so.6:sdt_libc:setjmp"),
            Some((Some("libc.so.6"), "libc", "setjmp"))
        );
        assert_eq!(
            sdt_target("libc:%sdt_libc:setjmp"),
            Some((Some("libc"), "libc", "setjmp"))
        );
        assert_eq!(sdt_target("sdt_only"), None);
        assert_eq!(sdt_target("libx:sdt_f"), None);
        assert_eq!(sdt_target("malloc"), None);
    }

    #[test]
    fn arg_substitution() {
        let args = sdt_args("-4@%edi 8@-8(%rbp) 8@16(%rip)", &|_| None);
        assert_eq!(substitute("$arg1", &args).unwrap(), "%di:s32");
        assert_eq!(substitute("x=$arg2", &args).unwrap(), "x=-8(%bp):u64");
        assert_eq!(substitute("x=$arg1:u8", &args).unwrap(), "x=%di:u8");
        assert_eq!(
            substitute("s=+0($arg2):string", &args).unwrap(),
            "s=+0(-8(%bp)):string"
        );
        assert!(substitute("$arg3", &args)
            .unwrap_err()
            .contains("RIP-relative"));
        assert!(substitute("$arg4", &args)
            .unwrap_err()
            .contains("3 arguments"));
        assert_eq!(substitute("%ax", &args).unwrap(), "%ax");
    }
}
