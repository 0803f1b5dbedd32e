"""ThreadDataLoader: torch's DataLoader with worker threads instead of processes.

Everything that decides *what* is loaded (argument checks, sampler and batch sampler, the base
seed, len(), per-epoch iterators and persistent workers) is DataLoader's own code: this class
subclasses it and replaces only the iterator. Batches are handed to workers round-robin with
num_workers * prefetch_factor in flight, as torch's multiprocessing iterator does, so the same
arguments and seed give the same batches in the same order.
"""

from __future__ import annotations

import atexit
import os
import queue
import sys
import threading
import weakref
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from pyddstore import DDStoreTypeError, DDStoreValueError
from pyddstore._args import int_arg
from pyddstore._env import settings as _env_settings

from . import _procloader, _readahead, _resume
from . import _torch_compat as _tc
from ._dispatch import Dispatch, ResumeEpoch, Task, finish_last_epoch
from ._spans import profiled, span, trace_path

_STATUS_INTERVAL = 1.0  # seconds between checks that worker threads are alive
_EXIT_JOIN_S = 10.0  # how long interpreter exit waits for each worker thread's fetch in flight

# Iterators with worker threads. A daemon thread still inside a native read when the interpreter
# finalizes is killed where it takes the GIL back, in the middle of Rust frames (a crash at exit):
# at exit, before the stores close (atexit runs last-registered first), their workers are stopped.
_LIVE_THREAD_ITERS: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _stop_workers_at_exit() -> None:
    for it in list(_LIVE_THREAD_ITERS):
        it._shutdown_workers(join_timeout=_EXIT_JOIN_S)


# get_worker_info() per thread while a loader's worker threads live: see _torch_compat.
_thread_info = _tc.thread_info
_hook_worker_info = _tc.hook
_unhook_worker_info = _tc.unhook
get_worker_info = _tc.get_worker_info


def _affinity_sets(num_workers: int, settings: Any) -> list[set[int] | None]:
    """DDSTORE_AFFINITY_WIDTH CPUs per worker from the process's affinity, from
    DDSTORE_AFFINITY_OFFSET on (wrapping around); both from `settings`."""
    width = settings.affinity_width
    if width <= 0 or not hasattr(os, "sched_getaffinity"):
        return [None] * num_workers
    offset = settings.affinity_offset
    cpus = sorted(os.sched_getaffinity(0))
    return [{cpus[(offset + w * width + k) % len(cpus)] for k in range(width)} for w in range(num_workers)]


class _StopWorker:
    pass


class _BufferPool:
    """Reusable alloc() buffer sets (reuse_buffers=True): one per worker, registered once."""

    def __init__(self, dataset: Any, rows: int | None):
        self.dataset = dataset
        self.rows = rows
        self._free: list = []
        self._all: list = []
        self._lock = threading.Lock()

    def acquire(self) -> Any:
        with self._lock:
            if self._free:
                return self._free.pop()
        if self.rows is None:
            return None  # sized on first use (batch_sampler)
        bufs = self.dataset.alloc(self.rows)
        with self._lock:
            self._all.append(bufs)
        return bufs

    def fit(self, bufs: Any, n: int) -> Any:
        """A set holding at least n rows (grows sets when batches have no fixed size)."""
        if bufs is not None and bufs.rows >= n:
            return bufs
        if bufs is not None:
            self._drop(bufs)
        bufs = self.dataset.alloc(max(n, self.rows or 0))
        with self._lock:
            self._all.append(bufs)
        return bufs

    def _drop(self, bufs: Any) -> None:
        with self._lock:
            self._all = [b for b in self._all if b is not bufs]
        self.dataset.release(bufs)

    def give_back(self, bufs: Any) -> None:
        if bufs is not None:
            with self._lock:
                self._free.append(bufs)

    def release_all(self) -> None:
        with self._lock:
            sets, self._all, self._free = self._all, [], []
        for b in sets:
            self.dataset.release(b)


class _Fetcher:
    """Fetches, collates and pins one batch in a worker thread (or the calling thread)."""

    def __init__(self, it: Any, worker_id: int):
        self.it = it
        self.worker_id = worker_id
        self.dataset = it._dataset
        # Batches read straight into batch tensors take resident, reused memory from the batch
        # pool (_batchmem) with or without reuse_buffers: no alloc() buffer set to copy from.
        self.pool = None if it._direct else it._pool  # outlives the iterator: back on close()
        self.bufs = self.pool.acquire() if self.pool is not None else None
        self.iter_fetcher = None
        if it._dataset_kind == _tc.DatasetKind.Iterable:
            self.iter_fetcher = _tc.DatasetKind.create_fetcher(
                _tc.DatasetKind.Iterable,
                self.dataset,
                it._auto_collation,
                it._thread_collate_fn,
                it._drop_last,
            )

    def close(self) -> None:
        if self.pool is not None:
            self.pool.give_back(self.bufs)
            self.bufs = None

    def fetch(self, index: Any) -> Any:
        with span("pyddstore.loader.read_batch"):
            return self._fetch(index)

    def _fetch(self, index: Any) -> Any:
        it = self.it
        if self.iter_fetcher is not None:
            data = self.iter_fetcher.fetch(index)
        elif not it._auto_collation:
            data = it._thread_collate_fn(self.dataset[index])
        else:
            if it._direct:
                return self.dataset.read_batch(index, pin=it._pin_memory)
            out = None
            if self.pool is not None:
                out = self.bufs = self.pool.fit(self.bufs, len(index))
            if out is not None:
                samples = self.dataset.__getitems__(index, out=out)
            elif getattr(self.dataset, "__getitems__", None):
                samples = self.dataset.__getitems__(index)
            else:
                samples = [self.dataset[i] for i in index]
            data = it._thread_collate_fn(samples)
        if it._pin_memory:
            data = _tc.pin_memory(data, it._pin_memory_device)
        return data


class _ThreadIterBase(_resume.PositionTracking, _tc.BaseLoaderIter):
    def __init__(self, loader: ThreadDataLoader):
        super().__init__(loader)  # same sampler iterator and base seed draw as DataLoader's
        self._loader_ref = weakref.ref(loader)
        self._pool = loader._buffer_pool
        self._worker_init_fn = loader.worker_init_fn
        collate_fn = loader.collate_fn
        self._thread_collate_fn = _tc.thread_collate if collate_fn is _tc.default_collate else collate_fn
        self._direct = (
            collate_fn is _tc.default_collate
            and self._auto_collation
            and self._dataset_kind == _tc.DatasetKind.Map
            and getattr(self._dataset, "collates_directly", False) is True
            and loader._settings.fast_collate
        )
        self._device_index = None
        if torch.accelerator.is_available():
            self._device_index = torch.accelerator.current_device_index()
        loader._live_iterators.add(self)
        loader._resume.seed_iterator(self)  # before workers start: a resumed epoch's base seed

    def _reset(self, loader: Any, first_iter: bool = False) -> None:
        super()._reset(loader, first_iter)
        loader._resume.attach(self)  # position tracking for state_dict() (_resume.PositionTracking)


class _CallingThreadIter(_ThreadIterBase):
    """num_workers=0: batches are read in the calling thread, nothing is prefetched."""

    def __init__(self, loader: ThreadDataLoader):
        super().__init__(loader)
        self._fetcher: _Fetcher | None = None
        loader._resume.attach(self)

    def _next_data(self) -> Any:
        try:
            index = self._next_index()
        except StopIteration:
            self._shutdown_workers()  # the epoch is over: reused buffers go back to the pool
            raise
        if self._fetcher is None:
            self._fetcher = _Fetcher(self, 0)
        return self._fetcher.fetch(index)

    def _shutdown_workers(self) -> None:
        if self._fetcher is not None:
            self._fetcher.close()
            self._fetcher = None

    def __del__(self) -> None:
        self._shutdown_workers()


class _ThreadIter(_ThreadIterBase):
    """num_workers > 0: worker threads, num_workers * prefetch_factor batches in flight."""

    def __init__(self, loader: ThreadDataLoader):
        super().__init__(loader)
        self._dispatch = Dispatch(self._num_workers, loader.prefetch_factor, loader.in_order)
        self._result_queue: queue.Queue = queue.Queue()
        self._index_queues: list[queue.Queue] = []
        self._workers: list[threading.Thread] = []
        self._done = threading.Event()
        self._shutdown = False
        _LIVE_THREAD_ITERS.add(self)
        cpus = _affinity_sets(self._num_workers, loader._settings)
        _hook_worker_info()  # undone in _shutdown_workers
        self._hooked = True
        for wid in range(self._num_workers):
            q: queue.Queue = queue.Queue()
            t = threading.Thread(
                target=_worker_main,
                args=(weakref.proxy(self), wid, q, self._result_queue, self._done, cpus[wid]),
                name=f"ddstore-loader-{wid}",
                daemon=True,
            )
            self._index_queues.append(q)
            self._workers.append(t)
            t.start()
        self._read_ahead = _readahead.ReadAhead.for_loader(loader)  # spilled rows, staged ahead
        self._reset(loader, first_iter=True)

    def _reset(self, loader: Any, first_iter: bool = False) -> None:
        super()._reset(loader, first_iter)
        self._dispatch.reset()
        if not first_iter:  # persistent workers: what the last epoch left is dropped
            finish_last_epoch(self._index_queues, self._get_data)
        self._fill(first=True)

    def _fill(self, first: bool = False) -> None:
        """Sends tasks while fewer than num_workers * prefetch_factor are in flight."""
        while not self._dispatch.full() and self._try_put_index(first):
            pass

    def _try_put_index(self, first: bool = False) -> bool:
        wid = self._dispatch.worker()
        if wid is None:
            return False
        try:
            index = self._next_index()
        except StopIteration:
            return False
        if first and self._read_ahead is not None:
            # The epoch's first batches go to the workers at once, before any read-ahead:
            # their spilled rows are staged here first (many reads in flight), not read
            # one batch per worker.
            self._read_ahead.stage_now(index)
        self._index_queues[wid].put((self._dispatch.sent(wid), index))
        if self._read_ahead is not None:
            self._read_ahead.announce()
        return True

    def _get_data(self) -> tuple:
        waited = 0.0
        while True:
            step = _STATUS_INTERVAL if self._timeout <= 0 else min(_STATUS_INTERVAL, self._timeout - waited)
            try:
                with span("pyddstore.loader.wait"):
                    return self._result_queue.get(timeout=max(step, 1e-3))
            except queue.Empty:
                waited += step
                dead = [i for i, t in enumerate(self._workers) if not t.is_alive()]
                if dead and not self._shutdown:
                    self._shutdown_workers()
                    raise RuntimeError(
                        f"ThreadDataLoader worker thread(s) {dead} exited unexpectedly"
                    ) from None
                if self._timeout > 0 and waited >= self._timeout:
                    raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds") from None

    def _next_data(self) -> Any:
        try:
            task = self._dispatch.next_answer(self._get_data, self._dropped)
        except StopIteration:
            if not self._persistent_workers:
                self._shutdown_workers()
            raise
        return self._process_data(task)

    def _dropped(self, task: Task) -> None:
        """A task of a worker that ran out (iterable dataset): another takes its place."""
        self._fill()

    def _process_data(self, task: Task) -> Any:
        self._fill()
        data = task.answer
        if isinstance(data, _tc.ExceptionWrapper):
            data.reraise()
        return data

    def _shutdown_workers(self, join_timeout: float | None = None) -> None:
        """Stops the workers after their current fetch and waits for them (at most
        `join_timeout` seconds each, if given)."""
        if self._shutdown:
            return
        self._shutdown = True
        if getattr(self, "_read_ahead", None) is not None:
            self._read_ahead.close()
        if getattr(self, "_hooked", False):
            self._hooked = False
            _unhook_worker_info()
        self._done.set()
        for q in self._index_queues:
            q.put(_StopWorker())
        if sys.is_finalizing():
            return  # daemon threads: nothing to wait for while the interpreter exits
        me = threading.current_thread()
        for t in self._workers:
            if t is not me:
                t.join(join_timeout)

    def __del__(self) -> None:
        self._shutdown_workers()


def _worker_main(
    it: Any,
    wid: int,
    index_queue: queue.Queue,
    results: queue.Queue,
    done: threading.Event,
    cpus: set[int] | None,
) -> None:
    """One worker thread: fetch, collate and pin the batches sent to it, in order."""
    fetcher = None
    init_error = None
    try:
        dataset = it._dataset
        _thread_info.info = _tc.thread_worker_info(wid, it._num_workers, it._base_seed, dataset)
        if cpus:
            os.sched_setaffinity(0, cpus)  # pid 0: this thread only (Linux)
        if it._device_index is not None:
            torch.accelerator.set_device_index(it._device_index)
        if it._worker_init_fn is not None:
            it._worker_init_fn(wid)
        fetcher = _Fetcher(it, wid)
    except ReferenceError:
        return  # the iterator was collected before this thread started
    except Exception:  # noqa: BLE001 - reported with the first batch, as DataLoader does
        init_error = _tc.ExceptionWrapper(where=f"in ThreadDataLoader worker thread {wid}")
    try:
        while True:
            r = index_queue.get()
            if isinstance(r, _StopWorker):
                break
            if isinstance(r, ResumeEpoch):
                if fetcher is not None and fetcher.iter_fetcher is not None:
                    fetcher.close()
                    fetcher = _Fetcher(it, wid)
                results.put((r, None))
                continue
            if done.is_set():
                continue
            idx, index = r
            if init_error is not None:
                data, init_error = init_error, None
            elif fetcher is None:
                data = _tc.ExceptionWrapper(
                    (RuntimeError, RuntimeError("worker failed to start"), None),
                    where=f"in ThreadDataLoader worker thread {wid}",
                )
            else:
                try:
                    data = fetcher.fetch(index)
                    read_ahead = getattr(it, "_read_ahead", None)
                    if read_ahead is not None:
                        read_ahead.announce()  # the rows this batch took left room in the stage
                except StopIteration:
                    data = _tc.IterableStop(wid)
                except BaseException:  # noqa: BLE001 - re-raised in the caller
                    data = _tc.ExceptionWrapper(where=f"in ThreadDataLoader worker thread {wid}")
            results.put((idx, data))
            del data, idx, index, r
    except ReferenceError:
        pass  # the iterator was collected
    finally:
        if fetcher is not None:
            fetcher.close()
        _thread_info.info = None


class ThreadDataLoader(DataLoader):
    """torch.utils.data.DataLoader with worker threads instead of processes: safe with MPI and
    GPU buffers, and each thread reads through its own store reader.

    Takes every DataLoader argument; random draws (sampler, base seed) match DataLoader's.
    Fetch, collate and pin_memory run in the worker threads; num_workers=0 reads in the calling
    thread. torch.utils.data.get_worker_info() works inside the worker threads while they run (its
    rng holds per-thread generators; the global random generators are not reseeded, as they are
    shared); importing pyddstore.torch leaves torch untouched (see pyddstore.torch.get_worker_info).

    Batches read straight into batch tensors (a DistDataset without decode=, record or ragged
    fields, the default collate) land in resident, reused memory (pyddstore.torch._batchmem):
    a buffer returns to a pool once its batch is dropped. reuse_buffers=True: the same for
    those; on the per-sample path each worker reads into one dataset.alloc(batch_size) buffer
    set that it reuses, so the collate must copy: it needs batch_size with the default
    collate_fn, or collate_copies=True. close() waits for in-flight fetches and releases them.
    multiprocessing_context is accepted and ignored.

    worker_type="process": worker processes (fork, spawn or forkserver, from
    multiprocessing_context) instead of threads, for per-sample Python work (decode=, transforms)
    that needs more than one core. Each worker reads or collates every batch into a ring of
    shared-memory slots allocated once; batches arrive as views of the slot (pinned copies with
    pin_memory), and a slot is written again only once no view of its batch is left: a ring grows
    by a slot per batch the caller keeps and shrinks back once they are gone (reuse_buffers=True:
    it never grows, and holding all its slots raises). Methods 1 and 2 only. Workers that run
    nothing of the caller's (a DistDataset read straight into the slots, the default collate,
    no worker_init_fn) are kept between epochs even with persistent_workers=False: no fork of
    this process per epoch, the same batches and seed draws; close() stops them.

    state_dict() / load_state_dict() follow torchdata's StatefulDataLoader: a job that stops
    mid-epoch goes on with exactly the batches it would have yielded next (see the "Restarting
    jobs" guide). auto_epoch=True calls sampler.set_epoch() at the start of every iteration:
    the sampler's epoch first (0 unless set_epoch() was called), then one more each iteration,
    counting on from a loaded state; without it, epochs are torch's (yours to set).

    Args:
        dataset (Dataset): usually a DistDataset or DistDatasetReader; any map-style dataset works.
        reuse_buffers (bool): per-sample path: each worker reads into one `dataset.alloc(batch_size)`
            buffer set it reuses (batches must be copied by the collate_fn); direct batches are
            reused memory either way.
        collate_copies (bool): with reuse_buffers and a custom collate_fn: it copies what it keeps.
        worker_type (str): "thread" (the default) or "process" (worker processes, see above).
        auto_epoch (bool): call sampler.set_epoch() at the start of every iteration (see above).
        profile_batches (int): record the first iteration's first N batches with torch.profiler
            (pyddstore's spans; worker threads where torch can record every thread) and write
            them as a Chrome trace, `{profile_dir}/pyddstore-trace-rank{R}.json`. 0: no trace.
        profile_dir (str | os.PathLike): where profile_batches writes its trace.
        **kwargs (Any): every `torch.utils.data.DataLoader` argument (batch_size, sampler, num_workers,
            collate_fn, pin_memory, ...).

    Example:
        ```python
        loader = ThreadDataLoader(trainset, batch_size=128, sampler=sampler, num_workers=2,
                                  pin_memory=True)
        for x, y in loader:
            x = x.to("cuda", non_blocking=True)
        loader.close()
        ```
    """

    def __init__(
        self,
        dataset: Any,
        reuse_buffers: bool = False,
        collate_copies: bool = False,
        worker_type: str = "thread",
        auto_epoch: bool = False,
        profile_batches: int = 0,
        profile_dir: str | os.PathLike[str] = ".",
        **kwargs: Any,
    ):
        if worker_type not in _procloader.WORKER_TYPES:
            raise DDStoreValueError(f"worker_type={worker_type!r}: expected 'thread' or 'process'")
        if int_arg(profile_batches, "profile_batches") < 0:
            raise DDStoreValueError(f"profile_batches={profile_batches}: expected 0 (no trace) or more")
        self.worker_type = worker_type
        self.reuse_buffers = bool(reuse_buffers)
        self.collate_copies = bool(collate_copies)
        self._live_iterators: weakref.WeakSet = weakref.WeakSet()
        self._kept_iterator: Any = None  # process workers kept between epochs (keeps_workers)
        self._buffer_pool: _BufferPool | None = None
        # DDSTORE_FAST_COLLATE and DDSTORE_AFFINITY_*: the dataset's store's settings, else the
        # environment's, read once here.
        self._settings = getattr(getattr(dataset, "ddstore", None), "settings", None) or _env_settings()
        super().__init__(dataset, **kwargs)
        if self.reuse_buffers and worker_type == "thread":
            if not hasattr(dataset, "alloc") or not hasattr(dataset, "release"):
                raise DDStoreTypeError(
                    "reuse_buffers=True needs a DistDataset or DistDatasetReader (dataset.alloc)"
                )
            if isinstance(dataset, IterableDataset):
                raise DDStoreValueError("reuse_buffers=True needs a map-style dataset")
            default = self.collate_fn is _tc.default_collate
            if not self.collate_copies and (self.batch_size is None or not default):
                raise DDStoreValueError(
                    "reuse_buffers=True reuses each worker's buffers, so batches must be copies: it needs "
                    "batch_size= with the default collate_fn, or collate_copies=True for a collate_fn that "
                    "copies what it keeps"
                )
            self._buffer_pool = _BufferPool(dataset, self.batch_size)
        # Batches the read-ahead stages (DDSTORE_READ_AHEAD_BATCHES, or what the stages hold).
        self._read_ahead_batches = _readahead.batches_ahead(
            dataset, self.batch_size, self._settings.read_ahead_batches
        )
        self._resume = _resume.LoaderResume(self, auto_epoch)
        self._profile = (int(profile_batches), profile_dir)  # the first iteration's, then (0, ...)

    def __iter__(self) -> Any:
        self._resume.begin()  # a loaded state and auto_epoch apply before torch's iterator starts
        batches, where = self._profile
        if batches > 0:  # profile_batches: this iteration's first batches, once
            self._profile = (0, where)
            return profiled(super().__iter__, batches, trace_path(where, self.dataset))
        return super().__iter__()

    def state_dict(self) -> dict:
        """Where this loader is, as JSON data (torchdata's StatefulDataLoader protocol): the
        epoch, the batches and samples this rank's current iteration has yielded (batches
        prefetched by workers are not counted), the epoch's base seed and the sampler's state.

        Example:
            ```python
            torch.save({"model": model.state_dict(), "loader": loader.state_dict()}, "ckpt.pt")
            ```
        """
        return self._resume.state_dict()

    def load_state_dict(self, state_dict: dict, exact: bool = False) -> None:
        """Resumes at the next iteration from a state_dict(): it yields exactly the batches the
        uninterrupted run would have yielded next, in the same order (the same rank count).
        From another rank count (a pyddstore DistributedSampler; exact=False) the epoch's
        samples no rank has seen yet come once across the new ranks, then normal epochs.
        A state of another dataset (length or name), batch size, rank count with exact=True (or,
        with torch's own DistributedSampler, from inside an epoch on another rank count), a
        position past the epoch, a corrupted state or one from a later epoch than set_epoch()
        gave raises DDStoreValueError naming the field.
        ``{}`` loads nothing (torchdata).

        Args:
            state_dict (dict): what state_dict() returned (JSON data).
            exact (bool): refuse a state saved with another rank count.

        Example:
            ```python
            loader.load_state_dict(torch.load("ckpt.pt")["loader"])
            for batch in loader:  # the rest of the interrupted epoch
                ...
            ```
        """
        self._resume.load_state_dict(state_dict, exact)
        if self._iterator is not None:  # persistent workers: the next epoch starts afresh
            self._iterator._shutdown_workers()
            self._iterator = None
        if self._kept_iterator is not None:
            self._kept_iterator._shutdown_workers()
            self._kept_iterator = None

    def check_worker_number_rationality(self) -> None:
        """No warning: threads wait on reads, so more of them than CPUs is fine."""

    def _get_iterator(self) -> Any:
        if self.worker_type == "process" and self.num_workers > 0:
            # Worker processes that run nothing of the caller's are kept between epochs, even
            # without persistent_workers (see _procloader.keeps_workers).
            kept, self._kept_iterator = self._kept_iterator, None
            it = kept if kept is not None and kept.renew(self) else _procloader.ProcessIter(self)
            if it.kept:
                self._kept_iterator = it
            return it
        if self.num_workers == 0:
            return _CallingThreadIter(self)
        return _ThreadIter(self)

    def close(self) -> None:
        """Stops the workers (after their in-flight fetches) and releases reused buffers.

        Example:
            ```python
            loader.close()
            ```
        """
        for it in list(self._live_iterators):
            it._shutdown_workers()
        self._iterator = self._kept_iterator = None
        if self._buffer_pool is not None:
            self._buffer_pool.release_all()

    def __enter__(self) -> ThreadDataLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
