//! What arrives at the owner: request slots posted to the provider, the
//! reader routes (AV addresses of authenticated reply names) and the
//! admission of a request's replies to its reader's queue.

use std::sync::atomic::Ordering;
use std::time::Instant;

use libfabric_sys as sys;

use super::peer::{Peer, Reply};
use super::{Server, MAX_ROUTES};
use crate::ofi::gather::answer::{self, Bounds};
use crate::ofi::gather::wire;

impl Server {
    pub(super) fn post_request_slot(&mut self, slot: usize) {
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
    pub(super) fn on_request(&mut self, slot: usize, len: usize) {
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
}
