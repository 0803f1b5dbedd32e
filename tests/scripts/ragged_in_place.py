"""Ragged variables whose values are written in place while they are created
(`PyDDStore._init_ragged`, Rust's one creation protocol `Store.init_ragged`,
as `pyddstore.torch` loads ragged fields): every rank's `fill` writes its
values with `update` of the values part it is given, in two pieces, the
second first; every row read back on every rank and checked against what its
owner wrote; the one-round-trip gather path used on tcp (each rank's longest
row agreed). Then a `fill` that raises on one rank fails every rank (that
rank with its own exception, the others naming it), and the store goes on
working.

    python ragged_in_place.py <comm: world|none>
"""

import sys

import numpy as np
from _common import expect_error, main_guard

import pyddstore
from pyddstore import DDStoreError

N = 29
UNIT = (3,)


def length(row: int) -> int:
    """Units of global row `row`: 0 for every fifth row."""
    return 0 if row % 5 == 0 else row % 4 + 1


def row_values(row: int) -> np.ndarray:
    n = length(row)
    return (row * 100 + np.arange(n * 3)).astype(np.float32).reshape((n,) + UNIT)


def my_rows(rank: int, size: int) -> range:
    per = -(-N // size)
    return range(min(N, rank * per), min(N, (rank + 1) * per))


class Refused(RuntimeError):
    """What the failing rank's fill raises."""


def main():
    if sys.argv[1] == "world":
        from mpi4py import MPI

        store = pyddstore.PyDDStore(comm=MPI.COMM_WORLD, method=1)
    else:
        store = pyddstore.PyDDStore(comm=None, method=1)
    rank, size = store.rank, store.size
    rows = my_rows(rank, size)
    lengths = [length(r) for r in rows]
    mine = np.concatenate([row_values(r) for r in rows]) if rows else np.empty((0,) + UNIT, np.float32)
    calls = []

    def fill(values_part):
        calls.append(values_part)
        half = len(mine) // 2
        store.update(values_part, mine[half:], offset=half)
        store.update(values_part, mine[:half], offset=0)

    store._init_ragged("g", lengths, UNIT, np.float32, fill)
    assert len(calls) == 1 and calls[0] != "g", calls
    assert store.is_ragged("g") and store.info("g")[0] == N, store.info("g")
    rng = np.random.default_rng(3 + rank)
    for b in [np.arange(N), rng.permutation(N), np.array([0, 0, 5, 1, N - 1])] + [
        rng.integers(0, N, 12) for _ in range(10)
    ]:
        values, offsets = store.get_batch("g", b)
        assert values.dtype == np.float32 and len(offsets) == len(b) + 1
        for i, r in enumerate(b):
            got, want = values[offsets[i] : offsets[i + 1]], row_values(int(r))
            assert got.shape == want.shape and np.array_equal(got, want), f"row {r} differs"

    # A fill that raises on the last rank: that rank raises its own exception, every other
    # rank an error naming it; none waits for the others.
    def failing(values_part):
        if rank == size - 1:
            raise Refused("no values on this rank")
        store.update(values_part, mine)

    if rank == size - 1:
        expect_error(
            Refused, "no values on this rank", store._init_ragged, "h", lengths, UNIT, np.float32, failing
        )
    else:
        expect_error(
            DDStoreError, f"rank {size - 1}", store._init_ragged, "h", lengths, UNIT, np.float32, failing
        )
    assert not store.is_ragged("h")

    # A bad write (the wrong dtype) is refused where it happens, like update()'s.
    def wrong_dtype(values_part):
        store.update(values_part, mine.astype(np.float64))

    expect_error(
        (TypeError, DDStoreError), "dtype", store._init_ragged, "k", lengths, UNIT, np.float32, wrong_dtype
    )
    # The store still works: a ragged variable added afterwards reads back.
    store.add("after", mine, lengths=lengths)
    values, offsets = store.get_batch("after", np.arange(N))
    assert np.array_equal(values, np.concatenate([row_values(r) for r in range(N)]))
    store.free()
    print(f"ragged_in_place ok (rank {rank} of {size}, {store.remote_path} remote reads)")


if __name__ == "__main__":
    main_guard(main)
