"""ThreadDataLoader(worker_type="process"): worker processes whose batches travel through a
ring of shared-memory slots allocated once per worker, instead of a fresh shared-memory tensor
per batch (what torch's DataLoader workers send).

The main process owns the rings' bookkeeping: it sends each task with the id of a free slot of
that worker; the worker reads (or fetches, transforms and collates) the batch, writes its tensors
and arrays into the slot and sends back only how many rows it read straight into the slot (a
DistDataset read with the default collate), or a small pickle that names the places of the
tensors and arrays in it. The main process rebuilds the batch as views of the slot (pinned
copies with pin_memory). Tasks and answers travel through a pipe per worker and direction,
written by the sender itself, and every message posts a semaphore the receiver sleeps on (see
_Line): one wake-up per batch at most, and none while the receiver is busy, where mp.Queues'
feeder threads cost about ten thread switches per batch and pipe wake-ups take a core from a
worker that goes on reading. A slot goes back to
the ring when the last view of its batch is gone (a finalizer on the array every view hangs
from), so no slot is handed out again while a batch still uses it. A ring holds
prefetch_factor + 2 slots (the batches in flight, the one the caller holds and the one being
handed over); when the caller keeps more batches, the ring grows by a slot for each, and such a
slot is dropped again once its batch is gone (reuse_buffers=True: the ring never grows, and a
caller holding all its slots gets a clear error). A worker allocates a slot's memory on its first
batch and again only when a batch does not fit (1.5x, rare with ragged samples); the memory
travels once, by file descriptor, as torch shares tensors.

Sampler, batch sampler, base seed, prefetching (num_workers * prefetch_factor batches in flight,
round-robin), persistent workers, worker_init_fn, get_worker_info, timeout and in_order follow
torch's multiprocessing iterator; exceptions in workers come back as torch's ExceptionWrapper and
are re-raised with the worker's traceback. Workers that run nothing of the caller's are kept for
the next iter(loader) even without persistent_workers (keeps_workers): a fork of a process
holding a large dataset costs more than a short epoch.
"""

from __future__ import annotations

import collections
import gc
import io
import math
import multiprocessing.connection as mp_connection
import os
import pickle
import random
import select
import signal
import time
import weakref
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import torch
import torch.multiprocessing as torch_mp

from pyddstore import DDStoreError, DDStoreValueError, Method

from . import _torch_compat as _tc
from ._dispatch import Dispatch, ResumeEpoch, Task, finish_last_epoch
from ._errors import ForkedWorkerError
from ._resume import PositionTracking
from ._spans import span

_STATUS_INTERVAL = 0.5  # seconds between checks that worker processes are alive
_WATCHDOG_INTERVAL = 2.0  # seconds an idle worker waits for a task before checking its parent
_FLUSH_INTERVAL = 0.01  # seconds between retries of tasks a full pipe did not take
_SHUTDOWN_GRACE = 10.0  # seconds workers get to stop before they are killed
_HEADER = 8  # bytes of a task message's length header
_SMALL_ANSWER = 16384  # bytes of an answer that the worker posts after writing it
_ALIGN = 64  # every tensor in a slot starts on a cache line
_GROWTH = 1.5  # a slot that is too small is replaced by one this much larger than needed
WORKER_TYPES = ("thread", "process")


class WorkerProcessError(DDStoreError, RuntimeError):
    """A ThreadDataLoader(worker_type="process") worker died (killed, crashed, or exited) while
    the loader waited on it; the message names the worker, its pid and how it ended.

    Example:
        ```python
        try:
            batch = next(it)
        except WorkerProcessError as e:
            print(e)  # "worker process 1 (pid 4242) was killed by signal SIGKILL ..."
        ```
    """


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def direct_batches(loader: Any) -> bool:
    """Whether the workers read each batch straight into their slot (a DistDataset that
    collates directly, the default collate, DDSTORE_FAST_COLLATE): no code of the caller's
    (collate_fn, decode=, transforms) runs in them then."""
    ds = loader.dataset
    return (
        loader.collate_fn is _tc.default_collate
        and loader._auto_collation
        and loader._dataset_kind == _tc.DatasetKind.Map
        and getattr(ds, "collates_directly", False) is True
        and hasattr(ds, "_read_into")
        and loader._settings.fast_collate
    )


def keeps_workers(loader: Any) -> bool:
    """persistent_workers=False, yet the workers are kept for the next iter(loader): nothing of
    the caller's runs in them (direct batches, no worker_init_fn), so a kept worker reads what a
    fresh one would, without a fork of this (perhaps large) process at every epoch. Each
    iter(loader) still draws its base seed and sampler iterator as torch's does."""
    return not loader.persistent_workers and loader.worker_init_fn is None and direct_batches(loader)


def check_process_args(loader: Any) -> None:
    """worker_type="process": refuses what worker processes cannot serve, before any starts."""
    store = getattr(loader.dataset, "ddstore", None)
    if getattr(store, "method", None) == Method.MPI_RMA:
        raise ForkedWorkerError(
            "ThreadDataLoader(worker_type='process') cannot serve a method=0 (MPI RMA) dataset: "
            "MPI does not reach worker processes; use worker_type='thread' (the default), or "
            "method=1 or 2, whose stores worker processes read through the fabric and same-node "
            "mappings"
        )


# -- the slot ring: worker side -------------------------------------------------------------


class _SlotWriter:
    """A worker's slots: their shared memory (allocated here, sent to the main process once)."""

    def __init__(self) -> None:
        self.memory: dict[int, torch.Tensor] = {}  # slot -> shared uint8 tensor
        self.registered: dict[int, list] = {}  # slot -> [(store, var, array)] registered

    def ensure(self, slot: int, nbytes: int) -> tuple[np.ndarray, torch.Tensor | None]:
        """The slot's bytes (at least nbytes), and its new memory when it had to be allocated."""
        mem = self.memory.get(slot)
        if mem is not None and mem.numel() >= nbytes:
            return mem.numpy(), None
        size = _aligned(max(nbytes, 1)) if mem is None else _aligned(int(nbytes * _GROWTH))
        grown = torch.empty(size, dtype=torch.uint8).share_memory_()
        if mem is not None:  # what was read there already stays (the old memory goes)
            grown[: mem.numel()].copy_(mem)
            self.unregister(slot)
        self.memory[slot] = grown
        return grown.numpy(), grown

    def unregister(self, slot: int) -> None:
        for store, var, arr in self.registered.pop(slot, []):
            store.unregister_recv(var, arr)


class _PackPickler(pickle.Pickler):
    """Pickles a batch with its CPU tensors and numeric arrays left out: each becomes a
    persistent id naming its place in the slot; the arrays are copied there afterwards (those
    already read into the slot stay where they are)."""

    def __init__(self, file: Any, slot_bytes: np.ndarray | None, start: int):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.places: list = []  # (value, offset) to copy into the slot
        self.size = start
        base = slot_bytes.__array_interface__["data"][0] if slot_bytes is not None else 0
        self._slot = (base, base + (slot_bytes.nbytes if slot_bytes is not None else 0))

    def _place(self, value: Any, ptr: int, nbytes: int) -> int:
        lo, hi = self._slot
        if nbytes and lo <= ptr and ptr + nbytes <= hi:
            return ptr - lo  # already in the slot (read there)
        off = self.size
        self.size = _aligned(off + nbytes)
        self.places.append((value, off))
        return off

    def persistent_id(self, obj: Any) -> Any:
        if type(obj) is torch.Tensor:
            if (
                obj.device.type != "cpu"
                or obj.layout != torch.strided
                or obj.is_nested
                or obj.requires_grad
                or obj.is_quantized
                or obj.is_conj()
                or obj.is_neg()
            ):
                return None  # pickled as torch pickles it
            if obj.is_contiguous():
                off = self._place(obj, obj.data_ptr(), obj.numel() * obj.element_size())
            else:
                off = self._place(obj, 0, obj.numel() * obj.element_size())
            return ("t", off, tuple(obj.shape), obj.dtype)
        if type(obj) in (np.ndarray, np.recarray) and not obj.dtype.hasobject:
            ptr = obj.__array_interface__["data"][0] if obj.flags.c_contiguous else 0
            off = self._place(obj, ptr, obj.nbytes)
            return ("a", off, obj.shape, obj.dtype, type(obj) is np.recarray)
        return None


def _copy_into(slot_bytes: np.ndarray, places: list) -> None:
    for value, off in places:
        if isinstance(value, torch.Tensor):
            nbytes = value.numel() * value.element_size()
            if nbytes:
                dst = torch.from_numpy(slot_bytes[off : off + nbytes]).view(value.dtype).view(value.shape)
                dst.copy_(value)
        elif value.nbytes:
            dst = slot_bytes[off : off + value.nbytes].view(np.uint8).view(value.dtype)
            dst.reshape(value.shape)[...] = value


def _pack(batch: Any, writer: _SlotWriter, slot: int, used: int = 0) -> tuple:
    """(pickled batch, the slot's new memory or None): the batch's arrays are in the slot, from
    byte `used` on (those before were read there)."""
    f = io.BytesIO()
    mem = writer.memory.get(slot)
    p = _PackPickler(f, mem.numpy() if mem is not None else None, used)
    p.dump(batch)
    new_memory = None
    if p.places:
        slot_bytes, new_memory = writer.ensure(slot, p.size)
        _copy_into(slot_bytes, p.places)
    return f.getvalue(), new_memory


def _direct_layout(fields: list, rows: int) -> tuple[list[int], int]:
    """Where each field's rows start in a slot that holds `rows` rows of every field, and the
    bytes the slot needs (the worker reads there, the main process views there)."""
    offsets, off = [], 0
    for f in fields:
        offsets.append(off)
        off = _aligned(off + rows * f.row_bytes)
    return offsets, off


class _DirectReader:
    """Reads a DistDataset batch straight into the slot (collates_directly datasets with the
    default collate): each field's rows land where the main process will view them, and each
    slot's field regions are registered with the store once."""

    def __init__(self, dataset: Any, batch_size: int | None):
        self.ds = dataset
        self.fields = dataset._select(None)
        self.rows = batch_size
        self.offsets, self.nbytes = _direct_layout(self.fields, batch_size or 0)

    def read(self, index: Any, writer: _SlotWriter, slot: int) -> tuple:
        """((rows read, rows the slot's layout holds), the slot's new memory or None)."""
        ds = self.ds
        rows = ds._rows(index)
        n = len(rows)
        if self.rows is None or n > self.rows:  # a batch sampler with larger batches
            self.__init__(ds, n)
            for s in list(writer.registered):
                writer.unregister(s)
        slot_bytes, new_memory = writer.ensure(slot, self.nbytes)
        ds._ensure_reader()
        if slot not in writer.registered:
            regs = []
            for f, off in zip(self.fields, self.offsets):
                view = slot_bytes[off : off + self.rows * f.row_bytes]
                ds._store.register_recv(f.var, view)
                regs.append((ds._store, f.var, view))
            writer.registered[slot] = regs
        for f, off in zip(self.fields, self.offsets):
            view = slot_bytes[off : off + n * f.row_bytes].view(f.dtype).reshape(n, *f.shape)
            ds._read_into(f, view, rows)
        return (n, self.rows), new_memory


# -- worker process ---------------------------------------------------------------------------


class _DropSlot:
    """Tells a worker to let go of a slot the ring grew by (its batch is gone)."""

    def __init__(self, slot: int):
        self.slot = slot


# -- messages: tasks (main process -> a worker) and answers (a worker -> the main process) ----


class _Pickler:
    """ForkingPickler (tensors' memory travels by file descriptor) made once: a fresh one per
    message copies the reducer table, several times the cost of pickling a task."""

    def __init__(self) -> None:
        self._buf = io.BytesIO()
        self._pickler = ForkingPickler(self._buf, pickle.HIGHEST_PROTOCOL)

    def frame(self, msg: Any) -> bytes:
        """msg pickled, behind its length (the bytes one message takes in a pipe)."""
        buf = self._buf
        buf.seek(0)
        buf.truncate()
        buf.write(bytes(_HEADER))
        self._pickler.clear_memo()
        self._pickler.dump(msg)
        buf.seek(0)
        buf.write((buf.getbuffer().nbytes - _HEADER).to_bytes(_HEADER, "little"))
        return buf.getvalue()


def _read_exact(fd: int, n: int) -> bytes:
    parts = []
    while n:
        part = os.read(fd, n)
        if not part:
            raise EOFError("the other end of a loader pipe closed")
        parts.append(part)
        n -= len(part)
    return b"".join(parts)


def _read_message(fd: int) -> Any:
    """The next framed message in the pipe `fd` (blocks until it is whole)."""
    n = int.from_bytes(_read_exact(fd, _HEADER), "little")
    return pickle.loads(_read_exact(fd, n))


class _Line:
    """One direction between the main process and its workers: a pipe per worker carries the
    messages, and a semaphore is posted once per message (one for each worker's tasks, one
    for the answers of every worker). Receivers sleep on the semaphore, never on a pipe: a
    pipe write wakes its reader as a "sync" wake-up, which the kernel answers by moving the
    reader to the writer's core, where it takes the core from a worker that goes on reading
    (measured on the busy 2-core machine: 1-9 ms lost per batch, several times its read); a
    semaphore post wakes the sleeper where it can run, and costs no system call when no one
    sleeps. (mp.Queue avoids it with a feeder thread per queue, at several thread switches
    and GIL hand-overs per batch.)"""

    def __init__(self, conn: Any, posted: Any):
        self.conn = conn  # owns the descriptor (passed to spawned workers as a Connection)
        self.posted = posted

    def receive(self, timeout: float) -> Any:
        """Worker side: the next task, or _NO_TASK after `timeout` seconds without one."""
        if not self.posted.acquire(timeout=timeout):
            return _NO_TASK
        return _read_message(self.conn.fileno())

    def send(self, pickler: _Pickler, msg: Any) -> None:
        """Worker side: sends an answer (blocks only while a large one fills the pipe)."""
        data = pickler.frame(msg)
        if len(data) <= _SMALL_ANSWER:  # the pipe takes it whole: posted once it is there
            _write_all(self.conn.fileno(), data)
            self.posted.release()
        else:  # posted first: the main process reads it as it is written
            self.posted.release()
            _write_all(self.conn.fileno(), data)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


_NO_TASK = object()


def _worker_loop(
    wid: int,
    num_workers: int,
    dataset: Any,
    dataset_kind: Any,
    auto_collation: bool,
    collate_fn: Any,
    drop_last: bool,
    direct_rows: Any,
    base_seed: int,
    init_fn: Any,
    tasks: Any,
    answers: Any,
    done_event: Any,
    populate: bool,
) -> None:
    """One worker process: fetch (or read straight into the slot) the batches sent to it. A
    worker that outlives its epoch (`populate`) first maps the dataset's same-node shares into
    its page tables (DistDataset._populate_node_shares): it will read most of their pages."""
    init_error = None
    fetcher = direct = None
    writer = _SlotWriter()
    try:
        torch.set_num_threads(1)
        seed = base_seed + wid
        random.seed(seed)
        torch.manual_seed(seed)
        np.random.seed(_tc.worker_seed(base_seed, wid))
        _tc.set_process_worker_info(wid, num_workers, seed, dataset)
        if init_fn is not None:
            init_fn(wid)
        if populate and hasattr(dataset, "_populate_node_shares"):
            dataset._populate_node_shares()
        if collate_fn is _tc.default_collate:
            collate_fn = _tc.thread_collate
        collate_fn = _tc.without_worker_info(collate_fn)
        if direct_rows is not False:
            direct = _DirectReader(dataset, direct_rows)
        else:
            fetcher = _tc.DatasetKind.create_fetcher(
                dataset_kind, dataset, auto_collation, collate_fn, drop_last
            )
    except Exception:  # noqa: BLE001 - reported with the first batch, as DataLoader does
        init_error = _tc.ExceptionWrapper(where=f"in ThreadDataLoader worker process {wid}")
    watchdog = _tc.ManagerWatchdog()
    pickler = _Pickler()
    iteration_end = False
    while watchdog.is_alive():
        try:
            r = tasks.receive(_WATCHDOG_INTERVAL)
        except (EOFError, OSError):
            break
        if r is _NO_TASK:
            if done_event.is_set():  # shutting down and every task read
                break
            continue
        if r is None:
            break
        if isinstance(r, _DropSlot):
            writer.unregister(r.slot)
            writer.memory.pop(r.slot, None)
            continue
        if isinstance(r, ResumeEpoch):
            iteration_end = False
            if fetcher is not None:
                fetcher = _tc.DatasetKind.create_fetcher(
                    dataset_kind, dataset, auto_collation, collate_fn, drop_last
                )
            answers.send(pickler, (r, None))
            continue
        if done_event.is_set() or iteration_end:
            continue
        idx, slot, index = r
        if init_error is not None:
            data, init_error = init_error, None
        else:
            try:
                with span("pyddstore.loader.read_batch"):  # in a trace this worker records
                    if direct is not None:
                        data = direct.read(index, writer, slot)
                    else:
                        batch = fetcher.fetch(index)
                        data = _pack(batch, writer, slot)
                        del batch
            except StopIteration:
                data = _tc.IterableStop(wid)
                iteration_end = True
            except Exception:  # noqa: BLE001 - re-raised in the main process
                data = _tc.ExceptionWrapper(where=f"in ThreadDataLoader worker process {wid}")
        try:
            answers.send(pickler, (idx, data))  # blocks only while the main process is not reading
        except OSError:  # the main process is gone
            break
        del data, r, index
    answers.conn.close()


# -- main process -----------------------------------------------------------------------------


class _Ring:
    """The main process's view of one worker's slots: their memory and which are free.

    A finalizer puts a slot back on `free` when the last view of its batch is gone; it may run
    in any thread (deque appends are atomic). Slots from `base` on are extra ones, made while
    the caller kept batches, and dropped once free."""

    def __init__(self, base: int):
        self.base = base
        self.free: collections.deque = collections.deque(range(base))
        self.memory: dict[int, np.ndarray] = {}
        self.next_slot = base
        self.peak_bytes = 0

    def new_slot(self) -> int:
        slot, self.next_slot = self.next_slot, self.next_slot + 1
        return slot

    def extra_free(self) -> list[int]:
        """Extra slots now free, taken off the free list."""
        extra = [s for s in list(self.free) if s >= self.base]
        for s in extra:
            self.free.remove(s)
            self.memory.pop(s, None)
        return extra

    def nbytes(self) -> int:
        return sum(m.nbytes for m in self.memory.values())

    def note(self, slot: int, memory: np.ndarray) -> None:
        self.memory[slot] = memory
        self.peak_bytes = max(self.peak_bytes, self.nbytes())


class _TaskSender:
    """The main process's end of one worker's task line (_Line). Writes never block (the end
    is non-blocking): what a full pipe does not take waits here, in order, and goes on with
    flush(), so a busy or hung worker never stalls the main process (timeout= holds) and a
    worker blocked sending an answer never waits on a main process blocked sending a task.
    A task is posted once its first bytes are in the pipe (the worker reads the rest as it
    comes)."""

    def __init__(self, conn: Any, posted: Any):
        self.conn = conn  # owns the descriptor
        self.posted = posted
        self.fd = conn.fileno()
        os.set_blocking(self.fd, False)
        self.backlog: collections.deque = collections.deque()  # [bytes not written, posted]
        self._pickler = _Pickler()

    def put(self, msg: Any) -> None:
        self.backlog.append([memoryview(self._pickler.frame(msg)), False])
        self.flush()

    def flush(self) -> None:
        while self.backlog:
            item = self.backlog[0]
            try:
                n = os.write(self.fd, item[0])
            except BlockingIOError:
                return
            except OSError:  # the worker is gone (the loader's wait reports it)
                self.backlog.clear()
                return
            if not item[1]:
                item[1] = True
                self.posted.release()
            if n < len(item[0]):
                item[0] = item[0][n:]
                return
            self.backlog.popleft()

    def close(self) -> None:
        self.backlog.clear()
        self.conn.close()


class _ViewUnpickler(pickle.Unpickler):
    """Rebuilds a packed batch: views of the slot (pinned copies with pin)."""

    def __init__(self, data: bytes, anchor: np.ndarray, pin: bool):
        super().__init__(io.BytesIO(data))
        self.anchor, self.pin = anchor, pin

    def persistent_load(self, pid: Any) -> Any:
        kind, off, shape = pid[0], pid[1], pid[2]
        if kind == "t":
            dtype = pid[3]
            nbytes = math.prod(shape) * dtype.itemsize
            if nbytes == 0:
                return torch.empty(shape, dtype=dtype)
            view = torch.from_numpy(self.anchor[off : off + nbytes]).view(dtype).view(shape)
            if self.pin:
                return torch.empty(shape, dtype=dtype, pin_memory=True).copy_(view)
            return view
        dtype, rec = pid[3], pid[4]
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes == 0:
            arr = np.empty(shape, dtype=dtype)
        else:
            arr = self.anchor[off : off + nbytes].view(dtype).reshape(shape)
            if self.pin:
                arr = arr.copy()
        return arr.view(np.recarray) if rec else arr


class ProcessIter(PositionTracking, _tc.BaseLoaderIter):
    """ThreadDataLoader(worker_type="process") with num_workers > 0."""

    def __init__(self, loader: Any):
        super().__init__(loader)  # same sampler iterator and base seed draw as DataLoader's
        check_process_args(loader)
        loader._resume.seed_iterator(self)  # before workers start: a resumed epoch's base seed
        self._dispatch = Dispatch(self._num_workers, loader.prefetch_factor, loader.in_order)
        self._grow = not loader.reuse_buffers
        # The batches in flight, the one the caller holds and the one being handed over.
        self._slots = loader.prefetch_factor + 2
        ctx = loader.multiprocessing_context or torch_mp
        self._context_name = ctx.get_start_method() if hasattr(ctx, "get_start_method") else "fork"
        ds = self._dataset
        direct = direct_batches(loader)
        direct_rows = loader.batch_size if direct else False
        self._direct_fields = ds._select(None) if direct else None
        # Kept for the next iter(loader) (see keeps_workers): the end of an epoch stops nothing.
        self.kept = keeps_workers(loader)
        self._persistent_workers = self._persistent_workers or self.kept
        self._epoch_over = False
        self._direct_layouts: dict = {}  # rows a slot holds -> each field's offset in it
        self._rings = [_Ring(self._slots) for _ in range(self._num_workers)]
        self._done_event = ctx.Event()
        self._index_queues: list[_TaskSender] = []  # (the name finish_last_epoch uses)
        self._answers: list = []  # each worker's answer pipe
        self._answers_posted = ctx.Semaphore(0)  # one post per answer of any worker
        self._answer_poll = select.poll()  # the answer pipes, polled without sleeping
        self._answer_wid: dict[int, int] = {}  # answer pipe descriptor -> worker
        self._workers: list = []
        self._shutdown = False
        try:
            for wid in range(self._num_workers):
                task_r, task_w = ctx.Pipe(duplex=False)
                answer_r, answer_w = ctx.Pipe(duplex=False)
                tasks_posted = ctx.Semaphore(0)
                self._index_queues.append(_TaskSender(task_w, tasks_posted))
                self._answers.append(answer_r)
                self._answer_wid[answer_r.fileno()] = wid
                self._answer_poll.register(answer_r, select.POLLIN)
                w = ctx.Process(
                    target=_worker_loop,
                    args=(
                        wid,
                        self._num_workers,
                        ds,
                        self._dataset_kind,
                        self._auto_collation,
                        loader.collate_fn,
                        self._drop_last,
                        direct_rows,
                        self._base_seed,
                        loader.worker_init_fn,
                        _Line(task_r, tasks_posted),
                        _Line(answer_w, self._answers_posted),
                        self._done_event,
                        self._persistent_workers,
                    ),
                    name=f"ddstore-loader-{wid}",
                    daemon=True,
                )
                w.start()
                self._workers.append(w)
                task_r.close()  # the worker's ends: only the worker holds them now
                answer_w.close()
        except BaseException:
            self._shutdown_workers()
            raise
        loader._live_iterators.add(self)
        self._reset(loader, first_iter=True)

    @property
    def ring_bytes(self) -> int:
        """Shared memory of every worker's slot ring now, in bytes."""
        return sum(r.nbytes() for r in self._rings)

    @property
    def ring_peak_bytes(self) -> int:
        """The most shared memory each worker's ring held at once, summed over the workers."""
        return sum(r.peak_bytes for r in self._rings)

    def renew(self, loader: Any) -> bool:
        """A kept iterator (keeps_workers) starts the next iter(loader) as a new iterator would:
        its sampler iterator and base seed are drawn as torch draws them, its workers stay.
        False (and its workers stopped, if its epoch is over) when it cannot: its epoch is not
        over (the caller may still use it), a worker or the dataset is gone, or the loader no
        longer reads batches straight into the slots."""
        if not self._epoch_over:
            return False
        if self._shutdown or not keeps_workers(loader) or getattr(self._dataset, "_freed", False):
            self._shutdown_workers()
            return False
        if self._dead_workers() or self._dataset._select(None) != self._direct_fields:
            self._shutdown_workers()
            return False
        self._sampler_iter = iter(self._index_sampler)  # as _BaseDataLoaderIter.__init__ draws
        self._base_seed = torch.empty((), dtype=torch.int64).random_(generator=loader.generator).item()
        loader._resume.seed_iterator(self)
        self._reset(loader)
        return True

    def _reset(self, loader: Any, first_iter: bool = False) -> None:
        super()._reset(loader, first_iter)
        self._epoch_over = False
        loader._resume.attach(self)  # skips what a loaded state yielded, then counts (state_dict)
        left = self._dispatch.tasks  # what the last epoch left in flight or unread
        self._dispatch.reset()
        self._pending: tuple | None = None  # (index, wid) waiting for a free slot
        if not first_iter:

            def keep(idx: int, data: Any) -> None:  # its slot and memory are freed below
                left[idx].answer = data

            # persistent workers: what the last epoch left is dropped
            finish_last_epoch(self._index_queues, self._get_data, keep)
            for task in left.values():
                self._take_memory(task)
        self._fill()

    def _take_memory(self, task: Task) -> None:
        """A result that will not be handed out: note its new memory, free its slot."""
        if task.answered and type(task.answer) is tuple:  # a batch: (payload, new memory)
            self._note_memory(task.wid, task.slot, task.answer[1])
        if task.answered:  # (a task never answered keeps its slot: its worker may write it)
            self._rings[task.wid].free.append(task.slot)

    def _note_memory(self, wid: int, slot: int, memory: Any) -> None:
        if memory is not None:
            self._rings[wid].note(slot, memory.numpy())

    def _fill(self) -> None:
        """Sends tasks while fewer than num_workers * prefetch_factor are in flight and slots
        are free."""
        for wid, ring in enumerate(self._rings):
            for slot in ring.extra_free():
                self._index_queues[wid].put(_DropSlot(slot))
        while not self._dispatch.full() and self._try_put_index():
            pass

    def _try_put_index(self) -> bool:
        if self._pending is None:
            wid = self._dispatch.worker()
            if wid is None:
                return False
            try:
                index = self._next_index()
            except StopIteration:
                return False
            self._pending = (index, wid)
        index, wid = self._pending
        ring = self._rings[wid]
        if ring.free:
            slot = ring.free.popleft()
        elif self._grow:  # the caller keeps batches: one more slot while it does
            slot = ring.new_slot()
        else:
            return False
        self._pending = None
        self._index_queues[wid].put((self._dispatch.sent(wid, slot), slot, index))
        return True

    def _dead_workers(self) -> list[str]:
        out = []
        for wid, w in enumerate(self._workers):
            if w.is_alive():
                continue
            code = w.exitcode
            if code is not None and code < 0:
                try:
                    how = f"was killed by signal {signal.Signals(-code).name}"
                except ValueError:
                    how = f"was killed by signal {-code}"
            else:
                how = f"exited with code {code}"
            out.append(f"worker process {wid} (pid {w.pid}) {how}")
        return out

    def _get_data(self) -> tuple:
        """The next answer of any worker (the one whose batch is handed out next first)."""
        # The span is opened even when an answer is already posted (a zero-length wait), as the
        # thread workers' loop does: a trace shows one wait per batch, however fast the workers.
        with span("pyddstore.loader.wait"):
            if not self._answers_posted.acquire(False):
                self._wait_posted()
        # A posted answer is in a pipe (or, a large one, on its way into it).
        ready = [self._answer_wid[fd] for fd, _ in self._answer_poll.poll(0)]
        while not ready:  # a large answer posted before it is written: wait for its first bytes
            got = mp_connection.wait(self._answers + [w.sentinel for w in self._workers], _STATUS_INTERVAL)
            ready = [wid for wid, conn in enumerate(self._answers) if conn in got]
            if got and not ready:
                self._worker_died()
        task = self._dispatch.tasks.get(self._dispatch.rcvd_idx)
        return self._receive(task.wid if task is not None and task.wid in ready else ready[0])

    def _wait_posted(self) -> None:
        """Sleeps until a worker posts an answer; raises when a worker dies or timeout= runs
        out first."""
        deadline = time.monotonic() + self._timeout if self._timeout > 0 else None
        while True:
            for sender in self._index_queues:
                sender.flush()
            step = _FLUSH_INTERVAL if any(s.backlog for s in self._index_queues) else _STATUS_INTERVAL
            if deadline is not None:
                step = min(step, max(deadline - time.monotonic(), 0.0))
            if self._answers_posted.acquire(timeout=step):
                return
            if self._dead_workers():
                self._worker_died()
            if deadline is not None and time.monotonic() >= deadline:
                self._shutdown_workers()
                raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds")

    def _receive(self, wid: int) -> tuple:
        try:
            return _read_message(self._answers[wid].fileno())
        except (EOFError, OSError):  # it died after its last answer
            self._workers[wid].join(timeout=_SHUTDOWN_GRACE)
            self._worker_died()

    def _worker_died(self) -> None:
        dead = self._dead_workers() or ["a worker process closed its answer pipe"]
        self._shutdown_workers()
        raise WorkerProcessError(
            f"ThreadDataLoader(worker_type='process'): {'; '.join(dead)} while the loader "
            f"waited for batch {self._dispatch.rcvd_idx} ({self._context_name} workers; a killed "
            "worker is often the kernel's out-of-memory killer: see dmesg)"
        ) from None

    def _next_data(self) -> Any:
        while True:
            self._fill()
            try:
                return self._process_data(self._dispatch.next_answer(self._get_data, self._dropped))
            except StopIteration:
                if self._pending is not None:
                    self._no_free_slot()
                    continue
                self._epoch_over = True
                if not self._persistent_workers:
                    self._shutdown_workers()
                raise

    def _dropped(self, task: Task) -> None:
        """A task of a worker that stopped (iterable dataset): its slot is free."""
        self._rings[task.wid].free.append(task.slot)

    def _no_free_slot(self) -> None:
        """Every task is done but the next one has no free slot: batches the caller still holds
        keep them. Collect garbage once (cycles), else say so."""
        gc.collect()
        wid = self._pending[1]
        if self._rings[wid].free:
            return
        raise DDStoreValueError(
            f"ThreadDataLoader(worker_type='process', reuse_buffers=True): the batches still "
            f"referenced hold all {self._slots} slots of worker {wid}'s ring, so no batch can be "
            "read: keep copies (batch.clone()) of batches you keep, or use reuse_buffers=False"
        )

    def _process_data(self, task: Task) -> Any:
        with span("pyddstore.loader.unpack_batch"):
            return self._unpack(task)

    def _unpack(self, task: Task) -> Any:
        wid, slot, data = task.wid, task.slot, task.answer
        if isinstance(data, _tc.ExceptionWrapper):
            self._rings[wid].free.append(slot)
            self._fill()
            data.reraise()
        payload, memory = data
        self._note_memory(wid, slot, memory)
        ring = self._rings[wid]
        # One array per batch that every view hangs from: numpy views of it keep it as their
        # base (its own base is a memoryview, not an array), torch.from_numpy keeps the view.
        anchor = np.frombuffer(memoryview(ring.memory[slot]), dtype=np.uint8)
        weakref.finalize(anchor, ring.free.append, slot)
        if type(payload) is tuple:  # (rows, rows the slot holds): read straight into the slot
            batch = self._direct_batch(anchor, *payload)
        else:
            batch = _ViewUnpickler(payload, anchor, self._pin_memory).load()
        del anchor  # with pinned copies, the slot is free again now
        self._fill()
        return batch

    def _direct_batch(self, anchor: np.ndarray, rows: int, capacity: int) -> Any:
        """The batch _DirectReader read into the slot: a tensor per field, as read_batch()
        makes it (views of the slot, or pinned copies)."""
        fields = self._direct_fields
        offsets = self._direct_layouts.get(capacity)
        if offsets is None:
            offsets = self._direct_layouts[capacity] = _direct_layout(fields, capacity)[0]
        got = {}
        for f, off in zip(fields, offsets):
            view = anchor[off : off + rows * f.row_bytes].view(f.dtype).reshape(rows, *f.shape)
            t = torch.from_numpy(view)
            if self._pin_memory:
                t = torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t)
            got[f.key] = t
        return self._dataset._schema.collate_like(got)

    def _shutdown_workers(self) -> None:
        """Stops the workers after their current batch (killing any that do not stop in
        _SHUTDOWN_GRACE seconds); answers still coming are read and dropped meanwhile, so no
        worker stays blocked sending one."""
        if self._shutdown:
            return
        self._shutdown = True
        self._done_event.set()
        for sender in self._index_queues:
            sender.put(None)
        deadline = time.monotonic() + _SHUTDOWN_GRACE
        open_answers = list(self._answers)
        while time.monotonic() < deadline:
            live = [w for w in self._workers if w.is_alive()]
            if not live:
                break
            for sender in self._index_queues:
                sender.flush()
            ready = mp_connection.wait(open_answers + [w.sentinel for w in live], _FLUSH_INTERVAL)
            for conn in open_answers[:]:
                if conn in ready and not os.read(conn.fileno(), 1 << 16):  # dropped; b"": closed
                    open_answers.remove(conn)
        for w in self._workers:
            if w.is_alive():
                w.kill()
            w.join(timeout=_SHUTDOWN_GRACE)
        for sender in self._index_queues:
            sender.close()
        for conn in self._answers:
            conn.close()

    def __del__(self) -> None:
        if not getattr(self, "_shutdown", True):
            self._shutdown_workers()
