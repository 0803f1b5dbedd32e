"""Ragged reads in one round trip per owner (the tcp gather path), every row
checked against what its owner stored.

python ragged_gather.py mixed    (mpirun -n 3/4, tcp, DDSTORE_SHM=1)  ranks 0-1 and 2-3 pretend to
                                 be two hosts (DDSTORE_HOST_ID): own rows, same-node rows by memory
                                 copy and remote rows through the gather path in one batch; any
                                 order, repeats, rows of 0 units, the last rank's share empty; a
                                 batch of one remote owner is one request (no ends read)
python ragged_gather.py spread M (mpirun -n 2, one-sided reads)  rows of a remote owner far apart
                                 and close together through the two-step path (row ends, then values)
python ragged_gather.py stopped  (3 plain procs)  rank 0 SIGSTOPs rank 1 and reads its rows into
                                 out=: DDStoreTimeoutError naming rank 1 within DDSTORE_TIMEOUT_S,
                                 out untouched then and after SIGCONT, and reads work again
"""

from __future__ import annotations

import os
import signal
import sys
import time

# Before the store exists: ranks 0-1 on "host" h0, 2-3 on h1 (same-node pairs share memory).
if sys.argv[1] == "mixed":
    os.environ["DDSTORE_HOST_ID"] = "h%d" % (int(os.environ.get("OMPI_COMM_WORLD_RANK", "0")) // 2)

import numpy as np
from _common import main_guard, rank_tag, wait_stopped

import pyddstore

N = 97
UNIT = (3,)


def length(row: int) -> int:
    """Units of global row `row`: 0 for every seventh, up to 40 otherwise."""
    return 0 if row % 7 == 0 else (row * 11) % 40 + 1


def row_values(row: int) -> np.ndarray:
    n = length(row) * UNIT[0]
    return ((row * 1009 + np.arange(n) * 7) % 65521).astype(np.float32).reshape((-1,) + UNIT)


def my_rows(rank: int, size: int) -> range:
    """Uneven shares; the last rank holds none."""
    holders = size - 1
    per = N // holders + 1
    return range(min(N, rank * per), min(N, (rank + 1) * per)) if rank < holders else range(N, N)


def check(values, offsets, rows, what):
    assert len(offsets) == len(rows) + 1 and offsets[0] == 0, what
    assert offsets[-1] == sum(length(int(r)) for r in rows), what
    for i, r in enumerate(rows):
        got = values[offsets[i] : offsets[i + 1]]
        assert np.array_equal(got, row_values(int(r))), f"{what}: row {r} differs from its owner's"


def add(store):
    rows = my_rows(store.rank, store.size)
    vals = [row_values(r) for r in rows]
    values = np.concatenate(vals) if vals else np.empty((0,) + UNIT, np.float32)
    store.add("g", values, lengths=[length(r) for r in rows])


def mixed():
    from mpi4py import MPI

    store = pyddstore.PyDDStore(comm=MPI.COMM_WORLD, method=1)
    rank, size = store.rank, store.size
    assert store.remote_path == "gather", store.remote_path
    add(store)
    rng = np.random.default_rng(5 + rank)
    zero = [r for r in range(N) if length(r) == 0]
    batches = [
        np.arange(N),
        rng.permutation(N)[::-1],
        np.array(zero),  # only rows of 0 units
        np.array([zero[-1], N - 1, N - 1, 0, zero[-1], 1, N - 1]),  # repeats, empty rows
        np.array([], np.int64),
    ] + [rng.integers(0, N, rng.integers(1, 60)) for _ in range(30)]
    for b in batches:
        v, off = store.get_batch("g", b)
        check(v, off, b, f"{rank_tag()} batch of {len(b)}")
    prof = store.get_profile("g#values")
    partner = rank ^ 1
    if partner < size and len(my_rows(partner, size)):
        assert prof["node_rows"] > 0, f"no same-node rows by memory copy: {prof}"
    if any(r // 2 != rank // 2 and len(my_rows(r, size)) for r in range(size)):
        assert prof["remote_reads"] > 0, f"no remote rows: {prof}"
    # out=: the values land at the start of the caller's buffer, the rest untouched.
    buf = np.full((8192,) + UNIT, -3.0, np.float32)
    b = rng.integers(0, N, 50)
    v, off = store.get_batch("g", indices=b, out=buf)
    assert np.shares_memory(v, buf)
    check(v, off, b, "out=")
    assert (buf[off[-1] :] == -3.0).all(), "a ragged read wrote past its rows"
    # A batch of one remote owner: one request, no separate read of its row ends.
    other_host = [r for r in range(size) if r // 2 != rank // 2 and len(my_rows(r, size))]
    if other_host:
        owner_rows = np.array(my_rows(other_host[0], size))
        b = rng.choice(owner_rows, 40)
        before = store.get_profile("g#values")["remote_reads"], store.get_profile("g#ends")["remote_reads"]
        v, off = store.get_batch("g", b)
        check(v, off, b, "one remote owner")
        after = store.get_profile("g#values")["remote_reads"], store.get_profile("g#ends")["remote_reads"]
        assert (after[0] - before[0], after[1] - before[1]) == (1, 0), (before, after)
    store.barrier()
    store.free()
    print(f"{rank_tag()} ragged gather mixed ok", flush=True)


def spread():
    """Two-step reads (row ends, then values; no gather path): rows of a remote owner far apart
    (its ends read as several spans) and close together (one span), checked row by row."""
    from mpi4py import MPI

    method = int(sys.argv[2])
    store = pyddstore.PyDDStore(comm=MPI.COMM_WORLD, method=method)
    assert store.remote_path == "one-sided", store.remote_path
    per = 3000
    first = store.rank * per
    lens = [(r * 7) % 5 for r in range(first, first + per)]
    vals = [np.full(n, r, np.int32) for r, n in zip(range(first, first + per), lens)]
    store.add("s", np.concatenate(vals), lengths=lens)
    other = ((store.rank + 1) % store.size) * per
    batches = [
        np.array([other, other + per - 1, other + 1500]),  # far apart: a span each
        np.array([other + per - 1, other + 2, other + 2, other]),
        other + np.arange(0, per, 97),  # 31 rows, 97 apart: one span
        np.array([other + 5, first + 3, other + per - 2, first + per - 1]),  # own rows too
    ]
    for b in batches:
        v, off = store.get_batch("s", b)
        for i, r in enumerate(b):
            want = np.full((int(r) * 7) % 5, r, np.int32)
            assert np.array_equal(v[off[i] : off[i + 1]], want), f"row {r} differs"
    store.barrier()
    store.free()
    print(f"{rank_tag()} ragged spread ok", flush=True)


def stopped():
    store = pyddstore.PyDDStore(None, method=1, handshake_dir=os.environ["DDSTORE_HANDSHAKE_DIR"])
    assert store.remote_path == "gather", store.remote_path
    add(store)
    pids = store.allgather(os.getpid())
    limit = float(os.environ["DDSTORE_TIMEOUT_S"])
    if store.rank == 0:
        victims = np.array(my_rows(1, store.size))
        v, off = store.get_batch("g", victims)
        check(v, off, victims, "before the stop")
        os.kill(pids[1], signal.SIGSTOP)
        wait_stopped(pids[1])
        out = np.full((8192,) + UNIT, -7.0, np.float32)
        try:
            t0 = time.monotonic()
            try:
                store.get_batch("g", indices=victims, out=out)
                raise AssertionError("a ragged read of a stopped owner returned")
            except pyddstore.DDStoreTimeoutError as e:
                waited = time.monotonic() - t0
                assert "rank 1" in str(e), f"the timeout does not name rank 1: {e}"
                assert waited < limit + 10, f"took {waited:.1f} s with DDSTORE_TIMEOUT_S={limit}"
                print(f"stopped owner: DDStoreTimeoutError after {waited:.1f} s: {e}", flush=True)
            assert (out == -7.0).all(), "a failed read wrote into the caller's buffer"
        finally:
            os.kill(pids[1], signal.SIGCONT)
        time.sleep(1.0)  # the owner now answers the old request: never into `out`
        assert (out == -7.0).all(), "a late reply landed in a buffer the caller got back"
        for _ in range(3):
            b = np.random.default_rng(3).integers(0, N, 64)
            v, off = store.get_batch("g", b)
            check(v, off, b, "after SIGCONT")
        print("stopped owner: ragged reads after SIGCONT ok", flush=True)
    store.barrier()
    store.free()
    print(f"{rank_tag()} ragged gather stopped ok", flush=True)


if __name__ == "__main__":
    main_guard({"mixed": mixed, "stopped": stopped, "spread": spread}[sys.argv[1]])
