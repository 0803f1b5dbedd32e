"""Under torchrun (2 processes): comm=None before init_process_group raises a clear error
(never a 1-rank store holding everything); after it, the store spans both processes and
every sample reads back as the source has it."""

import contextlib
import io
import os

import torch
import torch.distributed as dist
from pyddstore.__main__ import info
from pyddstore.torch import DistDataset, DistributedSampler
from torch.utils.data import TensorDataset

import pyddstore

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])

# `python -m pyddstore info` as this process would print it: torchrun seen, comm=None refused.
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    info()
text = buf.getvalue()
assert f"launcher: torchrun (RANK={rank}, WORLD_SIZE={world})" in text, text
assert "communicator: none: comm=None raises" in text and "init_process_group" in text, text
n = 300
x = torch.arange(n * 4, dtype=torch.float32).reshape(n, 4) * 0.5
src = TensorDataset(x, torch.arange(n))

try:
    DistDataset(src, "x", None, method=1)
except pyddstore.DDStoreValueError as e:
    msg = str(e)
    assert "torchrun" in msg and "init_process_group" in msg and f"of {world}" in msg, msg
    print(f"rank {rank}: no group -> {type(e).__name__}")
else:
    raise AssertionError("comm=None under torchrun without a group must raise")

dist.init_process_group("gloo")
ds = DistDataset(src, "x", None, method=1)
assert (ds.ddstore.size, ds.ddstore.rank, ds.ddstore.comm_kind) == (world, rank, "torch"), ds.ddstore
for i in range(n):  # every sample, most of them owned by the other process
    xi, yi = ds[i]
    assert torch.equal(xi, x[i]) and int(yi) == i, i
sampler = DistributedSampler(ds, seed=3)
assert (sampler.rank, sampler.num_replicas) == (rank, world)
dist.barrier()
ds.free()
dist.destroy_process_group()
print(f"torchrun ok rank {rank} of {world}")
