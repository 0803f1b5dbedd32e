"""ThreadDataLoader against torch's DataLoader, in this process (no store needed): same batches
in the same order for the same arguments and seed, prefetch depth, persistent workers, worker
info, exceptions, close()."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch
from pyddstore.torch import ThreadDataLoader, get_worker_info
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
)
from torch.utils.data.distributed import DistributedSampler


class Samples(Dataset):
    """(features, label, worker id, worker seed)."""

    def __init__(self, n: int = 23):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        info = torch.utils.data.get_worker_info()
        wid, seed = (-1, -1) if info is None else (info.id, info.seed)
        return torch.arange(3, dtype=torch.float32) + i, i, wid, seed


def _same(a, b) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), (a, b)
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _same(a[k], b[k])
    else:
        assert a == b, (a, b)


def _epochs(cls, ds, n_epochs: int, seed: int, **kw):
    torch.manual_seed(seed)  # default samplers and the base seed draw from the global generator
    loader = cls(ds, **kw)
    out = [list(loader) for _ in range(n_epochs)]
    if isinstance(loader, ThreadDataLoader):
        loader.close()
    return out


GRID = [
    {"batch_size": 4},
    {"batch_size": 4, "shuffle": True},
    {"batch_size": 5, "shuffle": True, "drop_last": True, "num_workers": 1},
    {"batch_size": 3, "shuffle": True, "num_workers": 3, "prefetch_factor": 1},
    {"batch_size": 4, "shuffle": True, "num_workers": 3, "prefetch_factor": 3, "persistent_workers": True},
    {"batch_size": 2, "num_workers": 1, "persistent_workers": True},
    {"batch_size": 4, "sampler": "random", "num_workers": 3},
    {"batch_sampler": "batch", "num_workers": 3},
    {"batch_size": None, "shuffle": True, "num_workers": 1},
    {"batch_size": 4, "shuffle": True, "num_workers": 3, "generator": 5},
    {"batch_size": 4, "shuffle": True, "generator": 5},
    {"batch_size": 6, "sampler": "dist", "num_workers": 3, "drop_last": True},
]


def _build(kw: dict, ds) -> dict:
    kw = dict(kw)
    if kw.get("generator") is not None:
        kw["generator"] = torch.Generator().manual_seed(kw["generator"])
    if kw.get("sampler") == "random":
        kw["sampler"] = RandomSampler(ds, generator=torch.Generator().manual_seed(3))
    elif kw.get("sampler") == "dist":
        kw["sampler"] = DistributedSampler(ds, num_replicas=2, rank=1, shuffle=True, seed=9)
    if kw.get("batch_sampler") == "batch":
        kw["batch_sampler"] = BatchSampler(SequentialSampler(ds), 4, drop_last=False)
    return kw


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("kw", GRID, ids=[str(i) for i in range(len(GRID))])
def test_same_batches_as_dataloader(kw):
    ds = Samples()
    want = _epochs(DataLoader, ds, 2, 11, **_build(kw, ds))
    got = _epochs(ThreadDataLoader, ds, 2, 11, **_build(kw, ds))
    assert len(want[0]) > 0
    _same(want, got)
    if kw.get("shuffle") and kw.get("generator") is None:
        labels = [[torch.as_tensor(b[1]).tolist() for b in epoch] for epoch in got]
        assert labels[0] != labels[1]


def test_len_and_argument_checks():
    ds = Samples()
    assert len(ThreadDataLoader(ds, batch_size=4)) == len(DataLoader(ds, batch_size=4))
    with pytest.raises(ValueError, match="mutually exclusive"):
        ThreadDataLoader(ds, batch_size=4, shuffle=True, sampler=SequentialSampler(ds))
    with pytest.raises(ValueError, match="persistent_workers"):
        ThreadDataLoader(ds, persistent_workers=True)
    with pytest.raises(TypeError, match="reuse_buffers"):
        ThreadDataLoader(ds, batch_size=4, reuse_buffers=True)


def test_distributed_sampler_set_epoch_and_persistent_workers():
    ds = Samples(40)
    sampler = DistributedSampler(ds, num_replicas=3, rank=2, shuffle=True, seed=1)
    loaders = [
        DataLoader(ds, batch_size=4, sampler=sampler, num_workers=2, persistent_workers=True),
        ThreadDataLoader(ds, batch_size=4, sampler=sampler, num_workers=2, persistent_workers=True),
    ]
    runs = []
    for loader in loaders:
        torch.manual_seed(0)
        epochs = []
        for epoch in range(3):
            sampler.set_epoch(epoch)
            epochs.append([b[1].tolist() for b in loader])
        runs.append(epochs)
    assert runs[0] == runs[1]
    assert runs[1][0] != runs[1][1]  # reshuffled per epoch with persistent workers
    loaders[1].close()


def test_persistent_workers_after_a_partial_epoch():
    ds = Samples(30)
    results = []
    for cls in (DataLoader, ThreadDataLoader):
        torch.manual_seed(4)
        loader = cls(ds, batch_size=3, shuffle=True, num_workers=2, persistent_workers=True)
        it = iter(loader)
        first = [next(it)[1].tolist(), next(it)[1].tolist()]
        rest = [b[1].tolist() for b in loader]  # new epoch while the old one had batches in flight
        results.append((first, rest))
        if cls is ThreadDataLoader:
            loader.close()
    assert results[0] == results[1]
    assert sorted(i for batch in results[1][1] for i in batch) == list(range(30))


def test_independent_iterators():
    ds = Samples(12)
    loader = ThreadDataLoader(ds, batch_size=4, num_workers=2)
    a, b = iter(loader), iter(loader)
    got_a = [x[1].tolist() for x in a]
    got_b = [x[1].tolist() for x in b]
    assert got_a == got_b == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]


def test_in_order_false_yields_every_batch():
    ds = Samples(25)
    got = list(ThreadDataLoader(ds, batch_size=2, num_workers=3, in_order=False))
    assert sorted(i for b in got for i in b[1].tolist()) == list(range(25))


class Counting(Dataset):
    """Counts batch fetches started; each fetch takes a moment."""

    def __init__(self, n: int):
        self.n = n
        self.started = 0
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        return i

    def __getitems__(self, indices):
        with self.lock:
            self.started += 1
        time.sleep(0.002)
        return list(indices)


@pytest.mark.parametrize(("workers", "factor"), [(1, 2), (3, 2), (2, 4)])
def test_prefetch_depth(workers, factor):
    ds = Counting(40)
    depth = workers * factor
    n_batches = 20
    seen = 0
    for seen, _ in enumerate(
        ThreadDataLoader(ds, batch_size=2, num_workers=workers, prefetch_factor=factor), 1
    ):
        want = min(n_batches, seen + depth)
        deadline = time.monotonic() + 5
        while ds.started < want and time.monotonic() < deadline:  # the workers may run ahead this far...
            time.sleep(0.005)
        time.sleep(0.02)
        with ds.lock:
            started = ds.started
        assert started == want, (seen, started)  # ...and no further
    assert seen == n_batches


def test_num_workers_zero_reads_in_calling_thread():
    ds = Counting(8)
    loader = ThreadDataLoader(ds, batch_size=4)
    it = iter(loader)
    time.sleep(0.05)
    assert ds.started == 0
    next(it)
    assert ds.started == 1


class Failing(Dataset):
    def __len__(self) -> int:
        return 20

    def __getitem__(self, i):
        if i == 13:
            raise_bad_sample(i)
        return i


def raise_bad_sample(i):
    raise KeyError(f"bad sample {i}")


@pytest.mark.parametrize("workers", [0, 2])
def test_worker_exception_reraised_with_traceback(workers):
    loader = ThreadDataLoader(Failing(), batch_size=2, num_workers=workers)
    with pytest.raises(KeyError) as info:
        list(loader)
    msg = str(info.value)
    assert "bad sample 13" in msg
    if workers:
        assert "ThreadDataLoader worker thread 0" in msg  # batch 6 goes to worker 6 % 2
        assert "raise_bad_sample" in msg  # the original traceback


def test_worker_init_fn_error():
    def init(wid):
        raise RuntimeError(f"init of {wid} failed")

    with pytest.raises(RuntimeError, match="init of 0 failed"):
        list(ThreadDataLoader(Samples(), batch_size=2, num_workers=1, worker_init_fn=init))


def test_worker_info_per_thread():
    seen = {}

    class Info(Dataset):
        def __len__(self):
            return 12

        def __getitem__(self, i):
            info = torch.utils.data.get_worker_info()
            seen[i] = (
                threading.current_thread().name,
                info.id,
                info.num_workers,
                info.dataset is ds,
                info.seed,
            )
            return i

    ds = Info()
    inits = []
    torch.manual_seed(3)
    loader = ThreadDataLoader(ds, batch_size=3, num_workers=2, worker_init_fn=lambda w: inits.append(w))
    list(loader)
    assert sorted(inits) == [0, 1]
    # Outside worker threads: None from pyddstore's (torch's is None too once no loader's
    # threads live; persistent loaders of earlier tests may still be alive here).
    assert get_worker_info() is None
    for i, (name, wid, nw, same, _) in seen.items():
        assert nw == 2 and same
        assert wid == (i // 3) % 2 and name == f"ddstore-loader-{wid}"
    seeds = {v[1]: v[4] for v in seen.values()}
    assert seeds[1] == seeds[0] + 1


class Shards(IterableDataset):
    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        wid, nw = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(wid, 17, nw))


def test_iterable_dataset():
    want = sorted(i for b in DataLoader(Shards(), batch_size=4, num_workers=2) for i in b.tolist())
    got = sorted(i for b in ThreadDataLoader(Shards(), batch_size=4, num_workers=2) for i in b.tolist())
    assert want == got == list(range(17))


def test_close_stops_workers():
    before = set(threading.enumerate())
    loader = ThreadDataLoader(Samples(40), batch_size=2, num_workers=3, persistent_workers=True)
    it = iter(loader)
    next(it)
    workers = [t for t in threading.enumerate() if t not in before and t.name.startswith("ddstore-loader")]
    assert len(workers) == 3
    loader.close()
    assert not any(t.is_alive() for t in workers)
    assert [b[1].tolist() for b in loader][:2] == [[0, 1], [2, 3]]  # usable again after close
    loader.close()


def test_affinity(monkeypatch):
    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no sched_getaffinity")
    cpus = sorted(os.sched_getaffinity(0))
    monkeypatch.setenv("DDSTORE_AFFINITY_WIDTH", "1")
    monkeypatch.setenv("DDSTORE_AFFINITY_OFFSET", "1")
    seen = {}

    class Where(Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            seen[torch.utils.data.get_worker_info().id] = os.sched_getaffinity(0)
            return i

    list(ThreadDataLoader(Where(), batch_size=2, num_workers=2))
    assert seen[0] == {cpus[1 % len(cpus)]}
    assert seen[1] == {cpus[2 % len(cpus)]}
    assert os.sched_getaffinity(0) == set(cpus)  # the calling thread is untouched


def test_timeout():
    class Slow(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            time.sleep(0.5)
            return i

    loader = ThreadDataLoader(Slow(), batch_size=2, num_workers=1, timeout=0.1)
    with pytest.raises(RuntimeError, match="timed out"):
        list(loader)
    loader.close()


IMPORT_LEAVES_TORCH = r"""
import threading
import torch.utils.data as tud
from torch.utils.data import dataloader, get_worker_info as bound  # bound by name, the usual idiom
from torch.utils.data._utils import worker
torchs, code, names = tud.get_worker_info, tud.get_worker_info.__code__, set(vars(worker))
import pyddstore.torch as pt
from pyddstore.torch import ThreadDataLoader, get_worker_info
def untouched():
    same = all(m.get_worker_info is torchs for m in (tud, worker, dataloader))
    return same and torchs.__code__ is code and set(vars(worker)) == names and worker._worker_info is None
assert untouched(), "importing pyddstore.torch changed torch's get_worker_info"
seen = {}
class Info(tud.Dataset):
    def __len__(self):
        return 8
    def __getitem__(self, i):
        a, b, c = tud.get_worker_info(), pt.get_worker_info(), bound()
        seen[i] = (a.id, a.num_workers, b.id, c.id, threading.current_thread().name)
        return i
class Shards(tud.IterableDataset):  # shards by the name-bound function
    def __iter__(self):
        info = bound()
        return iter(range(info.id, 9, info.num_workers))
loader = ThreadDataLoader(Info(), batch_size=2, num_workers=2)
assert untouched(), "a loader that has not started changes nothing"
batches = [b.tolist() for b in loader]
assert batches == [[0, 1], [2, 3], [4, 5], [6, 7]], batches
for i, (wid, nw, wid2, wid3, name) in seen.items():
    assert (wid, nw, wid2, wid3) == ((i // 2) % 2, 2, (i // 2) % 2, (i // 2) % 2), seen
    assert name == f"ddstore-loader-{wid}", seen
sharded = [i for b in ThreadDataLoader(Shards(), batch_size=2, num_workers=3) for i in b.tolist()]
assert sorted(sharded) == list(range(9)), sharded
assert tud.get_worker_info() is None and pt.get_worker_info() is None and bound() is None
assert untouched(), "torch's get_worker_info not restored once the loader's threads stopped"
# Persistent workers keep the proxy while they live; torch's function keeps its code. Other
# threads (here the main one) get one worker of one from torch, None from pyddstore's.
loader = ThreadDataLoader(Info(), batch_size=4, num_workers=1, persistent_workers=True)
list(loader); list(loader)
assert not untouched() and torchs.__code__ is code and set(vars(worker)) == names
main = tud.get_worker_info()
assert (main.id, main.num_workers, bound().id) == (0, 1, 0) and pt.get_worker_info() is None
loader.close()
assert untouched()
print("ok")
"""


def test_import_leaves_torch_untouched_and_worker_threads_get_their_info():
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", IMPORT_LEAVES_TORCH], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


EXIT_SCRIPT = r"""
import atexit, sys, threading

def report():  # registered first, so it runs last: after pyddstore's own exit handlers
    alive = [t.name for t in threading.enumerate() if t.name.startswith("ddstore-loader") and t.is_alive()]
    sys.stdout.write(f"alive-at-exit {len(alive)}\n")
    sys.stdout.flush()

atexit.register(report)
import numpy as np
import pyddstore
from pyddstore.torch import ThreadDataLoader, get_worker_info

store = pyddstore.PyDDStore(None, method=1, handshake_dir=sys.argv[1])
rows = np.arange(4000 * 256, dtype=np.float32).reshape(4000, 256)
store.add("x", rows)

class Rows:
    def __len__(self):
        return 4000

    def __getitem__(self, i):
        out = np.empty((1, 256), np.float32)
        store.get("x", out, i)
        return out[0]

loader = ThreadDataLoader(Rows(), batch_size=8, num_workers=2, prefetch_factor=8)
it = iter(loader)
batch = next(it)
assert np.array_equal(batch.numpy(), rows[:8]), batch
# exits with the workers reading and no close()
"""


def test_exit_with_live_worker_threads_stops_them_first(tmp_path):
    """An iterator left running at interpreter exit: its workers are stopped before the stores
    close (a daemon thread inside a native read at finalization would crash the process)."""
    import subprocess
    import sys

    env = {**os.environ, "DDSTORE_MPI": "0"}
    for var in ("OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS", "WORLD_SIZE", "PMI_SIZE"):
        env.pop(var, None)
    argv = [sys.executable, "-c", EXIT_SCRIPT, str(tmp_path)]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "alive-at-exit 0" in proc.stdout, proc.stdout + proc.stderr
