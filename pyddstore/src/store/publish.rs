//! Method 2: what a core job publishes of a variable, and an extra job
//! attaching to it.

use ddstore_core::layout::Layout;
use ddstore_core::store::VarInfo;
use ddstore_core::DType;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use super::PyStore;
use crate::errors::{value_error, IntoPyResult};

#[pymethods]
impl PyStore {
    /// Per-rank records another job needs to read `name` (method 2).
    fn records<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyList>> {
        let var = self.store.var(name).py(py)?;
        PyList::new(py, var.records().iter().map(|r| PyBytes::new(py, r)))
    }

    /// Per-rank same-node locators (JSON, or None) of `name` (method 2).
    fn node_records(&self, py: Python<'_>, name: &str) -> PyResult<Vec<Option<String>>> {
        let var = self.store.var(name).py(py)?;
        Ok(var
            .node_locators()
            .iter()
            .map(|l| {
                l.as_ref()
                    .map(|l| serde_json::to_string(l).expect("locator serialises"))
            })
            .collect())
    }

    /// Method 2 extra job: reads `name` as published by a core group.
    #[allow(clippy::too_many_arguments)] // mirrors the record's fields one to one
    #[pyo3(signature = (name, dtype, row_bytes, itemsize, counts, records, node_records=None))]
    fn attach(
        &self,
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
        self.detached(py, |s| s.attach(&name, info, &records, &locators))
    }
}
