//! `HandshakeDir`: Python's view of a verified private directory
//! (`ddstore_core::private_dir`), used by method 2's records, token files,
//! name locks and `meta.json`. Python never opens these files itself. Also
//! the compact forms of what a method-2 record holds per core rank (share
//! records, same-node locators) and back, every field bounded.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ddstore_core::private_dir::{NameLock, PrivateDir};
use ddstore_core::region::NodeLocator;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::errors::{value_error, IntoPyResult};

/// A handshake directory opened and checked once (`_native.HandshakeDir`).
#[pyclass(name = "HandshakeDir", module = "pyddstore._native", frozen)]
pub struct PyHandshakeDir {
    dir: Arc<PrivateDir>,
}

/// A held name lock; `release()` (or garbage collection) removes the lock file.
#[pyclass(name = "NameLock", module = "pyddstore._native", frozen)]
pub struct PyNameLock {
    lock: Mutex<Option<NameLock>>,
}

#[pymethods]
impl PyNameLock {
    fn release(&self) {
        self.lock.lock().unwrap().take();
    }
}

fn deadline(py: Python<'_>, timeout_s: f64) -> PyResult<Instant> {
    if !timeout_s.is_finite() || !(0.0..=365.0 * 86400.0).contains(&timeout_s) {
        return Err(value_error(
            py,
            format!("timeout_s={timeout_s} is not valid: expected 0 to 31536000 seconds"),
        ));
    }
    Ok(Instant::now() + Duration::from_secs_f64(timeout_s))
}

#[pymethods]
impl PyHandshakeDir {
    /// Opens `path` (created 0700 when `create`) and checks it is private.
    #[new]
    #[pyo3(signature = (path, create=true))]
    fn new(py: Python<'_>, path: PathBuf, create: bool) -> PyResult<Self> {
        let dir = py.detach(|| PrivateDir::open(&path, create)).py(py)?;
        Ok(PyHandshakeDir { dir: Arc::new(dir) })
    }

    #[getter]
    fn path(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    /// Writes `name` atomically, owner-only.
    fn write(&self, py: Python<'_>, name: &str, data: Vec<u8>) -> PyResult<()> {
        let dir = self.dir.clone();
        py.detach(move || dir.write(name, &data)).py(py)
    }

    /// The bytes of `name` (at most `cap`), or None when it does not exist.
    fn read<'py>(
        &self,
        py: Python<'py>,
        name: &str,
        cap: usize,
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let dir = self.dir.clone();
        let data = py.detach(move || dir.read(name, cap)).py(py)?;
        Ok(data.map(|d| PyBytes::new(py, &d)))
    }

    /// Waits up to `timeout_s` for `name`; None if it did not appear.
    fn wait_for<'py>(
        &self,
        py: Python<'py>,
        name: &str,
        timeout_s: f64,
        cap: usize,
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let until = deadline(py, timeout_s)?;
        let dir = self.dir.clone();
        let data = py.detach(move || dir.wait_for(name, until, cap)).py(py)?;
        Ok(data.map(|d| PyBytes::new(py, &d)))
    }

    /// Removes `name` if present.
    fn remove(&self, py: Python<'_>, name: &str) -> PyResult<()> {
        self.dir.remove(name).py(py)
    }

    /// Entry names.
    fn list(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        self.dir.list().py(py)
    }

    /// Takes lock `name`: a `NameLock`, or the text its live holder wrote.
    fn try_lock(&self, py: Python<'_>, name: &str, holder: &str) -> PyResult<Py<PyAny>> {
        match self.dir.try_lock(name, holder).py(py)? {
            Ok(lock) => Ok(Py::new(
                py,
                PyNameLock {
                    lock: Mutex::new(Some(lock)),
                },
            )?
            .into_any()),
            Err(text) => Ok(text.into_pyobject(py)?.into_any().unbind()),
        }
    }
}

/// Method 2: every rank's share record of a variable split into the
/// provider and the ranks' addresses (published once per store) and the
/// packed per-rank shares (published per variable): `(provider, addrs, shares)`.
#[pyfunction]
pub fn split_share_records(
    py: Python<'_>,
    records: Vec<Vec<u8>>,
) -> PyResult<(String, Vec<Bound<'_, PyBytes>>, Bound<'_, PyBytes>)> {
    let split = py
        .detach(|| ddstore_fabric::ofi::split_records(&records))
        .map_err(ddstore_core::Error::from)
        .py(py)?;
    let addrs = split.addrs.iter().map(|a| PyBytes::new(py, a)).collect();
    Ok((split.provider, addrs, PyBytes::new(py, &split.shares)))
}

/// Every rank's share record again from `split_share_records`' parts (as
/// read from a method-2 core job's files: every field is bounded).
#[pyfunction]
pub fn join_share_records<'py>(
    py: Python<'py>,
    provider: &str,
    addrs: Vec<Vec<u8>>,
    shares: Vec<u8>,
) -> PyResult<Vec<Bound<'py, PyBytes>>> {
    let records = py
        .detach(|| ddstore_fabric::ofi::join_records(provider, &addrs, &shares))
        .map_err(ddstore_core::Error::from)
        .py(py)?;
    Ok(records.iter().map(|r| PyBytes::new(py, r)).collect())
}

/// Bytes of one rank's same-node locator packed by `pack_node_records`:
/// host index (u32, `NO_LOCATOR` for none), pid (u32), fd (i32), length,
/// control offset and id (u64 each), little-endian.
pub const PACKED_LOCATOR_BYTES: usize = 36;
/// The host index of a rank without a locator.
const NO_LOCATOR: u32 = u32::MAX;
/// Longest host id a packed locator table accepts.
const MAX_HOST_BYTES: usize = 1024;

/// Method 2: every rank's same-node locator (JSON, or None) of a variable as
/// `(hosts, packed)`: each host id once, and per rank [`PACKED_LOCATOR_BYTES`].
#[pyfunction]
pub fn pack_node_records<'py>(
    py: Python<'py>,
    records: Vec<Option<String>>,
) -> PyResult<(Vec<String>, Bound<'py, PyBytes>)> {
    let mut hosts: Vec<String> = Vec::new();
    let mut packed = Vec::with_capacity(records.len() * PACKED_LOCATOR_BYTES);
    for (rank, json) in records.iter().enumerate() {
        let Some(json) = json else {
            packed.extend_from_slice(&NO_LOCATOR.to_le_bytes());
            packed.resize(packed.len() + PACKED_LOCATOR_BYTES - 4, 0);
            continue;
        };
        let loc: NodeLocator = serde_json::from_str(json).map_err(|e| {
            value_error(
                py,
                format!("rank {rank}'s same-node locator is not valid: {e}"),
            )
        })?;
        // Ranks of a node are neighbours: the last host is usually the one.
        let index = match hosts.iter().rposition(|h| *h == loc.host) {
            Some(i) => i,
            None => {
                hosts.push(loc.host);
                hosts.len() - 1
            }
        };
        packed.extend_from_slice(&(index as u32).to_le_bytes());
        packed.extend_from_slice(&loc.pid.to_le_bytes());
        packed.extend_from_slice(&loc.fd.to_le_bytes());
        for word in [loc.len as u64, loc.ctl as u64, loc.id] {
            packed.extend_from_slice(&word.to_le_bytes());
        }
    }
    Ok((hosts, PyBytes::new(py, &packed)))
}

/// Every rank's same-node locator (JSON, or None) again from
/// `pack_node_records`' parts (as read from a method-2 core job's record:
/// every field is bounded; anything out of bounds is a `DDStoreValueError`).
#[pyfunction]
pub fn unpack_node_records(
    py: Python<'_>,
    hosts: Vec<String>,
    packed: Vec<u8>,
) -> PyResult<Vec<Option<String>>> {
    let ranks = packed.len() / PACKED_LOCATOR_BYTES;
    if !packed.len().is_multiple_of(PACKED_LOCATOR_BYTES) || hosts.len() > ranks {
        return Err(value_error(
            py,
            format!(
                "packed same-node locators: {} bytes and {} hosts (expected {PACKED_LOCATOR_BYTES} \
                 bytes per rank and at most a host per rank)",
                packed.len(),
                hosts.len()
            ),
        ));
    }
    if let Some(h) = hosts
        .iter()
        .find(|h| h.is_empty() || h.len() > MAX_HOST_BYTES)
    {
        return Err(value_error(
            py,
            format!(
                "packed same-node locators: a host id of {} bytes (expected 1 to {MAX_HOST_BYTES})",
                h.len()
            ),
        ));
    }
    let u32_at = |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
    let u64_at = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    packed
        .chunks_exact(PACKED_LOCATOR_BYTES)
        .enumerate()
        .map(|(rank, b)| {
            let index = u32_at(b, 0);
            if index == NO_LOCATOR {
                return Ok(None);
            }
            let (Some(host), Ok(len), Ok(ctl)) = (
                hosts.get(index as usize),
                usize::try_from(u64_at(b, 12)),
                usize::try_from(u64_at(b, 20)),
            ) else {
                return Err(value_error(
                    py,
                    format!(
                        "packed same-node locators: rank {rank}'s host index {index} or its \
                         lengths are out of range ({} hosts)",
                        hosts.len()
                    ),
                ));
            };
            let loc = NodeLocator {
                host: host.clone(),
                pid: u32_at(b, 4),
                fd: u32_at(b, 8) as i32,
                len,
                ctl,
                id: u64_at(b, 28),
            };
            Ok(Some(
                serde_json::to_string(&loc).expect("a locator serialises"),
            ))
        })
        .collect()
}
