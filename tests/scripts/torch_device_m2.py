"""Method 2 with device shares: a core group holds a DistDataset with add_device= (shares
registered with the fabric) and a separate job reads every sample with DistDatasetReader,
through the fabric only (device shares are never node-shared).

Core:   DDSTORE_TEST_HOST_AS_DEVICE=1 python torch_device_m2.py --part core --comm file --hs DIR
Reader: python torch_device_m2.py --part reader --comm file --hs DIR
"""

from __future__ import annotations

import os
import time

import torch_common as tc
from torch.utils.data import DataLoader

A = tc.args()
N = 29
DONE = os.path.join(A.hs, "reader-done")


def core():
    w = tc.World(A)
    from pyddstore.torch import DistDataset

    ds = DistDataset(tc.DictSrc(N), "m2dev", comm=w.comm, method=2, handshake_dir=A.hs, add_device="cpu")
    assert ds._device_shares, "shares are not device shares"
    deadline = time.monotonic() + 200
    while not os.path.exists(DONE):
        assert time.monotonic() < deadline, "the reader did not finish"
        time.sleep(0.1)
    w.barrier()
    ds.free()
    print(f"core rank {w.rank}: ok", flush=True)


def reader():
    from pyddstore.torch import DistDatasetReader

    src = tc.DictSrc(N)
    ds = DistDatasetReader("m2dev", handshake_dir=A.hs)
    for i in range(N):
        tc.same(src[i], ds[i], f"reader item {i}")
    idx = [28, 0, 0, 13, 14, 15]
    for i, s in zip(idx, ds.__getitems__(idx)):
        tc.same(src[i], s, f"reader batch item {i}")
    p = ds.get_profile()
    assert p["node_rows"] == 0 and p["remote_rows"] > 0, p
    if os.environ.get("DDSTORE_FORK_WORKERS") == "1":
        got = list(DataLoader(ds, batch_size=5, num_workers=2))
        tc.same(list(DataLoader(src, batch_size=5)), got, "reader forked workers")
    with open(DONE, "w") as fh:
        fh.write("ok")
    print("reader: ok", flush=True)


tc.run(core if A.part == "core" else reader)
