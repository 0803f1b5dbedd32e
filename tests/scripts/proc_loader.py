"""ThreadDataLoader(worker_type="process"): every sample of 3 epochs (DistributedSampler,
set_epoch) checked against its index and content, in the sampler's order, for fork, spawn and
forkserver workers, persistent or not (or kept between epochs: the direct path, no
worker_init_fn), copies and views (reuse_buffers=True), the direct read
path and the pickled one (custom collate, ragged fields, torch_geometric batches); views stay
within the slot rings and a held batch is never overwritten; get_worker_info, worker_init_fn, a
raising worker (traceback re-raised) and a killed worker (named, no hang); method 0 refused.

    python proc_loader.py --part core --comm file --hs DIR    (2 plain processes: method 1 and
                                                              a method-2 core group)
    python proc_loader.py --part reader --comm file --hs DIR  (a DistDatasetReader job)
"""

from __future__ import annotations

import collections
import os
import signal
import time

import numpy as np
import torch
import torch_common as tc
from torch.utils.data import Dataset, get_worker_info

N = 96
EPOCHS = 3
DONE_NAME = "reader-done"


def x_of(i: int) -> torch.Tensor:
    return torch.arange(35, dtype=torch.float32).reshape(5, 7) * (i + 1) - i


class Src(Dataset):
    """(float32 (5, 7) tensor, the index, an int32 array) per sample."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        return x_of(i), i, np.arange(4, dtype=np.int32) * i


class Ragged(Dataset):
    """(a variable-length int64 sequence, the index) per sample."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        return torch.arange(i % 9 + 1, dtype=torch.int64) * (i + 3), i


def keep_numpy(batch):
    """A custom collate (the pickled path): a dict with a tensor, a numpy array and a list."""
    return {
        "x": torch.stack([s[0] for s in batch]),
        "i": [int(s[1]) for s in batch],
        "a": np.stack([np.asarray(s[2]) for s in batch]),
    }


def cat_ragged(batch):
    seqs = [s[0] for s in batch]
    return torch.cat(seqs), torch.tensor([len(s) for s in seqs]), torch.tensor([int(s[1]) for s in batch])


def check_tuple(batch) -> list:
    x, y, a = batch
    idx = y.tolist()
    for k, i in enumerate(idx):
        assert torch.equal(x[k], x_of(i)), i
        assert a[k].tolist() == (np.arange(4) * i).tolist(), i
    return idx


def check_dict(batch) -> list:
    assert isinstance(batch["a"], np.ndarray) and batch["a"].dtype == np.int32, type(batch["a"])
    for k, i in enumerate(batch["i"]):
        assert torch.equal(batch["x"][k], x_of(i)), i
        assert batch["a"][k].tolist() == (np.arange(4) * i).tolist(), i
    return batch["i"]


def check_ragged(batch) -> list:
    flat, lengths, idx = batch
    for seq, i in zip(torch.split(flat, lengths.tolist()), idx.tolist()):
        assert torch.equal(seq, Ragged()[i][0]), i
    return idx.tolist()


def epochs(world, ds, check, what, held=0, **kw):
    """EPOCHS epochs of this rank's DistributedSampler part, each sample checked, in order.
    held: the last `held` batches are kept and re-checked after every batch (a reused slot
    would overwrite them). Returns the slot addresses tensors were viewed at."""
    from pyddstore.torch import ThreadDataLoader
    from torch.utils.data.distributed import DistributedSampler

    sampler = DistributedSampler(ds, num_replicas=world.size, rank=world.rank, shuffle=True, seed=3)
    loader = ThreadDataLoader(ds, batch_size=8, sampler=sampler, worker_type="process", **kw)
    bases, t0 = set(), time.monotonic()
    for e in range(EPOCHS):
        sampler.set_epoch(e)
        seen, kept = [], collections.deque(maxlen=held or 1)
        for batch in loader:
            seen += check(batch)
            first = batch[0] if isinstance(batch, (tuple, list)) else batch["x"]
            bases.add(first.untyped_storage().data_ptr())
            if held:
                kept.append(batch)
                for b in kept:
                    check(b)
        assert seen == list(sampler), f"{what}: epoch {e} read {seen}, the sampler drew {list(sampler)}"
    loader.close()
    print(f"rank {world.rank}: {what}: {EPOCHS} epochs ok ({time.monotonic() - t0:.1f} s)", flush=True)
    return bases


# -- worker behaviour -------------------------------------------------------------------------

INIT = {"wid": None}


def mark_init(wid):
    INIT["wid"] = wid


class Info(Dataset):
    """Samples report the worker: (index, id, num_workers, seed, pid, worker_init_fn's mark)."""

    def __len__(self):
        return 40

    def __getitem__(self, i):
        info = get_worker_info()
        return torch.tensor([i, info.id, info.num_workers, info.seed, os.getpid(), INIT["wid"]])


class Faulty(Dataset):
    """Raises (mode 'raise') or kills its worker (mode 'kill') at sample 13."""

    def __init__(self, mode):
        self.mode = mode

    def __len__(self):
        return 40

    def __getitem__(self, i):
        if i == 13:
            _decode_sample(self.mode, i)
        return torch.full((3,), float(i))


def _decode_sample(mode, i):
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise ValueError(f"sample {i} cannot be decoded")


def worker_behaviour(world):
    from pyddstore.torch import ThreadDataLoader, WorkerProcessError

    loader = ThreadDataLoader(
        Info(),
        batch_size=4,
        num_workers=2,
        worker_type="process",
        worker_init_fn=mark_init,
        persistent_workers=True,
    )
    for _ in zip(range(3), loader):  # an epoch left early: its batches in flight are dropped
        pass
    rows = torch.cat(list(loader)).tolist()
    assert sorted(r[0] for r in rows) == list(range(40)), rows
    seeds = {}
    for _, wid, nw, seed, pid, mark in rows:
        assert nw == 2 and mark == wid and pid != os.getpid(), rows
        assert seeds.setdefault(wid, seed) == seed
    assert sorted(seeds) == [0, 1] and seeds[1] == seeds[0] + 1, seeds
    loader.close()

    loader = ThreadDataLoader(Faulty("raise"), batch_size=4, num_workers=2, worker_type="process")
    got = []
    try:
        for b in loader:
            got.append(b)
    except ValueError as e:
        msg = str(e)
        assert "sample 13 cannot be decoded" in msg and "Original Traceback" in msg, msg
        assert "_decode_sample" in msg and "worker process 1" in msg, msg
    else:
        raise AssertionError("the worker's exception was not re-raised")
    assert len(got) == 3, len(got)  # batches 0..2 came before the one that failed
    loader.close()

    loader = ThreadDataLoader(Faulty("kill"), batch_size=4, num_workers=2, worker_type="process")
    t = time.monotonic()
    e = tc.raises(WorkerProcessError, lambda: list(loader), "worker process 1 (pid", "SIGKILL")
    assert time.monotonic() - t < 120, "a killed worker must not hang the loader"
    loader.close()
    print(f"rank {world.rank}: worker behaviour ok ({e})", flush=True)


def held_batches(world, ds):
    """Batches kept beyond the ring: with reuse_buffers=True the ring's slots run out with a
    clear error; by default the ring grows a slot per kept batch and shrinks back once they are
    gone. No kept batch is ever overwritten."""
    from pyddstore.torch import ThreadDataLoader

    from pyddstore import DDStoreValueError

    kw = {"batch_size": 8, "num_workers": 1, "worker_type": "process", "prefetch_factor": 2}
    loader = ThreadDataLoader(ds, reuse_buffers=True, **kw)
    kept = []
    e = tc.raises(DDStoreValueError, lambda: [kept.append(b) for b in loader], "all 4 slots")
    assert len(kept) == 4, len(kept)  # prefetch_factor + 2 slots
    for b in kept:
        check_tuple(b)
    loader.close()
    loader = ThreadDataLoader(ds, persistent_workers=True, **kw)
    whole = list(loader)  # the whole epoch held at once
    assert sorted(i for b in whole for i in check_tuple(b)) == list(range(N))
    kept.clear()
    del whole, b
    for b in loader:  # a plain epoch: the extra slots are dropped as soon as they are free
        check_tuple(b)
    slots = len(loader._iterator._rings[0].memory)
    assert slots <= 4, f"the ring kept {slots} slots"
    loader.close()
    print(f"rank {world.rank}: held batches ok ({e})", flush=True)


def kept_workers(world, ds):
    """persistent_workers=False over a DistDataset read straight into the slots: the worker
    processes are kept between epochs (the same pids), every batch still right, and each
    iter(loader) draws the same base seed and global random numbers as when new workers start
    every epoch (a worker_init_fn: something of the caller's runs in them, so they do)."""
    from pyddstore.torch import ThreadDataLoader
    from torch.utils.data.distributed import DistributedSampler

    def run(**kw):
        torch.manual_seed(7)
        sampler = DistributedSampler(ds, num_replicas=world.size, rank=world.rank, shuffle=True, seed=3)
        kw.update(batch_size=8, sampler=sampler, num_workers=2, worker_type="process")
        loader = ThreadDataLoader(ds, **kw)
        pids, seeds = [], []
        for e in range(EPOCHS):
            sampler.set_epoch(e)
            it = iter(loader)
            pids.append(tuple(w.pid for w in it._workers))
            seeds.append(it._base_seed)
            seen = [i for batch in it for i in check_tuple(batch)]
            assert seen == list(sampler), f"epoch {e} read {seen}, the sampler drew {list(sampler)}"
        for _ in zip(range(2), loader):  # an epoch left early: the next one starts new workers
            pass
        it = iter(loader)
        pids.append(tuple(w.pid for w in it._workers))
        assert sorted(i for b in it for i in check_tuple(b)) == sorted(sampler)
        loader.close()
        return pids, seeds, torch.rand(3).tolist()

    kept, seeds, draws = run()
    assert len(set(kept[:EPOCHS])) == 1 and kept[EPOCHS] != kept[0], f"worker pids by epoch: {kept}"
    fresh, fresh_seeds, fresh_draws = run(worker_init_fn=mark_init)
    assert len(set(fresh)) == len(fresh), f"worker pids by epoch with a worker_init_fn: {fresh}"
    assert (seeds, draws) == (fresh_seeds, fresh_draws), (seeds, fresh_seeds, draws, fresh_draws)
    print(f"rank {world.rank}: kept workers ok (pids {kept})", flush=True)


def graphs(world):
    from pyddstore.torch import DistDataset
    from torch_geometric.data import Batch, Data

    def graph(i):
        g = torch.Generator().manual_seed(i)
        n = i % 5 + 1
        return Data(
            x=torch.randn(n, 3, generator=g), edge_index=torch.randint(0, n, (2, i % 4), generator=g), y=i
        )

    ds = DistDataset([graph(i) for i in range(N)], "pl_graphs", comm=world.comm, method=1)

    def check(batch):
        assert isinstance(batch, Batch), type(batch)
        idx = batch.y.tolist()
        for i, g in zip(idx, batch.to_data_list()):
            want = graph(i)
            assert torch.equal(g.x, want.x) and torch.equal(g.edge_index, want.edge_index), i
        return idx

    epochs(world, ds, check, "torch_geometric fork", num_workers=2, collate_fn=Batch.from_data_list)
    ds.free()


def core(a):
    from pyddstore.torch import DistDataset, ForkedWorkerError, ThreadDataLoader

    from pyddstore import _native

    world = tc.World(a)
    ds = DistDataset(Src(), "pl_m1", comm=world.comm, method=1)
    rag = DistDataset(Ragged(), "pl_rag", comm=world.comm, method=1, ragged={0: 0})
    m2 = DistDataset(Src(), "pl_m2", comm=world.comm, method=2, handshake_dir=a.hs)
    # fork, read straight into the slots: the workers are kept between epochs (kept_workers)
    epochs(world, ds, check_tuple, "fork", num_workers=2)
    kept_workers(world, ds)
    if world.rank == 0:  # forkserver, persistent, views of the slots, held batches re-checked
        bases = epochs(
            world,
            ds,
            check_dict,
            "forkserver views",
            held=2,
            num_workers=2,
            persistent_workers=True,
            reuse_buffers=True,
            collate_fn=keep_numpy,
            multiprocessing_context="forkserver",
        )
        assert len(bases) <= 2 * 4, f"views of {len(bases)} memory blocks: not the slot rings"
    else:  # spawn, persistent, one worker, a ragged field (each start method once: they are slow)
        epochs(
            world,
            rag,
            check_ragged,
            "spawn ragged",
            num_workers=1,
            persistent_workers=True,
            collate_fn=cat_ragged,
            multiprocessing_context="spawn",
        )
    held_batches(world, ds)
    worker_behaviour(world)
    graphs(world)
    if world.rank == 0:
        lone = DistDataset(Src(), "pl_m0", comm=_native.Comm.single(), method=0)
        loader = ThreadDataLoader(lone, batch_size=4, num_workers=1, worker_type="process")
        tc.raises(ForkedWorkerError, lambda: iter(loader), "method=0", "worker_type='thread'")
        lone.free()
    deadline = time.monotonic() + 300
    while not os.path.exists(os.path.join(a.hs, DONE_NAME)):
        assert time.monotonic() < deadline, "the reader did not finish"
        time.sleep(0.1)
    world.barrier()
    for d in (m2, rag, ds):
        d.free()
    print(f"core rank {world.rank}: proc_loader ok", flush=True)


def reader(a):
    from pyddstore.torch import DistDatasetReader

    class One:
        rank, size = 0, 1

    rd = DistDatasetReader("pl_m2", handshake_dir=a.hs)
    epochs(One(), rd, check_tuple, "method-2 reader fork", num_workers=2, persistent_workers=True)
    print("reader: proc_loader ok", flush=True)


if __name__ == "__main__":
    args = tc.args()
    tc.run(lambda: core(args) if args.part == "core" else reader(args))
