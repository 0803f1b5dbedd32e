"""Fork safety of large same-node reads: rank 0 reads a 64 MiB batch of rank 1's
rows (memory copies split across threads), forks, and the child reads the same
batch. Before, the copy threads were a pool that a forked child inherited
without threads, and the child's read never returned.

Usage: fork_large.py METHOD [loader]   (loader: a DataLoader over a DistDataset
whose main process read a large batch before forking its workers)"""

import os
import sys
import time

import numpy as np
from _common import main_guard, rank_tag, rows_of

ROW_SHAPE = (256, 1024)  # 1 MiB of uint8 per row
ROWS_PER_RANK = 64
SEED = 41


def wait_child(pid: int, timeout: float = 120.0) -> int:
    """The child's exit code; fails (and kills it) if it does not exit in time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    raise AssertionError(f"{rank_tag()} forked child did not finish its read in {timeout:.0f} s (hung)")


def store_fork(method: int) -> None:
    import pyddstore

    store = pyddstore.PyDDStore(method=method)
    rank = store.rank
    mine = rows_of(SEED, np.arange(rank * ROWS_PER_RANK, (rank + 1) * ROWS_PER_RANK), ROW_SHAPE, "uint8")
    store.add("big", mine)
    if rank == 0:
        other = np.arange(ROWS_PER_RANK, 2 * ROWS_PER_RANK)[::-1].copy()  # rank 1's rows, reversed
        out = np.empty((len(other),) + ROW_SHAPE, np.uint8)
        store.get_batch("big", out, other)  # 64 MiB: the threaded copy path
        assert np.array_equal(out, rows_of(SEED, other, ROW_SHAPE, "uint8"))
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                store.fork_reader()  # accepted, and no longer needed
                got = np.zeros_like(out)
                store.get_batch("big", got, other)
                code = 0 if np.array_equal(got, out) else 2
            finally:
                os._exit(code)
        assert wait_child(pid) == 0, f"{rank_tag()} the forked child read wrong rows"
        print(f"{rank_tag()} fork_large ok (method {method}, {store.transport})", flush=True)
    store.barrier()
    store.free()


def loader_fork() -> None:
    import torch
    from pyddstore.torch import DistDataset
    from torch.utils.data import DataLoader

    n = 2 * ROWS_PER_RANK
    source = [torch.from_numpy(rows_of(SEED, [i], ROW_SHAPE, "uint8")[0]) for i in range(n)]
    ds = DistDataset(source, "big", method=1)
    if ds.ddstore.rank == 0:
        # Validation in the main process: one 64 MiB batch read (threaded copies).
        whole = ds.__getitems__(list(range(n - 1, -1, -1)))
        assert all(torch.equal(whole[k], source[n - 1 - k]) for k in range(n))
        loader = DataLoader(ds, batch_size=16, num_workers=2, shuffle=True, timeout=120)
        seen = 0
        for batch in loader:
            assert batch.shape == (16,) + ROW_SHAPE
            seen += len(batch)
        assert seen == n, seen
        print(f"{rank_tag()} fork_large loader ok", flush=True)
    ds.ddstore.barrier()
    ds.ddstore.free()


def main() -> None:
    if sys.argv[1] == "loader":
        loader_fork()
    else:
        store_fork(int(sys.argv[1]))


if __name__ == "__main__":
    main_guard(main)
