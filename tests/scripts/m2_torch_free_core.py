"""Method-2 core job of a DistDataset that frees it while extra jobs read it and keeps living:
serves generation 1 of "m2f" (a fixed and a ragged field), waits for {hs}/FREE, frees it,
serves generation 2 under the same name (other values, other row lengths), writes
{hs}/READDED, then serves until {hs}/STOP.

    mpirun -n 2 python m2_torch_free_core.py --hs DIR
"""

from __future__ import annotations

import argparse
import os

import torch  # before MPI starts
from _common import main_guard
from m2_common import FreeGenSamples, wait_for
from pyddstore.torch import DistDataset


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--hs", required=True)
    a = p.parse_args()
    from mpi4py import MPI

    def serve(gen):
        src = FreeGenSamples(gen)
        ds = DistDataset(src, "m2f", comm=MPI.COMM_WORLD, method=2, handshake_dir=a.hs, ragged={"pos": 0})
        assert torch.equal(ds[3]["pos"], src[3]["pos"])
        return ds

    ds = serve(1)
    print(f"torch core gen 1 ready: rank {ds.ddstore.rank}", flush=True)
    wait_for(os.path.join(a.hs, "FREE"))
    ds.free()
    ds = serve(2)
    ds.ddstore.barrier()
    if ds.ddstore.rank == 0:
        open(os.path.join(a.hs, "READDED"), "w").close()
    wait_for(os.path.join(a.hs, "STOP"))
    ds.free()
    print(f"torch core stopped: rank {ds.ddstore.rank}", flush=True)


main_guard(main)
