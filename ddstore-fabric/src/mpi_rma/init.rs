//! MPI's lifetime (initialise once, finalise only what we initialised), the
//! process-wide lock that serialises our MPI calls below
//! `MPI_THREAD_MULTIPLE`, and MPI error codes turned into `FabricError`.

use std::os::raw::{c_char, c_int};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Mutex, MutexGuard};

use mpi::ffi;

use crate::error::{FabricError, FabricResult};

/// The thread support MPI provides (`MPI_Query_thread`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ThreadLevel {
    /// `MPI_THREAD_SINGLE`.
    Single,
    /// `MPI_THREAD_FUNNELED`.
    Funneled,
    /// `MPI_THREAD_SERIALIZED`.
    Serialized,
    /// `MPI_THREAD_MULTIPLE`.
    Multiple,
}

impl ThreadLevel {
    fn from_raw(level: c_int) -> ThreadLevel {
        // SAFETY: reading link-time constants exported by the MPI shim.
        let (funneled, serialized, multiple) = unsafe {
            (
                ffi::RSMPI_THREAD_FUNNELED,
                ffi::RSMPI_THREAD_SERIALIZED,
                ffi::RSMPI_THREAD_MULTIPLE,
            )
        };
        match level {
            l if l == multiple => ThreadLevel::Multiple,
            l if l == serialized => ThreadLevel::Serialized,
            l if l == funneled => ThreadLevel::Funneled,
            _ => ThreadLevel::Single,
        }
    }

    /// The lower-case name, as `DDSTORE_MPI_THREAD_LEVEL` spells it.
    pub fn name(self) -> &'static str {
        match self {
            ThreadLevel::Single => "single",
            ThreadLevel::Funneled => "funneled",
            ThreadLevel::Serialized => "serialized",
            ThreadLevel::Multiple => "multiple",
        }
    }
}

/// Set when this library called `MPI_Init_thread`.
static INITIALISED_BY_US: AtomicBool = AtomicBool::new(false);
/// Serialises every MPI call we make while the provided level is below MULTIPLE.
static MPI_LOCK: Mutex<()> = Mutex::new(());
/// Cached `MPI_Query_thread` result; -1 while unknown.
static PROVIDED_LEVEL: AtomicI32 = AtomicI32::new(-1);

/// Turns an MPI return code into a `FabricError::Mpi` naming the call.
pub(crate) fn check(call: &'static str, code: c_int) -> FabricResult<()> {
    if code == ffi::MPI_SUCCESS as c_int {
        return Ok(());
    }
    Err(FabricError::Mpi {
        call,
        code,
        message: error_string(code),
        peer: None,
    })
}

fn error_string(code: c_int) -> String {
    let mut buf = vec![0 as c_char; ffi::MPI_MAX_ERROR_STRING as usize + 1];
    let mut len: c_int = 0;
    // SAFETY: the buffer holds MPI_MAX_ERROR_STRING characters as required.
    let rc = unsafe { ffi::MPI_Error_string(code, buf.as_mut_ptr(), &mut len) };
    if rc != ffi::MPI_SUCCESS as c_int || len <= 0 {
        return format!("unknown MPI error {code}");
    }
    let bytes: Vec<u8> = buf[..len as usize].iter().map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Whether `MPI_Init`/`MPI_Init_thread` has been called (by anyone).
pub fn is_initialized() -> bool {
    let mut flag: c_int = 0;
    // SAFETY: MPI_Initialized may be called at any time, from any thread.
    unsafe { ffi::MPI_Initialized(&mut flag) };
    flag != 0
}

/// Whether `MPI_Finalize` has completed.
pub fn is_finalized() -> bool {
    let mut flag: c_int = 0;
    // SAFETY: MPI_Finalized may be called at any time, from any thread.
    unsafe { ffi::MPI_Finalized(&mut flag) };
    flag != 0
}

/// MPI is initialised and not yet finalised: handles may be used or freed.
pub(crate) fn is_usable() -> bool {
    is_initialized() && !is_finalized()
}

/// Initialises MPI asking for `MPI_THREAD_MULTIPLE` unless
/// someone already did (mpi4py, the user's code). Returns true when this library initialised
/// MPI (now or in an earlier call), that is when `finalize_if_ours` will
/// finalise it. Never initialises twice.
pub fn ensure_initialized() -> FabricResult<bool> {
    ensure_initialized_at(None)
}

/// As [`ensure_initialized`], asking for thread level `level` (single,
/// funneled, serialized, multiple; None: multiple) when this call initialises MPI.
/// The level comes from the caller's settings (`DDSTORE_MPI_THREAD_LEVEL`).
pub fn ensure_initialized_at(level: Option<&str>) -> FabricResult<bool> {
    let _guard = MPI_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    if is_finalized() {
        return Err(FabricError::Unavailable(
            "MPI was already finalised in this process; it cannot be initialised again".into(),
        ));
    }
    if !is_initialized() {
        let wanted = requested_level(level.unwrap_or(""))?;
        let mut provided: c_int = 0;
        // SAFETY: MPI is not initialised (checked under our lock); null argc/argv are allowed.
        let rc = unsafe {
            ffi::MPI_Init_thread(
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                wanted,
                &mut provided,
            )
        };
        check("MPI_Init_thread", rc)?;
        INITIALISED_BY_US.store(true, Ordering::SeqCst);
        PROVIDED_LEVEL.store(provided, Ordering::SeqCst);
    }
    Ok(INITIALISED_BY_US.load(Ordering::SeqCst))
}

fn requested_level(raw: &str) -> FabricResult<c_int> {
    // SAFETY: reading link-time constants exported by the MPI shim.
    let level = unsafe {
        match raw.trim().to_ascii_lowercase().as_str() {
            "" | "multiple" => ffi::RSMPI_THREAD_MULTIPLE,
            "serialized" => ffi::RSMPI_THREAD_SERIALIZED,
            "funneled" => ffi::RSMPI_THREAD_FUNNELED,
            "single" => ffi::RSMPI_THREAD_SINGLE,
            other => {
                return Err(FabricError::Invalid(format!(
                    "DDSTORE_MPI_THREAD_LEVEL={other:?} is not valid: expected single, funneled, serialized or multiple"
                )))
            }
        }
    };
    Ok(level)
}

/// Calls `MPI_Finalize` if this library initialised MPI and nobody finalised it yet.
pub fn finalize_if_ours() -> FabricResult<()> {
    let _guard = MPI_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    if INITIALISED_BY_US.load(Ordering::SeqCst) && is_usable() {
        // SAFETY: MPI is initialised by us and not finalised; no lock of ours is held elsewhere.
        let rc = unsafe { ffi::MPI_Finalize() };
        check("MPI_Finalize", rc)?;
    }
    Ok(())
}

/// Ends every process of the MPI job with `code` (`MPI_Abort` on
/// `MPI_COMM_WORLD`) when MPI is usable; otherwise returns.
pub fn abort_world(code: i32) {
    if is_usable() {
        // SAFETY: MPI is initialised and not finalised; MPI_Abort may be
        // called from any thread and does not return when it succeeds.
        unsafe { ffi::MPI_Abort(ffi::RSMPI_COMM_WORLD, code) };
    }
}

/// The thread level MPI provides; an error before `MPI_Init` or after `MPI_Finalize`.
pub fn thread_level() -> FabricResult<ThreadLevel> {
    provided_level().map(ThreadLevel::from_raw)
}

fn provided_level() -> FabricResult<c_int> {
    let cached = PROVIDED_LEVEL.load(Ordering::SeqCst);
    if cached >= 0 {
        return Ok(cached);
    }
    if !is_usable() {
        return Err(FabricError::Unavailable("MPI is not initialised".into()));
    }
    let mut provided: c_int = 0;
    // SAFETY: MPI is initialised; MPI_Query_thread only reads the provided level.
    check("MPI_Query_thread", unsafe {
        ffi::MPI_Query_thread(&mut provided)
    })?;
    PROVIDED_LEVEL.store(provided, Ordering::SeqCst);
    Ok(provided)
}

/// Takes the process-wide MPI lock unless MPI runs with `MPI_THREAD_MULTIPLE`.
/// Hold the returned guard across one MPI call (or one batch of calls);
/// never call another function that takes it while holding it.
pub(crate) fn serialize() -> Option<MutexGuard<'static, ()>> {
    // SAFETY: reading a link-time constant exported by the MPI shim.
    let multiple = unsafe { ffi::RSMPI_THREAD_MULTIPLE };
    match provided_level() {
        Ok(level) if level >= multiple => None,
        _ => Some(MPI_LOCK.lock().unwrap_or_else(|p| p.into_inner())),
    }
}

/// `MPI_Get_library_version`, e.g. "Open MPI v4.1.4, ...".
pub fn library_version() -> String {
    // SAFETY: reading a link-time constant exported by the MPI shim.
    let max = unsafe { ffi::RSMPI_MAX_LIBRARY_VERSION_STRING }.max(1) as usize;
    let mut buf = vec![0 as c_char; max + 1];
    let mut len: c_int = 0;
    // SAFETY: the buffer holds MPI_MAX_LIBRARY_VERSION_STRING characters; the
    // call is allowed before MPI_Init.
    let rc = unsafe { ffi::MPI_Get_library_version(buf.as_mut_ptr(), &mut len) };
    if rc != ffi::MPI_SUCCESS as c_int || len <= 0 {
        return "unknown MPI library".into();
    }
    let bytes: Vec<u8> = buf[..(len as usize).min(max)]
        .iter()
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes)
        .trim_end_matches(['\0', '\n', ' '])
        .to_string()
}
