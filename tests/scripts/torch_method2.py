"""Method 2: a core group holds a DistDataset and publishes {name}.meta.json; a separate job
reads it with DistDatasetReader.

Core:   mpirun -n N python torch_method2.py --part core --hs DIR   (waits for the reader)
Reader: python torch_method2.py --part reader --comm file --hs DIR
"""

from __future__ import annotations

import json
import os
import time

import numpy as np
import torch
import torch_common as tc
from torch.utils.data import DataLoader

A = tc.args()
N = 31
DONE = os.path.join(A.hs, "reader-done")


def core():
    w = tc.World(A)
    from pyddstore.torch import DistDataset

    ds = DistDataset(tc.DictSrc(N), "m2", comm=w.comm, method=2, handshake_dir=A.hs)
    recs = DistDataset(tc.RecSrc(N), "m2rec", comm=w.comm, method=2, handshake_dir=A.hs)
    if w.rank == 0:
        with open(os.path.join(A.hs, "m2.meta.json")) as fh:
            meta = json.load(fh)
        assert meta["version"] == 1 and meta["name"] == "m2" and meta["num_samples"] == N
        assert meta["n_core"] == w.size and [f["key"] for f in meta["fields"]] == ["x", "y", "m", "flag", "t"]
    deadline = time.monotonic() + 200
    while not os.path.exists(DONE):
        assert time.monotonic() < deadline, "the reader did not finish"
        time.sleep(0.1)
    w.barrier()
    recs.free()
    ds.free()
    print(f"core rank {w.rank}: ok", flush=True)


def reader():
    from pyddstore.torch import DistDatasetReader, ThreadDataLoader, WindowedDataset

    src = tc.DictSrc(N)
    ds = DistDatasetReader("m2", handshake_dir=A.hs)
    assert len(ds) == N and ds.shapes["m"] == (2, 2)
    for i in range(N):
        tc.same(src[i], ds[i], f"reader item {i}")
    for i, s in zip([30, 0, 0, 7], ds.__getitems__([30, 0, 0, 7])):
        tc.same(src[i], s, f"reader batch item {i}")
    got = ds.read_rows([3, 1], fields=["x"], out=ds.alloc(4, fields=["x"]))
    tc.same(torch.stack([src[3]["x"], src[1]["x"]]), got["x"], "reader read_rows")
    want = list(DataLoader(src, batch_size=6, shuffle=True, generator=torch.Generator().manual_seed(1)))
    loader = ThreadDataLoader(
        ds, batch_size=6, shuffle=True, generator=torch.Generator().manual_seed(1), num_workers=2
    )
    tc.same(want, list(loader), "reader ThreadDataLoader")
    loader.close()
    if os.environ.get("DDSTORE_FORK_WORKERS") == "1":
        got = list(DataLoader(ds, batch_size=6, num_workers=2, persistent_workers=True))
        tc.same(list(DataLoader(src, batch_size=6)), got, "reader forked workers")
    w = WindowedDataset(ds, window=2, stride=3, fields=["y"])
    tc.same({"y": np.array([src[3]["y"], src[4]["y"]])}, w[1], "reader windows")

    dec = DistDatasetReader("m2", handshake_dir=A.hs, decode=lambda d, i: (d["y"], i))
    assert dec[5] == (src[5]["y"], 5)
    recs = DistDatasetReader("m2rec", handshake_dir=A.hs)
    for i in range(N):
        tc.same(tc.RecSrc(N)[i], recs[i], f"reader record {i}")
    with open(DONE, "w") as fh:
        fh.write("ok")
    print("reader: ok", flush=True)


tc.run(core if A.part == "core" else reader)
