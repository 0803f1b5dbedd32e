//! What `O_DIRECT` reads need: file offsets, lengths and buffers aligned to
//! one block. The one home of that alignment (file loads, spill files, and
//! Python's aligned reader through `_native.DIRECT_ALIGN`).

/// Alignment of `O_DIRECT` offsets, lengths and buffers (a 4 KiB block
/// covers 512-byte and 4 KiB sector disks alike).
pub const ALIGN: usize = 4096;

/// The block-aligned file span around `offset .. offset + len`: its start
/// rounded down and its end rounded up to [`ALIGN`].
pub fn span(offset: u64, len: u64) -> (u64, u64) {
    let align = ALIGN as u64;
    (offset - offset % align, round_up(offset + len))
}

/// `n` rounded up to a multiple of [`ALIGN`].
pub fn round_up(n: u64) -> u64 {
    n.div_ceil(ALIGN as u64) * ALIGN as u64
}

/// `len` bytes at an [`ALIGN`]-aligned address inside `storage`, grown when
/// too short (kept for the next call otherwise; the bytes are whatever an
/// earlier read left: a read fills them).
pub fn buffer(storage: &mut Vec<u8>, len: usize) -> &mut [u8] {
    let at = aligned(storage, len);
    &mut storage[at]
}

/// As [`buffer`], giving where in `storage` the aligned bytes lie (they
/// stay there while `storage` is neither grown nor moved).
pub fn aligned(storage: &mut Vec<u8>, len: usize) -> std::ops::Range<usize> {
    if storage.len() < len + ALIGN {
        *storage = vec![0u8; len + ALIGN];
    }
    let start = storage.as_ptr().align_offset(ALIGN);
    start..start + len
}

/// Bytes of storage that [`aligned`] never has to grow for a direct read of
/// `len` bytes at any file offset (its aligned span, plus room to align).
pub fn storage_for(len: usize) -> usize {
    round_up(len as u64) as usize + 2 * ALIGN
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_cover_the_range_in_whole_blocks() {
        assert_eq!(span(0, 1), (0, 4096));
        assert_eq!(span(4095, 2), (0, 8192));
        assert_eq!(span(8192, 4096), (8192, 12288));
        assert_eq!(span(5000, 0), (4096, 8192));
    }

    #[test]
    fn buffers_are_aligned_and_long_enough() {
        let mut storage = Vec::new();
        for len in [1, 4096, 10_000, 3] {
            let b = buffer(&mut storage, len);
            assert_eq!(b.len(), len);
            assert_eq!(b.as_ptr() as usize % ALIGN, 0);
        }
        // Storage of storage_for(len) bytes holds the span of len bytes at any offset.
        for (offset, len) in [(0u64, 1usize), (4095, 2), (5000, 14_650_000), (8192, 4096)] {
            let (a, b) = span(offset, len as u64);
            let mut storage = vec![0u8; storage_for(len)];
            let before = storage.as_ptr();
            let at = aligned(&mut storage, (b - a) as usize);
            assert_eq!((at.len() as u64, storage.as_ptr()), (b - a, before));
        }
    }
}
