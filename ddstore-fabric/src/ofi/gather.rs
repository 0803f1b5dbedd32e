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
//! Tags: requests carry [`REQUEST_TAG`]; a reply carries [`REPLY_BIT`], a
//! status (0 = data, else a [`Refusal`] and no payload), the request's
//! 20-bit sequence number and the message's index in the request.

use crate::error::{FabricError, RefusedFor};

/// The tag of every request (owners receive exactly this tag).
pub const REQUEST_TAG: u64 = 1 << 58;
/// Set in every reply's tag.
pub const REPLY_BIT: u64 = 1 << 59;
const STATUS_SHIFT: u32 = 52;
/// The status bits of a reply tag; readers post receives ignoring them.
pub const STATUS_MASK: u64 = 0x3f << STATUS_SHIFT;
const SEQ_SHIFT: u32 = 32;
/// Sequence numbers wrap at 20 bits.
pub const SEQ_MASK: u32 = 0x000f_ffff;

/// Longest request (about 1,000 ranges); owners post receives of this size.
pub const MAX_REQUEST_BYTES: usize = 16 << 10;
/// Ranges of at least this many bytes get a message of their own, which
/// lands straight in the destination (no bounce copy for large rows).
pub const DIRECT_MIN: usize = 64 << 10;
/// Longest packed (bounce) message: bounds what an owner copies per message.
pub const MAX_PACKED_BYTES: usize = 4 << 20;

const MAGIC: u32 = u32::from_le_bytes(*b"DDG1");
const HEADER_BYTES: usize = 4 + 4 + 8 + 4 + 4 + 2;
const RANGE_BYTES: usize = 16;

/// Why an owner refused a request (the status of its one reply).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The key names no share this owner exposes (freed, or never issued).
    UnknownKey = 1,
    /// A range lies outside the share.
    OutOfRange = 2,
    /// The request could not be parsed, or a message exceeds the owner's limit.
    Malformed = 3,
    /// The owner could not address a reply to this reader.
    NoRoute = 4,
}

impl Refusal {
    fn from_status(s: u64) -> Option<Refusal> {
        Some(match s {
            1 => Refusal::UnknownKey,
            2 => Refusal::OutOfRange,
            3 => Refusal::Malformed,
            4 => Refusal::NoRoute,
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
            None => "an unknown status",
        }
    }
}

/// The tag of reply message `index` of request `seq`, with `status`.
pub fn reply_tag(seq: u32, index: u32, status: u64) -> u64 {
    REPLY_BIT | (status << STATUS_SHIFT) | (((seq & SEQ_MASK) as u64) << SEQ_SHIFT) | index as u64
}

/// The status bits of a reply tag (0: data).
pub fn reply_status(tag: u64) -> u64 {
    (tag & STATUS_MASK) >> STATUS_SHIFT
}

/// A request as the owner reads it.
#[derive(Debug, PartialEq, Eq)]
pub struct Request {
    pub seq: u32,
    pub key: u64,
    /// Where replies go: the reader endpoint's name.
    pub reply_to: Vec<u8>,
    /// Ranges per reply message, in message order.
    pub msg_ranges: Vec<u32>,
    /// (offset, len) in the share.
    pub ranges: Vec<(u64, u64)>,
}

/// Encodes a request into `out` (cleared first).
pub fn encode(
    out: &mut Vec<u8>,
    seq: u32,
    key: u64,
    reply_to: &[u8],
    msg_ranges: &[u32],
    ranges: &[(u64, u64)],
) {
    out.clear();
    out.extend_from_slice(&MAGIC.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&key.to_le_bytes());
    out.extend_from_slice(&(msg_ranges.len() as u32).to_le_bytes());
    out.extend_from_slice(&(ranges.len() as u32).to_le_bytes());
    out.extend_from_slice(&(reply_to.len() as u16).to_le_bytes());
    out.extend_from_slice(reply_to);
    for n in msg_ranges {
        out.extend_from_slice(&n.to_le_bytes());
    }
    for (off, len) in ranges {
        out.extend_from_slice(&off.to_le_bytes());
        out.extend_from_slice(&len.to_le_bytes());
    }
}

/// Bytes a request of `n_msgs` messages and `n_ranges` ranges takes.
pub fn request_bytes(name_len: usize, n_msgs: usize, n_ranges: usize) -> usize {
    HEADER_BYTES + name_len + 4 * n_msgs + RANGE_BYTES * n_ranges
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

/// Parses a request; `None` when it is malformed (its sequence number, when
/// readable, comes back so the refusal reaches the right receive).
pub fn decode(bytes: &[u8]) -> Result<Request, Option<u32>> {
    let mut c = Cursor(bytes);
    let magic = c.u32().ok_or(None)?;
    let seq = c.u32().ok_or(None)?;
    if magic != MAGIC {
        return Err(None);
    }
    let bad = Some(seq);
    let key = c.u64().ok_or(bad)?;
    let n_msgs = c.u32().ok_or(bad)? as usize;
    let n_ranges = c.u32().ok_or(bad)? as usize;
    let name_len = c.u16().ok_or(bad)? as usize;
    if bytes.len() != request_bytes(name_len, n_msgs, n_ranges) || n_msgs == 0 {
        return Err(bad);
    }
    let reply_to = c.take(name_len).ok_or(bad)?.to_vec();
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
        seq,
        key,
        reply_to,
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
    let chunk = limits.chunk.max(1);
    let packed_max = chunk.min(MAX_PACKED_BYTES);
    let per_request = limits.msgs_per_request.max(1);
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
        for (i, &(offset, n, dst)) in list.iter().enumerate() {
            let small = n < DIRECT_MIN;
            let joins = match &open {
                Some(o) => {
                    o.small
                        && small
                        && o.bytes + n <= packed_max
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
                    || request_bytes(limits.name_len, req.msgs.len() + 1, req.ranges.len() + 1)
                        > MAX_REQUEST_BYTES;
                if full {
                    let next = RequestPlan {
                        owner,
                        ..Default::default()
                    };
                    out.requests.push(std::mem::replace(&mut req, next));
                }
                open = Some(Open {
                    first: i,
                    bytes: n,
                    contiguous: true,
                    small,
                });
            }
            req.ranges.push((offset, n as u64));
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

/// Checks a request against the share it names (`share_len` bytes) and the
/// owner's longest message: every range inside, every message within limits.
pub fn check_request(req: &Request, share_len: u64, max_msg: usize) -> Result<(), Refusal> {
    let mut next = 0usize;
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
        if bytes > max_msg as u64 {
            return Err(Refusal::Malformed);
        }
        next = end;
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

    #[test]
    fn requests_round_trip_and_reject_garbage() {
        let mut buf = Vec::new();
        encode(
            &mut buf,
            7,
            0xdead,
            b"reader",
            &[2, 1],
            &[(0, 8), (64, 8), (512, 3)],
        );
        let req = decode(&buf).unwrap();
        assert_eq!(req.seq, 7);
        assert_eq!(req.key, 0xdead);
        assert_eq!(req.reply_to, b"reader");
        assert_eq!(req.msg_ranges, vec![2, 1]);
        assert_eq!(req.ranges, vec![(0, 8), (64, 8), (512, 3)]);
        assert!(decode(&buf[..buf.len() - 1]).is_err());
        assert!(decode(b"junk").is_err());
        let mut bad = Vec::new();
        encode(&mut bad, 1, 2, b"r", &[3], &[(0, 8)]); // counts do not add up
        assert!(decode(&bad).is_err());
        assert_eq!(check_request(&req, 515, 1 << 20), Ok(()));
        assert_eq!(check_request(&req, 514, 1 << 20), Err(Refusal::OutOfRange));
        assert_eq!(check_request(&req, 515, 15), Err(Refusal::Malformed));
        let huge = Request {
            ranges: vec![(u64::MAX - 1, 8)],
            msg_ranges: vec![1],
            ..req
        };
        assert_eq!(
            check_request(&huge, u64::MAX, 1 << 20),
            Err(Refusal::OutOfRange)
        );
    }

    #[test]
    fn tags_carry_status_seq_and_index() {
        let t = reply_tag(SEQ_MASK + 5, 9, 0);
        assert_eq!(t & STATUS_MASK, 0);
        assert_eq!(reply_status(reply_tag(3, 0, Refusal::UnknownKey as u64)), 1);
        assert_ne!(reply_tag(1, 0, 0), reply_tag(2, 0, 0));
        assert_ne!(REQUEST_TAG & REPLY_BIT, REPLY_BIT);
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
}
