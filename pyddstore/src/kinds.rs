//! The kinds of `ddstore_core::kinds` as Python sees them: the tables
//! `pyddstore._kinds` builds `Method` and `CommKind` from, and the one check
//! of a method number.

use ddstore_core::kinds::{CommKind, Method, RaggedPart};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyString};

use crate::errors::{value_error, IntoPyResult};

/// A `method=` argument as its method: an int 0, 1 or 2, or a
/// `pyddstore.Method` name in any case (`"LIBFABRIC"`, `"libfabric"`); a bool
/// or any other type is refused: DDStoreValueError naming the value.
pub fn method_arg(value: &Bound<'_, PyAny>) -> PyResult<Method> {
    let py = value.py();
    if let Ok(name) = value.cast::<PyString>() {
        return Method::from_name(&name.to_cow()?).py(py);
    }
    let number = match value.extract::<i64>() {
        Ok(n) if !value.is_instance_of::<PyBool>() => n,
        _ => {
            let shown = value.repr().map(|r| r.to_string()).unwrap_or_default();
            return Err(value_error(
                py,
                format!(
                    "method={shown} is not valid: expected 0 (MPI RMA), 1 or 2 (libfabric), \
                     or a pyddstore.Method name"
                ),
            ));
        }
    };
    Method::from_number(number).py(py)
}

/// The number of a valid `method=` argument (0, 1 or 2; an IntEnum member
/// counts as its number, a `Method` name in any case as its method);
/// DDStoreValueError otherwise.
#[pyfunction]
fn check_method(value: &Bound<'_, PyAny>) -> PyResult<u8> {
    Ok(method_arg(value)?.number())
}

/// Adds the kinds' tables and `check_method` to the module.
pub fn add_to(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let methods = PyDict::new(m.py());
    for method in Method::ALL {
        methods.set_item(method.name(), method.number())?;
    }
    m.add("METHOD_NUMBERS", methods)?;
    let kinds: Vec<&str> = CommKind::ALL.iter().map(|k| k.name()).collect();
    m.add("COMM_KINDS", kinds)?;
    let parts: Vec<&str> = RaggedPart::ALL.iter().map(|p| p.suffix()).collect();
    m.add("RAGGED_PARTS", parts)?;
    m.add_function(wrap_pyfunction!(check_method, m)?)?;
    Ok(())
}
