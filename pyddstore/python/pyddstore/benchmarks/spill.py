"""Datasets larger than memory (issue 27): one epoch of a DistDataset whose shares spill past
a memory budget, against the alternatives on the same data, measured in one run.

    mpirun -n 2 python -m pyddstore.benchmarks.spill [--mb 3072] [--budget-mb 384] [--sample-kb 49]

Per sample size it reports, per rank and as ratios against the spilled store's epoch:

- ``spill``: samples/s of an epoch with ThreadDataLoader over a shuffling DistributedSampler
  (the median of ``--rounds`` epochs),
  the dataset ``--mb`` MB (``--mb / (2 * --budget-mb)`` times the 2 ranks' budgets), each
  rank's share past ``--budget-mb`` MiB in a spill file under ``--dir``; the read-ahead hit rate
  and this rank's peak resident memory (VmHWM) against the budget;
- ``raw``: the random-read limit of the same spill files: ``O_DIRECT`` preads of one sample
  each (aligned), 32 in flight, as many as an epoch read from the files, in bursts before and
  after each epoch; ``spill / raw`` is the median over the epochs of the epoch's samples/s
  against the mean of the two bursts either side of it (this disk's rate drifts);
- ``memory``: the same store with everything in memory;
- ``memmap``: torch DataLoader (4 forked workers) over ``np.memmap`` of the source ``.npy``;
- ``files``: torch DataLoader (4 forked workers) over one file per sample (when the data set
  has at most --max-files samples).

- ``litdata``, ``streaming``: with ``--alt-python PATH`` (a Python with litdata and
  mosaicml-streaming, e.g. ``.venv-alt/bin/python`` made by ``scripts/setup-alt.sh``; they do not
  install beside pyddstore's numpy), each rank runs ``tools/spill_alt.py`` (of a checkout) in that
  Python over the same source: one conversion by rank 0 (timed apart), then one shuffled epoch split over the
  ranks (a gloo process group), 4 workers, batches of ``--batch``.
Root: the page cache is dropped before each epoch (cold cache); else it is warm and says so.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import random
import threading
import time

import numpy as np

from ._common import description, mpi_world

PART_SEEDS = 7


def _args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m pyddstore.benchmarks.spill", description=description(__doc__))
    p.add_argument("--mb", type=float, default=3072, help="data set size in MB (all ranks)")
    p.add_argument("--budget-mb", type=float, default=384, help="memory budget per rank in MiB")
    p.add_argument("--sample-kb", default="49,3", help="sample sizes in KB, comma-separated")
    p.add_argument(
        "--dir", default=None, help="work directory on the disk measured (default: ./bench-results/spill)"
    )
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--max-files", type=int, default=100_000, help="skip one-file-per-sample above this")
    p.add_argument("--json", default=None)
    p.add_argument(
        "--alt-python",
        default=None,
        help="a Python with litdata and mosaicml-streaming (see scripts/setup-alt.sh)",
    )
    p.add_argument("--rounds", type=int, default=3, help="spilled-store epochs, each between two raw bursts")
    p.add_argument("--only-spill", action="store_true", help="the spilled store and the raw limit only")
    p.add_argument("--alt-timeout", type=float, default=3600, help="seconds one alternative's run may take")
    return p.parse_args(argv)


def _drop_caches(comm) -> bool:
    """Drops the page cache (root only); whether it could."""
    comm.Barrier()
    ok = False
    if comm.rank == 0 and os.geteuid() == 0:
        os.sync()
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
            ok = True
        except OSError:
            pass
    ok = comm.bcast(ok, root=0)
    comm.Barrier()
    return ok


def _hwm_kib(field: str = "VmHWM") -> int:
    """This process's peak (or, with field="VmRSS", current) resident memory in KiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _pss_kib() -> int:
    """This process's proportional resident memory (shared pages split among the processes
    that map them: a same-node peer's share, read through shared memory, counts half)."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class _PeakPss:
    """The highest `_pss_kib()` seen while running (sampled every second; the kernel keeps no
    peak). Reading smaps_rollup walks every mapped page: at 0.2 s it took 13% of this
    machine's CPU time during an epoch (perf), a load the figures must not carry."""

    def __init__(self):
        self.peak = _pss_kib()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(1.0):
            self.peak = max(self.peak, _pss_kib())

    def stop(self) -> float:
        """Stops sampling; the peak in MiB."""
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _pss_kib())
        return self.peak / 1024


def _reset_hwm() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5\n")  # resets VmHWM to the current RSS
    except OSError:
        pass


def _write_source(path: str, n: int, size: int) -> None:
    """A .npy of n rows of `size` random bytes, written in slices."""
    mm = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint8, shape=(n, size))
    step = max(1, (64 << 20) // size)
    rng = np.random.default_rng(PART_SEEDS)
    for a in range(0, n, step):
        b = min(n, a + step)
        mm[a:b] = rng.integers(0, 256, (b - a, size), dtype=np.uint8)
    mm.flush()
    del mm


def _epoch(loader, sampler, check, epoch: int = 1) -> tuple[float, int]:
    """Samples/s of epoch `epoch` of `loader`; `check(batch)` verifies a few batches' content."""
    sampler.set_epoch(epoch)
    n, t0 = 0, time.perf_counter()
    for k, batch in enumerate(loader):
        if k % 50 == 0:
            check(batch, k)
        n += len(batch)
    return n / (time.perf_counter() - t0), n


def _raw_limit(files: list, size: int, reads: int, inflight: int = 32) -> float:
    """Random O_DIRECT preads of `size` bytes (aligned) from `files`, `inflight` at a time: reads/s."""
    fds = [os.open(f, os.O_RDONLY | getattr(os, "O_DIRECT", 0)) for f in files]
    lens = [os.fstat(fd).st_size for fd in fds]
    span = (size + 4095) // 4096 * 4096 + 4096
    left = [reads]
    lock = threading.Lock()

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        buf = mmap.mmap(-1, span)  # page-aligned, as O_DIRECT wants
        while True:
            with lock:
                if left[0] <= 0:
                    return
                left[0] -= 1
            k = rng.randrange(len(fds))
            off = rng.randrange(4096, max(4097, lens[k] - span)) // 4096 * 4096
            os.preadv(fds[k], [memoryview(buf)[: span - 4096 if off + span > lens[k] else span]], off)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(inflight)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.perf_counter() - t0
    for fd in fds:
        os.close(fd)
    return reads / took


def _run_size(comm, a, size: int, work: str) -> dict:
    import torch
    from torch.utils.data import DataLoader, Dataset
    from torch.utils.data.distributed import DistributedSampler as TorchSampler

    from pyddstore.torch import DistDataset, DistributedSampler, ThreadDataLoader

    n = int(a.mb * 1e6) // size
    src = os.path.join(work, f"src-{size}.npy")
    if comm.rank == 0 and not os.path.exists(src):
        _write_source(src, n, size)
    comm.Barrier()
    # The source is read with pread, not mapped: a mapping's faults bring pages around each
    # sample read (fault-around, read-ahead) into this rank's memory, 20 MiB an epoch at 3 KB.
    head = np.load(src, mmap_mode="r").offset
    src_fd = os.open(src, os.O_RDONLY)

    def want(i: int) -> np.ndarray:
        return np.frombuffer(os.pread(src_fd, size, head + int(i) * size), dtype=np.uint8)

    def check(batch, k):  # a batch's first samples against the source (content, not just shape)
        order = _last_idx["idx"]
        for j, s in enumerate(batch[:2]):
            if not np.array_equal(np.asarray(s), want(order[k * a.batch + j])):
                raise AssertionError(f"batch {k}: sample {order[k * a.batch + j]} differs from the source")

    _last_idx: dict = {}
    out: dict = {"sample_bytes": size, "samples": n, "budget_bytes": int(a.budget_mb * 2**20)}
    spill_dir = os.path.join(work, "spill")
    os.makedirs(spill_dir, mode=0o700, exist_ok=True)

    # The spilled store: load (no conversion step), then --rounds epochs.
    out["cold_cache"] = _drop_caches(comm)
    _reset_hwm()
    out["base_rss_mib"] = _hwm_kib() / 1024  # the interpreter, torch and the store's transport
    out["base_pss_mib"] = _pss_kib() / 1024
    pss = _PeakPss()
    t0 = time.perf_counter()
    ds = DistDataset(
        [src], f"spill{size}", comm, method=1, memory_limit=out["budget_bytes"], spill_dir=spill_dir
    )
    out["load_s"] = time.perf_counter() - t0
    out["load_peak_rss_mib"] = _hwm_kib() / 1024
    out["after_load_rss_mib"] = _hwm_kib("VmRSS") / 1024
    # Rounds alternate a raw burst and an epoch on the same files (raw, epoch 1, raw, epoch 2,
    # ..., raw): this disk's rate drifts by 1.5x within minutes, so each epoch is set against
    # the mean of the bursts either side of it, and the figure is the median of those ratios.
    files = [
        os.path.join(spill_dir, f)
        for f in os.listdir(spill_dir)
        if f.endswith(".spill") and f"p{os.getpid()}-" in f
    ]
    spilled_share = (n // comm.size) * 3 // 4  # a rough epoch's spilled reads, for the first burst
    _drop_caches(comm)
    raws = [_raw_limit(files, size, max(1000, spilled_share))]
    _reset_hwm()  # the epochs' own peak from here
    sampler = DistributedSampler(ds, shuffle=True, seed=1)
    loader = ThreadDataLoader(ds, batch_size=a.batch, sampler=sampler, num_workers=a.workers, collate_fn=list)
    epochs, peaks, spilled, hits = [], [], 0, 0  # peaks: PSS peak so far, after each round
    for epoch in range(1, a.rounds + 1):
        sampler.set_epoch(epoch)
        _last_idx["idx"] = np.fromiter(iter(sampler), dtype=np.int64)  # not a list: 36 B per sample
        before = ds._store.get_profile()
        _drop_caches(comm)
        rate, _ = _epoch(loader, sampler, check, epoch)
        epochs.append(rate)
        prof = ds._store.get_profile()
        read = prof["spilled_rows"] - before["spilled_rows"]
        spilled += read
        hits += prof["prefetch_hits"] - before["prefetch_hits"]
        _drop_caches(comm)
        raws.append(_raw_limit(files, size, max(1000, read)))
        peaks.append(max(pss.peak, _pss_kib()) / 1024)
    loader.close()
    out["epoch_peak_rss_mib"] = _hwm_kib() / 1024
    out["peak_pss_mib"] = pss.stop()
    out["pss_peak_after_round_mib"] = peaks
    out["shmem_rss_mib"] = _hwm_kib("RssShmem") / 1024  # own and same-node peers' shares touched
    out["peak_rss_mib"] = max(out["load_peak_rss_mib"], out["epoch_peak_rss_mib"])
    ratios = [e / ((raws[k] + raws[k + 1]) / 2) for k, e in enumerate(epochs)]
    out["spill_epochs"], out["raw_bursts"], out["spill_raw_ratio_per_round"] = epochs, raws, ratios
    out["spill"] = float(np.median(epochs))
    out["raw"] = float(np.median(raws))
    out["spilled_rows_read"] = spilled
    out["prefetch_hit_rate"] = hits / max(1, hits + spilled)
    ds.free()
    if a.only_spill:
        out["spill_over_raw"] = float(np.median(ratios))
        os.close(src_fd)
        return out

    # Everything in memory (for scale).
    ds = DistDataset([src], f"mem{size}", comm, method=1)
    sampler = DistributedSampler(ds, shuffle=True, seed=1)
    sampler.set_epoch(1)
    _last_idx["idx"] = np.fromiter(iter(sampler), dtype=np.int64)  # not a list: 36 B per sample
    loader = ThreadDataLoader(ds, batch_size=a.batch, sampler=sampler, num_workers=a.workers, collate_fn=list)
    out["memory"], _ = _epoch(loader, sampler, check)
    loader.close()
    ds.free()

    class Memmap(Dataset):
        def __init__(self):
            self.mm = None

        def __len__(self):
            return n

        def __getitem__(self, i):
            if self.mm is None:
                self.mm = np.load(src, mmap_mode="r")
            return torch.from_numpy(np.array(self.mm[i]))

    def torch_epoch(dataset) -> float:
        sampler = TorchSampler(dataset, num_replicas=comm.size, rank=comm.rank, shuffle=True, seed=1)
        loader = DataLoader(
            dataset,
            batch_size=a.batch,
            sampler=sampler,
            num_workers=a.workers,
            collate_fn=list,
            multiprocessing_context="fork",
        )
        sampler.set_epoch(1)
        _last_idx["idx"] = np.fromiter(iter(sampler), dtype=np.int64)  # not a list: 36 B per sample
        _drop_caches(comm)
        return _epoch(loader, sampler, check)[0]

    out["memmap"] = torch_epoch(Memmap())

    if n <= a.max_files:
        per = os.path.join(work, f"files-{size}")
        if comm.rank == 0 and not os.path.isdir(per):
            os.makedirs(per + ".tmp", exist_ok=True)
            mm = np.load(src, mmap_mode="r")
            for i in range(n):
                with open(os.path.join(per + ".tmp", f"{i}.bin"), "wb") as f:
                    f.write(mm[i].tobytes())
            os.rename(per + ".tmp", per)
        comm.Barrier()

        class Files(Dataset):
            def __len__(self):
                return n

            def __getitem__(self, i):
                with open(os.path.join(per, f"{i}.bin"), "rb") as f:
                    return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)

        out["files"] = torch_epoch(Files())
    else:
        out["files"] = None
    if a.alt_python:
        out.update(_alternatives(comm, a, src, os.path.join(work, f"alt-{size}"), size))
    out["spill_over_raw"] = float(np.median(ratios))
    for k in ("memory", "memmap", "files", "litdata", "streaming"):
        if out.get(k):
            out[f"spill_over_{k}"] = out["spill"] / out[k]
    os.close(src_fd)
    return out


def alt_script() -> str:
    """tools/spill_alt.py of the checkout this package runs from (a developer's harness, not in
    the wheel); DDStoreValueError from an installed package."""
    from pyddstore import DDStoreValueError

    here = os.path.dirname(os.path.abspath(__file__))
    script = os.path.normpath(os.path.join(here, "..", "..", "..", "..", "tools", "spill_alt.py"))
    if not os.path.isfile(script):
        raise DDStoreValueError(
            f"--alt-python runs tools/spill_alt.py of a source checkout; none at {script} (an "
            "installed pyddstore): run the bench from the repository (make bench-spill)"
        )
    return script


def _alternatives(comm, a, src: str, work: str, size: int) -> dict:
    """litdata's and mosaicml-streaming's samples/s on this rank (see tools/spill_alt.py), each
    library in its own process per rank (one after the other in one process, the second hung)."""
    import signal
    import subprocess
    import sys

    script = alt_script()
    out: dict = {}
    for k, name in enumerate(("litdata", "streaming")):
        port = 29500 + (size + k) % 400
        cmd = [a.alt_python, script, "--src", src, "--work", work, "--rank", str(comm.rank)]
        cmd += ["--world", str(comm.size), "--port", str(port), "--which", name]
        cmd += ["--batch", str(a.batch), "--workers", str(a.workers)]
        comm.Barrier()
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        try:
            stdout, stderr = proc.communicate(timeout=a.alt_timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its loader workers too
            stdout, stderr = proc.communicate()
            stderr += f"\ntimed out after {a.alt_timeout} s"
        lines = [x for x in stdout.splitlines() if x.startswith("ALT ")]
        if proc.returncode != 0 or not lines:
            sys.stderr.write(
                f"rank {comm.rank}: {' '.join(cmd)} failed ({proc.returncode}):\n{stderr[-3000:]}\n"
            )
            out[f"{name}_error"] = stderr[-300:]
            continue
        r = json.loads(lines[-1][4:])[name]
        out[name] = r.get("samples_per_s")
        out[f"{name}_convert_s"] = r.get("convert_s")
        if r.get("error"):
            out[f"{name}_error"] = r["error"]
    return out


def main(argv=None) -> None:
    a = _args(argv)
    comm = mpi_world()
    work = a.dir or os.path.join("bench-results", "spill")
    if comm.rank == 0:
        os.makedirs(work, exist_ok=True)
    comm.Barrier()
    results = []
    for kb in a.sample_kb.split(","):
        size = int(float(kb) * 1000)
        r = _run_size(comm, a, size, work)
        rows = comm.gather(r, root=0)
        if comm.rank == 0:
            results.append(rows)
            budget = rows[0]["budget_bytes"] / 2**20
            print(
                f"\n{size} B samples, {rows[0]['samples']} samples ({a.mb:.0f} MB, "
                f"{a.mb * 1e6 / (comm.size * budget * 2**20):.1f}x the {comm.size} ranks' "
                f"{budget:.0f} MiB budgets), "
                f"cold cache: {rows[0]['cold_cache']}"
            )
            for rank, x in enumerate(rows):
                line = (
                    f"  rank {rank}: spill {x['spill']:.0f} samples/s (load {x['load_s']:.1f} s, "
                    f"read-ahead hit rate {x['prefetch_hit_rate']:.2f}, "
                    f"peak RSS {x['peak_rss_mib']:.0f} MiB = "
                    f"{x['base_rss_mib']:.0f} before the load + "
                    f"{x['peak_rss_mib'] - x['base_rss_mib']:.0f}: load peak "
                    f"+{x['load_peak_rss_mib'] - x['base_rss_mib']:.0f}, after the load "
                    f"+{x['after_load_rss_mib'] - x['base_rss_mib']:.0f}, epoch peak "
                    f"+{x['epoch_peak_rss_mib'] - x['base_rss_mib']:.0f}, shared memory "
                    f"{x['shmem_rss_mib']:.0f}; peak PSS {x['peak_pss_mib']:.0f} MiB = "
                    f"{x['base_pss_mib']:.0f} + {x['peak_pss_mib'] - x['base_pss_mib']:.0f}); "
                    f"raw {x['raw']:.0f}/s"
                )
                if len(x.get("spill_epochs", [])) > 1:
                    line += "\n          rounds (epoch / mean of the raw bursts either side): " + ", ".join(
                        f"{e:.0f} / {(r0 + r1) / 2:.0f} = {e / ((r0 + r1) / 2):.2f}"
                        for e, r0, r1 in zip(x["spill_epochs"], x["raw_bursts"], x["raw_bursts"][1:])
                    )
                for k in ("memory", "memmap", "files"):
                    if x.get(k):
                        line += f", {k} {x[k]:.0f}/s"
                for alt in ("litdata", "streaming"):
                    if x.get(alt):
                        line += f", {alt} {x[alt]:.0f}/s"
                        if x.get(f"{alt}_convert_s"):
                            line += f" (conversion {x[f'{alt}_convert_s']:.0f} s)"
                    elif x.get(f"{alt}_error"):
                        line += f", {alt} failed: {x[f'{alt}_error'][:200]}"
                ratios = ", ".join(
                    f"{k[len('spill_over_') :]} {v:.2f}" for k, v in x.items() if k.startswith("spill_over_")
                )
                print(line + f"\n          spill / ...: {ratios}")
            print(job_line(rows))
    if comm.rank == 0 and a.json:
        os.makedirs(os.path.dirname(a.json) or ".", exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


# The loaders of a result row, in the order they are reported.
LOADERS = ("spill", "raw", "memory", "memmap", "files", "litdata", "streaming")


def job_line(rows: list[dict]) -> str:
    """The job's epoch throughput per loader: every rank reads its part of the epoch (split evenly),
    and a training job's steps wait for the slowest rank, so the epoch takes as long as that
    rank's part: all ranks' samples / its time = ranks x the lowest rank's samples/s. Against
    raw, with rounds, the ratio is the median over rounds, as per rank."""
    job = {}
    for k in LOADERS:
        rates = [x.get(k) for x in rows]
        if all(rates):
            job[k] = len(rows) * min(rates)
    figures = ", ".join(f"{k} {v:.0f}/s" for k, v in job.items())
    against = {k: job["spill"] / v for k, v in job.items() if k != "spill"}
    if all(len(x.get("spill_epochs", [])) > 1 for x in rows):
        # As per rank: each round's slowest epoch against the slowest mean of its raw bursts.
        per_round = [
            min(x["spill_epochs"][i] for x in rows)
            / min((x["raw_bursts"][i] + x["raw_bursts"][i + 1]) / 2 for x in rows)
            for i in range(len(rows[0]["spill_epochs"]))
        ]
        against["raw"] = float(np.median(per_round))
    ratios = ", ".join(f"{k} {v:.2f}" for k, v in against.items())
    return f"  job (epoch set by the slowest rank): {figures}\n          spill / ...: {ratios}"


if __name__ == "__main__":
    main()
