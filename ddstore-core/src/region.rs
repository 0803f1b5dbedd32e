//! Memory that holds a share: page-aligned regions this process owns
//! (anonymous, or a shared-memory file same-node peers can map) and
//! read-only mappings of peers' shares.
//!
//! All raw memory access of the core crate lives here, behind bounds checks.

use std::any::Any;
use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use memmap2::{Mmap, MmapMut, MmapOptions};

use crate::comm::Comm;
use crate::{Error, Result};

/// A block of bytes a share lives in. Reads and writes are bounds-checked
/// copies; concurrent writers and readers of the same bytes get no ordering
/// guarantee (as with remote one-sided reads), never memory unsafety.
pub trait Memory: Send + Sync {
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Start address, for registration with a NIC or an MPI window.
    fn as_ptr(&self) -> *const u8;
    fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()>;
    fn write_at(&self, offset: usize, src: &[u8]) -> Result<()>;
}

/// Memory described by a pointer and a length, kept alive by `owner`
/// (an MPI window, a mapping): the one way other modules turn raw memory
/// into a `Memory`.
pub struct RawMemory {
    ptr: *mut u8,
    len: usize,
    writable: bool,
    _owner: Arc<dyn Any + Send + Sync>,
}

// SAFETY: the bytes are plain data reachable from every thread; all access
// goes through bounds-checked copies, and `_owner` keeps them mapped.
unsafe impl Send for RawMemory {}
unsafe impl Sync for RawMemory {}

impl RawMemory {
    /// # Safety
    /// `ptr..ptr+len` must stay valid (and writable if `writable`) for as long
    /// as `owner` is alive.
    pub unsafe fn new(
        ptr: *mut u8,
        len: usize,
        writable: bool,
        owner: Arc<dyn Any + Send + Sync>,
    ) -> RawMemory {
        RawMemory {
            ptr,
            len,
            writable,
            _owner: owner,
        }
    }
}

fn check_range(what: &str, offset: usize, n: usize, len: usize) -> Result<()> {
    match offset.checked_add(n) {
        Some(end) if end <= len => Ok(()),
        _ => Err(Error::IndexOutOfRange(format!(
            "{what} of {n} bytes at offset {offset} is outside the share of {len} bytes"
        ))),
    }
}

impl Memory for RawMemory {
    fn len(&self) -> usize {
        self.len
    }
    fn as_ptr(&self) -> *const u8 {
        self.ptr
    }
    fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        check_range("read", offset, dst.len(), self.len)?;
        // SAFETY: range checked above; the owner keeps the memory valid; dst is
        // a distinct Rust slice so the ranges cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(offset), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }
    fn write_at(&self, offset: usize, src: &[u8]) -> Result<()> {
        if !self.writable {
            return Err(Error::Unsupported("this share is read-only here".into()));
        }
        check_range("write", offset, src.len(), self.len)?;
        // SAFETY: range checked above, memory writable per the constructor contract.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.add(offset), src.len()) };
        Ok(())
    }
}

/// This process's own share: anonymous memory, or a shared-memory file that
/// same-node peers map read-only.
pub struct Region {
    memory: RawMemory,
    /// Set while the shared-memory file still has a name.
    path: std::sync::Mutex<Option<PathBuf>>,
}

enum Mapping {
    Anonymous(#[allow(dead_code)] MmapMut),
    Shared(#[allow(dead_code)] MmapMut),
}

static REGION_SEQ: AtomicU64 = AtomicU64::new(0);

/// Directory for shared-memory files (`DDSTORE_SHM_DIR`, default /dev/shm).
pub fn shm_dir() -> PathBuf {
    std::env::var_os("DDSTORE_SHM_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/dev/shm"))
}

impl Region {
    /// Page-aligned zeroed memory of `len` bytes, private to this process.
    pub fn anonymous(len: usize) -> Result<Region> {
        // A zero-length mapping is invalid; keep one page and report len.
        let map = MmapOptions::new()
            .len(len.max(1))
            .map_anon()
            .map_err(|e| Error::io(format!("allocating a share of {len} bytes"), e))?;
        Ok(Self::from_mapping(Mapping::Anonymous(map), len, None))
    }

    /// Page-aligned memory of `len` bytes in a new owner-only file under
    /// `shm_dir()`, which same-node peers can map read-only.
    pub fn shared(name: &str, len: usize) -> Result<Region> {
        let safe: String = name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .take(40)
            .collect();
        let path = shm_dir().join(format!(
            "ddstore-{}-{}-{}",
            std::process::id(),
            REGION_SEQ.fetch_add(1, Ordering::Relaxed),
            safe
        ));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| Error::io(format!("creating shared-memory file {}", path.display()), e))?;
        let cleanup = |e: std::io::Error, what: &str| {
            let _ = std::fs::remove_file(&path);
            Error::io(format!("{what} {}", path.display()), e)
        };
        file.set_len(len.max(1) as u64)
            .map_err(|e| cleanup(e, "sizing"))?;
        // SAFETY: the file was just created by us with owner-only permissions;
        // other processes only ever map it read-only.
        let map = unsafe { MmapMut::map_mut(&file) }.map_err(|e| cleanup(e, "mapping"))?;
        Ok(Self::from_mapping(Mapping::Shared(map), len, Some(path)))
    }

    fn from_mapping(mut mapping: Mapping, len: usize, path: Option<PathBuf>) -> Region {
        let ptr = match &mut mapping {
            Mapping::Anonymous(m) | Mapping::Shared(m) => m.as_mut_ptr(),
        };
        // SAFETY: the mapping is at least `len` bytes, writable, and is moved
        // into the owner so it lives as long as the RawMemory.
        let memory = unsafe { RawMemory::new(ptr, len, true, Arc::new(OwnedMapping(mapping))) };
        Region {
            memory,
            path: std::sync::Mutex::new(path),
        }
    }

    /// Path of the shared-memory file, while it still has one.
    pub fn path(&self) -> Option<PathBuf> {
        self.path.lock().unwrap().clone()
    }

    /// Removes the file's name; existing mappings stay valid.
    pub fn unlink(&self) {
        if let Some(p) = self.path.lock().unwrap().take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

struct OwnedMapping(#[allow(dead_code)] Mapping);
// SAFETY: a mapping is plain memory; ownership only decides when it is unmapped.
unsafe impl Send for OwnedMapping {}
unsafe impl Sync for OwnedMapping {}

impl Drop for Region {
    fn drop(&mut self) {
        self.unlink();
    }
}

impl Memory for Region {
    fn len(&self) -> usize {
        self.memory.len()
    }
    fn as_ptr(&self) -> *const u8 {
        self.memory.as_ptr()
    }
    fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.memory.read_at(offset, dst)
    }
    fn write_at(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.memory.write_at(offset, src)
    }
}

/// Read-only mapping of a same-node peer's shared-memory file.
pub fn map_peer(path: &Path, len: usize) -> Result<RawMemory> {
    let file = std::fs::File::open(path)
        .map_err(|e| Error::io(format!("opening peer share {}", path.display()), e))?;
    let actual = file
        .metadata()
        .map_err(|e| Error::io("reading peer share size", e))?
        .len();
    if actual < len as u64 {
        return Err(Error::Comm(format!(
            "peer share {} has {actual} bytes, expected {len}",
            path.display()
        )));
    }
    // SAFETY: mapped read-only; the owner only writes rows, never truncates.
    let map = unsafe { Mmap::map(&file) }
        .map_err(|e| Error::io(format!("mapping peer share {}", path.display()), e))?;
    let ptr = map.as_ptr() as *mut u8;
    // SAFETY: the mapping holds `len` bytes and is owned by the RawMemory; not writable.
    Ok(unsafe { RawMemory::new(ptr, len, false, Arc::new(ReadOnlyMapping(map))) })
}

struct ReadOnlyMapping(#[allow(dead_code)] Mmap);

/// Identity of this machine: peers with the same id share /dev/shm.
/// `DDSTORE_HOST_ID` overrides it (tests use it to make ranks "remote").
pub fn host_id() -> String {
    if let Ok(id) = std::env::var("DDSTORE_HOST_ID") {
        return id;
    }
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!("{}/{}", host.trim(), boot.trim())
}

#[derive(serde::Serialize, serde::Deserialize)]
struct NodeRecord {
    host: String,
    path: Option<PathBuf>,
    len: usize,
}

/// Collective: tells every rank where this rank's shared file is, maps the
/// files of same-node peers, then removes this rank's file name so nothing
/// is left in /dev/shm once the job ends, however it ends.
/// Returns, per rank, a readable mapping or `None` (read it remotely).
pub fn share_on_node(comm: &dyn Comm, region: &Region) -> Result<Vec<Option<Arc<dyn Memory>>>> {
    let mine = NodeRecord {
        host: host_id(),
        path: region.path(),
        len: region.len(),
    };
    let bytes = serde_json::to_vec(&mine).expect("node record serialises");
    let all = comm.allgather(&bytes)?;
    let mut views: Vec<Option<Arc<dyn Memory>>> = Vec::with_capacity(all.len());
    for (rank, raw) in all.iter().enumerate() {
        let rec: NodeRecord = serde_json::from_slice(raw)
            .map_err(|e| Error::Comm(format!("bad node record from rank {rank}: {e}")))?;
        let view: Option<Arc<dyn Memory>> = match (&rec.path, rank == comm.rank()) {
            (_, true) => None,
            (Some(path), false) if rec.host == mine.host => {
                // A mapping that fails (another container's /dev/shm) falls back to remote reads.
                map_peer(path, rec.len)
                    .ok()
                    .map(|m| Arc::new(m) as Arc<dyn Memory>)
            }
            _ => None,
        };
        views.push(view);
    }
    comm.barrier()?;
    region.unlink();
    Ok(views)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anonymous_region_reads_back_and_checks_bounds() {
        let r = Region::anonymous(100).unwrap();
        r.write_at(10, &[1, 2, 3]).unwrap();
        let mut out = [0u8; 3];
        r.read_at(10, &mut out).unwrap();
        assert_eq!(out, [1, 2, 3]);
        assert_eq!(r.as_ptr() as usize % 4096, 0);
        assert!(r.read_at(98, &mut out).is_err());
        assert!(r.write_at(usize::MAX, &out).is_err());
    }

    #[test]
    fn shared_region_is_mappable_and_unlinks() {
        let dir = tempfile::tempdir().unwrap();
        std::env::set_var("DDSTORE_SHM_DIR", dir.path());
        let r = Region::shared("x/y", 8192).unwrap();
        r.write_at(4096, b"hello").unwrap();
        let path = r.path().unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o600
        );
        let peer = map_peer(&path, 8192).unwrap();
        let mut out = [0u8; 5];
        peer.read_at(4096, &mut out).unwrap();
        assert_eq!(&out, b"hello");
        assert!(peer.write_at(0, b"x").is_err());
        r.unlink();
        assert!(!path.exists());
        peer.read_at(4096, &mut out).unwrap();
        assert_eq!(&out, b"hello");
        std::env::remove_var("DDSTORE_SHM_DIR");
    }
}
