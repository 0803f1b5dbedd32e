//! A spilled share as one [`Memory`] of its full length: bytes below
//! `mem_len` live in the memory region, the rest in the spill file. Loads,
//! `update`, snapshot restore and every reader that goes through [`Memory`]
//! see one share; the store's read path splits batches itself (see
//! [`SpilledShare::split`]) to read spilled rows many at a time.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use super::file::SpillFile;
use crate::memory::Memory;
use crate::{Error, Result};

/// Bytes a file load moves through one bounce buffer into the spill file:
/// small, as a load runs `DDSTORE_LOAD_DEPTH` of them at once (32 x 128 KiB
/// = 4 MiB transient, outside the budget; what the allocator keeps of them
/// is given back after the load, see [`release_free_heap`]).
const LOAD_CHUNK: usize = 128 << 10;

/// Gives the allocator's free memory back to the system (`malloc_trim`):
/// called after a load into a spilled share, whose many load threads'
/// bounce buffers the allocator would otherwise keep (measured: the
/// resident size after a load fell by the bounce buffers' size).
pub fn release_free_heap() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only returns free heap pages to the kernel; it
    // touches no memory in use and has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Keeps the process's freed large buffers from staying resident, once per
/// process (the first budget seen sizes it), where a store has a memory
/// budget: glibc raises its mmap threshold each time a mapped buffer is
/// freed (up to 32 MiB), after which batches, read-ahead buffers and
/// replies come from per-thread heaps that keep them resident once freed
/// (measured: 30-40 MiB over a 32 MiB budget in one epoch). The threshold
/// is fixed instead at [`mmap_threshold`] of the budget: buffers that
/// large get their own mapping, returned when freed; smaller ones are
/// reused from the heaps. Not done where the environment sets the
/// threshold itself (`MALLOC_MMAP_THRESHOLD_`, or `GLIBC_TUNABLES` naming
/// it): the user's choice wins.
pub fn bound_heap_growth(budget: u64) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let tunables = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
        if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_some()
            || tunables.contains("mmap_threshold")
        {
            return;
        }
        #[cfg(target_env = "gnu")]
        {
            let threshold = mmap_threshold(budget) as libc::c_int;
            // SAFETY: mallopt only changes the allocator's threshold for
            // later allocations; it takes the allocator's own lock and
            // touches no memory in use.
            unsafe {
                libc::mallopt(libc::M_MMAP_THRESHOLD, threshold);
            }
        }
        #[cfg(not(target_env = "gnu"))]
        let _ = budget; // other allocators have no such threshold
    });
}

/// The allocator's mmap threshold under a `budget`: a 32nd of it, from
/// 128 KiB (glibc's default) to 4 MiB. Low enough that batches and buffers
/// a budget cannot hold many of are given back when freed; high enough that
/// the chunks a decoder allocates and frees over and over stay in the heap
/// (at 128 KiB `np.load` of a 14.65 MB sample took twice the CPU: every
/// chunk faulted in afresh).
pub fn mmap_threshold(budget: u64) -> u64 {
    (budget / 32).clamp(128 << 10, 4 << 20)
}

/// A share whose first `mem_len` bytes are in memory and the rest in a file.
pub struct SpilledShare {
    memory: Arc<dyn Memory>,
    file: Option<Arc<SpillFile>>,
    mem_len: usize,
    len: usize,
    /// File reads in flight when serving many ranges (`read_ranges`).
    inflight: usize,
}

impl SpilledShare {
    /// `memory` (the region of the first `memory.len()` bytes) followed by
    /// `file` (the rest); `file` is `None` where this process cannot reach
    /// the file (its reads of those bytes fail).
    pub fn new(memory: Arc<dyn Memory>, file: Option<Arc<SpillFile>>, len: usize) -> SpilledShare {
        let mem_len = memory.len().min(len);
        SpilledShare {
            memory,
            file,
            mem_len,
            len,
            inflight: 1,
        }
    }

    /// This share, reading up to `inflight` file ranges at a time in `read_ranges`.
    pub fn with_inflight(mut self, inflight: usize) -> SpilledShare {
        self.inflight = inflight.max(1);
        self
    }

    /// Bytes in memory (the first ones).
    pub fn mem_len(&self) -> usize {
        self.mem_len
    }

    /// The memory part.
    pub fn memory(&self) -> &Arc<dyn Memory> {
        &self.memory
    }

    /// The spill file, where this process reaches it.
    pub fn file(&self) -> Option<&Arc<SpillFile>> {
        self.file.as_ref()
    }

    /// `offset..offset + len` as the length of its memory part and the
    /// file data offset of the rest (`(len, None)` when all in memory).
    pub fn split(&self, offset: usize, len: usize) -> (usize, Option<u64>) {
        if offset + len <= self.mem_len {
            (len, None)
        } else if offset >= self.mem_len {
            (0, Some((offset - self.mem_len) as u64))
        } else {
            (self.mem_len - offset, Some(0))
        }
    }

    fn file_or_err(&self) -> Result<&SpillFile> {
        self.file.as_deref().ok_or_else(|| {
            Error::Unsupported(
                "rows of this share are in its owner's spill file, which this process cannot \
                 open: they are read through the owner"
                    .into(),
            )
        })
    }

    fn check(&self, offset: usize, n: usize) -> Result<()> {
        if offset.checked_add(n).is_none_or(|end| end > self.len) {
            return Err(Error::IndexOutOfRange(format!(
                "{n} bytes at {offset} are outside the share's {} bytes",
                self.len
            )));
        }
        Ok(())
    }
}

impl Memory for SpilledShare {
    fn len(&self) -> usize {
        self.len
    }
    /// The memory part's address: only its first [`SpilledShare::mem_len`]
    /// bytes are addressable (transports register the region itself, never this).
    fn as_ptr(&self) -> *const u8 {
        self.memory.as_ptr()
    }
    fn mapped_len(&self) -> usize {
        self.mem_len
    }
    fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check(offset, dst.len())?;
        let (in_mem, file_at) = self.split(offset, dst.len());
        let (head, tail) = dst.split_at_mut(in_mem);
        if in_mem > 0 {
            self.memory.read_at(offset, head)?;
        }
        if let Some(at) = file_at {
            self.file_or_err()?.read_at(at, tail, &mut Vec::new())?;
        }
        Ok(())
    }
    /// Ranges in memory are copied; the file parts of all of them are read
    /// up to `inflight` at a time (the owner serving a remote batch).
    fn read_ranges(&self, ranges: &[(u64, u64)], dst: &mut [u8]) -> Result<()> {
        let file = self.file.as_deref();
        let mut reads = Vec::new();
        let mut rest: &mut [u8] = dst;
        for &(off, len) in ranges {
            let (off, len) = (off as usize, len as usize);
            self.check(off, len)?;
            let (piece, tail) = std::mem::take(&mut rest).split_at_mut(len);
            rest = tail;
            let (in_mem, file_at) = self.split(off, len);
            let (head, spilled) = piece.split_at_mut(in_mem);
            if in_mem > 0 {
                self.memory.read_at(off, head)?;
            }
            if let Some(at) = file_at {
                let Some(file) = file else {
                    return Err(self.file_or_err().unwrap_err());
                };
                reads.push(super::SpillRead {
                    file,
                    offset: at,
                    dst: spilled,
                });
            }
        }
        super::read_all(reads, self.inflight)
    }
    fn write_at(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.check(offset, src.len())?;
        let (in_mem, file_at) = self.split(offset, src.len());
        let (head, tail) = src.split_at(in_mem);
        if in_mem > 0 {
            self.memory.write_at(offset, head)?;
        }
        if let Some(at) = file_at {
            self.file_or_err()?.write_at(at, tail)?;
        }
        Ok(())
    }
    fn pread_into(
        &self,
        offset: usize,
        len: usize,
        file: &File,
        file_offset: u64,
    ) -> Result<usize> {
        self.check(offset, len)?;
        let (in_mem, file_at) = self.split(offset, len);
        if in_mem > 0 {
            return self.memory.pread_into(offset, in_mem, file, file_offset);
        }
        let Some(at) = file_at else { return Ok(0) };
        let mut bounce = vec![0u8; len.min(LOAD_CHUNK)];
        let n = file
            .read_at(&mut bounce, file_offset)
            .map_err(|e| Error::io("reading a source file into a spill file", e))?;
        self.file_or_err()?.write_at(at, &bounce[..n])?;
        Ok(n)
    }
    fn release_is_local(&self) -> bool {
        self.memory.release_is_local()
    }
    fn prepare_write(&self, offset: usize, len: usize) {
        let (in_mem, _) = self.split(
            offset.min(self.len),
            len.min(self.len - offset.min(self.len)),
        );
        if in_mem > 0 {
            self.memory.prepare_write(offset, in_mem);
        }
    }
}
