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

/// Bytes of one rank's share in a packed table ([`split_records`]): base,
/// key, length and registered length (little-endian u64 each), then flags.
pub const PACKED_SHARE_BYTES: usize = 33;
/// Longest endpoint address [`join_records`] accepts (`fi_getname` gives far less).
pub const MAX_ADDR_BYTES: usize = 1024;
/// Longest provider name [`join_records`] accepts.
const MAX_PROVIDER_BYTES: usize = 256;
/// Flag bit: the owner answers gather requests for the share.
const GATHER_FLAG: u8 = 1;

/// Every rank's record of one variable split into what a store's variables
/// share (the provider, the ranks' addresses) and what differs per variable:
/// per rank its [`PeerShare`], packed in [`PACKED_SHARE_BYTES`] bytes (method
/// 2 publishes the first once per store and the second per variable).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitRecords {
    /// The provider every rank registered its share with.
    pub provider: String,
    /// Per rank, its endpoint's address.
    pub addrs: Vec<Vec<u8>>,
    /// Per rank, its share, packed.
    pub shares: Vec<u8>,
}

/// Splits every rank's encoded record (see [`SplitRecords`]); a malformed
/// record, or ranks of different providers, is `FabricError::Invalid`.
pub fn split_records(records: &[Vec<u8>]) -> FabricResult<SplitRecords> {
    let decoded = records
        .iter()
        .enumerate()
        .map(|(rank, raw)| ShareRecord::decode(rank, raw))
        .collect::<FabricResult<Vec<_>>>()?;
    let provider = decoded
        .first()
        .map(|r| r.provider.clone())
        .unwrap_or_default();
    if let Some((rank, r)) = decoded
        .iter()
        .enumerate()
        .find(|(_, r)| r.provider != provider)
    {
        return Err(FabricError::Invalid(format!(
            "rank {rank} registered its share with provider {:?}, rank 0 with {provider:?}",
            r.provider
        )));
    }
    let peers = Peers::from_records(decoded, None);
    let mut shares = Vec::with_capacity(peers.len() * PACKED_SHARE_BYTES);
    for p in &peers.shares {
        for word in [p.base, p.key, p.len, p.mem_len] {
            shares.extend_from_slice(&word.to_le_bytes());
        }
        shares.push(if p.gather { GATHER_FLAG } else { 0 });
    }
    let addrs = Arc::try_unwrap(peers.addrs).unwrap_or_else(|a| (*a).clone());
    Ok(SplitRecords {
        provider,
        addrs,
        shares,
    })
}

/// Every rank's encoded record again from a [`split_records`] split (as
/// read from files: every field is checked against its bound, and anything
/// out of bounds is `FabricError::Invalid`).
pub fn join_records(
    provider: &str,
    addrs: &[Vec<u8>],
    shares: &[u8],
) -> FabricResult<Vec<Vec<u8>>> {
    let bad = |why: String| FabricError::Invalid(format!("packed share records: {why}"));
    if provider.is_empty() || provider.len() > MAX_PROVIDER_BYTES {
        return Err(bad(format!(
            "a provider name of {} bytes (expected 1 to {MAX_PROVIDER_BYTES})",
            provider.len()
        )));
    }
    if shares.len() != addrs.len() * PACKED_SHARE_BYTES {
        return Err(bad(format!(
            "{} bytes of shares for {} ranks (expected {PACKED_SHARE_BYTES} per rank)",
            shares.len(),
            addrs.len()
        )));
    }
    if let Some(rank) = addrs
        .iter()
        .position(|a| a.is_empty() || a.len() > MAX_ADDR_BYTES)
    {
        return Err(bad(format!(
            "rank {rank}'s address has {} bytes (expected 1 to {MAX_ADDR_BYTES})",
            addrs[rank].len()
        )));
    }
    let word = |b: &[u8], i: usize| u64::from_le_bytes(b[8 * i..8 * i + 8].try_into().unwrap());
    let shares = shares
        .chunks_exact(PACKED_SHARE_BYTES)
        .enumerate()
        .map(|(rank, b)| {
            let p = PeerShare {
                base: word(b, 0),
                key: word(b, 1),
                len: word(b, 2),
                mem_len: word(b, 3),
                gather: b[32] & GATHER_FLAG != 0,
            };
            if b[32] & !GATHER_FLAG != 0 || p.mem_len > p.len {
                return Err(bad(format!(
                    "rank {rank}'s share has flags {:#x} and registers {} of its {} bytes \
                     (expected flags 0 or 1 and at most its length)",
                    b[32], p.mem_len, p.len
                )));
            }
            Ok(p)
        })
        .collect::<FabricResult<Vec<_>>>()?;
    let peers = Peers {
        addrs: Arc::new(addrs.to_vec()),
        shares,
    };
    Ok((0..peers.len())
        .map(|r| peers.record(provider, r).encode())
        .collect())
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
    fn records_split_into_addresses_and_packed_shares_and_join_again() {
        let recs: Vec<ShareRecord> = (0..4u64)
            .map(|r| {
                let mut rec = ShareRecord::new("tcp".into(), vec![r as u8; 16], 4096 * r, r, 100);
                rec.gather = r % 2 == 0;
                rec.mem_len = (r == 3).then_some(40);
                rec
            })
            .collect();
        let encoded: Vec<Vec<u8>> = recs.iter().map(ShareRecord::encode).collect();
        let split = split_records(&encoded).unwrap();
        assert_eq!(split.provider, "tcp");
        assert_eq!(split.addrs[2], vec![2; 16]);
        // Per rank and variable: a constant size, no address.
        assert_eq!(split.shares.len(), 4 * PACKED_SHARE_BYTES);
        let joined = join_records(&split.provider, &split.addrs, &split.shares).unwrap();
        assert_eq!(joined, encoded);
        let err = |r: FabricResult<Vec<Vec<u8>>>| r.unwrap_err().to_string();
        let (addrs, shares) = (&split.addrs, &split.shares);
        assert!(err(join_records("tcp", addrs, &shares[1..])).contains("per rank"));
        assert!(err(join_records("tcp", &addrs[1..], shares)).contains("3 ranks"));
        assert!(err(join_records("", addrs, shares)).contains("provider"));
        let mut long = addrs.clone();
        long[1] = vec![0; MAX_ADDR_BYTES + 1];
        assert!(err(join_records("tcp", &long, shares)).contains("rank 1's address"));
        let mut flags = shares.clone();
        flags[PACKED_SHARE_BYTES + 32] = 7;
        assert!(err(join_records("tcp", addrs, &flags)).contains("rank 1's share"));
        let mut over = shares.clone();
        over[3 * PACKED_SHARE_BYTES + 24..3 * PACKED_SHARE_BYTES + 32]
            .copy_from_slice(&1000u64.to_le_bytes());
        assert!(err(join_records("tcp", addrs, &over)).contains("rank 3's share"));
        let mut mixed = encoded.clone();
        mixed[2] = ShareRecord::new("shm".into(), vec![1], 0, 0, 0).encode();
        assert!(split_records(&mixed)
            .unwrap_err()
            .to_string()
            .contains("rank 2"));
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
