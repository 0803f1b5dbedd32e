"""Native file loads from a file system that hangs (tests/scripts/hangfs.py mounted at MNT).

    python hungfs_load.py single MNT SERVER_PID   (one process, PyDDStore.load_file_ranges)
    mpirun -n 2 python hungfs_load.py dist MNT SERVER_PID   (DistDataset of a .npy list)

`single`: a slow file (every READ answered 0.8 s late) loads in full past the deadline
(DDSTORE_LOAD_TIMEOUT_S=3: progress, not completion, counts), content checked; a load with
one hung range raises DDStoreTimeoutError naming the file and byte range within the deadline
while the other ranges land (checked); the share stays mapped after free() while the
abandoned reader may still write, the hung READ is then answered (SIGUSR1 to the server), the
reader exits, the mapping goes, and the process exits cleanly.

`dist`: rows of rank 1 come from b.npy, whose data never arrives: both ranks raise
DDStoreTimeoutError (rank 1 naming b.npy, rank 0 naming rank 1), neither hangs.

Each prints one "report: {json}" line.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import numpy as np

import pyddstore
from pyddstore import DDStoreTimeoutError


def pattern(name: str, n: int) -> bytes:
    seed = sum(name.encode())
    return ((np.arange(n, dtype=np.int64) * 7 + seed + np.arange(n) // 251) % 256).astype(np.uint8).tobytes()


def load_threads() -> int:
    """Threads of this process named ddstore-load (the native file load's readers)."""
    n = 0
    for t in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{t}/comm") as f:
                n += f.read().strip() == "ddstore-load"
        except OSError:
            pass
    return n


def wait_for(cond, secs: float) -> bool:
    end = time.monotonic() + secs
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def mapped(label: str) -> bool:
    with open("/proc/self/maps") as f:
        return any(label in line for line in f)


def single(mnt: str, server: int) -> dict:
    rep: dict = {}
    store = pyddstore.PyDDStore(None)
    k = 64 << 10
    # Slow but moving: 6 reads of 64 KiB one after another, each answered 0.8 s late (4.8 s
    # in all, past the 3 s deadline).
    store.add("slow", np.zeros(6 * k, np.uint8))
    ranges = np.array([[0, i * k, k, -1, 0, k, i * k] for i in range(6)], np.int64)
    t0 = time.monotonic()
    moved, _ = store.load_file_ranges("slow", [os.path.join(mnt, "slow.bin")], ranges, threads=1)
    rep["slow_secs"] = time.monotonic() - t0
    out = np.zeros(6 * k, np.uint8)
    store.get("slow", out)
    assert moved == 6 * k and out.tobytes() == pattern("slow.bin", 6 * k), "slow load content"
    rep["slow_ok"] = True

    # good.bin [0, 256K) in 4 ranges, hung.bin [0, 64K) fine and [128K, 192K) never answered.
    store.add("hung_x", np.zeros(6 * k, np.uint8))
    paths = [os.path.join(mnt, "good.bin"), os.path.join(mnt, "hung.bin")]
    rows = [[0, i * k, k, -1, 0, k, i * k] for i in range(4)]
    rows += [[1, 0, k, -1, 0, k, 4 * k], [1, 2 * k, k, -1, 0, k, 5 * k]]
    t0 = time.monotonic()
    try:
        store.load_file_ranges("hung_x", paths, np.array(rows, np.int64), threads=4)
        raise AssertionError("a load with a hung range succeeded")
    except DDStoreTimeoutError as e:
        rep["hung_secs"] = time.monotonic() - t0
        rep["hung_error"] = str(e)
    out = np.zeros(6 * k, np.uint8)
    store.get("hung_x", out)
    assert out[: 4 * k].tobytes() == pattern("good.bin", 4 * k), "good.bin ranges landed"
    assert out[4 * k : 5 * k].tobytes() == pattern("hung.bin", 2 * k)[:k], "hung.bin [0, 64K) landed"
    rep["landed_ok"] = True
    rep["readers_after_timeout"] = load_threads()
    # The share is a memfd named after the variable (a single process maps its own).
    rep["mapped_before_free"] = mapped("ddstore-hung_x")
    store.free()
    # The abandoned reader still holds the share: freed by the store, not unmapped.
    rep["mapped_after_free"] = mapped("ddstore-hung_x")
    os.kill(server, signal.SIGUSR1)  # the hung READ is answered: the late pread lands, the reader exits
    rep["readers_gone"] = wait_for(lambda: load_threads() == 0, 20)
    rep["unmapped_after_reader"] = wait_for(lambda: not mapped("ddstore-hung_x"), 10)
    return rep


def dist(mnt: str, server: int) -> dict:
    from mpi4py import MPI
    from pyddstore.torch import DistDataset

    comm = MPI.COMM_WORLD
    rep: dict = {"rank": comm.rank}
    paths = [os.path.join(mnt, "a.npy"), os.path.join(mnt, "b.npy")]
    t0 = time.monotonic()
    try:
        DistDataset(paths, "hung", comm, method=0)
        rep["error"] = None
    except DDStoreTimeoutError as e:
        rep["error"] = f"{type(e).__name__}: {e}"
    except Exception as e:  # noqa: BLE001 - reported, the test names what was expected
        rep["error"] = f"{type(e).__name__}: {e}"
    rep["secs"] = time.monotonic() - t0
    comm.Barrier()
    if comm.rank == 1:
        os.kill(server, signal.SIGUSR1)
        rep["readers_gone"] = wait_for(lambda: load_threads() == 0, 20)
    return rep


if __name__ == "__main__":
    mode, mnt, server = sys.argv[1], sys.argv[2], int(sys.argv[3])
    report = single(mnt, server) if mode == "single" else dist(mnt, server)
    print("report: " + json.dumps(report), flush=True)
