//! Programs run by `exec` are not traced (the agent is gone from the new image) unless the
//! session follows execs (`--follow-exec`, [`follow`]): the agent tells the CLI when the
//! traced process replaces itself, so the trace can say where its events stop, or that they
//! go on in the new image (issue 9, item 3; issue 13, item 5).
//!
//! The exec family is interposed: `execve`, `execv`, `execvp`, `execvpe`, `fexecve`,
//! `execveat`, and the variadic `execl`, `execle`, `execlp` (naked entry points that gather
//! their arguments as glibc's own do: glibc's call its internal `__execve`, past any
//! interposer). Each writes a [`TEXT_EXEC`] record (`PID\tPATH`, the path `execvp` would run
//! found in `PATH` as it would) before the real call, and a [`TEXT_EXEC_FAILED`] record
//! (`PID\tERRNO`) if the call returns. With `--follow-exec` the note says whether the new
//! image is followed (`PID\tPATH\tfollowed`, `PID\tPATH\tnot followed: WHY`) and the real
//! call gets the environment [`follow::prepare`] built (`execv` and `execvp` then become
//! `execve` and `execvpe`). An `exec` by a raw system call, or in a `posix_spawn`
//! child (glibc's calls its internal `__execve`), is not seen.

use std::ffi::{c_char, c_int, CStr};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicUsize, Ordering};

use ftprobe::trace;

use crate::follow;

/// TEXT record kind: `PID\tPATH`, the process is about to exec PATH.
pub const TEXT_EXEC: u32 = 2;
/// TEXT record kind: `PID\tERRNO`, its last exec failed (it goes on, traced).
pub const TEXT_EXEC_FAILED: u32 = 3;

const NAMES: [&CStr; 6] = [
    c"execve",
    c"execv",
    c"execvp",
    c"execvpe",
    c"fexecve",
    c"execveat",
];
static NEXT: [AtomicUsize; 6] = [const { AtomicUsize::new(0) }; 6];

/// Resolve the C library's definitions: called when the agent starts.
pub fn init() {
    for (i, name) in NAMES.iter().enumerate() {
        next(i, name);
    }
    follow::init();
}

fn next(i: usize, name: &CStr) -> usize {
    // Relaxed: a cache; a racing lookup stores the same value.
    let mut f = NEXT[i].load(Ordering::Relaxed);
    if f == 0 {
        // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated name; a lookup only.
        f = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) } as usize;
        NEXT[i].store(f, Ordering::Relaxed);
    }
    f
}

fn errno() -> c_int {
    // SAFETY: this thread's errno.
    unsafe { *libc::__errno_location() }
}

fn set_errno(e: c_int) {
    // SAFETY: this thread's errno.
    unsafe { *libc::__errno_location() = e };
}

/// The file `execvp` runs for `file`: itself when it has a `/`, else the first executable
/// regular file of that name in `PATH` (glibc's default path when unset).
fn search_path(file: &[u8]) -> Vec<u8> {
    if file.contains(&b'/') || file.is_empty() {
        return file.to_vec();
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/bin:/usr/bin".into());
    for dir in path.as_bytes().split(|&b| b == b':') {
        let dir: &[u8] = if dir.is_empty() { b"." } else { dir };
        let mut cand = dir.to_vec();
        cand.push(b'/');
        cand.extend_from_slice(file);
        let p = std::path::Path::new(std::ffi::OsStr::from_bytes(&cand));
        let ok = std::fs::metadata(p).is_ok_and(|m| m.is_file())
            && std::ffi::CString::new(cand.clone())
                // SAFETY: a NUL-terminated path; access only checks it.
                .is_ok_and(|c| unsafe { libc::access(c.as_ptr(), libc::X_OK) } == 0);
        if ok {
            return cand;
        }
    }
    file.to_vec()
}

/// Note the exec of `path` (searched in `PATH` when `search`) for the CLI, and, when the
/// session follows execs, prepare the new image's environment from `envp` (`None`:
/// `environ`): `Some` when the exec is followed (pass its `envp`, and call
/// [`follow::exec_failed`] if the exec returns).
fn note(path: &[u8], search: bool, envp: Option<Argv>) -> Option<follow::Prepared> {
    trace::buffer()?;
    let e = errno();
    let path = if search {
        search_path(path)
    } else {
        path.to_vec()
    };
    // SAFETY: the caller's envp is null or NULL-terminated, as the exec function takes it.
    let prepared = unsafe { follow::prepare(&path, envp) };
    let pid = ftprobe::sys::getpid();
    let path = String::from_utf8_lossy(&path);
    let text = match &prepared {
        None => format!("{pid}\t{path}"),
        Some(Ok(_)) => format!("{pid}\t{path}\tfollowed"),
        Some(Err(why)) => format!("{pid}\t{path}\tnot followed: {why}"),
    };
    trace::write_text(TEXT_EXEC, &text);
    set_errno(e);
    prepared.and_then(Result::ok)
}

/// The exec returned: it failed with `errno` (`followed`: its environment was prepared).
fn note_failed(followed: bool) {
    if trace::buffer().is_none() {
        return;
    }
    let e = errno();
    if followed {
        follow::exec_failed();
    }
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    trace::write_text(TEXT_EXEC_FAILED, &format!("{pid}\t{e}"));
    set_errno(e);
}

/// The bytes of a C string, or an empty slice for a null pointer.
///
/// # Safety
/// `p` is null or NUL-terminated.
unsafe fn bytes<'a>(p: *const c_char) -> &'a [u8] {
    if p.is_null() {
        &[]
    } else {
        // SAFETY: the caller's contract.
        unsafe { CStr::from_ptr(p) }.to_bytes()
    }
}

type Argv = *const *const c_char;

macro_rules! forward {
    ($prep:expr, $i:expr, $ty:ty, ($($arg:expr),*)) => {{
        let f = next($i, NAMES[$i]);
        if f == 0 {
            set_errno(libc::ENOSYS);
            return -1;
        }
        // SAFETY: the C library's function of that name, of this type.
        let r = unsafe { std::mem::transmute::<usize, $ty>(f)($($arg),*) };
        note_failed($prep.is_some());
        r
    }};
}

/// The `envp` to pass: the prepared one when the exec is followed.
fn env_of(prep: &Option<follow::Prepared>, envp: Argv) -> Argv {
    prep.as_ref().map_or(envp, |p| p.envp.as_ptr())
}

type Execve = unsafe extern "C" fn(*const c_char, Argv, Argv) -> c_int;
type Execv = unsafe extern "C" fn(*const c_char, Argv) -> c_int;

/// Interposed `execve(2)`.
///
/// # Safety
/// As `execve(2)`.
#[no_mangle]
pub unsafe extern "C" fn execve(path: *const c_char, argv: Argv, envp: Argv) -> c_int {
    // SAFETY: the caller passes a C string.
    let prep = note(unsafe { bytes(path) }, false, Some(envp));
    forward!(prep, 0, Execve, (path, argv, env_of(&prep, envp)))
}

/// Interposed `execv(3)`.
///
/// # Safety
/// As `execv(3)`.
#[no_mangle]
pub unsafe extern "C" fn execv(path: *const c_char, argv: Argv) -> c_int {
    // SAFETY: the caller passes a C string.
    let prep = note(unsafe { bytes(path) }, false, None);
    if let Some(p) = &prep {
        // Followed: `execve` with the new image's environment.
        forward!(prep, 0, Execve, (path, argv, p.envp.as_ptr()))
    } else {
        forward!(prep, 1, Execv, (path, argv))
    }
}

/// Interposed `execvp(3)`.
///
/// # Safety
/// As `execvp(3)`.
#[no_mangle]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: Argv) -> c_int {
    // SAFETY: the caller passes a C string.
    let prep = note(unsafe { bytes(file) }, true, None);
    if let Some(p) = &prep {
        // Followed: `execvpe` with the new image's environment.
        forward!(prep, 3, Execve, (file, argv, p.envp.as_ptr()))
    } else {
        forward!(prep, 2, Execv, (file, argv))
    }
}

/// Interposed `execvpe(3)`.
///
/// # Safety
/// As `execvpe(3)`.
#[no_mangle]
pub unsafe extern "C" fn execvpe(file: *const c_char, argv: Argv, envp: Argv) -> c_int {
    // SAFETY: the caller passes a C string.
    let prep = note(unsafe { bytes(file) }, true, Some(envp));
    forward!(prep, 3, Execve, (file, argv, env_of(&prep, envp)))
}

/// Interposed `fexecve(3)`.
///
/// # Safety
/// As `fexecve(3)`.
#[no_mangle]
pub unsafe extern "C" fn fexecve(fd: c_int, argv: Argv, envp: Argv) -> c_int {
    let link = std::fs::read_link(format!("/proc/self/fd/{fd}")).unwrap_or_default();
    let prep = note(link.as_os_str().as_bytes(), false, Some(envp));
    forward!(
        prep,
        4,
        unsafe extern "C" fn(c_int, Argv, Argv) -> c_int,
        (fd, argv, env_of(&prep, envp))
    )
}

/// Interposed `execveat(2)`.
///
/// # Safety
/// As `execveat(2)`.
#[no_mangle]
pub unsafe extern "C" fn execveat(
    dirfd: c_int,
    path: *const c_char,
    argv: Argv,
    envp: Argv,
    flags: c_int,
) -> c_int {
    // SAFETY: the caller passes a C string.
    let p = unsafe { bytes(path) };
    let prep = if p.starts_with(b"/") {
        note(p, false, Some(envp))
    } else {
        let dir = if dirfd == libc::AT_FDCWD {
            std::env::current_dir().unwrap_or_default()
        } else {
            std::fs::read_link(format!("/proc/self/fd/{dirfd}")).unwrap_or_default()
        };
        let full = if p.is_empty() {
            dir
        } else {
            dir.join(std::ffi::OsStr::from_bytes(p))
        };
        note(full.as_os_str().as_bytes(), false, Some(envp))
    };
    forward!(
        prep,
        5,
        unsafe extern "C" fn(c_int, *const c_char, Argv, Argv, c_int) -> c_int,
        (dirfd, path, argv, env_of(&prep, envp), flags)
    )
}

/// Which variadic exec [`exec_l`] completes.
const L: u64 = 0;
const LE: u64 = 1;
const LP: u64 = 2;

/// The body of `execl`, `execle` and `execlp`: `regs` holds the six argument registers as
/// the caller left them (`path`, `arg0`, then the first variadic arguments), `stack` the
/// caller's stack arguments after them.
///
/// # Safety
/// Called only by the naked entry points below, with a NULL-terminated argument list.
unsafe extern "C" fn exec_l(regs: *const u64, stack: *const u64, which: u64) -> c_int {
    // The entry points saved six registers; the caller passed a NULL-terminated list (and,
    // for execle, the environment after it) in registers and then on its stack.
    let arg = |i: usize| -> *const c_char {
        (if i < 6 {
            // SAFETY: one of the six saved registers.
            unsafe { *regs.add(i) }
        } else {
            // SAFETY: a stack argument of the caller, up to its list's end (see above).
            unsafe { *stack.add(i - 6) }
        }) as *const c_char
    };
    let path = arg(0);
    let mut argv: Vec<*const c_char> = Vec::new();
    let mut i = 1;
    loop {
        let a = arg(i);
        argv.push(a);
        i += 1;
        if a.is_null() {
            break;
        }
    }
    // SAFETY: the arguments are the caller's, as execve/execvp take them.
    unsafe {
        match which {
            LE => execve(path, argv.as_ptr(), arg(i) as Argv),
            LP => execvp(path, argv.as_ptr()),
            _ => {
                extern "C" {
                    static environ: Argv;
                }
                execve(path, argv.as_ptr(), environ)
            }
        }
    }
}

macro_rules! variadic_exec {
    ($name:ident, $which:expr) => {
        /// Interposed variadic exec (see the module docs): saves the argument registers
        /// and passes them, with the caller's stack arguments, to [`exec_l`].
        ///
        /// # Safety
        /// As the C function of this name.
        #[no_mangle]
        #[unsafe(naked)]
        pub unsafe extern "C" fn $name() -> c_int {
            core::arch::naked_asm!(
                // Entry: rsp = 8 mod 16. 48 bytes of registers + 8 keep rsp 16-aligned.
                "sub rsp, 56",
                "mov [rsp], rdi",
                "mov [rsp + 8], rsi",
                "mov [rsp + 16], rdx",
                "mov [rsp + 24], rcx",
                "mov [rsp + 32], r8",
                "mov [rsp + 40], r9",
                "mov rdi, rsp",
                "lea rsi, [rsp + 64]",
                "mov edx, {which}",
                "call {body}",
                "add rsp, 56",
                "ret",
                which = const $which,
                body = sym exec_l,
            )
        }
    };
}

variadic_exec!(execl, L);
variadic_exec!(execle, LE);
variadic_exec!(execlp, LP);
