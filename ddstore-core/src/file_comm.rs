//! A communicator without MPI: records are exchanged through files in a
//! shared directory (`handshake_dir`). Rank and size come from the launcher
//! (`SLURM_PROCID`/`SLURM_NTASKS`) or are given. Every file carries the job
//! id, so files an earlier job left in the directory are never read.

use std::any::Any;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::comm::Comm;
use crate::{Error, Result};

static COMMS_CREATED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

pub struct FileComm {
    dir: PathBuf,
    rank: usize,
    size: usize,
    job: String,
    timeout: Duration,
    /// Number of collectives done so far; names each round's files.
    round: Mutex<u64>,
}

/// The id that ties a job's files together: Slurm's job and step, else
/// `DDSTORE_JOB_ID`, else the launcher process (parent pid + its start time).
pub fn default_job_id() -> String {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    if let Some(job) = var("DDSTORE_JOB_ID") {
        return job;
    }
    if let Some(job) = var("SLURM_JOB_ID") {
        return format!("slurm{job}.{}", var("SLURM_STEP_ID").unwrap_or_default());
    }
    if let Some(ns) = var("PMIX_NAMESPACE").or_else(|| var("OMPI_MCA_ess_base_jobid")) {
        return ns;
    }
    // SAFETY: getppid has no preconditions and cannot fail.
    let ppid = unsafe { libc::getppid() };
    let started = fs::read_to_string(format!("/proc/{ppid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit(')')
                .next()
                .and_then(|rest| rest.split_whitespace().nth(19).map(String::from))
        })
        .unwrap_or_default();
    format!("ppid{ppid}-{started}")
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

impl FileComm {
    /// Rank and size from the arguments, else `SLURM_PROCID`/`SLURM_NTASKS`
    /// (or Open MPI's / PMI's equivalents).
    pub fn new(
        dir: &Path,
        rank: Option<usize>,
        size: Option<usize>,
        job: Option<String>,
        timeout: Duration,
    ) -> Result<FileComm> {
        let env_usize = |keys: &[&str]| -> Result<Option<usize>> {
            for k in keys {
                if let Ok(v) = std::env::var(k) {
                    return v.trim().parse().map(Some).map_err(|_| {
                        Error::invalid(format!("environment variable {k}={v:?} is not a number"))
                    });
                }
            }
            Ok(None)
        };
        let rank = match rank {
            Some(r) => r,
            None => env_usize(&["SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"])?.unwrap_or(0),
        };
        let size = match size {
            Some(s) => s,
            None => env_usize(&["SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"])?.unwrap_or(1),
        };
        if size == 0 || rank >= size {
            return Err(Error::invalid(format!(
                "FileComm rank {rank} is not valid for size {size}: expected 0 <= rank < size"
            )));
        }
        if dir.as_os_str().is_empty() {
            return Err(Error::invalid(
                "handshake_dir is empty: the file communicator needs a directory every rank can reach \
                 (pass handshake_dir= or set DDSTORE_HANDSHAKE_DIR)",
            ));
        }
        if dir.exists() && !dir.is_dir() {
            return Err(Error::invalid(format!(
                "handshake_dir {} exists and is not a directory",
                dir.display()
            )));
        }
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| Error::io(format!("creating handshake_dir {}", dir.display()), e))?;
        let job = match job {
            Some(job) => sanitize(&job),
            // Every rank creates its communicators in the same order, so the
            // n-th one of each process belongs to the same group: its files
            // must not meet those of an earlier communicator of the same job.
            None => {
                let nth = COMMS_CREATED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                format!("{}.c{nth}", sanitize(&default_job_id()))
            }
        };
        Ok(FileComm {
            dir: dir.to_path_buf(),
            rank,
            size,
            job,
            timeout,
            round: Mutex::new(0),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn job(&self) -> &str {
        &self.job
    }

    fn file(&self, round: u64, rank: usize) -> PathBuf {
        self.dir.join(format!("{}.r{round}.{rank}.rec", self.job))
    }
}

/// Writes `data` to `path` so readers never see a partial file.
pub fn write_atomically(path: &Path, data: &[u8]) -> Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let ctx = |e| Error::io(format!("writing {}", path.display()), e);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(ctx)?;
    f.write_all(data).map_err(ctx)?;
    f.sync_data().ok();
    fs::rename(&tmp, path).map_err(ctx)
}

/// Polls for `path` with backoff until it exists or `deadline` passes.
pub fn wait_for_file(path: &Path, deadline: Instant) -> Option<Vec<u8>> {
    let mut pause = Duration::from_micros(200);
    loop {
        if let Ok(data) = fs::read(path) {
            return Some(data);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

impl Comm for FileComm {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }

    fn allgather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let mut round = self.round.lock().unwrap();
        *round += 1;
        let r = *round;
        write_atomically(&self.file(r, self.rank), mine)?;
        // Everyone has finished reading round r-2 once they wrote round r-1.
        if r >= 2 {
            let _ = fs::remove_file(self.file(r - 2, self.rank));
        }
        let deadline = Instant::now() + self.timeout;
        let mut all = Vec::with_capacity(self.size);
        for peer in 0..self.size {
            if peer == self.rank {
                all.push(mine.to_vec());
                continue;
            }
            match wait_for_file(&self.file(r, peer), deadline) {
                Some(data) => all.push(data),
                None => {
                    return Err(Error::Timeout {
                        peer,
                        waited: self.timeout,
                        what: format!(
                            "no record {} in handshake_dir (is rank {peer} running, with the same \
                             handshake_dir and job id '{}'?)",
                            self.file(r, peer).display(),
                            self.job
                        ),
                    })
                }
            }
        }
        Ok(all)
    }

    fn barrier(&self) -> Result<()> {
        self.allgather(&[]).map(|_| ())
    }

    fn split(&self, color: usize, key: usize) -> Result<Arc<dyn Comm>> {
        let mut rec = Vec::with_capacity(16);
        rec.extend_from_slice(&(color as u64).to_le_bytes());
        rec.extend_from_slice(&(key as u64).to_le_bytes());
        let all = self.allgather(&rec)?;
        let parse = |b: &[u8]| -> (u64, u64) {
            (
                u64::from_le_bytes(b[..8].try_into().unwrap()),
                u64::from_le_bytes(b[8..16].try_into().unwrap()),
            )
        };
        let mut members: Vec<(u64, usize)> = all
            .iter()
            .enumerate()
            .filter(|(_, b)| b.len() == 16 && parse(b).0 == color as u64)
            .map(|(rank, b)| (parse(b).1, rank))
            .collect();
        members.sort_unstable();
        let new_rank = members
            .iter()
            .position(|&(_, r)| r == self.rank)
            .expect("own record present");
        let round = *self.round.lock().unwrap();
        Ok(Arc::new(FileComm {
            dir: self.dir.clone(),
            rank: new_rank,
            size: members.len(),
            job: format!("{}.s{round}c{color}", self.job),
            timeout: self.timeout,
            round: Mutex::new(0),
        }))
    }

    fn kind(&self) -> &'static str {
        "file"
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_as_ranks_allgather_split_and_time_out() {
        let dir = tempfile::tempdir().unwrap();
        let n = 4;
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let dir = dir.path().to_path_buf();
                std::thread::spawn(move || {
                    let c = FileComm::new(
                        &dir,
                        Some(rank),
                        Some(n),
                        Some("job1".into()),
                        Duration::from_secs(10),
                    )
                    .unwrap();
                    for round in 0..3u8 {
                        let all = c.allgather(&[rank as u8, round]).unwrap();
                        assert_eq!(
                            all,
                            (0..n).map(|r| vec![r as u8, round]).collect::<Vec<_>>()
                        );
                    }
                    let sub = c.split(rank % 2, n - rank).unwrap();
                    assert_eq!(sub.size(), 2);
                    let got = sub.allgather(&[rank as u8]).unwrap();
                    let mut expect: Vec<Vec<u8>> = (0..n)
                        .filter(|r| r % 2 == rank % 2)
                        .map(|r| vec![r as u8])
                        .collect();
                    expect.reverse(); // keys n - rank order them backwards
                    assert_eq!(got, expect);
                    c.barrier().unwrap();
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        // A stale file from job1 is not taken for job2, and a missing peer times out.
        let c = FileComm::new(
            dir.path(),
            Some(0),
            Some(2),
            Some("job2".into()),
            Duration::from_millis(200),
        )
        .unwrap();
        match c.allgather(b"x") {
            Err(Error::Timeout { peer: 1, .. }) => {}
            other => panic!("expected timeout, got {other:?}"),
        }
    }

    #[test]
    fn rejects_bad_arguments() {
        let dir = tempfile::tempdir().unwrap();
        assert!(FileComm::new(dir.path(), Some(2), Some(2), None, Duration::from_secs(1)).is_err());
        let file = dir.path().join("f");
        fs::write(&file, b"").unwrap();
        let err = FileComm::new(&file, Some(0), Some(1), None, Duration::from_secs(1))
            .err()
            .unwrap();
        assert!(err.to_string().contains("not a directory"));
    }
}
