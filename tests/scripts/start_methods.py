"""DataLoader workers started with spawn or forkserver read a DistDataset (method 1 or 2)
re-attached from its pickled handle; every sample is checked against the source, and no worker
initialised MPI. Without MPI, two comm=None stores and two DistDatasets (train, validation) live
at once in each process first.

argv: method:context:shm ... (e.g. 1:spawn:0 2:forkserver:1), all in one job. Run as plain
processes with the file communicator (run_procs), or under mpirun through start_methods_mpi.py
(which imports mpi4py at the top, as user scripts do)."""

import os
import pickle
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset, default_collate

N = 600


def source():
    x = torch.arange(N * 6, dtype=torch.float32).reshape(N, 6) * 0.25 - 7
    return TensorDataset(x, torch.arange(N))


def mpi_initialised() -> bool:
    mpi = sys.modules.get("mpi4py.MPI")
    return mpi is not None and mpi.Is_initialized()


def collate_in_worker(batch):
    """default_collate, plus the worker's pid and whether it initialised MPI (it must not)."""
    return default_collate(batch), os.getpid(), mpi_initialised()


def two_live_stores_and_datasets():
    """Two comm=None stores, then a train and a validation DistDataset, alive at once in each
    process (file communicator; the test sets DDSTORE_JOB_ID): every read checked."""
    import numpy as np
    from pyddstore.torch import DistDataset

    import pyddstore

    stores = [pyddstore.PyDDStore(None, method=1) for _ in range(2)]
    for k, st in enumerate(stores):
        assert st.comm_kind == "file" and st.size == 2, (st.comm_kind, st.size)
        st.add("v", np.full((3, 2), 10 * k + st.rank, np.int32))
    for k, st in enumerate(stores):
        out = np.empty((6, 2), np.int32)
        st.get_batch("v", out, np.arange(6)[::-1])
        assert out[:, 0].tolist() == [10 * k + 1] * 3 + [10 * k] * 3, (k, out)
    src = source()
    val = TensorDataset(src.tensors[0][:50] * -1, torch.arange(50))
    train, valid = DistDataset(src, "train", method=1), DistDataset(val, "val", method=1)
    for i in (0, N - 1):  # rows of both ranks
        assert torch.equal(train[i][0], src.tensors[0][i]), i
    for i in (0, 49):
        assert torch.equal(valid[i][0], val.tensors[0][i]), i
    for obj in (train, valid, *stores):
        obj.free()
    print(f"two live stores ok: rank {stores[0].rank}", flush=True)


def read_all(method: int, ctx: str, shm: str) -> tuple:
    """A DistDataset of `method` read in full by DataLoader workers of start method `ctx`."""
    from pyddstore.torch import DistDataset

    os.environ["DDSTORE_SHM"] = shm  # read by the stores this process and its workers make
    src = source()
    ds = DistDataset(src, f"sm{method}", method=method)
    assert ds.ddstore.size == 2, ds.ddstore.size
    # spawn starts every worker from scratch (a torch import each): one is enough to show it
    workers = 1 if ctx == "spawn" else 2
    loader = DataLoader(
        ds,
        batch_size=32,
        shuffle=True,
        num_workers=workers,
        multiprocessing_context=ctx,
        collate_fn=collate_in_worker,
    )
    seen, pids = [], set()
    for (x, y), pid, worker_mpi in loader:  # every sample, half of them owned by the other rank
        assert torch.equal(x, src.tensors[0][y]), y
        assert pid != os.getpid() and not worker_mpi, (pid, worker_mpi)
        seen += y.tolist()
        pids.add(pid)
    rank = ds.ddstore.rank
    assert sorted(seen) == list(range(N)), f"rank {rank}: {len(seen)} samples"
    assert len(pids) == workers, pids  # every worker read
    return ds, src, rank, len(seen)


def main():
    from pyddstore.torch import DistDataset, ForkedWorkerError

    import pyddstore

    if "mpi4py.MPI" not in sys.modules:
        two_live_stores_and_datasets()
    # argv: method:context:shm ... e.g. 1:spawn:0 2:forkserver:1
    for spec in sys.argv[1:]:
        method, ctx, shm = spec.split(":")
        method = int(method)
        ds, src, rank, n_read = read_all(method, ctx, shm)
        # The handle itself: a round trip in this process reads the same rows.
        again = pickle.loads(pickle.dumps(ds))
        assert torch.equal(again[N - 1][0], src.tensors[0][N - 1])
        again.free()
        if method == 1:  # a ragged field (variable-length tensor per sample) travels in the handle
            seqs = [(torch.arange(i % 7 + 1, dtype=torch.int64) * i, i) for i in range(N)]
            rag = DistDataset(seqs, f"rag{method}", method=method, ragged={0: 0})
            back = pickle.loads(pickle.dumps(rag))
            for i in range(0, N, 7):  # rows of both ranks
                seq, label = back[i]
                assert torch.equal(seq, seqs[i][0]) and int(label) == i, (i, seq)
            back.free()
            rag.free()
        ds.ddstore.barrier()
        ds.free()
        print(f"start method {ctx} ok: method {method} rank {rank} read {n_read} samples", flush=True)
    if os.environ.get("SLURM_PROCID") == "0":
        lone = DistDataset(source(), "m0", comm=pyddstore._native.Comm.single(), method=0)
        try:
            pickle.dumps(lone)
        except ForkedWorkerError as e:
            assert "method=0" in str(e) and "ThreadDataLoader" in str(e), e
            print("method 0 -> ForkedWorkerError")
        else:
            raise AssertionError("a method=0 dataset must not pickle")
        lone.free()


if __name__ == "__main__":
    main()
