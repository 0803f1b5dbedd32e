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

    ``PyDDStore(comm_or_none=None, method=0, handshake_dir="", n_core=0, nic_map=None)``:
    ``comm_or_none`` is an mpi4py communicator, a torch.distributed group, a
    :class:`pyddstore.FileComm` or None (resolved as documented in
    :mod:`pyddstore._comm`). ``method`` 0 reads with MPI RMA, 1 with
    libfabric, 2 with libfabric across jobs (``n_core > 0`` joins a running
    core group published in ``handshake_dir``). ``ddstore_width`` splits
    the group into independent stores of that many consecutive ranks.
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
        return self._native.rank

    @property
    def size(self) -> int:
        return self._native.size

    @property
    def comm_kind(self) -> str:
        return self._native.comm_kind

    @property
    def transport(self) -> str:
        return self._native.transport

    # -- variables --------------------------------------------------------
    def init(self, name: str, nrows: int, disp: int, itemsize: int = 1, dtype=None) -> None:
        """Collective: ``nrows`` rows on this rank, ``disp`` elements of ``itemsize`` bytes each."""
        self._check_name(name)
        if dtype is not None:
            itemsize = np.dtype(dtype).itemsize
        self._native.init(name, int(nrows), int(disp) * int(itemsize), int(itemsize), _dtype_name(dtype))
        self._published(name)

    def add(self, name: str, arr) -> None:
        """Collective: creates ``name`` from this rank's rows (first axis of ``arr``)."""
        self._check_name(name)
        self._native.add(name, _as_array(arr, f"add('{name}', arr)"))
        self._published(name)

    def update(self, name: str, arr, offset: int = 0) -> None:
        """Writes this rank's local rows ``offset .. offset + len(arr)``."""
        self._native.update(name, _as_array(arr, f"update('{name}', arr)"), int(offset))

    def info(self, name: str):
        """``(total_rows, disp, itemsize)``."""
        return self._native.info(name)

    def counts(self, name: str) -> list:
        return self._native.counts(name)

    def dtype(self, name: str) -> str:
        return self._native.dtype(name)

    def names(self) -> list:
        return self._native.names()

    def register_recv(self, name: str, arr) -> None:
        self._native.register_recv(name, arr)

    def unregister_recv(self, name: str, arr) -> None:
        self._native.unregister_recv(name, arr)

    def get_profile(self, name: str | None = None) -> dict:
        """Read counters of one variable, or summed over all of them."""
        if name is not None:
            return self._native.get_profile(name)
        total: dict = {}
        for n in self._native.names():
            for k, v in self._native.get_profile(n).items():
                total[k] = total.get(k, 0) + v
        return total

    # -- collectives over the store's group ---------------------------------
    def allgather(self, obj) -> list:
        return [pickle.loads(b) for b in self._native.comm().allgather(pickle.dumps(obj))]

    def barrier(self) -> None:
        self._native.comm().barrier()

    def epoch_begin(self) -> None:
        """Kept for existing callers: reads need no epoch, so this is free."""

    def epoch_end(self) -> None:
        """Kept for existing callers: reads need no epoch, so this is free."""

    # -- processes and jobs ---------------------------------------------------
    def fork_reader(self) -> None:
        """In a forked child: open fresh readers instead of the inherited ones."""
        self._native.fork_reader()

    def join(self, name: str, timeout_s: float | None = None, token: str | None = None) -> None:
        """Method 2 extra member: wait for ``name`` to be published, then read it.

        ``token``: the core job's job token; default ``DDSTORE_JOB_TOKEN``, else
        the token file the core job wrote in ``handshake_dir``."""
        if not self.is_extra:
            raise DDStoreUnsupportedError(
                "join() is for method=2 extra members: PyDDStore(None, method=2, n_core=N)"
            )
        _handshake.join(self, name, timeout_s, token)

    def free(self) -> None:
        """Collective: releases every variable once every rank has stopped reading. Idempotent."""
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
