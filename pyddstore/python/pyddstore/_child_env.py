"""Spawn and forkserver workers of an MPI rank start without initialising MPI.

A spawn child (and the forkserver, which preloads ``__main__``) imports the main module again
before it unpickles anything. A script with ``from mpi4py import MPI`` at the top then calls
``MPI_Init`` there with its parent's launcher environment, and Open MPI aborts the process
(``orte_init failed``). Such a worker never needs MPI: pyddstore's stores re-attach through the
fabric (``pyddstore._attach``).

So when a pyddstore store (or a dataset holding one) is pickled to start a process while MPI is
in use here, the next multiprocessing child or forkserver this thread launches gets
``MPI4PY_RC_INITIALIZE=0`` in its environment: mpi4py then imports there without initialising
MPI. The parent's environment is unchanged (the variable is set only for the duration of the one
launch call, ``multiprocessing.util.spawnv_passfds``, which copies it into the child), and other
processes it starts (the resource tracker, ``subprocess``) are left alone. A forkserver already
running (started by an earlier loader, with the variable) is not started again: the thread then
stays armed, and its next multiprocessing child gets the variable too (what an MPI rank's
multiprocessing child needs anyway).
"""

from __future__ import annotations

import os
import threading

VARIABLE = "MPI4PY_RC_INITIALIZE"
# The code a multiprocessing child or forkserver is started with (multiprocessing.spawn and
# multiprocessing.forkserver, Python 3.9-3.14).
_CHILD_MAINS = ("multiprocessing.spawn import spawn_main", "multiprocessing.forkserver import main")
_pending = threading.local()
_install_lock = threading.Lock()
_original_spawnv = None


def _mpi_in_use() -> bool:
    from ._comm import _mpi_in_use

    return _mpi_in_use()


def arm_for_process_start() -> None:
    """Called while a store is pickled: when that pickle starts a process (a spawn or
    forkserver DataLoader worker) and MPI is in use, that process starts with
    MPI4PY_RC_INITIALIZE=0."""
    from multiprocessing import context, util

    global _original_spawnv
    if context.get_spawning_popen() is None or not _mpi_in_use():
        return
    with _install_lock:
        if _original_spawnv is None:
            _original_spawnv = util.spawnv_passfds
            util.spawnv_passfds = _spawnv_passfds
    _pending.armed = True


def _spawnv_passfds(path, args, passfds):
    """multiprocessing.util.spawnv_passfds, with MPI4PY_RC_INITIALIZE=0 for the child this thread
    was armed for."""
    child = any(m in os.fsdecode(a) for a in args for m in _CHILD_MAINS)
    if not (child and getattr(_pending, "armed", False)):
        return _original_spawnv(path, args, passfds)
    _pending.armed = False
    saved = os.environ.get(VARIABLE)
    os.environ[VARIABLE] = "0"
    try:
        return _original_spawnv(path, args, passfds)
    finally:
        if saved is None:
            del os.environ[VARIABLE]
        else:
            os.environ[VARIABLE] = saved
