"""Which launcher started this process, and the world it describes.

``comm=None`` never makes a one-rank store in a process whose launcher says the job has
more ranks (torchrun without ``init_process_group``, ``mpirun`` with ``DDSTORE_MPI=0``,
``srun``): that store would silently hold the whole dataset on every rank."""

from __future__ import annotations

from typing import Mapping, NamedTuple, Optional

from . import _native
from ._errors import DDStoreValueError


class Launcher(NamedTuple):
    """A launcher seen in the environment (ddstore-core's launcher table, ``_native.LAUNCHERS``):
    its name, this process's rank, the world size, the variables they were read from, this
    process's rank and the number of ranks on its node, and the launcher's job id (None where
    the launcher does not say)."""

    name: str
    rank: int
    size: int
    source: str  # the variables it was read from
    local_rank: Optional[int] = None
    local_size: Optional[int] = None
    job_id: Optional[str] = None


def detect(environ: Optional[Mapping[str, str]] = None) -> Optional[Launcher]:
    """The launcher whose variables `environ` (default: this process's environment) sets, by
    the table's precedence (inner launchers first: torchrun under srun), else None. A launcher
    variable that is not a number raises DDStoreValueError naming it."""
    found = _native.launcher(None if environ is None else dict(environ))
    return None if found is None else Launcher(**found)


def srun_tasks(launcher: Optional[Launcher]) -> bool:
    """Whether `launcher` is srun with several tasks (without MPI: a file communicator's job)."""
    return launcher is not None and launcher.name == "srun" and launcher.size > 1


def mpi_launched() -> bool:
    """Whether a launcher of MPI jobs (mpirun, mpiexec, srun --mpi=pmix) started this process."""
    return _native.mpi_launched()


def no_group_error(launcher: Launcher) -> DDStoreValueError:
    """What comm=None raises when the launcher says the job has several ranks but no group
    was found: the store would otherwise be a one-rank store holding everything."""
    if launcher.name == "torchrun":
        fix = (
            "call torch.distributed.init_process_group() before creating the store (comm=None then "
            "uses the default group), or pass comm= (a torch.distributed group, an mpi4py "
            "communicator or a pyddstore.FileComm), or set DDSTORE_HANDSHAKE_DIR for a file "
            "communicator"
        )
    else:
        fix = (
            "pass comm= (an mpi4py communicator, a torch.distributed group or a pyddstore.FileComm), "
            "allow MPI (DDSTORE_MPI=1), or set DDSTORE_HANDSHAKE_DIR for a file communicator"
        )
    return DDStoreValueError(
        f"comm=None: launched by {launcher.name} as rank {launcher.rank} of {launcher.size} "
        f"({launcher.source}) but no communicator was found, and a one-rank store would hold the "
        f"whole dataset on every rank: {fix}"
    )
