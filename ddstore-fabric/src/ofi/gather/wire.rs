//! The gather path's wire format: request and reply tags, nonces, the
//! request MAC, and the encoding of plain and ragged requests (safe code).
//! See [`super`] for the protocol.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{FabricError, FabricResult};

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
/// Bytes of nonce every reply message carries as its remote CQ data.
pub const REPLY_DATA_BYTES: usize = 8;
/// Bytes of the MAC that ends every request.
pub const MAC_BYTES: usize = 32;

const MAGIC: u32 = u32::from_le_bytes(*b"DDG3");
const RAGGED_MAGIC: u32 = u32::from_le_bytes(*b"DDR3");
/// Magic, nonce, request id and the reply address's length: what precedes
/// the address.
const HEAD_BYTES: usize = 4 + NONCE_BYTES + 8 + 2;
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

    /// The remote CQ data every reply message to it carries (the 64 bits
    /// its tag does not hold).
    pub fn reply_data(&self) -> u64 {
        u64::from_le_bytes(self.0[8..].try_into().unwrap())
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
    /// Not served now (the owner serves its cap of readers, or this
    /// reader's queue is full): the reader sends the request again later.
    Busy = 7,
}

impl Refusal {
    pub(crate) fn from_status(s: u64) -> Option<Refusal> {
        Some(match s {
            1 => Refusal::UnknownKey,
            2 => Refusal::OutOfRange,
            3 => Refusal::Malformed,
            4 => Refusal::NoRoute,
            5 => Refusal::TooLarge,
            6 => Refusal::OverLimit,
            7 => Refusal::Busy,
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
            Some(Refusal::Busy) => "it was busy serving other readers",
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

/// An authenticated request: its nonce, id, where its replies go, and its
/// body (`Err` when the body is malformed: the sender is refused).
#[derive(Debug, PartialEq, Eq)]
pub struct Opened {
    /// The request's nonce (in every reply).
    pub nonce: Nonce,
    /// Its id: the reader's clock in microseconds when it was sent, strictly
    /// increasing per process ([`next_request_id`]); owners admit each
    /// reader's ids once ([`SeenRequests`]).
    pub id: u64,
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

/// Starts a request into `out` (cleared first): magic, nonce, a fresh
/// request id, reply address.
fn begin(out: &mut Vec<u8>, magic: u32, nonce: &Nonce, reply_to: &[u8]) {
    begin_with_id(out, magic, nonce, next_request_id(), reply_to);
}

fn begin_with_id(out: &mut Vec<u8>, magic: u32, nonce: &Nonce, id: u64, reply_to: &[u8]) {
    out.clear();
    out.extend_from_slice(&magic.to_le_bytes());
    out.extend_from_slice(&nonce.0);
    out.extend_from_slice(&id.to_le_bytes());
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
    let id = c.u64()?;
    let name_len = c.u16()? as usize;
    let reply_to = c.take(name_len)?.to_vec();
    let body = match magic {
        MAGIC => decode_plain(c.0).map(Body::Plain),
        RAGGED_MAGIC => decode_ragged(c.0).map(Body::Ragged),
        _ => Err(Refusal::Malformed),
    };
    Some(Opened {
        nonce,
        id,
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

// ---------------------------------------------------------------------------
// Replays. A request captured on the wire (or sent again by a token holder)
// would make its owner send the same replies to its reader again. Each
// request carries an id, the reader's wall clock in microseconds, strictly
// increasing in the process, under the MAC; an owner admits each reply
// address's ids once: above the highest seen, or within the REPLAY_SLACK ids
// below it not seen yet (requests of one reader may overtake each other). A
// reply address it does not know (first contact, or forgotten after a
// window of silence) is admitted only with an id inside the window of the
// owner's clock and above any it forgot early: a replay is refused by the
// address's record or, once that is forgotten, by its age. Readers' and
// owners' clocks may differ by up to the window at first contact.

/// Ids below a reply address's highest that are tracked (older ones are refused).
const REPLAY_SLACK: u64 = 128;

/// A fresh request id: the wall clock in microseconds, strictly increasing
/// in this process.
pub fn next_request_id() -> u64 {
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = now_us();
    let prev = LAST
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |last| {
            Some(now.max(last + 1))
        })
        .unwrap_or_else(|p| p);
    now.max(prev + 1)
}

/// The wall clock in microseconds since the Unix epoch.
pub fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// One reply address's ids seen: the highest, and which of the
/// [`REPLAY_SLACK`] below it (bit i: `highest - i`).
struct Seen {
    highest: u64,
    bits: u128,
}

/// The request ids an owner admitted, per reply address (see above).
pub struct SeenRequests {
    window_us: u64,
    capacity: usize,
    by_name: HashMap<Vec<u8>, Seen>,
    /// Ids at or below this are refused from unknown addresses (raised
    /// when records are dropped before their window ends).
    floor: u64,
    last_prune_us: u64,
}

impl SeenRequests {
    /// Remembers up to `capacity` reply addresses, each for `window` after
    /// its last request.
    pub fn new(window: std::time::Duration, capacity: usize) -> SeenRequests {
        SeenRequests {
            window_us: window.as_micros() as u64,
            capacity: capacity.max(2),
            by_name: HashMap::new(),
            floor: 0,
            last_prune_us: 0,
        }
    }

    /// Whether request `id` from `name` is admitted at `now_us` (the
    /// owner's clock); records it if so.
    pub fn admit(&mut self, name: &[u8], id: u64, now_us: u64) -> bool {
        if now_us.saturating_sub(self.last_prune_us) > self.window_us / 4 {
            self.prune(now_us);
        }
        if let Some(s) = self.by_name.get_mut(name) {
            if id > s.highest {
                let shift = id - s.highest;
                s.bits = if shift >= REPLAY_SLACK {
                    1
                } else {
                    (s.bits << shift) | 1
                };
                s.highest = id;
                return true;
            }
            let back = s.highest - id;
            if back >= REPLAY_SLACK || s.bits & (1 << back) != 0 {
                return false;
            }
            s.bits |= 1 << back;
            return true;
        }
        if id.saturating_add(self.window_us) < now_us || id <= self.floor {
            return false;
        }
        if self.by_name.len() >= self.capacity {
            self.prune(now_us);
        }
        if self.by_name.len() >= self.capacity {
            self.forget_older_half();
        }
        self.by_name.insert(
            name.to_vec(),
            Seen {
                highest: id,
                bits: 1,
            },
        );
        true
    }

    /// Forgets addresses silent for the window: their ids are refused by age now.
    fn prune(&mut self, now_us: u64) {
        let window = self.window_us;
        self.by_name
            .retain(|_, s| s.highest.saturating_add(window) >= now_us);
        self.last_prune_us = now_us;
    }

    /// Forgets the half of the addresses with the oldest ids, refusing
    /// their ids (and any older) from unknown addresses from now on.
    fn forget_older_half(&mut self) {
        let mut highest: Vec<u64> = self.by_name.values().map(|s| s.highest).collect();
        let mid = highest.len() / 2;
        let (_, median, _) = highest.select_nth_unstable(mid);
        let median = *median;
        self.floor = self.floor.max(median);
        self.by_name.retain(|_, s| s.highest > median);
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
// (nothing but their CQ data).

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

/// Bytes of one row end in a ragged variable's ends share (and of one row
/// length in a ragged reply stream).
pub const END_BYTES: usize = 8;

#[cfg(test)]
mod tests {
    use super::*;

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
    }

    #[test]
    fn each_request_id_is_admitted_once_per_reader() {
        let window = std::time::Duration::from_secs(60);
        let w = 60_000_000u64;
        let now = 1_000 * w;
        let mut seen = SeenRequests::new(window, 4);
        // Ids increase per process, even within one microsecond.
        let (a, b) = (next_request_id(), next_request_id());
        assert!(b > a && a.abs_diff(now_us()) < w);
        // An id once; reordered ids within the slack once each.
        assert!(seen.admit(b"r1", now, now));
        assert!(!seen.admit(b"r1", now, now));
        assert!(seen.admit(b"r1", now + 5, now));
        assert!(seen.admit(b"r1", now + 2, now));
        assert!(!seen.admit(b"r1", now + 2, now));
        assert!(!seen.admit(b"r1", now + 5, now));
        assert!(!seen.admit(b"r1", now + 5 - REPLAY_SLACK, now));
        // The same id from another reader is its own; stale ids from an
        // unknown reader are refused (clock skew up to the window is not).
        assert!(seen.admit(b"r2", now, now));
        assert!(seen.admit(b"r3", now - w + 1, now));
        assert!(!seen.admit(b"r4", now - w - 1, now));
        assert!(seen.admit(b"r4", now + w, now));
        // Forgotten after a window of silence: old ids are refused by age.
        let later = now + 2 * w + 1;
        assert!(!seen.admit(b"r1", now + 5, later));
        assert!(seen.admit(b"r1", later, later));
        // Full: the older half is forgotten and its ids refused from then on.
        for (i, name) in [b"a", b"b", b"c", b"d", b"e"].iter().enumerate() {
            assert!(seen.admit(*name, later + 10 + i as u64, later));
        }
        assert!(seen.by_name.len() <= 4 && seen.floor >= later);
        assert!(!seen.admit(b"r1", later, later));
        // Over the wire: the id is under the MAC and comes back out.
        let mut buf = Vec::new();
        let req = Request {
            key: 1,
            msg_ranges: vec![1],
            ranges: vec![(0, 8)],
        };
        encode(&mut buf, &key(), &nonce(3), b"r", &req);
        let first = open(&buf, &key()).unwrap().id;
        encode(&mut buf, &key(), &nonce(3), b"r", &req);
        assert!(open(&buf, &key()).unwrap().id > first);
        buf[4 + NONCE_BYTES] ^= 1;
        assert!(open(&buf, &key()).is_none());
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
}
