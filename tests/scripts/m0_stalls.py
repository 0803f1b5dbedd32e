"""Method 0 (MPI RMA) reads from a stopped peer: Ctrl-C and DDSTORE_TIMEOUT_S end them.

    OMPI_MCA_osc=pt2pt DDSTORE_SHM=0 mpirun -n 2 python m0_stalls.py stopped
    DDSTORE_SHM=0 mpirun -n 2 python m0_stalls.py long

osc/pt2pt serves a get only while the target is inside MPI, so a read from a SIGSTOPped rank
waits. Rank 0 stops rank 1 (which waits in a barrier meanwhile) and reads its rows: SIGINT one
second in must raise KeyboardInterrupt promptly; a store with timeout_s=2 must raise
DDStoreTimeoutError naming rank 1. After each, rank 1 resumed, the same rows read back exact
(the abandoned gets land in buffers the store keeps aside, never in `out`). Rank 0 prints
`m0stall {json}`.

long: with the default one-sided component (osc/sm on one host: each get is a copy done inside
MPI_Rget), rank 0 reads 3 million single rows of rank 1 in one get_batch (over a second, most
of it planning the batch); SIGINT 0.3 s in must raise KeyboardInterrupt before the read is done
(rows are left unread: uninterruptible, the whole batch would land first), and a read after it
is exact. Rank 0 prints `m0long {json}`."""

import json
import os
import signal
import sys
import time

import mpi4py

mpi4py.rc.thread_level = "serialized"  # osc/pt2pt refuses MPI_THREAD_MULTIPLE

import numpy as np  # noqa: E402
from _common import main_guard, rows_of, wait_stopped  # noqa: E402
from mpi4py import MPI  # noqa: E402
from net_signals import interrupted_after, rows_of_rank  # noqa: E402
from pyddstore._shares import share_of  # noqa: E402

import pyddstore  # noqa: E402

N, SHAPE, TIMEOUT_S = 64, (16,), 2


def stopped(pid, call, *args):
    """Runs `call` while `pid` is stopped (resumed afterwards, whatever happens)."""
    os.kill(pid, signal.SIGSTOP)
    wait_stopped(pid)
    try:
        return call(*args)
    finally:
        os.kill(pid, signal.SIGCONT)


def timed_out(store, out, rows):
    started = time.monotonic()
    try:
        store.get_batch("v", out, rows)
    except pyddstore.DDStoreTimeoutError as e:
        return round(time.monotonic() - started, 3), str(e)
    raise AssertionError("a read from a stopped rank returned")


def stopped_peer():
    store = pyddstore.PyDDStore(MPI.COMM_WORLD, method=0)
    settings = pyddstore.Settings.from_env(timeout_s=TIMEOUT_S)
    short = pyddstore.PyDDStore(MPI.COMM_WORLD, method=0, settings=settings)
    first, count = share_of(N, store.size, store.rank)
    for s in (store, short):
        s.add("v", rows_of(3, np.arange(first, first + count), SHAPE, "float32"))
    pids = store.allgather(os.getpid())
    if store.rank == 0:
        other = rows_of_rank(store, 1)
        want = rows_of(3, other, SHAPE, "float32")
        out = np.zeros((len(other),) + SHAPE, np.float32)
        report = {"rank": 0, "osc": os.environ.get("OMPI_MCA_osc", "")}
        # No read before: the first get of a rank (which osc/pt2pt makes wait inside
        # MPI_Rget, for the target's answer) was made when the variable was added.
        report["interrupt_s"] = stopped(pids[1], interrupted_after, 1.0, store.get_batch, "v", out, other)
        out[:] = 0
        store.get_batch("v", out, other)
        assert np.array_equal(out, want), "rows differ after the interrupt"
        report["timeout_s"], report["timeout_error"] = stopped(pids[1], timed_out, short, out, other)
        out[:] = 0
        short.get_batch("v", out, other)
        assert np.array_equal(out, want), "rows differ after the timeout"
        sys.stdout.write("m0stall " + json.dumps(report) + "\n")
        sys.stdout.flush()
    # Rank 1 waits here (inside MPI, so pt2pt serves rank 0's gets once it is resumed).
    store.barrier()
    short.free()
    store.free()


def long_batch():
    n = 12_000_000  # int32 rows (value = row, never 0 in rank 1's share): 24 MB per rank
    store = pyddstore.PyDDStore(MPI.COMM_WORLD, method=0)
    first, count = share_of(n, store.size, store.rank)
    store.add("v", np.arange(first, first + count, dtype=np.int32))
    store.barrier()
    if store.rank == 0:
        a, b = share_of(n, store.size, 1)
        rows = np.arange(a, a + b, 2)  # every other row: one get each
        few = rows[:100]
        small = np.zeros(len(few), np.int32)
        store.get_batch("v", small, few)  # by now gets go straight into `out`
        assert np.array_equal(small, few), "rows differ"
        out = np.zeros(len(rows), np.int32)
        report = {"rank": 0, "rows": len(rows)}
        report["interrupt_s"] = interrupted_after(0.3, store.get_batch, "v", out, rows)
        landed = out != 0
        assert np.array_equal(out[landed], rows[landed]), "wrong rows landed before the interrupt"
        report["landed"] = int(landed.sum())
        small[:] = 0
        store.get_batch("v", small, few[::-1])
        assert np.array_equal(small, few[::-1]), "rows differ after the interrupt"
        sys.stdout.write("m0long " + json.dumps(report) + "\n")
        sys.stdout.flush()
    store.barrier()
    store.free()


if __name__ == "__main__":
    main_guard(stopped_peer if sys.argv[1] == "stopped" else long_batch)
