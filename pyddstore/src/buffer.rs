//! Borrowing the bytes of numpy arrays passed in by the caller: the one
//! place the binding turns a Python-owned buffer into a Rust slice.

use ddstore_core::DType;
use numpy::npyffi;
use numpy::{PyArray1, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;

use crate::errors::type_error;

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

    pub fn bytes(&self) -> &[u8] {
        let n = self.nbytes();
        if n == 0 {
            return &[];
        }
        // SAFETY: a C-contiguous array owns `n` bytes at its data pointer, and
        // `self.arr` keeps the array alive for the slice's lifetime.
        unsafe { std::slice::from_raw_parts(self.addr() as *const u8, n) }
    }

    /// Only for arrays checked writable in `new`.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        let n = self.nbytes();
        if n == 0 {
            return &mut [];
        }
        // SAFETY: as in `bytes`, and the array was checked writable; the
        // caller holds the only Rust view of it during the call.
        unsafe { std::slice::from_raw_parts_mut(self.addr() as *mut u8, n) }
    }
}
