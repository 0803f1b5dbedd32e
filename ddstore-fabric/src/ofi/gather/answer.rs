//! What an owner answers gather requests with (safe code): the shares it
//! serves by memory key, the job's request key, and the replies to an
//! authenticated request, every range checked against the share it names
//! and the owner's bounds before anything is read.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use ddstore_core::memory::Memory;

use super::wire::{
    Body, MacKey, RaggedRequest, Refusal, Request, END_BYTES, MAX_PACKED_BYTES, MAX_REPLY_BYTES,
};

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

/// The job's request key, set once the job's secret is known, and what the
/// owner dropped for want of it.
#[derive(Default)]
pub struct Access {
    key: Mutex<Option<MacKey>>,
    /// Requests dropped unanswered: no valid MAC, a reply address unlike
    /// ours, or beyond a reader's backlog.
    pub rejected_requests: AtomicU64,
    /// Requests answered "busy" (their readers send them again).
    pub busy_replies: AtomicU64,
}

impl Access {
    /// Sets (or replaces) the key requests must be MACed under.
    pub fn set_key(&self, key: MacKey) {
        *self.key.lock().unwrap_or_else(|p| p.into_inner()) = Some(key);
    }
    /// The key, if set.
    pub fn key(&self) -> Option<MacKey> {
        self.key.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// The body of one reply message.
pub enum ReplyBody {
    /// A refusal: no bytes (the status is in the tag, the nonce in the CQ data).
    Empty,
    /// Ranges of a share, after `head`, sent straight from them when they
    /// fit one send's iov limit, else packed into one buffer when the reply
    /// is sent (so a queued reply holds no copy of them).
    Ranges {
        /// Bytes sent before the ranges (a ragged reply's row lengths).
        head: Vec<u8>,
        /// The share the request's key named.
        share: Arc<dyn Memory>,
        /// (offset, len) in the share, checked inside it.
        ranges: Vec<(u64, u64)>,
    },
    /// Bytes built for a reply message (a packed reply the provider did
    /// not take yet keeps its buffer).
    Packed(Vec<u8>),
}

/// What an owner's replies respect.
#[derive(Clone, Copy)]
pub struct Bounds {
    /// The provider's longest message.
    pub max_msg: usize,
    /// Ranges one send takes (more are packed).
    pub zero_copy_ranges: usize,
}

/// The replies to an authenticated request's body: (status 0, body) per
/// message, or one refusal (its status, an empty body).
pub fn answer(
    shares: &ServedShares,
    body: Result<Body, Refusal>,
    bounds: Bounds,
) -> Vec<(u64, ReplyBody)> {
    let replies = match body {
        Ok(Body::Plain(req)) => answer_plain(shares, req, bounds),
        Ok(Body::Ragged(req)) => ragged_replies(shares, req, bounds),
        Err(r) => Err(r),
    };
    replies.unwrap_or_else(|r| vec![(r as u64, ReplyBody::Empty)])
}

/// The replies of a plain request: (status 0, body) per message.
fn answer_plain(
    shares: &ServedShares,
    req: Request,
    bounds: Bounds,
) -> Result<Vec<(u64, ReplyBody)>, Refusal> {
    let share = shares.get(req.key).ok_or(Refusal::UnknownKey)?;
    check_request(
        &req,
        share.len() as u64,
        bounds.max_msg,
        bounds.zero_copy_ranges,
    )?;
    let mut next = 0usize;
    let mut out = Vec::with_capacity(req.msg_ranges.len());
    for &n in &req.msg_ranges {
        let ranges = req.ranges[next..next + n as usize].to_vec();
        next += n as usize;
        out.push((
            0,
            ReplyBody::Ranges {
                head: Vec::new(),
                share: share.clone(),
                ranges,
            },
        ));
    }
    Ok(out)
}

/// The replies of a ragged request: its messages, each the row lengths and
/// values ranges it carries, packed only when it is sent.
fn ragged_replies(
    shares: &ServedShares,
    req: RaggedRequest,
    bounds: Bounds,
) -> Result<Vec<(u64, ReplyBody)>, Refusal> {
    let values = shares.get(req.key).ok_or(Refusal::UnknownKey)?;
    let ends = shares.get(req.part.ends_key).ok_or(Refusal::UnknownKey)?;
    let msgs = ragged_messages(&req, ends.as_ref(), values.len() as u64, bounds.max_msg)?;
    Ok(msgs
        .into_iter()
        .map(|(head, ranges)| {
            let body = if head.is_empty() && ranges.is_empty() {
                ReplyBody::Empty
            } else {
                ReplyBody::Ranges {
                    head,
                    share: values.clone(),
                    ranges,
                }
            };
            (0, body)
        })
        .collect())
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

/// One ragged reply message: the row lengths it carries (bytes), then
/// (offset, len) ranges of the values share.
pub type RaggedMessage = (Vec<u8>, Vec<(u64, u64)>);

/// The owner's answer to a ragged request: its reply messages (`n_msgs` of
/// them, each at most `msg_bytes`), or why it is refused. `ends` is the
/// owner's row-ends share the request named, `values_len` the length of its
/// values share; every row and every range is checked against them, and
/// the stream must fit the receives the reader posted (at most `max_msg`
/// bytes each). The stream, cut into the messages: the rows' lengths in
/// units (one little-endian u64 each, in request order), then their values
/// back to back.
pub fn ragged_messages(
    req: &RaggedRequest,
    ends: &dyn Memory,
    values_len: u64,
    max_msg: usize,
) -> Result<Vec<RaggedMessage>, Refusal> {
    let part = &req.part;
    let m = part.msg_bytes as u64;
    if !ends.len().is_multiple_of(END_BYTES) {
        return Err(Refusal::Malformed);
    }
    let capacity = m * req.n_msgs as u64;
    if m > max_msg.min(MAX_PACKED_BYTES) as u64 || capacity > MAX_REPLY_BYTES {
        return Err(Refusal::OverLimit);
    }
    let n_rows = (ends.len() / END_BYTES) as u64;
    let ub = part.unit_bytes as u64;
    // Each row's length in units and byte range, from its end and its predecessor's.
    let mut lens = Vec::with_capacity(END_BYTES * part.rows.len());
    let mut spans = Vec::with_capacity(part.rows.len());
    let heads = (END_BYTES * part.rows.len()) as u64;
    let mut total = heads;
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
            .filter(|&(s, e)| s <= e && e <= values_len)
            .ok_or(Refusal::OutOfRange)?;
        total = total.saturating_add(range.1 - range.0);
        lens.extend_from_slice(&(end - start).to_le_bytes());
        spans.push((range.0, range.1 - range.0));
    }
    if total > capacity {
        return Err(Refusal::TooLarge);
    }
    // Readers ask for distinct rows, whose values fit in the share.
    if total - heads > values_len {
        return Err(Refusal::Malformed);
    }
    // Cut the stream into the posted messages: message i carries stream
    // bytes [i m, (i + 1) m); the values' spans start after the lengths.
    let mut msgs = Vec::with_capacity(req.n_msgs as usize);
    let mut spans = spans.into_iter().filter(|s| s.1 > 0).peekable();
    let mut at = heads; // stream offset of the next span's first byte not yet placed
    let mut skip = 0; // bytes of that span already placed
    for i in 0..req.n_msgs as u64 {
        let (start, end) = ((i * m).min(total), ((i + 1) * m).min(total));
        let head = lens[start.min(heads) as usize..end.min(heads) as usize].to_vec();
        let mut ranges = Vec::new();
        while let Some(&(off, len)) = spans.peek() {
            let from = at.max(start);
            if from >= end {
                break;
            }
            let take = (len - skip).min(end - from);
            ranges.push((off + skip, take));
            skip += take;
            at += take;
            if skip == len {
                spans.next();
                skip = 0;
            }
        }
        msgs.push((head, ranges));
    }
    Ok(msgs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ofi::gather::replies::parse_ragged_reply;
    use crate::ofi::gather::wire::RaggedPart;

    #[test]
    fn owners_check_requests_against_the_share_and_their_bounds() {
        let back = Request {
            key: 0xdead,
            msg_ranges: vec![2, 1],
            ranges: vec![(0, 8), (64, 8), (512, 3)],
        };
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
    /// The messages of a ragged reply, packed as an owner sends them.
    fn answer_ragged(
        req: &RaggedRequest,
        ends: &dyn Memory,
        values: &dyn Memory,
        max_msg: usize,
        _spare: Vec<u8>,
    ) -> Result<Vec<Vec<u8>>, Refusal> {
        let msgs = ragged_messages(req, ends, values.len() as u64, max_msg)?;
        Ok(msgs
            .into_iter()
            .map(|(head, ranges)| {
                let mut b = head;
                for (off, len) in ranges {
                    let mut part = vec![0; len as usize];
                    values.read_at(off as usize, &mut part).unwrap();
                    b.extend(part);
                }
                b
            })
            .collect())
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
}
