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
from _common import main_guard, rank_tag, rows_of, rss_kib
from pyddstore._shares import share_of

import pyddstore

ROWS, SHAPE = 1000, (64,)
# Allowed growth after warm-up, in each half of the measured cycles: a leak
# grows in both halves (a leaked share is 128 KiB, a leaked PyDDStore object
# about 10 KiB, so 80 cycles leak over 750 KiB), while a one-time step (a
# malloc arena or a thread's stack touched late, about 8 MiB, seen on main
# too) lands in one half only.
RSS_SLACK_KIB = 512
# A leak this large (since the first cycle) stops the run early: the machine is shared.
RSS_ABORT_KIB = 256 * 1024


def shm_names() -> set:
    """Our shares' files, and libfabric shm provider regions (``<pid>-<nonce>:<uid>:<n>``, 16 MiB
    each; ``<pid>:<uid>:<n>`` without pyddstore's nonce)."""
    shm_dir = os.environ.get("DDSTORE_SHM_DIR", "/dev/shm")
    pid = os.getpid()
    ours = glob.glob(os.path.join(shm_dir, f"ddstore-{pid}-*"))
    return set(ours + glob.glob(f"/dev/shm/{pid}:*") + glob.glob(f"/dev/shm/{pid}-*"))


# Files under this pid's names left by an earlier process that had the same pid (one killed
# by a test, or libfabric's shm files, which outlive their process) are not ours.
STALE = shm_names()


def shm_files() -> int:
    """How many of shm_names() this process made."""
    return len(shm_names() - STALE)


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
    first, count = share_of(ROWS, store.size, store.rank)
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
    before = first = middle = None
    done = 0
    for i in range(cycles):
        rank, size, transport = cycle(comm, method, rng, i)
        done = i + 1
        if done == 1:
            first = snapshot()
        if done == warmup:
            before = snapshot()
        if done == (warmup + cycles) // 2:
            middle = snapshot()
        # libfabric's shm provider leaves a 16 MiB /dev/shm file per leaked endpoint, even after exit.
        leaking = rss_kib() - first["rss_kib"] > RSS_ABORT_KIB or shm_files() - first["shm_files"] > 4
        if any(comm.allgather(leaking)):  # all ranks stop at the same cycle
            break
    if before is None:  # stopped during warm-up: compare with the first cycle
        before = first
        warmup = 1
    if middle is None or middle is before:
        middle = before
    after = snapshot()
    delta = {k: after[k] - before[k] for k in after}
    report = {"rank": rank, "size": size, "method": method, "transport": transport, "cycles": done}
    report.update({"warm": before, "end": after, "delta": delta})
    halves = (middle["rss_kib"] - before["rss_kib"], after["rss_kib"] - middle["rss_kib"])
    report["rss_halves_kib"] = halves
    # One write per report, so that the lines of ranks sharing a pipe stay whole.
    sys.stdout.write(f"hygiene {json.dumps(report)}\n")
    sys.stdout.flush()
    grew = [k for k in ("fds", "threads", "shm_files", "maps") if delta[k] > 0]
    if after["shm_files"]:
        grew.append("shm_files left")
    if min(halves) > RSS_SLACK_KIB or (middle is before and delta["rss_kib"] > 2 * RSS_SLACK_KIB):
        grew.append("rss_kib")
    if grew:
        raise AssertionError(f"{rank_tag()} grew over {done - warmup} cycles: {grew}: {delta}")


if __name__ == "__main__":
    main_guard(main)
