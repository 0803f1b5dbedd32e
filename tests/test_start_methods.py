"""Start methods: DataLoader workers started with spawn or forkserver (the Linux default
from Python 3.14) re-attach a DistDataset from its pickled handle through the fabric
(methods 1 and 2, no MPI in the worker) and read every sample; method 0 refuses clearly."""

import pytest
from conftest import run_procs

pytest.importorskip("torch")


@pytest.mark.parametrize(
    "method,ctx,shm",
    [
        (1, "spawn", "0"),  # every remote row through tcp;ofi_rxm
        (2, "forkserver", "1"),  # same-node shares mapped from the owners' memfds
    ],
)
def test_spawn_and_forkserver_workers_read_every_sample(method, ctx, shm, handshake_dir):
    env = {
        "DDSTORE_HANDSHAKE_DIR": handshake_dir,
        "DDSTORE_MPI": "0",
        "DDSTORE_FABRIC": "tcp",
        "DDSTORE_SHM": shm,
        "OMP_NUM_THREADS": "1",
    }
    procs = run_procs(2, "start_methods.py", str(method), ctx, env=env, timeout=300)
    for rank, p in enumerate(procs):
        assert f"start method {ctx} ok: method {method} rank {rank} read 600 samples" in p.stdout, p.stdout
    assert "method 0 -> ForkedWorkerError" in procs[0].stdout
