//! `_native.Settings`: one store's `DDSTORE_*` settings (ddstore_core's
//! [`Settings`]), read once from the environment plus constructor arguments,
//! with typed attributes (`settings.timeout_s`, `settings.shm`, ...).

use ddstore_core::config::{Settings, Value, SETTINGS};
use pyo3::exceptions::PyAttributeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::errors::{type_error, IntoPyResult};

/// Every `DDSTORE_*` setting of one store: the environment, read once, plus
/// the constructor's arguments (an argument wins over its variable), each
/// checked against ddstore_core's one table. Attributes are the variable
/// names without `DDSTORE_`, lower case, typed: flags bool, integers int,
/// seconds float, words and text str, None when unset without a default.
///
/// Example:
///     ```python
///     s = pyddstore.Settings.from_env(timeout_s=5)  # the environment, plus timeout_s
///     s.timeout_s, s.shm, s.fabric  # (5.0, True, None)
///     store = pyddstore.PyDDStore(comm, method=1, settings=s)
///     ```
#[pyclass(name = "Settings", module = "pyddstore._native", frozen)]
#[derive(Clone)]
pub struct PySettings {
    pub inner: Settings,
}

/// `DDSTORE_TIMEOUT_S` for "timeout_s" (None for a name that is no setting).
fn key_of(name: &str) -> Option<&'static str> {
    let want = format!("DDSTORE_{}", name.to_ascii_uppercase());
    SETTINGS.iter().map(|s| s.key).find(|k| *k == want)
}

fn to_py(py: Python<'_>, v: Option<Value>) -> PyResult<Py<PyAny>> {
    Ok(match v {
        None => py.None(),
        Some(Value::Flag(b)) => b.into_pyobject(py)?.to_owned().into_any().unbind(),
        Some(Value::Int(i)) => i.into_pyobject(py)?.into_any().unbind(),
        Some(Value::Seconds(s)) => s.into_pyobject(py)?.into_any().unbind(),
        Some(Value::Text(t)) => t.into_pyobject(py)?.into_any().unbind(),
    })
}

/// An argument's value as the variable's text ("" unsets it).
fn text_of(name: &str, value: &Bound<'_, PyAny>) -> PyResult<String> {
    if value.is_none() {
        return Ok(String::new());
    }
    if let Ok(b) = value.cast::<pyo3::types::PyBool>() {
        return Ok(if b.is_true() { "1" } else { "0" }.into());
    }
    if let Ok(i) = value.extract::<i64>() {
        return Ok(i.to_string());
    }
    if let Ok(f) = value.extract::<f64>() {
        return Ok(f.to_string());
    }
    if let Ok(s) = value.extract::<String>() {
        return Ok(s);
    }
    if let Ok(p) = value.call_method0("__fspath__") {
        return p.extract();
    }
    Err(type_error(
        value.py(),
        format!(
            "{name}={} is not valid: expected a string, number or bool",
            value.repr().map(|r| r.to_string()).unwrap_or_default()
        ),
    ))
}

/// `inner` with each override (`timeout_s=5`) applied and checked under its
/// argument's name; `skip_none`: None keeps the variable's value (else unsets it).
fn with_overrides(
    py: Python<'_>,
    mut inner: Settings,
    overrides: Option<&Bound<'_, PyDict>>,
    skip_none: bool,
) -> PyResult<Settings> {
    for (k, v) in overrides.into_iter().flat_map(|d| d.iter()) {
        let name: String = k.extract()?;
        let key = key_of(&name)
            .ok_or_else(|| type_error(py, format!("{name}= is not a pyddstore setting")))?;
        if skip_none && v.is_none() {
            continue;
        }
        let text = text_of(&name, &v)?;
        let text = if name == "method" && text.parse::<i64>().is_err() && !text.is_empty() {
            // A `pyddstore.Method` name (any case), as a store's method= takes it.
            crate::kinds::method_arg(&v)?.number().to_string()
        } else {
            text
        };
        inner = inner.with(key, &text, &name).py(py)?;
    }
    Ok(inner)
}

#[pymethods]
impl PySettings {
    /// The environment's settings, checked (DDStoreValueError naming the first
    /// bad variable), with `overrides` (setting names without `DDSTORE_`, lower
    /// case: `method=1`, `handshake_dir="/x"`; None leaves the variable's value)
    /// on top, each checked under its argument's name.
    ///
    /// Args:
    ///     **overrides (Any): settings by name, e.g. `timeout_s=5`, `method=1`.
    #[staticmethod]
    #[pyo3(signature = (**overrides))]
    fn from_env(py: Python<'_>, overrides: Option<&Bound<'_, PyDict>>) -> PyResult<PySettings> {
        let inner = Settings::from_env().py(py)?;
        Ok(PySettings {
            inner: with_overrides(py, inner, overrides, true)?,
        })
    }

    /// These settings with `overrides` on top (as `from_env`'s; None here unsets a setting).
    #[pyo3(signature = (**overrides))]
    fn replace(
        &self,
        py: Python<'_>,
        overrides: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<PySettings> {
        Ok(PySettings {
            inner: with_overrides(py, self.inner.clone(), overrides, false)?,
        })
    }

    fn __getattr__(&self, py: Python<'_>, name: &str) -> PyResult<Py<PyAny>> {
        let key = key_of(name).ok_or_else(|| {
            PyAttributeError::new_err(format!("Settings has no attribute {name:?}"))
        })?;
        to_py(py, self.inner.value(key).py(py)?)
    }

    /// Whether the setting `name` (e.g. "fabric") was given, by its variable or an argument.
    ///
    /// Args:
    ///     name (str): a setting's name: its variable without `DDSTORE_`, lower case.
    fn is_set(&self, name: &str) -> bool {
        key_of(name).is_some_and(|k| self.inner.is_set(k))
    }

    /// Every setting by name (typed, defaults filled in).
    fn as_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for row in SETTINGS {
            let name = row.key.trim_start_matches("DDSTORE_").to_ascii_lowercase();
            d.set_item(name, to_py(py, self.inner.value(row.key).py(py)?)?)?;
        }
        Ok(d)
    }

    fn __dir__(&self) -> Vec<String> {
        SETTINGS
            .iter()
            .map(|s| s.key.trim_start_matches("DDSTORE_").to_ascii_lowercase())
            .collect()
    }

    fn __repr__(&self) -> String {
        let set: Vec<String> = self
            .inner
            .iter()
            // The job token is a secret: never in a repr (logs, tracebacks).
            .map(|(k, v)| match k {
                "DDSTORE_JOB_TOKEN" => format!("{k}=<set>"),
                _ => format!("{k}={v:?}"),
            })
            .collect();
        format!("Settings({})", set.join(", "))
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<PySettings>()
            .is_ok_and(|o| o.get().inner == self.inner)
    }

    /// Pickles as its checked values (spawned workers get the parent's settings).
    fn __reduce__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let pairs: Vec<(String, String)> = self
            .inner
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let cls = py.get_type::<PySettings>().getattr("_from_pairs")?;
        PyTuple::new(
            py,
            [
                cls,
                PyTuple::new(py, [pairs.into_pyobject(py)?])?.into_any(),
            ],
        )
    }

    /// Rebuilds pickled settings (checked again).
    #[staticmethod]
    fn _from_pairs(py: Python<'_>, pairs: Vec<(String, String)>) -> PyResult<PySettings> {
        let inner =
            Settings::from_lookup(|k| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
                .py(py)?;
        Ok(PySettings { inner })
    }
}
