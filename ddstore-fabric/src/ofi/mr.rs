//! `fid_mr`: a registered memory region (a share, or a read destination).

use std::os::raw::c_void;
use std::ptr;
use std::sync::Arc;

use libfabric_sys as sys;

use super::domain::Domain;
use super::endpoint::Endpoint;
use super::error::{check, close_fid, OpenedBy};
use crate::error::{close_last, close_owned, report_failed_close, FabricResult};

/// A registered memory region (closed on drop).
pub struct MemoryRegion {
    ptr: *mut sys::fid_mr,
    addr: usize,
    len: usize,
    opened_by: OpenedBy,
    // Closed after the MR (FI_MR_ENDPOINT binds the MR to this endpoint).
    _endpoint: Option<Arc<Endpoint>>,
    _domain: Arc<Domain>,
}

// SAFETY: opened in an FI_THREAD_SAFE domain; the key and descriptor are
// read-only after registration.
unsafe impl Send for MemoryRegion {}
// SAFETY: the key and descriptor are only read after registration.
unsafe impl Sync for MemoryRegion {}

impl MemoryRegion {
    /// Registers `addr..addr+len` with `access` (FI_REMOTE_READ for a share,
    /// FI_READ for a read destination), honouring the domain's mr_mode:
    /// our own key unless FI_MR_PROV_KEY, and for FI_MR_ENDPOINT a bind to
    /// `endpoint` followed by `fi_mr_enable`.
    ///
    /// # Safety
    /// The memory must stay mapped for as long as the returned value lives.
    pub unsafe fn register(
        domain: &Arc<Domain>,
        endpoint: &Arc<Endpoint>,
        addr: *const u8,
        len: usize,
        access: u64,
    ) -> FabricResult<MemoryRegion> {
        let mut ptr = ptr::null_mut();
        let rc = with_fresh_key(domain, |requested_key| {
            // SAFETY: the domain is live; registration never writes the
            // memory, which the caller keeps mapped (this function's contract).
            unsafe {
                sys::ddfi_mr_reg(
                    domain.as_ptr(),
                    addr as *const c_void,
                    len,
                    access,
                    0,
                    requested_key,
                    0,
                    &mut ptr,
                    ptr::null_mut(),
                )
            }
        });
        check("fi_mr_reg", rc as i64)?;
        // SAFETY: ptr is the live MR just registered on domain over addr..addr+len.
        unsafe { Self::finish(domain, endpoint, ptr, addr, len) }
    }

    /// Wraps a registered `ptr`; for FI_MR_ENDPOINT binds it to `endpoint`
    /// and enables it.
    ///
    /// # Safety
    /// `ptr` is a live MR of `domain` covering `addr..addr+len`, owned by the result.
    unsafe fn finish(
        domain: &Arc<Domain>,
        endpoint: &Arc<Endpoint>,
        ptr: *mut sys::fid_mr,
        addr: *const u8,
        len: usize,
    ) -> FabricResult<MemoryRegion> {
        let bind = domain.requires(sys::FI_MR_ENDPOINT);
        let mr = MemoryRegion {
            ptr,
            addr: addr as usize,
            len,
            opened_by: OpenedBy::this_process(),
            _endpoint: bind.then(|| endpoint.clone()),
            _domain: domain.clone(),
        };
        if bind {
            // SAFETY: the MR and the endpoint are live objects of one domain.
            let rc = unsafe { sys::ddfi_mr_bind(mr.ptr, endpoint.fid(), 0) };
            check("fi_mr_bind", rc as i64)?;
            // SAFETY: the MR is live and bound.
            let rc = unsafe { sys::ddfi_mr_enable(mr.ptr) };
            check("fi_mr_enable", rc as i64)?;
        }
        Ok(mr)
    }

    /// The key a peer passes to `fi_read` (valid after enable).
    pub fn key(&self) -> u64 {
        // SAFETY: ptr is a live, enabled MR.
        unsafe { sys::ddfi_mr_key(self.ptr) }
    }

    /// The local descriptor for FI_MR_LOCAL providers.
    pub fn desc(&self) -> *mut c_void {
        // SAFETY: ptr is a live MR.
        unsafe { sys::ddfi_mr_desc(self.ptr) }
    }

    /// Whether `addr..addr+len` lies inside this registration.
    pub fn covers(&self, addr: usize, len: usize) -> bool {
        addr >= self.addr && addr.saturating_add(len) <= self.addr + self.len
    }
}

impl MemoryRegion {
    /// Closes the registration now, then its endpoint and domain where it
    /// held them last, reporting the first failure (an object whose close fails is abandoned, never closed again, with its parents).
    /// Dropping it closes it too, but can only log a failure.
    pub fn close(self) -> FabricResult<()> {
        let (endpoint, domain) = (self._endpoint.clone(), self._domain.clone());
        close_owned(self, Self::close_now)?;
        let endpoint = endpoint.map_or(Ok(()), |ep| close_last(ep, Endpoint::close));
        endpoint.and(close_last(domain, Domain::close))
    }

    /// Closes the handle once (a forked child abandons it, never closes it).
    fn close_now(&mut self) -> FabricResult<()> {
        let ptr = std::mem::replace(&mut self.ptr, ptr::null_mut());
        if ptr.is_null() || !self.opened_by.is_this_process() {
            return Ok(());
        }
        // SAFETY: ptr is a live MR, closed before its endpoint and domain
        // (which this value holds); taken out above, so it is closed once.
        unsafe { close_fid(ptr::addr_of_mut!((*ptr).fid), "memory registration") }
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        report_failed_close("memory registration", self.close_now());
    }
}

/// Registration of memory that may be on a device (`fi_mr_regattr` with
/// `iface` and device id), for shares held in GPU memory. Kept apart from
/// [`MemoryRegion::register`]; keys are chosen the same way.
impl MemoryRegion {
    /// Registers `addr..addr+len`, memory of interface `iface` (an
    /// `fi_hmem_iface`) on device `device`, for `access`.
    ///
    /// # Safety
    /// The memory must stay allocated (on that device) for as long as the
    /// returned value lives.
    pub unsafe fn register_hmem(
        domain: &Arc<Domain>,
        endpoint: &Arc<Endpoint>,
        addr: *const u8,
        len: usize,
        access: u64,
        iface: sys::fi_hmem_iface,
        device: i32,
    ) -> FabricResult<MemoryRegion> {
        let iov = sys::iovec {
            iov_base: addr as *mut c_void,
            iov_len: len,
        };
        // SAFETY: all-zero is a valid fi_mr_attr (pointers, integers, a union of integers).
        let mut attr: sys::fi_mr_attr = unsafe { std::mem::zeroed() };
        attr.mr_iov = &iov;
        attr.iov_count = 1;
        attr.access = access;
        attr.iface = iface;
        // Every member of the union is the device ordinal (cuda, ze, neuron, ...);
        // ROCm and system memory take none.
        attr.device.reserved = 0;
        if iface == sys::FI_HMEM_CUDA || iface == sys::FI_HMEM_ZE {
            attr.device.cuda = device;
        }
        let mut ptr = ptr::null_mut();
        let rc = with_fresh_key(domain, |requested_key| {
            attr.requested_key = requested_key;
            // SAFETY: the domain is live and attr points at iov, both alive for
            // the call; the caller keeps the device memory allocated.
            unsafe { sys::ddfi_mr_regattr(domain.as_ptr(), &attr, 0, &mut ptr) }
        });
        check("fi_mr_regattr", rc as i64)?;
        // SAFETY: ptr is the live MR just registered on domain over addr..addr+len.
        unsafe { Self::finish(domain, endpoint, ptr, addr, len) }
    }
}

/// Runs a registration with a key we pick (0 under FI_MR_PROV_KEY, where the
/// provider picks); a random key that happens to be taken is drawn again.
fn with_fresh_key(domain: &Domain, mut register: impl FnMut(u64) -> i32) -> i32 {
    if domain.requires(sys::FI_MR_PROV_KEY) {
        return register(0);
    }
    let mut rc = register(domain.unique_key());
    for _ in 0..3 {
        if rc != -(sys::FI_ENOKEY as i32) {
            break;
        }
        rc = register(domain.unique_key());
    }
    rc
}
