//! What arrives at the owner: request slots posted to the provider, and
//! each authenticated request's answer queued for its reader (its replies,
//! or "busy"), or held until a route frees up.

use std::sync::atomic::Ordering;
use std::time::Instant;

use libfabric_sys as sys;

use super::peer::{Peer, Reply};
use super::routes::Route;
use super::{Server, PARKED_REQUESTS};
use crate::ofi::gather::answer::{self, Bounds, ReplyBody as Body};
use crate::ofi::gather::wire::{self, Refusal};

impl Server {
    /// Posts request slot `slot` unless it is posted, or requests wait for
    /// a route (the provider holds further requests until they are served).
    pub(super) fn post_request_slot(&mut self, slot: usize) {
        if self.posted[slot] || self.parked.len() >= PARKED_REQUESTS {
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

    /// Opens a received request (one failing authentication, or a replay,
    /// is dropped without a trace) and serves it.
    pub(super) fn on_request(&mut self, slot: usize, len: usize) {
        let len = len.min(self.requests[slot].len());
        let opened = match self.access.key() {
            Some(key) => wire::open(&self.requests[slot][..len], &key),
            None => None,
        };
        let Some(opened) = opened else {
            self.reject();
            return;
        };
        if !self.seen.admit(&opened.reply_to, opened.id, wire::now_us()) {
            // A replay (or a reader's clock far behind ours at first contact).
            self.reject();
            return;
        }
        self.serve(opened, Instant::now());
    }

    /// Answers an authenticated request that arrived at `arrived`: its
    /// replies (data, or one refusal), or "busy" when its reader is past
    /// the reader cap or its queue is full; a request with no route free
    /// even for that waits ([`Server::serve_parked`]), never unanswered.
    fn serve(&mut self, opened: wire::Opened, arrived: Instant) {
        let peer = match self.route(&opened.reply_to) {
            Route::Serve(peer) => peer,
            Route::Busy(peer) => return self.busy(peer, opened.nonce, arrived),
            Route::Unroutable => return self.reject(),
            Route::Full => return self.parked.push_back((opened, arrived)),
        };
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
                queued: arrived,
            })
            .collect();
        if !self.admit_backlog(peer, replies.len()) {
            return self.busy(peer, nonce, arrived);
        }
        self.enqueue(peer, replies);
    }

    /// Queues one "busy" reply to the request with `nonce` (its reader
    /// sends it again after a while): beyond the queue bounds, as it holds
    /// no payload and each request gets at most one.
    fn busy(&mut self, peer: sys::fi_addr_t, nonce: wire::Nonce, arrived: Instant) {
        self.access.busy_replies.fetch_add(1, Ordering::Relaxed);
        let busy = Reply {
            nonce,
            index: 0,
            status: Refusal::Busy as u64,
            body: Body::Empty,
            queued: arrived,
        };
        self.enqueue(peer, vec![busy]);
    }

    /// Appends `replies` to `peer`'s queue (putting it in turn).
    fn enqueue(&mut self, peer: sys::fi_addr_t, replies: Vec<Reply>) {
        let entry = self.peers.entry(peer).or_insert_with(Peer::new);
        if entry.backlog.is_empty() {
            self.ready.push_back(peer);
        }
        self.queued_total += replies.len();
        entry.backlog.extend(replies);
    }

    /// Serves the requests that waited for a route, in order, while routes
    /// free up (one that waited past the readers' timeout is dropped: its
    /// reader has given up).
    pub(super) fn serve_parked(&mut self) {
        while let Some((opened, arrived)) = self.parked.pop_front() {
            if arrived.elapsed() >= self.expiry {
                self.reject();
                continue;
            }
            let waiting = self.parked.len();
            self.serve(opened, arrived);
            if self.parked.len() > waiting {
                // Parked again, at the back: put it back in front and wait.
                let back = self.parked.pop_back().expect("just parked");
                self.parked.push_front(back);
                return;
            }
        }
    }

    fn reject(&self) {
        self.access
            .rejected_requests
            .fetch_add(1, Ordering::Relaxed);
    }
}
