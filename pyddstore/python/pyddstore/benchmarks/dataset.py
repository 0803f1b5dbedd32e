"""PyTorch-level benchmarks: peak memory while a DistDataset loads its share, and a
training-shaped loop through every loader, as ratios against baselines measured in the same run.

    mpirun -n 4 python -m pyddstore.benchmarks.dataset [--parts memory,loaders,load] [--json FILE]

memory: rank 0 loads a --share-mib share (one rank, method 1) in a fresh process per case, so
peaks don't mix, and reports the peak RSS above the process's RSS just before loading, as a
multiple of the share (target: under 1.5x), for a source generating tensor samples on the fly
and for an np.memmap of a temporary file (the bulk path); the other ranks wait without spinning.

loaders: every rank runs epochs of --batches batches (DistributedSampler, set_epoch) with a fixed
--step-ms "training step" per batch, through torch's DataLoader over the in-memory TensorDataset
(the baseline; also with forked workers, new and persistent, for what processes cost), then
DataLoader(DistDataset) in the main process and with forked workers (method 1 only; new or
persistent workers), and ThreadDataLoader with 1 and 2 threads, for each method. Samples/s and
the time spent waiting for batches; the first batch of every epoch is checked against the
baseline's. load (not run by default): see pyddstore.benchmarks.load.
Method 1 runs with DDSTORE_FABRIC=tcp; ranks on one node read each other's shares
through shared memory unless DDSTORE_SHM=0 is exported.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import torch  # before MPI starts
from torch.utils.data import DataLoader, Dataset, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from pyddstore.torch import DistDataset, ThreadDataLoader

from .. import Method, _native
from ._common import FORKED_WORKERS, bench_settings, description, mpi_world, quiet_wait
from .load import measure_load, plot_load, print_load

MIB = 1 << 20
_LAUNCHER_PREFIXES = ("OMPI_", "PMIX_", "PMI_", "OPAL_", "MPI_LOCALNRANKS", "MV2_", "SLURM_")


# -- memory -----------------------------------------------------------------------------------


class GeneratedRows(Dataset):
    """One float32 tensor per sample, made on request: no source array in memory."""

    def __init__(self, n: int, floats: int):
        self.n, self.floats = n, floats

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        if not 0 <= i < self.n:
            raise IndexError(i)
        return torch.arange(self.floats, dtype=torch.float32).add_(i)


def _rows(a: int, b: int, floats: int) -> np.ndarray:
    """Rows a..b of GeneratedRows as one array (same float32 values)."""
    return np.arange(floats, dtype=np.float32)[None, :] + np.arange(a, b, dtype=np.float32)[:, None]


def _write_memmap(path: str, n: int, floats: int) -> None:
    mm = np.memmap(path, dtype=np.float32, mode="w+", shape=(n, floats))
    step = max(1, (16 * MIB) // (4 * floats))
    for a in range(0, n, step):
        b = min(n, a + step)
        mm[a:b] = _rows(a, b, floats)
    mm.flush()
    del mm


def _proc_status() -> dict:
    """VmHWM, VmRSS, RssAnon, RssFile, RssShmem of this process, in bytes."""
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            key, _, rest = line.partition(":")
            if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem"):
                out[key] = int(rest.split()[0]) * 1024
    return out


def _reset_peak() -> bool:
    """Resets VmHWM to the current RSS (Linux >= 4.0); False where that is not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


class _ResidentSampler:
    """Samples RssAnon + RssShmem every few ms in a thread: the peak without mapped file pages,
    which VmHWM counts but the kernel can drop (an np.memmap source's pages)."""

    def __init__(self, interval: float = 0.002):
        self.peak = self._now()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)
        self._thread.start()

    @staticmethod
    def _now() -> int:
        st = _proc_status()
        return st["RssAnon"] + st["RssShmem"]

    def _run(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self.peak = max(self.peak, self._now())

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(self.peak, self._now())


def memory_case(case: dict) -> dict:
    """One load in this (fresh, single-rank) process: peak RSS above the RSS before loading."""
    n, floats, chunk = case["n"], case["floats"], case["chunk"]
    if case["source"] == "generated":
        src = GeneratedRows(n, floats)
    else:
        src = np.memmap(case["path"], dtype=np.float32, mode="r", shape=(n, floats))
    gc.collect()
    reset = _reset_peak()
    before = _proc_status()
    sampler = _ResidentSampler()
    t0 = time.perf_counter()
    try:
        ds = DistDataset(src, f"mem_{case['source']}", method=1, chunk_size=chunk)
    finally:
        resident_peak = sampler.stop()
    secs = time.perf_counter() - t0
    after = _proc_status()
    for i in (0, n // 2, n - 1):  # the store holds the source's rows
        got = np.asarray(ds[i])
        if not np.array_equal(got, _rows(i, i + 1, floats)[0]):
            raise SystemExit(f"memory {case['source']}: wrong data read for sample {i}")
    ds.free()
    share = n * floats * 4
    peak = after["VmHWM"] - before["VmRSS"] if reset else after["VmHWM"] - before["VmHWM"]
    return {
        "source": case["source"],
        "chunk": case["label"],
        "share_mib": share / MIB,
        "base_mib": before["VmRSS"] / MIB,
        "peak_mib": peak / MIB,
        "ratio": peak / share,
        "resident_peak_mib": (resident_peak - before["RssAnon"] - before["RssShmem"]) / MIB,
        "anon_mib": (after["RssAnon"] - before["RssAnon"]) / MIB,
        "file_mib": (after["RssFile"] - before["RssFile"]) / MIB,
        "shmem_mib": (after["RssShmem"] - before["RssShmem"]) / MIB,
        "load_s": secs,
        "peak_reset": reset,
    }


def _child_env() -> dict:
    """This environment minus the launcher's variables: the child is a single-rank job."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCHER_PREFIXES)}
    env.update({"DDSTORE_MPI": "0", "DDSTORE_QUIET": "1", "DDSTORE_FABRIC": env.get("DDSTORE_FABRIC", "tcp")})
    env.setdefault("DDSTORE_FORK_WORKERS", "1")  # FORKED_WORKERS, before the child's Python starts
    env.setdefault("FI_TCP_IFACE", "lo")
    return env


def measure_memory(args) -> list[dict]:
    floats = max(1, args.row_kib * 1024 // 4)
    n = max(2, int(args.share_mib * MIB) // (floats * 4))
    chunks = [("default", None), (f"chunk_size={args.chunk_size}", args.chunk_size), ("one chunk", n)]
    results = []
    with tempfile.TemporaryDirectory(prefix="ddstore-bench-", dir=args.tmpdir) as tmp:
        path = os.path.join(tmp, "source.f32")
        # What a store costs whatever the share: two rows, subtracted as "net" below.
        fixed = _memory_subprocess({"source": "generated", "n": 2, "floats": floats, "chunk": None})
        fixed.update(chunk="2 rows (fixed)", ratio=None)
        for source in ("generated", "memmap"):
            if source == "memmap":
                _write_memmap(path, n, floats)
            for label, chunk in chunks:
                case = {"source": source, "n": n, "floats": floats, "chunk": chunk, "label": label}
                case["path"] = path
                results.append(_memory_subprocess(case))
    for r in results:
        r["fixed_mib"] = fixed["peak_mib"]
        r["net_ratio"] = (r["peak_mib"] - fixed["peak_mib"]) / r["share_mib"]
    return [fixed] + results


def _memory_subprocess(case: dict) -> dict:
    case.setdefault("label", "")
    cmd = [sys.executable, "-m", "pyddstore.benchmarks.dataset", "--memory-case", json.dumps(case)]
    proc = subprocess.run(cmd, env=_child_env(), capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"memory case {case}: failed\n{proc.stdout}\n{proc.stderr}")
    print(f"# memory: {case['source']} {case['label']} done", file=sys.stderr, flush=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def print_memory(results: list[dict]) -> None:
    print("# memory: peak RSS while loading a DistDataset share (1 rank, method 1), above the RSS before")
    print(
        f"{'source':<10} {'chunks':<16} {'share MiB':>9} {'peak MiB':>9} {'x share':>7} {'<1.5x':>5} "
        f"{'net x':>6} {'no-file':>7} {'anon':>6} {'file':>6} {'shmem':>6} {'load s':>6}"
    )
    for r in results:
        fixed = "net_ratio" not in r
        ok = "-" if fixed else ("yes" if r["ratio"] < 1.5 else "NO")
        ratio = "-" if fixed else f"{r['ratio']:.2f}"
        net = "-" if fixed else f"{r['net_ratio']:.2f}"
        print(
            f"{r['source']:<10} {r['chunk']:<16} {r['share_mib']:>9.1f} {r['peak_mib']:>9.0f} "
            f"{ratio:>7} {ok:>5} {net:>6} {r['resident_peak_mib']:>7.0f} {r['anon_mib']:>6.0f} "
            f"{r['file_mib']:>6.0f} {r['shmem_mib']:>6.0f} {r['load_s']:>6.2f}"
        )
    print(
        "# peak: VmHWM; x share: peak / share; net x: (peak - the 2-row store's peak) / share; no-file: "
        "peak of RssAnon+RssShmem (sampled every 2 ms), without mapped file pages; anon/file/shmem: RSS "
        "grown by the end of the load, by kind (the share is shmem; file: mapped source pages)"
    )


# -- loaders ----------------------------------------------------------------------------------


def _source(args, size: int) -> TensorDataset:
    """The same data on every rank: x rows of --row-floats float32, y int64 labels."""
    n = args.batches * args.batch_size * size
    g = torch.Generator().manual_seed(11)
    x = torch.rand((n, args.row_floats), generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    return TensorDataset(x, y)


def _epochs(comm, loader, sampler, args) -> tuple[list[dict], list]:
    """Runs the epochs, all ranks starting each together; per epoch its seconds, the seconds
    spent waiting for batches (iter() included: that is where new workers start), and its first
    batch (for the check)."""
    stats, firsts = [], []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        quiet_wait(comm)
        t0 = time.perf_counter()
        it = iter(loader)
        wait = time.perf_counter() - t0
        first_batch_s, first, samples = None, None, 0
        while True:
            t = time.perf_counter()
            try:
                x, y = next(it)
            except StopIteration:
                wait += time.perf_counter() - t
                break
            wait += time.perf_counter() - t
            if first is None:
                first_batch_s = time.perf_counter() - t0
                first = (x.clone(), y.clone())
            samples += len(y)
            time.sleep(args.step_ms / 1000)  # the training step
        del it
        secs = time.perf_counter() - t0
        stats.append({"secs": secs, "wait": wait, "first_batch_s": first_batch_s, "samples": samples})
        firsts.append(first)
    return stats, firsts


def _loader_cases(args, method: int) -> list[tuple]:
    """(label, loader kind, workers, persistent) for one method."""
    cases = [("main", "torch", 0, False)]
    if method != Method.MPI_RMA:
        w = args.fork_workers
        cases += [(f"fork{w}", "torch", w, False), (f"fork{w}-persist", "torch", w, True)]
    cases += [(f"thread{w}", "thread", w, False) for w in args.thread_workers]
    return cases


def _run_case(comm, ds, args, kind: str, workers: int, persistent: bool) -> tuple[list[dict], list]:
    sampler = DistributedSampler(ds, num_replicas=comm.size, rank=comm.rank, shuffle=True, seed=5)
    kw = {"batch_size": args.batch_size, "sampler": sampler, "num_workers": workers, "drop_last": True}
    if workers > 0:
        kw["persistent_workers"] = persistent
    loader = ThreadDataLoader(ds, **kw) if kind == "thread" else DataLoader(ds, **kw)
    try:
        return _epochs(comm, loader, sampler, args)
    finally:
        if kind == "thread":
            loader.close()
        elif getattr(loader, "_iterator", None) is not None:
            loader._iterator._shutdown_workers()  # persistent workers: stop them now, not at exit
        del loader
        gc.collect()


def _check_firsts(want: list, got: list, what: str) -> None:
    """Every epoch's first batch equals the baseline's (same sampler, same seed)."""
    bad = [e for e, (w, g) in enumerate(zip(want, got)) if g is None or not all(map(torch.equal, w, g))]
    if bad:
        raise SystemExit(f"{what}: wrong first batch in epochs {bad}")


def measure_loaders(args, comm) -> list[dict]:
    rank = comm.rank
    src = _source(args, comm.size)
    rows = []

    def record(method, label, stats):
        everyone = comm.allgather(stats)
        if rank == 0:
            rows.append(_loader_row(method, label, everyone, args))
            print(f"# loaders: {method} {label} done", file=sys.stderr, flush=True)

    quiet_wait(comm)
    stats, want = _run_case(comm, src, args, "torch", 0, False)
    record("-", "torch-base", stats)
    # Forked workers over the plain source too: what process workers cost without pyddstore.
    w = args.fork_workers
    for label, persistent in ((f"fork{w}", False), (f"fork{w}-persist", True)):
        quiet_wait(comm)
        stats, got = _run_case(comm, src, args, "torch", w, persistent)
        _check_firsts(want, got, f"rank {rank}: TensorDataset {label}")
        record("-", label, stats)
    for method in args.methods:
        settings = bench_settings(FORKED_WORKERS, **({"fabric": "tcp"} if method == Method.LIBFABRIC else {}))
        ds = DistDataset(src, f"bench_m{method}", comm, method=method, settings=settings)
        for label, kind, workers, persistent in _loader_cases(args, method):
            quiet_wait(comm)
            stats, got = _run_case(comm, ds, args, kind, workers, persistent)
            _check_firsts(want, got, f"rank {rank}: method {method} {label}")
            record(method, label, stats)
        quiet_wait(comm)
        ds.free()
    return rows


def _loader_row(method, label, everyone: list[list[dict]], args) -> dict:
    """Across ranks: an epoch lasts as long as its slowest rank; waits are averaged."""
    epochs = len(everyone[0])
    secs = [max(r[e]["secs"] for r in everyone) for e in range(epochs)]
    wait = [float(np.mean([r[e]["wait"] for r in everyone])) for e in range(epochs)]
    wait_max = [max(r[e]["wait"] for r in everyone) for e in range(epochs)]
    busy = [float(np.mean([r[e]["secs"] - r[e]["wait"] for r in everyone])) for e in range(epochs)]
    first = [float(np.mean([r[e]["first_batch_s"] or 0.0 for r in everyone])) for e in range(epochs)]
    samples = sum(r[0]["samples"] for r in everyone)  # per epoch, all ranks
    later = slice(1, None) if epochs > 1 else slice(0, None)  # epoch 0 also warms up
    return {
        "method": method,
        "loader": label,
        "epoch_s": secs,
        "wait_s": wait,
        "wait_max_s": wait_max,
        "step_s": busy,
        "first_batch_s": first,
        "samples_per_epoch": samples,
        "step_s_per_epoch": args.batches * args.step_ms / 1000,
        "samples_per_s": samples * len(secs[later]) / sum(secs[later]),
        "wait_s_per_epoch": float(np.mean(wait[later])),
        "wait_max_s_per_epoch": float(np.mean(wait_max[later])),
        "step_s_measured": float(np.mean(busy[later])),
        "first_epoch_s": secs[0],
    }


def add_loader_ratios(rows: list[dict]) -> None:
    """x base: samples/s over the baseline's; extra s: seconds per epoch beyond the baseline's."""
    base = next(r for r in rows if r["loader"] == "torch-base")
    base_epoch = base["samples_per_epoch"] / base["samples_per_s"]
    for r in rows:
        r["ratio_base"] = r["samples_per_s"] / base["samples_per_s"]
        r["extra_s_per_epoch"] = r["samples_per_epoch"] / r["samples_per_s"] - base_epoch


def print_loaders(rows: list[dict], args, size: int) -> None:
    print(
        f"# loaders: {size} ranks, {args.epochs} epochs of {args.batches} batches of {args.batch_size} x "
        f"{args.row_floats * 4} B per rank, {args.step_ms:g} ms step ({args.batches * args.step_ms / 1000:g} "
        "s per epoch); figures of the epochs after the first"
    )
    print(
        f"{'method':<6} {'loader':<15} {'samples/s':>10} {'x base':>6} {'s/epoch':>8} {'extra s':>8} "
        f"{'wait s':>7} {'max':>6} {'steps s':>7} {'1st epoch':>9}"
    )
    for r in rows:
        print(
            f"{str(r['method']):<6} {r['loader']:<15} {r['samples_per_s']:>10.0f} {r['ratio_base']:>6.2f} "
            f"{r['samples_per_epoch'] / r['samples_per_s']:>8.3f} {r['extra_s_per_epoch']:>8.3f} "
            f"{r['wait_s_per_epoch']:>7.3f} {r['wait_max_s_per_epoch']:>6.3f} {r['step_s_measured']:>7.3f} "
            f"{r['first_epoch_s']:>9.3f}"
        )
    print(
        "# samples/s: all ranks, an epoch lasting as long as its slowest rank; x base: over "
        "DataLoader(TensorDataset) in the main process; extra s: seconds per epoch beyond it; wait s: "
        "per epoch in iter()/next(), mean (max) over ranks; steps s: the rest (sleeps, which overrun on a "
        "busy machine)"
    )


# -- command line -----------------------------------------------------------------------------


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m pyddstore.benchmarks.dataset", description=description(__doc__)
    )
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    ap.add_argument("--parts", type=lambda s: s.split(","), default=["memory", "loaders"])
    ap.add_argument("--share-mib", type=float, default=400, help="memory: the share loaded (MiB)")
    ap.add_argument("--row-kib", type=int, default=64, help="memory: bytes per sample (KiB)")
    ap.add_argument("--chunk-size", type=int, default=256, help="memory: the chunk_size= case (samples)")
    ap.add_argument("--tmpdir", default=None, help="memory: where the memmap source file goes")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batches", type=int, default=40, help="loaders: batches per epoch per rank")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--row-floats", type=int, default=784, help="loaders: float32 values per sample")
    ap.add_argument("--step-ms", type=float, default=5.0, help="loaders: the training step (sleep)")
    ap.add_argument("--methods", type=ints, default=[0, 1])
    ap.add_argument("--fork-workers", type=int, default=2)
    ap.add_argument("--thread-workers", type=ints, default=[1, 2])
    ap.add_argument("--load-files", type=int, default=1500, help="load: .npz files (one sample each)")
    ap.add_argument("--load-kib", type=int, default=330, help="load: KiB per sample")
    ap.add_argument("--load-dir", default=None, help="load: reuse (or create) the files here")
    ap.add_argument("--limit-threads", type=int, default=64, help="load: threads of the read limit")
    ap.add_argument("--load-rounds", type=int, default=2, help="load: rounds of every case (best kept)")
    ap.add_argument(
        "--load-warm",
        action="store_true",
        help="load: keep the page cache (no drop before each case; smoke runs)",
    )
    ap.add_argument("--json", help="write the figures to this file")
    ap.add_argument("--plot", help="load: write a PNG bar chart of the load paths (matplotlib) to this file")
    ap.add_argument("--memory-case", help=argparse.SUPPRESS)  # internal: one memory case, JSON out
    args = ap.parse_args(argv)
    if args.memory_case:
        print(json.dumps(memory_case(json.loads(args.memory_case))), flush=True)
        return
    unknown = [p for p in args.parts if p not in ("memory", "loaders", "load")]
    if unknown:
        ap.error(f"unknown parts {unknown}: choose from memory, loaders, load")
    if any(m not in (0, 1) for m in args.methods):
        ap.error("--methods: 0 and/or 1")
    if args.epochs < 1 or args.batches < 1 or args.batch_size < 1:
        ap.error("--epochs, --batches and --batch-size must be positive")

    comm = mpi_world()
    out = {"ranks": comm.size, "version": _native.__version__, "args": vars(args)}
    if "memory" in args.parts:
        out["memory"] = measure_memory(args) if comm.rank == 0 else []
        quiet_wait(comm)  # the others wait without spinning while rank 0 measures
    if "load" in args.parts:
        out["load"] = measure_load(args, comm)
    if "loaders" in args.parts:
        rows = measure_loaders(args, comm)
        if comm.rank == 0:
            add_loader_ratios(rows)
        out["loaders"] = rows
    if comm.rank == 0:
        print(f"# pyddstore {_native.__version__} bench_torch: {comm.size} ranks")
        if "memory" in out:
            print_memory(out["memory"])
        if "loaders" in out:
            print_loaders(out["loaders"], args, comm.size)
        if "load" in out:
            print_load(out["load"], comm.size)
        if args.json:
            os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)
        if args.plot and "load" in out:
            plot_load(out["load"], args.plot)
    quiet_wait(comm)


if __name__ == "__main__":
    main()
