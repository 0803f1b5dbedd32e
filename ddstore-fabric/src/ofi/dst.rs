//! Destination ranges a caller registered once (`register_dst`): each
//! reader endpoint registers a range with libfabric the first time it
//! reads into it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::error::{FabricError, FabricResult};

/// Destination ranges registered once through `register_dst`; each reader
/// registers a range with its own endpoint the first time it reads into it.
#[derive(Default)]
pub struct DstRegistry {
    ranges: Mutex<Vec<DstRange>>,
}

/// Range ids are unique across registries: pooled endpoints keep the
/// registrations of every variable's ranges side by side.
static NEXT_RANGE_ID: AtomicU64 = AtomicU64::new(0);

/// One registered range, with an id unique in the process.
#[derive(Clone, Copy)]
pub(crate) struct DstRange {
    pub(crate) id: u64,
    pub(crate) addr: usize,
    pub(crate) len: usize,
}

impl DstRegistry {
    /// Registers `len` bytes at `addr` as a read destination.
    pub fn register(&self, addr: usize, len: usize) -> FabricResult<()> {
        if len == 0 || addr.checked_add(len).is_none() {
            return Err(FabricError::Invalid(format!(
                "cannot register {len} bytes at {addr:#x}"
            )));
        }
        let id = NEXT_RANGE_ID.fetch_add(1, Ordering::Relaxed);
        self.ranges
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(DstRange { id, addr, len });
        Ok(())
    }

    /// Forgets a range registered before.
    pub fn unregister(&self, addr: usize, len: usize) -> FabricResult<()> {
        let mut ranges = self.ranges.lock().unwrap_or_else(|p| p.into_inner());
        match ranges.iter().position(|r| r.addr == addr && r.len == len) {
            Some(i) => {
                ranges.swap_remove(i);
                Ok(())
            }
            None => Err(FabricError::Invalid(format!(
                "no destination of {len} bytes at {addr:#x} was registered"
            ))),
        }
    }

    pub(crate) fn snapshot(&self) -> Vec<DstRange> {
        self.ranges
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}
