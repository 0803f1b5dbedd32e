//! The memory a share lives in: the [`Memory`] trait every kind of share
//! memory implements (own regions, peers' mappings, MPI windows, device
//! memory, spilled shares), and [`RawMemory`], the one way raw memory
//! becomes a `Memory`. All raw memory access of the core crate lives here,
//! behind bounds checks.

use std::any::Any;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use crate::{Error, Result};

/// A page: shares are page-aligned; `populate` aligns to it.
pub(crate) const PAGE: usize = 4096;
/// Bytes of the next range [`RawMemory`] prefetches in `read_ranges`: the
/// first 1 KiB of a row; the hardware prefetcher follows on from there (a
/// 128 x 3 KB gather reply packed 10-15% faster, alternated call by call).
const PREFETCH_BYTES: usize = 1024;

/// A block of bytes a share lives in. Reads and writes are bounds-checked
/// copies; concurrent writers and readers of the same bytes get no ordering
/// guarantee (as with remote one-sided reads), never memory unsafety.
pub trait Memory: Send + Sync {
    /// Length in bytes.
    fn len(&self) -> usize;
    /// Whether the block holds no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Start address, for registration with a NIC or an MPI window.
    fn as_ptr(&self) -> *const u8;
    /// Bytes addressable at `as_ptr()`: all of them, but for a spilled
    /// share (its memory part only; see [`crate::spill::SpilledShare`]).
    fn mapped_len(&self) -> usize {
        self.len()
    }
    /// Copies `dst.len()` bytes from `offset`; out of range is an error.
    fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()>;
    /// Copies `src` to `offset`; out of range is an error.
    fn write_at(&self, offset: usize, src: &[u8]) -> Result<()>;
    /// A hint that `offset..offset + len` is read next (memory the CPU can
    /// fetch ahead); nothing by default.
    fn prefetch(&self, offset: usize, len: usize) {
        let _ = (offset, len);
    }
    /// Copies `ranges` (offset, length) one after another into `dst` (their
    /// lengths add up to `dst.len()`), asking for each next range while the
    /// current one is copied ([`Memory::prefetch`]); a spilled share reads
    /// its file's ranges many at a time.
    fn read_ranges(&self, ranges: &[(u64, u64)], dst: &mut [u8]) -> Result<()> {
        let mut at = 0usize;
        for (i, &(off, len)) in ranges.iter().enumerate() {
            if let Some(&(next, next_len)) = ranges.get(i + 1) {
                self.prefetch(next as usize, next_len as usize);
            }
            let len = len as usize;
            self.read_at(off as usize, &mut dst[at..at + len])?;
            at += len;
        }
        Ok(())
    }
    /// One `pread` of up to `len` bytes of `file` at `file_offset` straight
    /// into the share at `offset` (no intermediate buffer); the bytes read
    /// (0 at the end of the file). Memory that cannot take it (read-only,
    /// device memory) says so.
    fn pread_into(
        &self,
        offset: usize,
        len: usize,
        file: &File,
        file_offset: u64,
    ) -> Result<usize> {
        let _ = (offset, len, file, file_offset);
        Err(Error::Unsupported(
            "this share cannot be filled from a file directly".into(),
        ))
    }
    /// Whether holding this handle (an `Arc` of it) keeps the bytes mapped
    /// and nothing else frees them: true for a [`crate::region::Region`] this process
    /// mapped itself; false where release is collective or foreign (an MPI
    /// window, which every rank frees together, a peer's mapping). A file
    /// load lets a thread it may abandon write only into such memory.
    fn release_is_local(&self) -> bool {
        false
    }
    /// Faults `offset..offset + len` in for writing ahead of many short
    /// writes there (each under [`POPULATE_MIN`], so none does it itself).
    /// Best effort; out of range or read-only memory is left alone.
    fn prepare_write(&self, offset: usize, len: usize) {
        let _ = (offset, len);
    }
    /// Maps every page of this memory into this process's page tables for
    /// reading, ahead of reads (see `RawMemory::populate_read`); the bytes
    /// populated, 0 where there is nothing mapped to populate (a file, device
    /// memory) or the kernel refused. Best effort: reads fault pages in as
    /// usual either way.
    fn populate_read(&self) -> usize {
        0
    }
}

/// Writes and file reads of at least this many bytes fault their pages in
/// with one `madvise` first (see `RawMemory::populate`); shorter ones fault
/// as usual.
pub const POPULATE_MIN: usize = 64 << 10;

/// Memory described by a pointer and a length, kept alive by `owner`
/// (an MPI window, a mapping): the one way other modules turn raw memory
/// into a `Memory`.
pub struct RawMemory {
    ptr: *mut u8,
    len: usize,
    writable: bool,
    _owner: Arc<dyn Any + Send + Sync>,
}

// SAFETY: the bytes are plain data reachable from every thread; all access
// goes through bounds-checked copies, and `_owner` keeps them mapped.
unsafe impl Send for RawMemory {}
// SAFETY: as for Send: `&RawMemory` only copies bytes in and out (no
// reference into them escapes), so sharing it between threads is sound.
unsafe impl Sync for RawMemory {}

impl RawMemory {
    /// # Safety
    /// `ptr..ptr+len` must stay valid (and writable if `writable`) for as long
    /// as `owner` is alive.
    pub unsafe fn new(
        ptr: *mut u8,
        len: usize,
        writable: bool,
        owner: Arc<dyn Any + Send + Sync>,
    ) -> RawMemory {
        RawMemory {
            ptr,
            len,
            writable,
            _owner: owner,
        }
    }
}

/// `offset..offset + n` lies in a share of `len` bytes, or an `IndexOutOfRange` naming `what`.
pub(crate) fn check_range(what: &str, offset: usize, n: usize, len: usize) -> Result<()> {
    match offset.checked_add(n) {
        Some(end) if end <= len => Ok(()),
        _ => Err(Error::IndexOutOfRange(format!(
            "{what} of {n} bytes at offset {offset} is outside the share of {len} bytes"
        ))),
    }
}

impl RawMemory {
    /// Faults `offset..offset + len` in, writable, with one `madvise`
    /// (`MADV_POPULATE_WRITE`, Linux 5.14+) instead of one page fault per
    /// page inside a `pread` or a copy: many loading threads faulting one
    /// mapping page by page contend on its locks (ranges under 64 KiB are
    /// left to fault as usual). Best effort: older kernels refuse it and the
    /// pages fault in as before.
    fn populate(&self, offset: usize, len: usize) {
        if len < POPULATE_MIN {
            return;
        }
        let start = self.ptr as usize + offset;
        let aligned = start - start % PAGE;
        // SAFETY: the caller checked offset..offset+len lies in this mapping; aligning down
        // stays within its first page (mappings are page-aligned). POPULATE_WRITE only
        // faults pages in, it never changes their contents.
        unsafe {
            libc::madvise(
                aligned as *mut libc::c_void,
                len + (start - aligned),
                libc::MADV_POPULATE_WRITE,
            )
        };
    }

    /// Hints the CPU to fetch up to [`PREFETCH_BYTES`] of the `len` bytes at
    /// `offset` into its caches (nothing outside this memory; a no-op off
    /// x86-64): a gather reply packs rows from random places of the share,
    /// and the hardware prefetcher only finds a row's lines once the copy has
    /// missed on its first ones.
    fn prefetch(&self, offset: usize, len: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let end = offset.saturating_add(len.min(PREFETCH_BYTES)).min(self.len);
            for line in (offset..end).step_by(64) {
                // SAFETY: a prefetch is a hint: it reads nothing into the program and cannot
                // fault; the address is inside this mapping anyway.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(self.ptr.wrapping_add(line).cast()) };
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (offset, len);
    }

    /// Maps all of this memory into this process's page tables with one
    /// `madvise` (`MADV_POPULATE_READ`, Linux 5.14+). A forked child
    /// inherits no page tables of its parent's shared mappings (`fork()`
    /// copies only those of private memory), so it would otherwise fault
    /// them in 16 pages at a time on first touch, in the middle of its reads.
    /// Populating costs a page-table entry per page (8 bytes per 4 KiB) and
    /// about half the time of the faults it saves. The bytes populated, or 0
    /// where the kernel refuses (older kernels, memory it cannot populate).
    fn populate_read(&self) -> usize {
        if self.len == 0 {
            return 0;
        }
        let start = self.ptr as usize;
        let aligned = start - start % PAGE;
        // SAFETY: ptr..ptr+len is mapped, kept alive by `_owner`; aligning
        // down stays within its first page. POPULATE_READ only fills page
        // tables: it changes no contents and no protection, and a range it
        // cannot populate makes it fail, nothing else.
        let rc = unsafe {
            libc::madvise(
                aligned as *mut libc::c_void,
                self.len + (start - aligned),
                libc::MADV_POPULATE_READ,
            )
        };
        if rc == 0 {
            self.len
        } else {
            0
        }
    }
}

impl Memory for RawMemory {
    fn len(&self) -> usize {
        self.len
    }
    fn as_ptr(&self) -> *const u8 {
        self.ptr
    }
    fn prepare_write(&self, offset: usize, len: usize) {
        if self.writable && check_range("write", offset, len, self.len).is_ok() {
            self.populate(offset, len);
        }
    }
    fn populate_read(&self) -> usize {
        RawMemory::populate_read(self)
    }
    fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        check_range("read", offset, dst.len(), self.len)?;
        // SAFETY: range checked above; the owner keeps the memory valid; dst is
        // a distinct Rust slice so the ranges cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(offset), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }
    fn prefetch(&self, offset: usize, len: usize) {
        RawMemory::prefetch(self, offset, len)
    }
    fn write_at(&self, offset: usize, src: &[u8]) -> Result<()> {
        if !self.writable {
            return Err(Error::Unsupported("this share is read-only here".into()));
        }
        check_range("write", offset, src.len(), self.len)?;
        self.populate(offset, src.len());
        // SAFETY: range checked above, memory writable per the constructor contract.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.add(offset), src.len()) };
        Ok(())
    }
    fn pread_into(
        &self,
        offset: usize,
        len: usize,
        file: &File,
        file_offset: u64,
    ) -> Result<usize> {
        if !self.writable {
            return Err(Error::Unsupported("this share is read-only here".into()));
        }
        check_range("file read", offset, len, self.len)?;
        let file_offset = libc::off_t::try_from(file_offset)
            .map_err(|_| Error::invalid(format!("file offset {file_offset} is too large")))?;
        self.populate(offset, len);
        loop {
            // SAFETY: range checked above and the memory is writable per the
            // constructor contract; the kernel writes at most `len` bytes there.
            let got = unsafe {
                libc::pread(
                    file.as_raw_fd(),
                    self.ptr.add(offset).cast(),
                    len,
                    file_offset,
                )
            };
            if got >= 0 {
                return Ok(got as usize);
            }
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::Interrupted {
                return Err(Error::io("pread", err));
            }
        }
    }
}
