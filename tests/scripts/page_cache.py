"""A load leaves no page-cache footprint of the files pyddstore reads itself (issue 37): a list
of .npy files and an np.memmap, each made resident first (written back, then read), loaded
into a one-process DistDataset; afterwards their pages are not in the page cache (counted
with mincore over a fresh mapping, which faults nothing in), and every sample is checked.

python page_cache.py DIR   prints "npy list: resident A -> B of N pages" per source, then "ok".
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys

import numpy as np
from pyddstore.torch import DistDataset

ROWS, ROW_VALUES, FILES = 64, 4096, 8  # 64 rows of 16 KiB per file: 8 MiB in all
PAGE = mmap.PAGESIZE

libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
c = ctypes
libc.mmap.argtypes = (c.c_void_p, c.c_size_t, c.c_int, c.c_int, c.c_int, c.c_long)
libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p)


def resident(path: str) -> tuple[int, int]:
    """(pages of `path` in the page cache, pages in all), by mincore over a new mapping."""
    size = os.path.getsize(path)
    pages = (size + PAGE - 1) // PAGE
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), f"mmap failed: errno {ctypes.get_errno()}"
        try:
            vec = ctypes.create_string_buffer(pages)
            assert libc.mincore(addr, size, vec) == 0, f"mincore failed: errno {ctypes.get_errno()}"
            return sum(b & 1 for b in vec.raw), pages
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


def resident_all(paths: list[str]) -> tuple[int, int]:
    counts = [resident(p) for p in paths]
    return sum(c[0] for c in counts), sum(c[1] for c in counts)


def make_resident(paths: list[str]) -> None:
    """Written back (dirty pages cannot be dropped), then read: every page cached."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            while os.read(fd, 1 << 20):
                pass
        finally:
            os.close(fd)


def row(i: int) -> np.ndarray:
    return np.arange(ROW_VALUES, dtype=np.float32) + i * 0.5


def check(ds, n: int, what: str) -> None:
    for i in range(n):
        assert np.array_equal(np.asarray(ds[i]), row(i)), f"{what}: sample {i} differs"


def load_and_count(source, paths: list[str], n: int, what: str) -> None:
    make_resident(paths)
    before, pages = resident_all(paths)
    assert before >= pages * 0.9, f"{what}: only {before} of {pages} pages cached before the load"
    ds = DistDataset(source, what.replace(" ", "_"))
    after, _ = resident_all(paths)
    print(f"{what}: resident {before} -> {after} of {pages} pages", flush=True)
    # Kernel read-ahead still in flight when a range was dropped may leave a page or two.
    assert after <= pages // 50, f"{what}: {after} of {pages} pages still cached after the load"
    check(ds, n, what)
    ds.free()


def main(d: str) -> None:
    n = ROWS * FILES
    npys = []
    for k in range(FILES):
        p = os.path.join(d, f"part{k}.npy")
        np.save(p, np.stack([row(i) for i in range(k * ROWS, (k + 1) * ROWS)]))
        npys.append(p)
    load_and_count(npys, npys, n, "npy list")

    path = os.path.join(d, "rows.bin")
    mm = np.memmap(path, np.float32, "w+", shape=(n, ROW_VALUES))
    mm[:] = np.stack([row(i) for i in range(n)])
    mm.flush()
    del mm
    load_and_count(np.memmap(path, np.float32, "r", shape=(n, ROW_VALUES)), [path], n, "memmap")
    print("ok", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
