//! `pyddstore._native.Store`: the store as the Python package sees it.
//! Argument checks that need numpy happen here; the reading happens in
//! ddstore-core with the GIL released.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ddstore_core::config::Value;
use ddstore_core::external::HmemIface;
use ddstore_core::file_load::{FileRange, SourceFile};
use ddstore_core::layout::Layout;
use ddstore_core::store::{OwnRows, VarInfo, Variable};
use ddstore_core::{DType, Error, Store};
use numpy::{PyReadonlyArray1, PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use crate::buffer::Array;
use crate::comm::PyComm;
use crate::errors::{type_error, value_error, IntoPyResult};
use crate::settings::PySettings;

#[pyclass(name = "Store", module = "pyddstore._native", frozen)]
pub struct PyStore {
    store: Arc<Store>,
    /// What the store was made with (`store.settings`).
    settings: PySettings,
    method: u8,
    /// Element size per variable as given to init/add (info() reports it).
    itemsizes: Mutex<HashMap<String, usize>>,
}

/// Row indices from an int64 array (fast path) or any sequence of ints.
/// An integer argument (int or numpy integer; not a float) within int64,
/// else a DDStoreTypeError / DDStoreIndexError quoting what was passed.
fn int_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<i64> {
    let py = obj.py();
    let shown = || obj.repr().map(|r| r.to_string()).unwrap_or_default();
    if obj.is_instance_of::<pyo3::types::PyFloat>() {
        return Err(type_error(
            py,
            format!("{what}={} must be an integer, not a float", shown()),
        ));
    }
    let idx = obj
        .call_method0("__index__")
        .map_err(|_| type_error(py, format!("{what}={} must be an integer", shown())))?;
    idx.extract::<i64>().map_err(|_| {
        to_index(
            py,
            format!(
                "{what}={} is out of range: expected an integer below 2**63",
                shown()
            ),
        )
    })
}

pub(crate) fn indices_of(obj: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
    let py = obj.py();
    if let Ok(arr) = obj.extract::<PyReadonlyArray1<i64>>() {
        return Ok(arr
            .as_slice()
            .map(|s| s.to_vec())
            .unwrap_or_else(|_| arr.as_array().to_vec()));
    }
    if let Ok(arr) = obj.cast::<numpy::PyUntypedArray>() {
        let kind = numpy::PyArrayDescrMethods::kind(&arr.dtype());
        if kind != b'i' && kind != b'u' {
            return Err(type_error(
                py,
                format!(
                    "indices must be integers, got an array of dtype {}",
                    arr.dtype()
                ),
            ));
        }
        if arr.ndim() != 1 {
            return Err(value_error(
                py,
                format!(
                    "indices must be one-dimensional, got shape {:?}",
                    arr.shape()
                ),
            ));
        }
        if kind == b'u' && numpy::PyArrayDescrMethods::itemsize(&arr.dtype()) >= 8 {
            // Values of 2**63 and more would wrap to negatives: quote the value passed.
            let big = obj.call_method1("__ge__", (1u64 << 63,))?;
            if big.call_method0("any")?.is_truthy()? {
                let first = big.call_method0("argmax")?;
                let value = obj.get_item(first)?;
                return Err(to_index(
                    py,
                    format!("index {value} is out of range: indices must be below 2**63"),
                ));
            }
        }
        let as_i64 = obj.call_method1("astype", ("int64",))?;
        return indices_of(&as_i64);
    }
    if let Ok(v) = obj.extract::<Vec<i64>>() {
        return Ok(v);
    }
    // Say which element is wrong: a float, or an integer beyond int64.
    if let Ok(items) = obj.try_iter() {
        for (i, item) in items.enumerate() {
            if let Err(e) = int_arg(&item?, &format!("indices[{i}]")) {
                let msg = format!("{} (indices must be integers below 2**63)", e.value(py));
                return Err(if e.is_instance_of::<pyo3::exceptions::PyIndexError>(py) {
                    to_index(py, msg)
                } else {
                    type_error(py, msg)
                });
            }
        }
    }
    Err(type_error(
        py,
        "indices must be a sequence of integers (list, range or integer numpy array)".into(),
    ))
}

impl PyStore {
    /// Checks `arr` against `indices` and runs `read` with the GIL released.
    /// The variable is looked up once and handed to `read` (an `Arc`, no
    /// copy of its layout); indices are checked by the planner, once.
    pub(crate) fn read_indexed(
        &self,
        py: Python<'_>,
        call: &str,
        name: String,
        arr: Bound<'_, PyAny>,
        indices: Bound<'_, PyAny>,
        read: impl FnOnce(&Store, &Variable, &[i64], &mut [u8]) -> ddstore_core::Result<()> + Send,
    ) -> PyResult<()> {
        let rows = indices_of(&indices)?;
        let arg = format!("{call}('{name}', arr)");
        let a = Array::new(&arr, &arg, true)?;
        let var = self.store.var(&name).py(py)?;
        check_out(py, call, &name, &var.info, &a, rows.len())?;
        let store = &*self.store;
        // Held while the GIL is released: no other call can use this memory meanwhile.
        let mut out = a.borrow_mut(&arg)?;
        let out = out.bytes_mut();
        py.detach(|| read(store, &var, &rows, out)).py(py)
    }

    /// A fixed-row variable's shape; for a ragged one, its rows with the
    /// unit as the "row" width (what info/dtype/counts report).
    fn var_info(&self, py: Python<'_>, name: &str) -> PyResult<VarInfo> {
        if self.store.is_ragged(name) {
            let r = self.store.ragged_info(name).py(py)?;
            return Ok(VarInfo {
                dtype: r.dtype,
                row_bytes: r.unit_bytes,
                layout: r.rows,
            });
        }
        Ok(self.store.var(name).py(py)?.info.clone())
    }
}

/// Checks `arr`'s dtype against the variable's (raw-bytes variables take any dtype).
fn check_dtype(
    py: Python<'_>,
    call: &str,
    name: &str,
    info: &VarInfo,
    arr: &Array<'_>,
) -> PyResult<()> {
    if info.dtype != DType::Bytes && arr.dtype() != info.dtype {
        return Err(type_error(
            py,
            format!(
                "{call}('{name}'): arr has dtype {}, the variable holds {}",
                arr.dtype_name(),
                info.dtype.name()
            ),
        ));
    }
    Ok(())
}

/// Checks that `arr` can hold `nrows` rows of the variable with a matching dtype.
fn check_out(
    py: Python<'_>,
    call: &str,
    name: &str,
    info: &VarInfo,
    arr: &Array<'_>,
    nrows: usize,
) -> PyResult<()> {
    check_dtype(py, call, name, info, arr)?;
    let want = nrows * info.row_bytes;
    if arr.nbytes() != want {
        return Err(value_error(
            py,
            format!(
                "{call}('{name}'): arr has shape {:?} ({} bytes), expected {nrows} rows of {} bytes = {want} bytes",
                arr.arr.shape(),
                arr.nbytes(),
                info.row_bytes
            ),
        ));
    }
    Ok(())
}

#[pymethods]
impl PyStore {
    #[new]
    #[pyo3(signature = (comm, method, nic_map=None, settings=None))]
    fn new(
        py: Python<'_>,
        comm: &PyComm,
        method: u8,
        nic_map: Option<String>,
        settings: Option<PyRef<'_, PySettings>>,
    ) -> PyResult<PyStore> {
        let settings = match settings {
            Some(s) => s.inner.clone(),
            None => ddstore_core::config::Settings::from_env().py(py)?,
        };
        let mut config = settings.config().py(py)?;
        if method == 0 && config.memory_limit.is_some() {
            return Err(crate::errors::to_py(py, spill_unsupported_on_method0()));
        }
        // A method-2 core job's shares are read by other jobs (extra jobs).
        config.read_by_other_jobs = method == 2;
        let transport =
            crate::methods::transport_for(method, &comm.inner, &config, nic_map.as_deref())
                .py(py)?;
        Ok(PyStore {
            store: Arc::new(Store::new(comm.inner.clone(), transport, config)),
            settings: PySettings { inner: settings },
            method,
            itemsizes: Mutex::new(HashMap::new()),
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
        self.method
    }
    #[getter]
    fn comm_kind(&self) -> &'static str {
        self.store.comm().kind()
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
    fn secret(&self, py: Python<'_>) -> Option<Py<pyo3::types::PyBytes>> {
        self.store
            .secret()
            .map(|s| pyo3::types::PyBytes::new(py, &s).unbind())
    }

    /// Collective barrier over the store's group, bounded by
    /// `DDSTORE_TIMEOUT_S` like free()'s (DDStoreTimeoutError naming absent ranks).
    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        let store = self.store.clone();
        py.detach(move || store.comm().barrier_timeout(store.config().timeout))
            .py(py)
    }

    fn comm(&self) -> PyComm {
        PyComm {
            inner: self.store.comm().clone(),
        }
    }

    /// Collective: `nrows` rows on this rank, each `row_bytes` bytes.
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
        let request = self.spill_request(py, &name, memory_limit, spill_dir)?;
        let nrows = int_arg(&nrows, &format!("init('{name}'): nrows"))?;
        let row_bytes = int_arg(&row_bytes, &format!("init('{name}'): row_bytes"))?;
        if nrows < 0 {
            return Err(value_error(
                py,
                format!("init('{name}'): nrows={nrows} must be >= 0"),
            ));
        }
        if row_bytes <= 0 {
            return Err(value_error(
                py,
                format!("init('{name}'): a row of {row_bytes} bytes must be at least 1 byte"),
            ));
        }
        let dtype = match dtype {
            Some(d) => DType::parse(d).py(py)?,
            None => DType::Bytes,
        };
        let store = self.store.clone();
        let n = name.clone();
        py.detach(move || {
            store.init_spilling(
                &n,
                nrows as u64,
                row_bytes as usize,
                dtype,
                request.as_ref(),
            )
        })
        .py(py)?;
        self.itemsizes.lock().unwrap().insert(name, itemsize.max(1));
        Ok(())
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
        let request = self.spill_request(py, &name, memory_limit, spill_dir)?;
        let arg = format!("add('{name}', arr)");
        let a = Array::new(&arr, &arg, false)?;
        if a.arr.ndim() == 0 {
            return Err(value_error(
                py,
                format!("add('{name}'): arr must have at least one dimension (rows)"),
            ));
        }
        let nrows = a.rows();
        let per_row: usize = a.arr.shape()[1..].iter().product::<usize>() * a.itemsize();
        let dtype = a.dtype();
        let store = self.store.clone();
        let n = name.clone();
        let src = a.borrow(&arg)?;
        let data = src.bytes();
        py.detach(|| {
            store.init_spilling(&n, nrows as u64, per_row, dtype, request.as_ref())?;
            store.write_local(&n, 0, data)?;
            // Collective like upstream: every rank's rows are readable once add returns.
            // Bounded: a rank that never arrives is named, not waited for forever.
            store.comm().barrier_timeout(store.config().timeout)
        })
        .py(py)?;
        self.itemsizes.lock().unwrap().insert(name, a.itemsize());
        Ok(())
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
        let request = self.spill_request(py, &name, memory_limit, spill_dir)?;
        let arg = format!("add('{name}', values)");
        let a = Array::new(&values, &arg, false)?;
        if a.arr.ndim() == 0 {
            return Err(value_error(
                py,
                format!("add('{name}'): values must have at least one dimension (units)"),
            ));
        }
        let lengths = indices_of(&lengths)?;
        if let Some(i) = lengths.iter().position(|&l| l < 0) {
            return Err(value_error(
                py,
                format!(
                    "add('{name}'): lengths[{i}] = {} is negative: expected lengths >= 0",
                    lengths[i]
                ),
            ));
        }
        let lengths: Vec<u64> = lengths.iter().map(|&l| l as u64).collect();
        let unit_bytes: usize = a.arr.shape()[1..].iter().product::<usize>() * a.itemsize();
        let dtype = a.dtype();
        let store = self.store.clone();
        let n = name.clone();
        let src = a.borrow(&arg)?;
        let data = src.bytes();
        py.detach(|| {
            store.add_ragged_spilling(&n, &lengths, unit_bytes, dtype, data, request.as_ref())
        })
        .py(py)?;
        // The parts too: their info() is what a method-2 record or a pickled handle carries.
        let mut itemsizes = self.itemsizes.lock().unwrap();
        itemsizes.insert(ddstore_core::ragged::values_name(&name), a.itemsize());
        itemsizes.insert(ddstore_core::ragged::ends_name(&name), 8);
        itemsizes.insert(name, a.itemsize());
        Ok(())
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
        let rows = indices_of(&indices)?;
        let store = self.store.clone();
        let n = name.clone();
        let batch = py.detach(|| store.plan_ragged(&n, &rows)).py(py)?;
        let values = match out {
            Some(o) => {
                let a = Array::new(&o, &format!("get_batch('{name}', out)"), true)?;
                if batch.dtype() != DType::Bytes && a.dtype() != batch.dtype() {
                    return Err(type_error(
                        py,
                        format!(
                            "get_batch('{name}'): out has dtype {}, the variable holds {}",
                            a.dtype_name(),
                            batch.dtype().name()
                        ),
                    ));
                }
                if a.nbytes() < batch.bytes() {
                    return Err(value_error(
                        py,
                        format!(
                            "get_batch('{name}'): out has {} bytes, the batch needs {} ({} units of {} bytes)",
                            a.nbytes(),
                            batch.bytes(),
                            batch.units(),
                            batch.unit_bytes()
                        ),
                    ));
                }
                let flat = o.call_method1("reshape", (-1,))?;
                let end = (batch.bytes() / a.itemsize()) as isize;
                flat.get_item(pyo3::types::PySlice::new(py, 0, end, 1))?
            }
            None => {
                let itemsize = match batch.dtype() {
                    DType::Bytes => 1,
                    d => d.itemsize(),
                };
                crate::buffer::alloc_uninit(py, batch.dtype(), batch.bytes() / itemsize)
            }
        };
        {
            let arg = format!("get_batch('{name}', out)");
            let a = Array::new(&values, &arg, true)?;
            let mut dst = a.borrow_mut(&arg)?;
            let dst = dst.bytes_mut();
            let store = self.store.clone();
            py.detach(|| store.read_ragged(&batch, &mut dst[..batch.bytes()]))
                .py(py)?;
        }
        let offsets: Vec<i64> = batch.offsets().iter().map(|&o| o as i64).collect();
        Ok((values, numpy::PyArray1::from_vec(py, offsets)))
    }

    /// Whether `name` is a ragged variable.
    fn is_ragged(&self, name: &str) -> bool {
        self.store.is_ragged(name)
    }

    /// Method 2 extra job: `name`'s values and ends were attached
    /// (as `name#values`, `name#ends`); read them as one ragged variable.
    fn link_ragged(&self, py: Python<'_>, name: String) -> PyResult<()> {
        let itemsize = self
            .itemsizes
            .lock()
            .unwrap()
            .get(&ddstore_core::ragged::values_name(&name))
            .copied()
            .unwrap_or(1);
        self.store.link_ragged(&name).py(py)?;
        self.itemsizes.lock().unwrap().insert(name, itemsize);
        Ok(())
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
        let offset = match &offset {
            Some(o) => int_arg(o, &format!("update('{name}'): offset"))?,
            None => 0,
        };
        let arg = format!("update('{name}', arr)");
        let a = Array::new(&arr, &arg, false)?;
        check_dtype(py, "update", &name, &self.var_info(py, &name)?, &a)?;
        if offset < 0 {
            return Err(to_index(
                py,
                format!("update('{name}'): offset={offset} must be >= 0"),
            ));
        }
        let store = self.store.clone();
        let src = a.borrow(&arg)?;
        let data = src.bytes();
        py.detach(|| store.write_local(&name, offset as u64, data))
            .py(py)
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
        let what = format!("load_file_ranges('{name}')");
        let timeout = match timeout_s {
            Some(t) if t.is_finite() && t > 0.0 => Duration::from_secs_f64(t),
            Some(t) => {
                return Err(value_error(
                    py,
                    format!("{what}: timeout_s={t} must be a positive number of seconds"),
                ))
            }
            // The store's settings snapshot (DDSTORE_LOAD_TIMEOUT_S when it was made).
            None => match self.settings.inner.value("DDSTORE_LOAD_TIMEOUT_S").py(py)? {
                Some(Value::Seconds(t)) if t.is_finite() && t > 0.0 => Duration::from_secs_f64(t),
                other => {
                    return Err(value_error(
                        py,
                        format!("{what}: DDSTORE_LOAD_TIMEOUT_S gives {other:?}, not a positive number of seconds"),
                    ))
                }
            },
        };
        let table = ranges.as_array();
        if table.ncols() != 7 {
            return Err(value_error(
                py,
                format!("{what}: ranges must have 7 columns, got {}", table.ncols()),
            ));
        }
        if sizes.as_ref().is_some_and(|s| s.len() != paths.len()) {
            return Err(value_error(
                py,
                format!("{what}: sizes must give one size per path"),
            ));
        }
        let mut parsed = Vec::with_capacity(table.nrows());
        for (i, row) in table.rows().into_iter().enumerate() {
            let bad =
                |col: &str| value_error(py, format!("{what}: range {i}: {col} is out of range"));
            let file = usize::try_from(row[0]).map_err(|_| bad("file index"))?;
            let file_offset = u64::try_from(row[1]).map_err(|_| bad("file offset"))?;
            let len = usize::try_from(row[2]).map_err(|_| bad("length"))?;
            let crc32 = match row[3] {
                -1 => None,
                c => Some(u32::try_from(c).map_err(|_| bad("crc32"))?),
            };
            let skip = usize::try_from(row[4]).map_err(|_| bad("skip"))?;
            let write_len = usize::try_from(row[5]).map_err(|_| bad("write length"))?;
            let dst_offset = usize::try_from(row[6]).map_err(|_| bad("share offset"))?;
            parsed.push(FileRange {
                file,
                file_offset,
                len,
                crc32,
                skip,
                write_len,
                dst_offset,
            });
        }
        let store = self.store.clone();
        py.detach(move || {
            let mut files = Vec::with_capacity(paths.len());
            for (i, p) in paths.iter().enumerate() {
                let size = sizes.as_ref().and_then(|s| u64::try_from(s[i]).ok());
                files.push(SourceFile::open(p, nofollow, direct, size)?);
            }
            let all_direct = !files.is_empty() && files.iter().all(|f| f.is_direct());
            let n = store.load_file_ranges(&name, files, &parsed, threads, timeout)?;
            Ok((n, all_direct))
        })
        .py(py)
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
        let start = match &start {
            Some(s) => int_arg(s, &format!("get('{name}'): start"))?,
            None => 0,
        };
        let arg = format!("get('{name}', arr)");
        let a = Array::new(&arr, &arg, true)?;
        let var = self.store.var(&name).py(py)?;
        let info = &var.info;
        if !a.nbytes().is_multiple_of(info.row_bytes) {
            return Err(value_error(
                py,
                format!(
                    "get('{name}'): arr has shape {:?} ({} bytes), expected a multiple of the {}-byte row",
                    a.arr.shape(),
                    a.nbytes(),
                    info.row_bytes
                ),
            ));
        }
        check_out(py, "get", &name, info, &a, a.nbytes() / info.row_bytes)?;
        let store = self.store.clone();
        let mut out = a.borrow_mut(&arg)?;
        let out = out.bytes_mut();
        py.detach(|| store.get(&name, start, out)).py(py)
    }

    /// Row i of `arr` receives global row `indices[i]`.
    fn get_batch(
        &self,
        py: Python<'_>,
        name: String,
        arr: Bound<'_, PyAny>,
        indices: Bound<'_, PyAny>,
    ) -> PyResult<()> {
        self.read_indexed(py, "get_batch", name, arr, indices, |s, v, r, o| {
            s.read_var(v, r, o, OwnRows::Copy)
        })
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
        nrows: i64,
        row_bytes: i64,
        tensor: Bound<'_, PyAny>,
        iface: &str,
        device: i32,
        itemsize: usize,
        dtype: Option<&str>,
    ) -> PyResult<crate::external::PyDeviceShare> {
        let py = slf.py();
        let this = slf.get();
        if nrows < 0 || row_bytes <= 0 {
            return Err(value_error(
                py,
                format!("init_device('{name}'): nrows={nrows} must be >= 0 and row_bytes={row_bytes} >= 1"),
            ));
        }
        let dtype = match dtype {
            Some(d) => DType::parse(d).py(py)?,
            None => DType::Bytes,
        };
        let iface = HmemIface::parse(iface).py(py)?;
        let share = crate::external::share_of_tensor(&tensor, iface, device)?;
        let store = this.store.clone();
        let n = name.clone();
        py.detach(move || store.init_external(&n, nrows as u64, row_bytes as usize, dtype, share))
            .py(py)?;
        this.itemsizes
            .lock()
            .unwrap()
            .insert(name.clone(), itemsize.max(1));
        let layout = this.store.var(&name).py(py)?.info.layout.clone();
        let rank = this.store.comm().rank();
        Ok(crate::external::PyDeviceShare::new(
            slf.clone().unbind(),
            name,
            tensor.unbind(),
            layout.start(rank),
            layout.count(rank),
            row_bytes as usize,
        ))
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
        self.read_indexed(py, "get_batch_raw", name, arr, indices, |s, v, r, o| {
            s.read_rows_raw(&v.name, r, o)
        })
    }

    /// (total rows, elements per row, itemsize), as upstream pyddstore.
    fn info(&self, py: Python<'_>, name: &str) -> PyResult<(u64, usize, usize)> {
        let info = self.var_info(py, name)?;
        let itemsize = self
            .itemsizes
            .lock()
            .unwrap()
            .get(name)
            .copied()
            .unwrap_or(1);
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

    fn register_recv(&self, py: Python<'_>, name: String, arr: Bound<'_, PyAny>) -> PyResult<()> {
        let a = Array::new(&arr, &format!("register_recv('{name}', arr)"), true)?;
        self.store.register_dst(&name, a.addr(), a.nbytes()).py(py)
    }

    fn unregister_recv(&self, py: Python<'_>, name: String, arr: Bound<'_, PyAny>) -> PyResult<()> {
        let a = Array::new(&arr, &format!("unregister_recv('{name}', arr)"), true)?;
        self.store
            .unregister_dst(&name, a.addr(), a.nbytes())
            .py(py)
    }

    /// Whether any rank's share of `name` spills past its memory budget.
    fn is_spilled(&self, py: Python<'_>, name: &str) -> PyResult<bool> {
        self.store.is_spilled(name).py(py)
    }

    /// Reads ahead: stages the spilled rows among global `rows` (soon read
    /// by this process) in `name`'s read-ahead stage; returns how many.
    fn prefetch(&self, py: Python<'_>, name: &str, rows: Bound<'_, PyAny>) -> PyResult<usize> {
        let rows = indices_of(&rows)?;
        let store = self.store.clone();
        py.detach(|| store.prefetch(name, &rows)).py(py)
    }

    fn get_profile<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyDict>> {
        let p = self.store.profile(name).py(py)?;
        let d = PyDict::new(py);
        for (k, v) in p.fields() {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

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
            row_bytes,
            layout: Layout::new(&counts),
        };
        let store = self.store.clone();
        let n = name.clone();
        py.detach(move || store.attach(&n, info, &records, &locators))
            .py(py)?;
        self.itemsizes.lock().unwrap().insert(name, itemsize.max(1));
        Ok(())
    }

    fn fork_reader(&self, py: Python<'_>) -> PyResult<()> {
        self.store.fork_reader().py(py)
    }

    /// Collective: releases every variable (see `Store::free`).
    fn free(&self, py: Python<'_>) -> PyResult<()> {
        let store = self.store.clone();
        py.detach(move || store.free()).py(py)
    }
}

fn to_index(py: Python<'_>, msg: String) -> PyErr {
    crate::errors::to_py(py, Error::IndexOutOfRange(msg))
}

/// Method 0 (MPI windows over every rank's memory) has no owner to read a
/// spill file: `memory_limit` is refused there.
fn spill_unsupported_on_method0() -> ddstore_core::Error {
    ddstore_core::Error::Unsupported(
        "memory_limit (DDSTORE_MEMORY_LIMIT) needs method 1 or 2: method 0 reads shares through \
         MPI windows over memory only, so rows past the budget could not be served"
            .into(),
    )
}

impl PyStore {
    /// A variable's own budget and spill directory from `add`/`init`
    /// arguments (`None` when neither is given).
    fn spill_request(
        &self,
        py: Python<'_>,
        name: &str,
        memory_limit: Option<Bound<'_, PyAny>>,
        spill_dir: Option<std::path::PathBuf>,
    ) -> PyResult<Option<ddstore_core::spill::SpillRequest>> {
        let memory_limit = match memory_limit {
            None => None,
            Some(v) => {
                let n = int_arg(&v, &format!("memory_limit of '{name}'"))?;
                if n < 0 {
                    return Err(value_error(
                        py,
                        format!("memory_limit={n} of '{name}' must be >= 0 bytes"),
                    ));
                }
                Some(n as u64)
            }
        };
        if memory_limit.is_none() && spill_dir.is_none() {
            return Ok(None);
        }
        if self.method == 0 && memory_limit.is_some() {
            return Err(crate::errors::to_py(py, spill_unsupported_on_method0()));
        }
        Ok(Some(ddstore_core::spill::SpillRequest {
            memory_limit,
            spill_dir,
        }))
    }
}
