//! Ragged variables end to end inside one process: threads play the ranks
//! (file communicator, node-only transport). Every read is checked against
//! what the owning rank stored, including empty rows and empty shares.

use std::sync::Arc;
use std::time::Duration;

use ddstore_core::file_comm::FileComm;
use ddstore_core::node_only::NodeOnlyTransport;
use ddstore_core::{Comm, Config, DType, Error, Store};
use rand::{Rng, SeedableRng};

const UNIT: usize = 6;

/// Length of global row r (0 for every fifth row).
fn length(r: u64) -> u64 {
    if r.is_multiple_of(5) {
        0
    } else {
        (r * 7) % 11 + 1
    }
}

fn byte(row: u64, unit: u64, b: usize) -> u8 {
    (row.wrapping_mul(37) + unit * 11 + b as u64 * 3) as u8
}

fn row_bytes(r: u64) -> Vec<u8> {
    (0..length(r))
        .flat_map(|u| (0..UNIT).map(move |b| byte(r, u, b)))
        .collect()
}

fn store_for(dir: &std::path::Path, rank: usize, n: usize) -> Store {
    let comm: Arc<dyn Comm> = Arc::new(
        FileComm::new(
            dir,
            Some(rank),
            Some(n),
            Some("ragged".into()),
            Duration::from_secs(30),
        )
        .unwrap(),
    );
    Store::new(comm, Arc::new(NodeOnlyTransport), Config::default())
}

#[test]
fn ragged_rows_in_any_order_with_repeats_empty_rows_and_empty_shares() {
    let dir = tempfile::tempdir().unwrap();
    let counts = [6u64, 0, 9, 4];
    let n = counts.len();
    let total: u64 = counts.iter().sum();
    let handles: Vec<_> = (0..n)
        .map(|rank| {
            let dir = dir.path().to_path_buf();
            std::thread::spawn(move || {
                let store = store_for(&dir, rank, n);
                let first: u64 = counts[..rank].iter().sum();
                let rows: Vec<u64> = (first..first + counts[rank]).collect();
                let lengths: Vec<u64> = rows.iter().map(|&r| length(r)).collect();
                let data: Vec<u8> = rows.iter().flat_map(|&r| row_bytes(r)).collect();
                store
                    .add_ragged("g", &lengths, UNIT, DType::Uint8, &data)
                    .unwrap();
                assert_eq!(store.names(), vec!["g".to_string()]);
                let info = store.ragged_info("g").unwrap();
                assert_eq!(info.rows.total(), total);
                let mut rng = rand::rngs::StdRng::seed_from_u64(rank as u64);
                for k in 0..60 {
                    let batch: Vec<i64> = match k {
                        0 => vec![],
                        1 => (0..total as i64).collect(),
                        2 => vec![0, 0, 5, 5, 0],
                        _ => (0..rng.gen_range(1..30))
                            .map(|_| rng.gen_range(0..total as i64))
                            .collect(),
                    };
                    let (values, offsets) = store.get_ragged("g", &batch).unwrap();
                    assert_eq!(offsets.len(), batch.len() + 1);
                    for (i, &r) in batch.iter().enumerate() {
                        let got =
                            &values[offsets[i] as usize * UNIT..offsets[i + 1] as usize * UNIT];
                        assert_eq!(got, &row_bytes(r as u64)[..], "row {r} in batch {k}");
                    }
                }
                // Consecutive rows: one read per owner (rows 4..12 span ranks 0 and 2).
                assert_eq!(
                    store
                        .plan_ragged("g", &(4..12).collect::<Vec<_>>())
                        .unwrap()
                        .reads(),
                    2
                );
                // Bad indices and sizes: named, nothing read, the store still works.
                let err = store.get_ragged("g", &[0, total as i64]).err().unwrap();
                assert!(matches!(err, Error::IndexOutOfRange(_)), "{err}");
                let batch = store.plan_ragged("g", &[2, 3]).unwrap();
                let mut short = vec![0u8; batch.bytes().saturating_sub(1)];
                assert!(matches!(
                    store.read_ragged(&batch, &mut short),
                    Err(Error::InvalidArgument(_))
                ));
                assert!(matches!(store.var("g"), Err(Error::WrongType(_))));
                assert!(store.profile("g").unwrap().calls > 0);
                store.comm().barrier().unwrap();
                store.free().unwrap();
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn a_bad_rank_fails_every_rank() {
    let dir = tempfile::tempdir().unwrap();
    let handles: Vec<_> = (0..2)
        .map(|rank| {
            let dir = dir.path().to_path_buf();
            std::thread::spawn(move || {
                let store = store_for(&dir, rank, 2);
                // Rank 1's lengths promise more bytes than it passes.
                let lengths = if rank == 1 { vec![1, 2] } else { vec![1] };
                let err = store
                    .add_ragged("g", &lengths, 4, DType::Float32, &[0u8; 4])
                    .unwrap_err()
                    .to_string();
                assert!(err.contains("rank 1") && err.contains("lengths"), "{err}");
                store.free().unwrap();
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn values_written_between_begin_and_finish_read_back_and_a_failed_fill_fails_every_rank() {
    let dir = tempfile::tempdir().unwrap();
    let counts = [5u64, 7, 0];
    let n = counts.len();
    let total: u64 = counts.iter().sum();
    let handles: Vec<_> = (0..n)
        .map(|rank| {
            let dir = dir.path().to_path_buf();
            std::thread::spawn(move || {
                let store = store_for(&dir, rank, n);
                let first: u64 = counts[..rank].iter().sum();
                let rows: Vec<u64> = (first..first + counts[rank]).collect();
                let lengths: Vec<u64> = rows.iter().map(|&r| length(r)).collect();
                let data: Vec<u8> = rows.iter().flat_map(|&r| row_bytes(r)).collect();
                // The values written in two pieces, the second first, between the two steps.
                let new = store
                    .begin_ragged("g", &lengths, UNIT, DType::Uint8, None, None)
                    .unwrap();
                let half = (data.len() / UNIT / 2) * UNIT;
                let part = new.values_part();
                store
                    .write_local(&part, (half / UNIT) as u64, &data[half..])
                    .unwrap();
                store.write_local(&part, 0, &data[..half]).unwrap();
                store.finish_ragged(new, None).unwrap();
                let all: Vec<i64> = (0..total as i64).rev().collect();
                let (values, offsets) = store.get_ragged("g", &all).unwrap();
                for (i, &r) in all.iter().enumerate() {
                    let got = &values[offsets[i] as usize * UNIT..offsets[i + 1] as usize * UNIT];
                    assert_eq!(got, &row_bytes(r as u64)[..], "row {r}");
                }
                // Rank 2 reports a failed fill: every rank fails, naming it; none hangs.
                let new = store
                    .begin_ragged("h", &lengths, UNIT, DType::Uint8, None, None)
                    .unwrap();
                let problem = (rank == 2).then(|| "the source is gone".to_string());
                let err = store.finish_ragged(new, problem).unwrap_err().to_string();
                assert!(
                    err.contains("rank 2") && err.contains("the source is gone"),
                    "{err}"
                );
                assert!(!store.is_ragged("h"));
                store.free().unwrap();
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}
