"""Soak: every rank reads random rows of every rank through
PyDDStore.get_batch from two threads, verifying every byte, until it has
read <rows> rows; memory must stay flat after warm-up.

    python rel_soak.py <method> <rows per rank> [<comm: world|file>]

Prints ``soak {json}`` per rank (rows, rows/s, mismatches, RSS after
warm-up, half-way and at the end, and the growth per row read in the second
half). Memory is flat when RSS grew under 5% after warm-up and by under
8 bytes per row read in the second half: a ramp that outlasts the warm-up
(a ring or pool touched a little more per read) fails the second check
in short runs as well.
"""

import json
import os
import sys
import threading
import time

import numpy as np
from _common import main_guard, rank_tag, rows_of, rss_kib
from pyddstore._shares import share_of

import pyddstore

ROWS_PER_RANK, SHAPE, BATCH, THREADS = 4096, (32,), 256, 2
RSS_GROWTH_LIMIT = 0.05
LATE_BYTES_PER_ROW_LIMIT = 8


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
    first, count = share_of(n, store.size, store.rank)
    store.add("v", rows_of(3, np.arange(first, first + count), SHAPE, "float32"))
    store.barrier()
    per_thread = target // THREADS
    warm_rows, mid_rows = per_thread // 10, per_thread // 2
    done = [0] * THREADS
    mismatches = [0] * THREADS
    warm, mid = {}, {}
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
                for at, seen in ((warm_rows, warm), (mid_rows, mid)):
                    if done[t] >= at and t not in seen:
                        with warm_lock:
                            seen[t] = (rss_kib(), sum(done))
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
    (rss_warm, _), (rss_mid, rows_mid) = max(warm.values()), max(mid.values())
    rss_end = rss_kib()
    growth = (rss_end - rss_warm) / rss_warm
    total = sum(done)
    late_per_row = (rss_end - rss_mid) * 1024 / max(total - rows_mid, 1)
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
        "rss_mid_kib": rss_mid,
        "rss_end_kib": rss_end,
        "rss_growth": round(growth, 4),
        "rss_late_bytes_per_row": round(late_per_row, 2),
        "remote_rows": prof.get("remote_rows", 0),
        "node_rows": prof.get("node_rows", 0),
        "registered": register,
    }
    # One write per report, so that the lines of ranks sharing a pipe stay whole.
    sys.stdout.write(f"soak {json.dumps(report)}\n")
    sys.stdout.flush()
    assert sum(mismatches) == 0, f"{rank_tag()} {sum(mismatches)} rows differ"
    assert growth < RSS_GROWTH_LIMIT, f"{rank_tag()} RSS grew {growth:.1%} after warm-up: {report}"
    assert late_per_row < LATE_BYTES_PER_ROW_LIMIT, (
        f"{rank_tag()} RSS still grows {late_per_row:.1f} bytes per row read in the second half: {report}"
    )
    store.barrier()
    store.free()


if __name__ == "__main__":
    main_guard(main)
