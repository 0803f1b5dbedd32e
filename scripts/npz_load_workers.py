"""A map-style npz load with load_workers="threads" against "processes" (issue 37): the files in
the page cache (an in-memory load), rounds alternating, each rank's load time and the job's.

mpirun -n 2 python scripts/npz_load_workers.py DIR [--files 32 --kib 14305 --rounds 3]

DIR keeps the s000000.npz ... files (one uint8 array per file, written once, reused).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from mpi4py import MPI
from pyddstore.torch import DistDataset
from torch.utils.data import Dataset


class NpzFiles(Dataset):
    def __init__(self, d: str, n: int):
        self.d, self.n = d, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        with np.load(os.path.join(self.d, f"s{i:06d}.npz")) as z:
            return z["x"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--files", type=int, default=32)
    ap.add_argument("--kib", type=int, default=14305, help="KiB per sample (14305: 14.65 MB)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    os.makedirs(args.dir, exist_ok=True)
    for i in range(comm.rank, args.files, comm.size):
        p = os.path.join(args.dir, f"s{i:06d}.npz")
        if not os.path.exists(p):
            np.savez(p, x=np.full(args.kib * 1024, i % 251, np.uint8))
    comm.Barrier()
    for i in range(args.files):  # in the page cache: an in-memory load
        with open(os.path.join(args.dir, f"s{i:06d}.npz"), "rb") as f:
            while f.read(1 << 24):
                pass
    times: dict = {"threads": [], "processes": []}
    for r in range(args.rounds):
        for mode in ("threads", "processes") if r % 2 == 0 else ("processes", "threads"):
            comm.Barrier()
            t0 = time.perf_counter()
            ds = DistDataset(NpzFiles(args.dir, args.files), f"npz{r}{mode[0]}", comm, load_workers=mode)
            mine = time.perf_counter() - t0
            job = max(comm.allgather(mine))
            assert int(np.asarray(ds[args.files - 1])[0]) == (args.files - 1) % 251
            ds.free()
            times[mode].append(job)  # np.load's reads stay cached: every round reads from memory
    if comm.rank == 0:
        load = os.getloadavg()[0]
        for mode, t in times.items():
            rounds = ", ".join(f"{x:.2f}" for x in t)
            print(f"{mode}: {rounds} s (best {min(t):.2f} s), load average {load:.1f}")


if __name__ == "__main__":
    main()
