//! The owner's reads of spilled rows for gather replies, off the progress
//! thread: a reply whose ranges reach into a spill file (see
//! `ddstore_core::spill`) is packed by one of [`SPILL_READ_THREADS`]
//! threads while the progress thread goes on answering and sending; it is
//! sent when its rows are in. Each reply's reads run at its share's depth
//! (`DDSTORE_MAX_INFLIGHT`, at most `ddstore_core::spill::read::MAX_READ_THREADS`),
//! so up to `SPILL_READ_THREADS` times that many reads are in flight.
//!
//! The threads start with the first spilled reply and stop when the server
//! does. They belong to the serving process: a forked child never serves
//! (its transport state is abandoned, see `ddstore_core::fork`), and a
//! pool dropped in another process than its creator's does not join.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use ddstore_core::fork::CreatedBy;
use ddstore_core::memory::Memory;

/// Replies packed at once.
pub const SPILL_READ_THREADS: usize = 4;

/// One reply to pack: `ranges` of `share` into `buf` (of their total length).
pub struct Job<T> {
    /// What the server needs back to send it.
    pub tag: T,
    /// The share (memory and spill file).
    pub share: Arc<dyn Memory>,
    /// (offset, len) in the share, checked inside it.
    pub ranges: Vec<(u64, u64)>,
    /// Where the bytes go.
    pub buf: Vec<u8>,
    /// Bytes at the front of `buf` already filled (the ranges go after them).
    pub skip: usize,
}

/// A packed reply: its tag, its buffer, and whether every read succeeded.
pub struct Done<T> {
    /// The job's tag.
    pub tag: T,
    /// The job's buffer, filled when `ok`.
    pub buf: Vec<u8>,
    /// Whether the reads succeeded.
    pub ok: bool,
}

struct State<T> {
    jobs: VecDeque<Job<T>>,
    done: Vec<Done<T>>,
    stop: bool,
}

struct Shared<T> {
    state: Mutex<State<T>>,
    work: Condvar,
    /// Packed replies waiting to be taken (read without the lock).
    ready: AtomicUsize,
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The spill-read threads of one gather server.
pub struct SpillReads<T: Send + 'static> {
    shared: Arc<Shared<T>>,
    threads: Vec<JoinHandle<()>>,
    /// Called when a reply is packed (wakes the progress thread).
    wake: Arc<dyn Fn() + Send + Sync>,
    created: CreatedBy,
}

impl<T: Send + 'static> SpillReads<T> {
    /// No threads yet; `wake` is called from a thread that packed a reply.
    pub fn new(wake: impl Fn() + Send + Sync + 'static) -> SpillReads<T> {
        SpillReads {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    jobs: VecDeque::new(),
                    done: Vec::new(),
                    stop: false,
                }),
                work: Condvar::new(),
                ready: AtomicUsize::new(0),
            }),
            threads: Vec::new(),
            wake: Arc::new(wake),
            created: CreatedBy::this_process(),
        }
    }

    /// Queues `job`, starting the threads with the first one. A thread
    /// that cannot be started leaves the job to those that run; with none
    /// it is packed here.
    pub fn submit(&mut self, job: Job<T>) {
        while self.threads.len() < SPILL_READ_THREADS {
            let shared = self.shared.clone();
            let wake = self.wake.clone();
            match std::thread::Builder::new()
                .name("ddstore-spill-serve".into())
                .spawn(move || serve(&shared, &*wake))
            {
                Ok(t) => self.threads.push(t),
                Err(_) => break,
            }
        }
        if self.threads.is_empty() {
            let done = pack(job);
            self.shared.lock().done.push(done);
            self.shared.ready.fetch_add(1, Ordering::Release);
            return;
        }
        self.shared.lock().jobs.push_back(job);
        self.shared.work.notify_one();
    }

    /// Whether packed replies wait to be taken.
    pub fn has_done(&self) -> bool {
        self.shared.ready.load(Ordering::Acquire) > 0
    }

    /// The replies packed since the last call.
    pub fn take_done(&self) -> Vec<Done<T>> {
        if !self.has_done() {
            return Vec::new();
        }
        let mut s = self.shared.lock();
        self.shared.ready.store(0, Ordering::Release);
        std::mem::take(&mut s.done)
    }

    /// Stops the threads after the replies they are packing (queued ones
    /// are dropped) and joins them.
    pub fn stop(&mut self) {
        {
            let mut s = self.shared.lock();
            s.stop = true;
            s.jobs.clear();
        }
        self.shared.work.notify_all();
        if self.created.is_this_process() {
            for t in self.threads.drain(..) {
                let _ = t.join();
            }
        }
    }
}

impl<T: Send + 'static> Drop for SpillReads<T> {
    fn drop(&mut self) {
        self.stop();
    }
}

fn pack<T>(mut job: Job<T>) -> Done<T> {
    let ok = job
        .share
        .read_ranges(&job.ranges, &mut job.buf[job.skip..])
        .is_ok();
    Done {
        tag: job.tag,
        buf: job.buf,
        ok,
    }
}

fn serve<T>(shared: &Shared<T>, wake: &(dyn Fn() + Send + Sync)) {
    loop {
        let job = {
            let mut s = shared.lock();
            loop {
                if s.stop {
                    return;
                }
                if let Some(j) = s.jobs.pop_front() {
                    break j;
                }
                s = shared.work.wait(s).unwrap_or_else(|p| p.into_inner());
            }
        };
        let done = pack(job);
        shared.lock().done.push(done);
        shared.ready.fetch_add(1, Ordering::Release);
        wake();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ddstore_core::region::Region;
    use std::sync::atomic::AtomicU64;
    use std::time::{Duration, Instant};

    #[test]
    fn replies_are_packed_off_the_calling_thread_and_woken() {
        let region = Region::anonymous(4096).unwrap();
        let bytes: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
        region.write_at(0, &bytes).unwrap();
        let share: Arc<dyn Memory> = Arc::new(region);
        let wakes = Arc::new(AtomicU64::new(0));
        let w = wakes.clone();
        let mut reads = SpillReads::new(move || {
            w.fetch_add(1, Ordering::Relaxed);
        });
        for k in 0..20u64 {
            reads.submit(Job {
                tag: k,
                share: share.clone(),
                ranges: vec![(k * 100, 10), (4000, 50)],
                buf: vec![0; 60],
                skip: 0,
            });
        }
        reads.submit(Job {
            tag: 99,
            share: share.clone(),
            ranges: vec![(4090, 10)], // past the share: a failed read
            buf: vec![0; 10],
            skip: 0,
        });
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while got.len() < 21 && Instant::now() < deadline {
            got.extend(reads.take_done());
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(got.len(), 21);
        for d in &got {
            if d.tag == 99 {
                assert!(!d.ok);
                continue;
            }
            let k = d.tag as usize;
            assert!(d.ok);
            assert_eq!(&d.buf[..10], &bytes[k * 100..k * 100 + 10]);
            assert_eq!(&d.buf[10..], &bytes[4000..4050]);
        }
        assert_eq!(wakes.load(Ordering::Relaxed), 21);
        assert!(!reads.has_done());
        reads.stop();
        assert!(reads.threads.is_empty());
    }
}
