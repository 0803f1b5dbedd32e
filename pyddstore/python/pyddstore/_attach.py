"""Pickling a store: a handle that a process started with ``spawn`` or ``forkserver`` (a
DataLoader worker, a ``multiprocessing`` child) turns back into a store reading the same
variables through the fabric, as a method-2 extra job does: one process of its own, no MPI,
no collective call, and no copy of the data.

The handle holds, per variable, what the owning ranks published to the store's group (memory
keys, addresses, counts, same-node locators) and the provider the parent used. It is only
valid while the parent's store lives (until its ``free()``), and only for methods 1 and 2:
MPI windows (method 0) cannot be reached from another process."""

from __future__ import annotations

import copyreg
import os
from typing import Any

from ._child_env import arm_for_process_start
from ._errors import DDStoreFreedError, DDStoreUnsupportedError
from ._kinds import Method, ragged_parts
from ._profile import new_py_times
from ._store import PyDDStore, _live_stores

HANDLE_VERSION = 1

METHOD0_ALTERNATIVES = (
    "use pyddstore.torch.ThreadDataLoader (worker threads share the store), DataLoader with "
    "num_workers=0, or method=1 or 2 (libfabric), whose stores re-attach in spawn and forkserver "
    "workers"
)


def store_handle(store: Any, names: list) -> dict:
    """What a spawned process needs to read ``names`` of ``store`` (a PyDDStore)."""
    native = store._native
    if native.freed:
        raise DDStoreFreedError("a freed store cannot be pickled")
    if store.method == Method.MPI_RMA:
        raise DDStoreUnsupportedError(
            "a method=0 (MPI RMA) store cannot be pickled for a spawn or forkserver process: MPI "
            f"windows are not reachable from another process; {METHOD0_ALTERNATIVES}"
        )
    # A spawn or forkserver worker this pickle starts must not initialise MPI (see _child_env).
    arm_for_process_start()
    variables = []
    for name in names:
        # A ragged variable is two store variables (values, row ends) read as one.
        parts = ragged_parts(name) if native.is_ragged(name) else [name]
        for part in parts:
            _, _, itemsize = native.info(part)
            variables.append(
                {
                    "name": part,
                    "dtype": native.dtype(part),
                    "row_bytes": native.row_bytes(part),
                    "itemsize": itemsize,
                    "counts": [int(c) for c in native.counts(part)],
                    "records": [bytes(r) for r in native.records(part)],
                    "node": list(native.node_records(part)),
                }
            )
    ragged = {n: tuple(store._ragged_units.get(n, ())) for n in names if native.is_ragged(n)}
    transport = native.transport
    return {
        "version": HANDLE_VERSION,
        "method": store.method,
        "provider": transport.split(":", 1)[1] if transport.startswith("ofi:") else None,
        "world_rank": store.world_rank,
        "world_size": store.world_size,
        "group_id": store.group_id,
        "owner_pid": os.getpid(),
        "variables": variables,
        "ragged": ragged,
        # The job's secret: the worker's gather requests must prove it to the owners. The handle
        # travels only through the pipe to the worker process (same user), never to a file.
        "secret": native.secret(),
    }


def attach_store(handle: dict) -> Any:
    """A PyDDStore in this process reading the variables of ``handle`` (from store_handle)."""
    from . import _native

    if not isinstance(handle, dict) or handle.get("version") != HANDLE_VERSION:
        raise DDStoreUnsupportedError(
            "this pickled store comes from another pyddstore version: use the same pyddstore in "
            "the parent and its workers"
        )
    # The parent's provider, whatever this process's DDSTORE_FABRIC would choose.
    settings = _native.Settings.from_env(fabric=handle.get("provider") or None, method=2)
    store = PyDDStore.__new__(PyDDStore)
    store.settings = settings
    store.handshake_dir = ""
    store.n_core = len(handle["variables"][0]["counts"]) if handle["variables"] else 0
    store.is_extra = True
    store.world_rank, store.world_size = handle["world_rank"], handle["world_size"]
    store.group_id = handle["group_id"]
    store.method = handle["method"]
    store._publisher = None
    store._record_comm = None
    store._in_epoch = False
    store._py_times = new_py_times()
    store._recv = set()
    store._ragged_units = {}
    # No records to compare: its same-node reads still raise DDStoreStaleError once the parent
    # frees a variable (the state word), fabric reads fail as the parent's shares go.
    store._joined = {}
    store._freed_names = {}
    store._peer_tables = {}
    store._native = _native.Store(_native.Comm.single(), 2, None, settings)
    if handle.get("secret"):
        store._native.set_secret(bytes(handle["secret"]))
    for v in handle["variables"]:
        store._native.attach(
            v["name"], v["dtype"], v["row_bytes"], v["itemsize"], v["counts"], v["records"], v["node"]
        )
    for name, unit in handle.get("ragged", {}).items():
        store._native.link_ragged(name)
        store._ragged_units[name] = tuple(unit)
    _live_stores.add(store)
    return store


def reduce_store(store: PyDDStore) -> tuple:
    """How a PyDDStore pickles: to a handle that a spawn/forkserver process re-attaches through
    the fabric (methods 1 and 2; method 0 raises DDStoreUnsupportedError)."""
    names = store.names()
    # The parts of a ragged variable travel with it, not as variables of their own.
    parts = {p for n in names if store._native.is_ragged(n) for p in ragged_parts(n)}
    return (attach_store, (store_handle(store, [n for n in names if n not in parts]),))


# Registered here, not as PyDDStore.__reduce__: this module builds stores, so _store imports nothing
# of it (one import direction).
copyreg.pickle(PyDDStore, reduce_store)
