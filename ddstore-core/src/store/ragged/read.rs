//! Reading a batch of ragged rows: planned (row ends, then values; whole
//! rows from gather-path owners and the read-ahead stage in one go), then
//! read into the caller's buffer.

use crate::kinds::RaggedPart;
use crate::plan::validate_rows;
use crate::profile::Counters;
use crate::store::{OwnRows, Store, Variable};
use crate::transport::RaggedRequest;
use crate::{Error, Result};

use super::ends::KnownEnds;
use super::values::plan_values;
use super::{Gathered, RaggedBatch, RaggedVar, RowMap};

impl Store {
    /// Reads the lengths of `rows` (any order, repeats; every index checked
    /// first) and plans reading their values: one round trip per remote
    /// owner, which on the gather path also brings the values (staged for
    /// [`Store::read_ragged`]).
    pub fn plan_ragged(&self, name: &str, rows: &[i64]) -> Result<RaggedBatch> {
        self.plan_ragged_as(name, rows, true)
    }

    /// [`Store::plan_ragged`]; `reading: false` plans a read ahead's own
    /// read ([`Store::prefetch_ragged`]): it takes nothing from the stage
    /// (whose rows it fills) and is not counted.
    pub(super) fn plan_ragged_as(
        &self,
        name: &str,
        rows: &[i64],
        reading: bool,
    ) -> Result<RaggedBatch> {
        let var = self.ragged_var(name)?;
        let rows = validate_rows(rows, var.info.rows.total())?;
        let located: Vec<(usize, u64)> = rows
            .iter()
            .map(|&r| var.info.rows.locate_valid(r))
            .collect();
        // Rows the read-ahead staged come from memory, like gathered ones.
        let staged = if reading {
            take_staged(&var, &rows)
        } else {
            None
        };
        let hits = staged.as_ref().map_or(0, |s| s.by_row.len());
        // Remote owners serving the gather path: whole rows in one round trip each.
        let gathered = self.gather_ragged(&var, &rows, &located, staged.as_ref())?;
        let gathered = match (gathered, staged) {
            (Some(g), Some(s)) => Some(merge_gathered(g, s)),
            (g, s) => g.or(s),
        };
        let known = KnownEnds::find(&var, &rows, &located, gathered.as_ref())?;
        let remote = self.read_remote_ends(&var, &known)?;
        let mut planned = plan_values(
            name,
            &var,
            &rows,
            &located,
            gathered.as_ref(),
            &known,
            &remote,
        )?;
        let ub = var.info.unit_bytes;
        if reading {
            count_batch(
                &var.counters,
                &var.values,
                &located,
                planned.units as usize * ub,
            );
            Counters::add(&var.counters.prefetch_hits, hits as u64);
        }
        planned.offsets.push(planned.units);
        Ok(RaggedBatch {
            values: var.values.clone(),
            plan: planned.plan,
            offsets: planned.offsets,
            unit_bytes: ub,
            dtype: var.info.dtype,
            pool: gathered.is_some().then(|| var.staging.clone()),
            staged: gathered.map(|g| g.data).unwrap_or_default(),
            staged_copies: planned.staged_copies,
            counted: reading,
        })
    }

    /// Reads the rows of `rows` whose owners serve the gather path (remote,
    /// both parts keyed) in one request per owner, each row once; `None`
    /// when there are none or the transport cannot (then ends, then values).
    fn gather_ragged(
        &self,
        var: &RaggedVar,
        rows: &[u64],
        located: &[(usize, u64)],
        staged: Option<&Gathered>,
    ) -> Result<Option<Gathered>> {
        let Some(max_row_bytes) = &var.max_row_bytes else {
            return Ok(None);
        };
        let (values, ends) = (&var.values, &var.ends);
        // Transports without the gather path (MPI, one-sided fabrics) skip the bookkeeping.
        let served = |owner: usize| values.is_remote(owner) && values.gather_key(owner).is_some();
        if !located.iter().any(|&(owner, _)| served(owner)) {
            return Ok(None);
        }
        // Owner -> index in `owners` (usize::MAX: not served), owners with their rows.
        let mut index: RowMap<usize, usize> = RowMap::default();
        let mut owners: Vec<(usize, u64, Vec<u64>)> = Vec::new();
        let mut seen: RowMap<u64, ()> = RowMap::default();
        for (&row, &(owner, local)) in rows.iter().zip(located) {
            if !values.is_remote(owner) || staged.is_some_and(|s| s.by_row.contains_key(&row)) {
                continue;
            }
            let i = *index.entry(owner).or_insert_with(|| {
                match values.gather_key(owner).zip(ends.gather_key(owner)) {
                    Some((_, ends_key)) => {
                        owners.push((owner, ends_key, Vec::new()));
                        owners.len() - 1
                    }
                    None => usize::MAX,
                }
            });
            if i != usize::MAX && seen.insert(row, ()).is_none() {
                owners[i].2.push(local);
            }
        }
        if owners.is_empty() {
            return Ok(None);
        }
        let requests: Vec<RaggedRequest<'_>> = owners
            .iter()
            .map(|(owner, ends_key, rows)| RaggedRequest {
                owner: *owner,
                ends_key: *ends_key,
                rows,
                max_row_bytes: max_row_bytes[*owner],
            })
            .collect();
        let ub = var.info.unit_bytes;
        let staging = var.staging.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let read = values.read_ragged_rows(ub, &requests, staging.unwrap_or_default());
        let Some(read) = self.watch(read)? else {
            return Ok(None);
        };
        let mut by_row = RowMap::with_capacity_and_hasher(seen.len(), Default::default());
        for ((owner, _, locals), got) in owners.iter().zip(&read.rows) {
            let first = var.info.rows.start(*owner);
            for (&local, &entry) in locals.iter().zip(got) {
                by_row.insert(first + local, entry);
            }
        }
        Ok(Some(Gathered {
            data: read.data,
            by_row,
        }))
    }

    /// Reads a planned batch's values into `out` (exactly `batch.bytes()`
    /// bytes): row i at units `offsets[i] .. offsets[i + 1]`.
    pub fn read_ragged(&self, batch: &RaggedBatch, out: &mut [u8]) -> Result<()> {
        self.check_live()?;
        if out.len() != batch.bytes() {
            return Err(Error::invalid(format!(
                "output for '{}' has {} bytes, expected {} units x {} bytes = {}",
                RaggedPart::user_name(&batch.values.name),
                out.len(),
                batch.units(),
                batch.unit_bytes,
                batch.bytes()
            )));
        }
        let units = batch.units() as usize;
        if !batch.plan.segments.is_empty() || !batch.plan.repeats.is_empty() {
            let values = &batch.values;
            let read =
                values.execute_counted(&batch.plan, out, units, OwnRows::Copy, batch.counted);
            self.watch(read)?;
        }
        for &(from, to, len) in &batch.staged_copies {
            out[to..to + len].copy_from_slice(&batch.staged[from..from + len]);
        }
        Ok(())
    }

    /// Lengths, then values, of `rows`: `(values, offsets)` as
    /// [`Store::plan_ragged`] and [`Store::read_ragged`] give them.
    pub fn get_ragged(&self, name: &str, rows: &[i64]) -> Result<(Vec<u8>, Vec<u64>)> {
        let mut batch = self.plan_ragged(name, rows)?;
        let mut out = vec![0u8; batch.bytes()];
        self.read_ragged(&batch, &mut out)?;
        Ok((out, std::mem::take(&mut batch.offsets)))
    }
}

/// Adds one planned batch to a ragged variable's counters: its rows by
/// where their values come from (own share, a same-node mapping, the
/// transport) and the bytes of values it moves.
fn count_batch(c: &Counters, values: &Variable, located: &[(usize, u64)], bytes: usize) {
    let (mut own, mut node) = (0u64, 0u64);
    for &(owner, _) in located {
        if values.is_own(owner) {
            own += 1;
        } else if !values.is_remote(owner) {
            node += 1;
        }
    }
    let rows = located.len() as u64;
    Counters::add(&c.calls, 1);
    Counters::add(&c.rows, rows);
    Counters::add(&c.bytes, bytes as u64);
    Counters::add(&c.local_rows, own);
    Counters::add(&c.node_rows, node);
    Counters::add(&c.remote_rows, rows - own - node);
}

/// Takes the rows of `rows` the read-ahead staged out of the values' stage,
/// as rows gathered into one buffer (`None`: none staged).
fn take_staged(var: &RaggedVar, rows: &[u64]) -> Option<Gathered> {
    let stage = &var.values.spill.as_ref()?.stage;
    if stage.is_empty() {
        return None;
    }
    let ub = var.info.unit_bytes.max(1);
    let mut data = Vec::new();
    let mut by_row: RowMap<u64, (u64, usize)> = RowMap::default();
    for &row in rows {
        if by_row.contains_key(&row) {
            continue;
        }
        if let Some(bytes) = stage.take(row) {
            by_row.insert(row, ((bytes.len() / ub) as u64, data.len()));
            data.extend_from_slice(&bytes);
        }
    }
    (!by_row.is_empty()).then_some(Gathered { data, by_row })
}

/// `staged` rows appended to those `gathered` read.
fn merge_gathered(mut gathered: Gathered, staged: Gathered) -> Gathered {
    let base = gathered.data.len();
    gathered.data.extend_from_slice(&staged.data);
    for (row, (units, at)) in staged.by_row {
        gathered.by_row.insert(row, (units, at + base));
    }
    gathered
}
