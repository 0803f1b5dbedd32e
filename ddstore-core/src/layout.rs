//! Where a global row lives: the concatenation of the ranks' shares in rank order.

use crate::{Error, Result};

/// Rows per rank of one variable, with O(1) or O(log ranks) owner lookups.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// `starts[r]` is the first global row of rank r; `starts[n]` the total.
    starts: Vec<u64>,
    /// Rows per rank when every share (but maybe the last) is equal: O(1) lookups.
    uniform: Option<u64>,
}

impl Layout {
    /// The layout of shares of `counts[r]` rows on rank r.
    pub fn new(counts: &[u64]) -> Layout {
        let mut starts = Vec::with_capacity(counts.len() + 1);
        let mut total = 0u64;
        starts.push(0);
        for &c in counts {
            total += c;
            starts.push(total);
        }
        let first = counts.first().copied().unwrap_or(0);
        let uniform = (first > 0
            && counts.len() > 1
            && counts[..counts.len() - 1].iter().all(|&c| c == first)
            && counts[counts.len() - 1] <= first)
            .then_some(first);
        Layout { starts, uniform }
    }

    /// Number of ranks.
    pub fn nranks(&self) -> usize {
        self.starts.len() - 1
    }

    /// Rows of all ranks together.
    pub fn total(&self) -> u64 {
        *self.starts.last().unwrap()
    }

    /// Rows `rank` owns.
    pub fn count(&self, rank: usize) -> u64 {
        self.starts[rank + 1] - self.starts[rank]
    }

    /// First global row of `rank` (the `disp` of upstream pyddstore).
    pub fn start(&self, rank: usize) -> u64 {
        self.starts[rank]
    }

    /// Rows per rank, in rank order.
    pub fn counts(&self) -> Vec<u64> {
        self.starts.windows(2).map(|w| w[1] - w[0]).collect()
    }

    /// (owner rank, row within the owner's share) of a global row.
    pub fn locate(&self, row: u64) -> Result<(usize, u64)> {
        if row >= self.total() {
            return Err(Error::IndexOutOfRange(format!(
                "row {row} is out of range: the variable has {} rows",
                self.total()
            )));
        }
        Ok(self.locate_valid(row))
    }

    /// As [`Layout::locate`] for a row the caller checked (`row < total()`):
    /// the batch planner checks each index once and looks it up here.
    pub(crate) fn locate_valid(&self, row: u64) -> (usize, u64) {
        debug_assert!(row < self.total());
        let owner = match self.uniform {
            Some(per) => (row / per) as usize,
            // The last rank whose start is <= row (skips empty shares).
            None => self.starts.partition_point(|&s| s <= row) - 1,
        };
        (owner, row - self.starts[owner])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn naive_locate(counts: &[u64], row: u64) -> Option<(usize, u64)> {
        let mut start = 0;
        for (r, &c) in counts.iter().enumerate() {
            if row < start + c {
                return Some((r, row - start));
            }
            start += c;
        }
        None
    }

    #[test]
    fn uneven_and_empty_shares() {
        let l = Layout::new(&[3, 0, 2, 5]);
        assert_eq!(l.total(), 10);
        assert_eq!(l.locate(0).unwrap(), (0, 0));
        assert_eq!(l.locate(3).unwrap(), (2, 0));
        assert_eq!(l.locate(9).unwrap(), (3, 4));
        assert!(l.locate(10).is_err());
        assert_eq!(l.start(2), 3);
    }

    #[test]
    fn randomized_against_naive() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for _ in 0..200 {
            let n = rng.gen_range(1..9);
            let counts: Vec<u64> = if rng.gen_bool(0.3) {
                let per = rng.gen_range(1..20);
                let mut c = vec![per; n];
                c[n - 1] = rng.gen_range(0..=per);
                c
            } else {
                (0..n).map(|_| rng.gen_range(0..20)).collect()
            };
            let l = Layout::new(&counts);
            for row in 0..l.total() + 3 {
                assert_eq!(
                    l.locate(row).ok(),
                    naive_locate(&counts, row),
                    "{counts:?} row {row}"
                );
            }
        }
    }
}
