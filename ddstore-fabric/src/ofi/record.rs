//! The per-rank share descriptor exchanged by allgather and published for
//! other jobs (method 2): magic, format version, then JSON.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::{FabricError, FabricResult};

const MAGIC: &[u8; 4] = b"DDFI";
const FORMAT: u32 = 1;
/// Longest record body accepted (an endpoint name, a key and a few numbers fit in far less).
const MAX_RECORD_BYTES: usize = 64 << 10;

/// What a rank publishes so others can read its share (method 1 allgather, method 2 files).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShareRecord {
    /// Record format version.
    pub format: u32,
    /// Provider that registered the share; readers must use the same one.
    pub provider: String,
    /// The exposing endpoint's address (`fi_getname`).
    pub addr: Vec<u8>,
    /// Virtual address of the share (remote addresses with FI_MR_VIRT_ADDR).
    pub base: u64,
    /// Remote key of the registered share.
    pub key: u64,
    /// Length of the share in bytes.
    pub len: u64,
    /// The owner answers gather requests for this share (absent in older records).
    #[serde(default)]
    pub gather: bool,
    /// Bytes from the share's start that are in registered memory, where
    /// that is less than `len` (a spilled share: the rest is read through
    /// the gather path only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_len: Option<u64>,
}

impl ShareRecord {
    /// A record of format version 1 with no gather path.
    pub fn new(provider: String, addr: Vec<u8>, base: u64, key: u64, len: u64) -> ShareRecord {
        ShareRecord {
            format: FORMAT,
            provider,
            addr,
            base,
            key,
            len,
            gather: false,
            mem_len: None,
        }
    }

    /// Bytes from the share's start that one-sided reads can reach.
    pub fn registered_len(&self) -> u64 {
        self.mem_len.unwrap_or(self.len).min(self.len)
    }

    /// The record's bytes: a magic tag, then JSON.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend(serde_json::to_vec(self).expect("a share record serialises"));
        out
    }

    /// Parses `rank`'s record; anything malformed is `FabricError::Invalid`.
    pub fn decode(rank: usize, bytes: &[u8]) -> FabricResult<ShareRecord> {
        let bad = |why: String| {
            FabricError::Invalid(format!("share record of rank {rank} is not valid: {why}"))
        };
        let body = bytes
            .strip_prefix(MAGIC.as_slice())
            .ok_or_else(|| bad("not a libfabric (method 1/2) record".into()))?;
        // serde_json refuses nesting past 128 levels itself.
        if body.len() > MAX_RECORD_BYTES {
            return Err(bad(format!(
                "{} bytes, more than a record holds ({MAX_RECORD_BYTES})",
                body.len()
            )));
        }
        let rec: ShareRecord = serde_json::from_slice(body).map_err(|e| bad(e.to_string()))?;
        if rec.format != FORMAT {
            return Err(bad(format!(
                "format {} (this build reads format {FORMAT})",
                rec.format
            )));
        }
        Ok(rec)
    }
}

/// What a reader keeps of one rank's share of a variable: only what differs
/// between variables (the rank's address is kept once per store, in [`Peers::addrs`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerShare {
    /// Virtual address of the share.
    pub base: u64,
    /// Remote key of the registered share.
    pub key: u64,
    /// Length of the share in bytes.
    pub len: u64,
    /// Bytes from the start that one-sided reads reach (`len` unless spilled).
    pub mem_len: u64,
    /// The owner answers gather requests for it.
    pub gather: bool,
}

impl PeerShare {
    /// Bytes from the share's start that one-sided reads can reach.
    pub fn registered_len(&self) -> u64 {
        self.mem_len.min(self.len)
    }
}

/// Every rank's share of one variable: the ranks' endpoint addresses (one
/// table shared by every variable of a store) and per rank its [`PeerShare`].
#[derive(Clone, Debug, Default)]
pub struct Peers {
    /// Per rank, its endpoint's address (`fi_getname`).
    pub addrs: Arc<Vec<Vec<u8>>>,
    /// Per rank, its share.
    pub shares: Vec<PeerShare>,
}

impl Peers {
    /// Rank `rank`'s share, if there is such a rank.
    pub fn get(&self, rank: usize) -> Option<&PeerShare> {
        self.shares.get(rank)
    }

    /// Number of ranks.
    pub fn len(&self) -> usize {
        self.shares.len()
    }

    /// Whether no rank exposes the share.
    pub fn is_empty(&self) -> bool {
        self.shares.is_empty()
    }

    /// Rank `rank`'s record again, as it published it (for another job or a spawned worker).
    pub fn record(&self, provider: &str, rank: usize) -> ShareRecord {
        let p = self.shares[rank];
        let mut rec = ShareRecord::new(
            provider.to_string(),
            self.addrs[rank].clone(),
            p.base,
            p.key,
            p.len,
        );
        rec.gather = p.gather;
        rec.mem_len = (p.mem_len < p.len).then_some(p.mem_len);
        rec
    }

    /// The records of every rank, with `addrs` the ranks' addresses: that
    /// table itself when it holds the same addresses (every variable of a
    /// store shares it), else a new one.
    pub fn from_records(records: Vec<ShareRecord>, addrs: Option<&Arc<Vec<Vec<u8>>>>) -> Peers {
        let same = addrs.filter(|a| {
            a.len() == records.len() && a.iter().zip(&records).all(|(a, r)| *a == r.addr)
        });
        let shares = records
            .iter()
            .map(|r| PeerShare {
                base: r.base,
                key: r.key,
                len: r.len,
                mem_len: r.registered_len(),
                gather: r.gather,
            })
            .collect();
        let addrs = match same {
            Some(a) => a.clone(),
            None => Arc::new(records.into_iter().map(|r| r.addr).collect()),
        };
        Peers { addrs, shares }
    }
}

impl std::ops::Index<usize> for Peers {
    type Output = PeerShare;
    fn index(&self, rank: usize) -> &PeerShare {
        &self.shares[rank]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_share_one_address_table_and_give_their_records_back() {
        let recs = |key| {
            (0..3)
                .map(|r| {
                    let mut rec = ShareRecord::new("tcp".into(), vec![r as u8; 16], 4096, key, 100);
                    rec.gather = true;
                    rec
                })
                .collect::<Vec<_>>()
        };
        let first = Peers::from_records(recs(7), None);
        let second = Peers::from_records(recs(8), Some(&first.addrs));
        assert!(Arc::ptr_eq(&first.addrs, &second.addrs));
        assert_eq!(second.record("tcp", 2), recs(8)[2]);
        assert_eq!(second[1].key, 8);
        let mut moved = recs(9);
        moved[1].addr = vec![9; 16];
        let third = Peers::from_records(moved.clone(), Some(&first.addrs));
        assert!(!Arc::ptr_eq(&first.addrs, &third.addrs));
        assert_eq!(third.record("tcp", 1), moved[1]);
        // Per variable and rank: base, key, length, registered length, gather flag.
        assert!(std::mem::size_of::<PeerShare>() <= 40);
    }

    #[test]
    fn round_trip_and_rejects() {
        let r = ShareRecord::new("tcp;ofi_rxm".into(), vec![1, 2, 3], 4096, 7, 100);
        assert_eq!(ShareRecord::decode(0, &r.encode()).unwrap(), r);
        assert!(ShareRecord::decode(3, b"junk")
            .unwrap_err()
            .to_string()
            .contains("rank 3"));
        let mut future = r.clone();
        future.format = 9;
        assert!(ShareRecord::decode(0, &future.encode()).is_err());
        let mut nested = MAGIC.to_vec();
        nested.resize(nested.len() + 100_000, b'[');
        assert!(ShareRecord::decode(0, &nested).is_err());
        let mut huge = MAGIC.to_vec();
        huge.resize(MAX_RECORD_BYTES + 100, b' ');
        assert!(ShareRecord::decode(0, &huge)
            .unwrap_err()
            .to_string()
            .contains("more than"));
    }
}
