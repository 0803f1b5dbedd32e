"""The reading side of DistDataset and DistDatasetReader (_StoredDataset): the one read path
(item, batch, row and collated reads are views of `_read`), receive buffers, profiles, and
what a forked or spawned DataLoader worker needs to read on its own."""

from __future__ import annotations

import contextlib
import os
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from pyddstore import (
    DDStoreFreedError,
    DDStoreIndexError,
    DDStoreKeyError,
    DDStoreTypeError,
    DDStoreUnsupportedError,
    DDStoreValueError,
    Method,
)

from ._batchmem import POOL
from ._device import same_device
from ._errors import ForkedWorkerError
from ._field import TENSOR, Field
from ._meta import write_meta
from ._pickle import dataset_state, restore_dataset
from ._schema import Schema

# Same-node share bytes a long-lived worker process maps into its page tables when it starts
# (see _populate_node_shares): about 2 MiB of page tables and 0.07 s per GiB, in every worker.
_POPULATE_MAX = 4 << 30
_STORE_WIDE_PROFILE_KEYS = ("py_get", "py_gets", "py_sync", "epoch_sync", "recv_registered")


def _sum_profiles(profiles: list[dict]) -> dict:
    """Adds numeric counters of several profile dicts (nested dicts added key by key)."""
    total: dict = {}
    for p in profiles:
        for k, v in (p or {}).items():
            if isinstance(v, dict):
                total[k] = _sum_profiles([total.get(k, {}), v])
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                total[k] = total.get(k, 0) + v
            else:
                total.setdefault(k, v)
    return total


class Buffers(dict):
    """Per-field receive buffers from alloc(): a dict key -> array, registered with the store.

    Pass as out= to read_rows() / __getitems__(); give back with release().

    Args:
        arrays (dict): field key -> receive array.
        registered (list): (variable, array) pairs registered with the store, released by `release()`.

    Example:
        ```python
        bufs = ds.alloc(128)
        batch = ds.read_rows(idx, out=bufs)  # views into bufs
        ds.release(bufs)
        ```
    """

    def __init__(self, arrays: dict, registered: list):
        super().__init__(arrays)
        self.registered = registered  # [(var, array)] still registered
        self.rows = min((len(a) for a in arrays.values()), default=0)


class _StoredDataset(Dataset):
    """Reading side shared by DistDataset and DistDatasetReader."""

    _store: Any
    _schema: Schema
    _n: int
    _decode: Any
    _device: torch.device | None

    def _start_reading(
        self, store: Any, schema: Schema, n: int, device: Any, decode: Any, hs: str, name: str
    ) -> None:
        """After a load or a restore: ready to read, and (method 2, rank 0) the meta file an
        extra job opens the store through."""
        self._init_reading(store, schema, n, device, decode)
        self._meta_path = None
        if store.method == Method.LIBFABRIC_EXTRA_JOBS and store.rank == 0:
            write_meta(hs, name, store.size, n, schema)
            self._meta_path = os.path.join(hs, f"{name}.meta.json")

    def _init_reading(self, store: Any, schema: Schema, n: int, device: Any, decode: Any) -> None:
        self._store = store
        self._schema = schema
        self._n = n
        self._decode = decode
        self._device = torch.device(device) if device is not None else None
        self._pid = os.getpid()
        self._reader_pid = self._pid
        self._buffer_sets: list[Buffers] = []
        self._freed = False
        # Read once: no setting is looked up per batch.
        self._batch_get = store.settings.batch_get
        if not hasattr(self, "_device_shares"):
            self._device_shares: dict[str, Any] = {}  # field var -> pyddstore.DeviceShare

    # -- description ----------------------------------------------------------------------

    def __len__(self) -> int:
        return self._n

    def __repr__(self) -> str:
        """Name, length, fields (dtype and shape; a ragged axis shows as `*`) and the method."""
        kind = type(self).__name__
        if "_schema" not in self.__dict__:
            return f"<{kind} {getattr(self, 'name', '?')!r} (not loaded)>"
        fields = ", ".join(
            f"{f.key!r}: {f.dtype.name if not f.is_record else 'record'}"
            f"({', '.join('*' if i == f.ragged else str(d) for i, d in enumerate(f.shape))})"
            for f in self._schema.fields
        )
        store = self._store
        if self._freed:
            where = "freed"
        else:
            where = f"method {store.method} ({store.transport}), rank {store.rank} of {store.size}"
        return f"<{kind} {getattr(self, 'name', '?')!r}: {self._n} samples, fields {{{fields}}}, {where}>"

    @property
    def ddstore(self) -> Any:
        """The PyDDStore holding the variables (one per field)."""
        return self._store

    @property
    def schema(self) -> Schema:
        """The stored fields' description (keys, shapes, dtypes, the sample's structure)."""
        return self._schema

    @property
    def shapes(self) -> Any:
        """Each field's shape, arranged like a sample (a shape, a tuple/list, or a dict); the
        same for every sample kind: ``field_shapes``."""
        return self._schema.mirror(self.field_shapes)

    @property
    def dtypes(self) -> Any:
        """Each field's dtype name as upstream gives it ('float32', 'int64'; Python ints, floats
        and bools are 'int64', 'float64', 'bool'); a record field gives its numpy record dtype.
        Arranged like a sample, as ``shapes``; always a dict: ``field_dtypes``. The source's own
        types: ``source_dtypes``."""
        return self._schema.mirror(self.field_dtypes)

    @property
    def field_shapes(self) -> dict:
        """Each field's shape in a dict keyed by field, for every sample kind: dict keys, tuple
        positions, or 0 for a one-value sample (the keys of ``fields`` and ``read_rows()``).

        Example:
            ```python
            ds.field_shapes  # {0: (3, 32, 32)} for image samples, {"x": (4,), "y": ()} for dicts
            ```
        """
        return {f.key: f.shape for f in self._schema.fields}

    @property
    def field_dtypes(self) -> dict:
        """Each field's dtype name (as ``dtypes``) in a dict keyed as ``field_shapes``."""
        return {f.key: (f.dtype if f.is_record else f.dtype.name) for f in self._schema.fields}

    @property
    def source_dtypes(self) -> Any:
        """Each field's dtype as the source had it (torch dtype, numpy dtype, or int/float/bool)."""
        return self._schema.mirror({f.key: f.source_dtype() for f in self._schema.fields})

    @property
    def fields(self) -> list:
        """The stored fields' keys (dict keys, tuple positions, or [0])."""
        return list(self._schema.keys)

    # -- processes and devices ------------------------------------------------------------

    def __getstate__(self) -> dict:
        """Pickling (spawn/forkserver DataLoader workers): a handle of the store's variables
        that the worker re-attaches through the fabric (methods 1 and 2; method 0 raises)."""
        return dataset_state(self)

    def __setstate__(self, state: dict) -> None:
        restore_dataset(self, state)

    def _in_forked_child(self) -> bool:
        return os.getpid() != self._pid

    def _ensure_reader(self) -> None:
        """In a forked child (a DataLoader worker), open this process's own reader once."""
        if self._freed:
            raise DDStoreFreedError("this dataset was freed")
        pid = os.getpid()
        if pid == self._reader_pid:
            return
        if self._store.method == Method.MPI_RMA:
            raise ForkedWorkerError(
                "method=0 (MPI) stores cannot be read from forked DataLoader workers (MPI does not "
                "survive fork); use pyddstore.torch.ThreadDataLoader, or method=1/2 with "
                "DDSTORE_FORK_WORKERS=1"
            )
        self._store.fork_reader()
        self._reader_pid = pid

    def _populate_node_shares(self) -> int:
        """Maps the same-node shares this process copies rows from into its page tables now
        (up to _POPULATE_MAX bytes), for a worker process that will read many batches: fork()
        copies no page tables of shared mappings (and a spawned worker maps them afresh), so
        its reads would otherwise fault them in 64 KiB at a time, a few dozen faults per batch
        for as long as it reads rows it has not read before. The bytes populated."""
        if self._freed:
            return 0
        return self._store._populate_node_shares([f.var for f in self._schema.fields], _POPULATE_MAX)

    def _device_now(self) -> torch.device | None:
        # A forked process cannot use CUDA: samples stay in host memory there.
        return None if self._in_forked_child() else self._device

    # -- reads ----------------------------------------------------------------------------

    def _index(self, i: Any) -> int:
        i = int(i)
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise DDStoreIndexError(f"index {i} is out of range for a dataset of {self._n} samples")
        return i

    def _rows(self, rows: Any) -> np.ndarray:
        if isinstance(rows, torch.Tensor):
            rows = rows.numpy()
        arr = np.asarray(rows)
        if arr.ndim != 1:
            arr = arr.reshape(-1)
        if arr.dtype.kind not in "iu" and arr.size:
            raise DDStoreTypeError(f"rows must be integers, got {arr.dtype}")
        arr = arr.astype(np.int64, copy=True)
        neg = arr < 0
        if neg.any():
            arr[neg] += self._n
        if arr.size and (arr.min() < 0 or arr.max() >= self._n):
            bad = int(np.asarray(rows).reshape(-1)[(arr < 0) | (arr >= self._n)][0])
            raise DDStoreIndexError(f"row {bad} is out of range for a dataset of {self._n} samples")
        return arr

    def _select(self, fields: Any) -> list[Field]:
        if fields is None:
            return [self._schema.by_key[k] for k in self._schema.keys]
        try:
            return [self._schema.by_key[k] for k in fields]
        except KeyError as e:
            raise DDStoreKeyError(
                f"no stored field {e.args[0]!r}; stored fields: {self._schema.keys!r}"
            ) from None

    # The one read path: item, batch, row and collated reads are views of _read().

    def _read(
        self,
        rows: np.ndarray,
        fields: list[Field],
        out: Any = None,
        *,
        collate: bool = False,
        pin: bool = False,
    ) -> dict:
        """Rows `rows` (checked global rows) of `fields` as {key: (len(rows), *shape) values}: one
        read per field (one ragged read for a ragged field), into `out`'s buffers where given,
        moved to device= (not in a forked process, which cannot use the device). With
        `collate`, fixed fields land straight in torch tensors (pinned with `pin`), as
        default_collate would stack them."""
        self._ensure_reader()
        n = len(rows)
        dev = self._device_now()
        got = {}
        for f in fields:
            dst = out.get(f.key) if out is not None else None
            if f.is_ragged:
                if dst is not None:
                    dst = f.check_ragged_out(dst)
                values, offsets = self._store.get_batch(f.var, indices=rows, out=dst)
                v = f.ragged_values(values.reshape(-1), offsets)  # flat elements (a view)
                got[f.key] = (
                    v._replace(values=v.values.to(dev)) if dev is not None and f.kind == TENSOR else v
                )
                continue
            share = self._device_shares.get(f.var)
            if not collate:
                buf = f.check_out(dst, n) if dst is not None else f.alloc(n)
                self._read_into(f, buf, rows)
                v = f.values(buf)
                got[f.key] = v.to(dev) if dev is not None and f.kind == TENSOR else v
                continue
            # Resident, reused memory (see _batchmem); pinned: torch's pinned-memory cache.
            shape = (n, *f.shape)
            t = (
                torch.empty(shape, dtype=f.torch_dtype, pin_memory=True)
                if pin
                else POOL.empty(shape, f.torch_dtype)
            )
            if dst is None and share is not None and dev is not None and same_device(share.device, dev):
                # Own rows go device to device: no trip through host memory.
                share.read(t.numpy(), rows, own=False)
                t = t.to(dev, non_blocking=pin)
                share.gather_own(t, rows)
            else:
                if dst is not None:
                    buf = f.check_out(dst, n)
                    self._read_into(f, buf, rows)
                    t.numpy()[...] = buf
                else:
                    self._read_into(f, t.numpy(), rows)
                if dev is not None:
                    t = t.to(dev, non_blocking=pin)
            got[f.key] = t
        return got

    def _spilled_fields(self) -> list:
        """Fields, fixed and ragged, some of whose rows are in spill files (read ahead by
        ThreadDataLoader; a ragged field's rows are staged whole)."""
        return [
            f.var
            for f in self._schema.fields
            if f.var not in self._device_shares and self._store._is_spilled(f.var)
        ]

    def _read_ahead(self, indices) -> int:
        """Stages the spilled rows of samples `indices` (soon read here); the rows staged."""
        rows = np.asarray(indices, dtype=np.int64)
        return sum(self._store._prefetch(var, rows) for var in self._spilled_fields())

    def _read_into(self, f: Field, buf: np.ndarray, rows: np.ndarray) -> None:
        """Fixed rows of f into buf (store layout): through the field's DeviceShare, one
        get_batch, or (DDSTORE_BATCH_GET=0) one read per row."""
        share = self._device_shares.get(f.var)
        if share is not None:
            share.read(buf, rows)
        elif self._batch_get:
            self._store.get_batch(f.var, buf, rows)
        else:
            for j, r in enumerate(rows.tolist()):
                self._store.get(f.var, buf[j : j + 1], start=r)

    def _samples(self, rows: np.ndarray, out: Any = None) -> list:
        """Samples (decoded) of rows, from one _read of every field."""
        sel = self._select(None)
        got = self._read(rows, sel, out)
        columns = {f.key: f.column(got[f.key]) for f in sel}
        samples = self._schema.build(columns, len(rows))
        if self._decode is not None:
            samples = [self._decode(s, i) for s, i in zip(samples, rows.tolist())]
        return samples

    def read_rows(self, rows: Any, fields: Any = None, out: Any = None) -> dict:
        """Stored rows (any order, repeats allowed) as {key: (len(rows), *shape) values}.

        Tensors for tensor fields (on device= if set), numpy arrays otherwise, record arrays for
        records; a ragged field gives RaggedRows (flat values, per-row element offsets and
        shapes; ``.row(i)`` is row i). With out= (e.g. from alloc()) the results are views into
        those buffers. decode= is not applied. Local for every method (no other rank takes part).

        Example:
            ```python
            cols = ds.read_rows([7, 3, 7], fields=["x"])
            cols["x"].shape  # (3, *x_shape)
            ```
        """
        return self._read(self._rows(rows), self._select(fields), out)

    def __getitem__(self, index: Any) -> Any:
        return self._samples(np.array([self._index(index)], dtype=np.int64))[0]

    def __getitems__(self, indices: Any, out: Any = None) -> list:
        """Samples for a batch of indices: one read per field (DDSTORE_BATCH_GET=0: fixed fields
        row by row). With out= the samples' arrays are views into those buffers."""
        return self._samples(self._rows(indices), out)

    @property
    def collates_directly(self) -> bool:
        """Whether read_batch() gives default_collate's batches (no decode=, no record or
        ragged fields)."""
        return self._decode is None and not any(f.is_record or f.is_ragged for f in self._schema.fields)

    def read_batch(self, indices: Any, out: Any = None, pin: bool = False) -> Any:
        """A batch exactly as default_collate(self.__getitems__(indices)) would make it, read
        straight into the batch tensors (pinned with pin=True); needs collates_directly.

        Example:
            ```python
            x, y = ds.read_batch([4, 1, 9])  # tensors of 3 rows
            ```
        """
        if not self.collates_directly:
            raise DDStoreUnsupportedError(
                "read_batch() needs a dataset without decode=, record or ragged fields "
                "(collates_directly is False): use __getitems__ and a collate_fn"
            )
        got = self._read(self._rows(indices), self._select(None), out, collate=True, pin=pin)
        return self._schema.collate_like(got)

    # -- buffers --------------------------------------------------------------------------

    def alloc(self, n: int, fields: Any = None) -> Buffers:
        """Per-field buffers for n rows, registered with the store once; pass as out=.

        Example:
            ```python
            bufs = ds.alloc(64)
            samples = ds.__getitems__(list(range(64)), out=bufs)
            ```
        """
        if n < 1:
            raise DDStoreValueError(f"alloc needs n >= 1, got {n}")
        arrays, registered = {}, []
        try:
            for f in self._select(fields):
                arr = f.alloc_ragged(n) if f.is_ragged else f.alloc(n)
                self._store.register_recv(f.var, arr)
                registered.append((f.var, arr))
                arrays[f.key] = arr
        except BaseException:
            for var, arr in registered:
                self._store.unregister_recv(var, arr)
            raise
        bufs = Buffers(arrays, registered)
        self._buffer_sets.append(bufs)
        return bufs

    def release(self, bufs: Buffers) -> None:
        """Unregisters buffers from alloc(); they stay usable as plain arrays.

        Example:
            ```python
            ds.release(bufs)
            ```
        """
        regs, bufs.registered = getattr(bufs, "registered", []), []
        for var, arr in regs:
            if not self._freed:
                self._store.unregister_recv(var, arr)
        self._buffer_sets = [b for b in self._buffer_sets if b is not bufs]

    def free(self) -> None:
        """Releases buffers and frees the store (collective for the core group).

        Example:
            ```python
            ds.free()  # on every rank, once no rank reads any more
            ```
        """
        if self._freed:
            return
        for b in list(self._buffer_sets):
            self.release(b)
        self._freed = True
        self._device_shares = {}  # the native store's references go with free()
        if getattr(self, "_meta_path", None):  # the core stops serving: readers must not find it
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._meta_path)
        self._store.free()

    def get_profile(self, name: Any = None) -> dict:
        """Read counters summed over the store and the threads' readers: all fields, one field
        (by key), or one store variable (by name).

        Example:
            ```python
            print(ds.get_profile())  # reads, bytes, remote and local rows, ...
            ```
        """
        if name is None:
            names = [f.var for f in self._schema.fields]
        elif name in self._schema.by_key:
            names = [self._schema.by_key[name].var]
        else:
            names = [name]
        profiles = [self._store.get_profile(v) for v in names]
        total = _sum_profiles(profiles)
        # The store-wide counters (its get/get_batch calls, ...) are in every profile once.
        for k in _STORE_WIDE_PROFILE_KEYS:
            if profiles and k in profiles[0]:
                total[k] = profiles[0][k]
        return total
