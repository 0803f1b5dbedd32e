"""Batch memory: the host memory that batch tensors are read into (read_batch(), and so
ThreadDataLoader's batches).

A fresh tensor per batch costs a page fault per 4 KiB page before the read can copy into it (a
58.6 MB batch: about 14,300 faults, several times the copy itself). Batches of at least
POOL_MIN_BYTES therefore come from a pool of buffers that are faulted in once, when they are
made, and backed by transparent huge pages where the kernel gives them (`madvise(MADV_HUGEPAGE)`,
2 MiB aligned). A batch tensor is a view of one buffer; when the last reference to the tensor's
memory goes (the user dropped the batch, or `.to(device)` made a copy and the host batch went),
its buffer returns to the pool and the next batch of the same size reuses it. The pool keeps at
most KEEP_FREE idle buffers per size; others are unmapped.

Smaller batches come from torch's allocator (malloc reuses their blocks); pinned batches
(pin_memory=True) from torch's pinned-memory cache, which already reuses its blocks and knows
when an asynchronous copy from one is still running.
"""

from __future__ import annotations

import collections
import math
import mmap
import weakref

import numpy as np
import torch

POOL_MIN_BYTES = 1 << 20  # batches from this size on come from the pool
HUGE_PAGE = 2 << 20  # a transparent huge page (x86-64, aarch64 with 4 KiB pages)
KEEP_FREE = 6  # idle buffers kept per size (a loader's batches in flight, and one held)


class _Buffer:
    """One anonymous mapping of `nbytes` (a multiple of HUGE_PAGE), 2 MiB aligned, faulted in."""

    def __init__(self, nbytes: int):
        self._map = mmap.mmap(-1, nbytes + HUGE_PAGE)
        with_pad = np.frombuffer(self._map, dtype=np.uint8)
        skip = -with_pad.ctypes.data % HUGE_PAGE
        self.array = with_pad[skip : skip + nbytes]
        if hasattr(mmap, "MADV_HUGEPAGE"):
            try:
                self._map.madvise(mmap.MADV_HUGEPAGE, skip, nbytes)
            except OSError:
                pass  # THP off ("never") or unsupported: 4 KiB pages, still faulted in once
        self.array.fill(0)  # fault it in now, not in the read


class BatchPool:
    """Resident batch buffers, by size (one per process: `POOL`)."""

    def __init__(self) -> None:
        self._free: dict[int, collections.deque] = {}
        self.made = 0  # buffers mapped so far (tests)

    def empty(self, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        """An uninitialized tensor of `shape` and `dtype`: a view of a pooled buffer when it is
        large enough, else torch.empty()."""
        numel = math.prod(shape)
        nbytes = numel * dtype.itemsize
        if nbytes < POOL_MIN_BYTES:
            return torch.empty(shape, dtype=dtype)
        size = -(-nbytes // HUGE_PAGE) * HUGE_PAGE
        # Appending to a full deque drops its oldest buffer (unmapped once collected).
        free = self._free.setdefault(size, collections.deque(maxlen=KEEP_FREE))
        try:
            buf = free.pop()
        except IndexError:
            buf = _Buffer(size)
            self.made += 1
        view = buf.array[:nbytes]  # a new array object, referenced by the tensor's memory only
        t = torch.frombuffer(view, dtype=dtype, count=numel).view(shape)
        done = weakref.finalize(view, free.append, buf)  # the tensor's memory went: reuse buf
        done.atexit = False
        return t


POOL = BatchPool()
