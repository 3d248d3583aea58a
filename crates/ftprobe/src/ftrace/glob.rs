//! The `set_ftrace_filter` / `set_ftrace_notrace` pattern language (kernel/trace/ftrace.c,
//! `ftrace_process_regex()`, `filter_parse_regex()` in kernel/trace/trace_events_filter.c):
//!
//! - a glob on the function name: `*` anywhere, `?`, `[..]` character classes;
//! - a leading `!` removes the matching functions from the set built so far;
//! - `:mod:OBJ` restricts the pattern to one object (a glob on its file name, with or without
//!   the `.so...` suffix: `:mod:libc` and `:mod:libc.so.6` both name `libc.so.6`); an empty
//!   function part, `:mod:OBJ` alone, means every function of that object.
//!
//! As in the kernel, an empty filter set means *every* function: `!foo` alone, or `foo` then
//! `!foo`, leaves the set empty and so traces everything (Documentation/trace/ftrace.rst).

use glob::Pattern;

/// A pattern that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid filter pattern {text:?} at column {col}: {msg}")]
pub struct FilterError {
    /// The pattern as written.
    pub text: String,
    /// 0-based byte offset of the problem in `text`.
    pub col: usize,
    /// What is wrong.
    pub msg: String,
}

/// One parsed filter pattern.
#[derive(Debug, Clone)]
pub struct FilterEntry {
    /// The pattern as written.
    pub text: String,
    /// `!`: remove matches instead of adding them.
    pub negate: bool,
    func: Option<Pattern>,
    module: Option<Pattern>,
}

impl FilterEntry {
    /// Parse one pattern.
    pub fn parse(text: &str) -> Result<FilterEntry, FilterError> {
        let err = |col: usize, msg: &str| FilterError {
            text: text.to_owned(),
            col,
            msg: msg.into(),
        };
        let trimmed = text.trim();
        let (negate, rest, base) = match trimmed.strip_prefix('!') {
            Some(r) => (true, r, 1),
            None => (false, trimmed, 0),
        };
        let (func, module) = match rest.find(":mod:") {
            Some(i) => (&rest[..i], Some((&rest[i + 5..], base + i + 5))),
            None => (rest, None),
        };
        if func.is_empty() && module.is_none() {
            return Err(err(base, "empty pattern"));
        }
        // A ':' that is not part of '::' (C++ and Rust names) would be a command.
        if let Some(i) = func.replace("::", "\0\0").find(':') {
            return Err(err(base + i, "unknown command (only :mod: is supported)"));
        }
        let func = if func.is_empty() {
            None
        } else {
            Some(Pattern::new(func).map_err(|e| err(base + e.pos, e.msg))?)
        };
        let module = match module {
            Some(("", col)) => return Err(err(col, "empty module name")),
            Some((m, col)) => Some(Pattern::new(m).map_err(|e| err(col + e.pos, e.msg))?),
            None => None,
        };
        Ok(FilterEntry {
            text: text.to_owned(),
            negate,
            func,
            module,
        })
    }

    /// Whether the function `func` of the object whose file name is `module` matches.
    pub fn matches(&self, func: &str, module: &str) -> bool {
        if let Some(m) = &self.module {
            if !module_names(module).any(|n| m.matches(n)) {
                return false;
            }
        }
        self.func.as_ref().is_none_or(|p| p.matches(func))
    }

    /// Whether the function whose symbol is `sym` and whose shown (short demangled) name is
    /// `shown`, of the object whose file name is `module`, matches: the pattern is matched
    /// against the symbol, the shown name, and, when it has a `(` (a C++ signature,
    /// `f(double)`), the full demangled form, as `c++filt` prints it. Every user of filters
    /// (the engine's `ftrace_ops` filters, the readers of a recording) matches through here.
    pub fn matches_function(&self, sym: &str, shown: &str, module: &str) -> bool {
        if self.matches(sym, module) || (shown != sym && self.matches(shown, module)) {
            return true;
        }
        self.func.as_ref().is_some_and(|p| p.as_str().contains('('))
            && sym.starts_with("_Z")
            && crate::demangle::demangled_names(sym)
                .first()
                .is_some_and(|full| self.matches(full, module))
    }

    /// Whether the pattern has a `:mod:` part.
    pub fn names_a_module(&self) -> bool {
        self.module.is_some()
    }

    /// Whether the `:mod:` part (if any) matches the object whose file name is `module`.
    pub fn matches_module(&self, module: &str) -> bool {
        self.module
            .as_ref()
            .is_none_or(|m| module_names(module).any(|n| m.matches(n)))
    }
}

/// The names an object answers to in `:mod:`: its file name, and for `libfoo.so.1` also
/// `libfoo.so` (the name programs link with) and `libfoo`.
pub fn module_names(file: &str) -> impl Iterator<Item = &str> {
    let so = file.find(".so").map(|i| [&file[..i], &file[..i + 3]]);
    std::iter::once(file).chain(so.into_iter().flatten())
}

/// Whether a function is in the set that `entries` build, in order: the last pattern that
/// matches it (`matches(entry)`) adds it, or with `!` removes it. Whether the set as a whole
/// ends up empty (the kernel's "every function") is for the caller, who knows all the
/// functions.
pub fn in_set(entries: &[FilterEntry], mut matches: impl FnMut(&FilterEntry) -> bool) -> bool {
    let mut on = false;
    for e in entries {
        if (on == e.negate) && matches(e) {
            on = !e.negate;
        }
    }
    on
}

/// Apply patterns in order over `(func, module)` pairs; returns a flag per pair.
/// `None` when the resulting set is empty (the kernel's "no filter": everything).
pub fn select<'a>(
    entries: &[FilterEntry],
    items: impl ExactSizeIterator<Item = (&'a str, &'a str)> + Clone,
) -> Option<Vec<bool>> {
    let mut set = vec![false; items.len()];
    for e in entries {
        for (i, (f, m)) in items.clone().enumerate() {
            if e.matches(f, m) {
                set[i] = !e.negate;
            }
        }
    }
    set.iter().any(|&b| b).then_some(set)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sel(pats: &[&str], items: &[(&'static str, &'static str)]) -> Option<Vec<bool>> {
        let e: Vec<_> = pats
            .iter()
            .map(|p| FilterEntry::parse(p).unwrap())
            .collect();
        select(&e, items.iter().copied())
    }

    const ITEMS: &[(&str, &str)] = &[
        ("luaH_new", "lua"),
        ("luaH_get", "lua"),
        ("luaV_execute", "lua"),
        ("malloc", "libc.so.6"),
        ("luaH_new", "libother.so"),
    ];

    #[test]
    fn globs() {
        assert_eq!(
            sel(&["luaH_new"], ITEMS),
            Some(vec![true, false, false, false, true])
        );
        assert_eq!(
            sel(&["luaH_*"], ITEMS),
            Some(vec![true, true, false, false, true])
        );
        assert_eq!(
            sel(&["*_execute"], ITEMS),
            Some(vec![false, false, true, false, false])
        );
        assert_eq!(
            sel(&["*H_*"], ITEMS),
            Some(vec![true, true, false, false, true])
        );
        assert_eq!(
            sel(&["luaH_ge?"], ITEMS),
            Some(vec![false, true, false, false, false])
        );
        assert_eq!(
            sel(&["lua[HV]_[ne]*"], ITEMS),
            Some(vec![true, false, true, false, true])
        );
        assert_eq!(sel(&["nothing"], ITEMS), None);
    }

    #[test]
    fn negation_and_kernel_empty_rule() {
        assert_eq!(
            sel(&["luaH_*", "!luaH_get"], ITEMS),
            Some(vec![true, false, false, false, true])
        );
        // Removing everything leaves an empty set, which means every function (kernel rule).
        assert_eq!(sel(&["luaH_new", "!luaH_new"], ITEMS), None);
        assert_eq!(sel(&["!malloc"], ITEMS), None);
    }

    #[test]
    fn modules() {
        assert_eq!(
            sel(&["luaH_new:mod:lua"], ITEMS),
            Some(vec![true, false, false, false, false])
        );
        assert_eq!(
            sel(&[":mod:libc"], ITEMS),
            Some(vec![false, false, false, true, false])
        );
        assert_eq!(
            sel(&["*:mod:libc.so.6"], ITEMS),
            Some(vec![false, false, false, true, false])
        );
        assert_eq!(
            sel(&["luaH_*", "!*:mod:libother"], ITEMS),
            Some(vec![true, true, false, false, false])
        );
    }

    #[test]
    fn errors_have_columns() {
        let e = FilterEntry::parse("!foo:bar").unwrap_err();
        assert_eq!(
            (e.col, e.msg.as_str()),
            (4, "unknown command (only :mod: is supported)")
        );
        let e = FilterEntry::parse("foo:mod:").unwrap_err();
        assert_eq!((e.col, e.msg.as_str()), (8, "empty module name"));
        let e = FilterEntry::parse("foo[").unwrap_err();
        assert_eq!(e.col, 3);
        assert!(FilterEntry::parse("").is_err());
    }

    #[test]
    fn in_set_follows_the_order_of_writes() {
        let e = |pats: &[&str]| -> Vec<FilterEntry> {
            pats.iter()
                .map(|p| FilterEntry::parse(p).unwrap())
                .collect()
        };
        let on = |pats: &[&str], name: &str| in_set(&e(pats), |x| x.matches(name, ""));
        assert!(on(&["mid"], "mid"));
        assert!(!on(&["mid", "!mid"], "mid"));
        assert!(!on(&["!mid"], "leaf"));
        assert!(on(&["*", "!mid"], "leaf"));
        assert!(on(&["!mid", "mid"], "mid"));
    }

    #[test]
    fn functions_match_by_symbol_short_name_or_signature() {
        let m = |p: &str, sym: &str, shown: &str| {
            FilterEntry::parse(p)
                .unwrap()
                .matches_function(sym, shown, "")
        };
        assert!(m("f", "_Z1fd", "f"));
        assert!(m("_Z1fd", "_Z1fd", "f"));
        assert!(m("f(double)", "_Z1fd", "f"));
        assert!(!m("f(int)", "_Z1fd", "f"));
        assert!(m("f(*)", "_Z1fi", "f"));
        // Without a `(`, the signature is not matched.
        assert!(!m("*double*", "_Z1fd", "f"));
        assert!(m("main", "main", "main"));
    }
}
