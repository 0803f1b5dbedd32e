"""A forked process worker's page faults: ThreadDataLoader(worker_type="process") with two
workers per rank reads a method-1 DistDataset whose rows are all same-node (this rank's share
and its peer's mapping). fork() copies no page tables of shared mappings, so a worker that did
not populate them faults them in on first touch, a few dozen minor faults per batch; with the
shares populated when it starts (persistent workers), it reads later epochs' new rows without
faulting. Every batch is checked against the rows the owning rank stored; the workers' minor faults (from
/proc/<pid>/stat) are counted over the epochs after the first.

    python proc_faults.py --comm file --hs DIR   (2 plain processes)
"""

from __future__ import annotations

import multiprocessing

import numpy as np
import torch
import torch_common as tc
from torch.utils.data import Dataset
from torch.utils.data.distributed import DistributedSampler

N = 2048
SHAPE = (3, 64, 64)  # 48 KiB rows, as the workers bench
BATCH = 64
EPOCHS = 4


def x_of(i: int) -> torch.Tensor:
    return torch.full(SHAPE, float(i), dtype=torch.float32) + torch.arange(SHAPE[-1], dtype=torch.float32)


class Src(Dataset):
    def __len__(self) -> int:
        return N

    def __getitem__(self, i):
        return x_of(i), i


def minor_faults(pid: int) -> int:
    """minflt of process `pid`: the 10th field of /proc/<pid>/stat (after the name)."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])


def main() -> None:
    from pyddstore.torch import DistDataset, ThreadDataLoader

    a = tc.args()
    world = tc.World(a)
    ds = DistDataset(Src(), "proc_faults", world.comm, method=1)
    # Both ranks' shares are mapped here: the main process populates all of them (a no-op for
    # its own pages, which are mapped already), as a persistent worker does when it starts.
    share_bytes = N * (int(np.prod(SHAPE)) * 4 + 8)
    populated = ds._populate_node_shares()
    print(f"rank {world.rank}: populated {populated} of {share_bytes} bytes", flush=True)
    assert populated in (0, share_bytes), (populated, share_bytes)
    if populated == 0:
        print(f"rank {world.rank}: MADV_POPULATE_READ refused: faults not counted", flush=True)
    sampler = DistributedSampler(ds, num_replicas=world.size, rank=world.rank, shuffle=True, seed=7)
    loader = ThreadDataLoader(
        ds, batch_size=BATCH, sampler=sampler, num_workers=2, worker_type="process", persistent_workers=True
    )
    faults, batches = 0, 0
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        # (The workers start in the first epoch and stay: counted from before each later one.)
        before = {p.pid: minor_faults(p.pid) for p in multiprocessing.active_children()}
        n = 0
        for x, y in loader:
            for k, i in enumerate(y.tolist()):
                assert torch.equal(x[k], x_of(i)), f"rank {world.rank}: wrong row {i} in epoch {epoch}"
            n += 1
        assert n == len(sampler) // BATCH + bool(len(sampler) % BATCH), n
        if epoch > 0:  # the first epoch populates the shares and allocates the slots
            assert len(before) == 2, before
            faults += sum(minor_faults(p) - f for p, f in before.items())
            batches += n
    loader.close()
    per_batch = faults / batches
    print(f"rank {world.rank}: workers' minor faults per batch {per_batch:.1f} ({faults} in {batches})")
    if populated:
        # Without the populate: 28-29 per batch here (each 64 KiB of new rows one fault).
        assert per_batch < 8, f"rank {world.rank}: {per_batch:.1f} minor faults per batch in the workers"
    world.barrier()
    ds.free()
    print(f"rank {world.rank}: proc_faults ok", flush=True)


if __name__ == "__main__":
    tc.run(main)
