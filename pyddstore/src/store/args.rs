//! Argument extractors the store's methods share: integers, row indices,
//! dtypes, row shapes, and numpy arrays checked against a variable.

use ddstore_core::store::VarInfo;
use ddstore_core::{DType, Error};
use numpy::{PyReadonlyArray1, PyUntypedArrayMethods};
use pyo3::prelude::*;

use crate::buffer::{Array, Borrowed};
use crate::errors::{type_error, value_error, IntoPyResult};

/// An integer argument (int or numpy integer; not a float) within int64,
/// else a DDStoreTypeError / DDStoreIndexError quoting what was passed.
pub(crate) fn int_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<i64> {
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
        index_error(
            py,
            format!(
                "{what}={} is out of range: expected an integer below 2**63",
                shown()
            ),
        )
    })
}

/// An optional integer argument; `None` is 0 (a start row, an offset).
pub(crate) fn int_or_zero(obj: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<i64> {
    obj.map_or(Ok(0), |o| int_arg(o, what))
}

/// Row indices from an int64 array (fast path) or any sequence of ints.
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
                return Err(index_error(
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
                    index_error(py, msg)
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

/// A DDStoreIndexError raised by the binding itself.
pub(crate) fn index_error(py: Python<'_>, msg: String) -> PyErr {
    crate::errors::to_py(py, Error::IndexOutOfRange(msg))
}

/// The dtype a `dtype=` argument names; `None` is raw bytes.
pub(crate) fn dtype_arg(py: Python<'_>, dtype: Option<&str>) -> PyResult<DType> {
    dtype.map_or(Ok(DType::Bytes), |d| DType::parse(d).py(py))
}

/// `nrows` and `row_bytes` of a new variable: at least 0 rows of at least 1 byte.
pub(crate) fn shape_args(
    py: Python<'_>,
    call: &str,
    name: &str,
    nrows: &Bound<'_, PyAny>,
    row_bytes: &Bound<'_, PyAny>,
) -> PyResult<(u64, usize)> {
    let nrows = int_arg(nrows, &format!("{call}('{name}'): nrows"))?;
    let row_bytes = int_arg(row_bytes, &format!("{call}('{name}'): row_bytes"))?;
    if nrows < 0 {
        return Err(value_error(
            py,
            format!("{call}('{name}'): nrows={nrows} must be >= 0"),
        ));
    }
    if row_bytes <= 0 {
        return Err(value_error(
            py,
            format!("{call}('{name}'): a row of {row_bytes} bytes must be at least 1 byte"),
        ));
    }
    Ok((nrows as u64, row_bytes as usize))
}

/// A numpy array passed to a call on one variable, with the label its
/// errors carry (`get_batch('x', arr)`).
pub(crate) struct ArrayArg<'py> {
    /// The array.
    pub array: Array<'py>,
    /// `call('name', what)`, for messages.
    pub label: String,
}

impl<'py> ArrayArg<'py> {
    /// `obj` as the `what` argument of `call('name', ...)`: a C-contiguous
    /// array of a plain dtype, writable when the call writes into it.
    pub fn new(
        obj: &Bound<'py, PyAny>,
        call: &str,
        name: &str,
        what: &str,
        writable: bool,
    ) -> PyResult<ArrayArg<'py>> {
        let label = format!("{call}('{name}', {what})");
        let array = Array::new(obj, &label, writable)?;
        Ok(ArrayArg { array, label })
    }

    /// As [`ArrayArg::new`] for the rows of a new variable (first axis: rows,
    /// or units of a ragged one): the array and the bytes of one row.
    pub fn rows(
        obj: &Bound<'py, PyAny>,
        name: &str,
        what: &str,
        axis: &str,
    ) -> PyResult<(ArrayArg<'py>, usize)> {
        let arg = ArrayArg::new(obj, "add", name, what, false)?;
        let shape = arg.array.arr.shape();
        if shape.is_empty() {
            return Err(value_error(
                obj.py(),
                format!("add('{name}'): {what} must have at least one dimension ({axis})"),
            ));
        }
        let row_bytes = shape[1..].iter().product::<usize>() * arg.array.itemsize();
        Ok((arg, row_bytes))
    }

    /// Its bytes to read from, held against writers until dropped.
    pub fn borrow(&self) -> PyResult<Borrowed<'py>> {
        self.array.borrow(&self.label)
    }

    /// Its bytes to write to, held against every other use until dropped.
    pub fn borrow_mut(&self) -> PyResult<Borrowed<'py>> {
        self.array.borrow_mut(&self.label)
    }
}

/// Checks `arr`'s dtype against the variable's (raw-bytes variables take any dtype).
pub(crate) fn check_dtype(
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
pub(crate) fn check_out(
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
