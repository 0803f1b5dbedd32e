"""Cost of the bounded barrier (free/add/barrier, and before every MPI allgather) against
mpi4py's plain MPI_Barrier, measured in the same run (best of 3 alternating rounds), method 0:

    mpirun -n 2 --bind-to none python tests/scripts/barrier_bench.py [iterations]
"""

import sys
import time

import numpy as np
from mpi4py import MPI

import pyddstore


def main():
    s = pyddstore.PyDDStore(MPI.COMM_WORLD, method=0)
    s.add("x", np.zeros((4, 4), np.float32))
    world = MPI.COMM_WORLD
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    best = {}
    for _ in range(3):
        for name, fn in (("MPI_Barrier", world.Barrier), ("bounded", s.barrier)):
            fn()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            us = (time.perf_counter() - t0) / n * 1e6
            best[name] = min(best.get(name, us), us)
    if s.rank == 0:
        ratio = best["bounded"] / best["MPI_Barrier"]
        plain, bounded = best["MPI_Barrier"], best["bounded"]
        print(f"barrier us: MPI_Barrier {plain:.1f}  bounded {bounded:.1f}  ratio {ratio:.2f}")
    s.free()


if __name__ == "__main__":
    main()
