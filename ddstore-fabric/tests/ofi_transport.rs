//! OfiTransport over real providers on loopback: the test binary re-executes
//! itself as N ranks (test `rank_worker`) that exchange descriptors through
//! files, expose uneven shares, and read them from threads, through
//! registered buffers and from a forked child, verifying every byte.

mod ofi_support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ddstore_core::comm::Comm;
use ddstore_core::config::Config;
use ddstore_core::transport::{
    ExposeOptions, RaggedRequest, RemoteRead, RemoteShares, ShareReader, Transport,
};
use ddstore_fabric::ofi::{usable_providers, OfiTransport};
use ofi_support::{fill, launch, pattern, FileComm};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Rank processes share two cores with everything else: one scenario at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn run_ranks(scenario: &str, size: usize, fabric: &str, extra: &[(&str, &str)]) -> Vec<bool> {
    let _guard = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let exe = std::env::current_exe().unwrap();
    let mut env: Vec<(&str, String)> = vec![
        ("DDFI_SCENARIO", scenario.to_string()),
        ("DDSTORE_FABRIC", fabric.to_string()),
        ("DDSTORE_MAX_READ_BYTES", "4096".to_string()),
        ("DDSTORE_MAX_INFLIGHT", "16".to_string()),
        ("DDSTORE_TIMEOUT_S", "20".to_string()),
    ];
    if fabric != "shm" {
        env.push(("FABRIC_IFACE", "lo".to_string()));
    }
    env.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
    launch(
        &exe,
        &["--exact", "rank_worker", "--nocapture", "--test-threads=1"],
        size,
        &env,
        Duration::from_secs(150),
    )
}

#[test]
fn tcp_rxm_two_ranks() {
    assert_eq!(run_ranks("full", 2, "tcp", &[]), vec![true; 2]);
}

#[test]
fn tcp_rxm_four_ranks() {
    assert_eq!(run_ranks("full", 4, "tcp", &[]), vec![true; 4]);
}

#[test]
fn tcp_rxm_default_interface() {
    assert_eq!(
        run_ranks("full", 2, "tcp", &[("FABRIC_IFACE", "")]),
        vec![true; 2]
    );
}

/// Local descriptors for every destination, as cxi and verbs require.
#[test]
fn tcp_rxm_local_descriptors() {
    assert_eq!(
        run_ranks("full", 2, "tcp", &[("DDSTORE_OFI_LOCAL_MR", "1")]),
        vec![true; 2]
    );
}

#[test]
fn shm_two_ranks() {
    assert_eq!(run_ranks("full", 2, "shm", &[]), vec![true; 2]);
}

#[test]
fn sockets_two_ranks() {
    assert_eq!(run_ranks("full", 2, "sockets", &[]), vec![true; 2]);
}

#[test]
fn stopped_or_dead_peer_times_out() {
    let ok = run_ranks("stopped-peer", 2, "tcp", &[("DDSTORE_TIMEOUT_S", "2")]);
    assert!(ok[0], "rank 0 did not see a timeout as expected");
}

/// Ragged rows in one round trip per owner over the gather path: every row
/// checked, replies split over several messages and requests, and requests
/// a hostile reader could send (unknown key, row past the share, a bound the
/// rows exceed, an owner's corrupt ends) refused, the reader still usable.
#[test]
fn tcp_ragged_gather() {
    let ok = run_ranks(
        "ragged-gather",
        2,
        "tcp",
        &[
            ("DDSTORE_REMOTE_GATHER", "1"),
            ("DDSTORE_MAX_INFLIGHT", "4"),
        ],
    );
    assert_eq!(ok, vec![true; 2]);
}

#[test]
fn lists_providers_and_rejects_unknown_fabric() {
    let providers = usable_providers();
    assert!(
        providers.iter().any(|p| p.provider == "tcp;ofi_rxm"),
        "{providers:?}"
    );
    let shm = providers
        .iter()
        .find(|p| p.provider == "shm")
        .expect("shm listed");
    assert!(shm.mr_mode_names.contains(&"FI_MR_VIRT_ADDR") && shm.manual_progress);
    let config = Config {
        fabric: Some("infiniband".into()),
        ..Config::default()
    };
    let err = OfiTransport::from_lookup(&config, None, 0, |_| None)
        .err()
        .unwrap();
    assert!(err.to_string().contains("DDSTORE_FABRIC"), "{err}");
    assert!(!ddstore_fabric::ofi::libfabric_version().is_empty());
}

/// The rank process: does nothing unless started by `run_ranks`.
#[test]
fn rank_worker() {
    let Some(comm) = ofi_support::comm_from_env() else {
        return;
    };
    match std::env::var("DDFI_SCENARIO").as_deref() {
        Ok("full") => full(comm),
        Ok("stopped-peer") => stopped_peer(comm),
        Ok("ragged-gather") => ragged_gather(comm),
        other => panic!("unknown scenario {other:?}"),
    }
}

fn share_len(rank: usize) -> usize {
    [40_000, 0, 130_003, 7_777][rank % 4]
}

fn verify(reads: &[RemoteRead], dst: &[u8], var: u8, what: &str) {
    for r in reads {
        for i in 0..r.len {
            let want = pattern(var, r.owner, r.offset + i as u64);
            let got = dst[r.dst_offset + i];
            assert_eq!(
                got, want,
                "{what}: rank {} offset {} byte {i}",
                r.owner, r.offset
            );
        }
    }
}

/// A batch of random reads with repeats, packed into a destination.
fn random_batch(rng: &mut StdRng, lens: &[usize]) -> (Vec<RemoteRead>, usize) {
    let owners: Vec<usize> = (0..lens.len()).filter(|&r| lens[r] > 0).collect();
    let mut reads: Vec<RemoteRead> = Vec::new();
    let mut dst_len = 0;
    for _ in 0..rng.gen_range(1..40) {
        if !reads.is_empty() && rng.gen_bool(0.3) {
            let again = reads[rng.gen_range(0..reads.len())];
            reads.push(RemoteRead {
                dst_offset: dst_len,
                ..again
            });
            dst_len += again.len;
            continue;
        }
        let owner = owners[rng.gen_range(0..owners.len())];
        let max = [1usize, 3000, 20_000][rng.gen_range(0..3)].min(lens[owner]);
        let len = rng.gen_range(1..=max);
        let offset = rng.gen_range(0..=(lens[owner] - len)) as u64;
        reads.push(RemoteRead {
            owner,
            offset,
            len,
            dst_offset: dst_len,
        });
        dst_len += len;
    }
    (reads, dst_len)
}

fn full(comm: Arc<FileComm>) {
    let rank = comm.rank();
    let size = comm.size();
    let config = Config::from_env().unwrap();
    let transport = OfiTransport::from_env(&config, None, rank).unwrap();
    // The job's secret, as a method-2 core job's token (a joining job presents it).
    transport.set_secret(b"ofi_transport test token");
    let dyn_comm: Arc<dyn Comm> = comm.clone();
    let lens: Vec<usize> = (0..size).map(share_len).collect();

    let opts = ExposeOptions {
        name: "v1".into(),
        node_sharing: false,
        keep_address: false,
        lens: None,
    };
    let v1 = transport.expose(&dyn_comm, lens[rank], &opts).unwrap();
    v1.local.write_at(0, &fill(1, rank, lens[rank])).unwrap();
    assert_eq!(v1.records.len(), size);
    assert!(v1.node_peers.iter().all(Option::is_none));

    // A second variable in shared memory: same-node peers get mappings.
    let len2 = 10_000 + 1000 * rank;
    let opts2 = ExposeOptions {
        name: "v2/shared".into(),
        node_sharing: true,
        keep_address: false,
        lens: None,
    };
    let v2 = transport.expose(&dyn_comm, len2, &opts2).unwrap();
    v2.local.write_at(0, &fill(2, rank, len2)).unwrap();
    comm.barrier().unwrap();

    for (peer, view) in v2.node_peers.iter().enumerate() {
        if peer == rank {
            continue;
        }
        let view = view.as_ref().expect("same-node peer mapped");
        let mut got = vec![0u8; 10_000 + 1000 * peer];
        view.read_at(0, &mut got).unwrap();
        assert!(
            got == fill(2, peer, got.len()),
            "node mapping of rank {peer}"
        );
    }
    let mut reader2 = v2.remote.open_reader().unwrap();
    let reads: Vec<RemoteRead> = (0..size)
        .map(|p| RemoteRead {
            owner: p,
            offset: 0,
            len: 10_000 + 1000 * p,
            dst_offset: 14_000 * p,
        })
        .collect();
    let mut dst = vec![0u8; 14_000 * size];
    reader2.read_many(&reads, &mut dst).unwrap();
    verify(&reads, &dst, 2, "v2 whole shares");

    let shares: Arc<dyn RemoteShares> = v1.remote.clone();
    read_from_threads(&shares, &lens, rank);

    bad_and_registered_reads(&shares, &lens, rank);

    // Method 2: another transport instance (its own fabric, domain and
    // endpoints, as in a job that joins) attaches to the published records.
    let joiner = OfiTransport::from_env(&config, None, rank).unwrap();
    joiner.set_secret(b"ofi_transport test token");
    let attached = joiner.attach(&v1.records).unwrap();
    let mut reader = attached.open_reader().unwrap();
    let mut rng = StdRng::seed_from_u64(5 + rank as u64);
    for _ in 0..5 {
        let (reads, n) = random_batch(&mut rng, &lens);
        let mut dst = vec![0u8; n];
        reader.read_many(&reads, &mut dst).unwrap();
        verify(&reads, &dst, 1, "attached from records");
    }
    drop(reader);
    // A store's free: the attached shares, then the joining transport's
    // objects close in order and report success.
    attached.close().unwrap();
    joiner.close().unwrap();
    let mut garbled = v1.records.clone();
    garbled[0][0] ^= 0xff;
    assert!(transport.attach(&garbled).is_err());

    if rank == 0 {
        forked_child_reads(&shares, &lens);
    }
    comm.barrier().unwrap();
    drop(reader2);
    drop(shares);
    // As a store's free: the variables go, their shares close (the shares'
    // registrations), then the transport's node (endpoints, domain, fabric).
    let remotes = [v1.remote.clone(), v2.remote.clone()];
    drop(v1);
    drop(v2);
    for remote in remotes {
        assert_eq!(Arc::strong_count(&remote), 1, "the shares are still held");
        remote.close().unwrap();
    }
    comm.barrier().unwrap();
    transport.close().unwrap();
}

/// Four reading threads with their own readers: random batches, then every share whole.
fn read_from_threads(shares: &Arc<dyn RemoteShares>, lens: &[usize], rank: usize) {
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let shares = shares.clone();
            let lens = lens.to_vec();
            s.spawn(move || {
                let mut reader = shares.open_reader().unwrap();
                let mut rng = StdRng::seed_from_u64(rank as u64 * 1000 + t);
                for _ in 0..25 {
                    let (reads, n) = random_batch(&mut rng, &lens);
                    let mut dst = vec![0u8; n];
                    reader.read_many(&reads, &mut dst).unwrap();
                    verify(&reads, &dst, 1, "random batch");
                }
                // Every share whole: wider than DDSTORE_MAX_READ_BYTES, which only
                // the store's planner applies; the reader posts each as one fi_read.
                let whole: Vec<RemoteRead> = (0..lens.len())
                    .scan(0, |at, p| {
                        let r = RemoteRead {
                            owner: p,
                            offset: 0,
                            len: lens[p],
                            dst_offset: *at,
                        };
                        *at += lens[p];
                        Some(r)
                    })
                    .collect();
                let mut dst = vec![0u8; lens.iter().sum()];
                reader.read_many(&whole, &mut dst).unwrap();
                verify(&whole, &dst, 1, "whole shares");
            });
        }
    });
}

/// Bad reads are refused before anything moves and the reader stays
/// usable; reads land in a registered destination, before and after it is
/// unregistered.
fn bad_and_registered_reads(shares: &Arc<dyn RemoteShares>, lens: &[usize], rank: usize) {
    let size = lens.len();
    let mut reader = shares.open_reader().unwrap();
    let beyond = RemoteRead {
        owner: 0,
        offset: lens[0] as u64,
        len: 1,
        dst_offset: 0,
    };
    assert!(reader.read_many(&[beyond], &mut [0u8; 1]).is_err());
    let no_rank = RemoteRead {
        owner: size,
        offset: 0,
        len: 1,
        dst_offset: 0,
    };
    assert!(reader.read_many(&[no_rank], &mut [0u8; 1]).is_err());
    let empty_owner = RemoteRead {
        owner: 1,
        offset: 0,
        len: 0,
        dst_offset: 0,
    };
    reader.read_many(&[empty_owner], &mut []).unwrap();

    // A registered destination: reads land in sub-slices of it.
    let mut big = vec![0u8; 1 << 20];
    shares
        .register_dst(big.as_ptr() as usize, big.len())
        .unwrap();
    let mut rng = StdRng::seed_from_u64(99 + rank as u64);
    for round in 0..10 {
        let (reads, n) = random_batch(&mut rng, lens);
        let at = round * 4096;
        reader.read_many(&reads, &mut big[at..at + n]).unwrap();
        verify(&reads, &big[at..at + n], 1, "registered destination");
    }
    shares
        .unregister_dst(big.as_ptr() as usize, big.len())
        .unwrap();
    assert!(shares
        .unregister_dst(big.as_ptr() as usize, big.len())
        .is_err());
    let (reads, n) = random_batch(&mut rng, lens);
    reader.read_many(&reads, &mut big[..n]).unwrap();
    verify(&reads, &big[..n], 1, "after unregister");
    drop(reader);
}

/// A forked child abandons the inherited objects and reads through fresh ones.
fn forked_child_reads(shares: &Arc<dyn RemoteShares>, lens: &[usize]) {
    // SAFETY: the reader threads have joined; the child only uses the
    // transport (fresh fabric objects) and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            shares.forget_after_fork().unwrap();
            let mut reader = shares.open_reader().unwrap();
            let mut rng = StdRng::seed_from_u64(7);
            for _ in 0..10 {
                let (reads, n) = random_batch(&mut rng, lens);
                let mut dst = vec![0u8; n];
                reader.read_many(&reads, &mut dst).unwrap();
                verify(&reads, &dst, 1, "forked child");
            }
        }))
        .is_ok();
        // SAFETY: leave without running the parent's atexit handlers or destructors.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let start = Instant::now();
    let mut status = 0;
    loop {
        // SAFETY: pid is our child; status is a valid out-pointer.
        let done = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if done == pid {
            break;
        }
        if start.elapsed() > Duration::from_secs(60) {
            // SAFETY: pid is our child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("forked reader hung");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "forked reader failed"
    );
}

/// Rank 1 stops (SIGSTOP) after a first successful read: rank 0's posted
/// read must time out and break that reader, a fresh reader (which cannot
/// even connect) must time out too, and once rank 1 is killed reads must
/// still fail rather than hang.
fn stopped_peer(comm: Arc<FileComm>) {
    let rank = comm.rank();
    let config = Config::from_env().unwrap();
    let transport = OfiTransport::from_env(&config, None, rank).unwrap();
    let dyn_comm: Arc<dyn Comm> = comm.clone();
    let opts = ExposeOptions {
        name: "v".into(),
        node_sharing: false,
        keep_address: false,
        lens: None,
    };
    let v = transport.expose(&dyn_comm, 8192, &opts).unwrap();
    v.local.write_at(0, &fill(1, rank, 8192)).unwrap();
    let pids = comm.allgather(&std::process::id().to_le_bytes()).unwrap();
    let read = RemoteRead {
        owner: 1,
        offset: 0,
        len: 8192,
        dst_offset: 0,
    };
    let mut dst = vec![0u8; 8192];
    let mut connected = v.remote.open_reader().unwrap();
    if rank == 0 {
        connected.read_many(&[read], &mut dst).unwrap();
        verify(&[read], &dst, 1, "before the peer stopped");
    }
    comm.barrier().unwrap();
    if rank == 1 {
        // SAFETY: stopping ourselves; rank 0 kills us later.
        unsafe { libc::raise(libc::SIGSTOP) };
        std::process::exit(3);
    }
    std::thread::sleep(Duration::from_millis(300));

    let start = Instant::now();
    let err = connected.read_many(&[read], &mut dst).unwrap_err();
    let waited = start.elapsed();
    eprintln!("stopped peer, connected reader: {err} after {waited:?}");
    assert!(
        matches!(err, ddstore_core::Error::Timeout { peer: 1, .. }),
        "{err}"
    );
    assert!(waited < Duration::from_secs(10));
    let again = connected.read_many(&[read], &mut dst).unwrap_err();
    assert!(
        again.to_string().contains("unusable"),
        "a broken reader was reused: {again}"
    );
    drop(dst); // the caller may free the destination after a timeout

    let mut fresh = v.remote.open_reader().unwrap();
    let mut dst = vec![0u8; 8192];
    let start = Instant::now();
    let err = fresh.read_many(&[read], &mut dst).unwrap_err();
    eprintln!(
        "stopped peer, new reader: {err} after {:?}",
        start.elapsed()
    );
    assert!(
        matches!(err, ddstore_core::Error::Timeout { peer: 1, .. }),
        "{err}"
    );
    assert!(start.elapsed() < Duration::from_secs(10));

    let pid1 = i32::from_le_bytes(pids[1].as_slice().try_into().unwrap());
    // SAFETY: pid1 is rank 1, our sibling test process.
    unsafe { libc::kill(pid1, libc::SIGKILL) };
    std::thread::sleep(Duration::from_millis(200));
    let mut reader = v.remote.open_reader().unwrap();
    let start = Instant::now();
    let err = reader.read_many(&[read], &mut dst).unwrap_err();
    eprintln!("dead peer: {err} after {:?}", start.elapsed());
    assert!(start.elapsed() < Duration::from_secs(10));
    // Our own share is still readable through a fresh reader.
    let own = RemoteRead {
        owner: 0,
        offset: 0,
        len: 8192,
        dst_offset: 0,
    };
    let mut reader = v.remote.open_reader().unwrap();
    reader.read_many(&[own], &mut dst).unwrap();
    verify(&[own], &dst, 1, "own share after peer death");
}

/// Units (3 bytes each) of ragged row `row` of rank `rank`: 0 for every fifth.
fn ragged_len(rank: usize, row: u64) -> u64 {
    if row.is_multiple_of(5) {
        0
    } else {
        (row * 7 + rank as u64) % 40 + 1
    }
}

const RAGGED_ROWS: u64 = 300;
const UNIT: usize = 3;

/// Reads `rows` of rank 1 through the ragged gather and checks every byte.
fn check_ragged_rows(
    reader: &mut dyn ShareReader,
    ends_key: u64,
    max_row_bytes: u64,
    rows: &[u64],
) {
    let req = RaggedRequest {
        owner: 1,
        ends_key,
        rows,
        max_row_bytes,
    };
    let got = reader
        .read_ragged_rows(UNIT, &[req], vec![0xee; 1000]) // a reused buffer: junk replaced
        .unwrap()
        .expect("gathered");
    assert_eq!(got.rows.len(), 1);
    assert_eq!(got.rows[0].len(), rows.len());
    for (&row, &(units, at)) in rows.iter().zip(&got.rows[0]) {
        assert_eq!(units, ragged_len(1, row), "row {row}");
        let start: u64 = (0..row).map(|r| ragged_len(1, r)).sum();
        for k in 0..units as usize * UNIT {
            let want = pattern(7, 1, start * UNIT as u64 + k as u64);
            assert_eq!(got.data[at + k], want, "row {row} byte {k}");
        }
    }
}

/// A ragged gather of rank 1's `rows` that rank 1 refuses (`why`).
fn assert_ragged_refused(
    reader: &mut dyn ShareReader,
    ends_key: u64,
    rows: &[u64],
    max_row_bytes: u64,
    why: &str,
) {
    let req = RaggedRequest {
        owner: 1,
        ends_key,
        rows,
        max_row_bytes,
    };
    let err = match reader.read_ragged_rows(UNIT, &[req], Vec::new()) {
        Err(err) => err,
        Ok(_) => panic!("{why}: served, expected a refusal"),
    };
    let msg = err.to_string();
    assert!(msg.contains("rank 1 refused"), "{why}: {msg}");
    eprintln!("{why}: {msg}");
}

fn ragged_gather(comm: Arc<FileComm>) {
    let rank = comm.rank();
    let config = Config::from_env().unwrap();
    let transport = OfiTransport::from_env(&config, None, rank).unwrap();
    assert_eq!(transport.remote_path(), "gather");
    let dyn_comm: Arc<dyn Comm> = comm.clone();
    // Rank 1 holds the rows; rank 0 an empty share of both parts.
    let rows = if rank == 1 { RAGGED_ROWS } else { 0 };
    let mut ends = Vec::new();
    let mut end = 0u64;
    for r in 0..rows {
        end += ragged_len(rank, r);
        ends.extend_from_slice(&end.to_le_bytes());
    }
    if rank == 1 {
        // Row 299's end before its start: the owner's own data is corrupt there.
        let at = 298 * 8;
        ends[at..at + 8].copy_from_slice(&(end + 5).to_le_bytes());
    }
    let values = fill(7, rank, end as usize * UNIT);
    let expose = |name: &str, len: usize| {
        let opts = ExposeOptions {
            name: name.into(),
            node_sharing: false,
            keep_address: false,
            lens: None,
        };
        transport.expose(&dyn_comm, len, &opts).unwrap()
    };
    let v = expose("r#values", values.len());
    let e = expose("r#ends", ends.len());
    v.local.write_at(0, &values).unwrap();
    e.local.write_at(0, &ends).unwrap();
    comm.barrier().unwrap();
    if rank == 0 {
        let ends_key = e
            .remote
            .gather_key(1)
            .expect("rank 1 serves the gather path");
        assert!(v.remote.gather_key(1).is_some());
        let max_row_bytes = 40 * UNIT as u64;
        let mut reader = v.remote.open_reader().unwrap();
        // Any order, repeats, zero-length rows; 298 rows of up to 120 B: with 4 KiB
        // messages and a 4-deep window, several messages and several requests.
        check_ragged_rows(
            reader.as_mut(),
            ends_key,
            max_row_bytes,
            &[3, 0, 5, 17, 3, 1],
        );
        check_ragged_rows(reader.as_mut(), ends_key, max_row_bytes, &[0, 5, 10]);
        let all: Vec<u64> = (0..298).rev().collect();
        check_ragged_rows(reader.as_mut(), ends_key, max_row_bytes, &all);
        assert_ragged_refused(
            reader.as_mut(),
            ends_key ^ 0x5a5a_0000,
            &[1, 2],
            max_row_bytes,
            "unknown key",
        );
        assert_ragged_refused(
            reader.as_mut(),
            ends_key,
            &[1, RAGGED_ROWS],
            max_row_bytes,
            "row past the share",
        );
        assert_ragged_refused(
            reader.as_mut(),
            ends_key,
            &[1, u64::MAX / 8],
            max_row_bytes,
            "row overflowing",
        );
        assert_ragged_refused(
            reader.as_mut(),
            ends_key,
            &[299],
            max_row_bytes,
            "corrupt ends",
        );
        assert_ragged_refused(
            reader.as_mut(),
            ends_key,
            &[1, 2, 3],
            1,
            "rows longer than the bound",
        );
        // The values key as the ends key: the owner reads its values as ends.
        // Whatever it finds, the ranges are checked against the values share.
        let req = RaggedRequest {
            owner: 1,
            ends_key: v.remote.gather_key(1).unwrap(),
            rows: &[1],
            max_row_bytes,
        };
        if let Ok(Some(got)) = reader.read_ragged_rows(UNIT, &[req], Vec::new()) {
            assert!(got.rows[0][0].0 * UNIT as u64 <= max_row_bytes);
        }
        // Refusals leave the reader usable.
        check_ragged_rows(reader.as_mut(), ends_key, max_row_bytes, &[9, 8, 7]);
    }
    comm.barrier().unwrap();
    println!("rank {rank} ragged-gather ok");
}
