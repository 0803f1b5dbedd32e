"""Fork safety of large reads: rank 0 reads a 64 MiB batch of rank 1's rows
(same-node memory copies split across threads, or with DDSTORE_SHM=0 through the
transport's pooled readers), forks, and the child reads the same batch without
calling fork_reader() (the core notices the fork on the first read), then once
more after fork_reader() (kept, a no-op by then). Before, the copy threads were a
pool that a forked child inherited without threads, and its read never returned.

Usage: fork_large.py METHOD            (mpirun -n 2: methods 0, 1)
       fork_large.py loader            (a DataLoader over a DistDataset whose main
                                        process read a large batch before forking its workers)
       fork_large.py m2core --hs DIR   (mpirun -n 2: a method-2 core job serving "big"
                                        until DIR/STOP exists)
       fork_large.py m2extra --hs DIR  (one plain process: a method-2 extra job reads
                                        64 MiB, forks, its child reads; then creates STOP)"""

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


def my_rows(rank: int) -> np.ndarray:
    return rows_of(SEED, np.arange(rank * ROWS_PER_RANK, (rank + 1) * ROWS_PER_RANK), ROW_SHAPE, "uint8")


def read_fork_read(store) -> None:
    """Reads rank 1's rows (64 MiB, reversed), forks; the child reads them again, first without
    fork_reader(), then after it, while the parent reads them too (its readers are intact)."""
    other = np.arange(ROWS_PER_RANK, 2 * ROWS_PER_RANK)[::-1].copy()
    want = rows_of(SEED, other, ROW_SHAPE, "uint8")
    out = np.empty((len(other),) + ROW_SHAPE, np.uint8)
    store.get_batch("big", out, other)
    assert np.array_equal(out, want), f"{rank_tag()} the parent read wrong rows"
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            got = np.zeros_like(out)
            ok = True
            for _ in range(3):  # no fork_reader(): the core notices the fork
                got[:] = 0
                store.get_batch("big", got, other)
                ok = ok and np.array_equal(got, want)
            if ok:
                store.fork_reader()  # accepted, and a no-op by now
                got[:8] = 0
                store.get_batch("big", got[:8], other[:8])
                code = 0 if np.array_equal(got[:8], want[:8]) else 3
            else:
                code = 2
        finally:
            os._exit(code)
    # The parent reads while its child does: each must use readers of its own (an inherited
    # reader shares the parent's connections, and the two would take each other's replies).
    for _ in range(3):
        out[:] = 0
        store.get_batch("big", out, other)
        assert np.array_equal(out, want), f"{rank_tag()} the parent read wrong rows after the fork"
    code = wait_child(pid)
    assert code == 0, f"{rank_tag()} the forked child read wrong rows (exit {code})"


def store_fork(method: int) -> None:
    import pyddstore

    store = pyddstore.PyDDStore(method=method)
    store.add("big", my_rows(store.rank))
    if store.rank == 0:
        read_fork_read(store)
        print(f"{rank_tag()} fork_large ok (method {method}, {store.transport})", flush=True)
    store.barrier()
    store.free()


def m2_core(hs: str) -> None:
    import pyddstore

    store = pyddstore.PyDDStore(None, method=2, handshake_dir=hs)
    store.add("big", my_rows(store.rank))
    store.barrier()
    stop = os.path.join(hs, "STOP")
    deadline = time.monotonic() + 300
    while not os.path.exists(stop) and time.monotonic() < deadline:
        time.sleep(0.05)
    store.free()
    print(f"{rank_tag()} core stopped", flush=True)


def m2_extra(hs: str) -> None:
    import pyddstore

    store = pyddstore.PyDDStore(None, method=2, handshake_dir=hs, n_core=2)
    try:
        store.join("big")
        read_fork_read(store)
        print(f"fork_large ok (method 2 extra, {store.transport})", flush=True)
        store.free()
    finally:
        open(os.path.join(hs, "STOP"), "w").close()


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
    args = sys.argv[1:]
    hs = None
    if "--hs" in args:  # anywhere: the method-2 test's Core puts it first
        k = args.index("--hs")
        hs = args[k + 1]
        del args[k : k + 2]
    if args[0] == "loader":
        loader_fork()
    elif args[0] == "m2core":
        m2_core(hs)
    elif args[0] == "m2extra":
        m2_extra(hs)
    else:
        store_fork(int(args[0]))


if __name__ == "__main__":
    main_guard(main)
