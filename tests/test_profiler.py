"""pyddstore's spans in torch.profiler traces: a short profile of a one-rank DistDataset's load
and of ThreadDataLoader epochs (worker threads, worker processes) exported as a Chrome trace,
opened, and searched for the spans by name; with no profiler running no span is opened."""

import json

import numpy as np
import pytest

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


def _all_threads() -> dict:
    """profile()'s arguments that record every thread's spans (ThreadDataLoader's worker threads
    too), where this torch has the option (its experimental profile_all_threads)."""
    try:
        from torch._C._profiler import _ExperimentalConfig

        return {"experimental_config": _ExperimentalConfig(profile_all_threads=True)}
    except (ImportError, TypeError):
        return {}


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
