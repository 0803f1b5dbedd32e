//! The one place where Rust errors become Python exceptions. The classes
//! live in `pyddstore/_errors.py` so they can also derive from the matching
//! builtin (ValueError, IndexError, ...). They are bound once, when `_native`
//! is imported ([`bind`]): a class missing there (renamed, removed) or not
//! derived from `DDStoreError` fails that import, never a later raise.
//!
//! Every exception carries `call` (the failing libfabric or MPI call, e.g.
//! `fi_read`, `MPI_Get`), `code` (its return code) and `peer` (the rank
//! involved): `None` where absent. File errors are `OSError`s: their class
//! follows the `io::ErrorKind` ([`io_class`]), they carry `errno`, and Python
//! code reporting a file it cannot use builds them here too ([`file_error`]).

use std::io::ErrorKind;

use ddstore_core::error::RefusedFor;
use ddstore_core::Error;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

/// Every class `class_name` can name: bound and checked at import.
const CLASSES: [&str; 14] = [
    "DDStoreError",
    "DDStoreValueError",
    "DDStoreIndexError",
    "DDStoreTypeError",
    "DDStoreKeyError",
    "DDStoreBorrowError",
    "DDStoreFreedError",
    "DDStoreStaleError",
    "DDStoreTimeoutError",
    "DDStoreUnsupportedError",
    "DDStoreAccessError",
    "DDStoreFileError",
    "DDStoreFileNotFoundError",
    "DDStoreFilePermissionError",
];

/// The classes of [`CLASSES`], in that order.
static BOUND: PyOnceLock<Vec<Py<PyType>>> = PyOnceLock::new();

/// The Python class of each error: the same condition raises the same class
/// whichever transport (MPI, libfabric, memory copy) met it.
fn class_name(err: &Error) -> &'static str {
    match err {
        Error::InvalidArgument(_) | Error::AlreadyExists(_) => "DDStoreValueError",
        Error::IndexOutOfRange(_) => "DDStoreIndexError",
        Error::WrongType(_) => "DDStoreTypeError",
        Error::UnknownVariable { .. } => "DDStoreKeyError",
        Error::Borrowed(_) => "DDStoreBorrowError",
        Error::Freed => "DDStoreFreedError",
        Error::Stale { .. } => "DDStoreStaleError",
        Error::Timeout { .. } | Error::Stalled { .. } => "DDStoreTimeoutError",
        Error::Unsupported(_) => "DDStoreUnsupportedError",
        Error::Access(_)
        | Error::Refused {
            reason: RefusedFor::Key,
            ..
        } => "DDStoreAccessError",
        Error::Refused {
            reason: RefusedFor::Range,
            ..
        } => "DDStoreIndexError",
        Error::Comm(_)
        | Error::Transport(_)
        | Error::Call { .. }
        | Error::Refused {
            reason: RefusedFor::Other,
            ..
        } => "DDStoreError",
        Error::File(_) => "DDStoreFileError",
        Error::Io { source, .. } => io_class(source.kind()),
        // Raised as what the signal handler raised (see `to_py`).
        Error::Interrupted => "DDStoreError",
    }
}

/// The class of a failed file operation: the `FileNotFoundError` and
/// `PermissionError` kinds have a subclass each, like Python's own `OSError`s.
fn io_class(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::NotFound => "DDStoreFileNotFoundError",
        ErrorKind::PermissionDenied => "DDStoreFilePermissionError",
        _ => "DDStoreFileError",
    }
}

/// Imports `pyddstore._errors` and binds every class once (called by the
/// module's init): a missing class, or one not derived from `DDStoreError`,
/// fails the import of `pyddstore._native`.
pub fn bind(py: Python<'_>) -> PyResult<()> {
    let module = py.import("pyddstore._errors")?;
    let mut classes = Vec::with_capacity(CLASSES.len());
    for name in CLASSES {
        let cls = module.getattr(name)?.cast_into::<PyType>()?;
        classes.push(cls.unbind());
    }
    let root = classes[0].bind(py);
    for (name, cls) in CLASSES.iter().zip(&classes) {
        if !cls.bind(py).is_subclass(root)? {
            return Err(pyo3::exceptions::PyImportError::new_err(format!(
                "pyddstore._errors.{name} does not derive from DDStoreError"
            )));
        }
    }
    let _ = BOUND.set(py, classes);
    Ok(())
}

fn class_of<'py>(py: Python<'py>, name: &str) -> Option<Bound<'py, PyType>> {
    let at = CLASSES.iter().position(|&c| c == name)?;
    BOUND.get(py).map(|all| all[at].bind(py).clone())
}

/// The attributes every exception carries (`None` where absent).
#[derive(Default)]
struct Details {
    call: Option<&'static str>,
    code: Option<i64>,
    peer: Option<usize>,
    errno: Option<i32>,
}

/// An exception of class `name` with `msg` and `details`.
fn build(py: Python<'_>, name: &str, msg: String, details: Details) -> PyErr {
    let Some(cls) = class_of(py, name) else {
        // Only before `bind` ran (it runs in the module's init).
        return pyo3::exceptions::PyRuntimeError::new_err(msg);
    };
    let built = cls.call1((msg,)).and_then(|exc| {
        exc.setattr("call", details.call)?;
        exc.setattr("code", details.code)?;
        exc.setattr("peer", details.peer)?;
        if let Some(errno) = details.errno {
            exc.setattr("errno", errno)?;
        }
        Ok(exc)
    });
    match built {
        Ok(exc) => PyErr::from_value(exc),
        Err(e) => e,
    }
}

/// Builds the Python exception for `err`, with its `call`, `code` and `peer`
/// (and `errno` for a failed file operation).
pub fn to_py(py: Python<'_>, err: Error) -> PyErr {
    // A signal's handler interrupted the wait: raise what it raised (KeyboardInterrupt).
    if let Some(raised) = crate::signals::take_raised(&err) {
        return raised;
    }
    let details = Details {
        call: err.call(),
        code: err.code(),
        peer: err.peer(),
        errno: match &err {
            Error::Io { source, .. } => source.raw_os_error(),
            _ => None,
        },
    };
    build(py, class_name(&err), err.to_string(), details)
}

/// The exception Python code raises for a file it cannot use: a
/// `DDStoreFileError` with `message`, of the subclass `errno` calls for
/// (ENOENT: `DDStoreFileNotFoundError`, EACCES or EPERM:
/// `DDStoreFilePermissionError`), the same mapping as a failing file
/// operation in Rust. Returned, not raised: `raise _native.file_error(...)`.
#[pyfunction]
#[pyo3(signature = (message, errno=None))]
pub fn file_error(py: Python<'_>, message: String, errno: Option<i32>) -> Py<PyAny> {
    let name = errno.map_or("DDStoreFileError", |n| {
        io_class(std::io::Error::from_raw_os_error(n).kind())
    });
    let details = Details {
        errno,
        ..Details::default()
    };
    build(py, name, message, details).into_value(py).into_any()
}

/// `?`-friendly conversion: `result.map_err(py_err)?` needs the GIL token,
/// so this trait lets call sites write `.py(py)?`.
pub trait IntoPyResult<T> {
    fn py(self, py: Python<'_>) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for Result<T, Error> {
    fn py(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|e| to_py(py, e))
    }
}

/// A bad argument detected in the binding itself.
pub fn value_error(py: Python<'_>, msg: String) -> PyErr {
    to_py(py, Error::InvalidArgument(msg))
}
pub fn type_error(py: Python<'_>, msg: String) -> PyErr {
    to_py(py, Error::WrongType(msg))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One error of every variant: adding a variant without a class fails
    /// to compile (`class_name` matches exhaustively) and this test lists it.
    fn every_variant() -> Vec<Error> {
        vec![
            Error::InvalidArgument("x".into()),
            Error::IndexOutOfRange("x".into()),
            Error::WrongType("x".into()),
            Error::unknown_variable("x", []),
            Error::AlreadyExists("x".into()),
            Error::Borrowed("x".into()),
            Error::Freed,
            Error::Timeout {
                peer: 1,
                waited: std::time::Duration::ZERO,
                what: "x".into(),
            },
            Error::Stalled {
                waited: std::time::Duration::from_secs(3),
                what: "x".into(),
            },
            Error::Comm("x".into()),
            Error::Transport("x".into()),
            Error::Call {
                call: "fi_read",
                code: -5,
                message: "x".into(),
                peer: Some(1),
            },
            Error::Refused {
                peer: 1,
                reason: RefusedFor::Key,
                call: Some("fi_read"),
                code: Some(-13),
                message: "x".into(),
            },
            Error::Refused {
                peer: 1,
                reason: RefusedFor::Range,
                call: None,
                code: None,
                message: "x".into(),
            },
            Error::Refused {
                peer: 1,
                reason: RefusedFor::Other,
                call: None,
                code: None,
                message: "x".into(),
            },
            Error::Stale {
                peer: 1,
                message: "x".into(),
            },
            Error::Access("x".into()),
            Error::Unsupported("x".into()),
            Error::io("x", std::io::Error::other("x")),
            Error::File("x".into()),
            Error::Interrupted,
        ]
    }

    #[test]
    fn every_variant_maps_to_a_class_defined_in_errors_py() {
        let source = include_str!("../python/pyddstore/_errors.py");
        for name in CLASSES {
            assert!(
                source.contains(&format!("\nclass {name}(")),
                "{name} is not defined in _errors.py"
            );
        }
        for err in every_variant() {
            let name = class_name(&err);
            assert!(CLASSES.contains(&name), "{err:?} maps to unbound {name}");
        }
    }

    #[test]
    fn a_condition_has_one_class_whatever_the_path() {
        let refused = |reason, call| Error::Refused {
            peer: 0,
            reason,
            call,
            code: None,
            message: "x".into(),
        };
        // A key the owner does not serve: gather refusal, or a one-sided read's FI_EACCES.
        assert_eq!(
            class_name(&refused(RefusedFor::Key, None)),
            "DDStoreAccessError"
        );
        assert_eq!(
            class_name(&refused(RefusedFor::Key, Some("fi_read"))),
            class_name(&Error::Access("x".into()))
        );
        // Outside a share: the owner's refusal and a local check agree.
        assert_eq!(
            class_name(&refused(RefusedFor::Range, None)),
            class_name(&Error::IndexOutOfRange("x".into()))
        );
    }

    #[test]
    fn file_errors_are_file_errors_by_kind_whichever_side_met_them() {
        let io = |kind| Error::io("x", std::io::Error::from(kind));
        assert_eq!(
            class_name(&io(ErrorKind::NotFound)),
            "DDStoreFileNotFoundError"
        );
        assert_eq!(
            class_name(&io(ErrorKind::PermissionDenied)),
            "DDStoreFilePermissionError"
        );
        assert_eq!(
            class_name(&io(ErrorKind::UnexpectedEof)),
            "DDStoreFileError"
        );
        assert_eq!(class_name(&Error::File("x".into())), "DDStoreFileError");
        // Python's errno goes through the same mapping.
        let by_errno = |n| io_class(std::io::Error::from_raw_os_error(n).kind());
        assert_eq!(by_errno(libc::ENOENT), "DDStoreFileNotFoundError");
        assert_eq!(by_errno(libc::EACCES), "DDStoreFilePermissionError");
        assert_eq!(by_errno(libc::EIO), "DDStoreFileError");
    }
}
