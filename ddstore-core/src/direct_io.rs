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
    if storage.len() < len + ALIGN {
        *storage = vec![0u8; len + ALIGN];
    }
    let start = storage.as_ptr().align_offset(ALIGN);
    &mut storage[start..start + len]
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
    }
}
