//! Raw OfiTransport read benchmark: 2 processes on this machine, rank 0
//! reads rows of rank 1's share through an `OfiReader` while rank 1 only
//! waits (its progress thread serves the reads).
//!
//! `cargo run --release -p ddstore-fabric --example ofi_bench [providers...]`
//! (providers: tcp, shm, sockets; default tcp shm). Prints µs per row and
//! GB/s for batches of 1, 32 and 128 rows of 3 KB and 1 MB, and the CPU the
//! idle owner used meanwhile.

#[path = "../tests/ofi_support/mod.rs"]
mod ofi_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use ddstore_core::comm::Comm;
use ddstore_core::config::Config;
use ddstore_core::transport::{ExposeOptions, RemoteRead, Transport};
use ddstore_fabric::ofi::OfiTransport;
use ofi_support::{fill, launch, pattern, FileComm};
use rand::seq::SliceRandom;
use rand::SeedableRng;

const ROW_SIZES: [usize; 2] = [3 * 1024, 1 << 20];
const BATCHES: [usize; 3] = [1, 32, 128];
const SHARE: usize = 130 << 20;

fn main() {
    match ofi_support::comm_from_env() {
        Some(comm) => rank(comm),
        None => launcher(),
    }
}

fn launcher() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let fabrics = if args.is_empty() {
        vec!["tcp".to_string(), "shm".to_string()]
    } else {
        args
    };
    let exe = std::env::current_exe().expect("own path");
    println!(
        "{:<12} {:>8} {:>6} {:>10} {:>8}",
        "provider", "row", "batch", "us/row", "GB/s"
    );
    for fabric in fabrics {
        let mut env = vec![("DDSTORE_FABRIC", fabric.clone())];
        if fabric != "shm" {
            env.push(("FABRIC_IFACE", "lo".to_string()));
        }
        let ok = launch(&exe, &[], 2, &env, Duration::from_secs(300));
        if ok != [true, true] {
            eprintln!("{fabric}: a rank failed ({ok:?})");
            std::process::exit(1);
        }
    }
}

fn cpu_seconds() -> f64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given.
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
        usage.assume_init()
    };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 * 1e-6;
    t(usage.ru_utime) + t(usage.ru_stime)
}

fn rank(comm: Arc<FileComm>) {
    let me = comm.rank();
    let config = Config::from_env().expect("config");
    let transport = OfiTransport::from_env(&config, None, me).expect("transport");
    let dyn_comm: Arc<dyn Comm> = comm.clone();
    let opts = ExposeOptions {
        name: "bench".into(),
        node_sharing: false,
        keep_address: false,
        lens: None,
    };
    let share = transport.expose(&dyn_comm, SHARE, &opts).expect("expose");
    share.local.write_at(0, &fill(1, me, SHARE)).expect("fill");
    comm.barrier().expect("barrier");

    if me == 1 {
        // Owner: do nothing but wait, as a training rank would. First one
        // second before any read (the progress thread's idle cost).
        let cpu = cpu_seconds();
        std::thread::sleep(Duration::from_secs(1));
        println!(
            "{:<12} owner CPU while idle: {:.1}% of one core",
            transport.provider(),
            (cpu_seconds() - cpu) * 100.0
        );
        let (wall, cpu) = (Instant::now(), cpu_seconds());
        comm.barrier().expect("barrier");
        let busy = (cpu_seconds() - cpu) / wall.elapsed().as_secs_f64();
        println!(
            "{:<12} owner CPU while being read: {:.0}% of one core over {:.1} s",
            transport.provider(),
            busy * 100.0,
            wall.elapsed().as_secs_f64()
        );
        return;
    }

    std::thread::sleep(Duration::from_millis(1100));
    let mut reader = share.remote.open_reader().expect("reader");
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    for row in ROW_SIZES {
        let mut rows: Vec<usize> = (0..SHARE / row).collect();
        for batch in BATCHES {
            let mut dst = vec![0u8; row * batch];
            let mut elapsed = Duration::ZERO;
            let mut calls = 0usize;
            while elapsed < Duration::from_millis(400) || calls < 3 {
                rows.shuffle(&mut rng);
                let reads: Vec<RemoteRead> = rows[..batch]
                    .iter()
                    .enumerate()
                    .map(|(i, &r)| RemoteRead {
                        owner: 1,
                        offset: (r * row) as u64,
                        len: row,
                        dst_offset: i * row,
                    })
                    .collect();
                let start = Instant::now();
                reader.read_many(&reads, &mut dst).expect("read");
                if calls > 0 {
                    elapsed += start.elapsed(); // the first call also connects
                }
                calls += 1;
                let r = reads[batch - 1];
                assert_eq!(
                    dst[r.dst_offset + row - 1],
                    pattern(1, 1, r.offset + row as u64 - 1)
                );
            }
            let rows_read = ((calls - 1) * batch) as f64;
            let secs = elapsed.as_secs_f64();
            println!(
                "{:<12} {:>8} {:>6} {:>10.1} {:>8.2}",
                transport.provider(),
                if row < (1 << 20) {
                    "3 KB".into()
                } else {
                    "1 MB".to_string()
                },
                batch,
                secs * 1e6 / rows_read,
                rows_read * row as f64 / secs / 1e9
            );
        }
    }
    comm.barrier().expect("barrier");
}
