"""Method-2 core job: publishes a ragged variable r and variables a, b, c (every row a
function of the row and the group) in --hs, then serves until {hs}/STOP appears or SIGTERM/SIGINT, and frees.

    mpirun -n 2 python m2_core.py --hs DIR [--width W] [--comm mpi|file]
"""

from __future__ import annotations

import argparse
import os
import signal
import time

import numpy as np
from _common import main_guard, rows_of
from m2_common import N_ROWS, RAGGED, VARS, ragged_rows, seed_of
from pyddstore._shares import share_of

import pyddstore

STOPPED = []


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--hs", required=True)
    p.add_argument("--width", type=int, default=None)
    p.add_argument("--comm", choices=["mpi", "file"], default="mpi")
    a = p.parse_args()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, _f: STOPPED.append(s))
    if a.comm == "mpi":
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
    else:
        comm = pyddstore.FileComm(os.path.join(a.hs, "filecomm"))
    store = pyddstore.PyDDStore(comm, method=2, handshake_dir=a.hs, ddstore_width=a.width)
    assert store.method == 2
    first, count = share_of(N_ROWS, store.size, store.rank)
    store.add(RAGGED, *ragged_rows(store.group_id, range(first, first + count)))  # published before a
    for i, (name, (_, shape, dtype)) in enumerate(VARS.items()):
        first, count = share_of(N_ROWS, store.size, store.rank)
        rows = rows_of(seed_of(name, store.group_id), np.arange(first, first + count), shape, dtype)
        if i % 2 == 0:
            store.add(name, rows)
        else:  # init + update publishes too
            store.init(name, count, int(np.prod(shape)), dtype=dtype)
            store.update(name, rows, 0)
    store.barrier()
    print(
        f"core ready: rank {store.rank}/{store.size} group {store.group_id} pid {os.getpid()} "
        f"{store.transport}",
        flush=True,
    )
    stop_file = os.path.join(a.hs, "STOP")
    while not STOPPED and not os.path.exists(stop_file):
        time.sleep(0.05)
    store.free()
    print(f"core stopped: rank {store.rank} ({'signal' if STOPPED else 'stop file'})", flush=True)


main_guard(main)
