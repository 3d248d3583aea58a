//! Changing the environment without the C library's allocator (`setenv` calls the program's
//! `malloc`, and the agent never does, see `alloc`) and without the C library's functions
//! at all: a program may define `getenv`/`unsetenv` itself (bash does: before its
//! variables exist, its `unsetenv` changes nothing, and it reads its `envp` from `main`),
//! and its definitions win over the C library's. The agent edits `environ` in place, as
//! glibc's `unsetenv` does, so `main`'s `envp` (the same array) sees it too; the bytes of
//! what it takes out are overwritten with NULs, so `/proc/PID/environ` no longer shows them.

use std::ffi::{c_char, CStr};

extern "C" {
    static mut environ: *mut *mut c_char;
}

/// The entry `NAME=value` of `name` in `environ`, as its index and pointer.
///
/// # Safety
/// No other thread may change the environment meanwhile.
unsafe fn find(name: &str) -> Option<(usize, *mut c_char)> {
    // SAFETY: `environ` is the C library's, a NULL-terminated array of NUL-terminated
    // strings; the caller keeps other threads away.
    let env = unsafe { environ };
    if env.is_null() {
        return None;
    }
    let mut i = 0;
    loop {
        // SAFETY: within the array, up to its NULL.
        let e = unsafe { *env.add(i) };
        if e.is_null() {
            return None;
        }
        // SAFETY: a NUL-terminated entry.
        let b = unsafe { CStr::from_ptr(e) }.to_bytes();
        if b.len() > name.len() && b.starts_with(name.as_bytes()) && b[name.len()] == b'=' {
            return Some((i, e));
        }
        i += 1;
    }
}

/// Overwrite `len` bytes at `p` with NULs.
///
/// # Safety
/// `p..p+len` is a writable entry of the environment no one else refers to.
unsafe fn clear(p: *mut c_char, len: usize) {
    // SAFETY: the caller's contract.
    unsafe { std::ptr::write_bytes(p, 0, len) };
}

/// Take `name` out of the environment (every entry of that name), in place. Returns whether
/// it was set.
///
/// # Safety
/// No other thread may read or change the environment meanwhile (the agent's constructor:
/// one thread); nothing else may keep a pointer into the entries taken out.
pub unsafe fn remove(name: &str) -> bool {
    let mut found = false;
    // SAFETY: the caller's contract.
    while let Some((i, e)) = unsafe { find(name) } {
        found = true;
        // SAFETY: `environ` has an entry at `i` and a NULL after the last: each pointer from
        // `i + 1` on moves down one place, the NULL included (glibc's unsetenv does this).
        unsafe {
            let env = environ;
            let mut j = i;
            loop {
                let next = *env.add(j + 1);
                *env.add(j) = next;
                if next.is_null() {
                    break;
                }
                j += 1;
            }
            clear(e, CStr::from_ptr(e).to_bytes().len());
        }
    }
    found
}

/// Shorten the value of the environment variable `name` to `value`, in place (the bytes
/// after it NULs). Returns false (and changes nothing) when `name` is not set or `value` is
/// longer than its current value.
///
/// # Safety
/// As [`remove`].
pub unsafe fn shorten(name: &str, value: &str) -> bool {
    // SAFETY: the caller's contract.
    let Some((_, e)) = (unsafe { find(name) }) else {
        return false;
    };
    if value.as_bytes().contains(&0) {
        return false;
    }
    // SAFETY: a NUL-terminated entry `NAME=value`.
    let total = unsafe { CStr::from_ptr(e) }.to_bytes().len();
    let len = total - name.len() - 1;
    if value.len() > len {
        return false;
    }
    // SAFETY: the entry's value has `len` bytes and a NUL, in writable memory (the process's
    // initial stack, or a block `setenv` allocated); `value.len() <= len` bytes are written,
    // then NULs up to the old end.
    unsafe {
        let v = e.add(name.len() + 1).cast::<u8>();
        std::ptr::copy_nonoverlapping(value.as_ptr(), v, value.len());
        clear(v.add(value.len()).cast(), len - value.len());
    }
    true
}
