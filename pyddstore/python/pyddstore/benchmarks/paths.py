"""The gather path against one-sided reads, alternated round by round in one run.

    mpirun -n 2 --bind-to none python -m pyddstore.benchmarks.paths [--busy 8] [--json FILE]

Two stores hold the same rows at once over tcp;ofi_rxm (``DDSTORE_SHM=0``): one with
``DDSTORE_REMOTE_GATHER=auto`` (the default: gathered, with the per-request choice), one with
``DDSTORE_REMOTE_GATHER=0`` (one-sided reads only). Each round times the first, then the second,
on the same random batches of the other ranks' rows; every rank reads at once (``--readers all``,
as a training job's loaders do) or rank 0 alone. The figure per line is the median over the
rounds of auto's time / one-sided's time, so that this machine's drift between rounds cancels;
``--busy N`` runs N busy-looping processes beside the bench (a loaded node). Every line's rows
are checked against the owners' data first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

import numpy as np

from .._store import PyDDStore
from ._common import bench_settings, description, mpi_world, quiet_wait
from .stores import pattern, timed

PATHS = {
    "auto": {"shm": False, "fabric": "tcp", "remote_gather": "auto"},
    "one-sided": {"shm": False, "fabric": "tcp", "remote_gather": "0"},
}


def measure(args, comm) -> list[dict]:
    rank, size = comm.rank, comm.size
    rng = np.random.default_rng(11)
    stores = {k: PyDDStore(comm, method=1, settings=bench_settings(**v)) for k, v in PATHS.items()}
    reads = args.readers == "all" or rank == 0
    results = []
    for row_bytes in args.row_sizes:
        per_rank = int(max(4, min(4096, args.share_bytes // row_bytes)))
        name = f"p{row_bytes}"
        mine = pattern(np.arange(rank * per_rank, (rank + 1) * per_rank), row_bytes)
        for store in stores.values():
            store.add(name, mine)
        others = np.arange(per_rank * size)
        remote = others[others // per_rank != rank]
        for batch in args.batch_sizes:
            batches = rng.choice(remote, (64, batch))
            out = np.empty((batch, row_bytes), np.uint8)
            fns = {}
            for path, store in stores.items():
                if reads:
                    store.get_batch(name, out, batches[0])
                    if not np.array_equal(out, pattern(batches[0], row_bytes)):
                        raise SystemExit(f"{path}: wrong data for rows {batches[0][:8]}")
                if batch == 1:
                    fns[path] = lambda r, t, s=store: s.get(name, out, int(r[0]))
                else:
                    fns[path] = lambda r, t, s=store: s.get_batch(name, out, r)
            per_round = {p: [] for p in fns}
            for _ in range(args.rounds):
                for path, fn in fns.items():
                    quiet_wait(comm)
                    if reads:
                        secs, rows = timed(fn, batches, args.seconds, 1)
                        per_round[path].append(secs / rows * 1e6)
            if reads:
                ratios = [a / b for a, b in zip(per_round["auto"], per_round["one-sided"])]
                results.append(
                    {
                        "rank": rank,
                        "row_bytes": row_bytes,
                        "batch": batch,
                        "auto_us_per_row": statistics.median(per_round["auto"]),
                        "one_sided_us_per_row": statistics.median(per_round["one-sided"]),
                        "ratios": ratios,
                    }
                )
        quiet_wait(comm)
    for store in stores.values():
        store.free()
    return results


def summarize(per_rank: list) -> list[dict]:
    """Per line: the medians over ranks' medians, and the median of every (rank, round) ratio."""
    lines: dict = {}
    for results in per_rank:
        for r in results:
            lines.setdefault((r["row_bytes"], r["batch"]), []).append(r)
    out = []
    for (row_bytes, batch), rs in sorted(lines.items()):
        ratios = sorted(x for r in rs for x in r["ratios"])
        out.append(
            {
                "row_bytes": row_bytes,
                "batch": batch,
                "auto_us_per_row": statistics.median(r["auto_us_per_row"] for r in rs),
                "one_sided_us_per_row": statistics.median(r["one_sided_us_per_row"] for r in rs),
                "ratio_median": statistics.median(ratios),
                "ratio_q1": ratios[len(ratios) // 4],
                "ratio_q3": ratios[(3 * len(ratios)) // 4],
            }
        )
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m pyddstore.benchmarks.paths", description=description(__doc__)
    )
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    ap.add_argument("--row-sizes", type=ints, default=[3072, 65536, 262144, 1 << 20, 4 << 20])
    ap.add_argument("--batch-sizes", type=ints, default=[1, 2, 8, 32, 128])
    ap.add_argument("--rounds", type=int, default=9, help="alternating rounds per line")
    ap.add_argument("--seconds", type=float, default=0.15, help="time per path per round")
    ap.add_argument("--share-bytes", type=float, default=64e6, help="bytes per rank per variable")
    ap.add_argument("--readers", choices=["all", "rank0"], default="all")
    ap.add_argument("--busy", type=int, default=0, help="busy-looping processes beside the bench")
    ap.add_argument("--json", help="write the figures to this file")
    args = ap.parse_args(argv)
    comm = mpi_world()
    busy = []
    if comm.rank == 0:
        busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        results = measure(args, comm)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    lines = summarize(comm.allgather(results))
    if comm.rank != 0:
        return
    who = "every rank reads" if args.readers == "all" else "rank 0 reads"
    print(
        f"# {comm.size} ranks, {who}, {args.busy} busy processes, {args.rounds} alternating rounds;"
        " ratio = auto / one-sided time per row (median, quartiles over ranks x rounds)"
    )
    print(f"{'row B':>8} {'batch':>5} {'auto us/row':>12} {'1s us/row':>10} {'ratio':>6} {'q1-q3':>11}")
    for r in lines:
        print(
            f"{r['row_bytes']:>8} {r['batch']:>5} {r['auto_us_per_row']:>12.2f}"
            f" {r['one_sided_us_per_row']:>10.2f} {r['ratio_median']:>6.2f}"
            f" {r['ratio_q1']:>5.2f}-{r['ratio_q3']:<5.2f}"
        )
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(
                {"ranks": comm.size, "readers": args.readers, "busy": args.busy, "lines": lines}, f, indent=1
            )


if __name__ == "__main__":
    main()
