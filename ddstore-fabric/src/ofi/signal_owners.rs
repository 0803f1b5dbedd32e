//! Which signal handlers the PSM libraries installed. With
//! [`super::env::PROVIDER_SIGNAL_VARIABLES`] set before they load they install
//! none; a library loaded earlier by someone else (before pyddstore set them)
//! may have. The Python package puts Python's handlers back on these.

use std::ffi::{c_void, CStr};

/// The signals (1-31) whose handler lies in a PSM library (`libinfinipath*`,
/// `libpsm*`), found with `sigaction` and `dladdr`.
pub fn provider_signal_handlers() -> Vec<i32> {
    (1..32)
        .filter(|&sig| handler_library(sig).is_some_and(|lib| is_psm(&lib)))
        .collect()
}

fn is_psm(path: &str) -> bool {
    let file = path.rsplit('/').next().unwrap_or(path);
    file.starts_with("libinfinipath") || file.starts_with("libpsm")
}

/// The file of the shared object holding `sig`'s handler (None: default, ignored or unknown).
fn handler_library(sig: i32) -> Option<String> {
    // SAFETY: an all-zero sigaction is a valid value of this plain C struct.
    let mut current: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: a null new action makes sigaction only read the disposition into `current`.
    if unsafe { libc::sigaction(sig, std::ptr::null(), &mut current) } != 0 {
        return None;
    }
    let handler = current.sa_sigaction;
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        return None;
    }
    // SAFETY: an all-zero Dl_info is a valid value of this plain C struct.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only looks the address up in the loader's tables.
    if unsafe { libc::dladdr(handler as *const c_void, &mut info) } == 0 || info.dli_fname.is_null()
    {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated string of the loader's, valid while the
    // library stays loaded; it is copied at once.
    Some(
        unsafe { CStr::from_ptr(info.dli_fname) }
            .to_string_lossy()
            .into_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psm_libraries_are_told_apart() {
        assert!(is_psm("/lib/x86_64-linux-gnu/libinfinipath.so.4"));
        assert!(is_psm("/usr/lib64/libpsm2.so.2"));
        assert!(!is_psm("/usr/lib/libpython3.11.so.1.0"));
        assert!(!is_psm("/opt/psm/libc.so.6"));
    }
}
