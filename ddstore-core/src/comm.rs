//! Communicators: who the ranks are and how they exchange small records.
//!
//! Collectives here move metadata only (row counts, descriptors); they are
//! called during `init`/`add` and never on the read path.

use std::any::Any;
use std::sync::Arc;

use crate::kinds::CommKind;
use crate::Result;

/// The collective operations a store needs. Every rank of the group must
/// make the same sequence of calls.
pub trait Comm: Send + Sync {
    /// This process's rank in the group, `0..size()`.
    fn rank(&self) -> usize;
    /// Number of ranks in the group.
    fn size(&self) -> usize;
    /// Every rank's bytes, in rank order (records may differ in length).
    fn allgather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>>;
    /// Returns once every rank of the group has called it.
    fn barrier(&self) -> Result<()>;
    /// A barrier that gives up after `timeout`, with `Error::Timeout` naming
    /// the ranks that did not arrive (on every rank that waited). The default
    /// cannot bound a communicator without such a primitive.
    fn barrier_timeout(&self, timeout: std::time::Duration) -> Result<()> {
        let _ = timeout;
        self.barrier()
    }
    /// Ranks with equal `color` form a new group, ordered by `key` then rank.
    fn split(&self, color: usize, key: usize) -> Result<Arc<dyn Comm>>;
    /// Which kind of communicator it is (named in messages and `info`).
    fn kind(&self) -> CommKind;
    /// Lets a transport that needs a specific communicator (MPI RMA) find it.
    fn as_any(&self) -> &dyn Any;
}

/// A group of one: no other rank exists.
#[derive(Debug, Default)]
pub struct SingleComm;

impl Comm for SingleComm {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn allgather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        Ok(vec![mine.to_vec()])
    }
    fn barrier(&self) -> Result<()> {
        Ok(())
    }
    fn split(&self, _color: usize, _key: usize) -> Result<Arc<dyn Comm>> {
        Ok(Arc::new(SingleComm))
    }
    fn kind(&self) -> CommKind {
        CommKind::Single
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Helpers to pack fixed-size integers into allgather records.
pub fn gather_u64(comm: &dyn Comm, value: u64) -> Result<Vec<u64>> {
    let all = comm.allgather(&value.to_le_bytes())?;
    all.iter()
        .enumerate()
        .map(|(rank, bytes)| {
            let arr: [u8; 8] = bytes.as_slice().try_into().map_err(|_| {
                crate::Error::Comm(format!(
                    "rank {rank} sent {} bytes, expected 8",
                    bytes.len()
                ))
            })?;
            Ok(u64::from_le_bytes(arr))
        })
        .collect()
}

/// Every rank's `(color, key)` of a `split`, gathered in one allgather of
/// 16-byte records (the one encoding every communicator's `split` uses); a
/// record of another size is an error naming its rank.
pub fn gather_split(comm: &dyn Comm, color: usize, key: usize) -> Result<Vec<(u64, u64)>> {
    let mut record = [0u8; 16];
    record[..8].copy_from_slice(&(color as u64).to_le_bytes());
    record[8..].copy_from_slice(&(key as u64).to_le_bytes());
    let all = comm.allgather(&record)?;
    all.iter()
        .enumerate()
        .map(|(rank, bytes)| {
            let arr: [u8; 16] = bytes.as_slice().try_into().map_err(|_| {
                crate::Error::Comm(format!(
                    "rank {rank} sent a split record of {} bytes, expected 16",
                    bytes.len()
                ))
            })?;
            let word = |i: usize| u64::from_le_bytes(arr[i..i + 8].try_into().expect("8 bytes"));
            Ok((word(0), word(8)))
        })
        .collect()
}
