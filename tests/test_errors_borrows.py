"""Structured errors and checked borrows, across transports: the same bad call raises the
same class (with `call`, `code`, `peer` attributes) over MPI RMA, libfabric tcp and
same-node memory copies; a read into an array another read is using is refused with
DDStoreBorrowError; a read from a stopped rank times out naming it (`peer`)."""

import json

import numpy as np
import pytest
from conftest import reports, run_mpi

import pyddstore

EXPECTED = {
    "add_existing": "DDStoreValueError",
    "after_free": "DDStoreFreedError",
    "float_index": "DDStoreTypeError",
    "index_negative": "DDStoreIndexError",
    "index_past_end": "DDStoreIndexError",
    "range_negative": "DDStoreIndexError",
    "range_past_end": "DDStoreIndexError",
    "read_only_out": "DDStoreTypeError",
    "unknown_variable": "DDStoreKeyError",
    "update_past_end": "DDStoreIndexError",
    "wrong_dtype": "DDStoreTypeError",
    "wrong_shape": "DDStoreValueError",
}

TRANSPORTS = [
    pytest.param("0", {"DDSTORE_SHM": "0"}, "mpi-rma", id="m0-mpi-get"),
    pytest.param("1", {"DDSTORE_FABRIC": "tcp", "DDSTORE_SHM": "0"}, "ofi:tcp", id="m1-tcp"),
    pytest.param("1", {"DDSTORE_FABRIC": "tcp"}, "ofi:tcp", id="m1-memfd"),
]


@pytest.mark.parametrize("method,env,transport", TRANSPORTS)
def test_same_bad_read_same_class_on_every_transport(method, env, transport):
    out = run_mpi(2, "error_classes.py", method, env=env, timeout=180).stdout
    got = reports(out, "classes")
    assert got, out
    assert transport in out, out
    classes = {case: r[0] for case, r in got[0].items()}
    assert classes == EXPECTED, json.dumps(got[0], indent=1)
    # None of these names a transport call or a peer.
    assert all(r[1:] == [None, None, None] for r in got[0].values()), got[0]


def test_borrowed_out_array_refused_and_timeout_names_the_peer():
    env = {"DDSTORE_FABRIC": "tcp", "DDSTORE_SHM": "0", "DDSTORE_TIMEOUT_S": "6"}
    out = run_mpi(2, "borrow_stall.py", env=env, timeout=180).stdout
    assert "DDStoreTimeoutError peer=1" in out, out
    assert "borrow_stall ok" in out, out


def test_exception_classes_carry_structured_attributes():
    for name in pyddstore._errors.__all__:
        cls = getattr(pyddstore, name)
        e = cls("x")
        assert (e.call, e.code, e.peer) == (None, None, None), name
        assert issubclass(cls, pyddstore.DDStoreError)
    assert issubclass(pyddstore.DDStoreBorrowError, ValueError)


def test_two_threads_one_array_in_one_process():
    """Four threads reading into one array: each call completes or is refused with
    DDStoreBorrowError (no two reads write the array at once; nothing crashes), and a read
    afterwards fills it with exactly the rows asked for."""
    import threading

    store = pyddstore.PyDDStore(None, method=1)
    rows = np.arange(4096 * 64, dtype=np.int64).reshape(4096, 64)
    store.add("r", rows)
    shared = np.zeros((2048, 64), np.int64)
    lock = threading.Lock()
    counts = {"ok": 0, "refused": 0}

    def worker(k):
        rng = np.random.default_rng(k)
        for _ in range(30):
            idx = rng.integers(0, 4096, len(shared))
            try:
                store.get_batch("r", shared, idx)
            except pyddstore.DDStoreBorrowError:
                with lock:
                    counts["refused"] += 1
                continue
            with lock:
                counts["ok"] += 1

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert counts["ok"] + counts["refused"] == 120 and counts["ok"] > 0, counts
    idx = np.arange(2047, -1, -1)
    store.get_batch("r", shared, idx)
    assert np.array_equal(shared, rows[idx])
    store.free()
