"""Descriptors a rank holds, and a full global shuffle under a low descriptor limit (issue 35).

    python scale_fds.py ROLE [--limit L] [--hs DIR] [--n-core N] [--threads T] [--epochs E]

One `SCALEFD {json}` report per rank. Every peer is remote (run with DDSTORE_SHM=0).

ROLE m1: a method-1 job (mpirun, or plain processes with --hs: a file communicator): each rank adds
    ROWS_PER_RANK rows, then reads every row of the job in a shuffled order (E epochs, T threads
    splitting each epoch), every row checked against what its owner stored.
ROLE core: a method-2 core job (mpirun) publishing the same rows in --hs; serves until {hs}/STOP.
ROLE extra: a method-2 extra job reading the core job's rows (--n-core ranks) the same way.

--limit L: soft and hard RLIMIT_NOFILE are set to L before the store is created (so raising
the soft limit cannot escape it). The report says what failed (the error's class and message,
and how long after the store's creation) or what was read, with the descriptors open before the
store, after the add and after the reads (and their sockets) and VmRSS.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import threading
import time

import numpy as np
from _common import rows_of, rss_kib

# `--limit N` applies as `ulimit -n N` would, before pyddstore loads: it picks its libfabric
# settings (FI_AV_REMOVE_CLEANUP for the bounded set) by the limit it starts under.
if "--limit" in sys.argv:
    _limit = int(sys.argv[sys.argv.index("--limit") + 1])
    resource.setrlimit(resource.RLIMIT_NOFILE, (_limit, _limit))

import pyddstore  # noqa: E402

ROWS_PER_RANK = 32
WIDTH = 16
SEED = 11


def fds() -> tuple[int, int]:
    """(descriptors open, of them sockets)."""
    names = os.listdir("/proc/self/fd")
    socks = 0
    for n in names:
        try:
            socks += os.readlink(f"/proc/self/fd/{n}").startswith("socket:")
        except OSError:
            pass
    return len(names), socks


def settled_fds() -> tuple[int, int]:
    """fds() at its lowest over half a second: a descriptor held for a moment (the store's sweep of
    silent connections works on a dup; a provider's connection retry) is not one the rank keeps."""
    samples = []
    for _ in range(5):
        samples.append(fds())
        time.sleep(0.1)
    return min(samples)


def shuffle_read(store, total: int, threads: int, epochs: int, rank: int) -> int:
    """Reads every row `epochs` times in a shuffled order, checked; returns the rows read."""
    rng = np.random.default_rng(1000 + rank)
    errors: list[BaseException] = []
    read = [0] * threads

    def body(t: int, order: np.ndarray) -> None:
        try:
            for batch in np.array_split(order, max(1, len(order) // 8)):
                out = np.empty((len(batch), WIDTH), np.float32)
                store.get_batch("x", out, batch.astype(np.int64))
                want = rows_of(SEED, batch, (WIDTH,), np.float32)
                assert np.array_equal(out, want), f"rows {batch[:4]} differ from their owner's"
                read[t] += len(batch)
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            errors.append(e)

    for _ in range(epochs):
        parts = np.array_split(rng.permutation(total), threads)
        ts = [threading.Thread(target=body, args=(t, p)) for t, p in enumerate(parts)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        if errors:
            raise errors[0]
    return sum(read)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["m1", "core", "extra"])
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--hs", default=None)
    p.add_argument("--n-core", type=int, default=None)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--epochs", type=int, default=2)
    a = p.parse_args()
    report: dict = {"role": a.role, "limit": a.limit, "fds_start": fds()[0], "rss_start_kib": rss_kib()}
    t0 = time.monotonic()
    try:
        if a.role == "extra":
            store = pyddstore.PyDDStore(None, method=2, handshake_dir=a.hs, n_core=a.n_core)
            total = a.n_core * ROWS_PER_RANK
            store.join("x")
        else:
            if a.role == "core":  # under mpirun: the MPI communicator
                store = pyddstore.PyDDStore(None, method=2, handshake_dir=a.hs)
            else:  # with --hs: plain processes and a file communicator, else MPI
                comm = pyddstore.FileComm(os.path.join(a.hs, "filecomm")) if a.hs else None
                store = pyddstore.PyDDStore(comm, method=1)
            first = store.rank * ROWS_PER_RANK
            rows = rows_of(SEED, np.arange(first, first + ROWS_PER_RANK), (WIDTH,), np.float32)
            store.add("x", rows)
            total = store.size * ROWS_PER_RANK
        report["rank"] = store.rank
        report["size"] = store.size
        report["fds_store"], _ = fds()
        if a.role == "core":
            store.barrier()
            print("SCALEFD", json.dumps({**report, "ready": True}), flush=True)
            stop = os.path.join(a.hs, "STOP")
            while not os.path.exists(stop):
                time.sleep(0.05)
            report["fds_after"], report["sockets_after"] = fds()
            report["rss_after_kib"] = rss_kib()
        else:
            report["rss_store_kib"] = rss_kib()
            report["read"] = shuffle_read(store, total, a.threads, a.epochs, store.rank)
            if a.role == "m1":
                store.barrier()  # every rank's reads done: its connections to this rank are made
            report["fds_after"], report["sockets_after"] = settled_fds()
            report["rss_after_kib"] = rss_kib()
            if a.role == "m1":
                store.barrier()  # every rank counted before any closes its connections in free()
        store.free()
        report["result"] = "ok"
    except pyddstore.DDStoreError as e:
        report["result"] = type(e).__name__
        report["message"] = str(e)
    report["elapsed_s"] = time.monotonic() - t0
    print("SCALEFD", json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
