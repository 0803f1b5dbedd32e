//! Variables past their memory budget (issue 27; see `ddstore_core::spill`):
//! the `memory_limit=` / `spill_dir=` arguments of `init`, `add` and
//! `add_ragged`, and reading spilled rows ahead of use.

use ddstore_core::kinds::Method;
use ddstore_core::spill::SpillRequest;
use pyo3::prelude::*;

use super::args::{indices_of, int_arg};
use super::PyStore;
use crate::errors::{to_py, value_error, IntoPyResult};

/// Method 0 (MPI windows over every rank's memory) has no owner to read a
/// spill file: a memory budget is refused there.
pub(super) fn unsupported_on_method0() -> ddstore_core::Error {
    ddstore_core::Error::Unsupported(
        "memory_limit (DDSTORE_MEMORY_LIMIT) needs method 1 or 2: method 0 reads shares through \
         MPI windows over memory only, so rows past the budget could not be served"
            .into(),
    )
}

impl PyStore {
    /// A variable's own budget and spill directory from `add`/`init`
    /// arguments (`None` when neither is given).
    pub(super) fn spill_request(
        &self,
        py: Python<'_>,
        name: &str,
        memory_limit: Option<Bound<'_, PyAny>>,
        spill_dir: Option<std::path::PathBuf>,
    ) -> PyResult<Option<SpillRequest>> {
        let memory_limit = match memory_limit {
            None => None,
            Some(v) => {
                let n = int_arg(&v, &format!("memory_limit of '{name}'"))?;
                if n < 0 {
                    return Err(value_error(
                        py,
                        format!("memory_limit={n} of '{name}' must be >= 0 bytes"),
                    ));
                }
                Some(n as u64)
            }
        };
        if memory_limit.is_none() && spill_dir.is_none() {
            return Ok(None);
        }
        if self.method == Method::MpiRma && memory_limit.is_some() {
            return Err(to_py(py, unsupported_on_method0()));
        }
        Ok(Some(SpillRequest {
            memory_limit,
            spill_dir,
        }))
    }
}

#[pymethods]
impl PyStore {
    /// Whether any rank's share of `name` spills past its memory budget.
    fn is_spilled(&self, py: Python<'_>, name: &str) -> PyResult<bool> {
        self.store.is_spilled(name).py(py)
    }

    /// Reads ahead: stages the spilled rows among global `rows` (soon read
    /// by this process) in `name`'s read-ahead stage; returns how many.
    fn prefetch(&self, py: Python<'_>, name: &str, rows: Bound<'_, PyAny>) -> PyResult<usize> {
        let rows = indices_of(&rows)?;
        self.detached(py, |s| s.prefetch(name, &rows))
    }

    /// Bytes of `name`'s read-ahead stage (0: it stages nothing).
    fn stage_capacity(&self, py: Python<'_>, name: &str) -> PyResult<usize> {
        self.store.stage_capacity(name).py(py)
    }
}
