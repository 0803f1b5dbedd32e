//! Element types a variable can hold.

use crate::{Error, Result};

/// The element type of a variable, as numpy names it; fixes the row's item size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// Raw bytes of unknown type (`init` without a dtype, numpy records).
    Bytes,
    /// `bool`, one byte.
    Bool,
    /// `uint8`.
    Uint8,
    /// `int32`.
    Int32,
    /// `int64`.
    Int64,
    /// `float32`.
    Float32,
    /// `float64`.
    Float64,
}

impl DType {
    /// Every dtype, in code order.
    pub const ALL: [DType; 7] = [
        DType::Bytes,
        DType::Bool,
        DType::Uint8,
        DType::Int32,
        DType::Int64,
        DType::Float32,
        DType::Float64,
    ];

    /// Bytes per element (1 for `Bytes`).
    pub fn itemsize(self) -> usize {
        TABLE[self as usize].2
    }

    /// The numpy name (`"float32"`), as Python sees it.
    pub fn name(self) -> &'static str {
        TABLE[self as usize].0
    }

    /// The dtype numpy arrays of this kind character (`b'f'`) and item size
    /// are stored as; any other numpy dtype is raw bytes.
    pub fn from_numpy(kind: u8, itemsize: usize) -> DType {
        DType::ALL
            .into_iter()
            .find(|&d| {
                let (_, k, size) = TABLE[d as usize];
                d != DType::Bytes && k == kind && size == itemsize
            })
            .unwrap_or(DType::Bytes)
    }

    /// The one-byte code used in records exchanged between ranks.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// The dtype of a record's code; an unknown code is an error.
    pub fn from_code(code: u8) -> Result<DType> {
        DType::ALL
            .get(code as usize)
            .copied()
            .ok_or_else(|| Error::invalid(format!("unknown dtype code {code}")))
    }

    /// The dtype of a numpy name; an unknown name is an error that lists the accepted ones.
    pub fn parse(name: &str) -> Result<DType> {
        DType::ALL
            .iter()
            .copied()
            .find(|d| d.name() == name)
            .ok_or_else(|| {
                Error::WrongType(format!(
                    "unsupported dtype '{name}': expected one of bool, uint8, int32, int64, float32, float64"
                ))
            })
    }
}

/// What each dtype is, in code order (indexed by `DType as usize`): the one
/// table of numpy names, numpy kind characters (`dtype.kind`) and item sizes.
const TABLE: [(&str, u8, usize); 7] = [
    ("bytes", b'V', 1),
    ("bool", b'b', 1),
    ("uint8", b'u', 1),
    ("int32", b'i', 4),
    ("int64", b'i', 8),
    ("float32", b'f', 4),
    ("float64", b'f', 8),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_code(d.code()).unwrap(), d);
            assert_eq!(DType::parse(d.name()).unwrap(), d);
            if d != DType::Bytes {
                assert_eq!(DType::from_numpy(TABLE[d as usize].1, d.itemsize()), d);
            }
        }
        assert!(DType::parse("complex64").is_err());
    }
}
