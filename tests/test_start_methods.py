"""Start methods: DataLoader workers started with spawn or forkserver (the Linux default
from Python 3.14) re-attach a DistDataset from its pickled handle through the fabric
(methods 1 and 2, no MPI in the worker) and read every sample; method 0 refuses clearly."""

import pytest
from conftest import run_procs

pytest.importorskip("torch")


def test_spawn_and_forkserver_workers_read_every_sample(handshake_dir):
    # method 1 with spawn workers reads every remote row through tcp;ofi_rxm (DDSTORE_SHM=0);
    # method 2 with forkserver workers maps same-node shares from the owners' memfds.
    env = {
        "DDSTORE_HANDSHAKE_DIR": handshake_dir,
        "DDSTORE_MPI": "0",
        "DDSTORE_FABRIC": "tcp",
        "OMP_NUM_THREADS": "1",
    }
    procs = run_procs(2, "start_methods.py", "1:spawn:0", "2:forkserver:1", env=env, timeout=300)
    for rank, p in enumerate(procs):
        for method, ctx in ((1, "spawn"), (2, "forkserver")):
            assert f"start method {ctx} ok: method {method} rank {rank} read 600 samples" in p.stdout, (
                p.stdout
            )
    assert "method 0 -> ForkedWorkerError" in procs[0].stdout
