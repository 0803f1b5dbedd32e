"""torch.utils.data.get_worker_info() in ThreadDataLoader worker threads.

torch's ``get_worker_info`` returns a global of ``torch.utils.data._utils.worker`` that a worker
*process* sets once. ThreadDataLoader's workers are threads of one process, so while a loader's
threads live (from its iterator's start to its shutdown) torch's function runs code that answers
per thread: a worker thread's WorkerInfo, else torch's own variable (None outside worker
processes). The function object itself is kept (its code is swapped), so every reference to it
answers so, also one bound by name before the loader started
(``from torch.utils.data import get_worker_info``). The last loader to stop puts torch's code back
and removes the one name it added to torch's module; importing pyddstore.torch changes nothing.

A per-thread proxy stored in torch's variable instead would make ``get_worker_info() is None``
false in every other thread while a loader runs (the main thread, a ``num_workers=0`` loader
beside persistent ThreadDataLoader workers), breaking the usual ``if info is None`` test.
"""

from __future__ import annotations

import threading
from typing import Any

from torch.utils.data._utils import worker as _worker

#: This thread's WorkerInfo (`.info`) while it is a ThreadDataLoader worker.
thread_info = threading.local()

# The name under which torch's module sees `thread_info` while hooked.
_TORCH_GLOBAL = "_pyddstore_thread_worker_info"
_torch_function = _worker.get_worker_info
_torch_code = _torch_function.__code__
_lock = threading.Lock()
_users = 0


def _per_thread() -> Any:
    # Runs as torch's get_worker_info: these names resolve in torch's module.
    info = getattr(_pyddstore_thread_worker_info, "info", None)  # noqa: F821
    return info if info is not None else _worker_info  # noqa: F821


_per_thread_code = _per_thread.__code__.replace(co_name=_torch_code.co_name)


def get_worker_info() -> Any:
    """torch.utils.data.get_worker_info(), aware of ThreadDataLoader worker threads: in a worker
    thread its WorkerInfo (id, num_workers, seed, dataset), elsewhere torch's own answer.

    Example:
        ```python
        from pyddstore.torch import get_worker_info

        info = get_worker_info()  # None in the main thread, the worker's info in a worker
        ```
    """
    info = getattr(thread_info, "info", None)
    return info if info is not None else _worker._worker_info


def hook() -> None:
    """A loader's worker threads start: torch's get_worker_info answers per thread (unless
    something else replaced its code)."""
    global _users
    with _lock:
        if _users == 0 and _torch_function.__code__ is _torch_code:
            setattr(_worker, _TORCH_GLOBAL, thread_info)
            _torch_function.__code__ = _per_thread_code
        _users += 1


def unhook() -> None:
    """A loader's worker threads stopped: the last one puts torch's code back."""
    global _users
    with _lock:
        _users -= 1
        if _users == 0 and _torch_function.__code__ is _per_thread_code:
            _torch_function.__code__ = _torch_code
            delattr(_worker, _TORCH_GLOBAL)
