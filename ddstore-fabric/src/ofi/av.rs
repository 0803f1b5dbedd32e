//! `fid_av`: address vector (table) of the peers an endpoint reads from.

use std::os::raw::c_void;
use std::ptr;
use std::sync::Arc;

use libfabric_sys as sys;

use super::domain::Domain;
use super::error::{check, close_fid, OpenedBy};
use crate::error::{close_last, close_owned, report_failed_close, FabricError, FabricResult};

/// Longest endpoint name accepted from a peer (libfabric names are far shorter).
const MAX_NAME_BYTES: usize = 1024;

/// An address vector: the peers an endpoint can address (closed on drop).
pub struct Av {
    ptr: *mut sys::fid_av,
    opened_by: OpenedBy,
    _domain: Arc<Domain>,
}

// SAFETY: opened in an FI_THREAD_SAFE domain; libfabric serialises access.
unsafe impl Send for Av {}
// SAFETY: as for Send: libfabric serialises access to the AV.
unsafe impl Sync for Av {}

impl Av {
    /// Opens a table of `count` addresses in `domain`.
    pub fn open(domain: &Arc<Domain>, count: usize) -> FabricResult<Av> {
        let mut attr = sys::fi_av_attr {
            type_: sys::FI_AV_TABLE,
            count: count.max(1),
            ..Default::default()
        };
        let mut ptr = ptr::null_mut();
        // SAFETY: domain is alive; attr is valid; ptr receives the AV.
        let rc =
            unsafe { sys::ddfi_av_open(domain.as_ptr(), &mut attr, &mut ptr, ptr::null_mut()) };
        check("fi_av_open", rc as i64)?;
        Ok(Av {
            ptr,
            opened_by: OpenedBy::this_process(),
            _domain: domain.clone(),
        })
    }

    pub(crate) fn fid(&self) -> *mut sys::fid {
        // SAFETY: ptr is a live AV; only the address of its embedded fid is taken.
        unsafe { ptr::addr_of_mut!((*self.ptr).fid) }
    }

    /// Inserts endpoint names (from `fi_getname`), returning their fi_addr_t.
    /// The provider reads `addr_len` bytes (the length of its own names);
    /// shorter names (string formats such as shm's, whose length varies with
    /// the pid) are zero-padded to that length.
    pub fn insert(&self, names: &[&[u8]], addr_len: usize) -> FabricResult<Vec<sys::fi_addr_t>> {
        names
            .iter()
            .enumerate()
            .map(|(rank, name)| self.insert_one(rank, name, addr_len))
            .collect()
    }

    /// Inserts `rank`'s endpoint name, as [`Av::insert`] does.
    pub fn insert_one(
        &self,
        rank: usize,
        name: &[u8],
        addr_len: usize,
    ) -> FabricResult<sys::fi_addr_t> {
        if name.is_empty() || name.len() > addr_len.max(MAX_NAME_BYTES) {
            return Err(FabricError::Invalid(format!(
                "rank {rank} sent a {}-byte endpoint address, this provider uses {addr_len}",
                name.len()
            )));
        }
        let mut name = name.to_vec();
        name.resize(name.len().max(addr_len) + 1, 0);
        let mut addr: sys::fi_addr_t = sys::FI_ADDR_UNSPEC;
        // SAFETY: name is one address in this provider's format (the
        // provider reads only its own address length); addr receives one value.
        let rc = unsafe {
            sys::ddfi_av_insert(
                self.ptr,
                name.as_ptr() as *const c_void,
                1,
                &mut addr,
                0,
                ptr::null_mut(),
            )
        };
        if rc != 1 {
            check(
                "fi_av_insert",
                if rc < 0 {
                    rc as i64
                } else {
                    -(sys::FI_EINVAL as i64)
                },
            )?;
        }
        Ok(addr)
    }

    /// Removes one address (the provider drops its connection to that peer;
    /// operations still posted to it fail).
    pub fn remove(&self, addr: sys::fi_addr_t) -> FabricResult<()> {
        let mut addr = addr;
        // SAFETY: addr is one fi_addr_t this AV returned; count is 1.
        let rc = unsafe { sys::ddfi_av_remove(self.ptr, &mut addr, 1, 0) };
        check("fi_av_remove", rc as i64)
    }
}

impl Av {
    /// Closes it now, then its domain if it was the domain's last holder,
    /// reporting the first failure (an object whose close fails is abandoned, never closed again, with its parents). Dropping it
    /// closes it too, but can only log a failure.
    pub fn close(self) -> FabricResult<()> {
        let domain = self._domain.clone();
        close_owned(self, Self::close_now)?;
        close_last(domain, Domain::close)
    }

    /// Closes the handle once (a forked child abandons it, never closes it).
    fn close_now(&mut self) -> FabricResult<()> {
        if self.ptr.is_null() || !self.opened_by.is_this_process() {
            self.ptr = ptr::null_mut();
            return Ok(());
        }
        let fid = self.fid();
        self.ptr = ptr::null_mut();
        // SAFETY: endpoints bound to this AV hold an Arc<Av>: all closed by
        // now; the handle was taken out above, so it is closed once.
        unsafe { close_fid(fid, "address vector") }
    }
}

impl Drop for Av {
    fn drop(&mut self) {
        report_failed_close("address vector", self.close_now());
    }
}
