"""Shared pieces of the pyddstore.torch test scripts: deterministic sources (every rank builds
the same data), strict comparison, and communicator set-up for mpirun / plain processes."""

from __future__ import annotations

import argparse
import os
import sys
import traceback

import numpy as np
import torch
from torch.utils.data import Dataset

REC = np.dtype([("a", "<i4"), ("b", "<f8", (2,)), ("c", "u1")])


class TupleSrc(Dataset):
    """(tensor, int, float, int32 array, np.float32 scalar, bool) per sample."""

    def __init__(self, n: int, offset: int = 0):
        self.n, self.offset = n, offset

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        if not 0 <= i < self.n:
            raise IndexError(i)
        j = i + self.offset
        x = torch.arange(6, dtype=torch.float32).reshape(2, 3) * (j + 1)
        return x, j, j / 4, np.arange(3, dtype=np.int32) - j, np.float32(j * 1.5), j % 3 == 0


class DictSrc(Dataset):
    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        return {
            "x": torch.full((4,), float(i), dtype=torch.float64),
            "y": i * 7,
            "m": np.full((2, 2), i % 256, dtype=np.uint8),
            "flag": np.bool_(i % 2),
            "t": torch.tensor(i, dtype=torch.int32),
        }


class ValueSrc(Dataset):
    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        return torch.arange(5, dtype=torch.int64) * i


def record(i: int) -> np.void:
    r = np.zeros((), dtype=REC)
    r["a"], r["b"], r["c"] = i, (i / 2, -i), i % 200
    return r[()]


class RecSrc(Dataset):
    """(np.void record, structured array of 2 records) per sample."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        pair = np.zeros(2, dtype=REC)
        pair[0], pair[1] = record(i), record(-i)
        return record(i), pair


class ListSrc(Dataset):
    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        return [np.float64(i), torch.ones(2, dtype=torch.bool) if i % 2 else torch.zeros(2, dtype=torch.bool)]


def same(a, b, where: str = "") -> None:
    """Strict equality: same types, dtypes, shapes and values, recursively."""

    def check(ok: bool) -> None:
        # The message only on failure: repr() of a tensor costs more than the comparison.
        assert ok, f"{where}: {a!r} != {b!r}"

    if isinstance(a, torch.Tensor):
        check(isinstance(b, torch.Tensor))
        check(a.dtype == b.dtype and a.shape == b.shape and a.device == b.device)
        check(torch.equal(a, b))
    elif isinstance(a, np.ndarray):
        check(type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape)
        check(a.tobytes() == b.tobytes())
    elif isinstance(a, np.void):
        check(type(a) is type(b) and a.dtype == b.dtype and a.tobytes() == b.tobytes())
    elif isinstance(a, (tuple, list)):
        check(type(a) is type(b) and len(a) == len(b))
        for k, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{k}]")
    elif isinstance(a, dict):
        check(type(a) is type(b) and list(a) == list(b))
        for k in a:
            same(a[k], b[k], f"{where}[{k!r}]")
    else:
        check(type(a) is type(b) and a == b)


def raises(exc, fn, *must_contain):
    """fn() raises exc with every fragment in its message; returns the exception."""
    try:
        fn()
    except exc as e:
        for s in must_contain:
            assert s in str(e), f"{s!r} not in {e}"
        return e
    raise AssertionError(f"{fn} did not raise {exc.__name__}")


def distributed_batches(world, loader_cls, ds, epochs=2, **kw):
    """Every batch `loader_cls` yields for this rank's DistributedSampler part, per epoch."""
    from pyddstore.torch import ThreadDataLoader
    from torch.utils.data.distributed import DistributedSampler

    sampler = DistributedSampler(ds, num_replicas=world.size, rank=world.rank, shuffle=True, seed=7)
    loader = loader_cls(ds, batch_size=4, sampler=sampler, **kw)
    out = []
    for e in range(epochs):
        sampler.set_epoch(e)
        out.append(list(loader))
    if isinstance(loader, ThreadDataLoader):
        loader.close()
    return out


def args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--method", type=int, default=0)
    p.add_argument("--comm", choices=["mpi", "file", "torch"], default="mpi")
    p.add_argument("--hs", default="")
    p.add_argument("--part", default="all")
    return p.parse_args(argv)


class World:
    """The job's communicator (what DistDataset gets as comm=) and this process's rank/size."""

    def __init__(self, a: argparse.Namespace):
        self.kind = a.comm
        if a.comm == "mpi":
            from mpi4py import MPI

            self.comm = MPI.COMM_WORLD
            self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        else:
            self.rank = int(os.environ["SLURM_PROCID"])
            self.size = int(os.environ["SLURM_NTASKS"])
            if a.comm == "torch":
                import torch.distributed as dist

                dist.init_process_group(
                    "gloo",
                    init_method=f"file://{os.path.join(a.hs, 'torch-init')}",
                    rank=self.rank,
                    world_size=self.size,
                )
                self.comm = dist.group.WORLD
            else:
                from pyddstore import FileComm

                self.comm = FileComm(a.hs)  # rank and size from SLURM_PROCID / SLURM_NTASKS

    def barrier(self) -> None:
        if self.kind == "mpi":
            self.comm.Barrier()
        elif self.kind == "torch":
            import torch.distributed as dist

            dist.barrier()


def run(main) -> None:
    """Runs main(); any failure prints the traceback and exits non-zero without MPI shutdown
    waiting on the other ranks."""
    try:
        main()
    except BaseException:  # noqa: BLE001 - any failure must fail this rank
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
