"""The VAE example (examples/vae) in small configurations, as jobs/local-vae.sh runs it: the
single DDP job with method 0 and method 1 (mpirun, and without MPI over the DDP group), and the
method-2 split (core server + extra training job). Each must train: the loss goes down."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest
from conftest import run_mpi, run_procs
from test_method2 import Core

# Long runs: the slow tier (`pytest -m slow`), after the default one.
pytestmark = pytest.mark.slow

VAE = Path(__file__).resolve().parent.parent / "examples" / "vae"
EPOCH = re.compile(r"^epoch (\d+)/(\d+): loss ([0-9.]+), (\d+) samples/s, ([0-9.]+) s waiting", re.M)


def losses(out: str, epochs: int) -> list[float]:
    found = EPOCH.findall(out)
    assert len(found) == epochs, f"expected {epochs} epoch lines\n{out}"
    values = [float(m[2]) for m in found]
    assert values[-1] < values[0] * 0.9, f"the loss did not go down: {values}\n{out}"
    return values


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


@pytest.mark.parametrize(
    "env,opts",
    [
        pytest.param({"DDSTORE_METHOD": "0"}, [], id="method0"),
        pytest.param(
            {"DDSTORE_METHOD": "1", "DDSTORE_FABRIC": "tcp"}, ["--num-workers", "1"], id="method1-tcp"
        ),
    ],
)
def test_single_job(env, opts):
    out = run_mpi(2, str(VAE / "vae-ddp.py"), "--epochs", "3", *opts, env=env, timeout=300).stdout
    losses(out, 3)
    assert f"method {env['DDSTORE_METHOD']}," in out


def test_single_job_without_mpi():
    """--comm torch: method 1 over the DDP group, forked DataLoader workers (DDSTORE_FORK_WORKERS)."""
    env = {"DDSTORE_MPI": "0", "DDSTORE_FABRIC": "shm", "MASTER_ADDR": "127.0.0.1"}
    env["MASTER_PORT"] = free_port()
    args = ("--epochs", "2", "--num-workers", "2", "--loader", "torch")
    out = run_procs(2, str(VAE / "vae-ddp.py"), *args, env=env, timeout=300)[0].stdout
    assert "method 1, ofi:shm, comm torch, 2 ranks, loader torch with 2 workers" in out
    losses(out, 2)


def test_split_core_server_and_extra_job(handshake_dir):
    env = {"DDSTORE_FABRIC": "tcp", "DDSTORE_HANDSHAKE_TIMEOUT_S": "200"}
    core = Core(handshake_dir, env, 2, str(VAE / "vae_core_server.py"), hs_flag="--handshake-dir")
    try:
        core.wait_ready(["vae-train.meta.json"], timeout=200)
        args = ("--handshake-dir", str(handshake_dir), "--epochs", "2", "--num-workers", "1")
        out = run_mpi(2, str(VAE / "vae_extra_train.py"), *args, env=env, timeout=300).stdout
        assert "extra job: 1797 samples of (1, 28, 28), method 2" in out
        losses(out, 2)
        assert core.stop() == 0, core.output()
    finally:
        core.kill()
    assert "core: stopped" in core.output()
    assert not list(handshake_dir.glob("*.json")), "the core server must remove its records and meta file"
