//! `fid_domain`: one NIC (or provider instance) opened on a fabric.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use libfabric_sys as sys;

use super::error::{check, OpenedBy};
use super::fabric::Fabric;
use super::info::InfoEntry;
use crate::error::FabricResult;

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

impl Drop for Domain {
    fn drop(&mut self) {
        if !self.opened_by.is_this_process() {
            return; // inherited across fork(): abandon, never close
        }
        // SAFETY: endpoints, CQs, AVs and MRs hold an Arc<Domain>: all closed by now.
        unsafe { sys::ddfi_close(&mut (*self.ptr).fid) };
    }
}
