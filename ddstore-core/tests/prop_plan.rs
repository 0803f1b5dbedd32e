//! Property tests of the read path's pure parts: `validate_rows`,
//! `Layout::locate` and `Plan::build` on arbitrary layouts, rows and read
//! limits, each against a naive reference. Bounded (a few hundred cases each).

use ddstore_core::layout::Layout;
use ddstore_core::plan::{validate_rows, Plan};
use proptest::prelude::*;

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// The owner and local row of `row` by walking the shares one by one.
fn naive_locate(counts: &[u64], row: u64) -> Option<(usize, u64)> {
    let mut start = 0u64;
    for (rank, &c) in counts.iter().enumerate() {
        if row < start + c {
            return Some((rank, row - start));
        }
        start += c;
    }
    None
}

/// Byte `b` of global row `r` in the fake shares.
fn byte_of(row: u64, b: usize) -> u8 {
    ((row as usize).wrapping_mul(31).wrapping_add(b * 7) % 251) as u8
}

/// Runs a plan against fake shares, checking every segment stays inside its
/// owner's share and the destination, and that no two reads overlap.
fn execute(layout: &Layout, plan: &Plan, row_bytes: usize, nrows: usize) -> Vec<u8> {
    let mut out = vec![0xEEu8; nrows * row_bytes];
    let mut written = vec![false; out.len()];
    for s in &plan.segments {
        assert!(s.owner < layout.nranks(), "owner {} of {s:?}", s.owner);
        let share_bytes = layout.count(s.owner) * row_bytes as u64;
        assert!(
            s.offset + s.len as u64 <= share_bytes,
            "{s:?} reads past the owner's {share_bytes} bytes"
        );
        assert!(
            s.dst_offset + s.len <= out.len(),
            "{s:?} writes past the output"
        );
        for k in 0..s.len {
            let local_byte = s.offset as usize + k;
            let row = layout.start(s.owner) + (local_byte / row_bytes) as u64;
            let dst = s.dst_offset + k;
            assert!(!written[dst], "byte {dst} written twice");
            written[dst] = true;
            out[dst] = byte_of(row, local_byte % row_bytes);
        }
    }
    for c in &plan.repeats {
        assert!(
            c.from < c.to,
            "a repeat copies from a later position: {c:?}"
        );
        assert!(c.to + c.len <= out.len() && c.len == row_bytes, "{c:?}");
        out.copy_within(c.from..c.from + c.len, c.to);
    }
    out
}

fn naive_read(rows: &[u64], row_bytes: usize) -> Vec<u8> {
    rows.iter()
        .flat_map(|&r| (0..row_bytes).map(move |b| byte_of(r, b)))
        .collect()
}

/// Row counts per rank: arbitrary, uniform (O(1) lookups), with empty shares.
fn counts_strategy() -> impl Strategy<Value = Vec<u64>> {
    prop_oneof![
        prop::collection::vec(0u64..20, 1..9),
        (1u64..15, 1usize..8, 0u64..15).prop_map(|(per, n, last)| {
            let mut c = vec![per; n];
            c.push(last.min(per));
            c
        }),
        prop::collection::vec(prop_oneof![Just(0u64), 1u64..4], 1..12),
    ]
}

proptest! {
    #![proptest_config(config(400))]

    #[test]
    fn validate_rows_matches_reference(
        rows in prop::collection::vec(prop_oneof![any::<i64>(), -3i64..40], 0..40),
        total in prop_oneof![0u64..40, any::<u64>()],
    ) {
        let got = validate_rows(&rows, total);
        let bad = rows.iter().position(|&r| r < 0 || r as u64 >= total);
        match (got, bad) {
            (Ok(v), None) => {
                let want: Vec<u64> = rows.iter().map(|&r| r as u64).collect();
                prop_assert_eq!(v, want);
            }
            (Err(e), Some(pos)) => {
                let msg = e.to_string();
                prop_assert!(msg.contains(&format!("position {pos}")), "{}", msg);
                prop_assert!(msg.contains(&rows[pos].to_string()), "{}", msg);
            }
            (got, bad) => prop_assert!(false, "validate_rows {:?} but first bad {:?}", got, bad),
        }
    }

    #[test]
    fn locate_matches_reference(counts in counts_strategy(), extra in 0u64..5) {
        let layout = Layout::new(&counts);
        prop_assert_eq!(layout.total(), counts.iter().sum::<u64>());
        prop_assert_eq!(layout.counts(), counts.clone());
        for row in 0..layout.total() + extra {
            prop_assert_eq!(layout.locate(row).ok(), naive_locate(&counts, row), "row {}", row);
        }
        prop_assert!(layout.locate(u64::MAX).is_err());
    }

    #[test]
    fn locate_on_huge_shares(
        counts in prop::collection::vec(0u64..(1 << 60), 1..8),
        probes in prop::collection::vec(any::<u64>(), 1..20),
    ) {
        let layout = Layout::new(&counts);
        for p in probes {
            let row = if layout.total() > 0 && p % 2 == 0 { p % layout.total() } else { p };
            prop_assert_eq!(layout.locate(row).ok(), naive_locate(&counts, row), "row {}", row);
        }
    }

    #[test]
    fn plan_reads_what_a_naive_loop_reads(
        counts in counts_strategy(),
        picks in prop::collection::vec(any::<u64>(), 0..48),
        run in any::<bool>(),
        row_bytes in prop_oneof![1usize..24, Just(4096usize)],
        max_read in prop_oneof![1usize..64, 64usize..10_000, Just(usize::MAX)],
        read_once_mask in any::<u8>(),
    ) {
        let layout = Layout::new(&counts);
        prop_assume!(layout.total() > 0);
        let total = layout.total();
        let rows: Vec<u64> = if run {
            // A contiguous run (the coalescing case), possibly across shares.
            let start = picks.first().copied().unwrap_or(0) % total;
            (start..(start + picks.len() as u64).min(total)).collect()
        } else {
            picks.iter().map(|p| p % total).collect()
        };
        let signed: Vec<i64> = rows.iter().map(|&r| r as i64).collect();
        prop_assert_eq!(validate_rows(&signed, total).unwrap(), rows.clone());
        let read_once = |owner: usize| read_once_mask & (1 << (owner % 8)) != 0;
        let plan = Plan::build(&layout, &signed, row_bytes, max_read, read_once).unwrap();
        for s in &plan.segments {
            prop_assert!(s.len > 0 && s.len <= max_read.max(1), "{:?}", s);
        }
        // Rows of read-once owners are read exactly once; others once per position.
        let mut distinct = std::collections::HashSet::new();
        let expected_bytes: usize = rows
            .iter()
            .filter(|&&r| {
                let (owner, _) = layout.locate(r).unwrap();
                !read_once(owner) || distinct.insert(r)
            })
            .count()
            * row_bytes;
        prop_assert_eq!(plan.bytes(), expected_bytes);
        prop_assert_eq!(execute(&layout, &plan, row_bytes, rows.len()), naive_read(&rows, row_bytes));
    }

    #[test]
    fn plan_rejects_rows_past_the_end(
        counts in counts_strategy(),
        past in 0u64..5,
    ) {
        let layout = Layout::new(&counts);
        let rows = [(layout.total() + past) as i64];
        prop_assert!(Plan::build(&layout, &rows, 8, 64, |_| true).is_err());
        prop_assert!(Plan::build(&layout, &[-1 - past as i64], 8, 64, |_| true).is_err());
    }
}
