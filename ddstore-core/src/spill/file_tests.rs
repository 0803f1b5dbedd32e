//! Tests of the spill tier on real files (a temporary directory on the test machine's disk).

use std::sync::Arc;

use super::*;
use crate::memory::Memory;
use crate::region::Region;

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

#[test]
fn rows_written_at_any_offset_read_back_in_parallel() {
    let base = tempfile::tempdir().unwrap();
    let dir = SpillDir::open(&base.path().join("spill")).unwrap();
    let data = pattern(3 * 4096 + 777, 5);
    let file = SpillFile::create(&dir, &dir.file_name("x"), data.len() as u64, "'x'").unwrap();
    // Unaligned pieces from several threads, as a load writes them.
    let pieces: Vec<(usize, &[u8])> = data.chunks(1000).enumerate().collect();
    std::thread::scope(|s| {
        for part in pieces.chunks(4) {
            let file = &file;
            s.spawn(move || {
                for (k, chunk) in part {
                    file.write_at((*k * 1000) as u64, chunk).unwrap();
                }
            });
        }
    });
    let mut out = vec![0u8; data.len()];
    let mut reads = Vec::new();
    let mut rest: &mut [u8] = &mut out;
    let mut at = 0u64;
    while !rest.is_empty() {
        let take = rest.len().min(333);
        let (dst, tail) = rest.split_at_mut(take);
        reads.push(SpillRead {
            file: &file,
            offset: at,
            dst,
        });
        rest = tail;
        at += take as u64;
    }
    read_all(reads, 8).unwrap();
    assert_eq!(out, data);
    let mut one = [0u8; 10];
    assert!(file
        .read_at(data.len() as u64 - 5, &mut one, &mut Vec::new())
        .is_err());
    let path = file.path().to_path_buf();
    assert!(path.exists());
    drop(file);
    assert!(!path.exists(), "a freed spill file is removed");
}

#[test]
fn a_dead_processs_files_are_removed_and_a_live_ones_kept() {
    let base = tempfile::tempdir().unwrap();
    let path = base.path().join("spill");
    let live = SpillDir::open(&path).unwrap();
    let kept = SpillFile::create(&live, &live.file_name("v"), 10, "'v'").unwrap();
    // What a killed process leaves: an unlocked lock file, spill files, and
    // a spill file whose lock file is gone too.
    std::fs::write(path.join("p1-dead.lock"), b"pyddstore process 1").unwrap();
    std::fs::write(path.join("p1-dead.0.v.spill"), b"old rows").unwrap();
    std::fs::write(path.join("p2-gone.3.w.spill"), b"old rows").unwrap();
    let next = SpillDir::open(&path).unwrap();
    assert_eq!(next.removed_stale(), 2);
    let mut left: Vec<String> = std::fs::read_dir(&path)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    assert_eq!(left.len(), 3, "{left:?}"); // two live locks and the live file
    assert!(kept.path().exists());
    drop((kept, live, next));
    assert_eq!(std::fs::read_dir(&path).unwrap().count(), 0);
}

#[test]
fn a_spilled_share_is_one_share_of_its_full_length() {
    let base = tempfile::tempdir().unwrap();
    let dir = SpillDir::open(&base.path().join("spill")).unwrap();
    let rb = 24;
    let (mem_rows, rows) = (5usize, 12usize);
    let region: Arc<dyn Memory> = Arc::new(Region::anonymous(mem_rows * rb).unwrap());
    let file = Arc::new(
        SpillFile::create(
            &dir,
            &dir.file_name("s"),
            ((rows - mem_rows) * rb) as u64,
            "'s'",
        )
        .unwrap(),
    );
    let share = SpilledShare::new(region.clone(), Some(file.clone()), rows * rb);
    let data = pattern(rows * rb, 9);
    share.write_at(0, &data[..50]).unwrap();
    share.write_at(50, &data[50..]).unwrap();
    let mut back = vec![0u8; data.len()];
    share.read_at(0, &mut back).unwrap();
    assert_eq!(back, data);
    let mut mem = vec![0u8; mem_rows * rb];
    region.read_at(0, &mut mem).unwrap();
    assert_eq!(mem, data[..mem_rows * rb], "the first rows are in memory");
    assert_eq!(share.split(100, 40), (20, Some(0)));
    assert_eq!(share.split(130, 10), (0, Some(10)));
    assert!(share.read_at(rows * rb - 1, &mut [0u8; 2]).is_err());
    // What the owner's gather server does for a remote batch: many ranges, files in parallel.
    let share = SpilledShare::new(region.clone(), Some(file.clone()), rows * rb).with_inflight(4);
    let ranges = [(0u64, 24u64), (100, 40), (200, 10), (24, 96), (250, 38)];
    let mut got = vec![0u8; ranges.iter().map(|r| r.1 as usize).sum()];
    share.read_ranges(&ranges, &mut got).unwrap();
    let want: Vec<u8> = ranges
        .iter()
        .flat_map(|&(o, l)| data[o as usize..(o + l) as usize].to_vec())
        .collect();
    assert_eq!(got, want);

    // A file load straight into the share (straddling the boundary).
    let src = base.path().join("src.bin");
    let fresh = pattern(rows * rb, 77);
    std::fs::write(&src, &fresh).unwrap();
    let f = std::fs::File::open(&src).unwrap();
    let mut done = 0;
    while done < fresh.len() {
        let n = share
            .pread_into(done, fresh.len() - done, &f, done as u64)
            .unwrap();
        assert!(n > 0);
        done += n;
    }
    share.read_at(0, &mut back).unwrap();
    assert_eq!(back, fresh);

    // A same-node reader opens the owner's file through its locator.
    let loc = file.locator().unwrap();
    let peer = SpillFile::open_peer(&loc).unwrap();
    let mut got = vec![0u8; (rows - mem_rows) * rb];
    peer.read_at(0, &mut got, &mut Vec::new()).unwrap();
    assert_eq!(got, fresh[mem_rows * rb..]);
    assert!(
        peer.write_at(0, b"x").is_err(),
        "a peer's file is read-only"
    );
    let forged = SpillLocator {
        id: loc.id ^ 1,
        ..loc
    };
    assert!(matches!(
        SpillFile::open_peer(&forged),
        Err(crate::Error::Access(_))
    ));
}

#[test]
fn a_spill_dir_others_can_write_is_refused_by_its_name() {
    use std::os::unix::fs::PermissionsExt;
    let base = tempfile::tempdir().unwrap();
    let open = base.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = SpillDir::open(&open).unwrap_err().to_string();
    assert!(e.contains("spill_dir") && e.contains("0777"), "{e}");
}

/// The directory the helper below creates spill files in (set only for the
/// processes the test starts).
const RACE_DIR_VAR: &str = "SPILL_RACE_TEST_DIR";

/// Spill creations each process of the test below makes.
const RACE_ROUNDS: usize = 50;

/// Run by [`processes_sharing_a_spill_dir_create_spill_files_at_once`] in
/// processes of its own: opens the shared directory and creates a spill
/// file [`RACE_ROUNDS`] times, as a rank adding a spilling variable does.
#[test]
#[ignore = "a helper the concurrent-creation test runs in processes of its own"]
fn spill_race_helper() {
    let Some(path) = std::env::var_os(RACE_DIR_VAR) else {
        return;
    };
    let path = std::path::PathBuf::from(path);
    for round in 0..RACE_ROUNDS {
        let dir = SpillDir::open(&path).unwrap_or_else(|e| panic!("round {round}: {e}"));
        let file = SpillFile::create(&dir, &dir.file_name("v"), 4096, "'v'")
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        file.write_at(0, &[round as u8; 64]).unwrap();
        let mut back = [0u8; 64];
        file.read_at(0, &mut back, &mut Vec::new()).unwrap();
        assert_eq!(back, [round as u8; 64], "round {round}");
    }
}

#[test]
fn processes_sharing_a_spill_dir_create_spill_files_at_once() {
    let base = tempfile::tempdir().unwrap();
    let path = base.path().join("spill");
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..16)
        .map(|_| {
            std::process::Command::new(&exe)
                .args([
                    "--exact",
                    "spill::file_tests::spill_race_helper",
                    "--ignored",
                    "--test-threads=1",
                ])
                .env(RACE_DIR_VAR, &path)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let failed: Vec<String> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .filter(|out| !out.status.success())
        .map(|out| {
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let why = text.lines().find(|l| l.starts_with("round "));
            why.unwrap_or(&text).to_string()
        })
        .collect();
    assert!(
        failed.is_empty(),
        "{} of 16 failed: {failed:?}",
        failed.len()
    );
    let left = std::fs::read_dir(&path).unwrap().count();
    assert_eq!(left, 0, "every process removed its files and its lock");
}

#[test]
fn rows_read_in_place_land_in_their_buffer_at_any_offset() {
    let base = tempfile::tempdir().unwrap();
    let dir = SpillDir::open(&base.path().join("spill")).unwrap();
    let data = pattern(5 * 4096 + 333, 9);
    let file = SpillFile::create(&dir, &dir.file_name("x"), data.len() as u64, "'x'").unwrap();
    file.write_at(0, &data).unwrap();
    for (offset, len) in [
        (0usize, 1usize),
        (1, 4096),
        (4095, 4097),
        (777, 3 * 4096 + 5),
    ] {
        let mut storage = vec![0u8; crate::direct_io::storage_for(len)];
        let before = storage.as_ptr();
        let at = file
            .read_in_place(offset as u64, len, &mut storage)
            .unwrap();
        assert_eq!(&storage[at], &data[offset..offset + len]);
        if file.is_direct() {
            assert_eq!(
                storage.as_ptr(),
                before,
                "storage_for(len) bytes need no new buffer"
            );
        }
    }
    assert!(file
        .read_in_place(data.len() as u64 - 2, 3, &mut Vec::new())
        .is_err());
}
