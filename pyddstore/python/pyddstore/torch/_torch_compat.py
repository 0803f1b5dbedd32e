"""The one module that names torch's private DataLoader API: ThreadDataLoader and its worker
processes are built from torch's iterator base, fetchers, collate table, pin-memory helper,
worker seeds, WorkerInfo and its per-process global (checked with torch>=2.6, `make
test-torch-min`). A torch release that moves one of these breaks this file only.

The iterators (_loader.py, _procloader.py) subclass BaseLoaderIter and so keep torch's
iterator protocol: they read the state its __init__ sets (``_dataset``, ``_dataset_kind``,
``_auto_collation``, ``_drop_last``, ``_index_sampler``, ``_num_workers``, ``_pin_memory``,
``_pin_memory_device``, ``_timeout``, ``_base_seed``) and override ``_reset``, ``_next_data``,
``_next_index`` and ``_shutdown_workers`` as torch's own multiprocessing iterator does.

torch.utils.data.get_worker_info() in ThreadDataLoader worker threads:

torch's ``get_worker_info`` returns ``torch.utils.data._utils.worker._worker_info``, a module
global that a worker *process* sets once; torch offers no per-thread hook. ThreadDataLoader's
workers are threads of one process, so while a loader's threads live (from its iterator's start to
its shutdown) that global holds a per-thread proxy (`ThreadWorkerInfo`) and torch's function,
whose code is left alone, answers through it, however the code reaches it (also a reference
bound by name before the loader started, ``from torch.utils.data import get_worker_info``):

- in a worker thread: that worker's WorkerInfo (id, num_workers, seed, dataset, rng);
- in any other thread *while worker threads live*: not None but one worker of one (id 0,
  num_workers 1, seed ``torch.initial_seed()``, dataset None; or the WorkerInfo of the torch
  worker process this loader runs in), so a dataset that shards by worker reads all of its
  samples there, and ``get_worker_info() is None`` is False;
- before the first and after the last loader's threads: torch's own value (None in the main
  process), put back by the last loader to stop. Importing pyddstore.torch changes nothing.

`pyddstore.torch.get_worker_info()` answers None outside worker threads at any time.
"""

from __future__ import annotations

import random
import threading
from typing import Any, Callable

import numpy as np
import torch
from torch._utils import ExceptionWrapper
from torch.utils.data import default_collate
from torch.utils.data._utils import collate as _collate
from torch.utils.data._utils import pin_memory as _pin
from torch.utils.data._utils import worker as _worker
from torch.utils.data.dataloader import _BaseDataLoaderIter, _DatasetKind

__all__ = [
    "BaseLoaderIter",
    "DatasetKind",
    "ExceptionWrapper",
    "IterableStop",
    "ManagerWatchdog",
    "ThreadWorkerInfo",
    "default_collate",
    "get_worker_info",
    "hook",
    "is_map_style",
    "pin_memory",
    "set_process_worker_info",
    "thread_collate",
    "thread_info",
    "thread_worker_info",
    "unhook",
    "without_worker_info",
    "worker_seed",
]

#: torch's DataLoader iterator base (state, _reset, __next__, len), subclassed by the iterators.
BaseLoaderIter = _BaseDataLoaderIter
#: Map or Iterable, and the fetcher of each (create_fetcher).
DatasetKind = _DatasetKind
#: What an iterable dataset's worker sends when its iterator is exhausted.
IterableStop = _worker._IterableDatasetStopIteration
#: Whether the main process is still alive, seen from a worker process.
ManagerWatchdog = _worker.ManagerWatchdog


def is_map_style(loader: Any) -> bool:
    """Whether a DataLoader's dataset is map-style (indices from its sampler)."""
    return loader._dataset_kind == _DatasetKind.Map


def worker_seed(base_seed: int, worker_id: int) -> Any:
    """The numpy seed torch gives worker `worker_id` of an iterator with this base seed."""
    return _worker._generate_state(base_seed, worker_id)


def pin_memory(data: Any, device: Any) -> Any:
    """A batch copied into pinned memory, as DataLoader(pin_memory=True) does."""
    return _pin.pin_memory(data, device)


def thread_worker_info(worker_id: int, num_workers: int, base_seed: int, dataset: Any) -> Any:
    """WorkerInfo of a worker thread, with the per-worker generators newer torch gives."""
    seed = base_seed + worker_id
    rng = None
    rng_type = getattr(_worker, "_RNG", None)
    if rng_type is not None:
        np_rng = np.random.default_rng(worker_seed(base_seed, worker_id))
        rng = rng_type(random.Random(seed), torch.Generator().manual_seed(seed), np_rng)
    try:
        return _worker.WorkerInfo(
            id=worker_id, num_workers=num_workers, seed=seed, dataset=dataset, rng=rng, worker_method="thread"
        )
    except TypeError:  # older torch: no rng / worker_method
        return _worker.WorkerInfo(id=worker_id, num_workers=num_workers, seed=seed, dataset=dataset)


def set_process_worker_info(worker_id: int, num_workers: int, seed: int, dataset: Any) -> None:
    """In a worker process: what torch.utils.data.get_worker_info() answers there."""
    _worker._worker_info = _worker.WorkerInfo(
        id=worker_id, num_workers=num_workers, seed=seed, dataset=dataset
    )


def without_worker_info(collate_fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """collate_fn run with get_worker_info() None: torch's and torch_geometric's collates then
    stack into plain memory, not a fresh shared-memory segment."""

    def collate(batch: Any) -> Any:
        saved, _worker._worker_info = _worker._worker_info, None
        try:
            return collate_fn(batch)
        finally:
            _worker._worker_info = saved

    return collate


def thread_collate(batch: Any) -> Any:
    """default_collate without shared-memory output tensors (pointless between threads)."""
    fn_map = dict(_collate.default_collate_fn_map)
    if fn_map.get(torch.Tensor) is _collate.collate_tensor_fn:
        fn_map[torch.Tensor] = _stack_tensors
    return _collate.collate(batch, collate_fn_map=fn_map)


def _stack_tensors(batch: Any, *, collate_fn_map: Any = None) -> torch.Tensor:
    elem = batch[0]
    if elem.is_nested or elem.layout != torch.strided:
        return _collate.collate_tensor_fn(batch, collate_fn_map=collate_fn_map)
    return torch.stack(batch, 0)


# -- get_worker_info() per thread -----------------------------------------------------------

#: This thread's WorkerInfo (`.info`) while it is a ThreadDataLoader worker.
thread_info = threading.local()

_lock = threading.Lock()
_users = 0
_saved: Any = None  # torch's own value while the proxy stands in for it


class ThreadWorkerInfo:
    """What torch's `_worker_info` holds while ThreadDataLoader worker threads live: in a worker
    thread that worker's WorkerInfo, in any other thread one worker of one (see the module)."""

    __slots__ = ()

    @staticmethod
    def _info() -> Any:
        info = getattr(thread_info, "info", None)
        if info is not None:
            return info
        if _saved is not None:
            return _saved
        return _worker.WorkerInfo(id=0, num_workers=1, seed=torch.initial_seed(), dataset=None)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._info(), name)

    def __repr__(self) -> str:
        return repr(self._info())


_PROXY = ThreadWorkerInfo()


def get_worker_info() -> Any:
    """torch.utils.data.get_worker_info(), aware of ThreadDataLoader worker threads: in a worker
    thread its WorkerInfo (id, num_workers, seed, dataset), elsewhere torch's own answer (None
    in the main process, also while a loader's worker threads run).

    Example:
        ```python
        from pyddstore.torch import get_worker_info

        info = get_worker_info()  # None in the main thread, the worker's info in a worker
        ```
    """
    info = getattr(thread_info, "info", None)
    if info is not None:
        return info
    torchs = _worker._worker_info
    return _saved if torchs is _PROXY else torchs


def hook() -> None:
    """A loader's worker threads start: torch's `_worker_info` answers per thread (the proxy)."""
    global _users, _saved
    with _lock:
        if _users == 0:
            _saved, _worker._worker_info = _worker._worker_info, _PROXY
        _users += 1


def unhook() -> None:
    """A loader's worker threads stopped: the last one puts torch's value back."""
    global _users, _saved
    with _lock:
        _users -= 1
        if _users == 0 and _worker._worker_info is _PROXY:
            _worker._worker_info, _saved = _saved, None
