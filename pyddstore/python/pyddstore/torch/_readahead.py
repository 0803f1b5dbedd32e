"""Read-ahead of spilled samples (see the "Datasets larger than memory" guide).

A sampler that knows its order (pyddstore's DistributedSampler: the epoch's indices follow from
seed and epoch) says which samples come next; ThreadDataLoader hands the next
READ_AHEAD_BATCHES batches past those already dispatched to a thread that stages their spilled
rows (each field's `PyDDStore` read-ahead stage), so the worker that reads the batch copies them
from memory. Any other sampler reads spilled rows when they are needed. An `update()` followed by
`barrier()` drops the staged copies of the rows it wrote on every rank, so a batch read after the
barrier never gets an old row from the stage.
"""

from __future__ import annotations

import threading
from typing import Any

# Batches staged ahead of the ones already handed to workers (which are num_workers *
# prefetch_factor batches ahead of the training loop already).
READ_AHEAD_BATCHES = 4


class ReadAhead:
    """One loader iterator's read-ahead thread."""

    def __init__(self, dataset: Any, sampler: Any, batch_size: int):
        self._dataset = dataset
        self._sampler = sampler
        self._batch_size = batch_size
        self._wake = threading.Event()
        self._stop = False
        self.staged = 0  # rows staged so far
        self._thread = threading.Thread(target=self._run, name="ddstore-read-ahead", daemon=True)
        self._thread.start()

    @staticmethod
    def for_loader(loader: Any) -> ReadAhead | None:
        """A read-ahead for `loader` when its dataset has spilled fields and its sampler knows
        what comes next; None otherwise."""
        dataset, sampler = loader.dataset, getattr(loader, "sampler", None)
        if loader.batch_size is None or not hasattr(sampler, "upcoming"):
            return None
        spills = getattr(dataset, "_spilled_fields", None)
        if spills is None or not spills():
            return None
        return ReadAhead(dataset, sampler, loader.batch_size)

    def announce(self) -> None:
        """A batch was dispatched: stage what comes after it."""
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._stop:
                return
            try:
                indices = self._sampler.upcoming(READ_AHEAD_BATCHES * self._batch_size)
                if indices:
                    self.staged += self._dataset._read_ahead(indices)
            except Exception:  # noqa: BLE001 - a read that needs the rows reports the failure itself
                return

    def close(self) -> None:
        """Stops the thread (after the staging in progress, if any)."""
        self._stop = True
        self._wake.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=60)
