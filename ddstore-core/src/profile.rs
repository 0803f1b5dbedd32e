//! Read counters per variable, summed on request.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

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
    /// Messages this variable's readers received and discarded: gather
    /// replies not bound to a request they made (forged, or late).
    pub rejected_replies: u64,
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
            rejected_replies: 0,
        }
    }

    /// Adds `n` to one counter.
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }
}

impl Profile {
    /// Every counter with its name, in the order `get_profile()` reports them.
    pub fn fields(&self) -> [(&'static str, u64); 10] {
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
            ("rejected_replies", self.rejected_replies),
        ]
    }
}
