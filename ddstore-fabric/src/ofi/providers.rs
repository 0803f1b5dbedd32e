//! Which libfabric providers a `DDSTORE_FABRIC` value names: a leaf, so the
//! libfabric variables (`env.rs`) and the provider choice (`select.rs`) both
//! read it.

use crate::error::{FabricError, FabricResult};

/// `DDSTORE_FABRIC` values with a meaning of their own, for messages; any other
/// libfabric provider name (e.g. "udp;ofi_rxd") is passed through as given.
pub const FABRIC_VALUES: &str =
    "cxi, verbs, efa, opx, psm3, psm2, ucx, hsn/tcp, shm, sockets, or any libfabric provider name";

/// Providers tried when `DDSTORE_FABRIC` is unset, best first: NIC providers only show
/// up where their hardware is, so tcp;ofi_rxm is what a machine without one gets.
pub const DEFAULT_CANDIDATES: [&str; 5] = ["cxi", "efa", "opx", "verbs;ofi_rxm", "tcp;ofi_rxm"];

/// Providers to try, best first, for a `DDSTORE_FABRIC` value (unset: all).
///
/// Names map to libfabric providers (`verbs` and `tcp`/`hsn` through the ofi_rxm
/// utility provider, which gives them RDM endpoints); any other name made of
/// letters, digits, `_`, `-` and `;` is passed through, so every RDM provider with
/// RMA reads (efa, opx, psm3, ucx, ...) can be chosen; its mr_mode is honoured.
pub fn provider_candidates(value: Option<&str>) -> FabricResult<Vec<String>> {
    let value = value
        .map(|v| v.trim().to_ascii_lowercase())
        .filter(|v| !v.is_empty());
    let one = |p: &str| Ok(vec![p.to_string()]);
    match value.as_deref() {
        None => Ok(DEFAULT_CANDIDATES.iter().map(|p| p.to_string()).collect()),
        Some("verbs") => one("verbs;ofi_rxm"),
        Some("hsn" | "tcp") => one("tcp;ofi_rxm"),
        Some(name) if is_provider_name(name) => one(name),
        Some(other) => Err(FabricError::Invalid(format!(
            "DDSTORE_FABRIC={other:?} is not a provider name: use one of {FABRIC_VALUES}"
        ))),
    }
}

/// Whether `name` can be a libfabric provider name ("psm3", "tcp;ofi_rxm").
pub fn is_provider_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name.split(';').all(|part| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        })
}
