//! Borrowing the bytes of numpy arrays passed in by the caller: the one
//! place the binding turns a Python-owned buffer into a Rust slice.
//!
//! The aliasing rule: a Rust slice over an array exists only while a
//! checked borrow of its bytes is held ([`Borrowed`]): shared for sources
//! (`add`, `update`), exclusive for destinations (`get`, `get_batch`). The
//! borrow is taken with the GIL held and kept while the GIL is released for
//! the read, so a second call on the same memory (another thread passing the
//! same array, a view of it, or an overlapping slice) is refused with
//! `DDStoreBorrowError` naming the argument instead of aliasing a
//! `&mut [u8]`. A borrow is two checks: a claim on the address range in this
//! module's table (catches any two arrays over the same bytes, however they
//! were made: rust-numpy keys on the base object, and two `tensor.numpy()`
//! or `np.frombuffer` arrays have different ones), and rust-numpy's checked
//! borrow (`try_readwrite`/`try_readonly`), which other extensions built on
//! rust-numpy see too. Python code writing into an array while a call reads
//! into it is seen by neither: that is the caller's data race, as with any
//! numpy function that releases the GIL.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use ddstore_core::{DType, Error};
use numpy::npyffi;
use numpy::{
    BorrowError, Element, PyArray1, PyArrayDescrMethods, PyArrayDyn, PyArrayMethods,
    PyReadonlyArray, PyReadwriteArray, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::prelude::*;

use crate::errors::{to_py, type_error};

/// The dtype tag a numpy dtype is stored under; other dtypes are raw bytes.
pub fn dtype_of(arr: &Bound<'_, PyUntypedArray>) -> DType {
    let d = arr.dtype();
    DType::from_numpy(d.kind(), d.itemsize())
}

/// A new 1-D array of `len` elements of `dtype` (raw bytes: uint8), left
/// uninitialised: the caller fills every element before Python sees it.
pub fn alloc_uninit(py: Python<'_>, dtype: DType, len: usize) -> Bound<'_, PyAny> {
    // SAFETY: numpy allocates `len` elements of a plain-old-data type; every
    // caller overwrites them all (a read of the whole array) before returning it.
    unsafe {
        match dtype {
            DType::Bytes | DType::Uint8 => PyArray1::<u8>::new(py, len, false).into_any(),
            DType::Bool => PyArray1::<bool>::new(py, len, false).into_any(),
            DType::Int32 => PyArray1::<i32>::new(py, len, false).into_any(),
            DType::Int64 => PyArray1::<i64>::new(py, len, false).into_any(),
            DType::Float32 => PyArray1::<f32>::new(py, len, false).into_any(),
            DType::Float64 => PyArray1::<f64>::new(py, len, false).into_any(),
        }
    }
}

/// A C-contiguous numpy array, checked once.
pub struct Array<'py> {
    pub arr: Bound<'py, PyUntypedArray>,
}

impl<'py> Array<'py> {
    /// `arg` names the argument in messages, e.g. "get_batch(arr)".
    pub fn new(obj: &Bound<'py, PyAny>, arg: &str, writable: bool) -> PyResult<Array<'py>> {
        let py = obj.py();
        let arr = obj.cast::<PyUntypedArray>().map_err(|_| {
            type_error(
                py,
                format!(
                    "{arg} must be a numpy array, got {}; use tensor.numpy() for CPU tensors",
                    obj.get_type()
                        .name()
                        .map(|n| n.to_string())
                        .unwrap_or_default()
                ),
            )
        })?;
        // Object arrays hold PyObject pointers: stored or read elsewhere they
        // are dangling pointers, so any dtype holding references is refused.
        if arr.dtype().has_object() {
            return Err(type_error(
                py,
                format!(
                    "{arg} has dtype {} which holds Python object references: pyddstore stores plain \
                     data only (numeric, bool or fixed-size bytes dtypes)",
                    arr.dtype()
                ),
            ));
        }
        if !arr.is_c_contiguous() {
            return Err(type_error(
                py,
                format!("{arg} must be C-contiguous; pass np.ascontiguousarray(arr) or a fresh np.empty buffer"),
            ));
        }
        if writable && !Self::flag(arr, npyffi::NPY_ARRAY_WRITEABLE) {
            return Err(type_error(
                py,
                format!("{arg} is read-only; pass a writable array"),
            ));
        }
        Ok(Array { arr: arr.clone() })
    }

    fn flag(arr: &Bound<'_, PyUntypedArray>, flag: i32) -> bool {
        // SAFETY: the pointer comes from a live, type-checked numpy array.
        unsafe { (*arr.as_array_ptr()).fields.flags & flag != 0 }
    }

    pub fn nbytes(&self) -> usize {
        self.arr.shape().iter().product::<usize>() * self.arr.dtype().itemsize()
    }

    pub fn rows(&self) -> usize {
        if self.arr.ndim() == 0 {
            1
        } else {
            self.arr.shape()[0]
        }
    }

    pub fn itemsize(&self) -> usize {
        self.arr.dtype().itemsize()
    }

    pub fn dtype(&self) -> DType {
        dtype_of(&self.arr)
    }

    pub fn dtype_name(&self) -> String {
        self.arr.dtype().to_string()
    }

    pub fn addr(&self) -> usize {
        // SAFETY: reading the data pointer of a live numpy array.
        unsafe { (*self.arr.as_array_ptr()).fields.data as usize }
    }

    /// A shared borrow of the array's bytes (a source), held until the
    /// result is dropped. `arg` names the argument in the error.
    pub fn borrow(&self, arg: &str) -> PyResult<Borrowed<'py>> {
        self.checked(arg, false)
    }

    /// An exclusive borrow of the array's bytes (a destination; the array
    /// was checked writable in `new`), held until the result is dropped.
    pub fn borrow_mut(&self, arg: &str) -> PyResult<Borrowed<'py>> {
        self.checked(arg, true)
    }

    fn checked(&self, arg: &str, write: bool) -> PyResult<Borrowed<'py>> {
        let py = self.arr.py();
        let (addr, len) = (self.addr(), self.nbytes());
        let refused = |what: &str| {
            to_py(
                py,
                Error::Borrowed(format!(
                    "{arg} cannot be {what}: its memory is in use by another pyddstore call in \
                     progress (another thread passing the same array, a view or an overlapping \
                     slice of it); give each thread its own array"
                )),
            )
        };
        let what = if write { "read into" } else { "read from" };
        // First the address ranges (any two arrays over the same bytes, however
        // made: views, tensor.numpy() twice, frombuffer), then rust-numpy's flags
        // (borrows other rust-numpy extensions hold).
        let claim = Claim::take(addr, len, write).ok_or_else(|| refused(what))?;
        let guard = match self.typed_guard(write) {
            Some(g) => g,
            None => {
                // Other dtypes (fixed-size bytes, int16, byte-swapped, ...):
                // a flat uint8 view of the same memory; the flags key on memory.
                let view = self
                    .arr
                    .call_method1("reshape", (-1,))?
                    .call_method1("view", ("u1",))?
                    .cast_into::<PyArrayDyn<u8>>()?;
                guard_of(&view, write)
            }
        };
        let guard = guard.map_err(|e| match e {
            BorrowError::NotWriteable => {
                type_error(py, format!("{arg} is read-only; pass a writable array"))
            }
            _ => refused(what),
        })?;
        Ok(Borrowed {
            _guard: guard,
            _claim: claim,
            addr,
            len,
            exclusive: write,
        })
    }

    /// The checked borrow through the array's own element type, for the
    /// dtypes rust-numpy knows in native byte order (no Python call).
    fn typed_guard(&self, write: bool) -> Option<Result<Box<dyn Held + 'py>, BorrowError>> {
        fn typed<'py, T: Element + 'py>(
            arr: &Bound<'py, PyUntypedArray>,
            write: bool,
        ) -> Option<Result<Box<dyn Held + 'py>, BorrowError>> {
            arr.cast::<PyArrayDyn<T>>().ok().map(|a| guard_of(a, write))
        }
        match self.dtype() {
            DType::Bool => typed::<bool>(&self.arr, write),
            DType::Uint8 => typed::<u8>(&self.arr, write),
            DType::Int32 => typed::<i32>(&self.arr, write),
            DType::Int64 => typed::<i64>(&self.arr, write),
            DType::Float32 => typed::<f32>(&self.arr, write),
            DType::Float64 => typed::<f64>(&self.arr, write),
            DType::Bytes => None,
        }
    }
}

/// Byte ranges of caller memory that calls in progress hold: (id, start,
/// end, exclusive). A handful at a time (one per reading thread), so a scan is cheap.
/// Locked only with the GIL held (claims are taken before and released after
/// the GIL-free part of a call), so no thread holds it across `os.fork()`.
static IN_USE: Mutex<Vec<(u64, usize, usize, bool)>> = Mutex::new(Vec::new());
static NEXT_CLAIM: AtomicU64 = AtomicU64::new(0);

/// A claim on `[start, start + len)` in [`IN_USE`], released on drop.
/// Exclusive claims conflict with any overlapping claim, shared ones with
/// overlapping exclusive claims; empty ranges never conflict.
struct Claim(Option<u64>);

impl Claim {
    fn take(start: usize, len: usize, exclusive: bool) -> Option<Claim> {
        if len == 0 {
            return Some(Claim(None));
        }
        let end = start.saturating_add(len);
        let mut held = IN_USE.lock().unwrap_or_else(|p| p.into_inner());
        let clash = held
            .iter()
            .any(|&(_, s, e, x)| s < end && start < e && (x || exclusive));
        if clash {
            return None;
        }
        let id = NEXT_CLAIM.fetch_add(1, Ordering::Relaxed);
        held.push((id, start, end, exclusive));
        Some(Claim(Some(id)))
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if let Some(id) = self.0 {
            let mut held = IN_USE.lock().unwrap_or_else(|p| p.into_inner());
            held.retain(|c| c.0 != id);
        }
    }
}

/// A rust-numpy borrow guard of any element type: dropping it releases the borrow.
trait Held {}
impl<T: Element> Held for PyReadonlyArray<'_, T, numpy::IxDyn> {}
impl<T: Element> Held for PyReadwriteArray<'_, T, numpy::IxDyn> {}

fn guard_of<'py, T: Element + 'py>(
    a: &Bound<'py, PyArrayDyn<T>>,
    write: bool,
) -> Result<Box<dyn Held + 'py>, BorrowError> {
    if write {
        a.try_readwrite()
            .map(|g| Box::new(g) as Box<dyn Held + 'py>)
    } else {
        a.try_readonly().map(|g| Box::new(g) as Box<dyn Held + 'py>)
    }
}

/// The bytes of a C-contiguous array under a checked borrow (see the module
/// note): slices of it are valid while it lives.
pub struct Borrowed<'py> {
    _guard: Box<dyn Held + 'py>,
    _claim: Claim,
    addr: usize,
    len: usize,
    exclusive: bool,
}

impl Borrowed<'_> {
    /// The borrowed bytes.
    pub fn bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: a C-contiguous array owns `len` bytes at `addr`; the guard
        // keeps the array alive and holds a rust-numpy borrow of that memory
        // (no exclusive borrow elsewhere) for as long as `self`.
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len) }
    }

    /// The borrowed bytes, writable; only for [`Array::borrow_mut`].
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        assert!(self.exclusive, "bytes_mut of a shared borrow");
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: as in `bytes`, and the borrow is exclusive (taken with
        // try_readwrite on a writable array): no other checked borrow of
        // these bytes exists while `self` lives, and `&mut self` gives out one slice.
        unsafe { std::slice::from_raw_parts_mut(self.addr as *mut u8, self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::Claim;

    #[test]
    fn claims_refuse_overlaps_with_a_writer_only() {
        // Addresses no real array has here: tests run in one process.
        let base = usize::MAX / 2;
        let w = Claim::take(base, 100, true).expect("free range");
        assert!(
            Claim::take(base + 99, 10, false).is_none(),
            "overlaps the writer"
        );
        assert!(
            Claim::take(base + 50, 1, true).is_none(),
            "inside the writer"
        );
        assert!(
            Claim::take(base + 100, 10, true).is_some(),
            "adjacent is free"
        );
        assert!(
            Claim::take(base + 10, 0, true).is_some(),
            "empty never conflicts"
        );
        drop(w);
        let r1 = Claim::take(base, 100, false).expect("released");
        let r2 = Claim::take(base + 50, 100, false).expect("readers share");
        assert!(
            Claim::take(base + 120, 4, true).is_none(),
            "a writer waits for readers"
        );
        drop((r1, r2));
        assert!(Claim::take(base + 120, 4, true).is_some());
    }
}
