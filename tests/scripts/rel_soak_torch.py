"""Soak through the PyTorch API: a DistDataset read by a shuffling
ThreadDataLoader (2 worker threads), epoch after epoch, until every rank has
read <rows> samples; every sample is checked against the source (a pure
function of its index) and resident memory must stay flat after warm-up.

    mpirun -n 4 python rel_soak_torch.py <method> <rows per rank>

Prints ``soak-torch {json}`` per rank (rows, rows/s, mismatches, RSS).
"""

import json
import sys
import time

import torch
from _common import main_guard, rows_of, rss_kib
from mpi4py import MPI
from pyddstore.torch import DistDataset, ThreadDataLoader

SAMPLES_PER_RANK, SHAPE, BATCH, SEED = 4096, (32,), 256, 11
RSS_GROWTH_LIMIT = 0.05


class Source(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.from_numpy(rows_of(SEED, [i], SHAPE, "float32")[0]), i


def main():
    method, target = int(sys.argv[1]), int(sys.argv[2])
    comm = MPI.COMM_WORLD
    n = SAMPLES_PER_RANK * comm.size
    ds = DistDataset(Source(n), "soak", comm, method=method)
    # Each rank reads the whole dataset every epoch (its own shuffle), not only its part.
    sampler = torch.utils.data.RandomSampler(ds, generator=torch.Generator().manual_seed(comm.rank))
    loader = ThreadDataLoader(ds, batch_size=BATCH, sampler=sampler, num_workers=2, drop_last=True)
    rows = mismatches = epochs = 0
    warm = None
    start = time.monotonic()
    while rows < target:
        for x, index in loader:
            want = rows_of(SEED, index.numpy(), SHAPE, "float32")
            mismatches += int((x.numpy() != want).any(axis=1).sum())
            rows += len(index)
            if warm is None and rows >= target // 10:
                warm = rss_kib()
            if rows >= target:
                break
        epochs += 1
    took = time.monotonic() - start
    end = rss_kib()
    comm.Barrier()
    ds.free()
    report = {
        "rank": comm.rank,
        "method": method,
        "rows": rows,
        "epochs": epochs,
        "rows_per_s": round(rows / took),
        "mismatches": mismatches,
        "rss_warm_kib": warm,
        "rss_end_kib": end,
        "rss_growth": round((end - warm) / warm, 4),
    }
    print("soak-torch " + json.dumps(report), flush=True)
    assert mismatches == 0, report
    assert report["rss_growth"] < RSS_GROWTH_LIMIT, (
        f"resident memory grew {report['rss_growth']:.1%}: {report}"
    )


if __name__ == "__main__":
    main_guard(main)
