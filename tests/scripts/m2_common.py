"""What the method-2 core scripts store, so extra jobs can check every row they read."""

from __future__ import annotations

import numpy as np

N_ROWS = 53  # not a multiple of the core ranks
# name -> (seed offset, row shape, dtype)
VARS = {"a": (1, (3,), np.float64), "b": (2, (5, 2), np.int32), "c": (3, (7,), np.uint8)}


def seed_of(name: str, group: int) -> int:
    return VARS[name][0] + 10 * group


class Samples:
    """A map-style dataset: (image (2, 3) float32, label int64, mask (4,) bool) per index."""

    n = 41

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        import torch

        if not 0 <= i < self.n:
            raise IndexError(i)
        x = torch.arange(6, dtype=torch.float32).reshape(2, 3) + 0.25 * i
        return x, i * 3 + 1, torch.tensor([(i >> k) & 1 for k in range(4)], dtype=torch.bool)
