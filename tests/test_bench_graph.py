"""Smoke test of the graph benchmark: tiny sizes under mpirun -n 2, every line in the JSON with
sane figures (the bench itself checks every line's data against the owners' graphs first)."""

from __future__ import annotations

import json

import pytest
from conftest import run_mpi

pytest.importorskip("mpi4py")


def test_bench_graph_smoke(tmp_path):
    out = tmp_path / "bench_graph.json"
    args = ["--graphs", "150", "--seconds", "0.02", "--rounds", "1", "--range-bytes", "512"]
    run_mpi(2, "bg_run.py", *args, "--configs", "node-shm,ofi-tcp", "--json", str(out), timeout=300)
    res = json.loads(out.read_text())
    assert res["ranks"] == 2
    lines = {(r["config"], r["line"]): r for r in res["results"]}
    for config in ("node-shm", "ofi-tcp"):
        for line in ("ragged", "ragged-out", "padded", "records", "list"):
            r = lines[(config, line)]
            assert r["us_per_graph"] > 0 and r["graphs_per_s"] > 0 and r["bytes_per_batch"] > 0, r
        ratios = lines[(config, "ratios")]
        assert ratios["offset_bytes_per_row"] == 8
        assert ratios["ragged_vs_padded_per_byte"] > 0 and ratios["records_vs_ragged_per_graph"] > 0
        assert ratios["ragged_out_vs_padded_per_byte"] > 0
        assert lines[(config, "range-get")]["ratio"] > 0
