//! `MpiRma`: method 0. Each share is MPI window memory (allocated by MPI,
//! written in place while loading), read by `MPI_Rget` inside one
//! `MPI_Win_lock_all` epoch that lasts the window's life.
//!
//! Reads poll their requests, so a signal (Ctrl-C) or `DDSTORE_TIMEOUT_S`
//! ends the wait. A read that gives up with gets still pending must not let
//! MPI write memory that is freed or read again: such reads land in a buffer
//! the batch owns (copied out on success, kept aside when abandoned). Targets
//! whose gets are seen to complete inside `MPI_Rget` itself (osc/sm: a memory
//! copy) are read straight into the caller's memory with `MPI_Get` and
//! flushes that return at once, as fast as before.
//!
//! Dropping the last handle of an exposed share frees its windows, which is
//! collective: for method 0 the store's `free()` must be called on every rank.

use ddstore_core::fork::CreatedBy;
use std::os::raw::c_int;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ddstore_core::comm::{gather_u64, Comm};
use ddstore_core::memory::{Memory, RawMemory};
use ddstore_core::transport::{
    ExposeOptions, Exposed, ReaderTimes, RemoteRead, RemoteShares, ShareReader, Transport,
};
use mpi::ffi;

use super::comm::MpiComm;
use super::init::{library_version, thread_level};
use super::window::{Get, Gets, Window};
use crate::error::{FabricError, FabricResult};

const NEEDS_MPI_COMM: &str = "method 0 (MPI RMA) needs an MPI communicator; use method=1 with a file or torch.distributed communicator";
const FORKED: &str = "method 0 cannot be read from a forked process (no MPI after fork): use ThreadDataLoader, or method=1";
/// Test hook: group ranks into pretend nodes of this many consecutive ranks
/// instead of asking MPI which ranks share memory, to exercise the
/// multi-node layout (shared window per node + a window over all ranks) on one host.
const FAKE_NODE_SIZE_ENV: &str = "DDSTORE_MPI_FAKE_NODE_SIZE";

/// Method 0: MPI one-sided reads.
#[derive(Debug)]
pub struct MpiRma {
    /// How long a read waits for a target (`DDSTORE_TIMEOUT_S`).
    timeout: Duration,
}

/// `DDSTORE_TIMEOUT_S`'s default, for [`MpiRma::new`].
const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(60);

impl Default for MpiRma {
    fn default() -> Self {
        MpiRma::new()
    }
}

impl MpiRma {
    /// The method-0 transport; MPI must be initialised before a share is
    /// exposed. Reads wait 60 s for a target (see [`MpiRma::with_timeout`]).
    pub fn new() -> MpiRma {
        MpiRma::with_timeout(DEFAULT_READ_TIMEOUT)
    }

    /// The method-0 transport whose reads give up on a target after
    /// `timeout` (the store's `DDSTORE_TIMEOUT_S`).
    pub fn with_timeout(timeout: Duration) -> MpiRma {
        MpiRma { timeout }
    }
}

/// The windows of one share, freed in field order: the window over all
/// ranks (which may expose memory of the shared window) before the shared one.
struct ShareWindows {
    /// Set when reads go through a window other than `owner_of_memory`.
    over_all_ranks: Option<Window>,
    /// The window that owns this rank's memory (allocated or shared).
    owner_of_memory: Window,
}

impl ShareWindows {
    fn read_window(&self) -> &Window {
        self.over_all_ranks
            .as_ref()
            .unwrap_or(&self.owner_of_memory)
    }
}

/// A pointer MPI returned for `len` bytes, made safe for a `RawMemory`:
/// an empty share gets a dangling (never dereferenced) non-null pointer.
fn usable_ptr(ptr: *mut u8, len: usize) -> FabricResult<*mut u8> {
    if len == 0 {
        return Ok(NonNull::<u8>::dangling().as_ptr());
    }
    if ptr.is_null() {
        return Err(FabricError::Mpi {
            call: "MPI window allocation",
            code: 0,
            message: format!("MPI returned a null address for a share of {len} bytes"),
            peer: None,
        });
    }
    Ok(ptr)
}

/// The ranks sharing memory with this one, or `None` when no rank shares
/// memory with another. Collective; every rank gets the same kind of answer
/// so all ranks create the same windows.
fn node_comm(comm: &MpiComm) -> ddstore_core::Result<Option<MpiComm>> {
    let fake = ddstore_core::config::env_setting(FAKE_NODE_SIZE_ENV)?
        .and_then(|v| v.parse::<usize>().ok());
    let node = match fake {
        Some(n) if n > 0 => comm.split_raw((comm.rank() / n) as c_int, comm.rank() as c_int)?,
        _ => comm.split_node()?,
    };
    let node_sizes = gather_u64(comm, node.size() as u64)?;
    Ok(if node_sizes.iter().any(|&n| n > 1) {
        Some(node)
    } else {
        None
    })
}

/// Refuses, on every rank alike, a communicator spanning several nodes when this MPI cannot
/// make a window across them (e.g. Open MPI over TCP at `MPI_THREAD_MULTIPLE`: `osc/rdma`
/// needs an RDMA network and `osc/pt2pt` refuses that level). Collective; runs before any
/// share is created. A one-byte probe window is the only reliable test: which one-sided
/// component serves a window is decided inside `MPI_Win_allocate`.
fn check_windows_span_nodes(comm: &MpiComm) -> ddstore_core::Result<()> {
    let size = comm.size();
    if size < 2 {
        return Ok(());
    }
    let node = comm.split_node()?;
    if node.size() == size {
        return Ok(());
    }
    let nodes: u64 = gather_u64(comm, u64::from(node.rank() == 0))?.iter().sum();
    node.close()?;
    let probe = Window::allocate(comm, 1);
    let ok = gather_u64(comm, u64::from(probe.is_ok()))?;
    let failed: Vec<usize> = (0..size).filter(|&r| ok[r] == 0).collect();
    let mine = match probe {
        // Freeing is collective over the ranks that made it: only when all did.
        Ok(win) if failed.is_empty() => {
            win.close()?;
            return Ok(());
        }
        // Some ranks failed: a collective free could hang, so this one-byte probe is leaked.
        Ok(win) => {
            std::mem::forget(win);
            "the probe window was made here, not on the ranks named".to_string()
        }
        Err(e) => e.to_string(),
    };
    Err(FabricError::Unavailable(span_refusal(size, nodes, &failed, &mine)).into())
}

/// The message of a refused multi-node method 0: the MPI, why, and what would work.
fn span_refusal(size: usize, nodes: u64, failed: &[usize], detail: &str) -> String {
    let version = library_version();
    let version = version.lines().next().unwrap_or("unknown MPI").trim();
    let level = thread_level().map(|l| l.name()).unwrap_or("unknown");
    let shown: Vec<String> = failed.iter().take(8).map(|r| r.to_string()).collect();
    let more = if failed.len() > 8 { ", ..." } else { "" };
    let mut msg = format!(
        "method 0 (MPI RMA) cannot read across nodes here: {version} at thread level {level} has no \
         one-sided component for a window spanning nodes (a probe window over {size} ranks on \
         {nodes} nodes failed on ranks [{}{more}]: {detail}); nothing was created. Use method=1 \
         (DDSTORE_METHOD=1: libfabric reads over tcp, verbs or cxi)",
        shown.join(", ")
    );
    if version.contains("Open MPI") {
        msg.push_str(
            ", or Open MPI's active-message windows: OMPI_MCA_osc=sm,pt2pt with thread level \
             serialized (DDSTORE_MPI_THREAD_LEVEL=serialized, or mpi4py.rc.thread_level = \
             'serialized' before importing mpi4py); reads from a rank then complete only while \
             it is inside MPI. osc/rdma and osc/ucx need an RDMA network or UCX",
        );
    }
    msg
}

impl Transport for MpiRma {
    fn name(&self) -> String {
        "mpi-rma".into()
    }

    fn expose(
        &self,
        comm: &Arc<dyn Comm>,
        len: usize,
        opts: &ExposeOptions,
    ) -> ddstore_core::Result<Exposed> {
        let mpi_comm = comm
            .as_any()
            .downcast_ref::<MpiComm>()
            .ok_or_else(|| FabricError::Unavailable(NEEDS_MPI_COMM.into()))?;
        let size = mpi_comm.size();
        let me = mpi_comm.rank();
        // Every rank validates every size the same way, so all fail together
        // (the store agreed on the sizes already where it gives them).
        let sizes = match &opts.lens {
            Some(lens) if lens.len() == size => lens.clone(),
            _ => gather_u64(mpi_comm, len as u64)?,
        };
        let sizes: Vec<usize> = sizes.into_iter().map(|s| s as usize).collect();
        if let Some((rank, s)) = sizes
            .iter()
            .enumerate()
            .find(|(_, &s)| s > isize::MAX as usize)
        {
            return Err(FabricError::Invalid(format!(
                "rank {rank} asked for a share of {s} bytes for '{}', more than MPI can address",
                opts.name
            ))
            .into());
        }

        check_windows_span_nodes(mpi_comm)?;

        let node = if opts.node_sharing && size > 1 {
            node_comm(mpi_comm)?
        } else {
            None
        };
        let mut node_peers: Vec<Option<Arc<dyn Memory>>> = (0..size).map(|_| None).collect();
        let mut peer_views: Vec<(usize, *mut u8, usize)> = Vec::new();
        let windows = match node {
            Some(node) => {
                let shared = Window::allocate_shared(&node, len)?;
                let node_to_global = gather_u64(&node, me as u64)?;
                for (node_rank, &global) in node_to_global.iter().enumerate() {
                    let global = global as usize;
                    if node_rank == node.rank() {
                        continue;
                    }
                    let (ptr, peer_len) = shared.shared_query(node_rank)?;
                    let expected = sizes.get(global).copied().unwrap_or(usize::MAX);
                    if global >= size || peer_len < expected {
                        return Err(FabricError::Invalid(format!(
                            "node rank {node_rank} (rank {global}) shares {peer_len} bytes, expected {expected}"
                        ))
                        .into());
                    }
                    peer_views.push((global, ptr, expected));
                }
                let over_all_ranks = if node.size() < size {
                    let (base, mine) = shared.local();
                    // SAFETY: the memory belongs to `shared`, which is dropped
                    // after this window (field order of ShareWindows).
                    Some(unsafe { Window::create(mpi_comm, base, mine) }?)
                } else {
                    None
                };
                node.close()?;
                // With one node the shared window's ranks are the global ranks
                // (split_type keyed by rank keeps the order), so Gets use it directly.
                Arc::new(ShareWindows {
                    over_all_ranks,
                    owner_of_memory: shared,
                })
            }
            None => {
                let win = Window::allocate(mpi_comm, len)?;
                Arc::new(ShareWindows {
                    over_all_ranks: None,
                    owner_of_memory: win,
                })
            }
        };

        let owner: Arc<dyn std::any::Any + Send + Sync> = windows.clone();
        let (base, mine) = windows.owner_of_memory.local();
        let base = usable_ptr(base, mine)?;
        // SAFETY: MPI allocated `mine` bytes at `base` for this rank, writable,
        // and `owner` keeps the windows (and so the memory) alive.
        let local = unsafe { RawMemory::new(base, mine, true, owner.clone()) };
        for (global, ptr, peer_len) in peer_views {
            let ptr = usable_ptr(ptr, peer_len)?;
            // SAFETY: MPI_Win_shared_query gave this address of `peer_len`
            // bytes in the shared window that `owner` keeps alive; read-only.
            let view = unsafe { RawMemory::new(ptr, peer_len, false, owner.clone()) };
            node_peers[global] = Some(Arc::new(view));
        }
        open_access(comm, windows.read_window(), &sizes, self.timeout)?;
        let remote = Arc::new(MpiShares {
            inner: Arc::new(SharesInner {
                targets: (0..sizes.len()).map(|_| TargetGets::default()).collect(),
                windows,
                sizes,
                pid: CreatedBy::this_process(),
                forked: AtomicBool::new(false),
                abandoned: Mutex::new(Vec::new()),
                abandoned_count: AtomicUsize::new(0),
                timeout: self.timeout,
            }),
        });
        Ok(Exposed {
            local: Arc::new(local),
            node_peers,
            remote,
            records: Vec::new(),
            node_locators: Vec::new(),
        })
    }

    fn attach(&self, _records: &[Vec<u8>]) -> ddstore_core::Result<Arc<dyn RemoteShares>> {
        Err(FabricError::Unavailable(
            "method 0 (MPI RMA) shares cannot be read from another job: use method=2".into(),
        )
        .into())
    }
}

/// Every rank's share of one variable, read with `MPI_Rget`.
struct MpiShares {
    inner: Arc<SharesInner>,
}

struct SharesInner {
    /// Batches given up (a signal, the deadline) with gets pending, each
    /// owning the buffer they land in: freed once complete, leaked if still
    /// pending when the share is dropped. Before `windows`: dropping them
    /// calls no MPI.
    abandoned: Mutex<Vec<Gets>>,
    /// `abandoned.len()`, read without the lock on every read.
    abandoned_count: AtomicUsize,
    windows: Arc<ShareWindows>,
    /// Share size of every rank, gathered at expose.
    sizes: Vec<usize>,
    /// Per rank: what its gets were seen to do.
    targets: Vec<TargetGets>,
    /// How long a read waits for a target (`DDSTORE_TIMEOUT_S`).
    timeout: Duration,
    pid: CreatedBy,
    forked: AtomicBool,
}

/// Gets seen complete right after `MPI_Rget` returned before a target's
/// reads go straight into the caller's memory.
const GETS_TO_TRUST: u32 = 16;
/// Abandoned batches kept per share; past it the oldest is leaked.
const MAX_ABANDONED: usize = 64;

/// What one target's gets were seen to do (shared by the reader threads).
#[derive(Default)]
struct TargetGets {
    /// Gets that were complete right after `MPI_Rget` returned.
    done_at_post: AtomicU32,
    /// A get was pending after its post: the target needs waiting for
    /// (osc/pt2pt, rdma over a network), so its reads are staged for good.
    waits: AtomicBool,
}

impl TargetGets {
    /// Reads of this target may land in the caller's memory: its gets have
    /// always completed inside `MPI_Rget`, so no read waits for it.
    fn direct(&self) -> bool {
        !self.waits.load(Ordering::Relaxed)
            && self.done_at_post.load(Ordering::Relaxed) >= GETS_TO_TRUST
    }

    fn learn(&self, done_at_post: bool) {
        if done_at_post {
            self.done_at_post.fetch_add(1, Ordering::Relaxed);
        } else {
            self.waits.store(true, Ordering::Relaxed);
        }
    }

    fn decided(&self) -> bool {
        self.waits.load(Ordering::Relaxed)
            || self.done_at_post.load(Ordering::Relaxed) >= GETS_TO_TRUST
    }
}

impl SharesInner {
    /// Keeps `gets` (pending, given up on) until its requests complete.
    fn abandon(&self, gets: Gets) {
        let mut list = self.abandoned.lock().unwrap_or_else(|p| p.into_inner());
        list.push(gets);
        if list.len() > MAX_ABANDONED {
            drop(list.remove(0)); // leaks its buffer: MPI may still write it
        }
        self.abandoned_count.store(list.len(), Ordering::Relaxed);
    }

    /// Frees the abandoned batches whose gets have all completed.
    fn reap_abandoned(&self) -> FabricResult<()> {
        if self.abandoned_count.load(Ordering::Relaxed) == 0 {
            return Ok(());
        }
        let mut list = self.abandoned.lock().unwrap_or_else(|p| p.into_inner());
        let mut kept = Vec::with_capacity(list.len());
        for mut gets in list.drain(..) {
            if !gets.test_all()? {
                kept.push(gets);
            }
        }
        *list = kept;
        self.abandoned_count.store(list.len(), Ordering::Relaxed);
        Ok(())
    }

    fn check_not_forked(&self) -> FabricResult<()> {
        if self.forked.load(Ordering::Relaxed) || !self.pid.is_this_process() {
            return Err(FabricError::Unavailable(FORKED.into()));
        }
        Ok(())
    }

    fn validate(&self, reads: &[RemoteRead], dst_len: usize) -> FabricResult<()> {
        for r in reads {
            let Some(&share) = self.sizes.get(r.owner) else {
                return Err(FabricError::OutOfRange(format!(
                    "read from rank {} but the communicator has {} ranks",
                    r.owner,
                    self.sizes.len()
                )));
            };
            let in_share = r
                .offset
                .checked_add(r.len as u64)
                .is_some_and(|end| end <= share as u64);
            if !in_share {
                return Err(FabricError::OutOfRange(format!(
                    "read of {} bytes at offset {} is outside rank {}'s share of {share} bytes",
                    r.len, r.offset, r.owner
                )));
            }
            if r.len > MAX_GET {
                return Err(FabricError::Invalid(format!(
                    "read of {} bytes from rank {} is longer than one MPI_Get takes \
                     ({MAX_GET} bytes): split it (the store plans reads no longer)",
                    r.len, r.owner
                )));
            }
            let in_dst = r
                .dst_offset
                .checked_add(r.len)
                .is_some_and(|end| end <= dst_len);
            if !in_dst {
                return Err(FabricError::OutOfRange(format!(
                    "read of {} bytes to offset {} overflows the destination of {dst_len} bytes",
                    r.len, r.dst_offset
                )));
            }
        }
        Ok(())
    }
}

impl RemoteShares for MpiShares {
    fn open_reader(&self) -> ddstore_core::Result<Box<dyn ShareReader>> {
        self.inner.check_not_forked()?;
        Ok(Box::new(MpiReader {
            shares: self.inner.clone(),
            staging: Vec::new(),
            touched: vec![false; self.inner.sizes.len()],
            flush: Vec::new(),
            times: ReaderTimes::default(),
        }))
    }

    fn max_read_len(&self) -> Option<usize> {
        Some(MAX_GET)
    }

    fn forget_after_fork(&self) -> ddstore_core::Result<()> {
        self.inner.forked.store(true, Ordering::Relaxed);
        Ok(())
    }

    fn close(self: Arc<Self>) -> ddstore_core::Result<()> {
        let windows = Arc::into_inner(self)
            .and_then(|shares| Arc::into_inner(shares.inner))
            .and_then(|inner| Arc::into_inner(inner.windows));
        let Some(ShareWindows {
            over_all_ranks,
            owner_of_memory,
        }) = windows
        else {
            return Ok(()); // freed by its last holder's drop
        };
        // Field order, as on drop: the window over all ranks first.
        let over_all_ranks = over_all_ranks.map_or(Ok(()), Window::close);
        Ok(over_all_ranks.and(owner_of_memory.close())?)
    }
}

/// One thread's reader: no state shared with other readers but what was
/// learned of the targets, so threads read concurrently under MPI_THREAD_MULTIPLE.
struct MpiReader {
    shares: Arc<SharesInner>,
    /// Where staged reads land, reused from read to read.
    staging: Vec<u8>,
    /// Per rank: a direct read of the current batch goes to it.
    touched: Vec<bool>,
    /// The ranks of `touched`, flushed at the end of a direct read.
    flush: Vec<c_int>,
    /// Time spent waiting for the MPI lock and for reads to complete.
    times: ReaderTimes,
}

/// Longest single MPI_Get: its count is a C int.
const MAX_GET: usize = c_int::MAX as usize;

/// How long a wait polls without pausing, and the longest pause after.
const SPIN: Duration = Duration::from_millis(2);
const MAX_PAUSE: Duration = Duration::from_millis(1);

impl MpiReader {
    /// Reads every target straight into `dst` (`MPI_Get` and flushes, as
    /// fast as any read): only targets whose gets complete inside the call,
    /// so the flushes return at once.
    fn read_direct(&mut self, reads: &[RemoteRead], dst: &mut [u8]) -> FabricResult<()> {
        let win = self.shares.windows.read_window();
        for r in reads.iter().filter(|r| r.len > 0) {
            if !self.touched[r.owner] {
                self.touched[r.owner] = true;
                self.flush.push(r.owner as c_int);
            }
        }
        let read = win.get_into(
            dst,
            reads.iter().filter(|r| r.len > 0).map(as_get),
            &self.flush,
            &mut self.times,
        );
        for &t in &self.flush {
            self.touched[t as usize] = false;
        }
        self.flush.clear();
        read
    }

    /// Reads into the staging buffer, then copies into `dst`; a signal or the
    /// deadline abandons the batch (its buffer with it) with gets pending.
    fn read_staged(&mut self, reads: &[RemoteRead], dst: &mut [u8]) -> FabricResult<()> {
        let win = self.shares.windows.read_window();
        let reads: Vec<&RemoteRead> = reads.iter().filter(|r| r.len > 0).collect();
        let total = reads.iter().map(|r| r.len).sum::<usize>();
        let mut buf = std::mem::take(&mut self.staging);
        if buf.len() < total {
            buf.resize(total, 0);
        }
        let learning = reads
            .iter()
            .any(|r| !self.shares.targets[r.owner].decided());
        let mut gets = Gets::new(buf);
        let mut at = 0;
        let staged = reads.iter().map(|r| {
            let get = Get { at, ..as_get(r) };
            at += r.len;
            get
        });
        let posted = gets.post(win, staged, learning, &mut self.times.lock_ns);
        if learning {
            for i in 0..gets.len() {
                self.shares.targets[gets.target(i) as usize].learn(gets.done_at_post(i));
            }
        }
        let waiting = Instant::now();
        let waited = posted.and_then(|()| self.wait(&mut gets));
        self.times.cq_ns += waiting.elapsed().as_nanos() as u64;
        if let Err(e) = waited {
            if !gets.test_all()? {
                self.shares.abandon(gets);
            }
            return Err(e);
        }
        let Some(landed) = gets.landed() else {
            return Err(FabricError::Invalid(
                "a staged read ended with gets pending".into(),
            ));
        };
        let mut at = 0;
        for r in reads {
            dst[r.dst_offset..r.dst_offset + r.len].copy_from_slice(&landed[at..at + r.len]);
            at += r.len;
        }
        self.staging = gets.into_buffer().unwrap_or_default();
        Ok(())
    }

    /// Polls `gets` until all complete: spins briefly, then pauses with
    /// backoff; a pending signal or `DDSTORE_TIMEOUT_S` ends the wait.
    fn wait(&self, gets: &mut Gets) -> FabricResult<()> {
        wait_for(gets, self.shares.timeout)
    }
}

/// Polls `gets` until all complete: spins briefly, then pauses with backoff;
/// a pending signal or `timeout` ends the wait.
fn wait_for(gets: &mut Gets, timeout: Duration) -> FabricResult<()> {
    let start = Instant::now();
    let deadline = start + timeout;
    let mut pause = Duration::from_micros(20);
    loop {
        if gets.test_all()? {
            return Ok(());
        }
        crate::error::check_interrupt()?;
        let now = Instant::now();
        if now >= deadline {
            return Err(timed_out(gets, now - start));
        }
        if now - start < SPIN {
            std::thread::yield_now();
        } else {
            std::thread::sleep(pause.min(deadline - now));
            pause = (pause * 2).min(MAX_PAUSE);
        }
    }
}

/// The timeout of a wait, naming the first target still pending.
fn timed_out(gets: &mut Gets, waited: Duration) -> FabricError {
    let pending = (0..gets.len()).find(|&i| !matches!(gets.test(i), Ok(true)));
    let peer = pending.map_or(0, |i| gets.target(i) as usize);
    let left = (0..gets.len()).filter(|&i| !gets.is_done(i)).count();
    FabricError::Timeout {
        peer,
        waited,
        detail: format!(
            "{left} of {} MPI_Rget(s) of method 0 still pending: rank {peer} is stopped, \
             dead, or (with one-sided components that need the target inside MPI, e.g. \
             osc/pt2pt) busy outside MPI; DDSTORE_TIMEOUT_S sets the wait",
            gets.len()
        ),
    }
}

/// Opens every target's access while all ranks are inside `expose`: osc/pt2pt
/// does so at the first get of a target, waiting inside `MPI_Rget` (no
/// deadline, no signals) until the target answers. One 1-byte get of each
/// other rank's non-empty share, then a barrier (inside MPI, so the gets of
/// slower ranks are served). Collective. Only below `MPI_THREAD_MULTIPLE`,
/// where osc/pt2pt may serve the window (Open MPI refuses it above).
fn open_access(
    comm: &Arc<dyn Comm>,
    win: &Window,
    sizes: &[usize],
    timeout: Duration,
) -> ddstore_core::Result<()> {
    if thread_level()? == super::ThreadLevel::Multiple || sizes.len() < 2 {
        return Ok(());
    }
    let me = comm.rank();
    let mut gets = Gets::new(vec![0u8; sizes.len()]);
    let others = (0..sizes.len())
        .filter(|&t| t != me && sizes[t] > 0)
        .map(|t| Get {
            at: t,
            len: 1,
            target: t as c_int,
            disp: 0,
        });
    let mut lock_ns = 0;
    gets.post(win, others, false, &mut lock_ns)?;
    wait_for(&mut gets, timeout)?;
    comm.barrier()
}

fn as_get(r: &RemoteRead) -> Get {
    Get {
        at: r.dst_offset,
        len: r.len,
        target: r.owner as c_int,
        disp: r.offset as ffi::MPI_Aint,
    }
}

impl ShareReader for MpiReader {
    fn times(&self) -> ReaderTimes {
        self.times
    }

    fn read_many(&mut self, reads: &[RemoteRead], dst: &mut [u8]) -> ddstore_core::Result<()> {
        self.shares.check_not_forked()?;
        self.shares.validate(reads, dst.len())?;
        self.shares.reap_abandoned()?;
        let targets = &self.shares.targets;
        let direct = reads
            .iter()
            .all(|r| r.len == 0 || targets[r.owner].direct());
        Ok(if direct {
            self.read_direct(reads, dst)
        } else {
            self.read_staged(reads, dst)
        }?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ddstore_core::comm::SingleComm;

    #[test]
    fn needs_an_mpi_communicator_and_cannot_attach() {
        let comm: Arc<dyn Comm> = Arc::new(SingleComm);
        let opts = ExposeOptions {
            name: "x".into(),
            node_sharing: true,
            keep_address: false,
            lens: None,
        };
        let err = MpiRma::new()
            .expose(&comm, 16, &opts)
            .err()
            .expect("refused");
        assert!(
            err.to_string().contains("needs an MPI communicator"),
            "{err}"
        );
        let err = MpiRma::new().attach(&[]).err().expect("refused");
        assert!(err.to_string().contains("another job"), "{err}");
        assert_eq!(MpiRma::new().name(), "mpi-rma");
    }

    #[test]
    fn a_target_is_read_directly_only_after_its_gets_always_completed_inside_the_call() {
        let t = TargetGets::default();
        for _ in 1..GETS_TO_TRUST {
            t.learn(true);
        }
        assert!(!t.direct() && !t.decided(), "trusted too early");
        t.learn(true);
        assert!(t.direct() && t.decided());
        // One get left pending after its post: staged for good.
        t.learn(false);
        (0..100).for_each(|_| t.learn(true));
        assert!(!t.direct() && t.decided());
    }

    #[test]
    fn span_refusal_names_the_mpi_the_ranks_and_the_alternatives() {
        let ranks: Vec<usize> = (0..12).collect();
        let msg = span_refusal(12, 3, &ranks, "MPI_ERR_WIN");
        let version = library_version();
        let first = version
            .lines()
            .next()
            .unwrap_or_default()
            .trim()
            .to_string();
        for part in [
            first.as_str(),
            "across nodes",
            "12 ranks on 3 nodes",
            "[0, 1, 2, 3, 4, 5, 6, 7, ...]",
            "MPI_ERR_WIN",
            "nothing was created",
            "method=1",
        ] {
            assert!(msg.contains(part), "{part:?} missing from {msg}");
        }
        if first.contains("Open MPI") {
            assert!(msg.contains("OMPI_MCA_osc=sm,pt2pt"), "{msg}");
            assert!(msg.contains("serialized"), "{msg}");
        }
    }
}
