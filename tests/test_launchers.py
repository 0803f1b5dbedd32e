"""Launchers: the quickstart runs as written under mpirun with pyddstore.torch's
DistributedSampler (no torch.distributed); torchrun without init_process_group never yields
a one-rank store; an MPI launcher with MPI switched off does not either."""

import subprocess
import sys

import pytest
from conftest import SCRIPTS, _check, _env, run_mpi

pytest.importorskip("torch")


def test_quickstart_as_written_under_mpirun_and_sampler_semantics():
    out = run_mpi(2, "launch_quickstart.py", timeout=300).stdout
    assert "quickstart ok: rank" in out and "of 2 read" in out, out
    assert "sampler ok rank" in out, out


def test_torchrun_without_process_group_never_a_one_rank_store():
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        str(SCRIPTS / "launch_torchrun.py"),
    ]
    env = _env({"OMP_NUM_THREADS": "1", "DDSTORE_FABRIC": "tcp"})
    proc = _check(subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300), "torchrun")
    out = proc.stdout + proc.stderr
    assert out.count("no group -> DDStoreValueError") == 2, out
    assert "torchrun ok rank 0 of 2" in out and "torchrun ok rank 1 of 2" in out, out


def test_mpirun_with_mpi_off_and_no_communicator_raises():
    out = run_mpi(2, "launch_no_group.py", env={"DDSTORE_MPI": "0"}).stdout
    assert "no group -> DDStoreValueError" in out, out
