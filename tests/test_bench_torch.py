"""Smoke test of the PyTorch-level benchmark: tiny sizes under mpirun -n 2, every part and every
loader row present in the JSON with sane figures (the bench itself checks the data it reads)."""

from __future__ import annotations

import json
import math

import pytest
from conftest import run_mpi

# Long runs: the slow tier (`pytest -m slow`), after the default one.
pytestmark = pytest.mark.slow

pytest.importorskip("torch")
pytest.importorskip("mpi4py")
_native = pytest.importorskip("pyddstore._native")

LOADERS = {
    ("-", "torch-base"),
    ("-", "fork2"),
    ("-", "fork2-persist"),
    (0, "main"),
    (0, "thread1"),
    (0, "thread2"),
    (1, "main"),
    (1, "fork2"),
    (1, "fork2-persist"),
    (1, "thread1"),
    (1, "thread2"),
}


@pytest.mark.skipif(
    not {0, 1} <= set(getattr(_native, "METHODS", ())), reason="methods 0 and 1 are not both in this build"
)
def test_bench_torch_smoke(tmp_path):
    out = tmp_path / "bench_torch.json"
    args = ["--share-mib", "2", "--row-kib", "16", "--chunk-size", "8", "--epochs", "2", "--batches", "3"]
    args += ["--batch-size", "8", "--row-floats", "16", "--step-ms", "1", "--tmpdir", str(tmp_path)]
    proc = run_mpi(2, "tb_run.py", *args, "--json", str(out), timeout=600)
    res = json.loads(out.read_text())
    assert res["ranks"] == 2

    mem = res["memory"]
    assert [(r["source"], r["chunk"]) for r in mem] == [
        ("generated", "2 rows (fixed)"),
        ("generated", "default"),
        ("generated", "chunk_size=8"),
        ("generated", "one chunk"),
        ("memmap", "default"),
        ("memmap", "chunk_size=8"),
        ("memmap", "one chunk"),
    ]
    for r in mem[1:]:
        assert math.isclose(r["share_mib"], 2.0), r
        assert r["peak_mib"] > 0 and r["ratio"] > 0 and r["load_s"] > 0, r
        assert r["shmem_mib"] >= 1.5, r  # the share itself lives in the store's shared memory

    rows = res["loaders"]
    assert {(r["method"], r["loader"]) for r in rows} == LOADERS
    for r in rows:
        assert len(r["epoch_s"]) == 2 and len(r["wait_s"]) == 2, r
        assert r["samples_per_epoch"] == 2 * 3 * 8, r  # both ranks, every batch
        assert r["samples_per_s"] > 0 and r["ratio_base"] > 0, r
        assert 0 <= r["wait_s_per_epoch"] <= max(r["epoch_s"]), r
    assert next(r for r in rows if r["loader"] == "torch-base")["ratio_base"] == 1.0

    for header in ("# memory:", "# loaders:", "fork2-persist", "memmap"):
        assert header in proc.stdout, proc.stdout
