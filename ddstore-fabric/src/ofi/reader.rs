//! A reader: one endpoint + CQ + AV of its own, posting `fi_read`s in a
//! window and completing them with a deadline.

use std::collections::HashMap;
use std::os::raw::c_void;
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use ddstore_core::transport::{RaggedRequest, RaggedRows, ReaderTimes, RemoteRead, ShareReader};
use libfabric_sys as sys;

use super::av::Av;
use super::context::Contexts;
use super::cq::{Cq, CqEntry, CqError, Poll};
use super::domain::Domain;
use super::endpoint::Endpoint;
use super::gather::{self, Landing, MacKey, Nonce};
use super::mr::MemoryRegion;
use super::record::ShareRecord;
use crate::error::{FabricError, FabricResult, RefusedFor};

/// Destination ranges registered once through `register_dst`; each reader
/// registers a range with its own endpoint the first time it reads into it.
#[derive(Default)]
pub struct DstRegistry {
    ranges: Mutex<Vec<DstRange>>,
}

/// Range ids are unique across registries: pooled endpoints keep the
/// registrations of every variable's ranges side by side.
static NEXT_RANGE_ID: AtomicU64 = AtomicU64::new(0);

#[derive(Clone, Copy)]
struct DstRange {
    id: u64,
    addr: usize,
    len: usize,
}

impl DstRegistry {
    pub fn register(&self, addr: usize, len: usize) -> FabricResult<()> {
        if len == 0 || addr.checked_add(len).is_none() {
            return Err(FabricError::Invalid(format!(
                "cannot register {len} bytes at {addr:#x}"
            )));
        }
        let id = NEXT_RANGE_ID.fetch_add(1, Ordering::Relaxed);
        self.ranges
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(DstRange { id, addr, len });
        Ok(())
    }

    pub fn unregister(&self, addr: usize, len: usize) -> FabricResult<()> {
        let mut ranges = self.ranges.lock().unwrap_or_else(|p| p.into_inner());
        match ranges.iter().position(|r| r.addr == addr && r.len == len) {
            Some(i) => {
                ranges.swap_remove(i);
                Ok(())
            }
            None => Err(FabricError::Invalid(format!(
                "no destination of {len} bytes at {addr:#x} was registered"
            ))),
        }
    }

    fn snapshot(&self) -> Vec<DstRange> {
        self.ranges
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// What a window slot holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    /// A one-sided read.
    Read,
    /// A receive of reply message `msg` (of request `req`), `want` bytes
    /// after the reply header (which lands in the slot's header buffer).
    Recv { msg: usize, req: usize, want: usize },
    /// A gather request being sent.
    Send,
}

struct InFlight {
    peer: usize,
    posted: Instant,
    op: Op,
}

/// A completed receive, for the gather path to check and scatter.
struct Arrived {
    msg: usize,
    req: usize,
    peer: usize,
    want: usize,
    /// Bytes received, the reply header included.
    got: usize,
    tag: u64,
    /// The reply header it brought.
    header: [u8; gather::REPLY_HEADER_BYTES],
}

/// One reader endpoint with its window, pooled per domain ([`EndpointPool`])
/// and lent to one reader for the length of one call.
struct Live {
    /// Registrations of `DstRegistry` ranges, by range id, with the registry
    /// they belong to (closed before `ep`).
    dst_mrs: HashMap<u64, (Weak<DstRegistry>, MemoryRegion)>,
    ep: Arc<Endpoint>,
    /// This endpoint's name (owners address gather replies to it).
    name: Vec<u8>,
    /// Addresses inserted into the endpoint's AV, by endpoint name.
    addrs: HashMap<Vec<u8>, sys::fi_addr_t>,
    /// Per peer list resolved before (one per variable), its AV addresses.
    resolved: Vec<(Weak<Vec<ShareRecord>>, Vec<sys::fi_addr_t>)>,
    /// Its CQ has tagged entries (opened for the gather path).
    tagged: bool,
    /// The current reader's peers, as inserted in the AV.
    peers_fi: Vec<sys::fi_addr_t>,
    contexts: Contexts,
    slots: Vec<Option<InFlight>>,
    free: Vec<usize>,
    /// Receives completed since the gather path last looked.
    arrived: Vec<Arrived>,
    /// Reader-owned landing space for packed replies (never the caller's memory).
    bounce: Vec<u8>,
    /// Encoded requests of the current batch (alive until their sends complete).
    requests: Vec<Vec<u8>>,
    /// Time spent waiting for completions and registering destinations.
    times: ReaderTimes,
    /// Per window slot, where a reply receive's header lands.
    headers: Box<[[u8; gather::REPLY_HEADER_BYTES]]>,
    /// A receive matching any tag from anyone, posted once a batch's reply
    /// receives are: what matches no reply receive (forged or late replies)
    /// lands here and is dropped, so unexpected messages never pile up.
    trash: Box<[u8]>,
    /// Whether the trash receive is posted (its context is the slot after the window).
    trash_posted: bool,
    /// Messages discarded: trash receives, and replies whose header failed.
    discarded: Arc<AtomicU64>,
}

/// Posting stopped: the error that stopped it is in the caller's `first_error`.
struct Stopped;

/// Where one-sided reads of a batch land.
struct ReadTarget {
    /// Start of the caller's destination (validated reads stay inside it).
    dst: *mut u8,
    /// Its local descriptor (null where the provider needs none).
    desc: *mut c_void,
    /// Remote addresses are virtual addresses (`FI_MR_VIRT_ADDR`), not offsets.
    virt_addr: bool,
}

impl Live {
    /// Opens an endpoint (CQ, AV) of `window` operations in `domain`;
    /// `tagged`: for the gather path.
    fn open(domain: &Arc<Domain>, window: usize, tagged: bool) -> FabricResult<Live> {
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
            dst_mrs: HashMap::new(),
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
            headers: vec![[0u8; gather::REPLY_HEADER_BYTES]; window].into_boxed_slice(),
            trash: vec![0u8; TRASH_BYTES].into_boxed_slice(),
            trash_posted: false,
            // Set to the borrowing reader's counter at each check-out.
            discarded: Arc::default(),
        })
    }

    /// Points `peers_fi` at `peers`, inserting the names the AV lacks (once
    /// per peer list: later calls find the list's addresses by its pointer).
    fn resolve(&mut self, peers: &Arc<Vec<ShareRecord>>) -> FabricResult<()> {
        let known = self
            .resolved
            .iter()
            .find(|(list, _)| std::ptr::eq(list.as_ptr(), Arc::as_ptr(peers)));
        if let Some((_, fis)) = known {
            self.peers_fi.clone_from(fis);
            return Ok(());
        }
        let own_len = self.name.len();
        let mut fis = Vec::with_capacity(peers.len());
        for (rank, p) in peers.iter().enumerate() {
            let fi = match self.addrs.get(&p.addr) {
                Some(&fi) => fi,
                None => {
                    let fi = self.ep.av().insert_one(rank, &p.addr, own_len)?;
                    self.addrs.insert(p.addr.clone(), fi);
                    fi
                }
            };
            fis.push(fi);
        }
        // Lists of freed variables go (a new one may reuse their address).
        self.resolved.retain(|(list, _)| list.strong_count() > 0);
        self.peers_fi.clone_from(&fis);
        self.resolved.push((Arc::downgrade(peers), fis));
        Ok(())
    }

    /// Whether any operation is still posted.
    fn in_flight(&self) -> bool {
        self.free.len() < self.slots.len()
    }

    /// A free window slot, reaping completions while none is.
    fn take_slot(
        &mut self,
        settings: &ReaderSettings,
        first_error: &mut Option<FabricError>,
    ) -> Result<usize, Stopped> {
        loop {
            if let Some(s) = self.free.pop() {
                return Ok(s);
            }
            if let Err(e) = reap(self, settings, first_error) {
                first_error.get_or_insert(e);
            }
            if first_error.is_some() {
                return Err(Stopped);
            }
        }
    }

    /// Posts `r` in `slot`, retrying while the provider says `FI_EAGAIN`
    /// (reaping meanwhile) up to the timeout. On failure the slot is freed.
    fn post_read(
        &mut self,
        slot: usize,
        r: &RemoteRead,
        peer: &ShareRecord,
        target: &ReadTarget,
        settings: &ReaderSettings,
        first_error: &mut Option<FabricError>,
    ) -> Result<(), Stopped> {
        let remote_base = if target.virt_addr { peer.base } else { 0 };
        let stalled = Instant::now();
        loop {
            // SAFETY: the destination bytes lie inside dst (validated), which
            // stays borrowed until all reads completed or the endpoint is
            // closed (break_reader); the context slot is reserved until its
            // completion is reaped.
            let posted = unsafe {
                self.ep.post_read(
                    target.dst.add(r.dst_offset),
                    r.len,
                    target.desc,
                    self.peers_fi[r.owner],
                    remote_base + r.offset,
                    peer.key,
                    self.contexts.ptr(slot),
                )
            };
            let failed = match posted {
                Ok(Ok(())) => {
                    self.slots[slot] = Some(InFlight {
                        peer: r.owner,
                        posted: Instant::now(),
                        op: Op::Read,
                    });
                    return Ok(());
                }
                Ok(Err(_try_again)) if stalled.elapsed() > settings.timeout => {
                    FabricError::Timeout {
                        peer: r.owner,
                        waited: stalled.elapsed(),
                        detail: "fi_read kept returning FI_EAGAIN".into(),
                    }
                }
                Ok(Err(_try_again)) => {
                    if let Err(e) = reap(self, settings, first_error) {
                        first_error.get_or_insert(e);
                    }
                    if first_error.is_none() {
                        // Nothing of ours in flight: the provider is busy
                        // (e.g. still connecting); do not spin flat out.
                        if self.free.len() + 1 == self.slots.len() {
                            std::thread::sleep(Duration::from_micros(20));
                        }
                        continue;
                    }
                    self.free.push(slot);
                    return Err(Stopped);
                }
                Err(FabricError::Ofi {
                    call,
                    code,
                    message,
                    ..
                }) => FabricError::Ofi {
                    call,
                    code,
                    message: format!("read from rank {}: {message}", r.owner),
                    peer: Some(r.owner),
                },
                Err(other) => other,
            };
            self.free.push(slot);
            first_error.get_or_insert(failed);
            return Err(Stopped);
        }
    }

    /// Reaps until nothing is in flight or the oldest operation times out.
    fn drain(&mut self, settings: &ReaderSettings, first_error: &mut Option<FabricError>) {
        while self.in_flight() {
            if let Err(e) = reap(self, settings, first_error) {
                first_error.get_or_insert(e);
                return;
            }
        }
    }
}

pub struct ReaderSettings {
    pub window: usize,
    pub timeout: Duration,
    pub max_read_bytes: usize,
    /// Register destinations and pass descriptors even when the provider
    /// does not require FI_MR_LOCAL (always legal; tests the cxi/verbs path).
    pub force_local_mr: bool,
    /// Read from owners whose record offers it through the gather path
    /// (the domain has tagged messages).
    pub gather: bool,
    /// The key gather requests are MACed under (`None`: no gather requests).
    pub mac_key: Option<MacKey>,
    /// Where discarded replies are counted (the variable's profile).
    pub discarded: Arc<AtomicU64>,
}

/// Idle reader endpoints of one domain, shared by the readers of every
/// variable: a process holds one endpoint per concurrent read (and its
/// connections per peer), not one per variable and thread. An endpoint a
/// failed read left operations on is quarantined where the provider moves
/// data only while we poll (it is never polled again, so nothing lands in
/// the caller's memory, and a resumed peer still finds it open: shm crashes
/// a peer answering a closed endpoint); elsewhere it is closed.
pub struct EndpointPool {
    domain: Arc<Domain>,
    idle: Mutex<Vec<Live>>,
    quarantined: Mutex<Vec<Live>>,
}

/// Quarantined endpoints kept at most; past it the oldest is closed.
const MAX_QUARANTINED: usize = 16;
/// AV entries an endpoint starts with (it grows as peers are inserted).
const AV_SIZE_HINT: usize = 64;

impl EndpointPool {
    /// A pool of reader endpoints in `domain`.
    pub fn new(domain: Arc<Domain>) -> Arc<EndpointPool> {
        Arc::new(EndpointPool {
            domain,
            idle: Mutex::new(Vec::new()),
            quarantined: Mutex::new(Vec::new()),
        })
    }

    /// The domain its endpoints are opened in.
    pub fn domain(&self) -> &Arc<Domain> {
        &self.domain
    }

    /// Endpoints held now: (idle, quarantined).
    pub fn counts(&self) -> (usize, usize) {
        (lock(&self.idle).len(), lock(&self.quarantined).len())
    }

    /// An idle endpoint of this window and CQ format, or a new one.
    fn take(&self, window: usize, tagged: bool) -> FabricResult<Live> {
        let reused = {
            let mut idle = lock(&self.idle);
            let at = idle
                .iter()
                .rposition(|l| l.tagged == tagged && l.slots.len() == window);
            at.map(|i| idle.swap_remove(i))
        };
        match reused {
            Some(live) => Ok(live),
            None => Live::open(&self.domain, window, tagged),
        }
    }

    /// Takes back an endpoint with nothing in flight.
    fn give_back(&self, mut live: Live) {
        live.arrived.clear();
        lock(&self.idle).push(live);
    }

    /// Takes an endpoint that may still have operations in flight out of use.
    fn quarantine(&self, live: Live) {
        if !self.domain.info().manual_data_progress() {
            // The provider may still write into the caller's memory on its
            // own: closing the endpoint is what stops it.
            close_abandoning(live);
            return;
        }
        let oldest = {
            let mut q = lock(&self.quarantined);
            q.push(live);
            (q.len() > MAX_QUARANTINED).then(|| q.remove(0))
        };
        if let Some(old) = oldest {
            close_abandoning(old);
        }
    }
}

impl Drop for EndpointPool {
    fn drop(&mut self) {
        // No locking: a forked child may inherit these locks held.
        let idle = std::mem::take(self.idle.get_mut().unwrap_or_else(|p| p.into_inner()));
        let quarantined = std::mem::take(
            self.quarantined
                .get_mut()
                .unwrap_or_else(|p| p.into_inner()),
        );
        if !self.domain.usable_here() {
            // Inherited across fork(): never call into the parent's objects.
            std::mem::forget(idle);
            std::mem::forget(quarantined);
            return;
        }
        drop(idle);
        quarantined.into_iter().for_each(close_abandoning);
    }
}

/// A poisoned lock holds a plain Vec: still consistent.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Cancels what is in flight on `live` and closes its endpoint; buffers the
/// provider may still reference (contexts, bounce, requests) are leaked.
fn close_abandoning(live: Live) {
    for (slot, state) in live.slots.iter().enumerate() {
        if state.is_some() {
            // SAFETY: the slot holds an operation posted on this endpoint.
            unsafe { live.ep.cancel(live.contexts.ptr(slot)) };
        }
    }
    if live.trash_posted {
        // SAFETY: the trash receive is posted on this endpoint.
        unsafe { live.ep.cancel(live.contexts.ptr(live.slots.len())) };
    }
    let Live {
        dst_mrs,
        ep,
        contexts,
        bounce,
        requests,
        headers,
        trash,
        ..
    } = live;
    drop(ep);
    drop(dst_mrs); // the last Arc<Endpoint> may be held by a bound MR
    contexts.abandon();
    // Receives and sends may still reference these (the endpoint may
    // outlive us in a bound MR): never free them under the provider.
    std::mem::forget(bounce);
    std::mem::forget(requests);
    std::mem::forget(headers);
    std::mem::forget(trash);
}

/// Reads remote shares, through an endpoint of [`EndpointPool`] lent for
/// each call; one per thread.
pub struct OfiReader {
    /// The endpoint lent for the current call.
    live: Option<Live>,
    pool: Arc<EndpointPool>,
    broken: Option<String>,
    peers: Arc<Vec<ShareRecord>>,
    registry: Arc<DstRegistry>,
    settings: ReaderSettings,
    /// Longest gather reply message.
    chunk: usize,
    /// Longest one-sided read the provider takes (`max_msg_size`); the store
    /// plans no longer reads, so a read is always one `fi_read`.
    max_msg: usize,
    virt_addr: bool,
    local_mr: bool,
    /// The lent endpoint's name: owners address their replies to it.
    name: Vec<u8>,
    /// Time spent in the endpoints lent to earlier calls (the lent one keeps
    /// its own until it is given back).
    times: ReaderTimes,
    /// Gather replies are received from their owner's address only.
    directed: bool,
}

impl OfiReader {
    /// A reader of the shares `peers` describe, through endpoints of `pool`.
    pub fn open(
        pool: &Arc<EndpointPool>,
        peers: Arc<Vec<ShareRecord>>,
        registry: Arc<DstRegistry>,
        settings: ReaderSettings,
    ) -> FabricResult<OfiReader> {
        let domain = pool.domain();
        // The gather path needs a receive and the request's send in flight at once.
        let window = settings.window.max(if settings.gather { 2 } else { 1 });
        // Checked before any queue is sized from it: past the provider's
        // transmit queue, fi_enable or a later post would fail obscurely.
        let tx_size = domain.info().tx_size();
        if tx_size > 0 && window > tx_size {
            return Err(FabricError::Invalid(format!(
                "DDSTORE_MAX_INFLIGHT={window} is more than the {} provider's transmit queue of \
                 {tx_size} entries: set DDSTORE_MAX_INFLIGHT to at most {tx_size}",
                domain.info().provider()
            )));
        }
        let info = domain.info();
        let max_msg = info.max_msg_size().max(1);
        let mut reader = OfiReader {
            live: None,
            pool: pool.clone(),
            name: Vec::new(),
            times: ReaderTimes::default(),
            directed: info.caps() & sys::FI_DIRECTED_RECV != 0,
            broken: None,
            chunk: max_msg.min(settings.max_read_bytes.max(1)),
            max_msg,
            virt_addr: domain.requires(sys::FI_MR_VIRT_ADDR),
            local_mr: domain.requires(sys::FI_MR_LOCAL) || settings.force_local_mr,
            peers,
            registry,
            settings: ReaderSettings { window, ..settings },
        };
        // Opening one now reports an unusable provider here, not at the first read.
        reader.check_out()?;
        reader.check_in();
        Ok(reader)
    }

    /// Borrows an endpoint from the pool for one call.
    fn check_out(&mut self) -> FabricResult<()> {
        let mut live = self.pool.take(self.settings.window, self.settings.gather)?;
        if let Err(e) = live.resolve(&self.peers) {
            self.pool.give_back(live);
            return Err(e);
        }
        self.name.clone_from(&live.name);
        live.times = ReaderTimes::default();
        live.discarded = self.settings.discarded.clone();
        self.live = Some(live);
        Ok(())
    }

    /// Returns the lent endpoint (a failure that left operations in flight
    /// has already taken it out of use: see `break_reader`).
    fn check_in(&mut self) {
        if let Some(live) = self.live.take() {
            self.times = self.times.plus(live.times);
            if live.in_flight() {
                self.pool.quarantine(live);
            } else {
                self.pool.give_back(live);
            }
        }
    }

    fn validate(&self, reads: &[RemoteRead], dst_len: usize) -> ddstore_core::Result<()> {
        use ddstore_core::Error;
        for r in reads {
            let peer = self.peers.get(r.owner).ok_or_else(|| {
                Error::IndexOutOfRange(format!(
                    "read from rank {} but only {} ranks expose this share",
                    r.owner,
                    self.peers.len()
                ))
            })?;
            let inside = matches!(r.offset.checked_add(r.len as u64), Some(e) if e <= peer.len);
            if !inside {
                return Err(Error::IndexOutOfRange(format!(
                    "read of {} bytes at offset {} is outside rank {}'s share of {} bytes",
                    r.len, r.offset, r.owner, peer.len
                )));
            }
            if r.len > self.max_msg && !(self.settings.gather && peer.gather) {
                return Err(Error::InvalidArgument(format!(
                    "read of {} bytes from rank {} is longer than the provider's longest \
                     message ({} bytes): split it (the store plans reads no longer)",
                    r.len, r.owner, self.max_msg
                )));
            }
            if !matches!(r.dst_offset.checked_add(r.len), Some(e) if e <= dst_len) {
                return Err(Error::IndexOutOfRange(format!(
                    "read of {} bytes to offset {} overflows a destination of {dst_len} bytes",
                    r.len, r.dst_offset
                )));
            }
        }
        Ok(())
    }

    /// One-sided reads: each read is posted as one `fi_read` (the store
    /// planned them no longer than the provider's longest message), up to the
    /// window in flight, then every posted read is completed.
    fn do_reads(&mut self, reads: &[RemoteRead], dst: &mut [u8]) -> FabricResult<()> {
        // Kept until every read has completed or the endpoint is closed.
        let mut temporary: Option<MemoryRegion> = None;
        let desc = self.dst_desc(dst, &mut temporary)?;
        let live = self.live.as_mut().expect("checked by read_many");
        let mut first_error: Option<FabricError> = None;
        let target = ReadTarget {
            dst: dst.as_mut_ptr(),
            desc,
            virt_addr: self.virt_addr,
        };
        for r in reads.iter().filter(|r| r.len > 0) {
            let posted = live
                .take_slot(&self.settings, &mut first_error)
                .and_then(|slot| {
                    live.post_read(
                        slot,
                        r,
                        &self.peers[r.owner],
                        &target,
                        &self.settings,
                        &mut first_error,
                    )
                });
            if posted.is_err() {
                break;
            }
        }
        // Complete everything posted, even after an error, so dst is no longer
        // written once we return; a timeout here breaks the reader.
        live.drain(&self.settings, &mut first_error);
        if live.in_flight() {
            let why = first_error
                .as_ref()
                .map(|e| e.to_string())
                .unwrap_or_default();
            self.break_reader(why);
        }
        drop(temporary);
        first_error.map_or(Ok(()), Err)
    }

    /// The local descriptor of `dst` where the provider needs one: the
    /// registration of a `register_dst` range covering it (made once per
    /// reader), else a registration for this call left in `temporary`.
    fn dst_desc(
        &mut self,
        dst: &mut [u8],
        temporary: &mut Option<MemoryRegion>,
    ) -> FabricResult<*mut c_void> {
        if !self.local_mr {
            return Ok(ptr::null_mut());
        }
        let live = self.live.as_mut().expect("checked by read_many");
        let started = Instant::now();
        let ranges = self.registry.snapshot();
        let mine = Arc::downgrade(&self.registry);
        // Registrations of ranges since unregistered (of any variable) close.
        live.dst_mrs.retain(|id, (registry, _)| {
            if registry.ptr_eq(&mine) {
                ranges.iter().any(|r| r.id == *id)
            } else {
                registry
                    .upgrade()
                    .is_some_and(|g| g.snapshot().iter().any(|r| r.id == *id))
            }
        });
        let start = dst.as_ptr() as usize;
        let covering = ranges
            .iter()
            .find(|r| start >= r.addr && start + dst.len() <= r.addr + r.len);
        let mr = match covering {
            Some(r) => match live.dst_mrs.entry(r.id) {
                std::collections::hash_map::Entry::Occupied(e) => &e.into_mut().1,
                std::collections::hash_map::Entry::Vacant(e) => {
                    // SAFETY: the caller registered this range and dst, which
                    // lies inside it, is live memory; a registration never
                    // writes memory, and unregister_dst drops it.
                    let mr = unsafe {
                        MemoryRegion::register(
                            live.ep.domain(),
                            &live.ep,
                            r.addr as *const u8,
                            r.len,
                            sys::FI_READ as u64,
                        )
                    }?;
                    &e.insert((mine, mr)).1
                }
            },
            None => {
                // SAFETY: dst is borrowed mutably for this whole call and the
                // registration is closed before the call returns.
                let mr = unsafe {
                    MemoryRegion::register(
                        live.ep.domain(),
                        &live.ep,
                        dst.as_mut_ptr(),
                        dst.len(),
                        sys::FI_READ as u64,
                    )
                }?;
                &*temporary.insert(mr)
            }
        };
        let desc = mr.desc();
        live.times.mr_ns += started.elapsed().as_nanos() as u64;
        Ok(desc)
    }

    /// Operations may still be in flight: take the endpoint out of use
    /// (quarantined or closed, so nothing lands in the caller's memory
    /// later) and refuse further use of this reader.
    fn break_reader(&mut self, why: String) {
        if let Some(live) = self.live.take() {
            self.times = self.times.plus(live.times);
            self.pool.quarantine(live);
        }
        self.broken = Some(why);
    }
}

impl OfiReader {
    /// The gather path: one request per owner (more when the batch exceeds a
    /// request or the window), every reply's receive posted before its request
    /// is sent; replies land in `dst` directly or through the bounce buffer.
    fn do_gather(
        &mut self,
        reads: &[(usize, u64, usize, usize)],
        dst: &mut [u8],
    ) -> FabricResult<()> {
        let plan = gather::plan(reads, self.gather_limits());
        self.exchange(&plan, dst, &mut Vec::new())
    }

    /// What gather plans of this reader respect.
    fn gather_limits(&self) -> gather::Limits {
        let window = self.live.as_ref().map_or(2, |l| l.slots.len());
        gather::Limits {
            chunk: self.chunk,
            msgs_per_request: window - 1,
            name_len: self.name.len(),
        }
    }

    /// Sends a planned batch's requests and lands their replies in `dst`;
    /// `got` receives each message's received length (without its reply
    /// header), in plan order (a ragged request's replies may be shorter
    /// than their receives).
    ///
    /// Every request has a fresh nonce; a reply is used only if its tag and
    /// header carry that nonce (a receive whose header fails is counted,
    /// discarded and posted again, so the genuine reply still lands), and
    /// where the provider offers it, only if it came from the owner.
    fn exchange(
        &mut self,
        plan: &gather::Plan,
        dst: &mut [u8],
        got: &mut Vec<usize>,
    ) -> FabricResult<()> {
        let Some(mac_key) = self.settings.mac_key.clone() else {
            return Err(FabricError::Unavailable(
                "gather requests need the job's key, which this reader was not given".into(),
            ));
        };
        let nonces = plan
            .requests
            .iter()
            .map(|_| Nonce::random())
            .collect::<FabricResult<Vec<Nonce>>>()?;
        let live = self.live.as_mut().expect("checked by read_many");
        // Nothing is in flight between calls, so the buffers may move here.
        if live.bounce.len() < plan.bounce_len {
            live.bounce.resize(plan.bounce_len, 0);
        }
        if live.requests.len() < plan.requests.len() {
            live.requests.resize_with(plan.requests.len(), Vec::new);
        }
        let dst_base = dst.as_mut_ptr();
        let bounce_base = live.bounce.as_mut_ptr();
        // Per message of the batch: (request, index in it, its Message).
        let msgs: Vec<(usize, usize, gather::Message)> = plan
            .requests
            .iter()
            .enumerate()
            .flat_map(|(ri, r)| r.msgs.iter().enumerate().map(move |(mi, m)| (ri, mi, *m)))
            .collect();
        let mut sent = vec![false; plan.requests.len()];
        let mut cancel = vec![false; plan.requests.len()];
        let mut poisoned = false;
        let mut first_error: Option<FabricError> = None;
        let mut next_msg = 0usize;
        got.clear();
        got.resize(msgs.len(), 0);
        let settings = &self.settings;
        let directed = self.directed;
        let peers_fi = live.peers_fi.clone();
        // Where message `g` lands.
        let landing = |g: usize| -> *mut u8 {
            match msgs[g].2.land {
                // SAFETY (both): offsets planned inside dst (validated) or the bounce buffer.
                Landing::Direct(d) => unsafe { dst_base.add(d) },
                Landing::Bounce { at, .. } => unsafe { bounce_base.add(at) },
            }
        };
        // Posts the receive of message `g` in `slot`: its header into the
        // slot's header buffer, its payload where it lands.
        let post_recv = |live: &mut Live, slot: usize, g: usize| {
            let (ri, mi, m) = msgs[g];
            let owner = plan.requests[ri].owner;
            let iov = [
                sys::iovec {
                    iov_base: live.headers[slot].as_mut_ptr() as *mut c_void,
                    iov_len: gather::REPLY_HEADER_BYTES,
                },
                sys::iovec {
                    iov_base: landing(g) as *mut c_void,
                    iov_len: m.len,
                },
            ];
            let src = if directed {
                peers_fi[owner]
            } else {
                sys::FI_ADDR_UNSPEC
            };
            // SAFETY: the payload lies in dst (borrowed for this whole call,
            // and the endpoint is closed before returning if the receive is
            // still posted) or in the reader-owned bounce buffer; the header
            // buffer is the reader's (both abandoned, never freed, if the
            // reader breaks); the context slot is reserved.
            unsafe {
                live.ep.post_trecvv(
                    &iov,
                    src,
                    gather::reply_tag(&nonces[ri], mi as u32, 0),
                    gather::STATUS_MASK,
                    live.contexts.ptr(slot),
                )
            }
        };

        // Checks and scatters replies that arrived; a refusal cancels the
        // rest of its request's receives, any other mismatch poisons the
        // reader; a reply whose header is not its request's is discarded
        // and its receive posted again.
        let settle = |live: &mut Live,
                      cancel: &mut Vec<bool>,
                      poisoned: &mut bool,
                      first_error: &mut Option<FabricError>,
                      got: &mut Vec<usize>| {
            for a in std::mem::take(&mut live.arrived) {
                let genuine =
                    a.got >= gather::REPLY_HEADER_BYTES && a.header == nonces[a.req].reply_header();
                if !genuine {
                    live.discarded.fetch_add(1, Ordering::Relaxed);
                    // Its own slot was freed when it completed: one is free.
                    let slot = live.free.pop().expect("its slot was freed");
                    match post_recv(live, slot, a.msg) {
                        Ok(Ok(())) => {
                            live.slots[slot] = Some(InFlight {
                                peer: a.peer,
                                posted: Instant::now(),
                                op: Op::Recv {
                                    msg: a.msg,
                                    req: a.req,
                                    want: a.want,
                                },
                            });
                        }
                        Ok(Err(_)) | Err(_) => {
                            live.free.push(slot);
                            *poisoned = true;
                            first_error.get_or_insert(FabricError::Invalid(format!(
                                "a reply receive from rank {} could not be posted again after a \
                                 forged reply",
                                a.peer
                            )));
                        }
                    }
                    continue;
                }
                let status = gather::reply_status(a.tag);
                let payload = a.got - gather::REPLY_HEADER_BYTES;
                // A ragged reply fills at most its receive (the stream's tail is short).
                let fits = if plan.requests[a.req].ragged.is_some() {
                    payload <= a.want
                } else {
                    payload == a.want
                };
                if status == 0 && fits {
                    got[a.msg] = payload;
                }
                if status != 0 || !fits {
                    first_error.get_or_insert(gather::bad_reply(a.peer, status, payload, a.want));
                    if status != 0 && payload == 0 {
                        cancel[a.req] = true;
                    } else {
                        *poisoned = true;
                    }
                    continue;
                }
                if let Landing::Bounce { scatter, .. } = msgs[a.msg].2.land {
                    for &(b, d, n) in &plan.scatter[scatter.0..scatter.1] {
                        // SAFETY: the plan keeps b..b+n inside the bounce buffer and
                        // d..d+n inside dst (validated); this reply has completed, so
                        // nothing else writes either range.
                        unsafe { ptr::copy_nonoverlapping(bounce_base.add(b), dst_base.add(d), n) };
                    }
                }
            }
            // Receives of refused requests never get data: cancel them.
            for (slot, f) in live.slots.iter().enumerate() {
                if let Some(InFlight {
                    op: Op::Recv { req, .. },
                    ..
                }) = f
                {
                    if cancel[*req] {
                        // SAFETY: the slot holds a receive posted on this endpoint.
                        unsafe { live.ep.cancel(live.contexts.ptr(slot)) };
                    }
                }
            }
            cancel.iter_mut().for_each(|c| *c = false);
        };

        // Takes a free slot, reaping (and settling) while none is.
        macro_rules! slot {
            () => {
                loop {
                    if let Some(s) = live.free.pop() {
                        break Some(s);
                    }
                    if let Err(e) = reap(live, settings, &mut first_error) {
                        first_error.get_or_insert(e);
                    }
                    settle(live, &mut cancel, &mut poisoned, &mut first_error, got);
                    if first_error.is_some() {
                        break None;
                    }
                }
            };
        }

        // The trash receive matches anything: it must not sit before this
        // batch's reply receives in the provider's queue.
        live.withdraw_trash();

        'posting: for (ri, req) in plan.requests.iter().enumerate() {
            for _ in &req.msgs {
                let g = next_msg;
                next_msg += 1;
                let Some(slot) = slot!() else {
                    break 'posting;
                };
                let stalled = Instant::now();
                loop {
                    match post_recv(live, slot, g) {
                        Ok(Ok(())) => break,
                        Ok(Err(_again)) if stalled.elapsed() <= settings.timeout => {
                            if let Err(e) = progress_once(live, &mut first_error) {
                                first_error.get_or_insert(e);
                            }
                            settle(live, &mut cancel, &mut poisoned, &mut first_error, got);
                            if first_error.is_some() {
                                live.free.push(slot);
                                break 'posting;
                            }
                        }
                        Ok(Err(_again)) => {
                            live.free.push(slot);
                            first_error.get_or_insert(FabricError::Timeout {
                                peer: req.owner,
                                waited: stalled.elapsed(),
                                detail: "fi_trecv kept returning FI_EAGAIN".into(),
                            });
                            break 'posting;
                        }
                        Err(e) => {
                            live.free.push(slot);
                            first_error.get_or_insert(e);
                            break 'posting;
                        }
                    }
                }
                live.slots[slot] = Some(InFlight {
                    peer: req.owner,
                    posted: Instant::now(),
                    op: Op::Recv {
                        msg: g,
                        req: ri,
                        want: msgs[g].2.len,
                    },
                });
            }
            let body = &mut live.requests[ri];
            let key = self.peers[req.owner].key;
            match &req.ragged {
                Some(part) => gather::encode_ragged(
                    body,
                    &mac_key,
                    &nonces[ri],
                    &self.name,
                    &gather::RaggedRequest {
                        key,
                        n_msgs: req.msgs.len() as u32,
                        part: part.clone(),
                    },
                ),
                None => gather::encode(
                    body,
                    &mac_key,
                    &nonces[ri],
                    &self.name,
                    &gather::Request {
                        key,
                        msg_ranges: req.msg_ranges.clone(),
                        ranges: req.ranges.clone(),
                    },
                ),
            }
            let Some(slot) = slot!() else {
                cancel[ri] = true;
                break 'posting;
            };
            let iov = [sys::iovec {
                iov_base: live.requests[ri].as_mut_ptr() as *mut c_void,
                iov_len: live.requests[ri].len(),
            }];
            let stalled = Instant::now();
            loop {
                // SAFETY: the request buffer is reader-owned and not touched until
                // the send completes (or is abandoned with a broken reader).
                let posted = unsafe {
                    live.ep.post_tsendv(
                        &iov,
                        live.peers_fi[req.owner],
                        gather::REQUEST_TAG,
                        live.contexts.ptr(slot),
                    )
                };
                match posted {
                    Ok(Ok(())) => break,
                    Ok(Err(_again)) if stalled.elapsed() <= settings.timeout => {
                        // Not accepted yet (rxm: still connecting): progress, never
                        // wait on the receives, which need this request sent first.
                        if let Err(e) = progress_once(live, &mut first_error) {
                            first_error.get_or_insert(e);
                        }
                        settle(live, &mut cancel, &mut poisoned, &mut first_error, got);
                        if first_error.is_some() {
                            live.free.push(slot);
                            cancel[ri] = true;
                            break 'posting;
                        }
                        std::thread::yield_now();
                    }
                    Ok(Err(_again)) => {
                        live.free.push(slot);
                        cancel[ri] = true;
                        first_error.get_or_insert(FabricError::Timeout {
                            peer: req.owner,
                            waited: stalled.elapsed(),
                            detail: "a gather request could not be sent (FI_EAGAIN)".into(),
                        });
                        break 'posting;
                    }
                    Err(e) => {
                        live.free.push(slot);
                        cancel[ri] = true;
                        first_error.get_or_insert(match e {
                            FabricError::Ofi {
                                call,
                                code,
                                message,
                                ..
                            } => FabricError::Ofi {
                                call,
                                code,
                                message: format!("request to rank {}: {message}", req.owner),
                                peer: Some(req.owner),
                            },
                            other => other,
                        });
                        break 'posting;
                    }
                }
            }
            sent[ri] = true;
            live.slots[slot] = Some(InFlight {
                peer: req.owner,
                posted: Instant::now(),
                op: Op::Send,
            });
        }
        // Every reply receive is posted: from now on what matches none of
        // them lands in the trash.
        live.post_trash();
        // Receives of requests never sent get no reply.
        for (ri, s) in sent.iter().enumerate() {
            if !s {
                cancel[ri] = true;
            }
        }
        settle(live, &mut cancel, &mut poisoned, &mut first_error, got);
        // Complete (or cancel) everything posted before dst is handed back;
        // a timeout here breaks the reader, which closes its endpoint.
        while live.free.len() < live.slots.len() {
            if let Err(e) = reap(live, settings, &mut first_error) {
                first_error.get_or_insert(e);
                break;
            }
            live.post_trash();
            settle(live, &mut cancel, &mut poisoned, &mut first_error, got);
        }
        let outstanding = live.free.len() < live.slots.len();
        if outstanding || poisoned {
            let why = first_error
                .as_ref()
                .map(|e| e.to_string())
                .unwrap_or_default();
            self.break_reader(why);
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        for &(from, to, n) in &plan.repeats {
            dst.copy_within(from..from + n, to);
        }
        Ok(())
    }
}

/// Bytes of the trash receive: a longer message is truncated (and dropped).
const TRASH_BYTES: usize = 256;
/// Longest wait for the trash receive's cancellation before a batch posts.
const TRASH_WITHDRAW: Duration = Duration::from_millis(200);

impl Live {
    /// Posts the trash receive (any tag, any sender) if it is not posted.
    fn post_trash(&mut self) {
        if self.trash_posted {
            return;
        }
        let ctx = self.contexts.ptr(self.slots.len());
        // SAFETY: the trash buffer and its context belong to this reader and
        // are abandoned, never freed, if the reader breaks with it posted.
        let rc = unsafe {
            self.ep
                .post_trecv(self.trash.as_mut_ptr(), self.trash.len(), 0, u64::MAX, ctx)
        };
        self.trash_posted = matches!(rc, Ok(Ok(())));
    }

    /// Cancels the trash receive and waits (briefly) until the provider says
    /// it is gone, reaping what else completes meanwhile.
    fn withdraw_trash(&mut self) {
        if !self.trash_posted {
            return;
        }
        // SAFETY: the trash receive is posted on this endpoint.
        unsafe { self.ep.cancel(self.contexts.ptr(self.slots.len())) };
        let deadline = Instant::now() + TRASH_WITHDRAW;
        let mut ignored = None;
        while self.trash_posted && Instant::now() < deadline {
            if progress_once(self, &mut ignored).is_err() {
                break;
            }
        }
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
fn reap(
    live: &mut Live,
    settings: &ReaderSettings,
    first_error: &mut Option<FabricError>,
) -> FabricResult<()> {
    reap_until(live, Some(settings), first_error, false)
}

/// Polls the CQ once without waiting for anything to complete (progresses
/// the provider, e.g. a connection a send waits for).
fn progress_once(live: &mut Live, first_error: &mut Option<FabricError>) -> FabricResult<()> {
    reap_until(live, None, first_error, true)
}

/// As [`reap`]; with `once`, returns after one poll. Its time counts as completion wait.
fn reap_until(
    live: &mut Live,
    settings: Option<&ReaderSettings>,
    first_error: &mut Option<FabricError>,
    once: bool,
) -> FabricResult<()> {
    let started = Instant::now();
    let reaped = poll_until(live, settings, first_error, once);
    live.times.cq_ns += started.elapsed().as_nanos() as u64;
    reaped
}

fn poll_until(
    live: &mut Live,
    settings: Option<&ReaderSettings>,
    first_error: &mut Option<FabricError>,
    once: bool,
) -> FabricResult<()> {
    let mut done = [Done {
        ctx: ptr::null_mut(),
        len: 0,
        tag: 0,
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
        let Some(settings) = settings.filter(|_| !once) else {
            return Ok(());
        };
        if !live.check_deadline(settings)? {
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
                    header: self.headers[slot],
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
    fn check_deadline(&self, settings: &ReaderSettings) -> FabricResult<bool> {
        let Some((peer, waited, op)) = oldest(self) else {
            return Ok(false);
        };
        if waited <= settings.timeout {
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

impl ShareReader for OfiReader {
    fn times(&self) -> ReaderTimes {
        self.live
            .as_ref()
            .map_or(self.times, |l| self.times.plus(l.times))
    }

    fn read_many(&mut self, reads: &[RemoteRead], dst: &mut [u8]) -> ddstore_core::Result<()> {
        if let Some(why) = &self.broken {
            return Err(ddstore_core::Error::Transport(format!(
                "this reader is unusable after an earlier failure ({why}); open a new one"
            )));
        }
        self.validate(reads, dst.len())?;
        if reads.iter().all(|r| r.len == 0) {
            return Ok(());
        }
        self.check_out()?;
        let read = self.read_checked_out(reads, dst);
        self.check_in();
        read
    }

    fn read_ragged_rows(
        &mut self,
        unit_bytes: usize,
        requests: &[RaggedRequest<'_>],
        staging: Vec<u8>,
    ) -> ddstore_core::Result<Option<RaggedRows>> {
        if let Some(why) = &self.broken {
            return Err(ddstore_core::Error::Transport(format!(
                "this reader is unusable after an earlier failure ({why}); open a new one"
            )));
        }
        let served = |r: &RaggedRequest<'_>| self.peers.get(r.owner).is_some_and(|p| p.gather);
        if !self.settings.gather || !requests.iter().all(served) {
            return Ok(None);
        }
        self.check_out()?;
        let read = self.gather_ragged(unit_bytes, requests, staging);
        self.check_in();
        read
    }
}

impl OfiReader {
    /// [`ShareReader::read_many`] once an endpoint is lent.
    fn read_checked_out(
        &mut self,
        reads: &[RemoteRead],
        dst: &mut [u8],
    ) -> ddstore_core::Result<()> {
        if !self.settings.gather {
            return Ok(self.do_reads(reads, dst)?);
        }
        // Owners that serve the gather path get requests; any other owner
        // (a record without it) is read one-sided.
        let (gathered, direct): (Vec<&RemoteRead>, Vec<&RemoteRead>) =
            reads.iter().partition(|r| self.peers[r.owner].gather);
        if !gathered.is_empty() {
            let list: Vec<(usize, u64, usize, usize)> = gathered
                .iter()
                .map(|r| (r.owner, r.offset, r.len, r.dst_offset))
                .collect();
            self.do_gather(&list, dst)?;
        }
        if !direct.is_empty() {
            if let Some(why) = &self.broken {
                return Err(ddstore_core::Error::Transport(why.clone()));
            }
            let direct: Vec<RemoteRead> = direct.into_iter().copied().collect();
            self.do_reads(&direct, dst)?;
        }
        Ok(())
    }

    /// The ragged gather: plans [`gather::plan_ragged`] requests, lands every
    /// reply in a staging buffer this call owns (never the caller's memory:
    /// the reply sizes are only known once they arrive) and checks each
    /// reply stream against its rows.
    fn gather_ragged(
        &mut self,
        unit_bytes: usize,
        requests: &[RaggedRequest<'_>],
        staging: Vec<u8>,
    ) -> ddstore_core::Result<Option<RaggedRows>> {
        let owners: Vec<gather::RaggedOwner<'_>> = requests
            .iter()
            .map(|r| gather::RaggedOwner {
                owner: r.owner,
                ends_key: r.ends_key,
                rows: r.rows,
                max_row_bytes: r.max_row_bytes,
                share_bytes: self.peers[r.owner].len,
            })
            .collect();
        let staging_buf = staging;
        let Some((plan, slots, staging)) =
            gather::plan_ragged(&owners, unit_bytes, self.gather_limits())
        else {
            return Ok(None);
        };
        // A reused buffer is only zeroed where it grows; every byte read back was received.
        let mut data = staging_buf;
        if data.len() < staging {
            data.resize(staging, 0);
        }
        let mut got = Vec::new();
        let result = self.exchange(&plan, &mut data[..staging], &mut got);
        if self.broken.is_some() {
            // Receives may still target it (the endpoint may outlive us in a
            // bound MR): never free it under the provider.
            std::mem::forget(data);
            result?;
            return Err(ddstore_core::Error::Transport(
                "the reader broke during a ragged gather".into(),
            ));
        }
        result?;
        let mut rows: Vec<Vec<(u64, usize)>> = requests
            .iter()
            .map(|r| Vec::with_capacity(r.rows.len()))
            .collect();
        let mut first_msg = 0;
        for (req, slot) in plan.requests.iter().zip(&slots) {
            let m = req.msgs.first().map_or(0, |x| x.len);
            let gots = &got[first_msg..first_msg + req.msgs.len()];
            first_msg += req.msgs.len();
            // Full messages, then at most one short one, then empty ones.
            let full = gots.iter().take_while(|&&g| g == m).count();
            let tail_ok = gots[full..].iter().skip(1).all(|&g| g == 0);
            let stream_len: usize = gots.iter().sum();
            let parsed = if tail_ok {
                gather::parse_ragged_reply(
                    &data[slot.at..slot.at + stream_len],
                    slot.rows.1 - slot.rows.0,
                    unit_bytes,
                    requests[slot.owner_index].max_row_bytes,
                )
            } else {
                Err(format!(
                    "ragged reply messages of {gots:?} bytes leave a gap"
                ))
            };
            let parsed = parsed
                .map_err(|e| ddstore_core::Error::Transport(format!("rank {}: {e}", req.owner)))?;
            rows[slot.owner_index].extend(parsed.into_iter().map(|(u, off)| (u, slot.at + off)));
        }
        Ok(Some(RaggedRows { data, rows }))
    }
}

/// Completion errors of a target refusing the key or range (verbs, cxi).
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
