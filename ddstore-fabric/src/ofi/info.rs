//! `fi_getinfo` results: an owned `fi_info` list and what we ask for.

use std::ffi::{CStr, CString};
use std::os::raw::c_char;
use std::ptr::{self, NonNull};

use libfabric_sys as sys;

use super::error::{ofi_error, strerror};
use super::select::InfoRequest;
use crate::error::{FabricError, FabricResult};

/// The memory-registration modes we declare we can honour.
pub const MR_MODES: u64 = (sys::FI_MR_LOCAL
    | sys::FI_MR_VIRT_ADDR
    | sys::FI_MR_PROV_KEY
    | sys::FI_MR_ALLOCATED
    | sys::FI_MR_ENDPOINT) as u64;

/// A list of `fi_info` entries this process owns (freed with `fi_freeinfo`).
pub struct Info {
    head: NonNull<sys::fi_info>,
}

// SAFETY: the list is plain heap data owned by this value; libfabric keeps no
// reference to it, and we only read it through `&self`.
unsafe impl Send for Info {}
// SAFETY: shared use only reads the list.
unsafe impl Sync for Info {}

fn strdup(s: &str) -> FabricResult<*mut c_char> {
    let c = CString::new(s).map_err(|_| FabricError::Invalid(format!("{s:?} contains NUL")))?;
    // SAFETY: c is a valid NUL-terminated string; the copy is malloc'd so
    // that fi_freeinfo can free it with the hints.
    Ok(unsafe { libc::strdup(c.as_ptr()) })
}

impl Info {
    /// `fi_getinfo` for FI_EP_RDM with FI_RMA | FI_READ | FI_REMOTE_READ.
    pub fn query(req: &InfoRequest) -> FabricResult<Info> {
        // libfabric reads its variables at its first fi_getinfo: pyddstore's defaults first.
        super::env::before_first_query();
        let node = req
            .node
            .as_deref()
            .map(CString::new)
            .transpose()
            .map_err(|_| FabricError::Invalid("node address contains NUL".into()))?;
        // SAFETY: fi_allocinfo returns NULL or an fi_info whose attribute
        // structs are allocated and zeroed; every string put into it is
        // malloc'd, and fi_freeinfo releases all of it.
        unsafe {
            let hints = sys::ddfi_allocinfo();
            if hints.is_null() {
                return Err(ofi_error("fi_allocinfo", -(sys::FI_ENOMEM as i64)));
            }
            let h = &mut *hints;
            (*h.ep_attr).type_ = sys::FI_EP_RDM;
            h.caps = (sys::FI_RMA | sys::FI_READ | sys::FI_REMOTE_READ) as u64;
            h.mode = sys::FI_CONTEXT | sys::FI_CONTEXT2;
            if req.tagged {
                h.caps |= (sys::FI_TAGGED | sys::FI_SEND | sys::FI_RECV) as u64;
                if req.directed {
                    h.caps |= sys::FI_DIRECTED_RECV;
                }
            }
            let mut mr_mode = MR_MODES;
            if req.hmem {
                // Device memory: ask for the capability and declare we
                // register device buffers (FI_MR_HMEM).
                h.caps |= sys::FI_HMEM;
                mr_mode |= sys::FI_MR_HMEM as u64;
            }
            (*h.domain_attr).mr_mode = mr_mode as i32;
            (*h.domain_attr).threading = sys::FI_THREAD_SAFE;
            let fill = || -> FabricResult<()> {
                if let Some(p) = &req.provider {
                    (*h.fabric_attr).prov_name = strdup(p)?;
                }
                if let Some(d) = &req.domain {
                    (*h.domain_attr).name = strdup(d)?;
                }
                Ok(())
            };
            if let Err(e) = fill() {
                sys::fi_freeinfo(hints);
                return Err(e);
            }
            let (node_ptr, flags) = match &node {
                Some(n) => (n.as_ptr(), sys::FI_SOURCE),
                None => (ptr::null(), 0),
            };
            let mut out: *mut sys::fi_info = ptr::null_mut();
            let rc = sys::fi_getinfo(
                sys::FI_API_VERSION,
                node_ptr,
                ptr::null(),
                flags,
                hints,
                &mut out,
            );
            sys::fi_freeinfo(hints);
            if rc == -(sys::FI_ENODATA as i32) || (rc == 0 && out.is_null()) {
                return Err(FabricError::Unavailable(format!(
                    "no libfabric provider offers RDM one-sided reads for {}",
                    describe(req)
                )));
            }
            if rc != 0 {
                return Err(FabricError::Ofi {
                    call: "fi_getinfo",
                    code: rc as i64,
                    message: format!("{} ({})", strerror(rc as i64), describe(req)),
                    peer: None,
                });
            }
            let info = Info {
                head: NonNull::new_unchecked(out),
            };
            info.unique_shm_names()?;
            Ok(info)
        }
    }

    /// shm names its shared-memory files after `src_addr` ("fi_shm://<pid>"),
    /// the uid and a per-process counter. A process killed before closing its
    /// endpoints leaves those files in /dev/shm, and a later process given
    /// the same pid then fails `fi_enable` with EBUSY. A random part after
    /// the pid keeps every process's names its own.
    fn unique_shm_names(&self) -> FabricResult<()> {
        let nonce = {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u128(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos())
                    .unwrap_or(0),
            );
            h.finish() as u32
        };
        let mut cur = self.head.as_ptr();
        while !cur.is_null() {
            // SAFETY: cur is an entry of the list this value owns; src_addr is
            // malloc'd by libfabric and freed by fi_freeinfo, so it is replaced
            // by a malloc'd copy (strdup) and the old one freed here.
            unsafe {
                let e = &mut *cur;
                let shm = !e.fabric_attr.is_null()
                    && !(*e.fabric_attr).prov_name.is_null()
                    && CStr::from_ptr((*e.fabric_attr).prov_name).to_bytes() == b"shm";
                if shm && e.addr_format == sys::FI_ADDR_STR && !e.src_addr.is_null() {
                    let old = CStr::from_ptr(e.src_addr as *const c_char)
                        .to_string_lossy()
                        .into_owned();
                    if old.starts_with("fi_shm://") && !old.contains('-') {
                        let name = strdup(&format!("{old}-{nonce:08x}"))?;
                        libc::free(e.src_addr);
                        e.src_addrlen = libc::strlen(name) + 1;
                        e.src_addr = name.cast();
                    }
                }
                cur = e.next;
            }
        }
        Ok(())
    }

    /// Every entry of the list, in provider order.
    pub fn entries(&self) -> impl Iterator<Item = InfoEntry<'_>> {
        let mut cur: *const sys::fi_info = self.head.as_ptr();
        std::iter::from_fn(move || {
            // SAFETY: cur is NULL or an entry of the list we own, alive for 'self.
            let entry = unsafe { cur.as_ref()? };
            cur = entry.next;
            Some(InfoEntry { info: entry })
        })
    }

    /// The first (preferred) entry.
    pub fn first(&self) -> InfoEntry<'_> {
        // SAFETY: head is non-null and owned for the lifetime of self.
        let info = unsafe { self.head.as_ref() };
        InfoEntry { info }
    }

    /// An owned copy of the first entry alone (`fi_dupinfo`).
    pub fn dup_first(&self) -> FabricResult<Info> {
        // SAFETY: head is a valid entry; fi_dupinfo copies exactly one entry.
        let dup = unsafe { sys::fi_dupinfo(self.head.as_ptr()) };
        NonNull::new(dup)
            .map(|head| Info { head })
            .ok_or_else(|| ofi_error("fi_dupinfo", -(sys::FI_ENOMEM as i64)))
    }

    /// The entry as libfabric's calls take it; valid while `self` lives.
    pub(crate) fn as_ptr(&self) -> *mut sys::fi_info {
        self.head.as_ptr()
    }
}

impl Drop for Info {
    fn drop(&mut self) {
        // SAFETY: we own the list (from fi_getinfo or fi_dupinfo); freed once.
        // fi_info lists are plain heap memory, so freeing one in a forked
        // child is as safe as in the parent.
        unsafe { sys::fi_freeinfo(self.head.as_ptr()) }
    }
}

fn describe(req: &InfoRequest) -> String {
    format!(
        "provider {}, domain {}, node {}{}",
        req.provider.as_deref().unwrap_or("(any)"),
        req.domain.as_deref().unwrap_or("(any)"),
        req.node.as_deref().unwrap_or("(any)"),
        if req.hmem {
            ", device memory (FI_HMEM)"
        } else {
            ""
        },
    ) + if req.tagged { ", tagged messages" } else { "" }
}

/// One `fi_info` entry, borrowed from an [`Info`].
#[derive(Clone, Copy)]
pub struct InfoEntry<'a> {
    info: &'a sys::fi_info,
}

fn c_str(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: libfabric's name fields are NUL-terminated strings owned by the entry.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

impl InfoEntry<'_> {
    fn fabric_attr(&self) -> Option<&sys::fi_fabric_attr> {
        // SAFETY: attribute pointers of a getinfo entry are NULL or valid for its lifetime.
        unsafe { self.info.fabric_attr.as_ref() }
    }
    fn domain_attr(&self) -> Option<&sys::fi_domain_attr> {
        // SAFETY: as above.
        unsafe { self.info.domain_attr.as_ref() }
    }
    /// The provider name, e.g. `tcp;ofi_rxm`.
    pub fn provider(&self) -> String {
        self.fabric_attr()
            .map(|a| c_str(a.prov_name))
            .unwrap_or_default()
    }
    /// The fabric name.
    pub fn fabric_name(&self) -> String {
        self.fabric_attr()
            .map(|a| c_str(a.name))
            .unwrap_or_default()
    }
    /// The domain name (the NIC).
    pub fn domain_name(&self) -> String {
        self.domain_attr()
            .map(|a| c_str(a.name))
            .unwrap_or_default()
    }
    /// The mr_mode bits the provider requires of us.
    pub fn mr_mode(&self) -> u64 {
        self.domain_attr()
            .map(|a| a.mr_mode as u32 as u64)
            .unwrap_or(0)
    }
    /// The side being read must call into libfabric for reads to progress.
    pub fn manual_data_progress(&self) -> bool {
        self.domain_attr()
            .map(|a| a.data_progress == sys::FI_PROGRESS_MANUAL)
            .unwrap_or(true)
    }
    /// Longest message the endpoint accepts.
    pub fn max_msg_size(&self) -> usize {
        // SAFETY: as above.
        unsafe { self.info.ep_attr.as_ref() }
            .map(|a| a.max_msg_size)
            .unwrap_or(0)
    }
    /// Entries of the transmit queue (0 when the provider does not say).
    pub fn tx_size(&self) -> usize {
        // SAFETY: as above.
        unsafe { self.info.tx_attr.as_ref() }
            .map(|a| a.size)
            .unwrap_or(0)
    }
    /// Most iov entries one send takes (at least 1).
    pub fn tx_iov_limit(&self) -> usize {
        // SAFETY: attribute pointers of a getinfo entry are NULL or valid for its lifetime.
        unsafe { self.info.tx_attr.as_ref() }
            .map(|a| a.iov_limit)
            .unwrap_or(1)
            .max(1)
    }
    /// The capability bits of this entry.
    pub fn caps(&self) -> u64 {
        self.info.caps
    }
    /// Bytes of remote CQ data a message may carry (0 when it does not say).
    pub fn cq_data_size(&self) -> usize {
        self.domain_attr().map(|a| a.cq_data_size).unwrap_or(0)
    }
    /// Bytes in a memory key this provider accepts (0 when it does not say).
    pub fn mr_key_size(&self) -> usize {
        self.domain_attr().map(|a| a.mr_key_size).unwrap_or(0)
    }
}
