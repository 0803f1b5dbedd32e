"""PyDDStore end to end: every dtype, uneven shares, batched and shuffled
reads with repeats, threads, init/update, bad input and free, on real
multi-rank jobs (mpirun, and plain processes with the file communicator)."""

import pytest
from conftest import run_mpi, run_procs


@pytest.mark.parametrize("n", [1, 2, 4])
def test_method0_mpi(n):
    out = run_mpi(n, "store_basic.py", "0", "world").stdout
    assert out.count("store_basic ok (method 0") >= 1


@pytest.mark.parametrize("n", [2, 4])
def test_method0_without_node_sharing_reads_through_mpi_get(n):
    out = run_mpi(n, "store_basic.py", "0", "world", env={"DDSTORE_SHM": "0"}).stdout
    assert out.count("store_basic ok") >= 1


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


FABRICS = ["tcp", "shm"]


@pytest.mark.parametrize("fabric", FABRICS)
@pytest.mark.parametrize("n", [2, 4])
def test_method1_fabric_mpirun(fabric, n):
    env = {"DDSTORE_FABRIC": fabric, "DDSTORE_SHM": "0"}
    out = run_mpi(n, "store_basic.py", "1", "world", env=env).stdout
    assert out.count(f"store_basic ok (method 1, ofi:{'shm' if fabric == 'shm' else 'tcp;ofi_rxm'})") >= 1


@pytest.mark.parametrize("fabric", FABRICS)
def test_method1_file_comm_plain_processes(fabric, handshake_dir):
    env = {"DDSTORE_FABRIC": fabric, "DDSTORE_SHM": "0", "DDSTORE_HANDSHAKE_DIR": handshake_dir}
    procs = run_procs(3, "store_basic.py", "1", "none", env=env)
    assert all("store_basic ok (method 1, ofi:" in p.stdout for p in procs)


def test_method1_sockets():
    run_mpi(2, "store_basic.py", "1", "world", env={"DDSTORE_FABRIC": "sockets", "DDSTORE_SHM": "0"})


@pytest.mark.parametrize("fabric", FABRICS)
def test_method1_fork_registered_buffers_wide_rows(fabric):
    env = {"DDSTORE_FABRIC": fabric, "DDSTORE_SHM": "0", "DDSTORE_MAX_READ_BYTES": "4096"}
    out = run_mpi(2, "fabric_extra.py", "features", "world", env=env).stdout
    assert out.count("fabric features ok") >= 1


@pytest.mark.parametrize("fabric", FABRICS)
def test_method1_dead_peer_times_out(fabric, handshake_dir):
    env = {
        "DDSTORE_FABRIC": fabric,
        "DDSTORE_SHM": "0",
        "DDSTORE_TIMEOUT_S": "3",
        "DDSTORE_HANDSHAKE_DIR": handshake_dir,
    }
    procs = run_procs(3, "fabric_extra.py", "dead_peer", "none", env=env, timeout=120)
    for rank in (0, 2):
        assert "dead peer -> TimeoutError" in procs[rank].stdout


STALE_SHM_SCRIPT = r"""
import os, numpy as np, pyddstore
# What a killed earlier process with this pid left in /dev/shm: libfabric shm's default names.
planted = [f"/dev/shm/{os.getpid()}:{os.getuid()}:{i}" for i in range(8)]
for p in planted:
    with open(p, "xb") as f:
        f.write(b"stale")
try:
    store = pyddstore.PyDDStore(None, method=1)
    store.add("x", np.arange(12, dtype=np.int64).reshape(6, 2))
    out = np.empty((3, 2), np.int64)
    store.get_batch("x", out, [5, 0, 5])
    assert out.tolist() == [[10, 11], [0, 1], [10, 11]], out
    store.free()
    print("stale shm ok")
finally:
    for p in planted:
        os.unlink(p)
"""


def test_shm_endpoints_ignore_files_a_killed_process_left(tmp_path):
    """A process killed before closing its shm endpoints leaves files named after its pid in
    /dev/shm; a later process given that pid must still open its endpoints (their names carry
    a random part), not fail fi_enable with EBUSY."""
    import os
    import subprocess
    import sys

    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    env = dict(os.environ, DDSTORE_FABRIC="shm", DDSTORE_SHM="0", DDSTORE_HANDSHAKE_DIR=str(tmp_path / "hs"))
    r = subprocess.run(
        [sys.executable, "-c", STALE_SHM_SCRIPT], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0 and "stale shm ok" in r.stdout, r.stdout + r.stderr
