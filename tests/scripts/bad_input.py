"""The bad-input matrix: every bad call raises a pyddstore exception of the
expected builtin type with a message naming what is wrong, and a valid read
right after proves the store (and dataset) still works. Runs under
`mpirun -n 2` with method 1 (tcp), so reads cross ranks."""

import base64
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from _common import main_guard, rows_of
from mpi4py import MPI
from pyddstore.torch import (
    DistDataset,
    DistDatasetReader,
    ThreadDataLoader,
    WindowedDataset,
    row_of,
    share_of,
)

import pyddstore
from pyddstore import DDStoreError, _handshake, _native

N, SHAPE = 23, (4,)


class Src(torch.utils.data.Dataset):
    def __len__(self):
        return N

    def __getitem__(self, i):
        return torch.full(SHAPE, float(i)), i


def main():
    comm = MPI.COMM_WORLD
    store = pyddstore.PyDDStore(comm, method=1)
    first, count = share_of(N, store.size, store.rank)
    store.add("v", rows_of(1, np.arange(first, first + count), SHAPE, "float32"))
    ds = DistDataset(Src(), "ds", comm, method=1)
    win = WindowedDataset(ds, window=3)
    hs = tempfile.mkdtemp()
    a_file = os.path.join(hs, "plain-file")
    open(a_file, "w").close()
    good = np.empty((2,) + SHAPE, np.float32)
    f64 = np.empty((2,) + SHAPE, np.float64)

    def valid():
        store.get_batch("v", good, [0, N - 1])
        assert np.array_equal(good, rows_of(1, [0, N - 1], SHAPE, "float32"))
        x, y = ds[N - 1]
        assert y == N - 1 and float(x[0]) == N - 1

    def env_store(key, value):
        os.environ[key] = value
        try:
            pyddstore.PyDDStore(comm, method=None)
        finally:
            os.environ.pop(key)

    def corrupt_record(content, token="right"):
        path = os.path.join(hs, "bad.ddstore.json")
        with open(path, "w") as f:
            f.write(content)
        extra = pyddstore.PyDDStore(None, method=2, handshake_dir=hs, n_core=2)
        extra.join("bad", timeout_s=1, token=token)

    record = {
        "format": _handshake.FORMAT_VERSION,
        "name": "bad",
        "token_sha256": _handshake.token_digest("right"),
        "host": "h",
        "pid": 1,
        "n_core": 2,
        "dtype": "uint8",
        "row_bytes": 4,
        "itemsize": 1,
        "counts": [1, 1],
        "peers": {"id": "0f" * 8, "mac": "ef" * 32},
        "shares": base64.b64encode(bytes(2 * _native.PACKED_SHARE_BYTES)).decode(),
    }
    record["mac"] = _handshake.record_mac("right", record)

    def cli(*args):
        out = subprocess.run([sys.executable, "-m", "pyddstore", *args], capture_output=True, text=True)
        if out.returncode != 0:
            raise DDStoreCliError(out.stderr)

    cases = [
        # PyDDStore: buffers
        ("wrong dtype", TypeError, "dtype float64", store.get_batch, "v", f64, [0, 1]),
        (
            "wrong row width",
            ValueError,
            "expected 2 rows",
            store.get_batch,
            "v",
            np.empty((2, 5), np.float32),
            [0, 1],
        ),
        (
            "non-contiguous",
            TypeError,
            "C-contiguous",
            store.get_batch,
            "v",
            np.empty((2, 8), np.float32)[:, ::2],
            [0, 1],
        ),
        (
            "read-only",
            TypeError,
            "read-only",
            store.get_batch,
            "v",
            np.broadcast_to(good, good.shape),
            [0, 1],
        ),
        ("not an array", TypeError, "numpy array", store.get_batch, "v", [[0.0] * 4] * 2, [0, 1]),
        ("too few rows in out", ValueError, "expected 3 rows", store.get_batch, "v", good, [0, 1, 2]),
        # PyDDStore: indices
        ("row out of range", IndexError, f"index {N}", store.get_batch, "v", good, [0, N]),
        ("negative row", IndexError, "index -1", store.get_batch, "v", good, [-1, 0]),
        ("huge row", IndexError, "out of range", store.get_batch, "v", good, [0, 2**62]),
        ("float indices", TypeError, "integers", store.get_batch, "v", good, [0.5, 1.0]),
        ("NaN indices", TypeError, "integers", store.get_batch, "v", good, np.array([np.nan, 0.0])),
        (
            "2-D indices",
            ValueError,
            "one-dimensional",
            store.get_batch,
            "v",
            good,
            np.zeros((1, 2), np.int32),
        ),
        ("string indices", TypeError, "integers", store.get_batch, "v", good, "ab"),
        (
            "empty get past the end",
            IndexError,
            "out of range",
            store.get,
            "v",
            np.empty((0,) + SHAPE, np.float32),
            N + 1,
        ),
        ("get past the end", IndexError, "out of range", store.get, "v", good, N - 1),
        ("get negative start", IndexError, "out of range", store.get, "v", good, -2),
        (
            "ragged lengths of floats",
            TypeError,
            "lengths",
            store.add,
            "r",
            np.zeros((2, 4), np.float32),
            [0.5, 1.5],
        ),
        (
            "ragged negative length",
            ValueError,
            "lengths[1]",
            store.add,
            "r",
            np.zeros((2, 4), np.float32),
            [3, -1],
        ),
        # PyDDStore: names and variables
        ("unknown name", KeyError, "unknown variable 'nope':", store.get_batch, "nope", good, [0, 1]),
        (
            "close name",
            KeyError,
            "unknown variable 'vv' (did you mean 'v'?)",
            store.get_batch,
            "vv",
            good,
            [0, 1],
        ),
        ("empty name", TypeError, "non-empty str", store.add, "", np.zeros((1, 4), np.float32)),
        ("duplicate add", ValueError, "already exists", store.add, "v", np.zeros((1, 4), np.float32)),
        (
            "mismatched add",
            ValueError,
            f"this rank rows of {4 + store.rank} float32 values ({4 * (4 + store.rank)} bytes): every rank "
            f"must add rows of the same shape and dtype (this rank's rows are shaped ({4 + store.rank},))",
            store.add,
            "w",
            np.zeros((1, 4 + store.rank), np.float32),
        ),
        (
            "update out of share",
            IndexError,
            "do not fit",
            store.update,
            "v",
            np.zeros((count + 1, 4), np.float32),
            0,
        ),
        ("update wrong dtype", TypeError, "dtype", store.update, "v", np.zeros((1, 4), np.int64), 0),
        ("update negative offset", IndexError, "offset", store.update, "v", np.zeros((1, 4), np.float32), -1),
        ("init negative rows", ValueError, "nrows", store.init, "i", -1, 4, 4),
        ("join as a member", RuntimeError, "extra members", store.join, "v"),
        # PyDDStore: constructor and environment
        ("method 7", ValueError, "method=7", pyddstore.PyDDStore, comm, 7),
        ("DDSTORE_METHOD=7", ValueError, "DDSTORE_METHOD", env_store, "DDSTORE_METHOD", "7"),
        ("DDSTORE_FABRIC=nope", ValueError, "DDSTORE_FABRIC", env_store, "DDSTORE_FABRIC", "nope"),
        ("DDSTORE_COMM=bogus", ValueError, "DDSTORE_COMM", env_store, "DDSTORE_COMM", "bogus"),
        (
            "DDSTORE_MAX_INFLIGHT=lots",
            ValueError,
            "DDSTORE_MAX_INFLIGHT",
            env_store,
            "DDSTORE_MAX_INFLIGHT",
            "lots",
        ),
        ("DDSTORE_SHM=maybe", ValueError, "DDSTORE_SHM", env_store, "DDSTORE_SHM", "maybe"),
        ("bad comm object", ValueError, "not a communicator", pyddstore.PyDDStore, object()),
        ("ddstore_width 0", ValueError, "ddstore_width", pyddstore.PyDDStore, comm, 1, "", 0, None, 0),
        ("ddstore_width 3 of 2", ValueError, "does not divide", pyddstore.PyDDStore, comm, 1, "", 0, None, 3),
        (
            "method 0 without MPI",
            RuntimeError,
            "MPI communicator",
            pyddstore.PyDDStore,
            pyddstore.FileComm(hs, 0, 1),
            0,
        ),
        ("method 2 without dir", ValueError, "handshake_dir", pyddstore.PyDDStore, comm, 2),
        ("handshake_dir is a file", ValueError, "not a directory", pyddstore.FileComm, a_file, 0, 1),
        ("FileComm rank >= size", ValueError, "rank 3", pyddstore.FileComm, hs, 3, 2),
        # method 2 records
        (
            "join times out",
            TimeoutError,
            "no record",
            lambda: pyddstore.PyDDStore(None, method=2, handshake_dir=hs, n_core=2).join(
                "absent", timeout_s=0.2
            ),
        ),
        ("truncated record", ValueError, "corrupt or truncated", corrupt_record, json.dumps(record)[:40]),
        (
            "record of another format",
            ValueError,
            "format",
            corrupt_record,
            json.dumps({**record, "format": 9}),
        ),
        (
            "record n_core mismatch",
            ValueError,
            "n_core=2",
            corrupt_record,
            json.dumps({**record, "n_core": 3}),
        ),
        (
            "record bad counts",
            ValueError,
            "counts",
            corrupt_record,
            json.dumps({**record, "counts": [1, -1]}),
        ),
        (
            "record shares not base64",
            ValueError,
            "base64",
            corrupt_record,
            json.dumps({**record, "shares": "zz!"}),
        ),
        (
            "record stale",
            DDStoreError,
            "stale",
            corrupt_record,
            json.dumps({**record, "host": os.uname().nodename, "pid": 2**22 + 12345}),
        ),
        (
            "record, wrong job token",
            PermissionError,
            "not the token",
            corrupt_record,
            json.dumps(record),
            "x",
        ),
        (
            "record, altered memory key",
            PermissionError,
            "integrity",
            corrupt_record,
            json.dumps(
                {**record, "shares": base64.b64encode(b"\x01" * 2 * _native.PACKED_SHARE_BYTES).decode()}
            ),
        ),
        ("record, no job token", PermissionError, "no job token", corrupt_record, json.dumps(record), None),
        # DistDataset / WindowedDataset / row_of / DistDatasetReader
        ("sample out of range", IndexError, "out of range", ds.__getitem__, N),
        ("read_rows out of range", IndexError, "out of range", ds.read_rows, [0, N]),
        ("read_rows float rows", TypeError, "integers", ds.read_rows, np.array([0.5])),
        ("read_rows unknown field", KeyError, "field", ds.read_rows, [0], ["nope"]),
        ("alloc 0", ValueError, "alloc", ds.alloc, 0),
        (
            "DistDataset chunk_size 0",
            ValueError,
            "chunk_size",
            DistDataset,
            Src(),
            "c0",
            comm,
            None,
            None,
            None,
            1,
            None,
            0,
        ),
        (
            "DistDataset fields+encode",
            ValueError,
            "encode",
            lambda: DistDataset(Src(), "fe", comm, method=1, encode=lambda s: s, fields=[0]),
        ),
        ("DistDataset bad method", ValueError, "method", lambda: DistDataset(Src(), "m9", comm, method=9)),
        (
            "DistDataset string samples",
            TypeError,
            "encode",
            lambda: DistDataset(["a"] * 4, "s", comm, method=1),
        ),
        ("window 0", ValueError, "window", WindowedDataset, ds, 0),
        (
            "window start past the end",
            IndexError,
            "does not fit",
            lambda: WindowedDataset(ds, 3, starts=[N - 2]),
        ),
        ("window index", IndexError, "out of range", win.__getitem__, len(win)),
        ("window over a list", TypeError, "DistDataset", WindowedDataset, [1, 2, 3], 2),
        ("row_of bad source", IndexError, "source", row_of, torch.utils.data.ConcatDataset([Src()]), 3, 0),
        ("row_of index -1", IndexError, "index -1", row_of, torch.utils.data.ConcatDataset([Src()]), 0, -1),
        ("reader without dir", ValueError, "handshake_dir", lambda: DistDatasetReader("x", handshake_dir="")),
        # ThreadDataLoader
        (
            "reuse_buffers without batch_size",
            ValueError,
            "batch_size",
            lambda: iter(ThreadDataLoader(ds, batch_size=None, reuse_buffers=True)),
        ),
        (
            "reuse_buffers with a custom collate",
            ValueError,
            "collate_copies",
            lambda: ThreadDataLoader(ds, batch_size=4, reuse_buffers=True, collate_fn=lambda b: b),
        ),
        # CLI
        ("CLI unknown command", DDStoreCliError, "invalid choice", cli, "frobnicate"),
        ("CLI info with arguments", DDStoreCliError, "unrecognized arguments: extra", cli, "info", "extra"),
        ("CLI bench unknown config", DDStoreCliError, "unknown configs", cli, "bench", "--configs", "nope"),
    ]
    failures = []
    for what, exc, fragment, fn, *args in cases:
        try:
            fn(*args)
        except exc as e:
            if fragment.lower() not in str(e).lower():
                failures.append(f"{what}: message {str(e)!r} lacks {fragment!r}")
            elif exc is not DDStoreCliError and not isinstance(e, DDStoreError):
                failures.append(f"{what}: {type(e).__name__} is not a DDStoreError")
        except Exception as e:  # noqa: BLE001 - reported
            failures.append(f"{what}: expected {exc.__name__}, got {type(e).__name__}: {e}")
        else:
            failures.append(f"{what}: no exception")
        valid()
    comm.Barrier()
    if failures:
        raise AssertionError("\n".join(failures))
    ds.free()
    store.free()
    print(f"rank {store.rank}: {len(cases)} bad calls raised clearly; the store kept working")


class DDStoreCliError(Exception):
    pass


if __name__ == "__main__":
    main_guard(main)
