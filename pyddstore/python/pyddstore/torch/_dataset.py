"""DistDataset (the core group: every rank loads its share) and DistDatasetReader (a method-2
extra job reading what a core group published)."""

from __future__ import annotations

import collections.abc
import contextlib
import functools
import json
import mmap
import os
import sys
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, TensorDataset

from pyddstore import (
    DDStoreError,
    DDStoreFileError,
    DDStoreFreedError,
    DDStoreIndexError,
    DDStoreKeyError,
    DDStoreTimeoutError,
    DDStoreTypeError,
    DDStoreUnsupportedError,
    DDStoreValueError,
    PyDDStore,
)
from pyddstore._env import settings as _env_settings
from pyddstore._handshake import load_json_object, wait_and_read, write_private
from pyddstore._log import get_logger
from pyddstore._sources import file_rows_of, h5py_reopener, is_npy_list, npy_files
from pyddstore._store import _dtype_name

from . import _load, _snapshot
from ._schema import (
    META_VERSION,
    NDARRAY,
    PYG_HETERO,
    PYG_STRUCTURES,
    TENSOR,
    Field,
    Schema,
    SchemaError,
    SchemaTypeError,
    pyg_structure_of,
    share_of,
)

_LOG = get_logger("torch")


class ForkedWorkerError(DDStoreUnsupportedError):
    """A read from a forked process, or a pickling for a spawn/forkserver one, that the
    store's method cannot serve (method 0: MPI does not cross processes).

    Example:
        ```python
        ds = DistDataset(src, "train", MPI.COMM_WORLD)  # method 0
        DataLoader(ds, num_workers=2)  # workers raise ForkedWorkerError: use ThreadDataLoader
        ```
    """


def _resolve_add_device(add_device: Any, host_as_device: bool) -> tuple[torch.device, str, int] | None:
    """(device, memory interface, device index) for add_device=, or None for host storage.

    host_as_device (DDSTORE_TEST_HOST_AS_DEVICE=1, for tests) takes add_device="cpu" as device
    memory of interface "system": the share is a CPU tensor registered and read exactly like a
    GPU share."""
    if add_device is None or add_device is False:
        return None
    try:
        dev = torch.device("cuda" if add_device is True else add_device)
    except (RuntimeError, TypeError) as e:
        raise DDStoreValueError(f"add_device={add_device!r} is not a device: {e}") from None
    if dev.type == "cpu":
        if host_as_device:
            return dev, "system", 0
        raise DDStoreValueError(
            f"add_device={add_device!r} needs a GPU device (e.g. 'cuda'); shares are on the host without it"
        )
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise DDStoreValueError(f"add_device={add_device!r} needs a GPU, but torch.cuda is not available")
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        iface = "rocr" if getattr(torch.version, "hip", None) else "cuda"
        return torch.device("cuda", index), iface, index
    if dev.type == "xpu":
        xpu = getattr(torch, "xpu", None)
        if xpu is None or not xpu.is_available():
            raise DDStoreValueError(f"add_device={add_device!r} needs an XPU, but torch.xpu is not available")
        index = dev.index if dev.index is not None else xpu.current_device()
        return torch.device("xpu", index), "ze", index
    raise DDStoreValueError(
        f"add_device={add_device!r}: device type {dev.type!r} is not supported (cuda, xpu)"
    )


def _same_device(a: torch.device, b: torch.device) -> bool:
    if a.type != b.type:
        return False
    if a.type == "cuda":
        current = torch.cuda.current_device
        return (a.index if a.index is not None else current()) == (
            b.index if b.index is not None else current()
        )
    return a.index == b.index


def _sync_device(dev: torch.device) -> None:
    """Waits for copies to dev to finish, so peers read complete rows."""
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    elif dev.type == "xpu":
        torch.xpu.synchronize(dev)


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


def _spill_settings(settings, memory_limit, spill_dir):
    """`settings` with a dataset's memory budget and spill directory (arguments win over variables)."""
    over = {}
    if memory_limit is not None:
        over["memory_limit"] = memory_limit
    if spill_dir is not None:
        over["spill_dir"] = os.fspath(spill_dir)
    return settings.replace(**over) if over else settings


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
        if store.method == 2 and store.rank == 0:
            self._write_meta(hs, name, store.size, n, schema)
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
        """Each field's shape, arranged like a sample (a shape, a tuple/list, or a dict)."""
        return self._schema.mirror({f.key: f.shape for f in self._schema.fields})

    @property
    def dtypes(self) -> Any:
        """Each field's dtype name as upstream gives it ('float32', 'int64'; Python ints, floats
        and bools are 'int64', 'float64', 'bool'); a record field gives its numpy record dtype.
        The source's own types: ``source_dtypes``."""
        return self._schema.mirror(
            {f.key: (f.dtype if f.is_record else f.dtype.name) for f in self._schema.fields}
        )

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
        from ._pickle import dataset_state

        return dataset_state(self)

    def __setstate__(self, state: dict) -> None:
        from ._pickle import restore_dataset

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
        if self._store.method == 0:
            raise ForkedWorkerError(
                "method=0 (MPI) stores cannot be read from forked DataLoader workers (MPI does not "
                "survive fork); use pyddstore.torch.ThreadDataLoader, or method=1/2 with "
                "DDSTORE_FORK_WORKERS=1"
            )
        self._store.fork_reader()
        self._reader_pid = pid

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
            t = torch.empty((n, *f.shape), dtype=f.torch_dtype, pin_memory=pin)
            if dst is None and share is not None and dev is not None and _same_device(share.device, dev):
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
        """Fixed fields some of whose rows are in spill files (read ahead by ThreadDataLoader)."""
        return [
            f.var
            for f in self._schema.fixed_fields
            if f.var not in self._device_shares and self._store._native.is_spilled(f.var)
        ]

    def _read_ahead(self, indices) -> int:
        """Stages the spilled rows of samples `indices` (soon read here); the rows staged."""
        rows = np.asarray(indices, dtype=np.int64)
        return sum(self._store._native.prefetch(var, rows) for var in self._spilled_fields())

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


def _error_payload(e: BaseException, rank: int) -> tuple[str, str]:
    if isinstance(e, _snapshot.SnapshotError):
        return "snapshot", f"rank {rank}: {e}"
    if isinstance(e, DDStoreFileError):
        return "file", f"rank {rank}: {e}"
    if isinstance(e, DDStoreTimeoutError):
        return "timeout", f"rank {rank}: {e}"
    if isinstance(e, SchemaTypeError):
        return "type", str(e)
    if isinstance(e, SchemaError):
        return "value", str(e)
    return "other", f"rank {rank}: {type(e).__name__}: {e}"


def _rebuild_error(payload: tuple[str, str]) -> Exception:
    kind, msg = payload
    if kind == "type":
        return SchemaTypeError(msg)
    if kind == "value":
        return SchemaError(msg)
    if kind == "snapshot":
        return _snapshot.SnapshotError(msg)
    if kind == "file":
        return DDStoreFileError(msg)
    if kind == "timeout":
        return DDStoreTimeoutError(f"loading timed out on another rank: {msg}")
    return DDStoreError(f"loading failed on another rank: {msg}")


def _agree(store: Any, err: BaseException | None, value: Any = None) -> list:
    """Collective: every rank's value (JSON-able); raises on every rank if any rank failed
    (its own error where it failed, else one naming the rank that did)."""
    payload = None if err is None else _error_payload(err, store.rank)
    results = store.allgather({"error": payload, "value": value})
    failed = [r["error"] for r in results if r["error"] is not None]
    if err is not None:
        raise err
    if failed:
        raise _rebuild_error(tuple(failed[0]))
    return [r["value"] for r in results]


def _type_name(t: Any) -> str | None:
    """A sample container type as data ("module:qualname") for the schema exchange."""
    if not isinstance(t, type):
        return None
    return f"{t.__module__}:{t.__qualname__}"


def _type_from_name(name: Any) -> Any:
    """The container type a peer named, only if this process already has it loaded
    (nothing is imported or run) and it is a tuple, list or mapping type; else None."""
    if not isinstance(name, str) or ":" not in name:
        return None
    module, qualname = name.split(":", 1)
    obj = sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None) if obj is not None and part.isidentifier() else None
    if isinstance(obj, type) and issubclass(obj, (tuple, list, dict, collections.abc.Mapping)):
        return obj
    return None


def _bulk_arrays(source: Any) -> dict | None:
    """Array-backed sources whose shares can be copied without a Python call per sample:
    key -> array-like sliceable along rows (numpy array/memmap, tensor, TensorDataset, or any
    object with shape, dtype and slicing such as an h5py/zarr dataset)."""
    if isinstance(source, (np.ndarray, torch.Tensor)):
        return {0: source}
    if isinstance(source, TensorDataset):
        return dict(enumerate(source.tensors))
    if isinstance(source, Dataset):
        return None
    shape = getattr(source, "shape", None)
    if getattr(source, "dtype", None) is not None and isinstance(shape, tuple) and len(shape) >= 1:
        return {0: source}
    return None


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _source_len(source: Any) -> int:
    """len(source); array-likes without __len__ (zarr 3 arrays): their first dimension."""
    shape = getattr(source, "shape", None)
    if not hasattr(source, "__len__") and isinstance(shape, tuple) and shape:
        return int(shape[0])
    return len(source)


def _bulk_fits(arr: Any, f: Field) -> bool:
    """Whether rows of arr are exactly the field's values (else load sample by sample)."""
    if isinstance(arr, torch.Tensor):
        return f.kind == TENSOR and f.torch_dtype == arr.dtype and tuple(arr.shape[1:]) == f.shape
    dtype = np.dtype(arr.dtype)
    if f.is_record:
        return dtype == f.dtype and tuple(arr.shape[1:]) == f.shape
    return (
        f.kind != TENSOR
        and dtype.names is None
        and np.dtype(dtype.name) == f.dtype
        and tuple(arr.shape[1:]) == f.shape
    )


def _bulk_slice(arr: Any, a: int, b: int, f: Field) -> np.ndarray:
    if isinstance(arr, torch.Tensor):
        out = arr[a:b].detach().cpu().contiguous().numpy()
    else:
        out = np.ascontiguousarray(np.asarray(arr[a:b]))
        if not f.is_record and out.dtype != f.dtype:
            out = out.astype(f.dtype)
    return f.to_store(out)


def _bulk_slice_of(f: Field):
    def convert(arr: Any, a: int, b: int) -> np.ndarray:
        rows = _bulk_slice(arr, a, b, f)
        _drop_mapped_pages(arr)
        return rows

    return convert


def _load_summary(name: str, n: int, size: int, stats: list[dict]) -> str:
    """One line for rank 0: sizes, time, MB/s in total and per rank, depth, what limited it."""
    total = sum(s["nbytes"] for s in stats)
    slowest = max(stats, key=lambda s: s["secs"])
    secs = max(slowest["secs"], 1e-9)
    notes = sorted({note for s in stats for note in s["notes"]})
    extra = f"; {', '.join(notes)}" if notes else ""
    return (
        f"pyddstore: {name}: {n} samples, {max(s['nbytes'] for s in stats) / 2**20:.1f} MiB per rank "
        f"({size} ranks), {secs:.2f} s, {_load.rate_text(total / secs)} total, "
        f"{_load.rate_text(total / size / secs)} per rank; {slowest['path']} path, "
        f"{slowest['workers']} reader(s) in flight; limited by {_load.limit_of(slowest)}{extra}"
    )


class DistDataset(_StoredDataset):
    """A map-style dataset held in a distributed store: each rank loads only its share of
    `source` and every rank reads every sample.

    Samples keep the source's structure (a value, tuple/list or dict) and each field's shape
    and dtype; tensors come back as tensors, arrays as arrays, Python numbers as the same type,
    numpy records (stored as bytes) with the same layout. One store variable per field, named
    f"{name}/{key}".

    add_device= (e.g. "cuda", "cuda:1", a torch.device, or True for the current GPU): each
    rank's share of every field lives in that device's memory, registered with libfabric
    (FI_HMEM: GPUDirect RDMA on cxi and verbs), so other ranks read it with one-sided reads
    straight from the GPU. Needs method=1 or 2 (method=0 with several ranks raises
    DDStoreUnsupportedError; a one-process store works) and a provider with FI_HMEM (else a
    DDStoreUnsupportedError names the provider). The share is loaded through a host buffer of
    one chunk. This rank's own rows are gathered on the device with torch and copied once; read
    rows arrive in host memory (device= moves batches to the GPU). Forked DataLoader workers
    read every row, their own too, through the fabric. chunk_size= cannot be combined with it.

    ragged= (fields whose size varies from sample to sample along one axis): {key: axis} for
    those fields, or "auto" (every rank scans the shapes of its share once; the axes that differ
    anywhere are agreed by all ranks). torch_geometric Data samples need none: each tensor field
    is ragged along the axis Data batches it on, and samples come back as their own class (a
    Data subclass too, taken from each rank's own samples). Each ragged field
    is one ragged store variable (values plus per-row offsets kept by their owner); a batch is
    one ragged read per field. While loading, ragged rows are gathered in blocks that are given
    back as they are written into the variable (no second copy of the share). Not with
    add_device=.

    Loading keeps DDSTORE_LOAD_DEPTH (default 32) reads in flight and writes rows straight into
    the share: threads calling source[i] (load_workers="threads", the default), or forked
    processes filling a shared staging area (load_workers="processes", the default for a source
    with ``thread_safe = False``; a worker that finishes no sample for DDSTORE_LOAD_TIMEOUT_S is
    killed and named; compressed h5py datasets are read by forked processes with their own
    handles unless load_workers="threads"). Sources whose rows lie in files are read in Rust
    straight into the share (many preads in flight, the GIL released) instead of per-sample
    calls: a list of .npy file
    paths, an np.memmap, an h5py dataset stored contiguously or in unfiltered chunks of whole
    rows; compressed h5py datasets and zarr arrays are read in chunk-aligned slices.
    DDSTORE_LOAD_DIRECT=1 reads files with O_DIRECT.
    chunk_size= sets the rows per read of array and file sources. ``ds.load_stats`` holds each
    rank's load figures; ``ds.save(path)`` / ``DistDataset.restore(path)`` snapshot the shares.

    comm=None resolves as for PyDDStore (MPI, else the default torch.distributed group,
    else a FileComm); under torchrun, mpirun or srun without any of them it raises instead
    of making a one-rank store. A DistDataset pickles to a handle that spawn and forkserver
    DataLoader workers re-attach through the fabric (methods 1 and 2).

    Args:
        source (Dataset | Sequence | numpy.ndarray | torch.Tensor): map-style (`len()` and `[i]`), a list of
            `.npy` paths, an `np.memmap`, an h5py dataset, a zarr array, an array or tensor; every rank passes
            the same samples.
        name (str): the dataset's name: its variables are `{name}/{key}`.
        comm (object | None): as `PyDDStore`'s: an mpi4py communicator, a torch.distributed group, a
            `FileComm`, or None (resolved: MPI, else the default torch group, else a FileComm).
        ddstore_width (int | None): split the ranks into independent stores of that many ranks, each holding
            a whole copy.
        device (str | torch.device | None): move read samples and batches there.
        add_device (str | torch.device | bool | None): hold each rank's share in that device's memory
            ("cuda", "cuda:1", True: the current GPU); methods 1 and 2 with a provider that has FI_HMEM.
        method (int | None): 0 MPI RMA, 1 libfabric, 2 libfabric readable by other jobs; None:
            DDSTORE_METHOD, else by communicator.
        handshake_dir (str | None): directory for the file communicator and method-2 records; None:
            DDSTORE_HANDSHAKE_DIR.
        chunk_size (int | None): rows per read of array and file sources (not with add_device); None: sized
            so the reads in flight stay within ~10% of the share.
        encode (Callable | None): applied to each source sample before it is stored (returns the fields to
            keep).
        decode (Callable | None): applied to each sample read back.
        fields (Sequence[str | int] | None): keep only these keys or positions of each sample.
        ragged (dict[str | int, int] | str | None): fields whose size varies along one axis: {key: axis}, or
            "auto" (the axes that differ, found by scanning once); torch_geometric Data needs none.
        load_workers (str | None): "threads" calling `source[i]`, or "processes" (forked, for sources that
            are not thread-safe); None: threads, or processes when the source has `thread_safe = False`.
        memory_limit (int | None): bytes of this rank's share kept in memory (all fields together);
            later samples go to a spill file in `spill_dir`, written during the same load (see the
            "Datasets larger than memory" guide). None: `DDSTORE_MEMORY_LIMIT`, else all in memory.
        spill_dir (str | None): where spill files go; None: `DDSTORE_SPILL_DIR`, else
            `$TMPDIR/ddstore-spill-<uid>`.

    Example:
        ```python
        import torch
        from mpi4py import MPI
        from pyddstore.torch import DistDataset, DistributedSampler, ThreadDataLoader

        trainset = DistDataset(my_dataset, "train", MPI.COMM_WORLD)  # each rank loads its share
        sampler = DistributedSampler(trainset)
        loader = ThreadDataLoader(trainset, batch_size=128, sampler=sampler, num_workers=1)
        for x, y in loader:
            ...
        ```
    """

    def __init__(
        self,
        source: Any,
        name: str,
        comm: Any = None,
        ddstore_width: int | None = None,
        device: Any = None,
        add_device: Any = None,
        method: int | None = None,
        handshake_dir: str | None = None,
        chunk_size: int | None = None,
        encode: Any = None,
        decode: Any = None,
        fields: Any = None,
        ragged: Any = None,
        load_workers: str | None = None,
        *,
        memory_limit: int | None = None,
        spill_dir: str | None = None,
    ):
        super().__init__()
        if load_workers not in (None, "threads", "processes"):
            raise DDStoreValueError(
                f"load_workers={load_workers!r}: expected 'threads', 'processes' or None (threads, or "
                "processes for sources with thread_safe = False)"
            )
        self._load_workers = load_workers
        if not isinstance(name, str) or not name:
            raise DDStoreValueError("name must be a non-empty string")
        if fields is not None and encode is not None:
            raise DDStoreValueError(
                "fields= cannot be combined with encode=: return only the fields to keep from encode"
            )
        if fields is not None and (isinstance(fields, (str, int)) or not len(fields)):
            raise DDStoreValueError(f"fields= must be a non-empty list of keys or positions, got {fields!r}")
        if chunk_size is not None and (int(chunk_size) != chunk_size or chunk_size < 1):
            raise DDStoreValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")
        if chunk_size is not None and add_device is not None and add_device is not False:
            raise DDStoreValueError(
                "chunk_size= loads the share into host storage; it cannot be used with add_device="
            )
        if is_npy_list(source):  # every rank reads the same headers: same result or same error
            source = npy_files(source)
        settings = _spill_settings(_env_settings(), memory_limit, spill_dir)  # this dataset's and its store's
        self._share_device = _resolve_add_device(add_device, settings.test_host_as_device)
        self._device_shares = {}
        self.name = name
        self._add_device = add_device
        store = PyDDStore(
            comm,
            method=method,
            handshake_dir=handshake_dir or "",
            ddstore_width=ddstore_width,
            settings=settings,
        )
        hs = self._handshake_dir = store.handshake_dir
        try:
            world = getattr(store, "world_size", store.size)
            if store.method == 2 and store.size != world:
                raise DDStoreValueError("method=2 needs one group: ddstore_width cannot split the core group")
            n = _source_len(source)
            schema = self._agree_schema(store, source, name, encode, fields, n, ragged)
            if ragged == "auto":
                self._agree_ragged_axes(store, source, schema, encode, n)
            if schema.ragged_fields and self._share_device is not None:
                raise DDStoreUnsupportedError(
                    "add_device= does not hold ragged fields yet: leave add_device unset"
                )
            self._load(
                store,
                schema,
                n,
                functools.partial(self._load_share, store, source, schema, encode, chunk_size),
            )
        except BaseException:
            self._free_quietly(store)
            raise
        self._start_reading(store, schema, n, device, decode, hs, name)

    def save(self, path: str) -> None:
        """Collective: writes every rank's share of every field to the directory path (one file
        per rank in the store's layout plus manifest.json: schema, counts, sizes, checksums).
        DistDataset.restore(path) loads it back, on any number of ranks. path must not hold a
        snapshot yet. The source's namedtuple/dict subclasses and encode/decode are not saved.

        Args:
            path (str | os.PathLike): a directory (created) that holds no snapshot yet, reachable by every
                rank.
        """
        if self._freed:
            raise DDStoreFreedError("this dataset was freed")
        store = self._store
        start, count = share_of(self._n, store.size, store.rank)
        path = os.fspath(path)
        err = None
        if store.rank == 0:
            try:
                _snapshot.prepare_directory(path)
            except Exception as e:  # noqa: BLE001 - every rank must learn of the failure
                err = e
        _agree(store, err)
        entry, err = None, None
        try:
            entry = _snapshot.write_rank_file(self, path, start, count)
        except Exception as e:  # noqa: BLE001
            err = e
        entries = _agree(store, err, entry)
        err = None
        if store.rank == 0:
            try:
                _snapshot.write_manifest(path, self.name, self._n, self._schema, entries)
            except Exception as e:  # noqa: BLE001
                err = e
        _agree(store, err)

    @classmethod
    def restore(
        cls,
        path: str,
        name: str | None = None,
        comm: Any = None,
        ddstore_width: int | None = None,
        device: Any = None,
        method: int | None = None,
        handshake_dir: str | None = None,
        decode: Any = None,
        data_cls: Any = None,
        *,
        memory_limit: int | None = None,
        spill_dir: str | None = None,
    ) -> DistDataset:
        """Collective: the dataset a DistDataset.save(path) wrote, loaded with large reads
        (DDSTORE_LOAD_DEPTH in flight, O_DIRECT with DDSTORE_LOAD_DIRECT=1) on this group of
        any size (rows re-split evenly). name= renames it (default: the saved name). Every
        block is checked against the manifest's checksums; a corrupt, truncated or mismatched
        snapshot raises SnapshotError naming the file. Graph samples come back as data_cls (a
        torch_geometric Data or HeteroData subclass), else as Data or HeteroData: no class is
        imported by a name read from the snapshot.

        Args:
            path (str | os.PathLike): the directory `save(path)` wrote.
            name (str | None): the restored dataset's name; None: the saved one.
            comm (object | None): as for `DistDataset`; any number of ranks.
            ddstore_width (int | None): as for `DistDataset`.
            device (str | torch.device | None): move read samples and batches there.
            method (int | None): as for `DistDataset`.
            handshake_dir (str | None): as for `DistDataset`.
            decode (Callable | None): applied to each sample read back (snapshots do not keep one).
            data_cls (type | None): the torch_geometric Data or HeteroData subclass graph samples come back
                as; None: Data or HeteroData.
            memory_limit (int | None): as for `DistDataset`: rows past it are restored into spill files.
            spill_dir (str | None): as for `DistDataset`.
        """
        _check_data_cls(data_cls, "DistDataset.restore")
        self = cls.__new__(cls)
        _StoredDataset.__init__(self)
        self._share_device = None
        self._device_shares = {}
        self._add_device = None
        self._load_workers = None
        path = os.fspath(path)
        store = PyDDStore(
            comm,
            method=method,
            handshake_dir=handshake_dir or "",
            ddstore_width=ddstore_width,
            settings=_spill_settings(_env_settings(), memory_limit, spill_dir),
        )
        hs = self._handshake_dir = store.handshake_dir
        try:
            manifest, digest, err = None, None, None
            try:
                manifest, digest = _snapshot.read_manifest(path)
                name = _snapshot.check_restorable(manifest, path, name)
            except Exception as e:  # noqa: BLE001 - every rank must learn of the failure
                err = e
            digests = _agree(store, err, digest)
            if len(set(digests)) != 1:
                raise _snapshot.SnapshotError(
                    f"{os.path.join(path, _snapshot.MANIFEST)} differs between ranks (changed while read?)"
                )
            self.name = name
            schema = Schema.from_json(manifest["schema"])
            _use_data_cls(schema, data_cls, f"DistDataset.restore({path!r})")
            for f in schema.fields:
                f.var = f"{name}/{f.key}"
            n = manifest["num_samples"]
            direct = _load.load_direct(store.settings)

            def fill(start, count, depth, progress):
                stats = _load.LoadStats("snapshot", depth)
                stats.ragged = _snapshot.restore_share(
                    manifest,
                    path,
                    schema,
                    start,
                    count,
                    lambda f: functools.partial(store.load_file_ranges, f.var),
                    depth,
                    direct,
                    stats,
                    progress,
                )
                return stats

            self._load(store, schema, n, fill)
        except BaseException:
            self._free_quietly(store)
            raise
        self._start_reading(store, schema, n, device, decode, hs, name)
        return self

    @staticmethod
    def _free_quietly(store: Any) -> None:
        # Already failing: the original error matters more than one from freeing.
        with contextlib.suppress(DDStoreError):
            store.free()

    @staticmethod
    def _sample(source: Any, i: int, encode: Any) -> Any:
        s = source[i]
        return encode(s) if encode is not None else s

    def _agree_schema(
        self, store: Any, source: Any, name: str, encode: Any, fields: Any, n: int, ragged: Any = None
    ) -> Schema:
        """Rank 0 infers the schema from sample 0; every rank gets it (or the same error)."""
        payload, local_err = None, None
        if store.rank == 0:
            try:
                if n == 0:
                    raise SchemaError("the source is empty")
                if ragged is not None and ragged != "auto" and not isinstance(ragged, dict):
                    raise SchemaError(f"ragged={ragged!r} must be a dict {{key: axis}}, 'auto' or None")
                sample = self._sample(source, 0, encode)
                if ragged == "auto":
                    schema = Schema.infer(sample, name, fields, allow_empty=True)
                else:
                    schema = Schema.infer(sample, name, fields, ragged)
                payload = ("ok", schema.to_json(), _type_name(schema.seq_type))
            except Exception as e:  # noqa: BLE001 - every rank must learn of the failure
                local_err = e
                payload = ("err", _error_payload(e, 0))
        agreed = store.allgather(payload)[0]
        if agreed[0] == "err":
            raise local_err if local_err is not None else _rebuild_error(agreed[1])
        seq_type = schema.seq_type if store.rank == 0 else _type_from_name(agreed[2])
        if store.rank != 0 and agreed[1].get("structure") in PYG_STRUCTURES:
            seq_type = self._own_data_class(store, source, encode, n, agreed[2])
        return Schema.from_json(agreed[1], seq_type)

    def _own_data_class(self, store: Any, source: Any, encode: Any, n: int, name: Any) -> Any:
        """The Data (subclass) rank 0 found, as this rank's own samples give it: the class object
        of the first sample of its share (else sample 0), when its name is the one rank 0 sent;
        never imported or looked up by that name. None (plain Data) otherwise."""
        start, count = share_of(n, store.size, store.rank)
        try:
            cls = type(self._sample(source, start if count else 0, encode))
        except Exception:  # noqa: BLE001 - reading its own sample fails later, with context
            return None
        return cls if pyg_structure_of(cls) is not None and _type_name(cls) == name else None

    def _agree_ragged_axes(self, store: Any, source: Any, schema: Schema, encode: Any, n: int) -> None:
        """ragged='auto': every rank scans the shapes of its share (one extra pass over the
        source); the axes along which a field differs from sample 0 anywhere are agreed by
        every rank (JSON-able lists) and become ragged. A field may vary along one axis."""
        start, count = share_of(n, store.size, store.rank)
        varying: dict = {}
        payload = None
        try:
            for i in range(start, start + count):
                values = schema.field_values(self._sample(source, i, encode), i)
                for f, v in zip(schema.fields, values):
                    if f.kind not in (TENSOR, NDARRAY):
                        f.validate(v, i)
                        continue
                    shape = tuple(v.shape) if isinstance(v, (torch.Tensor, np.ndarray)) else None
                    if shape is None or len(shape) != len(f.shape):
                        f.validate(v, i)  # raises with the sample and field named
                    for axis, (a, b) in enumerate(zip(shape, f.shape)):
                        if a != b:
                            varying.setdefault(f.key, set()).add(axis)
        except Exception as e:  # noqa: BLE001 - every rank must learn of the failure
            payload = _error_payload(e, store.rank)
        mine = {"error": payload, "varying": [[k, sorted(a)] for k, a in varying.items()]}
        results = store.allgather(mine)
        failed = [r["error"] for r in results if r["error"] is not None]
        if failed:
            raise _rebuild_error(tuple(failed[0]))
        merged: dict = {}
        for r in results:
            for k, axes in r["varying"]:
                merged.setdefault(k, set()).update(axes)
        for f in schema.fields:
            axes = sorted(merged.get(f.key, ()))
            if len(axes) > 1:
                raise SchemaError(
                    f"field {f.key!r} varies along axes {axes}; a ragged field may vary along one axis only"
                )
            if axes:
                f.make_ragged(axes[0], f"field {f.key!r}")
            elif f.count == 0:
                raise SchemaError(f"field {f.key!r}: shape {f.shape} has no elements in any sample")

    def _load(self, store: Any, schema: Schema, n: int, fill: Any) -> None:
        """Writes this rank's share straight into the store with many reads in flight
        (DDSTORE_LOAD_DEPTH); every rank learns whether all ranks succeeded before the dataset
        exists."""
        rank, size = store.rank, store.size
        start, count = share_of(n, size, rank)
        for f in schema.fixed_fields:
            disp, itemsize, dtype = f.init_args()
            if self._share_device is None:
                store.init(f.var, count, disp, itemsize=itemsize, dtype=dtype)
            else:
                self._init_device_share(store, f, start, count)
        quiet = store.settings.quiet
        err, payload = None, None
        ragged: dict = {}
        stats = _load.LoadStats("samples", 1)
        progress = None
        try:
            depth = _load.load_depth(store.settings)
            fixed_bytes = count * sum(f.row_bytes for f in schema.fixed_fields)
            progress = _load.Progress(
                fixed_bytes if not schema.ragged_fields else 0,
                rank == 0 and not quiet,
                f"loading {self.name}",
                samples=count,
            )
            stats = fill(start, count, depth, progress)
            ragged = stats.ragged
        except Exception as e:  # noqa: BLE001 - every rank must learn of the failure
            err, payload = e, _error_payload(e, rank)
        finally:
            if progress is not None:
                progress.close()
        if err is None and self._share_device is not None:
            _sync_device(self._share_device[0])
        stats.finish()
        max_lens = [int(p.lengths.max()) if len(p.lengths) else 0 for p in ragged.values()]
        mine = {"error": payload, "max_lens": max_lens, "stats": stats.to_json()}
        st = mine["stats"]
        _LOG.debug(
            "%s: loaded rows %d..%d (%s bytes) in %.3f s",
            self.name,
            start,
            start + count,
            st.get("nbytes"),
            st.get("secs", 0.0),
            extra={"rank": rank},
        )
        results = store.allgather(mine)
        failed = [r["error"] for r in results if r["error"] is not None]
        if failed:
            raise err if err is not None else _rebuild_error(tuple(failed[0]))
        # Collective, in schema order on every rank: each ragged field from this rank's share.
        # Each is created from its lengths and filled in place (no second copy of the values).
        for j, f in enumerate(schema.ragged_fields):
            part = ragged.pop(f.key)
            _load.add_ragged_in_place(
                store, f.var, f, part.lengths, lambda var, part=part: part.write(store, var), _agree
            )
            del part
            f.max_len = max(r["max_lens"][j] for r in results)
        self.load_stats = [r["stats"] for r in results]
        if rank == 0 and not quiet:
            summary = _load_summary(self.name, n, size, self.load_stats).removeprefix("pyddstore: ")
            _LOG.info("loaded %s", summary, extra={"rank": rank})

    def _load_share(self, store, source, schema, encode, chunk_size, start, count, depth, progress):
        """This rank's rows into its share, by the fastest path the source allows."""
        put = functools.partial(self._put, store)
        plain = encode is None and not schema.ragged_fields
        rows_src = file_rows_of(source) if plain and len(schema.fields) == 1 else None
        f0 = schema.fields[0]
        if rows_src is not None and _bulk_fits(rows_src, f0) and self._share_device is None:
            stats = _load.LoadStats("files", depth)
            _load.load_file_rows(
                rows_src,
                start,
                count,
                functools.partial(store.load_file_ranges, f0.var),
                depth,
                _load.load_direct(store.settings),
                stats,
                progress,
                chunk_size,
            )
        else:
            arrays = _bulk_arrays(source) if plain else None
            if arrays is not None and all(
                f.key in arrays and _bulk_fits(arrays[f.key], f) for f in schema.fields
            ):
                stats = _load.LoadStats("arrays", depth)
                for f in schema.fields:
                    _load.load_sliced(
                        arrays[f.key],
                        f,
                        start,
                        count,
                        put,
                        depth,
                        stats,
                        progress,
                        _bulk_slice_of(f),
                        chunk_size,
                        h5py_reopener(arrays[f.key]),
                        0 if self._load_workers == "threads" else min(depth, _cpus()),
                    )
            else:
                mode = self._load_workers
                if mode is None:
                    mode = "threads" if getattr(source, "thread_safe", True) is not False else "processes"
                if mode == "processes" and not schema.ragged_fields:
                    workers = max(1, min(depth, count, _cpus()))
                    stats = _load.LoadStats("samples (processes)", workers)
                    _load.load_samples_forked(
                        source, schema, encode, start, count, put, workers, stats, progress
                    )
                    return stats
                if mode == "processes":  # ragged rows cannot come back through the staging area
                    depth = 1
                stats = _load.LoadStats("samples", min(depth, max(1, count)))
                if depth == 1 and mode == "processes":
                    stats.notes.append("ragged fields load in one thread without thread-safe sources")
                stats.ragged = _load.load_samples(
                    source, schema, encode, start, count, put, depth, stats, progress
                )
                return stats
        stats.ragged = {}
        return stats

    def _init_device_share(self, store: Any, f: Field, start: int, count: int) -> None:
        """Collective: allocates this rank's share of f on the device; the store registers it and
        returns the DeviceShare that owns it."""
        dev, iface, index = self._share_device
        tensor = torch.empty((count, f.row_bytes), dtype=torch.uint8, device=dev)
        disp, itemsize, dtype = f.init_args()
        if dtype is not None:
            itemsize = np.dtype(dtype).itemsize
        share = store.init_device(
            f.var, count, f.row_bytes, tensor, iface, index, itemsize=itemsize, dtype=_dtype_name(dtype)
        )
        assert share.start == start and share.count == count, (share, start, count)
        self._device_shares[f.var] = share

    def _put(self, store: Any, f: Field, rows: np.ndarray, offset: int) -> None:
        """Writes rows of this rank's share from offset: to the store, or (add_device=) through
        the field's DeviceShare (one host-to-device copy)."""
        share = self._device_shares.get(f.var)
        if share is None:
            store.update(f.var, rows, offset=offset)
        else:
            share.write(rows, offset)

    @staticmethod
    def _write_meta(hs: str, name: str, n_core: int, n: int, schema: Schema) -> None:
        """{handshake_dir}/{name}.meta.json: what a DistDatasetReader needs to read the fields."""
        if not hs:
            raise DDStoreValueError("method=2 needs handshake_dir= (or DDSTORE_HANDSHAKE_DIR)")
        meta = {"version": META_VERSION, "name": name, "n_core": n_core, "num_samples": n, **schema.to_json()}
        path = os.path.join(hs, f"{name}.meta.json")
        write_private(path, json.dumps(meta, indent=1).encode())  # owner-only, atomic


def read_meta(path: str, timeout: float) -> dict:
    """Waits up to timeout seconds for a meta file written by a core group and reads it."""
    raw = wait_and_read(
        path,
        timeout,
        f"{path} did not appear within {timeout:.0f} s: is the core group (DistDataset with "
        "method=2 and the same handshake_dir) running?",
    )
    meta = load_json_object(raw, path)
    if meta.get("version") != META_VERSION or isinstance(meta.get("version"), bool):
        raise DDStoreValueError(f"{path}: meta version {meta.get('version')!r} is not {META_VERSION}")
    for key in ("n_core", "num_samples"):
        value = meta.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**62:
            raise DDStoreValueError(f"{path}: {key!r} must be a non-negative integer, got {value!r}")
    try:
        Schema.from_json(meta)
    except DDStoreError:
        raise
    except Exception as e:  # noqa: BLE001 - any malformed field description
        what = f"{type(e).__name__}: {e}"
        raise DDStoreValueError(f"{path}: the field descriptions are malformed ({what})") from None
    return meta


class DistDatasetReader(_StoredDataset):
    """The dataset a method-2 core group (DistDataset(..., method=2)) holds, read from a
    separate extra job. Fields come from {handshake_dir}/{name}.meta.json. Graph samples come
    back as ``data_cls`` (a torch_geometric ``Data`` or ``HeteroData`` subclass the caller passes;
    else ``Data`` or ``HeteroData``: no class is ever imported by a name read from the meta file).

    Args:
        name (str): the name the core group's DistDataset was given.
        handshake_dir (str | None): where the core group publishes; None: DDSTORE_HANDSHAKE_DIR.
        n_core (int | None): ranks of the core group; None: DDSTORE_N_CORE, else from its records.
        device (str | torch.device | None): move read samples and batches there.
        decode (Callable | None): applied to each sample read back.
        data_cls (type | None): the torch_geometric Data or HeteroData subclass graph samples come back as;
            None: Data or HeteroData.

    Example:
        ```python
        # core job:  DistDataset(src, "train", method=2, handshake_dir=hs)
        reader = DistDatasetReader("train", handshake_dir=hs)
        x, y = reader[0]
        ```
    """

    def __init__(
        self,
        name: str,
        handshake_dir: str | None = None,
        n_core: int | None = None,
        device: Any = None,
        decode: Any = None,
        data_cls: Any = None,
    ):
        super().__init__()
        _check_data_cls(data_cls, "DistDatasetReader")
        settings = _env_settings()  # one snapshot: this reader's and its store's
        hs = handshake_dir or settings.handshake_dir
        if not hs:
            raise DDStoreValueError("DistDatasetReader needs handshake_dir= (or DDSTORE_HANDSHAKE_DIR)")
        meta = read_meta(os.path.join(hs, f"{name}.meta.json"), settings.handshake_timeout_s)
        if n_core is None:
            n_core = settings.n_core if settings.is_set("n_core") else int(meta["n_core"])
        self.name = name
        self.meta = meta
        schema = Schema.from_json(meta)
        _use_data_cls(schema, data_cls, f"DistDatasetReader('{name}')")
        store = PyDDStore(None, method=2, handshake_dir=hs, n_core=int(n_core), settings=settings)
        for f in schema.fields:
            store.join(f.var)
        n = int(meta["num_samples"])
        for f in schema.fields:
            total = store.info(f.var)[0]
            if total != n:
                raise DDStoreError(f"{f.var}: the core group holds {total} rows, the meta file says {n}")
        self._init_reading(store, schema, n, device, decode)


def _check_data_cls(data_cls: Any, who: str) -> None:
    if data_cls is not None and pyg_structure_of(data_cls) is None:
        raise DDStoreTypeError(
            f"{who}(data_cls={data_cls!r}): expected torch_geometric.data.Data, HeteroData "
            "or a subclass of one"
        )


def _use_data_cls(schema: Schema, data_cls: Any, who: str) -> None:
    """Graph samples of `schema` are built as data_cls (checked against the stored structure).
    The class always comes from the caller, never from a name read from a file."""
    if data_cls is None:
        return
    if schema.structure != pyg_structure_of(data_cls):
        held = f"{schema.structure}s"
        if schema.structure in PYG_STRUCTURES:
            held = "torch_geometric " + ("HeteroData" if schema.structure == PYG_HETERO else "Data")
        raise DDStoreTypeError(
            f"{who} with data_cls={data_cls.__name__}: the dataset's samples are {held}, "
            f"not {data_cls.__name__}"
        )
    schema.seq_type = data_cls


def _drop_mapped_pages(array) -> None:
    """A memory-mapped source keeps every page it was read from resident: drop them once copied,
    so loading from a file costs one chunk besides the share, not the whole file."""
    mm = getattr(array, "_mmap", None) or getattr(getattr(array, "base", None), "_mmap", None)
    if mm is not None and hasattr(mm, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
        with contextlib.suppress(OSError, ValueError):
            mm.madvise(mmap.MADV_DONTNEED)
