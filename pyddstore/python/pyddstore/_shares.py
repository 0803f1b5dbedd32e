"""The balanced split of n rows over the ranks of a group: the first n % size ranks hold one
more row. DistDataset splits its samples so (each rank loads its share); public as
pyddstore.torch.share_of, kept here, free of torch, so that code without torch (the store-level
test scripts) uses the same one."""

from __future__ import annotations

from ._errors import DDStoreValueError


def share_of(n: int, size: int, rank: int) -> tuple[int, int]:
    """(start, count) of rank's share of n samples split over size ranks: the first n % size
    ranks get one more.

    Args:
        n (int): samples in all.
        size (int): ranks.
        rank (int): the rank whose share to return.

    Example:
        ```python
        share_of(10, 3, 0)  # (0, 4)
        share_of(10, 3, 2)  # (7, 3)
        ```
    """
    if size <= 0 or not 0 <= rank < size:
        raise DDStoreValueError(f"rank {rank} is not in a group of {size}")
    base, extra = divmod(n, size)
    return rank * base + min(rank, extra), base + (1 if rank < extra else 0)


def shares(n: int, size: int) -> list[int]:
    """Rows per rank of the balanced split."""
    return [share_of(n, size, r)[1] for r in range(size)]
