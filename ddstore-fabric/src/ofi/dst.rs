//! Destination ranges a caller registered once (`register_dst`). Reads no
//! longer need them: one-sided reads land in their endpoint's landing,
//! registered once (`window::Landing`), never in the caller's memory; the
//! ranges are still checked, so an unregister matches a register.

use std::sync::Mutex;

use crate::error::{FabricError, FabricResult};

/// Destination ranges registered once through `register_dst`.
#[derive(Default)]
pub struct DstRegistry {
    ranges: Mutex<Vec<DstRange>>,
}

/// One registered range.
struct DstRange {
    addr: usize,
    len: usize,
}

impl DstRegistry {
    /// Registers `len` bytes at `addr` as a read destination.
    pub fn register(&self, addr: usize, len: usize) -> FabricResult<()> {
        if len == 0 || addr.checked_add(len).is_none() {
            return Err(FabricError::Invalid(format!(
                "cannot register {len} bytes at {addr:#x}"
            )));
        }
        self.ranges
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(DstRange { addr, len });
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
}
