//! The store's ragged variables (see [`crate::ragged`] for how they are
//! stored): creating and linking them, and reading a batch of rows, planned
//! in three steps: the row ends mapped here, those read from remote owners,
//! then the values.

use std::sync::Arc;

use crate::dtype::DType;
use crate::kinds::RaggedPart;
use crate::plan::{validate_rows, Plan, RepeatCopy};
use crate::profile::{Counters, Profile};
use crate::ragged::{
    ends_name, values_name, Gathered, RaggedBatch, RaggedInfo, RaggedVar, RowMap, StagingPool,
    END_BYTES, END_GAP_ROWS,
};
use crate::spill::stage::Reserved;
use crate::spill::store::Split;
use crate::transport::{RaggedRequest, RemoteRead};
use crate::{Error, Result};

use super::{Element, NewVar, OwnRows, Store, Variable};

impl Store {
    /// Collective: creates the ragged variable `name` from this rank's rows:
    /// `lengths[i]` units of `unit_bytes` bytes each for row i, the rows'
    /// values concatenated in `data`. Returns once every rank's rows are
    /// readable. A bad argument on any rank fails every rank with its message.
    pub fn add_ragged(
        &self,
        name: &str,
        lengths: &[u64],
        unit_bytes: usize,
        element: impl Into<Element>,
        data: &[u8],
    ) -> Result<()> {
        self.add_ragged_spilling(name, lengths, unit_bytes, element, data, None)
    }

    /// As [`Store::add_ragged`], with the variable's own memory budget and
    /// spill directory where `request` gives them (values first, then row
    /// ends, take from the budget; see [`crate::spill`]).
    pub fn add_ragged_spilling(
        &self,
        name: &str,
        lengths: &[u64],
        unit_bytes: usize,
        element: impl Into<Element>,
        data: &[u8],
        request: Option<&crate::spill::SpillRequest>,
    ) -> Result<()> {
        let units: u64 = lengths.iter().sum();
        let mut problem = None;
        if unit_bytes == 0 {
            problem = Some("units must be at least one byte wide".to_string());
        } else if (units as u128) * (unit_bytes as u128) != data.len() as u128 {
            problem = Some(format!(
                "the lengths sum to {units} units of {unit_bytes} bytes = {} bytes, but the values have {} bytes",
                units as u128 * unit_bytes as u128,
                data.len()
            ));
        } else if self.has_var(name) {
            problem = Some(format!("variable '{name}' already exists"));
        }
        let mut ends = Vec::with_capacity(lengths.len() * END_BYTES);
        let mut end = 0u64;
        for &l in lengths {
            end += l;
            ends.extend_from_slice(&end.to_le_bytes());
        }
        let longest = lengths.iter().max().copied().unwrap_or(0);
        // Both parts in one exchange: a bad rank fails every rank, not only itself.
        let mut alongs = self.create_many(&[
            NewVar {
                name: &values_name(name),
                rows: units,
                row_bytes: unit_bytes.max(1),
                element: element.into(),
                data: problem.is_none().then_some(data),
                request,
                problem,
                along: Some(longest.saturating_mul(unit_bytes as u64)),
            },
            NewVar {
                name: &ends_name(name),
                rows: lengths.len() as u64,
                row_bytes: END_BYTES,
                element: DType::Int64.into(),
                data: Some(&ends),
                request,
                problem: None,
                along: None,
            },
        ])?;
        self.link_ragged_with(name, Some(alongs.swap_remove(0)))
    }

    /// Registers `name` as ragged once its two variables exist here (after
    /// `add_ragged`, or after a method-2 extra job attached both).
    pub fn link_ragged(&self, name: &str) -> Result<()> {
        self.link_ragged_with(name, None)
    }

    fn link_ragged_with(&self, name: &str, max_row_bytes: Option<Vec<u64>>) -> Result<()> {
        let values = self.var(&values_name(name))?;
        let ends = self.var(&ends_name(name))?;
        if ends.info.row_bytes != END_BYTES
            || ends.info.layout.nranks() != values.info.layout.nranks()
        {
            return Err(Error::invalid(format!(
                "'{name}': its ends and values variables do not describe one ragged variable"
            )));
        }
        let info = RaggedInfo {
            dtype: values.info.dtype,
            itemsize: values.info.itemsize,
            unit_bytes: values.info.row_bytes,
            rows: ends.info.layout.clone(),
            units: values.info.layout.clone(),
        };
        let var = RaggedVar {
            info,
            values,
            ends,
            max_row_bytes,
            staging: StagingPool::default(),
            counters: Counters::default(),
        };
        self.ragged
            .write()
            .unwrap()
            .insert(name.to_string(), Arc::new(var));
        Ok(())
    }

    /// The shape of ragged variable `name`.
    pub fn ragged_info(&self, name: &str) -> Result<RaggedInfo> {
        Ok(self.ragged_var(name)?.info.clone())
    }

    pub(super) fn ragged_var(&self, name: &str) -> Result<Arc<RaggedVar>> {
        self.check_live()?;
        let found = self.ragged.read().unwrap().get(name).cloned();
        // The lock is released before the error looks at every name.
        found.ok_or_else(|| self.unknown_variable(name))
    }

    /// Read counters of ragged variable `name`: calls, rows (ragged rows),
    /// bytes (values) and the local / same-node / remote row split counted
    /// per batch; transport reads and times summed over its two parts.
    pub(crate) fn ragged_profile(&self, name: &str) -> Result<Profile> {
        let var = self.ragged_var(name)?;
        let mut p = var.counters.snapshot();
        for part in [&var.ends, &var.values] {
            let q = part.counters.snapshot();
            p.remote_reads += q.remote_reads;
            p.remote_ns += q.remote_ns;
            p.copy_ns += q.copy_ns;
            p.cq_ns += q.cq_ns;
            p.mr_ns += q.mr_ns;
            p.lock_ns += q.lock_ns;
            p.rejected_replies += part.remote.rejected_replies();
        }
        Ok(p)
    }

    /// Whether `name` is a ragged variable.
    pub fn is_ragged(&self, name: &str) -> bool {
        self.ragged.read().unwrap().contains_key(name)
    }

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
    fn plan_ragged_as(&self, name: &str, rows: &[i64], reading: bool) -> Result<RaggedBatch> {
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

    /// Reads ahead for ragged variable `name`: stages the rows among global
    /// `rows` whose values lie (partly) in spill files, whole, in the values'
    /// read-ahead stage (up to its capacity), so that a batch that needs them
    /// copies them from memory (see [`Store::prefetch`]). Returns the rows staged.
    pub(crate) fn prefetch_ragged(&self, name: &str, rows: &[i64]) -> Result<usize> {
        let var = self.ragged_var(name)?;
        let Some(spill) = &var.values.spill else {
            return Ok(0);
        };
        let stage = &spill.stage;
        let total = var.info.rows.total();
        if stage.capacity() == 0 {
            return Ok(0);
        }
        // Distinct valid rows not staged yet, in order, at most a stage of
        // them (the smallest rows, of one unit, bound how many fit).
        let most = stage.capacity() / var.info.unit_bytes.max(1);
        let mut seen = std::collections::HashSet::new();
        let mut wanted: Vec<u64> = Vec::new();
        for &r in rows {
            if wanted.len() >= most || wanted.len() >= PREFETCH_ROWS {
                break;
            }
            if r >= 0 && (r as u64) < total && seen.insert(r) && !stage.contains(r as u64) {
                wanted.push(r as u64);
            }
        }
        if wanted.is_empty() {
            return Ok(0);
        }
        // Each row's bounds tell whether its values spill and how large it is.
        let located: Vec<(usize, u64)> = wanted
            .iter()
            .map(|&r| var.info.rows.locate_valid(r))
            .collect();
        let known = KnownEnds::find(&var, &wanted, &located, None)?;
        let remote = self.read_remote_ends(&var, &known)?;
        let ub = var.info.unit_bytes;
        let mut spilled: Vec<(u64, usize)> = Vec::new();
        for (i, (&row, &(owner, local))) in wanted.iter().zip(&located).enumerate() {
            let (start, end) = match known.bounds[i] {
                Some(bounds) => bounds,
                None if local == 0 => (0, remote.end_of(row)),
                None => (remote.end_of(row - 1), remote.end_of(row)),
            };
            if end <= start || end > var.info.units.count(owner) {
                continue; // empty (nothing to stage) or corrupt (the read reports it)
            }
            let probe = RemoteRead {
                owner,
                offset: start * ub as u64,
                len: (end - start) as usize * ub,
                dst_offset: 0,
            };
            let readable = matches!(spill.split(&probe, &var.values.name), Ok(Split::Parts(..)))
                || (spill.remote_serves && spill.spilled_part(&probe).is_some());
            if readable {
                spilled.push((row, probe.len));
            }
        }
        // Reserved rows are pending: a read that needs one waits for it
        // rather than reading it again; the guard gives up what is not filled.
        let reserved = Reserved::new(stage, stage.reserve_sized(&spilled));
        let size: std::collections::HashMap<u64, usize> = spilled.into_iter().collect();
        let mut piece: Vec<i64> = Vec::new();
        let mut piece_bytes = 0usize;
        for (k, &row) in reserved.rows.iter().enumerate() {
            piece.push(row as i64);
            piece_bytes += size[&row];
            if piece_bytes >= PREFETCH_PIECE || k + 1 == reserved.rows.len() {
                let batch = self.plan_ragged_as(name, &piece, false)?;
                let mut out = vec![0u8; batch.bytes()];
                self.read_ragged(&batch, &mut out)?;
                for (i, &r) in piece.iter().enumerate() {
                    let (a, b) = (
                        batch.offsets[i] as usize * ub,
                        batch.offsets[i + 1] as usize * ub,
                    );
                    stage.fill(r as u64, out[a..b].to_vec());
                }
                piece.clear();
                piece_bytes = 0;
            }
        }
        Ok(reserved.rows.len())
    }

    /// Reads the row ends `known` still needs from remote owners: those
    /// closer than END_GAP_ROWS are read as one span (gaps included), since
    /// a read costs about the same for 8 bytes as for a few KiB, so a batch
    /// reads each owner's ends with one read, not one per row.
    fn read_remote_ends(&self, var: &RaggedVar, known: &KnownEnds) -> Result<RemoteEnds> {
        let info = &var.info;
        let ends_var = &var.ends;
        let mut spans: Vec<(u64, u64, usize)> = Vec::new();
        let mut plan = Plan::default();
        let max_read = ends_var.max_read.max(END_BYTES);
        let mut buf_len = 0usize;
        let mut push_span = |owner: usize, lo: u64, hi: u64, plan: &mut Plan| {
            let len = (hi - lo + 1) as usize * END_BYTES;
            plan.push_split(
                RemoteRead {
                    owner,
                    offset: (lo - info.rows.start(owner)) * END_BYTES as u64,
                    len,
                    dst_offset: buf_len,
                },
                max_read,
            );
            spans.push((lo, hi, buf_len));
            buf_len += len;
        };
        // Usually every owner's needed ends lie in one span within that budget (a batch of
        // random rows): one span each, without sorting the rows.
        let mut per_owner = known.per_owner.clone();
        let compact = per_owner
            .iter()
            .all(|&(_, lo, hi, n)| hi - lo < n * END_GAP_ROWS);
        if compact {
            per_owner.sort_unstable_by_key(|e| e.1);
            for &(owner, lo, hi, _) in &per_owner {
                push_span(owner, lo, hi, &mut plan);
            }
        } else {
            let mut need = known.need.clone();
            need.sort_unstable();
            need.dedup();
            let mut i = 0;
            while i < need.len() {
                let (owner, _) = info.rows.locate(need[i])?;
                let owner_end = info.rows.start(owner) + info.rows.count(owner);
                let (lo, mut hi) = (need[i], need[i]);
                i += 1;
                while i < need.len() && need[i] < owner_end && need[i] - hi <= END_GAP_ROWS {
                    hi = need[i];
                    i += 1;
                }
                push_span(owner, lo, hi, &mut plan);
            }
        }
        let mut ends = vec![0u8; buf_len];
        if !plan.segments.is_empty() {
            self.watch(ends_var.execute(&plan, &mut ends, buf_len / END_BYTES, OwnRows::Copy))?;
        }
        Ok(RemoteEnds { spans, ends })
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
                RaggedPart::owner(&batch.values.name).unwrap_or(&batch.values.name),
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

/// Row bounds of a batch found without a transport read: per row, its
/// (start, end) in units where its owner's ends are mapped here (own share,
/// same-node peers), else the rows whose ends remote owners must send.
struct KnownEnds {
    /// Per batch row: its bounds, or `None` (gathered, or ends read remotely).
    bounds: Vec<Option<(u64, u64)>>,
    /// Rows whose end is read remotely: each remote row and, unless first
    /// in its share, the one before it.
    need: Vec<u64>,
    /// Per remote owner: (owner, lowest and highest row whose end is needed, rows).
    per_owner: Vec<(usize, u64, u64, u64)>,
}

impl KnownEnds {
    /// Reads the ends in place where they are mapped; notes the others.
    fn find(
        var: &RaggedVar,
        rows: &[u64],
        located: &[(usize, u64)],
        gathered: Option<&Gathered>,
    ) -> Result<KnownEnds> {
        let mut known = KnownEnds {
            bounds: Vec::with_capacity(rows.len()),
            need: Vec::new(),
            per_owner: Vec::new(),
        };
        let mut owner_index: RowMap<usize, usize> = RowMap::default();
        for (&row, &(owner, local)) in rows.iter().zip(located) {
            if gathered.is_some_and(|g| g.by_row.contains_key(&row)) {
                known.bounds.push(None);
                continue;
            }
            if let Some(mem) = var.ends.mapped(owner) {
                let mut pair = [0u8; 2 * END_BYTES];
                if local == 0 {
                    mem.read_at(0, &mut pair[END_BYTES..])?;
                } else {
                    mem.read_at((local as usize - 1) * END_BYTES, &mut pair)?;
                }
                let start = u64::from_le_bytes(pair[..END_BYTES].try_into().unwrap());
                let end = u64::from_le_bytes(pair[END_BYTES..].try_into().unwrap());
                known.bounds.push(Some((start, end)));
                continue;
            }
            known.bounds.push(None);
            known.need.push(row);
            let lo = if local > 0 {
                known.need.push(row - 1);
                row - 1
            } else {
                row
            };
            let per_owner = &mut known.per_owner;
            let k = *owner_index.entry(owner).or_insert_with(|| {
                per_owner.push((owner, lo, row, 0));
                per_owner.len() - 1
            });
            let e = &mut per_owner[k];
            (e.1, e.2, e.3) = (e.1.min(lo), e.2.max(row), e.3 + 1);
        }
        Ok(known)
    }
}

/// Row ends read from remote owners: spans of consecutive rows' ends.
struct RemoteEnds {
    /// (first row, last row, offset in `ends`) of each span read.
    spans: Vec<(u64, u64, usize)>,
    ends: Vec<u8>,
}

impl RemoteEnds {
    /// The end of `row`, which one of the spans holds.
    fn end_of(&self, row: u64) -> u64 {
        let k = self.spans.partition_point(|s| s.0 <= row) - 1;
        let at = self.spans[k].2 + (row - self.spans[k].0) as usize * END_BYTES;
        u64::from_le_bytes(self.ends[at..at + END_BYTES].try_into().unwrap())
    }
}

/// The values part of a planned batch (see [`plan_values`]).
struct PlannedValues {
    plan: Plan,
    /// Each row's first unit in the result (the total is pushed last).
    offsets: Vec<u64>,
    /// Units of the whole batch.
    units: u64,
    /// Copies of gathered rows out of the staging buffer: (staged offset, dst offset, len).
    staged_copies: Vec<(usize, usize, usize)>,
}

/// Plans the values of a batch whose row bounds are known: coalesced reads
/// per owner, remote repeats read once and copied, gathered rows copied
/// from the staging buffer.
fn plan_values(
    name: &str,
    var: &RaggedVar,
    rows: &[u64],
    located: &[(usize, u64)],
    gathered: Option<&Gathered>,
    known: &KnownEnds,
    remote: &RemoteEnds,
) -> Result<PlannedValues> {
    let info = &var.info;
    let values = &var.values;
    let ub = info.unit_bytes;
    let max_read = values.max_read.max(ub);
    let mut plan = Plan {
        segments: Vec::with_capacity(rows.len()),
        repeats: Vec::new(),
    };
    let mut offsets = Vec::with_capacity(rows.len() + 1);
    // Repeats of remote rows are read once (only rows whose ends were read remotely).
    let remote_rows = if known.need.is_empty() { 0 } else { rows.len() };
    let mut first_seen: RowMap<u64, u64> =
        RowMap::with_capacity_and_hasher(remote_rows, Default::default());
    let mut open: Option<RemoteRead> = None;
    let mut dst = 0u64;
    let mut staged_copies: Vec<(usize, usize, usize)> = Vec::new();
    for (i, (&row, &(owner, local))) in rows.iter().zip(located).enumerate() {
        offsets.push(dst);
        if let Some(&(units, at)) = gathered.and_then(|g| g.by_row.get(&row)) {
            let (bytes, dst_b) = (units as usize * ub, dst as usize * ub);
            match staged_copies.last_mut() {
                Some(c) if c.0 + c.2 == at && c.1 + c.2 == dst_b => c.2 += bytes,
                _ if bytes > 0 => staged_copies.push((at, dst_b, bytes)),
                _ => {}
            }
            dst += units;
            continue;
        }
        let (start, end) = match known.bounds[i] {
            Some(bounds) => bounds,
            None if local == 0 => (0, remote.end_of(row)),
            None => (remote.end_of(row - 1), remote.end_of(row)),
        };
        let share_units = info.units.count(owner);
        if start > end || end > share_units {
            return Err(Error::Transport(format!(
                "'{name}': rank {owner} reports row {row} at units {start}..{end} of its {share_units}: \
                 its share is corrupt or was replaced"
            )));
        }
        let len = end - start;
        if len == 0 {
            continue;
        }
        let bytes = (len as usize) * ub;
        if values.is_remote(owner) {
            if let Some(&from) = first_seen.get(&row) {
                plan.repeats.push(RepeatCopy {
                    from: from as usize * ub,
                    to: dst as usize * ub,
                    len: bytes,
                });
                dst += len;
                continue;
            }
            first_seen.insert(row, dst);
        }
        let src = start * ub as u64;
        let dst_b = dst as usize * ub;
        match open.as_mut() {
            Some(seg)
                if seg.owner == owner
                    && seg.offset + seg.len as u64 == src
                    && seg.dst_offset + seg.len == dst_b =>
            {
                seg.len += bytes;
            }
            _ => {
                if let Some(seg) = open.take() {
                    plan.push_split(seg, max_read);
                }
                open = Some(RemoteRead {
                    owner,
                    offset: src,
                    len: bytes,
                    dst_offset: dst_b,
                });
            }
        }
        dst += len;
    }
    if let Some(seg) = open {
        plan.push_split(seg, max_read);
    }
    Ok(PlannedValues {
        plan,
        offsets,
        units: dst,
        staged_copies,
    })
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

/// A read ahead's rows read at once, at most (its bounds are looked up first).
const PREFETCH_ROWS: usize = 4096;

/// Bytes a ragged read ahead reads at once (as the fixed one's pieces).
const PREFETCH_PIECE: usize = 4 << 20;

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
