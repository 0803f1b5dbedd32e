"""Pickling DistDataset / DistDatasetReader for spawn and forkserver DataLoader workers.

The dataset pickles to its description (schema, length, decode) and a handle of its store's
variables (pyddstore._attach); the worker re-attaches through the fabric, as a method-2 extra
job does, without MPI. Samples come back in host memory in workers (device= applies in the
main process, as with forked workers); device shares (add_device=) are read through the
fabric."""

from __future__ import annotations

import os
from typing import Any

from pyddstore import Method
from pyddstore._attach import METHOD0_ALTERNATIVES, attach_store, store_handle
from pyddstore._errors import DDStoreFreedError

from ._errors import ForkedWorkerError

# Process-local state that never travels: rebuilt in the worker.
_LOCAL = ("_store", "_device_shares", "_buffer_sets", "_share_device", "_pid", "_reader_pid")


def dataset_state(ds: Any) -> dict:
    """ds.__dict__ for pickling, with the store replaced by a handle of the dataset's variables."""
    if ds._freed:
        raise DDStoreFreedError("a freed dataset cannot be pickled")
    if ds._store.method == Method.MPI_RMA:
        raise ForkedWorkerError(
            "a method=0 (MPI RMA) dataset cannot be sent to spawn or forkserver workers (the "
            f"DataLoader pickles it): {METHOD0_ALTERNATIVES}"
        )
    state = {k: v for k, v in ds.__dict__.items() if k not in _LOCAL}
    state["_store_handle"] = store_handle(ds._store, [f.var for f in ds._schema.fields])
    state["_meta_path"] = None  # only the core's own object withdraws the meta file
    return state


def restore_dataset(ds: Any, state: dict) -> None:
    """The worker side of dataset_state: attach the store, reset process-local state."""
    state = dict(state)
    handle = state.pop("_store_handle")
    ds.__dict__.update(state)
    ds._store = attach_store(handle)
    ds._pid = ds._reader_pid = os.getpid()
    ds._buffer_sets = []
    ds._device_shares = {}
    ds._share_device = None
    ds._device = None  # samples stay in host memory in workers
