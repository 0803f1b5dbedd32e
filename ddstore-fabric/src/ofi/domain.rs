//! `fid_domain`: one NIC (or provider instance) opened on a fabric.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use libfabric_sys as sys;

use super::error::{check, close_fid, OpenedBy};
use super::fabric::Fabric;
use super::info::InfoEntry;
use crate::error::{close_last, close_owned, report_failed_close, FabricResult};

/// An access domain of one fabric (closed on drop, after what it holds).
pub struct Domain {
    ptr: *mut sys::fid_domain,
    /// Keys we pick ourselves when the provider does not (no FI_MR_PROV_KEY):
    /// the n-th key is a keyed hash of n, so one key tells nothing of another.
    keys_issued: AtomicU64,
    key_hasher: RandomState,
    opened_by: OpenedBy,
    fabric: Arc<Fabric>,
}

// SAFETY: domains are opened with FI_THREAD_SAFE; libfabric serialises access.
unsafe impl Send for Domain {}
// SAFETY: as for Send: libfabric serialises access to the domain.
unsafe impl Sync for Domain {}

impl Domain {
    /// Opens the domain `fabric`'s info describes.
    pub fn open(fabric: &Arc<Fabric>) -> FabricResult<Arc<Domain>> {
        let mut ptr = ptr::null_mut();
        // SAFETY: the fabric and its info entry are alive; ptr receives the domain.
        let rc = unsafe {
            sys::ddfi_domain(
                fabric.as_ptr(),
                fabric.info().as_ptr(),
                &mut ptr,
                ptr::null_mut(),
            )
        };
        check("fi_domain", rc as i64)?;
        Ok(Arc::new(Domain {
            ptr,
            keys_issued: AtomicU64::new(0),
            key_hasher: RandomState::new(),
            opened_by: OpenedBy::this_process(),
            fabric: fabric.clone(),
        }))
    }

    /// The fabric it was opened in.
    pub(crate) fn fabric(&self) -> &Arc<Fabric> {
        &self.fabric
    }

    /// The `fi_info` entry this domain was opened with (as the provider returned it).
    pub fn info(&self) -> InfoEntry<'_> {
        self.fabric.info().first()
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::fid_domain {
        self.ptr
    }

    pub(crate) fn info_ptr(&self) -> *mut sys::fi_info {
        self.fabric.info().as_ptr()
    }

    /// Whether the provider requires this `FI_MR_*` mode bit.
    pub fn requires(&self, mr_bit: u32) -> bool {
        self.info().mr_mode() & mr_bit as u64 != 0
    }

    /// A fresh unguessable key for providers without FI_MR_PROV_KEY: a reader
    /// can only read a share through the key its owner published. Keys are
    /// 64-bit random (narrowed to the provider's mr_key_size), so a repeat is
    /// vanishingly unlikely; registration retries on FI_ENOKEY regardless.
    pub fn unique_key(&self) -> u64 {
        let n = self.keys_issued.fetch_add(1, Ordering::Relaxed);
        let key = self.key_hasher.hash_one(n);
        match self.info().mr_key_size() {
            1..=7 => key & ((1u64 << (8 * self.info().mr_key_size())) - 1),
            _ => key,
        }
    }

    /// False in a forked child for a domain its parent opened.
    pub fn usable_here(&self) -> bool {
        self.opened_by.is_this_process() && self.fabric.opened_by().is_this_process()
    }
}

impl Domain {
    /// Closes it now, then its fabric if it was the fabric's last holder,
    /// reporting the first failure (`-FI_EBUSY`: an object opened in it is
    /// still open; it is then abandoned, never closed again, with its fabric). Dropping it
    /// closes it too, but can only log a failure.
    pub fn close(self) -> FabricResult<()> {
        let fabric = self.fabric.clone();
        close_owned(self, Self::close_now)?;
        close_last(fabric, Fabric::close)
    }

    /// Closes the handle once (a forked child abandons it, never closes it).
    fn close_now(&mut self) -> FabricResult<()> {
        let ptr = std::mem::replace(&mut self.ptr, ptr::null_mut());
        if ptr.is_null() || !self.opened_by.is_this_process() {
            return Ok(());
        }
        // SAFETY: endpoints, CQs, AVs and MRs hold an Arc<Domain>: all closed
        // by now; the handle was taken out above, so it is closed once.
        unsafe { close_fid(ptr::addr_of_mut!((*ptr).fid), "domain") }
    }
}

impl Drop for Domain {
    fn drop(&mut self) {
        report_failed_close("domain", self.close_now());
    }
}

#[cfg(test)]
mod tests {
    use std::os::raw::c_void;
    use std::panic::{catch_unwind, AssertUnwindSafe};

    use super::*;
    use crate::error::FabricError;
    use crate::ofi::{Info, InfoRequest};

    /// A registration made behind the wrappers' back (so the domain has no
    /// child holding it): the ordering bug the parent chain prevents.
    fn raw_registration(domain: &Domain, buf: &[u8]) -> *mut sys::fid_mr {
        let mut mr = ptr::null_mut();
        // SAFETY: the domain is live and `buf` outlives the registration,
        // which the caller closes.
        let rc = unsafe {
            sys::ddfi_mr_reg(
                domain.as_ptr(),
                buf.as_ptr() as *const c_void,
                buf.len(),
                sys::FI_REMOTE_READ as u64,
                0,
                domain.unique_key(),
                0,
                &mut mr,
                ptr::null_mut(),
            )
        };
        check("fi_mr_reg", rc as i64).unwrap();
        mr
    }

    /// tcp;ofi_rxm and shm (checked here: tcp and sockets too) refuse to
    /// close a domain with a live registration with -FI_EBUSY: `close`
    /// returns it, and a drop logs it and fails a debug assertion. (Closing
    /// it again is not safe: rxm frees part of it on the way.)
    #[test]
    fn closing_a_domain_with_a_live_registration_is_reported() {
        let mut tried = Vec::new();
        for provider in ["tcp;ofi_rxm", "shm"] {
            let request = InfoRequest {
                provider: Some(provider.into()),
                node: provider.starts_with("tcp").then(|| "127.0.0.1".into()),
                ..Default::default()
            };
            let Ok(info) = Info::query(&request) else {
                continue;
            };
            tried.push(provider);
            let fabric = Arc::new(Fabric::open(&info).unwrap());
            for explicit in [true, false] {
                let domain = Domain::open(&fabric).unwrap();
                let buf = vec![0u8; 4096];
                let mr = raw_registration(&domain, &buf);
                let domain = Arc::into_inner(domain).unwrap();
                if explicit {
                    let err = domain.close().expect_err("a domain with a live MR closed");
                    let busy = -(sys::FI_EBUSY as i64);
                    assert!(
                        matches!(err, FabricError::Ofi { call: "fi_close", code, .. } if code == busy),
                        "{provider}: {err}"
                    );
                    assert!(err.to_string().contains("domain"), "{err}");
                } else {
                    let dropped = catch_unwind(AssertUnwindSafe(|| drop(domain)));
                    assert_eq!(dropped.is_err(), cfg!(debug_assertions), "{provider}");
                }
                // A refused close may have torn the domain down in part
                // (rxm closes its inner domain first): neither it nor the
                // registration is closed again, and their memory stays.
                std::mem::forget(buf);
                let _ = mr;
            }
        }
        assert!(
            tried.contains(&"tcp;ofi_rxm"),
            "tcp;ofi_rxm is not available"
        );
    }
}
