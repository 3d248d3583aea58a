//! Demangled names of C++ and Rust symbols: the full form (what `c++filt` prints) and the
//! short form a user types and the trace shows (what `c++filt --no-params` prints).
//!
//! Rust names go through `rustc-demangle` (legacy and v0 manglings, shown without the hash).
//! C++ names go through GNU libiberty's demangler (`cplus_demangle_v3_callback`, the code of
//! `c++filt`, linked from the system's `libiberty.a`; see build.rs) with `c++filt`'s options,
//! so both forms are byte for byte `c++filt`'s. Its callback interface allocates nothing (the
//! parse tree lives on the stack, the text comes in pieces), so it is safe in the agent, which
//! must not call the program's `malloc`. Built without libiberty, or for names longer than
//! [`GNU_MAX_LEN`], the `cpp_demangle` crate is used instead: it fails on some names that
//! `c++filt` demangles (`std::__fill_a1<...>` with an `enable_if` return type) and prints
//! others differently (empty template packs, a dropped parameter).

/// The longest name given to libiberty: its parse tree is a stack array of 2 components and
/// a substitution slot (~72 bytes) per byte of the name, ~600 KiB at this length, which the
/// threads that demangle (the agent's constructor and the CLI on the main thread, tests on
/// 2 MiB threads) can spare. libstdc++'s longest is under 1 KiB.
pub const GNU_MAX_LEN: usize = 8192;

/// Whether this build demangles C++ names with GNU libiberty (c++filt's demangler): false
/// when `libiberty.a` was not found at build time (Debian: `libiberty-dev`), and
/// `cpp_demangle` stands in (see the build script).
pub const WITH_LIBIBERTY: bool = cfg!(ftprobe_libiberty);

/// The demangled forms of a symbol name, none if it is not mangled: for C++ the full form
/// (with parameters, and `[clone .cold]` for a GCC clone, as `c++filt`) then the short form;
/// for Rust one form, without the hash.
///
/// The short form is `c++filt --no-params`'s, except for a GCC clone (`_Z7throweri.cold`,
/// `.isra.0`, `.part.0`, `.constprop.0`): there `c++filt` prints `thrower [clone .cold]`, and
/// the short form is `thrower.cold`, as perf shows it (the clone must not answer to the
/// function's own name, or `p thrower` would be ambiguous).
pub fn demangled_names(name: &str) -> Vec<String> {
    if let Ok(d) = rustc_demangle::try_demangle(name) {
        return vec![format!("{d:#}")];
    }
    if !name.starts_with("_Z") && !name.starts_with("_GLOBAL_") {
        return Vec::new();
    }
    let (base, clone) = match name.find('.') {
        Some(i) if name.starts_with("_Z") => (&name[..i], &name[i..]),
        _ => (name, ""),
    };
    let Some(full) = cxx_demangle(name, true) else {
        return Vec::new();
    };
    let mut out = vec![full];
    if let Some(short) = cxx_demangle(base, false) {
        out.push(format!("{short}{clone}"));
    }
    out
}

/// The name to show for a symbol: the short demangled form, or the name as is.
pub fn display_name(name: &str) -> String {
    demangled_names(name)
        .pop()
        .unwrap_or_else(|| name.to_owned())
}

/// One C++ name demangled with or without its parameters (and return type), by libiberty
/// where it is linked in.
fn cxx_demangle(name: &str, params: bool) -> Option<String> {
    #[cfg(ftprobe_libiberty)]
    if name.len() <= GNU_MAX_LEN {
        return gnu::demangle(name, params);
    }
    crate_demangle(name, params)
}

/// The `cpp_demangle` crate's answer, in `c++filt`'s layout (a clone suffix as
/// `[clone .suffix]` after the full form).
fn crate_demangle(name: &str, params: bool) -> Option<String> {
    let (base, clone) = match name.find('.') {
        Some(i) => (&name[..i], &name[i..]),
        None => (name, ""),
    };
    let sym = cpp_demangle::Symbol::new(base).ok()?;
    if params {
        let full = sym.demangle().ok()?;
        Some(if clone.is_empty() {
            full
        } else {
            format!("{full} [clone {clone}]")
        })
    } else {
        let short = cpp_demangle::DemangleOptions::new()
            .no_params()
            .no_return_type();
        sym.demangle_with_options(&short).ok()
    }
}

#[cfg(ftprobe_libiberty)]
mod gnu {
    use std::ffi::{c_char, c_int, c_void, CString};

    /// Options of libiberty's demangle.h: include function arguments.
    const DMGL_PARAMS: c_int = 1 << 0;
    /// Include `const`, `volatile` and the like.
    const DMGL_ANSI: c_int = 1 << 1;
    /// Spell out `std::string` and friends (`c++filt` sets it).
    const DMGL_VERBOSE: c_int = 1 << 3;

    extern "C" {
        /// libiberty (demangle.h): demangles `mangled` with `options` and hands the text to
        /// `callback` in pieces; returns non-zero on success. No heap allocation.
        fn cplus_demangle_v3_callback(
            mangled: *const c_char,
            options: c_int,
            callback: unsafe extern "C" fn(*const c_char, usize, *mut c_void),
            opaque: *mut c_void,
        ) -> c_int;
    }

    /// Appends one piece of demangled text to the `Vec<u8>` behind `opaque`.
    ///
    /// # Safety
    ///
    /// `opaque` is the `&mut Vec<u8>` that [`demangle`] passed, and `text` points to `len`
    /// readable bytes (libiberty's contract).
    unsafe extern "C" fn append(text: *const c_char, len: usize, opaque: *mut c_void) {
        // SAFETY: see the function's contract; the two do not overlap (libiberty's buffer
        // is on its stack).
        unsafe {
            let out = &mut *opaque.cast::<Vec<u8>>();
            out.extend_from_slice(std::slice::from_raw_parts(text.cast::<u8>(), len));
        }
    }

    /// `name` demangled as `c++filt` does (`--no-params` when `params` is false).
    pub(super) fn demangle(name: &str, params: bool) -> Option<String> {
        let c = CString::new(name).ok()?;
        let mut options = DMGL_ANSI | DMGL_VERBOSE;
        if params {
            options |= DMGL_PARAMS;
        }
        let mut out: Vec<u8> = Vec::new();
        // SAFETY: `c` is NUL-terminated and outlives the call; `append` receives `&mut out`,
        // which nothing else touches during the call, as its `opaque`. libiberty bounds its
        // recursion (DMGL_NO_RECURSE_LIMIT is not set) and the caller bounds the length.
        let ok = unsafe {
            cplus_demangle_v3_callback(c.as_ptr(), options, append, (&raw mut out).cast::<c_void>())
        };
        (ok != 0).then(|| String::from_utf8_lossy(&out).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::{demangled_names, display_name};

    #[test]
    fn cxx_names_and_their_gcc_clones() {
        assert_eq!(demangled_names("_Z7throweri"), ["thrower(int)", "thrower"]);
        // Regression: `thrower.cold` answered to `thrower` too, which made `p thrower`
        // ambiguous (found by a user).
        assert_eq!(
            demangled_names("_Z7throweri.cold"),
            ["thrower(int) [clone .cold]", "thrower.cold"]
        );
        assert_eq!(display_name("_ZN2ns1K3getEi.isra.0"), "ns::K::get.isra.0");
        assert_eq!(display_name("main.cold"), "main.cold");
        assert!(demangled_names("work").is_empty());
    }

    /// Regression: cpp_demangle 0.5 failed on this libstdc++ instantiation (uftrace's
    /// s-dwarf7), and the trace showed it mangled. The expected texts are `c++filt`'s and
    /// `c++filt --no-params`'s (binutils 2.40).
    #[cfg(ftprobe_libiberty)]
    #[test]
    fn names_cpp_demangle_failed_on_are_demangled_as_cxxfilt() {
        let fill = "_ZSt9__fill_a1IP2PtS0_EN9__gnu_cxx11__enable_ifIXntsrSt11__is_scalarIT0_E7__valueEvE6__typeET_S9_RKS5_";
        assert_eq!(
            demangled_names(fill),
            [
                "__gnu_cxx::__enable_if<!std::__is_scalar<Pt>::__value, void>::__type \
                 std::__fill_a1<Pt*, Pt>(Pt*, Pt*, Pt const&)",
                "std::__fill_a1<Pt*, Pt>"
            ]
        );
        // cpp_demangle dropped the first parameter here.
        assert_eq!(
            demangled_names("_ZNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEC2IS3_EEmcRKS3_")[0],
            "std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> >\
             ::basic_string<std::allocator<char> >(unsigned long, char, std::allocator<char> const&)"
        );
        // ... and printed an empty pack as `<Pt, >(Pt*, &&)`.
        assert_eq!(
            demangled_names("_ZSt10_ConstructI2PtJEEvPT_DpOT0_")[0],
            "void std::_Construct<Pt>(Pt*)"
        );
    }
}
