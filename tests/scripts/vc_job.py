"""One rank of a job on the virtual cluster (tests/test_vcluster.py): every read is checked
against what the owning rank stored, and rows are counted by where their owner lives.

    python vc_job.py store --method M --comm world|file [--torch] [--expect ok|refuse]
    python vc_job.py dead --hs DIR         (file communicator; the test kills a whole node)

store: variable "host" (one row per rank: a hash of its hostname) tells every rank which
ranks share its node; variable "x" (3 KB rows) is read in random batches of 128 mixing own,
same-node and other-node rows, from two threads. --torch adds DistDataset + ThreadDataLoader,
forked DataLoader workers and ddstore_width=2 groups. --expect refuse: add() must raise
DDStoreUnsupportedError (method 0 across nodes without a window that spans them) on every rank
and leave no variable behind. Prints `vcjob {json}` per rank.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
import zlib

import numpy as np
from _common import main_guard, rows_of, run_threads
from pyddstore._shares import share_of, shares

import pyddstore
from pyddstore import DDStoreTimeoutError, DDStoreUnsupportedError

N, SHAPE, SEED = 4003, (768,), 17  # 3 KB float32 rows
BATCH, ROUNDS = 128, 60


def say(report: dict) -> None:
    """One `vcjob {json}` line in a single write: print() writes its pieces separately when
    Python is unbuffered (PYTHONUNBUFFERED=1), and mpirun then interleaves the ranks' pieces."""
    sys.stdout.write("vcjob " + json.dumps(report) + "\n")
    sys.stdout.flush()


def make_store(method: int, comm_kind: str, hs: str | None, **kw):
    if comm_kind == "world":
        import mpi4py

        mpi4py.rc.thread_level = os.environ.get("VC_THREAD_LEVEL", "multiple")
        from mpi4py import MPI

        return pyddstore.PyDDStore(MPI.COMM_WORLD, method=method, **kw)
    return pyddstore.PyDDStore(None, method=method, handshake_dir=hs, **kw)


def host_hash() -> int:
    return zlib.crc32(socket.gethostname().encode())


def hosts_of(store) -> np.ndarray:
    """Every rank's host hash, read through the store (so that read is checked too)."""
    store.add("host", np.array([[host_hash(), store.rank]], dtype=np.int64))
    out = np.empty((store.size, 2), np.int64)
    store.get_batch("host", out, np.arange(store.size))
    assert list(out[:, 1]) == list(range(store.size)), out
    assert out[store.rank, 0] == host_hash()
    return out[:, 0]


def local_rank() -> int:
    for k in ("SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"):
        if os.environ.get(k):
            return int(os.environ[k])
    return 0


def expected_nic() -> str:
    """The interface FABRIC_IFACE, else DDSTORE_NIC_MAP (local rank -> NIC), names here."""
    if os.environ.get("FABRIC_IFACE"):
        return os.environ["FABRIC_IFACE"]
    pairs = sorted((int(k), v) for k, v in (e.split(":") for e in os.environ["DDSTORE_NIC_MAP"].split(",")))
    return pairs[local_rank() % len(pairs)][1]


def ipv4_of(iface: str) -> str:
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "dev", iface], capture_output=True, text=True)
    return out.stdout.split()[3].split("/")[0]


def check_nic(store, name: str) -> dict:
    """This rank's endpoint (its published record) is bound to the NIC its settings name."""
    records = store._native.records(name)
    mine = records[store.rank] if len(records) == store.size else records[0]
    addr = bytes(json.loads(mine[4:])["addr"])
    assert int.from_bytes(addr[:2], "little") == socket.AF_INET, addr
    bound, nic = socket.inet_ntoa(addr[4:8]), expected_nic()
    assert bound == ipv4_of(nic), f"rank {store.rank} bound {bound}, expected {nic} ({ipv4_of(nic)})"
    return {"nic": nic, "addr": bound}


def owners(counts: list[int]) -> np.ndarray:
    return np.repeat(np.arange(len(counts)), counts)


def mixed_reads(store, hosts: np.ndarray) -> dict:
    first, count = share_of(N, store.size, store.rank)
    counts = shares(N, store.size)
    store.add("x", rows_of(SEED, np.arange(first, first + count), SHAPE, "float32"))
    owner = owners(counts)
    tally = {"own": 0, "same_node": 0, "remote": 0, "mismatches": 0}
    lock = threading.Lock()

    def reader(t: int) -> None:
        rng = np.random.default_rng(1000 * store.rank + t)
        out = np.empty((BATCH,) + SHAPE, np.float32)
        for _ in range(ROUNDS):
            rows = rng.integers(0, N, BATCH)
            store.get_batch("x", out, rows)
            bad = int((out != rows_of(SEED, rows, SHAPE, "float32")).any(axis=1).sum())
            own = owner[rows] == store.rank
            same = (hosts[owner[rows]] == hosts[store.rank]) & ~own
            with lock:
                tally["mismatches"] += bad
                tally["own"] += int(own.sum())
                tally["same_node"] += int(same.sum())
                tally["remote"] += int((~own & ~same).sum())

    run_threads(2, reader)
    assert tally["mismatches"] == 0, tally
    assert tally["own"] > 0 and tally["remote"] > 0, tally
    if (hosts == hosts[store.rank]).sum() > 1:
        assert tally["same_node"] > 0, tally
    return tally


class Samples:
    """(x (4, 8) float32, label int64) per index; any rank can recompute any sample."""

    n = 203

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        import torch

        x = torch.from_numpy(rows_of(5, [i], (4, 8), "float32")[0])
        return x, i * 7 + 3


def check_batch(batch, what: str) -> int:
    x, label = batch
    idx = (label.numpy() - 3) // 7
    assert np.array_equal(x.numpy(), rows_of(5, idx, (4, 8), "float32")), f"{what}: rows {idx[:6]} differ"
    return len(idx)


def torch_reads(comm_kind: str, hs: str | None) -> dict:
    import torch
    from pyddstore.torch import DistDataset, ThreadDataLoader
    from torch.utils.data import DataLoader, default_collate
    from torch.utils.data.distributed import DistributedSampler

    comm = None
    if comm_kind == "world":
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
    src = Samples()
    done = {}
    ds = DistDataset(src, "vcds", comm, method=1, handshake_dir=hs)
    sampler = DistributedSampler(ds, num_replicas=ds.ddstore.size, rank=ds.ddstore.rank, shuffle=True)
    loader = ThreadDataLoader(ds, batch_size=32, sampler=sampler, num_workers=2)
    done["thread_loader"] = sum(check_batch(b, "ThreadDataLoader") for b in loader)
    forked = DataLoader(ds, batch_size=32, sampler=sampler, num_workers=2, persistent_workers=True)
    done["forked_workers"] = sum(check_batch(b, "forked worker") for b in forked)
    del forked
    # Groups of two consecutive ranks, each holding the whole dataset; with ranks mapped
    # round-robin over nodes every group spans two nodes.
    wide = DistDataset(src, "vcwide", comm, method=1, ddstore_width=2, handshake_dir=hs)
    rows = torch.randperm(len(src)).tolist()
    done["width2"] = sum(
        check_batch(default_collate(wide.__getitems__(part)), "ddstore_width=2")
        for part in (rows[:100], rows[100:])
    )
    done["width2_group_hosts"] = sorted({h for h in hosts_of_group(wide.ddstore)})
    wide.ddstore.free()
    ds.ddstore.free()
    return done


def hosts_of_group(store) -> list[int]:
    return [int(h) for h in hosts_of(store)]


def run_store(a) -> None:
    store = make_store(a.method, a.comm, a.hs)
    report = {
        "rank": store.rank,
        "size": store.size,
        "host": socket.gethostname(),
        "transport": store.transport,
    }
    if a.expect == "refuse":
        try:
            store.add("x", np.zeros((4, 8), np.float32))
        except DDStoreUnsupportedError as e:
            report["refused"] = str(e)
            report["names_after"] = list(store.names())
        else:
            raise AssertionError("method 0 across nodes was expected to be refused")
        store.free()
        say(report)
        return
    hosts = hosts_of(store)
    report["nodes"] = len(set(hosts.tolist()))
    report.update(mixed_reads(store, hosts))
    if os.environ.get("VC_CHECK_NIC") == "1":
        report.update(check_nic(store, "x"))
    report["transport"] = store.transport
    store.free()
    if a.torch:
        report["torch"] = torch_reads(a.comm, a.hs)
    say(report)


def run_dead(a) -> None:
    """Ranks on node 1 (ranks 2, 3) are killed by the test once everyone has read from them;
    rank 0 then reads from each dead rank (DDStoreTimeoutError), rank 1 only frees."""
    store = make_store(1, "file", a.hs)
    first, count = share_of(N, store.size, store.rank)
    counts = shares(N, store.size)
    store.add("x", rows_of(SEED, np.arange(first, first + count), SHAPE, "float32"))
    starts = np.cumsum([0] + counts)
    out = np.empty((8,) + SHAPE, np.float32)
    rows = np.arange(N)[::503][:8]
    store.get_batch("x", out, rows)
    assert np.array_equal(out, rows_of(SEED, rows, SHAPE, "float32"))
    store.barrier()
    open(os.path.join(a.hs, f"vcready-{store.rank}"), "w").close()
    if store.rank >= 2:  # the doomed node: wait to be killed
        time.sleep(600)
        raise AssertionError("node 1 was not killed")
    while not os.path.exists(os.path.join(a.hs, "node1-killed")):
        time.sleep(0.05)
    report = {"rank": store.rank, "timeouts": {}}
    if store.rank == 1:
        # Never reads from the dead node: free() must still return within its deadline
        # (its barrier cannot complete: ranks 2 and 3 are dead).
        t0 = time.monotonic()
        try:
            store.free()
            report["free_error"] = None
        except DDStoreTimeoutError as e:
            report["free_error"] = str(e)
        report["free_s"] = round(time.monotonic() - t0, 2)
        say(report)
        return
    for victim in (2, 3):
        rows = np.arange(starts[victim], starts[victim] + 4)
        t0 = time.monotonic()
        try:
            store.get_batch("x", out[:4], rows)
        except DDStoreTimeoutError as e:
            report["timeouts"][victim] = {"s": round(time.monotonic() - t0, 2), "msg": str(e)}
        else:
            raise AssertionError(f"a read from dead rank {victim} returned")
    # Rows of the surviving node still read exactly.
    rows = np.arange(starts[0], starts[2], 97)
    got = np.empty((len(rows),) + SHAPE, np.float32)
    store.get_batch("x", got, rows)
    assert np.array_equal(got, rows_of(SEED, rows, SHAPE, "float32"))
    t0 = time.monotonic()
    try:
        store.free()  # its bounded barrier cannot complete: ranks 2 and 3 are dead
        report["free_error"] = None
    except DDStoreTimeoutError as e:
        report["free_error"] = str(e)
    report["free_s"] = round(time.monotonic() - t0, 2)
    say(report)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("part", choices=["store", "dead"])
    p.add_argument("--method", type=int, default=1)
    p.add_argument("--comm", choices=["world", "file"], default="world")
    p.add_argument("--hs", default=None)
    p.add_argument("--torch", action="store_true")
    p.add_argument("--expect", choices=["ok", "refuse"], default="ok")
    a = p.parse_args()
    if a.torch:
        import torch  # noqa: F401 - before MPI starts, as pyddstore.torch asks

    if a.part == "store":
        run_store(a)
    else:
        run_dead(a)


main_guard(main)
