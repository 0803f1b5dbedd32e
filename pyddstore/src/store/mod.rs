//! `pyddstore._native.Store`: the store as the Python package sees it.
//! Argument checks that need numpy happen here; the reading happens in
//! ddstore-core with the GIL released.
//!
//! Split by concern, each file with its own `#[pymethods]` block (pyo3's
//! `multiple-pymethods`): this file holds the store-wide methods (creation,
//! properties, what a variable is, barrier, free); `write.rs` creates
//! variables and writes rows, `device.rs` creates one in a caller's device
//! memory (and is its `DeviceShare`), `read.rs` reads rows, `ragged.rs` handles
//! ragged variables, `spill.rs` memory budgets and read-ahead, `load.rs`
//! fills shares from files and `publish.rs` is what method 2 publishes and
//! attaches. They share the argument extractors of `args.rs` and the
//! class's helpers in `class.rs`.

use std::sync::Arc;

use ddstore_core::kinds::Method;
use ddstore_core::Store;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::comm::PyComm;
use crate::errors::IntoPyResult;
use crate::settings::PySettings;

mod args;
mod class;
mod device;
mod load;
mod publish;
mod ragged;
mod read;
mod spill;
mod write;

pub use class::PyStore;
pub use device::PyDeviceShare;

#[pymethods]
impl PyStore {
    #[new]
    #[pyo3(signature = (comm, method, nic_map=None, settings=None))]
    fn new(
        py: Python<'_>,
        comm: &PyComm,
        method: Bound<'_, PyAny>,
        nic_map: Option<String>,
        settings: Option<PyRef<'_, PySettings>>,
    ) -> PyResult<PyStore> {
        let method = crate::kinds::method_arg(&method)?;
        let settings = match settings {
            Some(s) => s.inner.clone(),
            None => ddstore_core::config::Settings::from_env().py(py)?,
        };
        let mut config = settings.config();
        if method == Method::MpiRma && config.memory_limit.is_some() {
            return Err(crate::errors::to_py(py, spill::unsupported_on_method0()));
        }
        // A method-2 core job's shares are read by other jobs (extra jobs).
        config.read_by_other_jobs = method.read_by_other_jobs();
        let transport =
            crate::methods::transport_for(method, &comm.inner, &config, nic_map.as_deref())
                .py(py)?;
        Ok(PyStore {
            store: Arc::new(Store::new(comm.inner.clone(), transport, config)),
            settings: PySettings { inner: settings },
            method,
        })
    }

    /// The settings this store was made with (read once, at creation).
    #[getter]
    fn settings(&self) -> PySettings {
        self.settings.clone()
    }

    #[getter]
    fn rank(&self) -> usize {
        self.store.comm().rank()
    }
    #[getter]
    fn size(&self) -> usize {
        self.store.comm().size()
    }
    #[getter]
    fn method(&self) -> u8 {
        self.method.number()
    }
    #[getter]
    fn comm_kind(&self) -> &'static str {
        self.store.comm().kind().name()
    }
    #[getter]
    fn transport(&self) -> String {
        self.store.transport_name()
    }
    /// "one-sided" or "gather" (`DDSTORE_REMOTE_GATHER`).
    #[getter]
    fn remote_path(&self) -> &'static str {
        self.store.remote_path()
    }
    #[getter]
    fn freed(&self) -> bool {
        self.store.is_freed()
    }
    /// Requests from the network this process dropped unanswered (no proof
    /// of the job's secret, or beyond an owner's bounds).
    #[getter]
    fn rejected_requests(&self) -> u64 {
        self.store.rejected_requests()
    }

    /// Gives the transport the job's secret (a method-2 job token): remote
    /// reads between the job's processes are authenticated with a key
    /// derived from it. Before any variable is added or joined.
    fn set_secret(&self, py: Python<'_>, secret: Vec<u8>) -> PyResult<()> {
        self.store.set_secret(&secret).py(py)
    }

    /// The job's secret its requests are keyed with (None: none in use), for
    /// the handle a spawned worker attaches with. Never put it in a log.
    fn secret(&self, py: Python<'_>) -> Option<Py<PyBytes>> {
        self.store.secret().map(|s| PyBytes::new(py, &s).unbind())
    }

    /// Collective barrier over the store's group, bounded by
    /// `DDSTORE_TIMEOUT_S` like free()'s (DDStoreTimeoutError naming absent
    /// ranks); every rank's read-ahead stages drop the rows updated before it.
    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        self.detached(py, |s| s.barrier())
    }

    fn comm(&self) -> PyComm {
        PyComm {
            inner: self.store.comm().clone(),
        }
    }

    /// (total rows, elements per row, itemsize), as upstream pyddstore.
    fn info(&self, py: Python<'_>, name: &str) -> PyResult<(u64, usize, usize)> {
        let info = self.var_info(py, name)?;
        let itemsize = info.itemsize.max(1);
        Ok((info.layout.total(), info.row_bytes / itemsize, itemsize))
    }

    fn dtype(&self, py: Python<'_>, name: &str) -> PyResult<&'static str> {
        Ok(self.var_info(py, name)?.dtype.name())
    }

    fn row_bytes(&self, py: Python<'_>, name: &str) -> PyResult<usize> {
        Ok(self.var_info(py, name)?.row_bytes)
    }

    /// Rows per rank of the group.
    fn counts(&self, py: Python<'_>, name: &str) -> PyResult<Vec<u64>> {
        Ok(self.var_info(py, name)?.layout.counts())
    }

    fn names(&self) -> Vec<String> {
        self.store.names()
    }

    fn get_profile<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyDict>> {
        let p = self.store.profile(name).py(py)?;
        let d = PyDict::new(py);
        for (k, v) in p.fields() {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    fn fork_reader(&self, py: Python<'_>) -> PyResult<()> {
        self.store.fork_reader().py(py)
    }

    /// Collective: releases every variable (see `Store::free`).
    fn free(&self, py: Python<'_>) -> PyResult<()> {
        self.detached(py, |s| s.free())
    }
}
