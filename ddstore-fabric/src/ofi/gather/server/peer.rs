//! One reply address's state at the owner, and the replies queued or in
//! flight to it.

use std::collections::VecDeque;
use std::time::Instant;

use libfabric_sys as sys;

use crate::ofi::gather::answer::ReplyBody as Body;
use crate::ofi::gather::wire::Nonce;

/// One reply message of a request, queued for (or sent to) its reader.
pub(super) struct Reply {
    pub(super) nonce: Nonce,
    pub(super) index: u32,
    /// 0: data, else a [`Refusal`](crate::ofi::gather::wire::Refusal).
    pub(super) status: u64,
    pub(super) body: Body,
    /// When the request arrived: a reply not taken by the provider within
    /// the readers' timeout is dropped (its reader has given up).
    pub(super) queued: Instant,
}

impl Reply {
    /// Bytes of packed reply it holds.
    pub(super) fn held(&self) -> usize {
        match &self.body {
            Body::Packed(b) => b.len(),
            _ => 0,
        }
    }
}

/// A reply posted to the provider: its memory stays here until it completes.
pub(super) struct Sending {
    pub(super) peer: sys::fi_addr_t,
    pub(super) reply: Reply,
    /// A buffer packed for it (counted in `packed_held`).
    pub(super) packed: Option<Vec<u8>>,
    pub(super) iov: Vec<sys::iovec>,
    pub(super) posted: Instant,
    /// Its reader was dropped for stalling: it only waits for the provider now.
    pub(super) abandoned: bool,
}

// SAFETY: the iovecs point into the reply's buffers (owned here)
// or a share kept alive by an Arc<dyn Memory> (Send + Sync); nothing else.
unsafe impl Send for Sending {}

/// One reply address's state at this owner.
pub(super) struct Peer {
    pub(super) backlog: VecDeque<Reply>,
    pub(super) in_flight: usize,
    /// Bytes of packed replies held for it (queued or in flight).
    pub(super) packed: usize,
    /// The provider refused a send to it and none has completed since
    /// (see [`Peer::is_stuck`]).
    pub(super) stuck: bool,
    /// When it last got stuck (the one stuck longest loses its queue first).
    pub(super) since: Instant,
    /// The provider refused its last send: not tried again before this.
    pub(super) retry_at: Option<Instant>,
    /// Sends refused in a row (with nothing in flight it waits longer
    /// after each, up to [`MAX_RETRY_MS`]).
    pub(super) refused: u32,
}

impl Peer {
    pub(super) fn new() -> Peer {
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
    pub(super) fn is_stuck(&self) -> bool {
        self.stuck && self.in_flight == 0
    }

    /// Whether it may be sent to now.
    pub(super) fn ready(&self, now: Instant) -> bool {
        self.retry_at.is_none_or(|t| t <= now)
    }
}

/// What became of a reply taken from the front of a reader's queue.
pub(super) enum Flushed {
    /// Posted, dropped, or replaced by a refusal: the next reply may go.
    Next,
    /// Back at the front of the queue until the provider (or the packing
    /// budget) takes more.
    Later,
}
