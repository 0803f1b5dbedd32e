"""Method-2 extra job with the torch layer: DistDatasetReader over m2_torch_core.py's dataset,
read through a torch DataLoader with forked workers (DDSTORE_FORK_WORKERS=1), ThreadDataLoader
and WindowedDataset; every batch equals the same loader over the plain source.

    DDSTORE_FORK_WORKERS=1 python m2_torch_extra.py --hs DIR --n-core 2
"""

from __future__ import annotations

import argparse
import faulthandler
import os

import torch
from _common import main_guard
from m2_common import Samples
from pyddstore.torch import DistDatasetReader, ThreadDataLoader, WindowedDataset
from torch.utils.data import DataLoader


def same(a, b, where):
    if isinstance(a, torch.Tensor):
        ok = isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
        assert ok, f"{where}: {a} != {b}"
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), f"{where}: {a!r} != {b!r}"
        for k, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{k}]")
    else:
        assert type(a) is type(b) and a == b, f"{where}: {a!r} != {b!r}"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--hs", required=True)
    p.add_argument("--n-core", type=int, default=None)
    a = p.parse_args()
    faulthandler.dump_traceback_later(float(os.environ.get("M2_WATCHDOG_S", "150")), exit=True)
    src = Samples()
    ds = DistDatasetReader("m2t", handshake_dir=a.hs, n_core=a.n_core)
    assert len(ds) == len(src) and ds.ddstore.method == 2
    for i in (0, 17, len(src) - 1):
        same(src[i], ds[i], f"item {i}")

    def batches(dataset, cls=DataLoader, **kw):
        g = torch.Generator().manual_seed(5)
        loader = cls(dataset, batch_size=6, shuffle=True, generator=g, **kw)
        out = [list(loader) for _ in range(2)]  # two epochs
        if hasattr(loader, "close"):
            loader.close()
        return out

    assert os.environ.get("DDSTORE_FORK_WORKERS") == "1"
    # The same loader arguments over the plain source give the same batches (and random draws).
    for cls, kw, what in (
        (DataLoader, dict(num_workers=2, persistent_workers=True), "forked persistent DataLoader workers"),
        (DataLoader, dict(num_workers=2), "forked DataLoader workers, new each epoch"),
        (ThreadDataLoader, dict(num_workers=2), "ThreadDataLoader"),
        (ThreadDataLoader, dict(num_workers=0), "ThreadDataLoader, no workers"),
    ):
        same(batches(src, DataLoader, **kw), batches(ds, cls, **kw), what)

    win = WindowedDataset(ds, window=3, stride=2, dilation=2)
    assert len(win) == (len(src) - 4 + 1) // 2, len(win)
    for i in (0, 5, len(win) - 1):
        rows = [i * 2, i * 2 + 2, i * 2 + 4]
        got = win[i]
        want_x = torch.stack([src[r][0] for r in rows])
        assert torch.equal(got[0], want_x), f"window {i}"
        assert got[1].tolist() == [src[r][1] for r in rows], f"window {i} labels"
    ds.free()
    print("torch extra ok", flush=True)


main_guard(main)
