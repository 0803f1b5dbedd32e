"""``DDSTORE_ABORT_ON_EXCEPTION=1``: an uncaught exception in an MPI job ends the whole job at
once (``MPI_Abort``), as ``python -m mpi4py`` does, instead of leaving the other ranks waiting
in a collective until ``DDSTORE_TIMEOUT_S`` passes."""

from __future__ import annotations

import sys

from . import _native


def install() -> None:
    """Chains an abort after the current ``sys.excepthook`` (once per process)."""
    if getattr(sys.excepthook, "_pyddstore_abort", False):
        return
    before = sys.excepthook

    def hook(kind, value, tb):
        before(kind, value, tb)
        sys.stderr.write(
            "pyddstore: uncaught exception, aborting the MPI job (DDSTORE_ABORT_ON_EXCEPTION=1)\n"
        )
        sys.stderr.flush()
        sys.stdout.flush()
        _native.abort_mpi(1)

    hook._pyddstore_abort = True  # type: ignore[attr-defined]
    sys.excepthook = hook
