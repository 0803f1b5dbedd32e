//! What a variable is, the same on every rank: its element type and size,
//! row width and rows per rank.

use crate::dtype::DType;
use crate::layout::Layout;

/// Shape of a variable, the same on every rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VarInfo {
    /// Element type of the rows.
    pub dtype: DType,
    /// Bytes per element as `info()` reports it (upstream's `itemsize`):
    /// the dtype's size, or for raw-bytes rows what the creator said.
    pub itemsize: usize,
    /// Bytes per row.
    pub row_bytes: usize,
    /// Rows per rank.
    pub layout: Layout,
}

/// What a variable's rows are made of: elements of `dtype`, `itemsize`
/// bytes each. A [`DType`] converts into one of its own size (raw bytes: 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Element {
    /// Element type of the rows.
    pub dtype: DType,
    /// Bytes per element (at least 1).
    pub itemsize: usize,
}

impl Element {
    /// Elements of `dtype` counted as `itemsize` bytes each (0 counts as 1).
    pub fn new(dtype: DType, itemsize: usize) -> Element {
        Element {
            dtype,
            itemsize: itemsize.max(1),
        }
    }
}

impl From<DType> for Element {
    fn from(dtype: DType) -> Element {
        Element::new(dtype, dtype.itemsize())
    }
}
