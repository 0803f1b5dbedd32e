"""pytest side of the virtual cluster (scripts/vcluster.py): a session-wide cluster of three
namespace "nodes", and launchers for mpirun across them and for plain processes on one node.

Import the fixture into a test module (`from vc_fixture import vcluster_fixture`); tests using it skip,
with the reason, where namespaces cannot be made (not root, no `ip`)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SCRIPTS, _check, _env

_HARNESS = Path(__file__).resolve().parent.parent / "scripts" / "vcluster.py"
_spec = importlib.util.spec_from_file_location("ddstore_vcluster", _HARNESS)
harness = importlib.util.module_from_spec(_spec)
sys.modules["ddstore_vcluster"] = harness
_spec.loader.exec_module(harness)

N_NODES = 3
NICS = 2  # eth0 (Open MPI's and the default), eth1 (for NIC selection)


@pytest.fixture(name="vcluster", scope="session")
def vcluster_fixture():
    """Three virtual nodes of two NICs for the whole session, torn down at its end (and by atexit, and
    by the next run's stale-cluster sweep if this process is killed)."""
    reason = harness.why_unavailable()
    if reason:
        pytest.skip(reason)
    cluster = harness.VCluster(N_NODES, NICS).up()
    try:
        yield cluster
    finally:
        cluster.down()


def vc_mpirun(
    cluster, per_node: int, script: str, *args: str, env: dict | None = None, nodes=None, timeout: float = 240
) -> subprocess.CompletedProcess:
    """tests/scripts/<script> under mpirun with `per_node` ranks on each of `nodes`
    (default: the first two), ranks placed round-robin over the nodes; checked."""
    nodes = [0, 1] if nodes is None else nodes
    argv = cluster.mpirun_argv(per_node, [sys.executable, str(SCRIPTS / script), *args], env=env, nodes=nodes)
    proc = subprocess.run(argv, env=_env(env), capture_output=True, text=True, timeout=timeout)
    return _check(proc, f"{script} on nodes {nodes}")


def vc_start(
    cluster, node: int, rank: int, size: int, local: int, script: str, *args: str, env: dict | None = None
) -> subprocess.Popen:
    """One plain process (file communicator, as srun would start it) on `node`."""
    e = _env({"FI_TCP_IFACE": "eth0", "FI_SOCKETS_IFACE": "eth0", **(env or {})})
    e.update({"SLURM_PROCID": str(rank), "SLURM_NTASKS": str(size), "SLURM_LOCALID": str(local)})
    argv = cluster.on_node(node, [sys.executable, str(SCRIPTS / script), *args])
    return subprocess.Popen(argv, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(procs: list[subprocess.Popen], timeout: float = 180, expect_ok: bool = True) -> list:
    """Waits for every process (killing all on a timeout); returns (rc, out, err) per process."""
    done = []
    for i, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError(f"process {i} did not finish within {timeout}s")
        if expect_ok:
            _check(subprocess.CompletedProcess(p.args, p.returncode, out, err), f"process {i}")
        done.append((p.returncode, out, err))
    return done
