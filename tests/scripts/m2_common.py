"""What the method-2 core scripts store, so extra jobs can check every row they read."""

from __future__ import annotations

import os
import time

import numpy as np

N_ROWS = 53  # not a multiple of the core ranks
# name -> (seed offset, row shape, dtype)
VARS = {"a": (1, (3,), np.float64), "b": (2, (5, 2), np.int32), "c": (3, (7,), np.uint8)}


def seed_of(name: str, group: int) -> int:
    return VARS[name][0] + 10 * group


# A ragged variable whose units are (3, 4) float32: row r has r % 4 units (0 included).
RAGGED = "r"
RAGGED_UNIT = (3, 4)


def ragged_rows(group: int, rows):
    """(values (units, 3, 4) float32, lengths) of ragged rows `rows` of core group `group`."""
    rows = [int(r) for r in rows]
    lengths = np.array([r % 4 for r in rows], dtype=np.int64)
    size = int(np.prod(RAGGED_UNIT))
    parts = [
        (np.arange(n * size, dtype=np.float32) + 1000 * r + 100000 * group).reshape((n,) + RAGGED_UNIT)
        for r, n in zip(rows, lengths)
    ]
    values = np.concatenate(parts) if parts else np.empty((0,) + RAGGED_UNIT, np.float32)
    return values, lengths


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


# m2_free_core.py: generation 1 is freed while extra jobs hold it, generation 2 takes its
# names. The fixed variable keeps its layout (so new bytes would fit an old handle's reads
# unnoticed); every value differs between generations.
FREE_ROWS = 37
FREE_FIXED_SHAPE = (6,)


def free_gen_rows(gen: int) -> int:
    return FREE_ROWS


def free_gen_fixed(gen: int, rows):
    """Generation `gen`'s fixed rows (float32, FREE_FIXED_SHAPE)."""
    rows = np.asarray(list(rows), dtype=np.int64)
    vals = rows[:, None] * 10 + np.arange(FREE_FIXED_SHAPE[0])[None, :] + 1000 * gen
    return vals.astype(np.float32)


def free_gen_length(gen: int, row: int) -> int:
    return (row * 3 + gen) % 5  # 0 included


def free_gen_ragged(gen: int, rows):
    """Generation `gen`'s ragged rows: (flat int64 values, lengths)."""
    rows = list(rows)
    lengths = np.array([free_gen_length(gen, r) for r in rows], dtype=np.int64)
    parts = [np.arange(n, dtype=np.int64) + 100 * r + 100000 * gen for r, n in zip(rows, lengths)]
    values = np.concatenate(parts) if parts else np.empty(0, np.int64)
    return values, lengths


class FreeGenSamples:
    """m2_torch_free_core.py's dataset, generation `gen`: {"x": (3,) float32, "pos": (L, 2)
    float32 with L = 0..3 varying by generation}."""

    n = 23

    def __init__(self, gen: int):
        self.gen = gen

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        import torch

        if not 0 <= i < self.n:
            raise IndexError(i)
        x = torch.arange(3, dtype=torch.float32) + 10 * i + 1000 * self.gen
        rows = (i + self.gen) % 4
        pos = torch.arange(rows * 2, dtype=torch.float32).reshape(rows, 2) + 100 * i + 1000 * self.gen
        return {"x": x, "pos": pos}


def wait_for(path: str, timeout: float = 240) -> None:
    """Waits for the file `path` (a step another job signals), failing after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"{path} did not appear in {timeout} s"
        time.sleep(0.05)
