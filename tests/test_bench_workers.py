"""Smoke test of the loader-workers benchmark (python -m pyddstore.benchmarks.workers): tiny sizes under
mpirun -n 2, every part (plain, decode, start: no persistent workers, issue 40's setup, one round)
with one and two workers, and every loader row
in the JSON with sane figures (the bench checks the first batch of every epoch itself). A longer
variant: DDSTORE_TEST_LONG=1 (make test-long)."""

from __future__ import annotations

import json
import os

import pytest
from conftest import run_mpi

pytest.importorskip("torch")
pytest.importorskip("mpi4py")

pytestmark = pytest.mark.skipif(
    os.environ.get("DDSTORE_TEST_LONG") != "1", reason="longer variant: DDSTORE_TEST_LONG=1 (make test-long)"
)


def test_bench_workers_smoke(tmp_path):
    out = tmp_path / "bench_workers.json"
    args = ["--samples", "256", "--decode-samples", "64"]
    args += [
        "--batch-size",
        "16",
        "--epochs",
        "2",
        "--rounds",
        "1",
        "--decode-ms",
        "0.2",
        "--tmpdir",
        str(tmp_path),
    ]
    run_mpi(2, "bw_run.py", *args, "--json", str(out), timeout=900)
    res = json.loads(out.read_text())
    assert res["ranks"] == 2
    # start: issue 40's setup (workers started every epoch, no persistent workers), one round.
    for part in ("plain", "decode", "start"):
        rows = {r["loader"]: r for r in res["rows"] if r["part"] == part}
        want = {"thread2", "process2", "torch2 DistDataset", "torch2 memmap"}
        if part != "decode":  # one and two workers
            want |= {"thread1", "process1"}
        if part == "start":  # a process worker forked every epoch
            want.add("process1 fork/epoch")
        assert want <= set(rows), rows
        assert all(r["samples_per_s"] > 0 for r in rows.values()), rows
        assert rows["process2"]["ring_mib_per_rank"] > 0 and rows["thread2"]["ring_mib_per_rank"] == 0
