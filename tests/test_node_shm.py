"""Same-node reads at memory speed: shares are nameless memfds that same-node
peers map read-only. Verified for methods 0, 1 and 2 (an extra job on the
node), from threads and a forked child; DDSTORE_SHM=0 reads the same data
through the transport; nothing is ever left in /dev/shm, even after SIGKILL."""

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import SCRIPTS, _env, run_mpi, run_procs


@pytest.mark.parametrize("method", ["0", "1"])
def test_same_node_rows_are_memory_copies(method):
    out = run_mpi(3, "node_shm.py", "member", method, "1", env={"DDSTORE_FABRIC": "tcp"}).stdout
    assert out.count("node_shm ok") >= 1


@pytest.mark.parametrize("method", ["0", "1"])
def test_shm_off_reads_the_same_rows_through_the_transport(method):
    env = {"DDSTORE_FABRIC": "tcp", "DDSTORE_SHM": "0"}
    assert run_mpi(3, "node_shm.py", "member", method, "0", env=env).stdout.count("node_shm ok") >= 1


def _shm_listing():
    """pyddstore's files in /dev/shm (MPI's and libfabric's own segments are theirs to clean)."""
    return sorted(f for f in os.listdir("/dev/shm") if "ddstore" in f) if os.path.isdir("/dev/shm") else []


def _start_core(hs: str) -> subprocess.Popen:
    """A 2-rank method-2 core job serving until {hs}/STOP, in its own process group."""
    return subprocess.Popen(
        ["mpirun", "-n", "2", "--bind-to", "none", sys.executable, str(SCRIPTS / "node_shm.py"), "core", hs],
        env=_env({"DDSTORE_FABRIC": "tcp"}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def test_method2_extra_job_on_the_node_maps_core_shares(handshake_dir):
    before = _shm_listing()
    hs = str(handshake_dir)
    core = _start_core(hs)
    try:
        procs = run_procs(1, "node_shm.py", "extra", hs, "2", env={"DDSTORE_FABRIC": "tcp"}, timeout=120)
        assert "extra: node_shm ok" in procs[0].stdout
    finally:
        (handshake_dir / "STOP").touch()
        try:
            core.wait(timeout=60)
        except subprocess.TimeoutExpired:
            core.kill()
    assert core.returncode == 0, core.stderr
    assert not list(handshake_dir.glob("*.ddstore.json")), "the core removes its records when it stops"
    assert _shm_listing() == before


def test_nothing_left_in_dev_shm_after_sigkill(handshake_dir):
    """SIGKILL the whole serving job: its shares vanish with it."""
    before = _shm_listing()
    hs = str(handshake_dir)
    core = _start_core(hs)
    try:
        deadline = time.monotonic() + 60
        while not list(handshake_dir.glob("*.ddstore.json")):
            assert time.monotonic() < deadline and core.poll() is None, "core did not start serving"
            time.sleep(0.1)
    finally:
        os.killpg(core.pid, signal.SIGKILL)
        core.wait(timeout=30)
    time.sleep(0.5)
    assert _shm_listing() == before
