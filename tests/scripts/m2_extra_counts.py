"""Method-2 extra job member that counts the core job's files it opens while joining (the
LD_PRELOAD'ed tests/scripts/fileops_count.c: opens of *.json and *.token), then reads every
row of every variable m2_core.py publishes and checks it: prints `RECORDS {json}`.

    mpirun -n 8 python m2_extra_counts.py mpi --hs DIR --n-core 2     (extra_comm: the MPI job)
    SLURM_PROCID=.. python m2_extra_counts.py file --hs DIR --n-core 2 (extra_comm: a FileComm)
    ... m2_extra_counts.py none ...                                     (no extra_comm: each reads)
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os

import numpy as np
from _common import main_guard, rows_of
from m2_common import N_ROWS, RAGGED, VARS, ragged_rows, seed_of

import pyddstore

SHIM = ctypes.CDLL(None)


def published_opens() -> int:
    files = (ctypes.c_longlong * 3)()
    SHIM.file_counts(files)
    return files[2]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("comm", choices=["mpi", "file", "none"])
    p.add_argument("--hs", required=True)
    p.add_argument("--n-core", type=int, required=True)
    p.add_argument("--comm-dir", default=None)
    a = p.parse_args()
    if a.comm == "mpi":
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        rank = comm.rank
    elif a.comm == "file":
        comm = pyddstore.FileComm(a.comm_dir)
        rank = comm.rank
    else:
        comm, rank = None, int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("SLURM_PROCID", "0")))
    before = published_opens()
    store = pyddstore.PyDDStore(None, method=2, handshake_dir=a.hs, n_core=a.n_core, extra_comm=comm)
    for name in VARS:
        store.join(name)
    store.join(RAGGED)
    opens = published_opens() - before
    rng = np.random.default_rng(rank)
    for name, (_, shape, dtype) in VARS.items():
        rows = rng.permutation(N_ROWS)
        out = np.empty((N_ROWS,) + shape, dtype)
        store.get_batch(name, out, rows)
        assert np.array_equal(out, rows_of(seed_of(name, 0), rows, shape, dtype)), name
    rows = rng.permutation(N_ROWS)[:9]
    want, lengths = ragged_rows(0, rows)
    values, offsets = store.get_batch(RAGGED, rows)
    assert np.array_equal(values, want) and np.array_equal(offsets, np.concatenate([[0], np.cumsum(lengths)]))
    print("RECORDS", json.dumps({"rank": rank, "opens": opens, "vars": len(VARS) + 1}), flush=True)
    store.free()


if __name__ == "__main__":
    main_guard(main)
