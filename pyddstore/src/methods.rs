//! Which transport serves which method, and MPI set-up.

use std::sync::Arc;

use ddstore_core::node_only::NodeOnlyTransport;
use ddstore_core::transport::Transport;
use ddstore_core::{Comm, Config, Error, Result};

pub fn mpi_comm(_fortran_handle: Option<i64>) -> Result<Arc<dyn Comm>> {
    Err(Error::Unsupported("MPI support is not built yet".into()))
}

/// The transport for `method`; `comm` is the store's group.
pub fn transport_for(
    method: u8,
    _comm: &Arc<dyn Comm>,
    _config: &Config,
    _nic_map: Option<&str>,
) -> Result<Arc<dyn Transport>> {
    match method {
        0 => Err(Error::Unsupported("method 0 is not built yet".into())),
        1 | 2 => Ok(Arc::new(NodeOnlyTransport)),
        m => Err(Error::invalid(format!(
            "method={m} is not valid: expected 0 (MPI RMA), 1 or 2 (libfabric)"
        ))),
    }
}

/// Methods this build can serve, for `pyddstore info` and test skips.
pub const METHODS: [u8; 3] = [0, 1, 2];
