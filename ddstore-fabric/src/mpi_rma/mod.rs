//! Method 0: MPI RMA windows over rsmpi's raw ffi.
//!
//! - `init`: MPI's lifetime and the lock that serialises our MPI calls
//!   when MPI provides less than `MPI_THREAD_MULTIPLE`.
//! - [`MpiComm`]: a private duplicate of an MPI communicator.
//! - [`MpiRma`]: the transport; shares live in MPI window memory.
//!
//! Contracts the store must keep for method 0:
//! - `expose` and dropping the last handle of an exposed share
//!   (`MPI_Win_free`) are collective: `free()` runs on every rank, in the
//!   same order of variables.
//! - A communicator spanning several nodes is first tested with a one-byte
//!   probe window whose outcome all ranks agree on: where no one-sided
//!   component can span the nodes (Open MPI over TCP at
//!   `MPI_THREAD_MULTIPLE`), every rank refuses with `Unavailable` before
//!   any share exists, instead of failing inside `MPI_Win_create`.
//! - Reads poll their `MPI_Rget`s until `Config::timeout` (or a signal):
//!   a read that gives up leaves its pending gets landing in a buffer the
//!   share keeps aside, so the memory it returned is never written later.
//!   Below `MPI_THREAD_MULTIPLE` (where osc/pt2pt, which opens a target's
//!   access at the first get, waiting inside `MPI_Rget`, may serve the
//!   window) `expose` ends with a 1-byte get of every rank and a barrier.
//! - Loaded bytes are written by plain stores into window memory; this
//!   relies on MPI's unified memory model (osc sm, rdma, ucx), and the store
//!   must pass a barrier between loading and reading.

mod comm;
mod init;
mod transport;
mod window;

pub use comm::MpiComm;
pub use init::{
    abort_world, ensure_initialized, ensure_initialized_at, finalize_if_ours, is_finalized,
    is_initialized, library_version, thread_level, ThreadLevel,
};
pub use transport::MpiRma;
