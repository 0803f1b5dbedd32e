"""Communicators and how `comm=None` is resolved (spec: "Without MPI").

==========================  ===================================================
``comm=None`` resolves to   when
==========================  ===================================================
``MPI.COMM_WORLD``          MPI is in use: mpi4py imported, or launched by mpirun/mpiexec
the default torch group     no MPI, ``torch.distributed`` initialised
a ``FileComm``              a handshake dir, or srun with several tasks; rank and size from
                            the launcher (``SLURM_PROCID``/``SLURM_NTASKS``, torchrun's
                            ``RANK``/``WORLD_SIZE``, ...: ddstore-core's launcher table)
DDStoreValueError           a launcher says there are several ranks and none of the above applies
a one-process store         otherwise
==========================  ===================================================

``DDSTORE_COMM=mpi|torch|file`` forces one; ``DDSTORE_MPI=0`` never uses MPI (nor does a build
without the cargo feature ``mpi``).
"""

from __future__ import annotations

import atexit
import os
import sys
import time

from . import _launch, _native, _wire
from ._env import settings as _env_settings
from ._errors import DDStoreTimeoutError, DDStoreValueError


class FileComm:
    """A communicator without MPI: ranks exchange records through files in
    ``handshake_dir`` (a directory every rank can reach, e.g. on Lustre).

    `rank`/`size` default to the launcher's (srun's `SLURM_PROCID`/`SLURM_NTASKS`, torchrun's,
    Open MPI's, PMI's, PMIx's, Cray PALS's: ddstore-core's launcher table); `job_id` (default
    `DDSTORE_JOB_ID`, else the launcher's: the Slurm job and step, Open MPI's job, ..., else the
    launching process) tags every file so files left by an earlier job are never read. The
    communicators one process makes under one job id are numbered (every rank makes them in the
    same order), so several live stores of a process never collide.

    Args:
        handshake_dir (str | os.PathLike | None): a directory every rank reaches (created 0700); None:
            DDSTORE_HANDSHAKE_DIR.
        rank (int | None): this process's rank; None: from the launcher's variables.
        size (int | None): the number of ranks; None: from the launcher's variables.
        job_id (str | None): tags this job's files; None: DDSTORE_JOB_ID, else the launcher's (the Slurm
            job and step, ...), else the launching process.
        timeout_s (float | None): how long a round waits for every rank; None: DDSTORE_HANDSHAKE_TIMEOUT_S.
        settings (pyddstore.Settings | None): settings to take the defaults above from instead of the
            environment's.

    Example:
        ```python
        # srun -n 8 python train.py   (no MPI)
        comm = pyddstore.FileComm("/lustre/me/hs")
        store = pyddstore.PyDDStore(comm, method=1)
        ```
    """

    def __init__(
        self,
        handshake_dir=None,
        rank: int | None = None,
        size: int | None = None,
        job_id: str | None = None,
        timeout_s: float | None = None,
        *,
        settings=None,
    ):
        settings = settings if settings is not None else _env_settings()
        handshake_dir = handshake_dir or settings.handshake_dir or ""
        if not handshake_dir:
            raise DDStoreValueError(
                "FileComm needs handshake_dir (a directory every rank can reach): pass handshake_dir= "
                "or set DDSTORE_HANDSHAKE_DIR"
            )
        if timeout_s is None:
            timeout_s = settings.handshake_timeout_s
        self.handshake_dir = os.fspath(handshake_dir)
        self._native = _native.Comm.file(self.handshake_dir, rank, size, job_id or settings.job_id, timeout_s)

    @classmethod
    def _wrap(cls, native) -> FileComm:
        obj = cls.__new__(cls)
        obj._native = native
        return obj

    @property
    def rank(self) -> int:
        """This process's rank."""
        return self._native.rank

    @property
    def size(self) -> int:
        """Number of ranks."""
        return self._native.size

    def allgather(self, obj) -> list:
        """Collective: every rank's `obj`: data only (see ``pyddstore._wire``), never pickles.

        Args:
            obj (object): data only (None, bool, int, float, str, bytes, lists, dicts with str keys).
        """
        return _wire.gather(self._native, obj)

    def barrier(self) -> None:
        """Collective: returns once every rank has called it (bounded by the handshake timeout)."""
        self._native.barrier()

    def split(self, color: int, key: int | None = None) -> FileComm:
        """Collective: the ranks with the same `color`, ordered by `key` (default: rank).

        Args:
            color (int): ranks with the same color form a group.
            key (int | None): orders ranks within a group; None: by rank.
        """
        return FileComm._wrap(self._native.split(color, self.rank if key is None else key))

    def __repr__(self) -> str:
        return f"FileComm(rank={self.rank}, size={self.size})"


# How long, once a torch barrier timed out, rank 0 waits for the others' answers.
_ABSENT_GRACE_S = 2.0


class TorchComm:
    """A `torch.distributed` group as a communicator. Records travel as uint8 tensors
    (`all_gather`), never as pickled objects; `barrier(timeout_s)` is bounded on gloo (the
    backend's barrier polled; `monitored_barrier` names the absent once it timed out). With
    NCCL/RCCL call `torch.cuda.set_device()` first.
    Passing a group (or None once `init_process_group` ran) as `comm` makes one for you.

    Args:
        group (torch.distributed.ProcessGroup | None): the group; None: the default group
            (init_process_group must have run).

    Example:
        ```python
        dist.init_process_group("gloo")
        store = pyddstore.PyDDStore(pyddstore.TorchComm(), method=1)
        ```
    """

    def __init__(self, group=None):
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise DDStoreValueError(
                "TorchComm needs torch.distributed initialised: call dist.init_process_group() first"
            )
        self._dist = dist
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)

    def _device(self):
        import torch

        if self._dist.get_backend(self.group) in ("nccl", "rccl"):
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _gather_ints(self, values: list) -> list:
        import torch

        mine = torch.tensor(values, dtype=torch.int64, device=self._device())
        outs = [torch.empty_like(mine) for _ in range(self.size)]
        self._dist.all_gather(outs, mine, group=self.group)
        return [o.cpu().tolist() for o in outs]

    def allgather(self, data: bytes) -> list:
        """Collective: every rank's `data`, by rank.

        Args:
            data (bytes): this rank's record.
        """
        import torch

        data = bytes(data)
        lens = [n for (n,) in self._gather_ints([len(data)])]
        width = max(max(lens), 1)
        mine = torch.zeros(width, dtype=torch.uint8)
        if data:
            mine[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        mine = mine.to(self._device())
        outs = [torch.empty_like(mine) for _ in range(self.size)]
        self._dist.all_gather(outs, mine, group=self.group)
        return [o[:n].cpu().numpy().tobytes() for o, n in zip(outs, lens)]

    def barrier(self, timeout_s: float | None = None) -> None:
        """A barrier; with ``timeout_s`` on gloo, DDStoreTimeoutError naming the ranks
        that did not arrive (other backends wait for the process group's own timeout).
        On gloo the barrier is the backend's own, polled against the deadline (Ctrl-C
        interrupts the wait); only once it timed out does `monitored_barrier`, a second
        collective, name the absent ranks.

        Args:
            timeout_s (float | None): gloo: how long to wait for every rank; None: the group's timeout.
        """
        if timeout_s is None or self._dist.get_backend(self.group) != "gloo":
            self._dist.barrier(group=self.group)
            return
        work = self._dist.barrier(group=self.group, async_op=True)
        deadline = time.monotonic() + timeout_s
        pause = 0.0005
        while not work.is_completed():
            now = time.monotonic()
            if now >= deadline:
                self._name_the_absent(timeout_s)
            time.sleep(min(pause, max(deadline - now, 0.0)))
            pause = min(pause * 2, 0.05)
        try:
            work.wait()
        except RuntimeError as e:
            raise DDStoreTimeoutError(f"torch.distributed barrier did not complete: {e}") from None

    def _name_the_absent(self, timeout_s: float) -> None:
        """After a barrier timed out: `monitored_barrier` names the ranks that are not there
        (rank 0 waits for each; the others wait longer, for rank 0's answer)."""
        import datetime

        grace = _ABSENT_GRACE_S if self.rank == 0 else 2 * _ABSENT_GRACE_S
        try:
            self._dist.monitored_barrier(
                group=self.group, timeout=datetime.timedelta(seconds=grace), wait_all_ranks=True
            )
        except RuntimeError as e:
            raise DDStoreTimeoutError(
                f"torch.distributed barrier did not complete within {timeout_s} s: {e}"
            ) from None
        raise DDStoreTimeoutError(
            f"torch.distributed barrier did not complete within {timeout_s} s, though every rank "
            "answered a monitored_barrier afterwards (DDSTORE_TIMEOUT_S sets the wait)"
        )

    def split(self, color: int, key: int) -> TorchComm:
        """Collective: a new group of the ranks with the same `color` (WORLD group only).

        Args:
            color (int): ranks with the same color form a group.
            key (int): orders ranks within a group.
        """
        dist = self._dist
        if self.group not in (None, dist.group.WORLD) and self.size != dist.get_world_size():
            raise DDStoreValueError("ddstore_width with torch.distributed needs the default (WORLD) group")
        pairs = [tuple(p) for p in self._gather_ints([color, key, self.rank])]
        mine = None
        for c in sorted({p[0] for p in pairs}):  # every rank creates every group, in the same order
            ranks = [r for _, _, r in sorted(p for p in pairs if p[0] == c)]
            group = dist.new_group(ranks)
            if c == color:
                mine = group
        return TorchComm(mine)


def _mpi_in_use() -> bool:
    return "mpi4py.MPI" in sys.modules or _launch.mpi_launched()


def _torch_initialized() -> bool:
    dist = sys.modules.get("torch.distributed")
    return bool(dist is not None and dist.is_available() and dist.is_initialized())


def _mpi_comm(comm, settings) -> _native.Comm:
    if comm is None:
        mpi = sys.modules.get("mpi4py.MPI")
        if mpi is not None:
            comm = mpi.COMM_WORLD
        else:
            comm = _native.Comm.mpi(None, settings)  # initialises MPI here, finalised at exit
            atexit.register(_native.finalize_mpi)
            return comm
    return _native.Comm.mpi(comm.py2f(), settings)


def resolve_comm(comm_or_none, settings=None) -> _native.Comm:
    """The native communicator for a user's `comm` argument (DDSTORE_COMM, DDSTORE_MPI and
    DDSTORE_HANDSHAKE_DIR from `settings`, default the environment's)."""
    settings = settings if settings is not None else _env_settings()
    if isinstance(comm_or_none, _native.Comm):
        return comm_or_none
    if isinstance(comm_or_none, FileComm):
        return comm_or_none._native
    if isinstance(comm_or_none, TorchComm):
        return _native.Comm.callback(comm_or_none)
    if comm_or_none is not None:
        if hasattr(comm_or_none, "py2f"):
            return _mpi_comm(comm_or_none, settings)
        dist = sys.modules.get("torch.distributed")
        if dist is not None and isinstance(comm_or_none, dist.ProcessGroup):
            return _native.Comm.callback(TorchComm(comm_or_none))
        raise DDStoreValueError(
            f"comm={comm_or_none!r} is not a communicator: pass an mpi4py communicator, "
            "a torch.distributed group, a pyddstore.FileComm, or None"
        )
    forced = settings.comm
    use_mpi = settings.mpi
    # A build without MPI goes on to torch or files under mpirun (DDSTORE_COMM=mpi raises).
    if forced == "mpi" or (forced is None and use_mpi and _native.HAS_MPI and _mpi_in_use()):
        if not use_mpi:
            raise DDStoreValueError("DDSTORE_COMM=mpi contradicts DDSTORE_MPI=0")
        return _mpi_comm(None, settings)
    if forced == "torch" or (forced is None and _torch_initialized()):
        return _native.Comm.callback(TorchComm())
    handshake_dir = settings.handshake_dir or ""
    launcher = _launch.detect()
    if forced == "file" or handshake_dir or _launch.srun_tasks(launcher):
        return FileComm(handshake_dir, settings=settings)._native
    if launcher is not None and launcher.size > 1:
        raise _launch.no_group_error(launcher)
    return _native.Comm.single()
