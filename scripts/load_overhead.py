"""Where a map-style npz load's CPU goes, one rank: np.load alone (a plain loop over source[i])
beside DistDataset loads at several depths, warm and cold cache (cold needs root).

    mpirun -n 1 python scripts/load_overhead.py DIR [FILES]

DIR holds the s000000.npz ... files `make bench-load` writes (python -m pyddstore.benchmarks.dataset
--parts load --load-dir DIR keeps them)."""

from __future__ import annotations

import gc
import os
import sys
import time

from pyddstore.benchmarks.load import NpzFiles, drop_caches
from pyddstore.torch import DistDataset


def warm(d: str, n: int) -> None:
    for i in range(n):
        with open(os.path.join(d, f"s{i:06d}.npz"), "rb") as fh:
            fh.read()


def main() -> None:
    d = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 750
    src = NpzFiles(d, n)
    warm(d, n)
    t, c = time.perf_counter(), time.process_time()
    for i in range(n):
        src[i]
    print(
        f"np.load alone (source[i] in a loop), warm: {(time.perf_counter() - t) / n * 1e3:.2f} ms wall, "
        f"{(time.process_time() - c) / n * 1e3:.2f} ms CPU per file"
    )
    for depth in (1, 4, 32):
        os.environ["DDSTORE_LOAD_DEPTH"] = str(depth)
        for cold in (False, True):
            cache = drop_caches() if cold else "warm"
            gc.collect()
            ds = DistDataset(src, f"o{depth}{int(cold)}", None)
            st = ds.load_stats[0]
            print(
                f"DistDataset depth {depth:2} ({cache}): {st['secs'] / n * 1e3:.2f} ms wall, "
                f"{st['cpu'] / n * 1e3:.2f} ms CPU per file",
                flush=True,
            )
            ds.free()
            if cold:
                warm(d, n)


if __name__ == "__main__":
    main()
