//! Which transport serves which method, and MPI set-up.

use std::sync::Arc;

use ddstore_core::config::Settings;
#[cfg(feature = "mpi")]
use ddstore_core::kinds::CommKind;
use ddstore_core::kinds::Method;
#[cfg(feature = "mpi")]
use ddstore_core::node_only::NodeOnlyTransport;
use ddstore_core::transport::Transport;
#[cfg(not(feature = "mpi"))]
use ddstore_core::Error;
use ddstore_core::{Comm, Config, Result};
#[cfg(feature = "mpi")]
use ddstore_fabric::mpi_rma::{self, MpiComm, MpiRma};
use ddstore_fabric::ofi::OfiTransport;

/// What a build without the `mpi` feature says when asked for MPI.
#[cfg(not(feature = "mpi"))]
const NO_MPI: &str =
    "this pyddstore was built without MPI (cargo feature `mpi` off): method=0 and \
MPI communicators are not available; use method=1 or 2 with a torch.distributed group \
or a pyddstore.FileComm (comm=None with DDSTORE_HANDSHAKE_DIR), or rebuild with MPI";

/// An MPI communicator from mpi4py's `py2f()` handle, or MPI_COMM_WORLD
/// (initialising MPI here when no one has; `finalize_mpi` undoes that).
#[cfg(feature = "mpi")]
pub fn mpi_comm(fortran_handle: Option<i64>, settings: &Settings) -> Result<Arc<dyn Comm>> {
    let comm = match fortran_handle {
        Some(h) => MpiComm::from_fortran(h)?,
        None => MpiComm::world_at(settings.raw("DDSTORE_MPI_THREAD_LEVEL"))?,
    };
    Ok(Arc::new(
        comm.with_timeout(settings.config().handshake_timeout),
    ))
}

/// Without MPI in this build: a clear error (method 0 needs it).
#[cfg(not(feature = "mpi"))]
pub fn mpi_comm(_fortran_handle: Option<i64>, _settings: &Settings) -> Result<Arc<dyn Comm>> {
    Err(Error::Unsupported(NO_MPI.to_string()))
}

#[cfg(feature = "mpi")]
pub fn finalize_mpi() -> Result<()> {
    Ok(mpi_rma::finalize_if_ours()?)
}

/// Ends the whole MPI job (`MPI_Abort`), where MPI is initialised.
#[cfg(feature = "mpi")]
pub fn abort_mpi(code: i32) {
    mpi_rma::abort_world(code)
}

/// No MPI job to end in a build without MPI.
#[cfg(not(feature = "mpi"))]
pub fn abort_mpi(_code: i32) {}

/// Nothing to finalise in a build without MPI.
#[cfg(not(feature = "mpi"))]
pub fn finalize_mpi() -> Result<()> {
    Ok(())
}

/// The MPI library's version string, or "" (no MPI in this build).
pub fn mpi_library_version() -> String {
    #[cfg(feature = "mpi")]
    return mpi_rma::library_version().trim().to_string();
    #[cfg(not(feature = "mpi"))]
    String::new()
}

/// The transport for `method`; `comm` is the store's group.
pub fn transport_for(
    method: Method,
    comm: &Arc<dyn Comm>,
    config: &Config,
    nic_map: Option<&str>,
) -> Result<Arc<dyn Transport>> {
    match (method, comm.kind()) {
        // Method 0 is not in a build without MPI, even for one process.
        #[cfg(not(feature = "mpi"))]
        (Method::MpiRma, _) => Err(Error::Unsupported(NO_MPI.to_string())),
        // One process has no peer to reach: its reads are memory copies.
        #[cfg(feature = "mpi")]
        (Method::MpiRma, CommKind::Single) => Ok(Arc::new(NodeOnlyTransport)),
        #[cfg(feature = "mpi")]
        (Method::MpiRma, _) => Ok(Arc::new(MpiRma::with_timeout(config.timeout))),
        (Method::Libfabric | Method::LibfabricExtraJobs, _) => Ok(Arc::new(
            OfiTransport::from_env(config, nic_map, ddstore_core::launcher::local_rank_env()?)?,
        )),
    }
}

/// Methods this build can serve, for `pyddstore info` and test skips.
#[cfg(feature = "mpi")]
pub const METHODS: &[Method] = &[
    Method::MpiRma,
    Method::Libfabric,
    Method::LibfabricExtraJobs,
];
/// Methods this build can serve: no method 0 without MPI.
#[cfg(not(feature = "mpi"))]
pub const METHODS: &[Method] = &[Method::Libfabric, Method::LibfabricExtraJobs];
