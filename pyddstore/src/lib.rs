//! `pyddstore._native`: the PyO3 binding. The public Python API is the
//! pure-Python package around it (python/pyddstore).

use pyo3::prelude::*;

mod buffer;
mod comm;
mod errors;
mod methods;
mod store;

/// Finalises MPI if this module initialised it (registered with atexit).
#[pyfunction]
fn finalize_mpi(py: Python<'_>) -> PyResult<()> {
    use errors::IntoPyResult;
    methods::finalize_mpi().py(py)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<comm::PyComm>()?;
    m.add_class::<store::PyStore>()?;
    m.add_function(wrap_pyfunction!(finalize_mpi, m)?)?;
    m.add("METHODS", methods::METHODS.to_vec())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
