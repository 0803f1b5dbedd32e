//! Communicators as Python objects: MPI (from mpi4py or initialised here),
//! the file communicator, and torch.distributed through Python callbacks.

use std::any::Any;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ddstore_core::file_comm::FileComm;
use ddstore_core::kinds::CommKind;
use ddstore_core::{Comm, Error, Result, SingleComm};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use crate::errors::IntoPyResult;

/// A group of ranks the store runs on (`pyddstore._native.Comm`).
#[pyclass(name = "Comm", module = "pyddstore._native", frozen)]
pub struct PyComm {
    pub inner: Arc<dyn Comm>,
}

#[pymethods]
impl PyComm {
    /// MPI: from an mpi4py communicator's `py2f()` handle, or MPI_COMM_WORLD
    /// (initialising MPI if nobody has, at `settings.mpi_thread_level`);
    /// collectives bounded by `settings.handshake_timeout_s` (default: the
    /// environment's settings).
    #[staticmethod]
    #[pyo3(signature = (fortran_handle=None, settings=None))]
    fn mpi(
        py: Python<'_>,
        fortran_handle: Option<i64>,
        settings: Option<PyRef<'_, crate::settings::PySettings>>,
    ) -> PyResult<PyComm> {
        let settings = match settings {
            Some(s) => s.inner.clone(),
            None => ddstore_core::config::Settings::from_env().py(py)?,
        };
        crate::methods::mpi_comm(fortran_handle, &settings)
            .py(py)
            .map(|inner| PyComm { inner })
    }

    /// Files in `handshake_dir`; rank and size default to the launcher's (ddstore_core::launcher),
    /// the timeout to the settings table's `DDSTORE_HANDSHAKE_TIMEOUT_S` default.
    #[staticmethod]
    #[pyo3(signature = (handshake_dir, rank=None, size=None, job_id=None, timeout_s=None))]
    fn file(
        py: Python<'_>,
        handshake_dir: PathBuf,
        rank: Option<usize>,
        size: Option<usize>,
        job_id: Option<String>,
        timeout_s: Option<f64>,
    ) -> PyResult<PyComm> {
        // Checked as the setting is (a bad value names the argument), else its default.
        let key = "DDSTORE_HANDSHAKE_TIMEOUT_S";
        let given = timeout_s.map(|s| s.to_string()).unwrap_or_default();
        let settings = ddstore_core::config::Settings::default()
            .with(key, &given, "timeout_s")
            .py(py)?;
        let timeout = settings.config().handshake_timeout;
        let comm = FileComm::new(&handshake_dir, rank, size, job_id, timeout).py(py)?;
        Ok(PyComm {
            inner: Arc::new(comm),
        })
    }

    /// Any object with `rank`, `size`, `allgather(bytes) -> list[bytes]`,
    /// `barrier(timeout_s)` and `split(color, key)` (pyddstore.TorchComm).
    #[staticmethod]
    fn callback(obj: Bound<'_, PyAny>) -> PyResult<PyComm> {
        let rank: usize = obj.getattr("rank")?.extract()?;
        let size: usize = obj.getattr("size")?.extract()?;
        Ok(PyComm {
            inner: Arc::new(CallbackComm {
                obj: obj.unbind(),
                rank,
                size,
            }),
        })
    }

    #[staticmethod]
    fn single() -> PyComm {
        PyComm {
            inner: Arc::new(SingleComm),
        }
    }

    #[getter]
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    #[getter]
    fn size(&self) -> usize {
        self.inner.size()
    }
    #[getter]
    fn kind(&self) -> &'static str {
        self.inner.kind().name()
    }

    fn allgather<'py>(&self, py: Python<'py>, data: Vec<u8>) -> PyResult<Bound<'py, PyList>> {
        let inner = self.inner.clone();
        let all = py.detach(move || inner.allgather(&data)).py(py)?;
        PyList::new(py, all.iter().map(|b| PyBytes::new(py, b)))
    }

    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        let inner = self.inner.clone();
        py.detach(move || inner.barrier()).py(py)
    }

    fn split(&self, py: Python<'_>, color: usize, key: usize) -> PyResult<PyComm> {
        let inner = self.inner.clone();
        let sub = py.detach(move || inner.split(color, key)).py(py)?;
        Ok(PyComm { inner: sub })
    }
}

/// A communicator whose collectives are Python calls (torch.distributed).
struct CallbackComm {
    obj: Py<PyAny>,
    rank: usize,
    size: usize,
}

fn py_failure(e: PyErr) -> Error {
    Error::Comm(format!("Python communicator failed: {e}"))
}

impl Comm for CallbackComm {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn allgather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        Python::attach(|py| {
            let out = self
                .obj
                .bind(py)
                .call_method1("allgather", (PyBytes::new(py, mine),))
                .map_err(py_failure)?;
            let all: Vec<Vec<u8>> = out.extract().map_err(|e: PyErr| py_failure(e))?;
            if all.len() != self.size {
                return Err(Error::Comm(format!(
                    "allgather returned {} records for {} ranks",
                    all.len(),
                    self.size
                )));
            }
            Ok(all)
        })
    }
    fn barrier(&self) -> Result<()> {
        Python::attach(|py| {
            self.obj
                .bind(py)
                .call_method0("barrier")
                .map(|_| ())
                .map_err(py_failure)
        })
    }
    fn barrier_timeout(&self, timeout: Duration) -> Result<()> {
        Python::attach(|py| {
            match self
                .obj
                .bind(py)
                .call_method1("barrier", (timeout.as_secs_f64(),))
            {
                Ok(_) => Ok(()),
                Err(e) if e.is_instance_of::<pyo3::exceptions::PyTimeoutError>(py) => {
                    Err(Error::Timeout {
                        peer: 0,
                        waited: timeout,
                        what: e.value(py).to_string(),
                    })
                }
                Err(e) => Err(py_failure(e)),
            }
        })
    }
    fn split(&self, color: usize, key: usize) -> Result<Arc<dyn Comm>> {
        Python::attach(|py| {
            let sub = self
                .obj
                .bind(py)
                .call_method1("split", (color, key))
                .map_err(py_failure)?;
            let rank: usize = sub
                .getattr("rank")
                .and_then(|r| r.extract())
                .map_err(py_failure)?;
            let size: usize = sub
                .getattr("size")
                .and_then(|r| r.extract())
                .map_err(py_failure)?;
            Ok(Arc::new(CallbackComm {
                obj: sub.unbind(),
                rank,
                size,
            }) as Arc<dyn Comm>)
        })
    }
    fn kind(&self) -> CommKind {
        CommKind::Torch
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
