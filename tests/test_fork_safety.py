"""A process forked after a large read reads as its parent did, with no fork_reader() call
(the core notices the fork on the first read and opens fresh readers; no thread pool is
carried across fork): methods 0 (shared window) and 1 (memfd, and through tcp readers)
under mpirun, a method-2 extra job, and a DataLoader whose main process read a 64 MiB
batch before forking its workers. The parent reads while its child does (a child reusing
the parent's reader shares its connections: on the tcp-readers case that made the parent's
read fail before readers were pooled per process). Every read is checked against the
owner's rows."""

import sys

import pytest
from conftest import SCRIPTS, run_mpi, run_procs


@pytest.mark.parametrize(
    "method,env",
    [
        pytest.param("0", {}, id="m0-shared-window"),
        pytest.param("1", {}, id="m1-memfd"),
        pytest.param("1", {"DDSTORE_FABRIC": "tcp", "DDSTORE_SHM": "0"}, id="m1-tcp-readers"),
    ],
)
def test_child_reads_after_parent_read_a_large_batch(method, env):
    out = run_mpi(2, "fork_large.py", method, env=env, timeout=240).stdout
    assert f"fork_large ok (method {method}" in out, out


@pytest.mark.parametrize("shm", ["1", "0"])
def test_method2_extra_job_forks_after_a_large_read(shm, handshake_dir):
    sys.path.insert(0, str(SCRIPTS.parent))
    from test_method2 import Core

    env = {"DDSTORE_FABRIC": "tcp", "DDSTORE_SHM": shm, "DDSTORE_MPI": None}
    core = Core(handshake_dir, env, 2, "fork_large.py", "m2core")
    try:
        core.wait_ready(["big.ddstore.json"])
        extra_env = {**env, "DDSTORE_HANDSHAKE_DIR": str(handshake_dir), "DDSTORE_HANDSHAKE_TIMEOUT_S": "60"}
        args = ("m2extra", "--hs", str(handshake_dir))
        out = run_procs(1, "fork_large.py", *args, env=extra_env, timeout=240)[0].stdout
        assert "fork_large ok (method 2 extra" in out, out
        assert core.proc.wait(timeout=120) == 0, core.output()
    finally:
        core.kill()


def test_dataloader_workers_fork_after_a_large_batch_in_the_main_process():
    pytest.importorskip("torch")
    out = run_mpi(2, "fork_large.py", "loader", timeout=240).stdout
    assert "fork_large loader ok" in out, out
