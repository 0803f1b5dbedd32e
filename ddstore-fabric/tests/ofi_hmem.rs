//! External (caller-owned) shares over real providers on loopback: host
//! memory registered with `fi_mr_regattr` as `FI_HMEM_SYSTEM`, the code path
//! GPU shares take. The binary re-executes itself as ranks (`hmem_rank`)
//! that build a Store over OfiTransport and check every byte read.

mod ofi_support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ddstore_core::comm::Comm;
use ddstore_core::config::Config;
use ddstore_core::external::{ExternalShare, HmemIface};
use ddstore_core::store::OwnRows;
use ddstore_core::{DType, Store};
use ddstore_fabric::ofi::OfiTransport;
use ofi_support::{launch, pattern};

static SERIAL: Mutex<()> = Mutex::new(());

const ROW: usize = 24;

fn rows_of(rank: usize) -> usize {
    [50, 0, 130, 7][rank % 4]
}

fn run(size: usize, fabric: &str, extra: &[(&str, &str)]) -> Vec<bool> {
    let _guard = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut env: Vec<(&str, String)> = vec![
        ("DDSTORE_FABRIC", fabric.to_string()),
        ("DDSTORE_TIMEOUT_S", "20".to_string()),
        ("DDSTORE_MAX_READ_BYTES", "256".to_string()),
    ];
    if fabric != "shm" {
        env.push(("FABRIC_IFACE", "lo".to_string()));
    }
    env.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
    launch(
        &std::env::current_exe().unwrap(),
        &["--exact", "hmem_rank", "--nocapture", "--test-threads=1"],
        size,
        &env,
        Duration::from_secs(120),
    )
}

#[test]
fn system_memory_share_tcp_four_ranks() {
    assert_eq!(run(4, "tcp", &[]), vec![true; 4]);
}

/// shm offers FI_HMEM: the share goes through a domain opened with it.
#[test]
fn system_memory_share_shm_hmem_domain() {
    assert_eq!(run(2, "shm", &[("DDSTORE_OFI_HMEM", "1")]), vec![true; 2]);
}

/// tcp;ofi_rxm lacks FI_HMEM (libfabric 1.17): every rank gets a clear error.
#[test]
fn provider_without_hmem_is_refused_clearly() {
    let expect = [("DDSTORE_OFI_HMEM", "1"), ("DDFI_EXPECT_NO_HMEM", "1")];
    assert_eq!(run(2, "tcp", &expect), vec![true; 2]);
}

/// The rank process: does nothing unless started by `run`.
#[test]
fn hmem_rank() {
    let Some(comm) = ofi_support::comm_from_env() else {
        return;
    };
    let rank = comm.rank();
    let size = comm.size();
    let config = Config::from_env().unwrap();
    let transport = Arc::new(OfiTransport::from_env(&config, None, rank).unwrap());
    let dyn_comm: Arc<dyn Comm> = comm.clone();
    let store = Store::new(dyn_comm, transport, config);

    let n = rows_of(rank);
    let mut data: Vec<u8> = (0..(n * ROW) as u64).map(|o| pattern(3, rank, o)).collect();
    let ptr = data.as_mut_ptr();
    let owner = Arc::new(Mutex::new(data));
    // SAFETY: the vector is never resized and lives in `owner`, which the share holds.
    let share = unsafe { ExternalShare::new(ptr, n * ROW, HmemIface::System, 0, owner) };
    let made = store.init_external("ext", n as u64, ROW, DType::Bytes, share);
    if std::env::var("DDFI_EXPECT_NO_HMEM").is_ok() {
        let err = made.unwrap_err().to_string();
        assert!(
            err.contains("FI_HMEM") && err.contains("add_device"),
            "{err}"
        );
        return;
    }
    made.unwrap();
    comm.barrier().unwrap();

    let counts: Vec<usize> = (0..size).map(rows_of).collect();
    let total: usize = counts.iter().sum();
    let first: usize = counts[..rank].iter().sum();
    let owner_of = |row: usize| {
        let mut start = 0;
        for (r, &c) in counts.iter().enumerate() {
            if row < start + c {
                return (r, row - start);
            }
            start += c;
        }
        unreachable!()
    };
    // Every row, backwards, with repeats.
    let rows: Vec<i64> = (0..total)
        .rev()
        .chain([first.min(total - 1), first.min(total - 1), total - 1])
        .map(|r| r as i64)
        .collect();
    for own in [OwnRows::Copy, OwnRows::Skip, OwnRows::Transport] {
        let mut out = vec![0xEEu8; rows.len() * ROW];
        store.read_rows_with("ext", &rows, &mut out, own).unwrap();
        for (i, &row) in rows.iter().enumerate() {
            let (r, local) = owner_of(row as usize);
            let got = &out[i * ROW..(i + 1) * ROW];
            if r == rank && own == OwnRows::Skip {
                assert!(
                    got.iter().all(|&b| b == 0xEE),
                    "{own:?}: own row {row} touched"
                );
                continue;
            }
            for (b, &v) in got.iter().enumerate() {
                let want = pattern(3, r, (local * ROW + b) as u64);
                assert_eq!(v, want, "{own:?}: row {row} byte {b}");
            }
        }
    }
    let p = store.profile("ext").unwrap();
    assert!(p.remote_rows > 0);
    store.free().unwrap();
}
