"""DistributedSampler without torch.distributed: rank and size from the dataset's store."""

from __future__ import annotations

import math
import sys
from typing import Any, Optional

import numpy as np
import torch
import torch.utils.data.distributed as _tud

from pyddstore import _launch
from pyddstore._errors import DDStoreValueError

from . import _state

# Indices turned into Python ints at a time while an iteration runs.
_CHUNK = 4096


def _store_of(dataset: Any) -> Any:
    """The PyDDStore behind a DistDataset/DistDatasetReader, also through wrappers
    (WindowedDataset, Subset, ...): the first ``.ddstore`` along ``.ds``/``.dataset``."""
    seen = 0
    while dataset is not None and seen < 16:
        store = getattr(dataset, "ddstore", None)
        if store is not None:
            return store
        dataset = getattr(dataset, "ds", None) or getattr(dataset, "dataset", None)
        seen += 1
    return None


def replica_of(dataset: Any) -> tuple[int, int, str]:
    """(rank, number of replicas, where they came from) for a data-parallel job reading
    ``dataset``: the default torch.distributed group when initialised, else the dataset's
    store (its whole group, across ``ddstore_width`` splits), else the launcher's variables
    (torchrun, mpirun, srun, PMI), else one replica."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), "torch.distributed"
    store = _store_of(dataset)
    if store is not None and not getattr(store, "is_extra", False):
        return store.world_rank, store.world_size, "the dataset's store"
    launcher = _launch.detect()
    if launcher is not None:
        return launcher.rank, launcher.size, launcher.name
    return 0, 1, "a single process"


class DistributedSampler(_tud.DistributedSampler):
    """``torch.utils.data.distributed.DistributedSampler`` that needs no torch.distributed group.

    ``num_replicas`` and ``rank`` default to the dataset's store: under ``mpirun`` or ``srun``
    with an MPI or file communicator, each rank of the store draws its own part, exactly as
    torch's sampler would with that rank and size. With torch.distributed initialised they come
    from the default group, as in torch. Everything else (``shuffle``, ``seed``, ``drop_last``,
    ``set_epoch()``, the padding of the last partial round) draws exactly torch's indices.

    ``state_dict()`` / ``load_state_dict()`` (torchdata's Stateful protocol, so torchdata's
    ``StatefulDataLoader`` saves and restores it): the epoch, the seed and how many samples this
    rank's current iteration has yielded, as JSON data. After ``load_state_dict()`` the next
    iteration yields the rest of that epoch: on the same rank count exactly what the
    uninterrupted run would have yielded; on another rank count (``exact=False``, the default)
    every sample of the epoch not yet seen by any rank once across the new ranks (their counts
    may differ by one), then normal epochs. It assumes every rank saved its state at the same
    step, as synchronous data-parallel training does. ``len()`` stays torch's.

    Args:
        dataset (DistDataset | DistDatasetReader | Dataset): the dataset to draw from; its store gives rank
            and size.
        num_replicas (int | None): number of ranks drawing; None: the store's size (or the default torch
            group's).
        rank (int | None): this rank among them; None: the store's rank.
        shuffle (bool): shuffle each epoch (seeded by `seed` + epoch).
        seed (int): the same on every rank.
        drop_last (bool): drop the tail instead of padding to an even split.

    Example:
        ```python
        from mpi4py import MPI
        from pyddstore.torch import DistDataset, DistributedSampler, ThreadDataLoader

        trainset = DistDataset(my_dataset, "train", MPI.COMM_WORLD)
        sampler = DistributedSampler(trainset, shuffle=True, seed=0)
        loader = ThreadDataLoader(trainset, batch_size=128, sampler=sampler, num_workers=1)
        for epoch in range(10):
            sampler.set_epoch(epoch)  # a new shuffle every epoch, the same on every rank
            for x, y in loader:
                ...
        ```
    """

    def __init__(
        self,
        dataset: Any,
        num_replicas: Optional[int] = None,
        rank: Optional[int] = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ):
        if num_replicas is None or rank is None:
            r, n, source = replica_of(dataset)
            if num_replicas is None:
                num_replicas = n
            if rank is None:
                rank = r if num_replicas == n else None
                if rank is None:
                    raise DDStoreValueError(
                        f"DistributedSampler: num_replicas={num_replicas} differs from the {n} ranks of "
                        f"{source}: pass rank= as well"
                    )
        for name, value in (("num_replicas", num_replicas), ("rank", rank)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise DDStoreValueError(f"DistributedSampler: {name}={value!r} is not an integer")
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise DDStoreValueError(
                f"DistributedSampler: rank={rank} is not in [0, num_replicas={num_replicas})"
            )
        super().__init__(
            dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last
        )
        self._pending: tuple | None = None  # (epoch, stream, yielded) for the next iteration
        self._current: list | None = None  # [epoch, stream, yielded] of the latest iteration
        self._epoch_set = False  # set_epoch() called since construction or the last load
        self._order: tuple | None = None  # (record, the running iteration's whole order), for upcoming()

    def __iter__(self) -> Any:
        # A generator: a loaded state is taken by the iteration that runs (torch's DataLoader
        # makes iterators it never advances), as in torchdata's StatefulDistributedSampler.
        pending, self._pending = self._pending, None
        if pending is None or pending[1].is_fresh(self) and pending[2] == 0:
            record = [self.epoch, _state.Stream.fresh(self), 0]
            order = self._torch_order()
        else:
            record = [self.epoch, pending[1], pending[2]]
            order = np.asarray(pending[1].indices(self, self.epoch), dtype=np.int64)
        # The whole order, once, as 8 bytes an index (a list of Python ints takes 36), shared
        # with upcoming().
        self._order = (record, order)
        self._current = record
        for start in range(record[2], len(order), _CHUNK):
            for i in order[start : start + _CHUNK].tolist():
                record[2] += 1
                yield i

    def _torch_order(self) -> np.ndarray:
        """This rank's indices of the epoch exactly as torch's DistributedSampler.__iter__ draws
        them (the same generator, permutation, padding and dealing; a test compares the two),
        computed in tensors: torch's list of Python ints takes 36 bytes per index of the whole
        data set while it is drawn, these 8 per index of the data set, then of this rank."""
        n = len(self.dataset)
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = torch.randperm(n, generator=g)
        else:
            order = torch.arange(n)
        if not self.drop_last:
            pad = self.total_size - n
            if pad > 0:
                order = torch.cat([order, order.repeat(math.ceil(pad / n))[:pad]])
        else:
            order = order[: self.total_size]
        mine = order[self.rank : self.total_size : self.num_replicas].numpy().copy()
        if len(mine) != self.num_samples:
            raise DDStoreValueError(
                f"DistributedSampler: {len(mine)} indices for rank {self.rank}, expected {self.num_samples}"
            )
        return mine

    def upcoming(self, n: int) -> list:
        """The next `n` indices the running iteration will yield (fewer at the epoch's end),
        without advancing it: the order follows from seed and epoch (or a loaded state), so a
        loader can read their rows ahead (see the "Datasets larger than memory" guide).

        Args:
            n (int): how many indices to look ahead.
        """
        if self._order is None or self._current is not self._order[0]:
            return []
        record, order = self._order
        return order[record[2] : record[2] + n].tolist()

    def set_epoch(self, epoch: int) -> None:
        """torch's set_epoch(). After load_state_dict(): the state's epoch goes on; a later
        epoch only once the state's epoch was fully seen; an earlier one raises
        DDStoreValueError (a state from a future epoch).

        Args:
            epoch (int): the epoch whose order the next iteration draws (seed + epoch).
        """
        if self._pending is not None and epoch != self._pending[0]:
            self._check_epoch(epoch, *self._pending)
            self._pending = None
        super().set_epoch(epoch)
        self._epoch_set = True

    def _check_epoch(self, epoch: int, state_epoch: int, stream: Any, yielded: int) -> None:
        if epoch < state_epoch:
            raise DDStoreValueError(
                f"DistributedSampler: the loaded state is from epoch {state_epoch}, a future epoch for "
                f"set_epoch({epoch}): resume at epoch {state_epoch} (the state's 'epoch')"
            )
        left = stream.length(self.rank) - yielded
        if epoch > state_epoch and left > 0:
            raise DDStoreValueError(
                f"DistributedSampler: the loaded state is inside epoch {state_epoch} ({left} samples of "
                f"rank {self.rank} left) but set_epoch({epoch}) was called: finish epoch {state_epoch} first"
            )

    def state_dict(self) -> dict:
        """This sampler's position as JSON data: epoch, seed, this rank's samples yielded in
        the current (or next, after load_state_dict) iteration, and the dataset's length/name.

        Example:
            ```python
            json.dump({"sampler": sampler.state_dict()}, f)
            ```
        """
        if self._pending is not None:
            epoch, stream, yielded = self._pending
        elif self._current is not None and self._current[0] == self.epoch:
            epoch, stream, yielded = self._current
        else:
            epoch, stream, yielded = self.epoch, _state.Stream.fresh(self), 0
        return _state.sampler_state(self, epoch, stream, yielded)

    def _upcoming_state(self) -> dict:
        """The state the next iteration starts from: a loaded one, else the epoch's start."""
        if self._pending is not None:
            return _state.sampler_state(self, *self._pending)
        return _state.sampler_state(self, self.epoch, _state.Stream.fresh(self), 0)

    def load_state_dict(self, state_dict: dict, exact: bool = False) -> None:
        """Resumes from a state_dict(): the next iteration yields the rest of the state's epoch
        (see the class). exact=True refuses a state from another rank count. A state of another
        dataset (length, name), of other shuffle/drop_last settings, corrupted (a position past
        its epoch, a seed torch cannot take), or from a later epoch than set_epoch() gave raises
        DDStoreValueError naming the field.

        Args:
            state_dict (dict): what state_dict() returned (JSON data).
            exact (bool): refuse a state saved with another rank count.

        Example:
            ```python
            sampler.load_state_dict(json.load(f)["sampler"])
            ```
        """
        self._restore(state_dict, exact, position=True)

    def _restore(self, state: dict, exact: bool, position: bool) -> None:
        """load_state_dict(); position=False restores the epoch and seed only (a state taken
        after its epoch ended: the next iteration is a whole epoch)."""
        epoch, stream, yielded = _state.check_sampler_state(state, self, exact)
        if not position:  # keep an epoch set_epoch() gave, unless it is an earlier one
            if self._epoch_set and self.epoch < epoch:
                self._check_epoch(self.epoch, epoch, stream, yielded)
            self.seed, self._pending = state["seed"], None
            if not self._epoch_set:
                self.epoch = epoch
            return
        if self._epoch_set and self.epoch != epoch:
            self._check_epoch(self.epoch, epoch, stream, yielded)
            self.seed, self._pending = state["seed"], None  # that epoch is over: keep set_epoch's
            return
        self.seed, self.epoch = state["seed"], epoch
        self._pending = (epoch, stream, yielded)
        self._epoch_set = False
