"""Method 1 beyond the basics: a forked child reading through fork_reader(),
registered destination buffers, rows wider than DDSTORE_MAX_READ_BYTES, and
a peer that exits early (TimeoutError naming it, no hang).

    python fabric_extra.py <scenario> [<comm: world|none>]
"""

import os
import sys
import time

import numpy as np
from _common import expect_error, main_guard, rows_of
from pyddstore._shares import share_of

import pyddstore


def make_store(comm_kind):
    if comm_kind == "world":
        from mpi4py import MPI

        return pyddstore.PyDDStore(MPI.COMM_WORLD, method=1)
    return pyddstore.PyDDStore(None, method=1)


def load(store, name, n, shape, dtype="float32", seed=5):
    first, count = share_of(n, store.size, store.rank)
    store.add(name, rows_of(seed, np.arange(first, first + count), shape, dtype))


def verify(store, name, rows, shape, dtype="float32", seed=5, out=None):
    out = np.empty((len(rows),) + shape, dtype) if out is None else out
    store.get_batch(name, out, rows)
    assert np.array_equal(out, rows_of(seed, rows, shape, dtype)), f"rows {rows[:6]} differ"


def features(comm_kind):
    store = make_store(comm_kind)
    n, shape = 103, (64,)
    load(store, "v", n, shape)
    # Wide rows: 16 KiB rows with DDSTORE_MAX_READ_BYTES=4096 set by the test.
    load(store, "wide", 9, (4096,), seed=9)
    rng = np.random.default_rng(store.rank)
    verify(store, "wide", rng.integers(0, 9, 12), (4096,), seed=9)
    # Registered destination buffers, reused across reads.
    buf = np.empty((32,) + shape, np.float32)
    store.register_recv("v", buf)
    for _ in range(20):
        verify(store, "v", rng.integers(0, n, 32), shape, out=buf)
    store.unregister_recv("v", buf)
    verify(store, "v", rng.integers(0, n, 32), shape, out=buf)
    # A forked child opens fresh readers and reads every rank's rows.
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            store.fork_reader()
            verify(store, "v", np.random.default_rng(99).permutation(n), shape)
            verify(store, "wide", np.arange(9), (4096,), seed=9)
        except BaseException as e:  # noqa: BLE001 - reported through the exit code
            print(f"child failed: {e!r}", file=sys.stderr, flush=True)
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "forked child failed to read"
    verify(store, "v", rng.integers(0, n, 64), shape)
    prof = store.get_profile("v")
    assert prof["remote_rows"] > 0 or store.size == 1, prof
    store.barrier()
    store.free()
    print(f"rank {store.rank}: fabric features ok ({store.transport})")


def dead_peer(comm_kind):
    store = make_store(comm_kind)
    n, shape = 40, (256,)
    load(store, "v", n, shape)
    first1, count1 = share_of(n, store.size, 1)
    rows1 = np.arange(first1, first1 + count1)
    verify(store, "v", rows1, shape)  # connected to rank 1 while it lives
    store.barrier()
    if store.rank == 1:
        os._exit(0)  # dies without freeing anything
    time.sleep(0.5)
    start = time.monotonic()
    e = expect_error(TimeoutError, "rank 1", verify, store, "v", rows1, shape)
    waited = time.monotonic() - start
    assert isinstance(e, pyddstore.DDStoreTimeoutError)
    limit = float(os.environ["DDSTORE_TIMEOUT_S"])
    assert waited < limit + 10, f"took {waited:.1f} s with DDSTORE_TIMEOUT_S={limit}"
    own_first, own_count = share_of(n, store.size, store.rank)
    verify(store, "v", np.arange(own_first, own_first + own_count), shape)  # still usable
    print(f"rank {store.rank}: dead peer -> TimeoutError after {waited:.1f} s: {e}")
    os._exit(0)  # the peer is gone: skip collective teardown


if __name__ == "__main__":
    main_guard(lambda: globals()[sys.argv[1]](sys.argv[2] if len(sys.argv) > 2 else "world"))
