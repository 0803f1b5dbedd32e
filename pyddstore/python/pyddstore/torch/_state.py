"""Where a job stopped, as data: the state behind DistributedSampler.state_dict() and
ThreadDataLoader.state_dict() (torchdata's StatefulDataLoader protocol), and its checks.

An epoch's order is torch's DistributedSampler list for the rank count the epoch started on
(shuffled with seed + epoch, padded or cut to whole rounds): "the order". A sampler iterates a
*stream*, a slice [start, end) of the order dealt round-robin over the current ranks; a fresh
epoch's stream is the whole order over its own rank count, which is exactly torch's sampler.
When every rank has taken `yielded` samples of a stream (ranks of synchronous data-parallel
training are at the same step), the samples seen so far are the order's first
start + yielded * ranks positions: a resume on the same rank count goes on with the same
stream after `yielded`; on another rank count the unseen rest (without the padding copies)
becomes a new stream dealt over the new ranks, each sample once.
"""

from __future__ import annotations

import collections
import copy
import math
from typing import Any

import torch
import torch.utils.data.distributed as _tud

from pyddstore._errors import DDStoreUnsupportedError, DDStoreValueError

SAMPLER_FORMAT = "pyddstore.DistributedSampler"
LOADER_FORMAT = "pyddstore.ThreadDataLoader"
VERSION = 1


def dataset_name(dataset: Any) -> str | None:
    """The name of the DistDataset/DistDatasetReader behind `dataset` (through wrappers such as
    WindowedDataset and Subset), None for other datasets."""
    for _ in range(16):
        if dataset is None:
            return None
        name = getattr(dataset, "name", None)
        if isinstance(name, str) and getattr(dataset, "ddstore", None) is not None:
            return name
        dataset = getattr(dataset, "ds", None) or getattr(dataset, "dataset", None)
    return None


def total_size(n: int, replicas: int, drop_last: bool) -> int:
    """Length of torch's DistributedSampler order for n samples on `replicas` ranks."""
    if drop_last and n % replicas != 0:
        return math.ceil((n - replicas) / replicas) * replicas
    return math.ceil(n / replicas) * replicas


def epoch_order(dataset: Any, replicas: int, seed: int, epoch: int, shuffle: bool, drop_last: bool) -> list:
    """torch's DistributedSampler order of one epoch for `replicas` ranks, before it is dealt
    to the ranks: torch's own __iter__ with one replica and that rank count's length."""
    one = _tud.DistributedSampler(
        dataset, num_replicas=1, rank=0, shuffle=shuffle, seed=seed, drop_last=drop_last
    )
    one.total_size = one.num_samples = total_size(len(dataset), replicas, drop_last)
    one.set_epoch(epoch)
    return list(_tud.DistributedSampler.__iter__(one))


def stream_len(start: int, end: int, replicas: int, rank: int) -> int:
    """Samples rank `rank` takes of the stream [start, end) dealt over `replicas` ranks."""
    return len(range(rank, end - start, replicas))


def _bad(what: str, detail: str) -> DDStoreValueError:
    return DDStoreValueError(f"{what}: {detail}")


def _int(state: dict, key: str, what: str, lo: int | None = 0) -> int:
    v = state.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or (lo is not None and v < lo):
        bound = "an integer" if lo is None else f"an integer >= {lo}"
        raise _bad(what, f"{key!r} is {v!r}, expected {bound} (a corrupted or foreign state?)")
    return v


def _bool(state: dict, key: str, what: str) -> bool:
    v = state.get(key)
    if not isinstance(v, bool):
        raise _bad(what, f"{key!r} is {v!r}, expected true or false (a corrupted or foreign state?)")
    return v


def _name(state: dict, key: str, what: str) -> str | None:
    v = state.get(key)
    if v is not None and not isinstance(v, str):
        raise _bad(what, f"{key!r} is {v!r}, expected a string or null")
    return v


def _header(state: Any, fmt: str, what: str) -> dict:
    if not isinstance(state, dict):
        raise _bad(what, f"expected the dict state_dict() returned, got {type(state).__name__}")
    if state.get("format") != fmt:
        raise _bad(what, f"'format' is {state.get('format')!r}, expected {fmt!r} (another object's state?)")
    if state.get("version") != VERSION:
        raise _bad(what, f"'version' is {state.get('version')!r}; this pyddstore reads version {VERSION}")
    return state


def check_dataset(state: dict, dataset: Any, what: str, len_key: str, name_key: str) -> None:
    """The state's dataset length and name are this dataset's."""
    n = _int(state, len_key, what)
    name = _name(state, name_key, what)
    if n != len(dataset):
        raise _bad(what, f"the state is for a dataset of {n} samples, this one has {len(dataset)}")
    mine = dataset_name(dataset)
    if name is not None and mine is not None and name != mine:
        raise _bad(what, f"the state is for dataset {name!r}, this one is {mine!r}")


class Stream:
    """The part of an epoch's order a sampler iterates: order positions [start, end) of the
    order made for `order_replicas` ranks, dealt round-robin over `replicas` ranks."""

    __slots__ = ("start", "end", "order_replicas", "replicas")

    def __init__(self, start: int, end: int, order_replicas: int, replicas: int):
        self.start, self.end, self.order_replicas, self.replicas = start, end, order_replicas, replicas

    @classmethod
    def fresh(cls, sampler: Any) -> Stream:
        """A whole epoch on the sampler's rank count: torch's own sampler."""
        n = sampler.num_replicas
        return cls(0, total_size(len(sampler.dataset), n, sampler.drop_last), n, n)

    def is_fresh(self, sampler: Any) -> bool:
        f = Stream.fresh(sampler)
        return (self.start, self.end, self.order_replicas, self.replicas) == (
            f.start,
            f.end,
            f.order_replicas,
            f.replicas,
        )

    def length(self, rank: int) -> int:
        return stream_len(self.start, self.end, self.replicas, rank)

    def indices(self, sampler: Any, epoch: int) -> list:
        order = epoch_order(
            sampler.dataset, self.order_replicas, sampler.seed, epoch, sampler.shuffle, sampler.drop_last
        )
        return order[self.start : self.end][sampler.rank :: self.replicas]


def sampler_state(sampler: Any, epoch: int, stream: Stream, yielded: int) -> dict:
    """A DistributedSampler's state: JSON data (ints, bools, strings)."""
    return {
        "format": SAMPLER_FORMAT,
        "version": VERSION,
        "epoch": int(epoch),
        "seed": int(sampler.seed),
        "shuffle": bool(sampler.shuffle),
        "drop_last": bool(sampler.drop_last),
        "dataset_len": len(sampler.dataset),
        "dataset_name": dataset_name(sampler.dataset),
        "num_replicas": stream.replicas,
        "rank": int(sampler.rank),
        "order_replicas": stream.order_replicas,
        "start": stream.start,
        "end": stream.end,
        "yielded": int(yielded),
    }


def check_sampler_state(state: Any, sampler: Any, exact: bool) -> tuple[int, Stream, int]:
    """(epoch, stream, yielded) to resume `sampler` (its rank count) from `state`; raises
    DDStoreValueError naming what does not fit."""
    what = "DistributedSampler.load_state_dict"
    _header(state, SAMPLER_FORMAT, what)
    epoch = _int(state, "epoch", what)
    _int(state, "seed", what, lo=None)
    for key in ("shuffle", "drop_last"):
        if _bool(state, key, what) != bool(getattr(sampler, key)):
            raise _bad(what, f"the state has {key}={state[key]}, this sampler {key}={getattr(sampler, key)}")
    check_dataset(state, sampler.dataset, what, "dataset_len", "dataset_name")
    n = len(sampler.dataset)
    replicas = _int(state, "num_replicas", what, lo=1)
    rank = _int(state, "rank", what)
    order_replicas = _int(state, "order_replicas", what, lo=1)
    start, end, yielded = (_int(state, k, what) for k in ("start", "end", "yielded"))
    if rank >= replicas:
        raise _bad(what, f"'rank' {rank} is not below 'num_replicas' {replicas}")
    full = total_size(n, order_replicas, sampler.drop_last)
    if not start <= end <= full:
        raise _bad(what, f"'start' {start} and 'end' {end} are not within the epoch's {full} positions")
    if yielded > stream_len(start, end, replicas, rank):
        mine = stream_len(start, end, replicas, rank)
        raise _bad(what, f"'yielded' {yielded} is more than rank {rank}'s {mine} samples")
    if replicas == sampler.num_replicas:
        return epoch, Stream(start, end, order_replicas, replicas), yielded
    if exact:
        raise _bad(
            what,
            f"the state is from {replicas} ranks and this job has {sampler.num_replicas}: the exact batches "
            "cannot be resumed (exact=False deals the epoch's unseen samples over the new ranks)",
        )
    # Every rank took `yielded` of its part: the order's first start + yielded * replicas
    # positions are seen. The rest, without torch's padding copies, goes to the new ranks.
    seen = min(start + yielded * replicas, end)
    return epoch, Stream(seen, max(seen, min(end, n)), order_replicas, sampler.num_replicas), 0


def loader_fields(state: Any, what: str) -> dict:
    """The ThreadDataLoader state's own fields, checked."""
    _header(state, LOADER_FORMAT, what)
    epoch = state.get("epoch")
    if epoch is not None:
        _int(state, "epoch", what)
    for key in ("batches_yielded", "samples_yielded"):
        _int(state, key, what)
    if state.get("base_seed") is not None:
        _int(state, "base_seed", what, lo=None)
    _bool(state, "finished", what)
    _bool(state, "drop_last", what)
    if state.get("batch_size") is not None:
        _int(state, "batch_size", what, lo=1)
    for key in ("generator", "sampler_generator"):
        g = state.get(key)
        if g is not None and (not isinstance(g, list) or not all(type(b) is int and 0 <= b < 256 for b in g)):
            raise _bad(what, f"{key!r} is not a list of bytes (a corrupted state?)")
    if state.get("sampler") is not None and not isinstance(state["sampler"], dict):
        raise _bad(what, "'sampler' is not a dict (a corrupted state?)")
    if state.get("mode") not in ("sampler", "skip"):
        raise _bad(what, f"'mode' is {state.get('mode')!r}, expected 'sampler' or 'skip'")
    return state


def generator_state(g: Any) -> list | None:
    return None if g is None else g.get_state().tolist()


def set_generator_state(g: Any, state: list | None, what: str) -> None:
    if g is None or state is None:
        return
    try:
        g.set_state(torch.tensor(state, dtype=torch.uint8))
    except (RuntimeError, ValueError) as e:
        raise _bad(what, f"the generator state does not fit this generator ({e})") from None


def unsupported(what: str, why: str) -> DDStoreUnsupportedError:
    return DDStoreUnsupportedError(f"{what}: {why}")


#: The class attribute by which pyddstore.torch.DistributedSampler (and subclasses) says that a
#: loader resumes from its state (a marker, as _sampler imports this module).
RESUMABLE = "_ddstore_resumes_loaders"


def _is_dist_sampler(sampler: Any) -> bool:
    return getattr(type(sampler), RESUMABLE, False) is True


class Progress:
    """One loader iteration's position: batches and samples handed to the caller (batches
    fetched ahead by workers are not counted) and what the iteration started from."""

    def __init__(self, start: dict):
        self.start = start
        self.batches = start["batches"]
        self.samples = start["samples"]
        self.sizes: collections.deque = collections.deque()  # samples of batches sent, not yielded
        self.finished = False

    def dispatched(self, index: Any, batched: bool) -> None:
        self.sizes.append(len(index) if batched else 1)

    def yielded(self) -> None:
        self.batches += 1
        self.samples += self.sizes.popleft() if self.sizes else 1


class LoaderResume:
    """ThreadDataLoader's state_dict()/load_state_dict() and auto_epoch (one per loader)."""

    def __init__(self, loader: Any, auto_epoch: bool):
        self.loader = loader
        self.auto_epoch = bool(auto_epoch)
        self.next_epoch: int | None = None  # auto_epoch's next epoch (None: the sampler's own)
        self.pending: dict | None = None
        self.exact = False
        self.progress: Progress | None = None
        self.begun: dict | None = None  # what begin() set up, for the iterator it makes
        if self.auto_epoch and not callable(getattr(self.sampler(), "set_epoch", None)):
            raise DDStoreValueError(
                "ThreadDataLoader(auto_epoch=True) needs a sampler with set_epoch() (DistributedSampler); "
                f"this loader's sampler is a {type(self.sampler()).__name__}"
            )

    def sampler(self) -> Any:
        """The sampler whose order the epoch sets (inside a user's batch_sampler if it has one)."""
        loader = self.loader
        if loader.batch_size is None and loader.batch_sampler is not None:
            return getattr(loader.batch_sampler, "sampler", loader.sampler)
        return loader.sampler

    def _mode(self) -> str:
        return "sampler" if _is_dist_sampler(self.sampler()) else "skip"

    def _generators(self) -> tuple:
        loader_gen = self.loader.generator
        sampler_gen = getattr(self.sampler(), "generator", None)
        if not isinstance(sampler_gen, torch.Generator) or sampler_gen is loader_gen:
            sampler_gen = None
        return loader_gen, sampler_gen

    def _check_reproducible(self, what: str) -> None:
        loader = self.loader
        if loader._dataset_kind != 0:  # _DatasetKind.Map
            raise unsupported(what, "an IterableDataset's position is its own: use a map-style dataset")
        if loader.num_workers > 0 and not loader.in_order:
            raise unsupported(what, "in_order=False yields batches out of order: no position to save")
        sampler = self.sampler()
        if isinstance(sampler, torch.utils.data.RandomSampler) and sampler.generator is None:
            raise DDStoreValueError(
                f"{what}: shuffle=True without generator= draws each epoch's order from torch's global "
                "generator, which cannot be restored: use DistributedSampler, or pass "
                "generator=torch.Generator().manual_seed(seed)"
            )

    # -- the start of an iteration -----------------------------------------------------------

    def begin(self) -> None:
        """ThreadDataLoader.__iter__, before any iterator exists: applies a loaded state and
        auto_epoch, then notes where the iteration starts."""
        sampler, mode = self.sampler(), self._mode()
        st, self.pending = self.pending, None
        start = {"batches": 0, "samples": 0, "skip": 0, "base_seed": None}
        if st is not None:
            what = "ThreadDataLoader.load_state_dict"
            finished = st["finished"]
            loader_gen, sampler_gen = self._generators()
            set_generator_state(loader_gen, st["generator"], what)
            set_generator_state(sampler_gen, st["sampler_generator"], what)
            if mode == "sampler":
                sampler._restore(st["sampler"], self.exact, position=not finished)
                if not finished and sampler._upcoming_state()["yielded"] > 0:  # the same stream goes on
                    start.update(batches=st["batches_yielded"], samples=st["samples_yielded"])
            elif st["epoch"] is not None and hasattr(sampler, "epoch"):
                sampler.epoch = st["epoch"]
            if not finished:
                start["base_seed"] = st["base_seed"]
                if mode == "skip":
                    start.update(skip=st["batches_yielded"], batches=st["batches_yielded"])
                    start["samples"] = st["samples_yielded"]
            if st["epoch"] is not None:
                self.next_epoch = st["epoch"] + (1 if finished else 0)
        if self.auto_epoch:
            if self.next_epoch is None:
                self.next_epoch = sampler.epoch
            sampler.set_epoch(self.next_epoch)
            self.next_epoch += 1
        epoch = getattr(sampler, "epoch", None)
        loader_gen, sampler_gen = self._generators()
        start.update(
            epoch=epoch if isinstance(epoch, int) else None,
            mode=mode,
            sampler=sampler._upcoming_state() if mode == "sampler" else None,
            generator=generator_state(loader_gen),
            sampler_generator=generator_state(sampler_gen),
        )
        self.begun = start

    def seed_iterator(self, it: Any) -> None:
        """A new iterator, before its workers start: a resumed epoch keeps its base seed."""
        if self.begun is not None and self.begun["base_seed"] is not None:
            it._base_seed = self.begun["base_seed"]

    def attach(self, it: Any) -> None:
        """The iterator's sampler iterator for this epoch exists: skip what was yielded (skip
        mode), then count from here."""
        start, self.begun = self.begun, None
        if start is None:  # an iterator made without __iter__ (torch internals): a plain epoch
            self.begin()
            start, self.begun = self.begun, None
        start["base_seed"] = int(it._base_seed)
        for _ in range(start["skip"]):
            try:
                next(it._sampler_iter)
            except StopIteration:
                break
        it._progress = self.progress = Progress(start)

    # -- the protocol ------------------------------------------------------------------------

    def state_dict(self) -> dict:
        what = "ThreadDataLoader.state_dict"
        self._check_reproducible(what)
        if self.pending is not None:
            return copy.deepcopy(self.pending)
        loader, sampler, p = self.loader, self.sampler(), self.progress
        state = {
            "format": LOADER_FORMAT,
            "version": VERSION,
            "dataset_len": len(loader.dataset),
            "dataset_name": dataset_name(loader.dataset),
            "batch_size": loader.batch_size,
            "drop_last": bool(loader.drop_last),
        }
        if p is None:  # no iteration yet: the next one starts the epoch
            epoch = self.next_epoch if self.auto_epoch else None
            epoch = getattr(sampler, "epoch", None) if epoch is None else epoch
            loader_gen, sampler_gen = self._generators()
            state.update(
                epoch=epoch if isinstance(epoch, int) else None,
                mode=self._mode(),
                finished=False,
                batches_yielded=0,
                samples_yielded=0,
                base_seed=None,
                generator=generator_state(loader_gen),
                sampler_generator=generator_state(sampler_gen),
                sampler=sampler._upcoming_state() if self._mode() == "sampler" else None,
            )
            return state
        s = p.start
        state.update(
            epoch=s["epoch"],
            mode=s["mode"],
            finished=p.finished,
            batches_yielded=p.batches,
            samples_yielded=p.samples,
            base_seed=s["base_seed"],
            generator=s["generator"],
            sampler_generator=s["sampler_generator"],
            sampler=None,
        )
        if p.finished:  # the next epoch draws from the generators as they are now
            loader_gen, sampler_gen = self._generators()
            state["generator"] = generator_state(loader_gen)
            state["sampler_generator"] = generator_state(sampler_gen)
        if s["sampler"] is not None:
            state["sampler"] = dict(s["sampler"], yielded=s["sampler"]["yielded"] + p.samples - s["samples"])
        return state

    def load_state_dict(self, state: dict, exact: bool) -> None:
        what = "ThreadDataLoader.load_state_dict"
        if isinstance(state, dict) and not state:  # torchdata: {} loads nothing
            self.pending = None
            return
        loader_fields(state, what)
        self._check_reproducible(what)
        check_dataset(state, self.loader.dataset, what, "dataset_len", "dataset_name")
        if state["mode"] != self._mode():
            raise _bad(
                what,
                f"the state was saved with a {'pyddstore ' if state['mode'] == 'sampler' else 'non-'}"
                f"DistributedSampler; this loader's sampler is a {type(self.sampler()).__name__}",
            )
        if state["mode"] == "sampler":
            if state["sampler"] is None:
                raise _bad(what, "'sampler' is missing (a corrupted state?)")
            check_sampler_state(state["sampler"], self.sampler(), exact)
        batch_size, drop_last = self.loader.batch_size, self.loader.drop_last
        replicas = getattr(self.sampler(), "num_replicas", None)
        same_ranks = state["mode"] == "skip" or state["sampler"]["num_replicas"] == replicas
        if same_ranks and (state.get("batch_size") != batch_size or state["drop_last"] != drop_last):
            raise _bad(
                what,
                f"the state has batch_size={state.get('batch_size')}, drop_last={state['drop_last']}; this "
                f"loader batch_size={batch_size}, drop_last={drop_last}: the batches would differ",
            )
        self.pending = copy.deepcopy(state)
        self.exact = bool(exact)


class PositionTracking:
    """Mixin of ThreadDataLoader's iterators (threads and processes): counts the indices sent to
    workers and the batches handed to the caller, for state_dict(). An iterator calls
    loader._resume.seed_iterator(self) before its workers start and loader._resume.attach(self)
    once its epoch's sampler iterator exists."""

    _progress: Any = None

    def _next_index(self) -> Any:
        index = super()._next_index()  # type: ignore[misc]
        if self._progress is not None:
            self._progress.dispatched(index, self._auto_collation)  # type: ignore[attr-defined]
        return index

    def __next__(self) -> Any:
        try:
            data = super().__next__()  # type: ignore[misc]
        except StopIteration:
            if self._progress is not None:
                self._progress.finished = True
            raise
        if self._progress is not None:
            self._progress.yielded()
        return data
