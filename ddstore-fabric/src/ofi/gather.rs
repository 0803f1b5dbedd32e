//! The owner-side gather path's wire format and the reader's plan (safe code).
//!
//! Over providers without hardware RMA (tcp;ofi_rxm, sockets) every
//! one-sided read is a request/response pair in software. Instead a reader
//! sends each owner one tagged *request* per batch: the share's memory key,
//! the byte ranges it wants and how they are grouped into reply messages;
//! the owner's progress thread checks the key and every range against the
//! share it exposes and answers with one tagged message per group, the
//! ranges packed back to back. The reader posts a receive per message before
//! sending the request: straight into the destination when the group lands
//! contiguously there, else into a reader-owned bounce buffer it scatters from.
//!
//! Authentication. Anyone who can reach an endpoint can send it tagged
//! messages, so both directions are bound to a secret:
//! - every request ends with a MAC (BLAKE3 in keyed mode) under the job's
//!   [`MacKey`]; an owner verifies it, in constant time, before it reads
//!   anything else of the request, in particular the reply address;
//! - every request carries a fresh 128-bit [`Nonce`] from the operating
//!   system's CSPRNG. Its reply tags hold 52 of its bits (a reply with any
//!   other tag matches no receive the reader posted) and every reply message
//!   starts with [`REPLY_HEADER_BYTES`] more of them, which the reader checks
//!   before it uses the message. Readers also receive only from the owner's
//!   address where the provider offers directed receives.
//!
//! Tags: requests carry [`REQUEST_TAG`]; a reply's tag is the nonce's tag
//! bits, a status (0 = data, else a [`Refusal`] and no payload) and the
//! message's index in the request.

use crate::error::{FabricError, FabricResult, RefusedFor};
use ddstore_core::region::Memory;

/// The tag of every request (owners receive exactly this tag).
pub const REQUEST_TAG: u64 = 1 << 58;
const STATUS_SHIFT: u32 = 9;
/// The status bits of a reply tag; readers post receives ignoring them.
pub const STATUS_MASK: u64 = 0x7 << STATUS_SHIFT;
/// The message index bits of a reply tag.
const INDEX_MASK: u64 = (1 << STATUS_SHIFT) - 1;
/// The nonce bits of a reply tag (52 of them).
const NONCE_TAG_MASK: u64 = !(STATUS_MASK | INDEX_MASK);
/// Most reply messages one request may ask for (their index fits the tag).
pub const MAX_MSGS_PER_REQUEST: usize = 256;

/// Longest request (about 1,000 ranges); owners post receives of this size.
pub const MAX_REQUEST_BYTES: usize = 16 << 10;
/// Ranges of at least this many bytes get a message of their own, which
/// lands straight in the destination (no bounce copy for large rows).
pub const DIRECT_MIN: usize = 64 << 10;
/// Longest packed (bounce) message: bounds what an owner copies per message,
/// enforced by the owner whatever the provider's longest message.
pub const MAX_PACKED_BYTES: usize = 4 << 20;
/// Most reply bytes one request may ask for (owners refuse more; readers
/// split their batches into requests of at most this many).
pub const MAX_REPLY_BYTES: u64 = 256 << 20;
/// Bytes of nonce at the start of every reply message.
pub const REPLY_HEADER_BYTES: usize = 8;
/// Bytes of the MAC that ends every request.
pub const MAC_BYTES: usize = 32;

const MAGIC: u32 = u32::from_le_bytes(*b"DDG2");
const RAGGED_MAGIC: u32 = u32::from_le_bytes(*b"DDR2");
/// Magic, nonce and the reply address's length: what precedes the address.
const HEAD_BYTES: usize = 4 + NONCE_BYTES + 2;
const PLAIN_FIXED_BYTES: usize = 8 + 4 + 4;
const RAGGED_FIXED_BYTES: usize = 8 + 8 + 4 + 4 + 4 + 4;
const RANGE_BYTES: usize = 16;
const NONCE_BYTES: usize = 16;

/// A request's nonce: 16 bytes from the operating system's CSPRNG.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Nonce(
    /// Its bytes.
    pub [u8; NONCE_BYTES],
);

impl Nonce {
    /// A fresh nonce (`getrandom`; fails only if the OS cannot supply one).
    pub fn random() -> FabricResult<Nonce> {
        let mut n = [0u8; NONCE_BYTES];
        getrandom::getrandom(&mut n).map_err(|e| {
            FabricError::Unavailable(format!("the operating system gave no random bytes: {e}"))
        })?;
        Ok(Nonce(n))
    }

    /// The tag bits of its replies.
    fn tag_bits(&self) -> u64 {
        u64::from_le_bytes(self.0[..8].try_into().unwrap()) & NONCE_TAG_MASK
    }

    /// The header every reply message to it starts with.
    pub fn reply_header(&self) -> [u8; REPLY_HEADER_BYTES] {
        self.0[8..].try_into().unwrap()
    }
}

/// The key requests are MACed under: derived from the job's secret (method
/// 1: exchanged through the communicator; method 2: the job token).
#[derive(Clone)]
pub struct MacKey([u8; 32]);

impl MacKey {
    /// The key of a job whose secret is `secret`.
    pub fn derive(secret: &[u8]) -> MacKey {
        MacKey(blake3::derive_key(
            "pyddstore 2026 gather request MAC v2",
            secret,
        ))
    }

    fn mac(&self, bytes: &[u8]) -> blake3::Hash {
        blake3::keyed_hash(&self.0, bytes)
    }

    /// `bytes` followed by their MAC (what [`open`] checks).
    pub fn seal(&self, mut bytes: Vec<u8>) -> Vec<u8> {
        seal(&mut bytes, self);
        bytes
    }
}

impl std::fmt::Debug for MacKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MacKey(<secret>)")
    }
}

/// Why an owner refused a request (the status of its one reply).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The key names no share this owner exposes (freed, or never issued).
    UnknownKey = 1,
    /// A range lies outside the share.
    OutOfRange = 2,
    /// The request could not be parsed.
    Malformed = 3,
    /// The owner could not address a reply to this reader.
    NoRoute = 4,
    /// The requested ragged rows hold more bytes than the receives the
    /// reader posted (its bound on their lengths was wrong).
    TooLarge = 5,
    /// The request exceeds the owner's bounds (bytes or messages per request,
    /// bytes per packed message) or the owner is out of memory for it.
    OverLimit = 6,
}

impl Refusal {
    fn from_status(s: u64) -> Option<Refusal> {
        Some(match s {
            1 => Refusal::UnknownKey,
            2 => Refusal::OutOfRange,
            3 => Refusal::Malformed,
            4 => Refusal::NoRoute,
            5 => Refusal::TooLarge,
            6 => Refusal::OverLimit,
            _ => return None,
        })
    }

    /// What a reader reports.
    pub fn describe(status: u64) -> &'static str {
        match Refusal::from_status(status) {
            Some(Refusal::UnknownKey) => {
                "it exposes no share under this memory key (the variable was freed, or the key \
                 is not one it issued)"
            }
            Some(Refusal::OutOfRange) => "a requested range lies outside its share",
            Some(Refusal::Malformed) => "the request was malformed",
            Some(Refusal::NoRoute) => "it cannot address a reply to this reader",
            Some(Refusal::TooLarge) => {
                "the requested ragged rows hold more bytes than the reader's bound on them"
            }
            Some(Refusal::OverLimit) => {
                "the request exceeds its bounds (256 MiB or 256 messages per request, 4 MiB per \
                 packed message) or it had no memory for the reply"
            }
            None => "an unknown status",
        }
    }
}

/// The tag of reply message `index` of the request with `nonce`, with `status`.
pub fn reply_tag(nonce: &Nonce, index: u32, status: u64) -> u64 {
    nonce.tag_bits() | ((status << STATUS_SHIFT) & STATUS_MASK) | (index as u64 & INDEX_MASK)
}

/// The status bits of a reply tag (0: data).
pub fn reply_status(tag: u64) -> u64 {
    (tag & STATUS_MASK) >> STATUS_SHIFT
}

/// A plain request as the owner reads it.
#[derive(Debug, PartialEq, Eq)]
pub struct Request {
    /// Memory key of the share.
    pub key: u64,
    /// Ranges per reply message, in message order.
    pub msg_ranges: Vec<u32>,
    /// (offset, len) in the share.
    pub ranges: Vec<(u64, u64)>,
}

/// An authenticated request: its nonce, where its replies go, and its body
/// (`Err` when the body is malformed: the sender is refused).
#[derive(Debug, PartialEq, Eq)]
pub struct Opened {
    /// The request's nonce (in every reply).
    pub nonce: Nonce,
    /// The reader endpoint's name (covered by the MAC).
    pub reply_to: Vec<u8>,
    /// What it asks for.
    pub body: Result<Body, Refusal>,
}

/// What an authenticated request asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Body {
    /// Byte ranges.
    Plain(Request),
    /// Whole ragged rows.
    Ragged(RaggedRequest),
}

/// Starts a request into `out` (cleared first): magic, nonce, reply address.
fn begin(out: &mut Vec<u8>, magic: u32, nonce: &Nonce, reply_to: &[u8]) {
    out.clear();
    out.extend_from_slice(&magic.to_le_bytes());
    out.extend_from_slice(&nonce.0);
    out.extend_from_slice(&(reply_to.len() as u16).to_le_bytes());
    out.extend_from_slice(reply_to);
}

/// Ends a request with its MAC.
fn seal(out: &mut Vec<u8>, key: &MacKey) {
    let mac = key.mac(out);
    out.extend_from_slice(mac.as_bytes());
}

/// Encodes a plain request into `out` (cleared first), MACed under `mac_key`.
pub fn encode(out: &mut Vec<u8>, mac_key: &MacKey, nonce: &Nonce, reply_to: &[u8], req: &Request) {
    begin(out, MAGIC, nonce, reply_to);
    out.extend_from_slice(&req.key.to_le_bytes());
    out.extend_from_slice(&(req.msg_ranges.len() as u32).to_le_bytes());
    out.extend_from_slice(&(req.ranges.len() as u32).to_le_bytes());
    for n in &req.msg_ranges {
        out.extend_from_slice(&n.to_le_bytes());
    }
    for (off, len) in &req.ranges {
        out.extend_from_slice(&off.to_le_bytes());
        out.extend_from_slice(&len.to_le_bytes());
    }
    seal(out, mac_key);
}

/// Bytes a plain request of `n_msgs` messages and `n_ranges` ranges takes.
pub fn request_bytes(name_len: usize, n_msgs: usize, n_ranges: usize) -> usize {
    HEAD_BYTES + name_len + PLAIN_FIXED_BYTES + 4 * n_msgs + RANGE_BYTES * n_ranges + MAC_BYTES
}

struct Cursor<'a>(&'a [u8]);

impl Cursor<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

/// Opens a received request: `None` unless its MAC under `mac_key` holds
/// (checked first, in constant time, before any field is used); then its
/// nonce, reply address and body.
pub fn open(bytes: &[u8], mac_key: &MacKey) -> Option<Opened> {
    let signed_len = bytes.len().checked_sub(MAC_BYTES)?;
    let (signed, mac) = bytes.split_at(signed_len);
    let mac: [u8; MAC_BYTES] = mac.try_into().ok()?;
    // blake3::Hash compares in constant time.
    if mac_key.mac(signed) != blake3::Hash::from(mac) {
        return None;
    }
    let mut c = Cursor(signed);
    let magic = c.u32()?;
    let nonce = Nonce(c.take(NONCE_BYTES)?.try_into().ok()?);
    let name_len = c.u16()? as usize;
    let reply_to = c.take(name_len)?.to_vec();
    let body = match magic {
        MAGIC => decode_plain(c.0).map(Body::Plain),
        RAGGED_MAGIC => decode_ragged(c.0).map(Body::Ragged),
        _ => Err(Refusal::Malformed),
    };
    Some(Opened {
        nonce,
        reply_to,
        body,
    })
}

fn decode_plain(bytes: &[u8]) -> Result<Request, Refusal> {
    let bad = Refusal::Malformed;
    let mut c = Cursor(bytes);
    let key = c.u64().ok_or(bad)?;
    let n_msgs = c.u32().ok_or(bad)? as usize;
    let n_ranges = c.u32().ok_or(bad)? as usize;
    // Counts are checked against the bytes before anything is allocated.
    let expected = (n_msgs as u64) * 4 + (n_ranges as u64) * RANGE_BYTES as u64;
    if c.0.len() as u64 != expected || n_msgs == 0 {
        return Err(bad);
    }
    if n_msgs > MAX_MSGS_PER_REQUEST {
        return Err(Refusal::OverLimit);
    }
    let msg_ranges = (0..n_msgs)
        .map(|_| c.u32())
        .collect::<Option<Vec<u32>>>()
        .ok_or(bad)?;
    let ranges = (0..n_ranges)
        .map(|_| Some((c.u64()?, c.u64()?)))
        .collect::<Option<Vec<_>>>()
        .ok_or(bad)?;
    if msg_ranges.contains(&0) || msg_ranges.iter().map(|&n| n as usize).sum::<usize>() != n_ranges
    {
        return Err(bad);
    }
    Ok(Request {
        key,
        msg_ranges,
        ranges,
    })
}

/// Where one reply message lands at the reader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Landing {
    /// Contiguously in the destination, at this offset.
    Direct(usize),
    /// In the bounce buffer at `at`; scatter entries `scatter.0..scatter.1`.
    Bounce { at: usize, scatter: (usize, usize) },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Message {
    pub len: usize,
    pub land: Landing,
}

/// One request to one owner.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct RequestPlan {
    pub owner: usize,
    pub msg_ranges: Vec<u32>,
    pub ranges: Vec<(u64, u64)>,
    pub msgs: Vec<Message>,
    /// A ragged request (whole rows, lengths resolved by the owner) instead
    /// of byte ranges: its replies may be shorter than their receives.
    pub ragged: Option<RaggedPart>,
}

/// Everything a batch needs: requests, bounce scatter, repeated ranges.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub requests: Vec<RequestPlan>,
    /// (bounce offset, destination offset, len).
    pub scatter: Vec<(usize, usize, usize)>,
    /// Repeats: (from destination offset, to destination offset, len), after all else.
    pub repeats: Vec<(usize, usize, usize)>,
    pub bounce_len: usize,
}

/// Limits a plan respects.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Longest reply message (the provider's max_msg_size, DDSTORE_MAX_READ_BYTES).
    pub chunk: usize,
    /// Messages per request: a request's receives are all posted before it is sent.
    pub msgs_per_request: usize,
    /// The reader endpoint's name length (it travels in every request).
    pub name_len: usize,
}

/// Plans `reads` (owner, offset, len, dst_offset), all of them to owners
/// that serve the gather path: per owner, in order, exact repeats once,
/// ranges longer than `chunk` split, small ranges packed.
pub fn plan(reads: &[(usize, u64, usize, usize)], limits: Limits) -> Plan {
    use std::collections::HashMap;
    let chunk = limits.chunk.clamp(1, MAX_REPLY_BYTES as usize);
    let packed_max = chunk.min(MAX_PACKED_BYTES);
    let per_request = limits.msgs_per_request.clamp(1, MAX_MSGS_PER_REQUEST);
    let mut out = Plan::default();
    // Per owner, in first-seen order: unique (offset, len, dst_offset) pieces.
    let mut owners: Vec<usize> = Vec::new();
    let mut pieces: HashMap<usize, Vec<(u64, usize, usize)>> = HashMap::new();
    let mut seen: HashMap<(usize, u64, usize), usize> = HashMap::new();
    for &(owner, offset, len, dst) in reads.iter().filter(|r| r.2 > 0) {
        if let Some(&first) = seen.get(&(owner, offset, len)) {
            out.repeats.push((first, dst, len));
            continue;
        }
        seen.insert((owner, offset, len), dst);
        let list = pieces.entry(owner).or_insert_with(|| {
            owners.push(owner);
            Vec::new()
        });
        let mut done = 0;
        while done < len {
            let n = chunk.min(len - done);
            list.push((offset + done as u64, n, dst + done));
            done += n;
        }
    }
    for owner in owners {
        let list = &pieces[&owner];
        let mut req = RequestPlan {
            owner,
            ..Default::default()
        };
        let mut open: Option<Open> = None;
        // Reply bytes the current request asks for (at most MAX_REPLY_BYTES).
        let mut req_bytes: u64 = 0;
        for (i, &(offset, n, dst)) in list.iter().enumerate() {
            let small = n < DIRECT_MIN;
            let joins = match &open {
                Some(o) => {
                    o.small
                        && small
                        && o.bytes + n <= packed_max
                        && req_bytes + n as u64 <= MAX_REPLY_BYTES
                        && request_bytes(limits.name_len, req.msgs.len() + 1, req.ranges.len() + 1)
                            <= MAX_REQUEST_BYTES
                }
                None => false,
            };
            if let (true, Some(o)) = (joins, open.as_mut()) {
                let prev = list[i - 1];
                o.contiguous &= prev.2 + prev.1 == dst;
                o.bytes += n;
            } else {
                if let Some(o) = open.take() {
                    close(&mut out, &mut req, list, o, i);
                }
                let full = req.msgs.len() >= per_request
                    || (req_bytes > 0 && req_bytes + n as u64 > MAX_REPLY_BYTES)
                    || request_bytes(limits.name_len, req.msgs.len() + 1, req.ranges.len() + 1)
                        > MAX_REQUEST_BYTES;
                if full {
                    let next = RequestPlan {
                        owner,
                        ..Default::default()
                    };
                    out.requests.push(std::mem::replace(&mut req, next));
                    req_bytes = 0;
                }
                open = Some(Open {
                    first: i,
                    bytes: n,
                    contiguous: true,
                    small,
                });
            }
            req.ranges.push((offset, n as u64));
            req_bytes += n as u64;
        }
        if let Some(o) = open.take() {
            close(&mut out, &mut req, list, o, list.len());
        }
        if !req.ranges.is_empty() {
            out.requests.push(req);
        }
    }
    out
}

/// The reply message being planned: its first piece, bytes so far, whether
/// its pieces are back to back in the destination, whether it packs small ones.
struct Open {
    first: usize,
    bytes: usize,
    contiguous: bool,
    small: bool,
}

/// Ends message `o` (pieces `o.first..end` of `list`) in `req`.
fn close(out: &mut Plan, req: &mut RequestPlan, list: &[(u64, usize, usize)], o: Open, end: usize) {
    req.msg_ranges.push((end - o.first) as u32);
    let land = if o.contiguous {
        Landing::Direct(list[o.first].2)
    } else {
        let at = out.bounce_len;
        let s0 = out.scatter.len();
        let mut b = at;
        for &(_, n, dst) in &list[o.first..end] {
            out.scatter.push((b, dst, n));
            b += n;
        }
        out.bounce_len = b;
        Landing::Bounce {
            at,
            scatter: (s0, out.scatter.len()),
        }
    };
    req.msgs.push(Message { len: o.bytes, land });
}

/// One owner's rows for a ragged gather ([`plan_ragged`]).
pub struct RaggedOwner<'a> {
    /// The owning rank.
    pub owner: usize,
    /// Memory key of the owner's ends share.
    pub ends_key: u64,
    /// Distinct local row numbers, in reply order.
    pub rows: &'a [u64],
    /// Longest row the owner holds, in bytes (agreed when the variable was added).
    pub max_row_bytes: u64,
    /// Bytes of the owner's values share.
    pub share_bytes: u64,
}

/// One planned ragged request: its rows are `rows` of its owner's list, its
/// reply stream lands at `at` of the staging buffer (`len` bytes posted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RaggedSlot {
    /// Index into the owners given to [`plan_ragged`].
    pub owner_index: usize,
    /// Rows `rows.0 .. rows.1` of that owner's list.
    pub rows: (usize, usize),
    /// Offset of its receives in the staging buffer.
    pub at: usize,
    /// Bytes of its receives (a bound on its reply).
    pub len: usize,
}

/// Plans ragged requests: per owner, rows in order, cut so that a request
/// fits [`MAX_REQUEST_BYTES`] and a bound on its reply (8 bytes plus the
/// owner's longest row per row, at most its share) fits the receives one
/// request may post. Every message lands straight in a staging buffer of the
/// returned length. `None` when a single row's bound exceeds what one
/// request may receive (the caller reads those rows another way).
pub fn plan_ragged(
    owners: &[RaggedOwner<'_>],
    unit_bytes: usize,
    limits: Limits,
) -> Option<(Plan, Vec<RaggedSlot>, usize)> {
    let msg_cap = limits
        .chunk
        .clamp(1, MAX_PACKED_BYTES)
        .min(u32::MAX as usize) as u64;
    let per_request = limits.msgs_per_request.clamp(1, MAX_RAGGED_MSGS) as u64;
    let budget = (msg_cap * per_request).min(MAX_REPLY_BYTES);
    if unit_bytes == 0 || unit_bytes > u32::MAX as usize {
        return None;
    }
    let mut plan = Plan::default();
    let mut slots = Vec::new();
    let mut staging = 0usize;
    for (oi, o) in owners.iter().enumerate() {
        let row_bound = o.max_row_bytes.min(o.share_bytes) + END_BYTES as u64;
        if row_bound > budget {
            return None;
        }
        let mut first = 0;
        while first < o.rows.len() {
            let mut end = first;
            let bound = |k: usize| (k as u64 * row_bound).min(o.share_bytes + 8 * k as u64);
            while end < o.rows.len()
                && bound(end + 1 - first) <= budget
                && ragged_request_bytes(limits.name_len, end + 1 - first) <= MAX_REQUEST_BYTES
            {
                end += 1;
            }
            let b = bound(end - first);
            let n_msgs = b.div_ceil(msg_cap).max(1);
            let m = b.div_ceil(n_msgs) as usize;
            let msgs = (0..n_msgs as usize)
                .map(|i| Message {
                    len: m,
                    land: Landing::Direct(staging + i * m),
                })
                .collect();
            plan.requests.push(RequestPlan {
                owner: o.owner,
                msgs,
                ragged: Some(RaggedPart {
                    ends_key: o.ends_key,
                    unit_bytes: unit_bytes as u32,
                    msg_bytes: m as u32,
                    rows: o.rows[first..end].to_vec(),
                }),
                ..Default::default()
            });
            let len = m * n_msgs as usize;
            slots.push(RaggedSlot {
                owner_index: oi,
                rows: (first, end),
                at: staging,
                len,
            });
            staging += len;
            first = end;
        }
    }
    Some((plan, slots, staging))
}

/// Checks a plain request against the share it names (`share_len` bytes)
/// and the owner's bounds: every range inside the share; every message at
/// most `max_msg` (the provider's longest) and, when it has more than
/// `zero_copy_ranges` ranges (so the owner packs it), at most
/// [`MAX_PACKED_BYTES`]; all of them at most [`MAX_REPLY_BYTES`].
pub fn check_request(
    req: &Request,
    share_len: u64,
    max_msg: usize,
    zero_copy_ranges: usize,
) -> Result<(), Refusal> {
    let mut next = 0usize;
    let mut total: u64 = 0;
    for &n in &req.msg_ranges {
        let end = next + n as usize;
        let mut bytes: u64 = 0;
        for &(off, len) in &req.ranges[next..end] {
            match off.checked_add(len) {
                Some(e) if e <= share_len && len > 0 => {}
                _ => return Err(Refusal::OutOfRange),
            }
            bytes = bytes.saturating_add(len);
        }
        let packed = n as usize > zero_copy_ranges;
        if bytes > max_msg as u64 || (packed && bytes > MAX_PACKED_BYTES as u64) {
            return Err(Refusal::OverLimit);
        }
        total = total.saturating_add(bytes);
        next = end;
    }
    if total > MAX_REPLY_BYTES {
        return Err(Refusal::OverLimit);
    }
    Ok(())
}

/// A reply that does not match its receive, as an error naming the owner.
pub fn bad_reply(owner: usize, status: u64, got: usize, want: usize) -> FabricError {
    if status != 0 {
        FabricError::Refused {
            peer: owner,
            reason: match Refusal::from_status(status) {
                Some(Refusal::UnknownKey) => RefusedFor::Key,
                Some(Refusal::OutOfRange) => RefusedFor::Range,
                _ => RefusedFor::Other,
            },
            call: None,
            code: None,
            detail: format!(
                "rank {owner} refused the request: {}",
                Refusal::describe(status)
            ),
        }
    } else {
        FabricError::Invalid(format!(
            "rank {owner} answered a gather request with {got} bytes where {want} were asked"
        ))
    }
}

// ---------------------------------------------------------------------------
// Ragged requests: whole rows of a ragged variable in one round trip.
//
// The reader names the owner's values and ends shares (by memory key), the
// unit size, local row numbers, and the receives it posted (`n_msgs`
// messages of `msg_bytes` each, sized from a bound on the rows' lengths
// agreed when the variable was added). The owner resolves each row's byte
// range from its own ends and answers with one stream, cut into the posted
// messages: the rows' lengths in units (one little-endian u64 each, in
// request order), then their values back to back. Message i carries stream
// bytes `i * msg_bytes ..`; messages past the end of the stream are empty
// (a reply header only).

/// Most reply messages one ragged request may ask for.
pub const MAX_RAGGED_MSGS: usize = 256;

/// The ragged part of a request: what the owner needs beyond the values key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RaggedPart {
    /// Memory key of the owner's row-ends share.
    pub ends_key: u64,
    /// Bytes of one unit of the values.
    pub unit_bytes: u32,
    /// Bytes of each posted reply receive.
    pub msg_bytes: u32,
    /// Local row numbers in the owner's share, in reply order.
    pub rows: Vec<u64>,
}

/// A ragged request as the owner reads it.
#[derive(Debug, PartialEq, Eq)]
pub struct RaggedRequest {
    /// Memory key of the values share.
    pub key: u64,
    /// Reply receives the reader posted, each of `part.msg_bytes`.
    pub n_msgs: u32,
    /// Keys, unit size, message size and rows.
    pub part: RaggedPart,
}

/// Bytes a ragged request of `n_rows` rows takes.
pub fn ragged_request_bytes(name_len: usize, n_rows: usize) -> usize {
    HEAD_BYTES + name_len + RAGGED_FIXED_BYTES + 8 * n_rows + MAC_BYTES
}

/// Encodes a ragged request into `out` (cleared first), MACed under `mac_key`.
pub fn encode_ragged(
    out: &mut Vec<u8>,
    mac_key: &MacKey,
    nonce: &Nonce,
    reply_to: &[u8],
    req: &RaggedRequest,
) {
    let part = &req.part;
    begin(out, RAGGED_MAGIC, nonce, reply_to);
    out.extend_from_slice(&req.key.to_le_bytes());
    out.extend_from_slice(&part.ends_key.to_le_bytes());
    out.extend_from_slice(&part.unit_bytes.to_le_bytes());
    out.extend_from_slice(&part.msg_bytes.to_le_bytes());
    out.extend_from_slice(&req.n_msgs.to_le_bytes());
    out.extend_from_slice(&(part.rows.len() as u32).to_le_bytes());
    for r in &part.rows {
        out.extend_from_slice(&r.to_le_bytes());
    }
    seal(out, mac_key);
}

fn decode_ragged(bytes: &[u8]) -> Result<RaggedRequest, Refusal> {
    let bad = Refusal::Malformed;
    let mut c = Cursor(bytes);
    let key = c.u64().ok_or(bad)?;
    let ends_key = c.u64().ok_or(bad)?;
    let unit_bytes = c.u32().ok_or(bad)?;
    let msg_bytes = c.u32().ok_or(bad)?;
    let n_msgs = c.u32().ok_or(bad)?;
    let n_rows = c.u32().ok_or(bad)? as u64;
    if c.0.len() as u64 != 8 * n_rows || n_msgs == 0 || msg_bytes == 0 || unit_bytes == 0 {
        return Err(bad);
    }
    if n_msgs as usize > MAX_RAGGED_MSGS {
        return Err(Refusal::OverLimit);
    }
    let rows = (0..n_rows)
        .map(|_| c.u64())
        .collect::<Option<Vec<u64>>>()
        .ok_or(bad)?;
    Ok(RaggedRequest {
        key,
        n_msgs,
        part: RaggedPart {
            ends_key,
            unit_bytes,
            msg_bytes,
            rows,
        },
    })
}

/// The owner's answer to a ragged request: the reply messages (`n_msgs` of
/// them, each at most `msg_bytes`), or why it is refused. `ends` and
/// `values` are the owner's shares the request's keys named; every row and
/// every range is checked against them, and the stream must fit the
/// receives the reader posted (at most `max_msg` bytes each). `stream` is a
/// buffer to reuse for the first message (its contents are replaced).
pub fn answer_ragged(
    req: &RaggedRequest,
    ends: &dyn Memory,
    values: &dyn Memory,
    max_msg: usize,
    mut stream: Vec<u8>,
) -> Result<Vec<Vec<u8>>, Refusal> {
    let part = &req.part;
    let m = part.msg_bytes as usize;
    if !ends.len().is_multiple_of(END_BYTES) {
        return Err(Refusal::Malformed);
    }
    let capacity = m as u64 * req.n_msgs as u64;
    if m > max_msg.min(MAX_PACKED_BYTES) || capacity > MAX_REPLY_BYTES {
        return Err(Refusal::OverLimit);
    }
    let n_rows = (ends.len() / END_BYTES) as u64;
    let ub = part.unit_bytes as u64;
    // Each row's byte range, from its end and its predecessor's.
    let mut spans = Vec::with_capacity(part.rows.len());
    let mut total = (END_BYTES * part.rows.len()) as u64;
    for &row in &part.rows {
        if row >= n_rows {
            return Err(Refusal::OutOfRange);
        }
        let mut pair = [0u8; 2 * END_BYTES];
        let (at, dst) = if row == 0 {
            (0, &mut pair[END_BYTES..])
        } else {
            ((row as usize - 1) * END_BYTES, &mut pair[..])
        };
        ends.read_at(at, dst).map_err(|_| Refusal::OutOfRange)?;
        let start = u64::from_le_bytes(pair[..END_BYTES].try_into().unwrap());
        let end = u64::from_le_bytes(pair[END_BYTES..].try_into().unwrap());
        let range = start
            .checked_mul(ub)
            .zip(end.checked_mul(ub))
            .filter(|&(s, e)| s <= e && e <= values.len() as u64)
            .ok_or(Refusal::OutOfRange)?;
        total = total.saturating_add(range.1 - range.0);
        spans.push((end - start, range.0 as usize, (range.1 - range.0) as usize));
    }
    if total > capacity {
        return Err(Refusal::TooLarge);
    }
    // Readers ask for distinct rows, whose values fit in the share: what a
    // request makes this owner allocate is bounded by its own share.
    if total - (END_BYTES * part.rows.len()) as u64 > values.len() as u64 {
        return Err(Refusal::Malformed);
    }
    // Every byte is overwritten below: a reused buffer is only zeroed where
    // it grows. No memory for it refuses the request (never aborts).
    let total = total as usize;
    stream
        .try_reserve(total.saturating_sub(stream.len()))
        .map_err(|_| Refusal::OverLimit)?;
    stream.resize(total, 0);
    let mut at = 0;
    for &(units, _, _) in &spans {
        stream[at..at + END_BYTES].copy_from_slice(&units.to_le_bytes());
        at += END_BYTES;
    }
    for &(_, off, len) in &spans {
        values
            .read_at(off, &mut stream[at..at + len])
            .map_err(|_| Refusal::OutOfRange)?;
        at += len;
    }
    // Cut into the posted messages, from the back (each tail copied once).
    let mut msgs = Vec::with_capacity(req.n_msgs as usize);
    for i in (1..req.n_msgs as usize).rev() {
        let at = (i * m).min(stream.len());
        msgs.push(stream.split_off(at));
    }
    msgs.push(stream);
    msgs.reverse();
    Ok(msgs)
}

/// Bytes of one row end in a ragged variable's ends share.
const END_BYTES: usize = 8;

/// Parses a ragged reply stream of `n_rows` rows (the received bytes, back
/// to back): each row's length in units and the offset of its values in the
/// stream. Checks that the lengths account for every byte and that no row
/// exceeds `max_row_bytes`.
pub fn parse_ragged_reply(
    stream: &[u8],
    n_rows: usize,
    unit_bytes: usize,
    max_row_bytes: u64,
) -> Result<Vec<(u64, usize)>, String> {
    let head = n_rows * END_BYTES;
    if stream.len() < head {
        return Err(format!(
            "a ragged reply of {} bytes is shorter than the {n_rows} row lengths",
            stream.len()
        ));
    }
    let mut at = head;
    let mut out = Vec::with_capacity(n_rows);
    for i in 0..n_rows {
        let units = u64::from_le_bytes(
            stream[i * END_BYTES..(i + 1) * END_BYTES]
                .try_into()
                .unwrap(),
        );
        let bytes = units
            .checked_mul(unit_bytes as u64)
            .filter(|&b| b <= max_row_bytes);
        let Some(bytes) = bytes else {
            return Err(format!(
                "a ragged reply gives row {i} {units} units, more than the longest row of {max_row_bytes} bytes"
            ));
        };
        out.push((units, at));
        at += bytes as usize;
    }
    if at != stream.len() {
        return Err(format!(
            "a ragged reply of {} bytes does not match its row lengths ({at} bytes)",
            stream.len()
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            chunk: 1 << 20,
            msgs_per_request: 63,
            name_len: 20,
        }
    }

    fn key() -> MacKey {
        MacKey::derive(b"job secret")
    }

    fn nonce(b: u8) -> Nonce {
        Nonce([b; 16])
    }

    fn opened_plain(
        bytes: &[u8],
        k: &MacKey,
    ) -> Option<(Nonce, Vec<u8>, Result<Request, Refusal>)> {
        let o = open(bytes, k)?;
        let body = o.body.map(|b| match b {
            Body::Plain(r) => r,
            Body::Ragged(_) => panic!("not plain"),
        });
        Some((o.nonce, o.reply_to, body))
    }

    #[test]
    fn requests_round_trip_and_reject_garbage() {
        let mut buf = Vec::new();
        let req = Request {
            key: 0xdead,
            msg_ranges: vec![2, 1],
            ranges: vec![(0, 8), (64, 8), (512, 3)],
        };
        encode(&mut buf, &key(), &nonce(7), b"reader", &req);
        assert_eq!(buf.len(), request_bytes(6, 2, 3));
        let (n, reply_to, body) = opened_plain(&buf, &key()).unwrap();
        assert_eq!((n, reply_to), (nonce(7), b"reader".to_vec()));
        let back = body.unwrap();
        assert_eq!(back, req);
        // Truncated, garbage, another key, one bit flipped: not authentic.
        assert!(open(&buf[..buf.len() - 1], &key()).is_none());
        assert!(open(b"junk", &key()).is_none());
        assert!(open(&buf, &MacKey::derive(b"other")).is_none());
        for bit in [0, 40, 8 * buf.len() - 1] {
            let mut flipped = buf.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            assert!(open(&flipped, &key()).is_none(), "bit {bit}");
        }
        // Authentic but malformed: counts that do not add up, a count
        // claiming more bytes than there are: refused, not allocated.
        let mut bad = Vec::new();
        let counts = Request {
            key: 2,
            msg_ranges: vec![3],
            ranges: vec![(0, 8)],
        };
        encode(&mut bad, &key(), &nonce(1), b"r", &counts);
        assert_eq!(
            opened_plain(&bad, &key()).unwrap().2,
            Err(Refusal::Malformed)
        );
        let mut huge = Vec::new();
        begin(&mut huge, MAGIC, &nonce(2), b"r");
        huge.extend_from_slice(&1u64.to_le_bytes());
        huge.extend_from_slice(&1u32.to_le_bytes());
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        huge.extend_from_slice(&[0; 4]);
        seal(&mut huge, &key());
        assert_eq!(
            opened_plain(&huge, &key()).unwrap().2,
            Err(Refusal::Malformed)
        );
        assert_eq!(check_request(&back, 515, 1 << 20, 3), Ok(()));
        assert_eq!(
            check_request(&back, 514, 1 << 20, 3),
            Err(Refusal::OutOfRange)
        );
        assert_eq!(check_request(&back, 515, 15, 3), Err(Refusal::OverLimit));
        let wide = Request {
            key: 1,
            msg_ranges: vec![2],
            ranges: vec![(0, 3 << 20), (0, 3 << 20)],
        };
        // Two ranges in one send: fine; packed (one range per send): over 4 MiB.
        assert_eq!(check_request(&wide, 4 << 20, 1 << 30, 2), Ok(()));
        assert_eq!(
            check_request(&wide, 4 << 20, 1 << 30, 1),
            Err(Refusal::OverLimit)
        );
        // 900 ranges of 64 MiB each: over the request's byte bound.
        let many = Request {
            key: 1,
            msg_ranges: vec![1; 900],
            ranges: vec![(0, 64 << 20); 900],
        };
        assert_eq!(
            check_request(&many, 64 << 20, usize::MAX, 3),
            Err(Refusal::OverLimit)
        );
        let huge = Request {
            ranges: vec![(u64::MAX - 1, 8)],
            msg_ranges: vec![1],
            key: 0,
        };
        assert_eq!(
            check_request(&huge, u64::MAX, 1 << 20, 3),
            Err(Refusal::OutOfRange)
        );
    }

    #[test]
    fn tags_carry_nonce_status_and_index() {
        let n = Nonce::random().unwrap();
        assert_ne!(n, Nonce::random().unwrap());
        let t = reply_tag(&n, 9, 0);
        assert_eq!(t & STATUS_MASK, 0);
        assert_eq!(
            reply_status(reply_tag(&n, 0, Refusal::UnknownKey as u64)),
            1
        );
        assert_eq!(reply_status(reply_tag(&n, 0, Refusal::OverLimit as u64)), 6);
        assert_ne!(reply_tag(&n, 1, 0), reply_tag(&n, 2, 0));
        assert_ne!(reply_tag(&nonce(1), 0, 0), reply_tag(&nonce(2), 0, 0));
        // 52 of the nonce's bits are in the tag.
        assert_eq!(NONCE_TAG_MASK.count_ones(), 52);
        assert_eq!(
            reply_tag(&n, (MAX_MSGS_PER_REQUEST - 1) as u32, 0) & NONCE_TAG_MASK,
            t & NONCE_TAG_MASK
        );
    }

    #[test]
    fn plan_packs_small_rows_lands_large_ones_and_reads_repeats_once() {
        // Owner 1: two 3 KB rows apart in dst (packed), owner 2: a 1 MB row (direct).
        let reads = [
            (1, 0, 3072, 0),
            (2, 0, 1 << 20, 3072),
            (1, 9216, 3072, 3072 + (1 << 20)),
            (1, 0, 3072, 6144 + (1 << 20)), // repeat of the first
        ];
        let p = plan(&reads, limits());
        assert_eq!(p.requests.len(), 2);
        let r1 = &p.requests[0];
        assert_eq!((r1.owner, r1.ranges.len(), r1.msgs.len()), (1, 2, 1));
        assert!(matches!(r1.msgs[0].land, Landing::Bounce { at: 0, .. }));
        assert_eq!(
            p.scatter,
            vec![(0, 0, 3072), (3072, 3072 + (1 << 20), 3072)]
        );
        let r2 = &p.requests[1];
        assert_eq!(
            r2.msgs,
            vec![Message {
                len: 1 << 20,
                land: Landing::Direct(3072)
            }]
        );
        assert_eq!(p.repeats, vec![(0, 6144 + (1 << 20), 3072)]);
    }

    #[test]
    fn plan_splits_at_the_chunk_and_the_window() {
        let l = Limits {
            chunk: 100_000,
            msgs_per_request: 2,
            name_len: 20,
        };
        // 350,000 contiguous bytes: 4 pieces, 2 messages per request, each straight into dst.
        let p = plan(&[(0, 0, 350_000, 0)], l);
        let lens: Vec<Vec<usize>> = p
            .requests
            .iter()
            .map(|r| r.msgs.iter().map(|m| m.len).collect())
            .collect();
        assert_eq!(lens, vec![vec![100_000, 100_000], vec![100_000, 50_000]]);
        assert!(p
            .requests
            .iter()
            .flat_map(|r| &r.msgs)
            .all(|m| matches!(m.land, Landing::Direct(_))));
        // Many small rows back to back in dst: one message, straight into dst.
        let reads: Vec<_> = (0..64)
            .map(|i| (0, 1000 * i as u64 * 3, 1000, 1000 * i))
            .collect();
        let p = plan(&reads, limits());
        assert_eq!(p.requests.len(), 1);
        assert_eq!(
            p.requests[0].msgs,
            vec![Message {
                len: 64_000,
                land: Landing::Direct(0)
            }]
        );
        assert_eq!(p.bounce_len, 0);
        // Too many ranges for one request: split, every range kept once.
        let reads: Vec<_> = (0..10_000)
            .map(|i| (0, 16 * i as u64, 8, 8 * (9_999 - i)))
            .collect();
        let p = plan(&reads, limits());
        assert!(p.requests.len() > 1);
        assert_eq!(
            p.requests.iter().map(|r| r.ranges.len()).sum::<usize>(),
            10_000
        );
        for r in &p.requests {
            assert!(request_bytes(20, r.msgs.len(), r.ranges.len()) <= MAX_REQUEST_BYTES);
            assert_eq!(
                r.msg_ranges.iter().map(|&n| n as usize).sum::<usize>(),
                r.ranges.len()
            );
        }
    }

    fn region(bytes: &[u8]) -> ddstore_core::region::Region {
        let r = ddstore_core::region::Region::anonymous(bytes.len().max(1)).unwrap();
        r.write_at(0, bytes).unwrap();
        r
    }

    /// Ends of rows of lengths `lens`, as an owner stores them.
    fn ends_of(lens: &[u64]) -> Vec<u8> {
        let mut end = 0;
        lens.iter()
            .flat_map(|l| {
                end += l;
                end.to_le_bytes()
            })
            .collect()
    }

    fn ragged_req(rows: Vec<u64>, n_msgs: u32, msg_bytes: u32) -> RaggedRequest {
        RaggedRequest {
            key: 11,
            n_msgs,
            part: RaggedPart {
                ends_key: 12,
                unit_bytes: 2,
                msg_bytes,
                rows,
            },
        }
    }

    #[test]
    fn ragged_requests_round_trip_and_reject_garbage() {
        let part = RaggedPart {
            ends_key: 0xbeef,
            unit_bytes: 12,
            msg_bytes: 4096,
            rows: vec![9, 0, 9, 3],
        };
        let ragged = |n_msgs: u32, part: &RaggedPart| RaggedRequest {
            key: 0xdead,
            n_msgs,
            part: part.clone(),
        };
        let mut buf = Vec::new();
        encode_ragged(&mut buf, &key(), &nonce(77), b"reader", &ragged(3, &part));
        assert_eq!(buf.len(), ragged_request_bytes(6, 4));
        let o = open(&buf, &key()).unwrap();
        assert_eq!(
            (o.nonce, o.reply_to.as_slice()),
            (nonce(77), &b"reader"[..])
        );
        assert_eq!(o.body, Ok(Body::Ragged(ragged(3, &part))));
        assert!(open(&buf[..buf.len() - 3], &key()).is_none());
        let refused = |n_msgs: u32, part: &RaggedPart| {
            let mut b = Vec::new();
            encode_ragged(&mut b, &key(), &nonce(1), b"r", &ragged(n_msgs, part));
            open(&b, &key()).unwrap().body
        };
        let mut zero = part.clone();
        zero.unit_bytes = 0;
        assert_eq!(refused(1, &zero), Err(Refusal::Malformed));
        assert_eq!(
            refused(MAX_RAGGED_MSGS as u32 + 1, &part),
            Err(Refusal::OverLimit)
        );
        assert_eq!(refused(0, &part), Err(Refusal::Malformed));
    }

    #[test]
    fn owners_answer_ragged_rows_or_refuse() {
        // Rows of 3, 0, 5 and 1 units of 2 bytes.
        let lens = [3u64, 0, 5, 1];
        let values: Vec<u8> = (0..18).collect();
        let (ends, vals) = (region(&ends_of(&lens)), region(&values));
        let stream = |msgs: Vec<Vec<u8>>| msgs.concat();
        // Rows 2, 1, 0, 3: lengths first, then values, in request order.
        let got = answer_ragged(
            &ragged_req(vec![2, 1, 0, 3], 1, 64),
            &ends,
            &vals,
            1 << 20,
            Vec::new(),
        )
        .unwrap();
        assert_eq!(got.len(), 1);
        let s = stream(got);
        let lens_back: Vec<u64> = s[..32]
            .chunks(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(lens_back, vec![5, 0, 3, 1]);
        let want: Vec<u8> = [&values[6..16], &values[0..6], &values[16..18]].concat();
        assert_eq!(&s[32..], &want[..]);
        assert_eq!(
            parse_ragged_reply(&s, 4, 2, 10).unwrap(),
            vec![(5, 32), (0, 42), (3, 42), (1, 48)]
        );
        // Cut into 3 messages of 20 bytes: 20, 20, 10 (50 bytes), or with room to spare.
        let got = answer_ragged(
            &ragged_req(vec![2, 1, 0, 3], 3, 20),
            &ends,
            &vals,
            1 << 20,
            Vec::new(),
        )
        .unwrap();
        assert_eq!(
            got.iter().map(Vec::len).collect::<Vec<_>>(),
            vec![20, 20, 10]
        );
        assert_eq!(stream(got), s);
        let got = answer_ragged(
            &ragged_req(vec![1], 4, 20),
            &ends,
            &vals,
            1 << 20,
            Vec::new(),
        )
        .unwrap();
        assert_eq!(
            got.iter().map(Vec::len).collect::<Vec<_>>(),
            vec![8, 0, 0, 0]
        );
        // Refusals: a row past the share, a reply larger than the receives, a
        // message over the owner's limit, an owner's own corrupt ends.
        let refuse = |req: RaggedRequest, ends: &dyn Memory| {
            answer_ragged(&req, ends, &vals, 64, vec![1, 2, 3])
        };
        assert_eq!(
            refuse(ragged_req(vec![4], 1, 64), &ends),
            Err(Refusal::OutOfRange)
        );
        assert_eq!(
            refuse(ragged_req(vec![u64::MAX], 1, 64), &ends),
            Err(Refusal::OutOfRange)
        );
        assert_eq!(
            refuse(ragged_req(vec![2, 2], 1, 30), &ends),
            Err(Refusal::TooLarge)
        );
        assert_eq!(
            refuse(ragged_req(vec![0], 1, 65), &ends),
            Err(Refusal::OverLimit)
        );
        // Repeated rows whose values exceed the share (readers send distinct rows).
        assert_eq!(
            refuse(ragged_req(vec![2; 3], 1, 64), &ends),
            Err(Refusal::Malformed)
        );
        let corrupt = region(&ends_of(&[3, 100]));
        assert_eq!(
            refuse(ragged_req(vec![1], 1, 64), &corrupt),
            Err(Refusal::OutOfRange)
        );
        let mut backwards = ends_of(&[3, 0]);
        backwards[8..16].copy_from_slice(&1u64.to_le_bytes());
        assert_eq!(
            refuse(ragged_req(vec![1], 1, 64), &region(&backwards)),
            Err(Refusal::OutOfRange)
        );
        assert_eq!(
            refuse(ragged_req(vec![0], 1, 64), &region(&[1, 2, 3])),
            Err(Refusal::Malformed)
        );
    }

    #[test]
    fn ragged_replies_are_checked_by_the_reader() {
        let mut s = 2u64.to_le_bytes().to_vec();
        s.extend_from_slice(&[1, 2, 3, 4]);
        assert_eq!(parse_ragged_reply(&s, 1, 2, 4).unwrap(), vec![(2, 8)]);
        assert!(parse_ragged_reply(&s, 1, 2, 3).is_err()); // longer than the owner's longest row
        assert!(parse_ragged_reply(&s[..10], 1, 2, 4).is_err()); // bytes missing
        assert!(parse_ragged_reply(&s[..4], 1, 2, 4).is_err()); // lengths missing
        s.push(9);
        assert!(parse_ragged_reply(&s, 1, 2, 4).is_err()); // a byte too many
        let huge = u64::MAX.to_le_bytes();
        assert!(parse_ragged_reply(&huge, 1, 2, u64::MAX).is_err());
    }

    #[test]
    fn ragged_plans_bound_each_request() {
        let rows: Vec<u64> = (0..1000).collect();
        let owners = [
            RaggedOwner {
                owner: 1,
                ends_key: 4,
                rows: &rows,
                max_row_bytes: 992,
                share_bytes: 1 << 30,
            },
            RaggedOwner {
                owner: 2,
                ends_key: 5,
                rows: &rows[..3],
                max_row_bytes: 1 << 20,
                share_bytes: 100, // the share bounds the reply better than its longest row
            },
        ];
        let l = Limits {
            chunk: 64 << 10,
            msgs_per_request: 3,
            name_len: 20,
        };
        let (plan, slots, staging) = plan_ragged(&owners, 4, l).unwrap();
        assert_eq!(plan.requests.len(), slots.len());
        let mut at = 0;
        let mut covered = vec![0; 2];
        for (req, slot) in plan.requests.iter().zip(&slots) {
            let part = req.ragged.as_ref().unwrap();
            let n = slot.rows.1 - slot.rows.0;
            assert_eq!(part.rows.len(), n);
            assert_eq!(slot.at, at);
            assert!(req.msgs.len() <= 3 && ragged_request_bytes(20, n) <= MAX_REQUEST_BYTES);
            let bound = (n as u64 * (owners[slot.owner_index].max_row_bytes + 8))
                .min(owners[slot.owner_index].share_bytes + 8 * n as u64);
            let posted: usize = req.msgs.iter().map(|m| m.len).sum();
            assert!(posted as u64 >= bound && posted == slot.len);
            for (i, m) in req.msgs.iter().enumerate() {
                assert_eq!(m.land, Landing::Direct(at + i * part.msg_bytes as usize));
                assert!(m.len <= 64 << 10);
            }
            covered[slot.owner_index] += n;
            at += slot.len;
        }
        assert_eq!(at, staging);
        assert_eq!(covered, vec![1000, 3]);
        assert_eq!(slots.last().unwrap().len, 124); // 100 bytes + 3 lengths
                                                    // A single row that cannot fit one request's receives: not planned.
        let too_long = [RaggedOwner {
            max_row_bytes: 1 << 30,
            share_bytes: 1 << 31,
            ..owners.into_iter().next().unwrap()
        }];
        assert!(plan_ragged(&too_long, 4, l).is_none());
    }
}
