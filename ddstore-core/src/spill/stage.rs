//! The read-ahead stage: spilled rows a reader will need soon, read ahead
//! of use (see `Store::prefetch`) into a bounded cache inside the budget, so
//! that the batch that needs them copies them from memory. A row leaves the
//! stage when a read takes it (an epoch reads each sample once) or, oldest
//! first, when newer rows need the room.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Most bytes one variable's stage takes from its budget.
pub const STAGE_MAX: u64 = 64 << 20;

/// The part of a spilling variable's budget its stage holds: an eighth, at
/// most [`STAGE_MAX`].
pub fn stage_bytes(budget: u64) -> u64 {
    (budget / 8).min(STAGE_MAX)
}

/// Staged rows of one variable, by global row.
#[derive(Default)]
pub struct Stage {
    cap: usize,
    staged: AtomicUsize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    rows: HashMap<u64, Vec<u8>>,
    order: VecDeque<u64>,
    bytes: usize,
}

impl Stage {
    /// A stage of at most `cap` bytes (0: no read-ahead).
    pub fn new(cap: usize) -> Stage {
        Stage {
            cap,
            ..Default::default()
        }
    }

    /// Its capacity in bytes.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Rows staged now.
    pub fn len(&self) -> usize {
        self.staged.load(Ordering::Relaxed)
    }

    /// Whether no row is staged (a read then skips the stage).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `row` is staged.
    pub fn contains(&self, row: u64) -> bool {
        !self.is_empty() && self.inner.lock().unwrap().rows.contains_key(&row)
    }

    /// Stages `bytes` as `row`, dropping the oldest rows while over capacity
    /// (a row larger than the stage is not staged).
    pub fn insert(&self, row: u64, bytes: Vec<u8>) {
        if bytes.len() > self.cap {
            return;
        }
        let mut s = self.inner.lock().unwrap();
        if s.rows.contains_key(&row) {
            return;
        }
        while s.bytes + bytes.len() > self.cap {
            let Some(old) = s.order.pop_front() else {
                break;
            };
            if let Some(b) = s.rows.remove(&old) {
                s.bytes -= b.len();
            }
        }
        s.bytes += bytes.len();
        s.order.push_back(row);
        s.rows.insert(row, bytes);
        self.staged.store(s.rows.len(), Ordering::Relaxed);
    }

    /// Takes `row` out of the stage, if it is there.
    pub fn take(&self, row: u64) -> Option<Vec<u8>> {
        if self.is_empty() {
            return None;
        }
        let mut s = self.inner.lock().unwrap();
        let b = s.rows.remove(&row)?;
        s.bytes -= b.len();
        // Its entry in `order` goes when it reaches the front (a missing row is skipped).
        self.staged.store(s.rows.len(), Ordering::Relaxed);
        Some(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stage_is_bounded_and_rows_leave_when_taken() {
        let s = Stage::new(100);
        for r in 0..5 {
            s.insert(r, vec![r as u8; 30]);
        }
        assert_eq!(s.len(), 3, "only 3 rows of 30 bytes fit in 100");
        assert!(!s.contains(0) && s.contains(4));
        assert_eq!(s.take(3), Some(vec![3u8; 30]));
        assert_eq!(s.take(3), None);
        s.insert(9, vec![9; 200]);
        assert!(!s.contains(9), "larger than the stage");
        assert_eq!(stage_bytes(800 << 20), 64 << 20);
        assert_eq!(stage_bytes(80), 10);
    }
}
