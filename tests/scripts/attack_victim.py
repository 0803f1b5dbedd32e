"""A method-1 job under attack (tests/test_attacks.py): 2 plain processes over tcp, gather path.

python attack_victim.py OUTDIR SECONDS [METHOD]
                                          each rank stores 256 rows of 3 KB, writes its pid to
                                          OUTDIR/ready.<rank> once its endpoints are up, then for
                                          SECONDS (or until OUTDIR/stop exists) reads the other
                                          rank's rows (single get()s and 64-row batches), checks
                                          every byte, and prints one JSON report line: reads,
                                          wrong bytes, rejected counters. METHOD 2 (a core job
                                          with DDSTORE_JOB_TOKEN): each rank also writes its
                                          share's memory key and length to OUTDIR/key.<rank>, as
                                          a token holder reads them from the signed record
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
from _common import main_guard, rows_of

import pyddstore

ROWS, WIDTH = 256, 3072


def main():
    outdir, seconds = sys.argv[1], float(sys.argv[2])
    method = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    store = pyddstore.PyDDStore(None, method=method)
    rank, size = store.rank, store.size
    mine = np.arange(rank * ROWS, (rank + 1) * ROWS)
    store.add("x", rows_of(5, mine, (WIDTH,), np.uint8))
    other = (rank + 1) % size
    theirs = np.arange(other * ROWS, (other + 1) * ROWS)
    rng = np.random.default_rng(rank)
    out = np.empty((64, WIDTH), np.uint8)
    one = np.empty((1, WIDTH), np.uint8)
    store.get_batch("x", out, theirs[:64])  # opens this rank's reader endpoint
    if method == 2:
        record = bytes(store._native.records("x")[rank])
        rec = json.loads(record[record.index(b"{") :])
        with open(os.path.join(outdir, f"key.{rank}"), "w") as f:
            f.write(f"{rec['key']} {rec['len']}")
    with open(os.path.join(outdir, f"ready.{rank}"), "w") as f:
        f.write(str(os.getpid()))
    reads = wrong = 0
    end = time.monotonic() + seconds
    stop = os.path.join(outdir, "stop")
    while time.monotonic() < end and not os.path.exists(stop):
        rows = rng.choice(theirs, 64, replace=False)
        store.get_batch("x", out, rows)
        wrong += int(np.count_nonzero(out != rows_of(5, rows, (WIDTH,), np.uint8)))
        row = int(rng.choice(theirs))
        store.get("x", one, row)
        wrong += int(np.count_nonzero(one != rows_of(5, [row], (WIDTH,), np.uint8)))
        reads += 65
    prof = store.get_profile("x")
    report = {
        "rank": rank,
        "reads": reads,
        "wrong": wrong,
        "rejected_replies": prof["rejected_replies"],
        "rejected_requests": prof["rejected_requests"],
        "rss_kb": int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024,
    }
    store.barrier()
    print("REPORT", json.dumps(report), flush=True)
    store.free()


if __name__ == "__main__":
    main_guard(main)
