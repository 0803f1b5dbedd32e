"""Graphs and other ragged samples through pyddstore.torch, checked item by item and batch by
batch against the plain source: torch_geometric Data (graphs with no edges and with no nodes),
dicts with explicit ragged= axes, tuples with ragged='auto'; through DataLoader, the
torch_geometric DataLoader, ThreadDataLoader (with reuse_buffers), forked workers
(DDSTORE_FORK_WORKERS=1), read_rows/alloc, encode/decode, WindowedDataset, and a method-2
DistDatasetReader.

    mpirun -n N python torch_graphs.py --method M [--part graphs]
    mpirun -n N python torch_graphs.py --part methods01      (methods 0 and 1 in one job)
    python torch_graphs.py --part core|reader --comm file --hs DIR   (method 2)
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch
import torch_common as tc
from torch.utils.data import DataLoader, Dataset

A = tc.args()
N = 37
DONE = os.path.join(A.hs, "reader-done") if A.hs else ""


def sizes(i: int) -> tuple[int, int]:
    """(nodes, edges) of graph i: every 7th graph from 3 has no nodes, every 4th from 1 no edges."""
    nodes = 0 if i % 7 == 3 else (i * 5) % 9 + 1
    edges = 0 if (i % 4 == 1 or nodes == 0) else (i * 3) % 11 + 1
    return nodes, edges


try:
    from torch_geometric.data import Data

    class Mol(Data):
        """A Data subclass with batching of its own: `ring` holds node indices that, unlike
        Data's default for an unknown key, are shifted by the nodes before it in a batch."""

        def __inc__(self, key, value, *args, **kwargs):
            if key == "ring":
                return self.num_nodes
            return super().__inc__(key, value, *args, **kwargs)

        def atoms(self) -> int:
            return self.x.size(0)

except ImportError:  # the tests skip without torch_geometric
    Mol = None


class Graphs(Dataset):
    """Graphs as torch_geometric Data, or as `Mol` (a subclass) with a `ring` field."""

    def __init__(self, cls=None):
        self.cls = cls

    def __len__(self):
        return N

    def __getitem__(self, i):
        from torch_geometric.data import Data

        g = torch.Generator().manual_seed(i)
        nodes, edges = sizes(i)
        if self.cls is Mol:
            return Mol(
                x=torch.randn(nodes, 3, generator=g),
                edge_index=torch.randint(0, max(nodes, 1), (2, edges), generator=g),
                ring=torch.arange(nodes) % max(nodes, 1),
                y=torch.tensor([i * 0.5]),
            )
        return Data(
            x=torch.randn(nodes, 3, generator=g),
            edge_index=torch.randint(0, max(nodes, 1), (2, edges), generator=g),
            edge_attr=torch.rand(edges, 2, generator=g, dtype=torch.float64),
            y=torch.tensor([i * 0.5]),
            z=torch.arange(nodes, dtype=torch.int32),
        )


class HeteroGraphs(Dataset):
    """torch_geometric HeteroData: two node types (one of them empty in some graphs), two edge
    types (one of them empty in some graphs) and a graph-level label."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        from torch_geometric.data import HeteroData

        g = torch.Generator().manual_seed(1000 + i)
        atoms, bonds = sizes(i)
        rings = i % 3 + 1
        d = HeteroData()
        d["atom"].x = torch.randn(atoms, 3, generator=g)
        d["atom"].z = torch.arange(atoms, dtype=torch.int32)
        d["ring"].x = torch.rand(rings, 2, generator=g, dtype=torch.float64)
        d["atom", "bond", "atom"].edge_index = torch.randint(0, max(atoms, 1), (2, bonds), generator=g)
        d["atom", "in", "ring"].edge_index = torch.stack(
            [torch.arange(atoms), torch.randint(0, rings, (atoms,), generator=g)]
        )
        d.y = torch.tensor([i * 0.25])
        return d


class Molecules(Dataset):
    """dicts: per-atom positions (ragged along 0), bonds (2, E) (ragged along 1), an energy."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        nodes, edges = sizes(i)
        return {
            "pos": torch.arange(nodes * 3, dtype=torch.float32).reshape(nodes, 3) + i,
            "bonds": np.arange(2 * edges, dtype=np.int64).reshape(2, edges) - i,
            "energy": float(i) / 3,
        }


class Series(Dataset):
    """tuples whose array varies along axis 1 only (found by ragged='auto')."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        return np.full((2, sizes(i)[1]), i, dtype=np.float64), i


def same_graph(a, b, where):
    assert type(a) is type(b), f"{where}: {type(a)} vs {type(b)}"
    assert sorted(a.keys()) == sorted(b.keys()), f"{where}: keys {a.keys()} vs {b.keys()}"
    for k in a.keys():
        tc.same(a[k], b[k], f"{where}.{k}")


def same_batches(want, got, where):
    assert len(want) == len(got), where
    for j, (a, b) in enumerate(zip(want, got)):
        assert sorted(a.keys()) == sorted(b.keys()), f"{where} batch {j}"
        for k in a.keys():
            tc.same(a[k], b[k], f"{where} batch {j}.{k}")


def check_graphs(ds, where, forked_ok, cls=None):
    from pyddstore.torch import ThreadDataLoader
    from torch_geometric.loader import DataLoader as GraphLoader

    src = Graphs(cls)
    for i in range(N):
        same_graph(src[i], ds[i], f"{where} graph {i}")  # the same class: Data, or Mol
    if cls is Mol:
        assert ds[4].atoms() == src[4].x.size(0), where
    idx = [5, 3, 3, 0, N - 1, 1]
    for i, g in zip(idx, ds.__getitems__(idx)):
        same_graph(src[i], g, f"{where} batch item {i}")
    want = list(GraphLoader(src, batch_size=5))
    same_batches(want, list(GraphLoader(ds, batch_size=5)), f"{where} GraphLoader")
    if cls is Mol:  # Mol's own __inc__ shifted `ring` in the batches of both
        assert not torch.equal(want[1].ring, torch.cat([src[i].ring for i in range(5, 10)])), where
    collate = GraphLoader(src, batch_size=5).collate_fn
    loader = ThreadDataLoader(ds, batch_size=5, num_workers=2, collate_fn=collate)
    same_batches(want, list(loader), f"{where} ThreadDataLoader")
    loader.close()
    loader = ThreadDataLoader(ds, batch_size=5, num_workers=2, collate_fn=list)
    for j, batch in enumerate(loader):
        for k, g in enumerate(batch):
            same_graph(src[5 * j + k], g, f"{where} ThreadDataLoader sample {5 * j + k}")
    loader.close()
    loader = ThreadDataLoader(
        ds, batch_size=5, num_workers=2, collate_fn=collate, reuse_buffers=True, collate_copies=True
    )
    same_batches(want, list(loader), f"{where} ThreadDataLoader reuse_buffers")
    loader.close()
    if forked_ok:
        got = list(GraphLoader(ds, batch_size=5, num_workers=2))
        same_batches(want, got, f"{where} forked workers")
        if cls is not None:  # samples made in forked workers, sent back: still the class
            plain = DataLoader(ds, batch_size=4, num_workers=2, collate_fn=list)
            got = [g for b in plain for g in b]
            for i, g in enumerate(got):
                same_graph(src[i], g, f"{where} forked worker sample {i}")
    # read_rows / alloc: one ragged read per field, views into registered buffers.
    bufs = ds.alloc(6)
    rows = ds.read_rows(idx, out=bufs)
    for j, i in enumerate(idx):
        tc.same(src[i].edge_index, rows["edge_index"].row(j), f"{where} read_rows edge_index {i}")
        tc.same(src[i].x, rows["x"].row(j), f"{where} read_rows x {i}")
    assert np.shares_memory(rows["x"].values.numpy(), bufs["x"])
    ds.release(bufs)
    assert ds.dtypes["edge_index"] == "int64" and ds.shapes["edge_index"] == (2, -1), (ds.dtypes, ds.shapes)


def same_hetero(a, b, where):
    """HeteroData (or HeteroDataBatch) a and b: the same class, stores, attributes and values."""
    assert type(a) is type(b), f"{where}: {type(a)} vs {type(b)}"
    da, db = a.to_dict(), b.to_dict()
    assert set(da) == set(db), f"{where}: stores {set(da)} vs {set(db)}"
    for k, va in da.items():
        if isinstance(va, dict):
            assert set(va) == set(db[k]), f"{where}.{k}: {set(va)} vs {set(db[k])}"
            for attr, v in va.items():
                tc.same(v, db[k][attr], f"{where}.{k}.{attr}")
        else:
            tc.same(va, db[k], f"{where}.{k}")


def check_hetero(ds, where, forked_ok):
    """HeteroData samples item by item, batch by batch (the torch_geometric loader, threads,
    forked workers) and one field through read_rows."""
    from pyddstore.torch import ThreadDataLoader
    from torch_geometric.loader import DataLoader as GraphLoader

    src = HeteroGraphs()
    for i in range(N):
        same_hetero(src[i], ds[i], f"{where} hetero graph {i}")
    idx = [5, 3, 3, 0, N - 1, 1]
    for i, g in zip(idx, ds.__getitems__(idx)):
        same_hetero(src[i], g, f"{where} hetero batch item {i}")
    want = list(GraphLoader(src, batch_size=6))
    got = list(GraphLoader(ds, batch_size=6))
    assert len(want) == len(got), where
    for j, (a, b) in enumerate(zip(want, got)):
        same_hetero(a, b, f"{where} hetero GraphLoader batch {j}")
    collate = GraphLoader(src, batch_size=6).collate_fn
    loader = ThreadDataLoader(ds, batch_size=6, num_workers=2, collate_fn=collate)
    for j, (a, b) in enumerate(zip(want, loader)):
        same_hetero(a, b, f"{where} hetero ThreadDataLoader batch {j}")
    loader.close()
    if forked_ok:
        got = list(GraphLoader(ds, batch_size=6, num_workers=2))
        for j, (a, b) in enumerate(zip(want, got)):
            same_hetero(a, b, f"{where} hetero forked workers batch {j}")
    rows = ds.read_rows(idx, fields=["atom__bond__atom.edge_index"])
    for j, i in enumerate(idx):
        tc.same(src[i]["atom", "bond", "atom"].edge_index, rows["atom__bond__atom.edge_index"].row(j), where)
    assert ds.shapes["atom.x"] == (-1, 3) and ds.dtypes["ring.x"] == "float64", (ds.shapes, ds.dtypes)


def check_graph_snapshots(het, comm, method):
    import shutil
    import tempfile

    from pyddstore.torch import DistDataset
    from torch_geometric.data import Data, HeteroData

    from pyddstore import DDStoreTypeError

    d = het._store.allgather(tempfile.mkdtemp(prefix="graph-snap-"))[0]
    try:
        het.save(os.path.join(d, "het"))
        back = DistDataset.restore(os.path.join(d, "het"), "het_back", comm=comm, method=method)
        for i in range(N):
            same_hetero(HeteroGraphs()[i], back[i], f"restored hetero graph {i}")
        back.free()
        mols = DistDataset(Graphs(Mol), "mol_snap", comm=comm, method=method)
        mols.save(os.path.join(d, "mol"))
        mols.free()
        back = DistDataset.restore(os.path.join(d, "mol"), "mol_back", comm=comm, method=method, data_cls=Mol)
        for i in range(N):
            same_graph(Graphs(Mol)[i], back[i], f"restored Mol graph {i}")
        back.free()
        mol = os.path.join(d, "mol")
        tc.raises(DDStoreTypeError, lambda: DistDataset.restore(mol, comm=comm, data_cls=HeteroData), "Data")
        plain = DistDataset.restore(os.path.join(d, "mol"), "mol_plain", comm=comm, method=method)
        assert type(plain[3]) is Data, type(plain[3])
        plain.free()
    finally:
        het._store.barrier()
        shutil.rmtree(d, ignore_errors=True)


def check_dicts(comm, method):
    from pyddstore.torch import DistDataset, SchemaError, WindowedDataset

    src = Molecules()
    tc.raises(SchemaError, lambda: DistDataset(src, "mol0", comm=comm, method=method), "ragged")
    ds = DistDataset(src, "mol", comm=comm, method=method, ragged={"pos": 0, "bonds": 1})
    for i in range(N):
        tc.same(src[i], ds[i], f"dict sample {i}")
    got = [s for b in DataLoader(ds, batch_size=4, collate_fn=list) for s in b]
    tc.same([src[i] for i in range(N)], got, "dict DataLoader")
    w = WindowedDataset(ds, window=3, stride=2, fields=["bonds", "energy"])
    for k in (0, 4, len(w) - 1):
        rows = [2 * k, 2 * k + 1, 2 * k + 2]
        want = {
            "bonds": [src[r]["bonds"] for r in rows],
            "energy": np.array([src[r]["energy"] for r in rows]),
        }
        tc.same(want, w[k], f"window {k}")
    tc.same([w[3], w[0]], w.__getitems__([3, 0]), "window batch")
    ds.free()
    # encode/decode around ragged fields.
    enc = DistDataset(
        src,
        "mol_enc",
        comm=comm,
        method=method,
        encode=lambda s: (s["pos"] * 2, s["energy"]),
        decode=lambda s, i: {"pos": s[0] / 2, "energy": s[1], "i": i},
        ragged={0: 0},
    )
    for i in (0, 3, N - 1):
        tc.same({"pos": src[i]["pos"], "energy": src[i]["energy"], "i": i}, enc[i], f"encode/decode {i}")
    enc.free()
    auto = DistDataset(Series(), "series", comm=comm, method=method, ragged="auto")
    assert auto.schema.by_key[0].ragged == 1
    for i in range(N):
        tc.same(Series()[i], auto[i], f"ragged='auto' sample {i}")
    auto.free()


def main():
    w = tc.World(A)
    from pyddstore.torch import DistDataset

    # --part methods01: methods 0 and 1 in one job (one start-up of torch and torch_geometric).
    methods = [0, 1] if A.part == "methods01" else [A.method]
    for method in methods:
        # Method 1: a Data subclass, which must come back as itself (method 0: Data).
        cls = Mol if method == 1 else None
        ds = DistDataset(Graphs(cls), f"graphs{method}", comm=w.comm, method=method)
        forked = method != 0 and os.environ.get("DDSTORE_FORK_WORKERS") == "1"
        check_graphs(ds, f"method {method}", forked, cls)
        ds.free()
        het = DistDataset(HeteroGraphs(), f"hetero{method}", comm=w.comm, method=method)
        check_hetero(het, f"method {method}", forked)
        if method == 1:  # snapshots of graphs: restored as the caller's class
            check_graph_snapshots(het, w.comm, method)
        het.free()
    if A.part in ("all", "methods01"):
        check_dicts(w.comm, methods[0])
    print(f"rank {w.rank}: torch_graphs ok (method {', '.join(map(str, methods))})", flush=True)


def core():
    w = tc.World(A)
    from pyddstore.torch import DistDataset

    ds = DistDataset(Graphs(Mol), "m2g", comm=w.comm, method=2, handshake_dir=A.hs)
    het = DistDataset(HeteroGraphs(), "m2h", comm=w.comm, method=2, handshake_dir=A.hs)
    deadline = time.monotonic() + 300
    while not os.path.exists(DONE):
        assert time.monotonic() < deadline, "the reader did not finish"
        time.sleep(0.1)
    w.barrier()
    ds.free()
    het.free()
    print(f"core rank {w.rank}: ok", flush=True)


def reader():
    from pyddstore.torch import DistDatasetReader

    from pyddstore import DDStoreTypeError

    tc.raises(DDStoreTypeError, lambda: DistDatasetReader("m2g", handshake_dir=A.hs, data_cls=dict), "Data")
    # The class comes from the caller (data_cls=), never from a name in the meta file.
    ds = DistDatasetReader("m2g", handshake_dir=A.hs, data_cls=Mol)
    assert len(ds) == N
    check_graphs(ds, "method 2 reader", os.environ.get("DDSTORE_FORK_WORKERS") == "1", Mol)
    ds.free()
    plain = DistDatasetReader("m2g", handshake_dir=A.hs)  # without data_cls=: Data
    assert type(plain[4]) is Data and torch.equal(plain[4].ring, Graphs(Mol)[4].ring)
    plain.free()
    from torch_geometric.data import HeteroData

    wrong = lambda: DistDatasetReader("m2h", handshake_dir=A.hs, data_cls=Data)  # noqa: E731
    tc.raises(DDStoreTypeError, wrong, "HeteroData")
    het = DistDatasetReader("m2h", handshake_dir=A.hs)  # HeteroData without data_cls=
    check_hetero(het, "method 2 reader", os.environ.get("DDSTORE_FORK_WORKERS") == "1")
    het.free()
    het = DistDatasetReader("m2h", handshake_dir=A.hs, data_cls=HeteroData)
    same_hetero(HeteroGraphs()[6], het[6], "method 2 reader data_cls=HeteroData")
    het.free()
    print("reader: ok", flush=True)


if __name__ == "__main__":
    tc.run({"core": core, "reader": reader}.get(A.part, main))
