//! How a reader cuts a batch into gather requests and reply messages, and
//! where each message lands (safe code).

use std::collections::hash_map::Entry;

use ddstore_core::row_map::RowMap;

use super::wire::{
    ragged_request_bytes, request_bytes, RaggedPart, DIRECT_MIN, END_BYTES, MAX_MSGS_PER_REQUEST,
    MAX_PACKED_BYTES, MAX_RAGGED_MSGS, MAX_REPLY_BYTES, MAX_REQUEST_BYTES,
};

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

/// Reads a [`PlanScratch`] keeps room for between plans (a larger batch's
/// maps are freed after it).
const SCRATCH_KEPT: usize = 1 << 14;

/// Owners a [`PlanScratch`] keeps a list for between plans: a reader that
/// has read from more (a global shuffle over thousands of ranks) starts
/// afresh, so its kept memory does not grow with the job's size.
const SCRATCH_OWNERS: usize = 256;

/// What [`plan_with`] builds a plan with, kept by a reader so that its
/// maps and lists are allocated once, not per batch.
#[derive(Default)]
pub struct PlanScratch {
    /// Owners, in first-seen order.
    owners: Vec<usize>,
    /// Per owner: its unique (offset, len, dst_offset) pieces (emptied per plan).
    pieces: RowMap<usize, Vec<(u64, usize, usize)>>,
    /// Per (owner, offset, len) read: where it first lands.
    seen: RowMap<(usize, u64, usize), usize>,
}

/// Plans `reads` (owner, offset, len, dst_offset), all of them to owners
/// that serve the gather path: per owner, in order, exact repeats once,
/// ranges longer than `chunk` split, small ranges packed; with the maps and
/// lists of `scratch`.
pub fn plan_with(
    reads: &[(usize, u64, usize, usize)],
    limits: Limits,
    scratch: &mut PlanScratch,
) -> Plan {
    let chunk = limits.chunk.clamp(1, MAX_REPLY_BYTES as usize);
    let packed_max = chunk.min(MAX_PACKED_BYTES);
    let per_request = limits.msgs_per_request.clamp(1, MAX_MSGS_PER_REQUEST);
    let mut out = Plan::default();
    let PlanScratch {
        owners,
        pieces,
        seen,
    } = scratch;
    owners.clear();
    seen.clear();
    for list in pieces.values_mut() {
        list.clear();
    }
    for &(owner, offset, len, dst) in reads.iter().filter(|r| r.2 > 0) {
        match seen.entry((owner, offset, len)) {
            Entry::Occupied(first) => {
                out.repeats.push((*first.get(), dst, len));
                continue;
            }
            Entry::Vacant(v) => {
                v.insert(dst);
            }
        }
        let list = pieces.entry(owner).or_default();
        if list.is_empty() {
            owners.push(owner);
        }
        let mut done = 0;
        while done < len {
            let n = chunk.min(len - done);
            list.push((offset + done as u64, n, dst + done));
            done += n;
        }
    }
    for &owner in owners.iter() {
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
    if seen.capacity() > SCRATCH_KEPT || pieces.len() > SCRATCH_OWNERS {
        *scratch = PlanScratch::default();
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A plan with a scratch of its own.
    fn plan(reads: &[(usize, u64, usize, usize)], limits: Limits) -> Plan {
        plan_with(reads, limits, &mut PlanScratch::default())
    }

    fn limits() -> Limits {
        Limits {
            chunk: 1 << 20,
            msgs_per_request: 63,
            name_len: 20,
        }
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
    fn a_reused_scratch_plans_as_a_fresh_one() {
        let mut scratch = PlanScratch::default();
        // Owners 1 and 2 with a repeat, then owner 2 alone (owner 1's
        // pieces must not leak into it), then a batch past SCRATCH_KEPT,
        // then batches over more owners than SCRATCH_OWNERS.
        let first = [
            (1, 0, 3072, 0),
            (2, 6144, 3072, 3072),
            (1, 0, 3072, 6144),
            (1, 9216, 3072, 9216),
        ];
        let second = [(2, 0, 3072, 3072), (2, 3072, 3072, 0)];
        let large: Vec<_> = (0..SCRATCH_KEPT as u64 * 2)
            .map(|i| (3, 16 * i, 8, 8 * i as usize))
            .collect();
        let many_owners: Vec<_> = (0..SCRATCH_OWNERS * 2)
            .map(|o| (o + 4, 0, 8, 8 * o))
            .collect();
        for reads in [
            &first[..],
            &second[..],
            &large[..],
            &first[..],
            &many_owners[..],
        ] {
            assert_eq!(
                plan_with(reads, limits(), &mut scratch),
                plan(reads, limits())
            );
        }
        assert!(scratch.seen.capacity() <= SCRATCH_KEPT);
        assert!(scratch.pieces.len() <= SCRATCH_OWNERS);
        // A scratch kept across batches of different owners keeps at most
        // SCRATCH_OWNERS lists, however many owners it has read from.
        for o in 0..SCRATCH_OWNERS * 3 {
            let one = [(o, 0, 8, 0)];
            assert_eq!(
                plan_with(&one, limits(), &mut scratch),
                plan(&one, limits())
            );
            assert!(scratch.pieces.len() <= SCRATCH_OWNERS);
        }
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
