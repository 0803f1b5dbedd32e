//! One spill file: the rows of a share past its memory budget.
//!
//! The file starts with a header block (magic, a random id, the data
//! length) so that a same-node reader that opens it through the owner's
//! `/proc/<pid>/fd/<fd>` knows it has the file the owner published and not
//! one that reused the descriptor. Data starts at [`HEADER`].
//!
//! Writes (the load, `update`, snapshot restore) go through an ordinary
//! descriptor: rows are not block-aligned and load threads write them
//! concurrently, so the kernel's page cache does the read-modify-write of
//! shared blocks; every [`FLUSH_BYTES`] written, the file is written back and
//! its pages dropped (`sync_file_range`, `posix_fadvise(DONTNEED)`), so the
//! cache held by a load stays bounded. Reads go through a second descriptor
//! opened with `O_DIRECT` (the kernel writes dirty pages of a range back
//! before a direct read of it, so reads see every completed write); where
//! the file system refuses `O_DIRECT`, reads are buffered and drop their
//! pages after each read.
//!
//! Room for the whole file is reserved when it is created
//! (`posix_fallocate`), so a full file system fails the variable's creation
//! on every rank, before a byte is loaded, naming the directory and the
//! bytes needed.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::dir::SpillDir;
use crate::direct_io;
use crate::{Error, Result};

/// Bytes before the data: one block, so data offsets keep their alignment.
pub const HEADER: u64 = direct_io::ALIGN as u64;
/// Bytes written between write-backs that drop the written pages from the cache.
pub const FLUSH_BYTES: u64 = 32 << 20;
const MAGIC: &[u8; 8] = b"DDSPILL1";

/// Where a same-node process opens an owner's spill file (published by the owner).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SpillLocator {
    /// The owner's process id.
    pub pid: u32,
    /// The owner's descriptor of the file (opened through `/proc/<pid>/fd/<fd>`).
    pub fd: i32,
    /// The id written in the file's header.
    pub id: u64,
    /// Data bytes.
    pub len: u64,
}

/// A spill file: written by its owner, read by it and its same-node peers.
pub struct SpillFile {
    /// The owner's writing descriptor; `None` in a reader that opened a peer's file.
    write: Option<File>,
    /// The reading descriptor (`O_DIRECT` while `direct`).
    read: File,
    /// The buffered reading descriptor, for file systems that refuse `O_DIRECT` reads.
    buffered: File,
    direct: AtomicBool,
    len: u64,
    id: u64,
    /// The directory and name to remove on drop (the owner only).
    owner: Option<(Arc<SpillDir>, String)>,
    creator: u32,
    unflushed: AtomicU64,
    flushing: Mutex<()>,
    shown: PathBuf,
}

impl std::fmt::Debug for SpillFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SpillFile({}, {} bytes)", self.shown.display(), self.len)
    }
}

/// Drops the page cache's clean pages of `len` bytes of `file` from `offset`
/// (whole pages around the range): bytes read once, now held elsewhere (a
/// share, a batch), need not stay cached. Dirty pages stay; a failure is
/// ignored (the cache is only advice).
pub fn drop_cached(file: &File, offset: u64, len: u64) {
    let (a, b) = direct_io::span(offset, len);
    // SAFETY: `file` is borrowed, so its descriptor is open for the call;
    // fadvise touches no memory of ours.
    unsafe {
        libc::posix_fadvise(
            file.as_raw_fd(),
            a as libc::off_t,
            (b - a) as libc::off_t,
            libc::POSIX_FADV_DONTNEED,
        );
    }
}

/// Tells the kernel not to read `file` ahead of its reads
/// (`POSIX_FADV_RANDOM`): reads of whole ranges need none, and pages read
/// ahead past a range could land after [`drop_cached`] dropped it.
pub fn no_read_ahead(file: &File) {
    // SAFETY: as in `drop_cached`.
    unsafe {
        libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM);
    }
}

/// Opens `/proc/<pid>/fd/<fd>` for reading, with `O_DIRECT` when `direct`.
fn open_proc_fd(pid: u32, fd: i32, direct: bool) -> io::Result<File> {
    let flags = libc::O_CLOEXEC | libc::O_NOCTTY | if direct { libc::O_DIRECT } else { 0 };
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(format!("/proc/{pid}/fd/{fd}"))
}

/// Free bytes of the file system holding `file`, if it says.
fn free_bytes(file: &File) -> Option<u64> {
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: the descriptor is open and `st` points to a writable statvfs buffer.
    let rc = unsafe { libc::fstatvfs(file.as_raw_fd(), st.as_mut_ptr()) };
    (rc == 0).then(|| {
        // SAFETY: fstatvfs filled the buffer (it returned 0).
        let st = unsafe { st.assume_init() };
        st.f_bavail.saturating_mul(st.f_frsize)
    })
}

fn is_full(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOSPC | libc::EFBIG | libc::EDQUOT)
    )
}

impl SpillFile {
    /// Creates the spill file `name` of `len` data bytes in `dir`, its room
    /// reserved; `what` names the share for messages ("'x' of rank 1").
    pub fn create(dir: &Arc<SpillDir>, name: &str, len: u64, what: &str) -> Result<SpillFile> {
        let write = dir.private().create_exclusive(name)?;
        let shown = dir.path().join(name);
        let file_len = direct_io::round_up(HEADER + len);
        let fail = |e: io::Error, free: Option<u64>| {
            let _ = dir.private().remove(name);
            if is_full(&e) {
                Error::io(
                    format!(
                        "spill_dir {} has no room for {what}: it needs {file_len} bytes{}; free \
                         space there, give a larger memory_limit, or point spill_dir \
                         (DDSTORE_SPILL_DIR) at a larger node-local file system",
                        dir.path().display(),
                        free.map(|f| format!(" and has {f} free"))
                            .unwrap_or_default(),
                    ),
                    e,
                )
            } else {
                Error::io(format!("creating spill file {}", shown.display()), e)
            }
        };
        let fd = write.as_raw_fd();
        // SAFETY: `fd` is the open descriptor `write` owns; fallocate has no memory preconditions.
        let rc = unsafe { libc::posix_fallocate(fd, 0, file_len as libc::off_t) };
        match rc {
            0 => {}
            // The file system reserves nothing ahead: the size is set, and a
            // full disk shows at the first write past the free space.
            libc::EOPNOTSUPP | libc::EINVAL => write
                .set_len(file_len)
                .map_err(|e| fail(e, free_bytes(&write)))?,
            errno => {
                let free = free_bytes(&write);
                return Err(fail(io::Error::from_raw_os_error(errno), free));
            }
        }
        let id = u64::from_str_radix(&crate::private_dir::random_hex(), 16).unwrap_or(1);
        let mut header = vec![0u8; HEADER as usize];
        header[..8].copy_from_slice(MAGIC);
        header[8..16].copy_from_slice(&id.to_le_bytes());
        header[16..24].copy_from_slice(&len.to_le_bytes());
        write
            .write_all_at(&header, 0)
            .map_err(|e| fail(e, free_bytes(&write)))?;
        let pid = std::process::id();
        let (read, direct) = match open_proc_fd(pid, fd, true) {
            Ok(f) => (f, true),
            Err(_) => (
                open_proc_fd(pid, fd, false).map_err(|e| fail(e, None))?,
                false,
            ),
        };
        let buffered = open_proc_fd(pid, fd, false).map_err(|e| fail(e, None))?;
        Ok(SpillFile {
            write: Some(write),
            read,
            buffered,
            direct: AtomicBool::new(direct),
            len,
            id,
            owner: Some((dir.clone(), name.to_string())),
            creator: pid,
            unflushed: AtomicU64::new(0),
            flushing: Mutex::new(()),
            shown,
        })
    }

    /// Opens a same-node owner's spill file for reading, checking that it is
    /// a regular file of this user holding the id and length published.
    pub fn open_peer(loc: &SpillLocator) -> Result<SpillFile> {
        let shown = PathBuf::from(format!("/proc/{}/fd/{}", loc.pid, loc.fd));
        let what = |e: io::Error| {
            Error::io(
                format!(
                    "opening the spill file of process {} ({})",
                    loc.pid,
                    shown.display()
                ),
                e,
            )
        };
        let buffered = open_proc_fd(loc.pid, loc.fd, false).map_err(what)?;
        let meta = buffered.metadata().map_err(what)?;
        // SAFETY: geteuid has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        let mut header = [0u8; 24];
        let header_ok = buffered.read_exact_at(&mut header, 0).is_ok()
            && &header[..8] == MAGIC
            && header[8..16] == loc.id.to_le_bytes()
            && header[16..24] == loc.len.to_le_bytes();
        if !meta.is_file() || meta.uid() != me || meta.len() < HEADER + loc.len || !header_ok {
            return Err(Error::Access(format!(
                "{} is not the spill file process {} published (another file, owner or size): refused",
                shown.display(),
                loc.pid
            )));
        }
        let (read, direct) = match open_proc_fd(loc.pid, loc.fd, true) {
            Ok(f) => (f, true),
            Err(_) => (buffered.try_clone().map_err(what)?, false),
        };
        Ok(SpillFile {
            write: None,
            read,
            buffered,
            direct: AtomicBool::new(direct),
            len: loc.len,
            id: loc.id,
            owner: None,
            creator: std::process::id(),
            unflushed: AtomicU64::new(0),
            flushing: Mutex::new(()),
            shown,
        })
    }

    /// Where same-node processes open this file (the owner's descriptor).
    pub fn locator(&self) -> Option<SpillLocator> {
        self.write.as_ref().map(|w| SpillLocator {
            pid: self.creator,
            fd: w.as_raw_fd(),
            id: self.id,
            len: self.len,
        })
    }

    /// Data bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the file holds no data bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether reads bypass the page cache (`O_DIRECT`).
    pub fn is_direct(&self) -> bool {
        self.direct.load(Ordering::Relaxed)
    }

    /// The path of the file (for messages).
    pub fn path(&self) -> &Path {
        &self.shown
    }

    fn check(&self, what: &str, offset: u64, n: usize) -> Result<()> {
        if offset
            .checked_add(n as u64)
            .is_none_or(|end| end > self.len)
        {
            return Err(Error::IndexOutOfRange(format!(
                "{what} of {n} bytes at {offset} is outside the {} bytes of spill file {}",
                self.len,
                self.shown.display()
            )));
        }
        Ok(())
    }

    /// Writes `src` at data offset `offset` (the owner only).
    pub fn write_at(&self, offset: u64, src: &[u8]) -> Result<()> {
        self.check("write", offset, src.len())?;
        let Some(w) = &self.write else {
            return Err(Error::Unsupported(format!(
                "spill file {} is another process's: read-only here",
                self.shown.display()
            )));
        };
        w.write_all_at(src, HEADER + offset).map_err(|e| {
            let room = if is_full(&e) {
                " (the spill file system is full)"
            } else {
                ""
            };
            Error::io(
                format!("writing spill file {}{room}", self.shown.display()),
                e,
            )
        })?;
        let pending = self
            .unflushed
            .fetch_add(src.len() as u64, Ordering::Relaxed);
        if pending + src.len() as u64 >= FLUSH_BYTES {
            self.flush_written();
        }
        Ok(())
    }

    /// Writes back what was written and drops those pages from the cache
    /// (one thread at a time; the others go on writing). Best effort.
    pub fn flush_written(&self) {
        let (Some(w), Ok(_guard)) = (&self.write, self.flushing.try_lock()) else {
            return;
        };
        self.unflushed.store(0, Ordering::Relaxed);
        let fd = w.as_raw_fd();
        let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
            | libc::SYNC_FILE_RANGE_WRITE
            | libc::SYNC_FILE_RANGE_WAIT_AFTER;
        // SAFETY: `fd` is open (owned by `w`); neither call touches memory of ours.
        unsafe {
            libc::sync_file_range(fd, 0, 0, flags);
            libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_DONTNEED);
        }
    }

    /// Reads `dst.len()` bytes at data offset `offset`. `scratch` is a
    /// buffer the direct path reuses for its aligned bounce.
    pub fn read_at(&self, offset: u64, dst: &mut [u8], scratch: &mut Vec<u8>) -> Result<()> {
        self.check("read", offset, dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        if let Some(at) = self.read_direct(offset, dst.len(), scratch)? {
            dst.copy_from_slice(&scratch[at]);
            return Ok(());
        }
        self.read_buffered(offset, dst)
    }

    /// Reads `len` bytes at data offset `offset` into `storage` (grown if
    /// shorter than [`direct_io::storage_for`]`(len)`) and says where they
    /// lie in it: a direct read lands there with no bounce copy (the
    /// read-ahead stage keeps `storage` as the row's buffer).
    pub fn read_in_place(
        &self,
        offset: u64,
        len: usize,
        storage: &mut Vec<u8>,
    ) -> Result<std::ops::Range<usize>> {
        self.check("read", offset, len)?;
        if len == 0 {
            return Ok(0..0);
        }
        if let Some(at) = self.read_direct(offset, len, storage)? {
            return Ok(at);
        }
        if storage.len() < len {
            storage.resize(len, 0);
        }
        self.read_buffered(offset, &mut storage[..len])?;
        Ok(0..len)
    }

    /// The direct path: reads the block-aligned span around `len` bytes at
    /// `offset` into `storage` and returns where those bytes lie in it;
    /// `None` when reads are buffered (the file system refused `O_DIRECT`).
    fn read_direct(
        &self,
        offset: u64,
        len: usize,
        storage: &mut Vec<u8>,
    ) -> Result<Option<std::ops::Range<usize>>> {
        if !self.is_direct() {
            return Ok(None);
        }
        let at = HEADER + offset;
        let (start, end) = direct_io::span(at, len as u64);
        let bounce = direct_io::aligned(storage, (end - start) as usize);
        match self.read.read_exact_at(&mut storage[bounce.clone()], start) {
            Ok(()) => {
                let skip = bounce.start + (at - start) as usize;
                Ok(Some(skip..skip + len))
            }
            // The file system took O_DIRECT at open but not for this read.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                self.direct.store(false, Ordering::Relaxed);
                Ok(None)
            }
            Err(e) => Err(self.read_error(e)),
        }
    }

    /// A buffered read into `dst`, its pages dropped after it.
    fn read_buffered(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        self.buffered
            .read_exact_at(dst, HEADER + offset)
            .map_err(|e| self.read_error(e))?;
        drop_cached(&self.buffered, HEADER + offset, dst.len() as u64);
        Ok(())
    }

    fn read_error(&self, e: io::Error) -> Error {
        Error::io(format!("reading spill file {}", self.shown.display()), e)
    }
}

impl Drop for SpillFile {
    fn drop(&mut self) {
        // A forked child's copy never removes its parent's file.
        if let Some((dir, name)) = &self.owner {
            if self.creator == std::process::id() {
                let _ = dir.private().remove(name);
            }
        }
    }
}
