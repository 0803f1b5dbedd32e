"""pyddstore.torch end to end: DistDataset under mpirun (methods 0 and 1), without MPI (file
and torch.distributed communicators), forked DataLoader workers, and a method-2 reader job.
Each launch runs many checks (tests/scripts/torch_dataset.py) to keep the suite fast."""

from __future__ import annotations

import pytest
from conftest import core_group_and_reader, run_mpi, run_procs

pytest.importorskip("torch")
_native = pytest.importorskip("pyddstore._native")

METHODS = set(getattr(_native, "METHODS", ()))


def needs(method: int):
    return pytest.mark.skipif(method not in METHODS, reason=f"method {method} is not in this build")


# Method 1 over the fabric providers; DDSTORE_SHM=0 keeps same-node reads on the fabric too.
FABRICS = [
    pytest.param({"DDSTORE_FABRIC": "tcp", "DDSTORE_SHM": "0"}, id="tcp"),
    pytest.param({"DDSTORE_FABRIC": "shm", "DDSTORE_SHM": "0"}, id="shm"),
    pytest.param({}, id="default"),
]


@needs(0)
@pytest.mark.parametrize("n", [2, 4])
def test_mpi_method0(n):
    # 2 ranks: every part, then several datasets with comm=None, one after another, in the same job;
    # 4 ranks: the parts whose layout depends on the rank count (shares, reads and windows over
    # several owners, ddstore_width=2 groups).
    part = "all,comm_none" if n == 2 else "structures,bulk,read_rows,windows,width"
    run_mpi(n, "torch_dataset.py", "--method", "0", "--part", part, timeout=600)


@needs(1)
@pytest.mark.parametrize("fabric", FABRICS)
def test_mpi_method1(fabric, handshake_dir):
    # tcp: every part, on 3 ranks (uneven shares). shm: its reads wait for the owner's progress
    # thread (minutes for every part on 2 oversubscribed cores), so the structures part (every sample
    # kind) on 2 ranks. The default (same-node rows through node shared memory): the parts whose reads
    # take another path or whose layout depends on the rank count, on 4 ranks (the loaders, encode and
    # bad-sample parts read through the same calls on every path).
    ranks, part = {
        "tcp": (3, "all"),
        "shm": (2, "structures"),
        None: (4, "structures,bulk,read_rows,windows,width"),
    }[fabric.get("DDSTORE_FABRIC")]
    run_mpi(ranks, "torch_dataset.py", "--method", "1", "--part", part, env=fabric, timeout=600)


@needs(1)
@pytest.mark.parametrize("comm", ["file", "torch"])
def test_without_mpi(comm, handshake_dir):
    env = {"DDSTORE_COMM": comm, "DDSTORE_MPI": "0", "DDSTORE_HANDSHAKE_DIR": str(handshake_dir)}
    # The file communicator's job: the parts that use the communicator beyond store creation (the
    # loaders' distributed batches, windows), and several datasets with comm=None, one after another.
    part = "structures,loaders,windows,comm_none" if comm == "file" else "structures"
    run_procs(
        2,
        "torch_dataset.py",
        "--method",
        "1",
        "--comm",
        comm,
        "--hs",
        str(handshake_dir),
        "--part",
        part,
        env=env,
        timeout=600,
    )


@needs(1)
@pytest.mark.parametrize("fabric", FABRICS)
def test_forked_workers_mpi(fabric):
    run_mpi(2, "torch_fork.py", "--method", "1", env={**fabric, "DDSTORE_FORK_WORKERS": "1"}, timeout=600)


@needs(1)
def test_forked_workers_without_mpi(handshake_dir):
    hs = str(handshake_dir)
    env = {"DDSTORE_FORK_WORKERS": "1", "DDSTORE_COMM": "file", "DDSTORE_MPI": "0"}
    run_procs(2, "torch_fork.py", "--method", "1", "--comm", "file", "--hs", hs, env=env, timeout=600)


@needs(2)
def test_method2_reader(handshake_dir):
    """A core group of two plain processes (file communicator) and a separate reader job."""
    env = {"DDSTORE_FORK_WORKERS": "1", "DDSTORE_HANDSHAKE_DIR": str(handshake_dir), "DDSTORE_MPI": "0"}
    core_group_and_reader("torch_method2.py", handshake_dir, env)


@needs(1)
def test_load_memory():
    run_procs(1, "torch_memory.py", env={"DDSTORE_MPI": "0"}, timeout=300)
