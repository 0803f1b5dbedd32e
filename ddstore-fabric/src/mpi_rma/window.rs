//! `Window`: one MPI window, locked for passive-target reads (`MPI_Win_lock_all`)
//! from creation until drop, when it is unlocked and freed (collective).

use ddstore_core::fork::CreatedBy;
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

/// Where a batch of gets lands.
enum Dest<'a> {
    /// The caller's memory: the batch can only end by completing (dropping
    /// it with requests pending waits for them).
    Borrowed(&'a mut [u8]),
    /// A buffer the batch owns: it may be abandoned with requests pending,
    /// the buffer then leaked rather than freed under MPI.
    Owned(Vec<u8>),
}

impl Dest<'_> {
    fn bytes(&mut self) -> &mut [u8] {
        match self {
            Dest::Borrowed(b) => b,
            Dest::Owned(v) => v,
        }
    }
}

/// A batch of `MPI_Rget`s on one window (inside its lock_all epoch), each
/// request with its target; a completed request is `MPI_REQUEST_NULL`.
/// Only [`Gets::post`] adds requests, always into memory the batch holds,
/// so no request can outlive the memory it writes.
pub(crate) struct Gets<'a> {
    dest: Dest<'a>,
    reqs: Vec<ffi::MPI_Request>,
    targets: Vec<c_int>,
    /// Per request: complete right after it was posted (with `test_each`).
    done_at_post: Vec<bool>,
}

// SAFETY: MPI requests are opaque handles; every call on them goes through
// `serialize()`, as for the window.
unsafe impl Send for Gets<'_> {}

fn request_null() -> ffi::MPI_Request {
    // SAFETY: reading a link-time constant exported by the MPI shim.
    unsafe { ffi::RSMPI_REQUEST_NULL }
}

/// Posts between two checks for a pending signal while posting.
const POSTS_PER_CHECK: usize = 256;

impl<'a> Gets<'a> {
    /// A batch landing in `dst` (the caller's memory, borrowed until it ends).
    pub(crate) fn into_borrowed(dst: &'a mut [u8]) -> Gets<'a> {
        Self::with(Dest::Borrowed(dst))
    }

    /// A batch landing in `buf`, which it owns (see [`Gets::abandon`]).
    pub(crate) fn into_owned(buf: Vec<u8>) -> Gets<'static> {
        Gets::with(Dest::Owned(buf))
    }

    fn with(dest: Dest<'a>) -> Gets<'a> {
        Gets {
            dest,
            reqs: Vec::new(),
            targets: Vec::new(),
            done_at_post: Vec::new(),
        }
    }

    /// Posts every get of `gets` on `win` (one `MPI_Rget` each), checking
    /// for a pending signal every few hundred; with `test_each`, tests each
    /// request once right after posting it (see [`Gets::done_at_post`]). On
    /// error the requests posted so far stay in the batch.
    pub(crate) fn post(
        &mut self,
        win: &Window,
        gets: impl Iterator<Item = Get>,
        test_each: bool,
    ) -> FabricResult<()> {
        let _g = serialize();
        let dest = self.dest.bytes();
        let (base, dest_len) = (dest.as_mut_ptr(), dest.len());
        for (n, g) in gets.enumerate() {
            if n % POSTS_PER_CHECK == POSTS_PER_CHECK - 1 {
                crate::error::check_interrupt()?;
            }
            let count = c_int::try_from(g.len)
                .ok()
                .filter(|_| g.at.checked_add(g.len).is_some_and(|end| end <= dest_len));
            let Some(count) = count else {
                return Err(FabricError::Invalid(format!(
                    "a get of {} bytes at {} does not fit a destination of {dest_len} bytes",
                    g.len, g.at
                )));
            };
            let mut req = request_null();
            // SAFETY: `at..at+len` is inside the destination (checked above),
            // which this batch holds until the request completes: a borrowed
            // one waits on drop, an owned one is leaked if abandoned. The
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

    /// Waits for every request (`MPI_Waitall`: no deadline, no signals).
    pub(crate) fn wait_all(&mut self) -> FabricResult<()> {
        if self.reqs.iter().all(|&r| r == request_null()) || !is_usable() {
            return Ok(());
        }
        let _g = serialize();
        // SAFETY: as in `test_all`.
        let rc = unsafe {
            ffi::MPI_Waitall(
                self.reqs.len() as c_int,
                self.reqs.as_mut_ptr(),
                ffi::RSMPI_STATUSES_IGNORE,
            )
        };
        self.reqs.fill(request_null());
        check("MPI_Waitall", rc)
    }

    /// The owned buffer, once every request completed (`test_all` said so):
    /// the landed bytes, and the buffer to reuse. `None` for a borrowed batch
    /// or while a request is pending.
    pub(crate) fn landed(&mut self) -> Option<&[u8]> {
        if !self.reqs.iter().all(|&r| r == request_null()) {
            return None;
        }
        match &self.dest {
            Dest::Owned(v) => Some(v),
            Dest::Borrowed(_) => None,
        }
    }

    /// Takes the owned buffer back once every request completed (for reuse).
    pub(crate) fn into_buffer(mut self) -> Option<Vec<u8>> {
        self.landed()?;
        match std::mem::replace(&mut self.dest, Dest::Owned(Vec::new())) {
            Dest::Owned(v) => Some(v),
            Dest::Borrowed(_) => None,
        }
    }
}

impl Drop for Gets<'_> {
    fn drop(&mut self) {
        if self.reqs.iter().all(|&r| r == request_null()) {
            return;
        }
        match &mut self.dest {
            // Never return the caller's memory with a get still landing in it.
            Dest::Borrowed(_) => {
                let _ = self.wait_all();
            }
            // MPI may still write the buffer: leaked, never freed (its
            // request handles too, never freed under MPI).
            Dest::Owned(v) => std::mem::forget(std::mem::take(v)),
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
