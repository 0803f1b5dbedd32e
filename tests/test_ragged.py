"""Ragged variables (rows of different lengths, 0 allowed) end to end:
mpirun -n 2/4 with methods 0 and 1 (tcp and shm, through the transport),
plain processes with the file communicator, and method 2 across jobs."""

import pytest
from conftest import run_mpi, run_procs


@pytest.mark.parametrize("n", [2, 4])
def test_method0(n):
    assert "ragged_store ok (method 0" in run_mpi(n, "ragged_store.py", "0", "world").stdout


def test_method0_through_mpi_get():
    assert "ragged_store ok" in run_mpi(2, "ragged_store.py", "0", "world", env={"DDSTORE_SHM": "0"}).stdout


@pytest.mark.parametrize("fabric,n", [("tcp", 4), ("shm", 2)])
def test_method1_through_the_fabric(fabric, n):
    env = {"DDSTORE_FABRIC": fabric, "DDSTORE_SHM": "0"}
    assert "ragged_store ok (method 1" in run_mpi(n, "ragged_store.py", "1", "world", env=env).stdout


def test_file_comm_without_mpi(handshake_dir):
    env = {"DDSTORE_HANDSHAKE_DIR": handshake_dir, "DDSTORE_FABRIC": "tcp", "DDSTORE_SHM": "0"}
    procs = run_procs(3, "ragged_store.py", "1", "none", env=env)
    assert all("ragged_store ok (method 1" in p.stdout for p in procs)
