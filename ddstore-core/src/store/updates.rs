//! Rows of spilling variables a rank updated since the last barrier (see
//! `spilling.rs`: the barrier tells every rank, whose read-ahead stages then
//! drop their copies).

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Mutex;

/// Most row ranges noted per variable between barriers; past it, the
/// variable's ranges merge into one spanning them all (dropping more staged
/// rows than were updated is only slower).
const MOST_RANGES: usize = 256;

/// Global rows of spilling variables this rank updated since the last
/// [`Store::barrier`], as ranges by variable.
#[derive(Default)]
pub(crate) struct Updates(Mutex<BTreeMap<String, Vec<(u64, u64)>>>);

impl Updates {
    pub(super) fn note(&self, name: &str, rows: Range<u64>) {
        let mut all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let ranges = all.entry(name.to_string()).or_default();
        match ranges.last_mut() {
            // Consecutive updates (a loop over rows) make one range.
            Some(last) if rows.start <= last.1 && rows.end >= last.0 => {
                *last = (last.0.min(rows.start), last.1.max(rows.end));
            }
            _ => ranges.push((rows.start, rows.end)),
        }
        if ranges.len() > MOST_RANGES {
            let span = ranges
                .iter()
                .fold((u64::MAX, 0), |(a, b), r| (a.min(r.0), b.max(r.1)));
            *ranges = vec![span];
        }
    }

    pub(super) fn take(&self) -> BTreeMap<String, Vec<(u64, u64)>> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Puts notes taken for a barrier that failed back (for the next one).
    pub(super) fn put_back(&self, taken: BTreeMap<String, Vec<(u64, u64)>>) {
        for (name, ranges) in taken {
            for (a, b) in ranges {
                self.note(&name, a..b);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn update_notes_merge_touching_ranges_and_stay_bounded() {
        let u = Updates::default();
        u.note("v", 10..20);
        u.note("v", 20..30); // a loop over rows: one range
        u.note("v", 5..12);
        u.note("v", 100..101);
        u.note("w", 0..1);
        let taken = u.take();
        assert_eq!(taken["v"], vec![(5, 30), (100, 101)]);
        assert_eq!(taken["w"], vec![(0, 1)]);
        assert!(u.take().is_empty(), "taken by the barrier");
        u.put_back(taken);
        assert_eq!(u.take()["v"], vec![(5, 30), (100, 101)]);
        for r in 0..(MOST_RANGES as u64 + 1) {
            u.note("v", 3 * r..3 * r + 1);
        }
        let span = 3 * MOST_RANGES as u64 + 1;
        assert_eq!(
            u.take()["v"],
            vec![(0, span)],
            "many ranges become one spanning them"
        );
    }
}
