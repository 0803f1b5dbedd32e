"""Peak resident memory of a budgeted DistDataset over its load and one shuffled epoch (issue 40,
item 3; issue 37's bounded load): each rank's VmHWM (from /proc/self/status, reset through
/proc/self/clear_refs just before the load) less its VmRSS before the load, checked against
budget x 1.1 + the fixed overhead the budget guide states (--bound-mib), and every sample of
the epoch compared with the source. The dataset is made without a method: under mpirun the
budget picks method 1 (rank 0 logs it); an explicit method=0 with the budget is refused.

mpirun -n 2 python spill_rss.py SPILL_DIR --budget-mib 32 [--n 4096 --row-kib 64 --source samples]

Prints one line per rank: "rank R: budget B MiB, load peak L MiB, epoch peak E MiB, bound X MiB,
samples S (epoch T s, checks included)".
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

import numpy as np
import torch
from pyddstore.torch import DistDataset, DistributedSampler, ThreadDataLoader
from torch.utils.data import Dataset

from pyddstore import DDStoreUnsupportedError

MIB = 1 << 20


def status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise AssertionError(f"/proc/self/status has no {key}")


def reset_peak() -> None:
    """VmHWM := VmRSS (Linux: writing 5 to clear_refs resets the peak resident size)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def row_of(i: int, n_values: int) -> np.ndarray:
    """Sample i: distinct per sample and per position (float32, exact up to 2**24)."""
    row = np.arange(n_values, dtype=np.float32)  # built in place: no temporary beside the row
    np.fmod(row, 4093, out=row)
    row += i * 3
    return row


class Rows(Dataset):
    """A map-style source that builds each sample when asked (it holds no memory itself)."""

    def __init__(self, n: int, n_values: int):
        self.n, self.n_values = n, n_values

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return row_of(i, self.n_values)


def npy_source(d: str, n: int, n_values: int, comm) -> list[str]:
    """The same rows as .npy files of 64 rows each (rank 0 writes them)."""
    paths = [os.path.join(d, f"rows{k:05d}.npy") for k in range(0, n, 64)]
    if comm.rank == 0:
        for k, p in zip(range(0, n, 64), paths):
            np.save(p, np.stack([row_of(i, n_values) for i in range(k, min(n, k + 64))]))
    comm.Barrier()
    return paths


PARTS = ("RssAnon", "RssFile", "RssShmem")


class Captured(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def method0_refuses(source, comm, budget: int, spill: str) -> None:
    """An explicit method=0 with a budget still refuses, clearly, on every rank."""
    try:
        DistDataset(source, "m0", comm, method=0, memory_limit=budget, spill_dir=spill)
    except DDStoreUnsupportedError as e:
        assert "method 1 or 2" in str(e), e
    else:
        raise AssertionError("method=0 with memory_limit= was accepted")


def parts_mib() -> str:
    return ", ".join(f"{k} {status_kib(k) / 1024:.1f}" for k in PARTS)


def read_epoch(ds, args, n_values: int, rank: int) -> int:
    """One shuffled epoch through ThreadDataLoader, every batch compared with the source;
    returns the samples read. RSS_PARTS=1 prints the largest anon/file/shmem parts seen."""
    sampler = DistributedSampler(ds, shuffle=True, seed=3)
    loader = ThreadDataLoader(ds, batch_size=args.batch, sampler=sampler, num_workers=args.workers)
    order = list(iter(sampler))
    seen = 0
    parts: dict = {}
    for batch in loader:
        if os.environ.get("RSS_PARTS"):
            for k in PARTS:
                parts[k] = max(parts.get(k, 0), status_kib(k))
        want = np.stack([row_of(int(i), n_values) for i in order[seen : seen + len(batch)]])
        assert torch.equal(batch, torch.from_numpy(want)), f"rank {rank}: batch at {seen} differs"
        seen += len(batch)
        del batch, want
    assert seen == len(order), (seen, len(order))
    if parts:
        print(
            f"rank {rank}: largest parts (MiB): " + ", ".join(f"{k} {v / 1024:.1f}" for k, v in parts.items())
        )
    loader.close()
    return seen


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("spill_dir")
    ap.add_argument("--budget-mib", type=float, required=True)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--row-kib", type=int, default=64)
    ap.add_argument("--source", choices=("samples", "npy"), default="samples")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--load-only", action="store_true", help="the load alone (samples checked, no epoch)")
    ap.add_argument(
        "--bound-mib", type=float, default=None, help="fixed overhead allowed (else none checked)"
    )
    args = ap.parse_args()
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank = comm.rank
    n_values = args.row_kib * 1024 // 4
    if args.source == "samples":
        source = Rows(args.n, n_values)
    else:
        source = npy_source(args.spill_dir, args.n, n_values, comm)
    spill = os.path.join(args.spill_dir, f"spill{rank}")
    os.makedirs(spill, exist_ok=True)
    if os.environ.get("RSS_PARTS"):
        print(f"rank {rank}: before the load (MiB): {parts_mib()}", flush=True)
    budget = int(args.budget_mib * MIB)
    method0_refuses(source, comm, budget, spill)
    log = Captured()
    logging.getLogger("pyddstore").addHandler(log)
    logging.getLogger("pyddstore").setLevel(logging.INFO)
    comm.Barrier()
    before = status_kib("VmRSS")
    reset_peak()
    # No method: under mpirun the default would be 0, which cannot spill; the budget picks 1.
    ds = DistDataset(source, "rss", comm, memory_limit=budget, spill_dir=spill)
    load_peak = (status_kib("VmHWM") - before) / 1024
    assert ds._store.method == 1, ds._store.method
    said = [line for line in log.lines if "method 1 (libfabric) chosen" in line]
    assert len(said) == (rank == 0), (rank, log.lines)
    if args.load_only:
        for i in range(rank, args.n, 7):
            assert np.array_equal(np.asarray(ds[i]), row_of(i, n_values)), f"sample {i} differs"
        seen, epoch_peak, epoch_s = (args.n + 6 - rank) // 7, load_peak, 0.0
    else:
        t0 = time.perf_counter()
        seen = read_epoch(ds, args, n_values, rank)
        epoch_s = time.perf_counter() - t0
        epoch_peak = (status_kib("VmHWM") - before) / 1024
        # Same-node reads were on: the peer's rows came from its memory and its spill file (read
        # or staged ahead), none remotely.
        prof = ds._store.get_profile()
        assert prof["node_rows"] > 0 and prof["remote_rows"] == 0, prof
        assert prof["memory_rows"] > 0 and prof["spilled_rows"] + prof["prefetch_hits"] > 0, prof
    ds.free()
    bound = None if args.bound_mib is None else args.budget_mib * 1.1 + args.bound_mib
    print(
        f"rank {rank}: budget {args.budget_mib:g} MiB, load peak {load_peak:.1f} MiB, epoch peak "
        f"{epoch_peak:.1f} MiB, bound {'-' if bound is None else f'{bound:.1f}'} MiB, samples {seen} "
        f"(epoch {epoch_s:.1f} s, checks included)",
        flush=True,
    )
    if bound is not None:
        worst = max(load_peak, epoch_peak)
        assert worst <= bound, f"rank {rank}: peak {worst:.1f} MiB over the bound {bound:.1f} MiB"
    comm.Barrier()


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        import traceback

        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)
