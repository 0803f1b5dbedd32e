//! Shares larger than the rank's memory budget (`DDSTORE_MEMORY_LIMIT`):
//! a share keeps its first rows in its memory region, as every share does,
//! and the rest in one spill file of a private spill directory
//! (`DDSTORE_SPILL_DIR`, see [`dir`]).
//!
//! The pieces: [`SpillDir`] (the directory, its lock, stale files of killed
//! jobs), [`SpillFile`] (one share's rows past the budget, written during the
//! load and read with `O_DIRECT` where the file system allows it, so page
//! cache does not blur the budget), [`SpilledShare`] (memory plus file as one
//! [`crate::memory::Memory`] of the share's full length, so loads, updates
//! and every read path see one share), [`read_all`] (many spilled rows read
//! in flight) and [`Stage`] (rows read ahead of use, inside the budget).

pub mod dir;
pub mod file;
pub mod read;
pub mod share;
pub mod stage;
pub mod store;

pub use dir::SpillDir;
pub use file::{SpillFile, SpillLocator};
pub use read::{read_all, run_all, SpillRead};
pub use share::SpilledShare;
pub use stage::Stage;
pub use store::SpillRequest;

/// How many of `rows` rows of `row_bytes` bytes fit in `budget` bytes.
pub fn rows_in_budget(rows: u64, row_bytes: usize, budget: u64) -> u64 {
    if row_bytes == 0 {
        return rows;
    }
    rows.min(budget / row_bytes as u64)
}

/// A file name part made of `name`'s letters, digits, `-` and `_` (at most
/// 48), so any variable name gives a plain file name.
pub(crate) fn file_safe(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(48)
        .collect();
    if s.is_empty() {
        "var".into()
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_counts_whole_rows() {
        assert_eq!(rows_in_budget(10, 100, 0), 0);
        assert_eq!(rows_in_budget(10, 100, 350), 3);
        assert_eq!(rows_in_budget(10, 100, 1 << 30), 10);
        assert_eq!(file_safe("a/b c#values"), "a_b_c_values");
        assert_eq!(file_safe(""), "var");
    }
}

#[cfg(test)]
mod file_tests;
