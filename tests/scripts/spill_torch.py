"""DistDataset with a memory budget (issue 27): samples past it live in spill files; every
sample read (ds[i], ThreadDataLoader batches over a shuffling DistributedSampler, forked and spawned torch
DataLoader workers, a restored snapshot, children forked while the loader reads ahead) is compared
with the source.

mpirun -n 2 python spill_torch.py <spill_dir> <snapshot_dir>
"""

import os
import signal
import sys
import time

import numpy as np
import torch
from pyddstore.torch import DistDataset, DistributedSampler, ThreadDataLoader
from torch.utils.data import DataLoader, Dataset
from torch_common import run, same

N = 201


class Src(Dataset):
    """Fixed and ragged fields: x (40 float32), y (int64), seq (i % 6 + 1 int32 values)."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        if not 0 <= i < N:
            raise IndexError(i)
        return {
            "x": torch.arange(40, dtype=torch.float32) + i * 0.5,
            "y": torch.tensor(i * 3, dtype=torch.int64),
            "seq": torch.arange(i % 6 + 1, dtype=torch.int32) - i,
        }


class SeqSrc(Dataset):
    """The ragged field of Src alone."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        return {"seq": Src()[i]["seq"]}


def check_ragged_read_ahead(comm, spill_dir):
    """A spilled ragged field is read ahead too (its rows staged whole): every sample of a
    shuffled epoch compared with the source, and the field's own prefetch_hits counted."""
    ds = DistDataset(
        SeqSrc(), "spr", comm, method=1, ragged={"seq": 0}, memory_limit=1 << 10, spill_dir=spill_dir
    )
    sampler = DistributedSampler(ds, shuffle=True, seed=5)
    loader = ThreadDataLoader(
        ds, batch_size=8, sampler=sampler, num_workers=1, prefetch_factor=1, collate_fn=list
    )
    var = next(f.var for f in ds._schema.fields if f.key == "seq")
    before = ds._store.get_profile(var)["prefetch_hits"]
    order = list(iter(sampler))
    seen = [s for batch in loader for s in batch]
    assert len(seen) == len(order), (len(seen), len(order))
    for i, s in zip(order, seen):
        same(s, SeqSrc()[i], f"ragged read-ahead sample {i}")
    hits = ds._store.get_profile(var)["prefetch_hits"] - before
    assert hits > 0, "the loader read spilled ragged rows ahead"
    print(f"rank {comm.rank}: ragged read-ahead hits {hits} of {len(order)} samples", flush=True)
    loader.close()
    ds.free()


def check_samples(ds, idx, where):
    for i in idx:
        same(ds[int(i)], Src()[int(i)], f"{where} sample {i}")


def fork_and_check(ds, idx, where):
    """Forks while the loader's threads run; the child reads samples `idx` (spilled ones among
    them) and checks them. A child that does not finish within 60 s is a hang (killed, failed)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            check_samples(ds, idx, where)
            code = 0
        except BaseException as e:  # noqa: BLE001 - reported, then the child exits
            sys.stderr.write(f"{where}: {e!r}\n")
        os._exit(code)
    for _ in range(600):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"{where}: child failed ({status})"
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError(f"{where}: the forked child hung")


def check_loader(ds, rank, size, where):
    """ThreadDataLoader over a shuffling DistributedSampler: set_epoch, read-ahead of spilled
    rows, and a resume from state_dict() mid-epoch; every sample compared with the source."""
    sampler = DistributedSampler(ds, num_replicas=size, rank=rank, shuffle=True, seed=3)
    loader = ThreadDataLoader(
        ds, batch_size=8, sampler=sampler, num_workers=1, prefetch_factor=1, collate_fn=list
    )
    before = ds._store.get_profile()["prefetch_hits"]
    sampler.set_epoch(1)  # set_epoch before iterating, as training loops do
    order = list(iter(sampler))
    seen = []
    for k, batch in enumerate(loader):
        seen += batch
        if k % 4 == 1:  # the read-ahead thread is staging: a fork now must not hang the child
            fork_and_check(ds, order[: len(seen) + 16], f"{where} forked at batch {k}")
    assert len(seen) == len(order), (len(seen), len(order))
    for i, s in zip(order, seen):
        same(s, Src()[i], f"{where} epoch 1 sample {i}")
    hits = ds._store.get_profile()["prefetch_hits"] - before
    assert hits > 0, "the loader read spilled rows ahead"
    print(f"rank {rank}: read-ahead hits {hits} of {len(order)} samples' rows", flush=True)

    sampler.set_epoch(2)
    it = iter(loader)
    first = [s for _ in range(3) for s in next(it)]
    state = loader.state_dict()
    del it
    sampler2 = DistributedSampler(ds, num_replicas=size, rank=rank, shuffle=True, seed=3)
    resumed = ThreadDataLoader(
        ds, batch_size=8, sampler=sampler2, num_workers=1, prefetch_factor=1, collate_fn=list
    )
    resumed.load_state_dict(state)
    rest = [s for batch in resumed for s in batch]
    sampler.set_epoch(2)
    order = list(iter(sampler))
    assert len(first) + len(rest) == len(order), (len(first), len(rest), len(order))
    for i, s in zip(order, first + rest):
        same(s, Src()[i], f"{where} resumed epoch 2 sample {i}")
    loader.close()
    resumed.close()


def main():
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    spill_dir, snap = sys.argv[1], sys.argv[2]
    # 201 samples of ~180 bytes split over 2 ranks; 4 KiB keeps about a fifth of each share in memory.
    ds = DistDataset(
        Src(), "sp", comm, method=1, ragged={"seq": 0}, memory_limit=8 << 10, spill_dir=spill_dir
    )
    files = [f for f in os.listdir(spill_dir) if f.endswith(".spill")]
    assert files, "the shares spilled"
    rng = np.random.default_rng(comm.rank)
    check_samples(ds, rng.integers(0, N, 30), "ds[i]")
    check_loader(ds, comm.rank, comm.size, "ThreadDataLoader")
    check_ragged_read_ahead(comm, spill_dir)
    # A forked torch DataLoader worker reads spilled samples too.
    loader = DataLoader(ds, batch_size=8, num_workers=2, collate_fn=list, multiprocessing_context="fork")
    seen = [s for batch in loader for s in batch]
    for i in range(0, N, 7):
        same(seen[i], Src()[i], f"forked worker sample {i}")
    # A spawned worker too (it attaches to the store; spilled rows come through their owners).
    loader = DataLoader(ds, batch_size=8, num_workers=1, collate_fn=list, multiprocessing_context="spawn")
    seen = [s for batch in loader for s in batch]
    for i in range(0, N, 5):
        same(seen[i], Src()[i], f"spawned worker sample {i}")
    prof = ds._store.get_profile()
    assert prof["spilled_rows"] > 0 and prof["memory_rows"] > 0, prof

    ds.save(snap)
    ds.free()
    comm.Barrier()
    assert not [f for f in os.listdir(spill_dir) if f.endswith(".spill")], "free() removes the spill files"
    back = DistDataset.restore(snap, comm=comm, method=1, memory_limit=2 << 10, spill_dir=spill_dir)
    assert [f for f in os.listdir(spill_dir) if f.endswith(".spill")], "the restore spilled"
    check_samples(back, range(comm.rank, N, 2), "restored")  # the ranks split the rows to check
    back.free()
    print(f"rank {comm.rank}: spill torch ok", flush=True)


if __name__ == "__main__":
    run(main)
