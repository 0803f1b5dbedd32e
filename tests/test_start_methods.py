"""Start methods: DataLoader workers started with spawn or forkserver (the Linux default
from Python 3.14) re-attach a DistDataset from its pickled handle through the fabric
(methods 1 and 2, no MPI in the worker) and read every sample; method 0 refuses clearly.
Also under mpirun, with the script importing mpi4py at the top (workers import it again)."""

import os
import re

import pytest
from conftest import run_mpi, run_procs

pytest.importorskip("torch")


def test_spawn_and_forkserver_workers_read_every_sample(handshake_dir):
    # method 1 with spawn workers reads every remote row through tcp;ofi_rxm (DDSTORE_SHM=0);
    # method 2 with forkserver workers maps same-node shares from the owners' memfds.
    # DDSTORE_JOB_ID set: each process's several file communicators (two stores, train and
    # validation datasets, the ones below) still keep apart.
    env = {
        "DDSTORE_HANDSHAKE_DIR": handshake_dir,
        "DDSTORE_MPI": "0",
        "DDSTORE_FABRIC": "tcp",
        "OMP_NUM_THREADS": "1",
        "DDSTORE_JOB_ID": f"startmethods{os.getpid()}",
    }
    procs = run_procs(2, "start_methods.py", "1:spawn:0", "2:forkserver:1", env=env, timeout=300)
    for rank, p in enumerate(procs):
        assert f"two live stores ok: rank {rank}" in p.stdout, p.stdout
        for method, ctx in ((1, "spawn"), (2, "forkserver")):
            assert f"start method {ctx} ok: method {method} rank {rank} read 600 samples" in p.stdout, (
                p.stdout
            )
    assert "method 0 -> ForkedWorkerError" in procs[0].stdout


def test_workers_of_a_script_importing_mpi4py_at_the_top(handshake_dir):
    """Under mpirun, `from mpi4py import MPI` at the top of the script: spawn (method 1) and
    forkserver (method 2) workers import it again without initialising MPI and read every sample."""
    env = {"DDSTORE_HANDSHAKE_DIR": handshake_dir, "DDSTORE_FABRIC": "tcp", "OMP_NUM_THREADS": "1"}
    out = run_mpi(2, "start_methods_mpi.py", "1:spawn:0", "2:forkserver:1", env=env, timeout=300).stdout
    for method, ctx in ((1, "spawn"), (2, "forkserver")):
        assert re.search(f"start method {ctx} ok: method {method} rank [01] read 600 samples", out), out
