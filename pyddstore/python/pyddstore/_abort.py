"""Uncaught exceptions in MPI jobs: when the dying rank ends the whole job (``MPI_Abort``), as
``python -m mpi4py`` does.

- With a method-0 (MPI RMA) store of several ranks open (not freed), always: its windows can only
  be freed by every rank together (``MPI_Win_free``), so the dying rank's exit would wait in
  ``MPI_Win_free`` for ranks that are not there, serving its window, while the others read on or
  wait in collectives, and the job would hang until killed from outside.
- With ``DDSTORE_ABORT_ON_EXCEPTION=1``, in every MPI job: at once, instead of the other ranks
  waiting out ``DDSTORE_TIMEOUT_S`` in their next collective (method 1 and 2)."""

from __future__ import annotations

import sys
import weakref

from . import _native
from ._kinds import Method

_always = False  # DDSTORE_ABORT_ON_EXCEPTION=1 for some store of this process
_rma_stores: weakref.WeakSet = weakref.WeakSet()  # method-0 stores of several ranks


def install(always: bool) -> None:
    """Chains the abort after the current ``sys.excepthook`` (once per process), for a store
    being made on an MPI communicator; `always`: its ``DDSTORE_ABORT_ON_EXCEPTION``."""
    global _always
    _always = _always or always
    if getattr(sys.excepthook, "_pyddstore_abort", False):
        return
    before = sys.excepthook

    def hook(kind, value, tb):
        before(kind, value, tb)
        why = _why()
        if why is None:
            return
        sys.stderr.write(f"pyddstore: uncaught exception, aborting the MPI job ({why})\n")
        sys.stderr.flush()
        sys.stdout.flush()
        _native.abort_mpi(1)

    hook._pyddstore_abort = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def watch(store) -> None:
    """Counts `store` (a PyDDStore, made after ``install``) while it is open, if it is a
    method-0 store of several ranks."""
    if store.method == Method.MPI_RMA and store.size > 1:
        _rma_stores.add(store)


def _why() -> str | None:
    """Why an uncaught exception now ends the job (None: it does not)."""
    if _always:
        return "DDSTORE_ABORT_ON_EXCEPTION=1"
    if any(not s._native.freed for s in list(_rma_stores)):
        return "a method-0 store is open: its MPI windows can only be freed by every rank together"
    return None
