//! Smoke test of OfiTransport on a real system: every rank exposes a share,
//! then reads every other rank's share whole and at random from two threads,
//! verifying every byte.
//!
//! Run one process per rank with a fresh directory all ranks can see:
//!   srun -n 4 target/release/examples/ofi_check /shared/scratch/ofi-check-$SLURM_JOB_ID
//! Rank and size come from DDFI_RANK/DDFI_SIZE, else the launcher
//! (`ddstore_core::launcher`: srun, mpirun, torchrun, ...); the provider
//! from DDSTORE_FABRIC / FABRIC_IFACE / DDSTORE_NIC_MAP as in pyddstore.
//! `ofi_check --list` prints the providers usable for one-sided reads.

#[path = "../tests/ofi_support/mod.rs"]
mod ofi_support;

use std::sync::Arc;
use std::time::Instant;

use ddstore_core::comm::Comm;
use ddstore_core::config::Config;
use ddstore_core::launcher;
use ddstore_core::transport::{ExposeOptions, RemoteRead, Transport};
use ddstore_fabric::ofi::{libfabric_version, usable_providers, OfiTransport};
use ofi_support::{fill, pattern};
use rand::{Rng, SeedableRng};

const SHARE: usize = 8 << 20;

fn env_pair(rank: &str, size: &str) -> Option<(usize, usize)> {
    Some((
        std::env::var(rank).ok()?.parse().ok()?,
        std::env::var(size).ok()?.parse().ok()?,
    ))
}

fn main() {
    let arg = std::env::args().nth(1).unwrap_or_else(|| "--list".into());
    if arg == "--list" {
        println!("libfabric {}", libfabric_version());
        for p in usable_providers() {
            println!("{p:?}");
        }
        return;
    }
    let launched = launcher::detect_env().expect("launcher variables");
    let (rank, size) = env_pair("DDFI_RANK", "DDFI_SIZE")
        .or_else(|| launched.as_ref().map(|l| (l.rank, l.size)))
        .unwrap_or((0, 1));
    std::fs::create_dir_all(&arg).expect("creating the handshake directory");
    let comm: Arc<dyn Comm> = Arc::new(ofi_support::file_comm(&arg, rank, size));
    let local_rank = launched.and_then(|l| l.local_rank).unwrap_or(0);
    let config = Config::from_env().expect("DDSTORE_* settings");
    let transport = OfiTransport::from_env(&config, None, local_rank).expect("libfabric transport");
    let opts = ExposeOptions {
        name: "ofi-check".into(),
        node_sharing: false,
        keep_address: false,
        lens: None,
    };
    let share = transport.expose(&comm, SHARE, &opts).expect("expose");
    share
        .local
        .write_at(0, &fill(1, rank, SHARE))
        .expect("fill");
    comm.barrier().expect("barrier");

    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let remote = share.remote.clone();
            s.spawn(move || {
                let mut reader = remote.open_reader().expect("reader");
                let mut dst = vec![0u8; SHARE];
                for peer in 0..size {
                    let whole = RemoteRead {
                        owner: peer,
                        offset: 0,
                        len: SHARE,
                        dst_offset: 0,
                    };
                    reader
                        .read_many(&[whole], &mut dst)
                        .expect("whole-share read");
                    assert!(dst == fill(1, peer, SHARE), "rank {peer}'s share differs");
                }
                let mut rng = rand::rngs::StdRng::seed_from_u64(rank as u64 * 10 + t);
                for _ in 0..200 {
                    let reads: Vec<RemoteRead> = (0..32)
                        .map(|i| RemoteRead {
                            owner: rng.gen_range(0..size),
                            offset: rng.gen_range(0..SHARE as u64 - 4096),
                            len: 4096,
                            dst_offset: i * 4096,
                        })
                        .collect();
                    reader
                        .read_many(&reads, &mut dst[..32 * 4096])
                        .expect("random reads");
                    for r in &reads {
                        for i in (0..r.len).step_by(97) {
                            let want = pattern(1, r.owner, r.offset + i as u64);
                            assert_eq!(
                                dst[r.dst_offset + i],
                                want,
                                "rank {} offset {}",
                                r.owner,
                                r.offset
                            );
                        }
                    }
                }
            });
        }
    });
    let secs = start.elapsed().as_secs_f64();
    comm.barrier().expect("barrier");
    println!(
        "rank {rank}/{size}: {} verified all reads in {secs:.2} s",
        transport.name()
    );
}
