//! `fid_fabric`: the root of every other libfabric object.

use std::ptr;

use libfabric_sys as sys;

use super::error::{check, OpenedBy};
use super::info::Info;
use crate::error::FabricResult;

/// An open fabric with the info it was opened from (closed on drop).
pub struct Fabric {
    ptr: *mut sys::fid_fabric,
    /// The single `fi_info` entry every child object is opened from.
    info: Info,
    opened_by: OpenedBy,
}

// SAFETY: fabrics are opened with FI_THREAD_SAFE hints; the handle is only
// passed to libfabric, which serialises access itself.
unsafe impl Send for Fabric {}
// SAFETY: shared use only passes the handle to libfabric, which serialises access.
unsafe impl Sync for Fabric {}

impl Fabric {
    /// Opens the fabric of `info`'s first entry (copied, so `info` may be dropped).
    pub fn open(info: &Info) -> FabricResult<Fabric> {
        let info = info.dup_first()?;
        let mut ptr = ptr::null_mut();
        // SAFETY: fabric_attr comes from fi_getinfo; ptr receives the new object.
        let rc = unsafe { sys::fi_fabric((*info.as_ptr()).fabric_attr, &mut ptr, ptr::null_mut()) };
        check("fi_fabric", rc as i64)?;
        Ok(Fabric {
            ptr,
            info,
            opened_by: OpenedBy::this_process(),
        })
    }

    /// The provider entry it was opened from.
    pub fn info(&self) -> &Info {
        &self.info
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::fid_fabric {
        self.ptr
    }

    /// The process that opened it (a forked child must not close it).
    pub fn opened_by(&self) -> OpenedBy {
        self.opened_by
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        if !self.opened_by.is_this_process() {
            return; // inherited across fork(): abandon, never close
        }
        // SAFETY: every child holds an Arc<Fabric>, so all of them are closed by now.
        unsafe { sys::ddfi_close(&mut (*self.ptr).fid) };
    }
}
