//! Python signals during native waits: the check `ddstore_core::interrupt`
//! runs (about every 100 ms while a call waits with the GIL released). On
//! the main thread, the only one Python runs signal handlers on, it takes
//! the GIL and runs the pending handlers; what one raised (Ctrl-C's
//! `KeyboardInterrupt`) stops the wait and is raised when the call returns.

use std::cell::RefCell;
use std::sync::OnceLock;
use std::thread::ThreadId;

use pyo3::prelude::*;

/// The thread that imported the module, when it is Python's main thread.
static MAIN: OnceLock<ThreadId> = OnceLock::new();

thread_local! {
    /// What a signal handler raised during this thread's wait.
    static RAISED: RefCell<Option<PyErr>> = const { RefCell::new(None) };
}

/// Installs the check (at import).
pub fn install(py: Python<'_>) -> PyResult<()> {
    let threading = py.import("threading")?;
    let main = threading.call_method0("main_thread")?;
    if threading.call_method0("current_thread")?.is(&main) {
        let _ = MAIN.set(std::thread::current().id());
    }
    ddstore_core::interrupt::install(signal_pending);
    Ok(())
}

fn signal_pending() -> bool {
    // Other threads never run handlers: spare them the GIL.
    if MAIN.get() != Some(&std::thread::current().id()) {
        return false;
    }
    Python::attach(|py| match py.check_signals() {
        Ok(()) => false,
        Err(raised) => {
            RAISED.with(|r| *r.borrow_mut() = Some(raised));
            true
        }
    })
}

/// What to raise instead of `err` when a signal handler raised during this
/// thread's wait (the handler's exception wins over what the wait then met);
/// clears the interruption.
pub fn take_raised(err: &ddstore_core::Error) -> Option<PyErr> {
    let fired = ddstore_core::interrupt::take();
    if let Some(raised) = RAISED.with(|r| r.borrow_mut().take()) {
        return Some(raised);
    }
    (fired || matches!(err, ddstore_core::Error::Interrupted))
        .then(|| pyo3::exceptions::PyKeyboardInterrupt::new_err("interrupted by a signal"))
}
