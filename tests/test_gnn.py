"""The GNN example (examples/gnn) in a small configuration: a DDP job over a DistDataset of
generated molecules of varying size (method 1 over tcp, a ThreadDataLoader worker) must train:
the loss goes down, and the data-wait fraction is printed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import run_mpi

# Long runs: the slow tier (`pytest -m slow`), after the default one.
pytestmark = pytest.mark.slow

pytest.importorskip("torch_geometric")

GNN = Path(__file__).resolve().parent.parent / "examples" / "gnn"
EPOCH = re.compile(r"^epoch (\d+)/(\d+): loss ([0-9.]+), .* data-wait fraction ([0-9.]+)%$", re.M)


def test_gnn_single_job_trains():
    env = {"DDSTORE_METHOD": "1", "DDSTORE_FABRIC": "tcp"}
    args = ("--epochs", "3", "--molecules", "1200", "--num-workers", "1")
    out = run_mpi(2, str(GNN / "gnn-ddp.py"), *args, env=env, timeout=300).stdout
    found = EPOCH.findall(out)
    assert len(found) == 3, out
    losses = [float(m[2]) for m in found]
    assert losses[-1] < losses[0] * 0.7, f"the loss did not go down: {losses}\n{out}"
    assert all(0 <= float(m[3]) <= 100 for m in found), out
    assert "1200 molecules" in out and "method 1," in out
