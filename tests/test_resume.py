"""Loader and sampler state, in this process: exact resume at every stop point (ThreadDataLoader
with 0, 1, 4 worker threads, persistent or not), the unseen rest once on another rank count,
auto_epoch against manual set_epoch(), torch's own samplers, and every kind of bad state
refused with a DDStoreValueError; kept process workers (a DistDataset, no persistent_workers)
resume exactly too. The multi-process kill -9 runs are in test_resume_jobs.py."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from pyddstore.torch import DistDataset, DistributedSampler, ThreadDataLoader
from pyddstore.torch._state import epoch_order
from torch.utils.data import IterableDataset, TensorDataset

from pyddstore import DDStoreUnsupportedError, DDStoreValueError, Settings

N = 23
DS = TensorDataset(torch.arange(N) * 10, torch.arange(N))  # sample i: (10 i, i)


def ids_of(batch) -> list:
    x, y = batch
    assert torch.equal(x, y * 10), (x, y)  # contents of every sample
    return y.tolist()


def run(make, epochs=3, stop=None, state=None, manual=False):
    """(epoch, ids) of every batch over `epochs` epochs (from a loaded state's epoch on); with
    stop=k returns after the k-th batch, with the state (through JSON) taken right then."""
    sampler, loader = make()
    first = 0
    if state is not None:
        saved = json.loads(state)
        loader.load_state_dict(saved["loader"])
        first = saved["epoch"] + saved["done"]
    out = []
    try:
        for epoch in range(first, epochs):
            if manual:
                sampler.set_epoch(epoch)
            for batch in loader:
                out.append((sampler.epoch, ids_of(batch)))
                if stop is not None and len(out) == stop:
                    return out, json.dumps({"loader": loader.state_dict(), "epoch": epoch, "done": False})
        return out, json.dumps({"loader": loader.state_dict(), "epoch": epochs - 1, "done": True})
    finally:
        loader.close()


def tdl(workers, replicas=2, rank=1, auto=True, drop_last=False, batch_drop_last=False, **kw):
    """A pyddstore DistributedSampler (drop_last: its own) under a ThreadDataLoader
    (batch_drop_last: the loader's drop_last)."""

    def make():
        s = DistributedSampler(DS, num_replicas=replicas, rank=rank, seed=3, drop_last=drop_last)
        loader = ThreadDataLoader(
            DS, batch_size=3, sampler=s, num_workers=workers, auto_epoch=auto, drop_last=batch_drop_last, **kw
        )
        return s, loader

    return make


@pytest.mark.parametrize(
    ("workers", "auto", "extra"),
    [
        (0, True, {}),
        (1, False, {}),
        (4, True, {}),
        (2, True, {"persistent_workers": True}),
        (2, True, {"worker_type": "process", "multiprocessing_context": "fork", "persistent_workers": True}),
    ],
)
def test_exact_resume_at_every_batch(workers, auto, extra):
    full, _ = run(tdl(workers, auto=auto, **extra), manual=not auto)
    assert len({tuple(ids) for e, ids in full if e == 0} ^ {tuple(ids) for e, ids in full if e == 1}) > 0
    for stop in range(1, len(full) + 1):
        head, state = run(tdl(workers, auto=auto, **extra), stop=stop, manual=not auto)
        tail, _ = run(tdl(workers, auto=auto, **extra), state=state, manual=not auto)
        assert head + tail == full, (stop, head, tail)


def test_exact_resume_with_kept_process_workers(monkeypatch):
    """Process workers over a DistDataset without persistent_workers are kept between epochs
    (nothing of the caller's runs in them); a resume at an epoch's start, middle and end still
    yields exactly the rest, and the kept workers are those of the first epoch."""
    monkeypatch.setenv("FI_TCP_IFACE", "lo")
    ds = DistDataset(DS, "resume_kept", method="libfabric", settings=Settings.from_env(quiet=True))
    pids = []

    def make():
        s = DistributedSampler(ds, num_replicas=2, rank=1, seed=3)
        loader = ThreadDataLoader(
            ds, batch_size=3, sampler=s, num_workers=2, worker_type="process", auto_epoch=True
        )
        get = loader._get_iterator

        def noted():  # the worker pids of every iterator
            it = get()
            pids.append(tuple(w.pid for w in it._workers))
            return it

        loader._get_iterator = noted
        return s, loader

    try:
        full, _ = run(make)
        assert len(full) == 12 and len(set(pids)) == 1, (full, pids)
        for stop in (1, 2, 4, 5, 12):
            head, state = run(make, stop=stop)
            tail, _ = run(make, state=state)
            assert head + tail == full, (stop, head, tail)
    finally:
        ds.free()


def test_state_before_and_after_iterating():
    sampler, loader = tdl(1)()
    state = loader.state_dict()  # before any iteration: the start of epoch 0
    assert state["epoch"] == 0 and state["batches_yielded"] == 0 and not state["finished"]
    json.dumps(state)
    it = iter(loader)
    next(it)
    mid = loader.state_dict()
    assert mid["batches_yielded"] == 1 and mid["sampler"]["yielded"] == 3  # prefetched: not counted
    rest = [ids_of(b) for b in it]
    done = loader.state_dict()
    assert done["finished"] and done["batches_yielded"] == 1 + len(rest)
    loader.close()
    # A loaded state is what state_dict() says until the next iteration; {} loads nothing.
    _, again = tdl(0)()
    again.load_state_dict(mid)
    assert again.state_dict() == mid
    again.load_state_dict({})
    assert again.state_dict()["batches_yielded"] == 0
    again.load_state_dict(mid)
    assert [ids_of(b) for b in again] == rest
    again.close()


def test_auto_epoch_equals_manual_set_epoch():
    auto, _ = run(tdl(1, auto=True), epochs=4)
    manual, _ = run(tdl(1, auto=False), epochs=4, manual=True)
    assert auto == manual
    orders = [[i for e, ids in auto if e == k for i in ids] for k in range(4)]
    assert len({tuple(o) for o in orders}) == 4  # a new order every epoch
    # Without auto_epoch (and no set_epoch) every epoch repeats torch's first order.
    plain, _ = run(tdl(0, auto=False), epochs=2)
    assert [ids for e, ids in plain[: len(plain) // 2]] == [ids for e, ids in plain[len(plain) // 2 :]]


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize(("old", "new"), [(3, 2), (2, 3), (3, 1), (1, 4)])
def test_other_rank_count_covers_the_unseen_rest_once(old, new, drop_last):
    sizes = len(list(DistributedSampler(DS, num_replicas=old, rank=0, drop_last=drop_last)))
    for stop in range(0, sizes // 3 + 1):
        seen, states = [], []
        for r in range(old):  # epoch 1 of `old` ranks, each `stop` batches in
            s, loader = tdl(1, replicas=old, rank=r, drop_last=drop_last)()
            s.set_epoch(1)
            it = iter(loader)
            seen += [i for _, b in zip(range(stop), it) for i in ids_of(b)]
            states.append(json.loads(json.dumps(loader.state_dict())))
            loader.close()
        rest, nxt = [], []
        for r in range(new):
            s, loader = tdl(0, replicas=new, rank=r, drop_last=drop_last)()
            loader.load_state_dict(states[r % old])
            with pytest.raises(DDStoreValueError, match="ranks"):
                s.load_state_dict(states[r % old]["sampler"], exact=True)
            rest += [i for b in loader for i in ids_of(b)]
            assert s.epoch == 1
            nxt.append([i for b in loader for i in ids_of(b)])  # epoch 2: torch's, on `new` ranks
            assert s.epoch == 2
            loader.close()
        epoch = set(epoch_order(DS, old, 3, 1, True, drop_last))
        assert len(rest) == len(set(rest)) and set(rest) == epoch - set(seen), (stop, rest, seen)
        for r in range(new):
            ref = torch.utils.data.DistributedSampler(
                DS, num_replicas=new, rank=r, seed=3, drop_last=drop_last
            )
            ref.set_epoch(2)
            assert nxt[r] == list(ref)


def test_resize_twice_in_one_epoch():
    """3 ranks, then 2 (each a batch further), then 3 again: still every sample once."""
    seen, states = [], []
    for r in range(3):
        s, loader = tdl(0, replicas=3, rank=r)()
        it = iter(loader)
        seen += ids_of(next(it))
        states.append(loader.state_dict())
        loader.close()
    again = []
    for r in range(2):
        s, loader = tdl(0, replicas=2, rank=r)()
        loader.load_state_dict(states[r])
        it = iter(loader)
        seen += ids_of(next(it))
        again.append(loader.state_dict())
        loader.close()
    rest = []
    for r in range(3):
        s, loader = tdl(4, replicas=3, rank=r)()
        loader.load_state_dict(again[r % 2])
        rest += [i for b in loader for i in ids_of(b)]
        loader.close()
    assert len(seen + rest) == N and set(seen + rest) == set(range(N))


def test_epoch_order_is_torchs():
    for replicas in (1, 2, 3, 4, 5):
        for drop_last in (False, True):
            order = epoch_order(DS, replicas, 9, 4, True, drop_last)
            for r in range(replicas):
                ref = torch.utils.data.DistributedSampler(DS, replicas, r, seed=9, drop_last=drop_last)
                ref.set_epoch(4)
                assert order[r::replicas] == list(ref)


def test_sampler_order_is_torchs():
    """pyddstore's DistributedSampler yields torch's order for every split: shuffled or not,
    padded (also by more than the data set) or cut, empty, over several epochs."""
    for n in (0, 1, 2, 7, 23):
        data = list(range(n))
        for replicas in (1, 2, 3, 5):
            for shuffle in (True, False):
                for drop_last in (False, True):
                    for rank in range(replicas):
                        ours = DistributedSampler(data, replicas, rank, shuffle, seed=3, drop_last=drop_last)
                        ref = torch.utils.data.DistributedSampler(data, replicas, rank, shuffle, 3, drop_last)
                        for epoch in (0, 4):
                            ours.set_epoch(epoch)
                            ref.set_epoch(epoch)
                            assert list(ours) == list(ref), (n, replicas, rank, shuffle, drop_last, epoch)


def test_upcoming_is_what_the_iteration_yields_next():
    """upcoming(n): the next n indices of the running iteration, torch's order, fresh and after
    load_state_dict (a resumed iteration), without advancing it; nothing outside an iteration."""
    for drop_last in (False, True):
        ref = torch.utils.data.DistributedSampler(DS, 3, 1, seed=9, drop_last=drop_last)
        ref.set_epoch(2)
        want = list(ref)
        s = DistributedSampler(DS, num_replicas=3, rank=1, seed=9, drop_last=drop_last)
        s.set_epoch(2)
        assert s.upcoming(4) == []  # no iteration yet
        it, got = iter(s), []
        for k in range(len(want)):
            if k:  # the generator's body runs from the first next()
                assert s.upcoming(3) == want[k : k + 3], (drop_last, k)
            got.append(next(it))
            if k == 2:
                state = s.state_dict()
        assert got == want and s.upcoming(3) == []
        resumed = DistributedSampler(DS, num_replicas=3, rank=1, seed=9, drop_last=drop_last)
        resumed.load_state_dict(state)
        it = iter(resumed)
        assert next(it) == want[3] and resumed.upcoming(2) == want[4:6]
        assert [next(it) for _ in range(len(want) - 4)] == want[4:]


def test_torch_samplers_resume_exactly():
    """torch's DistributedSampler and a RandomSampler with a generator: the loader restores the
    epoch or the generator and skips the batches already yielded."""

    def dist():
        s = torch.utils.data.DistributedSampler(DS, num_replicas=2, rank=0, seed=5)
        return s, ThreadDataLoader(DS, batch_size=4, sampler=s, num_workers=2, auto_epoch=True)

    def rand():
        g = torch.Generator().manual_seed(8)
        loader = ThreadDataLoader(DS, batch_size=4, shuffle=True, generator=g, num_workers=1)
        loader.sampler.epoch = 0  # run() reports sampler.epoch
        return loader.sampler, loader

    for make in (dist, rand):
        full, _ = run(make)
        for stop in (1, 5, 6, 7, len(full) - 1):
            head, state = run(make, stop=stop)
            tail, _ = run(make, state=state)
            assert [ids for _, ids in head + tail] == [ids for _, ids in full], (make, stop)


def test_unrestorable_loaders_refused():
    loader = ThreadDataLoader(DS, batch_size=4, shuffle=True)  # torch's global generator
    with pytest.raises(DDStoreValueError, match="generator"):
        loader.state_dict()

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(5))

    with pytest.raises(DDStoreUnsupportedError, match="IterableDataset"):
        ThreadDataLoader(Stream(), batch_size=2).state_dict()
    with pytest.raises(DDStoreValueError, match="set_epoch"):
        ThreadDataLoader(DS, batch_size=2, auto_epoch=True)


def test_bad_states_refused():
    sampler, loader = tdl(0)()
    it = iter(loader)
    next(it)
    good = loader.state_dict()
    loader.close()

    def bad(change, match, exact=False, make=tdl(0)):
        state = copy.deepcopy(good)
        change(state)
        _, fresh = make()
        with pytest.raises(DDStoreValueError, match=match):
            fresh.load_state_dict(state, exact=exact)

    def setter(path, value):
        def change(state):
            d = state
            for k in path[:-1]:
                d = d[k]
            d[path[-1]] = value

        return change

    bad(setter(["dataset_len"], N + 1), "24 samples")
    bad(setter(["sampler", "dataset_len"], 5), "5 samples")
    bad(setter(["format"], "torchdata"), "format")
    bad(setter(["version"], 99), "version")
    bad(setter(["batches_yielded"], -1), "batches_yielded")
    bad(setter(["finished"], "no"), "finished")
    bad(setter(["base_seed"], 1.5), "base_seed")
    bad(setter(["generator"], [1, 2, 300]), "generator")
    bad(setter(["mode"], "eval"), "mode")
    bad(setter(["sampler"], None), "sampler")
    bad(setter(["sampler", "yielded"], 10**6), "yielded")
    bad(setter(["sampler", "epoch"], True), "epoch")
    bad(setter(["sampler", "start"], 30), "start")
    bad(setter(["sampler", "rank"], 7), "rank")
    bad(setter(["sampler", "shuffle"], False), "shuffle")
    bad(setter(["batch_size"], 5), "batch_size")
    bad(lambda s: s["sampler"].update(num_replicas=3, order_replicas=3), "3 ranks", exact=True)
    bad(setter(["mode"], "skip"), "DistributedSampler")
    with pytest.raises(DDStoreValueError, match="dict"):
        tdl(0)()[1].load_state_dict([good])

    # A state from a future epoch, whichever comes first: set_epoch() or load_state_dict().
    s, later = tdl(0, auto=False)()
    it = iter(later)
    s.set_epoch(2)
    it = iter(later)
    next(it)
    state2 = later.state_dict()
    later.close()
    s, fresh = tdl(0, auto=False)()
    s.set_epoch(1)
    fresh.load_state_dict(state2)
    with pytest.raises(DDStoreValueError, match="future epoch"):
        list(fresh)
    s, fresh = tdl(0, auto=False)()
    s.load_state_dict(state2["sampler"])
    with pytest.raises(DDStoreValueError, match="future epoch"):
        s.set_epoch(1)
    with pytest.raises(DDStoreValueError, match="finish epoch 2"):
        s.set_epoch(3)  # the state's epoch is not over
    s.set_epoch(2)
    assert len(list(s)) == len(s) - 3


def test_dataset_name_checked():
    a = DistDataset(TensorDataset(torch.arange(N) * 10, torch.arange(N)), "resume-a")
    b = DistDataset(TensorDataset(torch.arange(N) * 10, torch.arange(N)), "resume-b")
    try:
        s = DistributedSampler(a, seed=1)
        loader = ThreadDataLoader(a, batch_size=4, sampler=s, auto_epoch=True)
        it = iter(loader)
        first = ids_of(next(it))
        state = loader.state_dict()
        rest = [i for batch in it for i in ids_of(batch)]
        assert state["dataset_name"] == "resume-a" and state["sampler"]["dataset_name"] == "resume-a"
        with pytest.raises(DDStoreValueError, match="resume-a"):
            ThreadDataLoader(b, batch_size=4, sampler=DistributedSampler(b)).load_state_dict(state)
        with pytest.raises(DDStoreValueError, match="resume-b"):
            DistributedSampler(b).load_state_dict(state["sampler"])
        again = ThreadDataLoader(a, batch_size=4, sampler=DistributedSampler(a, seed=1), auto_epoch=True)
        again.load_state_dict(state)
        assert first + [i for batch in again for i in ids_of(batch)] == first + rest
        assert sorted(first + rest) == list(range(N))
    finally:
        a.free()
        b.free()


def torch_dist(replicas=2, rank=0, n=N, **kw):
    """torch's own DistributedSampler under a ThreadDataLoader (the loader's "skip" mode)."""
    data = TensorDataset(torch.arange(n) * 10, torch.arange(n))

    def make():
        s = torch.utils.data.DistributedSampler(data, num_replicas=replicas, rank=rank, seed=5)
        return s, ThreadDataLoader(data, batch_size=4, sampler=s, auto_epoch=True, **kw)

    return make


def plain(**kw):
    """A RandomSampler with a generator, or no automatic batching (batch_size=None)."""

    def make():
        g = torch.Generator().manual_seed(8)
        loader = ThreadDataLoader(DS, generator=g, **kw)
        return loader.sampler, loader

    return make


@pytest.mark.parametrize(
    "make",
    [
        tdl(0),
        tdl(1, batch_drop_last=True),
        torch_dist(),
        torch_dist(drop_last=True),
        plain(batch_size=4, shuffle=True),
        plain(batch_size=None),
    ],
    ids=["pyddstore", "pyddstore-drop-last", "torch", "torch-drop-last", "random", "unbatched"],
)
def test_positions_past_the_epoch_refused(make):
    """batches_yielded or samples_yielded past this rank's epoch, or not agreeing with each
    other, is refused at load_state_dict() naming the field: mid-epoch and after the epoch."""
    _, loader = make()
    whole = len(loader)
    it = iter(loader)
    head = [ids_of(next(it)) if loader.batch_size else [int(next(it)[1])] for _ in range(2)]
    mid = loader.state_dict()
    rest = [ids_of(b) if loader.batch_size else [int(b[1])] for b in it]
    done = loader.state_dict()
    loader.close()
    assert done["finished"] and done["batches_yielded"] == whole == len(head) + len(rest)
    for good in (mid, done):
        for key, value in (
            ("batches_yielded", whole + 1),
            ("batches_yielded", 10**9),
            ("samples_yielded", good["samples_yielded"] + 1),
            ("samples_yielded", 10**9),
        ):
            state = dict(good, **{key: value})
            _, fresh = make()
            with pytest.raises(DDStoreValueError, match=key):
                fresh.load_state_dict(state)
            fresh.close()
    # The untouched state goes on with exactly the rest of the epoch.
    _, again = make()
    again.load_state_dict(mid)
    assert [ids_of(b) if again.batch_size else [int(b[1])] for b in again] == rest
    again.close()


def test_inflated_sizes_and_seeds_refused():
    """A sampler state's order_replicas/end past what its rank counts allow, seeds and epochs
    torch cannot seed with, and base seeds out of torch's range: refused at load_state_dict()
    naming the field, never a longer epoch, a MemoryError or torch's ValueError at iteration."""
    _, loader = tdl(0)()
    it = iter(loader)
    next(it)
    good = loader.state_dict()
    loader.close()
    assert good["sampler"]["end"] == 24 and good["sampler"]["order_replicas"] == 2

    def refused(match, loader=None, **changes):
        state = copy.deepcopy(good)
        for key, value in changes.items():
            where = state if key in ("epoch_", "base_seed") else state["sampler"]
            where[key.rstrip("_")] = value
        loader = loader or tdl(0)()[1]
        with pytest.raises(DDStoreValueError, match=match):
            loader.load_state_dict(state)
        loader.close()

    refused("'end' 24 is past", order_replicas=10**3)  # 122 batches before
    refused("'end' 10000 is past", order_replicas=10**4, end=10**4)  # thousands of batches before
    refused("'end' 10000000000 is past", order_replicas=10**10, end=10**10)  # a MemoryError before
    refused("'seed'", seed=2**64)
    refused("'seed'", seed=-(2**63) - 1)
    refused(r"'seed' 18446744073709551615 \+ 'epoch' 0", seed=2**64 - 1, epoch=0, epoch_=0)
    refused("'epoch'", epoch=2**63, epoch_=2**63)
    refused("'epoch'", epoch_=2**70)
    refused("'epoch' 5 is not the sampler's 'epoch' 0", epoch_=5)
    refused("'base_seed'", base_seed=-1)
    refused("'base_seed'", base_seed=2**63)
    # The same inflation on every count a state claims is a job of 10**6 ranks: on 2 ranks its
    # unseen rest is the data set's 23 samples once, not 10**6 positions.
    state = copy.deepcopy(good)
    state["sampler"].update(num_replicas=10**6, order_replicas=10**6, end=10**6, rank=0, yielded=0)
    state.update(batches_yielded=0, samples_yielded=0)
    rest = []
    for r in range(2):
        _, fresh = tdl(0, rank=r)()
        fresh.load_state_dict(state)
        rest += [i for b in fresh for i in ids_of(b)]
        fresh.close()
    assert sorted(rest) == list(range(N))
    # Seeds and epochs torch takes, however large, load and run.
    state = copy.deepcopy(good)
    state["sampler"].update(seed=2**64 - 10, epoch=7)
    state["epoch"] = 7
    _, fresh = tdl(0)()
    fresh.load_state_dict(state)
    assert len([b for b in fresh]) == len(fresh) - 1
    fresh.close()
    # torch's DistributedSampler: the loader state's epoch against the sampler's own seed.
    data = TensorDataset(torch.arange(N) * 10, torch.arange(N))
    s = torch.utils.data.DistributedSampler(data, num_replicas=2, rank=0, seed=2**64 - 10)
    skip = ThreadDataLoader(data, batch_size=4, sampler=s, auto_epoch=True)
    state = skip.state_dict()
    skip.close()
    for epoch, ok in ((8, True), (9, False), (2**63, False)):
        fresh = ThreadDataLoader(data, batch_size=4, sampler=s)
        if ok:
            fresh.load_state_dict(dict(state, epoch=epoch))
            assert len(list(fresh)) == len(fresh)
        else:
            with pytest.raises(DDStoreValueError, match="'epoch'"):
                fresh.load_state_dict(dict(state, epoch=epoch))
        fresh.close()


def test_torch_sampler_on_another_rank_count():
    """torch's own DistributedSampler (53 samples, 2 ranks): its state on 3 or 1 ranks is
    refused with exact=True; with exact=False inside an epoch it is refused naming
    'num_replicas' (torch's sampler cannot deal the rest over other ranks), and at an epoch's
    start, last batch or end the resume is exact: every sample of the epoch counted across
    the ranks, on 2 ranks as on the new count."""
    n = 53

    def epoch_ids(replicas, epoch):  # torch's epoch over `replicas` ranks, every rank's part
        out = []
        for r in range(replicas):
            ref = torch.utils.data.DistributedSampler(range(n), num_replicas=replicas, rank=r, seed=5)
            ref.set_epoch(epoch)
            out += list(ref)
        return sorted(out)

    def states(stop):  # epoch 1 on 2 ranks, `stop` batches in (None: to the end of the epoch)
        seen, out = [], []
        for r in range(2):
            s, loader = torch_dist(2, r, n)()
            s.set_epoch(1)
            it = iter(loader)
            seen += [i for _, b in zip(range(len(loader) if stop is None else stop), it) for i in ids_of(b)]
            if stop is None:
                assert next(it, None) is None
            out.append(json.loads(json.dumps(loader.state_dict())))
            loader.close()
        return seen, out

    whole = len(torch_dist(2, 0, n)()[1])  # 7 batches of 4 (27 samples a rank)
    for stop in (0, 3, whole - 1, whole, None):
        seen, saved = states(stop)
        inside = stop not in (0, whole, None)
        for new in (3, 1, 2):
            rest, nxt = [], []
            for r in range(new):
                s, loader = torch_dist(new, r, n)()
                state = saved[r % 2]
                if new != 2:
                    exact_refused = f"from 2 ranks .'num_replicas'. and this job has {new}"
                    with pytest.raises(DDStoreValueError, match=exact_refused):
                        loader.load_state_dict(state, exact=True)
                if inside and new != 2:
                    refused = "'num_replicas'.*pyddstore.torch.DistributedSampler"
                    with pytest.raises(DDStoreValueError, match=refused):
                        loader.load_state_dict(state)
                    loader.close()
                    continue
                loader.load_state_dict(state, exact=new == 2)
                rest += [i for b in loader for i in ids_of(b)]
                assert s.epoch == (2 if stop is None else 1)
                nxt += [i for b in loader for i in ids_of(b)]  # then torch's next epoch on `new` ranks
                loader.close()
            if inside and new != 2:
                continue
            if stop is None:  # the epoch was over: the next ones, whole, on the new ranks
                assert sorted(seen) == epoch_ids(2, 1)
                assert sorted(rest) == epoch_ids(new, 2) and sorted(nxt) == epoch_ids(new, 3), (stop, new)
            elif stop == 0 and new != 2:  # nothing seen: the whole epoch on the new ranks
                assert sorted(rest) == epoch_ids(new, 1), (stop, new)
                assert sorted(nxt) == epoch_ids(new, 2)
            else:  # the rest of the 2 ranks' epoch (empty after the last batch), each sample counted
                assert sorted(seen + rest) == epoch_ids(2, 1), (stop, new)
                assert set(seen + rest) == set(range(n))
                assert sorted(nxt) == epoch_ids(new, 2)


@pytest.mark.filterwarnings("ignore::UserWarning")  # torchdata's own deprecation warnings
def test_stateful_dataloader_states_checked():
    """torchdata's StatefulDataLoader restores the pyddstore sampler through its
    load_state_dict(): a sampler state past the epoch, into padding its rank count has not, or
    with a seed torch cannot take is refused naming the field; torchdata's own counters
    cannot skip samples (the sampler's state says where the epoch goes on)."""
    sdl = pytest.importorskip("torchdata.stateful_dataloader")

    def make():
        s = DistributedSampler(DS, num_replicas=2, rank=1, seed=3)
        return sdl.StatefulDataLoader(DS, batch_size=3, sampler=s)

    loader = make()
    it = iter(loader)
    next(it)
    good = json.loads(json.dumps(loader.state_dict()))
    rest = [ids_of(b) for b in it]
    for path, value, match in (
        (("sampler_state", "yielded"), 10**6, "'yielded'"),
        (("sampler_state", "order_replicas"), 10**3, "'end' 24 is past"),
        (("sampler_state", "end"), 10**3, "'end' 1000"),
        (("sampler_state", "seed"), 2**64, "'seed'"),
        (("sampler_state", "epoch"), 2**63, "'epoch'"),
    ):
        state = copy.deepcopy(good)
        state["_sampler_iter_state"][path[0]][path[1]] = value
        fresh = make()
        with pytest.raises(DDStoreValueError, match=match):  # at load_state_dict() or iter()
            fresh.load_state_dict(state)
            next(iter(fresh))
    for key in ("_num_yielded", "_sampler_iter_yielded"):
        fresh = make()
        fresh.load_state_dict(dict(good, **{key: 10**3}))
        assert [ids_of(b) for b in fresh] == rest
    fresh = make()
    fresh.load_state_dict(good)
    assert [ids_of(b) for b in fresh] == rest
