//! Changing the environment without the C library's allocator: `setenv` calls the program's
//! `malloc` (and the agent never does, see `alloc`); `unsetenv` only moves pointers.

use std::ffi::CStr;

/// Shorten the value of the environment variable `name` to `value`, in place. Returns false
/// (and changes nothing) when `name` is not set or `value` is longer than its current value.
///
/// # Safety
/// No other thread may read or change the environment meanwhile (the agent's constructor:
/// one thread).
pub unsafe fn shorten(name: &CStr, value: &str) -> bool {
    // SAFETY: a NUL-terminated name; the caller keeps other threads away.
    let cur = unsafe { libc::getenv(name.as_ptr()) };
    if cur.is_null() || value.as_bytes().contains(&0) {
        return false;
    }
    // SAFETY: getenv returns a NUL-terminated string, part of the "NAME=value" entry.
    let len = unsafe { CStr::from_ptr(cur) }.to_bytes().len();
    if value.len() > len {
        return false;
    }
    // SAFETY: the entry's value has `len` bytes and a NUL, in writable memory (the process's
    // initial stack, or a block `setenv` allocated); we write `value.len() + 1 <= len + 1`.
    unsafe {
        std::ptr::copy_nonoverlapping(value.as_ptr(), cur.cast::<u8>(), value.len());
        *cur.add(value.len()) = 0;
    }
    true
}
