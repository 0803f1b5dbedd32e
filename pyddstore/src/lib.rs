//! `pyddstore._native`: the PyO3 binding. The public Python API is the
//! pure-Python package around it (python/pyddstore).

use pyo3::prelude::*;

mod buffer;
mod comm;
mod errors;
mod methods;
mod store;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<comm::PyComm>()?;
    m.add_class::<store::PyStore>()?;
    m.add("METHODS", methods::METHODS.to_vec())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
