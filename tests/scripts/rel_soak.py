"""Soak: every rank reads random rows of every rank through
PyDDStore.get_batch from two threads, verifying every byte, until it has
read <rows> rows; memory must stay flat after warm-up.

    python rel_soak.py <method> <rows per rank> [<comm: world|file>]

Prints ``soak {json}`` per rank (rows, rows/s, mismatches, RSS).
"""

import json
import os
import sys
import threading
import time

import numpy as np
from _common import main_guard, rank_tag, rows_of, share_bounds

import pyddstore

ROWS_PER_RANK, SHAPE, BATCH, THREADS = 4096, (32,), 256, 2
RSS_GROWTH_LIMIT = 0.05


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def make_store(method, kind):
    if kind == "world":
        from mpi4py import MPI

        return pyddstore.PyDDStore(MPI.COMM_WORLD, method=method)
    return pyddstore.PyDDStore(None, method=method)


def main():
    method, target = int(sys.argv[1]), int(sys.argv[2])
    # REL_SOAK_REGISTER=1: destinations registered once (register_recv), not per call.
    register = os.environ.get("REL_SOAK_REGISTER") == "1"
    kind = sys.argv[3] if len(sys.argv) > 3 else "world"
    store = make_store(method, kind)
    n = ROWS_PER_RANK * store.size
    first, count, _ = share_bounds(n, store.size, store.rank)
    store.add("v", rows_of(3, np.arange(first, first + count), SHAPE, "float32"))
    store.barrier()
    per_thread = target // THREADS
    warm_rows = per_thread // 10
    done = [0] * THREADS
    mismatches = [0] * THREADS
    warm = {}
    errors = []
    warm_lock = threading.Lock()

    def reader(t):
        rng = np.random.default_rng(1000 * store.rank + t)
        out = np.empty((BATCH,) + SHAPE, np.float32)
        if register:
            store.register_recv("v", out)
        try:
            while done[t] < per_thread:
                rows = rng.integers(0, n, BATCH)
                store.get_batch("v", out, rows)
                mismatches[t] += int((out != rows_of(3, rows, SHAPE, "float32")).any(axis=1).sum())
                done[t] += BATCH
                if done[t] >= warm_rows and t not in warm:
                    with warm_lock:
                        warm[t] = rss_kib()
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    start = time.monotonic()
    threads = [threading.Thread(target=reader, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    elapsed = time.monotonic() - start
    if errors:
        raise errors[0]
    rss_warm, rss_end = max(warm.values()), rss_kib()
    growth = (rss_end - rss_warm) / rss_warm
    total = sum(done)
    prof = store.get_profile("v")
    report = {
        "rank": store.rank,
        "size": store.size,
        "method": method,
        "transport": store.transport,
        "rows": total,
        "seconds": round(elapsed, 2),
        "rows_per_s": round(total / elapsed),
        "mismatches": sum(mismatches),
        "rss_warm_kib": rss_warm,
        "rss_end_kib": rss_end,
        "rss_growth": round(growth, 4),
        "remote_rows": prof.get("remote_rows", 0),
        "node_rows": prof.get("node_rows", 0),
        "registered": register,
    }
    print("soak", json.dumps(report), flush=True)
    assert sum(mismatches) == 0, f"{rank_tag()} {sum(mismatches)} rows differ"
    assert growth < RSS_GROWTH_LIMIT, f"{rank_tag()} RSS grew {growth:.1%} after warm-up: {report}"
    store.barrier()
    store.free()


if __name__ == "__main__":
    main_guard(main)
