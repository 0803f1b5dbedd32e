//! Many spilled reads in flight: a bounded set of threads issuing `pread`s.
//!
//! The threads are spawned for one batch and joined before it returns (no
//! pool outlives a call: the fork rule of [`crate::fork`]); a thread costs
//! microseconds against the tens of microseconds a disk read takes.

use std::sync::Mutex;

use super::file::SpillFile;
use crate::Result;

/// One read of a spill file into a slice of a batch's output.
pub struct SpillRead<'a> {
    /// The file read.
    pub file: &'a SpillFile,
    /// Data offset in the file.
    pub offset: u64,
    /// Where the bytes land.
    pub dst: &'a mut [u8],
}

/// Most threads one batch's spilled reads use, whatever `DDSTORE_MAX_INFLIGHT`
/// says. Measured (`make bench-spill`'s 3 KB rows, 4 loader threads, a
/// virtio disk): 64 threads per batch read 10k rows/s, 16 read 25k/s, 8
/// read 25-29k/s (the disk's random-read limit with 32 in flight: 18k/s per
/// rank); several loader threads reading at once add up.
pub const MAX_READ_THREADS: usize = 8;

/// Most threads a read ahead (`Store::prefetch`) uses: it is the one reader
/// of the rows it stages (the loader's reads wait for them), so it keeps as
/// many reads in flight as the disk's random-read limit is measured with.
pub const MAX_READ_AHEAD_THREADS: usize = 32;

/// Bytes a read ahead keeps in flight: rows are read in the order they
/// are needed, and with no more than this in flight the soonest needed come
/// in first (a stage full of large rows read all at once would deliver its
/// first batch only when its last came in). Measured on this project's
/// virtio disk (fio, `O_DIRECT`): 64 MiB in flight in 4 to 16 MiB reads
/// reads as fast as more does.
pub const READ_AHEAD_BYTES: usize = 64 << 20;

/// Reads a read ahead of rows of `row_bytes` keeps in flight: as many as
/// [`READ_AHEAD_BYTES`] holds (at least 1), at most `inflight`
/// (`DDSTORE_MAX_INFLIGHT`) and [`MAX_READ_AHEAD_THREADS`] (small rows:
/// the disk's random-read limit).
pub fn read_ahead_depth(inflight: usize, row_bytes: usize) -> usize {
    (READ_AHEAD_BYTES / row_bytes.max(1))
        .clamp(1, MAX_READ_AHEAD_THREADS)
        .min(inflight.max(1))
}

/// Carries out `reads` with up to `inflight` of them in flight (at most
/// [`MAX_READ_AHEAD_THREADS`]); the first error is returned after every
/// thread stopped.
pub fn read_all(reads: Vec<SpillRead<'_>>, inflight: usize) -> Result<()> {
    run_all(reads, inflight, |r, scratch| {
        r.file.read_at(r.offset, r.dst, scratch)
    })
}

/// Runs `work` on every job of `jobs`, in their order, up to `inflight` at once (at most
/// [`MAX_READ_AHEAD_THREADS`] threads), each thread with its own scratch
/// buffer for `O_DIRECT` bounces; after the first error the other threads
/// stop at their next job, and it is returned once every thread stopped.
pub fn run_all<T: Send>(
    jobs: Vec<T>,
    inflight: usize,
    work: impl Fn(T, &mut Vec<u8>) -> Result<()> + Sync,
) -> Result<()> {
    let threads = inflight.clamp(1, MAX_READ_AHEAD_THREADS).min(jobs.len());
    if threads <= 1 {
        let mut scratch = Vec::new();
        return jobs.into_iter().try_for_each(|j| work(j, &mut scratch));
    }
    let mut jobs = jobs;
    jobs.reverse(); // taken from the back: the first job first
    let queue = Mutex::new(jobs);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut scratch = Vec::new();
                    loop {
                        let next = queue.lock().unwrap().pop();
                        let Some(job) = next else { return Ok(()) };
                        if let Err(e) = work(job, &mut scratch) {
                            queue.lock().unwrap().clear(); // the others stop at their next take
                            return Err(e);
                        }
                    }
                })
            })
            .collect();
        let mut first = Ok(());
        for h in handles {
            let r = h.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
            if first.is_ok() {
                first = r;
            }
        }
        first
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_ahead_keeps_a_bounded_number_of_bytes_in_flight() {
        // 14.65 MB rows: 4 in flight; 114 KB and 3 KB rows: the thread limit.
        assert_eq!(read_ahead_depth(64, 14_650_000), 4);
        assert_eq!(read_ahead_depth(64, 114_000), MAX_READ_AHEAD_THREADS);
        assert_eq!(read_ahead_depth(64, 3_000), MAX_READ_AHEAD_THREADS);
        // Rows past READ_AHEAD_BYTES: one at a time; DDSTORE_MAX_INFLIGHT caps it.
        assert_eq!(read_ahead_depth(64, 200 << 20), 1);
        assert_eq!(read_ahead_depth(2, 3_000), 2);
        assert_eq!(read_ahead_depth(0, 3_000), 1);
    }
}
