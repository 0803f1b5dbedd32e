"""DistDataset: the core group's dataset, every rank loading its share.

Building one is four steps, each in its own module: the arguments are checked (here); the
ranks agree on the schema (_agree.py); every rank loads its share (_load.py, the reads in
flight of _load_runner.py); then it reads like any stored dataset (_read.py). Snapshots
(save/restore) write and read the shares as they lie in the store (_snapshot.py).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol, Union

import numpy as np
import torch
from torch.utils.data import Dataset

from pyddstore import (
    DDStoreError,
    DDStoreFreedError,
    DDStoreTypeError,
    DDStoreUnsupportedError,
    DDStoreValueError,
    Method,
    PyDDStore,
    Settings,
)
from pyddstore._env import settings as _env_settings
from pyddstore._log import get_logger
from pyddstore._shares import share_of
from pyddstore._sources import is_npy_list, npy_files

from . import _device, _load, _load_runner, _ragged_parts, _snapshot
from ._agree import agree, agree_ragged_axes, agree_schema, error_payload, rebuild_error
from ._field import Field
from ._read import _StoredDataset
from ._schema import Schema, check_data_cls, use_data_cls
from ._spans import span

_LOG = get_logger("torch")


class ArrayLike(Protocol):
    """An array with rows: shape, dtype and slicing along the first axis (an h5py dataset, a
    zarr array)."""

    shape: tuple[int, ...]
    dtype: Any

    def __getitem__(self, index: Any) -> Any: ...


# What DistDataset loads from: a map-style dataset, a list of samples or of .npy paths, an
# array, memmap or tensor, or another array-like.
Source = Union[Dataset, Sequence[Any], np.ndarray, torch.Tensor, ArrayLike]
Device = Union[str, torch.device]


def _check_arguments(
    name: Any, encode: Any, fields: Any, chunk_size: Any, add_device: Any, load_workers: Any
) -> None:
    """DistDataset's argument checks that need no store (each error names the argument)."""
    if load_workers not in (None, "threads", "processes"):
        raise DDStoreValueError(
            f"load_workers={load_workers!r}: expected 'threads', 'processes' or None (threads, or "
            "processes for sources with thread_safe = False and for samples of 4 MiB or more)"
        )
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


def _spill_settings(settings: Settings, memory_limit: int | None, spill_dir: Any) -> Settings:
    """`settings` with a dataset's memory budget and spill directory (arguments win over variables)."""
    over: dict = {}
    if memory_limit is not None:
        over["memory_limit"] = memory_limit
    if spill_dir is not None:
        over["spill_dir"] = os.fspath(spill_dir)
    return settings.replace(**over) if over else settings


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
    with ``thread_safe = False`` and, on 4 or more cores, for samples of 4 MiB or more, whose
    decoding in Python holds the GIL; a worker that finishes no sample for DDSTORE_LOAD_TIMEOUT_S is
    killed and named; compressed h5py datasets are read by forked processes with their own
    handles unless load_workers="threads"). Sources whose rows lie in files are read in Rust
    straight into the share (many preads in flight, the GIL released) instead of per-sample
    calls: a list of .npy file
    paths, an np.memmap, an h5py dataset stored contiguously or in unfiltered chunks of whole
    rows; compressed h5py datasets and zarr arrays are read in chunk-aligned slices.
    DDSTORE_LOAD_DIRECT=1 reads files with O_DIRECT; buffered reads of those files drop their
    pages from the page cache once loaded. The samples a load holds in flight besides the share
    stay within 16 MiB + a tenth of the memory budget (256 MiB at most): fewer readers for large
    samples. With memory_limit= and no method under mpirun, method 1 is used (method 0 cannot
    spill).
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
        method (int | str | None): 0 MPI RMA, 1 libfabric, 2 libfabric readable by other jobs, or a
            `pyddstore.Method` member or name in any case ("LIBFABRIC"); None: DDSTORE_METHOD, else by
            communicator.
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
            are not thread-safe); None: threads, or processes when the source has `thread_safe = False`
            or (on 4+ cores) its samples are 4 MiB or larger.
        settings (pyddstore.Settings | None): the settings of this dataset and its store (e.g.
            `Settings.from_env(quiet=True, load_depth=8)`); None: the environment's, read once.
        memory_limit (int | None): bytes of this rank's share kept in memory (all fields together);
            later samples go to a spill file in `spill_dir`, written during the same load (see the
            "Datasets larger than memory" guide). None: the settings' `DDSTORE_MEMORY_LIMIT`, else all
            in memory.
        spill_dir (str | os.PathLike | None): where spill files go; None: `DDSTORE_SPILL_DIR`, else
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
        source: Source,
        name: str,
        comm: object | None = None,
        ddstore_width: int | None = None,
        device: Device | None = None,
        add_device: Device | bool | None = None,
        method: int | str | None = None,
        handshake_dir: str | None = None,
        chunk_size: int | None = None,
        encode: Callable[[Any], Any] | None = None,
        decode: Callable[[Any, int], Any] | None = None,
        fields: Sequence[str | int] | None = None,
        ragged: dict[str | int, int] | Literal["auto"] | None = None,
        load_workers: Literal["threads", "processes"] | None = None,
        *,
        settings: Settings | None = None,
        memory_limit: int | None = None,
        spill_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        super().__init__()
        _check_arguments(name, encode, fields, chunk_size, add_device, load_workers)
        self._load_workers = load_workers
        if is_npy_list(source):  # every rank reads the same headers: same result or same error
            source = npy_files(source)
        if settings is None:
            settings = _env_settings()  # one snapshot: this dataset's and its store's
        elif not isinstance(settings, Settings):
            raise DDStoreTypeError(f"settings={settings!r} is not a pyddstore.Settings")
        settings = _spill_settings(settings, memory_limit, spill_dir)
        self._share_device = _device.resolve_add_device(add_device, settings.test_host_as_device)
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
            if store.method == Method.LIBFABRIC_EXTRA_JOBS and store.size != world:
                raise DDStoreValueError("method=2 needs one group: ddstore_width cannot split the core group")
            n = _load.source_len(source)
            schema = agree_schema(store, source, name, encode, fields, n, ragged)
            if ragged == "auto":
                agree_ragged_axes(store, source, schema, encode, n)
            if schema.ragged_fields and self._share_device is not None:
                raise DDStoreUnsupportedError(
                    "add_device= does not hold ragged fields yet: leave add_device unset"
                )
            self._load(
                store,
                schema,
                n,
                functools.partial(
                    _load.load_share,
                    store,
                    source,
                    schema,
                    encode,
                    chunk_size,
                    load_workers,
                    functools.partial(self._put, store),
                    self._share_device is not None,
                ),
            )
        except BaseException:
            self._free_quietly(store)
            raise
        self._start_reading(store, schema, n, device, decode, hs, name)

    def save(self, path: str | os.PathLike[str]) -> None:
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
        agree(store, err)
        entry, err = None, None
        try:
            entry = _snapshot.write_rank_file(self, path, start, count)
        except Exception as e:  # noqa: BLE001
            err = e
        entries = agree(store, err, entry)
        err = None
        if store.rank == 0:
            try:
                _snapshot.write_manifest(path, self.name, self._n, self._schema, entries)
            except Exception as e:  # noqa: BLE001
                err = e
        agree(store, err)

    @classmethod
    def restore(
        cls,
        path: str | os.PathLike[str],
        name: str | None = None,
        comm: object | None = None,
        ddstore_width: int | None = None,
        device: Device | None = None,
        method: int | str | None = None,
        handshake_dir: str | None = None,
        decode: Callable[[Any, int], Any] | None = None,
        data_cls: type | None = None,
        *,
        memory_limit: int | None = None,
        spill_dir: str | os.PathLike[str] | None = None,
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
            spill_dir (str | os.PathLike | None): as for `DistDataset`.
        """
        check_data_cls(data_cls, "DistDataset.restore")
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
            digests = agree(store, err, digest)
            if len(set(digests)) != 1:
                raise _snapshot.SnapshotError(
                    f"{os.path.join(path, _snapshot.MANIFEST)} differs between ranks (changed while read?)"
                )
            self.name = name
            schema = Schema.from_json(manifest["schema"])
            use_data_cls(schema, data_cls, f"DistDataset.restore({path!r})")
            for f in schema.fields:
                f.var = f"{name}/{f.key}"
            n = manifest["num_samples"]
            direct = _load_runner.load_direct(store.settings)

            def fill(start, count, depth, progress):
                stats = _load_runner.LoadStats("snapshot", depth)
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

    def _load(self, store: Any, schema: Schema, n: int, fill: Any) -> None:
        """Writes this rank's share straight into the store with many reads in flight
        (DDSTORE_LOAD_DEPTH); every rank learns whether all ranks succeeded before the dataset
        exists."""
        rank, size = store.rank, store.size
        start, count = share_of(n, size, rank)
        if self._share_device is None:
            # Every field in one exchange between the ranks, whatever their number.
            store._init_many([(f.var, count, *f.init_args()) for f in schema.fixed_fields])
        else:
            for f in schema.fixed_fields:
                share = _device.init_device_share(store, f, start, count, self._share_device)
                self._device_shares[f.var] = share
        quiet = store.settings.quiet
        err, payload = None, None
        ragged: dict = {}
        stats = _load_runner.LoadStats("samples", 1)
        progress = None
        try:
            depth = _load_runner.load_depth(store.settings)
            fixed_bytes = count * sum(f.row_bytes for f in schema.fixed_fields)
            progress = _load_runner.Progress(
                fixed_bytes if not schema.ragged_fields else 0,
                rank == 0 and not quiet,
                f"loading {self.name}",
                samples=count,
            )
            with span("pyddstore.load"):
                stats = fill(start, count, depth, progress)
            ragged = stats.ragged
        except Exception as e:  # noqa: BLE001 - every rank must learn of the failure
            err, payload = e, error_payload(e, rank)
        finally:
            if progress is not None:
                progress.close()
        if err is None and self._share_device is not None:
            _device.sync_device(self._share_device[0])
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
        with span("pyddstore.load.agree"):
            results = store.allgather(mine)
        failed = [r["error"] for r in results if r["error"] is not None]
        if failed:
            raise err if err is not None else rebuild_error(tuple(failed[0]))

        # Collective, in schema order on every rank: each ragged field from this rank's share.
        # Each is created from its lengths and filled in place (no second copy of the values).
        for j, f in enumerate(schema.ragged_fields):
            part = ragged.pop(f.key)
            _ragged_parts.add_ragged_in_place(
                store, f.var, f, part.lengths, lambda values_part, part=part: part.write(store, values_part)
            )
            del part
            f.max_len = max(r["max_lens"][j] for r in results)
        self.load_stats = [r["stats"] for r in results]
        if rank == 0 and not quiet:
            summary = _load_runner.load_summary(self.name, n, size, self.load_stats).removeprefix(
                "pyddstore: "
            )
            _LOG.info("loaded %s", summary, extra={"rank": rank})

    def _put(self, store: Any, f: Field, rows: np.ndarray, offset: int) -> None:
        """Writes rows of this rank's share from offset: to the store, or (add_device=) through
        the field's DeviceShare (one host-to-device copy)."""
        share = self._device_shares.get(f.var)
        if share is None:
            store.update(f.var, rows, offset=offset)
        else:
            share.write(rows, offset)
