"""What one rank hands its communicator during store creation, one `add`, one `barrier` and one
`allgather`, counted by an LD_PRELOAD'ed shim (tests/scripts/pmpi_count.c: MPI calls and bytes;
file opens and creates in the handshake directory): prints `COUNTS {json}` per rank.

    mpicc -shared -fPIC -o /tmp/pmpi_count.so tests/scripts/pmpi_count.c
    PMPI_SHIM=/tmp/pmpi_count.so mpirun -n 8 python tests/scripts/coll_counts.py [METHOD]
    (file communicator: N processes with SLURM_PROCID/SLURM_NTASKS, DDSTORE_HANDSHAKE_DIR and
    LD_PRELOAD=fileops_count.so, built with cc -shared -fPIC ... -ldl)
"""

import ctypes
import json
import os
import sys

# The MPI shim goes first in the global symbol scope, before pyddstore loads libmpi, so the
# extension's MPI calls resolve to it (LD_PRELOAD would load it into mpirun too).
if os.environ.get("PMPI_SHIM"):
    ctypes.CDLL(os.environ["PMPI_SHIM"], mode=ctypes.RTLD_GLOBAL)

import numpy as np  # noqa: E402

import pyddstore  # noqa: E402

SHIM = ctypes.CDLL(None)
FIELDS = ("sends", "send_bytes", "collectives", "collective_bytes", "recvs", "gathered_bytes")
FIELDS += ("file_opens", "file_creates")


def counts() -> list:
    mpi = (ctypes.c_longlong * 6)()
    files = (ctypes.c_longlong * 3)()
    if hasattr(SHIM, "pmpi_counts"):
        SHIM.pmpi_counts(mpi)
    if hasattr(SHIM, "file_counts"):
        SHIM.file_counts(files)
    return list(mpi) + list(files)[:2]


def delta(before: list) -> dict:
    return dict(zip(FIELDS, (b - a for a, b in zip(before, counts()))))


def dataset():
    """DistDatasets of one field and of four: what creating them hands MPI differs by nothing
    (the fields are created in one exchange, whatever their number)."""
    import torch
    from mpi4py import MPI
    from pyddstore.torch import DistDataset

    report = {"rank": MPI.COMM_WORLD.rank, "size": MPI.COMM_WORLD.size}
    for k in (1, 4):
        src = [tuple(torch.full((3,), float(i + 10 * j)) for j in range(k)) for i in range(16)]
        t = counts()
        ds = DistDataset(src, f"d{k}", MPI.COMM_WORLD, method=1)
        report[f"fields{k}"] = delta(t)
        got = ds[5]
        got = got if isinstance(got, (tuple, list)) else (got,)
        assert all(torch.equal(got[j], torch.full((3,), 5.0 + 10 * j)) for j in range(k)), got
        ds.free()
    print("COUNTS", json.dumps(report), flush=True)


def main():
    if sys.argv[1:] == ["dataset"]:
        return dataset()
    method = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    t = counts()
    store = pyddstore.PyDDStore(None, method=method)
    report = {"rank": store.rank, "size": store.size, "create": delta(t)}
    rows = np.full((4, 16), store.rank, np.float32)  # fixed-size records on every rank
    store.add("warm", rows)  # a first add also agrees on the job's key
    t = counts()
    store.add("x", rows)
    report["add"] = delta(t)
    t = counts()
    store.add_many({"m1": rows, "m2": rows[:2] * 2, "m3": rows[:, :4].copy()})
    report["add_many"] = delta(t)
    t = counts()
    store.barrier()
    report["barrier"] = delta(t)
    t = counts()
    got = store.allgather(store.rank)
    report["allgather"] = delta(t)
    assert got == list(range(store.size)), got
    out = np.zeros((store.size, 16), np.float32)
    store.get_batch("x", out, np.arange(store.size, dtype=np.int64) * 4)
    assert (out == np.arange(store.size, dtype=np.float32)[:, None]).all(), out[:, 0]
    two = np.zeros((store.size, 16), np.float32)
    store.get_batch("m2", two, np.arange(store.size, dtype=np.int64) * 2 + 1)
    assert (two == 2 * np.arange(store.size, dtype=np.float32)[:, None]).all(), two[:, 0]
    # Reported before free(): Open MPI can drop what a rank prints just before it exits.
    print("COUNTS", json.dumps(report), flush=True)
    store.free()


if __name__ == "__main__":
    main()
