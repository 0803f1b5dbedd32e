"""Ragged variables through PyDDStore on every rank, checked row by row
against what the owning rank stored: rows of 0 units, a rank without rows,
random batches with repeats, the out= form, threads; plus the upstream
behaviours (comm=, epoch nesting, register_recv, get_profile keys).

    python ragged_store.py <method> <comm: world|none>
"""

import os
import sys

import numpy as np
from _common import expect_error, main_guard, run_threads

import pyddstore
from pyddstore import DDStoreError

N = 41


def length(row: int) -> int:
    """Units of global row `row`: 0 for every sixth row."""
    return 0 if row % 6 == 0 else (row * 5) % 9 + 1


def row_values(row: int, unit, dtype) -> np.ndarray:
    n = length(row)
    k = int(np.prod(unit)) if unit else 1
    vals = (row * 1009 + np.arange(n * k) * 13) % 997
    return vals.astype(dtype).reshape((n,) + tuple(unit))


def my_rows(rank: int, size: int) -> range:
    """Uneven shares; with several ranks, the last rank holds none."""
    holders = max(1, size - 1)
    if rank >= holders:
        return range(N, N)
    per = N // holders + 1
    return range(min(N, rank * per), min(N, (rank + 1) * per))


def check(values, offsets, rows, unit, dtype, what):
    assert offsets.dtype == np.int64 and len(offsets) == len(rows) + 1, what
    for i, r in enumerate(rows):
        got = values[offsets[i] : offsets[i + 1]]
        want = row_values(int(r), unit, dtype)
        assert got.shape == want.shape and np.array_equal(got, want), f"{what}: row {r} differs"


def main():
    method = int(sys.argv[1])
    if sys.argv[2] == "world":
        from mpi4py import MPI

        store = pyddstore.PyDDStore(comm=MPI.COMM_WORLD, method=method)
    else:
        store = pyddstore.PyDDStore(comm=None, method=method)
    rank, size = store.rank, store.size
    rng = np.random.default_rng(7 + rank)
    for name, unit, dtype in (("pos", (3,), np.float32), ("edges", (2,), np.int64), ("rec", (), np.uint8)):
        rows = my_rows(rank, size)
        vals = [row_values(r, unit, dtype) for r in rows]
        values = np.concatenate(vals) if vals else np.empty((0,) + unit, dtype)
        store.add(name, values, lengths=[length(r) for r in rows])
        assert store.is_ragged(name) and store.info(name)[0] == N, store.info(name)
        batches = [
            np.arange(N),
            rng.permutation(N),
            np.array([0, 0, 6, 1, 1, 6, N - 1]),  # empty rows and repeats
            np.array([], np.int64),
        ] + [rng.integers(0, N, rng.integers(1, 30)) for _ in range(20)]
        for b in batches:
            v, off = store.get_batch(name, b)
            check(v, off, b, unit, dtype, name)
        # out=: values land at the start of a preallocated buffer.
        buf = np.full((4096,) + unit, 77, dtype)
        b = rng.integers(0, N, 16)
        v, off = store.get_batch(name, indices=b, out=buf)
        assert np.shares_memory(v, buf)
        check(v, off, b, unit, dtype, name + " out=")
        expect_error(ValueError, "needs", lambda: store.get_batch(name, b, out=np.empty(1, dtype)))
        wrong = np.empty(4096, np.float64 if dtype != np.float64 else np.int32)
        expect_error(TypeError, "dtype", lambda: store.get_batch(name, b, out=wrong))
        expect_error(IndexError, f"index {N}", store.get_batch, name, [0, N])
        expect_error(TypeError, "ragged", store.get_batch, name, np.empty(3), [0, 1, 2])

        def reader(t):
            r = np.random.default_rng(100 * rank + t)
            for _ in range(20):
                b = r.integers(0, N, 12)
                v, off = store.get_batch(name, b)
                check(v, off, b, unit, dtype, f"{name} thread {t}")

        run_threads(3, reader)
    # A ragged variable's profile counts its rows and value bytes, each row by where it came from.
    b = rng.integers(0, N, 25)
    before = store.get_profile("pos")
    v, _ = store.get_batch("pos", b)
    after = store.get_profile("pos")
    counted = ("calls", "rows", "bytes", "local_rows", "node_rows", "remote_rows")
    d = {k: after[k] - before[k] for k in counted}
    own = sum(1 for r in b if int(r) in my_rows(rank, size))
    assert d["calls"] == 1 and d["rows"] == len(b) and d["bytes"] == v.nbytes, d
    assert d["local_rows"] == own and d["node_rows"] + d["remote_rows"] == len(b) - own, d
    if os.environ.get("DDSTORE_SHM") == "0":
        assert d["node_rows"] == 0, d
    # Through the fabric: a batch costs one read of row ends per owner plus the values' reads.
    if rank > 0 and os.environ.get("DDSTORE_SHM") == "0" and store.transport.startswith("ofi"):
        b = rng.choice(np.array(my_rows(0, size)), 12)  # rows of rank 0 only
        before = store.get_profile("pos")["remote_reads"]
        store.get_batch("pos", b)
        reads = store.get_profile("pos")["remote_reads"] - before
        nonempty = len({int(r) for r in b if length(int(r))})
        assert reads <= nonempty + 1, f"{reads} reads for {nonempty} rows of one owner"
    # A mismatch (ragged on one rank, fixed on another) fails every rank, no hang.
    if size > 1:
        arr = np.zeros((2, 4), np.float32)
        e = expect_error(
            DDStoreError,
            "",
            lambda: store.add("mixed", arr, lengths=[1, 1]) if rank == 0 else store.add("mixed", arr),
        )
        assert isinstance(e, DDStoreError)

    # Upstream behaviours.
    for m in ("get", "get_batch", "epoch_begin", "epoch_end", "add"):
        assert getattr(pyddstore.PyDDStore, m).__doc__, m
    store.epoch_begin()
    if method == 0:  # as upstream: method 0 fences (collective) and refuses nesting; others do nothing
        expect_error(ValueError, "already open", store.epoch_begin)
    store.epoch_end()
    if method == 0:
        expect_error(ValueError, "no epoch", store.epoch_end)
    else:
        store.epoch_end()
    store.add("fixed", np.arange(6 * 4, dtype=np.float32).reshape(6, 4) + 100 * rank)
    recv = np.empty((2, 4), np.float32)
    store.register_recv("fixed", recv)
    store.register_recv("fixed", recv)  # the same buffer: one registration
    store.get_batch("fixed", recv, [0, 6 * size - 1])
    assert recv[0, 0] == 0 and recv[1, 0] == 100 * (size - 1) + 20
    store.unregister_recv("fixed", recv)
    expect_error(ValueError, "not registered", store.unregister_recv, "fixed", recv)
    store.get("fixed", np.empty((0, 4), np.float32), 6 * size)
    expect_error(TypeError, "indices are missing", store.get_batch, "fixed", [0, 1])
    # get_profile() keys mean what upstream's do: py_gets counts get() and get_batch() calls,
    # py_get is the seconds in both, py_sync device synchronisation (0 in host memory), and
    # lock_wait, mr, read and cq are parts of those calls: upstream's "other" is never negative.
    before = store.get_profile()
    last = np.empty((3, 4), np.float32)
    for _ in range(4):
        store.get_batch("fixed", recv, [0, 6 * size - 1])  # rank 0's and the last rank's rows
    store.get("fixed", last, 6 * size - 3)
    assert last[0, 0] == 100 * (size - 1) + 12, last
    prof = store.get_profile()
    for k in ("calls", "rows", "py_get", "py_gets", "py_sync", "lock_wait", "mr", "mr_miss", "read", "cq"):
        assert k in prof, k
    assert prof["py_gets"] - before["py_gets"] == 5 and prof["py_get"] > before["py_get"], (before, prof)
    for p in (before, prof):
        assert p["py_sync"] == 0.0 and min(p[k] for k in ("lock_wait", "mr", "read", "cq")) >= 0, p
        other = p["py_get"] - p["py_sync"] - p["lock_wait"] - p["mr"] - p["read"] - p["cq"]
        assert other >= 0, f"upstream's other = {other} < 0: {p}"
    if size > 1 and method == 1 and os.environ.get("DDSTORE_SHM") == "0":
        assert prof["cq"] > 0, prof  # remote reads waited for their completions
    assert sorted(store.names()) == ["edges", "fixed", "pos", "rec"], store.names()
    store.free()
    path = store.remote_path
    print(f"rank {rank}/{size}: ragged_store ok (method {method}, {store.transport}, {path} remote reads)")


if __name__ == "__main__":
    main_guard(main)
