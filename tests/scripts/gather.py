"""The owner-side gather path (DDSTORE_REMOTE_GATHER): every read checked against the owner's rows.

mpirun -n 3 python gather.py read           method 1: 3 KB, 1 MB and 13 B rows; shuffled batches
                                            with repeats and the reader's own rows, get(), 4
                                            threads, a forked child; expects remote_path from
                                            GATHER_EXPECT (default "gather")
python gather.py stopped  (3 plain procs)   rank 0 SIGSTOPs rank 1 and reads its rows (on the
                                            path DDSTORE_REMOTE_GATHER picks: auto reads them
                                            one-sided, 1 gathers, 0 is one-sided only): a
                                            DDStoreTimeoutError naming rank 1 within
                                            DDSTORE_TIMEOUT_S; after SIGCONT the late data
                                            never lands in the caller's buffer (refilled with
                                            a pattern), not even while later reads progress
                                            the provider, and reads work
python gather.py core --hs DIR              method-2 core (one process): publishes "g", frees it
                                            when {hs}/free-now appears, serves until {hs}/STOP
python gather.py extra --hs DIR             joins "g", reads it (gather path, verified), asks the
                                            core to free, then a read is an error and never data
mpirun -n 4 python gather.py capped         DDSTORE_GATHER_READERS below the job's readers: 3
                                            threads per rank (each its own reader endpoint) read
                                            every owner at once; every row checked, and the
                                            job's busy_retries (allgathered) printed by rank 0
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import numpy as np
from _common import main_guard, rank_tag, rows_of, run_threads, wait_stopped
from pyddstore._shares import share_of

import pyddstore

# name -> (rows, row shape, dtype): 3 KB rows, 1 MB rows (split by DDSTORE_MAX_READ_BYTES
# when it is small), 13-byte rows (packed replies of odd sizes).
VARS = {
    "small": (301, (768,), np.float32),
    "big": (7, (1 << 18,), np.float32),
    "odd": (97, (13,), np.uint8),
}


def seed(name: str) -> int:
    return sorted(VARS).index(name) + 3


def check(store, name, rows):
    _, shape, dtype = VARS[name]
    rows = np.asarray(rows, dtype=np.int64)
    out = np.empty((len(rows),) + shape, dtype)
    store.get_batch(name, out, rows)
    want = rows_of(seed(name), rows, shape, dtype)
    assert np.array_equal(out, want), f"{name}: rows {rows[:8]} differ from the owners' data"


def add_all(store):
    for name, (n, shape, dtype) in VARS.items():
        first, count = share_of(n, store.size, store.rank)
        store.add(name, rows_of(seed(name), np.arange(first, first + count), shape, dtype))


def path_choice(store, expect: str) -> None:
    """Which path remote reads took (get_profile's gather_requests): under auto an owner's
    single short read and two reads of 3 KB go one-sided and three rows go as one gathered
    request; DDSTORE_REMOTE_GATHER=1 gathers all of them, one-sided stores gather none."""
    n = VARS["small"][0]
    first, _ = share_of(n, store.size, (store.rank + 1) % store.size)

    def sent(rows):
        before = store.get_profile("small")
        check(store, "small", rows)
        after = store.get_profile("small")
        return tuple(after[k] - before[k] for k in ("gather_requests", "remote_rows"))

    # Rows two apart: never merged into one read.
    (one, remote_one), (two, _), (three, _) = (sent(first + np.arange(k) * 2) for k in (1, 2, 3))
    mode = os.environ.get("DDSTORE_REMOTE_GATHER", "auto")
    if expect != "gather" or remote_one == 0:  # one-sided, or same-node rows by memory copy
        want = (0, 0, 0)
    else:
        want = (1, 1, 1) if mode == "1" else (0, 0, 1)
    got = (one, two, three)
    assert got == want, f"gather requests for 1, 2 and 3 rows: {got}, expected {want} ({mode})"


def read():
    from mpi4py import MPI

    store = pyddstore.PyDDStore(MPI.COMM_WORLD, method=1)
    expect = os.environ.get("GATHER_EXPECT", "gather")
    assert store.remote_path == expect, f"remote_path {store.remote_path!r}, expected {expect!r}"
    add_all(store)
    path_choice(store, expect)
    rank = store.rank
    rng = np.random.default_rng(11 + rank)
    for name, (n, _, _) in VARS.items():
        check(store, name, rng.permutation(n))  # every row, own rows among them
        check(store, name, [n - 1, 0, 0, n - 1, n // 2, n // 2, 0])  # repeats
        first, count = share_of(n, store.size, (rank + 1) % store.size)
        check(store, name, np.arange(first, first + count)[::-1])  # one owner, reversed
        check(store, name, np.arange(first, first + count))  # one owner, contiguous
        check(store, name, [])
        _, shape, dtype = VARS[name]
        for row in (0, n - 1, first):
            one = np.empty((1,) + shape, dtype)
            store.get(name, one, row)
            assert np.array_equal(one, rows_of(seed(name), [row], shape, dtype)), f"{name}: get({row})"

    def reader(t):
        r = np.random.default_rng(100 * rank + t)
        for i in range(25):
            name = ("small", "odd", "big")[i % 3]
            n = VARS[name][0]
            check(store, name, r.integers(0, n, 128 if name != "big" else 9))

    run_threads(4, reader)
    store.barrier()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            store.fork_reader()
            for name, (n, _, _) in VARS.items():
                check(store, name, np.random.default_rng(5).integers(0, n, 64))
            code = 0
        except BaseException as e:  # noqa: BLE001 - reported, then the child exits non-zero
            print(f"{rank_tag()} forked child failed: {e!r}", file=sys.stderr, flush=True)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "forked child failed to read"
    store.barrier()
    store.free()
    print(f"{rank_tag()} gather read ok ({store.transport}, {expect})", flush=True)


def stopped():
    store = pyddstore.PyDDStore(None, method=1, handshake_dir=os.environ["DDSTORE_HANDSHAKE_DIR"])
    add_all(store)
    pids = store.allgather(os.getpid())
    limit = float(os.environ["DDSTORE_TIMEOUT_S"])
    if store.rank == 0:
        mode = os.environ.get("DDSTORE_REMOTE_GATHER", "auto")
        assert store.remote_path == ("one-sided" if mode == "0" else "gather"), store.remote_path
        first, count = share_of(VARS["small"][0], store.size, 1)
        victims = np.arange(first, first + count)
        before = store.get_profile("small")["gather_requests"]
        check(store, "small", victims)
        # One read of rank 1's ~300 KB: auto reads it one-sided (per request), 1 gathers it.
        gathered = store.get_profile("small")["gather_requests"] - before
        assert gathered == (1 if mode == "1" else 0), (mode, gathered)
        os.kill(pids[1], signal.SIGSTOP)
        wait_stopped(pids[1])
        try:
            out = np.full((len(victims), 768), -7.0, np.float32)
            t0 = time.monotonic()
            try:
                store.get_batch("small", out, victims)
                raise AssertionError("a read of a stopped owner returned")
            except pyddstore.DDStoreTimeoutError as e:
                waited = time.monotonic() - t0
                assert "rank 1" in str(e), f"the timeout does not name rank 1: {e}"
                assert waited < limit + 10, f"took {waited:.1f} s with DDSTORE_TIMEOUT_S={limit}"
                print(f"stopped owner: DDStoreTimeoutError after {waited:.1f} s: {e}", flush=True)
            assert (out == -7.0).all(), "a read that timed out wrote into the caller's buffer"
            # The caller owns `out` again: whatever it writes now must survive the late data.
            out[:] = np.arange(out.size, dtype=np.float32).reshape(out.shape) + 0.5
            pattern = out.copy()
        finally:
            os.kill(pids[1], signal.SIGCONT)
        time.sleep(1.0)  # the owner now answers the old request: never into `out`
        assert np.array_equal(out, pattern), "a late reply landed in a buffer the caller got back"
        for _ in range(3):
            # Later reads progress the provider (its progress may be domain-wide).
            check(store, "small", victims)
            check(store, "small", np.random.default_rng(3).integers(0, VARS["small"][0], 128))
        assert np.array_equal(out, pattern), "a late reply landed while later reads progressed"
        print("stopped owner: reads after SIGCONT ok", flush=True)
    # free() synchronises even after a read timed out (the owner only stalled).
    store.barrier()
    store.free()
    print(f"{rank_tag()} gather stopped ok", flush=True)


def core(hs):
    comm = pyddstore.FileComm(os.path.join(hs, "filecomm"))
    store = pyddstore.PyDDStore(comm, method=2, handshake_dir=hs)
    n, shape, dtype = VARS["small"]
    store.add("g", rows_of(seed("small"), np.arange(n), shape, dtype))
    print(f"core ready {store.remote_path}", flush=True)
    while not os.path.exists(os.path.join(hs, "free-now")):
        time.sleep(0.05)
    store.free()
    open(os.path.join(hs, "freed"), "w").close()
    while not os.path.exists(os.path.join(hs, "STOP")):
        time.sleep(0.05)
    print("core stopped", flush=True)


def extra(hs):
    store = pyddstore.PyDDStore(None, method=2, handshake_dir=hs, n_core=1)
    store.join("g", timeout_s=60)
    assert store.remote_path == "gather", store.remote_path
    n, shape, dtype = VARS["small"]
    out = np.empty((128,) + shape, dtype)
    r = np.random.default_rng(9)
    for _ in range(10):
        rows = r.integers(0, n, 128)
        store.get_batch("g", out, rows)
        assert np.array_equal(out, rows_of(seed("small"), rows, shape, dtype)), "extra: rows differ"
    open(os.path.join(hs, "free-now"), "w").close()
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(hs, "freed")):
        assert time.monotonic() < deadline, "the core did not free"
        time.sleep(0.05)
    out[:] = -7
    try:
        store.get_batch("g", out, r.integers(0, n, 128))
        raise AssertionError("a read of a freed variable returned")
    except pyddstore.DDStoreError as e:
        assert (out == -7).all(), "a failed read wrote into the caller's buffer"
        print(f"freed variable: {type(e).__name__}: {e}", flush=True)
    store.free()
    print("extra freed-variable ok", flush=True)


def capped():
    """More reader endpoints than each owner serves at once: all read every owner together."""
    from mpi4py import MPI

    store = pyddstore.PyDDStore(MPI.COMM_WORLD, method=1)
    add_all(store)
    rank, threads = store.rank, 3
    start = threading.Barrier(threads)
    store.barrier()

    def reader(t):
        r = np.random.default_rng(1000 * rank + t)
        start.wait()
        for i in range(12):
            name = ("small", "big", "odd")[i % 3]
            n = VARS[name][0]
            check(store, name, r.integers(0, n, 128 if name != "big" else 7))

    run_threads(threads, reader)
    retries = sum(store.allgather(sum(store.get_profile(n)["busy_retries"] for n in VARS)))
    store.barrier()
    store.free()
    if rank == 0:
        print(f"capped read ok: busy_retries={retries}", flush=True)


def main():
    mode = sys.argv[1]
    if mode == "read":
        read()
    elif mode == "capped":
        capped()
    elif mode == "stopped":
        stopped()
    elif mode == "core":
        core(sys.argv[3])
    elif mode == "extra":
        extra(sys.argv[3])
    else:
        raise SystemExit(f"unknown mode {mode}")


main_guard(main)
