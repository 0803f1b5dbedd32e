//! The one error enum of ddstore-fabric; it converts into `ddstore_core::Error`
//! so the Python binding maps every failure in one place.

use std::time::Duration;

pub use ddstore_core::error::RefusedFor;

/// Every failure of a transport. Converted into `ddstore_core::Error`
/// keeping the call, its code and the peer (see `From` below).
#[derive(Debug, thiserror::Error)]
pub enum FabricError {
    /// A libfabric call failed: the call, its return code, `fi_strerror`,
    /// and the peer rank the call was for, where there is one.
    #[error("{call} failed: {message} (code {code})")]
    Ofi {
        /// The libfabric call, e.g. `fi_read`, `fi_cq_readerr`.
        call: &'static str,
        /// Its (negative) return code.
        code: i64,
        /// `fi_strerror`, with context.
        message: String,
        /// The rank the call was for, where there is one.
        peer: Option<usize>,
    },
    /// An MPI call failed: the call, its error code, `MPI_Error_string`, and
    /// the target rank, where there is one.
    #[error("{call} failed: {message} (MPI error {code})")]
    Mpi {
        /// The MPI call, e.g. `MPI_Get`.
        call: &'static str,
        /// Its error code.
        code: i32,
        /// `MPI_Error_string`, with context.
        message: String,
        /// The target rank, where there is one.
        peer: Option<usize>,
    },
    /// A peer did not complete a read in time.
    #[error("read from rank {peer} did not complete within {waited:?}: {detail}")]
    Timeout {
        /// The rank that did not answer.
        peer: usize,
        /// How long it was waited for (zero: known gone without waiting).
        waited: Duration,
        /// What was waited for.
        detail: String,
    },
    /// A peer refused a read: a gather request (unknown key, bad range),
    /// or a one-sided read whose key it rejected (`call` and `code` then say
    /// which call came back refused).
    #[error("{detail}")]
    Refused {
        /// The rank that refused.
        peer: usize,
        /// What it refused.
        reason: RefusedFor,
        /// The call the refusal came back on (one-sided reads).
        call: Option<&'static str>,
        /// That call's return code.
        code: Option<i64>,
        /// What was refused and why.
        detail: String,
    },
    /// No provider or configuration matches what was asked for.
    #[error("{0}")]
    Unavailable(String),
    /// Bad descriptors, records or arguments handed to a transport.
    #[error("{0}")]
    Invalid(String),
    /// A read outside a rank's share or the destination (the same condition
    /// on every transport: `ddstore_core::Error::IndexOutOfRange`).
    #[error("{0}")]
    OutOfRange(String),
    /// A signal handler asked the wait to stop (`ddstore_core::interrupt`).
    #[error("interrupted by a signal")]
    Interrupted,
}

/// `Err(FabricError::Interrupted)` when a signal asked this thread's wait to
/// stop (`ddstore_core::interrupt::check`, for the fabric's wait loops).
pub fn check_interrupt() -> FabricResult<()> {
    ddstore_core::interrupt::check().map_err(|_| FabricError::Interrupted)
}

impl FabricError {
    /// The same error, naming `peer` as the rank the failed call was for
    /// (libfabric and MPI call failures; other kinds are returned unchanged).
    pub fn with_peer(mut self, rank: usize) -> FabricError {
        if let FabricError::Ofi { peer, .. } | FabricError::Mpi { peer, .. } = &mut self {
            *peer = Some(rank);
        }
        self
    }
}

impl From<FabricError> for ddstore_core::Error {
    fn from(e: FabricError) -> Self {
        use ddstore_core::Error;
        match e {
            FabricError::Timeout {
                peer,
                waited,
                detail,
            } => Error::Timeout {
                peer,
                waited,
                what: detail,
            },
            FabricError::Unavailable(m) => Error::Unsupported(m),
            FabricError::Invalid(m) => Error::InvalidArgument(m),
            FabricError::OutOfRange(m) => Error::IndexOutOfRange(m),
            FabricError::Interrupted => Error::Interrupted,
            FabricError::Refused {
                peer,
                reason,
                call,
                code,
                detail,
            } => Error::Refused {
                peer,
                reason,
                call,
                code,
                message: detail,
            },
            FabricError::Ofi {
                call,
                code,
                message,
                peer,
            } => Error::Call {
                call,
                code,
                message,
                peer,
            },
            FabricError::Mpi {
                call,
                code,
                message,
                peer,
            } => Error::Call {
                call,
                code: i64::from(code),
                message: format!("{message} (MPI error {code})"),
                peer,
            },
        }
    }
}

/// A result with a [`FabricError`].
pub type FabricResult<T> = Result<T, FabricError>;

/// Reports a close that failed where no caller can be told (a `Drop`): a
/// warning on stderr (this crate has no logger of its own), and in debug
/// builds a failed assertion, so that tests catch a teardown out of order.
pub(crate) fn report_failed_close(what: &str, closed: FabricResult<()>) {
    if let Err(e) = &closed {
        eprintln!("pyddstore: warning: a {what} could not be closed on drop (abandoned): {e}");
    }
    debug_assert!(
        closed.is_ok(),
        "closing a {what} on drop failed: {closed:?}"
    );
}

/// Closes every item with `close`, reporting the first failure (a failed
/// close does not stop the others).
pub(crate) fn close_all<T>(
    items: impl IntoIterator<Item = T>,
    mut close: impl FnMut(T) -> FabricResult<()>,
) -> FabricResult<()> {
    let mut first = Ok(());
    for item in items {
        first = first.and(close(item));
    }
    first
}

/// Closes `obj` with `close_now` (which takes its handle out, so that its drop
/// closes nothing again). A failed close abandons it: forgotten, never closed
/// again, and the parents it holds stay open with it.
pub(crate) fn close_owned<T>(
    mut obj: T,
    close_now: impl FnOnce(&mut T) -> FabricResult<()>,
) -> FabricResult<()> {
    let closed = close_now(&mut obj);
    if closed.is_err() {
        std::mem::forget(obj);
    }
    closed
}

/// Closes what `arc` holds with `close` when this is its last holder; else
/// its last holder's drop closes it.
pub(crate) fn close_last<T>(
    arc: std::sync::Arc<T>,
    close: impl FnOnce(T) -> FabricResult<()>,
) -> FabricResult<()> {
    std::sync::Arc::into_inner(arc).map_or(Ok(()), close)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ddstore_core::Error;

    #[test]
    fn call_code_and_peer_survive_the_conversion() {
        let e: Error = FabricError::Ofi {
            call: "fi_read",
            code: -110,
            message: "Connection timed out".into(),
            peer: None,
        }
        .with_peer(3)
        .into();
        assert_eq!(
            (e.call(), e.code(), e.peer()),
            (Some("fi_read"), Some(-110), Some(3))
        );
        assert!(e.to_string().contains("fi_read"), "{e}");
        let e: Error = FabricError::Mpi {
            call: "MPI_Get",
            code: 12,
            message: "bad rank".into(),
            peer: None,
        }
        .with_peer(1)
        .into();
        assert_eq!(
            (e.call(), e.code(), e.peer()),
            (Some("MPI_Get"), Some(12), Some(1))
        );
        let e: Error = FabricError::Timeout {
            peer: 2,
            waited: Duration::from_secs(1),
            detail: "x".into(),
        }
        .into();
        assert_eq!((e.call(), e.code(), e.peer()), (None, None, Some(2)));
        let e: Error = FabricError::OutOfRange("outside".into()).into();
        assert!(matches!(e, Error::IndexOutOfRange(_)));
    }
}
