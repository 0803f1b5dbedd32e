"""Loading writes straight into the store: the Python-side peak while loading (numpy and torch
buffers, traced by tracemalloc) stays near one chunk, far below the share, for the
sample-by-sample path (default chunks and chunk_size=) and the bulk array path.

Usage: python torch_memory.py   (one process; the store's own memory is not traced)
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import torch_common as tc
from pyddstore.torch import DistDataset
from torch.utils.data import Dataset

ROW = 64 * 1024  # bytes per sample
N = 512  # 32 MiB share
# The interpreter's own small objects made while loading (a few KB; a run measured the chunked
# load at 2.6 KB over chunk + share/8): slack, not a buffer of the data.
SLACK = 64 * 1024


class Rows(Dataset):
    def __len__(self):
        return N

    def __getitem__(self, i):
        return np.full(ROW // 8, float(i))


def peak_while(make):
    tracemalloc.start()
    tracemalloc.reset_peak()
    ds = make()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return ds, peak


def main():
    share = N * ROW
    ds, peak = peak_while(lambda: DistDataset(Rows(), "mem_default", method=1))
    assert peak < 0.55 * share, f"default chunks: peak {peak} for a share of {share}"
    print("default chunks: peak", peak, "share", share)
    tc.same(Rows()[N - 1], ds[N - 1], "default chunks")
    ds.free()

    ds, peak = peak_while(lambda: DistDataset(Rows(), "mem_chunk", method=1, chunk_size=16))
    assert peak < 16 * ROW + share // 8 + SLACK, f"chunk_size=16: peak {peak}"
    tc.same(Rows()[3], ds[3], "chunk_size=16")
    ds.free()

    arr = np.random.default_rng(0).random((N, ROW // 8))
    ds, peak = peak_while(lambda: DistDataset(arr, "mem_bulk", method=1))
    assert peak < share // 8 + SLACK, f"bulk: peak {peak}"
    tc.same(arr[100], ds[100], "bulk")
    ds.free()
    print("ok", flush=True)


tc.run(main)
