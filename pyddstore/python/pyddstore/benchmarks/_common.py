"""What the benchmarks share: a barrier that sleeps, and the settings their stores get."""

from __future__ import annotations

import time

from .. import Settings


def description(doc: str) -> str:
    """A benchmark's --help description: its docstring's whole first paragraph, on one line."""
    return " ".join(doc.strip().split("\n\n")[0].split())


def mpi_world():
    """``MPI.COMM_WORLD``; without mpi4py, ends the benchmark with a message saying how to get it."""
    try:
        from mpi4py import MPI
    except ModuleNotFoundError as e:
        if e.name != "mpi4py":
            raise
        raise SystemExit(
            "pyddstore's benchmarks run under mpirun and need mpi4py, which is not installed: "
            "pip install mpi4py (built against the MPI pyddstore links), or the bench extra: "
            'pip install ".[bench]" from the pyddstore checkout'
        ) from None
    return MPI.COMM_WORLD


def quiet_wait(comm) -> None:
    """A barrier that sleeps instead of spinning, so waiting ranks leave the CPU to the others."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(0.0005)


# The stores of the PyTorch benchmarks are read by forked DataLoader workers
# (DDSTORE_FORK_WORKERS=1 unless exported otherwise). The libfabric default that goes with it
# (FI_MR_CACHE_MONITOR=memhooks where kdreg2 is the default, Cray) is set when the extension is
# imported: export DDSTORE_FORK_WORKERS=1 before starting Python there.
FORKED_WORKERS = {"fork_workers": True}


def bench_settings(defaults: dict | None = None, **overrides) -> Settings:
    """The environment's settings with `defaults` where the environment sets nothing (an
    exported DDSTORE_* variable still wins) and `overrides` on top (a configuration's own
    values): passed to the stores a benchmark makes, never written to os.environ."""
    settings = Settings.from_env()
    unset = {k: v for k, v in (defaults or {}).items() if not settings.is_set(k)}
    return settings.replace(**unset, **overrides)
