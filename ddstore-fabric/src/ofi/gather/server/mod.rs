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
//! served. Every authenticated request is answered: a reader past the
//! reader cap (`DDSTORE_GATHER_READERS` served at once), or whose queue is
//! full, gets a "busy" refusal ([`Refusal::Busy`](super::wire::Refusal::Busy))
//! and sends the request again after a while. A send the provider refuses is tried again after [`RETRY_MS`]
//! (longer, up to [`MAX_RETRY_MS`], while nothing of its address is in
//! flight) or at the next completion, never in a busy loop.
//!
//! Files: this one holds the loop (its state, one turn, shutdown);
//! [`peer`] one reply address's queue and the replies in it; [`requests`]
//! what arrives (request slots, admission, "busy"); [`routes`] the reader
//! index and its cap; [`budget`] the bounds on what is queued and held;
//! [`send`] how queued replies go out.

mod budget;
mod peer;
mod requests;
mod routes;
mod send;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use libfabric_sys as sys;

use self::peer::{Peer, Reply, Sending};
use super::answer::{Access, ServedShares};
use super::spill_reads::SpillReads;
use super::wire;
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
/// Routes kept only to answer "busy" to readers past the reader cap (each
/// an AV entry): beyond them a request waits in [`PARKED_REQUESTS`].
pub const BUSY_ROUTES: usize = 64;
/// Requests that found no route free, not even to answer "busy", held
/// until one frees; while this many wait no request slot is posted again.
pub const PARKED_REQUESTS: usize = REQUEST_SLOTS;
/// Packing buffers kept for reuse once their reply is sent: no allocation
/// (and no fresh zeroed pages) per packed reply on the serving hot path.
const SPARE_PACKING_BUFFERS: usize = 8;
/// How long shutdown waits for cancelled operations before abandoning buffers.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(2);
/// What an empty reply's one iov entry points at (it reads none of it).
static NO_BYTES: u8 = 0;

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
    /// Peers whose last send was refused (their `retry_at` set): what the
    /// next completion looks at, not every peer (4,096 at the reader cap).
    refused: HashSet<sys::fi_addr_t>,
    queued_total: usize,
    /// Bytes of packed replies held (built and queued, being read from a
    /// spill file, or in flight).
    packed_held: usize,
    /// Bytes of packed replies freed since the allocator was last trimmed.
    freed_since_trim: usize,
    last_trim: Instant,
    /// Readers' AV addresses by reply name (the reader index).
    routes: HashMap<Vec<u8>, sys::fi_addr_t>,
    /// Routes kept only to answer "busy" (past the reader cap).
    busy_routes: HashSet<sys::fi_addr_t>,
    /// Readers served at once (`DDSTORE_GATHER_READERS`).
    max_readers: usize,
    /// Authenticated requests waiting for a route, with when they arrived.
    parked: VecDeque<(wire::Opened, Instant)>,
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
    /// `DDSTORE_TIMEOUT_S`); `access`: the job's request key; `max_readers`:
    /// readers served at once (`DDSTORE_GATHER_READERS`).
    pub fn new(
        ep: Arc<Endpoint>,
        shares: Arc<ServedShares>,
        access: Arc<Access>,
        expiry: Duration,
        max_readers: usize,
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
            refused: HashSet::new(),
            queued_total: 0,
            packed_held: 0,
            freed_since_trim: 0,
            last_trim: Instant::now(),
            routes: HashMap::new(),
            busy_routes: HashSet::new(),
            max_readers: max_readers.max(1),
            parked: VecDeque::new(),
            seen: wire::SeenRequests::new(expiry.max(MIN_REPLAY_WINDOW), SEEN_ADDRESSES),
            expiry,
            spare: Vec::new(),
            spill_reads,
            spill_packing: 0,
        })
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
        self.serve_parked();
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
                    let peers = &mut self.peers;
                    self.refused.retain(|a| match peers.get_mut(a) {
                        Some(p) if !p.is_stuck() => {
                            p.retry_at = None;
                            false
                        }
                        Some(_) => true,
                        None => false,
                    });
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
