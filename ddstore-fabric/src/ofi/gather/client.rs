//! The reader's side of the gather path: one exchange sends a planned
//! batch's requests and lands their replies.
//!
//! Every request has a fresh nonce; a reply is used only if its tag and
//! CQ data carry that nonce (a receive whose CQ data fails is counted,
//! discarded and posted again, so the genuine reply still lands), and where
//! the provider offers it (`FI_DIRECTED_RECV`), only if it came from the
//! owner. Once a batch's reply receives are posted, a trash receive takes
//! whatever matches none of them, so unexpected messages never pile up.

use std::os::raw::c_void;
use std::ptr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use libfabric_sys as sys;

use super::plan::{Landing, Message, Plan};
use super::replies::bad_reply;
use super::wire::{self, MacKey, Nonce, Refusal};
use crate::error::{FabricError, FabricResult};
use crate::ofi::endpoint::TryAgain;
use crate::ofi::record::PeerShare;
use crate::ofi::window::{
    naming_peer, post_retrying, progress_once, reap, Arrived, InFlight, Live, Op, Posted, Stopped,
};

/// Longest wait for the trash receive's cancellation before a batch posts.
const TRASH_WITHDRAW: Duration = Duration::from_millis(200);

/// Bounce bytes an endpoint keeps after a batch (a larger one is freed).
const BOUNCE_KEPT: usize = 64 << 20;

/// First wait before a request an owner answered "busy" is sent again;
/// doubled at each busy answer to it, up to [`BUSY_WAIT_MAX`]. The request's
/// receives still wait under `DDSTORE_TIMEOUT_S`, so an owner busy for that
/// long is a timeout naming it.
const BUSY_WAIT_MIN: Duration = Duration::from_millis(2);
/// Longest wait before a busy request is sent again.
const BUSY_WAIT_MAX: Duration = Duration::from_millis(200);

/// What an exchange needs of its reader besides the lent endpoint.
pub(crate) struct Client<'a> {
    /// The key requests are MACed under.
    pub mac_key: &'a MacKey,
    /// The lent endpoint's name: owners address their replies to it.
    pub name: &'a [u8],
    /// Every owner's share record (the memory key a request names).
    pub peers: &'a [PeerShare],
    /// Replies are received from their owner's address only.
    pub directed: bool,
    /// How long an operation may wait (`DDSTORE_TIMEOUT_S`).
    pub timeout: Duration,
}

/// An exchange that failed.
pub(crate) struct Failed {
    /// What failed first.
    pub error: FabricError,
    /// Operations may still be in flight, or a reply did not match its
    /// receive: the reader must take its endpoint out of use.
    pub break_reader: bool,
}

/// Sends a planned batch's requests and lands their replies in `dst`;
/// `got` receives each message's received length, in plan order (a ragged request's replies may be shorter than
/// their receives). Every reply receive of a request is posted before the
/// request is sent; everything posted completes (or is cancelled) before
/// this returns, unless the error says to break the reader. `dst_owned`:
/// `dst` is the reader's own (abandoned with a broken reader), so replies
/// may land there directly; otherwise every reply lands in the bounce
/// buffer and is copied out once it completed, so a reply given up on a
/// timeout never writes into the caller's memory.
pub(crate) fn exchange(
    live: &mut Live,
    client: &Client<'_>,
    plan: &Plan,
    dst: &mut [u8],
    dst_owned: bool,
    got: &mut Vec<usize>,
) -> Result<(), Failed> {
    let mut batch =
        Exchange::new(live, client, plan, dst.as_mut_ptr(), dst_owned, got).map_err(|error| {
            Failed {
                error,
                break_reader: false,
            }
        })?;
    // Stopped early: the error is in `first_error`; what was posted still completes.
    let _ = batch.post_all();
    let live = batch.finish()?;
    if live.bounce.len() > BOUNCE_KEPT {
        live.bounce = Vec::new();
    }
    for &(from, to, n) in &plan.repeats {
        dst.copy_within(from..from + n, to);
    }
    Ok(())
}

/// One batch in flight: its plan and nonces, and what its replies did so far.
struct Exchange<'a> {
    live: &'a mut Live,
    client: &'a Client<'a>,
    plan: &'a Plan,
    /// Per request, its nonce.
    nonces: Vec<Nonce>,
    /// Per message of the batch: (request, index in it, its Message).
    msgs: Vec<(usize, usize, Message)>,
    /// The caller's destination (planned offsets lie inside it).
    dst: *mut u8,
    /// The endpoint's bounce buffer (sized for the plan).
    bounce: *mut u8,
    /// Per message planned to land directly in `dst`, where it lands in the
    /// bounce buffer instead (`dst` is the caller's).
    rehomed: Vec<Option<usize>>,
    /// Per request, whether its send was posted.
    sent: Vec<bool>,
    /// Per request, how often its owner answered "busy".
    busy: Vec<u32>,
    /// Requests answered "busy": (request, its message whose receive took
    /// the answer, when to send it again).
    retries: Vec<(usize, usize, Instant)>,
    /// Requests whose receives get no reply (refused): cancelled at the next settle.
    cancel: Vec<bool>,
    /// A reply did not match its receive: the endpoint is taken out of use.
    poisoned: bool,
    first_error: Option<FabricError>,
    /// Per message, the payload bytes received.
    got: &'a mut Vec<usize>,
}

impl<'a> Exchange<'a> {
    /// Draws the batch's nonces and sizes the endpoint's buffers for `plan`.
    fn new(
        live: &'a mut Live,
        client: &'a Client<'a>,
        plan: &'a Plan,
        dst: *mut u8,
        dst_owned: bool,
        got: &'a mut Vec<usize>,
    ) -> FabricResult<Exchange<'a>> {
        let nonces = plan
            .requests
            .iter()
            .map(|_| Nonce::random())
            .collect::<FabricResult<Vec<Nonce>>>()?;
        let msgs: Vec<(usize, usize, Message)> = plan
            .requests
            .iter()
            .enumerate()
            .flat_map(|(ri, r)| r.msgs.iter().enumerate().map(move |(mi, m)| (ri, mi, *m)))
            .collect();
        let mut bounce_len = plan.bounce_len;
        let rehomed = msgs
            .iter()
            .map(|(_, _, m)| match m.land {
                Landing::Direct(_) if !dst_owned => {
                    bounce_len += m.len;
                    Some(bounce_len - m.len)
                }
                _ => None,
            })
            .collect();
        // Nothing is in flight between calls, so the buffers may move here.
        if live.bounce.len() < bounce_len {
            live.bounce.resize(bounce_len, 0);
        }
        if live.requests.len() < plan.requests.len() {
            live.requests.resize_with(plan.requests.len(), Vec::new);
        }
        got.clear();
        got.resize(msgs.len(), 0);
        Ok(Exchange {
            bounce: live.bounce.as_mut_ptr(),
            live,
            client,
            plan,
            nonces,
            msgs,
            dst,
            rehomed,
            sent: vec![false; plan.requests.len()],
            busy: vec![0; plan.requests.len()],
            retries: Vec::new(),
            cancel: vec![false; plan.requests.len()],
            poisoned: false,
            first_error: None,
            got,
        })
    }

    /// Per request: its reply receives, then its send. Stops at the first error.
    fn post_all(&mut self) -> Result<(), Stopped> {
        // The trash receive matches anything: it must not sit before this
        // batch's reply receives in the provider's queue.
        self.live.withdraw_trash();
        let mut g = 0;
        for ri in 0..self.plan.requests.len() {
            for _ in 0..self.plan.requests[ri].msgs.len() {
                self.receive(g)?;
                g += 1;
            }
            self.send_request(ri)?;
        }
        Ok(())
    }

    /// Posts the receive of message `g` in a free slot.
    fn receive(&mut self, g: usize) -> Result<(), Stopped> {
        let slot = self.take_slot()?;
        let owner = self.plan.requests[self.msgs[g].0].owner;
        let posted = post_retrying(
            self,
            self.client.timeout,
            owner,
            "fi_trecv kept returning FI_EAGAIN",
            |batch| batch.post_receive(slot, g),
            Exchange::progress,
        );
        self.posted(slot, posted, |e| e)?;
        self.receiving(slot, g);
        Ok(())
    }

    /// Encodes request `ri` and posts its send in a free slot.
    fn send_request(&mut self, ri: usize) -> Result<(), Stopped> {
        self.encode_request(ri);
        let slot = self.take_slot()?;
        let owner = self.plan.requests[ri].owner;
        let posted = post_retrying(
            self,
            self.client.timeout,
            owner,
            "a gather request could not be sent (FI_EAGAIN)",
            |batch| batch.post_send(slot, ri),
            // Not accepted yet (rxm: still connecting): progress, never
            // wait on the receives, which need this request sent first.
            |batch| {
                batch.progress()?;
                std::thread::yield_now();
                Ok(())
            },
        );
        self.posted(slot, posted, |e| naming_peer(e, "request to", owner))?;
        self.sent[ri] = true;
        self.live.slots[slot] = Some(InFlight {
            peer: owner,
            posted: Instant::now(),
            op: Op::Send,
        });
        Ok(())
    }

    /// Frees `slot` unless the provider took its operation; records a
    /// failure to post (through `name`).
    fn posted(
        &mut self,
        slot: usize,
        posted: Posted,
        name: impl FnOnce(FabricError) -> FabricError,
    ) -> Result<(), Stopped> {
        match posted {
            Posted::Yes => return Ok(()),
            Posted::Stopped => {}
            Posted::Failed(e) => {
                self.first_error.get_or_insert(name(e));
            }
        }
        self.live.free.push(slot);
        Err(Stopped)
    }

    /// Records message `g`'s receive as posted in `slot`.
    fn receiving(&mut self, slot: usize, g: usize) {
        let (ri, _, m) = self.msgs[g];
        self.live.slots[slot] = Some(InFlight {
            peer: self.plan.requests[ri].owner,
            posted: Instant::now(),
            op: Op::Recv {
                msg: g,
                req: ri,
                want: m.len,
            },
        });
    }

    /// A free window slot, reaping (and settling replies) while none is.
    fn take_slot(&mut self) -> Result<usize, Stopped> {
        loop {
            if let Some(s) = self.live.free.pop() {
                return Ok(s);
            }
            if let Err(e) = reap(self.live, self.client.timeout, &mut self.first_error) {
                self.first_error.get_or_insert(e);
            }
            self.settle();
            if self.first_error.is_some() {
                return Err(Stopped);
            }
        }
    }

    /// Between retries of a post: one poll of the CQ, then settles replies.
    fn progress(&mut self) -> Result<(), Stopped> {
        if let Err(e) = progress_once(self.live, &mut self.first_error) {
            self.first_error.get_or_insert(e);
        }
        self.settle();
        match self.first_error {
            Some(_) => Err(Stopped),
            None => Ok(()),
        }
    }

    /// Where message `g` lands.
    fn landing(&self, g: usize) -> *mut u8 {
        if let Some(at) = self.rehomed[g] {
            // SAFETY: Exchange::new sized the bounce buffer to hold it.
            return unsafe { self.bounce.add(at) };
        }
        match self.msgs[g].2.land {
            // SAFETY: the plan keeps the offset inside dst (validated).
            Landing::Direct(d) => unsafe { self.dst.add(d) },
            // SAFETY: the plan keeps the offset inside the bounce buffer.
            Landing::Bounce { at, .. } => unsafe { self.bounce.add(at) },
        }
    }

    /// Posts the receive of message `g` in `slot`, straight where it lands
    /// (its nonce comes in the completion's CQ data).
    fn post_receive(&mut self, slot: usize, g: usize) -> FabricResult<Result<(), TryAgain>> {
        let (ri, mi, m) = self.msgs[g];
        let owner = self.plan.requests[ri].owner;
        let iov = [sys::iovec {
            iov_base: self.landing(g) as *mut c_void,
            iov_len: m.len,
        }];
        let src = if self.client.directed {
            self.live.peers_fi[owner]
        } else {
            sys::FI_ADDR_UNSPEC
        };
        // SAFETY: the payload lies in dst (borrowed for this whole call,
        // and the endpoint is closed before returning if the receive is
        // still posted) or in the reader-owned bounce buffer (abandoned,
        // never freed, if the reader breaks); the context slot is reserved.
        unsafe {
            self.live.ep.post_trecvv(
                &iov,
                src,
                wire::reply_tag(&self.nonces[ri], mi as u32, 0),
                wire::STATUS_MASK,
                self.live.contexts.ptr(slot),
            )
        }
    }

    /// Encodes request `ri` into the endpoint's buffer for it.
    fn encode_request(&mut self, ri: usize) {
        let req = &self.plan.requests[ri];
        let body = &mut self.live.requests[ri];
        let key = self.client.peers[req.owner].key;
        let (mac_key, nonce, name) = (self.client.mac_key, &self.nonces[ri], self.client.name);
        match &req.ragged {
            Some(part) => wire::encode_ragged(
                body,
                mac_key,
                nonce,
                name,
                &wire::RaggedRequest {
                    key,
                    n_msgs: req.msgs.len() as u32,
                    part: part.clone(),
                },
            ),
            None => wire::encode(
                body,
                mac_key,
                nonce,
                name,
                &wire::Request {
                    key,
                    msg_ranges: req.msg_ranges.clone(),
                    ranges: req.ranges.clone(),
                },
            ),
        }
    }

    /// Posts the send of request `ri` (encoded) in `slot`.
    fn post_send(&mut self, slot: usize, ri: usize) -> FabricResult<Result<(), TryAgain>> {
        let owner = self.plan.requests[ri].owner;
        let body = &mut self.live.requests[ri];
        let iov = [sys::iovec {
            iov_base: body.as_mut_ptr() as *mut c_void,
            iov_len: body.len(),
        }];
        // SAFETY: the request buffer is reader-owned and not touched until
        // the send completes (or is abandoned with a broken reader).
        unsafe {
            self.live.ep.post_tsendv(
                &iov,
                self.live.peers_fi[owner],
                wire::REQUEST_TAG,
                self.live.contexts.ptr(slot),
            )
        }
    }

    /// Checks and scatters replies that arrived; a refusal cancels the
    /// rest of its request's receives, any other mismatch poisons the
    /// reader; a reply whose CQ data is not its request's nonce is
    /// discarded and its receive posted again.
    fn settle(&mut self) {
        for a in std::mem::take(&mut self.live.arrived) {
            let genuine = a.data == Some(self.nonces[a.req].reply_data());
            if genuine {
                self.accept(a);
            } else {
                self.repost(a);
            }
        }
        self.cancel_refused();
    }

    /// Takes a genuine reply: its length checked against its receive, its
    /// bytes scattered from the bounce buffer where they landed there.
    fn accept(&mut self, a: Arrived) {
        let status = wire::reply_status(a.tag);
        let payload = a.got;
        if Refusal::from_status(status) == Some(Refusal::Busy) && payload == 0 {
            return self.retry_later(a.req, a.msg);
        }
        // A ragged reply fills at most its receive (the stream's tail is short).
        let fits = if self.plan.requests[a.req].ragged.is_some() {
            payload <= a.want
        } else {
            payload == a.want
        };
        if status != 0 || !fits {
            self.first_error
                .get_or_insert(bad_reply(a.peer, status, payload, a.want));
            if status != 0 && payload == 0 {
                self.cancel[a.req] = true;
            } else {
                self.poisoned = true;
            }
            return;
        }
        self.got[a.msg] = payload;
        if let (Some(at), Landing::Direct(d)) = (self.rehomed[a.msg], self.msgs[a.msg].2.land) {
            // SAFETY: at..at+payload lies in the bounce buffer and d..d+payload
            // in dst (the plan's, validated); this reply has completed.
            unsafe { ptr::copy_nonoverlapping(self.bounce.add(at), self.dst.add(d), payload) };
        }
        if let Landing::Bounce { scatter, .. } = self.msgs[a.msg].2.land {
            for &(b, d, n) in &self.plan.scatter[scatter.0..scatter.1] {
                // SAFETY: the plan keeps b..b+n inside the bounce buffer and
                // d..d+n inside dst (validated); this reply has completed, so
                // nothing else writes either range.
                unsafe { ptr::copy_nonoverlapping(self.bounce.add(b), self.dst.add(d), n) };
            }
        }
    }

    /// Schedules request `req`, answered "busy" in message `msg`'s
    /// receive, to be sent again after a wait that doubles at each answer.
    fn retry_later(&mut self, req: usize, msg: usize) {
        let wait = BUSY_WAIT_MIN
            .saturating_mul(1 << self.busy[req].min(16))
            .min(BUSY_WAIT_MAX);
        self.busy[req] += 1;
        self.live.times.busy_retries += 1;
        self.retries.push((req, msg, Instant::now() + wait));
    }

    /// Sends again the busy requests whose wait is over (after waiting for
    /// the first of them): the receive that took the answer posted again,
    /// then the request with a fresh id (owners admit each id once). The
    /// owner answered only once it had the whole request, so the provider
    /// no longer reads the request's buffer, encoded again here.
    fn resend_due(&mut self) -> Result<(), Stopped> {
        let Some(first) = self.retries.iter().map(|r| r.2).min() else {
            return Ok(());
        };
        std::thread::sleep(first.saturating_duration_since(Instant::now()));
        let now = Instant::now();
        let (due, later) = std::mem::take(&mut self.retries)
            .into_iter()
            .partition(|r| r.2 <= now);
        self.retries = later;
        // The trash receive matches anything: not before the reply receives.
        self.live.withdraw_trash();
        let due: Vec<(usize, usize, Instant)> = due;
        for (req, msg, _) in due {
            self.receive(msg)?;
            self.send_request(req)?;
        }
        self.live.post_trash();
        Ok(())
    }

    /// Discards a reply whose CQ data is not its request's nonce and posts its
    /// receive again (in the slot its completion freed).
    fn repost(&mut self, a: Arrived) {
        self.live.discarded.fetch_add(1, Ordering::Relaxed);
        let slot = self.live.free.pop().expect("its slot was freed");
        match self.post_receive(slot, a.msg) {
            Ok(Ok(())) => self.receiving(slot, a.msg),
            Ok(Err(_)) | Err(_) => {
                self.live.free.push(slot);
                self.poisoned = true;
                self.first_error.get_or_insert(FabricError::Invalid(format!(
                    "a reply receive from rank {} could not be posted again after a forged reply",
                    a.peer
                )));
            }
        }
    }

    /// Receives of refused requests never get data: cancels them.
    fn cancel_refused(&mut self) {
        for (slot, f) in self.live.slots.iter().enumerate() {
            if let Some(InFlight {
                op: Op::Recv { req, .. },
                ..
            }) = f
            {
                if self.cancel[*req] {
                    // SAFETY: the slot holds a receive posted on this endpoint.
                    unsafe { self.live.ep.cancel(self.live.contexts.ptr(slot)) };
                }
            }
        }
        self.cancel.iter_mut().for_each(|c| *c = false);
    }

    /// Completes (or cancels) everything posted before dst is handed back;
    /// what it cannot complete in time, or a poisoned batch, breaks the reader.
    /// Gives back the endpoint.
    fn finish(mut self) -> Result<&'a mut Live, Failed> {
        // Every reply receive is posted: from now on what matches none of
        // them lands in the trash.
        self.live.post_trash();
        // Receives of requests never sent get no reply.
        for (ri, sent) in self.sent.iter().enumerate() {
            if !sent {
                self.cancel[ri] = true;
            }
        }
        self.settle();
        while self.live.in_flight() || !self.retries.is_empty() {
            if self.first_error.is_some() {
                // No more retries: their requests' other receives get no reply.
                for (req, _, _) in std::mem::take(&mut self.retries) {
                    self.cancel[req] = true;
                }
                self.cancel_refused();
            } else if !self.retries.is_empty() {
                let _ = self.resend_due();
                self.settle();
                continue;
            }
            if !self.live.in_flight() {
                break;
            }
            if let Err(e) = reap(self.live, self.client.timeout, &mut self.first_error) {
                self.first_error.get_or_insert(e);
                break;
            }
            self.live.post_trash();
            self.settle();
        }
        if !self.live.in_flight() {
            self.live.repost_trash();
        }
        let break_reader = self.live.in_flight() || self.poisoned;
        match self.first_error {
            Some(error) => Err(Failed {
                error,
                break_reader,
            }),
            None => {
                debug_assert!(
                    !break_reader,
                    "a poisoned or unfinished batch records its error"
                );
                Ok(self.live)
            }
        }
    }
}

impl Live {
    /// Posts the trash receive (any tag, any sender) if it is not posted
    /// (nor cancelled with its completion still to be reaped).
    pub(crate) fn post_trash(&mut self) {
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

    /// Takes the trash receive out of the provider's matching queue: cancels
    /// it, and where the provider may remove it later
    /// (`!cancel_is_immediate`), waits (briefly) until it says it is gone,
    /// reaping what else completes meanwhile. Elsewhere its cancellation is
    /// reaped with the batch's completions ([`Live::repost_trash`]).
    fn withdraw_trash(&mut self) {
        if !self.trash_posted || self.trash_cancelled {
            return;
        }
        // SAFETY: the trash receive is posted on this endpoint.
        unsafe { self.ep.cancel(self.contexts.ptr(self.slots.len())) };
        self.trash_cancelled = true;
        if !self.cancel_is_immediate {
            self.wait_trash_reaped();
        }
    }

    /// Posts the trash receive again at the end of a batch, once a
    /// cancellation of it still pending has been reaped.
    fn repost_trash(&mut self) {
        if self.trash_cancelled {
            self.wait_trash_reaped();
        }
        self.post_trash();
    }

    /// Polls (up to [`TRASH_WITHDRAW`]) until the trash receive's completion is reaped.
    fn wait_trash_reaped(&mut self) {
        let deadline = Instant::now() + TRASH_WITHDRAW;
        let mut ignored = None;
        while self.trash_posted && Instant::now() < deadline {
            if progress_once(self, &mut ignored).is_err() {
                break;
            }
        }
    }
}
