"""Ragged rows while loading: each loading thread copies its rows into blocks of its own, and
the ragged variable is created and filled from them once every rank has loaded (no second
copy of the share)."""

from __future__ import annotations

import contextlib
import mmap
import threading
from typing import Any, Callable

import numpy as np

from ._agree import agree
from ._field import Field

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
    loaded, `add_ragged_in_place` creates the ragged variable from the lengths and `fill` writes
    each block's rows into it, giving each block back as soon as it is written: the rank holds
    its share plus about one block, never a second copy of the share."""

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

    def write(self, store: Any, values_part: str) -> None:
        """Fills the ragged variable's values (`values_part`, just created) from the blocks."""
        self.fill(lambda arr, off: store.update(values_part, arr, offset=off))

    def close(self) -> None:
        while self._blocks:
            self._blocks.pop().close()


def add_ragged_in_place(
    store: Any,
    name: str,
    f: Field,
    lengths: np.ndarray,
    fill: Callable[[str], None],
) -> None:
    """Collective: creates the ragged variable `name` from this rank's row lengths, then
    `fill(values_part)` writes the values straight into this rank's share of `values_part` (no
    contiguous copy of them first). Every rank learns whether all filled, a failure keeping its
    kind on every rank, before the variable is readable. The creation protocol is Rust's
    (`Store.init_ragged`, through `PyDDStore._init_ragged`)."""

    def agreed_fill(values_part: str) -> None:
        err = None
        try:
            fill(values_part)
        except Exception as e:  # noqa: BLE001 - every rank must learn of the failure
            err = e
        agree(store, err)

    store._init_ragged(name, lengths, (f.unit_count,), f.dtype, agreed_fill)
