//! The row ends a batch needs: read in place where the owner's ends are
//! mapped here, else read from remote owners in spans.

use crate::plan::Plan;
use crate::store::{OwnRows, Store};
use crate::transport::RemoteRead;
use crate::Result;

use super::{Gathered, RaggedVar, RowMap, END_BYTES, END_GAP_ROWS};

impl Store {
    /// Reads the row ends `known` still needs from remote owners: those
    /// closer than END_GAP_ROWS are read as one span (gaps included), since
    /// a read costs about the same for 8 bytes as for a few KiB, so a batch
    /// reads each owner's ends with one read, not one per row.
    pub(super) fn read_remote_ends(
        &self,
        var: &RaggedVar,
        known: &KnownEnds,
    ) -> Result<RemoteEnds> {
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
}

/// Row bounds of a batch found without a transport read: per row, its
/// (start, end) in units where its owner's ends are mapped here (own share,
/// same-node peers), else the rows whose ends remote owners must send.
pub(super) struct KnownEnds {
    /// Per batch row: its bounds, or `None` (gathered, or ends read remotely).
    pub(super) bounds: Vec<Option<(u64, u64)>>,
    /// Rows whose end is read remotely: each remote row and, unless first
    /// in its share, the one before it.
    pub(super) need: Vec<u64>,
    /// Per remote owner: (owner, lowest and highest row whose end is needed, rows).
    pub(super) per_owner: Vec<(usize, u64, u64, u64)>,
}

impl KnownEnds {
    /// Reads the ends in place where they are mapped; notes the others.
    pub(super) fn find(
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

    /// Batch row `i`'s bounds (`row`, `local` in its owner's share): found
    /// in place, else from the ends read remotely.
    pub(super) fn bounds_of(
        &self,
        i: usize,
        row: u64,
        local: u64,
        remote: &RemoteEnds,
    ) -> (u64, u64) {
        match self.bounds[i] {
            Some(bounds) => bounds,
            None if local == 0 => (0, remote.end_of(row)),
            None => (remote.end_of(row - 1), remote.end_of(row)),
        }
    }
}

/// Row ends read from remote owners: spans of consecutive rows' ends.
pub(super) struct RemoteEnds {
    /// (first row, last row, offset in `ends`) of each span read.
    spans: Vec<(u64, u64, usize)>,
    ends: Vec<u8>,
}

impl RemoteEnds {
    /// The end of `row`, which one of the spans holds.
    pub(super) fn end_of(&self, row: u64) -> u64 {
        let k = self.spans.partition_point(|s| s.0 <= row) - 1;
        let at = self.spans[k].2 + (row - self.spans[k].0) as usize * END_BYTES;
        u64::from_le_bytes(self.ends[at..at + END_BYTES].try_into().unwrap())
    }
}
