//! Borrowing the bytes of numpy arrays passed in by the caller: the one
//! place the binding turns a Python-owned buffer into a Rust slice.
//!
//! The aliasing rule: a Rust slice over an array exists only while a
//! rust-numpy checked borrow of that array is held ([`Borrowed`]): shared
//! for sources (`add`, `update`), exclusive for destinations (`get`,
//! `get_batch`). The borrow is taken with the GIL held and kept while the GIL
//! is released for the read, so a second call on the same memory (another
//! thread passing the same array, a view of it, or an overlapping slice) is
//! refused with `DDStoreBorrowError` naming the argument instead of aliasing
//! a `&mut [u8]`. rust-numpy's flags key on the memory (base object and byte
//! range), not on the array object or its dtype, and are shared with every
//! other extension built on rust-numpy. Python code writing into an array
//! while a call reads into it is not seen by these flags: that is the
//! caller's data race, as with any numpy function that releases the GIL.

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
    match (d.kind(), d.itemsize()) {
        (b'b', 1) => DType::Bool,
        (b'u', 1) => DType::Uint8,
        (b'i', 4) => DType::Int32,
        (b'i', 8) => DType::Int64,
        (b'f', 4) => DType::Float32,
        (b'f', 8) => DType::Float64,
        _ => DType::Bytes,
    }
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
        let guard = guard.map_err(|e| {
            let what = match (e, write) {
                (BorrowError::NotWriteable, _) => {
                    return type_error(py, format!("{arg} is read-only; pass a writable array"))
                }
                (_, true) => "read into",
                (_, false) => "read from",
            };
            to_py(
                py,
                Error::Borrowed(format!(
                    "{arg} cannot be {what}: its memory is in use by another pyddstore call in                      progress (another thread passing the same array, a view or an overlapping                      slice of it); give each thread its own array"
                )),
            )
        })?;
        Ok(Borrowed {
            _guard: guard,
            addr: self.addr(),
            len: self.nbytes(),
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
