//! Reading a ragged variable's spilled rows ahead of use, whole, into its
//! values' read-ahead stage.

use crate::spill::stage::Reserved;
use crate::spill::store::VarSpill;
use crate::store::Store;
use crate::transport::RemoteRead;
use crate::Result;

use super::ends::KnownEnds;

/// A read ahead's rows read at once, at most (its bounds are looked up first).
const PREFETCH_ROWS: usize = 4096;

impl Store {
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
            let (start, end) = known.bounds_of(i, row, local, &remote);
            if end <= start || end > var.info.units.count(owner) {
                continue; // empty (nothing to stage) or corrupt (the read reports it)
            }
            let probe = RemoteRead {
                owner,
                offset: start * ub as u64,
                len: (end - start) as usize * ub,
                dst_offset: 0,
            };
            if spill.read_ahead_reads(&probe, &var.values.name) {
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
            if piece_bytes >= VarSpill::PREFETCH_PIECE || k + 1 == reserved.rows.len() {
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
}
