//! What a reader checks in the replies it received: a refusal or a short
//! reply as an error naming the owner; a ragged reply stream parsed into its
//! rows, every length checked against the bytes and the owner's longest row.

use super::plan::{Plan, RaggedOwner, RaggedSlot};
use super::wire::{Refusal, END_BYTES};
use crate::error::{FabricError, RefusedFor};

/// Per owner of a ragged gather, per row: (units, offset in `data`), from
/// the replies the planned `slots` received (`got`, per message) into `data`;
/// each reply stream is checked against its rows.
pub(crate) fn ragged_rows(
    owners: &[RaggedOwner<'_>],
    unit_bytes: usize,
    plan: &Plan,
    slots: &[RaggedSlot],
    got: &[usize],
    data: &[u8],
) -> ddstore_core::Result<Vec<Vec<(u64, usize)>>> {
    let mut rows: Vec<Vec<(u64, usize)>> = owners
        .iter()
        .map(|o| Vec::with_capacity(o.rows.len()))
        .collect();
    let mut first_msg = 0;
    for (req, slot) in plan.requests.iter().zip(slots) {
        let m = req.msgs.first().map_or(0, |x| x.len);
        let gots = &got[first_msg..first_msg + req.msgs.len()];
        first_msg += req.msgs.len();
        // Full messages, then at most one short one, then empty ones.
        let full = gots.iter().take_while(|&&g| g == m).count();
        let tail_ok = gots[full..].iter().skip(1).all(|&g| g == 0);
        let stream_len: usize = gots.iter().sum();
        let parsed = if tail_ok {
            parse_ragged_reply(
                &data[slot.at..slot.at + stream_len],
                slot.rows.1 - slot.rows.0,
                unit_bytes,
                owners[slot.owner_index].max_row_bytes,
            )
        } else {
            Err(format!(
                "ragged reply messages of {gots:?} bytes leave a gap"
            ))
        };
        let parsed = parsed
            .map_err(|e| ddstore_core::Error::Transport(format!("rank {}: {e}", req.owner)))?;
        rows[slot.owner_index].extend(parsed.into_iter().map(|(u, off)| (u, slot.at + off)));
    }
    Ok(rows)
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
}
