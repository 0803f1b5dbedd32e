//! Which transport serves which method, and MPI set-up.

use std::sync::Arc;

use ddstore_core::node_only::NodeOnlyTransport;
use ddstore_core::transport::Transport;
use ddstore_core::{Comm, Config, Error, Result};
use ddstore_fabric::mpi_rma::{self, MpiComm, MpiRma};

/// An MPI communicator from mpi4py's `py2f()` handle, or MPI_COMM_WORLD
/// (initialising MPI here when no one has; `finalize_mpi` undoes that).
pub fn mpi_comm(fortran_handle: Option<i64>) -> Result<Arc<dyn Comm>> {
    let comm = match fortran_handle {
        Some(h) => MpiComm::from_fortran(h)?,
        None => MpiComm::world()?,
    };
    Ok(Arc::new(comm))
}

pub fn finalize_mpi() -> Result<()> {
    Ok(mpi_rma::finalize_if_ours()?)
}

/// The transport for `method`; `comm` is the store's group.
pub fn transport_for(
    method: u8,
    comm: &Arc<dyn Comm>,
    _config: &Config,
    _nic_map: Option<&str>,
) -> Result<Arc<dyn Transport>> {
    match (method, comm.kind()) {
        // One process has no peer to reach: its reads are memory copies.
        (0, "single") => Ok(Arc::new(NodeOnlyTransport)),
        (0, _) => Ok(Arc::new(MpiRma::new())),
        (1 | 2, _) => Ok(Arc::new(NodeOnlyTransport)),
        (m, _) => Err(Error::invalid(format!(
            "method={m} is not valid: expected 0 (MPI RMA), 1 or 2 (libfabric)"
        ))),
    }
}

/// Methods this build can serve, for `pyddstore info` and test skips.
pub const METHODS: [u8; 3] = [0, 1, 2];
