//! Which provider and which NIC: `DDSTORE_FABRIC`, `FABRIC_IFACE`, `nic_map`.

use super::iface::ipv4_of;
use crate::error::{FabricError, FabricResult};

/// What to ask `fi_getinfo` for: an RDM endpoint with one-sided reads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InfoRequest {
    /// `fabric_attr.prov_name`, e.g. "tcp;ofi_rxm"; `None` = any provider.
    pub provider: Option<String>,
    /// `domain_attr.name`: a NIC such as "cxi0" or "mlx5_0".
    pub domain: Option<String>,
    /// A local address to bind to (`FI_SOURCE`), e.g. the IP of an interface.
    pub node: Option<String>,
    /// Ask for `FI_HMEM` and declare `FI_MR_HMEM` (shares in device memory).
    pub hmem: bool,
    /// Also ask for tagged messages (`FI_TAGGED`, send and receive): the
    /// owner-side gather path. Only set where that path is used, so the
    /// choice among NIC providers (cxi, verbs) is never narrowed by it.
    pub tagged: bool,
    /// With `tagged`: also ask for directed receives (`FI_DIRECTED_RECV`),
    /// so gather replies are matched from their owner's address only.
    pub directed: bool,
}

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

/// Parses a NIC map, "0:cxi0,1:cxi1" (keyed by local rank) or "cxi0,cxi1"
/// (position = local rank), and picks the entry of `local_rank`
/// (modulo the number of entries when the rank is not listed).
pub fn nic_for_rank(map: &str, local_rank: usize) -> FabricResult<Option<String>> {
    let bad = |why: &str| {
        FabricError::Invalid(format!(
            "nic_map / DDSTORE_NIC_MAP {map:?} is not valid ({why}): \
             expected \"0:cxi0,1:cxi1\" or \"cxi0,cxi1\""
        ))
    };
    let items: Vec<&str> = map
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if items.is_empty() {
        return Ok(None);
    }
    let keyed = items.iter().any(|s| s.contains(':'));
    if !keyed {
        return Ok(Some(items[local_rank % items.len()].to_string()));
    }
    let mut pairs = Vec::with_capacity(items.len());
    for item in &items {
        let (k, v) = item
            .split_once(':')
            .ok_or_else(|| bad("mixed keyed and plain entries"))?;
        let k: usize = k
            .trim()
            .parse()
            .map_err(|_| bad("a key is not a local rank number"))?;
        let v = v.trim();
        if v.is_empty() {
            return Err(bad("an empty NIC name"));
        }
        pairs.push((k, v.to_string()));
    }
    if let Some((_, v)) = pairs.iter().find(|(k, _)| *k == local_rank) {
        return Ok(Some(v.clone()));
    }
    pairs.sort();
    Ok(Some(pairs[local_rank % pairs.len()].1.clone()))
}

/// The interface to use: `FABRIC_IFACE`, else the NIC map entry (argument,
/// else `DDSTORE_NIC_MAP`) of this local rank, else none (provider default).
pub fn interface(
    get: &impl Fn(&str) -> Option<String>,
    nic_map: Option<&str>,
    local_rank: usize,
) -> FabricResult<Option<String>> {
    if let Some(iface) = get("FABRIC_IFACE")
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
    {
        return Ok(Some(iface));
    }
    let env_map = get("DDSTORE_NIC_MAP");
    match nic_map.or(env_map.as_deref()) {
        Some(map) => nic_for_rank(map, local_rank),
        None => Ok(None),
    }
}

/// The `fi_getinfo` request for `provider` on `iface`: socket providers
/// bind to the interface's address, NIC providers select the domain by name.
pub fn request(provider: &str, iface: Option<&str>) -> FabricResult<InfoRequest> {
    let mut req = InfoRequest {
        provider: Some(provider.to_string()),
        ..Default::default()
    };
    let Some(iface) = iface else { return Ok(req) };
    // Socket-based providers bind to the interface's address; the others name a NIC.
    let by_address = ["tcp", "sockets", "udp", "net"]
        .iter()
        .any(|p| provider.starts_with(p));
    if by_address {
        let ip = match iface.parse::<std::net::IpAddr>() {
            Ok(ip) => ip.to_string(),
            Err(_) => ipv4_of(iface).map(|ip| ip.to_string()).ok_or_else(|| {
                FabricError::Unavailable(format!(
                    "FABRIC_IFACE / nic_map names interface {iface:?}, which has no IPv4 address here"
                ))
            })?,
        };
        req.node = Some(ip);
    } else if provider != "shm" {
        req.domain = Some(iface.to_string());
    }
    Ok(req)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fabric_values() {
        assert_eq!(
            provider_candidates(Some("hsn")).unwrap(),
            vec!["tcp;ofi_rxm"]
        );
        assert_eq!(
            provider_candidates(Some(" Verbs ")).unwrap(),
            vec!["verbs;ofi_rxm"]
        );
        assert_eq!(provider_candidates(None).unwrap().len(), 5);
        for name in ["efa", "opx", "psm3", "ucx", "udp;ofi_rxd", "cxi", "shm"] {
            assert_eq!(provider_candidates(Some(name)).unwrap(), vec![name]);
        }
        assert_eq!(provider_candidates(Some("PSM3")).unwrap(), vec!["psm3"]);
        for bad in ["tcp;", "a b", "verbs;;ofi_rxm", "x/y"] {
            let err = provider_candidates(Some(bad)).unwrap_err().to_string();
            assert!(
                err.contains("DDSTORE_FABRIC") && err.contains("psm3"),
                "{err}"
            );
        }
    }

    #[test]
    fn nic_maps() {
        assert_eq!(
            nic_for_rank("0:cxi0,1:cxi1", 1).unwrap().as_deref(),
            Some("cxi1")
        );
        assert_eq!(
            nic_for_rank("0:cxi0,1:cxi1", 3).unwrap().as_deref(),
            Some("cxi1")
        );
        assert_eq!(
            nic_for_rank("cxi0, cxi1,cxi2", 4).unwrap().as_deref(),
            Some("cxi1")
        );
        assert!(nic_for_rank("0:cxi0,x:cxi1", 0).is_err());
        assert!(nic_for_rank("0:cxi0,cxi1", 0).is_err());
        let get = |k: &str| (k == "DDSTORE_NIC_MAP").then(|| "a,b".to_string());
        assert_eq!(interface(&get, None, 1).unwrap().as_deref(), Some("b"));
        assert_eq!(
            interface(&get, Some("0:z"), 1).unwrap().as_deref(),
            Some("z")
        );
        let get = |k: &str| (k == "FABRIC_IFACE").then(|| "lo".to_string());
        assert_eq!(
            interface(&get, Some("0:z"), 0).unwrap().as_deref(),
            Some("lo")
        );
    }

    #[test]
    fn requests() {
        let r = request("tcp;ofi_rxm", Some("lo")).unwrap();
        assert_eq!(r.node.as_deref(), Some("127.0.0.1"));
        let r = request("cxi", Some("cxi1")).unwrap();
        assert_eq!(r.domain.as_deref(), Some("cxi1"));
        assert!(request("sockets", Some("no-such-if0")).is_err());
    }
}
