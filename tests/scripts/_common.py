"""Helpers for the multi-rank test scripts: deterministic row contents any
rank can recompute, and checks that report the failing rank."""

import faulthandler
import os
import signal
import sys
import threading
import time

import numpy as np

# A job that outlives its test's timeout gets SIGUSR1 from tests/conftest.py first:
# every rank then prints where each of its Python threads is, for the failure report.
faulthandler.register(signal.SIGUSR1, all_threads=True)

DTYPES = ["bool", "uint8", "int32", "int64", "float32", "float64"]


def rows_of(name_seed: int, rows, shape, dtype) -> np.ndarray:
    """The content of global rows `rows`: a pure function of (seed, row)."""
    rows = np.asarray(rows, dtype=np.int64)
    n = int(np.prod(shape)) if shape else 1
    vals = (rows[:, None] * 7919 + np.arange(n)[None, :] * 31 + name_seed) % 251
    dt = np.dtype(dtype)
    if dt == np.bool_:
        vals = vals % 2
    elif dt.kind == "f":
        vals = vals * 0.5 - 3.25
    elif dt.kind == "i":
        vals = vals - 100
    return vals.astype(dt).reshape((len(rows),) + tuple(shape))


def rss_kib() -> int:
    """This process's resident memory (VmRSS) in KiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def expect_error(exc_types, fragment: str, fn, *args):
    try:
        fn(*args)
    except exc_types as e:
        if fragment.lower() not in str(e).lower():
            raise AssertionError(f"error message {str(e)!r} lacks {fragment!r}") from e
        return e
    raise AssertionError(f"expected {exc_types} containing {fragment!r}, nothing was raised")


def run_threads(n: int, fn) -> None:
    errors = []

    def body(i):
        try:
            fn(i)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def rank_tag() -> str:
    return f"[rank {os.environ.get('OMPI_COMM_WORLD_RANK', os.environ.get('SLURM_PROCID', '?'))}]"


def main_guard(main):
    try:
        main()
    except BaseException:
        import traceback

        print(rank_tag(), "FAILED", file=sys.stderr)
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)


def wait_stopped(pid: int) -> None:
    """SIGSTOP takes effect once the target is scheduled: wait until it is ('T' in /proc)."""
    deadline = time.monotonic() + 30
    while True:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] in ("T", "t"):
                return
        assert time.monotonic() < deadline, f"process {pid} did not stop"
        time.sleep(0.01)
