"""Training steps against the loader (issue 37): per step the loop takes the loader's batch, then
sleeps the accelerator's compute time; the figure is the accelerator's utilization (AU, compute
time / wall time), beside samples/s and the time per step spent waiting for data.

    mpirun -n 2 python -m pyddstore.benchmarks.steps [--workloads ...] [--samples-small 8192]
        [--samples-large 256] [--epochs 3] [--torch-workers 1,2,4] [--dir DIR] [--json FILE]

Workloads (``--workloads``, comma-separated): ``small-mem`` (114 KB samples, batches of 64,
69.6 ms per step), ``small-spill`` (the same, the store's budget a quarter of each rank's share),
``large-mem`` (14.65 MB samples, batches of 4, 63.6 ms per step) and ``large-spill``. The source
is one ``.npz`` file per sample (one uint8 array, written once under ``--dir``), read through a
map-style dataset: by ``DistDataset`` (the load timed apart) then ``ThreadDataLoader`` with
pyddstore's ``DistributedSampler`` (``--store-workers`` threads), and by torch's ``DataLoader``
over the same files with torch's ``DistributedSampler`` and 1, 2 and 4 worker processes. Every
loader's first epoch is reported apart from the later ones (``steady``: their totals). Spilled
workloads drop the files' pages from the page cache before every epoch (``posix_fadvise
(DONTNEED)`` on each file, which needs no root); in-memory ones leave the files in the page cache
(the DataLoader's best case). Each row of each batch is checked (its first and last 4 KiB) against
the file it came from.

Spilled workloads also measure the disk (``disk``): every rank reads its share of the source files
with ``O_DIRECT`` (as the read-ahead reads spilled rows: one read per sample, at most 64 MiB in
flight), all ranks at once, before and after the store's epochs; ``required`` is the rate the
store's steps read spilled rows at when no step waits (rows read from the spill files per step,
all ranks, over the compute time), and ``au_bound`` = min(1, disk / required) the AU this disk
allows, whatever the CPU load; ``spilled_read`` is the rate the store's steady epochs read spilled
rows at (all ranks: staged by the read-ahead or read by the workers), against the disk.

Also: reading one batch of 4 large samples (``read_batch``) against a ``memcpy`` of the same bytes
into a warm buffer, the median of ``--copy-rounds``, as a ratio in the same run (``read_vs_memcpy``).
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import resource
import threading
import time

import numpy as np

from ._common import description, mpi_world, quiet_wait

# name: (sample bytes, batch size, compute seconds per step, spilled)
WORKLOADS = {
    "small-mem": (114_000, 64, 0.0696, False),
    "small-spill": (114_000, 64, 0.0696, True),
    "large-mem": (14_650_000, 4, 0.0636, False),
    "large-spill": (14_650_000, 4, 0.0636, True),
}
CHECK = 4096  # bytes checked at each end of every row


def _args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m pyddstore.benchmarks.steps", description=description(__doc__))
    p.add_argument(
        "--workloads", default=",".join(WORKLOADS), help="comma-separated, of: " + ", ".join(WORKLOADS)
    )
    p.add_argument(
        "--samples-small", type=int, default=8192, help="samples of the small workloads (all ranks)"
    )
    p.add_argument(
        "--samples-large", type=int, default=256, help="samples of the large workloads (all ranks)"
    )
    p.add_argument("--large-bytes", type=int, default=None, help="size of a large sample (default 14.65 MB)")
    p.add_argument("--epochs", type=int, default=3, help="epochs per loader (the first reported apart)")
    p.add_argument("--torch-workers", default="1,2,4", help="torch DataLoader worker counts ('' for none)")
    p.add_argument("--store-workers", type=int, default=2, help="ThreadDataLoader worker threads")
    p.add_argument("--compute-scale", type=float, default=1.0, help="multiplies each workload's compute time")
    p.add_argument("--copy-rounds", type=int, default=20, help="rounds of the batch read / memcpy comparison")
    p.add_argument("--dir", default=None, help="work directory (default: ./bench-results/steps)")
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


def _row(i: int, nbytes: int) -> np.ndarray:
    """Sample i: (0, 1, ..., 250, 0, ...) + i (mod 256), uint8."""
    return ((np.arange(nbytes, dtype=np.int64) % 251 + i) % 256).astype(np.uint8)


def _check_rows(rows: np.ndarray, idx, where: str) -> None:
    """Each row's first and last CHECK bytes against sample idx[j]."""
    nbytes = rows.shape[1]
    k = min(CHECK, nbytes)
    head = (np.arange(k) % 251).astype(np.int64)
    tail = (np.arange(nbytes - k, nbytes) % 251).astype(np.int64)
    for j, i in enumerate(idx):
        i = int(i)
        if not (
            np.array_equal(rows[j, :k], ((head + i) % 256).astype(np.uint8))
            and np.array_equal(rows[j, nbytes - k :], ((tail + i) % 256).astype(np.uint8))
        ):
            raise AssertionError(f"{where}: row {j} is not sample {i}")


class NpzFiles:
    """A map-style source: sample i is the one uint8 array of file i (a torch Dataset by duck
    typing: __len__ and __getitem__)."""

    def __init__(self, paths: list[str]):
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> np.ndarray:
        with np.load(self.paths[i]) as z:
            return z["x"]


def _write_files(comm, where: str, n: int, nbytes: int) -> list[str]:
    """n .npz files of nbytes each under `where` (written once, by the ranks in turn)."""
    paths = [os.path.join(where, f"s{i:07d}.npz") for i in range(n)]
    if comm.rank == 0:
        os.makedirs(where, exist_ok=True)
    comm.Barrier()
    for i in range(comm.rank, n, comm.size):
        p = paths[i]
        if os.path.exists(p) and os.path.getsize(p) > nbytes:
            continue
        tmp = p + f".tmp{comm.rank}.npz"
        np.savez(tmp, x=_row(i, nbytes))
        os.replace(tmp, p)
    comm.Barrier()
    return paths


def _drop_pages(comm, paths: list[str]) -> None:
    """Drops the files' pages from the page cache (each rank its share of the files)."""
    for p in paths[comm.rank :: comm.size]:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    comm.Barrier()


def _disk_rate(comm, paths: list[str], nbytes: int) -> float:
    """Bytes/s all ranks read together from their shares of `paths` with O_DIRECT: one read per
    file (its size rounded up to 4 KiB), as many in flight as 64 MiB holds (at most 32)."""
    mine = paths[comm.rank :: comm.size]
    span = -(-nbytes // 4096) * 4096 + 4096
    threads = max(1, min(32, (64 << 20) // span, len(mine)))
    done = [0] * threads

    def read(t: int) -> None:
        buf = mmap.mmap(-1, span)  # page-aligned, as O_DIRECT needs
        view = memoryview(buf)
        for p in mine[t::threads]:
            fd = os.open(p, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
            try:
                done[t] += os.preadv(fd, [view], 0)
            finally:
                os.close(fd)
        view.release()
        buf.close()

    quiet_wait(comm)
    t0 = time.perf_counter()
    ts = [threading.Thread(target=read, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    took = time.perf_counter() - t0
    total = comm.allreduce(sum(done))
    return total / comm.allreduce(took, op=_max())


def _max():
    from mpi4py import MPI

    return MPI.MAX


def _epoch(loader, compute: float, batch: int, order: list, where: str) -> dict:
    """One epoch of steps: take the batch (checked), sleep `compute`."""
    steps = samples = 0
    wait = 0.0
    t0 = time.perf_counter()
    it = iter(loader)
    while True:
        w0 = time.perf_counter()
        try:
            x = next(it)
        except StopIteration:
            break
        wait += time.perf_counter() - w0
        rows = x.numpy() if hasattr(x, "numpy") else np.asarray(x)
        _check_rows(rows.reshape(len(rows), -1), order[steps * batch : steps * batch + len(rows)], where)
        samples += len(rows)
        steps += 1
        del x, rows
        time.sleep(compute)
    wall = time.perf_counter() - t0
    return {"steps": steps, "samples": samples, "wall_s": wall, "wait_s": wait, "compute_s": steps * compute}


def _summary(epochs: list[dict]) -> dict:
    def of(es):
        if not es:
            return None
        tot = {k: sum(e[k] for e in es) for k in ("steps", "samples", "wall_s", "wait_s", "compute_s")}
        return {
            "au": tot["compute_s"] / tot["wall_s"],
            "samples_per_s": tot["samples"] / tot["wall_s"],
            "wait_ms_per_step": 1000 * tot["wait_s"] / max(1, tot["steps"]),
            "epochs": len(es),
        }

    return {"first_epoch": of(epochs[:1]), "steady": of(epochs[1:]), "per_epoch": epochs}


def _run_epochs(comm, make_loader, sampler, a, spec, paths, spilled, where) -> dict:
    _, batch, compute, _ = spec
    loader = make_loader()
    epochs = []
    for e in range(a.epochs):
        sampler.set_epoch(e)
        if spilled:
            _drop_pages(comm, paths)
        quiet_wait(comm)
        order = list(iter(sampler))
        epochs.append(_epoch(loader, compute * a.compute_scale, batch, order, f"{where} epoch {e}"))
    close = getattr(loader, "close", None)
    if close is not None:
        close()
    quiet_wait(comm)
    return _summary(epochs)


def _store(comm, a, name: str, spec, paths: list[str], spilled: bool, spill_dir: str) -> tuple[dict, object]:
    from pyddstore.torch import DistDataset, DistributedSampler, ThreadDataLoader

    nbytes, batch, _, _ = spec
    per_rank = -(-len(paths) // comm.size) * nbytes
    budget = per_rank // 4 if spilled else None
    if spilled:
        _drop_pages(comm, paths)
    quiet_wait(comm)
    t0 = time.perf_counter()
    # In memory: method 1 (as the DataLoader rows' threads read it); spilled: the default method,
    # which a budget picks.
    ds = DistDataset(
        NpzFiles(paths), name, comm, method=None if spilled else 1, memory_limit=budget, spill_dir=spill_dir
    )
    load_s = time.perf_counter() - t0
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    sampler = DistributedSampler(ds, shuffle=True, seed=0)
    disk_before = _disk_rate(comm, paths, nbytes) if spilled else None
    out = _run_epochs(
        comm,
        lambda: ThreadDataLoader(
            ds, batch_size=batch, sampler=sampler, num_workers=a.store_workers, persistent_workers=True
        ),
        sampler,
        a,
        spec,
        paths,
        spilled,
        f"{name} store",
    )
    prof = ds.get_profile()
    hits, misses = prof.get("prefetch_hits", 0), prof.get("spilled_rows", 0)
    if spilled:
        disk_after = _disk_rate(comm, paths, nbytes)
        out["disk"] = _disk_summary(comm, out, disk_before, disk_after, hits + misses, nbytes)
    out.update(
        load_s=load_s,
        budget_bytes=budget,
        peak_rss_mb_after_load=peak_mb,
        read_ahead_hit_rate=(hits / (hits + misses)) if hits + misses else None,
        workers=a.store_workers,
    )
    return out, ds


def _disk_summary(comm, out: dict, before: float, after: float, spilled_rows: int, nbytes: int) -> dict:
    """The disk against what the store's steps need of it (see the module's doc)."""
    steps = sum(e["steps"] for e in out["per_epoch"])
    compute = out["per_epoch"][0]["compute_s"] / max(1, out["per_epoch"][0]["steps"])
    # Spilled bytes per step, all ranks (the same share of spilled rows every epoch).
    per_step = comm.allreduce(spilled_rows * nbytes) / max(1, comm.allreduce(steps) / comm.size)
    disk = (before + after) / 2
    required = per_step / compute
    steady = out["per_epoch"][1:] or out["per_epoch"]
    wall = comm.allreduce(sum(e["wall_s"] for e in steady), op=_max())
    read = per_step * sum(e["steps"] for e in steady) / wall
    return {
        "disk_gbps": disk / 1e9,
        "disk_before_after_gbps": [before / 1e9, after / 1e9],
        "required_gbps": required / 1e9,
        "au_bound": min(1.0, disk / required),
        "spilled_read_gbps": read / 1e9,
    }


def _torch(comm, a, spec, paths, spilled, workers: int) -> dict:
    import torch
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler as TorchSampler

    _, batch, _, _ = spec
    src = NpzFiles(paths)
    sampler = TorchSampler(src, num_replicas=comm.size, rank=comm.rank, shuffle=True, seed=0)

    def make():
        return DataLoader(
            src,
            batch_size=batch,
            sampler=sampler,
            num_workers=workers,
            persistent_workers=True,
            collate_fn=lambda xs: torch.from_numpy(np.stack(xs)),
        )

    out = _run_epochs(comm, make, sampler, a, spec, paths, spilled, f"DataLoader({workers})")
    out["workers"] = workers
    return out


def _read_vs_memcpy(ds, rounds: int, nbytes: int) -> dict:
    """read_batch() of 4 large samples vs np.copyto of the same bytes into a warm buffer."""
    rng = np.random.default_rng(1)
    n = len(ds)
    src = np.empty((4, nbytes), dtype=np.uint8)
    warm = np.empty_like(src)
    idx = rng.choice(n, size=4, replace=False)
    first = ds.read_batch(idx)
    _check_rows(first.numpy(), idx, "read_batch")
    src[...] = first.numpy()
    del first
    warm[...] = src
    reads, copies = [], []
    for _ in range(rounds):  # alternated, so that both see the same machine
        idx = rng.choice(n, size=4, replace=False)
        t0 = time.perf_counter()
        b = ds.read_batch(idx)
        reads.append(time.perf_counter() - t0)
        _check_rows(b.numpy(), idx, "read_batch")
        del b
        t0 = time.perf_counter()
        np.copyto(warm, src)
        copies.append(time.perf_counter() - t0)
    r, c = float(np.median(reads)), float(np.median(copies))
    return {"bytes": 4 * nbytes, "read_ms": 1000 * r, "memcpy_ms": 1000 * c, "ratio": r / c, "rounds": rounds}


def main(argv=None) -> None:
    a = _args(argv)
    comm = mpi_world()
    work = os.path.abspath(a.dir or os.path.join("bench-results", "steps"))
    spill_dir = os.path.join(work, "spill")
    if comm.rank == 0:
        os.makedirs(spill_dir, mode=0o700, exist_ok=True)
    comm.Barrier()
    torch_workers = [int(w) for w in a.torch_workers.split(",") if w.strip()]
    large = a.large_bytes or WORKLOADS["large-mem"][0]
    results: dict = {"ranks": comm.size, "loadavg": os.getloadavg(), "workloads": {}}
    for wname in [w.strip() for w in a.workloads.split(",") if w.strip()]:
        if wname not in WORKLOADS:
            raise SystemExit(f"--workloads: unknown workload {wname!r}; known: {', '.join(WORKLOADS)}")
        nbytes, batch, compute, spilled = WORKLOADS[wname]
        is_large = wname.startswith("large")
        if is_large:
            nbytes = large
        spec = (nbytes, batch, compute, spilled)
        n = a.samples_large if is_large else a.samples_small
        paths = _write_files(
            comm, os.path.join(work, f"{'large' if is_large else 'small'}-{nbytes}-{n}"), n, nbytes
        )
        row: dict = {"sample_bytes": nbytes, "batch": batch, "compute_ms": 1000 * compute * a.compute_scale}
        row["store"], ds = _store(comm, a, wname.replace("-", "_"), spec, paths, spilled, spill_dir)
        if is_large and not spilled:
            row["read_vs_memcpy"] = _read_vs_memcpy(ds, a.copy_rounds, nbytes)
        ds.free()
        for w in torch_workers:
            row[f"torch_{w}"] = _torch(comm, a, spec, paths, spilled, w)
        row["loadavg"] = os.getloadavg()
        results["workloads"][wname] = row
        if comm.rank == 0:
            s = row["store"]["steady"] or row["store"]["first_epoch"]
            best = max(
                (
                    (row[f"torch_{w}"]["steady"] or row[f"torch_{w}"]["first_epoch"])["au"]
                    for w in torch_workers
                ),
                default=float("nan"),
            )
            print(
                f"{wname}: store AU {s['au']:.2f} ({s['wait_ms_per_step']:.1f} ms waiting per step, "
                f"load {row['store']['load_s']:.1f} s), best DataLoader AU {best:.2f}; "
                f"load average {row['loadavg'][0]:.1f}",
                flush=True,
            )
            if "disk" in row["store"]:
                d = row["store"]["disk"]
                print(
                    f"  disk {d['disk_gbps']:.2f} GB/s (O_DIRECT, all ranks; before/after "
                    f"{d['disk_before_after_gbps'][0]:.2f}/{d['disk_before_after_gbps'][1]:.2f}) against "
                    f"{d['required_gbps']:.2f} GB/s of spilled rows the steps need: AU bound "
                    f"{d['au_bound']:.2f}; the store read them at {d['spilled_read_gbps']:.2f} GB/s",
                    flush=True,
                )
            if "read_vs_memcpy" in row:
                r = row["read_vs_memcpy"]
                print(
                    f"  read_batch {r['read_ms']:.1f} ms vs memcpy {r['memcpy_ms']:.1f} ms: {r['ratio']:.2f}x"
                )
    every = comm.gather(results, root=0)
    if comm.rank == 0:
        out = {"ranks": comm.size, "per_rank": every}
        if a.json:
            os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
            with open(a.json, "w") as f:
                json.dump(out, f, indent=1)
        print("steps bench ok", flush=True)


if __name__ == "__main__":
    main()
