//! Fork safety, enforced here.
//!
//! The rule: **an object that holds threads, locks held across calls, or
//! transport state (a reader, a libfabric endpoint/domain/CQ/MR, an MPI
//! window or communicator, a progress thread) is used only by the process
//! that created it.** Every such object records its creator with
//! [`CreatedBy`] and checks it before use:
//!
//! - Readers are pooled per variable and per process (`ReaderPool`). The
//!   first read in a forked child takes a slot of its own, tells the
//!   transport to abandon what the child inherited
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
//!   in the child and would hang it.
//!
//! Same-node shares (shared memory, MPI shared windows) are plain mappings
//! and stay valid in the child: a child reads them with memory copies as its
//! parent did. Method 0's remote reads (MPI) are refused in a child (MPI is
//! not usable after fork).
//!
//! Transport-internal locks a parent thread holds mid-read at the fork are
//! not touched by the child either: it opens its own domain and endpoints.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use crate::transport::{RemoteShares, ShareReader};
use crate::{Error, Result};

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

/// Fork generations a pool keeps apart: a process forked from a process
/// forked from ... this deep (a DataLoader worker of a forked trainer is 2).
const GENERATIONS: usize = 8;

/// The readers of one variable, kept per process: each process that reads
/// takes a slot of its own, so a forked child never uses, and never even
/// locks, its parent's slot (whose lock another thread of the parent may
/// have held at the moment of the fork: locking it would hang the child).
pub(crate) struct ReaderPool {
    slots: [Slot; GENERATIONS],
    /// Reads are serialised (`DDSTORE_THREAD_READERS=0`: threads share one reader).
    serial: bool,
}

/// One process's readers.
struct Slot {
    /// The process that owns this slot; 0 while free.
    pid: AtomicU32,
    idle: Mutex<Vec<Box<dyn ShareReader>>>,
    /// Held for a whole read when reads are serialised.
    serial: Mutex<()>,
}

impl ReaderPool {
    /// `serial`: one read at a time (threads share one reader).
    pub(crate) fn new(serial: bool) -> ReaderPool {
        let pool = ReaderPool {
            slots: std::array::from_fn(|_| Slot {
                pid: AtomicU32::new(0),
                idle: Mutex::new(Vec::new()),
                serial: Mutex::new(()),
            }),
            serial,
        };
        pool.slots[0]
            .pid
            .store(CreatedBy::this_process().pid(), Ordering::Release);
        pool
    }

    /// Runs `read` with a reader of this process: an idle one, or a new one.
    /// A reader that failed may have reads outstanding: it is dropped, not
    /// given back. In a forked child the first read takes a fresh slot and
    /// tells the transport to abandon what it inherited.
    pub(crate) fn read<T>(
        &self,
        remote: &dyn RemoteShares,
        read: impl FnOnce(&mut dyn ShareReader) -> Result<T>,
    ) -> Result<T> {
        let slot = self.slot(remote)?;
        let _serial = self.serial.then(|| lock(&slot.serial));
        let pooled = lock(&slot.idle).pop();
        let mut reader = match pooled {
            Some(r) => r,
            None => remote.open_reader()?,
        };
        let got = read(reader.as_mut())?;
        lock(&slot.idle).push(reader);
        Ok(got)
    }

    /// Abandons what this process inherited now (what its first read does).
    pub(crate) fn forget_inherited(&self, remote: &dyn RemoteShares) -> Result<()> {
        self.slot(remote).map(|_| ())
    }

    /// This process's slot, taken on first use.
    fn slot(&self, remote: &dyn RemoteShares) -> Result<&Slot> {
        let me = CreatedBy::this_process().pid();
        if let Some(s) = self
            .slots
            .iter()
            .find(|s| s.pid.load(Ordering::Acquire) == me)
        {
            return Ok(s);
        }
        // A forked child (only its own threads race here): the first free slot.
        for s in &self.slots {
            if s.pid
                .compare_exchange(0, me, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                // The inherited readers stay in their slot, never used here:
                // their Drop abandons (never closes) the parent's objects.
                remote.forget_after_fork()?;
                return Ok(s);
            }
            if s.pid.load(Ordering::Acquire) == me {
                return Ok(s); // another thread of this process just took it
            }
        }
        Err(Error::Unsupported(format!(
            "this process is forked more than {GENERATIONS} generations from the one that \
             created the store: open a store in it instead"
        )))
    }
}

/// A poisoned lock holds a plain Vec or unit: still consistent.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::RemoteRead;
    use std::sync::atomic::AtomicUsize;

    #[derive(Default)]
    struct Counting {
        opened: AtomicUsize,
        forgotten: AtomicUsize,
    }
    struct Reader;
    impl ShareReader for Reader {
        fn read_many(&mut self, _: &[RemoteRead], _: &mut [u8]) -> Result<()> {
            Ok(())
        }
    }
    impl RemoteShares for Counting {
        fn open_reader(&self) -> Result<Box<dyn ShareReader>> {
            self.opened.fetch_add(1, Ordering::Relaxed);
            Ok(Box::new(Reader))
        }
        fn forget_after_fork(&self) -> Result<()> {
            self.forgotten.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
    }

    #[test]
    fn readers_are_reused_within_a_process() {
        let (pool, remote) = (ReaderPool::new(false), Counting::default());
        for _ in 0..3 {
            pool.read(&remote, |_| Ok(())).unwrap();
        }
        assert_eq!(remote.opened.load(Ordering::Relaxed), 1);
        assert_eq!(remote.forgotten.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_child_never_touches_its_parents_slot() {
        let (pool, remote) = (ReaderPool::new(true), Counting::default());
        pool.read(&remote, |_| Ok(())).unwrap();
        // As a forked child sees it: the slot is another process's, and a
        // thread of that process held its locks at the fork.
        pool.slots[0]
            .pid
            .store(CreatedBy::this_process().pid() ^ 1, Ordering::Release);
        let _held = (
            pool.slots[0].idle.lock().unwrap(),
            pool.slots[0].serial.lock().unwrap(),
        );
        for _ in 0..2 {
            pool.read(&remote, |_| Ok(())).unwrap(); // would hang on the held locks
        }
        assert_eq!(
            remote.forgotten.load(Ordering::Relaxed),
            1,
            "abandoned once"
        );
        assert_eq!(
            remote.opened.load(Ordering::Relaxed),
            2,
            "one fresh reader, reused"
        );
        // A failed read drops its reader: the next opens another.
        assert!(pool
            .read(&remote, |_| Err::<(), _>(Error::Transport("x".into())))
            .is_err());
        pool.read(&remote, |_| Ok(())).unwrap();
        assert_eq!(remote.opened.load(Ordering::Relaxed), 3);
    }

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
