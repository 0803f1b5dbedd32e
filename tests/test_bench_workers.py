"""Smoke test of the loader-workers benchmark (python -m pyddstore.benchmarks.workers): tiny sizes under
mpirun -n 2, every part (plain, decode, start: no persistent workers, issue 40's setup, one round)
with one and two workers, and every loader row
in the JSON with sane figures (the bench checks the first batch of every epoch itself): the start
part's rows checked in `make bench-workers`'s smoke (slow tier), every part with DDSTORE_TEST_LONG=1
(make test-long)."""

from __future__ import annotations

import json
import os

import pytest
from conftest import run_mpi

pytest.importorskip("torch")
pytest.importorskip("mpi4py")


def check_start_part(rows: list[dict]) -> None:
    """Issue 40's setup (no persistent workers, one and two workers) at a small size, one round, in
    the JSON of `make bench-workers`'s smoke (tests/test_make_targets.py: every part, 2 epochs):
    every row measured (each epoch's first batch checked by the bench)."""
    start = {r["loader"]: r for r in rows if r["part"] == "start"}
    want = {"thread1", "thread2", "process1", "process2", "process1 fork/epoch", "torch2 DistDataset"}
    assert want <= set(start), start
    assert all(len(r["epoch_s"]) == 2 and r["samples_per_s"] > 0 for r in start.values()), start
    assert all(start[k]["ring_mib_per_rank"] > 0 for k in ("process1", "process2", "process1 fork/epoch")), (
        start
    )
    # The goal is over one thread: every row carries that ratio too.
    assert start["thread1"]["x_thread1"] == 1.0 and all(r["x_thread1"] > 0 for r in start.values()), start


@pytest.mark.skipif(
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
