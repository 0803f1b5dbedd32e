//! `_native.launcher()` and `_native.LAUNCHERS`: ddstore_core's launcher
//! table ([`ddstore_core::launcher`]) for Python, so that `comm=None`, the
//! sampler and `python -m pyddstore info` read rank, size, local rank and
//! job id as the file communicator and the transports do.

use std::collections::HashMap;

use ddstore_core::launcher::{self as table, Launcher, LAUNCHERS};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::IntoPyResult;

/// A lookup in `environ` (a dict of str), else in the process environment.
fn lookup(environ: Option<HashMap<String, String>>) -> impl Fn(&str) -> Option<String> {
    move |k: &str| match &environ {
        Some(env) => env.get(k).cloned(),
        None => std::env::var(k).ok(),
    }
}

fn as_dict<'py>(py: Python<'py>, l: &Launcher) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("name", l.name)?;
    d.set_item("rank", l.rank)?;
    d.set_item("size", l.size)?;
    d.set_item("local_rank", l.local_rank)?;
    d.set_item("local_size", l.local_size)?;
    d.set_item("job_id", l.job_id.as_deref())?;
    d.set_item("source", l.source.as_str())?;
    Ok(d)
}

/// The launcher `environ` (default: this process's environment) describes:
/// `{"name", "rank", "size", "local_rank", "local_size", "job_id", "source"}`
/// (local ones and the job id None where it does not say), or None. A
/// launcher variable that is not a number raises DDStoreValueError naming it.
#[pyfunction]
#[pyo3(signature = (environ=None))]
fn launcher(
    py: Python<'_>,
    environ: Option<HashMap<String, String>>,
) -> PyResult<Option<Bound<'_, PyDict>>> {
    match table::detect(&lookup(environ)).py(py)? {
        Some(l) => as_dict(py, &l).map(Some),
        None => Ok(None),
    }
}

/// Whether a launcher of MPI jobs started the process `environ` describes.
#[pyfunction]
#[pyo3(signature = (environ=None))]
fn mpi_launched(environ: Option<HashMap<String, String>>) -> bool {
    table::mpi_launched(&lookup(environ))
}

/// Adds the launcher functions and `LAUNCHERS` (one dict per table row) to `m`.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(launcher, m)?)?;
    m.add_function(wrap_pyfunction!(mpi_launched, m)?)?;
    let rows = LAUNCHERS
        .iter()
        .map(|row| {
            let d = PyDict::new(m.py());
            d.set_item("key", row.key)?;
            d.set_item("name", row.name)?;
            d.set_item("rank", row.rank)?;
            d.set_item("size", row.size)?;
            d.set_item("local_rank", row.local_rank)?;
            d.set_item("local_size", row.local_size)?;
            // The variables whose values, joined by a dot, make the job id.
            let job_id: Vec<&str> = row
                .job_id
                .iter()
                .flat_map(|(id, part)| [Some(*id), *part])
                .flatten()
                .collect();
            d.set_item("job_id", job_id)?;
            d.set_item("requires", row.requires.to_vec())?;
            d.set_item("mpi", row.mpi)?;
            Ok(d)
        })
        .collect::<PyResult<Vec<_>>>()?;
    m.add("LAUNCHERS", rows)
}
