//! Batch planning: rows in any order, with repeats, become per-owner byte
//! ranges. Rows adjacent both in the owner's share and in the destination
//! coalesce into one read, long reads are split, and a repeated row is read
//! once and copied.

use crate::row_map::RowMap;

use crate::layout::Layout;
use crate::transport::RemoteRead;
use crate::{Error, Result};

/// Copy of an already-read destination row to another position (repeats).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RepeatCopy {
    /// Byte offset in the destination of the row already read.
    pub from: usize,
    /// Byte offset in the destination to copy it to.
    pub to: usize,
    /// Bytes to copy (one row).
    pub len: usize,
}

/// The reads and copies that fill a batch's destination buffer.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Reads, each at most the configured longest read.
    pub segments: Vec<RemoteRead>,
    /// Copies of repeated rows, done after every read landed.
    pub repeats: Vec<RepeatCopy>,
}

/// Turns signed row indices into validated global rows, naming the first bad one.
pub fn validate_rows(rows: &[i64], total: u64) -> Result<Vec<u64>> {
    rows.iter()
        .enumerate()
        .map(|(i, &r)| check_row(i, r, total))
        .collect()
}

/// Row index `r` at position `pos` as a global row, if `0 <= r < total`.
fn check_row(pos: usize, r: i64, total: u64) -> Result<u64> {
    if r < 0 || r as u64 >= total {
        Err(Error::IndexOutOfRange(format!(
            "index {r} at position {pos} is out of range: expected 0 <= index < {total}"
        )))
    } else {
        Ok(r as u64)
    }
}

impl Plan {
    /// Plans reading `rows` into a destination where row i lands at byte
    /// `i * row_bytes`. This is the one place the indices of a batch are
    /// checked (the first bad one is named with its position, before any
    /// byte moves). Repeats of rows whose owner `read_once(owner)` are read
    /// once and copied; others (memory copies anyway) skip the bookkeeping.
    /// Every read is at most `max_read_bytes` long: the one split.
    pub fn build(
        layout: &Layout,
        rows: &[i64],
        row_bytes: usize,
        max_read_bytes: usize,
        read_once: impl Fn(usize) -> bool,
    ) -> Result<Plan> {
        let max_read = max_read_bytes.max(1);
        let mut plan = Plan::default();
        let mut first_seen: RowMap<u64, usize> =
            RowMap::with_capacity_and_hasher(rows.len(), Default::default());
        // The open segment and the (row, position) it ends with.
        let mut open: Option<(RemoteRead, u64, usize)> = None;
        let total = layout.total();
        for (pos, &index) in rows.iter().enumerate() {
            let row = check_row(pos, index, total)?;
            let dst = pos * row_bytes;
            let (owner, local) = layout.locate_valid(row);
            if read_once(owner) {
                if let Some(&first) = first_seen.get(&row) {
                    let from = first * row_bytes;
                    plan.repeats.push(RepeatCopy {
                        from,
                        to: dst,
                        len: row_bytes,
                    });
                    continue;
                }
                first_seen.insert(row, pos);
            }
            if let Some((seg, last_row, last_pos)) = open.as_mut() {
                let extends = seg.owner == owner
                    && row == *last_row + 1
                    && pos == *last_pos + 1
                    && seg.len + row_bytes <= max_read;
                if extends {
                    seg.len += row_bytes;
                    *last_row = row;
                    *last_pos = pos;
                    continue;
                }
            }
            if let Some((seg, _, _)) = open.take() {
                plan.push_split(seg, max_read);
            }
            let seg = RemoteRead {
                owner,
                offset: local * row_bytes as u64,
                len: row_bytes,
                dst_offset: dst,
            };
            open = Some((seg, row, pos));
        }
        if let Some((seg, _, _)) = open {
            plan.push_split(seg, max_read);
        }
        Ok(plan)
    }

    /// Adds a segment, cut into pieces of at most `max_read` bytes (rows wider than that).
    pub(crate) fn push_split(&mut self, seg: RemoteRead, max_read: usize) {
        let mut done = 0;
        while done < seg.len {
            let len = (seg.len - done).min(max_read);
            self.segments.push(RemoteRead {
                owner: seg.owner,
                offset: seg.offset + done as u64,
                len,
                dst_offset: seg.dst_offset + done,
            });
            done += len;
        }
    }

    /// Bytes the segments read.
    pub fn bytes(&self) -> usize {
        self.segments.iter().map(|s| s.len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Applies a plan to fake shares where byte b of global row r is (r * 31 + b) mod 251.
    fn execute(layout: &Layout, plan: &Plan, row_bytes: usize, n: usize) -> Vec<u8> {
        let mut out = vec![0xEE; n * row_bytes];
        for s in &plan.segments {
            for k in 0..s.len {
                let local_byte = s.offset as usize + k;
                let row = layout.start(s.owner) + (local_byte / row_bytes) as u64;
                out[s.dst_offset + k] = ((row as usize * 31 + local_byte % row_bytes) % 251) as u8;
            }
        }
        for c in &plan.repeats {
            out.copy_within(c.from..c.from + c.len, c.to);
        }
        out
    }

    fn naive(rows: &[i64], row_bytes: usize) -> Vec<u8> {
        rows.iter()
            .flat_map(|&r| (0..row_bytes).map(move |b| ((r as usize * 31 + b) % 251) as u8))
            .collect()
    }

    #[test]
    fn coalesces_adjacent_rows_and_reads_repeats_once() {
        let layout = Layout::new(&[4, 4]);
        let plan = Plan::build(&layout, &[1, 2, 3, 4, 2], 8, 1 << 20, |_| true).unwrap();
        // 1..3 on rank 0 coalesce; 4 is rank 1's first row; the second 2 is a copy.
        assert_eq!(
            plan.segments,
            vec![
                RemoteRead {
                    owner: 0,
                    offset: 8,
                    len: 24,
                    dst_offset: 0
                },
                RemoteRead {
                    owner: 1,
                    offset: 0,
                    len: 8,
                    dst_offset: 24
                },
            ]
        );
        assert_eq!(
            plan.repeats,
            vec![RepeatCopy {
                from: 8,
                to: 32,
                len: 8
            }]
        );
    }

    #[test]
    fn splits_long_reads() {
        let layout = Layout::new(&[10]);
        let plan = Plan::build(&layout, &[0, 1, 2], 10, 16, |_| true).unwrap();
        assert!(plan.segments.iter().all(|s| s.len <= 16));
        assert_eq!(plan.bytes(), 30);
    }

    #[test]
    fn rejects_bad_indices_with_position() {
        let err = validate_rows(&[0, 5, -1], 10).unwrap_err().to_string();
        assert!(err.contains("-1") && err.contains("position 2"), "{err}");
        assert!(validate_rows(&[10], 10).is_err());
        let layout = Layout::new(&[4, 6]);
        let err = Plan::build(&layout, &[0, 5, 10], 8, 64, |_| true)
            .unwrap_err()
            .to_string();
        assert!(err.contains("10") && err.contains("position 2"), "{err}");
    }

    #[test]
    fn randomized_against_naive_reference() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for _ in 0..300 {
            let nranks = rng.gen_range(1..6);
            let counts: Vec<u64> = (0..nranks).map(|_| rng.gen_range(0..12)).collect();
            let layout = Layout::new(&counts);
            if layout.total() == 0 {
                continue;
            }
            let row_bytes = rng.gen_range(1..24);
            let n = rng.gen_range(0..40);
            let total = layout.total() as i64;
            let rows: Vec<i64> = if rng.gen_bool(0.3) {
                let s = rng.gen_range(0..total);
                (s..(s + n as i64).min(total)).collect()
            } else {
                (0..n).map(|_| rng.gen_range(0..total)).collect()
            };
            let max_read = rng.gen_range(1..64);
            let plan = Plan::build(&layout, &rows, row_bytes, max_read, |_| true).unwrap();
            assert!(plan.segments.iter().all(|s| s.len <= max_read && s.len > 0));
            let mut distinct = rows.clone();
            distinct.sort_unstable();
            distinct.dedup();
            assert_eq!(
                plan.bytes(),
                distinct.len() * row_bytes,
                "each distinct row read once"
            );
            assert_eq!(
                execute(&layout, &plan, row_bytes, rows.len()),
                naive(&rows, row_bytes)
            );
            // Without read-once bookkeeping every position is read, with the same result.
            let plan = Plan::build(&layout, &rows, row_bytes, max_read, |o| o % 2 == 1).unwrap();
            assert_eq!(
                execute(&layout, &plan, row_bytes, rows.len()),
                naive(&rows, row_bytes)
            );
        }
    }
}
