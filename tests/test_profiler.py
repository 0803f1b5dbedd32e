"""pyddstore's spans in torch.profiler traces: a short profile of a one-rank DistDataset's load
and of ThreadDataLoader epochs (worker threads, worker processes) exported as a Chrome trace,
opened, and searched for the spans by name; with no profiler running no span is opened."""

import json

import numpy as np
import pytest

import pyddstore

torch = pytest.importorskip("torch")

from pyddstore.torch import (  # noqa: E402
    DistDataset,
    ThreadDataLoader,
    _spans,  # noqa: E402
)

from pyddstore import Settings  # noqa: E402

ROWS, FEATURES, BATCH = 96, 8, 16


def _trace_names(prof, path) -> dict:
    """Span name -> count, from the Chrome trace the profile exports to `path`."""
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    counts: dict = {}
    for e in events:
        if e.get("ph") == "X":
            counts[e["name"]] = counts.get(e["name"], 0) + 1
    return counts


_all_threads = _spans.all_threads  # profile() arguments recording every thread, where torch can


def _data():
    x = np.arange(ROWS * FEATURES, dtype=np.float32).reshape(ROWS, FEATURES)
    return x


@pytest.mark.parametrize("worker_type", ["thread", "process"])
def test_trace_shows_the_load_and_the_loaders_reads_and_waits(tmp_path, worker_type, monkeypatch):
    monkeypatch.setenv("FI_TCP_IFACE", "lo")
    from torch.profiler import ProfilerActivity, profile

    settings = Settings.from_env(quiet=True)
    all_threads = _all_threads()
    with profile(activities=[ProfilerActivity.CPU], **all_threads) as prof:
        ds = DistDataset(_data(), f"prof_{worker_type}", method="libfabric", settings=settings)
        loader = ThreadDataLoader(ds, batch_size=BATCH, num_workers=2, worker_type=worker_type)
        seen = []
        for batch in loader:
            seen.append(batch[:, 0].numpy() // FEATURES)  # each row's first value names the row
        loader.close()
    assert sorted(np.concatenate(seen).tolist()) == list(range(ROWS))  # every row, once
    names = _trace_names(prof, tmp_path / "trace.json")
    batches = ROWS // BATCH
    assert names.get("pyddstore.load", 0) == 1 and names.get("pyddstore.load.agree", 0) == 1, names
    assert names.get("pyddstore.loader.wait", 0) >= 1, names
    if worker_type == "thread" and all_threads:
        assert names.get("pyddstore.loader.read_batch", 0) == batches, names
    else:  # reads run in the worker processes; the loop's process turns each batch into tensors
        assert names.get("pyddstore.loader.unpack_batch", 0) == batches, names
    ds.free()


def test_no_span_is_opened_without_a_profiler():
    from torch.profiler import ProfilerActivity, profile

    assert _spans.span("pyddstore.x") is _spans._NO_SPAN
    with profile(activities=[ProfilerActivity.CPU]):
        assert _spans.span("pyddstore.x") is not _spans._NO_SPAN
    assert _spans.span("pyddstore.x") is _spans._NO_SPAN


def test_profile_batches_writes_a_chrome_trace_of_the_first_batches(tmp_path, monkeypatch):
    """ThreadDataLoader(profile_batches=3): the first iteration's first 3 batches in
    {profile_dir}/pyddstore-trace-rank0.json, with the loader's spans; later iterations and the
    batches after the third are not recorded, and every epoch still yields every row."""
    monkeypatch.setenv("FI_TCP_IFACE", "lo")
    settings = Settings.from_env(quiet=True)
    ds = DistDataset(_data(), "prof_batches", method=1, settings=settings)
    loader = ThreadDataLoader(ds, batch_size=BATCH, num_workers=2, profile_batches=3, profile_dir=tmp_path)
    try:
        for _ in range(2):
            rows = sorted(np.concatenate([b[:, 0].numpy() // FEATURES for b in loader]).tolist())
            assert rows == list(range(ROWS))
    finally:
        loader.close()
        ds.free()
    assert [p.name for p in tmp_path.iterdir()] == ["pyddstore-trace-rank0.json"]
    events = json.loads((tmp_path / "pyddstore-trace-rank0.json").read_text())["traceEvents"]
    names = [e["name"] for e in events if e.get("ph") == "X"]
    assert sum(n.startswith("enumerate(DataLoader)") for n in names) == 3, names  # 3 batches asked for
    # A wait opens a span per check of the workers (one a second): at least one in 3 batches.
    assert names.count("pyddstore.loader.wait") >= 1, names
    if _all_threads():
        assert names.count("pyddstore.loader.read_batch") >= 3, names
    with pytest.raises(pyddstore.DDStoreValueError, match="profile_batches"):
        ThreadDataLoader(ds, batch_size=BATCH, profile_batches=-1)
