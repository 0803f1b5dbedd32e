//! The readers of one variable, kept per process (the store's; see
//! [`crate::fork`] for the rule they follow): a forked child takes a slot of
//! its own and never touches, nor even locks, its parent's readers.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use crate::fork::CreatedBy;
use crate::transport::{RemoteShares, ShareReader};
use crate::{Error, Result};

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
}
