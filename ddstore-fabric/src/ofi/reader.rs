//! A reader: one endpoint + CQ + AV of its own, posting `fi_read`s in a
//! window and completing them with a deadline.

use std::collections::HashMap;
use std::os::raw::c_void;
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ddstore_core::transport::{RemoteRead, ShareReader};
use libfabric_sys as sys;

use super::av::Av;
use super::cq::{Cq, Poll};
use super::domain::Domain;
use super::endpoint::Endpoint;
use super::mr::MemoryRegion;
use super::record::ShareRecord;
use crate::error::{FabricError, FabricResult};

/// Destination ranges registered once through `register_dst`; each reader
/// registers a range with its own endpoint the first time it reads into it.
#[derive(Default)]
pub struct DstRegistry {
    ranges: Mutex<Vec<DstRange>>,
    next_id: AtomicU64,
}

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
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
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

/// Operation contexts at fixed addresses (FI_CONTEXT2: the provider may
/// use them until the operation completes or the endpoint closes).
struct Contexts {
    base: *mut sys::fi_context2,
    len: usize,
}

impl Contexts {
    fn new(len: usize) -> Contexts {
        let boxed: Box<[sys::fi_context2]> =
            (0..len).map(|_| sys::fi_context2::default()).collect();
        Contexts {
            base: Box::into_raw(boxed) as *mut sys::fi_context2,
            len,
        }
    }
    fn ptr(&self, slot: usize) -> *mut c_void {
        debug_assert!(slot < self.len);
        self.base.wrapping_add(slot) as *mut c_void
    }
    fn slot_of(&self, ctx: *mut c_void) -> Option<usize> {
        let offset = (ctx as usize).checked_sub(self.base as usize)?;
        let size = std::mem::size_of::<sys::fi_context2>();
        (offset % size == 0 && offset / size < self.len).then_some(offset / size)
    }
    /// After a failure the provider may still hold pointers into them.
    fn abandon(self) {
        std::mem::forget(self);
    }
}

impl Drop for Contexts {
    fn drop(&mut self) {
        // SAFETY: base/len come from Box::into_raw of a boxed slice of len
        // elements; no operation is in flight once a reader drops normally.
        drop(unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(self.base, self.len)) });
    }
}

// SAFETY: the contexts are plain memory owned by the reader; the provider
// only uses them during calls made by the reader's current thread.
unsafe impl Send for Contexts {}

struct InFlight {
    peer: usize,
    posted: Instant,
}

struct Live {
    /// Registrations of `DstRegistry` ranges, by range id (closed before `ep`).
    dst_mrs: HashMap<u64, MemoryRegion>,
    ep: Arc<Endpoint>,
    peers_fi: Vec<sys::fi_addr_t>,
    contexts: Contexts,
    slots: Vec<Option<InFlight>>,
    free: Vec<usize>,
}

pub struct ReaderSettings {
    pub window: usize,
    pub timeout: Duration,
    pub max_read_bytes: usize,
    /// Register destinations and pass descriptors even when the provider
    /// does not require FI_MR_LOCAL (always legal; tests the cxi/verbs path).
    pub force_local_mr: bool,
}

pub struct OfiReader {
    live: Option<Live>,
    broken: Option<String>,
    peers: Arc<Vec<ShareRecord>>,
    registry: Arc<DstRegistry>,
    settings: ReaderSettings,
    chunk: usize,
    virt_addr: bool,
    local_mr: bool,
}

impl OfiReader {
    pub fn open(
        domain: &Arc<Domain>,
        peers: Arc<Vec<ShareRecord>>,
        registry: Arc<DstRegistry>,
        settings: ReaderSettings,
    ) -> FabricResult<OfiReader> {
        let window = settings.window.max(1);
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
        // A wait object lets an idle reader block in the provider's wait set
        // (sockets, eventfds), which also progresses the provider promptly.
        let cq = Arc::new(Cq::open_blocking_if_possible(domain, window * 2)?);
        let av = Arc::new(Av::open(domain, peers.len())?);
        let ep = Arc::new(Endpoint::open(domain, cq, av)?);
        let own_len = ep.name()?.len();
        let names: Vec<&[u8]> = peers.iter().map(|p| p.addr.as_slice()).collect();
        let peers_fi = ep.av().insert(&names, own_len)?;
        let info = domain.info();
        let max_msg = info.max_msg_size().max(1);
        Ok(OfiReader {
            live: Some(Live {
                dst_mrs: HashMap::new(),
                ep,
                peers_fi,
                contexts: Contexts::new(window),
                slots: (0..window).map(|_| None).collect(),
                free: (0..window).rev().collect(),
            }),
            broken: None,
            chunk: max_msg.min(settings.max_read_bytes.max(1)),
            virt_addr: domain.requires(sys::FI_MR_VIRT_ADDR),
            local_mr: domain.requires(sys::FI_MR_LOCAL) || settings.force_local_mr,
            peers,
            registry,
            settings: ReaderSettings { window, ..settings },
        })
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
            if !matches!(r.dst_offset.checked_add(r.len), Some(e) if e <= dst_len) {
                return Err(Error::IndexOutOfRange(format!(
                    "read of {} bytes to offset {} overflows a destination of {dst_len} bytes",
                    r.len, r.dst_offset
                )));
            }
        }
        Ok(())
    }

    fn do_reads(&mut self, reads: &[RemoteRead], dst: &mut [u8]) -> FabricResult<()> {
        let live = self.live.as_mut().expect("checked by read_many");
        let dst_base = dst.as_mut_ptr();
        // Local descriptor: a registered range covering dst, or a registration
        // for this call (kept until every read has completed or the endpoint closed).
        let mut temporary: Option<MemoryRegion> = None;
        let desc = if self.local_mr {
            let ranges = self.registry.snapshot();
            live.dst_mrs
                .retain(|id, _| ranges.iter().any(|r| r.id == *id));
            let start = dst_base as usize;
            let covering = ranges
                .iter()
                .find(|r| start >= r.addr && start + dst.len() <= r.addr + r.len);
            let mr = match covering {
                Some(r) => match live.dst_mrs.entry(r.id) {
                    std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
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
                        e.insert(mr)
                    }
                },
                None => {
                    // SAFETY: dst is borrowed mutably for this whole call and the
                    // registration is closed before the call returns.
                    let mr = unsafe {
                        MemoryRegion::register(
                            live.ep.domain(),
                            &live.ep,
                            dst_base,
                            dst.len(),
                            sys::FI_READ as u64,
                        )
                    }?;
                    temporary.insert(mr)
                }
            };
            mr.desc()
        } else {
            ptr::null_mut()
        };

        let mut first_error: Option<FabricError> = None;
        let chunk = self.chunk;
        'posting: for r in reads.iter().filter(|r| r.len > 0) {
            let peer = &self.peers[r.owner];
            let remote_base = if self.virt_addr { peer.base } else { 0 };
            let mut done = 0usize;
            while done < r.len {
                let n = chunk.min(r.len - done);
                let slot = loop {
                    if let Some(s) = live.free.pop() {
                        break s;
                    }
                    if let Err(e) = reap(live, &self.settings, &mut first_error) {
                        first_error.get_or_insert(e);
                    }
                    if first_error.is_some() {
                        break 'posting;
                    }
                };
                let stalled = Instant::now();
                loop {
                    // SAFETY: the destination bytes lie inside dst (validated),
                    // which stays borrowed until all reads completed or the
                    // endpoint is closed (break_reader); the context slot is
                    // reserved until its completion is reaped.
                    let posted = unsafe {
                        live.ep.post_read(
                            dst_base.add(r.dst_offset + done),
                            n,
                            desc,
                            live.peers_fi[r.owner],
                            remote_base + r.offset + done as u64,
                            peer.key,
                            live.contexts.ptr(slot),
                        )
                    };
                    match posted {
                        Ok(Ok(())) => break,
                        Ok(Err(_try_again)) => {
                            if stalled.elapsed() > self.settings.timeout {
                                live.free.push(slot);
                                first_error.get_or_insert(FabricError::Timeout {
                                    peer: r.owner,
                                    waited: stalled.elapsed(),
                                    detail: "fi_read kept returning FI_EAGAIN".into(),
                                });
                                break 'posting;
                            }
                            if let Err(e) = reap(live, &self.settings, &mut first_error) {
                                first_error.get_or_insert(e);
                            }
                            if first_error.is_some() {
                                live.free.push(slot);
                                break 'posting;
                            }
                            // Nothing of ours in flight: the provider is busy
                            // (e.g. still connecting); do not spin flat out.
                            if live.free.len() + 1 == live.slots.len() {
                                std::thread::sleep(Duration::from_micros(20));
                            }
                        }
                        Err(e) => {
                            live.free.push(slot);
                            first_error.get_or_insert(match e {
                                FabricError::Ofi {
                                    call,
                                    code,
                                    message,
                                } => FabricError::Ofi {
                                    call,
                                    code,
                                    message: format!("read from rank {}: {message}", r.owner),
                                },
                                other => other,
                            });
                            break 'posting;
                        }
                    }
                }
                live.slots[slot] = Some(InFlight {
                    peer: r.owner,
                    posted: Instant::now(),
                });
                done += n;
            }
        }
        // Complete everything posted, even after an error, so dst is no longer
        // written once we return; a timeout here breaks the reader.
        while live.free.len() < live.slots.len() {
            if let Err(e) = reap(live, &self.settings, &mut first_error) {
                first_error.get_or_insert(e);
                break;
            }
        }
        let outstanding = live.free.len() < live.slots.len();
        if outstanding {
            let why = first_error
                .as_ref()
                .map(|e| e.to_string())
                .unwrap_or_default();
            self.break_reader(why);
        }
        drop(temporary);
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Reads may still be in flight: cancel them, close the endpoint (which
    /// stops every transfer into caller memory) and refuse further use.
    fn break_reader(&mut self, why: String) {
        if let Some(live) = self.live.take() {
            for (slot, state) in live.slots.iter().enumerate() {
                if state.is_some() {
                    // SAFETY: the slot holds a read posted on this endpoint.
                    unsafe { live.ep.cancel(live.contexts.ptr(slot)) };
                }
            }
            let Live {
                dst_mrs,
                ep,
                contexts,
                ..
            } = live;
            drop(ep);
            drop(dst_mrs); // the last Arc<Endpoint> may be held by a bound MR
            contexts.abandon();
        }
        self.broken = Some(why);
    }
}

/// Polls spun before an idle reader blocks (or sleeps, without a wait object).
const SPINS: u32 = 32;
/// Longest block in `fi_cq_sread`, so timeouts are checked regularly.
const WAIT_MS: i32 = 1;

/// Polls the CQ once, freeing completed slots; records a failed read and
/// returns a timeout when the oldest read waited longer than allowed.
fn reap(
    live: &mut Live,
    settings: &ReaderSettings,
    first_error: &mut Option<FabricError>,
) -> FabricResult<()> {
    let mut entries = [sys::fi_cq_entry::default(); 32];
    let mut idle: u32 = 0;
    let cq = live.ep.cq().clone();
    loop {
        let polled = if cq.has_wait() && idle >= SPINS {
            match cq.wait_read(&mut entries, WAIT_MS) {
                Err(FabricError::Ofi { code, .. }) if code == -(sys::FI_ENOSYS as i64) => {
                    cq.poll(&mut entries)
                }
                other => other,
            }
        } else {
            cq.poll(&mut entries)
        };
        match polled? {
            Poll::Completed(0) => {}
            Poll::Completed(n) => {
                for e in &entries[..n] {
                    if let Some(slot) = live.contexts.slot_of(e.op_context) {
                        if live.slots[slot].take().is_some() {
                            live.free.push(slot);
                        }
                    }
                }
                return Ok(());
            }
            Poll::Failed(err) => {
                let slot = live.contexts.slot_of(err.context);
                let peer = slot
                    .and_then(|s| live.slots[s].take())
                    .map(|f| f.peer)
                    .or_else(|| {
                        // No context (shm): if every read in flight targets one peer, it is that one.
                        let mut peers = live.slots.iter().flatten().map(|f| f.peer);
                        let first = peers.next()?;
                        peers.all(|p| p == first).then_some(first)
                    });
                if slot.is_none() && peer.is_none() {
                    // A failure that names no read (shm, a peer killed while reads to several
                    // peers are in flight): the live peers' reads still complete, so the dead
                    // peer's reads are what is left when the timeout below names their rank.
                    continue;
                }
                if let Some(s) = slot {
                    if !live.free.contains(&s) && live.slots[s].is_none() {
                        live.free.push(s);
                    }
                }
                let who = peer
                    .map(|p| format!("rank {p}"))
                    .unwrap_or_else(|| "a peer".into());
                let lost = peer_lost(err.code);
                first_error.get_or_insert(match peer {
                    // A peer that has gone surfaces as a cancelled or refused read.
                    Some(peer) if lost => FabricError::Timeout {
                        peer,
                        waited: std::time::Duration::ZERO,
                        // tcp drops the connection of a read whose key it never issued.
                        detail: format!(
                            "the connection to rank {peer} is lost ({}): it has exited, or it \
                             refused this reader's memory key",
                            err.message
                        ),
                    },
                    Some(peer) if key_refused(err.code) => FabricError::Ofi {
                        call: "fi_read",
                        code: err.code,
                        message: format!(
                            "rank {peer} refused the read ({}): the memory key or address is not one \
                             it issued (a share record from another job, or altered)",
                            err.message
                        ),
                    },
                    _ => FabricError::Ofi {
                        call: "fi_read",
                        code: err.code,
                        message: format!("read from {who} failed: {}", err.message),
                    },
                });
                return Ok(());
            }
        }
        if let Some((peer, waited)) = oldest(live) {
            if waited > settings.timeout {
                return Err(FabricError::Timeout {
                    peer,
                    waited,
                    detail: "a read was posted but never completed (the peer may have exited)"
                        .into(),
                });
            }
        } else {
            return Ok(());
        }
        idle += 1;
        if idle < SPINS {
            std::hint::spin_loop();
        } else if idle < SPINS * 64 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(20));
        }
    }
}

fn oldest(live: &Live) -> Option<(usize, Duration)> {
    live.slots
        .iter()
        .flatten()
        .map(|f| (f.peer, f.posted.elapsed()))
        .max_by_key(|(_, w)| *w)
}

impl ShareReader for OfiReader {
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
        Ok(self.do_reads(reads, dst)?)
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
