//! Fork safety, enforced here.
//!
//! The rule: **an object that holds threads, locks held across calls, or
//! transport state (a reader, a libfabric endpoint/domain/CQ/MR, an MPI
//! window or communicator, a progress thread) is used only by the process
//! that created it.** Every such object records its creator with
//! [`CreatedBy`] and checks it before use:
//!
//! - Readers are pooled per variable and per process (the store's
//!   `reader_pool::ReaderPool`). The first read in a forked child takes a
//!   slot of its own, tells the transport to abandon what the child inherited
//!   ([`crate::transport::RemoteShares::forget_after_fork`]), and opens fresh
//!   readers; the parent's readers (and the locks that guard them, which
//!   another thread of the parent may have held at the fork) are never used
//!   in the child. No call from Python (`fork_reader()`) is needed; that call
//!   does the same at once and is kept for compatibility.
//! - Transport objects (libfabric handles in `ddstore-fabric::ofi`, MPI
//!   windows and communicators in `ddstore-fabric::mpi_rma`) carry a
//!   [`CreatedBy`] and skip their close in `Drop` in any other process.
//! - No thread pool outlives a call: large same-node copies run on threads
//!   spawned for one batch and joined before it returns
//!   (`store::copy_in_threads`); a pool started before a fork has no threads
//!   in the child and would hang it. Two threads outlive calls, and the
//!   child never uses them: an owner's gather server (its progress thread
//!   and the few threads that read spilled rows for its replies) serves
//!   only in the parent, and the read-ahead stage of a spilled variable
//!   (`spill::Stage`, whose lock the loader's read-ahead thread takes) is
//!   empty in a child and stages nothing there.
//!
//! Same-node shares (shared memory, MPI shared windows) are plain mappings
//! and stay valid in the child: a child reads them with memory copies as its
//! parent did. Method 0's remote reads (MPI) are refused in a child (MPI is
//! not usable after fork).
//!
//! Transport-internal locks a parent thread holds mid-read at the fork are
//! not touched by the child either: it opens its own domain and endpoints.

use std::sync::atomic::{AtomicU32, Ordering};

/// The process that created an object. After `fork()` the child holds copies
/// of the parent's objects, which belong to the parent's threads and
/// transport state: the child must abandon them (never use or close them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CreatedBy(u32);

/// This process's id, cached: `getpid` is a system call (glibc no longer
/// caches it; about 150 ns on a VM) and every read checks it. A handler
/// registered with `pthread_atfork` clears the cache in a forked child, which
/// then caches its own id on first use.
static CACHED_PID: AtomicU32 = AtomicU32::new(0);

extern "C" fn clear_cached_pid_in_child() {
    // Only an atomic store: async-signal-safe, as a handler run after fork must be.
    CACHED_PID.store(0, Ordering::Relaxed);
}

/// The calling process's id (see [`CACHED_PID`]).
pub fn current_pid() -> u32 {
    let cached = CACHED_PID.load(Ordering::Relaxed);
    if cached != 0 {
        return cached;
    }
    static REGISTERED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let registered = *REGISTERED.get_or_init(|| {
        // SAFETY: registers a handler that only stores to an atomic; no memory
        // is handed to libc. If it fails the pid is never cached (each call
        // asks the kernel), which is slower but still right.
        unsafe { libc::pthread_atfork(None, None, Some(clear_cached_pid_in_child)) == 0 }
    });
    let pid = std::process::id();
    if registered {
        CACHED_PID.store(pid, Ordering::Relaxed);
    }
    pid
}

impl CreatedBy {
    /// The calling process.
    pub fn this_process() -> CreatedBy {
        CreatedBy(current_pid())
    }

    /// False in a forked child for objects its parent created.
    pub fn is_this_process(self) -> bool {
        self.0 == current_pid()
    }

    /// The creator's process id.
    pub fn pid(self) -> u32 {
        self.0
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

    #[test]
    fn a_forked_child_sees_its_own_pid_not_the_cached_one() {
        let parent = current_pid();
        assert_eq!(parent, std::process::id());
        // SAFETY: the child only calls getpid-like functions and _exit.
        let child = unsafe { libc::fork() };
        assert!(child >= 0);
        if child == 0 {
            let ok = current_pid() == std::process::id() && current_pid() != parent;
            // SAFETY: leaves the child at once, running no test-harness code.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waits for the child just forked.
        unsafe { libc::waitpid(child, &mut status, 0) };
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "{status}"
        );
        assert_eq!(current_pid(), parent);
    }
}
