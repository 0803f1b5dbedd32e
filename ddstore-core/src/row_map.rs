//! Hash maps keyed by row numbers, ranks or byte offsets, on the read paths
//! (batch plans, ragged reads, gather plans).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Hashes row numbers and ranks with one multiplication: the per-row maps of
/// a batch are on the read path, where SipHash costs more than the lookups.
/// Not for keys an attacker chooses to collide (no per-process seed).
#[derive(Default)]
pub struct RowHasher(u64);

impl Hasher for RowHasher {
    fn finish(&self) -> u64 {
        // The product's high bits depend on every bit of the key: fold them into
        // the low bits that pick the bucket (strided rows would collide otherwise).
        self.0 ^ (self.0 >> 29)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

/// A map keyed by row numbers or ranks (or tuples of them).
pub type RowMap<K, V> = HashMap<K, V, BuildHasherDefault<RowHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_hashes_spread_strided_rows() {
        use std::hash::BuildHasher;
        let b = BuildHasherDefault::<RowHasher>::default();
        // Rows 1024 apart land in different buckets of a 1024-bucket table.
        let buckets: std::collections::HashSet<u64> =
            (0..128u64).map(|i| b.hash_one(i * 1024) & 1023).collect();
        assert!(buckets.len() > 100, "{}", buckets.len());
    }
}
