//! Loading byte ranges of files straight into this rank's share: many
//! `pread`s in flight, each landing in the registered region without an
//! intermediate buffer; `O_DIRECT` through an aligned bounce buffer per
//! thread; a CRC32 per range checked before the load succeeds (snapshots).
//! A buffered read drops the pages it read from the page cache once they
//! are in the share: a source read once leaves no second copy cached.
//!
//! The threads are spawned for the call and joined before it returns: no
//! pool outlives it, so a process forked afterwards (a DataLoader worker)
//! never inherits a pool whose threads it does not have (the same rule as
//! `store::copy_in_threads`). The one exception is a load that made no
//! progress for its deadline (a hung file system): the call returns an
//! error and leaves the threads stuck in the kernel behind, owning what
//! they touch (see [`read_ranges`]).
//!
//! No `unsafe` here: the one raw write (`pread` into the share) is
//! [`Memory::pread_into`] in the region module.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant};

use crate::direct_io;
use crate::memory::{Memory, POPULATE_MIN};
use crate::store::Store;
use crate::{Error, Result};

/// Bytes a buffered read through a thread's buffer moves per `pread`: small
/// enough to stay in cache until copied into the share, and under
/// [`POPULATE_MIN`] so no copy pays an `madvise` of its own (the range's
/// pages are faulted in once, first): 256 KiB pieces, each faulting its
/// own, loaded at 0.8x the speed of `pread`s straight into the share.
const BOUNCE_PIECE: usize = POPULATE_MIN - 4096;

/// Most threads one call spawns, whatever the caller asks for.
pub const MAX_THREADS: usize = 256;

/// Bytes read back per piece when checking a range that went straight into
/// the share (small enough to stay in cache between the copy and the hash).
const CHECK_PIECE: usize = 256 << 10;

/// One file a load reads from: opened read-only, closed when dropped.
pub struct SourceFile {
    file: File,
    path: String,
    direct: bool,
}

impl SourceFile {
    /// Opens `path` read-only with `O_NONBLOCK` (a FIFO planted at the path is
    /// refused, never waited on), `O_CLOEXEC`, and `O_NOFOLLOW` when
    /// `nofollow` (a symbolic link is refused). Only a regular file is
    /// accepted; with `size`, only one of exactly that many bytes. `direct`
    /// asks for `O_DIRECT`; a file system that refuses it gives a buffered
    /// file ([`SourceFile::is_direct`] says which).
    pub fn open(path: &str, nofollow: bool, direct: bool, size: Option<u64>) -> Result<SourceFile> {
        let mut flags = libc::O_NONBLOCK | libc::O_CLOEXEC;
        if nofollow {
            flags |= libc::O_NOFOLLOW;
        }
        let open = |extra: i32| {
            OpenOptions::new()
                .read(true)
                .custom_flags(flags | extra)
                .open(path)
        };
        let file = open(0).map_err(|e| {
            if nofollow && e.raw_os_error() == Some(libc::ELOOP) {
                Error::File(format!("{path} is a symbolic link"))
            } else {
                Error::io(format!("{path} cannot be opened"), e)
            }
        })?;
        let meta = file
            .metadata()
            .map_err(|e| Error::io(format!("{path}: fstat"), e))?;
        if !meta.file_type().is_file() {
            return Err(Error::File(format!("{path} is not a regular file")));
        }
        if let Some(want) = size {
            if meta.len() != want {
                let what = if meta.len() < want {
                    "truncated"
                } else {
                    "longer than expected"
                };
                return Err(Error::File(format!(
                    "{path} is {what}: {} bytes, expected {want}",
                    meta.len()
                )));
            }
        }
        let mut out = SourceFile {
            file,
            path: path.to_string(),
            direct: false,
        };
        if direct {
            // tmpfs and some overlay file systems refuse O_DIRECT: stay buffered.
            if let Ok(dfile) = open(libc::O_DIRECT) {
                let dmeta = dfile
                    .metadata()
                    .map_err(|e| Error::io(format!("{path}: fstat"), e))?;
                if (dmeta.dev(), dmeta.ino()) != (meta.dev(), meta.ino()) {
                    return Err(Error::File(format!("{path} changed while it was opened")));
                }
                out.file = dfile;
                out.direct = true;
            }
        }
        if !out.direct {
            crate::spill::file::no_read_ahead(&out.file); // each read drops its pages
        }
        Ok(out)
    }

    /// Whether reads bypass the page cache (`O_DIRECT` was granted).
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// The path it was opened as (named in every error).
    pub fn path(&self) -> &str {
        &self.path
    }

    fn truncated(&self, at: u64, need: u64) -> Error {
        Error::File(format!(
            "{} is truncated: it ends at byte {at}, the rows need {need}",
            self.path
        ))
    }
}

/// One read of a load: `len` bytes of a file from `file_offset`, of which
/// `write_len` bytes from `skip` on land in the share at `dst_offset`. With
/// `crc32`, all `len` bytes read must have that CRC32 (zlib's polynomial).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileRange {
    /// Index of the file in the call's list.
    pub file: usize,
    /// First byte read from the file.
    pub file_offset: u64,
    /// Bytes read (and checked).
    pub len: usize,
    /// Expected CRC32 of the bytes read.
    pub crc32: Option<u32>,
    /// Bytes read that are checked but not written (at the start).
    pub skip: usize,
    /// Bytes written after the skipped ones.
    pub write_len: usize,
    /// Byte offset in the share where the written bytes land.
    pub dst_offset: usize,
}

impl FileRange {
    /// A range read and written whole, unchecked.
    pub fn whole(file: usize, file_offset: u64, len: usize, dst_offset: usize) -> FileRange {
        FileRange {
            file,
            file_offset,
            len,
            crc32: None,
            skip: 0,
            write_len: len,
            dst_offset,
        }
    }
}

/// A thread's buffer for reads that cannot go straight into the share
/// (`O_DIRECT`, or a range written only in part); aligned for `O_DIRECT`.
#[derive(Default)]
struct Bounce {
    buf: Vec<u8>,
}

impl Bounce {
    fn aligned(&mut self, len: usize) -> &mut [u8] {
        direct_io::buffer(&mut self.buf, len)
    }
}

/// What the reading threads of one load share. They own it (an `Arc`), so a
/// thread the call gave up on (stuck in a `pread` on a hung file system) can
/// finish that `pread` later, write into memory still mapped, and exit.
struct Shared {
    /// The share, for reads straight into it: only memory a held handle
    /// keeps mapped ([`Memory::release_is_local`]), held until the thread exits.
    straight: Option<Arc<dyn Memory>>,
    files: Vec<SourceFile>,
    ranges: Vec<FileRange>,
    next: AtomicUsize,
    stop: AtomicBool,
    written: AtomicU64,
    /// When the load started; `last` counts nanoseconds from here.
    t0: Instant,
    /// When a `pread` last returned bytes (progress, not completion).
    last: AtomicU64,
    /// The share, for copies from a bounce buffer; emptied once the call gave
    /// up (copies take it shared), so nothing is written into memory the
    /// caller may free once the call returned, and an MPI window is not held
    /// past the collective free of its variable.
    target: RwLock<Option<Arc<dyn Memory>>>,
    state: Mutex<State>,
    exited: Condvar,
}

struct State {
    failure: Option<Error>,
    /// Threads not yet exited.
    running: usize,
    /// Per thread: the range it is reading and since when.
    reading: Vec<Option<(usize, Instant)>>,
}

impl Shared {
    fn moved(&self) {
        let ns = self.t0.elapsed().as_nanos().min(u64::MAX as u128) as u64;
        self.last.store(ns, Ordering::Relaxed);
    }

    fn idle(&self) -> Duration {
        let last = Duration::from_nanos(self.last.load(Ordering::Relaxed));
        self.t0.elapsed().saturating_sub(last)
    }

    /// Copies `src` into the share unless the call gave up on this load.
    fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        let target = self.target.read().unwrap_or_else(|e| e.into_inner());
        match target.as_ref() {
            Some(mem) => mem.write_at(offset, src),
            None => Err(Error::invalid("the load was abandoned")),
        }
    }

    fn work(&self, slot: usize) {
        // Counted out however the thread ends (a panic too), so the caller never waits on it.
        struct Exit<'a>(&'a Shared);
        impl Drop for Exit<'_> {
            fn drop(&mut self) {
                let mut st = self.0.lock();
                st.running -= 1;
                if std::thread::panicking() {
                    self.0.stop.store(true, Ordering::Relaxed);
                    st.failure
                        .get_or_insert(Error::invalid("a file load thread panicked"));
                }
                drop(st);
                self.0.exited.notify_all();
            }
        }
        let _exit = Exit(self);
        let mut bounce = Bounce::default();
        while !self.stop.load(Ordering::Relaxed) {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            let Some(r) = self.ranges.get(i) else { break };
            self.lock().reading[slot] = Some((i, Instant::now()));
            let done = read_one(self, &self.files[r.file], r, &mut bounce);
            let mut st = self.lock();
            st.reading[slot] = None;
            match done {
                Ok(()) => {
                    self.written
                        .fetch_add(r.write_len as u64, Ordering::Relaxed);
                }
                Err(e) => {
                    self.stop.store(true, Ordering::Relaxed);
                    st.failure.get_or_insert(e);
                    break;
                }
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The error of a load that made no progress for `waited`, naming the
    /// read waited on longest.
    fn stalled(&self, st: &State, waited: Duration, timeout: Duration) -> Error {
        let oldest = st.reading.iter().flatten().min_by_key(|(_, since)| *since);
        let limit = timeout.as_secs_f64();
        let what = match oldest {
            Some(&(i, since)) => {
                let r = &self.ranges[i];
                format!(
                    "{} bytes {}..{} unanswered for {:.1?} (DDSTORE_LOAD_TIMEOUT_S={limit})",
                    self.files[r.file].path,
                    r.file_offset,
                    r.file_offset + r.len as u64,
                    since.elapsed()
                )
            }
            None => format!("(DDSTORE_LOAD_TIMEOUT_S={limit})"),
        };
        Error::Stalled {
            waited,
            what: format!(
                "{what}; the file system may be hung (check the server or storage target \
                 holding the file) or very slow (raise DDSTORE_LOAD_TIMEOUT_S)"
            ),
        }
    }
}

/// Reads every range of `files` into `mem` with up to `threads` reads in
/// flight (threads spawned for this call); the first error stops the others
/// and is returned. Every range is checked before a byte moves. Returns the
/// bytes written.
///
/// Every wait has a deadline: when no `pread` of the load returns for
/// `timeout` (progress, not completion: a slow file system that moves never
/// fails) the call returns [`Error::Stalled`] naming the file and the byte
/// range waited on. A thread stuck in the kernel cannot be stopped, so it is
/// abandoned: it owns what it touches (the files, and `mem` only where
/// [`Memory::release_is_local`], which keeps that memory mapped until it
/// exits); into other memory (an MPI window, freed collectively with its
/// variable) it writes only from its own buffer and only while the call has
/// not given up, and holds no handle to it after. Such a thread, and the memory it holds,
/// outlive the call until its `pread` returns (a forked child does not have
/// it; it only holds a reference there that is never dropped).
pub fn read_ranges(
    mem: Arc<dyn Memory>,
    files: Vec<SourceFile>,
    ranges: &[FileRange],
    threads: usize,
    timeout: Duration,
) -> Result<u64> {
    for (i, r) in ranges.iter().enumerate() {
        if r.file >= files.len() {
            return Err(Error::invalid(format!(
                "range {i}: file index {} is not below the {} files given",
                r.file,
                files.len()
            )));
        }
        if r.skip.checked_add(r.write_len).is_none_or(|e| e > r.len) {
            return Err(Error::invalid(format!(
                "range {i}: {} bytes written after {} skipped do not fit the {} read",
                r.write_len, r.skip, r.len
            )));
        }
        if r.file_offset.checked_add(r.len as u64).is_none() {
            return Err(Error::invalid(format!("range {i}: file offset overflows")));
        }
        if r.dst_offset
            .checked_add(r.write_len)
            .is_none_or(|e| e > mem.len())
        {
            return Err(Error::IndexOutOfRange(format!(
                "range {i} ({}): {} bytes at byte {} of the share do not fit its {} bytes",
                files[r.file].path,
                r.write_len,
                r.dst_offset,
                mem.len()
            )));
        }
    }
    if ranges.is_empty() {
        return Ok(0);
    }
    let threads = threads.clamp(1, MAX_THREADS).min(ranges.len());
    let shared = Arc::new(Shared {
        straight: mem.release_is_local().then(|| mem.clone()),
        target: RwLock::new(Some(mem)),
        files,
        ranges: ranges.to_vec(),
        next: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
        written: AtomicU64::new(0),
        t0: Instant::now(),
        last: AtomicU64::new(0),
        state: Mutex::new(State {
            failure: None,
            running: threads,
            reading: vec![None; threads],
        }),
        exited: Condvar::new(),
    });
    let mut handles = Vec::with_capacity(threads);
    for slot in 0..threads {
        let sh = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("ddstore-load".into())
            .spawn(move || sh.work(slot));
        match spawned {
            Ok(h) => handles.push(h),
            Err(e) => {
                // The ones already running finish the ranges.
                shared.lock().running -= threads - slot;
                if slot == 0 {
                    return Err(Error::io("spawning a file load thread", e));
                }
                break;
            }
        }
    }
    let mut st = shared.lock();
    while st.running > 0 {
        let idle = shared.idle();
        let interrupted = crate::interrupt::check().is_err();
        if idle >= timeout || interrupted {
            shared.stop.store(true, Ordering::Relaxed);
            shared
                .target
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .take();
            if interrupted {
                return Err(Error::Interrupted);
            }
            let stalled = shared.stalled(&st, idle, timeout);
            // A failure already met says more than the wait for the others.
            return Err(st.failure.take().unwrap_or(stalled));
        }
        // Woken at least every CHECK_EVERY to notice a signal.
        st = shared
            .exited
            .wait_timeout(st, (timeout - idle).min(crate::interrupt::CHECK_EVERY))
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
    let failure = st.failure.take();
    drop(st);
    for h in handles {
        let _ = h.join();
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(shared.written.load(Ordering::Relaxed)),
    }
}

fn check_crc(f: &SourceFile, r: &FileRange, got: u32) -> Result<()> {
    match r.crc32 {
        Some(want) if want != got => Err(Error::File(format!(
            "{}: checksum mismatch in bytes {}..{} (CRC32 {got:#010x}, expected {want:#010x}): the file is corrupt",
            f.path,
            r.file_offset,
            r.file_offset + r.len as u64
        ))),
        _ => Ok(()),
    }
}

fn read_error(f: &SourceFile, at: u64, e: Error) -> Error {
    match e {
        Error::Io { source, .. } => Error::io(format!("{}: read at byte {at}", f.path), source),
        other => other,
    }
}

/// Reads range `r` of `f` into the share; a buffered read then drops the
/// range's pages from the page cache: the share holds the bytes now, and a
/// load of a data set larger than memory must not leave a second copy of
/// it cached (O_DIRECT reads leave none).
fn read_one(sh: &Shared, f: &SourceFile, r: &FileRange, bounce: &mut Bounce) -> Result<()> {
    read_range(sh, f, r, bounce)?;
    if !f.direct {
        crate::spill::file::drop_cached(&f.file, r.file_offset, r.len as u64);
    }
    Ok(())
}

fn read_range(sh: &Shared, f: &SourceFile, r: &FileRange, bounce: &mut Bounce) -> Result<()> {
    let end = r.file_offset + r.len as u64;
    let straight = sh.straight.as_deref().filter(|_| !f.direct);
    if let Some(mem) = straight.filter(|_| r.skip == 0 && r.write_len == r.len) {
        // Straight into the share: the kernel copies from the page cache.
        let mut done = 0;
        while done < r.len {
            let at = r.file_offset + done as u64;
            let got = mem
                .pread_into(r.dst_offset + done, r.len - done, &f.file, at)
                .map_err(|e| read_error(f, at, e))?;
            if got == 0 {
                return Err(f.truncated(at, end));
            }
            sh.moved();
            done += got;
        }
        if r.crc32.is_some() {
            let mut hasher = crc32fast::Hasher::new();
            let piece = bounce.aligned(CHECK_PIECE.min(r.len));
            let mut pos = 0;
            while pos < r.len {
                let n = piece.len().min(r.len - pos);
                mem.read_at(r.dst_offset + pos, &mut piece[..n])?;
                hasher.update(&piece[..n]);
                pos += n;
            }
            check_crc(f, r, hasher.finalize())?;
        }
        return Ok(());
    }
    if !f.direct {
        return read_in_pieces(sh, f, r, bounce);
    }
    // Through the bounce buffer: O_DIRECT reads whole aligned blocks around the range.
    let (a0, a1) = direct_io::span(r.file_offset, end - r.file_offset);
    let buf = bounce.aligned((a1 - a0) as usize);
    let need = (end - a0) as usize;
    let mut pos = 0usize;
    while pos < need {
        pos += pread_some(sh, f, &mut buf[pos..], a0 + pos as u64, end)?;
        if !pos.is_multiple_of(direct_io::ALIGN) && pos < need {
            return Err(Error::File(format!(
                "{}: unaligned short read at byte {} with O_DIRECT",
                f.path,
                a0 + pos as u64
            )));
        }
    }
    let data = &buf[(r.file_offset - a0) as usize..need];
    if r.crc32.is_some() {
        check_crc(f, r, crc32fast::hash(data))?;
    }
    sh.write(r.dst_offset, &data[r.skip..r.skip + r.write_len])
}

/// One `pread` of `f` at `at` into `buf` (retried when interrupted): the bytes
/// read, never 0 (the end of the file before `end` is an error naming it).
/// Counts as progress for the load's deadline.
fn pread_some(sh: &Shared, f: &SourceFile, buf: &mut [u8], at: u64, end: u64) -> Result<usize> {
    loop {
        match f.file.read_at(buf, at) {
            Ok(0) => return Err(f.truncated(at, end)),
            Ok(n) => {
                sh.moved();
                return Ok(n);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Error::io(format!("{}: read at byte {at}", f.path), e)),
        }
    }
}

/// A buffered range that cannot go straight into the share (memory released
/// elsewhere, or written only in part): read through the thread's buffer in
/// pieces that stay in cache between the `pread` and the copy (a whole
/// range read first and copied after went through memory twice: half the
/// speed), each piece checked and copied while the load is waited on.
fn read_in_pieces(sh: &Shared, f: &SourceFile, r: &FileRange, bounce: &mut Bounce) -> Result<()> {
    let end = r.file_offset + r.len as u64;
    let piece = bounce.aligned(BOUNCE_PIECE.min(r.len.max(1)));
    let mut hasher = r.crc32.map(|_| crc32fast::Hasher::new());
    let (w0, w1) = (r.skip, r.skip + r.write_len);
    if let Some(mem) = sh.target.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
        mem.prepare_write(r.dst_offset, r.write_len);
    }
    let mut pos = 0usize;
    while pos < r.len {
        let n = piece.len().min(r.len - pos);
        let mut got = 0;
        while got < n {
            got += pread_some(
                sh,
                f,
                &mut piece[got..n],
                r.file_offset + (pos + got) as u64,
                end,
            )?;
        }
        let chunk = &piece[..n];
        if let Some(h) = hasher.as_mut() {
            h.update(chunk);
        }
        let (lo, hi) = (pos.max(w0), (pos + n).min(w1));
        if lo < hi {
            sh.write(r.dst_offset + (lo - w0), &chunk[lo - pos..hi - pos])?;
        }
        pos += n;
    }
    match hasher {
        Some(h) => check_crc(f, r, h.finalize()),
        None => Ok(()),
    }
}

impl Store {
    /// Reads `ranges` of `files` straight into this rank's share of `name`
    /// (destination offsets in bytes of the share) with up to `threads`
    /// reads in flight, giving up when no read returns for `timeout`; see
    /// [`read_ranges`]. Returns the bytes written.
    pub fn load_file_ranges(
        &self,
        name: &str,
        files: Vec<SourceFile>,
        ranges: &[FileRange],
        threads: usize,
        timeout: Duration,
    ) -> Result<u64> {
        let mem = self.local_share(name)?;
        let loaded = read_ranges(mem, files, ranges, threads, timeout);
        if self.is_spilled(name)? {
            crate::spill::share::release_free_heap(); // the load threads' bounce buffers
        }
        loaded
    }
}
