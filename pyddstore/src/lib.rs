//! `pyddstore._native`: the PyO3 binding. The public Python API is the
//! pure-Python package around it (python/pyddstore).

#![warn(missing_docs)]
// Every `unsafe` block says why it is sound, and an `unsafe fn` body gets no
// implicit unsafe block: each unsafe operation in it has a block and a reason
// (`[workspace.lints]` in the top-level Cargo.toml, for every crate).

use pyo3::prelude::*;

mod buffer;
mod comm;
mod errors;
mod handshake;
mod kinds;
mod launcher;
mod methods;
mod settings;
mod signals;
mod store;

/// Finalises MPI if this module initialised it (registered with atexit).
#[pyfunction]
fn finalize_mpi(py: Python<'_>) -> PyResult<()> {
    use errors::IntoPyResult;
    methods::finalize_mpi().py(py)
}

/// Ends every process of the MPI job with `code` (`MPI_Abort`), where MPI
/// is initialised; returns otherwise (`DDSTORE_ABORT_ON_EXCEPTION`).
#[pyfunction]
fn abort_mpi(py: Python<'_>, code: i32) {
    py.detach(|| methods::abort_mpi(code))
}

/// What this machine offers: libfabric version and providers usable for
/// one-sided reads, and the MPI library (for `python -m pyddstore info`).
#[pyfunction]
fn system_info(py: Python<'_>) -> PyResult<Bound<'_, pyo3::types::PyDict>> {
    use pyo3::types::PyDict;
    let d = PyDict::new(py);
    d.set_item(
        "libfabric_version",
        ddstore_fabric::ofi::libfabric_version(),
    )?;
    d.set_item("mpi_library", methods::mpi_library_version())?;
    let providers = pyo3::types::PyList::empty(py);
    for p in ddstore_fabric::ofi::usable_providers() {
        let e = PyDict::new(py);
        let gather = ddstore_fabric::ofi::gather_by_default(&p.provider);
        e.set_item("provider", p.provider)?;
        e.set_item("fabric", p.fabric)?;
        e.set_item("domain", p.domain)?;
        e.set_item("mr_mode", p.mr_mode_names)?;
        e.set_item(
            "progress",
            if p.manual_progress { "manual" } else { "auto" },
        )?;
        e.set_item("max_msg_size", p.max_msg_size)?;
        e.set_item("gather_by_default", gather)?;
        providers.append(e)?;
    }
    d.set_item("providers", providers)?;
    Ok(d)
}

/// The libfabric providers a `DDSTORE_FABRIC` value makes pyddstore try, in order
/// (None: the default list); a value that cannot be a provider name raises.
#[pyfunction]
#[pyo3(signature = (value=None))]
fn provider_candidates(py: Python<'_>, value: Option<&str>) -> PyResult<Vec<String>> {
    use errors::IntoPyResult;
    ddstore_fabric::ofi::provider_candidates(value)
        .map_err(ddstore_core::Error::from)
        .py(py)
}

/// The checked value of one `DDSTORE_*` setting (flags as "0"/"1"), None when
/// unset; a bad value raises DDStoreValueError naming the variable. For the
/// import-time settings only (logging); everything else reads `Settings`.
#[pyfunction]
fn setting(py: Python<'_>, key: &str) -> PyResult<Option<String>> {
    use errors::IntoPyResult;
    ddstore_core::config::setting(&|k| std::env::var(k).ok(), key).py(py)
}

/// The libfabric variables this module defaulted when it was imported:
/// `{"variables": {name: (value, set_by_pyddstore)}, "why": {name: reason},
/// "started_after_defaults": True/False, or None while libfabric has not
/// started in this process}`.
#[pyfunction]
fn libfabric_env(py: Python<'_>) -> PyResult<Bound<'_, pyo3::types::PyDict>> {
    use pyo3::types::PyDict;
    let applied = ddstore_fabric::ofi::apply_libfabric_defaults();
    let vars = PyDict::new(py);
    let why = PyDict::new(py);
    for (name, value, ours) in &applied.variables {
        vars.set_item(*name, (value.as_str(), *ours))?;
        why.set_item(*name, ddstore_fabric::ofi::reason(name))?;
    }
    let d = PyDict::new(py);
    d.set_item("variables", vars)?;
    d.set_item("why", why)?;
    d.set_item(
        "started_after_defaults",
        ddstore_fabric::ofi::started_after_defaults(),
    )?;
    Ok(d)
}

/// The signals whose handler a PSM library installed (the package puts
/// Python's back on them; see `ddstore_fabric::ofi::PROVIDER_SIGNAL_VARIABLES`).
#[pyfunction]
fn provider_signal_handlers() -> Vec<i32> {
    ddstore_fabric::ofi::provider_signal_handlers()
}

/// The PSM variables the package set before loading this module
/// (`pyddstore._set_before_load`; empty when imported some other way).
fn set_before_load(py: Python<'_>) -> Vec<String> {
    py.import("pyddstore")
        .and_then(|package| package.getattr("_set_before_load"))
        .and_then(|names| names.extract())
        .unwrap_or_default()
}

/// Whether process `pid` exists on this machine (the one check, ddstore_core's).
#[pyfunction]
fn pid_alive(pid: u32) -> bool {
    ddstore_core::region::process_alive(pid)
}

/// The soft descriptor limit the first store raised (`(before, after, hard)`),
/// None before any store or where the limits could not be read or set.
#[pyfunction]
fn fd_limit_raised() -> Option<(u64, u64, u64)> {
    ddstore_core::fd_limit::raise_soft_limit().map(|r| (r.before, r.after, r.hard))
}

/// The block-aligned file span `(start, end)` an `O_DIRECT` read of `len`
/// bytes at `offset` covers (`ddstore_core::direct_io::span`, the one rule).
#[pyfunction]
fn direct_span(offset: u64, len: u64) -> (u64, u64) {
    ddstore_core::direct_io::span(offset, len)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // Before anything can start libfabric or a pyddstore thread: the one
    // place the libfabric variables pyddstore defaults are set (the PSM
    // ones the package had to set before loading libfabric count as ours).
    ddstore_fabric::ofi::apply_libfabric_defaults_after(&set_before_load(m.py()));
    // Exception classes next: a missing one fails this import.
    errors::bind(m.py())?;
    signals::install(m.py())?;
    m.add_class::<settings::PySettings>()?;
    launcher::register(m)?;
    m.add_class::<store::PyDeviceShare>()?;
    m.add_class::<comm::PyComm>()?;
    m.add_class::<store::PyStore>()?;
    m.add_class::<handshake::PyHandshakeDir>()?;
    m.add_class::<handshake::PyNameLock>()?;
    m.add_function(wrap_pyfunction!(finalize_mpi, m)?)?;
    m.add_function(wrap_pyfunction!(abort_mpi, m)?)?;
    m.add_function(wrap_pyfunction!(setting, m)?)?;
    m.add_function(wrap_pyfunction!(libfabric_env, m)?)?;
    m.add_function(wrap_pyfunction!(pid_alive, m)?)?;
    m.add(
        "PACKED_SHARE_BYTES",
        ddstore_fabric::ofi::PACKED_SHARE_BYTES,
    )?;
    m.add_function(wrap_pyfunction!(handshake::split_share_records, m)?)?;
    m.add_function(wrap_pyfunction!(handshake::join_share_records, m)?)?;
    m.add("PACKED_LOCATOR_BYTES", handshake::PACKED_LOCATOR_BYTES)?;
    m.add_function(wrap_pyfunction!(handshake::pack_node_records, m)?)?;
    m.add_function(wrap_pyfunction!(handshake::unpack_node_records, m)?)?;
    m.add_function(wrap_pyfunction!(provider_signal_handlers, m)?)?;
    m.add(
        "PROVIDER_SIGNAL_VARIABLES",
        ddstore_fabric::ofi::PROVIDER_SIGNAL_VARIABLES.to_vec(),
    )?;
    m.add_function(wrap_pyfunction!(fd_limit_raised, m)?)?;
    m.add_function(wrap_pyfunction!(direct_span, m)?)?;
    m.add_function(wrap_pyfunction!(system_info, m)?)?;
    m.add_function(wrap_pyfunction!(provider_candidates, m)?)?;
    m.add_function(wrap_pyfunction!(errors::file_error, m)?)?;
    // A list of ints (a Vec<u8> would become bytes).
    let methods: Vec<u32> = methods::METHODS
        .iter()
        .map(|&m| u32::from(m.number()))
        .collect();
    m.add("METHODS", methods)?;
    m.add("HAS_MPI", cfg!(feature = "mpi"))?;
    kinds::add_to(m)?;
    // The element dtypes a variable can hold: the one table (ddstore_core::dtype), for Python.
    let dtypes: Vec<&str> = ddstore_core::DType::ALL
        .iter()
        .filter(|d| **d != ddstore_core::DType::Bytes)
        .map(|d| d.name())
        .collect();
    m.add("DTYPES", dtypes)?;
    // What O_DIRECT reads align to (ddstore_core::direct_io), for Python's aligned reader.
    m.add("DIRECT_ALIGN", ddstore_core::direct_io::ALIGN)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
