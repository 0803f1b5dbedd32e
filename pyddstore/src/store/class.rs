//! The `Store` class's data and the helpers every concern of its methods
//! uses (see `mod.rs`).

use std::sync::Arc;

use ddstore_core::kinds::Method;
use ddstore_core::store::VarInfo;
use ddstore_core::Store;
use pyo3::prelude::*;

use crate::errors::IntoPyResult;
use crate::settings::PySettings;

/// `pyddstore._native.Store`: a store and what it was made with.
#[pyclass(name = "Store", module = "pyddstore._native", frozen)]
pub struct PyStore {
    pub(super) store: Arc<Store>,
    /// What the store was made with (`store.settings`).
    pub(super) settings: PySettings,
    pub(super) method: Method,
}

impl PyStore {
    /// Runs `call` on the store with the GIL released; its error becomes
    /// the matching Python exception.
    pub(super) fn detached<T: Send>(
        &self,
        py: Python<'_>,
        call: impl FnOnce(&Store) -> ddstore_core::Result<T> + Send,
    ) -> PyResult<T> {
        let store = &*self.store;
        py.detach(|| call(store)).py(py)
    }

    /// A fixed-row variable's shape; for a ragged one, its rows with the
    /// unit as the "row" width (what info/dtype/counts report).
    pub(super) fn var_info(&self, py: Python<'_>, name: &str) -> PyResult<VarInfo> {
        if self.store.is_ragged(name) {
            let r = self.store.ragged_info(name).py(py)?;
            return Ok(VarInfo {
                dtype: r.dtype,
                itemsize: r.itemsize,
                row_bytes: r.unit_bytes,
                layout: r.rows,
            });
        }
        Ok(self.store.var(name).py(py)?.info.clone())
    }
}
