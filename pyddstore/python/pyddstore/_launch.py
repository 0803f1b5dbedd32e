"""Which launcher started this process, and the world it describes.

``comm=None`` never makes a one-rank store in a process whose launcher says the job has
more ranks (torchrun without ``init_process_group``, ``mpirun`` with ``DDSTORE_MPI=0``,
``srun``): that store would silently hold the whole dataset on every rank."""

from __future__ import annotations

import os
from typing import Mapping, NamedTuple, Optional

from ._errors import DDStoreValueError


class Launcher(NamedTuple):
    """A launcher seen in the environment: its name, this process's rank and the world size."""

    name: str
    rank: int
    size: int
    source: str  # the variables it was read from


# (name, rank variable, size variable, variables that must also be set). torchrun comes first:
# under srun, torchrun's WORLD_SIZE counts processes while SLURM_NTASKS counts agents.
_LAUNCHERS = (
    ("torchrun", "RANK", "WORLD_SIZE", ("LOCAL_WORLD_SIZE",)),
    ("mpirun (Open MPI)", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", ()),
    ("srun", "SLURM_PROCID", "SLURM_NTASKS", ("SLURM_STEP_ID",)),
    ("mpiexec (PMI)", "PMI_RANK", "PMI_SIZE", ()),
    ("mpiexec (PMIx)", "PMIX_RANK", "PMIX_SIZE", ()),
)


def _int(raw: Optional[str]) -> Optional[int]:
    try:
        return int(str(raw).strip())
    except (TypeError, ValueError):
        return None


def detect(environ: Mapping[str, str] = os.environ) -> Optional[Launcher]:
    """The first launcher whose variables are all set with integer values, else None."""
    for name, rank_var, size_var, also in _LAUNCHERS:
        rank, size = _int(environ.get(rank_var)), _int(environ.get(size_var))
        if rank is None or size is None or not all(v in environ for v in also):
            continue
        return Launcher(name, rank, size, f"{rank_var}={rank}, {size_var}={size}")
    return None


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
