//! Ragged variables: rows of different lengths, stored as two variables
//! (values and row ends) and read as (values, offsets).

use ddstore_core::store::Element;
use ddstore_core::DType;
use pyo3::prelude::*;
use pyo3::types::PySlice;

use super::args::{dtype_arg, indices_of, ArrayArg};
use super::PyStore;
use crate::buffer::alloc_uninit;
use crate::errors::{type_error, value_error, IntoPyResult};

/// Row lengths in units: integers, none negative.
fn lengths_arg(
    py: Python<'_>,
    call: &str,
    name: &str,
    lengths: &Bound<'_, PyAny>,
) -> PyResult<Vec<u64>> {
    let lengths = indices_of(lengths)?;
    if let Some(i) = lengths.iter().position(|&l| l < 0) {
        return Err(value_error(
            py,
            format!(
                "{call}('{name}'): lengths[{i}] = {} is negative: expected lengths >= 0",
                lengths[i]
            ),
        ));
    }
    Ok(lengths.iter().map(|&l| l as u64).collect())
}

#[pymethods]
impl PyStore {
    /// Collective: creates the ragged variable `name` from this rank's rows:
    /// row i is `lengths[i]` consecutive units (first-axis entries) of
    /// `values`; lengths may be 0 and a rank may have no rows.
    #[pyo3(signature = (name, values, lengths, memory_limit=None, spill_dir=None))]
    fn add_ragged(
        &self,
        py: Python<'_>,
        name: String,
        values: Bound<'_, PyAny>,
        lengths: Bound<'_, PyAny>,
        memory_limit: Option<Bound<'_, PyAny>>,
        spill_dir: Option<std::path::PathBuf>,
    ) -> PyResult<()> {
        let request = self.spill_request(py, &name, memory_limit, spill_dir)?;
        let (arg, unit_bytes) = ArrayArg::rows(&values, &name, "values", "units")?;
        let lengths = lengths_arg(py, "add", &name, &lengths)?;
        let element = Element::new(arg.array.dtype(), arg.array.itemsize());
        let src = arg.borrow()?;
        let data = src.bytes();
        self.detached(py, |s| {
            s.add_ragged_spilling(&name, &lengths, unit_bytes, element, data, request.as_ref())
        })
    }

    /// Collective: creates the ragged variable `name` of this rank's rows
    /// (row i: `lengths[i]` units of `unit_bytes` bytes) and has `fill`
    /// write their values in place, with no contiguous copy of them first:
    /// `fill(values_part)` is called once with the name of the variable
    /// holding the values, which it fills (`update`, `load_file_ranges`)
    /// as this rank's units. The variable is readable once every rank's
    /// `fill` returned; an exception from `fill` on any rank fails every
    /// rank (that rank raises its own). The protocol is `add_ragged`'s
    /// (Rust's `begin_ragged`, then `finish_ragged`).
    #[allow(clippy::too_many_arguments)] // add_ragged's, with the shape and dtype instead of the values
    #[pyo3(signature = (name, lengths, unit_bytes, fill, itemsize=1, dtype=None, memory_limit=None, spill_dir=None))]
    fn init_ragged(
        &self,
        py: Python<'_>,
        name: String,
        lengths: Bound<'_, PyAny>,
        unit_bytes: usize,
        fill: Bound<'_, PyAny>,
        itemsize: usize,
        dtype: Option<&str>,
        memory_limit: Option<Bound<'_, PyAny>>,
        spill_dir: Option<std::path::PathBuf>,
    ) -> PyResult<()> {
        let request = self.spill_request(py, &name, memory_limit, spill_dir)?;
        let lengths = lengths_arg(py, "init_ragged", &name, &lengths)?;
        let element = Element::new(dtype_arg(py, dtype)?, itemsize);
        let new = self.detached(py, |s| {
            s.begin_ragged(&name, &lengths, unit_bytes, element, request.as_ref(), None)
        })?;
        let filled = fill.call1((new.values_part(),));
        let problem = filled.as_ref().err().map(|e| e.to_string());
        let linked = self.detached(py, |s| s.finish_ragged(new, problem));
        filled?;
        linked
    }

    /// Reads ragged rows `indices` (any order, repeats): returns
    /// `(values, offsets)`, row i being units `offsets[i]:offsets[i + 1]` of
    /// `values` (a flat array of the variable's dtype, `unit_bytes` per unit).
    /// With `out`, the values land at the start of `out` (a writable
    /// contiguous array of the same dtype, large enough) and `values` is the
    /// filled part of `out`.
    #[pyo3(signature = (name, indices, out=None))]
    fn get_ragged<'py>(
        &self,
        py: Python<'py>,
        name: String,
        indices: Bound<'py, PyAny>,
        out: Option<Bound<'py, PyAny>>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, numpy::PyArray1<i64>>)> {
        let rows = indices_of(&indices)?;
        let batch = self.detached(py, |s| s.plan_ragged(&name, &rows))?;
        let values = match out {
            Some(o) => {
                let a = ArrayArg::new(&o, "get_batch", &name, "out", true)?.array;
                if batch.dtype() != DType::Bytes && a.dtype() != batch.dtype() {
                    return Err(type_error(
                        py,
                        format!(
                            "get_batch('{name}'): out has dtype {}, the variable holds {}",
                            a.dtype_name(),
                            batch.dtype().name()
                        ),
                    ));
                }
                if a.nbytes() < batch.bytes() {
                    return Err(value_error(
                    py,
                    format!(
                        "get_batch('{name}'): out has {} bytes, the batch needs {} ({} units of {} bytes)",
                        a.nbytes(),
                        batch.bytes(),
                        batch.units(),
                        batch.unit_bytes()
                    ),
                ));
                }
                let flat = o.call_method1("reshape", (-1,))?;
                let end = (batch.bytes() / a.itemsize()) as isize;
                flat.get_item(PySlice::new(py, 0, end, 1))?
            }
            None => {
                let itemsize = match batch.dtype() {
                    DType::Bytes => 1,
                    d => d.itemsize(),
                };
                alloc_uninit(py, batch.dtype(), batch.bytes() / itemsize)
            }
        };
        {
            let arg = ArrayArg::new(&values, "get_batch", &name, "out", true)?;
            let mut dst = arg.borrow_mut()?;
            let dst = dst.bytes_mut();
            self.detached(py, |s| s.read_ragged(&batch, &mut dst[..batch.bytes()]))?;
        }
        let offsets: Vec<i64> = batch.offsets().iter().map(|&o| o as i64).collect();
        Ok((values, numpy::PyArray1::from_vec(py, offsets)))
    }

    /// Whether `name` is a ragged variable.
    fn is_ragged(&self, name: &str) -> bool {
        self.store.is_ragged(name)
    }

    /// Method 2 extra job: `name`'s values and ends were attached
    /// (as `name#values`, `name#ends`); read them as one ragged variable.
    fn link_ragged(&self, py: Python<'_>, name: String) -> PyResult<()> {
        self.store.link_ragged(&name).py(py)
    }
}
