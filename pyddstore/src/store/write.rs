//! Creating variables (from rows, or empty) and writing this rank's rows
//! (in a caller's device memory: `device.rs`).

use std::path::PathBuf;

use ddstore_core::store::{Element, NewVar};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::args::{check_dtype, dtype_arg, index_error, int_or_zero, shape_args, ArrayArg};
use super::PyStore;

/// A variable of `create_many`: to add from rows, or to init empty.
enum NewItem<'py> {
    Add(ArrayArg<'py>, usize),
    Init(u64, usize, Element),
}

impl<'py> NewItem<'py> {
    /// The item `(name, arr)` or `(name, nrows, row_bytes, itemsize, dtype)`.
    fn of(py: Python<'py>, item: &Bound<'py, PyTuple>, name: &str) -> PyResult<NewItem<'py>> {
        match item.len() {
            2 => {
                let (arg, row_bytes) = ArrayArg::rows(&item.get_item(1)?, name, "arr", "rows")?;
                Ok(NewItem::Add(arg, row_bytes))
            }
            5 => {
                let (nrows, row_bytes) =
                    shape_args(py, "init", name, &item.get_item(1)?, &item.get_item(2)?)?;
                let itemsize: usize = item.get_item(3)?.extract()?;
                let dtype: Option<String> = item.get_item(4)?.extract()?;
                let element = Element::new(dtype_arg(py, dtype.as_deref())?, itemsize);
                Ok(NewItem::Init(nrows, row_bytes, element))
            }
            n => Err(pyo3::exceptions::PyTypeError::new_err(format!(
                "create_many: an item of {n} values: expected (name, arr) or \
                 (name, nrows, row_bytes, itemsize, dtype)"
            ))),
        }
    }

    /// Rows on this rank, bytes per row, and the element.
    fn shape(&self) -> (u64, usize, Element) {
        match self {
            NewItem::Add(arg, rb) => (
                arg.array.rows() as u64,
                *rb,
                Element::new(arg.array.dtype(), arg.array.itemsize()),
            ),
            NewItem::Init(rows, rb, element) => (*rows, *rb, *element),
        }
    }
}

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
        // Collective like upstream: every rank's rows are readable once add returns
        // (one exchange: the rows are written before it).
        self.detached(py, |s| {
            s.add(&name, nrows, row_bytes, element, data, request.as_ref())
        })
    }

    /// Collective: creates every variable of `items` in one exchange, in
    /// order: an item `(name, arr)` as `add(name, arr)`, `(name, nrows,
    /// row_bytes, itemsize, dtype)` as `init`; `memory_limit` and
    /// `spill_dir` apply to each.
    #[pyo3(signature = (items, memory_limit=None, spill_dir=None))]
    fn create_many(
        &self,
        py: Python<'_>,
        items: Vec<Bound<'_, PyTuple>>,
        memory_limit: Option<Bound<'_, PyAny>>,
        spill_dir: Option<PathBuf>,
    ) -> PyResult<()> {
        let mut names = Vec::with_capacity(items.len());
        let mut made = Vec::with_capacity(items.len());
        let mut requests = Vec::with_capacity(items.len());
        for item in &items {
            let name: String = item.get_item(0)?.extract()?;
            made.push(NewItem::of(py, item, &name)?);
            requests.push(self.spill_request(
                py,
                &name,
                memory_limit.clone(),
                spill_dir.clone(),
            )?);
            names.push(name);
        }
        let borrowed = made
            .iter()
            .map(|m| match m {
                NewItem::Add(arg, _) => arg.borrow().map(Some),
                NewItem::Init(..) => Ok(None),
            })
            .collect::<PyResult<Vec<_>>>()?;
        let vars: Vec<NewVar<'_>> = made
            .iter()
            .zip(&borrowed)
            .zip(names.iter().zip(&requests))
            .map(|((m, b), (name, request))| {
                let (rows, row_bytes, element) = m.shape();
                NewVar {
                    name,
                    rows,
                    row_bytes,
                    element,
                    data: b.as_ref().map(|b| b.bytes()),
                    request: request.as_ref(),
                    problem: None,
                    along: None,
                }
            })
            .collect();
        self.detached(py, |s| s.create_many(&vars).map(drop))
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
