//! A reader endpoint and its window of posted operations, shared by both
//! read protocols (one-sided reads, the gather client): slots, the CQ
//! polling that frees them, which peer a failure names, deadlines, and the
//! one retry of a post the provider answers with `FI_EAGAIN`.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::os::raw::c_void;
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use ddstore_core::transport::ReaderTimes;
use libfabric_sys as sys;

use super::av::Av;
use super::context::Contexts;
use super::cq::{Cq, CqEntry, CqError, Poll};
use super::domain::Domain;
use super::endpoint::{Endpoint, TryAgain};
use super::mr::MemoryRegion;
use crate::error::{close_last, FabricError, FabricResult, RefusedFor};

/// Per rank, its endpoint's address (one table per store, see `Peers::addrs`).
type AddrTable = Vec<Vec<u8>>;

/// What a window slot holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// A one-sided read, landing in the endpoint's [`Landing`].
    Read,
    /// A receive of reply message `msg` (of request `req`), `want` bytes.
    Recv { msg: usize, req: usize, want: usize },
    /// A gather request being sent.
    Send,
}

/// An operation posted in a window slot.
pub(crate) struct InFlight {
    pub(crate) peer: usize,
    pub(crate) posted: Instant,
    pub(crate) op: Op,
}

/// A completed receive, for the gather path to check and scatter.
pub(crate) struct Arrived {
    pub(crate) msg: usize,
    pub(crate) req: usize,
    pub(crate) peer: usize,
    pub(crate) want: usize,
    /// Bytes received.
    pub(crate) got: usize,
    pub(crate) tag: u64,
    /// The remote CQ data it brought (None: the message carried none).
    pub(crate) data: Option<u64>,
}

/// One reader endpoint with its window, pooled per domain (`EndpointPool`)
/// and lent to one reader for the length of one call.
pub(crate) struct Live {
    /// Where one-sided reads land (its registration is closed before `ep`).
    pub(crate) landing: Landing,
    pub(crate) ep: Arc<Endpoint>,
    /// This endpoint's name (owners address gather replies to it).
    pub(crate) name: Vec<u8>,
    /// Addresses inserted into the endpoint's AV, by endpoint name.
    pub(crate) addrs: HashMap<Vec<u8>, sys::fi_addr_t>,
    /// Per address table resolved before (one per store: its variables
    /// share it), its AV addresses.
    pub(crate) resolved: Vec<(Weak<AddrTable>, Vec<sys::fi_addr_t>)>,
    /// Its CQ has tagged entries (opened for the gather path).
    pub(crate) tagged: bool,
    /// The current reader's peers, as inserted in the AV.
    pub(crate) peers_fi: Vec<sys::fi_addr_t>,
    pub(crate) contexts: Contexts,
    pub(crate) slots: Vec<Option<InFlight>>,
    pub(crate) free: Vec<usize>,
    /// Receives completed since the gather path last looked.
    pub(crate) arrived: Vec<Arrived>,
    /// Reader-owned landing space for packed replies (never the caller's memory).
    pub(crate) bounce: Vec<u8>,
    /// Encoded requests of the current batch (alive until their sends complete).
    pub(crate) requests: Vec<Vec<u8>>,
    /// Time spent waiting for completions and registering destinations.
    pub(crate) times: ReaderTimes,
    /// A receive matching any tag from anyone, posted once a batch's reply
    /// receives are: what matches no reply receive (forged or late replies)
    /// lands here and is dropped, so unexpected messages never pile up.
    pub(crate) trash: Box<[u8]>,
    /// Whether the trash receive is posted (its context is the slot after the
    /// window), from its post until its completion is reaped.
    pub(crate) trash_posted: bool,
    /// The trash receive was cancelled and its completion is not reaped yet.
    pub(crate) trash_cancelled: bool,
    /// The provider takes a cancelled receive out of its matching queue
    /// before `fi_cancel` returns (rxm's shared receive context, under its
    /// lock): a batch need not wait for the trash's cancellation to post.
    pub(crate) cancel_is_immediate: bool,
    /// Messages discarded: trash receives, and replies whose CQ data failed.
    pub(crate) discarded: Arc<AtomicU64>,
    /// Its bounded set of live connections: peers (by AV address) posted to
    /// since inserted, with when they were last admitted ([`Live::admit`])
    /// and their name (to insert again when disconnected).
    pub(crate) connected: HashMap<sys::fi_addr_t, (u64, Vec<u8>)>,
    /// The address table `peers_fi` was resolved from (names by rank).
    current: Option<Arc<AddrTable>>,
    /// At most this many live connections (see `pool.rs`).
    pub(crate) max_connections: usize,
    /// Whether a bounded set closes every connection after each call
    /// (see `EndpointPool::take`).
    pub(crate) release_between_calls: bool,
    /// Admissions so far (the clock of `connected`).
    admissions: u64,
    /// Peers disconnected to stay within `max_connections`.
    pub(crate) evictions: u64,
}

/// Reader-owned memory one-sided reads land in, copied out to the caller's
/// destination once they completed: a read given up on a timeout may still
/// complete later (the provider progresses a quarantined endpoint with the
/// others of its domain, or the owner writes it, as shm does), and then it
/// writes only here. Registered once where the provider needs local
/// descriptors; it moves only while nothing is in flight, and is abandoned
/// (never freed) with an endpoint closed with reads in flight.
#[derive(Default)]
pub(crate) struct Landing {
    buf: Vec<u8>,
    /// Its registration (closed before `buf` moves or is freed).
    mr: Option<MemoryRegion>,
}

impl Landing {
    /// Bytes it holds.
    pub(crate) fn len(&self) -> usize {
        self.buf.len()
    }

    /// Makes it hold at least `want` bytes, and no more than `keep` beyond a
    /// call's need (grown by doubling up to `keep`); registered with `ep`'s
    /// domain when `register`. Only while nothing is in flight on `ep`.
    pub(crate) fn reserve(
        &mut self,
        ep: &Arc<Endpoint>,
        want: usize,
        keep: usize,
        register: bool,
    ) -> FabricResult<()> {
        let len = self.buf.len();
        if len < want || len > want.max(keep) {
            self.mr = None;
            // Zeroed by the allocator: pages are touched only where reads land.
            self.buf = vec![0u8; want.max(keep.min(2 * len))];
        }
        if register && self.mr.is_none() && !self.buf.is_empty() {
            // SAFETY: buf is owned here and neither moved nor freed before
            // the registration is closed (above, and in `Live::close`), or
            // is abandoned with it (`abandon`).
            let mr = unsafe {
                MemoryRegion::register(
                    ep.domain(),
                    ep,
                    self.buf.as_ptr(),
                    self.buf.len(),
                    sys::FI_READ as u64,
                )
            }?;
            self.mr = Some(mr);
        }
        Ok(())
    }

    /// Where a read of `len` bytes at `at` lands (`at + len` within `len()`).
    pub(crate) fn at(&mut self, at: usize, len: usize) -> *mut u8 {
        self.buf[at..at + len].as_mut_ptr()
    }

    /// Bytes `at..at + len`, of reads that completed.
    pub(crate) fn landed(&self, at: usize, len: usize) -> &[u8] {
        &self.buf[at..at + len]
    }

    /// Its local descriptor (null when not registered).
    pub(crate) fn desc(&self) -> *mut c_void {
        self.mr.as_ref().map_or(ptr::null_mut(), MemoryRegion::desc)
    }

    /// Closes the registration and leaks the buffer: reads in flight may
    /// still write it.
    pub(crate) fn abandon(self) {
        let Landing { buf, mr } = self;
        drop(mr);
        std::mem::forget(buf);
    }
}

/// Posting stopped: the error that stopped it is in the caller's `first_error`.
pub(crate) struct Stopped;

/// AV entries an endpoint starts with (it grows as peers are inserted).
const AV_SIZE_HINT: usize = 64;
/// Bytes of the trash receive: a longer message is truncated (and dropped).
pub(crate) const TRASH_BYTES: usize = 256;

impl Live {
    /// Opens an endpoint (CQ, AV) of `window` operations in `domain`;
    /// `tagged`: for the gather path.
    /// `max_connections`: its bounded set's size (see [`Live::admit`]);
    /// `release_between_calls`: whether it is given up after each call.
    pub(crate) fn open(
        domain: &Arc<Domain>,
        window: usize,
        tagged: bool,
        max_connections: usize,
        release_between_calls: bool,
    ) -> FabricResult<Live> {
        let format = if tagged {
            sys::FI_CQ_FORMAT_TAGGED
        } else {
            sys::FI_CQ_FORMAT_CONTEXT
        };
        // A wait object lets an idle reader block in the provider's wait set
        // (sockets, eventfds), which also progresses the provider promptly.
        let cq = Arc::new(Cq::open_blocking_if_possible_format(
            domain,
            window * 2,
            format,
        )?);
        let av = Arc::new(Av::open(domain, AV_SIZE_HINT)?);
        let ep = Arc::new(Endpoint::open(domain, cq, av)?);
        let name = ep.name()?;
        Ok(Live {
            landing: Landing::default(),
            ep,
            name,
            addrs: HashMap::new(),
            resolved: Vec::new(),
            tagged,
            peers_fi: Vec::new(),
            // One more context: the trash receive's.
            contexts: Contexts::new(window + 1),
            slots: (0..window).map(|_| None).collect(),
            free: (0..window).rev().collect(),
            arrived: Vec::new(),
            bounce: Vec::new(),
            requests: Vec::new(),
            times: ReaderTimes::default(),
            trash: vec![0u8; TRASH_BYTES].into_boxed_slice(),
            trash_posted: false,
            trash_cancelled: false,
            cancel_is_immediate: domain.info().provider().contains("ofi_rxm"),
            // Set to the borrowing reader's counter at each check-out.
            discarded: Arc::default(),
            connected: HashMap::new(),
            current: None,
            max_connections: max_connections.max(1),
            release_between_calls,
            admissions: 0,
            evictions: 0,
        })
    }

    /// Makes room for connections to `owners` (at most `max_connections`
    /// of them, with nothing in flight): each counts as live from now on,
    /// and live peers not among them are disconnected, least recently
    /// admitted first, until the set fits (see [`Live::disconnect`]).
    pub(crate) fn admit(&mut self, owners: &[usize]) -> FabricResult<()> {
        debug_assert!(!self.in_flight(), "admit with operations in flight");
        self.admissions += 1;
        let now = self.admissions;
        for &o in owners {
            let name = self.current.as_ref().and_then(|t| t.get(o));
            match self.connected.entry(self.peers_fi[o]) {
                Entry::Occupied(mut e) => e.get_mut().0 = now,
                Entry::Vacant(e) => {
                    e.insert((now, name.cloned().unwrap_or_default()));
                }
            }
        }
        while self.connected.len() > self.max_connections {
            let idle = self
                .connected
                .iter()
                .filter(|(_, (when, _))| *when < now)
                .min_by_key(|(_, (when, _))| *when)
                .map(|(&fi, _)| fi);
            let Some(fi) = idle else { break };
            self.disconnect(fi)?;
        }
        Ok(())
    }

    /// Closes every live connection (nothing may be in flight): an endpoint
    /// whose bounded set is smaller than its peers holds none between calls,
    /// so its owners' descriptors are free for their own readers.
    pub(crate) fn disconnect_all(&mut self) -> FabricResult<()> {
        let live: Vec<sys::fi_addr_t> = self.connected.keys().copied().collect();
        live.into_iter().try_for_each(|fi| self.disconnect(fi))
    }

    /// Closes the connection to the peer at `fi`: its AV entry is removed
    /// (with `FI_AV_REMOVE_CLEANUP` rxm closes the connection) and its name
    /// inserted again, unconnected until the next operation posted to it.
    /// The AV gives the name back its old address as a rule (its free list
    /// hands out the entry just removed), so the per-rank address lists are
    /// rewritten only where it did not: an eviction does not cost O(ranks).
    fn disconnect(&mut self, fi: sys::fi_addr_t) -> FabricResult<()> {
        let Some((_, name)) = self.connected.remove(&fi) else {
            return Ok(());
        };
        if self.addrs.get(&name) != Some(&fi) {
            return Ok(()); // not a name of this AV (never posted to)
        }
        self.ep.av().remove(fi)?;
        let fresh = self.ep.av().insert_one(0, &name, self.name.len())?;
        self.addrs.insert(name, fresh);
        if fresh != fi {
            let lists = self.resolved.iter_mut().map(|(_, fis)| fis);
            for fis in lists.chain(std::iter::once(&mut self.peers_fi)) {
                fis.iter_mut()
                    .filter(|a| **a == fi)
                    .for_each(|a| *a = fresh);
            }
        }
        self.evictions += 1;
        Ok(())
    }

    /// Points `peers_fi` at the ranks' addresses `peers`, inserting the names
    /// the AV lacks (once per table: later calls find it by its pointer).
    pub(crate) fn resolve(&mut self, peers: &Arc<AddrTable>) -> FabricResult<()> {
        let known = self
            .resolved
            .iter()
            .find(|(list, _)| std::ptr::eq(list.as_ptr(), Arc::as_ptr(peers)));
        if let Some((_, fis)) = known {
            self.peers_fi.clone_from(fis);
            self.current = Some(peers.clone());
            return Ok(());
        }
        let own_len = self.name.len();
        let mut fis = Vec::with_capacity(peers.len());
        for (rank, p) in peers.iter().enumerate() {
            let fi = match self.addrs.get(p) {
                Some(&fi) => fi,
                None => {
                    let fi = self.ep.av().insert_one(rank, p, own_len)?;
                    self.addrs.insert(p.clone(), fi);
                    fi
                }
            };
            fis.push(fi);
        }
        // Lists of freed variables go (a new one may reuse their address).
        self.resolved.retain(|(list, _)| list.strong_count() > 0);
        self.peers_fi.clone_from(&fis);
        self.resolved.push((Arc::downgrade(peers), fis));
        self.current = Some(peers.clone());
        Ok(())
    }

    /// Whether any operation is still posted.
    pub(crate) fn in_flight(&self) -> bool {
        self.free.len() < self.slots.len()
    }

    /// A free window slot, reaping completions while none is.
    pub(crate) fn take_slot(
        &mut self,
        timeout: Duration,
        first_error: &mut Option<FabricError>,
    ) -> Result<usize, Stopped> {
        loop {
            if let Some(s) = self.free.pop() {
                return Ok(s);
            }
            if let Err(e) = reap(self, timeout, first_error) {
                first_error.get_or_insert(e);
            }
            if first_error.is_some() {
                return Err(Stopped);
            }
        }
    }

    /// Closes an endpoint with nothing in flight: its destination
    /// registrations, then the endpoint (and its CQ and AV); every close is
    /// attempted, the first failure reported.
    pub(crate) fn close(self) -> FabricResult<()> {
        debug_assert!(
            !self.in_flight(),
            "an endpoint closed with operations in flight"
        );
        // The buffers (trash, contexts, landing) are dropped after the endpoint.
        let Live {
            mut landing, ep, ..
        } = self;
        let registration = landing.mr.take().map_or(Ok(()), MemoryRegion::close);
        registration.and(close_last(ep, Endpoint::close))
    }

    /// Reaps until nothing is in flight or the oldest operation times out.
    pub(crate) fn drain(&mut self, timeout: Duration, first_error: &mut Option<FabricError>) {
        while self.in_flight() {
            if let Err(e) = reap(self, timeout, first_error) {
                first_error.get_or_insert(e);
                return;
            }
        }
    }
}

/// What became of an operation posted with [`post_retrying`].
pub(crate) enum Posted {
    /// The provider took it.
    Yes,
    /// Posting stopped while waiting: the error is in the caller's `first_error`.
    Stopped,
    /// The provider failed the post, or kept answering `FI_EAGAIN` for
    /// longer than `timeout` (`detail` says what could not be posted).
    Failed(FabricError),
}

/// Posts with `post` until the provider takes the operation: after each
/// `FI_EAGAIN`, `meanwhile` makes progress (reaping, settling replies) and
/// says whether to go on; after `timeout` of them, a timeout naming `peer`.
pub(crate) fn post_retrying<S>(
    state: &mut S,
    timeout: Duration,
    peer: usize,
    detail: &str,
    mut post: impl FnMut(&mut S) -> FabricResult<Result<(), TryAgain>>,
    mut meanwhile: impl FnMut(&mut S) -> Result<(), Stopped>,
) -> Posted {
    let stalled = Instant::now();
    loop {
        match post(state) {
            Ok(Ok(())) => return Posted::Yes,
            Ok(Err(TryAgain)) if stalled.elapsed() <= timeout => {
                if meanwhile(state).is_err() {
                    return Posted::Stopped;
                }
            }
            Ok(Err(TryAgain)) => {
                return Posted::Failed(FabricError::Timeout {
                    peer,
                    waited: stalled.elapsed(),
                    detail: detail.into(),
                })
            }
            Err(e) => return Posted::Failed(e),
        }
    }
}

/// `e` with the peer it concerns and what for (`"read from rank 3"`), if
/// it is a libfabric error.
pub(crate) fn naming_peer(e: FabricError, what: &str, peer: usize) -> FabricError {
    match e {
        FabricError::Ofi {
            call,
            code,
            message,
            ..
        } => FabricError::Ofi {
            call,
            code,
            message: format!("{what} rank {peer}: {message}"),
            peer: Some(peer),
        },
        other => other,
    }
}

/// Polls spun before an idle reader blocks (or sleeps, without a wait object).
const SPINS: u32 = 32;
/// Longest block in `fi_cq_sread`, so timeouts are checked regularly.
const WAIT_MS: i32 = 1;

/// One completion, whatever the CQ's format.
#[derive(Clone, Copy)]
struct Done {
    ctx: *mut c_void,
    len: usize,
    tag: u64,
    /// Remote CQ data, where the completion says it carries some.
    data: Option<u64>,
}

/// Waits (up to `WAIT_MS`) or polls once, as the CQ's entry format requires.
fn poll_cq(cq: &Cq, block: bool, out: &mut [Done; 32]) -> FabricResult<Result<usize, CqError>> {
    fn once<E: CqEntry>(cq: &Cq, buf: &mut [E], block: bool) -> FabricResult<Poll> {
        if block {
            match cq.wait_read(buf, WAIT_MS) {
                Err(FabricError::Ofi { code, .. }) if code == -(sys::FI_ENOSYS as i64) => {
                    cq.poll(buf)
                }
                other => other,
            }
        } else {
            cq.poll(buf)
        }
    }
    let polled = if cq.is_tagged() {
        let mut e = [sys::fi_cq_tagged_entry::default(); 32];
        let p = once(cq, &mut e, block)?;
        if let Poll::Completed(n) = p {
            for (o, e) in out.iter_mut().zip(&e[..n]) {
                *o = Done {
                    ctx: e.op_context,
                    len: e.len,
                    tag: e.tag,
                    data: (e.flags & sys::FI_REMOTE_CQ_DATA as u64 != 0).then_some(e.data),
                };
            }
        }
        p
    } else {
        let mut e = [sys::fi_cq_entry::default(); 32];
        let p = once(cq, &mut e, block)?;
        if let Poll::Completed(n) = p {
            for (o, e) in out.iter_mut().zip(&e[..n]) {
                *o = Done {
                    ctx: e.op_context,
                    len: 0,
                    tag: 0,
                    data: None,
                };
            }
        }
        p
    };
    Ok(match polled {
        Poll::Completed(n) => Ok(n),
        Poll::Failed(err) => Err(err),
    })
}

/// Polls the CQ once, freeing completed slots; records a failed read and
/// returns a timeout when the oldest read waited longer than allowed.
pub(crate) fn reap(
    live: &mut Live,
    timeout: Duration,
    first_error: &mut Option<FabricError>,
) -> FabricResult<()> {
    reap_until(live, Some(timeout), first_error, false)
}

/// Polls the CQ once without waiting for anything to complete (progresses
/// the provider, e.g. a connection a send waits for).
pub(crate) fn progress_once(
    live: &mut Live,
    first_error: &mut Option<FabricError>,
) -> FabricResult<()> {
    reap_until(live, None, first_error, true)
}

/// As [`reap`]; with `once`, returns after one poll. Its time counts as completion wait.
fn reap_until(
    live: &mut Live,
    timeout: Option<Duration>,
    first_error: &mut Option<FabricError>,
    once: bool,
) -> FabricResult<()> {
    let started = Instant::now();
    let reaped = poll_until(live, timeout, first_error, once);
    live.times.cq_ns += started.elapsed().as_nanos() as u64;
    reaped
}

fn poll_until(
    live: &mut Live,
    timeout: Option<Duration>,
    first_error: &mut Option<FabricError>,
    once: bool,
) -> FabricResult<()> {
    let mut done = [Done {
        ctx: ptr::null_mut(),
        len: 0,
        tag: 0,
        data: None,
    }; 32];
    let mut idle: u32 = 0;
    let cq = live.ep.cq().clone();
    loop {
        let block = cq.has_wait() && idle >= SPINS && !once;
        match poll_cq(&cq, block, &mut done)? {
            Ok(0) => {}
            Ok(n) => {
                live.complete(&done[..n]);
                return Ok(());
            }
            Err(err) => match live.fail(err) {
                Failure::Cancelled => return Ok(()),
                // The dead peer's reads are what is left when the deadline names it.
                Failure::Unattributed => continue,
                Failure::Error(e) => {
                    first_error.get_or_insert(e);
                    return Ok(());
                }
            },
        }
        // A signal (Ctrl-C) stops the wait: the caller takes the endpoint out of use.
        crate::error::check_interrupt()?;
        let Some(timeout) = timeout.filter(|_| !once) else {
            return Ok(());
        };
        if !live.check_deadline(timeout)? {
            return Ok(());
        }
        back_off(&mut idle);
    }
}

/// What a failed completion means to the batch.
enum Failure {
    /// A receive this reader cancelled (its request was refused or never sent).
    Cancelled,
    /// A failure that names no operation (shm, a peer killed while reads to
    /// several peers are in flight): the live peers' operations still complete.
    Unattributed,
    /// The batch fails with this error.
    Error(FabricError),
}

impl Live {
    /// Frees the slots of completed operations; receives are kept in
    /// `arrived` for the gather path to check.
    fn complete(&mut self, done: &[Done]) {
        for d in done {
            let Some(slot) = self.contexts.slot_of(d.ctx) else {
                continue;
            };
            if slot == self.slots.len() {
                // The trash receive took a message nobody asked for.
                self.trash_posted = false;
                self.trash_cancelled = false;
                self.discarded.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let Some(f) = self.slots[slot].take() else {
                continue;
            };
            self.free.push(slot);
            if let Op::Recv { msg, req, want } = f.op {
                self.arrived.push(Arrived {
                    msg,
                    req,
                    peer: f.peer,
                    want,
                    got: d.len,
                    tag: d.tag,
                    data: d.data,
                });
            }
        }
    }

    /// Frees the slot of a failed operation and says what the failure means.
    fn fail(&mut self, err: CqError) -> Failure {
        let slot = self.contexts.slot_of(err.context);
        if slot == Some(self.slots.len()) {
            // The trash receive: cancelled, or a message too long for it (truncated).
            self.trash_posted = false;
            self.trash_cancelled = false;
            if err.code.unsigned_abs() != sys::FI_ECANCELED as u64 {
                self.discarded.fetch_add(1, Ordering::Relaxed);
            }
            return Failure::Cancelled;
        }
        let taken = slot.and_then(|s| self.slots[s].take());
        if let Some(s) = slot {
            if !self.free.contains(&s) && self.slots[s].is_none() {
                self.free.push(s);
            }
        }
        let op = taken.as_ref().map(|f| f.op).unwrap_or(Op::Read);
        if matches!(op, Op::Recv { .. }) && err.code.unsigned_abs() == sys::FI_ECANCELED as u64 {
            return Failure::Cancelled;
        }
        let peer = taken.map(|f| f.peer).or_else(|| {
            // No context (shm): if every read in flight targets one peer, it is that one.
            let mut peers = self.slots.iter().flatten().map(|f| f.peer);
            let first = peers.next()?;
            peers.all(|p| p == first).then_some(first)
        });
        if slot.is_none() && peer.is_none() {
            return Failure::Unattributed;
        }
        Failure::Error(completion_error(op, peer, &err))
    }

    /// Whether anything is still in flight; a timeout naming the peer of the
    /// oldest operation when it has waited longer than allowed.
    fn check_deadline(&self, timeout: Duration) -> FabricResult<bool> {
        let Some((peer, waited, op)) = oldest(self) else {
            return Ok(false);
        };
        if waited <= timeout {
            return Ok(true);
        }
        Err(FabricError::Timeout {
            peer,
            waited,
            detail: match op {
                Op::Read => "a read was posted but never completed (the peer may have exited)",
                Op::Recv { .. } => {
                    "it never answered a gather request (it may be stopped, have exited or freed the variable)"
                }
                Op::Send => "a gather request was never sent (the peer may have exited)",
            }
            .into(),
        })
    }
}

/// The error of a failed completion of `op` with `peer` (when known).
fn completion_error(op: Op, peer: Option<usize>, err: &CqError) -> FabricError {
    let call = match op {
        Op::Read => "fi_read",
        Op::Recv { .. } => "fi_trecv",
        Op::Send => "fi_tsend",
    };
    match peer {
        // A peer that has gone surfaces as a cancelled or refused read.
        Some(peer) if peer_lost(err.code) => FabricError::Timeout {
            peer,
            waited: std::time::Duration::ZERO,
            // tcp drops the connection of a read whose key it never issued.
            detail: format!(
                "the connection to rank {peer} is lost ({}): it has exited, or it \
                 refused this reader's memory key",
                err.message
            ),
        },
        Some(peer) if key_refused(err.code) => FabricError::Refused {
            peer,
            reason: RefusedFor::Key,
            call: Some(call),
            code: Some(err.code),
            detail: format!(
                "rank {peer} refused the read ({}): the memory key or address is not one \
                 it issued (a share record from another job, or altered)",
                err.message
            ),
        },
        _ => {
            let who = peer
                .map(|p| format!("rank {p}"))
                .unwrap_or_else(|| "a peer".into());
            FabricError::Ofi {
                call,
                code: err.code,
                message: format!("{call} with {who} failed: {}", err.message),
                peer,
            }
        }
    }
}

/// Waits a little longer each time nothing completed: spins, then yields,
/// then sleeps 20 µs.
fn back_off(idle: &mut u32) {
    *idle += 1;
    if *idle < SPINS {
        std::hint::spin_loop();
    } else if *idle < SPINS * 64 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros(20));
    }
}

fn oldest(live: &Live) -> Option<(usize, Duration, Op)> {
    live.slots
        .iter()
        .flatten()
        .map(|f| (f.peer, f.posted.elapsed(), f.op))
        .max_by_key(|(_, w, _)| *w)
}

fn key_refused(code: i64) -> bool {
    let code = code.unsigned_abs() as u32;
    code == sys::FI_EACCES || code == sys::FI_EKEYREJECTED
}

/// Completion errors meaning the peer process or its connection is gone.
fn peer_lost(code: i64) -> bool {
    let code = code.unsigned_abs() as u32;
    [
        sys::FI_ECANCELED,
        sys::FI_ENOTCONN,
        sys::FI_ECONNRESET,
        sys::FI_ECONNREFUSED,
        sys::FI_ECONNABORTED,
        sys::FI_EHOSTUNREACH,
        sys::FI_ESHUTDOWN,
        sys::FI_EIO,
    ]
    .contains(&code)
}
