//! `Window`: one MPI window, locked for passive-target reads (`MPI_Win_lock_all`)
//! from creation until drop, when it is unlocked and freed (collective).

use ddstore_core::fork::CreatedBy;
use ddstore_core::transport::ReaderTimes;
use std::os::raw::{c_int, c_void};

use mpi::ffi;

use super::comm::MpiComm;
use super::init::{check, is_usable, serialize};
use crate::error::{report_failed_close, FabricError, FabricResult};

pub(crate) struct Window {
    win: ffi::MPI_Win,
    /// Memory MPI allocated for this rank (null or dangling when `len` is 0,
    /// or when the window was created over memory owned elsewhere).
    base: *mut u8,
    len: usize,
    locked: bool,
    /// The creating process; a forked child must never touch the window.
    pid: CreatedBy,
    /// Freed already (by `close`), or never to be freed here.
    freed: bool,
}

// SAFETY: an MPI_Win is an opaque handle; every call on it goes through
// `serialize()` (the process-wide lock below MPI_THREAD_MULTIPLE), and under
// MPI_THREAD_MULTIPLE concurrent MPI_Rget/MPI_Test inside one lock_all
// epoch are allowed. `base` is memory MPI keeps until MPI_Win_free.
unsafe impl Send for Window {}
// SAFETY: see Send.
unsafe impl Sync for Window {}

fn aint(len: usize) -> FabricResult<ffi::MPI_Aint> {
    ffi::MPI_Aint::try_from(len)
        .map_err(|_| FabricError::Invalid(format!("a share of {len} bytes is too large for MPI")))
}

impl Window {
    /// `MPI_Win_allocate` of `len` bytes over `comm`. Collective.
    pub(crate) fn allocate(comm: &MpiComm, len: usize) -> FabricResult<Window> {
        Self::allocate_with(comm, len, "MPI_Win_allocate", ffi::MPI_Win_allocate)
    }

    /// `MPI_Win_allocate_shared` of `len` bytes over a node communicator. Collective.
    pub(crate) fn allocate_shared(node: &MpiComm, len: usize) -> FabricResult<Window> {
        Self::allocate_with(
            node,
            len,
            "MPI_Win_allocate_shared",
            ffi::MPI_Win_allocate_shared,
        )
    }

    fn allocate_with(
        comm: &MpiComm,
        len: usize,
        call: &'static str,
        alloc: unsafe extern "C" fn(
            ffi::MPI_Aint,
            c_int,
            ffi::MPI_Info,
            ffi::MPI_Comm,
            *mut c_void,
            *mut ffi::MPI_Win,
        ) -> c_int,
    ) -> FabricResult<Window> {
        let size = aint(len)?;
        let mut base: *mut u8 = std::ptr::null_mut();
        let mut win = std::mem::MaybeUninit::<ffi::MPI_Win>::uninit();
        let rc = {
            let _g = serialize();
            // SAFETY: the communicator is valid; MPI writes the base address
            // (into `base`, a pointer-sized slot) and the window handle.
            unsafe {
                alloc(
                    size,
                    1,
                    ffi::RSMPI_INFO_NULL,
                    comm.as_raw(),
                    &mut base as *mut *mut u8 as *mut c_void,
                    win.as_mut_ptr(),
                )
            }
        };
        check(call, rc)?;
        // SAFETY: the allocation succeeded, so the handle was written.
        let win = unsafe { win.assume_init() };
        Self::adopt(win, base, len)
    }

    /// `MPI_Win_create` over `comm` exposing `base..base+len`. Collective.
    ///
    /// # Safety
    /// The memory must stay valid until this window is dropped.
    pub(crate) unsafe fn create(comm: &MpiComm, base: *mut u8, len: usize) -> FabricResult<Window> {
        let size = aint(len)?;
        let mut win = std::mem::MaybeUninit::<ffi::MPI_Win>::uninit();
        let rc = {
            let _g = serialize();
            // SAFETY: the caller guarantees the memory outlives the window.
            unsafe {
                ffi::MPI_Win_create(
                    base as *mut c_void,
                    size,
                    1,
                    ffi::RSMPI_INFO_NULL,
                    comm.as_raw(),
                    win.as_mut_ptr(),
                )
            }
        };
        check("MPI_Win_create", rc)?;
        // SAFETY: the creation succeeded, so the handle was written.
        let win = unsafe { win.assume_init() };
        Self::adopt(win, std::ptr::null_mut(), 0)
    }

    /// Sets MPI_ERRORS_RETURN and opens the window-long read epoch; on error
    /// the returned-early window is dropped, which frees it.
    fn adopt(win: ffi::MPI_Win, base: *mut u8, len: usize) -> FabricResult<Window> {
        let mut window = Window {
            win,
            base,
            len,
            locked: false,
            pid: CreatedBy::this_process(),
            freed: false,
        };
        {
            let _g = serialize();
            // SAFETY: the window is valid and ours.
            unsafe {
                check(
                    "MPI_Win_set_errhandler",
                    ffi::MPI_Win_set_errhandler(win, ffi::RSMPI_ERRORS_RETURN),
                )?;
                check(
                    "MPI_Win_lock_all",
                    ffi::MPI_Win_lock_all(ffi::MPI_MODE_NOCHECK as c_int, win),
                )?;
            }
        }
        window.locked = true;
        Ok(window)
    }

    /// This rank's memory in an allocated window (base, len).
    pub(crate) fn local(&self) -> (*mut u8, usize) {
        (self.base, self.len)
    }

    /// Address and size of `rank`'s memory in a shared window.
    pub(crate) fn shared_query(&self, rank: usize) -> FabricResult<(*mut u8, usize)> {
        let mut size: ffi::MPI_Aint = 0;
        let mut disp: c_int = 0;
        let mut base: *mut u8 = std::ptr::null_mut();
        let _g = serialize();
        // SAFETY: the window is a shared window; MPI writes size, unit and address.
        let rc = unsafe {
            ffi::MPI_Win_shared_query(
                self.win,
                rank as c_int,
                &mut size,
                &mut disp,
                &mut base as *mut *mut u8 as *mut c_void,
            )
        };
        check("MPI_Win_shared_query", rc)?;
        Ok((base, size.max(0) as usize))
    }

    /// Reads every get of `gets` into `dst` with `MPI_Get`, then completes
    /// them (`MPI_Win_flush` of each target in `targets`, the distinct
    /// targets of `gets`), even after an error: nothing lands in `dst` after
    /// this returns. The flushes do not look for signals: only for targets
    /// whose gets complete inside the call (osc/sm), for which they return at
    /// once. Checks for a pending signal every few hundred posts; adds the
    /// wait for the MPI lock and the flushes to `times`.
    pub(crate) fn get_into(
        &self,
        dst: &mut [u8],
        gets: impl Iterator<Item = Get>,
        targets: &[c_int],
        times: &mut ReaderTimes,
    ) -> FabricResult<()> {
        let (base, dst_len) = (dst.as_mut_ptr(), dst.len());
        let _g = locked(&mut times.lock_ns);
        let mut posted = Ok(());
        for (n, g) in gets.enumerate() {
            if n % POSTS_PER_CHECK == POSTS_PER_CHECK - 1 {
                if let Err(e) = crate::error::check_interrupt() {
                    posted = Err(e);
                    break;
                }
            }
            let Some(count) = fitting(&g, dst_len) else {
                posted = Err(misfit(&g, dst_len));
                break;
            };
            // SAFETY: `at..at+len` is inside `dst` (checked above), which
            // stays mutably borrowed until the flushes below complete the get;
            // the window is inside its lock_all epoch; we hold the serialize guard.
            let rc = unsafe {
                ffi::MPI_Get(
                    base.add(g.at) as *mut c_void,
                    count,
                    ffi::RSMPI_UINT8_T,
                    g.target,
                    g.disp,
                    count,
                    ffi::RSMPI_UINT8_T,
                    self.win,
                )
            };
            if let Err(e) = check("MPI_Get", rc) {
                posted = Err(e.with_peer(g.target as usize));
                break;
            }
        }
        let flushing = std::time::Instant::now();
        let mut flushed = Ok(());
        for &t in targets {
            // SAFETY: the window is valid and inside its lock_all epoch.
            let rc = unsafe { ffi::MPI_Win_flush(t, self.win) };
            if let Err(e) = check("MPI_Win_flush", rc) {
                flushed = Err(e.with_peer(t as usize));
            }
        }
        if flushed.is_err() {
            // Last resort so nothing lands in `dst` after we return.
            // SAFETY: as above.
            let _ = unsafe { ffi::MPI_Win_flush_all(self.win) };
        }
        times.cq_ns += flushing.elapsed().as_nanos() as u64;
        posted.and(flushed)
    }
}

/// One `MPI_Rget` to post: `len` bytes at `disp` of `target`, landing at
/// `at` of the destination.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Get {
    pub(crate) at: usize,
    pub(crate) len: usize,
    pub(crate) target: c_int,
    pub(crate) disp: ffi::MPI_Aint,
}

/// A batch of `MPI_Rget`s on one window (inside its lock_all epoch) into a
/// buffer the batch owns, each request with its target; a completed request
/// is `MPI_REQUEST_NULL`. Only [`Gets::post`] adds requests, always into that
/// buffer, which is leaked rather than freed while a request may still write
/// it: a batch can be given up (a signal, a deadline) at any time.
pub(crate) struct Gets {
    buf: Vec<u8>,
    reqs: Vec<ffi::MPI_Request>,
    targets: Vec<c_int>,
    /// Per request: complete right after it was posted (with `test_each`).
    done_at_post: Vec<bool>,
}

// SAFETY: MPI requests are opaque handles; every call on them goes through
// `serialize()`, as for the window.
unsafe impl Send for Gets {}

fn request_null() -> ffi::MPI_Request {
    // SAFETY: reading a link-time constant exported by the MPI shim.
    unsafe { ffi::RSMPI_REQUEST_NULL }
}

/// `serialize()`, adding the time it took to `lock_ns`.
fn locked(lock_ns: &mut u64) -> Option<std::sync::MutexGuard<'static, ()>> {
    let started = std::time::Instant::now();
    let guard = serialize();
    *lock_ns += started.elapsed().as_nanos() as u64;
    guard
}

/// Posts between two checks for a pending signal while posting.
const POSTS_PER_CHECK: usize = 256;

/// The count of get `g` when it fits a destination of `dst_len` bytes.
fn fitting(g: &Get, dst_len: usize) -> Option<c_int> {
    let inside = g.at.checked_add(g.len).is_some_and(|end| end <= dst_len);
    c_int::try_from(g.len).ok().filter(|_| inside)
}

fn misfit(g: &Get, dst_len: usize) -> FabricError {
    FabricError::Invalid(format!(
        "a get of {} bytes at {} does not fit a destination of {dst_len} bytes",
        g.len, g.at
    ))
}

impl Gets {
    /// A batch landing in `buf` (reused: its bytes are overwritten).
    pub(crate) fn new(buf: Vec<u8>) -> Gets {
        Gets {
            buf,
            reqs: Vec::new(),
            targets: Vec::new(),
            done_at_post: Vec::new(),
        }
    }

    /// Posts every get of `gets` on `win` (one `MPI_Rget` each), checking
    /// for a pending signal every few hundred; with `test_each`, tests each
    /// request once right after posting it (see [`Gets::done_at_post`]). On
    /// error the requests posted so far stay in the batch. Adds the wait for
    /// the MPI lock to `lock_ns`.
    pub(crate) fn post(
        &mut self,
        win: &Window,
        gets: impl Iterator<Item = Get>,
        test_each: bool,
        lock_ns: &mut u64,
    ) -> FabricResult<()> {
        let _g = locked(lock_ns);
        let (base, dst_len) = (self.buf.as_mut_ptr(), self.buf.len());
        for (n, g) in gets.enumerate() {
            if n % POSTS_PER_CHECK == POSTS_PER_CHECK - 1 {
                crate::error::check_interrupt()?;
            }
            let Some(count) = fitting(&g, dst_len) else {
                return Err(misfit(&g, dst_len));
            };
            let mut req = request_null();
            // SAFETY: `at..at+len` is inside the buffer (checked above), which
            // this batch owns and never frees while the request may write it
            // (see Drop); its heap block does not move with the Vec. The
            // window is inside its lock_all epoch; we hold the serialize guard.
            let rc = unsafe {
                ffi::MPI_Rget(
                    base.add(g.at) as *mut c_void,
                    count,
                    ffi::RSMPI_UINT8_T,
                    g.target,
                    g.disp,
                    count,
                    ffi::RSMPI_UINT8_T,
                    win.win,
                    &mut req,
                )
            };
            check("MPI_Rget", rc).map_err(|e| e.with_peer(g.target as usize))?;
            self.reqs.push(req);
            self.targets.push(g.target);
            if test_each {
                let i = self.reqs.len() - 1;
                let done = self.test_locked(i)?;
                self.done_at_post.push(done);
            }
        }
        Ok(())
    }

    /// Requests posted.
    pub(crate) fn len(&self) -> usize {
        self.reqs.len()
    }

    /// The target of request `i`.
    pub(crate) fn target(&self, i: usize) -> c_int {
        self.targets[i]
    }

    /// Whether request `i` was complete when tested right after its post
    /// (false when `post` did not test each).
    pub(crate) fn done_at_post(&self, i: usize) -> bool {
        self.done_at_post.get(i).copied().unwrap_or(false)
    }

    /// Whether request `i` is known complete (no MPI call).
    pub(crate) fn is_done(&self, i: usize) -> bool {
        self.reqs[i] == request_null()
    }

    /// Tests request `i` once (`MPI_Test`); true when it is complete.
    pub(crate) fn test(&mut self, i: usize) -> FabricResult<bool> {
        let _g = serialize();
        self.test_locked(i)
    }

    fn test_locked(&mut self, i: usize) -> FabricResult<bool> {
        if self.is_done(i) {
            return Ok(true);
        }
        let mut flag: c_int = 0;
        // SAFETY: a request MPI_Rget returned and not yet completed; the
        // caller holds the serialize guard.
        let rc = unsafe { ffi::MPI_Test(&mut self.reqs[i], &mut flag, ffi::RSMPI_STATUS_IGNORE) };
        check("MPI_Test", rc).map_err(|e| e.with_peer(self.targets[i] as usize))?;
        Ok(flag != 0)
    }

    /// Tests every request (`MPI_Testall`); true when all are complete.
    pub(crate) fn test_all(&mut self) -> FabricResult<bool> {
        if self.reqs.is_empty() {
            return Ok(true);
        }
        let mut flag: c_int = 0;
        let _g = serialize();
        // SAFETY: `len` requests MPI_Rget returned (completed ones are
        // MPI_REQUEST_NULL, which MPI_Testall accepts).
        let rc = unsafe {
            ffi::MPI_Testall(
                self.reqs.len() as c_int,
                self.reqs.as_mut_ptr(),
                &mut flag,
                ffi::RSMPI_STATUSES_IGNORE,
            )
        };
        check("MPI_Testall", rc)?;
        if flag != 0 {
            self.reqs.fill(request_null());
        }
        Ok(flag != 0)
    }

    /// Whether every request is known complete (no MPI call).
    fn all_done(&self) -> bool {
        self.reqs.iter().all(|&r| r == request_null())
    }

    /// The landed bytes, once every request completed (`test_all` said so).
    pub(crate) fn landed(&self) -> Option<&[u8]> {
        self.all_done().then_some(&self.buf[..])
    }

    /// Takes the buffer back for reuse, once every request completed.
    pub(crate) fn into_buffer(mut self) -> Option<Vec<u8>> {
        self.all_done().then(|| std::mem::take(&mut self.buf))
    }
}

impl Drop for Gets {
    fn drop(&mut self) {
        if !self.all_done() {
            // MPI may still write the buffer: leaked, never freed (the
            // request handles too, never freed under MPI).
            std::mem::forget(std::mem::take(&mut self.buf));
        }
    }
}

impl Window {
    /// Ends the read epoch and frees the window now (collective: every rank
    /// closes its windows in the same order), reporting MPI's answer.
    /// Dropping it frees it too, but can only log a failure.
    pub(crate) fn close(mut self) -> FabricResult<()> {
        self.free_now()
    }

    /// Unlocks and frees the window once (a forked child, or a process whose
    /// MPI is finalised, leaves it alone).
    fn free_now(&mut self) -> FabricResult<()> {
        if std::mem::replace(&mut self.freed, true) || !self.pid.is_this_process() || !is_usable() {
            return Ok(());
        }
        let _g = serialize();
        let unlocked = if self.locked {
            // SAFETY: the window is ours, inside its lock_all epoch, and MPI is usable.
            check("MPI_Win_unlock_all", unsafe {
                ffi::MPI_Win_unlock_all(self.win)
            })
        } else {
            Ok(())
        };
        // SAFETY: the window is ours and MPI is usable; freed once (the flag above).
        let freed = check("MPI_Win_free", unsafe { ffi::MPI_Win_free(&mut self.win) });
        unlocked.and(freed)
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        report_failed_close("MPI window", self.free_now());
    }
}
