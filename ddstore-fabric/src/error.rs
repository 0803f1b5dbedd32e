//! The one error enum of ddstore-fabric; it converts into `ddstore_core::Error`
//! so the Python binding maps every failure in one place.

use std::time::Duration;

/// Every failure of a transport; converted into `ddstore_core::Error`.
#[derive(Debug, thiserror::Error)]
pub enum FabricError {
    /// A libfabric call failed: the call, its return code and `fi_strerror`.
    #[error("{call} failed: {message} (code {code})")]
    Ofi {
        /// The libfabric function, e.g. `fi_read`.
        call: &'static str,
        /// Its return code (negative errno).
        code: i64,
        /// `fi_strerror` of the code.
        message: String,
    },
    /// An MPI call failed: the call, its error code and `MPI_Error_string`.
    #[error("{call} failed: {message} (MPI error {code})")]
    Mpi {
        /// The MPI function, e.g. `MPI_Win_flush`.
        call: &'static str,
        /// Its error code.
        code: i32,
        /// `MPI_Error_string` of the code.
        message: String,
    },
    /// A peer did not complete a read in time.
    #[error("read from rank {peer} did not complete within {waited:?}: {detail}")]
    Timeout {
        /// The rank read from.
        peer: usize,
        /// How long the reader waited.
        waited: Duration,
        /// What was outstanding.
        detail: String,
    },
    /// A peer refused a request of the gather path (unknown key, bad range).
    #[error("{detail}")]
    Refused {
        /// The owner that refused.
        peer: usize,
        /// Its reason.
        detail: String,
    },
    /// No provider or configuration matches what was asked for.
    #[error("{0}")]
    Unavailable(String),
    /// Bad descriptors, records or arguments handed to a transport.
    #[error("{0}")]
    Invalid(String),
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
            other => Error::Transport(other.to_string()),
        }
    }
}

/// The result of every fallible call of this crate.
pub type FabricResult<T> = Result<T, FabricError>;
