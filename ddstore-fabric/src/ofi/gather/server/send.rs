//! How queued replies go out: one reader at a time in turn, straight from
//! the share or packed first (from memory, or off the progress thread from
//! a spill file), and what happens when the provider does not take a send.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ddstore_core::memory::Memory;
use libfabric_sys as sys;

use super::peer::{Flushed, Reply, Sending};
use super::{
    Server, MAX_RETRY_MS, NO_BYTES, PEER_SENDS, REQUEST_SLOTS, RETRY_MS, SPILL_PACKING,
    STUCK_PACKED,
};
use crate::ofi::gather::answer::ReplyBody as Body;
use crate::ofi::gather::spill_reads::{Done, Job};
use crate::ofi::gather::wire::{self, Refusal};

impl Server {
    /// Posts queued replies while send slots are free, one reader at a
    /// time in turn, each within its own bounds. A reply the provider does
    /// not take now (its reader still connecting, or gone) waits at the
    /// front of its reader's queue; other readers go on.
    pub(super) fn flush(&mut self) {
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

    /// Packs `head` and `ranges` of `share` into one buffer (fallible:
    /// `None` when there is no memory for it now).
    fn pack(&mut self, head: &[u8], share: &dyn Memory, ranges: &[(u64, u64)]) -> Option<Vec<u8>> {
        let mut packed = self.packing_buffer(head, ranges)?;
        share.read_ranges(ranges, &mut packed[head.len()..]).ok()?;
        Some(packed)
    }

    /// A buffer (reused when one is spare) of `head` followed by room for
    /// `ranges` (fallible). A spare buffer keeps its old bytes where the
    /// ranges go: only growth is zeroed (not the whole reply, every time),
    /// and a reply is sent only once its ranges were all read over them.
    fn packing_buffer(&mut self, head: &[u8], ranges: &[(u64, u64)]) -> Option<Vec<u8>> {
        let total = head.len() + ranges.iter().map(|r| r.1 as usize).sum::<usize>();
        let mut packed = self.spare.pop().unwrap_or_default();
        packed.truncate(total);
        packed.try_reserve(total - packed.len()).ok()?;
        packed.resize(total, 0);
        packed[..head.len()].copy_from_slice(head);
        Some(packed)
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
                self.refused.insert(peer);
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
}
