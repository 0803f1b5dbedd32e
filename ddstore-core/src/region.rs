//! Memory that holds a share: page-aligned regions this process owns
//! (anonymous, or a shared-memory file same-node peers can map) and
//! read-only mappings of peers' shares.
//!
//! Raw access to these mappings goes through [`RawMemory`] (see
//! [`crate::memory`]), behind bounds checks.
//!
//! A shared region ends with a control block on a page of its own: a
//! random id (so a reader knows it mapped the region its locator names, not
//! another one that reused the file descriptor) and a state word the owner
//! sets to "retired" when it frees the region, before unmapping it. A
//! same-node reader in another job ([`ShareState`]) checks that word after
//! each copy: its mapping keeps the pages alive after the owner frees them,
//! so without the word it would go on reading a freed variable's bytes.

use std::ffi::CString;
use std::fs::File;
use std::mem::ManuallyDrop;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::sync::Arc;

use memmap2::{Mmap, MmapMut, MmapOptions};

use crate::comm::Comm;
use crate::memory::{Memory, RawMemory, PAGE};
use crate::{Error, Result};

/// This process's own share: anonymous memory, or a shared-memory file that
/// same-node peers map read-only.
///
/// The file is a `memfd`: it never has a name in any directory, so nothing
/// can be left behind in /dev/shm however the job ends. Peers open it as
/// `/proc/<pid>/fd/<fd>`, which the kernel allows only to processes that may
/// inspect the owner (the same user), and only while the owner lives.
pub struct Region {
    memory: RawMemory,
    /// The memfd of a shared region (kept open: it is how peers find it).
    file: Option<File>,
    /// A shared region's control block (see the module docs).
    control: Option<Control>,
}

/// Where a shared region's control block is, and who may retire it.
struct Control {
    /// Offset of the block in the mapping (past the share, page-aligned).
    offset: usize,
    /// The region's random id, also in its locator.
    id: u64,
    /// Only the creating process retires it: a forked child dropping its
    /// inherited copy must not mark the parent's live share freed.
    creator: crate::fork::CreatedBy,
}

/// The state word of a region whose owner holds it.
const STATE_LIVE: u32 = 0x4444_5331;
/// The state word once the owner freed the region (anything but
/// [`STATE_LIVE`] reads as not live: a zeroed or foreign block too).
const STATE_RETIRED: u32 = 0x4444_53ff;
/// Offset of the id in the control block (the state word is at 0).
const ID_AT: usize = 8;
/// Bytes of the control block a reader needs.
const CONTROL_BYTES: usize = 16;

/// The control block's offset for a share of `len` bytes.
fn control_offset(len: usize) -> Option<usize> {
    len.max(1).checked_next_multiple_of(PAGE)
}

/// An id no other region of this host is likely to have: the clock, the
/// pid and a per-process counter, mixed.
fn region_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u32(crate::fork::current_pid());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    h.write_u64(now);
    h.finish()
}

enum Mapping {
    Anonymous(#[allow(dead_code)] MmapMut),
    Shared(#[allow(dead_code)] MmapMut),
}

/// Where a same-node peer finds a shared region.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NodeLocator {
    /// Host name of the owner (a locator from another host is refused).
    pub host: String,
    /// Pid of the owning process.
    pub pid: u32,
    /// The owner's file descriptor of the shared-memory file.
    pub fd: i32,
    /// Length of the region in bytes.
    pub len: usize,
    /// Offset of the region's control block in the file (see the module docs).
    pub ctl: usize,
    /// The region's id, as its control block holds it.
    pub id: u64,
}

impl NodeLocator {
    fn path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/fd/{}", self.pid, self.fd))
    }
}

impl Region {
    /// Page-aligned zeroed memory of `len` bytes, private to this process.
    pub fn anonymous(len: usize) -> Result<Region> {
        Self::anonymous_with(len, false)
    }

    /// As [`Region::anonymous`]; with `keep_address` the address range stays
    /// reserved once the region is freed (a method-2 core job's shares).
    pub fn anonymous_with(len: usize, keep_address: bool) -> Result<Region> {
        // A zero-length mapping is invalid; keep one page and report len.
        let map = MmapOptions::new()
            .len(len.max(1))
            .map_anon()
            .map_err(|e| Error::io(format!("allocating a share of {len} bytes"), e))?;
        Ok(Self::from_mapping(
            Mapping::Anonymous(map),
            len,
            None,
            None,
            keep_address,
        ))
    }

    /// Page-aligned memory of `len` bytes in an owner-only memfd that
    /// same-node peers can map read-only (see [`Region::locator`]).
    pub fn shared(name: &str, len: usize) -> Result<Region> {
        Self::shared_with(name, len, false)
    }

    /// As [`Region::shared`]; with `keep_address` the address range stays
    /// reserved once the region is freed (a method-2 core job's shares).
    pub fn shared_with(name: &str, len: usize, keep_address: bool) -> Result<Region> {
        let label: String = name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .take(40)
            .collect();
        let label = CString::new(format!("ddstore-{label}")).expect("no NUL in label");
        // SAFETY: memfd_create takes a valid C string and flags; it returns a new fd or -1.
        let fd = unsafe { libc::memfd_create(label.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(Error::io(
                "memfd_create for a shared share",
                std::io::Error::last_os_error(),
            ));
        }
        // SAFETY: fd was just returned by memfd_create and is owned by nobody else.
        let file = unsafe { File::from_raw_fd(fd) };
        let ctx = |what: &'static str| {
            move |e| Error::io(format!("{what} a shared share of {len} bytes"), e)
        };
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(ctx("restricting"))?;
        let ctl = control_offset(len)
            .ok_or_else(|| Error::invalid(format!("a shared share of {len} bytes is too large")))?;
        file.set_len((ctl + PAGE) as u64).map_err(ctx("sizing"))?;
        // SAFETY: the memfd is ours; peers only ever map it read-only.
        let map = unsafe { MmapMut::map_mut(&file) }.map_err(ctx("mapping"))?;
        let control = Control {
            offset: ctl,
            id: region_id(),
            creator: crate::fork::CreatedBy::this_process(),
        };
        let region = Self::from_mapping(
            Mapping::Shared(map),
            len,
            Some(file),
            Some(control),
            keep_address,
        );
        region.set_state(STATE_LIVE);
        Ok(region)
    }

    fn from_mapping(
        mut mapping: Mapping,
        len: usize,
        file: Option<File>,
        control: Option<Control>,
        keep_address: bool,
    ) -> Region {
        let ptr = match &mut mapping {
            Mapping::Anonymous(m) | Mapping::Shared(m) => m.as_mut_ptr(),
        };
        let owned = Arc::new(OwnedMapping {
            mapping: ManuallyDrop::new(mapping),
            keep_address,
        });
        // SAFETY: the mapping is at least `len` bytes, writable, and is moved
        // into the owner so it lives as long as the RawMemory.
        let memory = unsafe { RawMemory::new(ptr, len, true, owned) };
        Region {
            memory,
            file,
            control,
        }
    }

    /// Writes the control block's id, then (release) its state word.
    fn set_state(&self, state: u32) {
        let Some(c) = &self.control else { return };
        // SAFETY: `shared` sized the file (and so the mapping, which the
        // RawMemory keeps) to `c.offset + PAGE` bytes, and `c.offset` is
        // page-aligned: both fields are in bounds and aligned. The block
        // lies past the share, where no other write of this process goes;
        // readers in other processes only load the state word atomically.
        unsafe {
            let block = self.memory.as_ptr().cast_mut().add(c.offset);
            block.add(ID_AT).cast::<u64>().write_volatile(c.id.to_le());
            AtomicU32::from_ptr(block.cast::<u32>()).store(state, Ordering::Release);
        }
    }

    /// How a same-node process reaches this region, if it is shared.
    pub fn locator(&self) -> Option<NodeLocator> {
        self.file.as_ref().map(|f| NodeLocator {
            host: host_id(),
            pid: crate::fork::current_pid(),
            fd: f.as_raw_fd(),
            len: self.len(),
            ctl: self.control.as_ref().map_or(0, |c| c.offset),
            id: self.control.as_ref().map_or(0, |c| c.id),
        })
    }
}

impl Drop for Region {
    /// Marks a shared region retired before it is unmapped, so same-node
    /// readers of other jobs (whose mappings outlive this one) stop reading
    /// it. Never blocks and never waits for readers.
    fn drop(&mut self) {
        if self
            .control
            .as_ref()
            .is_some_and(|c| c.creator.is_this_process())
        {
            self.set_state(STATE_RETIRED);
        }
    }
}

/// A region's mapping. With `keep_address` (shares other jobs read), the
/// address range is not handed back when the region goes: a one-sided
/// fabric reader of another job still holding the freed share's address (and
/// a key the provider may issue again: shm reads by address) would otherwise
/// read whatever share is mapped there next. The range is replaced by an
/// inaccessible reservation with no memory behind it, kept for the process's
/// life (address space only), so such a read fails. Otherwise it is unmapped.
struct OwnedMapping {
    mapping: ManuallyDrop<Mapping>,
    /// Reserve the range when freed instead of unmapping it: only for shares
    /// other jobs may read (a method-2 core job's); within one job every rank
    /// frees collectively and no reader outlives the share.
    keep_address: bool,
}
// SAFETY: a mapping is plain memory; ownership only decides when it is unmapped.
unsafe impl Send for OwnedMapping {}
// SAFETY: `&OwnedMapping` gives no access to the bytes (only Drop touches the mapping).
unsafe impl Sync for OwnedMapping {}

impl Drop for OwnedMapping {
    fn drop(&mut self) {
        if !self.keep_address {
            // SAFETY: dropped once, here, when the last owner goes.
            unsafe { ManuallyDrop::drop(&mut self.mapping) };
            return;
        }
        let (ptr, len) = match &*self.mapping {
            Mapping::Anonymous(m) | Mapping::Shared(m) => (m.as_ptr(), m.len()),
        };
        // SAFETY: ptr..ptr+len is this mapping (memmap2 maps at offset 0, so
        // ptr is page-aligned), which nothing uses once its last owner is
        // gone; MAP_FIXED replaces it in one call (its pages are released),
        // PROT_NONE with MAP_NORESERVE commits no memory.
        let reserved = unsafe {
            libc::mmap(
                ptr as *mut libc::c_void,
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if reserved == libc::MAP_FAILED {
            // SAFETY: not reserved: unmapped as usual, once.
            unsafe { ManuallyDrop::drop(&mut self.mapping) };
        }
        // Reserved: the memmap2 value is left undropped (it would unmap the reservation).
    }
}

impl Memory for Region {
    fn len(&self) -> usize {
        self.memory.len()
    }
    fn as_ptr(&self) -> *const u8 {
        self.memory.as_ptr()
    }
    /// This process's own mapping: unmapped only when the last handle goes.
    fn release_is_local(&self) -> bool {
        true
    }
    fn prepare_write(&self, offset: usize, len: usize) {
        self.memory.prepare_write(offset, len)
    }
    /// A shared region only: `fork()` copies the page tables of private
    /// memory, so a forked child lacks only those of shared mappings.
    fn populate_read(&self) -> usize {
        if self.file.is_some() {
            self.memory.populate_read()
        } else {
            0
        }
    }
    fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.memory.read_at(offset, dst)
    }
    fn prefetch(&self, offset: usize, len: usize) {
        self.memory.prefetch(offset, len)
    }
    fn write_at(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.memory.write_at(offset, src)
    }
    fn pread_into(
        &self,
        offset: usize,
        len: usize,
        file: &File,
        file_offset: u64,
    ) -> Result<usize> {
        self.memory.pread_into(offset, len, file, file_offset)
    }
}

/// A same-node peer's shared region, mapped read-only, and its state word.
pub struct PeerMapping {
    /// The share's bytes.
    pub memory: RawMemory,
    /// Whether its owner still holds it.
    pub state: ShareState,
}

/// The state word of a peer's shared region, read from this process's
/// mapping of it (which it keeps alive).
pub struct ShareState {
    word: *const u32,
    _mapping: Arc<ReadOnlyMapping>,
}

// SAFETY: the word is only ever loaded atomically, from any thread; the Arc
// keeps it mapped.
unsafe impl Send for ShareState {}
// SAFETY: as for Send: `&ShareState` only loads the word atomically.
unsafe impl Sync for ShareState {}

impl ShareState {
    /// Whether the owner has not freed the region. Reads of the region made
    /// before this call are ordered before its load (an acquire fence, as a
    /// seqlock reader validates): `true` after a copy means the copy read
    /// the bytes the owner held, not bytes from after a free.
    pub fn is_live(&self) -> bool {
        fence(Ordering::Acquire);
        // SAFETY: `word` is 4-byte aligned (page-aligned block) and inside
        // the mapping `_mapping` keeps. The mapping is read-only: a relaxed
        // atomic load of 4 bytes is one the standard library guarantees to
        // work on read-only memory.
        let state = unsafe { AtomicU32::from_ptr(self.word.cast_mut()) }.load(Ordering::Relaxed);
        state == STATE_LIVE
    }
}

/// A same-node peer's shared region opened for reading: refused unless the
/// file is long enough for the locator's control block.
fn open_peer_file(loc: &NodeLocator) -> Result<File> {
    let path = loc.path();
    let file = File::open(&path)
        .map_err(|e| Error::io(format!("opening peer share {}", path.display()), e))?;
    let actual = file
        .metadata()
        .map_err(|e| Error::io("reading peer share size", e))?
        .len();
    let want = loc.ctl.checked_add(CONTROL_BYTES);
    if loc.ctl < loc.len || !loc.ctl.is_multiple_of(PAGE) || want.is_none_or(|w| actual < w as u64)
    {
        return Err(Error::Comm(format!(
            "peer share {} has {actual} bytes, expected {} and a control block at {}",
            path.display(),
            loc.len,
            loc.ctl
        )));
    }
    Ok(file)
}

/// Refuses a peer's region whose control block (its id and state word as
/// `id` and `live`) is not the locator's or says freed.
fn check_control(loc: &NodeLocator, id: u64, live: bool) -> Result<()> {
    if id != loc.id || !live {
        return Err(Error::Comm(format!(
            "peer share {} is not the region its locator names, or was freed",
            loc.path().display()
        )));
    }
    Ok(())
}

/// Read-only mapping of a same-node peer's shared region: refused unless its
/// control block holds the locator's id (the descriptor was not reused for
/// another region) and says the region is live.
pub fn map_peer(loc: &NodeLocator) -> Result<PeerMapping> {
    let file = open_peer_file(loc)?;
    // SAFETY: mapped read-only; the owner only writes rows and the control
    // block, never truncates.
    let map = unsafe { Mmap::map(&file) }
        .map_err(|e| Error::io(format!("mapping peer share {}", loc.path().display()), e))?;
    let mut id = [0u8; 8];
    id.copy_from_slice(&map[loc.ctl + ID_AT..loc.ctl + ID_AT + 8]);
    let ptr = map.as_ptr() as *mut u8;
    let mapping = Arc::new(ReadOnlyMapping(map));
    let state = ShareState {
        // In bounds: checked against the file's size above.
        word: ptr.wrapping_add(loc.ctl).cast::<u32>(),
        _mapping: mapping.clone(),
    };
    check_control(loc, u64::from_le_bytes(id), state.is_live())?;
    // SAFETY: the mapping holds `len` bytes and is owned by the RawMemory; not writable.
    let memory = unsafe { RawMemory::new(ptr, loc.len, false, mapping) };
    Ok(PeerMapping { memory, state })
}

/// A same-node peer's shared region read with `pread` on its file, never
/// mapped: a mapping keeps every page this process touched in its resident
/// size (as shared memory, `RssShmem`) for as long as it lives, so a rank
/// reading its peers' shares would count them in its own resident size.
/// The bytes are copied from the same pages either way (a memory copy, plus
/// one system call per read). A rank with a memory budget reads its peers
/// this way (see [`read_node_peers_by_file`]).
pub struct PeerFile {
    file: File,
    len: usize,
}

impl PeerFile {
    /// Opens a same-node peer's region for reading, checked as [`map_peer`]
    /// checks it (its id, and that it is live).
    pub fn open(loc: &NodeLocator) -> Result<PeerFile> {
        use std::os::unix::fs::FileExt;
        let file = open_peer_file(loc)?;
        let mut block = [0u8; CONTROL_BYTES];
        file.read_exact_at(&mut block, loc.ctl as u64)
            .map_err(|e| Error::io(format!("reading peer share {}", loc.path().display()), e))?;
        let state = u32::from_ne_bytes(block[..4].try_into().expect("4 bytes"));
        let id = u64::from_le_bytes(block[ID_AT..ID_AT + 8].try_into().expect("8 bytes"));
        check_control(loc, id, state == STATE_LIVE)?;
        Ok(PeerFile { file, len: loc.len })
    }
}

impl Memory for PeerFile {
    fn len(&self) -> usize {
        self.len
    }
    /// Never mapped: no address (nothing registers a peer's share).
    fn as_ptr(&self) -> *const u8 {
        std::ptr::null()
    }
    fn mapped_len(&self) -> usize {
        0
    }
    fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        use std::os::unix::fs::FileExt;
        crate::memory::check_range("read", offset, dst.len(), self.len)?;
        self.file
            .read_exact_at(dst, offset as u64)
            .map_err(|e| Error::io("reading a same-node peer's share", e))
    }
    fn write_at(&self, _offset: usize, _src: &[u8]) -> Result<()> {
        Err(Error::Unsupported("this share is read-only here".into()))
    }
}

/// Swaps the mapped views of same-node peers (`views`, per rank) for
/// [`PeerFile`]s where `locators` says where their regions are: the reads
/// of a rank with a memory budget, whose resident size must not grow by the
/// peers' pages it reads. A region that cannot be opened keeps its mapping.
pub fn read_node_peers_by_file(
    views: &mut [Option<Arc<dyn Memory>>],
    locators: &[Option<NodeLocator>],
) {
    for (view, loc) in views.iter_mut().zip(locators) {
        if let (Some(_), Some(loc)) = (&view, loc) {
            if let Ok(file) = PeerFile::open(loc) {
                *view = Some(Arc::new(file));
            }
        }
    }
}

/// The locators of this host's ranks, the others' dropped: a rank keeps
/// other hosts' locators only to publish them (a method-2 core's rank 0),
/// as each costs about 130 bytes per rank and variable.
pub fn same_host_only(locators: Vec<Option<NodeLocator>>) -> Vec<Option<NodeLocator>> {
    let host = host_id();
    locators
        .into_iter()
        .map(|l| l.filter(|l| l.host == host))
        .collect()
}

/// Maps every locator on this host except rank `own`'s (`None`: read remotely).
pub fn map_node_peers(
    locators: &[Option<NodeLocator>],
    own: Option<usize>,
) -> Vec<Option<Arc<dyn Memory>>> {
    map_node_peers_watched(locators, own)
        .into_iter()
        .map(|p| p.map(|p| Arc::new(p.memory) as Arc<dyn Memory>))
        .collect()
}

/// As [`map_node_peers`], keeping each mapping's state word (readers in
/// another job check it: see [`ShareState`]).
pub fn map_node_peers_watched(
    locators: &[Option<NodeLocator>],
    own: Option<usize>,
) -> Vec<Option<PeerMapping>> {
    let host = host_id();
    locators
        .iter()
        .enumerate()
        .map(|(rank, loc)| match loc {
            // A mapping that fails (another container, no /proc access) falls back to remote reads.
            Some(l) if l.host == host && Some(rank) != own => map_peer(l).ok(),
            _ => None,
        })
        .collect()
}

struct ReadOnlyMapping(#[allow(dead_code)] Mmap);

/// Whether process `pid` (of this host) still exists.
pub fn process_alive(pid: u32) -> bool {
    // SAFETY: kill with signal 0 only checks for existence and permission.
    let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Identity of this machine: peers with the same id share /dev/shm.
/// `DDSTORE_HOST_ID` overrides it (tests use it to make ranks "remote").
pub fn host_id() -> String {
    if let Ok(Some(id)) = crate::config::env_setting("DDSTORE_HOST_ID") {
        return id;
    }
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!("{}/{}", host.trim(), boot.trim())
}

/// Same-node sharing of one variable, as set up by [`share_on_node`].
pub struct NodeShares {
    /// Per rank: a readable mapping of its share, or `None` (read it remotely).
    pub views: Vec<Option<Arc<dyn Memory>>>,
    /// Per rank: where its share is (for extra jobs on the same node, method 2).
    pub locators: Vec<Option<NodeLocator>>,
}

/// Collective: tells every rank where this rank's shared region is and maps
/// the regions of same-node peers.
pub fn share_on_node(comm: &dyn Comm, region: &Region) -> Result<NodeShares> {
    share_on_node_located(comm, region.locator())
}

/// As [`share_on_node`], for a region whose locator is `locator`.
pub fn share_on_node_located(comm: &dyn Comm, locator: Option<NodeLocator>) -> Result<NodeShares> {
    let mine = serde_json::to_vec(&locator).expect("locator serialises");
    let locators = comm
        .allgather(&mine)?
        .iter()
        .enumerate()
        .map(|(rank, raw)| {
            serde_json::from_slice::<Option<NodeLocator>>(raw)
                .map_err(|e| Error::Comm(format!("bad node record from rank {rank}: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let views = map_node_peers(&locators, Some(comm.rank()));
    // Peers hold their mappings before anyone may free (and close) a region.
    comm.barrier()?;
    Ok(NodeShares { views, locators })
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
    fn scattered_ranges_pack_in_order_up_to_the_last_byte() {
        // A gather reply's packing: rows from anywhere, the last one ending the region
        // (where the next range's prefetch must stay inside it), and a range past it refused.
        let len = 3 * PAGE + 100;
        let r = Region::anonymous(len).unwrap();
        let bytes: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        r.write_at(0, &bytes).unwrap();
        let ranges = [
            (5000u64, 3000u64),
            (0, 10),
            (len as u64 - 1500, 1500),
            (4096, 1),
        ];
        let mut out = vec![0u8; 4511];
        r.read_ranges(&ranges, &mut out).unwrap();
        let want: Vec<u8> = ranges
            .iter()
            .flat_map(|&(o, l)| bytes[o as usize..(o + l) as usize].to_vec())
            .collect();
        assert_eq!(out, want);
        let past = [(0u64, 10u64), (len as u64 - 5, 10)];
        assert!(r.read_ranges(&past, &mut [0u8; 20]).is_err());
    }

    #[test]
    fn shared_region_is_mappable_read_only_and_nameless() {
        let r = Region::shared("x/y", 8192).unwrap();
        r.write_at(4096, b"hello").unwrap();
        let loc = r.locator().unwrap();
        let mode = std::fs::metadata(loc.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let peer = map_peer(&loc).unwrap();
        let mut out = [0u8; 5];
        peer.memory.read_at(4096, &mut out).unwrap();
        assert_eq!(&out, b"hello");
        assert!(peer.memory.write_at(0, b"x").is_err());
        assert!(peer.state.is_live());
        // Our own rank is never mapped as a peer; a dead pid falls back to remote.
        let dead = NodeLocator {
            pid: u32::MAX - 1,
            ..loc.clone()
        };
        let views = map_node_peers(&[Some(loc.clone()), Some(dead), None, Some(loc)], Some(0));
        assert_eq!(
            views.iter().map(|v| v.is_some()).collect::<Vec<_>>(),
            [false, false, false, true]
        );
    }

    #[test]
    fn shared_regions_and_peer_mappings_populate_their_page_tables() {
        let len = 3 * PAGE + 5;
        let r = Region::shared("p", len).unwrap();
        let loc = r.locator().unwrap();
        let peer = map_peer(&loc).unwrap();
        let populated = r.populate_read();
        if populated != 0 {
            // (0: a kernel without MADV_POPULATE_READ.)
            assert_eq!(populated, len);
            assert_eq!(peer.memory.populate_read(), len);
        }
        // Private memory's page tables are copied by fork; a peer read by file maps nothing.
        assert_eq!(Region::anonymous(len).unwrap().populate_read(), 0);
        assert_eq!(PeerFile::open(&loc).unwrap().populate_read(), 0);
    }

    #[test]
    fn a_freed_region_reads_retired_through_a_mapping_that_outlives_it() {
        let r = Region::shared("v", 100).unwrap();
        r.write_at(0, b"old").unwrap();
        let loc = r.locator().unwrap();
        assert_eq!((loc.ctl, loc.len), (PAGE, 100));
        let peer = map_peer(&loc).unwrap();
        assert!(peer.state.is_live());
        drop(r);
        // The pages outlive the owner's mapping, the state word says freed.
        let mut out = [0u8; 3];
        peer.memory.read_at(0, &mut out).unwrap();
        assert_eq!(&out, b"old");
        assert!(!peer.state.is_live());
    }

    #[test]
    fn only_this_hosts_locators_are_kept() {
        let r = Region::shared("h", 4096).unwrap();
        let here = r.locator().unwrap();
        let elsewhere = NodeLocator {
            host: format!("{}-other", here.host),
            ..here.clone()
        };
        let kept = same_host_only(vec![Some(here.clone()), Some(elsewhere), None]);
        assert_eq!(kept, vec![Some(here), None, None]);
    }

    #[test]
    fn a_locator_whose_descriptor_now_holds_another_region_is_refused() {
        let r = Region::shared("v", 5000).unwrap();
        let loc = r.locator().unwrap();
        assert_eq!(loc.ctl, 2 * PAGE);
        let other = NodeLocator {
            id: loc.id ^ 1,
            ..loc.clone()
        };
        assert!(map_peer(&other).is_err());
        let moved = NodeLocator {
            ctl: PAGE,
            ..loc.clone()
        };
        assert!(map_peer(&moved).is_err(), "control block inside the share");
        assert!(map_peer(&loc).is_ok());
    }

    #[test]
    fn a_peer_file_reads_the_region_without_mapping_it_and_checks_its_locator() {
        let r = Region::shared("v", 3 * PAGE).unwrap();
        let rows: Vec<u8> = (0..3 * PAGE).map(|i| (i % 251) as u8).collect();
        r.write_at(0, &rows).unwrap();
        let loc = r.locator().unwrap();
        let peer = PeerFile::open(&loc).unwrap();
        let mut out = vec![0u8; PAGE + 10];
        peer.read_at(PAGE - 5, &mut out).unwrap();
        assert_eq!(out, rows[PAGE - 5..2 * PAGE + 5]);
        let mut ranges = vec![0u8; 7];
        peer.read_ranges(&[(0, 3), (3 * PAGE as u64 - 4, 4)], &mut ranges)
            .unwrap();
        assert_eq!(ranges[..3], rows[..3]);
        assert_eq!(ranges[3..], rows[3 * PAGE - 4..]);
        assert!(matches!(
            peer.read_at(3 * PAGE - 3, &mut [0u8; 4]),
            Err(Error::IndexOutOfRange(_))
        ));
        assert!(peer.write_at(0, b"x").is_err());
        assert!(peer.as_ptr().is_null() && peer.mapped_len() == 0);
        let other = NodeLocator {
            id: loc.id ^ 1,
            ..loc.clone()
        };
        assert!(PeerFile::open(&other).is_err(), "another region's id");
        // The views of mapped peers become files; the own rank and remote ranks stay as they are.
        let mut views = map_node_peers(&[Some(loc.clone()), Some(loc.clone()), None], Some(0));
        read_node_peers_by_file(&mut views, &[Some(loc.clone()), Some(loc.clone()), None]);
        assert!(views[0].is_none() && views[2].is_none());
        let view = views[1].as_ref().unwrap();
        assert!(view.as_ptr().is_null());
        let mut first = [0u8; 4];
        view.read_at(0, &mut first).unwrap();
        assert_eq!(first, rows[..4]);
        drop(r);
        assert!(PeerFile::open(&loc).is_err(), "a freed region");
    }

    /// The line of /proc/self/maps whose range holds `addr`, if any.
    fn maps_line_holding(addr: usize) -> Option<String> {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        maps.lines()
            .find(|l| {
                let range = l.split(' ').next().unwrap_or("");
                let (a, b) = range.split_once('-').unwrap_or(("0", "0"));
                let (a, b) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16));
                matches!((a, b), (Ok(a), Ok(b)) if a <= addr && addr < b)
            })
            .map(str::to_string)
    }

    #[test]
    fn a_region_read_by_other_jobs_leaves_an_inaccessible_reservation() {
        // (Without keep_address the range is unmapped: the hygiene tests count mappings.)
        let r = Region::shared_with("v", 5 * PAGE, true).unwrap();
        let addr = r.as_ptr() as usize;
        drop(r);
        let line = maps_line_holding(addr).expect("the kept range is still mapped");
        assert!(line.contains(" ---p "), "{line}");
    }

    #[test]
    fn a_freed_region_keeps_its_addresses_from_the_next_region() {
        for shared in [false, true] {
            let make = || {
                if shared {
                    Region::shared_with("v", 3 * PAGE, true).unwrap()
                } else {
                    Region::anonymous_with(3 * PAGE, true).unwrap()
                }
            };
            let first = make();
            let addr = first.as_ptr() as usize;
            drop(first);
            let next: Vec<Region> = (0..4).map(|_| make()).collect();
            assert!(
                next.iter().all(|r| r.as_ptr() as usize != addr),
                "a new region took a freed one's address (shared: {shared})"
            );
        }
    }
}
