"""Loading every kind of source, and snapshots, under mpirun (tests/test_load.py).

--part sources: a map-style source of .npz files (default depth; a thread_safe=False one), an
in-memory array, an np.memmap and a slice of one, a list of .npy files, h5py datasets (contiguous
and chunked+compressed), zarr when installed, O_DIRECT, and reads split into many small pieces.
--part save: saves a fixed and a ragged dataset, restores them on the same ranks.
--part restore: restores what --part save wrote (on another number of ranks), then damaged
copies (truncated file, wrong checksum, symbolic link, bad manifest) that must fail clearly.
Every sample of every dataset is checked on every rank against the generator."""

from __future__ import annotations

import json
import os
import shutil
import sys

import numpy as np
import torch
from torch.utils.data import Dataset
from torch_common import World, raises, run, same

N = 203  # uneven shares on 2 and 3 ranks
SHAPE = (6, 16)


def row(i: int) -> np.ndarray:
    return np.arange(96, dtype=np.float32).reshape(SHAPE) + 1000 * i


def pos(i: int) -> np.ndarray:
    return (np.arange((i % 7) * 3, dtype=np.float32).reshape(-1, 3) + i).copy()


def write_files(d: str) -> None:
    """The source files (run once, by the pytest process)."""
    import h5py

    os.makedirs(d, exist_ok=True)
    for i in range(N):
        np.savez(os.path.join(d, f"s{i:05d}.npz"), x=row(i), y=np.int64(i * 3))
    allrows = np.stack([row(i) for i in range(N)])
    np.save(os.path.join(d, "all.npy"), allrows)
    for k, (a, b) in enumerate([(0, 70), (70, 71), (71, N)]):
        np.save(os.path.join(d, f"part{k}.npy"), allrows[a:b])
    with h5py.File(os.path.join(d, "data.h5"), "w") as h:
        h.create_dataset("contig", data=allrows)
        h.create_dataset("chunked", data=allrows, chunks=(16, 6, 16), compression="gzip")
        h.create_dataset("rawchunks", data=allrows, chunks=(16, 6, 16))  # unfiltered: read raw


class NpzSource(Dataset):
    def __init__(self, d: str):
        self.d = d

    def __len__(self) -> int:
        return N

    def __getitem__(self, i):
        with np.load(os.path.join(self.d, f"s{i:05d}.npz")) as z:
            return torch.from_numpy(z["x"]), int(z["y"])


class UnsafeNpzSource(NpzSource):
    thread_safe = False


class BadSource(UnsafeNpzSource):
    def __getitem__(self, i):
        if i == 150:
            raise ValueError(f"sample {i} is unreadable")
        return super().__getitem__(i)


class StuckSource(UnsafeNpzSource):
    def __getitem__(self, i):
        if i == 150:
            import time

            time.sleep(3600)  # a worker stuck on a dead mount: the parent kills it at its deadline
        return super().__getitem__(i)


class RaggedSource(Dataset):
    def __len__(self) -> int:
        return N

    def __getitem__(self, i):
        return {"pos": pos(i), "y": np.int64(i), "img": torch.from_numpy(row(i))}


def _equal(a, b) -> bool:
    """What torch_common.same checks (types, dtypes, shapes, values), without building its
    message: same() is called only to report a difference."""
    if isinstance(a, torch.Tensor):
        return type(b) is type(a) and a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))
    if isinstance(a, (np.ndarray, np.void)):
        return (
            type(a) is type(b)
            and a.dtype == b.dtype
            and np.shape(a) == np.shape(b)
            and a.tobytes() == b.tobytes()
        )
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return type(a) is type(b) and list(a) == list(b) and all(_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def check(got, want, where: str) -> None:
    if not _equal(want, got):
        same(want, got, where)
        raise AssertionError(f"{where}: {got!r} != {want!r}")


def check_all(ds, want, what: str) -> None:
    """Every sample (one batched read), a few one by one, every row again in reverse order."""
    n = len(ds)
    for i, got in enumerate(ds.__getitems__(list(range(n)))):
        check(got, want(i), f"{what} sample {i}")
    for i in sorted({0, 1, n // 3, n // 2, n - 2, n - 1, -1}):
        check(ds[i], want(i % n), f"{what} ds[{i}]")
    rows = np.arange(len(ds))[::-1].copy()
    got = ds.read_rows(rows)
    for j, i in enumerate(rows.tolist()):
        w = want(i)
        if isinstance(w, dict):
            for k, v in w.items():
                g = got[k].row(j) if hasattr(got[k], "row") else got[k][j]
                check(np.asarray(g), np.asarray(v), f"{what} read_rows row {i} field {k}")
        elif isinstance(w, tuple):
            check(got[0][j], w[0], f"{what} read_rows row {i}")
        else:
            check(np.asarray(got[0][j]), np.asarray(w), f"{what} read_rows row {i}")


def stats_of(ds, world) -> dict:
    return ds.load_stats[world.rank]


def part_sources(world, d: str) -> None:
    import h5py
    from pyddstore.torch import DistDataset, _load_runner

    from pyddstore import DDStoreError, DDStoreTimeoutError

    ds = DistDataset(NpzSource(d), "npz", world.comm)
    st = stats_of(ds, world)
    assert st["path"] == "samples" and st["workers"] == 32, st
    check_all(ds, npz_want, "npz")
    ds.free()

    # Not thread-safe: forked processes fill a staging area (small here: several rounds).
    saved = _load_runner.MIN_WINDOW_BYTES
    _load_runner.MIN_WINDOW_BYTES = 10 * row(0).nbytes
    try:
        ds = DistDataset(UnsafeNpzSource(d), "npz1", world.comm)
    finally:
        _load_runner.MIN_WINDOW_BYTES = saved
    st = stats_of(ds, world)
    assert st["path"] == "samples (processes)" and st["workers"] == 2, st
    check_all(ds, npz_want, "npz thread_safe=False")
    ds.free()
    ds = DistDataset(RaggedSource(), "rag-t", world.comm, ragged={"pos": 0})
    check_all(ds, rag_want, "ragged, threads")
    ds.free()
    ds = DistDataset(RaggedSource(), "rag-p", world.comm, ragged={"pos": 0}, load_workers="processes")
    assert stats_of(ds, world)["workers"] == 1
    check_all(ds, rag_want, "ragged, load_workers=processes")
    ds.free()
    # A failing sample in a worker process reaches every rank, named.
    raises(DDStoreError, lambda: DistDataset(BadSource(d), "bad", world.comm), "sample 150")
    # A worker stuck in source[150] times out (DDSTORE_LOAD_TIMEOUT_S) on every rank, named.
    e = raises(
        DDStoreTimeoutError,
        lambda: _with_env(
            "DDSTORE_LOAD_TIMEOUT_S", "2", lambda: DistDataset(StuckSource(d), "stuck", world.comm)
        ),
        "sample 150",
    )
    if world.rank == 0:
        print(f"stuck worker: {e}", flush=True)

    allrows = np.stack([row(i) for i in range(N)])
    ds = DistDataset(allrows, "mem", world.comm)
    assert stats_of(ds, world)["path"] == "arrays"
    check_all(ds, row, "in-memory array")
    ds.free()

    mm = np.load(os.path.join(d, "all.npy"), mmap_mode="r")
    ds = DistDataset(mm, "mm", world.comm)
    assert stats_of(ds, world)["path"] == "files (native)", stats_of(ds, world)
    check_all(ds, row, "memmap")
    ds.free()
    ds = DistDataset(mm[3:], "mm3", world.comm)  # a slice keeps its parent's offset attribute
    assert stats_of(ds, world)["path"] == "files (native)"
    check_all(ds, lambda i: row(i + 3), "memmap slice")
    ds.free()
    del mm

    parts = [os.path.join(d, f"part{k}.npy") for k in range(3)]
    ds = DistDataset(parts, "npy", world.comm)
    assert stats_of(ds, world)["path"] == "files (native)"
    check_all(ds, row, "npy list")
    ds.free()

    # Reads of two rows each: pieces cross file boundaries, many more pieces than threads.
    saved = _load_runner.MAX_READ_BYTES
    _load_runner.MAX_READ_BYTES = 2 * row(0).nbytes
    try:
        ds = DistDataset(parts, "npy-small", world.comm)
        check_all(ds, row, "npy list, small reads")
        ds.free()
    finally:
        _load_runner.MAX_READ_BYTES = saved

    os.environ["DDSTORE_LOAD_DIRECT"] = "1"
    try:
        ds = DistDataset(parts, "npy-direct", world.comm)
        notes = stats_of(ds, world)["notes"]
        assert any("O_DIRECT" in n for n in notes), notes
        check_all(ds, row, "npy list, O_DIRECT")
        if world.rank == 0:
            print("O_DIRECT:", notes, flush=True)
        ds.free()
    finally:
        del os.environ["DDSTORE_LOAD_DIRECT"]

    with h5py.File(os.path.join(d, "data.h5"), "r") as h:
        ds = DistDataset(h["contig"], "h5c", world.comm)
        assert stats_of(ds, world)["path"] == "files (native)"
        check_all(ds, row, "h5py contiguous")
        ds.free()
        ds = DistDataset(h["rawchunks"], "h5r", world.comm)  # unfiltered chunks: raw reads
        assert stats_of(ds, world)["path"] == "files (native)", stats_of(ds, world)
        check_all(ds, row, "h5py chunked, no filters")
        ds.free()
        # Compressed: forked workers with their own handles decompress in parallel (several
        # rounds through a small staging area), or threads where one CPU is all there is.
        saved = _load_runner.MIN_WINDOW_BYTES
        _load_runner.MIN_WINDOW_BYTES = 40 * row(0).nbytes
        try:
            ds = DistDataset(h["chunked"], "h5z", world.comm, chunk_size=16)
        finally:
            _load_runner.MIN_WINDOW_BYTES = saved
        want = "arrays (processes)" if len(os.sched_getaffinity(0)) > 1 else "arrays"
        assert stats_of(ds, world)["path"] == want, stats_of(ds, world)
        check_all(ds, row, "h5py chunked gzip")
        ds.free()

    try:
        import zarr
    except ImportError:
        zarr = None
    if zarr is not None:
        z = zarr.open(
            os.path.join(d, f"z{world.rank}.zarr"),
            mode="w",
            shape=allrows.shape,
            chunks=(10, 6, 16),
            dtype="f4",
        )
        z[:] = allrows
        ds = DistDataset(z, "zarr", world.comm)
        assert stats_of(ds, world)["path"] == "arrays"
        check_all(ds, row, "zarr")
        ds.free()
        if world.rank == 0:
            print("zarr checked", flush=True)

    # Files that changed after the source was described: every rank names the file.
    from pyddstore._sources import FileRows, Segment

    from pyddstore import DDStoreFileError

    short = os.path.join(d, "short.bin")
    if world.rank == 0:
        allrows[:100].tofile(short)  # 100 rows where the source says N
        os.symlink(os.path.join(d, "all.npy"), os.path.join(d, "link.npy"))
    world.barrier()
    raises(
        DDStoreFileError,
        lambda: DistDataset(FileRows([Segment(short, 0, N)], np.float32, SHAPE), "short", world.comm),
        "short.bin is truncated",
    )
    raises(
        DDStoreFileError,
        lambda: DistDataset(
            FileRows([Segment(os.path.join(d, "gone.bin"), 0, N)], np.float32, SHAPE), "gone", world.comm
        ),
        "gone.bin cannot be opened",
    )
    # A symbolic link to a file source is followed (datasets are often linked into place).
    ds = DistDataset(np.load(os.path.join(d, "link.npy"), mmap_mode="r"), "link", world.comm)
    check_all(ds, row, "memmap through a symbolic link")
    ds.free()

    # Bad input: a list of .npy files that do not match.
    from pyddstore import DDStoreValueError, Settings

    if world.rank == 0:
        np.save(os.path.join(d, "odd.npy"), np.zeros((3, 5), np.float32))
    world.barrier()
    raises(
        DDStoreValueError,
        lambda: DistDataset([parts[0], os.path.join(d, "odd.npy")], "bad", world.comm),
        "odd.npy",
    )
    raises(
        DDStoreValueError,
        lambda: _with_env("DDSTORE_LOAD_DEPTH", "0", lambda: _load_runner.load_depth(Settings.from_env())),
        "DDSTORE_LOAD_DEPTH",
    )
    raises(
        DDStoreValueError,
        lambda: _with_env(
            "DDSTORE_LOAD_DIRECT", "maybe", lambda: _load_runner.load_direct(Settings.from_env())
        ),
        "DDSTORE_LOAD_DIRECT",
    )
    if world.rank == 0:
        print("sources ok", flush=True)


def _with_env(key, value, fn):
    os.environ[key] = value
    try:
        return fn()
    finally:
        del os.environ[key]


def npz_want(i):
    return torch.from_numpy(row(i)), i * 3


def rag_want(i):
    return {"pos": pos(i), "y": np.int64(i), "img": torch.from_numpy(row(i))}


def small_blocks() -> None:
    from pyddstore.torch import _snapshot

    # Several checksum blocks per span and several blocks per read.
    _snapshot.BLOCK_BYTES = 1000
    _snapshot.READ_BYTES = 3000


def part_save(world, d: str) -> None:
    from pyddstore.torch import DistDataset, SnapshotError

    small_blocks()
    ds = DistDataset(NpzSource(d), "fx", world.comm)
    ds.save(os.path.join(d, "snap-fixed"))
    raises(SnapshotError, lambda: ds.save(os.path.join(d, "snap-fixed")), "already holds a snapshot")
    ds.free()
    rg = DistDataset(RaggedSource(), "rg", world.comm, ragged={"pos": 0})
    rg.save(os.path.join(d, "snap-ragged"))
    rg.free()
    back = DistDataset.restore(os.path.join(d, "snap-fixed"), comm=world.comm)
    assert back.name == "fx" and stats_of(back, world)["path"] == "snapshot (native)"
    check_all(back, npz_want, "restored fixed, same ranks")
    back.free()
    back = DistDataset.restore(os.path.join(d, "snap-ragged"), "rg2", world.comm)
    check_all(back, rag_want, "restored ragged, same ranks")
    back.free()
    if world.rank == 0:
        m = json.load(open(os.path.join(d, "snap-fixed", "manifest.json")))
        assert len(m["ranks"]) == world.size and sum(r["count"] for r in m["ranks"]) == N
        assert all(len(r["fields"][0]["rows"]["crc"]) > 3 for r in m["ranks"]), "expected several blocks"
        modes = {oct(os.stat(os.path.join(d, "snap-fixed", r["file"])).st_mode & 0o777) for r in m["ranks"]}
        assert modes == {"0o600"}, modes
        print("save ok", flush=True)


def damaged(d: str, tag: str, fn) -> str:
    """A copy of snap-fixed damaged by fn(copy dir) (rank 0 makes it)."""
    dst = os.path.join(d, f"snap-{tag}")
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(os.path.join(d, "snap-fixed"), dst)
    fn(dst)
    return dst


def part_restore(world, d: str) -> None:
    from pyddstore.torch import DistDataset, SnapshotError

    small_blocks()
    for direct in ("0", "1"):
        os.environ["DDSTORE_LOAD_DIRECT"] = direct
        back = DistDataset.restore(os.path.join(d, "snap-fixed"), comm=world.comm)
        check_all(back, npz_want, f"restored fixed on {world.size} ranks (direct={direct})")
        back.free()
        back = DistDataset.restore(os.path.join(d, "snap-ragged"), comm=world.comm)
        check_all(back, rag_want, f"restored ragged on {world.size} ranks (direct={direct})")
        back.free()
    del os.environ["DDSTORE_LOAD_DIRECT"]

    def truncate(p):
        f = os.path.join(p, "rank-00001.ddsnap")
        os.truncate(f, os.path.getsize(f) - 10)

    def flip(p):
        f = os.path.join(p, "rank-00000.ddsnap")
        with open(f, "r+b") as fh:
            fh.seek(5000)
            b = fh.read(1)
            fh.seek(5000)
            fh.write(bytes([b[0] ^ 0xFF]))

    def symlink(p):
        f = os.path.join(p, "rank-00000.ddsnap")
        os.rename(f, f + ".real")
        os.symlink(f + ".real", f)

    def bad_json(p):
        with open(os.path.join(p, "manifest.json"), "w") as fh:
            fh.write("{not json")

    def bad_count(p):
        mp = os.path.join(p, "manifest.json")
        m = json.load(open(mp))
        m["num_samples"] += 1
        json.dump(m, open(mp, "w"))

    def object_dtype(p):
        mp = os.path.join(p, "manifest.json")
        m = json.load(open(mp))
        m["schema"]["fields"][0]["dtype"] = "|O"
        json.dump(m, open(mp, "w"))

    cases = [
        ("dtype", object_dtype, "dtype |O is not one the store holds"),
        ("trunc", truncate, "rank-00001.ddsnap is truncated"),
        ("crc", flip, "rank-00000.ddsnap: checksum mismatch"),
        ("link", symlink, "rank-00000.ddsnap is a symbolic link"),
        ("json", bad_json, "manifest.json is not valid JSON"),
        ("count", bad_count, "manifest.json: the rank files hold"),
    ]
    for tag, fn, msg in cases:
        if world.rank == 0:
            damaged(d, tag, fn)
        world.barrier()
        e = raises(
            SnapshotError,
            lambda tag=tag: DistDataset.restore(os.path.join(d, f"snap-{tag}"), comm=world.comm),
            msg,
        )
        if world.rank == 0:
            print(f"{tag}: {e}", flush=True)
    # The store is usable after the failures.
    back = DistDataset.restore(os.path.join(d, "snap-fixed"), "again", world.comm)
    check_all(back, npz_want, "restored after failures")
    back.free()
    if world.rank == 0:
        print("restore ok", flush=True)


def main() -> None:
    part, d = sys.argv[1], sys.argv[2]
    from torch_common import args

    world = World(args(sys.argv[3:]))
    {"sources": part_sources, "save": part_save, "restore": part_restore}[part](world, d)


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write_files(sys.argv[2])
    else:
        run(main)
