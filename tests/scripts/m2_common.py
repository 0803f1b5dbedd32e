"""What the method-2 core scripts store, so extra jobs can check every row they read."""

from __future__ import annotations

import numpy as np

N_ROWS = 53  # not a multiple of the core ranks
# name -> (seed offset, row shape, dtype)
VARS = {"a": (1, (3,), np.float64), "b": (2, (5, 2), np.int32), "c": (3, (7,), np.uint8)}


def seed_of(name: str, group: int) -> int:
    return VARS[name][0] + 10 * group
