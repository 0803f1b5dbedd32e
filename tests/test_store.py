"""PyDDStore end to end: every dtype, uneven shares, batched and shuffled
reads with repeats, threads, init/update, bad input and free, on real
multi-rank jobs (mpirun, and plain processes with the file communicator)."""

import pytest
from conftest import run_mpi, run_procs


@pytest.mark.parametrize("n", [1, 2, 4])
def test_method0_mpi(n):
    out = run_mpi(n, "store_basic.py", "0", "world").stdout
    assert out.count("store_basic ok (method 0") == n


@pytest.mark.parametrize("n", [2, 4])
def test_method0_without_node_sharing_reads_through_mpi_get(n):
    out = run_mpi(n, "store_basic.py", "0", "world", env={"DDSTORE_SHM": "0"}).stdout
    assert out.count("store_basic ok") == n


def test_method0_serialized_thread_level():
    run_mpi(2, "store_basic.py", "0", "none", env={"DDSTORE_MPI_THREAD_LEVEL": "serialized"})


def test_default_comm_under_mpirun_is_mpi():
    assert "method 0, mpi-rma" in run_mpi(2, "store_basic.py", "default", "none").stdout


@pytest.mark.parametrize("n", [1, 3])
def test_file_comm_without_mpi(n, handshake_dir):
    procs = run_procs(n, "store_basic.py", "1", "none", env={"DDSTORE_HANDSHAKE_DIR": handshake_dir})
    assert all("store_basic ok (method 1" in p.stdout for p in procs)


def test_method0_with_file_comm_raises(handshake_dir):
    procs = run_procs(1, "expect_error.py", "method0_file", env={"DDSTORE_HANDSHAKE_DIR": handshake_dir})
    assert "needs an MPI communicator" in procs[0].stdout
