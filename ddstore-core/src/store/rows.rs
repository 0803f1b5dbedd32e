//! Writing and reading rows by variable name: this rank's share, batches
//! of global rows, consecutive rows and the transport's raw ceiling.

use std::sync::Arc;

use crate::memory::Memory;
use crate::plan::{validate_rows, Plan};
use crate::transport::RemoteRead;
use crate::{Error, Result};

use super::{OwnRows, Store, Variable};

impl Store {
    /// Writes rows `[first_row, first_row + n)` of this rank's share.
    pub fn write_local(&self, name: &str, first_row: u64, data: &[u8]) -> Result<()> {
        let var = self.var(name)?;
        let (local, rank) = match (&var.local, var.my_rank) {
            (Some(l), Some(r)) => (l, r),
            _ => {
                return Err(Error::Unsupported(format!(
                    "variable '{name}' is attached read-only here"
                )))
            }
        };
        let rb = var.info.row_bytes;
        if !data.len().is_multiple_of(rb) {
            return Err(Error::invalid(format!(
                "update of '{name}': {} bytes is not a whole number of {rb}-byte rows",
                data.len()
            )));
        }
        let n = (data.len() / rb) as u64;
        let count = var.info.layout.count(rank);
        if first_row.checked_add(n).is_none_or(|end| end > count) {
            return Err(Error::IndexOutOfRange(format!(
                "update of '{name}': rows {first_row}..{} do not fit this rank's {count} rows",
                first_row.saturating_add(n)
            )));
        }
        local.write_at(first_row as usize * rb, data)?;
        let start = var.info.layout.start(rank) + first_row;
        self.note_update(&var, start..start + n);
        Ok(())
    }

    /// This rank's writable share of `name` (loading from files fills it
    /// without a copy through Python). Its rows count as updated: staged
    /// copies go at the next barrier (see [`Store::barrier`]).
    pub(crate) fn local_share(&self, name: &str) -> Result<Arc<dyn Memory>> {
        let var = self.var(name)?;
        match (&var.local, var.my_rank) {
            (Some(l), Some(rank)) => {
                let start = var.info.layout.start(rank);
                self.note_update(&var, start..start + var.info.layout.count(rank));
                Ok(l.clone())
            }
            _ => Err(Error::Unsupported(format!(
                "variable '{name}' is attached read-only here"
            ))),
        }
    }

    /// Reads global rows (any order, repeats) into `out`, row i at `i * row_bytes`.
    /// Every index is checked before a byte moves.
    pub fn read_rows(&self, name: &str, rows: &[i64], out: &mut [u8]) -> Result<()> {
        self.read_rows_with(name, rows, out, OwnRows::Copy)
    }

    /// As [`Store::read_rows`], with rows of this rank's share handled as `own` says.
    pub fn read_rows_with(
        &self,
        name: &str,
        rows: &[i64],
        out: &mut [u8],
        own: OwnRows,
    ) -> Result<()> {
        let var = self.var(name)?;
        self.read_var(&var, rows, out, own)
    }

    /// The read path of `get_batch` for a variable already looked up (one
    /// lookup per batch; callers check `out` against `var.info` first and
    /// pass the same `Arc`): plans the batch, which checks every index once
    /// and splits long runs once, then copies and reads.
    pub fn read_var(
        &self,
        var: &Variable,
        rows: &[i64],
        out: &mut [u8],
        own: OwnRows,
    ) -> Result<()> {
        self.check_live()?;
        let rb = var.info.row_bytes;
        if out.len() != rows.len() * rb {
            return Err(Error::invalid(format!(
                "output for '{}' has {} bytes, expected {} rows x {rb} bytes = {}",
                var.name,
                out.len(),
                rows.len(),
                rows.len() * rb
            )));
        }
        let plan = Plan::build(&var.info.layout, rows, rb, var.max_read, |o| {
            var.is_remote(o) || (own == OwnRows::Transport && var.my_rank == Some(o))
        })?;
        self.watch(var.execute(&plan, out, rows.len(), own))
    }

    /// Reads `out.len() / row_bytes` consecutive rows starting at `start`:
    /// one read (or memory copy) per owner the range spans. An empty `out`
    /// reads nothing and succeeds for any `0 <= start <= rows` (upstream's
    /// zero-length `get`, e.g. a graph without edges).
    pub fn get(&self, name: &str, start: i64, out: &mut [u8]) -> Result<()> {
        let var = self.var(name)?;
        let rb = var.info.row_bytes;
        if !out.len().is_multiple_of(rb) {
            return Err(Error::invalid(format!(
                "output for '{name}' has {} bytes, expected a multiple of the {rb}-byte row",
                out.len()
            )));
        }
        let n = (out.len() / rb) as u64;
        let layout = &var.info.layout;
        let total = layout.total();
        if start < 0 || (start as u64).checked_add(n).is_none_or(|end| end > total) {
            return Err(Error::IndexOutOfRange(format!(
                "get of '{name}': rows {start}..{} are out of range: the variable has {total} rows",
                start.saturating_add(n as i64)
            )));
        }
        if n == 0 {
            return Ok(());
        }
        let (start, end) = (start as u64, start as u64 + n);
        let mut plan = Plan::default();
        let mut row = start;
        while row < end {
            let (owner, local) = layout.locate(row)?;
            let take = (layout.start(owner) + layout.count(owner)).min(end) - row;
            plan.push_split(
                RemoteRead {
                    owner,
                    offset: local * rb as u64,
                    len: take as usize * rb,
                    dst_offset: (row - start) as usize * rb,
                },
                var.max_read,
            );
            row += take;
        }
        self.watch(var.execute(&plan, out, n as usize, OwnRows::Copy))
    }

    /// The transport's ceiling for benchmarks: one read per row straight
    /// through a reader, with no planning, coalescing or memory copies.
    pub fn read_rows_raw(&self, name: &str, rows: &[i64], out: &mut [u8]) -> Result<()> {
        let var = self.var(name)?;
        let rb = var.info.row_bytes;
        if out.len() != rows.len() * rb {
            return Err(Error::invalid(format!(
                "output has {} bytes, expected {}",
                out.len(),
                rows.len() * rb
            )));
        }
        let mut plan = Plan::default();
        for (i, row) in validate_rows(rows, var.info.layout.total())?
            .into_iter()
            .enumerate()
        {
            let (owner, local) = var.info.layout.locate_valid(row);
            let read = RemoteRead {
                owner,
                offset: local * rb as u64,
                len: rb,
                dst_offset: i * rb,
            };
            plan.push_split(read, var.max_read);
        }
        self.watch(var.read_remote(&plan.segments, out))
    }

    /// Registers a destination buffer of `name`'s reads once, so reads into it skip registration.
    pub fn register_dst(&self, name: &str, addr: usize, len: usize) -> Result<()> {
        self.var(name)?.remote.register_dst(addr, len)
    }
    /// Undoes [`Store::register_dst`].
    pub fn unregister_dst(&self, name: &str, addr: usize, len: usize) -> Result<()> {
        self.var(name)?.remote.unregister_dst(addr, len)
    }
}
