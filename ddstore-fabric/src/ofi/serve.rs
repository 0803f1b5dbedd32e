//! The owner's side of the gather path: the shares this process serves (by
//! memory key) and the progress-thread loop that answers requests with
//! tagged messages. See `gather.rs` for the wire format.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ddstore_core::region::Memory;
use libfabric_sys as sys;

use super::context::Contexts;
use super::cq::Poll;
use super::endpoint::Endpoint;
use super::gather::{self, Refusal};

/// Shares readers may gather from, by the memory key their records publish:
/// a request naming any other key (a freed variable, a key this owner never
/// issued) is refused, never served.
#[derive(Default)]
pub struct ServedShares {
    map: Mutex<HashMap<u64, Arc<dyn Memory>>>,
}

impl ServedShares {
    pub fn add(&self, key: u64, share: Arc<dyn Memory>) {
        self.lock().insert(key, share);
    }
    pub fn remove(&self, key: u64) {
        self.lock().remove(&key);
    }
    fn get(&self, key: u64) -> Option<Arc<dyn Memory>> {
        self.lock().get(&key).cloned()
    }
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<dyn Memory>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Requests received at once (each slot holds one request of up to 16 KiB);
/// more wait in the provider until a slot is posted again.
const REQUEST_SLOTS: usize = 32;
/// Replies in flight at once; more wait in a backlog.
const SEND_SLOTS: usize = 256;
/// CQ entries the serving endpoint needs (every posted operation completes there).
pub const CQ_SIZE: usize = 2 * (REQUEST_SLOTS + SEND_SLOTS);
/// Longest block in `fi_cq_sread` before the stop flag is checked again.
const WAIT_MS: i32 = 100;
/// How long the loop keeps polling without blocking after it did work (so
/// replies just posted progress without a wakeup). Measured 0, 50 and 500 µs
/// with `python -m pyddstore.bench` (128 x 3 KB, 1-4 threads): no difference
/// beyond the noise of this shared machine, so short, to leave the CPU to training.
const HOT: Duration = Duration::from_micros(100);
/// Reader names remembered (each an AV entry); beyond that the cache restarts.
const MAX_ROUTES: usize = 4096;
/// Packing buffers kept for reuse once their reply is sent: no allocation
/// (and no fresh zeroed pages) per packed reply on the serving hot path.
const SPARE_PACKING_BUFFERS: usize = 8;
/// How long shutdown waits for cancelled operations before abandoning buffers.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(2);

enum Body {
    /// A refusal: no payload, the status is in the tag.
    Empty,
    /// Ranges sent straight from the share (kept alive until the send completes).
    Region {
        _share: Arc<dyn Memory>,
        iov: Vec<sys::iovec>,
    },
    /// Ranges packed into one buffer (more ranges than the provider's iov limit).
    Packed(Vec<u8>),
}

struct Reply {
    peer: sys::fi_addr_t,
    tag: u64,
    body: Body,
    /// When the request arrived: a reply not taken by the provider within
    /// the readers' timeout is dropped (its reader has given up).
    queued: Instant,
}

// SAFETY: the iovecs point into a share kept alive by the same Reply (an
// Arc<dyn Memory>, which is Send + Sync); nothing else is shared.
unsafe impl Send for Reply {}

/// State of the serving loop, owned by the progress thread.
pub struct Server {
    ep: Arc<Endpoint>,
    shares: Arc<ServedShares>,
    max_msg: usize,
    iov_limit: usize,
    name_len: usize,
    requests: Vec<Box<[u8]>>,
    posted: Vec<bool>,
    /// Slots 0..REQUEST_SLOTS: receives; then SEND_SLOTS sends.
    contexts: Contexts,
    sending: Vec<Option<Reply>>,
    free_sends: Vec<usize>,
    backlog: VecDeque<Reply>,
    routes: HashMap<Vec<u8>, sys::fi_addr_t>,
    expiry: Duration,
    /// Packing buffers of sent replies, reused by the next packed replies.
    spare: Vec<Vec<u8>>,
}

impl Server {
    /// `expiry`: how long a reply may wait for the provider (the readers' `DDSTORE_TIMEOUT_S`).
    pub fn new(
        ep: Arc<Endpoint>,
        shares: Arc<ServedShares>,
        expiry: Duration,
    ) -> crate::error::FabricResult<Server> {
        let info = ep.domain().info();
        let max_msg = info.max_msg_size().max(1);
        let iov_limit = info.tx_iov_limit().min(16);
        let name_len = ep.name()?.len();
        Ok(Server {
            ep,
            shares,
            max_msg,
            iov_limit,
            name_len,
            requests: (0..REQUEST_SLOTS)
                .map(|_| vec![0u8; gather::MAX_REQUEST_BYTES].into_boxed_slice())
                .collect(),
            posted: vec![false; REQUEST_SLOTS],
            contexts: Contexts::new(REQUEST_SLOTS + SEND_SLOTS),
            sending: (0..SEND_SLOTS).map(|_| None).collect(),
            free_sends: (0..SEND_SLOTS).rev().collect(),
            backlog: VecDeque::new(),
            routes: HashMap::new(),
            expiry,
            spare: Vec::new(),
        })
    }

    fn post_request_slot(&mut self, slot: usize) {
        if self.posted[slot] {
            return;
        }
        let buf = &mut self.requests[slot];
        // SAFETY: the boxed buffer and the context slot live in this Server,
        // which cancels or abandons every posted receive before it drops.
        let rc = unsafe {
            self.ep.post_trecv(
                buf.as_mut_ptr(),
                buf.len(),
                gather::REQUEST_TAG,
                0,
                self.contexts.ptr(slot),
            )
        };
        // FI_EAGAIN or an error: try again on the next turn of the loop.
        self.posted[slot] = matches!(rc, Ok(Ok(())));
    }

    fn route(&mut self, name: &[u8]) -> Option<sys::fi_addr_t> {
        if let Some(a) = self.routes.get(name) {
            return Some(*a);
        }
        if self.routes.len() >= MAX_ROUTES {
            self.routes.clear();
        }
        let addr = self.ep.av().insert(&[name], self.name_len).ok()?[0];
        self.routes.insert(name.to_vec(), addr);
        Some(addr)
    }

    /// Turns a received request into replies (data, or one refusal).
    fn on_request(&mut self, slot: usize, len: usize) {
        let len = len.min(self.requests[slot].len());
        if gather::is_ragged(&self.requests[slot][..len]) {
            return self.on_ragged_request(slot, len);
        }
        // A request we cannot parse carries no usable reply address: dropped
        // (its reader times out naming this rank).
        let Ok(req) = gather::decode(&self.requests[slot][..len]) else {
            return;
        };
        let Some(peer) = self.route(&req.reply_to) else {
            return;
        };
        let now = Instant::now();
        let refuse = |r: Refusal| Reply {
            peer,
            tag: gather::reply_tag(req.seq, 0, r as u64),
            body: Body::Empty,
            queued: now,
        };
        let Some(share) = self.shares.get(req.key) else {
            self.backlog.push_back(refuse(Refusal::UnknownKey));
            return;
        };
        if let Err(r) = gather::check_request(&req, share.len() as u64, self.max_msg) {
            self.backlog.push_back(refuse(r));
            return;
        }
        let base = share.as_ptr();
        let mut next = 0usize;
        for (index, &n) in req.msg_ranges.iter().enumerate() {
            let ranges = &req.ranges[next..next + n as usize];
            next += n as usize;
            let body = if ranges.len() <= self.iov_limit {
                Body::Region {
                    _share: share.clone(),
                    iov: ranges
                        .iter()
                        .map(|&(off, len)| sys::iovec {
                            // In bounds: check_request saw every range inside the share.
                            iov_base: base.wrapping_add(off as usize) as *mut _,
                            iov_len: len as usize,
                        })
                        .collect(),
                }
            } else {
                let total: u64 = ranges.iter().map(|r| r.1).sum();
                let mut packed = self.spare.pop().unwrap_or_default();
                packed.clear();
                packed.resize(total as usize, 0);
                let mut at = 0usize;
                let mut failed = false;
                for &(off, len) in ranges {
                    let len = len as usize;
                    failed |= share
                        .read_at(off as usize, &mut packed[at..at + len])
                        .is_err();
                    at += len;
                }
                if failed {
                    self.backlog.push_back(refuse(Refusal::OutOfRange));
                    return;
                }
                Body::Packed(packed)
            };
            self.backlog.push_back(Reply {
                peer,
                tag: gather::reply_tag(req.seq, index as u32, 0),
                body,
                queued: now,
            });
        }
    }

    /// Answers a ragged request: its rows' lengths, then their values, cut
    /// into the messages the reader posted (or one refusal).
    fn on_ragged_request(&mut self, slot: usize, len: usize) {
        let Ok(req) = gather::decode_ragged(&self.requests[slot][..len]) else {
            return;
        };
        let Some(peer) = self.route(&req.reply_to) else {
            return;
        };
        let now = Instant::now();
        let shares = self
            .shares
            .get(req.key)
            .zip(self.shares.get(req.part.ends_key));
        let answer = match shares {
            None => Err(Refusal::UnknownKey),
            Some((values, ends)) => {
                // A packing buffer of an earlier reply: no fresh pages per reply.
                let stream = self.spare.pop().unwrap_or_default();
                gather::answer_ragged(&req, ends.as_ref(), values.as_ref(), self.max_msg, stream)
            }
        };
        match answer {
            Ok(msgs) => {
                for (index, body) in msgs.into_iter().enumerate() {
                    self.backlog.push_back(Reply {
                        peer,
                        tag: gather::reply_tag(req.seq, index as u32, 0),
                        body: if body.is_empty() {
                            Body::Empty
                        } else {
                            Body::Packed(body)
                        },
                        queued: now,
                    });
                }
            }
            Err(r) => self.backlog.push_back(Reply {
                peer,
                tag: gather::reply_tag(req.seq, 0, r as u64),
                body: Body::Empty,
                queued: now,
            }),
        }
    }

    /// Posts backlogged replies while send slots are free. A reply the
    /// provider does not take now (its reader still connecting, or gone)
    /// goes to the back, so it never holds up other readers' replies.
    fn flush(&mut self) {
        let mut tries = self.backlog.len();
        while let Some(slot) = self.free_sends.last().copied() {
            if tries == 0 {
                return;
            }
            tries -= 1;
            let Some(reply) = self.backlog.pop_front() else {
                return;
            };
            static EMPTY: u8 = 0;
            let one;
            let iov: &[sys::iovec] = match &reply.body {
                Body::Empty => {
                    one = [sys::iovec {
                        iov_base: &EMPTY as *const u8 as *mut _,
                        iov_len: 0,
                    }];
                    &one
                }
                Body::Region { iov, .. } => iov,
                Body::Packed(v) => {
                    one = [sys::iovec {
                        iov_base: v.as_ptr() as *mut _,
                        iov_len: v.len(),
                    }];
                    &one
                }
            };
            // SAFETY: the iov points into the reply's share (kept alive by its
            // Arc) or its packed buffer (a Vec whose heap block does not move
            // when the Reply moves into `sending`); both stay until the send
            // completes or shutdown abandons them. The context slot is free.
            let rc = unsafe {
                self.ep.post_tsendv(
                    iov,
                    reply.peer,
                    reply.tag,
                    self.contexts.ptr(REQUEST_SLOTS + slot),
                )
            };
            match rc {
                Ok(Ok(())) => {
                    self.free_sends.pop();
                    self.sending[slot] = Some(reply);
                }
                Ok(Err(_again)) if reply.queued.elapsed() < self.expiry => {
                    self.backlog.push_back(reply)
                }
                Ok(Err(_again)) => {}
                // The reader is gone (or unreachable): drop its reply.
                Err(_) => {}
            }
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
            }
            self.post_request_slot(slot);
        } else {
            let s = slot - REQUEST_SLOTS;
            if let Some(reply) = self.sending[s].take() {
                if let Body::Packed(buffer) = reply.body {
                    if self.spare.len() < SPARE_PACKING_BUFFERS {
                        self.spare.push(buffer);
                    }
                }
                self.free_sends.push(s);
            }
        }
    }

    /// One turn: wait (or poll) for completions, handle them, send replies.
    /// Returns whether anything happened.
    pub fn turn(&mut self, block: bool) -> bool {
        for slot in 0..REQUEST_SLOTS {
            self.post_request_slot(slot);
        }
        let cq = self.ep.cq().clone();
        let mut entries = [sys::fi_cq_tagged_entry::default(); 16];
        let polled = if block && self.backlog.is_empty() && cq.has_wait() {
            cq.wait_read(&mut entries, WAIT_MS)
        } else {
            cq.poll(&mut entries)
        };
        let busy = match polled {
            Ok(Poll::Completed(n)) => {
                for e in &entries[..n] {
                    self.completed(e.op_context, e.len, true);
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
        let queued = !self.backlog.is_empty();
        self.flush();
        busy || queued
    }

    /// Cancels what is posted and waits for it to finish; what does not
    /// finish in time is abandoned (leaked), never freed under the provider.
    fn shutdown(mut self) {
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
        self.backlog.clear();
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
/// reads of its shares progress through the same CQ polls).
pub fn run(mut server: Server, stop: &AtomicBool) {
    let blocking = server.ep.cq().has_wait();
    let mut sleep = Duration::from_micros(5);
    let mut hot_until = Instant::now();
    while !stop.load(Ordering::Acquire) {
        // Keep polling for a while after a request: replies just posted
        // (and the next request of a busy reader) progress without a wakeup.
        let hot = Instant::now() < hot_until;
        let busy = server.turn(blocking && !hot);
        if busy {
            hot_until = Instant::now() + HOT;
        }
        if blocking {
            if hot && !busy {
                std::thread::yield_now();
            }
            continue;
        }
        if busy || hot {
            sleep = Duration::from_micros(5);
            std::thread::yield_now();
        } else {
            std::thread::sleep(sleep);
            sleep = (sleep * 2).min(Duration::from_micros(200));
        }
    }
    server.shutdown();
}
