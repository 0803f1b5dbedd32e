"""Where a loader stopped: ThreadDataLoader.state_dict() / load_state_dict() (torchdata's
StatefulDataLoader protocol) and the position tracking of its iterators. The state of the
sampler, and the checks of what a state holds, are in _state.py."""

from __future__ import annotations

import collections
import copy
from typing import Any

import torch
import torch.utils.data.distributed as _tud

from pyddstore._errors import DDStoreValueError

from . import _torch_compat as _tc
from ._sampler import DistributedSampler
from ._state import (
    LOADER_FORMAT,
    VERSION,
    bad_state,
    check_dataset,
    check_position,
    check_sampler_state,
    check_seed,
    dataset_name,
    generator_state,
    loader_fields,
    set_generator_state,
    stream_len,
    total_size,
    unsupported,
)


def _is_dist_sampler(sampler: Any) -> bool:
    return isinstance(sampler, DistributedSampler)


def _torch_replicas(sampler: Any) -> int | None:
    """The rank count of torch's own DistributedSampler (its part of an epoch depends on it),
    None for other samplers of the "skip" mode."""
    if isinstance(sampler, _tud.DistributedSampler) and not _is_dist_sampler(sampler):
        return int(sampler.num_replicas)
    return None


def _torch_samples(sampler: Any, replicas: int) -> int:
    """Each rank's samples of an epoch of torch's DistributedSampler `sampler` on `replicas` ranks."""
    return total_size(len(sampler.dataset), replicas, sampler.drop_last) // replicas


def _len(obj: Any) -> int | None:
    """len(obj), None for an object without a length."""
    try:
        return len(obj)
    except TypeError:
        return None


class Position:
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
        self.position: Position | None = None
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
        if not _tc.is_map_style(loader):
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
                if mode == "skip" and st.get("num_replicas") not in (None, _torch_replicas(sampler)):
                    # torch's DistributedSampler from another rank count, at the epoch's start
                    # or end (load_state_dict() refuses the rest): none or all of it on this one.
                    if st["samples_yielded"] > 0:
                        whole = len(self.loader)
                        start.update(skip=whole, batches=whole, samples=len(sampler))
                elif mode == "skip":
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
        it._position = self.position = Position(start)

    # -- the protocol ------------------------------------------------------------------------

    def state_dict(self) -> dict:
        what = "ThreadDataLoader.state_dict"
        self._check_reproducible(what)
        if self.pending is not None:
            return copy.deepcopy(self.pending)
        loader, sampler, p = self.loader, self.sampler(), self.position
        state = {
            "format": LOADER_FORMAT,
            "version": VERSION,
            "dataset_len": len(loader.dataset),
            "dataset_name": dataset_name(loader.dataset),
            "batch_size": loader.batch_size,
            "drop_last": bool(loader.drop_last),
            "num_replicas": _torch_replicas(sampler),
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
            raise bad_state(
                what,
                f"the state was saved with a {'pyddstore ' if state['mode'] == 'sampler' else 'non-'}"
                f"DistributedSampler; this loader's sampler is a {type(self.sampler()).__name__}",
            )
        if state["mode"] == "sampler":
            if state["sampler"] is None:
                raise bad_state(what, "'sampler' is missing (a corrupted state?)")
            check_sampler_state(state["sampler"], self.sampler(), exact)
            if state["epoch"] != state["sampler"]["epoch"]:
                raise bad_state(
                    what, f"'epoch' {state['epoch']} is not the sampler's 'epoch' {state['sampler']['epoch']}"
                )
            same_ranks = state["sampler"]["num_replicas"] == self.sampler().num_replicas
        else:
            same_ranks = self._check_torch_sampler(state, exact, what)
        batch_size, drop_last = self.loader.batch_size, self.loader.drop_last
        if same_ranks and (state.get("batch_size") != batch_size or state["drop_last"] != drop_last):
            raise bad_state(
                what,
                f"the state has batch_size={state.get('batch_size')}, drop_last={state['drop_last']}; this "
                f"loader batch_size={batch_size}, drop_last={drop_last}: the batches would differ",
            )
        self._check_position(state, same_ranks, what)
        self.pending = copy.deepcopy(state)
        self.exact = bool(exact)

    def _check_torch_sampler(self, state: dict, exact: bool, what: str) -> bool:
        """A "skip" state against this loader's sampler: saved with torch's DistributedSampler
        exactly when this one is (its 'num_replicas'), its epoch a seed torch takes, and on
        another rank count only where no sample of the epoch is skipped or repeated: at the
        epoch's start or end (exact=True: never). True when the rank counts are the same."""
        sampler = self.sampler()
        mine, replicas = _torch_replicas(sampler), state.get("num_replicas")
        if (mine is None) != (replicas is None):
            saved = "torch's DistributedSampler" if mine is None else "another sampler"
            raise bad_state(
                what,
                f"'num_replicas' is {replicas}: {saved} saved the state; this loader's sampler is a "
                f"{type(sampler).__name__}",
            )
        if mine is None:
            return True
        if state["epoch"] is None:
            raise bad_state(what, "'epoch' is null, but torch's DistributedSampler saved the state")
        check_seed(int(sampler.seed), state["epoch"], what, "this sampler's seed")
        if replicas == mine:
            return True
        if exact:
            raise bad_state(
                what,
                f"the state is from {replicas} ranks ('num_replicas') and this job has {mine}: exact=True "
                "refuses another rank count",
            )
        seen = state["samples_yielded"]
        inside = 0 < max(seen, state["batches_yielded"]) and seen < _torch_samples(sampler, replicas)
        if inside and not state["finished"]:
            raise bad_state(
                what,
                f"the state is from {replicas} ranks ('num_replicas'), {state['batches_yielded']} batches "
                f"into epoch {state['epoch']}, and this job has {mine}: torch's DistributedSampler cannot "
                "deal the rest of an epoch over other ranks (samples would be skipped or seen twice). Use "
                f"pyddstore.torch.DistributedSampler, resume on {replicas} ranks, or from a state saved at "
                "an epoch's start or end",
            )
        return False

    def _check_position(self, state: dict, same_ranks: bool, what: str) -> None:
        """The state's batches and samples yielded lie inside the iteration it describes (on
        another rank count: the one of the ranks that saved it) and agree with each other."""
        loader, sampler = self.loader, self.sampler()
        batches = None
        if state["mode"] == "sampler":
            s = state["sampler"]
            if state["samples_yielded"] != s["yielded"]:
                mine, its = state["samples_yielded"], s["yielded"]
                raise bad_state(what, f"'samples_yielded' {mine} is not the sampler's 'yielded' {its}")
            samples = stream_len(s["start"], s["end"], s["num_replicas"], s["rank"])
        elif state.get("num_replicas") is not None:  # torch's DistributedSampler, maybe of another rank count
            samples = _torch_samples(sampler, state["num_replicas"])
        else:
            samples = _len(sampler)
            if loader.batch_size is None and loader.batch_sampler is not None and same_ranks:
                batches = _len(loader.batch_sampler)
        if state.get("batch_size") is not None:
            batch_size, drop_last = state["batch_size"], state["drop_last"]
        elif loader.batch_sampler is None:  # no automatic batching: a sample a batch
            batch_size, drop_last = 1, False
        else:  # the user's batch_sampler: its own batches
            batch_size, drop_last = None, False
            if loader.batch_size is None and getattr(loader.batch_sampler, "sampler", None) is not sampler:
                samples = None  # the batch sampler draws from a sampler of its own
        check_position(state, what, samples, batch_size, drop_last, batches)


class PositionTracking:
    """Mixin of ThreadDataLoader's iterators (threads and processes): counts the indices sent to
    workers and the batches handed to the caller, for state_dict(). An iterator calls
    loader._resume.seed_iterator(self) before its workers start and loader._resume.attach(self)
    once its epoch's sampler iterator exists."""

    _position: Any = None

    def _next_index(self) -> Any:
        index = super()._next_index()  # type: ignore[misc]
        if self._position is not None:
            self._position.dispatched(index, self._auto_collation)  # type: ignore[attr-defined]
        return index

    def __next__(self) -> Any:
        try:
            data = super().__next__()  # type: ignore[misc]
        except StopIteration:
            if self._position is not None:
                self._position.finished = True
            raise
        if self._position is not None:
            self._position.yielded()
        return data
