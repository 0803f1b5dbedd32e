//! Shared by the libfabric tests and `examples/ofi_bench.rs`: the file
//! communicator of a launched rank, the byte pattern every share is filled
//! with, and a launcher for N processes.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use ddstore_core::file_comm::FileComm;

/// The communicator of a rank started by [`launch`]: ddstore-core's
/// `FileComm` over `DDFI_DIR`, rank and size from `DDFI_RANK`/`DDFI_SIZE`.
pub fn comm_from_env() -> Option<Arc<FileComm>> {
    let dir = std::env::var("DDFI_DIR").ok()?;
    let rank = std::env::var("DDFI_RANK").ok()?.parse().ok()?;
    let size = std::env::var("DDFI_SIZE").ok()?.parse().ok()?;
    Some(Arc::new(file_comm(&dir, rank, size)))
}

/// A `FileComm` of `size` ranks in `dir`, all with the same job id.
pub fn file_comm(dir: &str, rank: usize, size: usize) -> FileComm {
    let job = Some("ddfi-test".to_string());
    FileComm::new(
        Path::new(dir),
        Some(rank),
        Some(size),
        job,
        Duration::from_secs(120),
    )
    .expect("a valid test FileComm")
}

/// The byte at `offset` of `rank`'s share of variable `var`.
pub fn pattern(var: u8, rank: usize, offset: u64) -> u8 {
    (offset.wrapping_mul(7) ^ (offset >> 9) ^ (rank as u64 * 131) ^ (var as u64 * 29)) as u8
}

pub fn fill(var: u8, rank: usize, len: usize) -> Vec<u8> {
    (0..len as u64).map(|o| pattern(var, rank, o)).collect()
}

/// Starts `size` copies of `exe args` with rank variables set and `env`
/// added, waits for all within `limit`, kills stragglers, and returns each
/// process's success.
pub fn launch(
    exe: &std::path::Path,
    args: &[&str],
    size: usize,
    env: &[(&str, String)],
    limit: Duration,
) -> Vec<bool> {
    let dir = tempfile_dir();
    let mut children: Vec<Child> = (0..size)
        .map(|rank| {
            let mut cmd = Command::new(exe);
            cmd.args(args)
                .env("DDFI_DIR", &dir)
                .env("DDFI_RANK", rank.to_string())
                .env("DDFI_SIZE", size.to_string());
            for (k, v) in env {
                cmd.env(k, v);
            }
            cmd.spawn().expect("spawning a rank")
        })
        .collect();
    let start = Instant::now();
    let mut status: Vec<Option<bool>> = vec![None; size];
    while status.iter().any(Option::is_none) {
        for (i, c) in children.iter_mut().enumerate() {
            if status[i].is_none() {
                if let Ok(Some(s)) = c.try_wait() {
                    status[i] = Some(s.success());
                }
            }
        }
        if start.elapsed() > limit {
            for (i, c) in children.iter_mut().enumerate() {
                if status[i].is_none() {
                    eprintln!("rank {i} still running after {limit:?}: killing it");
                    let _ = c.kill();
                    let _ = c.wait();
                    status[i] = Some(false);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = std::fs::remove_dir_all(&dir);
    status.into_iter().map(|s| s.unwrap_or(false)).collect()
}

fn tempfile_dir() -> PathBuf {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "ddfi-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("creating a handshake directory");
    dir
}
