//! `pyddstore._native.Store`: the store as the Python package sees it.
//! Argument checks that need numpy happen here; the reading happens in
//! ddstore-core with the GIL released.
//!
//! Split by concern: this file holds the class, its one `#[pymethods]`
//! block and the store-wide methods (creation, properties, what a variable
//! is, barrier, free); every other method is a one-line call of the function
//! of its name in `write.rs` (creating variables, writing rows), `read.rs`
//! (reading rows), `ragged.rs` (ragged variables), `load.rs` (filling shares
//! from files) or `publish.rs` (what method 2 publishes and attaches), which
//! share the argument extractors of `args.rs`.

use std::sync::Arc;

use ddstore_core::kinds::Method;
use ddstore_core::Store;
use numpy::PyReadonlyArray2;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use crate::comm::PyComm;
use crate::errors::IntoPyResult;
use crate::external::PyDeviceShare;
use crate::settings::PySettings;

mod args;
mod class;
mod load;
mod publish;
mod ragged;
mod read;
mod spill;
mod write;

pub(crate) use args::indices_of;
pub use class::PyStore;

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

    // -- the other concerns: each method is the function of its name in that file --

    /// Collective: `nrows` rows on this rank, each `row_bytes` bytes.
    /// `memory_limit`, `spill_dir`: this variable's own budget and spill
    /// directory (see `ddstore_core::spill`).
    #[pyo3(signature = (name, nrows, row_bytes, itemsize=1, dtype=None, memory_limit=None, spill_dir=None))]
    #[allow(clippy::too_many_arguments)]
    fn init(
        &self,
        py: Python<'_>,
        name: String,
        nrows: Bound<'_, PyAny>,
        row_bytes: Bound<'_, PyAny>,
        itemsize: usize,
        dtype: Option<&str>,
        memory_limit: Option<Bound<'_, PyAny>>,
        spill_dir: Option<std::path::PathBuf>,
    ) -> PyResult<()> {
        write::init(
            self,
            py,
            name,
            nrows,
            row_bytes,
            itemsize,
            dtype,
            memory_limit,
            spill_dir,
        )
    }

    /// Collective: creates `name` from this rank's rows (`arr`, first axis = rows).
    #[pyo3(signature = (name, arr, memory_limit=None, spill_dir=None))]
    fn add(
        &self,
        py: Python<'_>,
        name: String,
        arr: Bound<'_, PyAny>,
        memory_limit: Option<Bound<'_, PyAny>>,
        spill_dir: Option<std::path::PathBuf>,
    ) -> PyResult<()> {
        write::add(self, py, name, arr, memory_limit, spill_dir)
    }

    /// Whether any rank's share of `name` spills past its memory budget.
    fn is_spilled(&self, py: Python<'_>, name: &str) -> PyResult<bool> {
        spill::is_spilled(self, py, name)
    }

    /// Bytes of `name`'s read-ahead stage (0: it stages nothing).
    fn stage_capacity(&self, py: Python<'_>, name: &str) -> PyResult<usize> {
        spill::stage_capacity(self, py, name)
    }

    /// Reads ahead: stages the spilled rows among global `rows` (soon read
    /// by this process) in `name`'s read-ahead stage; returns how many.
    fn prefetch(&self, py: Python<'_>, name: &str, rows: Bound<'_, PyAny>) -> PyResult<usize> {
        spill::prefetch(self, py, name, rows)
    }

    /// Writes this rank's rows `[offset, offset + len(arr))`.
    #[pyo3(signature = (name, arr, offset=None))]
    fn update(
        &self,
        py: Python<'_>,
        name: String,
        arr: Bound<'_, PyAny>,
        offset: Option<Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        write::update(self, py, name, arr, offset)
    }

    /// Collective: creates `name` with this rank's `nrows` rows of
    /// `row_bytes` in `tensor`'s memory (a contiguous tensor of exactly
    /// `nrows * row_bytes` bytes on device `device` of interface `iface`:
    /// "cuda", "rocr", "ze", or "system" for host memory) and returns the
    /// `DeviceShare` that owns it: the store and the share keep the tensor
    /// alive; it must not be resized. Rows are written and read through the share.
    #[allow(clippy::too_many_arguments)] // init's arguments plus the share's memory
    #[pyo3(signature = (name, nrows, row_bytes, tensor, iface, device=0, itemsize=1, dtype=None))]
    fn init_device(
        slf: &Bound<'_, Self>,
        name: String,
        nrows: Bound<'_, PyAny>,
        row_bytes: Bound<'_, PyAny>,
        tensor: Bound<'_, PyAny>,
        iface: &str,
        device: i32,
        itemsize: usize,
        dtype: Option<&str>,
    ) -> PyResult<PyDeviceShare> {
        write::init_device(
            slf, name, nrows, row_bytes, tensor, iface, device, itemsize, dtype,
        )
    }

    /// Reads rows `start .. start + len(arr)` (one owner's share) into `arr`.
    #[pyo3(signature = (name, arr, start=None))]
    fn get(
        &self,
        py: Python<'_>,
        name: String,
        arr: Bound<'_, PyAny>,
        start: Option<Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        read::get(self, py, name, arr, start)
    }

    /// Row i of `arr` receives global row `indices[i]`.
    fn get_batch(
        &self,
        py: Python<'_>,
        name: String,
        arr: Bound<'_, PyAny>,
        indices: Bound<'_, PyAny>,
    ) -> PyResult<()> {
        read::get_batch(self, py, name, arr, indices)
    }

    /// Benchmark ceiling: `get_batch` without planning, each row one
    /// transport read (no shared-memory shortcut, no coalescing).
    fn get_batch_raw(
        &self,
        py: Python<'_>,
        name: String,
        arr: Bound<'_, PyAny>,
        indices: Bound<'_, PyAny>,
    ) -> PyResult<()> {
        read::get_batch_raw(self, py, name, arr, indices)
    }

    fn register_recv(&self, py: Python<'_>, name: String, arr: Bound<'_, PyAny>) -> PyResult<()> {
        read::register_recv(self, py, name, arr)
    }

    fn unregister_recv(&self, py: Python<'_>, name: String, arr: Bound<'_, PyAny>) -> PyResult<()> {
        read::unregister_recv(self, py, name, arr)
    }

    /// Collective: creates the ragged variable `name` from this rank's rows:
    /// row i is `lengths[i]` consecutive units (first-axis entries) of
    /// `values`; lengths may be 0 and a rank may have no rows.
    #[pyo3(signature = (name, values, lengths, memory_limit=None, spill_dir=None))]
    fn add_ragged(
        &self,
        py: Python<'_>,
        name: String,
        values: Bound<'_, PyAny>,
        lengths: Bound<'_, PyAny>,
        memory_limit: Option<Bound<'_, PyAny>>,
        spill_dir: Option<std::path::PathBuf>,
    ) -> PyResult<()> {
        ragged::add_ragged(self, py, name, values, lengths, memory_limit, spill_dir)
    }

    /// Reads ragged rows `indices` (any order, repeats): returns
    /// `(values, offsets)`, row i being units `offsets[i]:offsets[i + 1]` of
    /// `values` (a flat array of the variable's dtype, `unit_bytes` per unit).
    /// With `out`, the values land at the start of `out` (a writable
    /// contiguous array of the same dtype, large enough) and `values` is the
    /// filled part of `out`.
    #[pyo3(signature = (name, indices, out=None))]
    fn get_ragged<'py>(
        &self,
        py: Python<'py>,
        name: String,
        indices: Bound<'py, PyAny>,
        out: Option<Bound<'py, PyAny>>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, numpy::PyArray1<i64>>)> {
        ragged::get_ragged(self, py, name, indices, out)
    }

    /// Whether `name` is a ragged variable.
    fn is_ragged(&self, name: &str) -> bool {
        ragged::is_ragged(self, name)
    }

    /// Method 2 extra job: `name`'s values and ends were attached
    /// (as `name#values`, `name#ends`); read them as one ragged variable.
    fn link_ragged(&self, py: Python<'_>, name: String) -> PyResult<()> {
        ragged::link_ragged(self, py, name)
    }

    /// Reads byte ranges of files straight into this rank's share of `name`
    /// with up to `threads` reads in flight (threads spawned for the call,
    /// the GIL released). `ranges` is an int64 array of rows (file index,
    /// file offset, bytes read, CRC32 of them or -1, bytes skipped, bytes
    /// written, byte offset in the share). Files open read-only, O_NONBLOCK,
    /// O_CLOEXEC, O_NOFOLLOW with `nofollow`, O_DIRECT with `direct` where
    /// the file system allows it; only regular files, of exactly `sizes[i]`
    /// bytes where given (-1: any). When no read returns for `timeout_s`
    /// seconds (None: DDSTORE_LOAD_TIMEOUT_S, read now) it raises
    /// DDStoreTimeoutError naming the file and byte range, leaving a reader
    /// stuck in the kernel behind. Returns (bytes written, whether every
    /// file was read with O_DIRECT).
    #[pyo3(signature = (name, paths, ranges, threads=32, direct=false, nofollow=false, sizes=None, timeout_s=None))]
    #[allow(clippy::too_many_arguments)]
    fn load_file_ranges(
        &self,
        py: Python<'_>,
        name: String,
        paths: Vec<String>,
        ranges: PyReadonlyArray2<'_, i64>,
        threads: usize,
        direct: bool,
        nofollow: bool,
        sizes: Option<Vec<i64>>,
        timeout_s: Option<f64>,
    ) -> PyResult<(u64, bool)> {
        load::load_file_ranges(
            self, py, name, paths, ranges, threads, direct, nofollow, sizes, timeout_s,
        )
    }

    /// Per-rank records another job needs to read `name` (method 2).
    fn records<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyList>> {
        publish::records(self, py, name)
    }

    /// Per-rank same-node locators (JSON, or None) of `name` (method 2).
    fn node_records(&self, py: Python<'_>, name: &str) -> PyResult<Vec<Option<String>>> {
        publish::node_records(self, py, name)
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
        publish::attach(
            self,
            py,
            name,
            dtype,
            row_bytes,
            itemsize,
            counts,
            records,
            node_records,
        )
    }
}
