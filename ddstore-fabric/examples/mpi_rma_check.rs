//! Checks method 0 (MPI RMA) for real: run under `mpirun -n N`.
//!
//! Every rank fills its share (uneven sizes, some empty) with a pattern of
//! (rank, offset), then reads random ranges of every rank, from one thread
//! and from 4 threads at once, with node sharing on and off, and checks
//! every byte. Prints the time per row of 128 random 3 KB rows.
//! Exits non-zero on any mismatch or error.

use std::sync::Arc;
use std::time::Instant;

use ddstore_core::comm::Comm;
use ddstore_core::transport::{ExposeOptions, Exposed, RemoteRead, ShareReader, Transport};
use ddstore_fabric::mpi_rma::{self, MpiComm, MpiRma};
use rand::{rngs::StdRng, Rng, SeedableRng};

type CheckResult<T = ()> = Result<T, String>;

fn pattern(rank: usize, offset: usize) -> u8 {
    (offset.wrapping_mul(31) ^ (offset >> 9) ^ rank.wrapping_mul(101)) as u8
}

/// Uneven share sizes; every third rank (starting at rank 1) has none.
fn share_len(rank: usize) -> usize {
    if rank % 3 == 1 {
        0
    } else {
        50_000 + rank * 12_345
    }
}

fn expose(
    comm: &Arc<dyn Comm>,
    len: usize,
    node_sharing: bool,
    fill: bool,
) -> CheckResult<Exposed> {
    let opts = ExposeOptions {
        name: "check".into(),
        node_sharing,
        keep_address: false,
        lens: None,
    };
    let exposed = MpiRma::new()
        .expose(comm, len, &opts)
        .map_err(|e| format!("expose: {e}"))?;
    if exposed.local.len() != len {
        return Err(format!(
            "local share has {} bytes, expected {len}",
            exposed.local.len()
        ));
    }
    if fill {
        let data: Vec<u8> = (0..len).map(|o| pattern(comm.rank(), o)).collect();
        exposed
            .local
            .write_at(0, &data)
            .map_err(|e| format!("write_at: {e}"))?;
    }
    comm.barrier().map_err(|e| format!("barrier: {e}"))?;
    Ok(exposed)
}

fn random_reads(rng: &mut StdRng, size: usize, max_len: usize) -> (Vec<RemoteRead>, usize) {
    let mut reads = Vec::new();
    let mut dst_len = 0;
    for _ in 0..rng.gen_range(1..20) {
        let owner = rng.gen_range(0..size);
        let share = share_len(owner);
        let offset = rng.gen_range(0..=share);
        let len = rng.gen_range(0..=(share - offset).min(max_len));
        reads.push(RemoteRead {
            owner,
            offset: offset as u64,
            len,
            dst_offset: dst_len,
        });
        dst_len += len + rng.gen_range(0..3);
    }
    (reads, dst_len)
}

fn verify(reads: &[RemoteRead], dst: &[u8], who: &str) -> CheckResult {
    for r in reads {
        for i in 0..r.len {
            let want = pattern(r.owner, r.offset as usize + i);
            let got = dst[r.dst_offset + i];
            if got != want {
                return Err(format!(
                    "{who}: rank {} offset {}: got {got}, expected {want}",
                    r.owner,
                    r.offset as usize + i
                ));
            }
        }
    }
    Ok(())
}

fn read_batches(
    exposed: &Exposed,
    size: usize,
    seed: u64,
    batches: usize,
    who: &str,
) -> CheckResult {
    let mut reader = exposed
        .remote
        .open_reader()
        .map_err(|e| format!("{who}: open_reader: {e}"))?;
    let mut rng = StdRng::seed_from_u64(seed);
    for _ in 0..batches {
        let (reads, dst_len) = random_reads(&mut rng, size, 20_000);
        let mut dst = vec![0xAAu8; dst_len];
        reader
            .read_many(&reads, &mut dst)
            .map_err(|e| format!("{who}: read_many: {e}"))?;
        verify(&reads, &dst, who)?;
    }
    Ok(())
}

/// Same-node views (memcpy path) hold the owners' data, read-only; none
/// without node sharing.
fn check_node_views(
    exposed: &Exposed,
    rank: usize,
    size: usize,
    node_sharing: bool,
    mode: &str,
) -> CheckResult {
    let fake_nodes = std::env::var("DDSTORE_MPI_FAKE_NODE_SIZE").is_ok();
    for (peer, view) in exposed.node_peers.iter().enumerate() {
        match view {
            Some(view) => {
                let mut all = vec![0u8; view.len()];
                view.read_at(0, &mut all)
                    .map_err(|e| format!("node view {peer}: {e}"))?;
                let wanted: Vec<u8> = (0..share_len(peer)).map(|o| pattern(peer, o)).collect();
                if all != wanted {
                    return Err(format!(
                        "{mode}: node view of rank {peer} has wrong contents"
                    ));
                }
                if view.write_at(0, &[1]).is_ok() && !view.is_empty() {
                    return Err(format!("node view of rank {peer} is writable"));
                }
            }
            None if node_sharing && size > 1 && peer != rank && !fake_nodes => {
                return Err(format!(
                    "{mode}: rank {peer} on this node has no shared view"
                ));
            }
            None => {}
        }
    }
    if !node_sharing && exposed.node_peers.iter().any(Option::is_some) {
        return Err("node views offered with node sharing off".into());
    }
    Ok(())
}

/// Bad reads are refused before anything is posted.
fn check_bad_reads(reader: &mut dyn ShareReader, size: usize, mode: &str) -> CheckResult {
    let bad = [
        RemoteRead {
            owner: size,
            offset: 0,
            len: 1,
            dst_offset: 0,
        },
        RemoteRead {
            owner: 0,
            offset: share_len(0) as u64,
            len: 1,
            dst_offset: 0,
        },
        RemoteRead {
            owner: 0,
            offset: u64::MAX,
            len: 2,
            dst_offset: 0,
        },
        RemoteRead {
            owner: 0,
            offset: 0,
            len: 2,
            dst_offset: usize::MAX,
        },
        RemoteRead {
            owner: 0,
            offset: 0,
            len: 10,
            dst_offset: 5,
        },
    ];
    for b in bad {
        let mut small = [0u8; 10];
        if reader.read_many(&[b], &mut small).is_ok() {
            return Err(format!("{mode}: bad read {b:?} was accepted"));
        }
    }
    Ok(())
}

fn check_shares(comm: &Arc<dyn Comm>, node_sharing: bool) -> CheckResult {
    let (rank, size) = (comm.rank(), comm.size());
    let exposed = expose(comm, share_len(rank), node_sharing, true)?;
    let mode = if node_sharing {
        "node sharing"
    } else {
        "no node sharing"
    };

    check_node_views(&exposed, rank, size, node_sharing, mode)?;

    // Whole shares of every rank in one batch.
    let mut reads = Vec::new();
    let mut at = 0;
    for owner in 0..size {
        reads.push(RemoteRead {
            owner,
            offset: 0,
            len: share_len(owner),
            dst_offset: at,
        });
        at += share_len(owner);
    }
    let mut dst = vec![0u8; at];
    let mut reader = exposed
        .remote
        .open_reader()
        .map_err(|e| format!("open_reader: {e}"))?;
    reader
        .read_many(&reads, &mut dst)
        .map_err(|e| format!("{mode}: whole shares: {e}"))?;
    verify(&reads, &dst, mode)?;

    check_bad_reads(reader.as_mut(), size, mode)?;

    // Random ranges from this thread, then 4 threads with their own readers.
    read_batches(&exposed, size, 1000 + rank as u64, 200, mode)?;
    let results: Vec<CheckResult> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|t| {
                let exposed = &exposed;
                let who = format!("{mode}, thread {t}");
                s.spawn(move || read_batches(exposed, size, (rank * 10 + t) as u64, 100, &who))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("reader thread panicked".into()))
            })
            .collect()
    });
    results.into_iter().collect::<CheckResult<Vec<()>>>()?;

    // After fork (or forget_after_fork) reads are refused with a clear error.
    exposed
        .remote
        .forget_after_fork()
        .map_err(|e| e.to_string())?;
    match exposed.remote.open_reader() {
        Err(e) if e.to_string().contains("forked") => {}
        Err(e) => return Err(format!("unexpected error after fork: {e}")),
        Ok(_) => return Err("open_reader worked after forget_after_fork".into()),
    }
    if reader.read_many(&reads, &mut dst).is_ok() {
        return Err("read_many worked after forget_after_fork".into());
    }
    drop(reader);
    comm.barrier().map_err(|e| format!("barrier: {e}"))?;
    // As a store's free: the variable goes, then its shares close (a
    // collective MPI_Win_free) and report MPI's answer.
    let remote = exposed.remote.clone();
    drop(exposed);
    if Arc::strong_count(&remote) != 1 {
        return Err("the shares are still held after their variable went".into());
    }
    remote
        .close()
        .map_err(|e| format!("closing the shares (MPI_Win_free): {e}"))
}

/// Microseconds per row for 128 random 3 KB rows across all ranks.
fn time_rows(comm: &Arc<dyn Comm>, node_sharing: bool) -> CheckResult<f64> {
    const ROW: usize = 3072;
    const ROWS_PER_RANK: usize = 1024;
    const BATCH: usize = 128;
    const BATCHES: usize = 200;
    let (rank, size) = (comm.rank(), comm.size());
    let exposed = expose(comm, ROW * ROWS_PER_RANK, node_sharing, false)?;
    let mut reader = exposed
        .remote
        .open_reader()
        .map_err(|e| format!("open_reader: {e}"))?;
    let mut rng = StdRng::seed_from_u64(7 + rank as u64);
    let mut dst = vec![0u8; ROW * BATCH];
    let mut reads = Vec::with_capacity(BATCH);
    let start = Instant::now();
    for _ in 0..BATCHES {
        reads.clear();
        for i in 0..BATCH {
            let owner = rng.gen_range(0..size);
            let row = rng.gen_range(0..ROWS_PER_RANK);
            reads.push(RemoteRead {
                owner,
                offset: (row * ROW) as u64,
                len: ROW,
                dst_offset: i * ROW,
            });
        }
        reader
            .read_many(&reads, &mut dst)
            .map_err(|e| format!("timed read: {e}"))?;
    }
    let us = start.elapsed().as_secs_f64() * 1e6 / (BATCH * BATCHES) as f64;
    drop(reader);
    comm.barrier().map_err(|e| format!("barrier: {e}"))?;
    drop(exposed);
    Ok(us)
}

pub fn run() -> CheckResult {
    let comm: Arc<dyn Comm> =
        Arc::new(MpiComm::world().map_err(|e| format!("MPI_COMM_WORLD: {e}"))?);
    let level = mpi_rma::thread_level().map_err(|e| e.to_string())?;
    if comm.rank() == 0 {
        println!(
            "mpi_rma_check: {} ranks, thread level {}, {}",
            comm.size(),
            level.name(),
            mpi_rma::library_version().lines().next().unwrap_or("")
        );
    }
    // mpi4py hands communicators over as Fortran handles; in Open MPI
    // MPI_COMM_WORLD's is 0 and 2 is MPI_COMM_NULL.
    if mpi_rma::library_version().starts_with("Open MPI") {
        let dup = MpiComm::from_fortran(0).map_err(|e| format!("from_fortran(0): {e}"))?;
        if (dup.rank(), dup.size()) != (comm.rank(), comm.size()) {
            return Err(format!("from_fortran(0) gave {dup:?}"));
        }
        if MpiComm::from_fortran(2).is_ok() {
            return Err("from_fortran(MPI_COMM_NULL) was accepted".into());
        }
    }
    if MpiComm::from_fortran(i64::MAX).is_ok() {
        return Err("from_fortran(i64::MAX) was accepted".into());
    }
    // A split communicator works and is still an MPI communicator.
    let halves = comm
        .split(comm.rank() % 2, usize::MAX - comm.rank())
        .map_err(|e| e.to_string())?;
    let gathered = halves
        .allgather(&[comm.rank() as u8])
        .map_err(|e| e.to_string())?;
    let mut expected: Vec<Vec<u8>> = (0..comm.size())
        .filter(|r| r % 2 == comm.rank() % 2)
        .map(|r| vec![r as u8])
        .collect();
    expected.reverse();
    if gathered != expected || halves.kind() != ddstore_core::kinds::CommKind::Mpi {
        return Err(format!(
            "split by parity with reversed keys gathered {gathered:?}"
        ));
    }
    drop(halves);
    // Explicit frees report MPI's answer (a drop can only log it).
    let dup = MpiComm::world().map_err(|e| e.to_string())?;
    let node = dup.split_node().map_err(|e| e.to_string())?;
    node.close()
        .map_err(|e| format!("MPI_Comm_free of a node communicator: {e}"))?;
    dup.close()
        .map_err(|e| format!("MPI_Comm_free of a duplicate: {e}"))?;

    for node_sharing in [true, false] {
        check_shares(&comm, node_sharing)?;
    }
    for node_sharing in [true, false] {
        let us = time_rows(&comm, node_sharing)?;
        println!(
            "rank {}: {us:.2} us/row (128 random 3 KB rows over {} ranks, MPI_Get, node sharing {})",
            comm.rank(),
            comm.size(),
            if node_sharing { "on" } else { "off" }
        );
    }
    comm.barrier().map_err(|e| e.to_string())?;
    if comm.rank() == 0 {
        println!("mpi_rma_check: all checks passed");
    }
    drop(comm);
    mpi_rma::finalize_if_ours().map_err(|e| e.to_string())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("mpi_rma_check FAILED: {e}");
        // Exiting without MPI_Finalize makes mpirun stop the other ranks.
        std::process::exit(1);
    }
}
