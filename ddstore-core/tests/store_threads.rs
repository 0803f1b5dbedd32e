//! Store end to end inside one process: threads play the ranks, joined by
//! the file communicator, reading through the node-only transport.

use std::sync::Arc;
use std::time::Duration;

use ddstore_core::file_comm::FileComm;
use ddstore_core::node_only::NodeOnlyTransport;
use ddstore_core::{Comm, Config, DType, Error, Store};
use rand::{Rng, SeedableRng};

fn value(row: u64, byte: usize) -> u8 {
    (row.wrapping_mul(131) as usize + byte * 7) as u8
}

#[test]
fn ranks_read_every_row_with_repeats_and_errors_do_not_poison() {
    let dir = tempfile::tempdir().unwrap();
    let counts = [5u64, 0, 7, 3];
    let n = counts.len();
    let row_bytes = 24;
    let handles: Vec<_> = (0..n)
        .map(|rank| {
            let dir = dir.path().to_path_buf();
            std::thread::spawn(move || {
                let comm: Arc<dyn Comm> = Arc::new(
                    FileComm::new(
                        &dir,
                        Some(rank),
                        Some(n),
                        Some("t".into()),
                        Duration::from_secs(20),
                    )
                    .unwrap(),
                );
                let store = Store::new(comm, Arc::new(NodeOnlyTransport), Config::default());
                store
                    .init("v", counts[rank], row_bytes, DType::Uint8)
                    .unwrap();
                let first: u64 = counts[..rank].iter().sum();
                let data: Vec<u8> = (0..counts[rank])
                    .flat_map(|r| (0..row_bytes).map(move |b| value(first + r, b)))
                    .collect();
                store.write_local("v", 0, &data).unwrap();
                store.comm().barrier().unwrap();
                let total: u64 = counts.iter().sum();
                let mut rng = rand::rngs::StdRng::seed_from_u64(rank as u64);
                for _ in 0..50 {
                    let rows: Vec<i64> = (0..rng.gen_range(1..40))
                        .map(|_| rng.gen_range(0..total as i64))
                        .collect();
                    let mut out = vec![0u8; rows.len() * row_bytes];
                    store.read_rows("v", &rows, &mut out).unwrap();
                    for (i, &r) in rows.iter().enumerate() {
                        for b in 0..row_bytes {
                            assert_eq!(out[i * row_bytes + b], value(r as u64, b), "row {r}");
                        }
                    }
                }
                let mut out = vec![0u8; 2 * row_bytes];
                assert!(matches!(
                    store.read_rows("v", &[0, total as i64], &mut out),
                    Err(Error::IndexOutOfRange(_))
                ));
                // A range spanning ranks 0 and 2 (rank 1 is empty): one copy per owner.
                store.get("v", 4, &mut out).unwrap();
                assert_eq!((out[0], out[row_bytes]), (value(4, 0), value(5, 0)));
                // Zero-length gets succeed anywhere inside (or at the end of) the variable.
                store.get("v", total as i64, &mut []).unwrap();
                assert!(store.get("v", total as i64 + 1, &mut []).is_err());
                store.get("v", 5, &mut out).unwrap();
                assert_eq!(out[0], value(5, 0));
                assert!(store.profile("v").unwrap().node_rows > 0 || rank == 2);
                store.comm().barrier().unwrap();
                store.free().unwrap();
                assert!(matches!(
                    store.read_rows("v", &[0], &mut out[..row_bytes]),
                    Err(Error::Freed)
                ));
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn populating_node_shares_maps_own_and_peer_shares_within_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    let (n, rows_a, rows_b) = (2usize, 3u64, 5u64);
    let row_bytes = 4096 + 8; // shares that do not end on a page
    let handles: Vec<_> = (0..n)
        .map(|rank| {
            let dir = dir.path().to_path_buf();
            std::thread::spawn(move || {
                let comm: Arc<dyn Comm> = Arc::new(
                    FileComm::new(
                        &dir,
                        Some(rank),
                        Some(n),
                        Some("p".into()),
                        Duration::from_secs(20),
                    )
                    .unwrap(),
                );
                let store = Store::new(comm, Arc::new(NodeOnlyTransport), Config::default());
                store.init("a", rows_a, row_bytes, DType::Uint8).unwrap();
                store.init("b", rows_b, row_bytes, DType::Uint8).unwrap();
                let (a, b) = (
                    n * rows_a as usize * row_bytes,
                    n * rows_b as usize * row_bytes,
                );
                let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
                let all = store
                    .populate_node_shares(&names(&["a", "b"]), usize::MAX)
                    .unwrap();
                if all != 0 {
                    // (0: a kernel without MADV_POPULATE_READ, which populates nothing.)
                    assert_eq!(all, a + b, "every rank's share of both, own and peer");
                    // A share that would pass the bound is left out: b's own share fits
                    // after a's two, b's peer share does not.
                    let bound = a + rows_b as usize * row_bytes;
                    let some = store
                        .populate_node_shares(&names(&["a", "b"]), bound)
                        .unwrap();
                    assert_eq!(some, bound);
                    let one_b = rows_b as usize * row_bytes;
                    assert_eq!(
                        store
                            .populate_node_shares(&names(&["b"]), one_b - 1)
                            .unwrap(),
                        0
                    );
                }
                assert!(matches!(
                    store.populate_node_shares(&names(&["c"]), usize::MAX),
                    Err(Error::UnknownVariable { .. })
                ));
                store.comm().barrier().unwrap();
                store.free().unwrap();
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}
