"""Loading a rank's share: the path a source allows (load_share), each keeping many reads in
flight (_load_runner.py).

Rows go from each reader straight into the store's share (update() copies with the GIL
released); nothing collects the samples. The paths, fastest first: sources whose rows lie in
files (FileRows: .npy lists, memmaps, contiguous h5py datasets) are read in Rust with many
preads in flight; array-likes (in-memory arrays, tensors, chunked h5py, zarr) are sliced
(compressed h5py by forked processes, _forked.py); map-style sources are called sample by
sample by threads, or by forked processes where they are not thread-safe.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import mmap
import threading
import time
from typing import Any, Callable

import numpy as np
import torch
from torch.utils.data import Dataset, TensorDataset

from pyddstore import DDStoreError, DDStoreFileError, DDStoreTimeoutError
from pyddstore._sources import FileRows, drop_cached_file, file_of, file_rows_of, h5py_reopener

from ._field import TENSOR, Field
from ._forked import load_samples_forked, load_sliced_forked, load_timeout
from ._load_runner import (
    HELD_MAX_BYTES,
    LoadStats,
    Progress,
    bounded_depth,
    cpus,
    load_direct,
    load_held_bytes,
    run_tasks,
    run_workers,
    window,
)
from ._ragged_parts import RaggedParts
from ._schema import ChunkFiller, Schema, sample_of

NATIVE_CALL_BYTES = 256 << 20  # bytes per native file-load call (progress is shown between calls)
# Samples at least this large load in forked processes by default where there are cores for
# them: decoding them in Python (np.load's chunked copies) holds the GIL, so threads take turns.
PROCESS_SAMPLE_BYTES = 4 << 20
PROCESS_MIN_CPUS = 4


def load_samples(
    source: Any,
    schema: Schema,
    encode: Any,
    start: int,
    count: int,
    put: Callable[[Field, np.ndarray, int], None],
    depth: int,
    stats: LoadStats,
    progress: Progress,
) -> dict:
    """Map-style source: `depth` threads each take the next sample, validate it and write its
    fixed fields into the share at its row (no chunk of samples in between). Ragged fields are
    gathered per row into blocks; returns {key: RaggedParts} of this rank's share."""
    fixed, ragged = schema.fixed_fields, schema.ragged_fields
    parts = {f.key: RaggedParts(f, count) for f in ragged}
    counter = itertools.count()
    failed = threading.Event()

    def work() -> None:
        filler = ChunkFiller(schema, 1)
        src_s = put_s = 0.0
        nbytes = 0
        try:
            while not failed.is_set():
                j = next(counter)  # atomic under the GIL
                if j >= count:
                    return
                i = start + j
                t0 = time.perf_counter()
                sample = sample_of(source, i, encode)
                t1 = time.perf_counter()
                filler.put(0, sample, i)
                sample = None  # copied: not held while the next one decodes
                row_bytes = 0
                for f, view in zip(fixed, filler.store_views(1)):
                    put(f, view, j)
                    row_bytes += view.nbytes
                for f in ragged:
                    chunks, lengths = filler.ragged[f.key]
                    values = chunks.pop()
                    lengths.pop()
                    parts[f.key].put(j, values)
                    row_bytes += values.nbytes
                src_s += t1 - t0
                put_s += time.perf_counter() - t1
                nbytes += row_bytes
                progress.update(row_bytes)
        except BaseException:
            failed.set()
            raise
        finally:
            stats.add(nbytes, src_s, put_s)

    try:
        run_workers(min(depth, max(1, count)), work, stats)
    except BaseException:
        for p in parts.values():
            p.close()
        raise
    return parts


# Columns of a native file-load range (PyDDStore._native.load_file_ranges).
R_FILE, R_OFF, R_LEN, R_CRC, R_SKIP, R_WLEN, R_DST = range(7)


def load_ranges_native(
    fill: Callable[..., tuple[int, bool]],
    paths: list[str],
    ranges: np.ndarray,
    threads: int,
    direct: bool,
    stats: LoadStats,
    progress: Progress,
    error: type = DDStoreFileError,
    nofollow: bool = False,
    sizes: list[int] | None = None,
) -> bool:
    """Reads `ranges` (int64 rows of 7 columns, see R_*) of `paths` straight into a variable's
    share in Rust (`fill` is its _native.load_file_ranges bound to the variable), `threads` reads
    in flight with the GIL released, in calls of about NATIVE_CALL_BYTES so progress moves. A
    file that cannot be read (missing, symbolic link with nofollow, not regular, truncated,
    wrong size or checksum) raises `error` naming it; a call whose reads make no progress for
    DDSTORE_LOAD_TIMEOUT_S (a hung file system) raises DDStoreTimeoutError naming the file and
    byte range. Returns whether every file was read with O_DIRECT."""
    ranges = np.ascontiguousarray(ranges, dtype=np.int64).reshape(-1, 7)
    ends = np.cumsum(ranges[:, R_LEN])
    all_direct = True
    k = 0
    while k < len(ranges):
        base = int(ends[k - 1]) if k else 0
        z = max(k + 1, int(np.searchsorted(ends, base + NATIVE_CALL_BYTES, side="right")))
        batch = ranges[k:z]
        t0 = time.perf_counter()
        try:
            moved, d = fill(paths, batch, max(1, threads), direct, nofollow, sizes)
        except DDStoreError as e:
            # A hung file system stays a DDStoreTimeoutError (the message says what to do).
            if isinstance(e, (error, DDStoreTimeoutError)):
                raise
            raise error(str(e)) from None
        all_direct = all_direct and d
        stats.add(int(moved), (time.perf_counter() - t0) * max(1, min(threads, len(batch))), 0.0)
        progress.update(int(moved))
        k = z
    if direct:
        stats.notes.append(
            "O_DIRECT" if all_direct else "O_DIRECT not supported by this file system: buffered reads"
        )
    return all_direct


def load_file_rows(
    rows_src: FileRows,
    start: int,
    count: int,
    native: Callable[..., tuple[int, bool]],
    depth: int,
    direct: bool,
    stats: LoadStats,
    progress: Progress,
    rows_per_read: int | None = None,
    held: int = HELD_MAX_BYTES,
) -> None:
    """Rows [start, start + count) of a file source into a field's share, in Rust straight into
    the share (`native` is the variable's load_file_ranges): reads of whole rows (a few MiB
    each, `rows_per_read` rows with chunk_size=), `depth` in flight, the GIL released."""
    step = window(depth, count * rows_src.row_bytes, rows_src.row_bytes, stats, rows_per_read, held)
    pieces = []
    for a in range(start, start + count, step):
        pieces.extend(rows_src.ranges(a, min(start + count, a + step)))
    stats.path = "files (native)"
    index: dict[str, int] = {}
    rb = rows_src.row_bytes
    table = np.empty((len(pieces), 7), np.int64)
    for t, (path, off, first, n) in enumerate(pieces):
        table[t] = (index.setdefault(path, len(index)), off, n * rb, -1, 0, n * rb, (first - start) * rb)
    stats.workers = min(depth, max(1, len(pieces)))
    load_ranges_native(native, list(index), table, stats.workers, direct, stats, progress)


def load_sliced(
    arr: Any,
    f: Field,
    start: int,
    count: int,
    put: Callable[[Field, np.ndarray, int], None],
    depth: int,
    stats: LoadStats,
    progress: Progress,
    convert: Callable[[Any, int, int], np.ndarray],
    rows_per_read: int | None = None,
    reopen: Callable[[], Any] | None = None,
    processes: int = 0,
    settings: Any = None,
    held: int = HELD_MAX_BYTES,
) -> None:
    """An array-like read by slicing (chunked/compressed h5py, zarr, tensors, in-memory
    arrays): slices aligned to the array's chunks along rows (`.chunks[0]`), `depth` in flight
    for thread-safe readers. With `reopen` and processes > 1 (h5py, which runs reads one at a
    time under its own lock), forked processes each with their own handle read the slices,
    each bounded by the store's `settings` (DDSTORE_LOAD_TIMEOUT_S). At most `held` bytes of
    slices are in flight (load_held_bytes), at least one slice per reader."""
    row_bytes = max(1, f.row_bytes)
    step = window(depth, count * row_bytes, row_bytes, stats, rows_per_read, held)
    chunk_rows = _chunk_rows(arr)
    if chunk_rows:
        step = max(chunk_rows, step - step % chunk_rows)
    bounds = []
    a = start
    while a < start + count:
        b = min(start + count, a + step)
        if chunk_rows and b < start + count:
            b = max(a + 1, b - b % chunk_rows)  # end on a chunk boundary
        bounds.append((a, b))
        a = b

    if reopen is not None and processes > 1 and len(bounds) > 1:
        stats.path = "arrays (processes)"
        stats.workers = min(processes, len(bounds))
        timeout = load_timeout(settings)
        workers = stats.workers
        load_sliced_forked(reopen, f, bounds, start, put, convert, workers, stats, progress, timeout, held)
        return

    def handle(ab) -> tuple[float, float, int]:
        t0 = time.perf_counter()
        rows = convert(arr, *ab)
        t1 = time.perf_counter()
        put(f, rows, ab[0] - start)
        return t1 - t0, time.perf_counter() - t1, rows.nbytes

    in_memory = isinstance(arr, np.ndarray) and not isinstance(arr, np.memmap)
    run_tasks(bounds, 1 if in_memory else min(depth, len(bounds)), handle, stats, progress)


def _chunk_rows(arr: Any) -> int:
    chunks = getattr(arr, "chunks", None)
    if isinstance(chunks, tuple) and chunks and isinstance(chunks[0], int) and chunks[0] > 0:
        return chunks[0]
    return 0


def _bulk_arrays(source: Any) -> dict | None:
    """Array-backed sources whose shares can be copied without a Python call per sample:
    key -> array-like sliceable along rows (numpy array/memmap, tensor, TensorDataset, or any
    object with shape, dtype and slicing such as an h5py/zarr dataset)."""
    if isinstance(source, (np.ndarray, torch.Tensor)):
        return {0: source}
    if isinstance(source, TensorDataset):
        return dict(enumerate(source.tensors))
    if isinstance(source, Dataset):
        return None
    shape = getattr(source, "shape", None)
    if getattr(source, "dtype", None) is not None and isinstance(shape, tuple) and len(shape) >= 1:
        return {0: source}
    return None


def source_len(source: Any) -> int:
    """len(source); array-likes without __len__ (zarr 3 arrays): their first dimension."""
    shape = getattr(source, "shape", None)
    if not hasattr(source, "__len__") and isinstance(shape, tuple) and shape:
        return int(shape[0])
    return len(source)


def _bulk_fits(arr: Any, f: Field) -> bool:
    """Whether rows of arr are exactly the field's values (else load sample by sample)."""
    if isinstance(arr, torch.Tensor):
        return f.kind == TENSOR and f.torch_dtype == arr.dtype and tuple(arr.shape[1:]) == f.shape
    dtype = np.dtype(arr.dtype)
    if f.is_record:
        return dtype == f.dtype and tuple(arr.shape[1:]) == f.shape
    return (
        f.kind != TENSOR
        and dtype.names is None
        and np.dtype(dtype.name) == f.dtype
        and tuple(arr.shape[1:]) == f.shape
    )


def _bulk_slice(arr: Any, a: int, b: int, f: Field) -> np.ndarray:
    if isinstance(arr, torch.Tensor):
        out = arr[a:b].detach().cpu().contiguous().numpy()
    else:
        out = np.ascontiguousarray(np.asarray(arr[a:b]))
        if not f.is_record and out.dtype != f.dtype:
            out = out.astype(f.dtype)
    return f.to_store(out)


def _bulk_slice_of(f: Field):
    def convert(arr: Any, a: int, b: int) -> np.ndarray:
        rows = _bulk_slice(arr, a, b, f)
        _drop_mapped_pages(arr)
        return rows

    return convert


def _drop_mapped_pages(array) -> None:
    """A memory-mapped source keeps every page it was read from resident: drop them once copied,
    so loading from a file costs one chunk besides the share, not the whole file."""
    mm = getattr(array, "_mmap", None) or getattr(getattr(array, "base", None), "_mmap", None)
    if mm is not None and hasattr(mm, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
        with contextlib.suppress(OSError, ValueError):
            mm.madvise(mmap.MADV_DONTNEED)


def load_share(
    store: Any,
    source: Any,
    schema: Schema,
    encode: Any,
    chunk_size: int | None,
    load_workers: str | None,
    put: Callable[[Field, np.ndarray, int], None],
    on_device: bool,
    start: int,
    count: int,
    depth: int,
    progress: Progress,
) -> LoadStats:
    """Rows [start, start + count) of `source` into this rank's share, by the fastest path the
    source allows: its files read in Rust, its arrays sliced, else sample by sample. `put`
    writes rows of a field at an offset of the share; `on_device`: the share is in device
    memory (add_device=), which file reads cannot fill."""
    plain = encode is None and not schema.ragged_fields
    held = load_held_bytes(store.settings)
    rows_src = file_rows_of(source) if plain and len(schema.fields) == 1 else None
    f0 = schema.fields[0]
    if rows_src is not None and _bulk_fits(rows_src, f0) and not on_device:
        stats = LoadStats("files", depth)
        load_file_rows(
            rows_src,
            start,
            count,
            functools.partial(store.load_file_ranges, f0.var),
            depth,
            load_direct(store.settings),
            stats,
            progress,
            chunk_size,
            held,
        )
        return stats
    arrays = _bulk_arrays(source) if plain else None
    if arrays is not None and all(f.key in arrays and _bulk_fits(arrays[f.key], f) for f in schema.fields):
        stats = LoadStats("arrays", depth)
        processes = 0 if load_workers == "threads" else min(depth, cpus())
        for f in schema.fields:
            arr = arrays[f.key]
            load_sliced(
                arr,
                f,
                start,
                count,
                put,
                depth,
                stats,
                progress,
                _bulk_slice_of(f),
                chunk_size,
                h5py_reopener(arr),
                processes,
                store.settings,
                held,
            )
            path = file_of(arr)
            if path is not None:  # read once: not kept in the page cache beside the share
                drop_cached_file(path)
        return stats
    timeout = load_timeout(store.settings)
    return _load_samples_of(
        source, schema, encode, load_workers, put, start, count, depth, progress, timeout, held
    )


def default_workers(source: Any, schema: Schema, row_bytes: int) -> str:
    """load_workers=None: "processes" for a source with thread_safe = False, and for samples of
    PROCESS_SAMPLE_BYTES or more where PROCESS_MIN_CPUS cores are free to decode them in
    parallel (no ragged fields: their rows need threads); else "threads"."""
    if getattr(source, "thread_safe", True) is False:
        return "processes"
    large = row_bytes >= PROCESS_SAMPLE_BYTES and not schema.ragged_fields
    return "processes" if large and cpus() >= PROCESS_MIN_CPUS else "threads"


def _load_samples_of(
    source: Any,
    schema: Schema,
    encode: Any,
    load_workers: str | None,
    put: Callable[[Field, np.ndarray, int], None],
    start: int,
    count: int,
    depth: int,
    progress: Progress,
    timeout: float,
    held: int = HELD_MAX_BYTES,
) -> LoadStats:
    """A map-style source, sample by sample: `depth` threads, or (load_workers="processes",
    or a source with thread_safe = False) forked processes; ragged fields need threads (their
    rows cannot come back through the staging area), one where the source is not thread-safe.
    Samples in flight stay within `held` bytes (load_held_bytes): a thread holds a sample and
    its copy, a forked worker's rows wait in a staging area of at most `held` bytes."""
    row_bytes = max(1, sum(f.row_bytes for f in schema.fixed_fields))
    mode = load_workers if load_workers is not None else default_workers(source, schema, row_bytes)
    if mode == "processes" and not schema.ragged_fields:
        stats = LoadStats("samples (processes)", 1)
        workers = bounded_depth(max(1, min(depth, count, cpus())), held, row_bytes, stats)
        stats.workers = stats.declared = workers
        args = (start, count, put, workers, stats, progress, timeout, held)
        load_samples_forked(source, schema, encode, *args)
        return stats
    if mode == "processes":
        depth = 1
    stats = LoadStats("samples", 1)
    depth = bounded_depth(min(depth, max(1, count)), held, 2 * row_bytes, stats)
    stats.workers = stats.declared = depth
    if depth == 1 and mode == "processes":
        stats.notes.append("ragged fields load in one thread without thread-safe sources")
    stats.ragged = load_samples(source, schema, encode, start, count, put, depth, stats, progress)
    return stats
