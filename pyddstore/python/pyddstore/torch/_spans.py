"""Spans named ``pyddstore.*`` in ``torch.profiler`` traces: the loader's batch reads and waits
and the store's load. ``record_function`` costs microseconds per call even with no profiler
running (measured 30 µs on a loaded 2-core machine), so a span is opened only while one runs.

Names: ``pyddstore.loader.read_batch`` (a worker thread, or a worker process, reads and collates
one batch), ``pyddstore.loader.wait`` (the training loop waits for the next batch),
``pyddstore.loader.unpack_batch`` (a worker process's batch becomes tensors in the loop's
process), ``pyddstore.load`` (a rank reads its share into the store, or restores it from a
snapshot) and ``pyddstore.load.agree`` (the ranks learn whether every load succeeded).
Spans of worker threads are recorded when the profiler records every thread
(``experimental_config=torch._C._profiler._ExperimentalConfig(profile_all_threads=True)``);
those of worker processes only by a profiler running in the worker.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

from torch.autograd import profiler as _profiler
from torch.profiler import record_function

_NO_SPAN = contextlib.nullcontext()  # stateless: one shared instance serves every call


def span(name: str) -> Any:
    """``record_function(name)`` while a torch profiler runs in this process, else a no-op."""
    # torch.profiler.profile sets this flag on start and clears it on stop (torch 2.x); without
    # it the span is always opened.
    if getattr(_profiler, "_is_profiler_enabled", True):
        return record_function(name)
    return _NO_SPAN


def all_threads() -> dict:
    """``profile()`` arguments that record every thread (ThreadDataLoader's worker threads
    too), where this torch has the option (experimental in torch 2.x); else none."""
    try:
        from torch._C._profiler import _ExperimentalConfig

        return {"experimental_config": _ExperimentalConfig(profile_all_threads=True)}
    except (ImportError, TypeError):
        return {}


def profiled(make_batches: Callable[[], Iterator], n: int, path: str) -> Iterator:
    """``make_batches()`` (a loader's iterator, made once the profiler runs, so its workers'
    first reads are recorded too) whose first `n` batches, their reads and waits (every thread
    where torch can), torch.profiler records and writes to `path` as a Chrome trace."""
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU], **all_threads())
    prof.start()
    try:
        batches = make_batches()
    except BaseException:
        prof.stop()
        raise
    return _recorded(prof, batches, n, path)


def _recorded(prof: Any, batches: Iterator, n: int, path: str) -> Iterator:
    try:
        for done, batch in enumerate(batches, 1):
            if done == n:
                prof.stop()
                prof.export_chrome_trace(path)
                prof = None
            yield batch
            if prof is None:
                yield from batches
                return
    finally:
        if prof is not None:  # fewer than n batches, or the loop stopped early
            prof.stop()
            prof.export_chrome_trace(path)


def trace_path(directory: Any, dataset: Any) -> str:
    """`directory`/pyddstore-trace-rank{R}.json, R the dataset's store rank (else 0)."""
    rank = getattr(getattr(dataset, "ddstore", None), "rank", 0)
    return os.path.join(os.fspath(directory), f"pyddstore-trace-rank{rank}.json")
