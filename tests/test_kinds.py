"""Methods, communicator kinds and ragged part names are spelled once, in ddstore_core::kinds,
and reach Python from _native: `pyddstore.Method` is an IntEnum (users keep passing method=1),
`pyddstore.CommKind` compares equal to the names `store.comm_kind` gives, and a method is
checked in one place (Rust) whichever way it arrives."""

from __future__ import annotations

import numpy as np
import pytest
from pyddstore._kinds import ragged_parts

import pyddstore
from pyddstore import CommKind, DDStoreValueError, Method, _native


def test_method_numbers_and_comm_kinds_come_from_rust():
    named = [(m.name, int(m)) for m in Method]
    assert named == [("MPI_RMA", 0), ("LIBFABRIC", 1), ("LIBFABRIC_EXTRA_JOBS", 2)]
    assert [k.value for k in CommKind] == ["mpi", "file", "torch", "single"] == _native.COMM_KINDS
    assert set(_native.METHODS) <= {int(m) for m in Method}
    assert ragged_parts("g") == ["g#values", "g#ends"]


@pytest.mark.parametrize("method", [1, Method.LIBFABRIC, np.int64(1)])
def test_a_plain_int_or_a_member_makes_the_same_store(method):
    store = pyddstore.PyDDStore(None, method=method)
    try:
        assert store.method == 1 and store.method == Method.LIBFABRIC and type(store.method) is int
        assert store.comm_kind == CommKind.SINGLE == "single"
        rows = np.arange(12, dtype=np.float32).reshape(4, 3)
        store.add("x", rows)
        out = np.empty((2, 3), np.float32)
        store.get_batch("x", out, [3, 1])
        assert np.array_equal(out, rows[[3, 1]])
    finally:
        store.free()


@pytest.mark.parametrize("bad", [3, -1, True, 1.0, "1"])
def test_a_bad_method_is_refused_by_the_one_check(bad):
    with pytest.raises(DDStoreValueError, match="is not valid: expected 0 \\(MPI RMA\\), 1 or 2"):
        pyddstore.PyDDStore(None, method=bad)
    with pytest.raises(DDStoreValueError, match="is not valid"):
        _native.check_method(bad)
