"""Forked torch DataLoader workers reading a DistDataset (methods 1/2, DDSTORE_FORK_WORKERS=1):
batches equal DataLoader over the plain source, with and without persistent workers, and each
worker opens its own reader. Also a DistDatasetReader-free check that device= is ignored in
workers (host tensors).

Usage: DDSTORE_FORK_WORKERS=1 mpirun -n N python torch_fork.py --method 1
"""

from __future__ import annotations

import os

import torch
import torch_common as tc
from pyddstore.torch import DistDataset
from torch.utils.data import DataLoader

A = tc.args()
W = tc.World(A)  # after pyddstore: it sets libfabric defaults before MPI starts libfabric


class Pids(torch.utils.data.Dataset):
    """Wraps a dataset and adds the reading process's pid to every sample."""

    def __init__(self, ds):
        self.ds = ds

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        return (*self.ds[i], os.getpid())


def main():
    src = tc.TupleSrc(45)
    ds = DistDataset(src, "forked", comm=W.comm, method=A.method, handshake_dir=A.hs or None)
    want = tc.distributed_batches(W, DataLoader, src, 3)
    tc.same(want, tc.distributed_batches(W, DataLoader, ds, 3, num_workers=2), "forked workers")
    tc.same(
        want,
        tc.distributed_batches(W, DataLoader, ds, 3, num_workers=2, persistent_workers=True),
        "persistent forked workers",
    )

    pids = set()
    for epoch in tc.distributed_batches(W, DataLoader, Pids(ds), 2, num_workers=2, persistent_workers=True):
        for b in epoch:
            pids.update(b[-1].tolist())
    assert os.getpid() not in pids and len(pids) == 2, pids  # read in the two workers

    # device= applies in this process only: forked workers return host tensors.
    ds_dev = DistDataset(
        src, "forked_dev", comm=W.comm, method=A.method, handshake_dir=A.hs or None, device="cpu"
    )
    got = tc.distributed_batches(W, DataLoader, ds_dev, 1, num_workers=1)
    assert all(b[0].device.type == "cpu" for b in got[0])
    tc.same(want[:1], got, "device= in workers")
    ds_dev.free()
    ds.free()
    W.barrier()
    print(f"rank {W.rank}: ok", flush=True)


tc.run(main)
