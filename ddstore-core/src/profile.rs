//! Read counters per variable, summed on request.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::transport::ReaderTimes;

/// Live read counters of one variable, updated by reading threads.
#[derive(Default, Debug)]
pub struct Counters {
    /// `get_batch` calls.
    pub calls: AtomicU64,
    /// Rows read.
    pub rows: AtomicU64,
    /// Bytes read.
    pub bytes: AtomicU64,
    /// Rows served from this process's own share.
    pub local_rows: AtomicU64,
    /// Rows served by memcpy from a same-node peer's mapping.
    pub node_rows: AtomicU64,
    /// Rows read through the transport.
    pub remote_rows: AtomicU64,
    /// Transport reads posted (after coalescing and splitting).
    pub remote_reads: AtomicU64,
    /// Time spent waiting on the transport, in nanoseconds.
    pub remote_ns: AtomicU64,
    /// Time spent in memory copies, in nanoseconds.
    pub copy_ns: AtomicU64,
    /// Part of `remote_ns` spent waiting for completions (the completion queue, MPI flushes).
    pub cq_ns: AtomicU64,
    /// Part of `remote_ns` spent registering read destinations.
    pub mr_ns: AtomicU64,
    /// Part of `remote_ns` spent waiting for a lock before posting reads.
    pub lock_ns: AtomicU64,
    /// Requests sent through owner-side gather paths (the rest of `remote_reads` went one-sided).
    pub gather_requests: AtomicU64,
    /// Gather requests an owner answered "busy", sent again after a wait.
    pub busy_retries: AtomicU64,
    /// Rows this process read from memory: own or same-node shares (memory hits).
    pub memory_rows: AtomicU64,
    /// Rows read from spill files (own or same-node owners'; see [`crate::spill`]).
    pub spilled_rows: AtomicU64,
    /// Spill file reads posted.
    pub spilled_reads: AtomicU64,
    /// Spilled rows served from the read-ahead stage (prefetch hits).
    pub prefetch_hits: AtomicU64,
    /// Time spent reading spill files, in nanoseconds.
    pub spill_ns: AtomicU64,
}

/// A snapshot of [`Counters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Profile {
    /// `get_batch` calls.
    pub calls: u64,
    /// Rows read.
    pub rows: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Rows served from this process's own share.
    pub local_rows: u64,
    /// Rows copied from a same-node peer's mapping.
    pub node_rows: u64,
    /// Rows read through the transport.
    pub remote_rows: u64,
    /// Transport reads posted.
    pub remote_reads: u64,
    /// Nanoseconds waiting on the transport.
    pub remote_ns: u64,
    /// Nanoseconds in memory copies.
    pub copy_ns: u64,
    /// Nanoseconds of `remote_ns` waiting for completions.
    pub cq_ns: u64,
    /// Nanoseconds of `remote_ns` registering read destinations.
    pub mr_ns: u64,
    /// Nanoseconds of `remote_ns` waiting for a lock before posting.
    pub lock_ns: u64,
    /// Requests sent through owner-side gather paths.
    pub gather_requests: u64,
    /// Gather requests an owner answered "busy", sent again after a wait.
    pub busy_retries: u64,
    /// Messages this variable's readers received and discarded: gather
    /// replies not bound to a request they made (forged, or late).
    pub rejected_replies: u64,
    /// Rows read from memory (own or same-node shares).
    pub memory_rows: u64,
    /// Rows read from spill files.
    pub spilled_rows: u64,
    /// Spill file reads posted.
    pub spilled_reads: u64,
    /// Spilled rows served from the read-ahead stage.
    pub prefetch_hits: u64,
    /// Nanoseconds reading spill files.
    pub spill_ns: u64,
}

impl Counters {
    /// The current values (each read on its own, not as one atomic snapshot).
    pub fn snapshot(&self) -> Profile {
        Profile {
            calls: self.calls.load(Relaxed),
            rows: self.rows.load(Relaxed),
            bytes: self.bytes.load(Relaxed),
            local_rows: self.local_rows.load(Relaxed),
            node_rows: self.node_rows.load(Relaxed),
            remote_rows: self.remote_rows.load(Relaxed),
            remote_reads: self.remote_reads.load(Relaxed),
            remote_ns: self.remote_ns.load(Relaxed),
            copy_ns: self.copy_ns.load(Relaxed),
            cq_ns: self.cq_ns.load(Relaxed),
            mr_ns: self.mr_ns.load(Relaxed),
            lock_ns: self.lock_ns.load(Relaxed),
            gather_requests: self.gather_requests.load(Relaxed),
            busy_retries: self.busy_retries.load(Relaxed),
            rejected_replies: 0,
            memory_rows: self.memory_rows.load(Relaxed),
            spilled_rows: self.spilled_rows.load(Relaxed),
            spilled_reads: self.spilled_reads.load(Relaxed),
            prefetch_hits: self.prefetch_hits.load(Relaxed),
            spill_ns: self.spill_ns.load(Relaxed),
        }
    }

    /// Adds what a reader spent during one transport call (a [`ReaderTimes`] difference).
    pub fn add_reader_times(&self, t: ReaderTimes) {
        Self::add(&self.cq_ns, t.cq_ns);
        Self::add(&self.mr_ns, t.mr_ns);
        Self::add(&self.lock_ns, t.lock_ns);
        Self::add(&self.gather_requests, t.gather_requests);
        Self::add(&self.busy_retries, t.busy_retries);
    }

    /// Adds `n` to one counter.
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }
}

impl Profile {
    /// Every counter with its name, in the order `get_profile()` reports them.
    pub fn fields(&self) -> [(&'static str, u64); 20] {
        [
            ("calls", self.calls),
            ("rows", self.rows),
            ("bytes", self.bytes),
            ("local_rows", self.local_rows),
            ("node_rows", self.node_rows),
            ("remote_rows", self.remote_rows),
            ("remote_reads", self.remote_reads),
            ("remote_ns", self.remote_ns),
            ("copy_ns", self.copy_ns),
            ("cq_ns", self.cq_ns),
            ("mr_ns", self.mr_ns),
            ("lock_ns", self.lock_ns),
            ("gather_requests", self.gather_requests),
            ("busy_retries", self.busy_retries),
            ("rejected_replies", self.rejected_replies),
            ("memory_rows", self.memory_rows),
            ("spilled_rows", self.spilled_rows),
            ("spilled_reads", self.spilled_reads),
            ("prefetch_hits", self.prefetch_hits),
            ("spill_ns", self.spill_ns),
        ]
    }
}
