//! Ragged variables: rows of different lengths (0 allowed), e.g. the atoms
//! or edges of graphs of different sizes.
//!
//! A ragged variable is two ordinary variables of the same group, so every
//! transport, the shared-memory shortcut, method 2 publishing and the
//! in-flight window serve it unchanged:
//! - `values` (`{name}#values`): each rank's rows concatenated, one "unit"
//!   (an element, or a slice of elements along the ragged axis) per row of
//!   that variable;
//! - `ends` (`{name}#ends`): one little-endian u64 per ragged row, the end
//!   of the row in units within its owner's `values` share (the start is the
//!   previous row's end, 0 for the owner's first row).
//!
//! Where the offsets of other ranks' rows live: with the owner only, read on
//! demand. Replicating them would cost 8 B x every row on every rank: 8 GB
//! per rank at 10^9 rows (80 TB over 10^4 ranks). On demand it costs 8 B per
//! own row (800 KB per rank at 10^9 rows on 10^4 ranks) plus the row and
//! unit counts per rank every layout keeps (2 x 8 B x 10^4 = 160 KB), and
//! each rank's longest row (8 B per rank) agreed at `add_ragged`.
//!
//! Reading a batch: own and same-node rows read their ends in place from the
//! mapped share. Remote owners serving the gather path (tcp) resolve their
//! rows themselves: one request per owner names the rows and both shares'
//! keys, the reply carries lengths then values into a staging buffer sized
//! from the longest rows (see `ShareReader::read_ragged_rows`). Other remote
//! owners (MPI passive target, one-sided fabrics, method-2 readers, which do
//! not learn the longest rows) cost one extra round trip per owner: all the
//! `ends` reads of a batch are posted together, then all the `values` reads.
//!
//! Files: `create.rs` creates, links and finds them; `read.rs` plans and
//! reads a batch in three steps: the row ends (`ends.rs`: those mapped
//! here, then those read from remote owners), then the values (`values.rs`);
//! `prefetch.rs` reads spilled rows ahead of use. Maps keyed by row numbers
//! are [`RowMap`]s.

use std::sync::{Arc, Mutex};

use crate::dtype::DType;
use crate::layout::Layout;
use crate::plan::Plan;
use crate::profile::Counters;

use super::Variable;

mod create;
mod ends;
mod prefetch;
mod read;
mod values;

use crate::row_map::RowMap;
pub use create::NewRagged;

/// Bytes of one stored row offset.
pub const END_BYTES: usize = 8;

/// Needed row ends of one owner at most this many rows apart are read as one
/// span (4 KiB of ends: about the cost of an 8-byte read on any fabric).
pub const END_GAP_ROWS: u64 = 512;

/// Shape of a ragged variable, the same on every rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RaggedInfo {
    /// Element type of the values.
    pub dtype: DType,
    /// Bytes per element as `info()` reports it (the values' itemsize).
    pub itemsize: usize,
    /// Bytes of one unit (one element, or one slice along the ragged axis).
    pub unit_bytes: usize,
    /// Where each ragged row lives.
    pub rows: Layout,
    /// Units each rank holds.
    pub units: Layout,
}

/// A ragged variable as the store keeps it: its shape and its two parts.
pub(crate) struct RaggedVar {
    pub(crate) info: RaggedInfo,
    pub(crate) values: Arc<Variable>,
    pub(crate) ends: Arc<Variable>,
    /// Longest row of each rank in bytes, agreed at `add_ragged`: bounds the
    /// reply of a one-round-trip ragged read (`None` for an attached
    /// variable, which reads ends first, then values).
    pub(crate) max_row_bytes: Option<Vec<u64>>,
    /// Staging buffers of finished gathered batches, reused by the next ones.
    pub(crate) staging: StagingPool,
    /// Batches, ragged rows and value bytes read, rows split by where they
    /// came from (the parts' counters count units and row ends instead).
    pub(crate) counters: Counters,
}

/// Reader-filled staging buffers, handed back when their batch drops.
pub(crate) type StagingPool = Arc<Mutex<Vec<Vec<u8>>>>;

/// Staging buffers a ragged variable keeps for reuse (more threads allocate).
const STAGING_KEPT: usize = 4;

/// Rows read in one round trip per owner through the gather path.
pub(crate) struct Gathered {
    /// The reader's staging buffer: the rows' values somewhere in it.
    pub(crate) data: Vec<u8>,
    /// Global row -> (length in units, offset of its values in `data`).
    pub(crate) by_row: RowMap<u64, (u64, usize)>,
}

/// A batch whose row lengths are known (the `ends` were read) and whose
/// values are planned but not read yet: the caller sizes the destination
/// from [`RaggedBatch::offsets`], then calls [`Store::read_ragged`].
pub struct RaggedBatch {
    pub(crate) values: Arc<Variable>,
    pub(crate) plan: Plan,
    pub(crate) offsets: Vec<u64>,
    pub(crate) unit_bytes: usize,
    pub(crate) dtype: DType,
    /// Values already read through the gather path (reader-staged), and
    /// their copies into the destination: (staged offset, dst offset, len).
    pub(crate) staged: Vec<u8>,
    pub(crate) staged_copies: Vec<(usize, usize, usize)>,
    /// Where `staged` goes back to when the batch drops.
    pub(crate) pool: Option<StagingPool>,
    /// A read (counted); `false`: a read ahead's own read of rows it stages.
    pub(crate) counted: bool,
}

impl Drop for RaggedBatch {
    fn drop(&mut self) {
        if let Some(pool) = &self.pool {
            let mut kept = pool.lock().unwrap_or_else(|p| p.into_inner());
            if kept.len() < STAGING_KEPT {
                kept.push(std::mem::take(&mut self.staged));
            }
        }
    }
}

impl RaggedBatch {
    /// Per-row start in units within the result, plus the total at the end
    /// (`rows + 1` entries; row i is `offsets[i] .. offsets[i + 1]`).
    pub fn offsets(&self) -> &[u64] {
        &self.offsets
    }
    /// Units of the whole batch.
    pub fn units(&self) -> u64 {
        *self.offsets.last().unwrap_or(&0)
    }
    /// Bytes of the destination `read_ragged` fills.
    pub fn bytes(&self) -> usize {
        self.units() as usize * self.unit_bytes
    }
    /// Bytes of one unit (one step along the ragged axis).
    pub fn unit_bytes(&self) -> usize {
        self.unit_bytes
    }
    /// The variable's element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Reads and memory copies the values need (after coalescing): one per
    /// owner for consecutive rows of one share.
    pub fn reads(&self) -> usize {
        self.plan.segments.len() + self.staged_copies.len()
    }
}
