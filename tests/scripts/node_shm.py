"""Same-node reads: every rank's rows are memory copies from shared mappings.

python node_shm.py member <method> [expect_node: 1|0]   (under mpirun)
python node_shm.py core <handshake_dir>                  (method 2 core, serves until STOP)
python node_shm.py extra <handshake_dir> <n_core>        (method 2 extra on this node)
"""

import os
import sys
import time

import numpy as np
from _common import main_guard, rows_of, run_threads
from pyddstore._shares import share_of

import pyddstore

N, SHAPE = 301, (96,)


def load(store):
    first, count = share_of(N, store.size, store.rank)
    store.add("v", rows_of(3, np.arange(first, first + count), SHAPE, "float64"))


def verify(store, rows):
    out = np.empty((len(rows),) + SHAPE, np.float64)
    store.get_batch("v", out, rows)
    assert np.array_equal(out, rows_of(3, rows, SHAPE, "float64")), f"rows {rows[:5]} differ"


def memfds(pid):
    links = []
    for f in os.listdir(f"/proc/{pid}/fd"):
        try:
            links.append(os.readlink(f"/proc/{pid}/fd/{f}"))
        except OSError:  # closed meanwhile (e.g. listdir's own fd)
            pass
    return [link for link in links if "memfd:ddstore" in link]


def member(method, expect_node):
    from mpi4py import MPI

    store = pyddstore.PyDDStore(MPI.COMM_WORLD, method=int(method))
    load(store)
    rng = np.random.default_rng(store.rank)
    run_threads(4, lambda i: [verify(store, rng.integers(0, N, 64)) for _ in range(30)])
    prof = store.get_profile("v")
    if expect_node == "1":
        assert prof["remote_rows"] == 0 and prof["node_rows"] > 0, prof
        if method == "1":
            assert memfds(os.getpid()), "shares should be memfds"
    else:
        assert prof["node_rows"] == 0 and prof["remote_rows"] > 0, prof
    if method == "1":  # a forked child reads through inherited mappings
        pid = os.fork()
        if pid == 0:
            try:
                store.fork_reader()
                verify(store, np.arange(N))
                p = store.get_profile("v")
                os._exit(0 if expect_node != "1" or p["remote_rows"] == 0 else 3)
            except BaseException as e:  # noqa: BLE001
                print("child:", repr(e), file=sys.stderr, flush=True)
                os._exit(1)
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0, "forked child failed"
    store.free()
    print(f"rank {store.rank}: node_shm ok {prof}")


def core(hs):
    from mpi4py import MPI

    store = pyddstore.PyDDStore(MPI.COMM_WORLD, method=2, handshake_dir=hs)
    load(store)
    print(f"rank {store.rank}: serving", flush=True)
    while not os.path.exists(os.path.join(hs, "STOP")):
        time.sleep(0.05)
    store.free()


def extra(hs, n_core):
    store = pyddstore.PyDDStore(None, method=2, handshake_dir=hs, n_core=int(n_core))
    store.join("v")
    verify(store, np.arange(N))
    verify(store, np.random.default_rng(0).integers(0, N, 500))
    prof = store.get_profile("v")
    assert prof["node_rows"] == prof["rows"] and prof["remote_rows"] == 0, prof
    print(f"extra: node_shm ok {prof}")


if __name__ == "__main__":
    main_guard(lambda: globals()[sys.argv[1]](*sys.argv[2:]))
