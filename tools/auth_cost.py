"""What a build's gather path costs against another build's, alternated in one run.

    python tools/auth_cost.py --against OTHER/.venv/bin/python [--rounds 4]

A developer's harness (it compares two builds), not part of the wheel: run it from a checkout.

Each round runs, for this interpreter's pyddstore and then the other's, one
``mpirun -n 2`` job per row size: rank 0 reads ``--batches`` batches of 128
random rows of rank 1 (method 1, ``DDSTORE_SHM=0``: the gather path over tcp,
checked against what rank 1 stored) while rank 1 only serves. A job reports
the median time per row over its batches; the summary gives, per row size, the
median of those medians over the rounds for each build and their ratio (this
build / the other). The worker uses only API both builds have (``PyDDStore``,
``add``, ``get_batch``, ``free``), so the other build may be an older checkout
(e.g. one built with ``maturin develop --release`` in a git worktree).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

BATCH = 128


def worker(row_bytes: int, batches: int) -> None:
    """One job's rank: rank 0 reads, rank 1 serves until rank 0 is done."""
    import numpy as np
    from mpi4py import MPI  # this file runs as a script, under either build: no package imports

    import pyddstore

    comm = MPI.COMM_WORLD
    store = pyddstore.PyDDStore(comm, method=1)
    rows = max(256, (64 << 20) // row_bytes)
    n = row_bytes // 4
    mine = np.arange(rows * n, dtype=np.float32).reshape(rows, n) % 65521 + comm.rank
    store.add("v", mine)
    if comm.rank == 0:
        rng = np.random.default_rng(1)
        out = np.empty((BATCH, n), np.float32)
        per_row = []
        for i in range(batches + 3):  # 3 warm-up batches
            picked = rng.integers(0, rows, BATCH)
            t0 = time.perf_counter()
            store.get_batch("v", out, rows + picked)
            if i >= 3:
                per_row.append((time.perf_counter() - t0) / BATCH * 1e6)
            if not np.array_equal(out, mine[picked] + 1):  # rank 1 stored each value + 1
                raise SystemExit(f"rows {picked[:4]} of rank 1 differ from what it stored")
        print("auth_cost " + json.dumps({"median_us": statistics.median(per_row)}), flush=True)
        comm.Ibarrier().Wait()
    else:
        done = comm.Ibarrier()
        while not done.Test():  # serve without a blocking MPI call holding the core
            time.sleep(0.001)
    store.free()


def run_job(python: str, row_bytes: int, batches: int) -> float:
    env = dict(os.environ, DDSTORE_SHM="0", DDSTORE_QUIET="1")
    env.setdefault("FI_TCP_IFACE", "lo")
    cmd = ["mpirun", "-n", "2", "--bind-to", "none", python, os.path.abspath(__file__), "--worker"]
    cmd += ["--row-bytes", str(row_bytes), "--batches", str(batches)]
    # Run from / so that the other interpreter imports its own pyddstore, not this checkout's.
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd="/")
    for line in p.stdout.splitlines():
        if line.startswith("auth_cost "):
            return json.loads(line.split(" ", 1)[1])["median_us"]
    raise SystemExit(f"{' '.join(cmd)} exited with {p.returncode}:\n{p.stdout}\n{p.stderr}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", help="the other build's Python interpreter")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--row-sizes", default="3072,1048576")
    ap.add_argument("--batches", default="400,24", help="batches per job, per row size")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--row-bytes", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        worker(a.row_bytes, int(a.batches))
        return
    if not a.against:
        ap.error("--against is required")
    sizes = [int(s) for s in a.row_sizes.split(",")]
    batches = [int(b) for b in a.batches.split(",")]
    if len(batches) != len(sizes):
        ap.error("--batches needs one count per row size")
    builds = {"this": sys.executable, "other": a.against}
    medians = {(b, s): [] for b in builds for s in sizes}
    for r in range(a.rounds):
        for b, python in builds.items():
            for s, n in zip(sizes, batches):
                m = run_job(python, s, n)
                medians[(b, s)].append(m)
                print(f"round {r + 1} {b:5} {s:>8} B rows: {m:8.2f} us/row (median, {n} batches)", flush=True)
    summary = []
    for s in sizes:
        this, other = (statistics.median(medians[(b, s)]) for b in builds)
        summary.append({"row_bytes": s, "this_us": this, "other_us": other, "ratio": this / other})
        print(f"{s:>8} B rows x {BATCH}: this {this:.2f} / other {other:.2f} us/row = {this / other:.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            per_job = {f"{b}:{s}": v for (b, s), v in medians.items()}
            json.dump({"rounds": a.rounds, "medians": per_job, "summary": summary}, f)


if __name__ == "__main__":
    main()
