//! Reading rows: a batch of global rows (any order, repeats), consecutive
//! rows, the transport's raw ceiling, and destination buffers registered once.

use ddstore_core::store::{OwnRows, Variable};
use ddstore_core::Store;
use numpy::PyUntypedArrayMethods;
use pyo3::prelude::*;

use super::args::{check_out, indices_of, int_or_zero, ArrayArg};
use super::PyStore;
use crate::errors::{value_error, IntoPyResult};

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
        let arg = ArrayArg::new(&arr, call, &name, "arr", true)?;
        let var = self.store.var(&name).py(py)?;
        check_out(py, call, &name, &var.info, &arg.array, rows.len())?;
        // Held while the GIL is released: no other call can use this memory meanwhile.
        let mut out = arg.borrow_mut()?;
        let out = out.bytes_mut();
        self.detached(py, |s| read(s, &var, &rows, out))
    }
}

#[pymethods]
impl PyStore {
    /// Reads rows `start .. start + len(arr)` (one owner's share) into `arr`.
    #[pyo3(signature = (name, arr, start=None))]
    fn get(
        &self,
        py: Python<'_>,
        name: String,
        arr: Bound<'_, PyAny>,
        start: Option<Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let start = int_or_zero(start.as_ref(), &format!("get('{name}'): start"))?;
        let arg = ArrayArg::new(&arr, "get", &name, "arr", true)?;
        let a = &arg.array;
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
        check_out(py, "get", &name, info, a, a.nbytes() / info.row_bytes)?;
        let mut out = arg.borrow_mut()?;
        let out = out.bytes_mut();
        self.detached(py, |s| s.get(&name, start, out))
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

    fn register_recv(&self, py: Python<'_>, name: String, arr: Bound<'_, PyAny>) -> PyResult<()> {
        let arg = ArrayArg::new(&arr, "register_recv", &name, "arr", true)?;
        let (addr, len) = (arg.array.addr(), arg.array.nbytes());
        self.store.register_dst(&name, addr, len).py(py)
    }

    fn unregister_recv(&self, py: Python<'_>, name: String, arr: Bound<'_, PyAny>) -> PyResult<()> {
        let arg = ArrayArg::new(&arr, "unregister_recv", &name, "arr", true)?;
        let (addr, len) = (arg.array.addr(), arg.array.nbytes());
        self.store.unregister_dst(&name, addr, len).py(py)
    }

    /// Maps the same-node memory that reads of `names` copy from into this
    /// process's page tables, at most `max_bytes` of it (a forked worker's
    /// first reads fault it in otherwise); the bytes populated
    /// (`Store::populate_node_shares`).
    fn populate_node_shares(
        &self,
        py: Python<'_>,
        names: Vec<String>,
        max_bytes: usize,
    ) -> PyResult<usize> {
        self.detached(py, |s| s.populate_node_shares(&names, max_bytes))
    }
}
