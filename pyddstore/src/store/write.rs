//! Creating variables (from rows, or empty) and writing this rank's rows
//! (in a caller's device memory: `device.rs`).

use std::path::PathBuf;

use ddstore_core::store::Element;
use pyo3::prelude::*;

use super::args::{check_dtype, dtype_arg, index_error, int_or_zero, shape_args, ArrayArg};
use super::PyStore;

#[pymethods]
impl PyStore {
    /// Collective: `nrows` rows on this rank, each `row_bytes` bytes.
    /// `memory_limit`, `spill_dir`: this variable's own budget and spill
    /// directory (see `ddstore_core::spill`).
    #[pyo3(signature = (name, nrows, row_bytes, itemsize=1, dtype=None, memory_limit=None, spill_dir=None))]
    #[allow(clippy::too_many_arguments)] // the shape, the dtype and the spill arguments
    fn init(
        &self,
        py: Python<'_>,
        name: String,
        nrows: Bound<'_, PyAny>,
        row_bytes: Bound<'_, PyAny>,
        itemsize: usize,
        dtype: Option<&str>,
        memory_limit: Option<Bound<'_, PyAny>>,
        spill_dir: Option<PathBuf>,
    ) -> PyResult<()> {
        let request = self.spill_request(py, &name, memory_limit, spill_dir)?;
        let (nrows, row_bytes) = shape_args(py, "init", &name, &nrows, &row_bytes)?;
        let element = Element::new(dtype_arg(py, dtype)?, itemsize);
        self.detached(py, |s| {
            s.init_spilling(&name, nrows, row_bytes, element, request.as_ref())
        })
    }

    /// Collective: creates `name` from this rank's rows (`arr`, first axis = rows).
    #[pyo3(signature = (name, arr, memory_limit=None, spill_dir=None))]
    fn add(
        &self,
        py: Python<'_>,
        name: String,
        arr: Bound<'_, PyAny>,
        memory_limit: Option<Bound<'_, PyAny>>,
        spill_dir: Option<PathBuf>,
    ) -> PyResult<()> {
        let request = self.spill_request(py, &name, memory_limit, spill_dir)?;
        let (arg, row_bytes) = ArrayArg::rows(&arr, &name, "arr", "rows")?;
        let nrows = arg.array.rows() as u64;
        let element = Element::new(arg.array.dtype(), arg.array.itemsize());
        let src = arg.borrow()?;
        let data = src.bytes();
        self.detached(py, |s| {
            s.init_spilling(&name, nrows, row_bytes, element, request.as_ref())?;
            s.write_local(&name, 0, data)?;
            // Collective like upstream: every rank's rows are readable once add returns.
            // Bounded: a rank that never arrives is named, not waited for forever.
            s.comm().barrier_timeout(s.config().timeout)
        })
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
        let offset = int_or_zero(offset.as_ref(), &format!("update('{name}'): offset"))?;
        let arg = ArrayArg::new(&arr, "update", &name, "arr", false)?;
        check_dtype(py, "update", &name, &self.var_info(py, &name)?, &arg.array)?;
        if offset < 0 {
            return Err(index_error(
                py,
                format!("update('{name}'): offset={offset} must be >= 0"),
            ));
        }
        let src = arg.borrow()?;
        let data = src.bytes();
        self.detached(py, |s| s.write_local(&name, offset as u64, data))
    }
}
