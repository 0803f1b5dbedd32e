"""Ragged variables (rows of different lengths, 0 allowed) end to end:
mpirun -n 2/4 with methods 0 and 1 (tcp through the transport), and plain
processes with the file communicator. DDSTORE_TEST_LONG=1 (make test-long)
adds MPI_Get and the shm provider. Method 2: tests/test_torch_graphs.py."""

import os

import pytest
from conftest import run_mpi, run_procs

long_test = pytest.mark.skipif(
    os.environ.get("DDSTORE_TEST_LONG") != "1", reason="longer variant: DDSTORE_TEST_LONG=1 (make test-long)"
)


@pytest.mark.parametrize("n", [2, 4])
def test_method0(n):
    assert "ragged_store ok (method 0" in run_mpi(n, "ragged_store.py", "0", "world").stdout


@long_test
def test_method0_through_mpi_get():
    assert "ragged_store ok" in run_mpi(2, "ragged_store.py", "0", "world", env={"DDSTORE_SHM": "0"}).stdout


@pytest.mark.parametrize("fabric,n", [("tcp", 4), pytest.param("shm", 2, marks=long_test)])
def test_method1_through_the_fabric(fabric, n):
    env = {"DDSTORE_FABRIC": fabric, "DDSTORE_SHM": "0"}
    assert "ragged_store ok (method 1" in run_mpi(n, "ragged_store.py", "1", "world", env=env).stdout


@pytest.mark.parametrize("gather,path", [("1", "gather"), ("0", "one-sided")])
def test_method1_tcp_gather_and_one_sided(gather, path):
    """Ragged batches through the owner-side gather path (tcp's default) and through one-sided reads."""
    env = {"DDSTORE_FABRIC": "tcp", "DDSTORE_SHM": "0", "DDSTORE_REMOTE_GATHER": gather}
    out = run_mpi(2, "ragged_store.py", "1", "world", env=env).stdout
    assert "ragged_store ok (method 1" in out and f"{path} remote reads)" in out, out


def test_file_comm_without_mpi(handshake_dir):
    env = {"DDSTORE_HANDSHAKE_DIR": handshake_dir, "DDSTORE_FABRIC": "tcp", "DDSTORE_SHM": "0"}
    procs = run_procs(3, "ragged_store.py", "1", "none", env=env)
    assert all("ragged_store ok (method 1" in p.stdout for p in procs)


@pytest.mark.parametrize(
    "n,extra",
    [
        (4, {}),
        # 4 KiB reply messages and a 4-deep window: replies cut over several messages and requests.
        (3, {"DDSTORE_MAX_READ_BYTES": "4096", "DDSTORE_MAX_INFLIGHT": "4"}),
    ],
    ids=["4-ranks", "3-ranks-small-messages"],
)
def test_one_round_trip_gather_mixed_rows(n, extra):
    """tcp's gather path reads whole ragged rows in one request per owner, beside own and
    same-node rows (two pretend hosts); every row checked (tests/scripts/ragged_gather.py)."""
    env = {"DDSTORE_FABRIC": "tcp", "DDSTORE_SHM": "1", "DDSTORE_REMOTE_GATHER": "auto", **extra}
    out = run_mpi(n, "ragged_gather.py", "mixed", env=env).stdout
    assert "ragged gather mixed ok" in out, out


@pytest.mark.parametrize(
    "method,env",
    [
        (0, {"DDSTORE_SHM": "0"}),
        (1, {"DDSTORE_FABRIC": "tcp", "DDSTORE_SHM": "0", "DDSTORE_REMOTE_GATHER": "0"}),
    ],
    ids=["mpi-get", "tcp-one-sided"],
)
def test_two_step_reads_of_far_apart_rows(method, env):
    """Without the gather path a batch reads row ends (one span per owner, or several for rows
    far apart), then values."""
    out = run_mpi(2, "ragged_gather.py", "spread", str(method), env=env).stdout
    assert "ragged spread ok" in out, out


def test_one_round_trip_gather_stopped_owner(handshake_dir):
    env = {"DDSTORE_FABRIC": "tcp", "DDSTORE_SHM": "0", "DDSTORE_TIMEOUT_S": "3"}
    env["DDSTORE_HANDSHAKE_DIR"] = str(handshake_dir)
    procs = run_procs(3, "ragged_gather.py", "stopped", env=env, timeout=180)
    out = procs[0].stdout
    assert "stopped owner: DDStoreTimeoutError after" in out and "reads after SIGCONT ok" in out, out


def test_created_in_place_mpi_tcp_gather():
    """A ragged variable created with its values written in place by a fill callback (Rust's one
    creation protocol, as pyddstore.torch loads ragged fields): every row checked on every rank,
    through tcp's one-round-trip gather path; a fill that raises on one rank fails every rank."""
    env = {"DDSTORE_FABRIC": "tcp", "DDSTORE_SHM": "0", "DDSTORE_REMOTE_GATHER": "1"}
    out = run_mpi(3, "ragged_in_place.py", "world", env=env).stdout
    assert out.count("ragged_in_place ok") == 3 and "gather remote reads" in out, out


def test_created_in_place_file_comm(handshake_dir):
    env = {"DDSTORE_HANDSHAKE_DIR": handshake_dir, "DDSTORE_FABRIC": "tcp", "DDSTORE_SHM": "1"}
    procs = run_procs(2, "ragged_in_place.py", "none", env=env)
    assert all("ragged_in_place ok" in p.stdout for p in procs)
