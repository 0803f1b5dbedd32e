"""PyDDStore: the store API of upstream pyddstore (HydraGNN style), plus
the methods pyddstore.torch builds on."""

from __future__ import annotations

import atexit
import os
import pickle
import weakref

import numpy as np

from . import _handshake, _log, _native
from ._comm import resolve_comm
from ._env import check_fabric, env_choice, env_flag, resolve_method
from ._errors import DDStoreTypeError, DDStoreUnsupportedError, DDStoreValueError

_live_stores: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _at_exit_all() -> None:
    for store in list(_live_stores):
        store._at_exit()


_SUPPORTED = {
    "bool": "bool",
    "uint8": "uint8",
    "int32": "int32",
    "int64": "int64",
    "float32": "float32",
    "float64": "float64",
}


def _dtype_name(dtype) -> str | None:
    """The stored dtype tag for a numpy dtype; None stores raw bytes."""
    if dtype is None:
        return None
    return _SUPPORTED.get(np.dtype(dtype).name)


class PyDDStore:
    """A distributed store of named variables; each rank holds a share of
    every variable's rows and reads any row with one-sided reads.

    Args:
        comm_or_none: an mpi4py communicator, a torch.distributed group, a
            `pyddstore.FileComm`, or None: `MPI.COMM_WORLD` when MPI is in use, else the
            default torch.distributed group when initialised, else a `FileComm` in
            `handshake_dir`. Under a launcher that says the job has several ranks (torchrun,
            mpirun, srun) and no communicator found, None raises `DDStoreValueError`
            instead of making a one-rank store.
        method: 0 reads with MPI RMA, 1 with libfabric, 2 with libfabric across jobs.
            Default: `DDSTORE_METHOD`, else 0 with an MPI communicator, else 1.
        handshake_dir: directory for the file communicator and method-2 records
            (default `DDSTORE_HANDSHAKE_DIR`).
        n_core: method 2 only: with `comm_or_none=None` and `n_core > 0` this process is
            an extra member that `join()`s a core group of `n_core` ranks.
        nic_map: per-local-rank NIC map, `"0:cxi0,1:cxi1"` or a dict (default
            `DDSTORE_NIC_MAP`).
        ddstore_width: split the group into independent stores of that many consecutive
            ranks (each group holds a whole copy).

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
        self, comm_or_none=None, method=None, handshake_dir="", n_core=0, nic_map=None, ddstore_width=None
    ):
        method = resolve_method(method)
        # Settings are checked even where this store does not use them: a typo must not pass silently.
        env_choice("DDSTORE_COMM", ("mpi", "torch", "file"))
        check_fabric()
        self.handshake_dir = os.fspath(handshake_dir or os.environ.get("DDSTORE_HANDSHAKE_DIR", ""))
        if not isinstance(n_core, int) or n_core < 0:
            raise DDStoreValueError(f"n_core={n_core!r} is not valid: expected a non-negative integer")
        self.n_core = n_core
        self.is_extra = method == 2 and n_core > 0 and comm_or_none is None
        if self.is_extra:
            if not self.handshake_dir:
                raise DDStoreValueError(
                    "method=2 extra members need handshake_dir (where the core job publishes)"
                )
            comm = _native.Comm.single()
        else:
            comm = resolve_comm(comm_or_none, self.handshake_dir)
        if method is None:
            method = 0 if comm.kind == "mpi" else 1
        if method == 0 and comm.kind not in ("mpi", "single"):
            raise DDStoreUnsupportedError(
                f"method=0 (MPI RMA) needs an MPI communicator, got a {comm.kind} communicator: "
                "use method=1 (libfabric), or pass an mpi4py communicator"
            )
        if method == 2 and not self.handshake_dir:
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
        self._native = _native.Store(
            comm,
            method,
            nic_map
            if isinstance(nic_map, (str, type(None)))
            else ",".join(f"{k}:{v}" for k, v in dict(nic_map).items()),
        )
        # Hot paths go straight to the native methods (no Python frame per read).
        self.get_batch = self._native.get_batch
        self.get = self._native.get
        self._publisher = None
        if method == 2 and not self.is_extra:
            self._publisher = _handshake.Publisher(self, self.handshake_dir)
        # A weak reference: the exit hook must not keep a dropped store (and its memory) alive.
        _live_stores.add(self)
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

    # -- reads (instances bind these straight to the native methods: no Python frame) --------
    def get(self, name: str, arr, start: int = 0) -> None:
        """Reads `len(arr)` consecutive global rows of `name` from row `start` into `arr`.

        `arr` is a C-contiguous numpy array (or CPU tensor) whose rows match the variable's
        row shape and dtype. Raises `DDStoreIndexError` for rows out of range.

        Example:
            ```python
            out = np.empty((10, 8), np.float32)
            store.get("x", out, start=120)  # global rows 120..129
            ```
        """
        self._native.get(name, arr, start)

    def get_batch(self, name: str, arr, indices, own_rows=None) -> None:
        """Reads the global rows `indices` (any order, repeats allowed) of `name` into `arr`.

        Reads to every owner are posted together and waited for once; same-node rows are
        memory copies. Every index is checked before a byte moves; a failed call leaves the
        store usable. `own_rows` is for pyddstore.torch's device shares.

        Example:
            ```python
            out = np.empty((128, 8), np.float32)
            store.get_batch("x", out, np.random.randint(0, 400, 128))
            ```
        """
        self._native.get_batch(name, arr, indices, own_rows=own_rows)

    # -- variables --------------------------------------------------------
    def init(self, name: str, nrows: int, disp: int, itemsize: int = 1, dtype=None) -> None:
        """Collective: creates `name` with `nrows` rows on this rank, each of `disp` elements
        of `itemsize` bytes (or of `dtype`); fill them with `update()`.

        Example:
            ```python
            store.init("y", nrows=len(my_rows), disp=16, dtype=np.float64)
            store.update("y", my_rows)
            store.barrier()
            ```
        """
        self._check_name(name)
        if dtype is not None:
            itemsize = np.dtype(dtype).itemsize
        self._native.init(name, int(nrows), int(disp) * int(itemsize), int(itemsize), _dtype_name(dtype))
        self._published(name)

    def add(self, name: str, arr) -> None:
        """Collective: creates `name` from this rank's rows (first axis of `arr`); returns once
        every rank's rows are readable.

        Example:
            ```python
            store.add("x", np.random.rand(1000, 32).astype(np.float32))
            ```
        """
        self._check_name(name)
        self._native.add(name, _as_array(arr, f"add('{name}', arr)"))
        self._published(name)

    def update(self, name: str, arr, offset: int = 0) -> None:
        """Writes this rank's local rows `offset .. offset + len(arr)` (local, not collective:
        call `barrier()` before others read them).

        Example:
            ```python
            store.update("x", new_rows, offset=10)
            store.barrier()
            ```
        """
        self._native.update(name, _as_array(arr, f"update('{name}', arr)"), int(offset))

    def info(self, name: str):
        """`(total_rows, disp, itemsize)` of `name`: rows over all ranks, elements per row,
        bytes per element.

        Example:
            ```python
            total, disp, itemsize = store.info("x")
            ```
        """
        return self._native.info(name)

    def counts(self, name: str) -> list:
        """Rows each rank holds of `name`, by rank (`sum(counts) == info(name)[0]`)."""
        return self._native.counts(name)

    def dtype(self, name: str) -> str:
        """The stored dtype of `name` (`float32`, ..., or `bytes` for raw rows)."""
        return self._native.dtype(name)

    def names(self) -> list:
        """The variables this store holds."""
        return self._native.names()

    def register_recv(self, name: str, arr) -> None:
        """Registers `arr` as a destination of reads of `name` once (providers that need
        registered destinations, cxi and verbs, then skip a registration per read).

        Example:
            ```python
            buf = np.empty((128, 8), np.float32)
            store.register_recv("x", buf)
            store.get_batch("x", buf, idx)
            store.unregister_recv("x", buf)
            ```
        """
        self._native.register_recv(name, arr)

    def unregister_recv(self, name: str, arr) -> None:
        """Undoes `register_recv(name, arr)`."""
        self._native.unregister_recv(name, arr)

    def get_profile(self, name: str | None = None) -> dict:
        """Read counters of one variable, or summed over all of them.

        Example:
            ```python
            print(store.get_profile("x"))  # reads, bytes, remote/local split, ...
            ```
        """
        if name is not None:
            return self._native.get_profile(name)
        total: dict = {}
        for n in self._native.names():
            for k, v in self._native.get_profile(n).items():
                total[k] = total.get(k, 0) + v
        return total

    # -- collectives over the store's group ---------------------------------
    def allgather(self, obj) -> list:
        """Collective: every rank's picklable `obj`, by rank, over the store's group."""
        return [pickle.loads(b) for b in self._native.comm().allgather(pickle.dumps(obj))]

    def barrier(self) -> None:
        """Collective: returns once every rank of the group has called it (e.g. after
        `update()`, before others read the updated rows)."""
        self._native.comm().barrier()

    def epoch_begin(self) -> None:
        """Kept for existing (upstream DDStore) callers: reads need no epoch, so this costs
        nothing.

        Example:
            ```python
            store.epoch_begin(); store.get_batch("x", out, idx); store.epoch_end()
            ```
        """

    def epoch_end(self) -> None:
        """Kept for existing callers: reads need no epoch, so this is free."""

    # -- processes and jobs ---------------------------------------------------
    def fork_reader(self) -> None:
        """In a forked child (methods 1, 2): open fresh readers instead of the inherited ones.
        pyddstore.torch calls it in forked DataLoader workers.

        Example:
            ```python
            if os.fork() == 0:
                store.fork_reader()
                store.get_batch("x", out, idx)
                os._exit(0)
            ```
        """
        self._native.fork_reader()

    def join(self, name: str, timeout_s: float | None = None, token: str | None = None) -> None:
        """Method 2 extra member: wait for `name` to be published, then read it.

        `token`: the core job's job token; default `DDSTORE_JOB_TOKEN`, else the token file
        the core job wrote in `handshake_dir`.

        Example:
            ```python
            extra = pyddstore.PyDDStore(None, method=2, handshake_dir=hs, n_core=4)
            extra.join("x")
            extra.get_batch("x", out, idx)
            ```
        """
        if not self.is_extra:
            raise DDStoreUnsupportedError(
                "join() is for method=2 extra members: PyDDStore(None, method=2, n_core=N)"
            )
        _handshake.join(self, name, timeout_s, token)

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

    def _report_profile(self) -> None:
        """DDSTORE_PROFILE=1: one line of read counters per variable on stderr."""
        if not env_flag("DDSTORE_PROFILE", False):
            return
        for name in self._native.names():
            p = self._native.get_profile(name)
            _log.get_logger("store").info(
                f"rank {self.world_rank}: profile {name}: " + " ".join(f"{k}={v}" for k, v in p.items())
            )

    # -- helpers ------------------------------------------------------------
    def _check_name(self, name) -> None:
        if not isinstance(name, str) or not name:
            raise DDStoreTypeError(f"name must be a non-empty str, got {name!r}")

    def _published(self, name: str) -> None:
        if self._publisher is not None:
            self._publisher.publish(name)

    def __reduce__(self):
        """Pickles to a handle that a spawn/forkserver process re-attaches through the fabric
        (methods 1 and 2; method 0 raises DDStoreUnsupportedError). See pyddstore._attach."""
        from ._attach import attach_store, store_handle

        return (attach_store, (store_handle(self, self.names()),))

    def __repr__(self) -> str:
        return (
            f"PyDDStore(rank={self.rank}, size={self.size}, method={self.method}, "
            f"comm={self.comm_kind}, transport={self.transport})"
        )


def _as_array(arr, what: str):
    if isinstance(arr, np.ndarray):
        return arr
    if hasattr(arr, "numpy") and hasattr(arr, "is_cuda"):  # torch tensor
        if arr.is_cuda:
            raise DDStoreTypeError(f"{what}: tensor is on {arr.device}; pass a CPU tensor or numpy array")
        return arr.detach().numpy()
    raise DDStoreTypeError(f"{what} must be a numpy array or CPU tensor, got {type(arr).__name__}")
