"""The collectives over a store's group and upstream's read epochs (PyDDStore's methods)."""

from __future__ import annotations

import time

from . import _wire
from ._errors import DDStoreValueError
from ._kinds import Method


class StoreCollectives:
    """PyDDStore's collectives: its `_native` store, `method`, `size`, `_in_epoch` and
    `_py_times` are the store's own."""

    def allgather(self, obj) -> list:
        """Every rank's `obj`, in rank order. Data only (None, bool, int, float, str, bytes,
        lists, dicts with str keys; see ``pyddstore._wire``): nothing received can run code.

        Args:
            obj (object): data only: None, bool, int, float, str, bytes, lists, dicts with str keys.
        """
        return _wire.gather(self._native.comm(), obj)

    def barrier(self) -> None:
        """Collective; bounded by DDSTORE_TIMEOUT_S, like free()'s barrier (DDStoreTimeoutError
        naming the ranks that did not arrive). Ctrl-C interrupts it (KeyboardInterrupt); the
        store's later collectives then raise DDStoreError (the ranks no longer agree on which
        collective comes next)."""
        self._native.barrier()

    def epoch_begin(self) -> None:
        """Opens a read epoch, as upstream's ``epoch_begin``: for method 0 collective (a barrier of
        the store's group, where upstream fences every window) and refusing nesting
        (``epoch_begin`` twice without ``epoch_end`` raises DDStoreValueError); for methods 1
        and 2 nothing, as upstream. Reads themselves need no epoch.

        Example:
            ```python
            store.epoch_begin()
            store.get_batch("x", out, idx)
            store.epoch_end()
            ```
        """
        if self.method != Method.MPI_RMA:
            return
        if self._in_epoch:
            raise DDStoreValueError("epoch_begin(): an epoch is already open: call epoch_end() first")
        self._epoch_sync()
        self._in_epoch = True

    def epoch_end(self) -> None:
        """Closes the epoch :meth:`epoch_begin` opened (method 0: collective; without an open
        epoch it raises DDStoreValueError); nothing for methods 1 and 2, as upstream."""
        if self.method != Method.MPI_RMA:
            return
        if not self._in_epoch:
            raise DDStoreValueError("epoch_end(): no epoch is open: call epoch_begin() first")
        self._epoch_sync()
        self._in_epoch = False

    def _epoch_sync(self) -> None:
        if self.size > 1:
            t = time.perf_counter()
            self._native.barrier()
            self._py_times["epoch_sync"] += time.perf_counter() - t
