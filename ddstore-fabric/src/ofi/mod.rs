//! Methods 1 and 2: libfabric one-sided reads (`fi_read`) of every rank's share.
//!
//! One owning wrapper per libfabric object ([`Fabric`], [`Domain`], [`Cq`],
//! [`Av`], [`Endpoint`], [`MemoryRegion`], [`Info`]); children hold an `Arc`
//! of their parent, so objects close in fabtests' order (endpoint, CQ/AV,
//! MR, domain, fabric). Objects record the process that opened them and are
//! abandoned, never closed, in a forked child. Each has a `close()` that
//! reports `fi_close`'s answer (a store's `free` closes through it); a drop
//! closes too, but can only log a failure (and fails a debug assertion).

mod av;
mod context;
mod cq;
mod domain;
mod dst;
mod endpoint;
mod env;
mod error;
mod fabric;
mod gather;
mod iface;
mod info;
mod mr;
mod pool;
mod progress;
mod reader;
mod record;
mod select;
mod signal_owners;
mod silent_conns;
mod transport;
mod window;

pub use av::Av;
pub use cq::{Cq, CqError, Poll};
pub use domain::Domain;
pub use endpoint::Endpoint;
pub use env::{
    apply_libfabric_defaults, apply_libfabric_defaults_after, defaults_for, reason,
    started_after_defaults, Applied, PROVIDER_SIGNAL_VARIABLES,
};
pub use error::strerror;
pub use fabric::Fabric;
pub use info::{Info, InfoEntry, MR_MODES};
pub use mr::MemoryRegion;
pub use reader::OfiReader;

/// The gather path's wire format, for tools that speak it (the tests'
/// attacker, `examples/ofi_attack.rs`).
pub mod wire {
    pub use super::gather::wire::{
        encode, encode_ragged, reply_tag, MacKey, Nonce, RaggedPart, RaggedRequest, Request,
        MAC_BYTES, REQUEST_TAG, STATUS_MASK,
    };
}
pub use record::{
    join_records, split_records, PeerShare, Peers, ShareRecord, SplitRecords, MAX_ADDR_BYTES,
    PACKED_SHARE_BYTES,
};
pub use select::{
    is_provider_name, nic_for_rank, provider_candidates, InfoRequest, DEFAULT_CANDIDATES,
    FABRIC_VALUES,
};
pub use signal_owners::provider_signal_handlers;
pub use transport::{gather_by_default, OfiShares, OfiTransport};

use libfabric_sys as sys;

/// A provider usable for one-sided reads on this machine (for `info`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProviderInfo {
    /// Provider name, e.g. `tcp;ofi_rxm`.
    pub provider: String,
    /// Fabric name.
    pub fabric: String,
    /// Domain name (the NIC).
    pub domain: String,
    /// mr_mode bits the provider requires, and their names.
    pub mr_mode: u64,
    /// Names of the `mr_mode` bits.
    pub mr_mode_names: Vec<&'static str>,
    /// Reads of a share need its owner to call into libfabric.
    pub manual_progress: bool,
    /// Longest message the endpoint accepts.
    pub max_msg_size: u64,
}

const MR_MODE_NAMES: &[(u32, &str)] = &[
    (sys::FI_MR_LOCAL, "FI_MR_LOCAL"),
    (sys::FI_MR_RAW, "FI_MR_RAW"),
    (sys::FI_MR_VIRT_ADDR, "FI_MR_VIRT_ADDR"),
    (sys::FI_MR_ALLOCATED, "FI_MR_ALLOCATED"),
    (sys::FI_MR_PROV_KEY, "FI_MR_PROV_KEY"),
    (sys::FI_MR_MMU_NOTIFY, "FI_MR_MMU_NOTIFY"),
    (sys::FI_MR_RMA_EVENT, "FI_MR_RMA_EVENT"),
    (sys::FI_MR_ENDPOINT, "FI_MR_ENDPOINT"),
    (sys::FI_MR_HMEM, "FI_MR_HMEM"),
];

/// Every provider/domain offering RDM endpoints with one-sided reads here.
pub fn usable_providers() -> Vec<ProviderInfo> {
    let Ok(info) = Info::query(&InfoRequest::default()) else {
        return Vec::new();
    };
    let mut out: Vec<ProviderInfo> = Vec::new();
    for e in info.entries() {
        let mr_mode = e.mr_mode();
        let p = ProviderInfo {
            provider: e.provider(),
            fabric: e.fabric_name(),
            domain: e.domain_name(),
            mr_mode,
            mr_mode_names: MR_MODE_NAMES
                .iter()
                .filter(|(bit, _)| mr_mode & *bit as u64 != 0)
                .map(|(_, n)| *n)
                .collect(),
            manual_progress: e.manual_data_progress(),
            max_msg_size: e.max_msg_size() as u64,
        };
        if !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

/// The runtime libfabric version, e.g. "1.17".
pub fn libfabric_version() -> String {
    // SAFETY: fi_version takes no arguments and returns a number.
    let v = unsafe { sys::fi_version() };
    format!("{}.{}", v >> 16, v & 0xffff)
}
