//! Planning the values of a batch whose row bounds are known.

use crate::plan::{Plan, RepeatCopy};
use crate::transport::RemoteRead;
use crate::{Error, Result};

use super::ends::{KnownEnds, RemoteEnds};
use super::{Gathered, RaggedVar, RowMap};

/// The values part of a planned batch (see [`plan_values`]).
pub(super) struct PlannedValues {
    pub(super) plan: Plan,
    /// Each row's first unit in the result (the total is pushed last).
    pub(super) offsets: Vec<u64>,
    /// Units of the whole batch.
    pub(super) units: u64,
    /// Copies of gathered rows out of the staging buffer: (staged offset, dst offset, len).
    pub(super) staged_copies: Vec<(usize, usize, usize)>,
}

/// Plans the values of a batch whose row bounds are known: coalesced reads
/// per owner, remote repeats read once and copied, gathered rows copied
/// from the staging buffer.
pub(super) fn plan_values(
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
        let (start, end) = known.bounds_of(i, row, local, remote);
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
