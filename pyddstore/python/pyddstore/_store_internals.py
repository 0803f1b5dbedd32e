"""The store's internal API: what `pyddstore.torch` and pickling (`_attach.py`) may use of a
`PyDDStore` beyond its public methods, and nothing else private (tests/test_module_map.py checks
that `torch/` touches no other private store attribute; docs/developer.md lists these names).

The methods create, publish and read a variable's parts as the torch loaders need: a ragged
variable made from rows loaded in place, spilled rows staged ahead of a read, a ragged
variable's values read without their unit shape. They are not public: their names and
arguments may change with the loaders that call them."""

from __future__ import annotations

import numpy as np

from ._args import dtype_name
from ._kinds import RAGGED_VALUES


class StoreInternals:
    """Mixed into `PyDDStore`: the internal API (see the module's docstring). The store sets
    `_native` (its `_native.Store`), `_publisher` (method-2 records, or None) and
    `_ragged_units` (ragged variable -> the shape of one unit)."""

    _native: object
    _publisher: object
    _ragged_units: dict

    def _reserve(self, name: str) -> None:
        """Method 2 core: the name fits the file system and no other live job publishes it.
        Called before a variable is created."""
        if self._publisher is not None:
            self._publisher.reserve(name)

    def _published(self, name: str) -> None:
        """Method 2 core: publishes the record of `name` (created and readable) for extra jobs."""
        if self._publisher is not None:
            self._publisher.publish(name)

    def _create_part(self, name: str, nrows: int, row_bytes: int, dtype) -> None:
        """Collective: creates `name` with this rank's `nrows` rows of `row_bytes` bytes of
        `dtype` (numpy), reserved but not yet published: a ragged variable's part before it
        is linked (`_link_ragged`)."""
        itemsize = np.dtype(dtype).itemsize
        self._native.init(name, nrows, row_bytes, itemsize=itemsize, dtype=dtype_name(dtype))

    def _link_ragged(self, name: str, unit: tuple) -> None:
        """Makes the two filled parts of `name` (`ragged_parts(name)`) one ragged variable whose
        values are read in units of shape `unit`."""
        self._native.link_ragged(name)
        self._ragged_units[name] = tuple(unit)

    def _is_spilled(self, name: str) -> bool:
        """Whether some of this rank's rows of `name` live in a spill file."""
        return self._native.is_spilled(name)

    def _prefetch(self, name: str, rows) -> int:
        """Stages the spilled rows `rows` (global, int64) of `name` that this rank will soon
        read; returns how many it staged."""
        return self._native.prefetch(name, rows)

    def _get_ragged_flat(self, name: str, rows):
        """`(values, offsets)` of ragged rows `rows`, values flat (not in units) and not counted
        as a user's read: what a snapshot writes."""
        return self._native.get_ragged(name, rows, None)

    def _values_var(self, name: str) -> str:
        """The variable reads of ``name`` land from: a ragged variable's values part."""
        return name + RAGGED_VALUES if self._native.is_ragged(name) else name
