//! Transports behind `ddstore_core::transport::Transport`:
//! `mpi_rma` (method 0, feature `mpi`) and [`ofi`] (libfabric, methods 1 and 2).

#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod error;
#[cfg(feature = "mpi")]
pub mod mpi_rma;
pub mod ofi;

pub use error::FabricError;
