//! Shares in caller-owned memory, usually a GPU's (`add_device=`): registered
//! with `fi_mr_regattr` naming the memory's interface and device, in a domain
//! opened with `FI_HMEM`, so peers read it with one-sided reads (GPUDirect
//! RDMA on cxi and verbs). Such shares are never node-shared through memfd:
//! peers on the node read them through the fabric too.

use std::sync::Arc;

use ddstore_core::comm::Comm;
use ddstore_core::external::{ExternalShare, HmemIface};
use ddstore_core::memory::Memory;
use ddstore_core::region::Region;
use ddstore_core::transport::{ExposeOptions, Exposed};
use libfabric_sys as sys;

use super::{Info, InfoRequest, MemoryRegion, Node, OfiTransport, ShareRecord};
use crate::error::{FabricError, FabricResult};

fn iface_code(iface: HmemIface) -> sys::fi_hmem_iface {
    match iface {
        HmemIface::System => sys::FI_HMEM_SYSTEM,
        HmemIface::Cuda => sys::FI_HMEM_CUDA,
        HmemIface::Rocr => sys::FI_HMEM_ROCR,
        HmemIface::Ze => sys::FI_HMEM_ZE,
    }
}

/// A rank's registration outcome, gathered so one rank's failure fails every
/// rank instead of leaving them waiting.
const OK: u8 = 1;
const FAILED: u8 = 0;

/// This rank's share, registered.
struct Registered {
    node: Arc<Node>,
    record: ShareRecord,
    mr: MemoryRegion,
    /// The host page registered in place of an empty share.
    placeholder: Option<Arc<dyn Memory>>,
}

impl OfiTransport {
    /// The node whose domain has FI_HMEM (opened once).
    fn hmem_node(&self) -> FabricResult<Arc<Node>> {
        // Device shares are read one-sided: the gather path serves host shares.
        let request = InfoRequest {
            hmem: true,
            tagged: false,
            ..self.request.clone()
        };
        let mut slot = self.hmem_node.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = slot.as_ref() {
            if !n.domain.usable_here() {
                return Err(FabricError::Unavailable(
                    "a forked process cannot expose shares: call expose in the parent".into(),
                ));
            }
            return Ok(n.clone());
        }
        let info = Info::query(&request).map_err(|e| {
            FabricError::Unavailable(format!(
                "libfabric provider {:?} cannot register device memory (FI_HMEM) here ({e}): \
                 use DDSTORE_FABRIC=cxi or verbs with a libfabric built with CUDA/ROCm support, \
                 or drop add_device= (keep shares on the host; device= still puts batches on the GPU)",
                self.provider
            ))
        })?;
        let node = Arc::new(Node::open(
            &info,
            false,
            self.config.timeout,
            self.config.gather_readers,
            &self.access,
            self.config.max_connections,
        )?);
        *slot = Some(node.clone());
        Ok(node)
    }

    /// Collective: registers this rank's external share and gathers every rank's record.
    pub(super) fn expose_hmem(
        &self,
        comm: &Arc<dyn Comm>,
        share: ExternalShare,
        _opts: &ExposeOptions,
    ) -> ddstore_core::Result<Exposed> {
        let len = share.len();
        let registered = self.register_external(&share);
        let mine = match &registered {
            Ok(r) => [&[OK][..], &r.record.encode()].concat(),
            Err(e) => [&[FAILED][..], e.to_string().as_bytes()].concat(),
        };
        let gathered = comm.allgather(&mine)?;
        let Registered {
            node,
            mr,
            placeholder,
            ..
        } = registered?;
        let mut records = Vec::with_capacity(gathered.len());
        for (rank, raw) in gathered.into_iter().enumerate() {
            match raw.split_first() {
                Some((&OK, record)) => records.push(record.to_vec()),
                Some((_, why)) => {
                    return Err(FabricError::Unavailable(format!(
                        "rank {rank} could not register its device share: {}",
                        String::from_utf8_lossy(why)
                    ))
                    .into())
                }
                None => {
                    return Err(FabricError::Unavailable(format!(
                        "rank {rank} sent an empty share record"
                    ))
                    .into())
                }
            }
        }
        let peers = self.decode_all(&records)?;
        let local: Arc<dyn Memory> = Arc::new(share);
        // The MR closes before the memory it covers is released.
        let keep = placeholder.unwrap_or_else(|| local.clone());
        // Readers read into host memory: a forked child (which must not touch
        // the GPU runtime) opens its reader domain without FI_HMEM, as for host shares.
        let shares = self.shares(node, peers, Some((mr, keep)));
        debug_assert_eq!(local.len(), len);
        Ok(Exposed {
            local,
            node_peers: (0..comm.size()).map(|_| None).collect(),
            remote: Arc::new(shares),
            records,
            node_locators: Vec::new(),
        })
    }

    /// Registers the share (or, when empty, a host page nobody reads) and
    /// builds this rank's record.
    fn register_external(&self, share: &ExternalShare) -> FabricResult<Registered> {
        let node = if share.iface().is_device() || self.config.ofi_hmem {
            self.hmem_node()?
        } else {
            self.node()?
        };
        let (addr, reg_len, iface, device, placeholder) = if share.is_empty() {
            let page = Region::anonymous(0)
                .map_err(|e| FabricError::Unavailable(format!("a placeholder page: {e}")))?;
            let page: Arc<dyn Memory> = Arc::new(page);
            (page.as_ptr(), 1, HmemIface::System, 0, Some(page))
        } else {
            (
                share.as_ptr(),
                share.len(),
                share.iface(),
                share.device(),
                None,
            )
        };
        // SAFETY: the share's memory stays allocated while its owner lives;
        // the owner (or the placeholder page) is held by OfiShares next to
        // the MR, which is closed first.
        let mr = unsafe {
            MemoryRegion::register_hmem(
                &node.domain,
                &node.target,
                addr,
                reg_len,
                sys::FI_REMOTE_READ as u64,
                iface_code(iface),
                device,
            )
        }
        .map_err(|e| {
            FabricError::Unavailable(format!(
                "registering {} bytes of {} memory (device {device}) with {:?}: {e}",
                reg_len,
                iface.name(),
                self.provider
            ))
        })?;
        let record = ShareRecord::new(
            self.provider.clone(),
            node.target.name()?,
            addr as u64,
            mr.key(),
            share.len() as u64,
        );
        Ok(Registered {
            node,
            record,
            mr,
            placeholder,
        })
    }
}
