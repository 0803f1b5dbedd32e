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
// MPI_THREAD_MULTIPLE concurrent MPI_Get/MPI_Win_flush inside one lock_all
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

    /// Posts one `MPI_Get` of `count` bytes at `disp` of `target` into `dst`.
    ///
    /// # Safety
    /// `dst..dst+count` must be writable and stay untouched by Rust until the
    /// target is flushed; the caller holds `serialize()`'s guard if needed.
    pub(crate) unsafe fn get(
        &self,
        dst: *mut u8,
        count: c_int,
        target: c_int,
        disp: ffi::MPI_Aint,
    ) -> FabricResult<()> {
        // SAFETY: per the caller's contract.
        let rc = unsafe {
            ffi::MPI_Get(
                dst as *mut c_void,
                count,
                ffi::RSMPI_UINT8_T,
                target,
                disp,
                count,
                ffi::RSMPI_UINT8_T,
                self.win,
            )
        };
        check("MPI_Get", rc).map_err(|e| e.with_peer(target as usize))
    }

    /// Completes every operation this process posted to `target`; the caller
    /// holds `serialize()`'s guard if needed.
    pub(crate) fn flush(&self, target: c_int) -> FabricResult<()> {
        // SAFETY: the window is valid and inside its lock_all epoch.
        check("MPI_Win_flush", unsafe {
            ffi::MPI_Win_flush(target, self.win)
        })
        .map_err(|e| e.with_peer(target as usize))
    }

    /// Completes every operation this process posted on the window.
    pub(crate) fn flush_all(&self) -> FabricResult<()> {
        // SAFETY: the window is valid and inside its lock_all epoch.
        check("MPI_Win_flush_all", unsafe {
            ffi::MPI_Win_flush_all(self.win)
        })
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
