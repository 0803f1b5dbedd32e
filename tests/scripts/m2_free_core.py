"""Method-2 core job that frees its variables while extra jobs hold them, and keeps living:
publishes a fixed-row variable "fx" and a ragged "rg" (generation 1), waits for {hs}/FREE,
frees that store, publishes different variables under the same names (generation 2: other
rows, widths and contents), writes {hs}/READDED, then serves until {hs}/STOP.

    mpirun -n 2 python m2_free_core.py --hs DIR
"""

from __future__ import annotations

import argparse
import os

from _common import main_guard
from m2_common import free_gen_fixed, free_gen_ragged, free_gen_rows, wait_for
from pyddstore._shares import share_of

import pyddstore


def publish(comm, hs: str, gen: int):
    store = pyddstore.PyDDStore(comm, method=2, handshake_dir=hs)
    first, count = share_of(free_gen_rows(gen), store.size, store.rank)
    store.add("fx", free_gen_fixed(gen, range(first, first + count)))
    values, lengths = free_gen_ragged(gen, range(first, first + count))
    store.add("rg", values, lengths=lengths)
    store.barrier()
    return store


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--hs", required=True)
    a = p.parse_args()
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    store = publish(comm, a.hs, 1)
    print(f"core gen 1 ready: rank {store.rank} pid {os.getpid()} {store.transport}", flush=True)
    wait_for(os.path.join(a.hs, "FREE"))
    store.free()
    store = publish(comm, a.hs, 2)
    if store.rank == 0:
        open(os.path.join(a.hs, "READDED"), "w").close()
    print(f"core gen 2 ready: rank {store.rank}", flush=True)
    wait_for(os.path.join(a.hs, "STOP"))
    store.free()
    print(f"core stopped: rank {store.rank}", flush=True)


main_guard(main)
