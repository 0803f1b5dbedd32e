//! The one place where Rust errors become Python exceptions. The classes
//! live in `pyddstore/_errors.py` so they can also derive from the matching
//! builtin (ValueError, IndexError, ...).

use ddstore_core::Error;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

static ERRORS_MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

fn class_name(err: &Error) -> &'static str {
    match err {
        Error::InvalidArgument(_) => "DDStoreValueError",
        Error::IndexOutOfRange(_) => "DDStoreIndexError",
        Error::WrongType(_) => "DDStoreTypeError",
        Error::UnknownVariable(_) => "DDStoreKeyError",
        Error::AlreadyExists(_) => "DDStoreValueError",
        Error::Freed => "DDStoreFreedError",
        Error::Timeout { .. } => "DDStoreTimeoutError",
        Error::Unsupported(_) => "DDStoreUnsupportedError",
        Error::Access(_) => "DDStoreAccessError",
        Error::Comm(_) | Error::Transport(_) | Error::Io { .. } => "DDStoreError",
    }
}

/// Builds the Python exception for `err` (falls back to RuntimeError if
/// the Python package is not importable, e.g. a bare `_native` import).
pub fn to_py(py: Python<'_>, err: Error) -> PyErr {
    let msg = err.to_string();
    let module =
        ERRORS_MODULE.get_or_try_init(py, || py.import("pyddstore._errors").map(|m| m.unbind()));
    match module.and_then(|m| m.bind(py).getattr(class_name(&err))) {
        Ok(cls) => match cls.cast_into::<PyType>() {
            Ok(cls) => PyErr::from_type(cls, msg),
            Err(_) => pyo3::exceptions::PyRuntimeError::new_err(msg),
        },
        Err(_) => pyo3::exceptions::PyRuntimeError::new_err(msg),
    }
}

/// `?`-friendly conversion: `result.map_err(py_err)?` needs the GIL token,
/// so this trait lets call sites write `.py(py)?`.
pub trait IntoPyResult<T> {
    fn py(self, py: Python<'_>) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for Result<T, Error> {
    fn py(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|e| to_py(py, e))
    }
}

/// A bad argument detected in the binding itself.
pub fn value_error(py: Python<'_>, msg: String) -> PyErr {
    to_py(py, Error::InvalidArgument(msg))
}
pub fn type_error(py: Python<'_>, msg: String) -> PyErr {
    to_py(py, Error::WrongType(msg))
}
