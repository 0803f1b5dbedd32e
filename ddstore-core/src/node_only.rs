//! A transport for jobs on one node: every share is a shared-memory file
//! that every rank maps, so all reads are memory copies. It needs no
//! libfabric or MPI and refuses peers on other nodes.

use std::sync::Arc;

use crate::comm::Comm;
use crate::region::{share_on_node, Region};
use crate::transport::{ExposeOptions, Exposed, RemoteShares, Transport, Unreachable};
use crate::{Error, Result};

/// The transport of a store with no MPI or libfabric: same-node shares only.
#[derive(Debug, Default)]
pub struct NodeOnlyTransport;

impl Transport for NodeOnlyTransport {
    fn name(&self) -> String {
        "node-shm".into()
    }

    fn expose(&self, comm: &Arc<dyn Comm>, len: usize, opts: &ExposeOptions) -> Result<Exposed> {
        let region = Region::shared(&opts.name, len)?;
        let shares = share_on_node(comm.as_ref(), &region)?;
        let node_peers = shares.views;
        let unreachable: Vec<usize> = (0..comm.size())
            .filter(|&r| r != comm.rank() && node_peers[r].is_none())
            .collect();
        if !unreachable.is_empty() {
            return Err(Error::Unsupported(format!(
                "ranks {unreachable:?} are not on this node: the node-only transport reads shared memory only; \
                 use method=1 (libfabric) or method=0 (MPI) across nodes"
            )));
        }
        Ok(Exposed {
            local: Arc::new(region),
            node_peers,
            remote: Arc::new(Unreachable),
            records: Vec::new(),
            node_locators: shares.locators,
        })
    }

    fn attach(&self, _records: &[Vec<u8>]) -> Result<Arc<dyn RemoteShares>> {
        Err(Error::Unsupported(
            "the node-only transport cannot be read from another job".into(),
        ))
    }
}
