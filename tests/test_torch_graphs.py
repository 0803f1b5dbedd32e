"""Ragged samples in pyddstore.torch (tests/scripts/torch_graphs.py): torch_geometric graphs,
including graphs with no edges and with no nodes, checked item by item and batch by batch for
methods 0 and 1 (one mpirun -n 2 job; method 1 over tcp with forked workers) and 2 (a core group
of plain processes without MPI and a separate DistDatasetReader job). DDSTORE_TEST_LONG=1 adds
method 1 under mpirun -n 4 and as plain processes without MPI."""

from __future__ import annotations

import os

import pytest
from conftest import core_group_and_reader, run_mpi, run_procs

pytest.importorskip("torch")
pytest.importorskip("torch_geometric")


def test_methods_0_and_1_mpirun_2_forked_workers():
    # Method 1 through the fabric (tcp), with forked DataLoader workers; method 0 through MPI_Get.
    env = {"DDSTORE_FABRIC": "tcp", "DDSTORE_SHM": "0", "DDSTORE_FORK_WORKERS": "1"}
    out = run_mpi(2, "torch_graphs.py", "--part", "methods01", env=env, timeout=600).stdout
    assert "torch_graphs ok (method 0, 1)" in out


@pytest.mark.skipif(
    os.environ.get("DDSTORE_TEST_LONG") != "1", reason="longer variant: DDSTORE_TEST_LONG=1 (make test-long)"
)
def test_method1_tcp_mpirun_4_forked_workers():
    env = {"DDSTORE_FABRIC": "tcp", "DDSTORE_SHM": "0", "DDSTORE_FORK_WORKERS": "1"}
    out = run_mpi(4, "torch_graphs.py", "--method", "1", "--part", "graphs", env=env, timeout=600).stdout
    assert "torch_graphs ok (method 1)" in out


@pytest.mark.skipif(
    os.environ.get("DDSTORE_TEST_LONG") != "1", reason="longer variant: DDSTORE_TEST_LONG=1 (make test-long)"
)
def test_method1_file_comm_without_mpi_forked_workers(handshake_dir):
    env = {"DDSTORE_COMM": "file", "DDSTORE_MPI": "0", "DDSTORE_HANDSHAKE_DIR": str(handshake_dir)}
    env["DDSTORE_FORK_WORKERS"] = "1"
    args = ("--method", "1", "--comm", "file", "--hs", str(handshake_dir), "--part", "graphs")
    procs = run_procs(2, "torch_graphs.py", *args, env=env)
    assert all("torch_graphs ok (method 1)" in p.stdout for p in procs)


def test_method2_reader_job(handshake_dir):
    core_group_and_reader("torch_graphs.py", handshake_dir, {"DDSTORE_MPI": "0"})
