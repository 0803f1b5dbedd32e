//! Reading file ranges straight into a share: whole and partial ranges,
//! O_DIRECT through the bounce buffer, checksums, and files that must be
//! refused (truncated, wrong size, symbolic link, FIFO, missing).

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use ddstore_core::file_load::{read_ranges, FileRange, SourceFile};
use ddstore_core::memory::Memory;
use ddstore_core::region::Region;

fn data(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
}

fn file_with(dir: &tempfile::TempDir, name: &str, bytes: &[u8]) -> String {
    let path = dir.path().join(name);
    std::fs::File::create(&path)
        .unwrap()
        .write_all(bytes)
        .unwrap();
    path.to_str().unwrap().to_string()
}

/// The load deadline of these tests (they never come near it).
const T: Duration = Duration::from_secs(60);

fn share(mem: &Arc<Region>) -> Vec<u8> {
    let mut out = vec![0u8; mem.len()];
    mem.read_at(0, &mut out).unwrap();
    out
}

#[test]
fn ranges_land_at_their_offsets_with_and_without_o_direct() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = data(3 << 20);
    let a = file_with(&dir, "a.bin", &bytes);
    for direct in [false, true] {
        let files = vec![SourceFile::open(&a, true, direct, Some(bytes.len() as u64)).unwrap()];
        let mem = Arc::new(Region::anonymous(2 << 20).unwrap());
        // Odd offsets and lengths (O_DIRECT reads aligned blocks around them), reversed order.
        let mut ranges = Vec::new();
        let piece = 100_003;
        let mut dst = 0;
        while dst + piece <= mem.len() {
            ranges.push(FileRange::whole(0, 12_345 + dst as u64, piece, dst));
            dst += piece;
        }
        ranges.reverse();
        // A checked range written in part: bytes [10, 60) of a 100-byte read.
        let crc = crc32fast::hash(&bytes[7..107]);
        ranges.push(FileRange {
            file: 0,
            file_offset: 7,
            len: 100,
            crc32: Some(crc),
            skip: 10,
            write_len: 50,
            dst_offset: dst,
        });
        let n = read_ranges(mem.clone(), files, &ranges, 8, T).unwrap();
        assert_eq!(n as usize, dst + 50);
        let got = share(&mem);
        assert_eq!(&got[..dst], &bytes[12_345..12_345 + dst], "direct={direct}");
        assert_eq!(&got[dst..dst + 50], &bytes[17..67], "direct={direct}");
    }
}

#[test]
fn a_wrong_checksum_or_short_file_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = data(10_000);
    let a = file_with(&dir, "a.bin", &bytes);
    let files = || vec![SourceFile::open(&a, true, false, None).unwrap()];
    let mem = Arc::new(Region::anonymous(20_000).unwrap());
    let mut r = FileRange::whole(0, 0, 4096, 0);
    r.crc32 = Some(crc32fast::hash(&bytes[..4096]) ^ 1);
    let e = read_ranges(mem.clone(), files(), &[r], 2, T)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("a.bin: checksum mismatch in bytes 0..4096"),
        "{e}"
    );
    let e = read_ranges(
        mem.clone(),
        files(),
        &[FileRange::whole(0, 9_000, 2_000, 0)],
        2,
        T,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("a.bin is truncated: it ends at byte 10000"),
        "{e}"
    );
    let e = read_ranges(
        mem.clone(),
        files(),
        &[FileRange::whole(0, 0, 100, 19_950)],
        2,
        T,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("do not fit"), "{e}");
    let e = read_ranges(
        mem.clone(),
        files(),
        &[FileRange::whole(1, 0, 100, 0)],
        2,
        T,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("file index 1"), "{e}");
}

#[test]
fn files_that_are_not_plain_files_of_the_right_size_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let a = file_with(&dir, "a.bin", &data(100));
    let e = SourceFile::open(&a, true, false, Some(101))
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("a.bin is truncated: 100 bytes, expected 101"),
        "{e}"
    );
    let link = dir.path().join("link.bin");
    std::os::unix::fs::symlink(&a, &link).unwrap();
    let link = link.to_str().unwrap();
    let e = SourceFile::open(link, true, false, None)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("link.bin is a symbolic link"), "{e}");
    assert!(SourceFile::open(link, false, false, None).is_ok());
    let fifo = dir.path().join("fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let e = SourceFile::open(fifo.to_str().unwrap(), true, false, None)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("fifo is not a regular file"), "{e}");
    let e = SourceFile::open(&format!("{a}.gone"), true, false, None)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("a.bin.gone cannot be opened"), "{e}");
}

/// Memory whose release this process does not control (as an MPI window):
/// no straight `pread` into it, only copies while the load is waited on.
struct Foreign(std::sync::Mutex<Vec<u8>>);

impl Memory for Foreign {
    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
    fn as_ptr(&self) -> *const u8 {
        std::ptr::null()
    }
    fn read_at(&self, offset: usize, dst: &mut [u8]) -> ddstore_core::Result<()> {
        dst.copy_from_slice(&self.0.lock().unwrap()[offset..offset + dst.len()]);
        Ok(())
    }
    fn write_at(&self, offset: usize, src: &[u8]) -> ddstore_core::Result<()> {
        self.0.lock().unwrap()[offset..offset + src.len()].copy_from_slice(src);
        Ok(())
    }
}

#[test]
fn memory_released_elsewhere_is_filled_through_a_buffer_and_not_held() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = data(1 << 20);
    let a = file_with(&dir, "a.bin", &bytes);
    let files = vec![SourceFile::open(&a, true, false, None).unwrap()];
    let mem = Arc::new(Foreign(std::sync::Mutex::new(vec![0u8; 1 << 20])));
    let ranges: Vec<_> = (0..16)
        .map(|i| FileRange::whole(0, i * 65_536, 65_536, i as usize * 65_536))
        .collect();
    let n = read_ranges(mem.clone(), files, &ranges, 4, T).unwrap();
    assert_eq!(n, 1 << 20);
    assert_eq!(*mem.0.lock().unwrap(), bytes);
    // The reading threads are gone and hold no reference to the share.
    assert_eq!(Arc::strong_count(&mem), 1);
}
