"""Sources whose rows lie in files as raw bytes, read with large positional reads many at a time
instead of one Python call per sample: a list of ``.npy`` files, an ``np.memmap``, an ``h5py``
dataset stored contiguously or in unfiltered chunks of whole rows (DistDataset reads them in Rust,
straight into the share: PyDDStore._native.load_file_ranges). Also the reading machinery (aligned
buffers for ``O_DIRECT``) that the Python fallbacks use."""

from __future__ import annotations

import mmap
import os
import stat
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _native
from ._errors import DDStoreFileError, DDStoreTypeError, DDStoreValueError

ALIGN = _native.DIRECT_ALIGN  # O_DIRECT: offsets, lengths and buffers aligned to this (Rust's one value)


@dataclass(frozen=True)
class Segment:
    """``rows`` rows stored contiguously in ``path`` from byte ``offset`` on."""

    path: str
    offset: int
    rows: int


class FileRows:
    """Rows of one dtype and shape laid out back to back in one or more files (segments in
    order). Sliceable like an array (``rows[a:b]``) and indexable per sample, so it works as a
    DistDataset source anywhere; DistDataset reads a rank's rows with large positional reads."""

    def __init__(self, segments: list[Segment], dtype: np.dtype, row_shape: tuple[int, ...]):
        self.segments = list(segments)
        self.dtype = np.dtype(dtype)
        self.row_shape = tuple(row_shape)
        self.row_bytes = int(np.prod(row_shape, dtype=np.int64)) * self.dtype.itemsize
        self._starts = np.cumsum([0] + [s.rows for s in self.segments])

    @property
    def shape(self) -> tuple[int, ...]:
        return (int(self._starts[-1]), *self.row_shape)

    def __len__(self) -> int:
        return int(self._starts[-1])

    def ranges(self, a: int, b: int) -> list[tuple[str, int, int, int]]:
        """Rows [a, b) as (path, byte offset, first row, rows) pieces, one per segment touched."""
        out = []
        k = int(np.searchsorted(self._starts, a, side="right")) - 1
        while a < b and k < len(self.segments):
            seg, s0 = self.segments[k], int(self._starts[k])
            n = min(b, s0 + seg.rows) - a
            if n > 0:
                out.append((seg.path, seg.offset + (a - s0) * self.row_bytes, a, n))
                a += n
            k += 1
        return out

    def _read(self, a: int, b: int) -> np.ndarray:
        out = np.empty((b - a, *self.row_shape), self.dtype)
        flat = out.reshape(-1).view(np.uint8)
        pos = 0
        for path, off, _, n in self.ranges(a, b):
            nbytes = n * self.row_bytes
            fd = open_regular(path, direct=False)[0]
            try:
                pread_exact(fd, memoryview(flat)[pos : pos + nbytes], off, path)
            finally:
                os.close(fd)
            pos += nbytes
        return out

    def __getitem__(self, index: Any) -> np.ndarray:
        n = len(self)
        if isinstance(index, slice):
            a, b, step = index.indices(n)
            if step != 1:
                raise DDStoreValueError(f"FileRows supports slices with step 1, got step {step}")
            return self._read(a, max(a, b))
        i = int(index)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"row {index} is out of range for {n} rows")
        return self._read(i, i + 1)[0]


def npy_files(paths: list) -> FileRows:
    """A list of ``.npy`` files (same dtype and row shape, C order) as one source of rows: the
    files' rows one after another."""
    segments, dtype, row_shape = [], None, None
    for p in paths:
        path = os.fspath(p)
        try:
            fd, _ = open_regular(path, False)  # a regular file; a FIFO or device is refused
            with os.fdopen(fd, "rb") as fh:
                version = np.lib.format.read_magic(fh)
                if version == (1, 0):
                    shape, fortran, dt = np.lib.format.read_array_header_1_0(fh)
                else:
                    shape, fortran, dt = np.lib.format.read_array_header_2_0(fh)
                offset = fh.tell()
                size = os.fstat(fh.fileno()).st_size
        except OSError as e:
            # The class by errno (a missing file: DDStoreFileNotFoundError), as Rust's file errors.
            raise _native.file_error(f"{path}: cannot read the .npy header: {e}", e.errno) from None
        except ValueError as e:
            raise DDStoreValueError(f"{path}: not a .npy file ({e})") from None
        if dt.hasobject:
            raise DDStoreTypeError(f"{path}: dtype {dt} holds Python objects; it cannot be stored")
        if len(shape) == 0:
            raise DDStoreValueError(f"{path}: a 0-d array has no rows")
        if fortran and len(shape) > 1:
            raise DDStoreValueError(f"{path}: Fortran-ordered arrays are not supported; save in C order")
        if dtype is None:
            dtype, row_shape = dt, tuple(shape[1:])
        elif dt != dtype or tuple(shape[1:]) != row_shape:
            raise DDStoreValueError(
                f"{path}: rows of shape {tuple(shape[1:])} dtype {dt} differ from the first file's "
                f"{row_shape} {dtype}; every file must hold the same rows"
            )
        need = offset + int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        if size < need:
            raise DDStoreFileError(f"{path}: truncated ({size} bytes, the header needs {need})")
        segments.append(Segment(path, offset, int(shape[0])))
    if dtype is None:
        raise DDStoreValueError("the list of .npy files is empty")
    return FileRows(segments, dtype, row_shape)


def is_npy_list(source: Any) -> bool:
    return (
        isinstance(source, (list, tuple))
        and len(source) > 0
        and all(isinstance(p, (str, os.PathLike)) and os.fspath(p).endswith(".npy") for p in source)
    )


def file_rows_of(source: Any) -> FileRows | None:
    """The files behind an array source whose rows can be read with positional reads: FileRows
    itself, an np.memmap (C-contiguous, native byte order), an h5py dataset stored contiguously
    without filters in a plain (sec2) file. None for anything else."""
    if isinstance(source, FileRows):
        return source
    if isinstance(source, np.memmap):
        return _memmap_rows(source)
    if type(source).__module__.startswith("h5py"):
        return _h5py_rows(source)
    return None


def _memmap_rows(arr: np.memmap) -> FileRows | None:
    mm = getattr(arr, "_mmap", None)
    path = getattr(arr, "filename", None)
    if mm is None or path is None or arr.ndim < 1 or not arr.flags.c_contiguous or not arr.dtype.isnative:
        return None
    if getattr(arr, "mode", "c") == "c":  # copy-on-write: changes live in memory, not in the file
        return None
    if arr.dtype.hasobject:
        return None
    # Where arr's first byte lies in the file: its distance from the mapping's start plus the
    # file offset the mapping starts at (a slice of a memmap keeps its parent's `offset`).
    base = np.frombuffer(mm, dtype=np.uint8)
    start_in_map = arr.ctypes.data - base.ctypes.data
    del base
    map_start = arr.offset - arr.offset % mmap.ALLOCATIONGRANULARITY
    return FileRows([Segment(path, map_start + start_in_map, arr.shape[0])], arr.dtype, arr.shape[1:])


def _h5py_rows(ds: Any) -> FileRows | None:
    try:
        if ds.compression is not None or ds.ndim < 1:
            return None
        if ds.file.driver != "sec2" or not ds.dtype.isnative or ds.dtype.hasobject:
            return None
        if ds.file.mode != "r":  # writes may still sit in HDF5's buffers, not in the file
            return None
        if ds.chunks is not None:
            return _h5py_chunk_rows(ds)
        offset = ds.id.get_offset()
        if offset is None:  # not allocated yet
            return None
        return FileRows([Segment(ds.file.filename, int(offset), ds.shape[0])], ds.dtype, ds.shape[1:])
    except (AttributeError, TypeError, ValueError, KeyError, RuntimeError):
        return None


def _h5py_chunk_rows(ds: Any) -> FileRows | None:
    """A chunked dataset without filters whose chunks span whole rows (chunks[1:] == shape[1:]):
    each chunk is rows stored raw, so its rows are one segment at the chunk's byte offset.
    None when a chunk is filtered or not allocated (its rows are fill values, not in the file)."""
    if ds.id.get_create_plist().get_nfilters() or tuple(ds.chunks[1:]) != tuple(ds.shape[1:]):
        return None
    n, per = ds.shape[0], ds.chunks[0]
    row_bytes = int(np.prod(ds.shape[1:], dtype=np.int64)) * ds.dtype.itemsize
    found: dict[int, int] = {}

    def visit(info: Any) -> None:
        if info.filter_mask == 0 and info.byte_offset is not None and info.size == per * row_bytes:
            found[info.chunk_offset[0] // per] = int(info.byte_offset)

    if hasattr(ds.id, "chunk_iter"):
        ds.id.chunk_iter(visit)
    else:
        for k in range(ds.id.get_num_chunks()):
            visit(ds.id.get_chunk_info(k))
    chunks = -(-n // per)
    if sorted(found) != list(range(chunks)):
        return None
    segments = [Segment(ds.file.filename, found[c], min(per, n - c * per)) for c in range(chunks)]
    return FileRows(segments, ds.dtype, ds.shape[1:])


def h5py_reopener(ds: Any) -> Any:
    """For an h5py dataset of a file opened read-only: a function that opens the same dataset
    again (a forked load worker's own handle), else None."""
    if not type(ds).__module__.startswith("h5py"):
        return None
    try:
        if ds.file.mode != "r":
            return None
        filename, name = ds.file.filename, ds.name
    except (AttributeError, ValueError):
        return None

    def reopen() -> Any:
        import h5py

        return h5py.File(filename, "r")[name]

    return reopen


def file_of(arr: Any) -> str | None:
    """The file an array source read by slicing lies in (an np.memmap, an h5py dataset opened
    read-only), else None."""
    if isinstance(arr, np.memmap):
        return getattr(arr, "filename", None)
    if type(arr).__module__.startswith("h5py"):
        try:
            return arr.file.filename if arr.file.mode == "r" else None
        except (AttributeError, ValueError):
            return None
    return None


def drop_cached_file(path: str) -> None:
    """Drops `path`'s clean pages from the page cache (posix_fadvise DONTNEED): a source read
    once into the store need not stay cached beside it. Advice only: failures are ignored."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except (OSError, AttributeError):
        pass
    finally:
        os.close(fd)


# -- reading ---------------------------------------------------------------------------------


def open_regular(path: str, direct: bool, nofollow: bool = False) -> tuple[int, bool]:
    """Opens path read-only: (fd, direct). With direct, O_DIRECT where the file system allows
    it (else buffered, direct False). nofollow: refuse a symbolic link. Only regular files."""
    # O_NONBLOCK: a FIFO planted at the path must not block the open (regular files ignore it).
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if nofollow:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except OSError as e:
        what = "is a symbolic link" if nofollow and e.errno == 40 else f"cannot be opened ({e.strerror})"
        raise _native.file_error(f"{path} {what}", e.errno) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise DDStoreFileError(f"{path} is not a regular file")
        if direct and hasattr(os, "O_DIRECT"):
            try:
                dfd = os.open(path, flags | os.O_DIRECT)
            except OSError:  # tmpfs and some overlay file systems refuse O_DIRECT
                return fd, False
            if os.fstat(dfd).st_ino != os.fstat(fd).st_ino:
                os.close(dfd)
                raise DDStoreFileError(f"{path} changed while it was opened")
            os.close(fd)
            return dfd, True
        return fd, False
    except BaseException:
        os.close(fd)
        raise


def pread_exact(fd: int, dst: memoryview, offset: int, path: str) -> None:
    """Fills dst from fd at offset (buffered file); a file too short is an error naming it."""
    pos = 0
    while pos < len(dst):
        got = os.preadv(fd, [dst[pos:]], offset + pos)
        if got == 0:
            raise DDStoreFileError(
                f"{path} is truncated: {offset + pos} bytes, rows need {offset + len(dst)}"
            )
        pos += got


class AlignedReader:
    """One worker's reading buffer: large positional reads, with O_DIRECT (aligned offset,
    length and buffer) for descriptors opened that way. Not shared between threads."""

    def __init__(self) -> None:
        self._buf: mmap.mmap | None = None
        self._view: memoryview | None = None

    def _buffer(self, nbytes: int) -> memoryview:
        if self._buf is None or len(self._buf) < nbytes:
            self.close()
            size = _native.direct_span(0, max(nbytes, ALIGN))[1]
            self._buf = mmap.mmap(-1, size)  # page-aligned, as O_DIRECT needs
            self._view = memoryview(self._buf)
        return self._view  # type: ignore[return-value]

    def read(self, fd: int, direct: bool, offset: int, nbytes: int, path: str) -> memoryview:
        """nbytes at offset, as a view of this reader's buffer (valid until the next read)."""
        if not direct:
            view = self._buffer(nbytes)[:nbytes]
            pread_exact(fd, view, offset, path)
            return view
        a0, a1 = _native.direct_span(offset, nbytes)
        buf = self._buffer(a1 - a0)
        pos = 0
        need = offset + nbytes - a0
        while pos < need:
            got = os.preadv(fd, [buf[pos : a1 - a0]], a0 + pos)
            if got == 0:
                raise DDStoreFileError(f"{path} is truncated: {a0 + pos} bytes, rows need {offset + nbytes}")
            pos += got
            if pos % ALIGN and pos < need:  # a short read not at the end of the file
                raise DDStoreFileError(f"{path}: unaligned short read at byte {a0 + pos}")
        return buf[offset - a0 : offset - a0 + nbytes]

    def close(self) -> None:
        try:
            if self._view is not None:
                self._view.release()
            if self._buf is not None:
                self._buf.close()
        except BufferError:
            pass  # a view is still held (an error's traceback): the mapping goes with it
        self._buf = self._view = None
