//! The spill directory: private like the handshake directory (owner-only,
//! refused when another user made it or can write it, files created
//! `O_EXCL|O_NOFOLLOW` 0600 relative to the verified directory).
//!
//! Several processes (the ranks of a node, other jobs of the user) share
//! one directory. Each takes a lock file `<tag>.lock` (held with `flock`,
//! which the kernel releases when the process dies) before it creates spill
//! files `<tag>.<n>.<variable>.spill`; a process removes its files when it
//! frees them. Opening the directory removes the files of every tag whose
//! lock no live process holds: a killed job's spill files go with the next
//! job that opens the directory.
//!
//! A cleaner takes a lock it finds to learn whether its holder lives; it can
//! find a new process's lock file in the instant between its creation and
//! its `flock`, and hold it for as long as its clean-up takes. The new
//! process, whose tag no one else uses, then waits for its lock (up to
//! [`OWN_LOCK_WAIT`]) instead of failing.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::private_dir::{random_hex, NameLock, PrivateDir};
use crate::Result;

/// An open spill directory and this process's lock in it.
#[derive(Debug)]
pub struct SpillDir {
    dir: PrivateDir,
    tag: String,
    lock: Option<NameLock>,
    creator: u32,
    next: AtomicU64,
    /// Spill files of killed processes this open removed.
    removed_stale: usize,
}

/// What a cleaner writes into the lock files it takes.
const CLEANER: &str = "pyddstore cleaning up";

/// Longest a process waits for its own lock while cleaners hold it.
pub const OWN_LOCK_WAIT: Duration = Duration::from_secs(10);

fn tag_of(name: &str) -> Option<&str> {
    let tag = name.strip_suffix(".lock").or_else(|| {
        name.strip_suffix(".spill")
            .and_then(|n| n.split('.').next())
    })?;
    tag.starts_with('p').then_some(tag)
}

impl SpillDir {
    /// Where spill files go when no directory is given: `$TMPDIR` (else
    /// `/tmp`) `/ddstore-spill-<uid>`.
    pub fn default_path() -> PathBuf {
        let base = std::env::var_os("TMPDIR")
            .filter(|t| !t.is_empty())
            .map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
        // SAFETY: geteuid has no preconditions and cannot fail.
        base.join(format!("ddstore-spill-{}", unsafe { libc::geteuid() }))
    }

    /// Opens (creating it 0700) and verifies `path`, takes this process's
    /// lock, and removes spill files no live process holds.
    pub fn open(path: &Path) -> Result<Arc<SpillDir>> {
        let dir = PrivateDir::open_as(path, true, "spill_dir")?;
        let pid = std::process::id();
        let tag = format!("p{pid}-{}", &random_hex()[..8]);
        let holder = format!("pyddstore process {pid}");
        let lock = Self::take_own_lock(&dir, &format!("{tag}.lock"), &holder)?;
        let mut me = SpillDir {
            dir,
            tag,
            lock: Some(lock),
            creator: pid,
            next: AtomicU64::new(0),
            removed_stale: 0,
        };
        me.removed_stale = me.remove_stale()?;
        Ok(Arc::new(me))
    }

    /// Takes this process's lock `name`, waiting while a cleaner (another
    /// process opening the directory) holds it: the tag is this process's
    /// own, so no one else holds it for longer than a clean-up.
    fn take_own_lock(dir: &PrivateDir, name: &str, holder: &str) -> Result<NameLock> {
        let deadline = Instant::now() + OWN_LOCK_WAIT;
        let mut pause = Duration::from_millis(1);
        loop {
            match dir.try_lock(name, holder)? {
                Ok(lock) => return Ok(lock),
                Err(other) if Instant::now() >= deadline => {
                    return Err(crate::Error::Access(format!(
                        "spill lock {name} in {} is held by {} after {}s",
                        dir.path().display(),
                        if other.is_empty() {
                            "another process"
                        } else {
                            &other
                        },
                        OWN_LOCK_WAIT.as_secs()
                    )))
                }
                Err(_) => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
            }
        }
    }

    /// Removes the spill files of tags whose lock no live process holds
    /// (or that have no lock file: their process died while freeing).
    fn remove_stale(&self) -> Result<usize> {
        let names = self.dir.list()?;
        let mut dead: Vec<String> = Vec::new();
        // Locks of dead tags, held until their files are gone (dropping one removes it).
        let mut taken = Vec::new();
        for name in &names {
            let Some(tag) = tag_of(name) else { continue };
            if tag == self.tag || dead.iter().any(|d| d == tag) {
                continue;
            }
            let lock_name = format!("{tag}.lock");
            if !names.contains(&lock_name) {
                dead.push(tag.to_string());
                continue;
            }
            // Locked by us now: its holder is gone.
            if let Ok(held) = self.dir.try_lock(&lock_name, CLEANER)? {
                dead.push(tag.to_string());
                taken.push(held);
            }
        }
        let mut removed = 0;
        for name in &names {
            if let Some(tag) = tag_of(name) {
                if dead.iter().any(|d| d == tag) && name.ends_with(".spill") {
                    self.dir.remove(name)?;
                    removed += 1;
                }
            }
        }
        drop(taken);
        Ok(removed)
    }

    /// The verified directory.
    pub fn private(&self) -> &PrivateDir {
        &self.dir
    }

    /// Its path (for messages).
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Spill files of killed processes removed when this directory was opened.
    pub fn removed_stale(&self) -> usize {
        self.removed_stale
    }

    /// A fresh spill file name for variable `var`.
    pub fn file_name(&self, var: &str) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        format!("{}.{n}.{}.spill", self.tag, super::file_safe(var))
    }
}

impl Drop for SpillDir {
    fn drop(&mut self) {
        // A forked child's copy leaves its parent's lock in place.
        if self.creator != std::process::id() {
            std::mem::forget(self.lock.take());
        }
    }
}
