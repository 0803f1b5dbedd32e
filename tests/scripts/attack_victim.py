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
                                          a token holder reads them from the signed record, and
                                          adds a ragged variable "r" (64 rows of 256 KB) whose
                                          values and ends keys, unit bytes and row count go to
                                          OUTDIR/ragged.<rank>
While OUTDIR/attacking exists (and OUTDIR/attack.done does not) reads count as under attack: the
report has the median batch time before and during the attack, and the resident size when the
attack began, its peak (sampled each batch) and at the end.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
from _common import main_guard, rows_of
from pyddstore._kinds import ragged_parts

import pyddstore

ROWS, WIDTH = 256, 3072
RAGGED_ROWS, RAGGED_ROW = 64, 256 << 10


def rss_kb() -> int:
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def progress_cpu_s() -> float:
    """CPU seconds of this process's libfabric progress threads (the owner's serving loop)."""
    total = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            stat = open(f"/proc/self/task/{tid}/stat").read()
        except OSError:
            continue
        name, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()
        if name.startswith("ddstore-ofi-pro"):
            total += int(rest[11]) + int(rest[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def record_of(store, name: str, rank: int) -> dict:
    record = bytes(store._native.records(name)[rank])
    return json.loads(record[record.index(b"{") :])


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
        rec = record_of(store, "x", rank)
        with open(os.path.join(outdir, f"key.{rank}"), "w") as f:
            f.write(f"{rec['key']} {rec['len']}")
        lengths = np.full(RAGGED_ROWS, RAGGED_ROW)
        store.add("r", np.ones(RAGGED_ROWS * RAGGED_ROW, np.uint8), lengths=lengths)
        values, ends = (record_of(store, part, rank) for part in ragged_parts("r"))
        with open(os.path.join(outdir, f"ragged.{rank}"), "w") as f:
            f.write(f"{values['key']} {ends['key']} 1 {RAGGED_ROWS}")
    with open(os.path.join(outdir, f"ready.{rank}"), "w") as f:
        f.write(str(os.getpid()))
    reads = wrong = 0
    end = time.monotonic() + seconds
    stop = os.path.join(outdir, "stop")
    attacking, done = os.path.join(outdir, "attacking"), os.path.join(outdir, "attack.done")
    times: dict[str, list[float]] = {"before": [], "during": []}
    rss = {"start": rss_kb(), "peak": 0}
    # The progress threads' CPU seconds per wall second, before and during the attack (a spinning
    # thread: ~1).
    cpu = {"t0": (time.monotonic(), progress_cpu_s()), "before": None, "during": None}
    while time.monotonic() < end and not os.path.exists(stop):
        phase = "during" if os.path.exists(attacking) and not os.path.exists(done) else "before"
        ended = "before" if phase == "during" else "during" if os.path.exists(done) else None
        if ended is not None and cpu[ended] is None:
            wall, used = time.monotonic() - cpu["t0"][0], progress_cpu_s() - cpu["t0"][1]
            cpu[ended] = round(used / max(wall, 1e-9), 2)
            cpu["t0"] = (time.monotonic(), progress_cpu_s())
        if not os.path.exists(attacking):
            rss["start"] = rss_kb()
        rss["peak"] = max(rss["peak"], rss_kb())
        rows = rng.choice(theirs, 64, replace=False)
        t0 = time.monotonic()
        store.get_batch("x", out, rows)
        if not os.path.exists(done):
            times[phase].append(time.monotonic() - t0)
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
        "rss_kb": rss_kb(),
        "cpu_before": cpu["before"],
        "cpu_during": cpu["during"],
        "rss_start_kb": rss["start"],
        "rss_peak_kb": rss["peak"],
        "batches_before": len(times["before"]),
        "batches_during": len(times["during"]),
        "median_before_s": float(np.median(times["before"])) if times["before"] else None,
        "median_during_s": float(np.median(times["during"])) if times["during"] else None,
    }
    store.barrier()
    print("REPORT", json.dumps(report), flush=True)
    store.free()


if __name__ == "__main__":
    main_guard(main)
