"""Many variables read from many threads, and a reader stopped and resumed while it reads.

    mpirun -n 9 python net_threads.py

Every rank adds FIELDS variables. Rank 0 reads random rows of every variable (from every
rank) in READERS threads, each row checked against what its owner stored, while rank 1
stops (SIGSTOP) and resumes (SIGCONT) rank 0 STOPS times: no read may fail (an interrupted
wait is retried). Rank 0 then counts its open file descriptors: endpoints are shared per
peer, not opened per variable and thread. Prints `threads {json}`."""

import json
import os
import signal
import threading
import time

import numpy as np
from _common import main_guard, rows_of, run_threads
from mpi4py import MPI
from pyddstore._shares import share_of

import pyddstore

FIELDS, READERS, ROWS_PER_RANK, SHAPE, STOPS = 25, 4, 16, (8,), 3


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def main():
    store = pyddstore.PyDDStore(MPI.COMM_WORLD, method=1)
    n = ROWS_PER_RANK * store.size
    first, count = share_of(n, store.size, store.rank)
    for f in range(FIELDS):
        store.add(f"f{f}", rows_of(f, np.arange(first, first + count), SHAPE, "int32"))
    pids = store.allgather(os.getpid())
    report = {"rank": store.rank, "size": store.size}
    done = threading.Event()
    if store.rank == 0:
        report["fds_before"] = open_fds()
        batches = [0] * READERS

        def read(i):
            rng = np.random.default_rng(i)
            out = np.empty((32,) + SHAPE, np.int32)
            while not done.is_set() or batches[i] < FIELDS:
                f = int(rng.integers(FIELDS)) if batches[i] >= FIELDS else batches[i]
                rows = rng.integers(0, n, size=len(out))
                store.get_batch(f"f{f}", out, rows)
                assert np.array_equal(out, rows_of(f, rows, SHAPE, "int32")), f"field {f} differs"
                batches[i] += 1

        errors = []
        readers = threading.Thread(target=_record, args=(errors, run_threads, READERS, read))
        readers.start()
        store.barrier()  # rank 1 stops and resumes this process meanwhile
        done.set()
        readers.join()
        if errors:
            raise errors[0]
        report["batches"] = sum(batches)
        report["fds_after"] = open_fds()
    else:
        if store.rank == 1:
            time.sleep(1.0)
            for _ in range(STOPS):
                os.kill(pids[0], signal.SIGSTOP)
                time.sleep(0.5)
                os.kill(pids[0], signal.SIGCONT)
                time.sleep(0.5)
        store.barrier()
    # Reported before free(): Open MPI may drop what a rank prints just before it exits.
    print("threads " + json.dumps(report), flush=True)
    store.free()


def _record(errors, fn, *args):
    try:
        fn(*args)
    except BaseException as e:  # noqa: BLE001 - re-raised by the main thread
        errors.append(e)


if __name__ == "__main__":
    main_guard(main)
