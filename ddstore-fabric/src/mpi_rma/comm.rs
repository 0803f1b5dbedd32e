//! `MpiComm`: a private duplicate of an MPI communicator (ours or mpi4py's)
//! implementing `ddstore_core::comm::Comm`.

use std::any::Any;
use std::os::raw::{c_int, c_void};
use std::sync::Arc;

use ddstore_core::comm::Comm;
use mpi::ffi;

use super::init::{check, ensure_initialized, is_usable, serialize};
use crate::error::{FabricError, FabricResult};

/// An MPI communicator this process owns: freed on drop while MPI is usable.
pub struct MpiComm {
    handle: ffi::MPI_Comm,
    rank: usize,
    size: usize,
    /// The process that created the handle; a forked child must not free it.
    pid: u32,
}

// SAFETY: an MPI_Comm is an opaque handle to MPI-internal state. Every call
// we make on it goes through `serialize()`, which holds the process-wide lock
// unless MPI provides MPI_THREAD_MULTIPLE, so moving or sharing the handle
// across threads never breaks MPI's threading contract.
unsafe impl Send for MpiComm {}
// SAFETY: see Send; `&MpiComm` only exposes calls that go through `serialize()`.
unsafe impl Sync for MpiComm {}

impl std::fmt::Debug for MpiComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MpiComm(rank {} of {})", self.rank, self.size)
    }
}

impl MpiComm {
    /// Duplicates the communicator mpi4py hands over as `comm.py2f()`, so our
    /// traffic never mixes with the user's. Collective over that communicator.
    pub fn from_fortran(handle: i64) -> FabricResult<MpiComm> {
        if !is_usable() {
            return Err(FabricError::Unavailable(
                "an MPI communicator handle was given but MPI is not initialised in this process"
                    .into(),
            ));
        }
        let fint = c_int::try_from(handle).map_err(|_| {
            FabricError::Invalid(format!("{handle} is not a Fortran MPI communicator handle"))
        })?;
        let comm = {
            let _g = serialize();
            // SAFETY: MPI is initialised; f2c returns MPI_COMM_NULL for unknown handles.
            unsafe { ffi::MPI_Comm_f2c(fint) }
        };
        // SAFETY: reading a link-time constant exported by the MPI shim.
        if comm == unsafe { ffi::RSMPI_COMM_NULL } {
            return Err(FabricError::Invalid(format!(
                "Fortran handle {handle} is MPI_COMM_NULL or not a communicator"
            )));
        }
        Self::dup_of(comm)
    }

    /// A duplicate of `MPI_COMM_WORLD`, initialising MPI first if nobody did.
    pub fn world() -> FabricResult<MpiComm> {
        ensure_initialized()?;
        // SAFETY: reading a link-time constant exported by the MPI shim.
        Self::dup_of(unsafe { ffi::RSMPI_COMM_WORLD })
    }

    fn dup_of(comm: ffi::MPI_Comm) -> FabricResult<MpiComm> {
        let mut dup = std::mem::MaybeUninit::<ffi::MPI_Comm>::uninit();
        let rc = {
            let _g = serialize();
            // SAFETY: `comm` is a valid communicator; MPI writes the new handle.
            unsafe { ffi::MPI_Comm_dup(comm, dup.as_mut_ptr()) }
        };
        check("MPI_Comm_dup", rc)?;
        // SAFETY: MPI_Comm_dup succeeded, so it wrote the handle.
        Self::adopt(unsafe { dup.assume_init() })
    }

    /// Takes ownership of a fresh communicator: sets MPI_ERRORS_RETURN and
    /// caches rank and size. Frees it again on error.
    fn adopt(handle: ffi::MPI_Comm) -> FabricResult<MpiComm> {
        let mut comm = MpiComm {
            handle,
            rank: 0,
            size: 1,
            pid: std::process::id(),
        };
        let (mut rank, mut size): (c_int, c_int) = (0, 0);
        let _g = serialize();
        // SAFETY: `handle` is a valid communicator we own; the out-pointers are valid.
        unsafe {
            check(
                "MPI_Comm_set_errhandler",
                ffi::MPI_Comm_set_errhandler(handle, ffi::RSMPI_ERRORS_RETURN),
            )?;
            check("MPI_Comm_rank", ffi::MPI_Comm_rank(handle, &mut rank))?;
            check("MPI_Comm_size", ffi::MPI_Comm_size(handle, &mut size))?;
        }
        comm.rank = rank as usize;
        comm.size = size as usize;
        Ok(comm)
    }

    /// The ranks of this communicator that share memory with this one
    /// (`MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`), in this communicator's order.
    /// Collective.
    pub fn split_node(&self) -> FabricResult<MpiComm> {
        let mut node = std::mem::MaybeUninit::<ffi::MPI_Comm>::uninit();
        let rc = {
            let _g = serialize();
            // SAFETY: our handle is valid; MPI writes the new handle.
            unsafe {
                ffi::MPI_Comm_split_type(
                    self.handle,
                    ffi::RSMPI_COMM_TYPE_SHARED,
                    self.rank as c_int,
                    ffi::RSMPI_INFO_NULL,
                    node.as_mut_ptr(),
                )
            }
        };
        check("MPI_Comm_split_type", rc)?;
        // SAFETY: the split succeeded and every rank has a color, so the handle is set.
        Self::adopt(unsafe { node.assume_init() })
    }

    /// Splits by small non-negative color and key (both already dense). Collective.
    pub(crate) fn split_raw(&self, color: c_int, key: c_int) -> FabricResult<MpiComm> {
        let mut out = std::mem::MaybeUninit::<ffi::MPI_Comm>::uninit();
        let rc = {
            let _g = serialize();
            // SAFETY: our handle is valid; MPI writes the new handle.
            unsafe { ffi::MPI_Comm_split(self.handle, color, key, out.as_mut_ptr()) }
        };
        check("MPI_Comm_split", rc)?;
        // SAFETY: the split succeeded with a defined color, so the handle is set.
        Self::adopt(unsafe { out.assume_init() })
    }

    /// The raw handle, for windows created over this communicator. It stays
    /// valid as long as `self` lives.
    pub fn as_raw(&self) -> ffi::MPI_Comm {
        self.handle
    }

    /// Every rank's value of a u64, in rank order (plain MPI_Allgather).
    fn allgather_u64(&self, value: u64) -> FabricResult<Vec<u64>> {
        let mut all = vec![0u64; self.size];
        let _g = serialize();
        // SAFETY: one u64 sent, `size` u64 received into a buffer of that size.
        let rc = unsafe {
            ffi::MPI_Allgather(
                &value as *const u64 as *const c_void,
                1,
                ffi::RSMPI_UINT64_T,
                all.as_mut_ptr() as *mut c_void,
                1,
                ffi::RSMPI_UINT64_T,
                self.handle,
            )
        };
        check("MPI_Allgather", rc)?;
        Ok(all)
    }

    fn allgather_bytes(&self, mine: &[u8]) -> FabricResult<Vec<Vec<u8>>> {
        let lens = self.allgather_u64(mine.len() as u64)?;
        // Every rank sees the same lengths, so every rank takes the same branch.
        let total: u64 = lens.iter().sum();
        if total > c_int::MAX as u64 {
            return Err(FabricError::Invalid(format!(
                "allgather of {total} bytes in all exceeds MPI's count limit of {} bytes",
                c_int::MAX
            )));
        }
        let counts: Vec<c_int> = lens.iter().map(|&l| l as c_int).collect();
        let mut displs = Vec::with_capacity(counts.len());
        let mut at: c_int = 0;
        for &c in &counts {
            displs.push(at);
            at += c;
        }
        // One spare byte keeps the pointers valid when every record is empty.
        let mut recv = vec![0u8; total as usize + 1];
        let rc = {
            let _g = serialize();
            // SAFETY: `mine` holds counts[rank] bytes; `recv` holds `total` bytes
            // laid out by `displs`; all buffers outlive the blocking call.
            unsafe {
                ffi::MPI_Allgatherv(
                    mine.as_ptr() as *const c_void,
                    mine.len() as c_int,
                    ffi::RSMPI_UINT8_T,
                    recv.as_mut_ptr() as *mut c_void,
                    counts.as_ptr(),
                    displs.as_ptr(),
                    ffi::RSMPI_UINT8_T,
                    self.handle,
                )
            }
        };
        check("MPI_Allgatherv", rc)?;
        Ok(counts
            .iter()
            .zip(&displs)
            .map(|(&c, &d)| recv[d as usize..(d + c) as usize].to_vec())
            .collect())
    }

    fn barrier_raw(&self) -> FabricResult<()> {
        let _g = serialize();
        // SAFETY: our handle is valid.
        check("MPI_Barrier", unsafe { ffi::MPI_Barrier(self.handle) })
    }
}

impl Drop for MpiComm {
    fn drop(&mut self) {
        // A forked child or a finalised MPI must leave the handle alone.
        if self.pid != std::process::id() || !is_usable() {
            return;
        }
        let _g = serialize();
        // SAFETY: we own the handle (a dup or split result) and MPI is usable.
        unsafe { ffi::MPI_Comm_free(&mut self.handle) };
    }
}

impl Comm for MpiComm {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn allgather(&self, mine: &[u8]) -> ddstore_core::Result<Vec<Vec<u8>>> {
        Ok(self.allgather_bytes(mine)?)
    }
    fn barrier(&self) -> ddstore_core::Result<()> {
        Ok(self.barrier_raw()?)
    }
    /// Colors and keys may be any usize: one allgather turns them into the
    /// dense values MPI_Comm_split accepts, with the same grouping and order.
    fn split(&self, color: usize, key: usize) -> ddstore_core::Result<Arc<dyn Comm>> {
        let mut record = [0u8; 16];
        record[..8].copy_from_slice(&(color as u64).to_le_bytes());
        record[8..].copy_from_slice(&(key as u64).to_le_bytes());
        let all = self.allgather_bytes(&record)?;
        let mut pairs = Vec::with_capacity(all.len());
        for (rank, bytes) in all.iter().enumerate() {
            let arr: [u8; 16] = bytes.as_slice().try_into().map_err(|_| {
                FabricError::Invalid(format!(
                    "rank {rank} sent a split record of {} bytes",
                    bytes.len()
                ))
            })?;
            let c = u64::from_le_bytes(arr[..8].try_into().expect("8 bytes"));
            let k = u64::from_le_bytes(arr[8..].try_into().expect("8 bytes"));
            pairs.push((c, k, rank));
        }
        let mut colors: Vec<u64> = pairs.iter().map(|p| p.0).collect();
        colors.sort_unstable();
        colors.dedup();
        let dense_color = colors
            .binary_search(&(color as u64))
            .expect("own color gathered");
        let mut order: Vec<(u64, usize)> = pairs.iter().map(|p| (p.1, p.2)).collect();
        order.sort_unstable();
        let dense_key = order
            .binary_search(&(key as u64, self.rank))
            .expect("own key gathered");
        Ok(Arc::new(
            self.split_raw(dense_color as c_int, dense_key as c_int)?,
        ))
    }
    fn kind(&self) -> &'static str {
        "mpi"
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
