"""Pure logic of pyddstore.torch, in this process (no store, no MPI): share split, schema
inference and validation, the meta JSON, window index math, row_of, affinity sets, and that
direct batch reads arrange batches exactly as default_collate does."""

from __future__ import annotations

import collections
import json

import numpy as np
import pytest
import torch
from pyddstore.torch import SchemaError, SchemaTypeError, row_of, share_of
from pyddstore.torch._loader import _affinity_sets
from pyddstore.torch._schema import ChunkFiller, Schema
from pyddstore.torch._windowed import window_rows, window_starts
from torch.utils.data import ConcatDataset
from torch.utils.data._utils.collate import default_collate

from pyddstore import DDStoreIndexError


@pytest.mark.parametrize(("n", "size"), [(10, 3), (3, 4), (0, 2), (17, 1), (100, 7)])
def test_share_split(n, size):
    parts = [share_of(n, size, r) for r in range(size)]
    counts = [c for _, c in parts]
    assert sum(counts) == n
    assert counts == sorted(counts, reverse=True) and max(counts) - min(counts) <= 1
    assert counts[: n % size] == [n // size + 1] * (n % size)
    starts = [s for s, _ in parts]
    assert starts == [sum(counts[:r]) for r in range(size)]
    with pytest.raises(ValueError):
        share_of(n, size, size)


Point = collections.namedtuple("Point", ["x", "y"])
REC = np.dtype({"names": ["a", "b"], "formats": ["<i2", ("<f8", (2,))], "offsets": [0, 8], "itemsize": 32})


def _sample(i):
    return (
        torch.full((2, 3), float(i)),
        i,
        i / 3,
        np.arange(4, dtype=np.uint8) + i,
        np.int32(i),
        bool(i % 2),
        np.array(i, dtype=np.float64),
    )


def test_infer_fields_and_json_roundtrip():
    s = Schema.infer(_sample(0), "v")
    kinds = [(f.key, f.kind, f.shape, str(f.dtype)) for f in s.fields]
    assert kinds == [
        (0, "tensor", (2, 3), "float32"),
        (1, "int", (), "int64"),
        (2, "float", (), "float64"),
        (3, "ndarray", (4,), "uint8"),
        (4, "npscalar", (), "int32"),
        (5, "bool", (), "bool"),
        (6, "ndarray", (), "float64"),
    ]
    assert [f.var for f in s.fields] == [f"v/{k}" for k in range(7)]
    rec = np.zeros(3, dtype=REC)
    d = Schema.infer({"r": rec[0], "arr": rec, "ra": rec.view(np.recarray)}, "recs")
    back = Schema.from_json(json.loads(json.dumps(d.to_json())))
    for a, b in zip(d.fields, back.fields):
        assert (a.key, a.kind, a.shape, a.dtype, a.record) == (b.key, b.kind, b.shape, b.dtype, b.record)
        assert a.init_args() == (32 * a.count, 1, None)
    assert back.structure == "dict" and back.keys == ["r", "arr", "ra"]


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (torch.zeros(2, dtype=torch.float16), "float16"),
        (np.zeros(2, dtype=np.complex64), "complex64"),
        (np.zeros(2, dtype=np.int16), "int16"),
        ("cat", "encode"),
        (b"cat", "encode"),
        (np.array(["a", "b"]), "encode"),
        (np.str_("a"), "encode"),
        ([1, 2], "nested"),
        (None, "NoneType"),
        (np.zeros(2, dtype=object), "encode"),
    ],
)
def test_unsupported_values(value, match):
    with pytest.raises(SchemaTypeError, match=match) as info:
        Schema.infer({"ok": 1, "bad": value}, "v")
    assert "'bad'" in str(info.value) and "sample 0" in str(info.value)
    assert isinstance(info.value, TypeError)


def test_empty_fields_and_selection():
    with pytest.raises(SchemaError, match="no elements"):
        Schema.infer(np.zeros((0, 3)), "v")
    with pytest.raises(SchemaError, match="no field 'z'"):
        Schema.infer({"x": 1}, "v", fields=["z"])
    s = Schema.infer({"x": 1, "y": 2.0, "z": True}, "v", fields=["z", "x"])
    assert [f.key for f in s.fields] == ["x", "z"] and s.keys == ["z", "x"]
    assert s.build({"x": [1], "z": [False]}, 1) == [{"z": False, "x": 1}]


def _fill(samples, rows=None):
    s = Schema.infer(samples[0], "v")
    filler = ChunkFiller(s, rows or len(samples))
    for j, smp in enumerate(samples):
        filler.put(j, smp, 100 + j)
    return s, filler


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ({"x": torch.zeros(4), "y": 1}, r"sample 101, field 'x'.*\(4,\)"),
        ({"x": torch.zeros(3, dtype=torch.float64), "y": 1}, "sample 101.*float64"),
        ({"x": torch.zeros(3), "y": 1.5}, "sample 101, field 'y'"),
        ({"x": torch.zeros(3)}, "sample 101 has 1 fields"),
        ({"x": torch.zeros(3), "z": 1}, "sample 101 has no field 'y'"),
        ({"x": torch.zeros(3), "y": 1, "w": 2}, "sample 101 has 3 fields"),
        ((torch.zeros(3), 1), "sample 101 is a tuple"),
        ({"x": torch.zeros(3), "y": 2**70}, "sample 101, field 'y'"),
    ],
)
def test_ragged_and_differing_samples(bad, match):
    with pytest.raises(SchemaError, match=match):
        _fill([{"x": torch.zeros(3), "y": 1}, bad])


def test_fill_and_rebuild():
    samples = [_sample(i) for i in range(5)]
    s, filler = _fill(samples, rows=8)
    views = filler.store_views(5)
    columns = {f.key: f.column(f.values(v.copy())) for f, v in zip(s.fields, views)}
    rebuilt = s.build(columns, 5)
    for a, b in zip(samples, rebuilt):
        assert type(b) is tuple
        for x, y in zip(a, b):
            assert type(x) is type(y)
            if isinstance(x, torch.Tensor):
                assert torch.equal(x, y)
            else:
                assert np.array_equal(x, y) and np.asarray(x).dtype == np.asarray(y).dtype


@pytest.mark.parametrize(
    "make",
    [
        lambda i: _sample(i)[:6] + (np.float32(i),),
        lambda i: {"a": torch.tensor([i, i]), "b": i, "c": np.array([i * 0.5])},
        lambda i: [np.int64(i), torch.zeros(2) + i],
        lambda i: Point(torch.tensor(float(i)), i),
        lambda i: torch.arange(3) * i,
        lambda i: float(i),
    ],
)
def test_direct_batches_arranged_like_default_collate(make):
    samples = [make(i) for i in range(4)]
    s = Schema.infer(samples[0], "v")
    filler = ChunkFiller(s, 4)
    for j, smp in enumerate(samples):
        filler.put(j, smp, j)
    values = {}
    for f, v in zip(s.fields, filler.store_views(4)):
        values[f.key] = torch.from_numpy(v.copy())
    want, got = default_collate(samples), s.collate_like(values)
    flat_w = want if isinstance(want, (list, tuple)) else [want]
    flat_g = got if isinstance(got, (list, tuple)) else [got]
    if isinstance(want, dict):
        flat_w, flat_g = list(want.values()), list(got.values())
        assert list(want) == list(got)
    assert type(want) is type(got)
    for a, b in zip(flat_w, flat_g):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def test_window_math():
    assert window_starts(10, 3).tolist() == list(range(8))
    assert window_starts(10, 3, stride=2, dilation=2).tolist() == [0, 2, 4]
    assert window_starts(4, 3, dilation=2).tolist() == []
    assert window_starts(10, 2, starts=[0, 8, 3]).tolist() == [0, 8, 3]
    # A window that does not fit is an IndexError (as upstream) naming the window and the rows.
    fits_not = r"starts\[1\] = 9: the window of 2 rows .* rows 9..10, .* 10 stored"
    with pytest.raises(DDStoreIndexError, match=fits_not):
        window_starts(10, 2, starts=[0, 9])
    with pytest.raises(IndexError, match=r"rows -1..0, which does not fit in 10 stored rows"):
        window_starts(10, 2, starts=[-1])
    with pytest.raises(ValueError, match="window"):
        window_starts(10, 0)
    assert window_rows(np.array([1, 5]), 3, 2).tolist() == [[1, 3, 5], [5, 7, 9]]


def test_row_of():
    concat = ConcatDataset([list(range(4)), list(range(6)), list(range(2))])
    assert [row_of(concat, 0, 3), row_of(concat, 1, 0), row_of(concat, 2, 1), row_of(concat, -1, 1)] == [
        3,
        4,
        11,
        11,
    ]
    for k in range(3):
        for i in range(len(concat.datasets[k])):
            assert concat[row_of(concat, k, i)] == concat.datasets[k][i]
    with pytest.raises(IndexError):
        row_of(concat, 0, 4)
    with pytest.raises(IndexError):  # not the last sample of dataset 1, as upstream
        row_of(concat, 1, -1)
    with pytest.raises(IndexError):
        row_of(concat, 3, 0)


def test_affinity_sets(monkeypatch):
    import os

    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no sched_getaffinity")
    cpus = sorted(os.sched_getaffinity(0))
    from pyddstore import Settings

    monkeypatch.delenv("DDSTORE_AFFINITY_WIDTH", raising=False)
    assert _affinity_sets(2, Settings.from_env()) == [None, None]
    sets = _affinity_sets(3, Settings.from_env(affinity_width=2, affinity_offset=1))
    for w, s in enumerate(sets):
        assert s == {cpus[(1 + 2 * w + k) % len(cpus)] for k in range(2)}


def test_ragged_schema_filler_and_json():
    """ragged={key: axis}: sample 0 may be empty there, other axes must match, the JSON keeps the
    axis and the longest row, the filler collects each field's share with its lengths."""
    from pyddstore.torch._field import RaggedRows

    samples = [
        {"pos": torch.zeros(0, 3), "bonds": np.zeros((2, 0), np.int64), "e": 0.5},
        {"pos": torch.ones(4, 3), "bonds": np.arange(6, dtype=np.int64).reshape(2, 3), "e": 1.5},
    ]
    s = Schema.infer(samples[0], "m", ragged={"pos": 0, "bonds": -1})
    pos, bonds = s.by_key["pos"], s.by_key["bonds"]
    assert (pos.shape, pos.ragged, bonds.shape, bonds.ragged) == ((-1, 3), 0, (2, -1), 1)
    assert [f.key for f in s.ragged_fields] == ["pos", "bonds"] and [f.key for f in s.fixed_fields] == ["e"]
    filler = ChunkFiller(s, 2)
    for i, smp in enumerate(samples):
        filler.put(i, smp, i)
    values, lengths = filler.ragged_share(bonds)
    assert lengths.tolist() == [0, 3] and values.shape == (3, 2)
    with pytest.raises(SchemaError, match="ragged axis"):
        filler.put(0, {"pos": torch.ones(2, 4), "bonds": samples[1]["bonds"], "e": 1.0}, 7)
    bonds.max_len = 3
    back = Schema.from_json(json.loads(json.dumps(s.to_json())))
    assert (back.by_key["bonds"].ragged, back.by_key["bonds"].max_len) == (1, 3)
    bad = s.to_json()
    bad["fields"][0]["ragged"] = 1  # not the -1 axis
    with pytest.raises(ValueError, match="malformed"):
        Schema.from_json(bad)
    with pytest.raises(SchemaError, match="no stored field"):
        Schema.infer(samples[0], "m", ragged={"nope": 0})
    with pytest.raises(SchemaError, match="at least one dimension"):
        Schema.infer(samples[1], "m", ragged={"e": 0})
    with pytest.raises(SchemaError, match="has no elements"):  # an empty field that is not ragged
        Schema.infer(samples[0], "m", ragged={"bonds": 1})
    rows = bonds.ragged_values(np.arange(6, dtype=np.int64), np.array([0, 0, 3]))
    assert isinstance(rows, RaggedRows) and rows.shapes == [(2, 0), (2, 3)]
    assert np.array_equal(rows.row(1), np.arange(6).reshape(2, 3)) and rows.row(0).shape == (2, 0)


# PyG warns of the 'a__b' type name this test builds on purpose (the schema must refuse it).
@pytest.mark.filterwarnings("ignore:There exist type names:UserWarning")
def test_hetero_field_names_round_trip_and_refuse_ambiguous_names():
    pyg = pytest.importorskip("torch_geometric.data")
    d = pyg.HeteroData()
    d["atom"].x = torch.zeros(3, 2)
    d["atom", "bond", "atom"].edge_index = torch.zeros(2, 4, dtype=torch.int64)
    d.y = torch.tensor([1.0])
    s = Schema.infer(d, "h")
    assert s.structure == "pyg-hetero"
    axes = {f.key: f.ragged for f in s.fields}
    assert axes == {"y": 0, "atom.x": 0, "atom__bond__atom.edge_index": 1}, axes
    back = Schema.from_json(json.loads(json.dumps(s.to_json())))
    vals = s.field_values(d, 0)
    (rebuilt,) = back.build({f.key: [v] for f, v in zip(back.fields, vals)}, 1)
    assert type(rebuilt) is pyg.HeteroData
    assert torch.equal(rebuilt["atom", "bond", "atom"].edge_index, d["atom", "bond", "atom"].edge_index)
    assert torch.equal(rebuilt["atom"].x, d["atom"].x) and torch.equal(rebuilt.y, d.y)
    # A second graph with another attribute set is refused, naming it.
    other = pyg.HeteroData()
    other["atom"].x = torch.zeros(1, 2)
    with pytest.raises(SchemaError, match="sample 4 has attributes"):
        s.field_values(other, 4)
    for bad_type in ("a.b", "a__b"):
        h = pyg.HeteroData()
        h[bad_type].x = torch.zeros(1, 2)
        with pytest.raises(SchemaTypeError, match="without '.' or '__'"):
            Schema.infer(h, "bad")


@pytest.mark.parametrize("body", [b"[" * 100_000, b'{"a":' * 5_000 + b"1" + b"}" * 5_000, b"\xff\xfe"])
def test_nested_or_garbled_manifest_is_a_snapshot_error(tmp_path, body):
    import sys

    from pyddstore.torch._snapshot import MANIFEST, SnapshotError, read_manifest

    from pyddstore import _json

    (tmp_path / MANIFEST).write_bytes(body)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(1_000_000)  # the C parser would recurse past the C stack
    try:
        with pytest.raises(SnapshotError, match="manifest"):
            read_manifest(str(tmp_path))
    finally:
        sys.setrecursionlimit(limit)
    # Brackets inside strings are text, not nesting.
    assert _json.nesting_depth(b'{"k": "[[[[{{{{\\"[[", "l": [[1]]}') == 3


def test_load_progress_counts_samples_and_rates_round_sensibly(capsys):
    """The load progress counts samples (callers report bytes of whole samples); the fallback
    line gives 0.16 MB/s as 0.16, not 0; a share that fits the in-flight window is never
    'limited by memory'."""
    from pyddstore.torch import _load_runner

    assert _load_runner.rate_text(0.16e6) == "0.16 MB/s" and _load_runner.rate_text(42.34e6) == "42.3 MB/s"
    assert _load_runner.rate_text(1234.4e6) == "1234 MB/s"
    progress = _load_runner.Progress(1000 * 40, True, "loading t", samples=1000)
    progress._every = 0.0  # a line at every update (stderr is not a terminal here)
    progress.update(40 * 250)
    line = capsys.readouterr().err
    assert "loading t: 250/1000 samples (0.0/0.0 MiB)" in line, line
    progress.close()
    stats = _load_runner.LoadStats("samples", 32)
    _load_runner.window(32, 40_000, 40, stats)
    assert not stats.window_capped
    stats = _load_runner.LoadStats("samples", 32)
    _load_runner.window(32, 1 << 30, 40, stats)  # 1 GiB: a 102 MiB window, 3.2 MiB reads (under 8 MiB)
    assert stats.window_capped


def test_dist_dataset_takes_its_settings(monkeypatch):
    """settings= is the dataset's and its store's: the environment's value is not used."""
    from pyddstore.torch import DistDataset

    import pyddstore
    from pyddstore import DDStoreTypeError

    monkeypatch.setenv("DDSTORE_LOAD_DEPTH", "5")
    rows = [torch.full((3,), float(i)) for i in range(20)]  # map-style: one thread per read in flight
    settings = pyddstore.Settings.from_env(load_depth=3, quiet=True)
    ds = DistDataset(rows, "own-settings", pyddstore._native.Comm.single(), method=1, settings=settings)
    try:
        assert ds.ddstore.settings.load_depth == 3 and ds.ddstore.settings.quiet
        assert ds.load_stats[0]["workers"] == 3, ds.load_stats
        assert all(torch.equal(ds[i], rows[i]) for i in range(len(rows)))
    finally:
        ds.free()
    with pytest.raises(DDStoreTypeError, match="settings="):
        DistDataset(rows, "bad-settings", pyddstore._native.Comm.single(), method=1, settings={"quiet": 1})


def test_dispatch_hands_out_in_order_and_drops_a_stopped_workers_tasks():
    """The loader iterators' one dispatch (threads and processes): round-robin, in order by
    default, out of order with in_order=False, a stopped worker's tasks dropped."""
    from pyddstore.torch import _torch_compat as tc
    from pyddstore.torch._dispatch import Dispatch, ResumeEpoch

    d = Dispatch(2, 2, in_order=True)
    workers = []
    while not d.full():
        w = d.worker()
        assert d.sent(w, slot=len(workers)) == len(workers)
        workers.append(w)
    assert workers == [0, 1, 0, 1] and d.outstanding == 4
    answers = iter([(ResumeEpoch(), None), (1, "b"), (0, "a"), (3, tc.IterableStop(1)), (2, "c")])
    dropped = []
    got = [d.next_answer(lambda: next(answers), dropped.append) for _ in range(3)]
    assert [(t.answer, t.wid, t.slot) for t in got] == [("a", 0, 0), ("b", 1, 1), ("c", 0, 2)]
    assert [t.slot for t in dropped] == [3] and d.active == [True, False] and d.outstanding == 0
    with pytest.raises(StopIteration):
        d.next_answer(lambda: next(answers), dropped.append)
    assert d.worker() == 0  # worker 1 ran out: only worker 0 gets tasks

    d = Dispatch(2, 1, in_order=False)
    first, second = d.sent(d.worker()), d.sent(d.worker())
    assert d.full() and d.worker() is None  # each worker holds its share
    answers = iter([(second, "late"), (first, "early")])
    got = [d.next_answer(lambda: next(answers), dropped.append).answer for _ in range(2)]
    assert got == ["late", "early"]  # as they come
    d.reset()
    assert (d.send_idx, d.rcvd_idx, d.tasks, d.active) == (0, 0, {}, [True, True])
