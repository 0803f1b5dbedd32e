"""Same-node reads of a peer's share: mapped (no memory budget) against pread (a budget), alternated.

    mpirun -n 2 --bind-to none python tools/peer_reads.py [--row-sizes 3072,65536] [--rounds 5]

A developer's harness, not part of the wheel: run it from a checkout.

Both ranks hold the same rows twice in one store (method 1, ``DDSTORE_SHM=1``): variable
``mapped<R>`` without a budget, which a rank reads from its same-node peer through a mapping of the
peer's shared memory, and ``budgeted<R>`` with ``memory_limit=`` (twice its share: nothing spills),
which a rank reads with ``pread`` on the peer's memory file, so the peer's pages do not count in
its resident size. Each round, for each row size, rank 0 reads ``--batches`` batches of 128
random rows of rank 1's share from one variable, then the other (the order alternates by round),
every batch checked against what rank 1 stored. Prints per row size the median time per row of
each and their ratio, and rank 0's RssShmem growth over each variable's reads (a count).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from mpi4py import MPI

import pyddstore

BATCH = 128


def rss_shmem_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssShmem:"):
                return int(line.split()[1])
    return 0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--row-sizes", default="3072,65536", help="bytes per row, comma-separated")
    ap.add_argument("--share-mib", type=int, default=64, help="MiB per rank per variable")
    ap.add_argument("--batches", type=int, default=200, help="batches per variable per round")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    assert comm.size == 2, "run with mpirun -n 2"
    store = pyddstore.PyDDStore(comm, method=1)
    for row_bytes in (int(s) for s in args.row_sizes.split(",")):
        rows = (args.share_mib << 20) // row_bytes
        n = row_bytes // 4
        mine = np.arange(rows * n, dtype=np.float32).reshape(rows, n) % 65521 + comm.rank
        names = {"mapped": f"mapped{row_bytes}", "budgeted": f"budgeted{row_bytes}"}
        store.add(names["mapped"], mine)
        store.add(names["budgeted"], mine, memory_limit=2 * mine.nbytes)
        times: dict[str, list[float]] = {"mapped": [], "budgeted": []}
        shmem: dict[str, int] = {"mapped": 0, "budgeted": 0}
        rng = np.random.default_rng(1)
        out = np.empty((BATCH, n), np.float32)
        for r in range(args.rounds):
            order = ("mapped", "budgeted") if r % 2 == 0 else ("budgeted", "mapped")
            for name in order:
                if comm.rank == 0:
                    before = rss_shmem_kib()
                    per_row = []
                    for _ in range(args.batches):
                        picked = rng.integers(0, rows, BATCH)
                        t0 = time.perf_counter()
                        store.get_batch(names[name], out, rows + picked)
                        per_row.append((time.perf_counter() - t0) / BATCH * 1e6)
                        if not np.array_equal(out, mine[picked] + 1):  # rank 1 stored each value + 1
                            raise SystemExit(f"{name}: rows {picked[:4]} of rank 1 differ")
                    times[name].append(statistics.median(per_row))
                    shmem[name] += rss_shmem_kib() - before
                comm.Barrier()
        if comm.rank == 0:
            m, b = (statistics.median(times[k]) for k in ("mapped", "budgeted"))
            print(
                f"rows of {row_bytes} B: mapped {m:.3f} us/row, budgeted (pread) {b:.3f} us/row, "
                f"pread/mapped {b / m:.2f}; RssShmem growth mapped {shmem['mapped'] / 1024:.1f} MiB, "
                f"budgeted {shmem['budgeted'] / 1024:.1f} MiB",
                flush=True,
            )
    store.free()


if __name__ == "__main__":
    main()
