"""Loading a rank's share with many reads in flight (DDSTORE_LOAD_DEPTH, default 32).

Throughput from a parallel file system is decided by how many reads are in flight, not by their
order, so every load path keeps `depth` reads going: worker threads that call the source's
__getitem__ (map-style sources) or read large row ranges of the files behind an array source
(FileRows: .npy lists, memmaps, contiguous h5py datasets; snapshots). Rows go from each worker
straight into the store's share (update() copies with the GIL released); nothing collects the
samples. Progress shows MB/s and an ETA; the summary says what limited the load.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import os
import signal
import sys
import threading
import time
from typing import Any, Callable

import numpy as np

from pyddstore import DDStoreError, DDStoreFileError, DDStoreTimeoutError
from pyddstore._sources import FileRows

from ._schema import ChunkFiller, Field, Schema


class DDStoreChildError(DDStoreError, RuntimeError):
    """A forked load worker died (killed, out of memory) before answering."""


MAX_READ_BYTES = 8 << 20  # one read of a file source
MIN_WINDOW_BYTES = 16 << 20
NATIVE_CALL_BYTES = 256 << 20  # bytes per native file-load call (progress is shown between calls)


def load_depth(settings) -> int:
    """DDSTORE_LOAD_DEPTH of `settings` (a store's: reads in flight while loading;
    DDSTORE_LOAD_THREADS is the older name; the default is the settings table's)."""
    return settings.load_depth


def load_direct(settings) -> bool:
    """DDSTORE_LOAD_DIRECT=1 (of `settings`): read file sources and snapshots with O_DIRECT."""
    return settings.load_direct


class LoadStats:
    """What one rank's load did: bytes, time, and where its workers spent their time."""

    def __init__(self, path: str, workers: int):
        self.path = path
        self.workers = workers
        self.declared = workers
        self.nbytes = 0
        self.t0 = time.perf_counter()
        self.cpu0 = time.process_time()
        self.secs = 0.0
        self.cpu = 0.0
        self.source_s = 0.0  # workers inside the source (read + decode), summed
        self.put_s = 0.0  # workers copying into the share, summed
        self.window_bytes = 0
        self.window_capped = False  # the in-flight window was limited by memory
        self.notes: list[str] = []
        self.ragged: dict = {}  # samples path: {key: (values, lengths)} of ragged fields
        self._lock = threading.Lock()

    def add(self, nbytes: int, source_s: float, put_s: float) -> None:
        with self._lock:
            self.nbytes += nbytes
            self.source_s += source_s
            self.put_s += put_s

    def finish(self) -> None:
        self.secs = time.perf_counter() - self.t0
        self.cpu = time.process_time() - self.cpu0

    def to_json(self) -> dict:
        return {
            "path": self.path,
            "workers": self.workers,
            "nbytes": self.nbytes,
            "secs": self.secs,
            "cpu": self.cpu,
            "source_s": self.source_s,
            "put_s": self.put_s,
            "window_bytes": self.window_bytes,
            "window_capped": self.window_capped,
            "notes": self.notes,
        }


def limit_of(stats: dict) -> str:
    """A short judgement of what limited a load, from LoadStats.to_json()."""
    secs = max(stats["secs"], 1e-9)
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    cpu_share = stats["cpu"] / secs / cores
    busy = (stats["source_s"] + stats["put_s"]) / secs / max(1, stats["workers"])
    if stats["window_capped"] and busy > 0.8:
        return f"memory (in-flight window capped at {stats['window_bytes'] / 2**20:.0f} MiB)"
    if stats["path"] == "samples" and stats["workers"] > 1 and stats["cpu"] / secs > 0.5:
        # Threads share one interpreter: Python-heavy __getitem__ runs one at a time.
        return (
            f"decode in Python (the GIL: {stats['cpu'] / secs:.1f} cores busy; load_workers='processes' "
            "runs it in parallel where cores are free)"
        )
    if cpu_share > 0.85:
        what = "decode" if stats["path"].startswith("samples") else "copies"
        return f"CPU ({what}: {cpu_share:.0%} of {cores} cores)"
    if stats["put_s"] > stats["source_s"]:
        return "copies into the share"
    return f"the source (reads; CPU {cpu_share:.0%} of {cores} cores)"


def rate_text(bytes_per_s: float) -> str:
    """MB/s with three significant digits (0.16 MB/s, 42.3 MB/s, 1234 MB/s), never a bare 0."""
    mb = bytes_per_s / 1e6
    return f"{mb:.0f} MB/s" if mb >= 100 else f"{mb:.3g} MB/s"


class Progress:
    """Samples loaded on rank 0 (callers report bytes of whole samples): a tqdm bar (samples,
    samples/s, ETA) on a terminal when tqdm is installed, else a line on stderr every 5 s on a
    terminal and every 30 s elsewhere (a Slurm output file gets no bar frames). Thread-safe."""

    LINE_EVERY_S = {True: 5.0, False: 30.0}  # by whether stderr is a terminal

    def __init__(self, total_bytes: int, enabled: bool, desc: str, samples: int = 0):
        self.total = total_bytes
        self.samples = samples if samples > 0 else total_bytes
        self.enabled = enabled and total_bytes > 0
        self.desc = desc
        self.done = 0
        self.t0 = time.perf_counter()
        self._last = self.t0
        self._shown = 0
        self._lock = threading.Lock()
        self._bar = None
        tty = bool(getattr(sys.stderr, "isatty", lambda: False)())
        self._every = self.LINE_EVERY_S[tty]
        if self.enabled and tty:
            try:
                from tqdm.auto import tqdm

                self._bar = tqdm(total=self.samples, desc=desc, unit="sample", unit_scale=True, leave=False)
            except ImportError:
                self._bar = None

    def _samples_of(self, nbytes: int) -> int:
        return nbytes * self.samples // self.total

    def update(self, nbytes: int) -> None:
        if not self.enabled:
            return
        with self._lock:
            self.done += nbytes
            if self._bar is not None:
                now_samples = self._samples_of(self.done)
                self._bar.update(now_samples - self._shown)
                self._shown = now_samples
                return
            now = time.perf_counter()
            if now - self._last < self._every:
                return
            self._last = now
            rate = self.done / max(now - self.t0, 1e-9)
            eta = (self.total - self.done) / rate if rate > 0 else float("inf")
            print(
                f"{self.desc}: {self._samples_of(self.done)}/{self.samples} samples "
                f"({self.done / 2**20:.1f}/{self.total / 2**20:.1f} MiB), {rate_text(rate)}, ETA {eta:.0f} s",
                file=sys.stderr,
                flush=True,
            )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _run_workers(n: int, work: Callable[[], None], stats: LoadStats | None = None) -> None:
    """Runs work() in n threads; the first error (if any) is raised once all have stopped."""
    if stats is not None:
        stats.workers = max(stats.workers if stats.workers != stats.declared else 0, n)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as e:  # noqa: BLE001 - re-raised below in the caller's thread
            errors.append(e)

    if n <= 1:
        work()
        return
    threads = [threading.Thread(target=run, name=f"ddstore-load-{k}", daemon=True) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def run_tasks(
    tasks: list,
    threads: int,
    handle: Callable[[Any], tuple[float, float, int]],
    stats: LoadStats,
    progress: Progress,
) -> None:
    """Runs `handle(task)` for every task, `threads` at a time, each thread taking the next
    task in order. `handle` returns (seconds reading the source, seconds putting rows into the
    share, bytes moved). The first error stops the other threads and is raised."""
    it = iter(tasks)
    lock = threading.Lock()
    failed = threading.Event()

    def work() -> None:
        src_s = put_s = 0.0
        nbytes = 0
        try:
            while not failed.is_set():
                with lock:
                    task = next(it, None)
                if task is None:
                    return
                read_s, wrote_s, moved = handle(task)
                src_s += read_s
                put_s += wrote_s
                nbytes += moved
                progress.update(moved)
        except BaseException:
            failed.set()
            raise
        finally:
            stats.add(nbytes, src_s, put_s)

    _run_workers(threads, work, stats)


RAGGED_BLOCK_BYTES = 1 << 20  # a loading thread's block of ragged values


class _Block:
    """Ragged values of rows one thread loaded, back to back in an anonymous mapping (given
    back to the system when closed, unlike small heap allocations)."""

    def __init__(self, units: int, f: Field):
        self.buf = mmap.mmap(-1, max(1, units * f.unit_count * f.dtype.itemsize))
        self.arr = np.frombuffer(self.buf, f.dtype, units * f.unit_count).reshape(units, f.unit_count)
        self.used = 0
        self.rows: list[tuple[int, int, int]] = []  # (row in the share, first unit, units)

    def close(self) -> None:
        self.arr = None  # type: ignore[assignment]
        with contextlib.suppress(BufferError):
            self.buf.close()


class RaggedParts:
    """One ragged field's rows of this rank's share while loading: every row copied into its
    loading thread's block (about RAGGED_BLOCK_BYTES), lengths kept per row. Once all ranks have
    loaded, `add_to(store, ...)` creates the ragged variable from the lengths and writes each
    block's rows into it, giving each block back as soon as it is written: the rank holds its
    share plus about one block, never a second copy of the share."""

    def __init__(self, f: Field, count: int):
        self.f = f
        self.lengths = np.zeros(count, np.int64)
        self._blocks: list[_Block] = []
        self._mine = threading.local()
        self._lock = threading.Lock()

    def put(self, j: int, values: np.ndarray) -> None:
        """Row j's values (flat, whole units of f): copied into this thread's block."""
        f = self.f
        v = values.reshape(-1, f.unit_count)
        n = len(v)
        self.lengths[j] = n
        if n == 0:
            return
        blk = getattr(self._mine, "block", None)
        if blk is None or blk.used + n > len(blk.arr):
            unit_bytes = max(1, f.unit_count * f.dtype.itemsize)
            blk = _Block(max(n, RAGGED_BLOCK_BYTES // unit_bytes), f)
            self._mine.block = blk
            with self._lock:
                self._blocks.append(blk)
        blk.arr[blk.used : blk.used + n] = v
        blk.rows.append((j, blk.used, n))
        blk.used += n

    def fill(self, update: Callable[[np.ndarray, int], None]) -> None:
        """Writes every row through update(values, first unit), block by block, closing each."""
        starts = np.concatenate([[0], np.cumsum(self.lengths)[:-1]]) if len(self.lengths) else self.lengths
        while self._blocks:
            blk = self._blocks.pop()
            for j, a, n in blk.rows:
                update(blk.arr[a : a + n], int(starts[j]))
            blk.close()

    def write(self, store: Any, values_var: str) -> None:
        """Fills the ragged variable's values (`values_var`, just created) from the blocks."""
        native = store._native
        self.fill(lambda arr, off: native.update(values_var, arr, offset=off))

    def close(self) -> None:
        while self._blocks:
            self._blocks.pop().close()


def add_ragged_in_place(
    store: Any,
    name: str,
    f: Field,
    lengths: np.ndarray,
    fill: Callable[[str], None],
    agree: Callable[[Any, BaseException | None], Any],
) -> None:
    """Collective: creates the ragged variable `name` (values `name#values`, ends `name#ends`)
    from this rank's row lengths, then `fill(values_var)` writes the values straight into this
    rank's share (no contiguous copy of them first); every rank learns whether all filled
    (`agree`) before the variable is linked."""
    from pyddstore._store import _dtype_name

    native = store._native
    values, ends = f"{name}#values", f"{name}#ends"
    lengths = np.ascontiguousarray(lengths, dtype=np.int64)
    unit_bytes = max(1, f.unit_count * f.dtype.itemsize)
    store._reserve(values)
    store._reserve(ends)
    native.init(values, int(lengths.sum()), unit_bytes, itemsize=f.dtype.itemsize, dtype=_dtype_name(f.dtype))
    native.init(ends, len(lengths), 8, itemsize=8, dtype="int64")
    err = None
    try:
        native.update(ends, np.cumsum(lengths, dtype=np.int64))
        fill(values)
    except Exception as e:  # noqa: BLE001 - every rank must learn of the failure
        err = e
    agree(store, err)
    native.link_ragged(name)
    store.barrier()
    store._ragged_units[name] = (f.unit_count,)
    store._published(values)
    store._published(ends)


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
                sample = source[i]
                if encode is not None:
                    sample = encode(sample)
                t1 = time.perf_counter()
                filler.put(0, sample, i)
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
        _run_workers(min(depth, max(1, count)), work, stats)
    except BaseException:
        for p in parts.values():
            p.close()
        raise
    return parts


def window(depth: int, share_bytes: int, row_bytes: int, stats: LoadStats, rows: int | None = None) -> int:
    """Rows per read so that depth reads in flight stay within ~10% of the share (at least
    16 MiB in all), at most 8 MiB each, whole rows; `rows` (chunk_size=) overrides."""
    if rows is not None:
        stats.window_bytes = rows * row_bytes * depth
        return rows
    limit = max(MIN_WINDOW_BYTES, share_bytes // 10)
    per_read = min(MAX_READ_BYTES, max(1, limit // max(1, depth)))
    # Capped only when the share did not fit in the window (a 40 KB share never is).
    stats.window_capped = per_read < MAX_READ_BYTES and limit < share_bytes
    rows = max(1, per_read // max(1, row_bytes))
    stats.window_bytes = rows * row_bytes * depth
    return rows


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
) -> None:
    """Rows [start, start + count) of a file source into a field's share, in Rust straight into
    the share (`native` is the variable's load_file_ranges): reads of whole rows (a few MiB
    each, `rows_per_read` rows with chunk_size=), `depth` in flight, the GIL released."""
    step = window(depth, count * rows_src.row_bytes, rows_src.row_bytes, stats, rows_per_read)
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
) -> None:
    """An array-like read by slicing (chunked/compressed h5py, zarr, tensors, in-memory
    arrays): slices aligned to the array's chunks along rows (`.chunks[0]`), `depth` in flight
    for thread-safe readers. With `reopen` and processes > 1 (h5py, which runs reads one at a
    time under its own lock), forked processes each with their own handle read the slices,
    each bounded by the store's `settings` (DDSTORE_LOAD_TIMEOUT_S)."""
    row_bytes = max(1, f.row_bytes)
    step = window(depth, count * row_bytes, row_bytes, stats, rows_per_read)
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
        load_sliced_forked(reopen, f, bounds, start, put, convert, stats.workers, stats, progress, timeout)
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


def _staging_filler(schema: Schema, staging: Any, rows: int) -> ChunkFiller:
    """A ChunkFiller whose row buffers are views of the shared staging mapping: each field's
    rows in value layout, one field after another."""
    filler = ChunkFiller(schema, 0)
    bufs, pos = [], 0
    for f in schema.fixed_fields:
        n = rows * f.row_bytes
        bufs.append(np.frombuffer(staging, np.uint8, n, pos).view(f.dtype).reshape(rows, *f.shape))
        pos += n
    filler.bufs = bufs
    return filler


def _child_loop(rfd: int, wfd: int, w: int, workers: int, source, schema, encode, start, filler) -> None:
    """A forked worker: for every chunk [a, b) the parent sends, fills rows a + w, a + w +
    workers, ... of the staging area, writing "." after each sample (the parent's deadline
    counts from the last sign of life); then a line: "ok" or the error (JSON: kind, message)."""
    import json

    from pyddstore.torch._dataset import _error_payload

    with os.fdopen(rfd, "r") as cmds:
        for line in cmds:
            a, b = (int(x) for x in line.split())
            try:
                for j in range(a + w, b, workers):
                    i = start + j
                    sample = source[i]
                    if encode is not None:
                        sample = encode(sample)
                    filler.put(j - a, sample, i)
                    os.write(wfd, b".")
                answer = b"ok\n"
            except BaseException as e:  # noqa: BLE001 - reported to the parent
                answer = (json.dumps(list(_error_payload(e, -1))) + "\n").encode()
            while answer:
                answer = answer[os.write(wfd, answer) :]


def load_timeout(settings) -> float:
    """DDSTORE_LOAD_TIMEOUT_S of `settings` (a store's): how long a forked load worker may
    work on one sample."""
    return settings.load_timeout_s


def _await_children(children, timeout: float, stuck: Callable[[int, int], str]) -> list:
    """Each child's answer to the chunk just sent (bytes without the dots; b"" if it died). A
    child silent for `timeout` seconds (no sample or slice finished) raises DDStoreTimeoutError
    with stuck(child, items it finished) in its message."""
    import select

    fds = {pr.fileno(): k for k, (_, _, pr) in enumerate(children)}
    bufs = {k: bytearray() for k in fds.values()}
    dots = dict.fromkeys(fds.values(), 0)
    last = dict.fromkeys(fds.values(), time.monotonic())
    answers: list = [None] * len(children)
    pending = set(fds)
    while pending:
        now = time.monotonic()
        wait = min(last[fds[fd]] + timeout for fd in pending) - now
        ready, _, _ = select.select(list(pending), [], [], max(0.0, min(wait, 5.0)))
        now = time.monotonic()
        for fd in ready:
            k = fds[fd]
            data = os.read(fd, 1 << 16)
            last[k] = now
            if not data:
                answers[k] = b""
                pending.discard(fd)
                continue
            buf = bufs[k]
            buf += data
            n = len(buf) - len(buf.lstrip(b"."))
            dots[k] += n
            del buf[:n]
            if buf.endswith(b"\n"):
                answers[k] = bytes(buf).strip()
                pending.discard(fd)
        for fd in list(pending):
            k = fds[fd]
            if now - last[k] >= timeout:
                raise DDStoreTimeoutError(
                    f"load worker process {children[k][0]} has not finished {stuck(k, dots[k])} "
                    f"within {timeout:g} s (DDSTORE_LOAD_TIMEOUT_S)"
                )
    return answers


def _fork_children(workers: int, child: Callable[[int, int, int], None]) -> list:
    """Forks `workers` processes, each running child(w, command fd, answer fd) then os._exit;
    returns [(pid, command writer, answer reader)]."""
    children: list = []
    sys.stdout.flush()
    sys.stderr.flush()
    for w in range(workers):
        c_r, p_w = os.pipe()
        p_r, c_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child
            code = 0
            try:
                os.close(p_w)
                os.close(p_r)
                for _, pw, pr in children:
                    pw.close()
                    pr.close()
                child(w, c_r, c_w)
            except BaseException:  # noqa: BLE001 - the parent sees the pipe close
                code = 1
            finally:
                os._exit(code)
        os.close(c_r)
        os.close(c_w)
        children.append((pid, os.fdopen(p_w, "w"), os.fdopen(p_r, "r")))
    return children


def _end_children(children: list, finished: bool) -> None:
    """Closes the pipes (each child's loop ends) and reaps the children; after a failure they
    are killed first (one may be stuck in a read and never see its pipe close)."""
    for pid, pw, pr in children:
        if not finished:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        pw.close()
        pr.close()
    for pid, _, _ in children:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def _child_error(pid: int, answer: bytes, what: str) -> Exception | None:
    """The error a child's answer reports (None for "ok")."""
    import json

    from ._dataset import _rebuild_error

    if not answer:
        return DDStoreChildError(f"load worker process {pid} died while loading {what}")
    if answer == b"ok":
        return None
    kind, msg = json.loads(answer)
    if kind == "other":
        return DDStoreError(f"a load worker process failed: {msg.replace('rank -1: ', '', 1)}")
    return _rebuild_error((kind, msg))


def load_sliced_forked(
    reopen: Callable[[], Any],
    f: Field,
    bounds: list[tuple[int, int]],
    start: int,
    put: Callable[[Field, np.ndarray, int], None],
    convert: Callable[[Any, int, int], np.ndarray],
    workers: int,
    stats: LoadStats,
    progress: Progress,
    timeout: float,
) -> None:
    """Slices `bounds` of an array whose reads hold a lock (a compressed h5py dataset:
    decompression runs one slice at a time in one process) read by `workers` forked processes,
    each with its own handle (`reopen()` in the child), into a shared staging area of whole rows
    (~10% of the share, at least 16 MiB), round after round; this process copies each round into
    the share. Children never touch the store; a child that finishes no slice within
    `timeout` seconds (the store's DDSTORE_LOAD_TIMEOUT_S) is killed and named."""
    import json

    rb = max(1, f.row_bytes)
    total = sum(b - a for a, b in bounds)
    limit = max(MIN_WINDOW_BYTES, total * rb // 10, max((b - a) * rb for a, b in bounds) * workers)
    rounds: list[list[tuple[int, int]]] = [[]]
    used = 0
    for a, b in bounds:
        if rounds[-1] and used + (b - a) * rb > limit:
            rounds.append([])
            used = 0
        rounds[-1].append((a, b))
        used += (b - a) * rb
    staging = mmap.mmap(-1, max(1, limit))
    stats.window_bytes = limit

    def child(w: int, rfd: int, wfd: int) -> None:
        from pyddstore.torch._dataset import _error_payload

        arr = reopen()  # this process's own handle
        dst = np.frombuffer(staging, np.uint8)
        with os.fdopen(rfd, "r") as cmds:
            for line in cmds:
                k0, k1 = (int(x) for x in line.split())
                base = rounds[k0][0][0]
                try:
                    for a, b in rounds[k0][w::workers]:
                        rows = np.ascontiguousarray(convert(arr, a, b))
                        if rows.nbytes != (b - a) * rb:
                            raise DDStoreError(f"rows {a}..{b}: {rows.nbytes} bytes, expected {(b - a) * rb}")
                        dst[(a - base) * rb : (b - base) * rb] = rows.reshape(-1).view(np.uint8)
                        os.write(wfd, b".")
                    answer = b"ok\n"
                except BaseException as e:  # noqa: BLE001 - reported to the parent
                    answer = (json.dumps(list(_error_payload(e, -1))) + "\n").encode()
                while answer:
                    answer = answer[os.write(wfd, answer) :]

    children: list = []
    finished = False
    try:
        children = _fork_children(workers, child)
        for k, slices in enumerate(rounds):
            a0, b0 = slices[0][0], slices[-1][1]
            t0 = time.perf_counter()
            for _, pw, _ in children:
                pw.write(f"{k} {k + 1}\n")
                pw.flush()

            def stuck(w: int, done: int, slices=slices) -> str:
                a, b = slices[w::workers][min(done, len(slices[w::workers]) - 1)]
                return f"rows {a}..{b} of {f.key!r} (is the file system stuck?)"

            answers = _await_children(children, timeout, stuck)
            for (pid, _, _), answer in zip(children, answers):
                err = _child_error(pid, answer, f"rows {a0}..{b0}")
                if err is not None:
                    raise err
            t1 = time.perf_counter()
            n = b0 - a0
            rows = np.frombuffer(staging, f.store_dtype, n * rb // f.store_dtype.itemsize)
            put(f, rows.reshape(n, *f.store_shape), a0 - start)
            del rows
            stats.add(n * rb, (t1 - t0) * workers, time.perf_counter() - t1)
            progress.update(n * rb)
        finished = True
    finally:
        _end_children(children, finished)
        with contextlib.suppress(BufferError):
            staging.close()


def load_samples_forked(
    source: Any,
    schema: Schema,
    encode: Any,
    start: int,
    count: int,
    put: Callable[[Field, np.ndarray, int], None],
    workers: int,
    stats: LoadStats,
    progress: Progress,
    timeout: float,
) -> None:
    """Map-style sources that are not thread-safe (or whose decoding holds the GIL): `workers`
    forked processes fill a shared staging area of whole rows (at most ~10% of the share, at
    least 16 MiB), chunk after chunk, and this process copies each chunk into the share.
    Children never touch the store; each sends "ok" or its error through a pipe, and a child
    that dies is seen as the pipe's end; one that finishes no sample within `timeout` seconds
    (the store's DDSTORE_LOAD_TIMEOUT_S) is killed and named."""
    row_bytes = max(1, sum(f.row_bytes for f in schema.fixed_fields))
    rows = max(workers, min(count, max(MIN_WINDOW_BYTES, count * row_bytes // 10) // row_bytes))
    stats.window_bytes = rows * row_bytes
    staging = mmap.mmap(-1, max(1, rows * row_bytes))  # MAP_SHARED|MAP_ANONYMOUS: seen by the children
    filler = _staging_filler(schema, staging, rows)
    children: list = []
    finished = False
    try:
        children = _fork_children(
            workers,
            lambda w, rfd, wfd: _child_loop(rfd, wfd, w, workers, source, schema, encode, start, filler),
        )
        for a in range(0, count, rows):
            b = min(count, a + rows)
            t0 = time.perf_counter()
            for _, pw, _ in children:
                pw.write(f"{a} {b}\n")
                pw.flush()

            def stuck(k: int, done: int, a=a, b=b) -> str:
                i = start + a + k + done * workers
                return (
                    f"sample {i} (this rank's samples {start + a}..{start + b} were loading): "
                    f"is source[{i}] stuck?"
                )

            answers = _await_children(children, timeout, stuck)
            error = None
            for (pid, _, _), answer in zip(children, answers):
                error = error or _child_error(pid, answer, f"rows {a}..{b}")
            if error is not None:
                raise error
            t1 = time.perf_counter()
            for f, view in zip(schema.fixed_fields, filler.store_views(b - a)):
                put(f, view, a)
            stats.add((b - a) * row_bytes, (t1 - t0) * workers, time.perf_counter() - t1)
            progress.update((b - a) * row_bytes)
        finished = True
    finally:
        _end_children(children, finished)
        filler.bufs = []
        try:
            staging.close()
        except BufferError:
            pass
