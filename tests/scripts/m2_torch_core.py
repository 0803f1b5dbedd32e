"""Method-2 core job of a DistDataset: every sample a function of its index; serves until
{hs}/STOP appears or SIGTERM, then frees.

    mpirun -n 2 python m2_torch_core.py --hs DIR
"""

from __future__ import annotations

import argparse
import os
import signal
import time

import torch  # before MPI starts
from _common import main_guard
from m2_common import Samples
from pyddstore.torch import DistDataset

STOPPED = []


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--hs", required=True)
    a = p.parse_args()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, _f: STOPPED.append(s))
    from mpi4py import MPI

    ds = DistDataset(Samples(), "m2t", comm=MPI.COMM_WORLD, method=2, handshake_dir=a.hs)
    assert ds.ddstore.method == 2 and torch.equal(ds[5][0], Samples()[5][0])
    print(f"torch core ready: rank {ds.ddstore.rank}", flush=True)
    while not STOPPED and not os.path.exists(os.path.join(a.hs, "STOP")):
        time.sleep(0.05)
    ds.free()
    print(f"torch core stopped: rank {ds.ddstore.rank}", flush=True)


main_guard(main)
