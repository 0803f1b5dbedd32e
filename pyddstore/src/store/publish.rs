//! Method 2: what a core job publishes of a variable, and an extra job
//! attaching to it.
//! Each `pub(super)` function is the body of the `Store` method of its
//! name (the thin methods of `mod.rs`).

use ddstore_core::layout::Layout;
use ddstore_core::store::VarInfo;
use ddstore_core::DType;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use super::PyStore;
use crate::errors::{value_error, IntoPyResult};

pub(super) fn records<'py>(
    this: &PyStore,
    py: Python<'py>,
    name: &str,
) -> PyResult<Bound<'py, PyList>> {
    let var = this.store.var(name).py(py)?;
    PyList::new(py, var.records().iter().map(|r| PyBytes::new(py, r)))
}

pub(super) fn node_records(
    this: &PyStore,
    py: Python<'_>,
    name: &str,
) -> PyResult<Vec<Option<String>>> {
    let var = this.store.var(name).py(py)?;
    Ok(var
        .node_locators()
        .iter()
        .map(|l| {
            l.as_ref()
                .map(|l| serde_json::to_string(l).expect("locator serialises"))
        })
        .collect())
}

#[allow(clippy::too_many_arguments)] // mirrors the record's fields one to one
pub(super) fn attach(
    this: &PyStore,
    py: Python<'_>,
    name: String,
    dtype: &str,
    row_bytes: usize,
    itemsize: usize,
    counts: Vec<u64>,
    records: Vec<Vec<u8>>,
    node_records: Option<Vec<Option<String>>>,
) -> PyResult<()> {
    if counts.len() != records.len() {
        return Err(value_error(
            py,
            format!(
                "attach('{name}'): {} counts but {} records",
                counts.len(),
                records.len()
            ),
        ));
    }
    // A malformed locator only costs the shortcut: that rank is read remotely.
    let locators: Vec<_> = node_records
        .unwrap_or_default()
        .iter()
        .map(|r| r.as_deref().and_then(|j| serde_json::from_str(j).ok()))
        .collect();
    let info = VarInfo {
        dtype: DType::parse(dtype).py(py)?,
        itemsize: itemsize.max(1),
        row_bytes,
        layout: Layout::new(&counts),
    };
    this.detached(py, |s| s.attach(&name, info, &records, &locators))
}
