"""DistDataset end to end on every rank: items equal the plain source for every sample
structure (with and without chunk_size, bulk array sources), DataLoader / ThreadDataLoader
batches equal DataLoader over the source, read_rows / alloc, windows, encode/decode/fields,
ddstore_width, bad samples, reuse_buffers; method 0: forked workers raise.

Usage: mpirun -n N python torch_dataset.py --method M [--part P[,P...]]
       (or plain processes: --comm file|torch --hs DIR)
"""

from __future__ import annotations

import os
import tempfile

import numpy as np
import torch
import torch_common as tc
from pyddstore.torch import (
    DistDataset,
    ForkedWorkerError,
    SchemaError,
    SchemaTypeError,
    ThreadDataLoader,
    WindowedDataset,
    row_of,
    share_of,
)
from torch.utils.data import ConcatDataset, DataLoader, TensorDataset

from pyddstore import DDStoreIndexError, DDStoreValueError

A = tc.args()
W = tc.World(A)  # after pyddstore: it sets libfabric defaults before MPI starts libfabric
KW = {"comm": W.comm, "method": A.method, "handshake_dir": A.hs or None}
COUNTER = [0]


def make(src, **extra):
    COUNTER[0] += 1
    return DistDataset(src, f"ds{COUNTER[0]}", **{**KW, **extra})


def check_items(ds, src, what):
    n = len(src)
    assert len(ds) == n, what

    def want(i):
        s = src[i]
        return np.asarray(s) if isinstance(s, np.memmap) else s  # rows come back as plain arrays

    for i in range(n):
        tc.same(want(i), ds[i], f"{what} item {i}")
    order = [n - 1, 0, n // 2, 0, n - 1, 1]
    for i, s in zip(order, ds.__getitems__(order)):
        tc.same(want(i), s, f"{what} batch item {i}")
    tc.same(want(n - 1), ds[-1], f"{what} item -1")
    tc.raises(IndexError, lambda: ds[n])


def check_structures():
    for cls, n in [(tc.TupleSrc, 37), (tc.DictSrc, 29), (tc.ValueSrc, 23), (tc.RecSrc, 19), (tc.ListSrc, 11)]:
        src = cls(n)
        for cs in (None, 4):
            ds = make(src, chunk_size=cs)
            check_items(ds, src, f"{cls.__name__} chunk_size={cs}")
            st = ds.ddstore
            for f in ds.schema.fields:
                assert st.counts(f.var) == [share_of(n, st.size, r)[1] for r in range(st.size)]
            ds.free()
    os.environ["DDSTORE_LOAD_THREADS"] = "3"  # parallel source reads while loading
    try:
        ds = make(tc.DictSrc(23), chunk_size=5)
        check_items(ds, tc.DictSrc(23), "DDSTORE_LOAD_THREADS=3")
        ds.free()
        tc.raises(SchemaError, lambda: make(Bad(20, 9, "ragged"), chunk_size=6), "sample 9")
    finally:
        del os.environ["DDSTORE_LOAD_THREADS"]
    ds = make(tc.TupleSrc(5))
    assert ds.shapes == ((2, 3), (), (), (3,), (), ()), ds.shapes
    assert ds.dtypes == ("float32", "int64", "float64", "int32", "float32", "bool"), ds.dtypes
    assert ds.source_dtypes == (torch.float32, int, float, np.dtype("int32"), np.dtype("float32"), bool)
    ds.free()
    ds = make(tc.DictSrc(5))
    assert ds.shapes == {"x": (4,), "y": (), "m": (2, 2), "flag": (), "t": ()}
    assert ds.dtypes["x"] == "float64" and ds.dtypes["flag"] == "bool", ds.dtypes
    ds.free()
    ds = make(tc.RecSrc(5))
    assert ds.shapes == ((), (2,)) and ds.dtypes == (tc.REC, tc.REC)
    ds.free()


def check_bulk():
    rng = np.random.default_rng(0)
    arr = rng.random((41, 3))
    ints = np.arange(17, dtype=np.int32) * 3
    t = torch.from_numpy(rng.random((30, 2, 2)).astype(np.float32))
    recs = np.array([tc.record(i) for i in range(13)], dtype=tc.REC)
    with tempfile.TemporaryDirectory() as d:
        mm = np.memmap(os.path.join(d, "mm.bin"), dtype=np.float32, mode="w+", shape=(26, 5))
        mm[:] = rng.random((26, 5))
        mm.flush()
        sources = {
            "ndarray": arr,
            "memmap": np.memmap(os.path.join(d, "mm.bin"), dtype=np.float32, mode="r", shape=(26, 5)),
            "int32 1-d": ints,
            "tensor": t,
            "TensorDataset": TensorDataset(t, torch.arange(30)),
            "structured": recs,
            "recarray": recs.view(np.recarray),
        }
        for what, src in sources.items():
            for cs in (None, 7):
                ds = make(src, chunk_size=cs)
                check_items(ds, src, f"{what} chunk_size={cs}")
                ds.free()
        ds = make(sources["TensorDataset"], fields=[1])
        tc.same((torch.tensor(3),), ds[3], "TensorDataset fields=[1]")
        ds.free()


def check_loaders():
    for cls, n in [(tc.TupleSrc, 26), (tc.DictSrc, 21), (tc.ValueSrc, 19), (tc.ListSrc, 9)]:
        src = cls(n)
        ds = make(src)
        want = tc.distributed_batches(W, DataLoader, src)
        tc.same(want, tc.distributed_batches(W, DataLoader, ds), f"DataLoader {cls.__name__}")
        for workers in (0, 2):
            loader = ThreadDataLoader(ds, batch_size=4, num_workers=workers)
            assert iter(loader)._direct, "direct batch reads not used"
            tc.same(
                want,
                tc.distributed_batches(W, ThreadDataLoader, ds, num_workers=workers),
                f"thread {cls.__name__}",
            )
            tc.same(
                want,
                tc.distributed_batches(W, ThreadDataLoader, ds, num_workers=workers, reuse_buffers=True),
                f"reuse_buffers {cls.__name__}",
            )
        for env in ("DDSTORE_FAST_COLLATE", "DDSTORE_BATCH_GET"):
            # Settings are read once, when a store is made: a dataset made with the variable set.
            os.environ[env] = "0"
            try:
                ds0 = make(src)
            finally:
                del os.environ[env]
            assert not iter(ThreadDataLoader(ds0, batch_size=4))._direct or env == "DDSTORE_BATCH_GET"
            assert iter(ThreadDataLoader(ds, batch_size=4))._direct, "the first dataset keeps its settings"
            tc.same(
                want,
                tc.distributed_batches(W, ThreadDataLoader, ds0, num_workers=1),
                f"{env}=0 {cls.__name__}",
            )
            ds0.free()
        prof = ds.get_profile()
        assert isinstance(prof, dict)
        ds.free()

    src = tc.TupleSrc(22)
    ds = make(src)

    def copying_collate(batch):
        return torch.stack([s[0] for s in batch]).clone(), [s[1] for s in batch]

    want = tc.distributed_batches(W, DataLoader, src, collate_fn=copying_collate)
    got = tc.distributed_batches(
        W,
        ThreadDataLoader,
        ds,
        num_workers=2,
        collate_fn=copying_collate,
        reuse_buffers=True,
        collate_copies=True,
    )
    tc.same(want, got, "collate_copies")
    tc.raises(
        DDStoreValueError,
        lambda: ThreadDataLoader(ds, batch_size=4, collate_fn=copying_collate, reuse_buffers=True),
    )
    tc.raises(ValueError, lambda: ThreadDataLoader(ds, batch_size=None, reuse_buffers=True), "batch_size")
    for workers in (0, 2):  # batches read straight into tensors: the batch pool, no alloc() set
        loader = ThreadDataLoader(ds, batch_size=4, num_workers=workers, reuse_buffers=True)
        for _ in range(3):
            assert len(list(loader)) == 6
        assert not loader._buffer_pool._all, loader._buffer_pool._all
        loader.close()
    for workers in (0, 2):  # the per-sample path: one registered set per worker, reused across epochs
        loader = ThreadDataLoader(
            ds,
            batch_size=4,
            num_workers=workers,
            collate_fn=copying_collate,
            reuse_buffers=True,
            collate_copies=True,
        )
        for _ in range(3):
            assert len(list(loader)) == 6
        assert len(loader._buffer_pool._all) == max(1, workers), loader._buffer_pool._all
        loader.close()
        assert not loader._buffer_pool._all
    loader = ThreadDataLoader(ds, batch_size=3, num_workers=2, reuse_buffers=True, persistent_workers=True)
    first = [b[1].tolist() for b in loader]
    assert first == [[3 * k + j for j in range(3) if 3 * k + j < 22] for k in range(8)], first
    loader.close()
    assert not loader._buffer_pool._all
    ds.free()


def check_read_rows():
    src = tc.TupleSrc(23)
    ds = make(src)
    rows = [22, 0, 5, 5, 11]
    got = ds.read_rows(rows)
    assert sorted(got) == [0, 1, 2, 3, 4, 5]
    tc.same(torch.stack([src[r][0] for r in rows]), got[0], "read_rows tensors")
    tc.same(np.array([src[r][1] for r in rows], dtype=np.int64), got[1], "read_rows ints")
    tc.same(np.stack([src[r][3] for r in rows]), got[3], "read_rows arrays")
    tc.same(np.array([src[r][5] for r in rows]), got[5], "read_rows bools")
    bufs = ds.alloc(8, fields=[0, 3])
    got2 = ds.read_rows(rows, fields=[0, 3], out=bufs)
    assert sorted(got2) == [0, 3]
    tc.same(got[0], got2[0], "read_rows out=")
    assert np.shares_memory(got2[0].numpy(), bufs[0]) and np.shares_memory(got2[3], bufs[3])
    samples = ds.__getitems__([4, 2], out=ds.alloc(2))
    tc.same(src[4], samples[0], "__getitems__ out=")
    ds.release(bufs)
    tc.raises(IndexError, lambda: ds.read_rows([23]))
    tc.raises(KeyError, lambda: ds.read_rows([1], fields=["nope"]))
    ds.free()
    ds = make(tc.RecSrc(9))
    r = ds.read_rows([3, 1])
    tc.same(np.array([tc.record(3), tc.record(1)], dtype=tc.REC), r[0], "read_rows records")
    ds.free()


def window_of(src, rows):
    samples = [src[r] for r in rows]
    return (
        torch.stack([s[0] for s in samples]),
        np.array([s[1] for s in samples], dtype=np.int64),
        np.array([s[2] for s in samples]),
        np.stack([s[3] for s in samples]),
        np.array([s[4] for s in samples], dtype=np.float32),
        np.array([s[5] for s in samples]),
    )


def check_windows():
    src = tc.TupleSrc(37)
    ds = make(src)
    w = WindowedDataset(ds, window=3, stride=2, dilation=2)
    assert len(w) == (37 - 4 - 1) // 2 + 1
    for i in range(len(w)):
        tc.same(window_of(src, [2 * i, 2 * i + 2, 2 * i + 4]), w[i], f"window {i}")
    idx = [len(w) - 1, 0, 3, 3]
    for i, s in zip(idx, w.__getitems__(idx)):
        tc.same(w[i], s, f"window batch {i}")
    w0 = WindowedDataset(ds, window=2, fields=[0])
    tc.same({0: torch.stack([src[5][0], src[6][0]])}, w0[5], "window fields: a dict keyed by field")
    tc.same(
        list(DataLoader(w, batch_size=3)), list(ThreadDataLoader(w, batch_size=3, num_workers=2)), "windows"
    )
    # A window past the end is an IndexError (as upstream) naming the window, its rows and the count.
    fits_not = ("starts[0] = 35", "window of 3 rows", "rows 35..37", "37 stored rows")
    tc.raises(DDStoreIndexError, lambda: WindowedDataset(ds, window=3, starts=[35]), *fits_not)
    ds.free()

    files = ConcatDataset([tc.TupleSrc(10), tc.TupleSrc(13, offset=100), tc.TupleSrc(4, offset=200)])
    frames = make(files)
    dt = 2
    starts = [row_of(files, k, t) for k in range(3) for t in range(len(files.datasets[k]) - 2 * dt)]
    assert row_of(files, 1, 0) == 10 and row_of(files, 2, 3) == 26
    tc.raises(IndexError, lambda: row_of(files, 2, -1), "index -1")
    pairs = WindowedDataset(frames, window=3, dilation=dt, starts=starts)
    assert len(pairs) == 6 + 9 + 0
    for i in range(len(pairs)):
        s = starts[i]
        got = pairs[i]
        tc.same(window_of(files, [s, s + dt, s + 2 * dt]), got, f"concat window {i}")
        assert got[1][2] - got[1][0] == 2 * dt  # never crosses a file boundary
    frames.free()


LABELS = ["cat", "dog", "owl"]
GROUP_INFO = [{"site": "a"}, {"site": "b"}]


class Pets(torch.utils.data.Dataset):
    def __len__(self):
        return 14

    def __getitem__(self, i):
        return {"x": torch.full((3,), float(i)), "label": LABELS[i % 3], "group": i % 2}


def check_encode_decode_fields():
    src = Pets()
    ds = make(
        src,
        encode=lambda s: {"x": s["x"], "label": LABELS.index(s["label"]), "group": s["group"]},
        decode=lambda d, i: {**d, "label": LABELS[d["label"]], "meta": GROUP_INFO[d["group"]], "i": i},
    )
    for i in range(len(src)):
        want = {**src[i], "meta": GROUP_INFO[i % 2], "i": i}
        tc.same(want, ds[i], f"decoded {i}")
        tc.same(want, ds.__getitems__([i])[0], f"decoded batch {i}")
    assert ds.read_rows([4])["label"].tolist() == [LABELS.index(src[4]["label"])]
    loader = ThreadDataLoader(ds, batch_size=5, num_workers=1)
    assert not iter(loader)._direct
    batches = list(loader)
    assert batches[0]["label"] == [LABELS[i % 3] for i in range(5)]
    ds.free()
    tc.raises(SchemaTypeError, lambda: make(src), "encode")
    tc.raises(ValueError, lambda: make(src, fields=["x"], encode=lambda s: s), "encode")
    d = tc.DictSrc(12)
    ds = make(d, fields=["y", "x"])
    tc.same({"y": d[5]["y"], "x": d[5]["x"]}, ds[5], "fields")
    tc.same(
        list(DataLoader([{"y": d[i]["y"], "x": d[i]["x"]} for i in range(12)], batch_size=5)),
        list(ThreadDataLoader(ds, batch_size=5)),
        "fields batches",
    )
    ds.free()
    t = tc.TupleSrc(6)
    ds = make(t, fields=[3, 0])
    tc.same((t[2][3], t[2][0]), ds[2], "tuple fields")
    ds.free()
    tc.raises(ValueError, lambda: make(d, fields=["nope"]), "nope")


class Bad(torch.utils.data.Dataset):
    def __init__(self, n, bad, how):
        self.n, self.bad, self.how = n, bad, how

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        x = torch.zeros(3)
        if i == self.bad:
            if self.how == "ragged":
                x = torch.zeros(4)
            elif self.how == "dtype":
                x = torch.zeros(3, dtype=torch.float64)
            elif self.how == "float16":
                x = torch.zeros(3, dtype=torch.float16)
            elif self.how == "missing":
                return {"y": 1}
            elif self.how == "string":
                return {"x": x, "y": "str"}
        return {"x": x, "y": i}


def check_bad_samples():
    last = 20 - 1  # owned by the last rank
    tc.raises(SchemaError, lambda: make(Bad(20, last, "ragged")), f"sample {last}", "'x'", "(4,)")
    tc.raises(SchemaError, lambda: make(Bad(20, 7, "dtype")), "sample 7", "float64")
    tc.raises(SchemaError, lambda: make(Bad(20, last, "missing")), f"sample {last}")
    tc.raises(SchemaError, lambda: make(Bad(20, 9, "ragged"), chunk_size=3), "sample 9")
    tc.raises(SchemaTypeError, lambda: make(Bad(20, 0, "float16")), "sample 0", "'x'", "float16")
    tc.raises(SchemaTypeError, lambda: make(Bad(20, 0, "string")), "encode")
    tc.raises(SchemaError, lambda: make(Bad(20, 5, "string")), "sample 5")
    tc.raises(SchemaError, lambda: make([]), "empty")
    ds = make(Bad(20, -1, "none"))  # still works after the failures
    tc.same({"x": torch.zeros(3), "y": 19}, ds[19], "after failures")
    ds.free()


def check_width():
    if W.size < 2 or A.method == 2:
        return
    width = 2 if W.size % 2 == 0 and W.size > 2 else 1
    src = tc.TupleSrc(13)
    ds = make(src, ddstore_width=width)
    assert ds.ddstore.size == width and ds.ddstore.rank == W.rank % width, (ds.ddstore.size, ds.ddstore.rank)
    check_items(ds, src, f"ddstore_width={width}")
    var = ds.schema.fields[0].var
    assert ds.ddstore.counts(var) == [share_of(13, width, r)[1] for r in range(width)]
    ds.free()


def check_fork_method0():
    if A.method != 0:
        return
    ds = make(tc.TupleSrc(8))
    loader = DataLoader(ds, batch_size=2, num_workers=1)
    e = tc.raises(ForkedWorkerError, lambda: list(loader), "ThreadDataLoader")
    assert "worker process 0" in str(e)
    ds.free()


def check_comm_none():
    """comm=None, several datasets one after another (each opens its own communicator)."""
    import time

    src = tc.TupleSrc(21)
    for k in range(4):
        if W.rank == 1:
            time.sleep(0.2)  # ranks arrive at different times, as in real jobs
        ds = DistDataset(src, f"none{k}", comm=None, method=A.method, handshake_dir=A.hs or None)
        check_items(ds, src, f"comm=None dataset {k}")
        ds.free()


PARTS = {
    "structures": check_structures,
    "bulk": check_bulk,
    "loaders": check_loaders,
    "read_rows": check_read_rows,
    "windows": check_windows,
    "encode": check_encode_decode_fields,
    "bad": check_bad_samples,
    "width": check_width,
    "fork0": check_fork_method0,
    "comm_none": check_comm_none,
}


def main():
    # --part: one part, "all" (every part but comm_none), or several joined by commas, so that
    # one job (one torch import per rank) runs several scenarios in sequence.
    wanted = set(A.part.split(","))
    for name, fn in PARTS.items():
        if name in wanted or ("all" in wanted and name != "comm_none"):
            fn()
            W.barrier()
    print(f"rank {W.rank}: ok", flush=True)


tc.run(main)
