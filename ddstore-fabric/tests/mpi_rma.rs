//! Runs the `mpi_rma_check` example (compiled into this test binary) under
//! real `mpirun` with 1, 2 and 4 ranks, plus a pretend two-node layout and a
//! serialized MPI thread level. Skipped, with a message, when `mpirun` is
//! not on PATH.
//!
//! The test binary re-executes itself as the MPI program (test
//! `mpi_rma_worker` with `DDSTORE_MPI_RMA_WORKER=1`), so no nested cargo
//! build is needed and `cargo test --test mpi_rma` works on its own.

#[allow(dead_code)]
#[path = "../examples/mpi_rma_check.rs"]
mod mpi_rma_check;

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const WORKER_ENV: &str = "DDSTORE_MPI_RMA_WORKER";
/// One mpirun at a time: the machine may have few cores.
static ONE_JOB: Mutex<()> = Mutex::new(());

/// The MPI program: does nothing unless started by `mpirun_check`.
#[test]
fn mpi_rma_worker() {
    if std::env::var_os(WORKER_ENV).is_none() {
        return;
    }
    if let Err(e) = mpi_rma_check::run() {
        eprintln!("mpi_rma_check FAILED: {e}");
        // Exiting without MPI_Finalize makes mpirun stop the other ranks.
        std::process::exit(1);
    }
}

fn mpirun_path() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("mpirun"))
        .find(|p| p.is_file())
}

fn mpirun_check(ranks: usize, extra_env: &[(&str, &str)]) {
    let Some(mpirun) = mpirun_path() else {
        eprintln!("SKIPPED: mpirun is not on PATH; install Open MPI (openmpi-bin) to run the MPI RMA test");
        return;
    };
    let _one = ONE_JOB.lock().unwrap_or_else(|p| p.into_inner());
    let me = std::env::current_exe().expect("test binary path");
    let mut cmd = Command::new(mpirun);
    cmd.arg("-n")
        .arg(ranks.to_string())
        .arg(&me)
        .args([
            "mpi_rma_worker",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(WORKER_ENV, "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_rmaps_base_oversubscribe", "1")
        .env_remove("DDSTORE_MPI_FAKE_NODE_SIZE")
        .env_remove("DDSTORE_MPI_THREAD_LEVEL")
        .envs(extra_env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("starting mpirun");
    // Drain the pipes on threads so a chatty run cannot block on a full pipe.
    let mut out_pipe = child.stdout.take().expect("stdout");
    let mut err_pipe = child.stderr.take().expect("stderr");
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out_pipe.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err_pipe.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + Duration::from_secs(300);
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for mpirun") {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let (out, err) = (
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    );
    let what = format!("mpirun -n {ranks} {extra_env:?}");
    let status =
        status.unwrap_or_else(|| panic!("{what} timed out\nstdout:\n{out}\nstderr:\n{err}"));
    assert!(
        status.success(),
        "{what} failed: {status}\nstdout:\n{out}\nstderr:\n{err}"
    );
    assert!(
        out.contains("mpi_rma_check: all checks passed"),
        "{what} did not report success\nstdout:\n{out}\nstderr:\n{err}"
    );
    for line in out.lines().filter(|l| l.contains("us/row")) {
        eprintln!("{line}");
    }
}

#[test]
fn mpi_rma_one_rank() {
    mpirun_check(1, &[]);
}

#[test]
fn mpi_rma_two_ranks() {
    mpirun_check(2, &[]);
}

#[test]
fn mpi_rma_four_ranks() {
    mpirun_check(4, &[]);
}

/// Ranks 0-2 and rank 3 as two pretend nodes: a shared window per node and
/// a window over all ranks for reads across nodes.
#[test]
fn mpi_rma_four_ranks_two_pretend_nodes() {
    mpirun_check(4, &[("DDSTORE_MPI_FAKE_NODE_SIZE", "3")]);
}

/// Below MPI_THREAD_MULTIPLE every MPI call goes through one lock.
#[test]
fn mpi_rma_serialized_thread_level() {
    mpirun_check(2, &[("DDSTORE_MPI_THREAD_LEVEL", "serialized")]);
}
