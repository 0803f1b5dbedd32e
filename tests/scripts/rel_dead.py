"""A rank killed with SIGKILL while the others read in a loop.

    python rel_dead.py <method> <comm: world|none>
    python rel_dead.py extra <n_core>     (method 2: an extra job reading the core group)

Rank 1 SIGKILLs itself once every rank has read from it. Under mpirun
(method 0) the launcher is expected to end the whole job. With the file
communicator (methods 1, 2) every survivor must get DDStoreTimeoutError
naming rank 1 within DDSTORE_TIMEOUT_S (+ slack), then free() raises
DDStoreTimeoutError naming rank 1 within the timeout too, and it exits 0.
With REL_DEAD_EXTRA=1 the core group (method 2) waits until an extra job
has joined and read before rank 1 dies; the extra job must then get
DDStoreTimeoutError naming rank 1 too.
"""

import os
import signal
import sys
import time

import numpy as np
from _common import main_guard, rows_of
from pyddstore._shares import share_of

import pyddstore

N, SHAPE, VICTIM, SLACK_S = 60, (128,), 1, 15.0


def make_store(method, kind):
    if kind == "world":
        from mpi4py import MPI

        return pyddstore.PyDDStore(MPI.COMM_WORLD, method=method)
    return pyddstore.PyDDStore(None, method=method, handshake_dir=os.environ["DDSTORE_HANDSHAKE_DIR"])


def extra_ready_path():
    return os.path.join(os.environ["DDSTORE_HANDSHAKE_DIR"], "extra-ready")


def wait_for_extra():
    deadline = time.monotonic() + 60
    while not os.path.exists(extra_ready_path()):
        if time.monotonic() > deadline:
            raise TimeoutError("the extra job did not report ready within 60 s")
        time.sleep(0.05)


def checked_reader(store, out, seed, low=0, high=N):
    """A read of random rows in low..high into `out`, checked against the owners' data."""
    rng = np.random.default_rng(seed)

    def read_once():
        rows = rng.integers(low, high, len(out))
        store.get_batch("v", out, rows)
        assert np.array_equal(out, rows_of(4, rows, SHAPE, "float32")), f"rows {rows[:6]} differ"

    return read_once


def victim_reader(store, out):
    """A read of random rows that all belong to the victim rank."""
    first, count = share_of(N, len(store.counts("v")), VICTIM)
    return checked_reader(store, out, 7, first, first + count)


def read_until_victim_fails(store, read_once, start, limit, errors=(pyddstore.DDStoreTimeoutError,)):
    reads = 0
    while True:
        try:
            read_once()
            reads += 1
        except errors as e:
            waited = time.monotonic() - start
            assert f"rank {VICTIM}" in str(e), f"timeout does not name rank {VICTIM}: {e}"
            assert waited < limit + SLACK_S, f"took {waited:.1f} s with DDSTORE_TIMEOUT_S={limit}"
            return waited, reads, e
        if time.monotonic() - start > limit + SLACK_S:
            raise AssertionError(f"still reading {time.monotonic() - start:.0f} s after rank {VICTIM} died")


def extra(n_core):
    store = pyddstore.PyDDStore(
        None, method=2, n_core=int(n_core), handshake_dir=os.environ["DDSTORE_HANDSHAKE_DIR"]
    )
    store.join("v", timeout_s=60)
    out = np.empty((16,) + SHAPE, np.float32)
    read_once = checked_reader(store, out, 99)
    for _ in range(20):
        read_once()
    with open(extra_ready_path(), "w") as f:
        f.write("ready")
    limit = float(os.environ.get("DDSTORE_TIMEOUT_S", "60"))
    # The victim dies once the core ranks see the ready file (polled every 50 ms). The survivors
    # then time out and free, withdrawing the record: the extra's read fails either as a timeout
    # naming the victim or, once the record is gone while the publishing rank lives, as stale
    # (which names the victim too); both within the deadline.
    errors = (pyddstore.DDStoreTimeoutError, pyddstore.DDStoreStaleError)
    waited, reads, e = read_until_victim_fails(
        store, victim_reader(store, out), time.monotonic(), limit + 5, errors
    )
    print(f"extra: {type(e).__name__} after {waited:.1f} s and {reads} reads: {e}", flush=True)
    store.free()
    print("extra: freed, exiting", flush=True)


def main():
    if sys.argv[1] == "extra":
        return extra(sys.argv[2])
    method, kind = int(sys.argv[1]), sys.argv[2]
    store = make_store(method, kind)
    first, count = share_of(N, store.size, store.rank)
    store.add("v", rows_of(4, np.arange(first, first + count), SHAPE, "float32"))
    out = np.empty((16,) + SHAPE, np.float32)
    read_once = checked_reader(store, out, store.rank)
    for _ in range(20):
        read_once()
    if os.environ.get("REL_DEAD_EXTRA") == "1":
        wait_for_extra()
    store.barrier()
    if store.rank == VICTIM:
        print(f"rank {store.rank}: SIGKILL self", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    limit = float(os.environ.get("DDSTORE_TIMEOUT_S", "60"))
    # From now on read the victim's rows: a survivor that has already given up and exited
    # is gone too, and its rows would fail for its own reason.
    waited, reads, e = read_until_victim_fails(store, victim_reader(store, out), time.monotonic(), limit)
    print(f"rank {store.rank}: TimeoutError after {waited:.1f} s and {reads} reads: {e}", flush=True)
    # free() synchronises within DDSTORE_TIMEOUT_S: the dead rank is named, never waited for.
    t0 = time.monotonic()
    try:
        store.free()
        raise AssertionError("free() completed although rank 1 is dead")
    except pyddstore.DDStoreTimeoutError as e:
        assert f"[{VICTIM}]" in str(e), f"free() does not name rank {VICTIM}: {e}"
        assert time.monotonic() - t0 < limit + SLACK_S, f"free() took {time.monotonic() - t0:.1f} s"
    print(f"rank {store.rank}: freed, exiting", flush=True)


if __name__ == "__main__":
    main_guard(main)
