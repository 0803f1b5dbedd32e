"""A peer stopped with SIGSTOP past DDSTORE_TIMEOUT_S while rank 0 reads it.

    mpirun -n 2 python rel_stall.py <method> resume|stay

Rank 0 stops rank 1, reads rank 1's rows (DDStoreTimeoutError naming rank 1,
or the rows when the provider reads a stopped process's memory itself, as shm
does). `resume`: rank 0 resumes rank 1, reads again (checked against rank 1's
data), and both ranks free: free() must complete. `stay`: rank 1 is stopped before
it reaches free(), and rank 0 frees while it is still stopped: free() must
raise DDStoreTimeoutError naming rank 1 within DDSTORE_TIMEOUT_S + slack
(leaving its share mapped); then rank 1 is resumed and its free() completes
or raises within the timeout too. Rank 0 resumes rank 1 itself after
DDSTORE_TIMEOUT_S + 12 s in any case, as an outside resume would (report key
`resumed_from_outside`). Every rank prints `stall {json}`."""

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

N, SHAPE, SLACK_S = 40, (64,), 10.0
# A stopped job is resumed from outside (Slurm, a shell): if rank 0's read is held inside the
# provider until rank 1 runs again (libfabric 1.x shm locks a peer's region), this plays that
# part, and the report says it did.
RESUME_AFTER_S = 12.0


def timed_free(store, limit):
    t0 = time.monotonic()
    try:
        store.free()
        outcome = "freed"
    except pyddstore.DDStoreTimeoutError as e:
        assert "[1]" in str(e) or "[0]" in str(e), f"free() names no rank: {e}"
        outcome = "timeout"
    took = time.monotonic() - t0
    assert took < limit + SLACK_S, f"free() took {took:.1f} s with DDSTORE_TIMEOUT_S={limit}"
    return outcome, took


def main():
    method, mode = int(sys.argv[1]), sys.argv[2]
    limit = float(os.environ["DDSTORE_TIMEOUT_S"])
    store = pyddstore.PyDDStore(MPI.COMM_WORLD, method=method)
    first, count = share_of(N, store.size, store.rank)
    store.add("v", rows_of(5, np.arange(first, first + count), SHAPE, "float32"))
    pids = store.allgather(os.getpid())
    report = {"rank": store.rank, "method": method, "mode": mode}
    if store.rank == 0:
        f1, c1 = share_of(N, store.size, 1)
        rows = np.arange(f1, f1 + c1)
        out = np.empty((len(rows),) + SHAPE, np.float32)
        os.kill(pids[1], signal.SIGSTOP)
        wait_stopped(pids[1])
        resumed = threading.Event()

        def resume_from_outside():
            resumed.set()
            os.kill(pids[1], signal.SIGCONT)

        outside = threading.Timer(limit + RESUME_AFTER_S, resume_from_outside)
        outside.start()
        try:
            t0 = time.monotonic()
            try:
                store.get_batch("v", out, rows)
                report["stopped_read"] = "read"
                assert np.array_equal(out, rows_of(5, rows, SHAPE, "float32"))
            except pyddstore.DDStoreTimeoutError as e:
                assert "rank 1" in str(e), e
                report["stopped_read"] = "timeout"
            report["stopped_read_s"] = round(time.monotonic() - t0, 2)
            outside.cancel()
            report["resumed_from_outside"] = resumed.is_set()
            if mode == "resume":
                os.kill(pids[1], signal.SIGCONT)
                out[:] = 0
                store.get_batch("v", out, rows)
                assert np.array_equal(out, rows_of(5, rows, SHAPE, "float32")), "rows after resume differ"
                report["free"], report["free_s"] = timed_free(store, limit)
            else:
                report["free"], report["free_s"] = timed_free(store, limit)
        finally:
            outside.cancel()
            os.kill(pids[1], signal.SIGCONT)
    else:
        if mode == "stay":
            time.sleep(1.0)  # rank 0 stops this rank here, before it reaches free()
        report["free"], report["free_s"] = timed_free(store, limit)
    if mode == "stay" and store.rank == 0:
        assert report["free"] == "timeout", f"free() completed although rank 1 was stopped: {report}"
    if mode == "resume":
        assert report["free"] == "freed", report
    print("stall " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main_guard(main)
