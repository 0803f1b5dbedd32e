"""Runs examples/quickstart.py as written (under mpirun) and checks what it read: every batch
the loader gave it equals the source's rows of its labels, each epoch's samples are this rank's
part of the sampler's order, and the ranks together read every sample. Then checks
pyddstore.torch's DistributedSampler against torch's own with the same rank and size: seed,
epoch, shuffle and drop_last semantics, on a size that does not divide evenly."""

import contextlib
import io
import os
import runpy

import torch
import torch.utils.data.distributed as tud
from pyddstore.torch import ThreadDataLoader

HERE = os.path.dirname(os.path.abspath(__file__))

# Every batch the example's loader yields, copied as it goes (the example itself only counts).
epochs = []
_iter = ThreadDataLoader.__iter__


def _recording_iter(self):
    epochs.append([])
    for x, y in _iter(self):
        epochs[-1].append((x.clone(), y.clone()))
        yield x, y


ThreadDataLoader.__iter__ = _recording_iter
out = io.StringIO()
with contextlib.redirect_stdout(out):
    g = runpy.run_path(os.path.join(HERE, "..", "..", "examples", "quickstart.py"), run_name="__main__")
ThreadDataLoader.__iter__ = _iter
printed = out.getvalue()
print(printed, end="")

from mpi4py import MPI  # noqa: E402 - the example imported torch first
from pyddstore.__main__ import info  # noqa: E402
from pyddstore.torch import DistDataset, DistributedSampler  # noqa: E402

comm = MPI.COMM_WORLD
n, features, sampler = g["n"], g["features"], g["sampler"]
assert len(epochs) == 2, len(epochs)
for epoch, batches in enumerate(epochs):
    for x, y in batches:
        assert torch.equal(x, features[y])  # any rank's rows, exactly as the source has them
    mine = torch.cat([y for _, y in batches]).tolist()
    sampler.set_epoch(epoch)
    assert mine == list(sampler), epoch  # this rank's part of the epoch's order, in order
    everyone = comm.allgather(mine)
    assert sorted(set(sum(everyone, []))) == list(range(n))  # the ranks together cover every sample
    assert f"rank {comm.rank} of {comm.size}, epoch {epoch}: {len(mine)} samples read" in printed
print(f"quickstart ok: rank {comm.rank} of {comm.size} read {len(mine)} samples per epoch")

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
