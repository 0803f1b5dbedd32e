//! The owner's side of the gather path: the shares this process serves (by
//! memory key) and the progress-thread loop that answers requests with
//! tagged messages. See [`super`] for the protocol.
//!
//! Bounds, whatever the sender or the provider: a request is used only once
//! its MAC holds under the job's key (anything else is dropped without a
//! reply and without touching the AV); its reply address must look like this
//! endpoint's own; its replies are bounded ([`check_request`](super::answer::check_request)); each
//! reader has at most [`PEER_SENDS`] replies in flight and [`PEER_BACKLOG`]
//! queued ([`TOTAL_BACKLOG`] over all readers); reply addresses the
//! provider refused a send to and no send has completed to since ("stuck":
//! an address that never accepts, or a reader still connecting) queue at
//! most [`STUCK_BACKLOG`] replies and hold [`STUCK_PACKED`] bytes together,
//! and lose their queues, the one stuck longest first, to make room for
//! any other reader, so unreachable addresses cannot take the backlog from
//! readers being served; packed replies (ragged ones included) are built
//! only when their turn to be sent comes, from fallible allocations, within
//! [`PEER_PACKED`] bytes per reply address and [`PACKED_IN_FLIGHT`] over
//! all, and their memory is freed (and trimmed from the allocator) when
//! they complete or expire; each reply address's request ids are admitted
//! once ([`wire::SeenRequests`]: replays are dropped); a reader whose reply
//! has not completed within the readers' timeout is dropped (its address
//! removed, which closes its connection) so that the others keep being
//! served. A send the provider refuses is tried again after [`RETRY_MS`]
//! (longer, up to [`MAX_RETRY_MS`], while nothing of its address is in
//! flight) or at the next completion, never in a busy loop.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ddstore_core::memory::Memory;
use libfabric_sys as sys;

use super::answer::{self, Access, Bounds, ReplyBody as Body, ServedShares};
use super::spill_reads::{Done, Job, SpillReads};
use super::wire::{self, Nonce, Refusal};
use crate::ofi::context::Contexts;
use crate::ofi::cq::Poll;
use crate::ofi::endpoint::Endpoint;

/// Requests received at once (each slot holds one request of up to 16 KiB);
/// more wait in the provider until a slot is posted again.
const REQUEST_SLOTS: usize = 32;
/// Replies in flight at once, over all readers.
const SEND_SLOTS: usize = 512;
/// Replies in flight to one reader at once (a reader's default window,
/// `DDSTORE_MAX_INFLIGHT`, so large rows stream at full depth): a reader
/// that stops progressing holds at most these.
pub const PEER_SENDS: usize = 64;
/// Replies queued for one reader; a request that would queue more is dropped.
pub const PEER_BACKLOG: usize = 1024;
/// Replies queued over all readers.
pub const TOTAL_BACKLOG: usize = 16384;
/// Replies queued over all stuck reply addresses (see above).
pub const STUCK_BACKLOG: usize = TOTAL_BACKLOG / 8;
/// Bytes of packed replies (built, queued or in flight) at once (at least
/// one is always allowed).
pub const PACKED_IN_FLIGHT: usize = 128 << 20;
/// Bytes of packed replies held for one reply address (at least one is
/// always allowed).
pub const PEER_PACKED: usize = PACKED_IN_FLIGHT / 4;
/// Bytes of packed replies held for stuck reply addresses, over all of
/// them: within it a packed reply the provider refused keeps its buffer
/// (not packed again at every try).
pub const STUCK_PACKED: usize = 16 << 20;
/// How long a reply address whose last send the provider refused (still
/// connecting, or not accepting) waits before the next try, unless a
/// completion comes first.
pub const RETRY_MS: i32 = 5;
/// The longest wait before a stuck address with nothing in flight is tried again.
pub const MAX_RETRY_MS: u64 = 160;
/// Reply addresses whose request ids are remembered (see [`wire::SeenRequests`]).
const SEEN_ADDRESSES: usize = 1 << 16;
/// The shortest replay window: readers' and owners' clocks may differ by
/// this much.
const MIN_REPLAY_WINDOW: Duration = Duration::from_secs(60);
/// Bytes of packed replies freed since the last trim above which the
/// allocator is asked to give free memory back once at most this much is
/// held (one packed message).
const TRIM_AFTER: usize = wire::MAX_PACKED_BYTES;
/// Bytes of replies being read from spill files at once (at least one is
/// always allowed): two 4 MiB replies per spill-read thread, so the threads
/// stay busy while a spilling owner's memory beside its budget stays small.
pub const SPILL_PACKING: usize = 2 * super::spill_reads::SPILL_READ_THREADS * (4 << 20);
/// CQ entries the serving endpoint needs (every posted operation completes there).
pub const CQ_SIZE: usize = 2 * (REQUEST_SLOTS + SEND_SLOTS);
/// Longest block in `fi_cq_sread` before the stop flag and deadlines are checked.
const WAIT_MS: i32 = 100;
/// Reader names remembered (each an AV entry); beyond that idle ones are removed.
const MAX_ROUTES: usize = 4096;
/// Packing buffers kept for reuse once their reply is sent: no allocation
/// (and no fresh zeroed pages) per packed reply on the serving hot path.
const SPARE_PACKING_BUFFERS: usize = 8;
/// How long shutdown waits for cancelled operations before abandoning buffers.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(2);
/// What an empty reply's one iov entry points at (it reads none of it).
static NO_BYTES: u8 = 0;

struct Reply {
    nonce: Nonce,
    index: u32,
    /// 0: data, else a [`Refusal`].
    status: u64,
    body: Body,
    /// When the request arrived: a reply not taken by the provider within
    /// the readers' timeout is dropped (its reader has given up).
    queued: Instant,
}

impl Reply {
    /// Bytes of packed reply it holds.
    fn held(&self) -> usize {
        match &self.body {
            Body::Packed(b) => b.len(),
            _ => 0,
        }
    }
}

/// A reply posted to the provider: its memory stays here until it completes.
struct Sending {
    peer: sys::fi_addr_t,
    reply: Reply,
    /// A buffer packed for it (counted in `packed_held`).
    packed: Option<Vec<u8>>,
    iov: Vec<sys::iovec>,
    posted: Instant,
    /// Its reader was dropped for stalling: it only waits for the provider now.
    abandoned: bool,
}

// SAFETY: the iovecs point into the reply's buffers (owned here)
// or a share kept alive by an Arc<dyn Memory> (Send + Sync); nothing else.
unsafe impl Send for Sending {}

/// One reply address's state at this owner.
struct Peer {
    backlog: VecDeque<Reply>,
    in_flight: usize,
    /// Bytes of packed replies held for it (queued or in flight).
    packed: usize,
    /// The provider refused a send to it and none has completed since
    /// (see [`Peer::is_stuck`]).
    stuck: bool,
    /// When it last got stuck (the one stuck longest loses its queue first).
    since: Instant,
    /// The provider refused its last send: not tried again before this.
    retry_at: Option<Instant>,
    /// Sends refused in a row (with nothing in flight it waits longer
    /// after each, up to [`MAX_RETRY_MS`]).
    refused: u32,
}

impl Peer {
    fn new() -> Peer {
        Peer {
            backlog: VecDeque::new(),
            in_flight: 0,
            packed: 0,
            stuck: false,
            since: Instant::now(),
            retry_at: None,
            refused: 0,
        }
    }

    /// Whether it is stuck: refused, with nothing in flight (an address
    /// with sends in flight is connected, and the provider only busy).
    fn is_stuck(&self) -> bool {
        self.stuck && self.in_flight == 0
    }

    /// Whether it may be sent to now.
    fn ready(&self, now: Instant) -> bool {
        self.retry_at.is_none_or(|t| t <= now)
    }
}

/// What became of a reply taken from the front of a reader's queue.
enum Flushed {
    /// Posted, dropped, or replaced by a refusal: the next reply may go.
    Next,
    /// Back at the front of the queue until the provider (or the packing
    /// budget) takes more.
    Later,
}

/// State of the serving loop, owned by the progress thread.
pub struct Server {
    ep: Arc<Endpoint>,
    shares: Arc<ServedShares>,
    access: Arc<Access>,
    max_msg: usize,
    /// Ranges one send takes.
    zero_copy_ranges: usize,
    name: Vec<u8>,
    requests: Vec<Box<[u8]>>,
    posted: Vec<bool>,
    /// Slots 0..REQUEST_SLOTS: receives; then SEND_SLOTS sends.
    contexts: Contexts,
    sending: Vec<Option<Sending>>,
    free_sends: Vec<usize>,
    peers: HashMap<sys::fi_addr_t, Peer>,
    /// Peers with queued replies, in turn.
    ready: VecDeque<sys::fi_addr_t>,
    queued_total: usize,
    /// Bytes of packed replies held (built and queued, being read from a
    /// spill file, or in flight).
    packed_held: usize,
    /// Bytes of packed replies freed since the allocator was last trimmed.
    freed_since_trim: usize,
    last_trim: Instant,
    routes: HashMap<Vec<u8>, sys::fi_addr_t>,
    /// Request ids admitted per reply address (replays are dropped).
    seen: wire::SeenRequests,
    expiry: Duration,
    /// Packing buffers of sent replies, reused by the next packed replies.
    spare: Vec<Vec<u8>>,
    /// Replies reaching into a spill file, packed off this thread (each
    /// holds its send slot and counts as in flight to its reader).
    spill_reads: SpillReads<(sys::fi_addr_t, usize, Reply)>,
    /// Bytes of replies the spill-read threads are packing now.
    spill_packing: usize,
}

impl Server {
    /// `expiry`: how long a reply may wait for the provider (the readers'
    /// `DDSTORE_TIMEOUT_S`); `access`: the job's request key.
    pub fn new(
        ep: Arc<Endpoint>,
        shares: Arc<ServedShares>,
        access: Arc<Access>,
        expiry: Duration,
    ) -> crate::error::FabricResult<Server> {
        let info = ep.domain().info();
        let max_msg = info.max_msg_size().max(1);
        let iov_limit = info.tx_iov_limit().clamp(1, 16);
        let name = ep.name()?;
        let cq = ep.cq().clone();
        let spill_reads = SpillReads::new(move || cq.signal());
        Ok(Server {
            ep,
            shares,
            access,
            max_msg,
            zero_copy_ranges: iov_limit,
            name,
            requests: (0..REQUEST_SLOTS)
                .map(|_| vec![0u8; wire::MAX_REQUEST_BYTES].into_boxed_slice())
                .collect(),
            posted: vec![false; REQUEST_SLOTS],
            contexts: Contexts::new(REQUEST_SLOTS + SEND_SLOTS),
            sending: (0..SEND_SLOTS).map(|_| None).collect(),
            free_sends: (0..SEND_SLOTS).rev().collect(),
            peers: HashMap::new(),
            ready: VecDeque::new(),
            queued_total: 0,
            packed_held: 0,
            freed_since_trim: 0,
            last_trim: Instant::now(),
            routes: HashMap::new(),
            seen: wire::SeenRequests::new(expiry.max(MIN_REPLAY_WINDOW), SEEN_ADDRESSES),
            expiry,
            spare: Vec::new(),
            spill_reads,
            spill_packing: 0,
        })
    }

    fn post_request_slot(&mut self, slot: usize) {
        if self.posted[slot] {
            return;
        }
        let buf = &mut self.requests[slot];
        // Any tag: every message sent to this endpoint lands in a request
        // slot and is authenticated there (none piles up unexpected).
        // SAFETY: the boxed buffer and the context slot live in this Server,
        // which cancels or abandons every posted receive before it drops.
        let rc = unsafe {
            self.ep.post_trecv(
                buf.as_mut_ptr(),
                buf.len(),
                wire::REQUEST_TAG,
                u64::MAX,
                self.contexts.ptr(slot),
            )
        };
        // FI_EAGAIN or an error: try again on the next turn of the loop.
        self.posted[slot] = matches!(rc, Ok(Ok(())));
    }

    /// Whether `name` (from an authenticated request) looks like an
    /// endpoint name of this provider: no longer than ours and, for socket
    /// addresses, of our address family and length.
    fn plausible_name(&self, name: &[u8]) -> bool {
        let family = |n: &[u8]| n.get(..2).map(|f| u16::from_ne_bytes([f[0], f[1]]));
        let own = family(&self.name);
        let inet = [libc::AF_INET as u16, libc::AF_INET6 as u16];
        match own {
            Some(f) if inet.contains(&f) => {
                name.len() == self.name.len() && family(name) == Some(f)
            }
            _ => !name.is_empty() && name.len() <= self.name.len(),
        }
    }

    /// The AV address of an authenticated reader name, inserted on first use.
    fn route(&mut self, name: &[u8]) -> Option<sys::fi_addr_t> {
        if let Some(a) = self.routes.get(name) {
            return Some(*a);
        }
        if !self.plausible_name(name) {
            return None;
        }
        if self.routes.len() >= MAX_ROUTES {
            // Forget readers with nothing queued or in flight.
            let idle: Vec<Vec<u8>> = self
                .routes
                .iter()
                .filter(|(_, a)| {
                    self.peers
                        .get(a)
                        .is_none_or(|p| p.in_flight == 0 && p.backlog.is_empty())
                })
                .map(|(n, _)| n.clone())
                .collect();
            for n in idle {
                if let Some(a) = self.routes.remove(&n) {
                    self.peers.remove(&a);
                    let _ = self.ep.av().remove(a);
                }
            }
            if self.routes.len() >= MAX_ROUTES {
                return None;
            }
        }
        let addr = self.ep.av().insert(&[name], self.name.len()).ok()?[0];
        self.routes.insert(name.to_vec(), addr);
        Some(addr)
    }

    /// Turns a received request into replies (data, or one refusal); a
    /// request that fails authentication is dropped without a trace.
    fn on_request(&mut self, slot: usize, len: usize) {
        let len = len.min(self.requests[slot].len());
        let opened = match self.access.key() {
            Some(key) => wire::open(&self.requests[slot][..len], &key),
            None => None,
        };
        let Some(opened) = opened else {
            self.access
                .rejected_requests
                .fetch_add(1, Ordering::Relaxed);
            return;
        };
        if !self.seen.admit(&opened.reply_to, opened.id, wire::now_us()) {
            // A replay (or a reader's clock far behind ours at first contact).
            self.reject();
            return;
        }
        let Some(peer) = self.route(&opened.reply_to) else {
            self.reject();
            return;
        };
        let now = Instant::now();
        let nonce = opened.nonce;
        let bounds = Bounds {
            max_msg: self.max_msg,
            zero_copy_ranges: self.zero_copy_ranges,
        };
        let replies: Vec<Reply> = answer::answer(&self.shares, opened.body, bounds)
            .into_iter()
            .enumerate()
            .map(|(index, (status, body))| Reply {
                nonce,
                index: if status == 0 { index as u32 } else { 0 },
                status,
                body,
                queued: now,
            })
            .collect();
        if !self.admit_backlog(peer, replies.len()) {
            self.reject();
            return;
        }
        let entry = self.peers.entry(peer).or_insert_with(Peer::new);
        if entry.backlog.is_empty() {
            self.ready.push_back(peer);
        }
        self.queued_total += replies.len();
        entry.backlog.extend(replies);
    }

    fn reject(&self) {
        self.access
            .rejected_requests
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Whether `n` more replies may be queued for `peer`: within its
    /// backlog and the total and, for a stuck address, within
    /// [`STUCK_BACKLOG`] over all stuck ones; stuck addresses lose their
    /// queues, the one stuck longest first, to make room.
    fn admit_backlog(&mut self, peer: sys::fi_addr_t, n: usize) -> bool {
        let p = self.peers.entry(peer).or_insert_with(Peer::new);
        if p.backlog.len() + n > PEER_BACKLOG {
            return false;
        }
        let stuck = p.is_stuck();
        loop {
            let stuck_queued: usize = self
                .peers
                .values()
                .filter(|p| p.is_stuck())
                .map(|p| p.backlog.len())
                .sum();
            if self.queued_total + n <= TOTAL_BACKLOG
                && (!stuck || stuck_queued + n <= STUCK_BACKLOG)
            {
                return true;
            }
            let evicted = self.evict_stuck(peer, |p| !p.backlog.is_empty());
            if !evicted {
                return false;
            }
        }
    }

    /// Clears the queue of the address stuck longest (other than `peer`)
    /// among those `which` picks; whether there was one.
    fn evict_stuck(&mut self, peer: sys::fi_addr_t, which: impl Fn(&Peer) -> bool) -> bool {
        let oldest = self
            .peers
            .iter()
            .filter(|(a, p)| p.is_stuck() && **a != peer && which(p))
            .min_by_key(|(_, p)| p.since)
            .map(|(a, _)| *a);
        match oldest {
            Some(a) => {
                self.clear_backlog(a);
                true
            }
            None => false,
        }
    }

    /// Drops every reply queued for `peer` (their memory freed).
    fn clear_backlog(&mut self, peer: sys::fi_addr_t) {
        let Some(p) = self.peers.get_mut(&peer) else {
            return;
        };
        let dropped: Vec<Reply> = p.backlog.drain(..).collect();
        self.queued_total -= dropped.len();
        for r in dropped {
            self.discard(peer, r);
        }
    }

    /// Frees a reply that will not be sent.
    fn discard(&mut self, peer: sys::fi_addr_t, reply: Reply) {
        let held = reply.held();
        if let Body::Packed(buf) = reply.body {
            self.release(peer, held);
            self.recycle(buf);
        }
    }

    /// Counts `bytes` of packed reply held for `peer`.
    fn hold(&mut self, peer: sys::fi_addr_t, bytes: usize) {
        self.packed_held += bytes;
        if let Some(p) = self.peers.get_mut(&peer) {
            p.packed += bytes;
        }
    }

    /// Counts `bytes` of packed reply for `peer` freed.
    fn release(&mut self, peer: sys::fi_addr_t, bytes: usize) {
        debug_assert!(bytes <= self.packed_held, "released more than held");
        self.packed_held = self.packed_held.saturating_sub(bytes);
        self.freed_since_trim += bytes;
        if let Some(p) = self.peers.get_mut(&peer) {
            p.packed = p.packed.saturating_sub(bytes);
        }
    }

    /// Whether `bytes` more of packed reply may be held for `peer` now:
    /// within [`PACKED_IN_FLIGHT`] and [`PEER_PACKED`] (at least one reply
    /// always may) and, for a stuck address, within [`STUCK_PACKED`] over
    /// all stuck ones, the one stuck longest losing its queue to make room.
    fn make_room(&mut self, peer: sys::fi_addr_t, bytes: usize) -> bool {
        let (mine, stuck) = self
            .peers
            .get(&peer)
            .map_or((0, false), |p| (p.packed, p.is_stuck()));
        if !(self.packed_held == 0 || self.packed_held + bytes <= PACKED_IN_FLIGHT)
            || !(mine == 0 || mine + bytes <= PEER_PACKED)
        {
            return false;
        }
        if !stuck {
            return true;
        }
        loop {
            if self.stuck_packed() + bytes <= STUCK_PACKED {
                return true;
            }
            // Only queued packed replies can be taken back (not those in flight).
            if !self.evict_stuck(peer, |p| p.backlog.iter().any(|r| r.held() > 0)) {
                return false;
            }
        }
    }

    /// Bytes of packed replies held for stuck addresses.
    fn stuck_packed(&self) -> usize {
        self.peers
            .values()
            .filter(|p| p.is_stuck())
            .map(|p| p.packed)
            .sum()
    }

    /// Gives freed reply memory back to the system once little is held
    /// (the allocator keeps large freed blocks otherwise), at most once a
    /// second.
    fn trim(&mut self) {
        if self.packed_held <= TRIM_AFTER
            && self.freed_since_trim > TRIM_AFTER
            && self.last_trim.elapsed() >= Duration::from_secs(1)
        {
            self.spare.clear();
            ddstore_core::spill::share::release_free_heap();
            self.freed_since_trim = 0;
            self.last_trim = Instant::now();
        }
    }

    /// Packs `head` and `ranges` of `share` into one buffer (fallible:
    /// `None` when there is no memory for it now).
    fn pack(&mut self, head: &[u8], share: &dyn Memory, ranges: &[(u64, u64)]) -> Option<Vec<u8>> {
        let mut packed = self.packing_buffer(head, ranges)?;
        share.read_ranges(ranges, &mut packed[head.len()..]).ok()?;
        Some(packed)
    }

    /// A buffer (reused when one is spare) of `head` followed by room for
    /// `ranges` (fallible).
    fn packing_buffer(&mut self, head: &[u8], ranges: &[(u64, u64)]) -> Option<Vec<u8>> {
        let total = head.len() + ranges.iter().map(|r| r.1 as usize).sum::<usize>();
        let mut packed = self.spare.pop().unwrap_or_default();
        packed.clear();
        packed.try_reserve(total).ok()?;
        packed.extend_from_slice(head);
        packed.resize(total, 0);
        Some(packed)
    }

    /// Posts queued replies while send slots are free, one reader at a
    /// time in turn, each within its own bounds. A reply the provider does
    /// not take now (its reader still connecting, or gone) waits at the
    /// front of its reader's queue; other readers go on.
    fn flush(&mut self) {
        self.post_spilled();
        let now = Instant::now();
        let mut turns = self.ready.len();
        while turns > 0 && !self.free_sends.is_empty() {
            turns -= 1;
            let Some(peer) = self.ready.pop_front() else {
                return;
            };
            let keep = self.flush_peer(peer, now);
            if keep {
                self.ready.push_back(peer);
            }
        }
    }

    /// Posts what `peer` may have in flight now; whether it still has replies queued.
    fn flush_peer(&mut self, peer: sys::fi_addr_t, now: Instant) -> bool {
        loop {
            let Some(p) = self.peers.get_mut(&peer) else {
                return false;
            };
            if p.backlog.is_empty() {
                return false;
            }
            if p.in_flight >= PEER_SENDS || !p.ready(now) {
                return true;
            }
            let Some(&slot) = self.free_sends.last() else {
                return true;
            };
            let reply = p.backlog.pop_front().expect("not empty");
            self.queued_total -= 1;
            if reply.queued.elapsed() >= self.expiry {
                self.discard(peer, reply); // its reader has given up on it
                continue;
            }
            if let Flushed::Later = self.send_reply(peer, slot, reply) {
                return true;
            }
        }
    }

    /// Sends `reply` to `peer` from send slot `slot`: straight from the
    /// share when its ranges fit one send, else packed first (within
    /// [`PACKED_IN_FLIGHT`]; a refusal when there is no memory for it).
    fn send_reply(&mut self, peer: sys::fi_addr_t, slot: usize, reply: Reply) -> Flushed {
        // Build what the send reads: the share's ranges or a buffer.
        let mut packed = None;
        let mut ranges_iov: Vec<(*const u8, usize)> = Vec::new();
        match &reply.body {
            Body::Empty | Body::Packed(_) => {}
            // A spilled share's rows past its memory are not addressable: packed.
            Body::Ranges {
                head,
                share,
                ranges,
            } if ranges.len() + usize::from(!head.is_empty()) <= self.zero_copy_ranges
                && ranges
                    .iter()
                    .all(|&(o, l)| o + l <= share.mapped_len() as u64) =>
            {
                // The head's heap block stays put when the reply moves.
                if !head.is_empty() {
                    ranges_iov.push((head.as_ptr(), head.len()));
                }
                let base = share.as_ptr();
                // In bounds: check_request saw every range inside the share.
                ranges_iov.extend(
                    ranges
                        .iter()
                        .map(|&(off, len)| (base.wrapping_add(off as usize), len as usize)),
                );
            }
            Body::Ranges {
                head,
                share,
                ranges,
            } => {
                let total = head.len() + ranges.iter().map(|r| r.1 as usize).sum::<usize>();
                if !self.make_room(peer, total) {
                    // Wait for packed replies held to complete.
                    self.requeue(peer, reply);
                    return Flushed::Later;
                }
                let share = share.clone();
                let ranges = ranges.clone();
                let head = head.clone();
                if ranges
                    .iter()
                    .any(|&(o, l)| o + l > share.mapped_len() as u64)
                {
                    return self.read_spilled(peer, slot, reply, share, (head, ranges), total);
                }
                match self.pack(&head, share.as_ref(), &ranges) {
                    Some(buf) => {
                        self.hold(peer, buf.len());
                        packed = Some(buf);
                    }
                    // No memory now: refuse rather than abort.
                    None => return self.refuse_over_limit(peer, reply),
                }
            }
        }
        self.post_reply(peer, slot, reply, packed, &ranges_iov)
    }

    /// Hands `reply` (`ranges` of `share`, `total` bytes, some in its spill
    /// file) to the spill-read threads, with send slot `slot` and a packing
    /// buffer (fallible: a refusal when there is no memory for it); it is
    /// sent once packed ([`Server::post_spilled`]).
    fn read_spilled(
        &mut self,
        peer: sys::fi_addr_t,
        slot: usize,
        reply: Reply,
        share: Arc<dyn Memory>,
        (head, ranges): (Vec<u8>, Vec<(u64, u64)>),
        total: usize,
    ) -> Flushed {
        if self.spill_packing > 0 && self.spill_packing + total > SPILL_PACKING {
            // Wait for the spill reads under way to finish.
            self.requeue(peer, reply);
            return Flushed::Later;
        }
        let Some(buf) = self.packing_buffer(&head, &ranges) else {
            return self.refuse_over_limit(peer, reply);
        };
        let taken = self.free_sends.pop();
        debug_assert_eq!(taken, Some(slot));
        self.hold(peer, total);
        self.spill_packing += total;
        self.peers.get_mut(&peer).expect("present").in_flight += 1;
        self.spill_reads.submit(Job {
            tag: (peer, slot, reply),
            share,
            ranges,
            skip: head.len(),
            buf,
        });
        Flushed::Next
    }

    /// Sends the spilled replies packed since the last turn (a failed read
    /// is refused; a reply whose reader was dropped, or that waited past
    /// the readers' timeout, is dropped).
    fn post_spilled(&mut self) {
        for Done { tag, buf, ok } in self.spill_reads.take_done() {
            let (peer, slot, reply) = tag;
            self.free_sends.push(slot);
            self.spill_packing -= buf.len();
            let live = self.peers.get_mut(&peer).map(|p| {
                p.in_flight = p.in_flight.saturating_sub(1);
            });
            if live.is_none() || !ok || reply.queued.elapsed() >= self.expiry {
                self.release(peer, buf.len());
                self.recycle(buf);
                if live.is_some() && !ok {
                    let refusal = Reply {
                        status: Refusal::OverLimit as u64,
                        body: Body::Empty,
                        ..reply
                    };
                    self.post_reply(peer, slot, refusal, None, &[]);
                }
                continue;
            }
            // post_reply takes the last free slot: this one.
            if let Flushed::Later = self.post_reply(peer, slot, reply, Some(buf), &[]) {
                // Requeued (to be read again): make sure its reader is in turn.
                if !self.ready.contains(&peer) {
                    self.ready.push_back(peer);
                }
            }
        }
    }

    /// Queues a refusal in place of `reply`, for which there is no memory
    /// now (refused rather than aborting); tagged as its message, whose
    /// receive ignores status bits.
    fn refuse_over_limit(&mut self, peer: sys::fi_addr_t, reply: Reply) -> Flushed {
        let refusal = Reply {
            status: Refusal::OverLimit as u64,
            body: Body::Empty,
            ..reply
        };
        self.requeue(peer, refusal);
        Flushed::Next
    }

    /// Puts `reply` back at the front of `peer`'s queue.
    fn requeue(&mut self, peer: sys::fi_addr_t, reply: Reply) {
        let p = self.peers.get_mut(&peer).expect("present");
        p.backlog.push_front(reply);
        self.queued_total += 1;
    }

    /// Posts the send of `reply` (`packed` or its packed body, or
    /// `ranges_iov` of its share; its nonce as CQ data) from send slot `slot`.
    fn post_reply(
        &mut self,
        peer: sys::fi_addr_t,
        slot: usize,
        reply: Reply,
        packed: Option<Vec<u8>>,
        ranges_iov: &[(*const u8, usize)],
    ) -> Flushed {
        self.free_sends.pop();
        let tag = wire::reply_tag(&reply.nonce, reply.index, reply.status);
        let data = reply.nonce.reply_data();
        let sending = self.sending[slot].insert(Sending {
            peer,
            reply,
            packed,
            iov: Vec::new(),
            posted: Instant::now(),
            abandoned: false,
        });
        // The iov points into the Sending, whose slot does not move until it completes.
        match (&sending.packed, &sending.reply.body) {
            (Some(buf), _) | (None, Body::Packed(buf)) => sending.iov.push(sys::iovec {
                iov_base: buf.as_ptr() as *mut _,
                iov_len: buf.len(),
            }),
            _ => {}
        }
        for &(ptr, len) in ranges_iov {
            sending.iov.push(sys::iovec {
                iov_base: ptr as *mut _,
                iov_len: len,
            });
        }
        if sending.iov.is_empty() {
            // A refusal or an empty ragged message: no bytes, one entry.
            sending.iov.push(sys::iovec {
                iov_base: &NO_BYTES as *const u8 as *mut _,
                iov_len: 0,
            });
        }
        // SAFETY: the iov points into this Sending (packed buffer: heap
        // blocks that stay put) or into the reply's share, kept alive by its
        // Arc (an empty entry reads nothing); all stay until the send
        // completes or shutdown abandons them. The context slot is free.
        let rc = unsafe {
            self.ep.post_tsendv_data(
                &sending.iov,
                peer,
                data,
                tag,
                self.contexts.ptr(REQUEST_SLOTS + slot),
            )
        };
        if matches!(rc, Ok(Ok(()))) {
            let p = self.peers.get_mut(&peer).expect("present");
            p.in_flight += 1;
            p.refused = 0;
            return Flushed::Next;
        }
        let back = self.sending[slot].take().expect("just placed");
        self.free_sends.push(slot);
        let mut reply = back.reply;
        match rc {
            // Not taken now: it waits at the front of its reader's queue,
            // tried again after a while or at the next completion.
            Ok(Err(_again)) => {
                let p = self.peers.get_mut(&peer).expect("present");
                if !p.stuck {
                    p.stuck = true;
                    p.since = Instant::now();
                }
                let p_stuck = p.is_stuck();
                let wait = if p.in_flight > 0 {
                    RETRY_MS as u64
                } else {
                    (RETRY_MS as u64) << p.refused.min(5)
                };
                p.refused += 1;
                p.retry_at = Some(Instant::now() + Duration::from_millis(wait.min(MAX_RETRY_MS)));
                if let Some(buf) = back.packed {
                    if !p_stuck || self.stuck_packed() <= STUCK_PACKED {
                        // Packed once: it keeps its buffer (still held) until it goes.
                        reply.body = Body::Packed(buf);
                    } else {
                        self.release(peer, buf.len());
                        self.recycle(buf);
                    }
                }
                self.requeue(peer, reply);
                Flushed::Later
            }
            // The reader is gone (or unreachable): drop its reply.
            _ => {
                if let Some(buf) = back.packed {
                    self.release(peer, buf.len());
                    self.recycle(buf);
                }
                self.discard(peer, reply);
                Flushed::Next
            }
        }
    }

    fn recycle(&mut self, buffer: Vec<u8>) {
        // Only message-sized buffers: a large ragged stream's is freed.
        if self.spare.len() < SPARE_PACKING_BUFFERS && buffer.capacity() <= wire::MAX_PACKED_BYTES {
            self.spare.push(buffer);
        }
    }

    /// Drops readers whose oldest reply in flight is older than the
    /// readers' timeout: their queue is cleared and their address removed
    /// (the provider closes the connection, failing what is in flight).
    fn drop_stalled_readers(&mut self) {
        let stalled: Vec<sys::fi_addr_t> = self
            .sending
            .iter()
            .flatten()
            .filter(|s| !s.abandoned && s.posted.elapsed() > self.expiry)
            .map(|s| s.peer)
            .collect();
        for peer in stalled {
            if !self.peers.contains_key(&peer) {
                continue;
            }
            self.clear_backlog(peer);
            self.routes.retain(|_, a| *a != peer);
            let _ = self.ep.av().remove(peer);
            // Its sends in flight keep their slots until the provider fails them.
            for (slot, s) in self.sending.iter_mut().enumerate() {
                if let Some(s) = s.as_mut().filter(|s| s.peer == peer && !s.abandoned) {
                    s.abandoned = true;
                    // SAFETY: the slot holds a send posted on this endpoint.
                    unsafe { self.ep.cancel(self.contexts.ptr(REQUEST_SLOTS + slot)) };
                }
            }
            // Its abandoned sends no longer count against a reader at this address.
            self.peers.remove(&peer);
        }
    }

    fn completed(&mut self, ctx: *mut std::os::raw::c_void, len: usize, ok: bool) {
        let Some(slot) = self.contexts.slot_of(ctx) else {
            return;
        };
        if slot < REQUEST_SLOTS {
            self.posted[slot] = false;
            if ok {
                self.on_request(slot, len);
            } else {
                // Longer than any request (truncated), or cancelled.
                self.access
                    .rejected_requests
                    .fetch_add(1, Ordering::Relaxed);
            }
            self.post_request_slot(slot);
        } else {
            let s = slot - REQUEST_SLOTS;
            if let Some(done) = self.sending[s].take() {
                self.free_sends.push(s);
                if let Some(p) = self.peers.get_mut(&done.peer).filter(|_| !done.abandoned) {
                    p.in_flight = p.in_flight.saturating_sub(1);
                    if ok {
                        // A reply reached it: a reader being served.
                        p.stuck = false;
                        p.refused = 0;
                    }
                }
                // An abandoned send's reader is gone: its bytes count only in the total.
                let peer = if done.abandoned {
                    sys::FI_ADDR_UNSPEC
                } else {
                    done.peer
                };
                if let Some(buf) = done.packed {
                    self.release(peer, buf.len());
                    self.recycle(buf);
                }
                self.discard(peer, done.reply);
            }
        }
    }

    /// Whether replies wait that a free slot could take now.
    fn can_send(&self) -> bool {
        let now = Instant::now();
        !self.free_sends.is_empty()
            && self.ready.iter().any(|a| {
                self.peers.get(a).is_some_and(|p| {
                    p.in_flight < PEER_SENDS && !p.backlog.is_empty() && p.ready(now)
                })
            })
    }

    /// Whether replies wait for a retry (their address refused a send).
    fn retrying(&self) -> bool {
        self.ready
            .iter()
            .any(|a| self.peers.get(a).is_some_and(|p| p.retry_at.is_some()))
    }

    /// One turn: wait (or poll) for completions, handle them, send replies.
    /// Returns whether anything happened.
    pub fn turn(&mut self, block: bool) -> bool {
        for slot in 0..REQUEST_SLOTS {
            self.post_request_slot(slot);
        }
        let cq = self.ep.cq().clone();
        let mut entries = [sys::fi_cq_tagged_entry::default(); 16];
        let polled = if block && !self.can_send() && cq.has_wait() {
            let wait = if self.retrying() { RETRY_MS } else { WAIT_MS };
            cq.wait_read(&mut entries, wait)
        } else {
            cq.poll(&mut entries)
        };
        let busy = match polled {
            Ok(Poll::Completed(n)) => {
                for e in &entries[..n] {
                    self.completed(e.op_context, e.len, true);
                }
                if n > 0 {
                    // The provider made progress: refused sends of addresses
                    // with sends in flight (connected) or just completed may
                    // go now; the others wait out their time.
                    for p in self.peers.values_mut() {
                        if !p.is_stuck() {
                            p.retry_at = None;
                        }
                    }
                }
                n > 0
            }
            Ok(Poll::Failed(err)) => {
                self.completed(err.context, 0, false);
                true
            }
            Err(_) => {
                std::thread::sleep(Duration::from_millis(1));
                false
            }
        };
        self.flush();
        self.drop_stalled_readers();
        self.trim();
        busy || self.can_send()
    }

    /// Cancels what is posted and waits for it to finish; what does not
    /// finish in time is abandoned (leaked), never freed under the provider.
    fn shutdown(mut self) {
        self.spill_reads.stop();
        for slot in 0..REQUEST_SLOTS + SEND_SLOTS {
            let live = if slot < REQUEST_SLOTS {
                self.posted[slot]
            } else {
                self.sending[slot - REQUEST_SLOTS].is_some()
            };
            if live {
                // SAFETY: the slot holds an operation posted on this endpoint.
                unsafe { self.ep.cancel(self.contexts.ptr(slot)) };
            }
        }
        self.peers.clear();
        let deadline = Instant::now() + SHUTDOWN_WAIT;
        let pending =
            |s: &Server| s.posted.iter().any(|p| *p) || s.sending.iter().any(|r| r.is_some());
        let cq = self.ep.cq().clone();
        let mut entries = [sys::fi_cq_tagged_entry::default(); 16];
        while pending(&self) && Instant::now() < deadline {
            match cq.poll(&mut entries) {
                Ok(Poll::Completed(n)) => {
                    for e in &entries[..n] {
                        self.forget_op(e.op_context);
                    }
                    if n == 0 {
                        std::thread::sleep(Duration::from_micros(50));
                    }
                }
                Ok(Poll::Failed(err)) => self.forget_op(err.context),
                Err(_) => break,
            }
        }
        if pending(&self) {
            // The provider may still write or read these: never free them.
            std::mem::forget(self);
        }
    }

    fn forget_op(&mut self, ctx: *mut std::os::raw::c_void) {
        match self.contexts.slot_of(ctx) {
            Some(s) if s < REQUEST_SLOTS => self.posted[s] = false,
            Some(s) => {
                self.sending[s - REQUEST_SLOTS] = None;
            }
            None => {}
        }
    }
}

/// The progress loop of an owner that serves the gather path (one-sided
/// reads of its shares progress through the same CQ polls). With a wait
/// object it sleeps in the provider's wait set (`fi_cq_sread`, on the
/// sockets' file descriptors) whenever it has nothing to send, so a request
/// wakes it at once, not at the next tick of a timer, and it never spins
/// beside a loaded node's other work (measured: a 50 µs polling window
/// after each request made no difference beyond this machine's noise).
/// Without a wait object it polls, backing off to 200 µs sleeps while idle.
pub fn run(mut server: Server, stop: &AtomicBool) {
    let blocking = server.ep.cq().has_wait();
    let mut sleep = Duration::from_micros(5);
    while !stop.load(Ordering::Acquire) {
        let busy = server.turn(blocking);
        if blocking {
            continue;
        }
        if busy {
            sleep = Duration::from_micros(5);
            std::thread::yield_now();
        } else {
            std::thread::sleep(sleep);
            sleep = (sleep * 2).min(Duration::from_micros(200));
        }
    }
    server.shutdown();
}
