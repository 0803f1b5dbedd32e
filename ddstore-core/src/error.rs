//! The one error type of ddstore-core; every crate above converts into it
//! and the Python binding maps each variant to one exception class.

use std::time::Duration;

/// The result of every fallible call of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every failure of the store, one variant per Python exception class.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A bad argument value (maps to `ValueError`).
    #[error("{0}")]
    InvalidArgument(String),
    /// A row or sample index outside the valid range (maps to `IndexError`).
    #[error("{0}")]
    IndexOutOfRange(String),
    /// A buffer of the wrong dtype or kind (maps to `TypeError`).
    #[error("{0}")]
    WrongType(String),
    /// A variable name that is not in the store (maps to `KeyError`).
    #[error("unknown variable '{0}': call add() or init() on every rank first")]
    UnknownVariable(String),
    /// `add`/`init` of a name that already exists.
    #[error("variable '{0}' already exists: use update() to change its rows, or a new name")]
    AlreadyExists(String),
    /// Any call after `free()`.
    #[error("the store was freed; create a new PyDDStore to read again")]
    Freed,
    /// A peer did not answer in time.
    #[error("{}", timeout_message(*peer, *waited, what))]
    Timeout {
        /// The rank that did not answer.
        peer: usize,
        /// How long the caller waited (zero: known unreachable at once).
        waited: Duration,
        /// What was waited for.
        what: String,
    },
    /// Collective or handshake failures.
    #[error("communicator: {0}")]
    Comm(String),
    /// Transport failures (libfabric, MPI) with the failing call named.
    #[error("transport: {0}")]
    Transport(String),
    /// Refused for safety: an untrusted directory or file, a wrong token, a name
    /// another live job holds (maps to `DDStoreAccessError`).
    #[error("{0}")]
    Access(String),
    /// The operation is not possible in this configuration.
    #[error("{0}")]
    Unsupported(String),
    /// An operating-system call failed (files, shared memory).
    #[error("{context}: {source}")]
    Io {
        /// What was being done, e.g. the path opened.
        context: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
}

fn timeout_message(peer: usize, waited: Duration, what: &str) -> String {
    if waited.is_zero() {
        format!("rank {peer} is unreachable: {what}")
    } else {
        format!("timed out after {waited:.1?} waiting for rank {peer}: {what}")
    }
}

impl Error {
    /// An [`Error::InvalidArgument`] with this message.
    pub fn invalid(msg: impl Into<String>) -> Self {
        Error::InvalidArgument(msg.into())
    }
    /// An [`Error::Io`] saying what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}
