"""Every PyDDStore feature of the foundation, on every rank; run under
mpirun (method 0 or 1) or as plain processes with the file communicator.

    python store_basic.py <method|default> [<comm: world|none|file>]
"""

import sys

import numpy as np
from _common import DTYPES, expect_error, main_guard, rows_of, run_threads
from pyddstore._shares import share_of, shares

import pyddstore
from pyddstore import DDStoreError


def make_store(method, comm_kind):
    if comm_kind == "world":
        from mpi4py import MPI

        return pyddstore.PyDDStore(MPI.COMM_WORLD, method=method)
    return pyddstore.PyDDStore(None, method=method)


def check_batch(store, name, seed, n, shape, dtype, rows):
    out = np.empty((len(rows),) + shape, dtype)
    store.get_batch(name, out, rows)
    want = rows_of(seed, rows, shape, dtype)
    assert np.array_equal(out, want), f"{name}: rows {list(rows)[:8]}... differ"


def main():
    method = None if sys.argv[1] == "default" else int(sys.argv[1])
    comm_kind = sys.argv[2] if len(sys.argv) > 2 else "world"
    store = make_store(method, comm_kind)
    rank, size = store.rank, store.size
    rng = np.random.default_rng(1234 + rank)

    # Every dtype, N not a multiple of the ranks, rows of several elements.
    n = 37
    for seed, dtype in enumerate(DTYPES):
        shape = (3, 5)
        first, count = share_of(n, size, rank)
        counts = shares(n, size)
        name = f"v_{dtype}"
        store.add(name, rows_of(seed, np.arange(first, first + count), shape, dtype))
        assert store.info(name) == (n, 15, np.dtype(dtype).itemsize), store.info(name)
        assert store.counts(name) == counts
        rows = rng.permutation(n)
        check_batch(store, name, seed, n, shape, dtype, rows)  # every row, shuffled
        check_batch(store, name, seed, n, shape, dtype, np.concatenate([rows[:5], rows[:5], [0, 0, n - 1]]))
        check_batch(store, name, seed, n, shape, dtype, [n - 1])
        # get: a range inside each shard, at each shard boundary.
        start = 0
        for c in counts:
            if c:
                out = np.empty((c,) + shape, dtype)
                store.get(name, out, start)
                assert np.array_equal(out, rows_of(seed, np.arange(start, start + c), shape, dtype))
                one = np.empty((1,) + shape, dtype)
                store.get(name, one, start + c - 1)
                assert np.array_equal(one, rows_of(seed, [start + c - 1], shape, dtype))
            start += c

    # init + update in chunks, then read.
    first, count = share_of(50, size, rank)
    store.init("u", count, 4, 8, dtype=np.int64)
    data = rows_of(99, np.arange(first, first + count), (4,), np.int64)
    half = count // 2
    store.update("u", data[:half], 0)
    store.update("u", data[half:], half)
    store.barrier()
    check_batch(store, "u", 99, 50, (4,), np.int64, rng.integers(0, 50, 64))

    # Four threads reading at once.
    def reader(i):
        r = np.random.default_rng(100 * rank + i)
        for _ in range(50):
            check_batch(
                store, "v_float32", DTYPES.index("float32"), n, (3, 5), "float32", r.integers(0, n, 16)
            )

    run_threads(4, reader)

    # Bad input: a clear exception, then the store still works.
    good = np.empty((2, 3, 5), np.float32)
    ok = lambda: check_batch(store, "v_float32", 4, n, (3, 5), "float32", [0, n - 1])  # noqa: E731
    bad_calls = [
        (TypeError, "dtype", store.get_batch, "v_float32", np.empty((2, 3, 5), np.float64), [0, 1]),
        (
            ValueError,
            "expected 2 rows",
            store.get_batch,
            "v_float32",
            np.empty((2, 3, 4), np.float32),
            [0, 1],
        ),
        (
            TypeError,
            "contiguous",
            store.get_batch,
            "v_float32",
            np.empty((2, 3, 10), np.float32)[:, :, ::2],
            [0, 1],
        ),
        (TypeError, "read-only", store.get_batch, "v_float32", np.broadcast_to(good, (2, 3, 5)), [0, 1]),
        (IndexError, f"index {n}", store.get_batch, "v_float32", good, [0, n]),
        (IndexError, "index -1", store.get_batch, "v_float32", good, [-1, 0]),
        (TypeError, "integers", store.get_batch, "v_float32", good, [0.5, 1.5]),
        (TypeError, "integers", store.get_batch, "v_float32", good, np.array([0.0, 1.0])),
        (KeyError, "unknown variable 'nope'", store.get_batch, "nope", good, [0, 1]),
        (IndexError, "out of range", store.get, "v_float32", good, n - 1),
        (ValueError, "already exists", store.add, "v_float32", np.zeros((1, 3, 5), np.float32)),
        (TypeError, "numpy array", store.get_batch, "v_float32", [[0.0]], [0]),
    ]
    # A range spanning shards reads once per owner; an empty get reads nothing, even at the end.
    counts = shares(n, size)
    span = np.empty((min(3, n - counts[0] + 1),) + (3, 5), np.float32)
    store.get("v_float32", span, counts[0] - 1)
    assert np.array_equal(
        span, rows_of(4, np.arange(counts[0] - 1, counts[0] - 1 + len(span)), (3, 5), "float32")
    )
    for start in (0, counts[0], n):
        store.get("v_float32", np.empty((0, 3, 5), np.float32), start)
    bad_calls.append(
        (IndexError, "out of range", store.get, "v_float32", np.empty((0, 3, 5), np.float32), n + 1)
    )
    for exc, frag, fn, *args in bad_calls:
        e = expect_error(exc, frag, fn, *args)
        assert isinstance(e, DDStoreError), f"{type(e)} is not a DDStoreError"
        ok()
    # Mismatched row widths across ranks: every rank gets the error, nobody hangs.
    width = 4 if rank == 0 else 5
    if size > 1:
        expect_error(
            ValueError, "same shape and dtype", store.add, "ragged", np.zeros((2, width), np.float32)
        )
    ok()

    # Upstream (HydraGNN) style: epoch_begin/get/epoch_end.
    store.epoch_begin()
    buf = np.empty((1, 3, 5), np.float32)
    store.get("v_float32", buf, 0)
    store.epoch_end()
    assert np.array_equal(buf, rows_of(4, [0], (3, 5), "float32"))
    prof = store.get_profile("v_float32")
    assert prof["rows"] > 0 and prof["calls"] > 0
    store.barrier()
    store.free()
    store.free()  # idempotent
    expect_error(pyddstore.DDStoreFreedError, "freed", store.get_batch, "v_float32", good, [0, 1])
    print(f"rank {rank}/{size}: store_basic ok (method {store.method}, {store.transport})")


if __name__ == "__main__":
    main_guard(main)
