//! Method 0: MPI RMA windows over rsmpi's raw ffi.
//!
//! - [`init`]: MPI's lifetime and the lock that serialises our MPI calls
//!   when MPI provides less than `MPI_THREAD_MULTIPLE`.
//! - [`MpiComm`]: a private duplicate of an MPI communicator.
//! - [`MpiRma`]: the transport; shares live in MPI window memory.

mod comm;
mod init;
mod transport;
mod window;

pub use comm::MpiComm;
pub use init::{
    ensure_initialized, finalize_if_ours, is_finalized, is_initialized, library_version,
    thread_level, ThreadLevel,
};
pub use transport::MpiRma;
