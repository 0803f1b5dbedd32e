//! `fid_fabric`: the root of every other libfabric object.

use std::ptr;

use libfabric_sys as sys;

use super::error::{check, close_fid, OpenedBy};
use super::info::Info;
use crate::error::{close_owned, report_failed_close, FabricResult};

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

impl Fabric {
    /// Closes it now, reporting `fi_close`'s answer (`-FI_EBUSY`: a domain
    /// opened on it is still open; it is then abandoned, never closed again). Dropping it closes
    /// it too, but can only log a failure.
    pub fn close(self) -> FabricResult<()> {
        close_owned(self, Self::close_now)
    }

    /// Closes the handle once (a forked child abandons it, never closes it).
    fn close_now(&mut self) -> FabricResult<()> {
        let ptr = std::mem::replace(&mut self.ptr, ptr::null_mut());
        if ptr.is_null() || !self.opened_by.is_this_process() {
            return Ok(());
        }
        // SAFETY: every child holds an Arc<Fabric>, so all of them are closed
        // by now; the handle was taken out above, so it is closed once.
        unsafe { close_fid(ptr::addr_of_mut!((*ptr).fid), "fabric") }
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        report_failed_close("fabric", self.close_now());
    }
}
