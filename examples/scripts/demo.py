"""The 4-rank demo: every rank loads its share of a synthetic dataset into
the store, then reads random batches of rows from all ranks, checks every
byte against what the owner stored, and prints the read speed beside
numpy fancy indexing of a local array (the memory ceiling).

    mpirun -n 4 python examples/scripts/demo.py [--rows 40000] [--row-bytes 3072] [--method 0]
"""

import argparse
import os
import time

import numpy as np

import pyddstore


def expected_rows(rows: np.ndarray, width: int) -> np.ndarray:
    """Row r holds r * 1000 + column, so any row can be checked anywhere."""
    return (rows[:, None] * 1000 + np.arange(width)[None, :]).astype(np.float32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=40000)
    ap.add_argument("--row-bytes", type=int, default=3072)
    ap.add_argument("--method", type=int, default=None)
    ap.add_argument("--batches", type=int, default=300)
    args = ap.parse_args()

    store = pyddstore.PyDDStore(None, method=args.method)
    rank, size = store.rank, store.size
    width = args.row_bytes // 4
    share = [args.rows // size + (r < args.rows % size) for r in range(size)]
    first = sum(share[:rank])
    t0 = time.perf_counter()
    store.add("demo", expected_rows(np.arange(first, first + share[rank]), width))
    store.barrier()
    load_s = time.perf_counter() - t0

    rng = np.random.default_rng(rank)
    local = expected_rows(np.arange(args.rows), width)  # the ceiling: a local array
    lines = []
    for batch in (1, 32, 128):
        out = np.empty((batch, width), np.float32)
        for _ in range(args.batches):  # verified pass
            rows = rng.integers(0, args.rows, batch)
            store.get_batch("demo", out, rows)
            if not np.array_equal(out, expected_rows(rows, width)):
                raise SystemExit(f"rank {rank}: rows {rows} read wrong data")
        rows_all = rng.integers(0, args.rows, (args.batches, batch))
        t = time.perf_counter()
        for rows in rows_all:
            store.get_batch("demo", out, rows)
        store_s = time.perf_counter() - t
        t = time.perf_counter()
        for rows in rows_all:
            np.take(local, rows, axis=0, out=out)
        numpy_s = time.perf_counter() - t
        n = args.batches * batch
        lines.append((batch, store_s / n * 1e6, n * args.row_bytes / store_s / 1e9, numpy_s / n * 1e6))
    store.barrier()
    prof = store.get_profile("demo")
    if rank == 0:
        print(
            f"pyddstore demo: {size} ranks, method {store.method} "
            f"({store.transport}, {store.comm_kind} comm), "
            f"{args.rows} rows x {args.row_bytes} B, loaded in {load_s:.2f} s; every read verified"
        )
        print(f"{'batch':>6} {'us/row':>9} {'GB/s':>7} {'numpy us/row':>13} {'ratio':>6}")
        for batch, us, gbs, np_us in lines:
            print(f"{batch:>6} {us:>9.2f} {gbs:>7.2f} {np_us:>13.2f} {us / np_us:>6.2f}")
        print(
            f"rank 0 rows: {prof['local_rows']} own, {prof['node_rows']} same-node, "
            f"{prof['remote_rows']} remote"
        )
    store.free()
    if os.environ.get("DDSTORE_DEMO_FAIL_FAST"):
        raise SystemExit(0)


if __name__ == "__main__":
    main()
