"""ThreadDataLoader(worker_type="process"): in this process, the same batches and worker seeds as
torch's DataLoader, iterable datasets and in_order=False; and (tests/scripts/proc_loader.py) a
core group of two plain processes (file communicator, no MPI) reading a method-1 DistDataset
through fork, spawn and forkserver workers (persistent or not, fixed and growing slot rings,
ragged and torch_geometric samples, raising and killed workers, method 0 refused), while a
separate job reads the group's method-2 dataset through a DistDatasetReader with worker
processes; and (tests/scripts/proc_faults.py) that forked workers populate the same-node
shares they read (their minor faults per batch counted)."""

from __future__ import annotations

import time

import pytest
from conftest import run_procs, start_procs

torch = pytest.importorskip("torch")
from pyddstore.torch import ThreadDataLoader  # noqa: E402
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset  # noqa: E402


class Samples(Dataset):
    """(features, label, worker id, worker seed): the seeds must match torch's workers' too."""

    def __len__(self) -> int:
        return 23

    def __getitem__(self, i: int):
        info = torch.utils.data.get_worker_info()
        return torch.arange(3, dtype=torch.float64) + i, i, info.id, info.seed


class Shards(IterableDataset):
    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        return iter(range(info.id, 17, info.num_workers))


def _epochs(cls, ds, **kw):
    torch.manual_seed(11)  # the default sampler and the base seed draw from the global generator
    loader = cls(ds, **kw)
    out = [[(b[0].tolist(), *(t.tolist() for t in b[1:])) for b in loader] for _ in range(2)]
    if isinstance(loader, ThreadDataLoader):
        loader.close()
    return out


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize(
    "kw",
    [
        {"batch_size": 4, "shuffle": True, "num_workers": 3, "prefetch_factor": 1},
        {"batch_size": 5, "shuffle": True, "num_workers": 2, "persistent_workers": True, "drop_last": True},
    ],
    ids=["3-workers", "persistent"],
)
def test_same_batches_and_seeds_as_dataloader(kw):
    want = _epochs(DataLoader, Samples(), **kw)
    assert want == _epochs(ThreadDataLoader, Samples(), worker_type="process", **kw)


def test_iterable_dataset_and_in_order_false():
    loader = ThreadDataLoader(Shards(), batch_size=4, num_workers=2, worker_type="process")
    assert sorted(i for b in loader for i in b.tolist()) == list(range(17))
    loader = ThreadDataLoader(Samples(), batch_size=2, num_workers=3, worker_type="process", in_order=False)
    assert sorted(i for b in loader for i in b[1].tolist()) == list(range(23))
    with pytest.raises(ValueError, match="worker_type"):
        ThreadDataLoader(Samples(), worker_type="greenlet")


class Slow(Dataset):
    """Sample 5 takes far longer than the loader's timeout (1 s)."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        if i == 5:
            time.sleep(5)
        return i


def test_tasks_larger_than_a_pipe_and_timeout():
    # 40,000 indices a task pickle to ~200 KB: more than a pipe holds (the task queues' feeder
    # threads write them in pieces while the workers read them).
    ds = TensorDataset(torch.arange(120_000) * 3)
    loader = ThreadDataLoader(ds, batch_size=40_000, num_workers=2, worker_type="process", prefetch_factor=3)
    got = torch.cat([b for (b,) in loader])
    assert torch.equal(got, torch.arange(120_000) * 3)
    loader = ThreadDataLoader(Slow(), batch_size=1, num_workers=1, worker_type="process", timeout=1)
    got, t = [], time.monotonic()
    with pytest.raises(RuntimeError, match="timed out after 1 seconds"):
        for b in loader:
            got.append(int(b))
    assert got == [0, 1, 2, 3, 4], got  # the batches before the late one
    assert time.monotonic() - t < 60, "a late batch must not hang the loader"


def test_process_workers_core_group_and_reader(handshake_dir):
    pytest.importorskip("torch_geometric")
    hs = str(handshake_dir)
    env = {
        "DDSTORE_FORK_WORKERS": "1",
        "DDSTORE_MPI": "0",
        "DDSTORE_FABRIC": "tcp",
        "DDSTORE_HANDSHAKE_DIR": hs,
        "OMP_NUM_THREADS": "1",
    }
    args = ("--comm", "file", "--hs", hs)
    core = start_procs(2, "proc_loader.py", "--part", "core", *args, env=env)
    try:
        reader = run_procs(1, "proc_loader.py", "--part", "reader", *args, env=env, timeout=400)[0]
    finally:
        (handshake_dir / "reader-done").touch()  # lets the core group finish either way
        outs = [p.communicate(timeout=400) for p in core]
    assert "reader: proc_loader ok" in reader.stdout
    assert "method-2 reader fork: 3 epochs ok" in reader.stdout
    for rank, (p, (out, err)) in enumerate(zip(core, outs)):
        assert p.returncode == 0, f"core rank {rank} failed\n{out}\n{err}"
        for what in ("fork", ("forkserver views", "spawn ragged")[rank], "torch_geometric fork"):
            assert f"rank {rank}: {what}: 3 epochs ok" in out, out
        assert "worker behaviour ok" in out and "held batches ok" in out, out
        assert f"rank {rank}: kept workers ok" in out, out
        assert f"core rank {rank}: proc_loader ok" in out, out


def test_forked_workers_populate_same_node_shares(handshake_dir):
    # fork() copies no page tables of shared mappings: a worker that did not populate the
    # same-node shares faulted 28-29 times per batch of 64 x 48 KiB rows here, 0.1-0.2 with them.
    hs = str(handshake_dir)
    env = {
        "DDSTORE_FORK_WORKERS": "1",
        "DDSTORE_MPI": "0",
        "DDSTORE_FABRIC": "tcp",
        "DDSTORE_HANDSHAKE_DIR": hs,
        "OMP_NUM_THREADS": "1",
    }
    procs = run_procs(2, "proc_faults.py", "--comm", "file", "--hs", hs, env=env, timeout=300)
    for rank, p in enumerate(procs):
        assert f"rank {rank}: proc_faults ok" in p.stdout, p.stdout
        assert f"rank {rank}: workers' minor faults per batch" in p.stdout, p.stdout
