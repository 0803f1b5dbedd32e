"""ThreadDataLoader(worker_type="process") (tests/scripts/proc_loader.py): a core group of two
plain processes (file communicator, no MPI) reads a method-1 DistDataset through fork, spawn and
forkserver workers (persistent or not, fixed and growing slot rings, ragged and torch_geometric samples,
raising and killed workers, method 0 refused), and a separate job reads the group's method-2
dataset through a DistDatasetReader with worker processes."""

from __future__ import annotations

import pytest
from conftest import run_procs, start_procs

pytest.importorskip("torch")
pytest.importorskip("torch_geometric")


def test_process_workers_core_group_and_reader(handshake_dir):
    hs = str(handshake_dir)
    env = {
        "DDSTORE_FORK_WORKERS": "1",
        "DDSTORE_MPI": "0",
        "DDSTORE_FABRIC": "tcp",
        "DDSTORE_HANDSHAKE_DIR": hs,
        "OMP_NUM_THREADS": "1",
    }
    args = ("--comm", "file", "--hs", hs)
    core = start_procs(2, "proc_loader.py", "--part", "core", *args, env=env)
    try:
        reader = run_procs(1, "proc_loader.py", "--part", "reader", *args, env=env, timeout=400)[0]
    finally:
        (handshake_dir / "reader-done").touch()  # lets the core group finish either way
        outs = [p.communicate(timeout=400) for p in core]
    assert "reader: proc_loader ok" in reader.stdout
    assert "method-2 reader fork: 3 epochs ok" in reader.stdout
    for rank, (p, (out, err)) in enumerate(zip(core, outs)):
        assert p.returncode == 0, f"core rank {rank} failed\n{out}\n{err}"
        for what in ("fork", ("forkserver views", "spawn ragged")[rank], "torch_geometric fork"):
            assert f"rank {rank}: {what}: 3 epochs ok" in out, out
        assert "worker behaviour ok" in out and "held batches ok" in out, out
        assert f"core rank {rank}: proc_loader ok" in out, out
