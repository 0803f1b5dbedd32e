//! Turning libfabric return codes into `FabricError::Ofi`, and noticing
//! objects inherited across `fork()`.

use std::ffi::CStr;

use libfabric_sys as sys;

use crate::error::{FabricError, FabricResult};

/// `fi_strerror` of a (positive or negative) libfabric error code.
pub fn strerror(code: i64) -> String {
    let errnum = code.unsigned_abs().min(i32::MAX as u64) as i32;
    // SAFETY: fi_strerror returns a pointer to a static, NUL-terminated string
    // for every value (an "Unknown error" text for unknown ones).
    let msg = unsafe { CStr::from_ptr(sys::fi_strerror(errnum)) };
    msg.to_string_lossy().into_owned()
}

pub fn ofi_error(call: &'static str, code: i64) -> FabricError {
    FabricError::Ofi {
        call,
        code,
        message: strerror(code),
        peer: None,
    }
}

/// `Ok(())` for 0 (or a positive count), `FabricError::Ofi` for a negative code.
pub fn check(call: &'static str, rc: i64) -> FabricResult<()> {
    if rc < 0 {
        Err(ofi_error(call, rc))
    } else {
        Ok(())
    }
}

/// `fi_close` of `fid`, a `what` (named in the error).
///
/// # Safety
/// `fid` is a live libfabric object this process opened, closed at most once.
pub(crate) unsafe fn close_fid(fid: *mut sys::fid, what: &str) -> FabricResult<()> {
    // SAFETY: per this function's contract.
    let rc = unsafe { sys::ddfi_close(fid) } as i64;
    if rc < 0 {
        return Err(FabricError::Ofi {
            call: "fi_close",
            code: rc,
            message: format!("closing the {what}: {}", strerror(rc)),
            peer: None,
        });
    }
    Ok(())
}

/// The process that opened a libfabric object: after `fork()` the child
/// abandons its parent's objects, never closes them (the rule:
/// [`ddstore_core::fork`]).
pub use ddstore_core::fork::CreatedBy as OpenedBy;
