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
