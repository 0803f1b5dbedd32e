//! A communicator without MPI: records are exchanged through files in a
//! shared directory (`handshake_dir`). Rank and size come from the launcher
//! ([`crate::launcher`]: srun, torchrun, mpirun, ...) or are given. Every
//! file carries the job id, so files an earlier job left in the directory
//! are never read.

use std::any::Any;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::comm::Comm;
use crate::launcher;
use crate::private_dir::{NameLock, PrivateDir, DEFAULT_READ_CAP};
use crate::{Error, Result};

/// Communicators this process made so far, per (directory, job id, rank): the n-th one is
/// `{job}.c{n}`.
static COMMS_CREATED: Mutex<Vec<(PathBuf, String, usize, u64)>> = Mutex::new(Vec::new());

/// The name of this process's next communicator of rank `rank` in job `job` in `dir`. Every
/// rank creates its communicators in the same order, so the n-th one of each process belongs
/// to the same group; numbering them keeps two live communicators of one process (two stores,
/// a train and a validation dataset) apart whatever set the job id.
fn nth_comm_of(dir: &Path, job: &str, rank: usize) -> String {
    let mut made = COMMS_CREATED.lock().unwrap();
    let nth = match made
        .iter_mut()
        .find(|(d, j, r, _)| d == dir && j == job && *r == rank)
    {
        Some((_, _, _, n)) => {
            *n += 1;
            *n
        }
        None => {
            made.push((dir.to_path_buf(), job.to_string(), rank, 0));
            0
        }
    };
    format!("{job}.c{nth}")
}

/// How much longer than rank 0 the other ranks wait in a barrier, so rank 0's
/// verdict (which ranks did not arrive) reaches them before they give up.
const RELEASE_GRACE: Duration = Duration::from_secs(2);

/// The file communicator (see the module doc).
pub struct FileComm {
    dir: Arc<PrivateDir>,
    rank: usize,
    size: usize,
    job: String,
    timeout: Duration,
    /// Number of collectives done so far; names each round's files.
    round: Mutex<u64>,
    /// A signal interrupted a collective: the ranks no longer agree on the round.
    interrupted: std::sync::atomic::AtomicBool,
    /// Held for this communicator's life: tells a later job that this one is alive.
    _live: Option<Arc<NameLock>>,
}

/// The id that ties a job's files together: `DDSTORE_JOB_ID`, else the
/// launcher's ([`launcher::job_id`]: Slurm's job and step, Open MPI's job,
/// ...), else the launching process (parent pid + its start time).
pub fn default_job_id() -> Result<String> {
    if let Some(job) = crate::config::env_setting("DDSTORE_JOB_ID")? {
        return Ok(job);
    }
    launcher::job_id(&|k| std::env::var(k).ok(), parent_process_id)
}

/// The parent process: its pid and start time (pids are reused).
fn parent_process_id() -> String {
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
    let clean: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    // File names stay well under NAME_MAX whatever the job id.
    clean.chars().take(96).collect()
}

const LIVE_SUFFIX: &str = ".live";
/// What `clean_dead_jobs` writes into a lock file while it checks it.
const CLEANING: &str = "cleaning";

/// Removes what dead jobs left. A job's round, barrier and temporary files go
/// only when every one of its `*.live` locks can be taken (all its ranks are
/// gone), and those locks are held until the files are removed: a job with one
/// rank still alive, or one rank just starting while another already wrote its
/// first round, keeps all its files.
fn clean_dead_jobs(dir: &PrivateDir, own_job: &str) {
    let Ok(names) = dir.list() else { return };
    let mut locks_by_job: std::collections::BTreeMap<&str, Vec<&String>> = Default::default();
    for lock in names.iter().filter(|n| n.ends_with(LIVE_SUFFIX)) {
        let stem = &lock[..lock.len() - LIVE_SUFFIX.len()];
        let Some((job, _rank)) = stem.rsplit_once('.') else {
            continue;
        };
        if job == own_job || job.starts_with(&format!("{own_job}.")) {
            continue;
        }
        locks_by_job.entry(job).or_default().push(lock);
    }
    for (job, locks) in locks_by_job {
        // Taking a lock proves its holder is dead; dropping it removes the file.
        let mut taken = Vec::with_capacity(locks.len());
        for &lock in &locks {
            match dir.try_lock(lock, CLEANING) {
                Ok(Ok(dead)) => taken.push(dead),
                _ => break,
            }
        }
        if taken.len() < locks.len() {
            continue; // a rank of this job is alive: leave all of its files
        }
        let (a, b) = (format!("{job}."), format!(".{job}."));
        for n in &names {
            if !n.ends_with(LIVE_SUFFIX) && (n.starts_with(&a) || n.starts_with(&b)) {
                let _ = dir.remove(n);
            }
        }
    }
    // A job whose ranks all ended leaves no lock, but its last merged file.
    let live: Vec<&str> = names
        .iter()
        .filter_map(|n| {
            n.strip_suffix(LIVE_SUFFIX)?
                .rsplit_once('.')
                .map(|(job, _)| job)
        })
        .collect();
    let within = |job: &str, group: &str| job == group || job.starts_with(&format!("{group}."));
    for n in &names {
        let Some(job) = round_file_job(n) else {
            continue;
        };
        if !within(job, own_job) && !live.iter().any(|&l| within(job, l)) {
            let _ = dir.remove(n);
        }
    }
}

/// The job of a round's file (`<job>.r<round>.<rank>.rec` or `.rel`, `<job>.r<round>.all`,
/// or a temporary file of either), or None for any other name.
fn round_file_job(name: &str) -> Option<&str> {
    let name = match name.strip_prefix('.') {
        Some(tmp) => tmp.rsplit_once(".tmp-")?.0,
        None => name,
    };
    let stem = match name.strip_suffix(".all") {
        Some(stem) => stem,
        None => {
            let rest = name
                .strip_suffix(".rec")
                .or_else(|| name.strip_suffix(".rel"))?;
            let (stem, rank) = rest.rsplit_once('.')?;
            rank.parse::<u64>().ok()?;
            stem
        }
    };
    let (job, round) = stem.rsplit_once(".r")?;
    round.parse::<u64>().ok()?;
    Some(job)
}

impl FileComm {
    /// Rank and size from the arguments, else from the launcher
    /// ([`crate::launcher`]), else 0 of 1. The directory is created (0700)
    /// or must be private already (`PrivateDir`).
    pub fn new(
        dir: &Path,
        rank: Option<usize>,
        size: Option<usize>,
        job: Option<String>,
        timeout: Duration,
    ) -> Result<FileComm> {
        let launched = match (rank, size) {
            (Some(_), Some(_)) => None,
            _ => launcher::detect_env()?,
        };
        let rank = rank.unwrap_or(launched.as_ref().map_or(0, |l| l.rank));
        let size = size.unwrap_or(launched.as_ref().map_or(1, |l| l.size));
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
        let pdir = PrivateDir::open(dir, true)?;
        let job = nth_comm_of(
            pdir.path(),
            &sanitize(&match job {
                Some(job) => job,
                None => default_job_id()?,
            }),
            rank,
        );
        clean_dead_jobs(&pdir, &job);
        let holder = format!("pid {} rank {rank} of job {job}", std::process::id());
        let live_name = format!("{job}.{rank}{LIVE_SUFFIX}");
        let mut attempt = pdir.try_lock(&live_name, &holder)?;
        // Another job's clean_dead_jobs may hold this lock for a moment while it
        // checks whether the file is stale: wait for it rather than fail.
        let settle = std::time::Instant::now() + Duration::from_secs(2);
        while matches!(&attempt, Err(other) if (other == CLEANING || other.is_empty()) && std::time::Instant::now() < settle)
        {
            std::thread::sleep(Duration::from_millis(10));
            attempt = pdir.try_lock(&live_name, &holder)?;
        }
        let live = match attempt {
            Ok(lock) => lock,
            Err(other) => {
                return Err(Error::Access(format!(
                "rank {rank} of file-communicator job '{job}' is already running in {} ({other}): \
                     two live jobs with the same job id cannot share a handshake_dir; give each \
                     job its own job id (a different DDSTORE_JOB_ID, or FileComm(job_id=)) or its \
                     own handshake_dir",
                dir.display()
            )))
            }
        };
        Ok(FileComm {
            dir: Arc::new(pdir),
            rank,
            size,
            job,
            timeout,
            round: Mutex::new(0),
            interrupted: Default::default(),
            _live: Some(Arc::new(live)),
        })
    }

    /// The verified directory (method 2's records use it too).
    pub fn private_dir(&self) -> &Arc<PrivateDir> {
        &self.dir
    }

    /// The directory the ranks exchange records in.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The job id that tags this group's records.
    pub fn job(&self) -> &str {
        &self.job
    }

    fn file(&self, round: u64, rank: usize) -> String {
        format!("{}.r{round}.{rank}.rec", self.job)
    }

    /// Job ids other than ours under which `peer` wrote records in the directory
    /// (quoted, comma-separated), or None.
    fn other_job_ids(&self, peer: usize) -> Option<String> {
        let tail = format!(".{peer}.rec");
        let mut ids: Vec<String> = self
            .dir
            .list()
            .ok()?
            .into_iter()
            .filter_map(|name| {
                let stem = name.strip_suffix(&tail)?;
                let (job, round) = stem.rsplit_once(".r")?;
                round.parse::<u64>().ok()?;
                // Sub-communicators ("<job>.s<round>c<color>") number their ranks differently.
                let sub = job.rsplit_once(".s").is_some_and(|(_, t)| {
                    t.contains('c') && t.replace('c', "").parse::<u64>().is_ok()
                });
                (job != self.job && !sub).then(|| format!("'{job}'"))
            })
            .collect();
        ids.sort();
        ids.dedup();
        (!ids.is_empty()).then(|| ids.join(", "))
    }

    /// Runs collective `f` unless an earlier one was interrupted by a signal
    /// (then every later one fails clearly instead of meeting the wrong round).
    fn collective<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        use std::sync::atomic::Ordering;
        if self.interrupted.load(Ordering::Acquire) {
            return Err(Error::Comm(
                "an earlier collective of this communicator was interrupted by a signal \
                 (Ctrl-C): the ranks no longer agree on which collective comes next, so it \
                 can no longer be used"
                    .into(),
            ));
        }
        let done = f();
        if matches!(done, Err(Error::Interrupted)) {
            self.interrupted.store(true, Ordering::Release);
        }
        done
    }

    /// The merged records of round `round`, which rank 0 writes for everyone.
    fn merged_file(&self, round: u64) -> String {
        format!("{}.r{round}.all", self.job)
    }

    /// One round: every rank writes its record; rank 0 alone reads them (and
    /// removes each), then writes them merged into one file every other rank
    /// reads (or, past the deadline, the list of the ranks that wrote none).
    /// O(N) file operations per round in all, one read and one write for a
    /// rank other than 0. Only the last round's merged file stays behind, for
    /// the next round or barrier (or, once every rank of the job is gone, the
    /// next job in the directory: `clean_dead_jobs`) to remove.
    fn gather_round(&self, mine: &[u8], timeout: Duration) -> Result<(u64, Gathered)> {
        let mut round = self.round.lock().unwrap();
        *round += 1;
        let r = *round;
        let start = Instant::now();
        self.dir.write(&self.file(r, self.rank), mine)?;
        if self.rank != 0 {
            let cap = (DEFAULT_READ_CAP + 8).saturating_mul(self.size) + 16;
            let merged =
                self.dir
                    .wait_for(&self.merged_file(r), start + timeout + RELEASE_GRACE, cap)?;
            let Some(merged) = merged else {
                let _ = self.dir.remove(&self.file(r, self.rank));
                return Ok((r, Gathered::Unreleased));
            };
            let got = decode_merged(&merged, self.size)
                .map_err(|e| Error::Comm(format!("{}: {e}", self.merged_file(r))))?;
            if let Gathered::All(all) = &got {
                if all[self.rank] != mine {
                    return Err(Error::Comm(format!(
                        "{} does not hold this rank's record: another job shares job id '{}' \
                         in this handshake_dir",
                        self.merged_file(r),
                        self.job
                    )));
                }
            }
            return Ok((r, got));
        }
        let deadline = start + timeout;
        let mut all = vec![Vec::new(); self.size];
        all[0] = mine.to_vec();
        let mut missing = Vec::new();
        for (peer, slot) in all.iter_mut().enumerate().skip(1) {
            // Once one peer is missing, the others are only checked, not waited for.
            let until = if missing.is_empty() {
                deadline
            } else {
                Instant::now()
            };
            let name = self.file(r, peer);
            match self.dir.wait_for(&name, until, DEFAULT_READ_CAP)? {
                Some(data) => {
                    self.dir.remove(&name)?;
                    *slot = data;
                }
                None => missing.push(peer),
            }
        }
        // Every rank wrote this round's record, so it has read the last merged file.
        if missing.is_empty() && r >= 2 {
            self.dir.remove(&self.merged_file(r - 1))?;
        }
        let got = if missing.is_empty() {
            Gathered::All(all)
        } else {
            Gathered::Missing(missing)
        };
        self.dir.write(&self.merged_file(r), &encode_merged(&got))?;
        self.dir.remove(&self.file(r, 0))?;
        Ok((r, got))
    }

    /// This rank's release from barrier round `round`, written by rank 0.
    fn release_file(&self, round: u64, rank: usize) -> String {
        format!("{}.r{round}.{rank}.rel", self.job)
    }

    /// A barrier that leaves no file behind and names the ranks that did not
    /// arrive on every rank: every rank reports to rank 0 (its empty record),
    /// rank 0 releases each with a verdict of its own ("ok", or the ranks
    /// missing), which that rank reads and removes. 4(N-1) file operations in
    /// all, two for a rank other than 0. Once every rank arrived, each has
    /// read the last round's merged file, so rank 0 removes it: a job whose
    /// last collective is a barrier (`free()`) leaves nothing.
    fn barrier_within(&self, timeout: Duration) -> Result<()> {
        let mut round = self.round.lock().unwrap();
        *round += 1;
        let r = *round;
        let start = Instant::now();
        if self.rank != 0 {
            let arrived = self.file(r, self.rank);
            self.dir.write(&arrived, b"")?;
            let release = self.release_file(r, self.rank);
            let verdict = self.dir.wait_for(
                &release,
                start + timeout + RELEASE_GRACE,
                16 * self.size + 16,
            )?;
            let Some(verdict) = verdict else {
                let _ = self.dir.remove(&arrived);
                return Err(self.absent_error(vec![0], timeout, "did not release the barrier"));
            };
            self.dir.remove(&release)?;
            if verdict == b"ok" {
                return Ok(());
            }
            let missing = String::from_utf8_lossy(&verdict)
                .split(',')
                .filter_map(|s| s.trim().parse().ok())
                .collect();
            return Err(self.absent_error(
                missing,
                timeout,
                "did not arrive at the barrier (as rank 0 saw)",
            ));
        }
        let deadline = start + timeout;
        let mut missing = Vec::new();
        for peer in 1..self.size {
            // Once one peer is missing, the others are only checked, not waited for.
            let until = if missing.is_empty() {
                deadline
            } else {
                Instant::now()
            };
            let name = self.file(r, peer);
            match self.dir.wait_for(&name, until, 64)? {
                Some(_) => self.dir.remove(&name)?,
                None => missing.push(peer),
            }
        }
        if missing.is_empty() && r >= 2 {
            self.dir.remove(&self.merged_file(r - 1))?;
        }
        let verdict = if missing.is_empty() {
            "ok".to_string()
        } else {
            let names: Vec<String> = missing.iter().map(|m| m.to_string()).collect();
            names.join(",")
        };
        for peer in (1..self.size).filter(|p| !missing.contains(p)) {
            self.dir
                .write(&self.release_file(r, peer), verdict.as_bytes())?;
        }
        if missing.is_empty() {
            Ok(())
        } else {
            Err(self.absent_error(missing, timeout, "did not arrive at the barrier"))
        }
    }

    fn absent_error(&self, missing: Vec<usize>, waited: Duration, what: &str) -> Error {
        Error::Timeout {
            peer: missing.first().copied().unwrap_or(0),
            waited,
            what: format!(
                "ranks {missing:?} of file-communicator job '{}' {what} in {} (stopped or dead; \
                 DDSTORE_TIMEOUT_S / DDSTORE_HANDSHAKE_TIMEOUT_S set the wait)",
                self.job,
                self.dir.path().display()
            ),
        }
    }
}

/// What a round of the file communicator brought.
enum Gathered {
    /// Every rank's record, in rank order.
    All(Vec<Vec<u8>>),
    /// These ranks wrote no record by rank 0's deadline.
    Missing(Vec<usize>),
    /// Rank 0 wrote no merged file (a rank other than 0 waited in vain).
    Unreleased,
}

/// Kinds of merged file: every record, or the ranks that wrote none.
const MERGED_ALL: u8 = 0;
const MERGED_MISSING: u8 = 1;

/// The merged file of a round: a kind byte, a count, then per record its
/// length and bytes (or per missing rank its number), all u64 little-endian.
fn encode_merged(got: &Gathered) -> Vec<u8> {
    let mut out = Vec::new();
    match got {
        Gathered::All(all) => {
            out.push(MERGED_ALL);
            out.extend_from_slice(&(all.len() as u64).to_le_bytes());
            for rec in all {
                out.extend_from_slice(&(rec.len() as u64).to_le_bytes());
                out.extend_from_slice(rec);
            }
        }
        Gathered::Missing(missing) => {
            out.push(MERGED_MISSING);
            out.extend_from_slice(&(missing.len() as u64).to_le_bytes());
            for &m in missing {
                out.extend_from_slice(&(m as u64).to_le_bytes());
            }
        }
        Gathered::Unreleased => unreachable!("rank 0 writes records or the missing"),
    }
    out
}

/// The next `n` bytes of `rest`, or an error when it is shorter.
fn take<'a>(rest: &mut &'a [u8], n: usize) -> std::result::Result<&'a [u8], String> {
    if rest.len() < n {
        return Err("the merged record file is cut short".into());
    }
    let (head, tail) = rest.split_at(n);
    *rest = tail;
    Ok(head)
}

fn take_u64(rest: &mut &[u8]) -> std::result::Result<u64, String> {
    Ok(u64::from_le_bytes(
        take(rest, 8)?.try_into().expect("8 bytes"),
    ))
}

/// Reads a merged file of a group of `size` ranks (see [`encode_merged`]);
/// any other content is an error saying what is wrong.
fn decode_merged(data: &[u8], size: usize) -> std::result::Result<Gathered, String> {
    let mut rest = data;
    let kind = take(&mut rest, 1)?[0];
    let count = take_u64(&mut rest)?;
    let got = match kind {
        MERGED_ALL if count == size as u64 => Gathered::All(
            (0..size)
                .map(|_| {
                    let len = usize::try_from(take_u64(&mut rest)?).unwrap_or(usize::MAX);
                    Ok(take(&mut rest, len)?.to_vec())
                })
                .collect::<std::result::Result<_, String>>()?,
        ),
        MERGED_MISSING if count >= 1 && count < size as u64 => Gathered::Missing(
            (0..count)
                .map(|_| match take_u64(&mut rest)? {
                    m if m < size as u64 => Ok(m as usize),
                    m => Err(format!("it names rank {m} of a group of {size}")),
                })
                .collect::<std::result::Result<_, String>>()?,
        ),
        _ => {
            return Err(format!(
                "not a merged record file of {size} ranks (kind {kind}, count {count})"
            ))
        }
    };
    if !rest.is_empty() {
        return Err(format!("{} bytes follow the records", rest.len()));
    }
    Ok(got)
}

impl Comm for FileComm {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }

    fn allgather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.collective(|| self.allgather_round(mine))
    }

    fn barrier(&self) -> Result<()> {
        self.collective(|| self.barrier_within(self.timeout))
    }

    fn barrier_timeout(&self, timeout: Duration) -> Result<()> {
        self.collective(|| self.barrier_within(timeout))
    }

    fn split(&self, color: usize, key: usize) -> Result<Arc<dyn Comm>> {
        self.split_group(color, key)
    }

    fn kind(&self) -> crate::kinds::CommKind {
        crate::kinds::CommKind::File
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl FileComm {
    fn allgather_round(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let (r, missing) = match self.gather_round(mine, self.timeout)? {
            (_, Gathered::All(all)) => return Ok(all),
            (r, Gathered::Missing(missing)) => (r, missing),
            (r, Gathered::Unreleased) => (r, vec![0]),
        };
        let peer = missing[0];
        let what = match self.other_job_ids(peer) {
            // The usual cause: ranks started under different parents (a wrapper, `timeout`,
            // separate shells) derive different default job ids.
            Some(others) => format!(
                "rank {peer} wrote no record {} in handshake_dir, but records of rank {peer} \
                 under job id {others} are there: the ranks have different job ids (ranks \
                 started under different parents get different defaults); set the same \
                 DDSTORE_JOB_ID for every rank",
                self.file(r, peer),
            ),
            None if self.rank != 0 && peer == 0 => format!(
                "rank 0 wrote no merged record {} in handshake_dir (is it running, with the \
                 same handshake_dir and job id '{}'?)",
                self.merged_file(r),
                self.job
            ),
            None => format!(
                "ranks {missing:?} wrote no record {} in handshake_dir (are they running, with \
                 the same handshake_dir and job id '{}'?)",
                self.file(r, peer),
                self.job
            ),
        };
        Err(Error::Timeout {
            peer,
            waited: self.timeout,
            what,
        })
    }

    fn split_group(&self, color: usize, key: usize) -> Result<Arc<dyn Comm>> {
        let all = crate::comm::gather_split(self, color, key)?;
        let mut members: Vec<(u64, usize)> = all
            .iter()
            .enumerate()
            .filter(|(_, &(c, _))| c == color as u64)
            .map(|(rank, &(_, k))| (k, rank))
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
            interrupted: Default::default(),
            _live: self._live.clone(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ranks `ranks` of a `size`-rank job `job` in `dir`, one thread each,
    /// each running `body` with its communicator; joined (a panic fails the test).
    fn in_threads(
        dir: &Path,
        ranks: std::ops::Range<usize>,
        size: usize,
        job: &str,
        body: impl Fn(FileComm, usize) + Send + Sync + 'static,
    ) {
        let body = Arc::new(body);
        let handles: Vec<_> = ranks
            .map(|rank| {
                let (dir, job, body) = (dir.to_path_buf(), job.to_string(), body.clone());
                std::thread::spawn(move || {
                    let timeout = Duration::from_secs(10);
                    let c = FileComm::new(&dir, Some(rank), Some(size), Some(job), timeout);
                    body(c.unwrap(), rank)
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }

    #[test]
    fn threads_as_ranks_allgather_split_and_time_out() {
        let dir = tempfile::tempdir().unwrap();
        let n = 4;
        in_threads(dir.path(), 0..n, n, "job1", move |c, rank| {
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
        });
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
    fn a_peer_under_another_job_id_is_named_with_the_fix() {
        // Rank 1 started under another parent: same directory, another default job id.
        let dir = tempfile::tempdir().unwrap();
        let hs = dir.path().to_path_buf();
        let other = std::thread::spawn(move || {
            let c = FileComm::new(
                &hs,
                Some(1),
                Some(2),
                Some("jobB".into()),
                Duration::from_millis(1500),
            )
            .unwrap();
            c.allgather(b"b").err()
        });
        let c = FileComm::new(
            dir.path(),
            Some(0),
            Some(2),
            Some("jobA".into()),
            Duration::from_millis(700),
        )
        .unwrap();
        match c.allgather(b"a") {
            Err(Error::Timeout { peer: 1, what, .. }) => assert!(
                what.contains("under job id 'jobB.c0'") && what.contains("DDSTORE_JOB_ID"),
                "{what}"
            ),
            other => panic!("expected timeout, got {other:?}"),
        }
        assert!(other.join().unwrap().is_some(), "rank 1 must time out too");
    }

    #[test]
    fn communicators_of_one_process_keep_apart_and_a_live_job_id_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let mk = |job: &str| {
            FileComm::new(
                dir.path(),
                Some(0),
                Some(1),
                Some(job.into()),
                Duration::from_secs(5),
            )
        };
        // Two live stores of one process under one given job id (DDSTORE_JOB_ID).
        let (a, b) = (mk("same").unwrap(), mk("same").unwrap());
        assert_eq!((a.job(), b.job()), ("same.c0", "same.c1"));
        assert_eq!(a.allgather(b"a").unwrap(), vec![b"a".to_vec()]);
        assert_eq!(b.allgather(b"b").unwrap(), vec![b"b".to_vec()]);
        // Another live job holds the name this process's first "other" communicator takes.
        let held = PrivateDir::open(dir.path(), false)
            .unwrap()
            .try_lock("other.c0.0.live", "pid 1 rank 0 of job other.c0")
            .unwrap()
            .unwrap();
        let e = mk("other").err().expect("refused").to_string();
        assert!(
            e.contains("already running") && e.contains("give each job its own job id"),
            "{e}"
        );
        drop(held);
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

    #[test]
    fn a_clean_run_leaves_nothing_and_a_barrier_names_the_absent() {
        let dir = tempfile::tempdir().unwrap();
        let hs = dir.path().join("hs");
        let left = || -> Vec<String> {
            fs::read_dir(&hs)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect()
        };
        in_threads(&hs, 0..3, 3, "j", |c, rank| {
            c.allgather(&[rank as u8]).unwrap();
            c.allgather(&[rank as u8]).unwrap();
            c.barrier().unwrap();
        });
        // A barrier last (as free() ends) removes the last merged file.
        assert_eq!(left(), Vec::<String>::new());
        // An allgather last leaves its merged file, until the next job in the directory.
        in_threads(&hs, 0..3, 3, "i", |c, rank| {
            c.allgather(&[rank as u8]).unwrap();
        });
        assert_eq!(left(), ["i.c0.r1.all"]);
        drop(
            FileComm::new(
                &hs,
                Some(0),
                Some(1),
                Some("next".into()),
                Duration::from_secs(5),
            )
            .unwrap(),
        );
        assert_eq!(fs::read_dir(&hs).unwrap().count(), 0);
        // Rank 2 never comes: ranks 0 and 1 both name it.
        in_threads(&hs, 0..2, 3, "k", |c, _| {
            let t0 = Instant::now();
            let e = c.barrier_timeout(Duration::from_millis(300)).unwrap_err();
            assert!(t0.elapsed() < Duration::from_secs(4));
            assert!(e.to_string().contains("ranks [2]"), "{e}");
        });
    }

    #[test]
    fn without_rank_0_the_others_name_it_and_a_bad_merged_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let hs = dir.path().join("hs");
        in_threads(&hs, 1..3, 3, "z", |c, _| {
            let e = c.barrier_timeout(Duration::from_millis(300)).unwrap_err();
            assert!(
                e.to_string().contains("ranks [0]") && e.to_string().contains("release"),
                "{e}"
            );
        });
        let ranks: Vec<_> = (1..3)
            .map(|rank| {
                let hs = hs.clone();
                std::thread::spawn(move || {
                    let short = Duration::from_millis(300);
                    let c = FileComm::new(&hs, Some(rank), Some(3), Some("y".into()), short);
                    c.unwrap().allgather(b"r").unwrap_err().to_string()
                })
            })
            .collect();
        for r in ranks {
            let e = r.join().unwrap();
            assert!(e.contains("rank 0 wrote no merged record"), "{e}");
        }
        let all = Gathered::All(vec![b"a".to_vec(), Vec::new(), b"ccc".to_vec()]);
        let bytes = encode_merged(&all);
        assert!(matches!(decode_merged(&bytes, 3), Ok(Gathered::All(v)) if v[2] == b"ccc"));
        assert!(
            decode_merged(&bytes, 4).is_err(),
            "a file of another group size"
        );
        assert!(
            decode_merged(&bytes[..bytes.len() - 1], 3).is_err(),
            "cut short"
        );
        assert!(
            decode_merged(&[bytes.as_slice(), b"x"].concat(), 3).is_err(),
            "trailing bytes"
        );
        let missing = encode_merged(&Gathered::Missing(vec![2]));
        assert!(matches!(decode_merged(&missing, 3), Ok(Gathered::Missing(m)) if m == [2]));
        assert!(
            decode_merged(&missing, 2).is_err(),
            "rank 2 of a group of 2"
        );
        assert!(decode_merged(b"", 3).is_err());
    }

    #[test]
    fn a_job_with_a_live_rank_keeps_its_files() {
        use std::os::unix::fs::OpenOptionsExt;
        let dir = tempfile::tempdir().unwrap();
        let hs = dir.path().join("hs");
        let mk = |job: &str, rank| {
            FileComm::new(
                &hs,
                Some(rank),
                Some(2),
                Some(job.into()),
                Duration::from_secs(5),
            )
            .unwrap()
        };
        let plant = |name: &str| {
            fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(hs.join(name))
                .unwrap();
        };
        let alive = mk("a", 0);
        // Rank 1 of job "a" is starting (its lock file exists, not yet held)
        // while rank 0 already wrote a round file.
        plant("a.c0.1.live");
        plant("a.c0.r0.0.rec");
        drop(mk("b", 0));
        assert!(
            hs.join("a.c0.r0.0.rec").exists(),
            "a live job's files were removed"
        );
        // Rank 0 is killed: its lock file stays behind, held by nobody.
        drop(alive);
        plant("a.c0.0.live");
        drop(mk("c", 0));
        assert!(
            !hs.join("a.c0.r0.0.rec").exists(),
            "a dead job's files were kept"
        );
        assert!(!hs.join("a.c0.0.live").exists());
    }
}
