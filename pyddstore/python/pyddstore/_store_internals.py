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
from ._kinds import RAGGED_VALUES, ragged_parts


class StoreInternals:
    """Mixed into `PyDDStore`: the internal API (see the module's docstring). The store sets
    `_native` (its `_native.Store`), `_publisher` (method-2 records, or None) and
    `_ragged_units` (ragged variable -> the shape of one unit)."""

    _native: object
    _publisher: object
    _ragged_units: dict
    _init_item: object  # PyDDStore's: init()'s arguments checked
    _create_many: object  # PyDDStore's: items created in one exchange, reserved and published
    _check_name: object  # PyDDStore's: a variable name checked

    def _reserve(self, *names: str) -> None:
        """Method 2 core: the names fit the file system and no other live job publishes them
        (one exchange for all). Called before variables are created."""
        if self._publisher is not None:
            self._publisher.reserve(*names)

    def _published(self, name: str) -> None:
        """Method 2 core: publishes the record of `name` (created and readable) for extra jobs."""
        if self._publisher is not None:
            self._publisher.publish(name)

    def _init_many(self, specs: list) -> None:
        """Collective: `init(*spec)` of every (name, nrows, disp, itemsize, dtype) of `specs`
        (reserved, created, published), with one exchange between the ranks for all of them."""
        self._create_many([self._init_item(*spec) for spec in specs], None, None)

    def _init_ragged(self, name: str, lengths, unit_shape: tuple, dtype, fill) -> None:
        """Collective: as ``add(name, values, lengths)`` with the values not at hand:
        ``fill(values_part)`` writes this rank's values (units shaped ``unit_shape`` of ``dtype``)
        straight into its share of the variable named ``values_part`` (``update``,
        ``load_file_ranges``). An exception from ``fill`` on any rank fails every rank. The
        creation protocol is Rust's (``_native.Store.init_ragged``)."""
        self._check_name(name)
        dtype = np.dtype(dtype)
        unit_bytes = max(1, int(np.prod(unit_shape, dtype=np.int64)) * dtype.itemsize)
        lengths = np.ascontiguousarray(lengths, dtype=np.int64)
        self._reserve(*ragged_parts(name))
        self._native.init_ragged(
            name, lengths, unit_bytes, fill, itemsize=dtype.itemsize, dtype=dtype_name(dtype)
        )
        self._ragged_units[name] = tuple(unit_shape)
        for part in ragged_parts(name):
            self._published(part)

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

    def _populate_node_shares(self, names: list, max_bytes: int) -> int:
        """Maps the same-node memory reads of `names` copy from (own shares, same-node peers'
        mappings) into this process's page tables, at most `max_bytes` of it: what a forked
        reader lacks (fork() copies no page tables of shared mappings). The bytes populated."""
        return self._native.populate_node_shares(list(names), int(max_bytes))

    def _stage_capacity(self, name: str) -> int:
        """Bytes of `name`'s read-ahead stage on this rank (0: it stages nothing)."""
        return self._native.stage_capacity(name)

    def _get_ragged_flat(self, name: str, rows):
        """`(values, offsets)` of ragged rows `rows`, values flat (not in units) and not counted
        as a user's read: what a snapshot writes."""
        return self._native.get_ragged(name, rows, None)

    def _values_var(self, name: str) -> str:
        """The variable reads of ``name`` land from: a ragged variable's values part."""
        return name + RAGGED_VALUES if self._native.is_ragged(name) else name
