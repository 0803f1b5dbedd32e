//! The owner's bounds on what it queues and holds: replies per reader and
//! in total, stuck addresses' share, packed bytes, and readers that stall.

use std::time::{Duration, Instant};

use libfabric_sys as sys;

use super::peer::{Peer, Reply};
use super::{
    Server, PACKED_IN_FLIGHT, PEER_BACKLOG, PEER_PACKED, REQUEST_SLOTS, SPARE_PACKING_BUFFERS,
    STUCK_BACKLOG, STUCK_PACKED, TOTAL_BACKLOG, TRIM_AFTER,
};
use crate::ofi::gather::answer::ReplyBody as Body;
use crate::ofi::gather::wire;

impl Server {
    /// Whether `n` more replies may be queued for `peer`: within its
    /// backlog and the total and, for a stuck address, within
    /// [`STUCK_BACKLOG`] over all stuck ones; stuck addresses lose their
    /// queues, the one stuck longest first, to make room.
    pub(super) fn admit_backlog(&mut self, peer: sys::fi_addr_t, n: usize) -> bool {
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
    pub(super) fn discard(&mut self, peer: sys::fi_addr_t, reply: Reply) {
        let held = reply.held();
        if let Body::Packed(buf) = reply.body {
            self.release(peer, held);
            self.recycle(buf);
        }
    }

    /// Counts `bytes` of packed reply held for `peer`.
    pub(super) fn hold(&mut self, peer: sys::fi_addr_t, bytes: usize) {
        self.packed_held += bytes;
        if let Some(p) = self.peers.get_mut(&peer) {
            p.packed += bytes;
        }
    }

    /// Counts `bytes` of packed reply for `peer` freed.
    pub(super) fn release(&mut self, peer: sys::fi_addr_t, bytes: usize) {
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
    pub(super) fn make_room(&mut self, peer: sys::fi_addr_t, bytes: usize) -> bool {
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
    pub(super) fn stuck_packed(&self) -> usize {
        self.peers
            .values()
            .filter(|p| p.is_stuck())
            .map(|p| p.packed)
            .sum()
    }

    /// Gives freed reply memory back to the system once little is held
    /// (the allocator keeps large freed blocks otherwise), at most once a
    /// second.
    pub(super) fn trim(&mut self) {
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

    pub(super) fn recycle(&mut self, buffer: Vec<u8>) {
        // Only message-sized buffers: a large ragged stream's is freed.
        if self.spare.len() < SPARE_PACKING_BUFFERS && buffer.capacity() <= wire::MAX_PACKED_BYTES {
            self.spare.push(buffer);
        }
    }

    /// Drops readers whose oldest reply in flight is older than the
    /// readers' timeout: their queue is cleared and their address removed
    /// (the provider closes the connection, failing what is in flight).
    pub(super) fn drop_stalled_readers(&mut self) {
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
            self.busy_routes.remove(&peer);
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
}
