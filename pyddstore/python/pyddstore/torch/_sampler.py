"""DistributedSampler without torch.distributed: rank and size from the dataset's store."""

from __future__ import annotations

import sys
from typing import Any, Optional

import torch.utils.data.distributed as _tud

from pyddstore import _launch
from pyddstore._errors import DDStoreValueError


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
    ``set_epoch()``, the padding of the last partial round) is torch's own.

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
