"""Loader throughput against what a user would pick instead, measured in one run.

    python -m pyddstore.benchmarks.loaders [--samples N] [--floats F] [--json FILE] [--plot FILE.png]

One process reads every sample of one dataset (F float32 features and an int64 label per
sample) in shuffled batches for --epochs epochs after a warm-up epoch, through:

- pyddstore: a one-rank ``DistDataset`` (method 1) and ``ThreadDataLoader``;
- torch DataLoader over one ``.npy`` file per sample;
- torch DataLoader over an ``np.memmap`` of all samples;
- litdata (``litdata.optimize`` then ``StreamingDataset``/``StreamingDataLoader``);
- mosaicml-streaming (``MDSWriter`` then ``StreamingDataset`` in a torch DataLoader);
- webdataset (tar shards, ``WebDataset`` in a torch DataLoader).

Every batch is checked (each feature row holds its label). Files live under --dir (default a
temporary directory) and are read warm, from the page cache: this compares the loaders'
own costs, not the file system's. litdata, mosaicml-streaming and webdataset are optional
(``pip install litdata mosaicml-streaming webdataset``, in a separate environment:
mosaicml-streaming 0.13 downgrades numpy below 2.2); a loader that is not installed, fails or
hangs is reported and left out.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

from ._common import description


def _check(x, y) -> None:
    x, y = np.asarray(x), np.asarray(y)
    if not np.array_equal(x[:, 0], y.astype(np.float32)) or not np.array_equal(x[:, -1], x[:, 0]):
        raise SystemExit("bench_loaders: a batch does not hold its samples' rows")


def _timed(batches, epochs: int, n: int) -> float:
    """samples/s over `epochs` passes after one warm-up pass; `batches()` yields (x, y)."""
    for x, y in batches():
        _check(x, y)
    seen, t0 = 0, time.perf_counter()
    for _ in range(epochs):
        for x, y in batches():
            _check(x, y)
            seen += len(y)
    if seen != epochs * n:
        raise SystemExit(f"bench_loaders: read {seen} samples, expected {epochs * n}")
    return seen / (time.perf_counter() - t0)


def _rows(n: int, floats: int) -> np.ndarray:
    return np.repeat(np.arange(n, dtype=np.float32)[:, None], floats, axis=1)


def run_pyddstore(args, d):
    import torch
    from torch.utils.data import TensorDataset

    from pyddstore import _native
    from pyddstore.torch import DistDataset, ThreadDataLoader

    src = TensorDataset(torch.from_numpy(_rows(args.samples, args.floats)), torch.arange(args.samples))
    ds = DistDataset(src, "bench_loaders", comm=_native.Comm.single(), method=1)
    loader = ThreadDataLoader(ds, batch_size=args.batch, shuffle=True, num_workers=args.workers)
    try:
        return _timed(lambda: iter(loader), args.epochs, args.samples)
    finally:
        ds.free()


class _NpyFiles:
    def __init__(self, paths):
        self.paths = paths

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        return np.load(self.paths[i]), i


class _Memmap:
    def __init__(self, path, n, floats):
        self.path, self.shape, self.arr = path, (n, floats), None

    def __len__(self):
        return self.shape[0]

    def __getitem__(self, i):
        if self.arr is None:  # opened in each worker
            self.arr = np.memmap(self.path, np.float32, "r", shape=self.shape)
        return np.array(self.arr[i]), i


def _torch_loader(ds, args, shuffle=True):
    from torch.utils.data import DataLoader

    return DataLoader(
        ds, batch_size=args.batch, shuffle=shuffle, num_workers=args.workers, persistent_workers=True
    )


def run_torch_files(args, d):
    rows = _rows(args.samples, args.floats)
    paths = []
    os.makedirs(f"{d}/npy", exist_ok=True)
    for i in range(args.samples):
        paths.append(f"{d}/npy/{i:07d}.npy")
        np.save(paths[-1], rows[i])
    loader = _torch_loader(_NpyFiles(paths), args)
    return _timed(lambda: iter(loader), args.epochs, args.samples)


def run_memmap(args, d):
    path = f"{d}/rows.f32"
    _rows(args.samples, args.floats).tofile(path)
    loader = _torch_loader(_Memmap(path, args.samples, args.floats), args)
    return _timed(lambda: iter(loader), args.epochs, args.samples)


class _Sample:
    """litdata.optimize's fn: a picklable object carrying the row length to its workers."""

    def __init__(self, floats: int):
        self.floats = floats

    def __call__(self, i):
        return {"x": np.full(self.floats, i, np.float32), "y": i}


def _stack(samples):  # litdata's collate: its rows' storage cannot go through torch's default
    return np.stack([s["x"] for s in samples]), np.array([s["y"] for s in samples])


def run_litdata(args, d):
    import litdata

    out = f"{d}/litdata"
    inputs = list(range(args.samples))
    litdata.optimize(
        fn=_Sample(args.floats), inputs=inputs, output_dir=out, chunk_bytes="16MB", num_workers=1
    )
    ds = litdata.StreamingDataset(out, shuffle=True)
    loader = litdata.StreamingDataLoader(
        ds, batch_size=args.batch, num_workers=args.workers, collate_fn=_stack
    )
    return _timed(lambda: iter(loader), args.epochs, args.samples)


def run_streaming(args, d):
    from streaming import MDSWriter, StreamingDataset

    out = f"{d}/mds"
    rows = _rows(args.samples, args.floats)
    with MDSWriter(out=out, columns={"x": "ndarray", "y": "int64"}) as w:
        for i in range(args.samples):
            w.write({"x": rows[i], "y": np.int64(i)})
    ds = StreamingDataset(local=out, shuffle=True, batch_size=args.batch)  # shuffles itself
    loader = _torch_loader(ds, args, shuffle=None)
    return _timed(lambda: ((b["x"], b["y"]) for b in loader), args.epochs, args.samples)


def run_webdataset(args, d):
    import webdataset as wds

    rows = _rows(args.samples, args.floats)
    shards = max(1, args.workers)
    os.makedirs(f"{d}/wds", exist_ok=True)
    urls = [f"{d}/wds/shard-{k:03d}.tar" for k in range(shards)]
    for k, url in enumerate(urls):
        with wds.TarWriter(url) as w:
            for i in range(k, args.samples, shards):
                w.write({"__key__": f"{i:07d}", "x.npy": rows[i], "cls": i})
    ds = (
        wds.WebDataset(urls, shardshuffle=False, empty_check=False)
        .shuffle(1000)
        .decode()
        .to_tuple("x.npy", "cls")
    )
    from torch.utils.data import DataLoader

    loader = DataLoader(
        ds.batched(args.batch), batch_size=None, num_workers=args.workers, persistent_workers=True
    )
    return _timed(lambda: iter(loader), args.epochs, args.samples)


LOADERS = {
    "pyddstore": run_pyddstore,
    "torch-files": run_torch_files,
    "np.memmap": run_memmap,
    "litdata": run_litdata,
    "streaming": run_streaming,
    "webdataset": run_webdataset,
}


def plot(results: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in results if r.get("samples_per_s")]
    base = next((r["samples_per_s"] for r in done if r["loader"] == "pyddstore"), None)
    fig, ax = plt.subplots(figsize=(8, 4))
    bars = ax.bar([r["loader"] for r in done], [r["samples_per_s"] for r in done], color="tab:blue")
    for bar, r in zip(bars, done):
        label = f"{r['samples_per_s']:.0f}" + (f"\n{r['samples_per_s'] / base:.2g}x" if base else "")
        ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom")
    ax.set_yscale("log")
    ax.set_ylabel("samples/s (log; higher is better)")
    ax.set_title("shuffled batches of one dataset, one process, warm page cache")
    ax.margins(y=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _one(name: str, args, d: str) -> dict:
    """One loader in this process (a child of the bench): its figure, or why it has none."""
    os.makedirs(d, exist_ok=True)
    try:
        return {"loader": name, "samples_per_s": LOADERS[name](args, d)}
    except ImportError as e:
        return {"loader": name, "skipped": f"not installed: {e.name}"}
    except Exception as e:  # noqa: BLE001 - one loader's failure is reported, the others still run
        return {"loader": name, "skipped": f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:200]}"}


def _run_one(name: str, args, d: str) -> dict:
    """Each loader in its own process, killed (with its workers) after --timeout-s: a loader
    that hangs is reported, and no loader's threads or workers outlive it into the next."""
    import signal
    import subprocess

    cmd = [sys.executable, "-m", "pyddstore.benchmarks.loaders", "--one", name, "--one-dir", d]
    cmd += [f"--{k}={v}" for k, v in (("samples", args.samples), ("floats", args.floats),
                                       ("batch", args.batch), ("workers", args.workers),
                                       ("epochs", args.epochs))]  # fmt: skip
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=args.timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"loader": name, "skipped": f"no result within {args.timeout_s:.0f} s"}
    lines = out.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"loader": name, "skipped": f"exited with {proc.returncode}"}
    return json.loads(lines[-1])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m pyddstore.benchmarks.loaders", description=description(__doc__)
    )
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--floats", type=int, default=256, help="float32 features per sample")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--workers", type=int, default=2, help="loader workers (threads or processes)")
    ap.add_argument("--epochs", type=int, default=2, help="timed epochs, after one warm-up epoch")
    ap.add_argument("--loaders", type=lambda s: s.split(","), default=list(LOADERS))
    ap.add_argument("--dir", help="where the files go (default: a temporary directory, removed)")
    ap.add_argument("--json", help="write the figures to this file")
    ap.add_argument("--plot", help="write a PNG bar chart (matplotlib) to this file")
    ap.add_argument("--from-json", help="plot (--plot) an earlier --json run's figures, measuring nothing")
    ap.add_argument("--timeout-s", type=float, default=300, help="per loader, files written included")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: one loader, JSON out
    ap.add_argument("--one-dir", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(_one(args.one, args, args.one_dir)), flush=True)
        return
    if args.from_json:
        if not args.plot:
            ap.error("--from-json needs --plot")
        with open(args.from_json) as f:
            plot(json.load(f)["results"], args.plot)
        return
    unknown = [name for name in args.loaders if name not in LOADERS]
    if unknown:
        ap.error(f"unknown loaders {unknown}: choose from {', '.join(LOADERS)}")
    top = args.dir or tempfile.mkdtemp(prefix="bench-loaders-")
    results = []
    shape = f"{args.samples} samples of {args.floats * 4} B"
    print(f"# bench_loaders: {shape}, batch {args.batch}, {args.workers} workers")
    for name in args.loaders:
        result = _run_one(name, args, os.path.join(top, name.replace(".", "-")))
        results.append(result)
        if "samples_per_s" in result:
            print(f"{name:<12} {result['samples_per_s']:10.0f} samples/s", flush=True)
        else:
            print(f"{name:<12} skipped: {result['skipped']}", flush=True)
    if not args.dir:
        shutil.rmtree(top, ignore_errors=True)
    out = {"args": vars(args), "results": results}
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    if args.plot:
        plot(results, args.plot)
    if not any(r.get("samples_per_s") for r in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
