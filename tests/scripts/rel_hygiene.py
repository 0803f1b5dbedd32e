"""Resource hygiene: many cycles of create store, add, verified get_batch,
free in one process must not leak file descriptors, threads, shared-memory
files, memory mappings or memory.

    python rel_hygiene.py <method> <comm: world|file> <cycles> [<warmup>]

Prints one line per rank: ``hygiene {json}`` with the figures after warm-up
and at the end, and fails (exit 1) when any of them grew.
"""

import glob
import json
import os
import sys

import numpy as np
from _common import main_guard, rank_tag, rows_of, rss_kib, share_bounds

import pyddstore

ROWS, SHAPE = 1000, (64,)
# Allowed growth after warm-up: allocator noise (flat after about 50 cycles
# when nothing leaks), not a per-cycle leak: a leaked share is 128 KiB, a
# leaked PyDDStore object about 10 KiB, so 160 cycles leak over 1.5 MiB.
RSS_SLACK_KIB = 1024
# A leak this large (since the first cycle) stops the run early: the machine is shared.
RSS_ABORT_KIB = 256 * 1024


def shm_files() -> int:
    """Our shares' files, and libfabric shm provider regions (``<pid>:<ep>:<n>``, 16 MiB each)."""
    shm_dir = os.environ.get("DDSTORE_SHM_DIR", "/dev/shm")
    ours = glob.glob(os.path.join(shm_dir, f"ddstore-{os.getpid()}-*"))
    return len(ours) + len(glob.glob(f"/dev/shm/{os.getpid()}:*"))


def snapshot() -> dict:
    with open("/proc/self/maps") as f:
        maps = sum(1 for _ in f)
    return {
        "fds": len(os.listdir("/proc/self/fd")),
        "threads": len(os.listdir("/proc/self/task")),
        "shm_files": shm_files(),
        "maps": maps,
        "rss_kib": rss_kib(),
    }


def make_comm(kind):
    if kind == "world":
        from mpi4py import MPI

        return MPI.COMM_WORLD
    return pyddstore.FileComm(os.environ["DDSTORE_HANDSHAKE_DIR"], job_id=f"hyg{os.getppid()}")


def cycle(comm, method, rng, i):
    store = pyddstore.PyDDStore(comm, method=method)
    first, count, _ = share_bounds(ROWS, store.size, store.rank)
    seed = i % 50
    store.add("v", rows_of(seed, np.arange(first, first + count), SHAPE, "float32"))
    rows = rng.integers(0, ROWS, 96)
    out = np.empty((len(rows),) + SHAPE, np.float32)
    store.get_batch("v", out, rows)
    if not np.array_equal(out, rows_of(seed, rows, SHAPE, "float32")):
        raise AssertionError(f"cycle {i}: rows {rows[:6]} differ")
    store.barrier()  # nobody frees while a peer still reads
    store.free()
    return store.rank, store.size, store.transport


def main():
    method, kind, cycles = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    warmup = int(sys.argv[4]) if len(sys.argv) > 4 else 40
    comm = make_comm(kind)
    rng = np.random.default_rng(os.getpid())
    before = first = None
    done = 0
    for i in range(cycles):
        rank, size, transport = cycle(comm, method, rng, i)
        done = i + 1
        if done == 1:
            first = snapshot()
        if done == warmup:
            before = snapshot()
        # libfabric's shm provider leaves a 16 MiB /dev/shm file per leaked endpoint, even after exit.
        leaking = rss_kib() - first["rss_kib"] > RSS_ABORT_KIB or shm_files() - first["shm_files"] > 4
        if any(comm.allgather(leaking)):  # all ranks stop at the same cycle
            break
    if before is None:  # stopped during warm-up: compare with the first cycle
        before = first
        warmup = 1
    after = snapshot()
    delta = {k: after[k] - before[k] for k in after}
    report = {"rank": rank, "size": size, "method": method, "transport": transport, "cycles": done}
    report.update({"warm": before, "end": after, "delta": delta})
    print("hygiene", json.dumps(report), flush=True)
    grew = [k for k in ("fds", "threads", "shm_files", "maps") if delta[k] > 0]
    if after["shm_files"]:
        grew.append("shm_files left")
    if delta["rss_kib"] > RSS_SLACK_KIB:
        grew.append("rss_kib")
    if grew:
        raise AssertionError(f"{rank_tag()} grew over {done - warmup} cycles: {grew}: {delta}")


if __name__ == "__main__":
    main_guard(main)
