//! Operation contexts at fixed addresses, handed to libfabric with every
//! posted operation and mapped back to a slot when it completes.

use std::os::raw::c_void;
use std::ptr;

use libfabric_sys as sys;

/// Operation contexts at fixed addresses (FI_CONTEXT2: the provider may
/// use them until the operation completes or the endpoint closes).
pub struct Contexts {
    base: *mut sys::fi_context2,
    len: usize,
}

impl Contexts {
    pub fn new(len: usize) -> Contexts {
        let boxed: Box<[sys::fi_context2]> =
            (0..len).map(|_| sys::fi_context2::default()).collect();
        Contexts {
            base: Box::into_raw(boxed) as *mut sys::fi_context2,
            len,
        }
    }
    pub fn ptr(&self, slot: usize) -> *mut c_void {
        debug_assert!(slot < self.len);
        self.base.wrapping_add(slot) as *mut c_void
    }
    pub fn slot_of(&self, ctx: *mut c_void) -> Option<usize> {
        let offset = (ctx as usize).checked_sub(self.base as usize)?;
        let size = std::mem::size_of::<sys::fi_context2>();
        (offset % size == 0 && offset / size < self.len).then_some(offset / size)
    }
    /// After a failure the provider may still hold pointers into them.
    pub fn abandon(self) {
        std::mem::forget(self);
    }
}

impl Drop for Contexts {
    fn drop(&mut self) {
        // SAFETY: base/len come from Box::into_raw of a boxed slice of len
        // elements; no operation is in flight once a reader drops normally.
        drop(unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(self.base, self.len)) });
    }
}

// SAFETY: the contexts are plain memory owned by the reader; the provider
// only uses them during calls made by the reader's current thread.
unsafe impl Send for Contexts {}
