//! A torch tensor as a store share (`add_device=`): `Store.init_device`
//! creates a variable in the tensor's memory (described by the tensor
//! itself, kept alive by a reference the share holds) and returns the
//! `DeviceShare` its rows are written and read through.

use std::sync::Arc;

use ddstore_core::external::{ExternalShare, HmemIface};
use ddstore_core::store::Element;
use pyo3::prelude::*;

use super::args::{dtype_arg, indices_of, shape_args};
use super::PyStore;
use crate::errors::{type_error, value_error, IntoPyResult};

/// The Python object whose memory a share uses; held until the share is dropped.
struct TensorOwner(#[allow(dead_code)] Py<PyAny>);

/// The device type torch reports for memory of `iface` (ROCm builds of torch say "cuda").
fn torch_device_type(iface: HmemIface) -> &'static [&'static str] {
    match iface {
        HmemIface::System => &["cpu"],
        HmemIface::Cuda | HmemIface::Rocr => &["cuda"],
        HmemIface::Ze => &["xpu"],
    }
}

/// This rank's share in `tensor`'s memory: a contiguous tensor on a device
/// of interface `iface` (index `device`), which must not be resized while
/// the store lives.
fn share_of_tensor(
    tensor: &Bound<'_, PyAny>,
    iface: HmemIface,
    device: i32,
) -> PyResult<ExternalShare> {
    let py = tensor.py();
    let what = |e: PyErr| type_error(py, format!("the share must be a torch.Tensor ({e})"));
    let contiguous: bool = tensor
        .call_method0("is_contiguous")
        .and_then(|v| v.extract())
        .map_err(what)?;
    if !contiguous {
        return Err(value_error(
            py,
            "the share tensor must be contiguous".into(),
        ));
    }
    let dev = tensor.getattr("device").map_err(what)?;
    let dev_type: String = dev.getattr("type")?.extract()?;
    let dev_index: Option<i32> = dev.getattr("index")?.extract()?;
    if !torch_device_type(iface).contains(&dev_type.as_str()) {
        return Err(value_error(
            py,
            format!(
                "the share tensor is on a {dev_type} device, which is not {} memory",
                iface.name()
            ),
        ));
    }
    if iface.is_device() && dev_index.is_some_and(|i| i != device) {
        return Err(value_error(
            py,
            format!(
                "the share tensor is on device {}, not {device}",
                dev_index.unwrap_or(0)
            ),
        ));
    }
    let numel: usize = tensor.call_method0("numel")?.extract()?;
    let itemsize: usize = tensor.call_method0("element_size")?.extract()?;
    let len = numel
        .checked_mul(itemsize)
        .ok_or_else(|| value_error(py, format!("the share tensor's {numel} elements overflow")))?;
    let ptr: usize = tensor.call_method0("data_ptr")?.extract()?;
    if ptr == 0 && len > 0 {
        return Err(value_error(py, "the share tensor has no memory".into()));
    }
    let owner = Arc::new(TensorOwner(tensor.clone().unbind()));
    // SAFETY: `ptr..ptr+len` is the memory of a contiguous tensor of `numel`
    // elements of `itemsize` bytes, on the device checked above (host memory
    // for System); `owner` holds a reference to the tensor, so torch keeps
    // that memory allocated while the share lives (the documented contract:
    // the tensor is not resized).
    Ok(unsafe { ExternalShare::new(ptr as *mut u8, len, iface, device, owner) })
}

/// One rank's share of a variable in device memory (`DistDataset(add_device=)`):
/// the one object that owns the tensor (keeping it alive), stands for its
/// registration with the store (made by `Store.init_device`, released with
/// the store), writes rows into it and reads batches of the variable with
/// this rank's own rows gathered on the device by torch. Other ranks' rows
/// come through the transport; in a forked process (which cannot use the
/// device) every row does, the own ones from the parent's registered share.
///
/// Example:
///     ```python
///     t = torch.empty((n, 64), dtype=torch.uint8, device="cuda")
///     share = store.init_device("x", n, 64, t, "cuda", 0)  # collective
///     share.write(my_rows, 0)
///     share.read(out, [0, 17, 5])  # any rows; own ones gathered on the GPU
///     ```
#[pyclass(name = "DeviceShare", module = "pyddstore._native", frozen)]
pub struct PyDeviceShare {
    store: Py<PyStore>,
    name: String,
    tensor: Py<PyAny>,
    start: u64,
    count: u64,
    row_bytes: usize,
    /// The process that made the share: only it can use the device.
    pid: u32,
}

impl PyDeviceShare {
    /// Made by `Store.init_device` once the variable exists.
    fn new(
        store: Py<PyStore>,
        name: String,
        tensor: Py<PyAny>,
        start: u64,
        count: u64,
        row_bytes: usize,
    ) -> PyDeviceShare {
        PyDeviceShare {
            store,
            name,
            tensor,
            start,
            count,
            row_bytes,
            pid: ddstore_core::fork::current_pid(),
        }
    }

    /// Positions in `rows` of this rank's rows, and their indices in the share.
    fn mine(&self, rows: &[i64]) -> (Vec<i64>, Vec<i64>) {
        let (lo, hi) = (self.start as i64, (self.start + self.count) as i64);
        rows.iter()
            .enumerate()
            .filter(|(_, &r)| (lo..hi).contains(&r))
            .map(|(i, &r)| (i as i64, r - lo))
            .unzip()
    }

    /// `values` as an int64 tensor on the share's device.
    fn index_tensor<'py>(&self, py: Python<'py>, values: Vec<i64>) -> PyResult<Bound<'py, PyAny>> {
        let torch = py.import("torch")?;
        let kw = pyo3::types::PyDict::new(py);
        kw.set_item("dtype", torch.getattr("int64")?)?;
        kw.set_item("device", self.tensor.bind(py).getattr("device")?)?;
        torch.call_method("tensor", (values,), Some(&kw))
    }

    /// This rank's rows among `local` (indices in the share), gathered on the device.
    fn gathered<'py>(&self, py: Python<'py>, local: Vec<i64>) -> PyResult<Bound<'py, PyAny>> {
        let idx = self.index_tensor(py, local)?;
        self.tensor.bind(py).call_method1("index_select", (0, idx))
    }
}

/// `arr` (n rows of `row_bytes`, C-contiguous) as an (n, row_bytes) uint8 view of the same memory.
fn byte_rows<'py>(
    arr: &Bound<'py, PyAny>,
    n: usize,
    row_bytes: usize,
) -> PyResult<Bound<'py, PyAny>> {
    let py = arr.py();
    let np = py.import("numpy")?;
    let contiguous: bool = arr.getattr("flags")?.get_item("C_CONTIGUOUS")?.extract()?;
    if !contiguous {
        return Err(value_error(
            py,
            "the destination array must be C-contiguous".into(),
        ));
    }
    arr.call_method1("reshape", (-1,))?
        .call_method1("view", (np.getattr("uint8")?,))?
        .call_method1("reshape", ((n, row_bytes),))
}

#[pymethods]
impl PyDeviceShare {
    /// The variable's name.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }
    /// The (count, row_bytes) uint8 device tensor holding this rank's rows.
    #[getter]
    fn tensor(&self, py: Python<'_>) -> Py<PyAny> {
        self.tensor.clone_ref(py)
    }
    /// The first global row of this rank's share.
    #[getter]
    fn start(&self) -> u64 {
        self.start
    }
    /// How many rows this rank holds.
    #[getter]
    fn count(&self) -> u64 {
        self.count
    }
    /// Bytes per row.
    #[getter]
    fn row_bytes(&self) -> usize {
        self.row_bytes
    }
    /// The torch device of the share.
    #[getter]
    fn device<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.tensor.bind(py).getattr("device")
    }

    /// Writes `rows` (host rows of this variable) into the share from row
    /// `offset` on: one host-to-device copy.
    ///
    /// Args:
    ///     rows (numpy.ndarray): host rows of `row_bytes` bytes each.
    ///     offset (int): the first of this rank's rows to write, 0-based.
    fn write(&self, py: Python<'_>, rows: Bound<'_, PyAny>, offset: i64) -> PyResult<()> {
        let np = py.import("numpy")?;
        let host = np.call_method1("ascontiguousarray", (rows,))?;
        let n: usize = host.len()?;
        if offset < 0 || offset as u64 + n as u64 > self.count {
            return Err(crate::errors::to_py(
                py,
                ddstore_core::Error::IndexOutOfRange(format!(
                    "write('{}'): rows {offset}..{} do not fit this rank's {} rows",
                    self.name,
                    offset + n as i64,
                    self.count
                )),
            ));
        }
        let nbytes: usize = host.getattr("nbytes")?.extract()?;
        if nbytes != n * self.row_bytes {
            return Err(value_error(
                py,
                format!(
                    "write('{}'): {n} rows of {nbytes} bytes in all, expected {} bytes per row",
                    self.name, self.row_bytes
                ),
            ));
        }
        let src = py
            .import("torch")?
            .call_method1("from_numpy", (byte_rows(&host, n, self.row_bytes)?,))?;
        self.tensor
            .bind(py)
            .call_method1("narrow", (0, offset, n))?
            .call_method1("copy_", (src,))?;
        Ok(())
    }

    /// Reads rows `rows` of the variable into `out` (host memory, len(rows)
    /// rows): other ranks' rows through the transport, this rank's gathered
    /// on the device and copied once (`own=False` leaves them untouched, for
    /// `gather_own`). In a forked process every row comes through the transport.
    ///
    /// Args:
    ///     out (numpy.ndarray): contiguous host buffer of len(rows) rows.
    ///     rows (Sequence[int] | numpy.ndarray): global row numbers, any rank's, any order.
    ///     own (bool): also copy this rank's rows (False: leave them for `gather_own`).
    #[pyo3(signature = (out, rows, own=true))]
    fn read(
        &self,
        py: Python<'_>,
        out: Bound<'_, PyAny>,
        rows: Bound<'_, PyAny>,
        own: bool,
    ) -> PyResult<()> {
        use ddstore_core::store::OwnRows;
        let store = self.store.bind(py).get();
        let forked = ddstore_core::fork::current_pid() != self.pid;
        let mode = if forked {
            OwnRows::Transport
        } else {
            OwnRows::Skip
        };
        let indices = indices_of(&rows)?;
        store.read_indexed(
            py,
            "read",
            self.name.clone(),
            out.clone(),
            rows,
            move |s, v, r, o| s.read_var(v, r, o, mode),
        )?;
        if forked || !own {
            return Ok(());
        }
        let (pos, local) = self.mine(&indices);
        if pos.is_empty() {
            return Ok(());
        }
        let got = self
            .gathered(py, local)?
            .call_method0("cpu")?
            .call_method0("numpy")?;
        let view = byte_rows(&out, indices.len(), self.row_bytes)?;
        let np = py.import("numpy")?;
        view.set_item(np.call_method1("asarray", (pos,))?, got)
    }

    /// Copies this rank's rows among `rows` into `dst` (a contiguous tensor
    /// of len(rows) rows on the share's device), device to device; other
    /// rows of `dst` are left as they are.
    ///
    /// Args:
    ///     dst (torch.Tensor): contiguous, len(rows) rows, on the share's device.
    ///     rows (Sequence[int] | numpy.ndarray): global row numbers.
    fn gather_own(
        &self,
        py: Python<'_>,
        dst: Bound<'_, PyAny>,
        rows: Bound<'_, PyAny>,
    ) -> PyResult<()> {
        if ddstore_core::fork::current_pid() != self.pid {
            return Err(crate::errors::to_py(
                py,
                ddstore_core::Error::Unsupported(format!(
                    "gather_own('{}'): a forked process cannot use the device; read() reads every row \
                     through the transport there",
                    self.name
                )),
            ));
        }
        let indices = indices_of(&rows)?;
        let (pos, local) = self.mine(&indices);
        if pos.is_empty() {
            return Ok(());
        }
        let torch = py.import("torch")?;
        let as_bytes = dst
            .call_method1("view", (torch.getattr("uint8")?,))?
            .call_method1("reshape", ((indices.len(), self.row_bytes),))?;
        let pos = self.index_tensor(py, pos)?;
        as_bytes.call_method1("index_copy_", (0, pos, self.gathered(py, local)?))?;
        Ok(())
    }

    fn __repr__(&self) -> String {
        format!(
            "DeviceShare('{}', rows {}..{}, {} bytes per row)",
            self.name,
            self.start,
            self.start + self.count,
            self.row_bytes
        )
    }
}

#[pymethods]
impl PyStore {
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
        let py = slf.py();
        let this = slf.get();
        let (nrows, row_bytes) = shape_args(py, "init_device", &name, &nrows, &row_bytes)?;
        let element = Element::new(dtype_arg(py, dtype)?, itemsize);
        let iface = HmemIface::parse(iface).py(py)?;
        let share = share_of_tensor(&tensor, iface, device)?;
        this.detached(py, |s| {
            s.init_external(&name, nrows, row_bytes, element, share)
        })?;
        let layout = this.store.var(&name).py(py)?.info.layout.clone();
        let rank = this.store.comm().rank();
        Ok(PyDeviceShare::new(
            slf.clone().unbind(),
            name,
            tensor.unbind(),
            layout.start(rank),
            layout.count(rank),
            row_bytes,
        ))
    }
}
