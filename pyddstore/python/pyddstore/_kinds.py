"""The kinds that cross into Rust, spelled once (``ddstore_core::kinds``) and built here from
``_native``'s tables: `Method` (the ``method=`` of a store: users may pass the plain numbers 0, 1
and 2), `CommKind` (what ``store.comm_kind`` names) and the parts a ragged variable is stored as.

Example:
    ```python
    store = pyddstore.PyDDStore(comm, method=pyddstore.Method.LIBFABRIC)  # the same as method=1
    assert store.method == pyddstore.Method.LIBFABRIC == 1
    ```
"""

from __future__ import annotations

import enum

from . import _native

#: How a store reads rows of other ranks: MPI_RMA (0), LIBFABRIC (1), LIBFABRIC_EXTRA_JOBS (2).
Method = enum.IntEnum("Method", dict(_native.METHOD_NUMBERS), module=__name__)

#: The communicator a store's group runs on; members compare equal to their names ("mpi", ...).
CommKind = enum.Enum("CommKind", {k.upper(): k for k in _native.COMM_KINDS}, type=str, module=__name__)

#: What a ragged variable's two parts add to its name: values, then row ends.
RAGGED_VALUES, RAGGED_ENDS = _native.RAGGED_PARTS


def check_method(method) -> int:
    """The number of a valid ``method=`` argument (0, 1, 2 or a `Method`); DDStoreValueError
    naming the value otherwise (the check is ``ddstore_core::kinds::Method``'s)."""
    return _native.check_method(method)


def ragged_parts(name: str) -> list[str]:
    """The names of ragged variable `name`'s two variables: values, then row ends."""
    return [name + RAGGED_VALUES, name + RAGGED_ENDS]
