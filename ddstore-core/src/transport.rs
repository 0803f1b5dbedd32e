//! What a transport (MPI RMA, libfabric) provides to the store.
//!
//! A transport knows nothing about variables, dtypes or Python: it allocates
//! or registers a rank's share, tells every rank how to reach every share,
//! and reads byte ranges of remote shares into a destination buffer.

use std::sync::Arc;

use crate::comm::Comm;
use crate::external::ExternalShare;
use crate::memory::Memory;
use crate::region::NodeLocator;
use crate::{Error, Result};

/// One byte range of a remote share, to land at `dst_offset` of the destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteRead {
    /// Rank whose share is read.
    pub owner: usize,
    /// Byte offset inside the owner's share.
    pub offset: u64,
    /// Bytes to read.
    pub len: usize,
    /// Byte offset inside the destination buffer.
    pub dst_offset: usize,
}

/// What a share looks like after `Transport::expose`.
pub struct Exposed {
    /// This rank's own share: written while loading, read by memcpy.
    pub local: Arc<dyn Memory>,
    /// Other ranks' shares readable by memcpy (same node), indexed by rank; `None` = remote.
    pub node_peers: Vec<Option<Arc<dyn Memory>>>,
    /// One-sided access to every rank's share.
    pub remote: Arc<dyn RemoteShares>,
    /// One record per rank that another job passes to `Transport::attach`
    /// (method 2): what [`RemoteShares::records`] gives back.
    pub records: Vec<Vec<u8>>,
    /// Per rank, where a same-node process of another job maps its share
    /// (empty when the transport has no such route).
    pub node_locators: Vec<Option<NodeLocator>>,
}

/// Turns a share's memory region into the share a spilled variable reads
/// (see [`Transport::expose_spilled`]).
pub type WrapShare<'a> = &'a dyn Fn(Arc<dyn Memory>) -> Arc<dyn Memory>;

/// A share allocated (and registered) on this rank whose peers are not
/// known yet (see [`Transport::prepare`]): the store writes this rank's
/// rows into `local` and sends `record` (and `locator`) in the one
/// allgather that creates the variable, then hands every rank's record to
/// [`Transport::connect`].
pub struct Prepared {
    /// This rank's own share (as [`Exposed::local`]).
    pub local: Arc<dyn Memory>,
    /// Where a same-node process maps the share (`None`: not shared on the node).
    pub locator: Option<NodeLocator>,
    /// What the other ranks need to read the share (as one of [`Exposed::records`]).
    pub record: Vec<u8>,
    /// The transport's own objects (registrations), for `connect`.
    pub state: Box<dyn std::any::Any + Send>,
}

/// How a share is exposed.
pub struct ExposeOptions {
    /// Variable name, for messages and shared-memory file names.
    pub name: String,
    /// Offer the share to same-node peers through shared memory.
    pub node_sharing: bool,
    /// Other jobs may read the share (a method-2 core job): once freed, its
    /// address range stays reserved so that a reader of another job that
    /// still holds its address cannot read the next share mapped there.
    pub keep_address: bool,
    /// Every rank's share length, when the store agreed on them already
    /// (the transport need not gather them again).
    pub lens: Option<Vec<u64>>,
}

/// A way to make rank shares readable by other ranks (MPI RMA, libfabric, node-only).
pub trait Transport: Send + Sync {
    /// e.g. "mpi-rma", "ofi:tcp;ofi_rxm".
    fn name(&self) -> String;
    /// Collective over `comm`: allocates (or registers) `len` bytes for this
    /// rank's share and makes every rank's share readable by every rank.
    fn expose(&self, comm: &Arc<dyn Comm>, len: usize, opts: &ExposeOptions) -> Result<Exposed>;
    /// Collective over `comm`: as `expose`, for a share in memory the caller
    /// owns (device memory, see [`ExternalShare`]). Never shared on the node
    /// through shared memory. Transports without device-memory registration
    /// serve a one-rank group only.
    fn expose_external(
        &self,
        comm: &Arc<dyn Comm>,
        share: ExternalShare,
        _opts: &ExposeOptions,
    ) -> Result<Exposed> {
        expose_alone(&self.name(), comm, share)
    }
    /// Collective over `comm`: as `expose` for a share of `len` bytes whose
    /// first `mem_len` are in memory (the rest in a spill file: see
    /// [`crate::spill`]). `wrap` turns the region into the share of `len`
    /// bytes: it becomes `Exposed::local`, and transports with an owner-side
    /// gather path serve it (its spilled rows too) to remote readers. Others
    /// expose the region only: remote reads of spilled rows are refused by
    /// the store before they are sent.
    fn expose_spilled(
        &self,
        comm: &Arc<dyn Comm>,
        mem_len: usize,
        len: usize,
        opts: &ExposeOptions,
        wrap: WrapShare<'_>,
    ) -> Result<Exposed> {
        let _ = len;
        let mut exposed = self.expose(comm, mem_len, opts)?;
        exposed.local = wrap(exposed.local);
        Ok(exposed)
    }
    /// Collective, before a store creates variables (every rank calls it,
    /// whatever its own arguments): agrees on what the job's transports
    /// share (the job's key, once). The default has nothing to agree.
    fn ready(&self, _comm: &Arc<dyn Comm>) -> Result<()> {
        Ok(())
    }
    /// Not collective: allocates `len` bytes for this rank's share (or, for
    /// a spilled share, `len` bytes in memory of `spilled.0` in all, the
    /// region wrapped by `spilled.1`: see [`Transport::expose_spilled`]),
    /// registers it and returns its record, so that the store exchanges it
    /// with the variable's own agreement: one allgather per `add`. `None`:
    /// this transport only exposes collectively ([`Transport::expose`]).
    fn prepare(
        &self,
        _comm: &Arc<dyn Comm>,
        _len: usize,
        _opts: &ExposeOptions,
        _spilled: Option<(usize, WrapShare<'_>)>,
    ) -> Result<Option<Prepared>> {
        Ok(None)
    }
    /// Not collective: every rank's share from every rank's
    /// [`Prepared::record`] (in rank order), this rank's `prepared` among them.
    fn connect(&self, _prepared: Prepared, _records: &[Vec<u8>]) -> Result<Arc<dyn RemoteShares>> {
        Err(Error::Unsupported(format!(
            "the {} transport exposes shares collectively only",
            self.name()
        )))
    }
    /// Method 2: reach shares another job published (`Exposed::records`).
    fn attach(&self, records: &[Vec<u8>]) -> Result<Arc<dyn RemoteShares>>;
    /// How remote rows are read: "one-sided" reads, or "gather" (one request
    /// per owner per batch, answered by the owner; see `DDSTORE_REMOTE_GATHER`).
    fn remote_path(&self) -> &'static str {
        "one-sided"
    }
    /// The job's secret, from which the transport derives the key that
    /// authenticates requests between the job's processes (transports that
    /// exchange no requests ignore it). Set before shares are exposed or
    /// attached; else the first `expose` draws one and shares it over `comm`.
    fn set_secret(&self, _secret: &[u8]) {}
    /// The job's secret in use (given, or agreed at the first `expose`), for a
    /// spawned worker of this process to authenticate its requests with.
    fn secret(&self) -> Option<Vec<u8>> {
        None
    }
    /// Requests from the network dropped unanswered (see `set_secret`).
    fn rejected_requests(&self) -> u64 {
        0
    }
    /// Closes what the transport opened, at the store's `free` (after every
    /// variable's [`RemoteShares::close`]), reporting the first failure;
    /// objects something else still holds close when it drops them.
    fn close(&self) -> Result<()> {
        Ok(())
    }
}

/// Remote access to the shares of one variable.
pub trait RemoteShares: Send + Sync {
    /// A reader for one thread (or one forked process); readers are pooled by the store.
    fn open_reader(&self) -> Result<Box<dyn ShareReader>>;
    /// Per rank, the record another job passes to `Transport::attach` to
    /// read these shares (method 2, spawned workers); empty where the
    /// transport cannot be reached from another process.
    fn records(&self) -> Vec<Vec<u8>> {
        Vec::new()
    }
    /// Bytes each rank exposes, where the transport knows (checks attached layouts).
    fn share_lens(&self) -> Option<Vec<u64>> {
        None
    }
    /// Longest read a reader takes in one piece, where the transport has a
    /// limit below `DDSTORE_MAX_READ_BYTES` (a provider's longest message):
    /// the store plans reads no longer than this, so readers never split.
    fn max_read_len(&self) -> Option<usize> {
        None
    }
    /// Registers a destination buffer once so reads into it skip registration.
    fn register_dst(&self, _addr: usize, _len: usize) -> Result<()> {
        Ok(())
    }
    /// Undoes [`RemoteShares::register_dst`].
    fn unregister_dst(&self, _addr: usize, _len: usize) -> Result<()> {
        Ok(())
    }
    /// Called in a forked child before any read: objects inherited from the
    /// parent must be abandoned (never closed) and fresh ones opened lazily.
    fn forget_after_fork(&self) -> Result<()> {
        Ok(())
    }
    /// The memory key under which `owner` serves this share to the gather
    /// path (`None`: read it one-sided). A ragged read names the ends
    /// share's key in its values request, so both go in one round trip.
    fn gather_key(&self, _owner: usize) -> Option<u64> {
        None
    }
    /// Messages its readers received and discarded (replies not bound to
    /// a request they made).
    fn rejected_replies(&self) -> u64 {
        0
    }
    /// Closes the variable's shares at the store's `free` when this is their
    /// last holder, reporting the first failure (dropping them closes them
    /// too, but can only log one).
    fn close(self: Arc<Self>) -> Result<()> {
        Ok(())
    }
}

/// Whole rows of a ragged variable to read from one owner in one round
/// trip (the owner resolves their lengths): see [`ShareReader::read_ragged_rows`].
pub struct RaggedRequest<'a> {
    /// The owning rank.
    pub owner: usize,
    /// The owner's gather key of the ragged variable's ends share.
    pub ends_key: u64,
    /// Distinct local row numbers in the owner's share.
    pub rows: &'a [u64],
    /// Longest row the owner holds, in bytes (bounds the reply).
    pub max_row_bytes: u64,
}

/// Rows read by [`ShareReader::read_ragged_rows`]: their values back to back
/// somewhere in `data`, and per request, per row (in request order) its
/// length in units and the offset of its values in `data`.
pub struct RaggedRows {
    /// Reader-filled bytes (the caller copies rows out of it).
    pub data: Vec<u8>,
    /// Per request given, per row: (units, offset in `data`).
    pub rows: Vec<Vec<(u64, usize)>>,
}

/// Time a reader spent in parts of its reads, summed over its life (what `get_profile()`
/// reports as `cq`, `mr` and `lock_wait`; the store adds the difference over each call).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReaderTimes {
    /// Waiting for completions: the completion queue, MPI flushes (nanoseconds).
    pub cq_ns: u64,
    /// Registering read destinations (nanoseconds).
    pub mr_ns: u64,
    /// Waiting for a lock before posting, e.g. MPI below `MPI_THREAD_MULTIPLE` (nanoseconds).
    pub lock_ns: u64,
    /// Requests sent through an owner-side gather path (a count, not a time).
    pub gather_requests: u64,
    /// Gather requests an owner answered "busy", sent again after a wait (a count).
    pub busy_retries: u64,
}

impl ReaderTimes {
    /// What was spent since `earlier` (a snapshot of the same reader).
    pub fn since(self, earlier: ReaderTimes) -> ReaderTimes {
        ReaderTimes {
            cq_ns: self.cq_ns.saturating_sub(earlier.cq_ns),
            mr_ns: self.mr_ns.saturating_sub(earlier.mr_ns),
            lock_ns: self.lock_ns.saturating_sub(earlier.lock_ns),
            gather_requests: self.gather_requests.saturating_sub(earlier.gather_requests),
            busy_retries: self.busy_retries.saturating_sub(earlier.busy_retries),
        }
    }

    /// Both spans of time added up.
    pub fn plus(self, other: ReaderTimes) -> ReaderTimes {
        ReaderTimes {
            cq_ns: self.cq_ns.saturating_add(other.cq_ns),
            mr_ns: self.mr_ns.saturating_add(other.mr_ns),
            lock_ns: self.lock_ns.saturating_add(other.lock_ns),
            gather_requests: self.gather_requests.saturating_add(other.gather_requests),
            busy_retries: self.busy_retries.saturating_add(other.busy_retries),
        }
    }
}

/// Reads ranges of remote shares; one per thread, pooled by the store.
pub trait ShareReader: Send {
    /// Time spent so far in completion waits, registrations and locks (zeros where a
    /// transport does not measure them).
    fn times(&self) -> ReaderTimes {
        ReaderTimes::default()
    }
    /// Reads every range into `dst`: all are posted (up to the in-flight
    /// window) before waiting. On error no guarantee is made about `dst`.
    fn read_many(&mut self, reads: &[RemoteRead], dst: &mut [u8]) -> Result<()>;
    /// Reads whole ragged rows (values of `unit_bytes`-byte units) with one
    /// request per owner, the owners resolving the rows' lengths themselves.
    /// `Ok(None)`: this reader cannot (no gather path, or a row too long for
    /// one request); the caller reads row ends, then values. `staging` is a
    /// buffer to land the replies in (grown as needed, its contents
    /// replaced): it comes back as [`RaggedRows::data`], so callers reuse it.
    fn read_ragged_rows(
        &mut self,
        _unit_bytes: usize,
        _requests: &[RaggedRequest<'_>],
        _staging: Vec<u8>,
    ) -> Result<Option<RaggedRows>> {
        Ok(None)
    }
}

/// The remote route of a share no other rank reaches (a node-only store, a
/// one-rank external share): any read of another rank is refused.
pub(crate) struct Unreachable;

impl RemoteShares for Unreachable {
    fn open_reader(&self) -> Result<Box<dyn ShareReader>> {
        Ok(Box::new(Unreachable))
    }
}

impl ShareReader for Unreachable {
    fn read_many(&mut self, reads: &[RemoteRead], _dst: &mut [u8]) -> Result<()> {
        match reads.first() {
            None => Ok(()),
            Some(r) => Err(Error::Unsupported(format!(
                "rank {} is not reachable by memory copy",
                r.owner
            ))),
        }
    }
}

/// A single rank's external share, with no peer to reach: what a transport
/// without device-memory support can still offer (a one-process store).
fn expose_alone(transport: &str, comm: &Arc<dyn Comm>, share: ExternalShare) -> Result<Exposed> {
    if comm.size() != 1 {
        return Err(Error::Unsupported(format!(
            "the {transport} transport cannot give other ranks access to a share in {} memory: \
             use method=1 (libfabric) with add_device=, or drop add_device=",
            share.iface().name()
        )));
    }
    Ok(Exposed {
        local: Arc::new(share),
        node_peers: vec![None],
        remote: Arc::new(Unreachable),
        records: Vec::new(),
        node_locators: Vec::new(),
    })
}
