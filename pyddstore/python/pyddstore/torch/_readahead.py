"""Read-ahead of spilled samples (see the "Datasets larger than memory" guide).

A sampler that knows its order (pyddstore's DistributedSampler: the epoch's indices follow from
seed and epoch) says which samples come next; ThreadDataLoader hands the next k batches
(DDSTORE_READ_AHEAD_BATCHES, 4 by default) past those already dispatched to a thread that stages
their spilled rows (each field's `PyDDStore` read-ahead stage, sized in the core to hold at least
DDSTORE_STAGE_ROWS rows within half the budget), so the worker that reads the batch copies them
from memory. The thread stages what fits whenever a batch is dispatched and whenever a worker has
read one (its rows' room in the stage is free again): rows are reserved as soon as there is room,
not a batch later. Where a stage holds fewer than k of the loader's batches, the loader says so once,
at construction, and stages what fits; an epoch's first batches, handed to the workers at once,
are staged before they are handed out. Any other sampler reads spilled rows when they are
needed. An `update()` followed by `barrier()` drops the staged copies of the rows it wrote on
every rank, so a batch read after the barrier never gets an old row from the stage.
"""

from __future__ import annotations

import threading
from typing import Any

from pyddstore._log import get_logger

_log = get_logger("torch")


def stage_batches(dataset: Any, batch_size: int) -> int | None:
    """How many batches of `batch_size` rows the stages of `dataset`'s spilled fixed fields hold
    (the fewest over fields); None when no fixed field spills."""
    schema = getattr(dataset, "_schema", None)
    if schema is None or not getattr(dataset, "_spilled_fields", None):
        return None
    spilled = set(dataset._spilled_fields())
    store = dataset._store
    fits = [
        store._stage_capacity(f.var) // max(1, f.row_bytes * batch_size)
        for f in schema.fields
        if f.var in spilled and not f.is_ragged
    ]
    return min(fits) if fits else None


def batches_ahead(dataset: Any, batch_size: int | None, wanted: int) -> int:
    """Batches a loader of `batch_size` stages ahead: `wanted` (DDSTORE_READ_AHEAD_BATCHES), or
    what the stages hold where that is fewer (said once, here: at the loader's construction)."""
    if batch_size is None:
        return wanted
    fits = stage_batches(dataset, batch_size)
    if fits is None or fits >= wanted:
        return wanted
    _log.warning(
        "read-ahead: the stage holds %d of the %d batches of %d samples asked for "
        "(DDSTORE_READ_AHEAD_BATCHES): the memory budget cannot hold them beside its memory part "
        "(the stage takes at most half the budget; DDSTORE_STAGE_ROWS, memory_limit=); staging %d",
        fits,
        wanted,
        batch_size,
        max(1, fits),
    )
    return max(1, fits)


class ReadAhead:
    """One loader iterator's read-ahead thread."""

    def __init__(self, dataset: Any, sampler: Any, batch_size: int, batches: int):
        self._dataset = dataset
        self._sampler = sampler
        self._batch_size = batch_size
        self._batches = batches
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
        return ReadAhead(dataset, sampler, loader.batch_size, loader._read_ahead_batches)

    def stage_now(self, indices: Any) -> None:
        """Stages the spilled rows of `indices` in the calling thread (an epoch's first batches,
        handed to the workers before the read-ahead could stage them)."""
        try:
            self.staged += self._dataset._read_ahead(indices)
        except Exception:  # noqa: BLE001 - a read that needs the rows reports the failure itself
            pass

    def announce(self) -> None:
        """A batch was dispatched, or read (room in the stage): stage what comes next."""
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._stop:
                return
            try:
                indices = self._sampler.upcoming(self._batches * self._batch_size)
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
