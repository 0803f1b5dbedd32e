"""DistDataset(..., add_device=) on every rank: each rank's share lives in device memory
registered with the fabric; other ranks read it with one-sided reads, this rank gathers its own
rows on the device. Every sample equals the source (single items, batches with repeats,
read_rows, windows, forked DataLoader workers, ThreadDataLoader); shares are never node-shared.

--add-device cpu runs the device code path on a CPU: with DDSTORE_TEST_HOST_AS_DEVICE=1 a CPU
tensor is the share, registered through fi_mr_regattr as FI_HMEM_SYSTEM memory.
--add-device cuda uses the GPU (cuda:<local rank % GPUs>).

Usage: DDSTORE_TEST_HOST_AS_DEVICE=1 DDSTORE_FORK_WORKERS=1 mpirun -n N python torch_device.py
         --method 1 --add-device cpu [--part all|items|method0]
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch
import torch_common as tc
from pyddstore.torch import DistDataset, ThreadDataLoader, WindowedDataset
from torch.utils.data import DataLoader, TensorDataset

from pyddstore import DDStoreUnsupportedError, DDStoreValueError

sys.argv, _rest = sys.argv[:1], sys.argv[1:]
_dev_arg = "cpu"
if "--add-device" in _rest:
    k = _rest.index("--add-device")
    _dev_arg = _rest[k + 1]
    del _rest[k : k + 2]
A = tc.args(_rest)
W = tc.World(A)  # after pyddstore: it sets libfabric defaults before MPI starts libfabric
COUNTER = [0]


def share_device() -> str:
    if _dev_arg != "cuda":
        return _dev_arg
    local = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", os.environ.get("SLURM_LOCALID", "0")))
    index = local % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return f"cuda:{index}"


DEV = share_device()
KW = {"comm": W.comm, "method": A.method, "handshake_dir": A.hs or None, "add_device": DEV}


def make(src, **extra):
    COUNTER[0] += 1
    return DistDataset(src, f"dev{COUNTER[0]}", **{**KW, **extra})


def check_device_shares(ds) -> None:
    """Every field's share is a registered device tensor of this rank's rows."""
    shares = ds._device_shares
    assert len(shares) == len(ds.fields), shares
    want = torch.device(DEV)
    for share in shares.values():
        t = share.tensor
        assert t.device.type == want.type and t.dtype == torch.uint8 and t.shape[0] == share.count, t


def check_items(ds, src, what: str) -> None:
    n = len(src)
    assert len(ds) == n, what
    for i in range(n):
        tc.same(src[i], ds[i], f"{what} item {i}")
    rng = np.random.default_rng(11 + W.rank)
    idx = list(rng.permutation(n)) + [0, n - 1, 0, n // 2, n // 2]
    idx = [int(i) for i in idx]
    got = ds.__getitems__(idx)
    for j, i in enumerate(idx):
        tc.same(src[i], got[j], f"{what} batch position {j} (sample {i})")
    tc.same(src[n - 1], ds[-1], f"{what} item -1")


def check_profile(ds) -> None:
    """Own rows count as local, the rest as remote: device shares are never node-shared."""
    p = ds.get_profile()
    assert p["node_rows"] == 0, p
    if W.size > 1:
        assert p["remote_rows"] > 0, p
    assert p["local_rows"] > 0 or all(s.count == 0 for s in ds._device_shares.values()), p


def check_items_part() -> None:
    # Sample-by-sample loading (tuple, dict, records), a bulk tensor source, and a dataset
    # smaller than the group (ranks with empty shares).
    sources = [tc.TupleSrc(23), tc.DictSrc(17), tc.RecSrc(9)]
    for src in sources:
        ds = make(src)
        check_device_shares(ds)
        check_items(ds, src, type(src).__name__)
        check_profile(ds)
        ds.free()
    x = torch.arange(31 * 6, dtype=torch.float32).reshape(31, 2, 3)
    y = torch.arange(31, dtype=torch.int64) * 3
    bulk = TensorDataset(x, y)
    ds = make(bulk)
    check_device_shares(ds)
    check_items(ds, bulk, "bulk TensorDataset")
    rows = [30, 0, 5, 5, 17]
    got = ds.read_rows(rows)
    tc.same(x[rows], got[0], "read_rows x")
    tc.same(y[rows], got[1], "read_rows y")
    bufs = ds.alloc(len(rows))
    got = ds.read_rows(rows, out=bufs)
    tc.same(x[rows], got[0], "read_rows into registered buffers")
    ds.release(bufs)
    win = WindowedDataset(ds, window=3, stride=2, dilation=2)
    for i in range(len(win)):
        s = 2 * i
        tc.same((x[s : s + 5 : 2], y[s : s + 5 : 2]), win[i], f"window {i}")
    got = win.__getitems__([len(win) - 1, 0, 0])
    tc.same((x[[s := 2 * (len(win) - 1), s + 2, s + 4]], y[[s, s + 2, s + 4]]), got[0], "window batch")
    ds.free()

    small = tc.ValueSrc(max(1, W.size - 1))
    ds = make(small)
    check_items(ds, small, "fewer samples than ranks")
    ds.free()

    tc.raises(DDStoreValueError, lambda: make(tc.ValueSrc(8), chunk_size=4), "chunk_size", "add_device")


def check_loaders_part() -> None:
    src = tc.TupleSrc(37)
    ds = make(src)
    want = tc.distributed_batches(W, DataLoader, src)
    tc.same(want, tc.distributed_batches(W, DataLoader, ds), "DataLoader in the main process")
    for workers in (0, 2):
        tc.same(
            want, tc.distributed_batches(W, ThreadDataLoader, ds, num_workers=workers), f"thread x{workers}"
        )
    if os.environ.get("DDSTORE_FORK_WORKERS") == "1":
        tc.same(want, tc.distributed_batches(W, DataLoader, ds, num_workers=2), "forked workers")
        tc.same(
            want,
            tc.distributed_batches(W, DataLoader, ds, num_workers=2, persistent_workers=True),
            "persistent forked workers",
        )
    # Batches on the share's device (direct reads with the default collate): own rows are
    # copied device to device, the rest moved there from host memory.
    dev = torch.device(DEV)
    ds_dev = make(src, device=dev)
    assert iter(ThreadDataLoader(ds_dev, batch_size=4))._direct, "direct batch reads not used"
    for workers in (0, 2):
        got = tc.distributed_batches(W, ThreadDataLoader, ds_dev, epochs=1, num_workers=workers)
        assert all(b[0].device == dev for b in got[0])
        got = [[[t.cpu() if isinstance(t, torch.Tensor) else t for t in b] for b in got[0]]]
        tc.same(want[:1], got, f"ThreadDataLoader x{workers} batches on {dev}")
    ds_dev.free()
    ds.free()


def main():
    if A.part == "method0":
        e = tc.raises(DDStoreUnsupportedError, lambda: make(tc.ValueSrc(8)), "method=1")
        print(f"rank {W.rank}: method 0 refused: {e}", flush=True)
        return
    if A.part in ("all", "items"):
        check_items_part()
    if A.part in ("all", "loaders"):
        check_loaders_part()
    W.barrier()
    print(f"rank {W.rank}: ok", flush=True)


tc.run(main)
