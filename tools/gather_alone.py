"""One path of the paths bench, alone and sustained, for profilers (`perf record -a`, `perf stat
--per-thread`) that cannot tell the bench's alternating rounds apart:

    mpirun -n 2 --bind-to none python tools/gather_alone.py auto 6     # the tcp gather path
    mpirun -n 2 --bind-to none python tools/gather_alone.py socket 6   # the plain-socket line

Every rank reads batches of 128 random 3 KB rows of the other ranks' shares for the given seconds
(the first batch is checked against the owners' data) and prints its time per row.
"""

import sys
import time

import numpy as np
from mpi4py import MPI
from pyddstore._store import PyDDStore
from pyddstore.benchmarks._common import bench_settings
from pyddstore.benchmarks.paths import PATHS, SocketGather
from pyddstore.benchmarks.stores import pattern

ROW_BYTES, BATCH, PER_RANK = 3072, 128, 4096


def main() -> None:
    path, seconds = sys.argv[1], float(sys.argv[2])
    if path not in ("auto", "socket"):
        raise SystemExit("path: auto (the gather path) or socket (the plain-socket line)")
    comm = MPI.COMM_WORLD
    rank = comm.rank
    rows = np.arange(PER_RANK * comm.size)
    remote = rows[rows // PER_RANK != rank]
    batches = np.random.default_rng(11).choice(remote, (64, BATCH))
    out = np.empty((BATCH, ROW_BYTES), np.uint8)
    if path == "socket":
        sockets = SocketGather(comm, PER_RANK, ROW_BYTES)
        read, close = (lambda r: sockets.gather(out, r)), sockets.close
    else:
        store = PyDDStore(comm, method=1, settings=bench_settings(**PATHS["auto"]))
        store.add("p", pattern(np.arange(rank * PER_RANK, (rank + 1) * PER_RANK), ROW_BYTES))
        read, close = (lambda r: store.get_batch("p", out, r)), store.free
    read(batches[0])
    if not np.array_equal(out, pattern(batches[0], ROW_BYTES)):
        raise SystemExit(f"{path}: wrong data for rows {batches[0][:8]}")
    comm.Barrier()
    started, done = time.perf_counter(), 0
    while time.perf_counter() - started < seconds:
        read(batches[done % len(batches)])
        done += 1
    took = time.perf_counter() - started
    print(f"{path} rank {rank}: {took / done / BATCH * 1e6:.2f} us/row, {done} batches", flush=True)
    comm.Barrier()
    close()


if __name__ == "__main__":
    main()
