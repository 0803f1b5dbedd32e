"""Ctrl-C during native waits, and one rank dying under mpirun.

    mpirun -n 2 python net_signals.py interrupt   (DDSTORE_TIMEOUT_S=10)
    mpirun -n 2 python net_signals.py uncaught    (DDSTORE_TIMEOUT_S=3)

interrupt: rank 0 stops rank 1 and reads its rows (a wait of DDSTORE_TIMEOUT_S); SIGINT to
rank 0 one second in must raise KeyboardInterrupt promptly; rank 1 resumed, the same rows read
back exact. Then rank 1 waits in barrier() of a second store (rank 0 comes late) and gets SIGINT:
KeyboardInterrupt promptly, and that store's next collective raises a DDStoreError saying it was
interrupted, while the first store still reads exact and frees. Every rank prints
`signals {json}`.

uncaught: rank 1 raises an uncaught exception while rank 0 waits in barrier(); rank 0 prints
`uncaught {json}` (the time it started waiting) first. The job must end (rank 0 with
DDStoreTimeoutError) within DDSTORE_TIMEOUT_S, or at once with DDSTORE_ABORT_ON_EXCEPTION=1."""

import json
import os
import signal
import sys
import threading
import time

import numpy as np
from _common import main_guard, rows_of, wait_stopped
from mpi4py import MPI
from pyddstore._shares import share_of

import pyddstore

N, SHAPE = 64, (16,)


def interrupted_after(delay, call, *args):
    """Seconds from a SIGINT sent `delay` s into `call` to the KeyboardInterrupt it raised."""
    sent = []

    def ctrl_c():
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)

    timer = threading.Timer(delay, ctrl_c)
    timer.start()
    try:
        call(*args)
    except KeyboardInterrupt:
        return round(time.monotonic() - sent[0], 3)
    finally:
        timer.cancel()
    raise AssertionError(f"{call.__name__} returned although interrupted")


def rows_of_rank(store, rank):
    first, count = share_of(N, store.size, rank)
    return np.arange(first, first + count)


def interrupt():
    store = pyddstore.PyDDStore(MPI.COMM_WORLD, method=1)
    first, count = share_of(N, store.size, store.rank)
    store.add("v", rows_of(3, np.arange(first, first + count), SHAPE, "float32"))
    # A second store for the barrier: an interrupted collective retires its communicator.
    spare = pyddstore.PyDDStore(MPI.COMM_WORLD, method=1, settings=pyddstore.Settings.from_env(timeout_s=3))
    pids = store.allgather(os.getpid())
    report = {"rank": store.rank}
    other = rows_of_rank(store, 1 - store.rank)
    out = np.zeros((len(other),) + SHAPE, np.float32)
    if store.rank == 0:
        os.kill(pids[1], signal.SIGSTOP)
        wait_stopped(pids[1])
        try:
            report["read_interrupt_s"] = interrupted_after(1.0, store.get_batch, "v", out, other)
        finally:
            os.kill(pids[1], signal.SIGCONT)
        store.get_batch("v", out, other)
        assert np.array_equal(out, rows_of(3, other, SHAPE, "float32")), "rows differ after the interrupt"
        store.barrier()
        time.sleep(2.0)  # rank 1 waits in spare.barrier() meanwhile
        try:
            spare.barrier()
            report["late_barrier"] = "passed"
        except pyddstore.DDStoreTimeoutError:
            report["late_barrier"] = "timeout"
    else:
        store.barrier()
        report["barrier_interrupt_s"] = interrupted_after(1.0, spare.barrier)
        try:
            spare.barrier()
            raise AssertionError("a collective after an interrupted one passed")
        except pyddstore.DDStoreError as e:
            assert "interrupted" in str(e), e
            report["next_collective"] = str(e)
        store.get_batch("v", out, other)
        assert np.array_equal(out, rows_of(3, other, SHAPE, "float32")), "rows differ after the interrupt"
    print("signals " + json.dumps(report), flush=True)
    store.free()


def uncaught():
    store = pyddstore.PyDDStore(MPI.COMM_WORLD, method=1)
    store.barrier()
    if store.rank == 1:
        time.sleep(0.5)
        raise RuntimeError("rank 1 fails (on purpose)")
    print("uncaught " + json.dumps({"waiting_since": time.time()}), flush=True)
    store.barrier()
    raise AssertionError("barrier() passed without rank 1")


if __name__ == "__main__":
    if sys.argv[1] == "interrupt":
        main_guard(interrupt)
    else:
        uncaught()  # its exception must stay uncaught
