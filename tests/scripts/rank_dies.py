"""One rank ends while the others use the store: the whole job must end.

    mpirun -n 3 python rank_dies.py METHOD HOW    (DDSTORE_TIMEOUT_S small, e.g. 5)

Every rank builds a store with method METHOD (0: MPI RMA, 1: libfabric) and checks a read of
every rank's rows. Then rank 1 ends: HOW=raise, of an uncaught exception; HOW=exit, with
sys.exit(3) (no exception hook runs; the store is left unfreed). Rank 0 reads rank 1's rows in a
loop (up to 60 s) and rank 2 waits in barrier(); each survivor prints `waiting {json}` (rank, the
time it began) first. The job must end, nonzero, within DDSTORE_TIMEOUT_S + 10 s of that time."""

import json
import sys
import time

import numpy as np
from _common import rows_of
from mpi4py import MPI
from pyddstore._shares import share_of

import pyddstore

N, SHAPE = 60, (4,)


def main(method: int, how: str) -> None:
    store = pyddstore.PyDDStore(MPI.COMM_WORLD, method=method)
    first, count = share_of(N, store.size, store.rank)
    store.add("v", rows_of(5, np.arange(first, first + count), SHAPE, "float32"))
    every = np.arange(N)
    out = np.zeros((N,) + SHAPE, np.float32)
    store.get_batch("v", out, every)
    assert np.array_equal(out, rows_of(5, every, SHAPE, "float32")), "rows differ"
    store.barrier()
    if store.rank == 1:
        time.sleep(0.5)
        if how == "exit":
            sys.exit(3)
        raise RuntimeError("rank 1 fails (on purpose)")
    print("waiting " + json.dumps({"rank": store.rank, "since": time.time()}), flush=True)
    if store.rank == 0:
        f1, c1 = share_of(N, store.size, 1)
        theirs = np.arange(f1, f1 + c1)
        got = np.zeros((c1,) + SHAPE, np.float32)
        # Reads only (no collective) for up to a minute: a method-0 rank stuck in its exit's
        # MPI_Win_free still serves its window, so these pass until the job is ended.
        until = time.monotonic() + 60
        while time.monotonic() < until:
            store.get_batch("v", got, theirs)
            assert np.array_equal(got, rows_of(5, theirs, SHAPE, "float32")), "rows differ"
        raise AssertionError("rank 1's rows read on for 60 s after it died")
    store.barrier()
    raise AssertionError("barrier() passed without rank 1")


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])  # rank 1's exception must stay uncaught
