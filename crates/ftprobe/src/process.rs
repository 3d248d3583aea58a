//! The objects loaded in this process (`dl_iterate_phdr`), and its thread count.

use std::ffi::CStr;
use std::path::PathBuf;

/// An object mapped in this process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadedObject {
    /// Its file (`/proc/self/exe` resolved for the main program).
    pub path: PathBuf,
    /// Load bias: process address = file address (svma) + bias.
    pub bias: u64,
}

/// Every object the dynamic linker has loaded, main program first; the vDSO (no file) is
/// left out.
pub fn loaded_objects() -> Vec<LoadedObject> {
    let mut out: Vec<LoadedObject> = Vec::new();
    unsafe extern "C" fn cb(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut libc::c_void,
    ) -> i32 {
        // SAFETY: dl_iterate_phdr passes a valid info for the duration of the call, and `data`
        // is the &mut Vec passed below, used by this thread only.
        let (info, out) = unsafe { (&*info, &mut *(data as *mut Vec<LoadedObject>)) };
        let name = if info.dlpi_name.is_null() {
            &[][..]
        } else {
            // SAFETY: a non-null dlpi_name is a NUL-terminated string owned by the linker.
            unsafe { CStr::from_ptr(info.dlpi_name) }.to_bytes()
        };
        let path = if name.is_empty() {
            if !out.is_empty() {
                return 0; // an unnamed object after the main program: the vDSO
            }
            std::fs::read_link("/proc/self/exe").unwrap_or_default()
        } else {
            PathBuf::from(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(name))
        };
        if path.as_os_str().is_empty() || path.to_string_lossy().starts_with("linux-vdso") {
            return 0;
        }
        out.push(LoadedObject {
            path,
            bias: info.dlpi_addr,
        });
        0
    }
    // SAFETY: the callback matches dl_iterate_phdr's contract and only touches `out`.
    unsafe { libc::dl_iterate_phdr(Some(cb), (&mut out as *mut Vec<LoadedObject>).cast()) };
    out
}

/// How many threads this process has: the `Threads:` line of `/proc/self/status`. Read with
/// plain `open`/`read` (no `opendir`, which would call the C library's `malloc`: the agent
/// never does).
pub fn thread_count() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn thread_count_sees_a_new_thread() {
        let before = super::thread_count().unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            let _ = rx.recv();
        });
        // Other tests may start or end threads meanwhile: at least one more than none.
        assert!(super::thread_count().unwrap() >= 2);
        assert!(before >= 1);
        drop(tx);
        t.join().unwrap();
    }
}
