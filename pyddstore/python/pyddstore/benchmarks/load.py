"""Load benchmark: how fast each kind of source fills the ranks' shares, beside the limit (the same
bytes read straight from the files by N threads per rank) measured in the same run, cold cache
where the machine allows dropping it, and the peak memory of each load as a multiple of the share.

    mpirun -n 2 python -m pyddstore.benchmarks.dataset --parts load [--load-files 1500 --load-kib 330]
        [--load-rounds 2] [--load-dir DIR] [--load-warm]

Cases: a map-style dataset whose __getitem__ calls np.load on one .npz file per sample (the
default load: DDSTORE_LOAD_DEPTH reads in flight), an np.memmap of one .npy file, a contiguous
h5py dataset, a chunked+gzip h5py dataset (not in the ratios: decompression is CPU-bound), a
ragged map-style dataset generated in memory (for its peak memory against its ragged share; not
in the ratios) and a snapshot of the npz dataset restored with DistDataset.restore. The limit:
every rank reads the bytes of its share of the .npz files with 1 and with --limit-threads threads
(whole files, pread).
A ceiling line calls the same np.load on 32 threads and drops the results (no store at all):
what any loader calling that __getitem__ can reach on this machine.
Each ratio case is also paired with a cold many-thread read just before it (x paired), and
rank 0 prints what np.load of one file costs in CPU alone (one thread, warm cache): the ceiling
of a map-style npz load is about cores x file size / that.
The page cache is dropped before every case (`sync; echo 3 > /proc/sys/vm/drop_caches`, root);
where that is refused, or with --load-warm (a smoke run: a drop costs the whole machine), the
figures are warm-cache ones and the output says so.
"""

from __future__ import annotations

import gc
import os
import shutil
import sys
import tempfile
import threading
import time

import numpy as np
from torch.utils.data import Dataset

from pyddstore.torch import DistDataset, share_of

from ._common import FORKED_WORKERS, bench_settings

MIB = 1 << 20


class RaggedRows(Dataset):
    """Sample i: a float32 array of 1 + (i * 7919) % max_len rows of 8 values (a point cloud or
    graph-like field) and a label: what a ragged load holds twice without care."""

    def __init__(self, n: int, max_len: int):
        self.n, self.max_len = n, max_len

    def __len__(self) -> int:
        return self.n

    def length(self, i: int) -> int:
        return 1 + (i * 7919) % self.max_len

    def __getitem__(self, i):
        return {"pos": np.full((self.length(i), 8), i, np.float32), "y": np.int64(i)}


class NpzFiles(Dataset):
    """Sample i is np.load of file i: what the issue measured (x float32 rows, y label)."""

    def __init__(self, d: str, n: int):
        self.d, self.n = d, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        with np.load(os.path.join(self.d, f"s{i:06d}.npz")) as z:
            return z["x"], int(z["y"])


def _row(i: int, floats: int) -> np.ndarray:
    return np.arange(floats, dtype=np.float32) + np.float32(i)


def write_data(d: str, n: int, floats: int) -> None:
    import h5py

    os.makedirs(d, exist_ok=True)
    mm = np.lib.format.open_memmap(os.path.join(d, "all.npy"), mode="w+", dtype=np.float32, shape=(n, floats))
    with h5py.File(os.path.join(d, "data.h5"), "w") as h:
        contig = h.create_dataset("contig", shape=(n, floats), dtype=np.float32)
        chunked = h.create_dataset(
            "gzip",
            shape=(n, floats),
            dtype=np.float32,
            chunks=(8, floats),
            compression="gzip",
            compression_opts=1,
        )
        step = 64
        for a in range(0, n, step):
            b = min(n, a + step)
            rows = np.stack([_row(i, floats) for i in range(a, b)])
            for i in range(a, b):
                np.savez(os.path.join(d, f"s{i:06d}.npz"), x=rows[i - a], y=np.int64(i))
            mm[a:b] = rows
            contig[a:b] = rows
            chunked[a:b] = rows
    mm.flush()
    del mm
    os.sync()


def drop_caches(warm: bool = False) -> str:
    """'dropped', or why not."""
    if warm:
        return "not dropped (--load-warm): warm cache"
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as fh:
            fh.write("3\n")
        return "dropped"
    except OSError as e:
        return f"not dropped ({e.strerror}): warm cache"


def _status() -> dict:
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssShmem"):
                out[key] = int(rest.split()[0]) * 1024
    return out


class PeakSampler:
    """RssAnon + RssShmem sampled every 2 ms: the share (shared memory) plus everything the load
    allocates, without page-cache pages a reader maps."""

    def __init__(self) -> None:
        self.base = self._now()
        self.peak = self.base
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    @staticmethod
    def _now() -> int:
        st = _status()
        return st["RssAnon"] + st["RssShmem"]

    def _run(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, self._now())

    def stop(self) -> int:
        self._stop.set()
        self._t.join()
        return max(self.peak, self._now()) - self.base


def read_limit(paths: list[str], threads: int) -> tuple[int, float]:
    """Reads whole files with `threads` threads (pread into a reused buffer each): bytes, secs."""
    it = iter(paths)
    lock = threading.Lock()
    total = [0]

    def work() -> None:
        buf = bytearray(1 << 20)
        got_all = 0
        while True:
            with lock:
                p = next(it, None)
            if p is None:
                break
            fd = os.open(p, os.O_RDONLY)
            try:
                size = os.fstat(fd).st_size
                if len(buf) < size:
                    buf = bytearray(size)
                mv = memoryview(buf)
                pos = 0
                while pos < size:
                    n = os.preadv(fd, [mv[pos:size]], pos)
                    if n == 0:
                        break
                    pos += n
                got_all += pos
            finally:
                os.close(fd)
        with lock:
            total[0] += got_all

    t0 = time.perf_counter()
    ts = [threading.Thread(target=work) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return total[0], time.perf_counter() - t0


def npz_decode_cpu(paths: list[str]) -> dict:
    """What decoding the npz files costs alone: CPU seconds per file of the bench's __getitem__
    (np.load of x and y), of reading every zip member (CRC checked) and of a plain read, one
    thread, warm cache (the files are read once first). The ceiling of a map-style load on a
    machine is about cores x file size / (np.load + read + copy CPU per file)."""
    import zipfile

    for p in paths:
        with open(p, "rb") as fh:
            fh.read()

    def npload(p: str) -> None:
        with np.load(p) as z:
            z["x"], int(z["y"])

    def members(p: str) -> None:
        with zipfile.ZipFile(p) as z:
            for name in z.namelist():
                z.read(name)

    def plain(p: str) -> None:
        with open(p, "rb") as fh:
            fh.read()

    out = {}
    for label, fn in (("np.load", npload), ("zip members", members), ("read", plain)):
        c0 = time.process_time()
        for p in paths:
            fn(p)
        out[label] = (time.process_time() - c0) / max(1, len(paths))
    out["file_bytes"] = os.path.getsize(paths[0]) if paths else 0
    return out


def measure_load(args, comm) -> dict:
    import h5py

    n, floats = args.load_files, max(1, args.load_kib * 1024 // 4)
    tmp = None
    d = args.load_dir
    if d is None:
        tmp = tempfile.mkdtemp(prefix="ddstore-load-", dir=args.tmpdir) if comm.rank == 0 else None
        d = comm.bcast(tmp, root=0)
    try:
        if comm.rank == 0 and not os.path.exists(os.path.join(d, "data.h5")):
            t = time.perf_counter()
            write_data(d, n, floats)
            print(
                f"# load: wrote {n} files in {time.perf_counter() - t:.0f} s to {d}",
                file=sys.stderr,
                flush=True,
            )
        comm.Barrier()
        start, count = share_of(n, comm.size, comm.rank)
        my_files = [os.path.join(d, f"s{i:06d}.npz") for i in range(start, start + count)]
        share = count * floats * 4
        rows: list[dict] = []
        cache = None

        def paired_limit() -> float:
            """The many-thread read of this rank's npz bytes, cold, just before a case: MB/s in
            total (the machine is shared: its speed drifts between cases)."""
            comm.Barrier()
            if comm.rank == 0:
                drop_caches(args.load_warm)
            comm.Barrier()
            t0 = time.perf_counter()
            got = read_limit(my_files, args.limit_threads)[0]
            comm.Barrier()
            wall = time.perf_counter() - t0
            return sum(comm.allgather(got)) / wall / 1e6

        def timed(label: str, fn, check=None, ratio=True, share_bytes=None) -> None:
            nonlocal cache
            gc.collect()
            pair = paired_limit() if ratio else None
            comm.Barrier()
            if comm.rank == 0:
                cache = drop_caches(args.load_warm)
            comm.Barrier()
            sampler = PeakSampler()
            t0 = time.perf_counter()
            nbytes, keep = fn()
            secs = time.perf_counter() - t0
            peak = sampler.stop()
            comm.Barrier()
            wall = time.perf_counter() - t0
            if check is not None:
                check(keep)
            if hasattr(keep, "free"):
                keep.free()
            del keep
            everyone = comm.gather({"nbytes": nbytes, "secs": secs, "peak": peak}, root=0)
            if comm.rank == 0:
                total = sum(e["nbytes"] for e in everyone)
                rows.append(
                    {
                        "case": label,
                        "total_mb_s": total / wall / 1e6,
                        "per_rank_mb_s": [e["nbytes"] / e["secs"] / 1e6 for e in everyone],
                        "peak_x_share": max(e["peak"] for e in everyone) / max(1, share_bytes or share),
                        "secs": wall,
                        "ratio": ratio,
                        "paired_limit_mb_s": pair,
                        "x_paired": (total / wall / 1e6 / pair) if pair else None,
                        "cache": cache,
                    }
                )
                print(f"# load: {label} {total / wall / 1e6:.0f} MB/s", file=sys.stderr, flush=True)

        def check_rows(ds) -> None:
            for i in (0, n // 2, n - 1, start, start + count - 1):
                x = ds[i]
                x = x[0] if isinstance(x, tuple) else x
                if not np.array_equal(np.asarray(x), _row(i, floats)):
                    raise SystemExit(f"bench load: wrong data for sample {i}")

        for _ in range(args.load_rounds):
            _round(args, comm, d, n, my_files, timed, check_rows, DistDataset, h5py)
        best: dict = {}
        for r in rows:  # best MB/s of the rounds, worst peak
            b = best.setdefault(r["case"], dict(r))
            if r["total_mb_s"] > b["total_mb_s"]:
                b.update({k: v for k, v in r.items() if k != "peak_x_share"})
            b["peak_x_share"] = max(b["peak_x_share"], r["peak_x_share"])
            b["rounds"] = b.get("rounds", 0) + 1
            if r["x_paired"] is not None:
                b.setdefault("x_paired_rounds", []).append(r["x_paired"])
        decode = npz_decode_cpu(my_files) if comm.rank == 0 else None
        return {
            "rows": list(best.values()),
            "share_mib": share / MIB,
            "files": n,
            "file_kib": args.load_kib,
            "npz_decode": decode,
        }
    finally:
        comm.Barrier()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _round(args, comm, d, n, my_files, timed, check_rows, DistDataset, h5py) -> None:  # noqa: N803
    """One round of every case, in the same order."""
    timed("read, 1 thread (limit)", lambda: (read_limit(my_files, 1)[0], None), ratio=False)
    timed(
        f"read, {args.limit_threads} threads (limit)",
        lambda: (read_limit(my_files, args.limit_threads)[0], None),
        ratio=False,
    )

    share = len(my_files) * os.path.getsize(my_files[0]) if my_files else 0

    def fill_memory():
        # What populating a share costs without any reads: page faults and one pass of writes.
        buf = np.ones(share // 4, np.float32)
        return buf.nbytes, None

    timed("fill a new share-sized buffer (memory)", fill_memory, ratio=False)

    def npload_alone(threads: int = 32):
        # The same np.load calls as the map-style load, on as many threads as its default depth,
        # results dropped: the ceiling of any loader that calls this __getitem__ (no store at all).
        from concurrent.futures import ThreadPoolExecutor

        src = NpzFiles(d, n)
        first = _share(n, comm)[0]
        with ThreadPoolExecutor(threads) as pool:
            got = sum(x.nbytes for x, _ in pool.map(src.__getitem__, range(first, first + len(my_files))))
        return got, None

    timed("np.load alone, 32 threads (no store)", npload_alone)

    def load(src, name, **kw):
        ds = DistDataset(src, name, comm, settings=bench_settings(FORKED_WORKERS), **kw)
        return ds.load_stats[comm.rank]["nbytes"], ds

    timed("DistDataset, npz map-style (default)", lambda: load(NpzFiles(d, n), "npz"), check_rows)
    timed(
        "DistDataset, npz, load_workers=processes",
        lambda: load(NpzFiles(d, n), "npzp", load_workers="processes"),
        check_rows,
    )
    mm: np.ndarray | None = np.load(os.path.join(d, "all.npy"), mmap_mode="r")
    timed("DistDataset, np.memmap", lambda: load(mm, "mm"), check_rows)
    mm = None
    with h5py.File(os.path.join(d, "data.h5"), "r") as h:
        timed("DistDataset, h5py contiguous", lambda: load(h["contig"], "h5"), check_rows)
        timed("DistDataset, h5py chunked gzip", lambda: load(h["gzip"], "h5z"), check_rows, ratio=False)
    # Ragged: ~the npz share in rows of 1..max_len units (peak against the ragged share).
    rag = RaggedRows(n, 2 * max(1, os.path.getsize(my_files[0]) // 32) if my_files else 1)

    def check_ragged(ds) -> None:
        for i in (0, n // 2, n - 1):
            got = np.asarray(ds[i]["pos"])
            if got.shape != (rag.length(i), 8) or not (got == i).all():
                raise SystemExit(f"bench load: wrong ragged data for sample {i}")

    timed(
        "DistDataset, ragged map-style",
        lambda: load(rag, "rag", ragged={"pos": 0}),
        check_ragged,
        ratio=False,
        share_bytes=sum(rag.length(i) * 32 + 8 for i in range(*_share(n, comm))),
    )
    snap = os.path.join(d, f"snap-{os.getpid() if comm.rank == 0 else 0}-{time.time_ns()}")
    snap = comm.bcast(snap, root=0)
    ds = DistDataset(NpzFiles(d, n), "tosave", comm, settings=bench_settings(FORKED_WORKERS))
    ds.save(snap)
    ds.free()
    timed("DistDataset.restore (snapshot)", lambda: _restore(DistDataset, snap, comm), check_rows)
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(snap, ignore_errors=True)


def _share(n: int, comm) -> tuple[int, int]:
    """(first, end) of this rank's rows."""
    start, count = share_of(n, comm.size, comm.rank)
    return start, start + count


def _restore(cls, path, comm):
    ds = cls.restore(path, comm=comm)
    return ds.load_stats[comm.rank]["nbytes"], ds


def plot_load(res: dict, path: str) -> None:
    """Bars: MB/s in total of each load path, the read limit's bars (the same bytes read straight
    from the files) in grey, and the many-thread limit as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = res["rows"]
    limit = max((r["total_mb_s"] for r in rows if "threads (limit)" in r["case"]), default=0.0)
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.5))
    colors = ["tab:grey" if "(limit)" in r["case"] else "tab:blue" for r in rows]
    ax.barh([r["case"] for r in rows], [r["total_mb_s"] for r in rows], color=colors)
    if limit:
        ax.axvline(limit, color="k", linestyle="--", linewidth=1, label=f"read limit {limit:.0f} MB/s")
        ax.legend(fontsize=8, loc="lower right")
    ax.invert_yaxis()
    ax.set_xlabel("MB/s, all ranks (higher is better)")
    ax.set_title(f"loading {res['files']} files of {res['file_kib']} KiB; page cache: {rows[0]['cache']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def print_load(res: dict, size: int) -> None:
    rows = res["rows"]
    limit = max((r["total_mb_s"] for r in rows if "threads (limit)" in r["case"]), default=0.0)
    print(
        f"# load: {res['files']} files of {res['file_kib']} KiB, {size} ranks, "
        f"{res['share_mib']:.0f} MiB share per rank; page cache: {rows[0]['cache']}"
    )
    print(
        f"{'case':<40} {'MB/s total':>10} {'MB/s per rank':>20} {'x limit':>7} {'x paired':>14} "
        f"{'peak/share':>10}"
    )
    for r in rows:
        per = "/".join(f"{v:.0f}" for v in r["per_rank_mb_s"])
        x = f"{r['total_mb_s'] / limit:.2f}" if limit else "-"
        paired = "/".join(f"{v:.2f}" for v in r.get("x_paired_rounds", [])) or "-"
        peak = "-" if not r["case"].startswith("DistDataset") else f"{r['peak_x_share']:.2f}"
        print(f"{r['case']:<40} {r['total_mb_s']:>10.0f} {per:>20} {x:>7} {paired:>14} {peak:>10}")
    print(f"# best of {rows[0].get('rounds', 1)} rounds (the cases alternate); peak: the worst round")
    dec = res.get("npz_decode")
    if dec:
        per_core = dec["file_bytes"] / max(dec["np.load"], 1e-9) / 1e6
        print(
            f"# npz decode, one thread, warm cache (rank 0): np.load {dec['np.load'] * 1e3:.2f} ms CPU per "
            f"file ({per_core:.0f} MB/s per core), zip members {dec['zip members'] * 1e3:.2f} ms, "
            f"plain read {dec['read'] * 1e3:.2f} ms"
        )
    print(
        "# x paired: per round, MB/s / the many-thread read measured cold just before that case (the "
        "machine is shared, its speed drifts between cases); "
        "x limit: MB/s / the best many-thread read of the same npz bytes (into a reused buffer), same run; "
        "fill: page faults + writes of a new share-sized array, what any load pays on top of the reads; "
        "peak/share: peak RssAnon+RssShmem above the RSS before the load (the share included), per rank, "
        "worst rank"
    )
