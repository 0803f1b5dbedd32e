"""Runs examples/quickstart.py as written (under mpirun), then checks pyddstore.torch's
DistributedSampler against torch's own with the same rank and size: seed, epoch, shuffle
and drop_last semantics, on a size that does not divide evenly."""

import contextlib
import io
import os
import runpy

import torch.utils.data.distributed as tud

HERE = os.path.dirname(os.path.abspath(__file__))
g = runpy.run_path(os.path.join(HERE, "..", "..", "examples", "quickstart.py"), run_name="__main__")

from mpi4py import MPI  # noqa: E402 - the example imported torch first
from pyddstore.__main__ import info  # noqa: E402
from pyddstore.torch import DistDataset, DistributedSampler  # noqa: E402

comm = MPI.COMM_WORLD

# `python -m pyddstore info` as this rank would print it under mpirun.
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    info()
text = buf.getvalue()
assert "launcher: mpirun (Open MPI)" in text and "communicator: mpi (MPI.COMM_WORLD)" in text, text
assert "method: 0 (MPI RMA)" in text, text
odd = DistDataset(g["features"][:1001], "odd", comm)  # 1001 samples: uneven over 2 or 3 ranks
for shuffle in (True, False):
    for drop_last in (False, True):
        for seed in (0, 7):
            ours = DistributedSampler(odd, shuffle=shuffle, seed=seed, drop_last=drop_last)
            ref = tud.DistributedSampler(
                odd, num_replicas=comm.size, rank=comm.rank, shuffle=shuffle, seed=seed, drop_last=drop_last
            )
            assert (ours.rank, ours.num_replicas) == (comm.rank, comm.size)
            for epoch in (0, 3):
                ours.set_epoch(epoch)
                ref.set_epoch(epoch)
                assert list(ours) == list(ref), (shuffle, drop_last, seed, epoch)
                assert len(ours) == len(ref)
try:
    DistributedSampler(odd, num_replicas=comm.size + 1)
except ValueError as e:
    assert "pass rank=" in str(e), e
else:
    raise AssertionError("num_replicas without rank must raise")
odd.free()
print(f"sampler ok rank {comm.rank}")
