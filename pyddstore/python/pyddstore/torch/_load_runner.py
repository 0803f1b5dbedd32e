"""How a load keeps reads in flight (DDSTORE_LOAD_DEPTH, default 32) and what it reports.

Throughput from a parallel file system is decided by how many reads are in flight, not by their
order, so every load path keeps `depth` reads going, each at most MAX_READ_BYTES, all of them
within a window of about 10% of the share. This module holds those sizes, the worker threads
that run the reads, and what a load reports: LoadStats (per rank), Progress (MB/s and an ETA on
rank 0) and the summary line that says what limited the load.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Callable

MAX_READ_BYTES = 8 << 20  # one read of a file source
MIN_WINDOW_BYTES = 16 << 20  # the reads in flight may always hold this much
HELD_MAX_BYTES = 256 << 20  # samples a load holds in flight besides the share, at most


def load_depth(settings) -> int:
    """DDSTORE_LOAD_DEPTH of `settings` (a store's: reads in flight while loading;
    DDSTORE_LOAD_THREADS is the older name; the default is the settings table's)."""
    return settings.load_depth


def load_direct(settings) -> bool:
    """DDSTORE_LOAD_DIRECT=1 (of `settings`): read file sources and snapshots with O_DIRECT."""
    return settings.load_direct


def load_held_bytes(settings) -> int:
    """Bytes of samples a load may hold in flight besides the share (the load's bound, stated
    in the budget guide): 16 MiB plus a tenth of the memory budget (DDSTORE_MEMORY_LIMIT, a
    DistDataset's memory_limit=), at most 256 MiB, also without a budget; never less than one
    sample per reader in flight."""
    budget = settings.memory_limit
    if budget is None:
        return HELD_MAX_BYTES
    return min(HELD_MAX_BYTES, MIN_WINDOW_BYTES + budget // 10)


def bounded_depth(depth: int, held: int, per_reader: int, stats: LoadStats) -> int:
    """Readers in flight so that each holding `per_reader` bytes stays within `held` bytes
    (at least one, at most `depth`); a lowered depth is noted in the load's summary."""
    n = max(1, min(depth, held // max(1, per_reader)))
    if n < depth:
        stats.window_capped = True
        stats.window_bytes = n * per_reader
        stats.notes.append(
            f"{n} of {depth} readers in flight ({per_reader / 2**20:.1f} MiB each, within "
            f"{held / 2**20:.0f} MiB)"
        )
    return n


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
    cores = cpus()
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


def run_workers(n: int, work: Callable[[], None], stats: LoadStats | None = None) -> None:
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

    run_workers(threads, work, stats)


def window(
    depth: int,
    share_bytes: int,
    row_bytes: int,
    stats: LoadStats,
    rows: int | None = None,
    held: int = HELD_MAX_BYTES,
) -> int:
    """Rows per read so that depth reads in flight stay within ~10% of the share (at least
    16 MiB in all, at most `held`: load_held_bytes), at most 8 MiB each, whole rows; `rows`
    (chunk_size=) overrides."""
    if rows is not None:
        stats.window_bytes = rows * row_bytes * depth
        return rows
    limit = min(max(MIN_WINDOW_BYTES, share_bytes // 10), held)
    per_read = min(MAX_READ_BYTES, max(1, limit // max(1, depth)))
    # Capped only when the share did not fit in the window (a 40 KB share never is).
    stats.window_capped = per_read < MAX_READ_BYTES and limit < share_bytes
    rows = max(1, per_read // max(1, row_bytes))
    stats.window_bytes = rows * row_bytes * depth
    return rows


def cpus() -> int:
    """CPUs this process may run on (its affinity), for sizing worker pools."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def load_summary(name: str, n: int, size: int, stats: list[dict]) -> str:
    """One line for rank 0: sizes, time, MB/s in total and per rank, depth, what limited it."""
    total = sum(s["nbytes"] for s in stats)
    slowest = max(stats, key=lambda s: s["secs"])
    secs = max(slowest["secs"], 1e-9)
    notes = sorted({note for s in stats for note in s["notes"]})
    extra = f"; {', '.join(notes)}" if notes else ""
    return (
        f"pyddstore: {name}: {n} samples, {max(s['nbytes'] for s in stats) / 2**20:.1f} MiB per rank "
        f"({size} ranks), {secs:.2f} s, {rate_text(total / secs)} total, "
        f"{rate_text(total / size / secs)} per rank; {slowest['path']} path, "
        f"{slowest['workers']} reader(s) in flight; limited by {limit_of(slowest)}{extra}"
    )
