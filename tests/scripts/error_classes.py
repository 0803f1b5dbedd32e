"""The same bad call raises the same class on every transport, with `call`, `code` and
`peer` attributes (None where the error names no call or peer). Runs under `mpirun -n 2`;
rank 0 makes each bad call (reads cross to rank 1: MPI_Get, libfabric, or a memory copy
of a same-node share, as the environment chooses) and prints one `classes {json}` line.

Usage: error_classes.py METHOD"""

import json
import sys

import numpy as np
from _common import main_guard, rows_of
from mpi4py import MPI
from pyddstore._shares import share_of

import pyddstore

N, SHAPE = 23, (4,)


def outcome(fn, *args):
    try:
        fn(*args)
    except pyddstore.DDStoreError as e:
        return [type(e).__name__, e.call, e.code, e.peer]
    return ["no error"]


def main():
    comm = MPI.COMM_WORLD
    store = pyddstore.PyDDStore(comm, method=int(sys.argv[1]))
    first, count = share_of(N, store.size, store.rank)
    mine = rows_of(1, np.arange(first, first + count), SHAPE, "float32")
    store.add("v", mine)
    got = {"add_existing": outcome(store.add, "v", mine)}  # collective: every rank refuses
    if store.rank == 0:
        one = np.empty((1,) + SHAPE, np.float32)
        two = np.empty((2,) + SHAPE, np.float32)
        ro = np.empty((1,) + SHAPE, np.float32)
        ro.setflags(write=False)
        got.update(
            index_past_end=outcome(store.get_batch, "v", one, [N]),
            index_negative=outcome(store.get_batch, "v", one, [-N - 1]),
            range_past_end=outcome(store.get, "v", two, N - 1),
            range_negative=outcome(store.get, "v", two, -1),
            unknown_variable=outcome(store.get_batch, "nope", one, [0]),
            wrong_dtype=outcome(store.get_batch, "v", np.empty((1,) + SHAPE, np.float64), [N - 1]),
            wrong_shape=outcome(store.get_batch, "v", two, [N - 1]),
            read_only_out=outcome(store.get_batch, "v", ro, [N - 1]),
            update_past_end=outcome(store.update, "v", mine[:1], count),
            float_index=outcome(store.get_batch, "v", one, [0.5]),
        )
        # A valid read of rank 1's rows after all of that: content as rank 1 stored it.
        store.get_batch("v", two, [N - 1, N - 2])
        assert np.array_equal(two, rows_of(1, [N - 1, N - 2], SHAPE, "float32"))
    store.barrier()
    store.free()
    if store.rank == 0:
        got["after_free"] = outcome(store.get_batch, "v", np.empty((1,) + SHAPE, np.float32), [0])
        print(f"classes {json.dumps(got, sort_keys=True)} transport {store.transport}", flush=True)


if __name__ == "__main__":
    main_guard(main)
