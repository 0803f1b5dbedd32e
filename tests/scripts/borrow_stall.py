"""Checked borrows of out arrays, and a fabric failure's attributes. Runs under
`mpirun -n 2`, method 1 over tcp with DDSTORE_SHM=0 and a short DDSTORE_TIMEOUT_S.

Rank 1 stops itself (SIGSTOP). Rank 0 starts reads of rank 1's rows into `out` and `sout`
on two threads: they cannot complete, so they hold those arrays' borrows until they time
out. Meanwhile the main thread reads into `out` again, into an overlapping view of it,
into another array over the same bytes (np.frombuffer twice), and from it (update): each
is refused with DDStoreBorrowError naming the argument, while a read into a separate
array works. The same for a fixed-size bytes variable (`sout`, borrowed through a uint8
view). The stalled reads end with DDStoreTimeoutError whose `peer` is 1. Rank 0 then
resumes rank 1 (SIGCONT) and both read everything, checked against the rows their
owners stored (the borrows were released)."""

import os
import signal
import threading
import time

import numpy as np
from _common import main_guard, rank_tag, rows_of
from mpi4py import MPI

import pyddstore
from pyddstore import DDStoreBorrowError, DDStoreTimeoutError

ROWS, SHAPE, SEED = 32, (256,), 5


def names(rows) -> np.ndarray:
    """A fixed-size bytes variable (no rust-numpy element type: borrowed through a uint8 view)."""
    return np.array([f"row {int(r):011d}".encode() for r in rows], "S16")


def stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")


def expect_borrowed(fn, *args, arg: str) -> None:
    try:
        fn(*args)
    except DDStoreBorrowError as e:
        assert arg in str(e) and "in use by another pyddstore call" in str(e), str(e)
        assert isinstance(e, ValueError) and e.call is None and e.peer is None
        return
    raise AssertionError(f"{rank_tag()} {fn.__name__}{args[:1]} was not refused")


def main():
    comm = MPI.COMM_WORLD
    pids = comm.allgather(os.getpid())
    store = pyddstore.PyDDStore(comm, method=1)
    rank = store.rank
    store.add("x", rows_of(SEED, np.arange(rank * ROWS, (rank + 1) * ROWS), SHAPE, "float32"))
    store.add("s", names(np.arange(rank * ROWS, (rank + 1) * ROWS)))
    theirs = np.arange(ROWS, 2 * ROWS)
    store.barrier()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)  # rank 0 resumes it
    else:
        deadline = time.monotonic() + 30
        while not stopped(pids[1]):
            assert time.monotonic() < deadline, "rank 1 did not stop"
            time.sleep(0.01)
        # Over a bytearray: a second np.frombuffer of it is another array (and another base
        # object) over the same bytes, refused all the same.
        memory = bytearray(ROWS * int(np.prod(SHAPE)) * 4)
        out = np.frombuffer(memory, np.float32).reshape((ROWS,) + SHAPE)
        alias = np.frombuffer(memory, np.float32).reshape((ROWS,) + SHAPE)[8:12]
        sout = np.zeros(ROWS, "S16")
        result = {}

        def stalled_read(name, arr):
            t0 = time.monotonic()
            try:
                store.get_batch(name, arr, theirs)
                result[name] = None
            except DDStoreTimeoutError as e:
                result[name] = e
            result["took"] = time.monotonic() - t0

        threads = [threading.Thread(target=stalled_read, args=a) for a in (("x", out), ("s", sout))]
        for t in threads:
            t.start()
        time.sleep(1.0)  # the reads are posted and waiting (DDSTORE_TIMEOUT_S is longer)
        assert all(t.is_alive() for t in threads), f"a read of a stopped rank returned early: {result}"
        own = np.arange(ROWS)
        expect_borrowed(store.get_batch, "x", out, own, arg="get_batch('x', arr)")
        expect_borrowed(store.get_batch, "x", out[4:8], own[:4], arg="get_batch('x', arr)")
        expect_borrowed(store.get, "x", out[:2], 0, arg="get('x', arr)")
        expect_borrowed(store.get_batch, "x", alias, own[:4], arg="get_batch('x', arr)")
        expect_borrowed(store.update, "x", out[:1], 0, arg="update('x', arr)")
        expect_borrowed(store.get_batch, "s", sout[1:3], own[:2], arg="get_batch('s', arr)")
        expect_borrowed(store.get_batch, "s", sout.reshape(2, -1)[1], own[:16], arg="get_batch('s', arr)")
        # Another array is not affected: rank 0's own rows, checked.
        other = np.zeros((4,) + SHAPE, np.float32)
        store.get_batch("x", other, own[:4])
        assert np.array_equal(other, rows_of(SEED, own[:4], SHAPE, "float32"))
        sother = np.zeros(4, "S16")
        store.get_batch("s", sother, own[:4])
        assert np.array_equal(sother, names(own[:4]))
        still_stalled = all(t.is_alive() for t in threads)
        for t in threads:
            t.join(timeout=120)
            assert not t.is_alive(), "a stalled read never timed out"
        assert still_stalled, "a stalled read ended before every refusal was checked"
        for name in ("x", "s"):
            e = result[name]
            assert isinstance(e, DDStoreTimeoutError), result
            assert e.peer == 1, (e.peer, str(e))
        os.kill(pids[1], signal.SIGCONT)
        took = result["took"]
        print(f"{rank_tag()} stalled read: DDStoreTimeoutError peer={e.peer} after {took:.1f} s", flush=True)
    store.barrier()
    everything = np.arange(2 * ROWS)[::-1].copy()
    out = np.zeros((2 * ROWS,) + SHAPE, np.float32)
    store.get_batch("x", out, everything)
    assert np.array_equal(out, rows_of(SEED, everything, SHAPE, "float32"))
    sout = np.zeros(2 * ROWS, "S16")
    store.get_batch("s", sout, everything)
    assert np.array_equal(sout, names(everything))
    store.barrier()
    store.free()
    print(f"{rank_tag()} borrow_stall ok", flush=True)


if __name__ == "__main__":
    main_guard(main)
