//! Transports behind `ddstore_core::transport::Transport`:
//! `mpi_rma` (method 0, feature `mpi`) and [`ofi`] (libfabric, methods 1 and 2).

#![warn(missing_docs)]

pub mod error;
#[cfg(feature = "mpi")]
pub mod mpi_rma;
pub mod ofi;

pub use error::FabricError;
