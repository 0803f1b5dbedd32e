//! Filling this rank's share of a variable straight from files.

use std::time::Duration;

use ddstore_core::config::Value;
use ddstore_core::file_load::{FileRange, SourceFile};
use numpy::PyReadonlyArray2;
use pyo3::prelude::*;

use super::PyStore;
use crate::errors::{value_error, IntoPyResult};

/// Columns of the `ranges` table of `load_file_ranges`, in order.
const RANGE_COLUMNS: usize = 7;

impl PyStore {
    /// `timeout_s` as a duration; `None` is the store's `DDSTORE_LOAD_TIMEOUT_S`.
    fn load_timeout(
        &self,
        py: Python<'_>,
        what: &str,
        timeout_s: Option<f64>,
    ) -> PyResult<Duration> {
        match timeout_s {
            Some(t) if t.is_finite() && t > 0.0 => Ok(Duration::from_secs_f64(t)),
            Some(t) => Err(value_error(
                py,
                format!("{what}: timeout_s={t} must be a positive number of seconds"),
            )),
            // The store's settings snapshot (DDSTORE_LOAD_TIMEOUT_S when it was made).
            None => match self.settings.inner.value("DDSTORE_LOAD_TIMEOUT_S").py(py)? {
                Some(Value::Seconds(t)) if t.is_finite() && t > 0.0 => Ok(Duration::from_secs_f64(t)),
                other => Err(value_error(
                    py,
                    format!("{what}: DDSTORE_LOAD_TIMEOUT_S gives {other:?}, not a positive number of seconds"),
                )),
            },
        }
    }
}

/// The rows of a `ranges` table as file ranges, each value checked.
fn parse_ranges(
    py: Python<'_>,
    what: &str,
    ranges: &PyReadonlyArray2<'_, i64>,
) -> PyResult<Vec<FileRange>> {
    let table = ranges.as_array();
    if table.ncols() != RANGE_COLUMNS {
        return Err(value_error(
            py,
            format!(
                "{what}: ranges must have {RANGE_COLUMNS} columns, got {}",
                table.ncols()
            ),
        ));
    }
    let mut parsed = Vec::with_capacity(table.nrows());
    for (i, row) in table.rows().into_iter().enumerate() {
        let bad = |col: &str| value_error(py, format!("{what}: range {i}: {col} is out of range"));
        let crc32 = match row[3] {
            -1 => None,
            c => Some(u32::try_from(c).map_err(|_| bad("crc32"))?),
        };
        parsed.push(FileRange {
            file: usize::try_from(row[0]).map_err(|_| bad("file index"))?,
            file_offset: u64::try_from(row[1]).map_err(|_| bad("file offset"))?,
            len: usize::try_from(row[2]).map_err(|_| bad("length"))?,
            crc32,
            skip: usize::try_from(row[4]).map_err(|_| bad("skip"))?,
            write_len: usize::try_from(row[5]).map_err(|_| bad("write length"))?,
            dst_offset: usize::try_from(row[6]).map_err(|_| bad("share offset"))?,
        });
    }
    Ok(parsed)
}

#[pymethods]
impl PyStore {
    /// Reads byte ranges of files straight into this rank's share of `name`
    /// with up to `threads` reads in flight (threads spawned for the call,
    /// the GIL released). `ranges` is an int64 array of rows (file index,
    /// file offset, bytes read, CRC32 of them or -1, bytes skipped, bytes
    /// written, byte offset in the share). Files open read-only, O_NONBLOCK,
    /// O_CLOEXEC, O_NOFOLLOW with `nofollow`, O_DIRECT with `direct` where
    /// the file system allows it; only regular files, of exactly `sizes[i]`
    /// bytes where given (-1: any). When no read returns for `timeout_s`
    /// seconds (None: DDSTORE_LOAD_TIMEOUT_S, read now) it raises
    /// DDStoreTimeoutError naming the file and byte range, leaving a reader
    /// stuck in the kernel behind. Returns (bytes written, whether every
    /// file was read with O_DIRECT).
    #[pyo3(signature = (name, paths, ranges, threads=32, direct=false, nofollow=false, sizes=None, timeout_s=None))]
    #[allow(clippy::too_many_arguments)]
    fn load_file_ranges(
        &self,
        py: Python<'_>,
        name: String,
        paths: Vec<String>,
        ranges: PyReadonlyArray2<'_, i64>,
        threads: usize,
        direct: bool,
        nofollow: bool,
        sizes: Option<Vec<i64>>,
        timeout_s: Option<f64>,
    ) -> PyResult<(u64, bool)> {
        let what = format!("load_file_ranges('{name}')");
        let timeout = self.load_timeout(py, &what, timeout_s)?;
        let parsed = parse_ranges(py, &what, &ranges)?;
        if sizes.as_ref().is_some_and(|s| s.len() != paths.len()) {
            return Err(value_error(
                py,
                format!("{what}: sizes must give one size per path"),
            ));
        }
        self.detached(py, |s| {
            let mut files = Vec::with_capacity(paths.len());
            for (i, p) in paths.iter().enumerate() {
                let size = sizes.as_ref().and_then(|s| u64::try_from(s[i]).ok());
                files.push(SourceFile::open(p, nofollow, direct, size)?);
            }
            let all_direct = !files.is_empty() && files.iter().all(|f| f.is_direct());
            let n = s.load_file_ranges(&name, files, &parsed, threads, timeout)?;
            Ok((n, all_direct))
        })
    }
}
