"""PyDDStore: the store API of upstream pyddstore (HydraGNN style), plus
the methods pyddstore.torch builds on."""

from __future__ import annotations

import atexit
import itertools
import os
import sys
import time
import weakref

import numpy as np

from . import _abort, _handshake, _log, _native, _profile
from ._args import as_array as _as_array
from ._args import dtype_name as _dtype_name
from ._args import int_arg as _int
from ._collectives import StoreCollectives
from ._comm import resolve_comm
from ._env import check_fabric, resolve_method
from ._env import settings as _env_settings
from ._errors import (
    DDStoreError,
    DDStoreTypeError,
    DDStoreUnsupportedError,
    DDStoreValueError,
)
from ._kinds import CommKind, Method, ragged_parts
from ._profile import ProfileCounters, new_py_times
from ._store_internals import StoreInternals
from ._store_jobs import ExtraMember, RecvBuffers

_live_stores: weakref.WeakSet = weakref.WeakSet()
_made = itertools.count()  # stores are made collectively: the same order on every rank


@atexit.register
def _at_exit_all() -> None:
    for store in sorted(_live_stores, key=lambda s: s._made):
        store._at_exit()


def _path(p) -> str | None:
    """A path argument as text (None stays None)."""
    return None if p is None else os.fspath(p)


class PyDDStore(StoreCollectives, ProfileCounters, RecvBuffers, ExtraMember, StoreInternals):
    """A distributed store of named variables; each rank holds a share of
    every variable's rows and reads any row with one-sided reads.

    Args:
        comm: an mpi4py communicator, a torch.distributed group, a `pyddstore.FileComm`,
            or None (upstream's name; `comm_or_none=` is accepted too). None is
            `MPI.COMM_WORLD` when MPI is in use, else the default torch.distributed group
            when initialised, else a `FileComm` in `handshake_dir`. Under a launcher that
            says the job has several ranks (torchrun, mpirun, srun) and no communicator
            found, None raises `DDStoreValueError` instead of making a one-rank store.
        method: 0 reads with MPI RMA, 1 with libfabric, 2 with libfabric across jobs; a
            `Method` member or its name in any case (`"LIBFABRIC"`) is the same.
            Default: `DDSTORE_METHOD`, else 0 with an MPI communicator, else 1.
        handshake_dir: directory for the file communicator and method-2 records
            (default `DDSTORE_HANDSHAKE_DIR`).
        n_core: method 2 only: with `comm=None` and `n_core > 0` this process is
            an extra member that `join()`s a core group of `n_core` ranks.
        nic_map: per-local-rank NIC map, `"0:cxi0,1:cxi1"` or a dict (default
            `DDSTORE_NIC_MAP`).
        ddstore_width: split the group into independent stores of that many consecutive
            ranks (each group holds a whole copy).
        settings: a `pyddstore.Settings` to use instead of the environment's
            (`Settings.from_env(timeout_s=5)`); the arguments above go on top.
        comm_or_none: upstream's name of `comm` (keyword only); pass one of the two.
        extra_comm: method 2 extra member only (keyword): the extra job's own communicator (an
            mpi4py communicator, a torch.distributed group or a `FileComm`), collective. Its rank
            0 reads each record file and gives it to the others (with a `FileComm`: one member
            per node reads), instead of every member reading every record.

    The store reads every `DDSTORE_*` setting once, here: `store.settings` holds them,
    typed (`store.settings.timeout_s`), with `method`, `handshake_dir`, `n_core` and
    `nic_map` as given.

    Collective calls (`add`, `init`, `free`) must be made by every rank of the group in the
    same order. A store pickles to a handle that spawn/forkserver processes re-attach
    through the fabric (methods 1 and 2).

    Example:
        ```python
        from mpi4py import MPI
        import numpy as np
        import pyddstore

        store = pyddstore.PyDDStore(MPI.COMM_WORLD)  # method 0 under mpirun
        rows = np.full((100, 8), store.rank, dtype=np.float32)
        store.add("x", rows)  # collective: this rank's 100 rows
        out = np.empty((3, 8), np.float32)
        store.get_batch("x", out, [0, 150, 399])  # rows of any rank, any order
        store.free()
        ```
    """

    def __init__(
        self,
        comm: object | None = None,
        method: int | str | None = None,
        handshake_dir: str | os.PathLike = "",
        n_core: int = 0,
        nic_map: str | dict[int, str] | None = None,
        ddstore_width: int | None = None,
        *,
        comm_or_none: object | None = None,
        settings: _native.Settings | None = None,
        extra_comm: object | None = None,
    ):
        if comm is not None and comm_or_none is not None:
            raise DDStoreTypeError("pass the communicator once: comm= (or its older name comm_or_none=)")
        comm_or_none = comm if comm is not None else comm_or_none
        # Every setting is read and checked once, here, even where this store does not use it: a
        # typo must not pass silently.
        if settings is None:
            settings = _env_settings()
        elif not isinstance(settings, _native.Settings):
            raise DDStoreTypeError(f"settings={settings!r} is not a pyddstore.Settings")
        method = resolve_method(method, settings)
        if isinstance(n_core, bool) or not isinstance(n_core, int) or n_core < 0:
            raise DDStoreValueError(f"n_core={n_core!r} is not valid: expected a non-negative integer")
        if nic_map is not None and not isinstance(nic_map, str):
            nic_map = ",".join(f"{k}:{v}" for k, v in dict(nic_map).items())
        given = {
            "method": method,
            "handshake_dir": os.fspath(handshake_dir) if handshake_dir else None,
            "nic_map": nic_map,
            "n_core": n_core or None,
        }
        settings = settings.replace(**{k: v for k, v in given.items() if v is not None})
        check_fabric(settings)
        self.handshake_dir = settings.handshake_dir or ""
        self.n_core = n_core
        self.is_extra = method == Method.LIBFABRIC_EXTRA_JOBS and n_core > 0 and comm_or_none is None
        if extra_comm is not None and not self.is_extra:
            raise DDStoreValueError(
                "extra_comm= is for method=2 extra members (comm=None, n_core > 0): a core or "
                "single-job store takes its communicator as comm="
            )
        # What the extra job's members read of the core job's files, read once (see _handshake).
        self._record_comm = _handshake.RecordComm.of(extra_comm, settings)
        if self.is_extra:
            if not self.handshake_dir:
                raise DDStoreValueError(
                    "method=2 extra members need handshake_dir (where the core job publishes)"
                )
            comm = _native.Comm.single()
        else:
            comm = resolve_comm(comm_or_none, settings)
        if comm.kind == CommKind.MPI:  # an uncaught exception may have to end the job (_abort.py)
            _abort.install(settings.abort_on_exception)
        if method is None:
            method = Method.MPI_RMA if comm.kind == CommKind.MPI else Method.LIBFABRIC
            if method == Method.MPI_RMA and settings.memory_limit is not None:
                # MPI windows cover memory only: rows past a budget need an owner that serves them.
                method = Method.LIBFABRIC
                if comm.rank == 0:
                    _log.logger.info(
                        "memory_limit=%d given without a method: method 1 (libfabric) chosen, as "
                        "method 0 (MPI RMA) cannot serve spilled rows",
                        settings.memory_limit,
                        extra={"rank": comm.rank},
                    )
        method = int(method)  # store.method is the plain number, as upstream's
        if method == Method.MPI_RMA and comm.kind not in (CommKind.MPI, CommKind.SINGLE):
            raise DDStoreUnsupportedError(
                f"method=0 (MPI RMA) needs an MPI communicator, got a {comm.kind} communicator: "
                "use method=1 (libfabric), or pass an mpi4py communicator"
            )
        if method == Method.LIBFABRIC_EXTRA_JOBS and not self.handshake_dir:
            raise DDStoreValueError("method=2 needs handshake_dir (a directory the extra jobs can read)")
        self.world_rank, self.world_size = comm.rank, comm.size
        if ddstore_width is not None:
            if isinstance(ddstore_width, bool) or not isinstance(ddstore_width, int) or ddstore_width < 1:
                raise DDStoreValueError(
                    f"ddstore_width={ddstore_width!r} is not valid: expected a positive integer"
                )
            if comm.size % ddstore_width != 0:
                raise DDStoreValueError(
                    f"ddstore_width={ddstore_width} does not divide the {comm.size} ranks into equal groups"
                )
            self.group_id = comm.rank // ddstore_width
            comm = comm.split(self.group_id, comm.rank)
        else:
            self.group_id = 0
        self.method = method
        #: The settings this store was made with (`pyddstore.Settings`, typed attributes).
        self.settings = settings.replace(method=method)
        self._native = _native.Store(comm, method, settings.nic_map, self.settings)
        self._in_epoch = False
        # Upstream get_profile() keys: get/get_batch calls and seconds in them; ours: epoch syncs.
        self._py_times = new_py_times()
        self._recv: set = set()
        self._ragged_units: dict = {}  # ragged variables here -> their unit shape
        # Extra members: per joined name, the records it was joined from (see _raise_if_freed),
        # and the names found freed by the core job (later reads fail at once, no timeout).
        self._joined: dict = {}
        self._freed_names: dict = {}
        # Extra members: the core job's address files read so far (see _handshake.join).
        self._peer_tables: dict = {}
        self._publisher = None
        if method == Method.LIBFABRIC_EXTRA_JOBS and not self.is_extra:
            self._publisher = _handshake.Publisher(self, self.handshake_dir)
        # A weak reference: the exit hook must not keep a dropped store (and its memory) alive.
        self._made = next(_made)
        _live_stores.add(self)
        _abort.watch(self)  # a method-0 store open: an uncaught exception ends the job
        _log.report_choice(self)

    # -- identity ---------------------------------------------------------
    @property
    def rank(self) -> int:
        """This process's rank in the store's group (0 for a method-2 extra member)."""
        return self._native.rank

    @property
    def size(self) -> int:
        """Number of ranks holding shares (the group's size)."""
        return self._native.size

    @property
    def comm_kind(self) -> str:
        """The communicator: `mpi`, `torch`, `file` or `single`."""
        return self._native.comm_kind

    @property
    def transport(self) -> str:
        """How remote rows are read, e.g. `mpi-rma` or `ofi:tcp;ofi_rxm`."""
        return self._native.transport

    @property
    def remote_path(self) -> str:
        """How remote rows are read: ``"one-sided"`` reads or ``"gather"`` (the owner answers one
        request per batch; ``DDSTORE_REMOTE_GATHER``)."""
        return self._native.remote_path

    # -- variables --------------------------------------------------------
    def init(
        self,
        name: str,
        nrows: int,
        disp: int,
        itemsize: int = 1,
        dtype=None,
        *,
        memory_limit=None,
        spill_dir=None,
    ) -> None:
        """Collective: creates `name` with `nrows` rows on this rank, each of `disp` elements
        of `itemsize` bytes (or of `dtype`); fill them with `update()`.

        Args:
            name (str): the variable's name.
            nrows (int): rows this rank holds (0 allowed).
            disp (int): elements per row.
            itemsize (int): bytes per element (ignored when `dtype` is given).
            dtype (numpy.dtype | str | None): the elements' dtype; None stores raw bytes.
            memory_limit (int | None): bytes of the share kept in memory; the rest spills (see `add`).
            spill_dir (str | None): where the spill file goes (see `add`).

        Example:
            ```python
            store.init("y", nrows=len(my_rows), disp=16, dtype=np.float64)
            store.update("y", my_rows)
            store.barrier()
            ```
        """
        item = self._init_item(name, nrows, disp, itemsize, dtype)
        self._reserve(name)
        self._native.init(*item, memory_limit, _path(spill_dir))
        self._published(name)

    def _init_item(self, name: str, nrows: int, disp: int, itemsize: int, dtype) -> tuple:
        """init()'s arguments checked: (name, nrows, row_bytes, itemsize, dtype name)."""
        self._check_name(name)
        if dtype is not None:
            if np.dtype(dtype).hasobject:
                raise DDStoreTypeError(
                    f"init('{name}'): dtype {np.dtype(dtype)} holds Python object references; "
                    "pyddstore stores plain data only"
                )
            itemsize = np.dtype(dtype).itemsize
        disp, itemsize = _int(disp, f"init('{name}'): disp"), _int(itemsize, f"init('{name}'): itemsize")
        if not 0 <= disp * itemsize < 2**63 or itemsize < 1:
            raise DDStoreValueError(
                f"init('{name}'): disp={disp} elements of itemsize={itemsize} bytes is out of range"
            )
        return (name, nrows, disp * itemsize, itemsize, _dtype_name(dtype))

    def add_many(self, arrays: dict, *, memory_limit=None, spill_dir=None) -> None:
        """Collective: adds every variable of `arrays` (name -> this rank's rows, as `add(name,
        arr)`), in its order, with one exchange between the ranks for all of them: what a dataset
        of several fields costs one `add`. Ragged variables go through `add(name, arr, lengths)`.

        Args:
            arrays (dict[str, numpy.ndarray]): per new variable, this rank's rows (first axis).
            memory_limit (int | None): as `add`, for each variable.
            spill_dir (str | None): as `add`, for each variable.

        Example:
            ```python
            store.add_many({"x": np.zeros((100, 8), np.float32), "y": np.arange(100)})
            ```
        """
        if not isinstance(arrays, dict):
            raise DDStoreTypeError(
                f"add_many(arrays): expected a dict of name -> rows, got {type(arrays).__name__}"
            )
        items = []
        for name, arr in arrays.items():
            self._check_name(name)
            items.append((name, _as_array(arr, f"add('{name}', arr)")))
        self._create_many(items, memory_limit, spill_dir)

    def _create_many(self, items: list, memory_limit, spill_dir) -> None:
        names = [item[0] for item in items]
        self._reserve(*names)
        self._native.create_many(items, memory_limit, _path(spill_dir))
        for name in names:
            self._published(name)

    def init_device(
        self,
        name: str,
        nrows: int,
        row_bytes: int,
        tensor,
        iface: str,
        device: int = 0,
        *,
        itemsize=1,
        dtype=None,
    ):
        """Collective: creates `name` with this rank's `nrows` rows of `row_bytes` bytes in
        `tensor`'s memory (a contiguous torch tensor of exactly that many bytes on device `device`
        of memory interface `iface`: "cuda", "rocr", "ze", or "system" for host memory registered
        like device memory) and returns its `pyddstore.DeviceShare`, the one object that owns the
        tensor and its registration: write rows with `share.write(rows, offset)`, read batches
        with `share.read(out, rows)` (this rank's rows gathered on the device). Needs a
        transport that registers device memory (method 1 or 2 with FI_HMEM; a one-process store
        works with any method).

        Args:
            name (str): the variable's name.
            nrows (int): rows this rank holds.
            row_bytes (int): bytes per row.
            tensor (torch.Tensor): contiguous, exactly `nrows * row_bytes` bytes, on the device.
            iface (str): "cuda", "rocr", "ze", or "system" (host memory registered like device memory).
            device (int): the device's ordinal.
            itemsize (int): bytes per element, for reads typed by element.
            dtype (numpy.dtype | str | None): the elements' dtype; None stores raw bytes.

        Example:
            ```python
            t = torch.empty((n, 64), dtype=torch.uint8, device="cuda")
            share = store.init_device("x", n, 64, t, "cuda", 0)
            share.write(my_rows, 0)
            ```
        """
        self._check_name(name)
        self._reserve(name)
        share = self._native.init_device(name, nrows, row_bytes, tensor, iface, device, itemsize, dtype)
        self._published(name)
        return share

    def add(self, name: str, arr, lengths=None, *, memory_limit=None, spill_dir=None) -> None:
        """Collective: creates `name` from this rank's rows (first axis of `arr`); returns once
        every rank's rows are readable.

        With `lengths` (one non-negative int per row), `name` is ragged:
        row i is the next `lengths[i]` entries of `arr`'s first axis (0
        allowed), and `get_batch(name, indices)` returns values and offsets.
        Every rank must pass `lengths` or none must; a rank may have no rows.

        Args:
            name (str): the variable's name, new in this store.
            arr (numpy.ndarray): this rank's rows along the first axis (C-contiguous; 0 rows allowed).
            lengths (Sequence[int] | numpy.ndarray | None): one non-negative length per row: a ragged
                variable whose rows are consecutive runs of `arr`'s first axis.
            memory_limit (int | None): bytes of this variable's share kept in memory on this rank;
                later rows go to a spill file (see the "Datasets larger than memory" guide). None:
                the store's `DDSTORE_MEMORY_LIMIT`, if set. Not with method 0.
            spill_dir (str | None): where the spill file goes (else `DDSTORE_SPILL_DIR`, else
                `$TMPDIR/ddstore-spill-<uid>`).

        Example:
            ```python
            store.add("x", np.random.rand(1000, 32).astype(np.float32))
            store.add("seq", np.arange(10), lengths=[3, 0, 7])  # ragged: 3 rows
            ```
        """
        self._check_name(name)
        arr = _as_array(arr, f"add('{name}', arr)")
        if lengths is None:
            self._reserve(name)
            try:
                self._native.add(name, arr, memory_limit, _path(spill_dir))
            except DDStoreValueError as e:
                if "same shape and dtype" not in str(e):
                    raise
                # The ranks compare sizes; the shape is this rank's to say.
                raise DDStoreValueError(f"{e} (this rank's rows are shaped {arr.shape[1:]})") from None
            self._published(name)
            return
        lengths = np.asarray(lengths)
        if lengths.ndim != 1 or (lengths.size and lengths.dtype.kind not in "iu"):
            raise DDStoreTypeError(
                f"add('{name}'): lengths must be a 1-D sequence of non-negative ints, got "
                f"shape {lengths.shape} of {lengths.dtype}"
            )
        self._reserve(*ragged_parts(name))
        self._native.add_ragged(name, arr, lengths.astype(np.int64), memory_limit, _path(spill_dir))
        self._ragged_units[name] = tuple(arr.shape[1:])
        for part in ragged_parts(name):
            self._published(part)

    def is_ragged(self, name: str) -> bool:
        """Whether ``name`` was added with ``lengths`` (rows of different lengths).

        Args:
            name (str): a variable of this store.
        """
        return self._native.is_ragged(name)

    def get(self, name: str, arr, start: int = 0) -> None:
        """Reads rows ``start .. start + len(arr)`` of ``name`` into ``arr``
        (upstream's ``get``): one read per owner the range spans; an empty
        ``arr`` reads nothing and succeeds for any ``0 <= start <= rows``.

        Args:
            name (str): a fixed-row variable.
            arr (numpy.ndarray): destination: its length is the number of rows read.
            start (int): the first global row (rows of all ranks in rank order).
        """
        t = time.perf_counter()
        try:
            if self._freed_names:
                self._raise_if_known_freed(name)
            self._native.get(name, arr, start)
        except DDStoreError as e:
            self._raise_if_freed(name, e)
            raise
        finally:
            self._count_get(t)

    def get_batch(self, name: str, arr=None, indices=None, *, out=None):
        """Reads rows ``indices`` (any ranks, any order, repeats) of ``name``.

        Fixed rows: ``get_batch(name, arr, indices)`` fills ``arr`` (row i =
        global row ``indices[i]``) and returns None. (Variables with a share in device memory
        are read through their `DeviceShare`.)

        Ragged variables: ``get_batch(name, indices)`` (or ``indices=``)
        returns ``(values, offsets)``: row i is ``values[offsets[i]:offsets[i + 1]]``
        (``offsets`` int64, one more than the rows). With ``out=`` (a
        contiguous array of the variable's dtype, large enough) the values
        land at its start and ``values`` is a view of ``out``.

        Args:
            name (str): a variable of this store.
            arr (numpy.ndarray | Sequence[int] | None): fixed rows: the destination, `len(indices)` rows;
                ragged: the indices (or pass `indices=`).
            indices (Sequence[int] | numpy.ndarray | None): global row numbers: any rank's, any order,
                repeats allowed.
            out (numpy.ndarray | None): ragged only: a contiguous buffer of the variable's dtype the values
                land in.
        """
        t = time.perf_counter()
        try:
            if self._freed_names:
                self._raise_if_known_freed(name)
            if indices is None or name in self._ragged_units:
                if indices is None:
                    if name not in self._ragged_units and name in self._native.names():
                        raise DDStoreTypeError(
                            f"get_batch('{name}', arr, indices): indices are missing "
                            f"('{name}' has fixed rows)"
                        )
                    indices = arr
                elif arr is not None:
                    raise DDStoreTypeError(
                        f"get_batch('{name}'): '{name}' is ragged: call get_batch(name, indices) or "
                        "get_batch(name, indices=..., out=buffer)"
                    )
                values, offsets = self._native.get_ragged(name, indices, out)
                unit = self._ragged_units.get(name)
                if unit:
                    values = values.reshape((-1,) + unit)
                return values, offsets
            self._native.get_batch(name, arr, indices)
            return None
        except DDStoreError as e:
            self._raise_if_freed(name, e)
            raise
        finally:
            self._count_get(t)

    def _count_get(self, started: float) -> None:
        """One get() or get_batch() call that started at `started` (perf_counter) ended."""
        times = self._py_times
        times["py_get"] += time.perf_counter() - started
        times["py_gets"] += 1

    def update(self, name: str, arr, offset: int = 0) -> None:
        """Writes this rank's local rows `offset .. offset + len(arr)` (local, not collective:
        call `barrier()` before others read them).

        Args:
            name (str): a fixed-row variable.
            arr (numpy.ndarray): rows to write, shaped like the variable's rows.
            offset (int): the first of this rank's local rows to overwrite.

        Example:
            ```python
            store.update("x", new_rows, offset=10)
            store.barrier()
            ```
        """
        self._native.update(name, _as_array(arr, f"update('{name}', arr)"), offset)

    def load_file_ranges(
        self,
        name: str,
        paths,
        ranges,
        threads: int = 32,
        direct: bool = False,
        nofollow: bool = False,
        sizes=None,
        timeout_s: float | None = None,
    ):
        """Reads byte ranges of files straight into this rank's share of `name` (local, not
        collective), up to `threads` reads in flight with the GIL released; the loaders of
        `pyddstore.torch` use it for file sources and snapshots. `ranges` is an int64 array, one
        row per read: file index (into `paths`), file offset, bytes read, their CRC32 or -1,
        bytes skipped, bytes written, byte offset in the share. `direct` reads with O_DIRECT
        where the file system allows it, `nofollow` refuses symbolic links, `sizes` (-1: any)
        the exact size each file must have. Only regular files are read. Returns
        `(bytes written, whether every file was read with O_DIRECT)`.

        When no read returns for `timeout_s` seconds (None: this store's DDSTORE_LOAD_TIMEOUT_S setting,
        default 600) it raises DDStoreTimeoutError naming the file and the byte range waited on
        (a hung file system: a Lustre OST or NFS server gone); a slow file system that moves
        never times out. A reader stuck in the kernel cannot be stopped: it is left behind,
        keeps the share's memory mapped until its read returns, and writes nothing else. The
        rows of a failed load are undefined until loaded again.

        Args:
            name (str): a fixed-row variable created with `init`.
            paths (Sequence[str]): the files, indexed by the first column of `ranges`.
            ranges (numpy.ndarray): int64, one row per read: file index, file offset, bytes read, CRC32 or
                -1, bytes skipped, bytes written, byte offset in the share.
            threads (int): reads in flight.
            direct (bool): read with O_DIRECT where the file system allows it.
            nofollow (bool): refuse symbolic links.
            sizes (Sequence[int] | None): the exact size each file must have (-1: any).
            timeout_s (float | None): how long no read may return; None: this store's
                DDSTORE_LOAD_TIMEOUT_S.

        Example:
            ```python
            # 1,000 rows of 4 float32 from an .npy file whose header is 128 bytes
            n = 1000 * 16
            ranges = np.array([[0, 128, n, -1, 0, n, 0]], dtype=np.int64)
            store.load_file_ranges("x", ["/data/x.npy"], ranges)
            ```
        """
        return self._native.load_file_ranges(name, paths, ranges, threads, direct, nofollow, sizes, timeout_s)

    def info(self, name: str):
        """`(total_rows, disp, itemsize)` of `name`: rows over all ranks, elements per row,
        bytes per element.

        Args:
            name (str): a variable of this store.

        Example:
            ```python
            total, disp, itemsize = store.info("x")
            ```
        """
        return self._native.info(name)

    def counts(self, name: str) -> list:
        """Rows each rank holds of `name`, by rank (`sum(counts) == info(name)[0]`).

        Args:
            name (str): a variable of this store.
        """
        return self._native.counts(name)

    def dtype(self, name: str) -> str:
        """The stored dtype of `name` (`float32`, ..., or `bytes` for raw rows).

        Args:
            name (str): a variable of this store.
        """
        return self._native.dtype(name)

    def names(self) -> list:
        """The variables this store holds."""
        return self._native.names()

    # -- processes and jobs ---------------------------------------------------
    def fork_reader(self) -> None:
        """Not needed any more: a forked child's first read notices the fork and opens fresh
        readers instead of the inherited ones (methods 1, 2; method 0 children read same-node
        shares only). Calling it does the same at once and is kept for compatibility.

        Example:
            ```python
            if os.fork() == 0:
                store.get_batch("x", out, idx)  # fresh readers, opened on this first read
                os._exit(0)
            ```
        """
        self._native.fork_reader()

    def free(self) -> None:
        """Collective: releases every variable once every rank has stopped reading. Idempotent.

        Example:
            ```python
            store.free()  # on every rank
            ```
        """
        if self._publisher is not None:
            self._publisher.withdraw()
        if not self._native.freed:
            self._report_profile()
        self._native.free()

    def _at_exit(self) -> None:
        if self._publisher is not None:
            self._publisher.withdraw()
        if not self._native.freed:
            self._report_profile()
            if self.method == Method.MPI_RMA and self.size > 1:
                self._free_at_exit()

    def _free_at_exit(self) -> None:
        """A method-0 store left open is freed at exit, bounded: every rank's exit frees its
        stores in the order they were made, and where a rank does not come within
        ``DDSTORE_TIMEOUT_S`` the windows are left to the process's end. Left to interpreter
        teardown, each window's ``MPI_Win_free`` would wait for every rank, forever where one
        is gone."""
        try:
            self._native.free()
        except DDStoreError as e:
            rank = self.world_rank
            sys.stderr.write(f"pyddstore: rank {rank}: at exit, a method-0 store was left unfreed: {e}\n")

    def _report_profile(self) -> None:
        """DDSTORE_PROFILE=1: one line of read counters per variable on stderr."""
        if self.settings.profile:
            _profile.report(self._native, self.world_rank)

    def _check_name(self, name) -> None:
        if not isinstance(name, str) or not name:
            raise DDStoreTypeError(f"name must be a non-empty str, got {name!r}")

    def __repr__(self) -> str:
        return (
            f"PyDDStore(rank={self.rank}, size={self.size}, method={self.method}, "
            f"comm={self.comm_kind}, transport={self.transport})"
        )
