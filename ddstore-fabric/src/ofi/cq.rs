//! `fid_cq`: completion queue in context format.

use std::ffi::CStr;
use std::os::raw::c_void;
use std::ptr;
use std::sync::Arc;

use libfabric_sys as sys;

use super::domain::Domain;
use super::error::{check, close_fid, ofi_error, strerror, OpenedBy};
use crate::error::{close_last, close_owned, report_failed_close, FabricResult};

/// A completion queue (closed on drop).
pub struct Cq {
    ptr: *mut sys::fid_cq,
    has_wait: bool,
    format: sys::fi_cq_format,
    opened_by: OpenedBy,
    domain: Arc<Domain>,
}

// SAFETY: opened in an FI_THREAD_SAFE domain; libfabric serialises access.
unsafe impl Send for Cq {}
// SAFETY: as for Send: libfabric serialises access to the CQ.
unsafe impl Sync for Cq {}

/// A failed operation reported by `fi_cq_readerr`.
#[derive(Debug)]
pub struct CqError {
    /// The context the failed operation was posted with.
    pub context: *mut c_void,
    /// The tag of a failed tagged operation (0 otherwise).
    pub tag: u64,
    /// The provider's error code (positive errno).
    pub code: i64,
    /// The provider's description of the error.
    pub message: String,
}

/// An entry format a CQ can be opened with: context only (one-sided reads)
/// or tagged (the gather path, which needs the length and tag of a receive).
pub trait CqEntry: Copy + Default {
    const FORMAT: sys::fi_cq_format;
    fn context(&self) -> *mut c_void;
}

impl CqEntry for sys::fi_cq_entry {
    const FORMAT: sys::fi_cq_format = sys::FI_CQ_FORMAT_CONTEXT;
    fn context(&self) -> *mut c_void {
        self.op_context
    }
}

impl CqEntry for sys::fi_cq_tagged_entry {
    const FORMAT: sys::fi_cq_format = sys::FI_CQ_FORMAT_TAGGED;
    fn context(&self) -> *mut c_void {
        self.op_context
    }
}

/// The result of one poll of the queue.
pub enum Poll {
    /// The contexts of `n` completed operations were written to the buffer.
    Completed(usize),
    /// An operation failed.
    Failed(CqError),
}

impl Cq {
    /// `wait`: also give it a wait object so [`Cq::wait_read`] can block.
    pub fn open(domain: &Arc<Domain>, size: usize, wait: bool) -> FabricResult<Cq> {
        Self::open_format(domain, size, wait, sys::FI_CQ_FORMAT_CONTEXT)
    }

    /// As [`Cq::open`], with entries of `format` (see [`CqEntry`]).
    pub fn open_format(
        domain: &Arc<Domain>,
        size: usize,
        wait: bool,
        format: sys::fi_cq_format,
    ) -> FabricResult<Cq> {
        let mut attr = sys::fi_cq_attr {
            size,
            format,
            wait_obj: if wait {
                sys::FI_WAIT_UNSPEC
            } else {
                sys::FI_WAIT_NONE
            },
            ..Default::default()
        };
        let mut ptr = ptr::null_mut();
        // SAFETY: domain is alive; attr is a valid fi_cq_attr; ptr receives the CQ.
        let rc =
            unsafe { sys::ddfi_cq_open(domain.as_ptr(), &mut attr, &mut ptr, ptr::null_mut()) };
        check("fi_cq_open", rc as i64)?;
        Ok(Cq {
            ptr,
            has_wait: wait,
            format,
            opened_by: OpenedBy::this_process(),
            domain: domain.clone(),
        })
    }

    /// A CQ whose wait blocks on a file descriptor when the provider has one
    /// (tcp: sockets); otherwise (shm waits by spinning) one without a wait
    /// object, which callers poll.
    pub fn open_blocking_if_possible(domain: &Arc<Domain>, size: usize) -> FabricResult<Cq> {
        Self::open_blocking_if_possible_format(domain, size, sys::FI_CQ_FORMAT_CONTEXT)
    }

    /// As [`Cq::open_blocking_if_possible`], with entries of `format`.
    pub fn open_blocking_if_possible_format(
        domain: &Arc<Domain>,
        size: usize,
        format: sys::fi_cq_format,
    ) -> FabricResult<Cq> {
        if let Ok(cq) = Cq::open_format(domain, size, true, format) {
            if cq.wait_fd().is_some() {
                return Ok(cq);
            }
        }
        Cq::open_format(domain, size, false, format)
    }

    /// Whether entries are [`sys::fi_cq_tagged_entry`].
    pub fn is_tagged(&self) -> bool {
        self.format == sys::FI_CQ_FORMAT_TAGGED
    }

    fn check_format<E: CqEntry>(&self) -> FabricResult<()> {
        if E::FORMAT == self.format {
            Ok(())
        } else {
            Err(crate::error::FabricError::Invalid(format!(
                "completion queue of format {} polled with entries of format {}",
                self.format,
                E::FORMAT
            )))
        }
    }

    /// Whether it was opened with a wait object (blocking reads possible).
    pub fn has_wait(&self) -> bool {
        self.has_wait
    }

    /// The file descriptor the provider's wait blocks on, if it has one
    /// (`FI_GETWAIT`); providers without one wait by spinning.
    pub fn wait_fd(&self) -> Option<i32> {
        if !self.has_wait {
            return None;
        }
        let mut fd: i32 = -1;
        // SAFETY: FI_GETWAIT on a CQ opened with FI_WAIT_FD writes one int.
        let rc = unsafe {
            sys::ddfi_control(
                self.fid(),
                sys::FI_GETWAIT as i32,
                &mut fd as *mut i32 as *mut c_void,
            )
        };
        (rc == 0 && fd >= 0).then_some(fd)
    }

    pub(crate) fn fid(&self) -> *mut sys::fid {
        // SAFETY: ptr is a live CQ; only the address of its embedded fid is taken.
        unsafe { ptr::addr_of_mut!((*self.ptr).fid) }
    }

    /// Polls once (this also progresses the endpoints bound to it).
    pub fn poll<E: CqEntry>(&self, buf: &mut [E]) -> FabricResult<Poll> {
        self.check_format::<E>()?;
        // SAFETY: buf holds buf.len() entries of this CQ's format (checked above).
        let rc = unsafe { sys::ddfi_cq_read(self.ptr, buf.as_mut_ptr() as *mut c_void, buf.len()) };
        self.interpret("fi_cq_read", rc as i64)
    }

    /// Blocks up to `timeout_ms` for a completion, progressing meanwhile.
    pub fn wait_read<E: CqEntry>(&self, buf: &mut [E], timeout_ms: i32) -> FabricResult<Poll> {
        self.check_format::<E>()?;
        // SAFETY: as in poll; no wait condition is passed.
        let rc = unsafe {
            sys::ddfi_cq_sread(
                self.ptr,
                buf.as_mut_ptr() as *mut c_void,
                buf.len(),
                ptr::null(),
                timeout_ms,
            )
        };
        self.interpret("fi_cq_sread", rc as i64)
    }

    /// Wakes a thread blocked in [`Cq::wait_read`].
    pub fn signal(&self) {
        if self.has_wait {
            // SAFETY: ptr is a live CQ with a wait object.
            unsafe { sys::ddfi_cq_signal(self.ptr) };
        }
    }

    fn interpret(&self, call: &'static str, rc: i64) -> FabricResult<Poll> {
        if rc >= 0 {
            return Ok(Poll::Completed(rc as usize));
        }
        let code = -rc;
        // A wait a signal interrupted (SIGSTOP/SIGCONT, a Python handler's
        // signal) completed nothing: callers poll again until their deadline.
        if code == sys::FI_EAGAIN as i64
            || code == sys::FI_ETIMEDOUT as i64
            || code == sys::FI_EINTR as i64
        {
            return Ok(Poll::Completed(0));
        }
        if code == sys::FI_EAVAIL as i64 {
            return self.read_error().map(Poll::Failed);
        }
        Err(ofi_error(call, rc))
    }

    fn read_error(&self) -> FabricResult<CqError> {
        let mut entry = sys::fi_cq_err_entry::default();
        // SAFETY: entry is a zeroed error entry (err_data_size 0: the provider
        // points err_data at its own buffer).
        let rc = unsafe { sys::ddfi_cq_readerr(self.ptr, &mut entry, 0) };
        if rc < 0 {
            return Err(ofi_error("fi_cq_readerr", rc as i64));
        }
        let mut text = [0 as std::os::raw::c_char; 256];
        // SAFETY: prov_errno/err_data come from the error entry just read;
        // text is a writable buffer of the length passed.
        let detail = unsafe {
            let p = sys::ddfi_cq_strerror(
                self.ptr,
                entry.prov_errno,
                entry.err_data,
                text.as_mut_ptr(),
                text.len(),
            );
            if p.is_null() {
                String::new()
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        let code = -(entry.err as i64);
        Ok(CqError {
            context: entry.op_context,
            tag: entry.tag,
            code,
            message: format!("{} (provider: {detail})", strerror(code)),
        })
    }

    /// The domain it was opened in.
    pub fn domain(&self) -> &Arc<Domain> {
        &self.domain
    }
}

impl Cq {
    /// Closes it now, then its domain if it was the domain's last holder,
    /// reporting the first failure (an object whose close fails is abandoned, never closed again, with its parents). Dropping it
    /// closes it too, but can only log a failure.
    pub fn close(self) -> FabricResult<()> {
        let domain = self.domain.clone();
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
        // SAFETY: endpoints bound to this CQ hold an Arc<Cq>: all closed by
        // now; the handle was taken out above, so it is closed once.
        unsafe { close_fid(fid, "completion queue") }
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        report_failed_close("completion queue", self.close_now());
    }
}
