//! Fork safety, enforced here.
//!
//! The rule: **an object that holds threads, locks held across calls, or
//! transport state (a reader, a libfabric endpoint/domain/CQ/MR, an MPI
//! window or communicator, a progress thread) is used only by the process
//! that created it.** Every such object records its creator with
//! [`CreatedBy`] and checks it before use:
//!
//! - Readers are pooled per variable in a [`ReaderPool`]. The first read in a
//!   forked child finds the pool created by another process: it abandons the
//!   inherited readers (forgets them: closing them would tear down the
//!   parent's provider state) and tells the transport
//!   ([`crate::transport::RemoteShares::forget_after_fork`]), then opens fresh
//!   readers. No call from Python (`fork_reader()`) is needed; that call does
//!   the same eagerly and is kept for compatibility.
//! - Transport objects (libfabric handles in `ddstore-fabric::ofi`, MPI
//!   windows and communicators in `ddstore-fabric::mpi_rma`) carry a
//!   [`CreatedBy`] and skip their close in `Drop` in any other process.
//! - No thread pool outlives a call: large same-node copies run on threads
//!   spawned for one batch and joined before it returns
//!   (`store::copy_in_threads`); a pool started before a fork has no threads
//!   in the child and would hang it.
//!
//! Same-node shares (shared memory, MPI shared windows) are plain mappings
//! and stay valid in the child: a child reads them with memory copies as its
//! parent did. Method 0's remote reads (MPI) are refused in a child (MPI is
//! not usable after fork).
//!
//! What this cannot cover: a fork while another thread of the parent holds a
//! lock (a reader pool's, for the microseconds of a take or give-back, or the
//! shared reader lock of `DDSTORE_THREAD_READERS=0` for a whole read) leaves
//! that lock held in the child. Fork from a thread that is not reading (as
//! torch's DataLoader does), or use spawn/forkserver.

use std::sync::Mutex;

use crate::transport::{RemoteShares, ShareReader};
use crate::Result;

/// The process that created an object. After `fork()` the child holds copies
/// of the parent's objects, which belong to the parent's threads and
/// transport state: the child must abandon them (never use or close them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CreatedBy(u32);

impl CreatedBy {
    /// The calling process.
    pub fn this_process() -> CreatedBy {
        CreatedBy(std::process::id())
    }

    /// False in a forked child for objects its parent created.
    pub fn is_this_process(self) -> bool {
        self.0 == std::process::id()
    }

    /// The creator's process id.
    pub fn pid(self) -> u32 {
        self.0
    }
}

/// Idle readers of one variable, owned by the process that opened them.
pub(crate) struct ReaderPool {
    inner: Mutex<PoolInner>,
}

struct PoolInner {
    created_by: CreatedBy,
    idle: Vec<Box<dyn ShareReader>>,
}

impl ReaderPool {
    pub(crate) fn new() -> ReaderPool {
        ReaderPool {
            inner: Mutex::new(PoolInner {
                created_by: CreatedBy::this_process(),
                idle: Vec::new(),
            }),
        }
    }

    /// An idle reader of this process, or a new one. In a forked child the
    /// first call abandons every inherited reader first.
    pub(crate) fn take(&self, remote: &dyn RemoteShares) -> Result<Box<dyn ShareReader>> {
        let pooled = {
            let mut inner = self.lock();
            Self::adopt(&mut inner, remote)?;
            inner.idle.pop()
        };
        match pooled {
            Some(r) => Ok(r),
            None => remote.open_reader(),
        }
    }

    /// Returns a reader that completed its reads. A reader opened before a
    /// fork by another thread of the parent never comes back in the child
    /// (that thread does not exist there), so every reader given back here
    /// was taken by this process.
    pub(crate) fn give_back(&self, reader: Box<dyn ShareReader>) {
        let mut inner = self.lock();
        if inner.created_by.is_this_process() {
            inner.idle.push(reader);
        } else {
            std::mem::forget(reader);
        }
    }

    /// Abandons inherited readers now (what the first read of a child does).
    pub(crate) fn forget_inherited(&self, remote: &dyn RemoteShares) -> Result<()> {
        Self::adopt(&mut self.lock(), remote)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolInner> {
        // A panic while holding this lock leaves a plain Vec: still consistent.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn adopt(inner: &mut PoolInner, remote: &dyn RemoteShares) -> Result<()> {
        if inner.created_by.is_this_process() {
            return Ok(());
        }
        for reader in inner.idle.drain(..) {
            // Inherited: its endpoint and completion queue are the parent's.
            std::mem::forget(reader);
        }
        remote.forget_after_fork()?;
        inner.created_by = CreatedBy::this_process();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_created_its_own_objects() {
        let c = CreatedBy::this_process();
        assert!(c.is_this_process());
        assert_eq!(c.pid(), std::process::id());
        assert!(!CreatedBy(c.pid().wrapping_add(1)).is_this_process());
    }
}
