//! `fid_ep`: a reliable-datagram endpoint bound to one CQ and one AV.

use std::os::raw::c_void;
use std::ptr;
use std::sync::Arc;

use libfabric_sys as sys;

use super::av::Av;
use super::cq::Cq;
use super::domain::Domain;
use super::error::{check, close_fid, ofi_error, OpenedBy};
use super::silent_conns::GuardedPort;
use crate::error::{close_last, close_owned, report_failed_close, FabricResult};

/// An enabled RDM endpoint bound to its CQ and AV (closed on drop).
pub struct Endpoint {
    ptr: *mut sys::fid_ep,
    opened_by: OpenedBy,
    // Dropped after the endpoint is closed, in this order.
    cq: Arc<Cq>,
    av: Arc<Av>,
    domain: Arc<Domain>,
    /// Its port, swept for accepted connections that never speak.
    _guard: Option<GuardedPort>,
}

// SAFETY: opened in an FI_THREAD_SAFE domain; libfabric serialises access.
unsafe impl Send for Endpoint {}
// SAFETY: as for Send: libfabric serialises access to the endpoint.
unsafe impl Sync for Endpoint {}

/// `fi_read` was not accepted now: progress the CQ and post it again.
pub struct TryAgain;

impl Endpoint {
    /// fabtests' order: open, bind CQ (transmit and receive) and AV, enable.
    pub fn open(domain: &Arc<Domain>, cq: Arc<Cq>, av: Arc<Av>) -> FabricResult<Endpoint> {
        let mut ptr = ptr::null_mut();
        // SAFETY: domain and its info entry are alive; ptr receives the endpoint.
        let rc = unsafe {
            sys::ddfi_endpoint(
                domain.as_ptr(),
                domain.info_ptr(),
                &mut ptr,
                ptr::null_mut(),
            )
        };
        check("fi_endpoint", rc as i64)?;
        // From here on, Drop closes the endpoint if a later step fails.
        let mut ep = Endpoint {
            ptr,
            opened_by: OpenedBy::this_process(),
            cq,
            av,
            domain: domain.clone(),
            _guard: None,
        };
        // SAFETY: ep, cq and av are live objects of the same domain.
        let rc = unsafe {
            sys::ddfi_ep_bind(
                ep.ptr,
                ep.cq.fid(),
                (sys::FI_TRANSMIT | sys::FI_RECV) as u64,
            )
        };
        check("fi_ep_bind(cq)", rc as i64)?;
        // SAFETY: as above.
        let rc = unsafe { sys::ddfi_ep_bind(ep.ptr, ep.av.fid(), 0) };
        check("fi_ep_bind(av)", rc as i64)?;
        // SAFETY: the endpoint is bound and not yet enabled.
        let rc = unsafe { sys::ddfi_enable(ep.ptr) };
        check("fi_enable", rc as i64)?;
        ep._guard = ep.name().ok().and_then(|n| GuardedPort::new(&n));
        Ok(ep)
    }

    pub(crate) fn fid(&self) -> *mut sys::fid {
        // SAFETY: ptr is a live endpoint; only the address of its fid is taken.
        unsafe { ptr::addr_of_mut!((*self.ptr).fid) }
    }

    /// The completion queue it is bound to.
    pub fn cq(&self) -> &Arc<Cq> {
        &self.cq
    }

    /// The address vector it is bound to.
    pub fn av(&self) -> &Arc<Av> {
        &self.av
    }

    /// The domain it was opened in.
    pub fn domain(&self) -> &Arc<Domain> {
        &self.domain
    }

    /// This endpoint's address, as peers insert it into their AVs.
    pub fn name(&self) -> FabricResult<Vec<u8>> {
        let mut len: usize = 0;
        // SAFETY: a zero-length query only writes the needed length.
        let rc = unsafe { sys::ddfi_getname(self.fid(), ptr::null_mut(), &mut len) };
        if rc != 0 && rc != -(sys::FI_ETOOSMALL as i32) {
            return Err(ofi_error("fi_getname", rc as i64));
        }
        let mut buf = vec![0u8; len];
        // SAFETY: buf has room for len bytes.
        let rc =
            unsafe { sys::ddfi_getname(self.fid(), buf.as_mut_ptr() as *mut c_void, &mut len) };
        check("fi_getname", rc as i64)?;
        buf.truncate(len);
        Ok(buf)
    }

    /// Posts one `fi_read` of `len` bytes from `peer`'s `remote_addr` (with
    /// `key`) into `buf`.
    ///
    /// # Safety
    /// `buf..buf+len` must stay valid and untouched, and `context` must stay
    /// valid, until the read completes on this endpoint's CQ or the endpoint
    /// is closed; `desc` must be NULL or the descriptor of a registration
    /// covering `buf` that outlives the read.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn post_read(
        &self,
        buf: *mut u8,
        len: usize,
        desc: *mut c_void,
        peer: sys::fi_addr_t,
        remote_addr: u64,
        key: u64,
        context: *mut c_void,
    ) -> FabricResult<Result<(), TryAgain>> {
        // SAFETY: the endpoint is live; the caller keeps buf, desc and
        // context valid until the read completes (this function's contract).
        let rc = unsafe {
            sys::ddfi_read(
                self.ptr,
                buf as *mut c_void,
                len,
                desc,
                peer,
                remote_addr,
                key,
                context,
            )
        };
        posted("fi_read", rc)
    }

    /// Posts a tagged receive of up to `len` bytes into `buf`, matching
    /// `tag` except for the bits set in `ignore`, from any peer.
    ///
    /// # Safety
    /// `buf..buf+len` and `context` must stay valid until the receive
    /// completes on this endpoint's CQ or the endpoint is closed.
    pub unsafe fn post_trecv(
        &self,
        buf: *mut u8,
        len: usize,
        tag: u64,
        ignore: u64,
        context: *mut c_void,
    ) -> FabricResult<Result<(), TryAgain>> {
        // SAFETY: the endpoint is live; the caller keeps buf and context
        // valid until the receive completes (this function's contract).
        let rc = unsafe {
            sys::ddfi_trecv(
                self.ptr,
                buf as *mut c_void,
                len,
                ptr::null_mut(),
                sys::FI_ADDR_UNSPEC,
                tag,
                ignore,
                context,
            )
        };
        posted("fi_trecv", rc)
    }

    /// Posts a tagged receive scattering into `iov` (at most the provider's
    /// receive iov limit, at least one entry), matching `tag` except for the
    /// bits in `ignore`, from `src` only (`FI_ADDR_UNSPEC`: from any peer;
    /// only endpoints with `FI_DIRECTED_RECV` honour a source).
    ///
    /// # Safety
    /// Every iov entry's memory and `context` must stay valid until the
    /// receive completes on this endpoint's CQ or the endpoint is closed.
    pub unsafe fn post_trecvv(
        &self,
        iov: &[sys::iovec],
        src: sys::fi_addr_t,
        tag: u64,
        ignore: u64,
        context: *mut c_void,
    ) -> FabricResult<Result<(), TryAgain>> {
        let mut desc = [ptr::null_mut::<c_void>(); 4];
        // SAFETY: the endpoint is live; iov and desc hold at least the count
        // passed; the caller keeps the iov's memory and context valid until
        // the receive completes (this function's contract).
        let rc = unsafe {
            sys::ddfi_trecvv(
                self.ptr,
                iov.as_ptr(),
                desc.as_mut_ptr(),
                iov.len().min(desc.len()),
                src,
                tag,
                ignore,
                context,
            )
        };
        posted("fi_trecvv", rc)
    }

    /// Sends the bytes of `iov` (at most the provider's iov limit, at least
    /// one entry) as one tagged message to `peer`.
    ///
    /// # Safety
    /// Every iov entry's memory and `context` must stay valid and unchanged
    /// until the send completes on this endpoint's CQ or the endpoint is closed.
    pub unsafe fn post_tsendv(
        &self,
        iov: &[sys::iovec],
        peer: sys::fi_addr_t,
        tag: u64,
        context: *mut c_void,
    ) -> FabricResult<Result<(), TryAgain>> {
        let rc = if iov.len() == 1 {
            // SAFETY: the endpoint is live; the caller keeps the buffer and
            // context valid until the send completes (this function's contract).
            unsafe {
                sys::ddfi_tsend(
                    self.ptr,
                    iov[0].iov_base,
                    iov[0].iov_len,
                    ptr::null_mut(),
                    peer,
                    tag,
                    context,
                )
            }
        } else {
            let mut desc = [ptr::null_mut::<c_void>(); 16];
            // SAFETY: as above; iov and desc hold at least the count passed.
            unsafe {
                sys::ddfi_tsendv(
                    self.ptr,
                    iov.as_ptr(),
                    desc.as_mut_ptr(),
                    iov.len().min(desc.len()),
                    peer,
                    tag,
                    context,
                )
            }
        };
        posted("fi_tsendv", rc)
    }

    /// Sends the bytes of `iov` (at most the provider's iov limit, at least
    /// one entry) as one tagged message to `peer` whose completion at the
    /// receiver carries `data` (remote CQ data: the domain's `cq_data_size`
    /// must be at least 8).
    ///
    /// # Safety
    /// As [`Endpoint::post_tsendv`].
    pub unsafe fn post_tsendv_data(
        &self,
        iov: &[sys::iovec],
        peer: sys::fi_addr_t,
        data: u64,
        tag: u64,
        context: *mut c_void,
    ) -> FabricResult<Result<(), TryAgain>> {
        let mut desc = [ptr::null_mut::<c_void>(); 16];
        // SAFETY: the endpoint is live; iov and desc hold at least the count
        // passed; the caller keeps the iov's memory and context valid until
        // the send completes (this function's contract).
        let rc = unsafe {
            sys::ddfi_tsendv_data(
                self.ptr,
                iov.as_ptr(),
                desc.as_mut_ptr(),
                iov.len().min(desc.len()),
                peer,
                data,
                tag,
                context,
            )
        };
        posted("fi_tsendmsg", rc)
    }

    /// Asks the provider to cancel a posted operation (best effort).
    ///
    /// # Safety
    /// `context` must be the context of an operation posted on this endpoint
    /// (or one that completed); providers compare or dereference it.
    pub unsafe fn cancel(&self, context: *mut c_void) {
        // SAFETY: the endpoint is live; context is one of its operations'
        // (this function's contract).
        unsafe { sys::ddfi_cancel(self.fid(), context) };
    }
}

impl Endpoint {
    /// Closes it now (discarding what is still posted), then its CQ, AV and
    /// domain where it held them last, reporting the first failure (an
    /// object whose close fails is abandoned, never closed again, with its
    /// parents). Dropping it closes it too, but can only log a failure.
    pub fn close(self) -> FabricResult<()> {
        let (cq, av, domain) = (self.cq.clone(), self.av.clone(), self.domain.clone());
        close_owned(self, Self::close_now)?;
        let cq = close_last(cq, Cq::close);
        let av = close_last(av, Av::close);
        cq.and(av).and(close_last(domain, Domain::close))
    }

    /// Closes the handle once (a forked child abandons it, never closes it).
    fn close_now(&mut self) -> FabricResult<()> {
        if self.ptr.is_null() || !self.opened_by.is_this_process() {
            self.ptr = ptr::null_mut();
            return Ok(());
        }
        let fid = self.fid();
        self.ptr = ptr::null_mut();
        // SAFETY: MRs bound to this endpoint hold an Arc<Endpoint>: closed by
        // now; the handle was taken out above, so it is closed once. Closing
        // discards reads still in flight.
        unsafe { close_fid(fid, "endpoint") }
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        report_failed_close("endpoint", self.close_now());
    }
}

/// What a post call's return code means: posted, `TryAgain` (the provider's
/// queue is full: progress and post again), or the call's error.
fn posted(call: &'static str, rc: isize) -> FabricResult<Result<(), TryAgain>> {
    // EMFILE/ENFILE: rxm could not open the connection's socket now; peers
    // disconnecting (a bounded set, see `pool.rs`) free descriptors soon.
    let retry = [
        sys::FI_EAGAIN as isize,
        libc::EMFILE as isize,
        libc::ENFILE as isize,
    ];
    if retry.contains(&-rc) {
        return Ok(Err(TryAgain));
    }
    check(call, rc as i64)?;
    Ok(Ok(()))
}
