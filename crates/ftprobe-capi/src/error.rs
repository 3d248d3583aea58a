//! Errors: each function returns 0 or a negative errno (the kernel's convention), and keeps
//! the error's text for [`ftprobe_last_error`], per thread (as `dlerror`).

use std::cell::RefCell;
use std::ffi::{CStr, CString};
use std::fmt::Display;

use libc::{c_char, c_int};

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Record `err` as this thread's last error and return `-errno`.
pub(crate) fn fail(errno: c_int, err: &dyn Display) -> c_int {
    let text = err.to_string().replace('\0', "\\0");
    let text = CString::new(text).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = text);
    -errno
}

/// The text of the last error of a call of this API on the calling thread ("" if none).
/// Calls that succeed leave it alone, as `errno`. The string stays valid until the next
/// failing call on this thread.
#[no_mangle]
pub extern "C" fn ftprobe_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// A C string argument as `&str`: NULL or not UTF-8 is -EINVAL.
///
/// # Safety
/// `s` is NULL or a NUL-terminated string valid for the call.
pub(crate) unsafe fn str_arg<'a>(s: *const c_char, what: &str) -> Result<&'a str, c_int> {
    if s.is_null() {
        return Err(fail(libc::EINVAL, &format!("{what} is NULL")));
    }
    // SAFETY: the caller's contract.
    let c = unsafe { CStr::from_ptr(s) };
    c.to_str()
        .map_err(|_| fail(libc::EINVAL, &format!("{what} is not UTF-8")))
}
