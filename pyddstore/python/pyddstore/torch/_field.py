"""Fields: one stored value of every sample (a tensor, an array, a number or a record) and
how it maps onto a store variable's rows.

Pure logic (no store, no communication): a value's kind, shape and dtype (classify), checks
of later samples against sample 0's field, row buffers, ragged fields, and the JSON form of a
field in meta files and snapshots.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from pyddstore import DDStoreTypeError, DDStoreValueError, _native

# The element dtypes a store holds: the one table, ddstore_core's DType (numpy and torch share
# the names).
SUPPORTED_DTYPES = tuple(_native.DTYPES)
_SUPPORTED_NP = {np.dtype(name) for name in SUPPORTED_DTYPES}
_TORCH_TO_NP = {getattr(torch, name): np.dtype(name) for name in SUPPORTED_DTYPES}
_NP_TO_TORCH = {v: k for k, v in _TORCH_TO_NP.items()}

# Field kinds: how a field's values look in a sample.
TENSOR = "tensor"  # torch.Tensor
NDARRAY = "ndarray"  # numeric numpy array (any ndim, incl. 0-d)
NPSCALAR = "npscalar"  # numpy scalar such as np.float32(1.0)
INT = "int"  # Python int, stored as int64
FLOAT = "float"  # Python float, stored as float64
BOOL = "bool"  # Python bool
RECORD = "record"  # numpy structured data, stored as bytes
NUMBER_KINDS = (INT, FLOAT, BOOL)
_PY_DTYPES = {INT: np.dtype("int64"), FLOAT: np.dtype("float64"), BOOL: np.dtype("bool")}

# Record flavours: what a record field's values are.
REC_VOID = "void"  # np.void scalar (a row of a structured array)
REC_RECORD = "record"  # np.record scalar (a row of a recarray)
REC_NDARRAY = "ndarray"  # structured ndarray
REC_RECARRAY = "recarray"  # np.recarray


class RaggedRows(NamedTuple):
    """Rows of a ragged field read in one batch: ``values`` holds every row's elements, row
    after row (a flat tensor for tensor fields, else a flat array); row i is
    ``values[offsets[i]:offsets[i + 1]].reshape(shapes[i])``.

    Example:
        ```python
        cols = ds.read_rows([4, 9], fields=["atoms"])  # a ragged field
        rr = cols["atoms"]
        first = rr.row(0)  # sample 4's atoms, in its own shape
        ```
    """

    values: Any
    offsets: np.ndarray
    shapes: list

    def row(self, i: int) -> Any:
        """Row i, in its own shape.

        Args:
            i (int): 0 <= i < the number of rows.
        """
        return self.values[int(self.offsets[i]) : int(self.offsets[i + 1])].reshape(self.shapes[i])

    def __len__(self) -> int:  # rows, not tuple fields
        return len(self.shapes)


class SchemaError(DDStoreValueError):
    """Samples that cannot be stored: ragged shapes, missing keys, differing structures.

    Example:
        ```python
        DistDataset([torch.zeros(3), torch.zeros(4)], "ragged")  # SchemaError names sample 1
        ```
    """


class SchemaTypeError(DDStoreTypeError):
    """A field of a type or dtype the store does not hold (strings, float16, objects...).

    Example:
        ```python
        DistDataset([{"name": "cat"}], "s")  # SchemaTypeError: use encode=/decode= for strings
        ```
    """


def field_where(index: int, key: Any) -> str:
    """Where a value sits, for error messages: "sample 3, field 'x'"."""
    return f"sample {index}, field {key!r}"


def _string_hint(where: str, what: str) -> SchemaTypeError:
    return SchemaTypeError(
        f"{where}: {what} cannot be stored; pass encode= to turn strings into numbers "
        "(e.g. an index into a list of labels) and decode= to turn them back"
    )


def _check_numeric(dtype: np.dtype, where: str) -> np.dtype:
    if dtype.kind in "USO" or dtype.kind == "T":
        raise _string_hint(where, f"dtype {dtype}")
    canon = np.dtype(dtype.name) if dtype.names is None else dtype
    if canon not in _SUPPORTED_NP:
        raise SchemaTypeError(
            f"{where}: dtype {dtype} is not supported (supported: {', '.join(SUPPORTED_DTYPES)}); "
            "convert it in the source or with encode="
        )
    return canon


@dataclass
class Field:
    """One stored field: a key (dict key, tuple position, or 0), its kind, shape and dtype."""

    key: Any
    kind: str
    shape: tuple[int, ...]
    dtype: np.dtype  # numeric dtype, or the record dtype for records
    record: str | None = None  # record flavour
    var: str = ""  # store variable name
    ragged: int | None = None  # the axis along which samples differ (shape has -1 there)
    max_len: int = 0  # ragged: the longest row along that axis, over every rank

    @property
    def is_ragged(self) -> bool:
        return self.ragged is not None

    @property
    def unit_count(self) -> int:
        """Ragged: elements per step along the ragged axis."""
        return math.prod(d for i, d in enumerate(self.shape) if i != self.ragged)

    def row_shape(self, length: int) -> tuple[int, ...]:
        """Ragged: the shape of a row of `length` steps along the ragged axis."""
        return tuple(length if i == self.ragged else d for i, d in enumerate(self.shape))

    def make_ragged(self, axis: int, where: str) -> None:
        """Lets this field vary along axis (negative counts from the end)."""
        if self.kind not in (TENSOR, NDARRAY) or not self.shape:
            raise SchemaError(
                f"{where}: ragged= needs a tensor or array field of at least one dimension, "
                f"got {self.describe()}"
            )
        nd = len(self.shape)
        if not isinstance(axis, int) or isinstance(axis, bool) or not -nd <= axis < nd:
            raise SchemaError(f"{where}: ragged axis {axis!r} is not an axis of shape {self.shape}")
        axis %= nd
        self.ragged = axis
        self.shape = self.row_shape(-1)
        if self.unit_count == 0:
            raise SchemaError(f"{where}: shape {self.shape} has no elements besides the ragged axis")

    @property
    def is_record(self) -> bool:
        return self.kind == RECORD

    @property
    def count(self) -> int:
        return math.prod(self.shape)

    @property
    def row_bytes(self) -> int:
        return self.count * self.dtype.itemsize

    @property
    def store_shape(self) -> tuple[int, ...]:
        """Shape of one row as kept in the store's buffers."""
        return (self.row_bytes,) if self.is_record else self.shape

    @property
    def store_dtype(self) -> np.dtype:
        return np.dtype(np.uint8) if self.is_record else self.dtype

    @property
    def torch_dtype(self) -> torch.dtype | None:
        return None if self.is_record else _NP_TO_TORCH[self.dtype]

    def init_args(self) -> tuple[int, int, np.dtype | None]:
        """(disp, itemsize, dtype) for PyDDStore.init: records are stored as bytes."""
        if self.is_record:
            return self.row_bytes, 1, None
        return self.count, self.dtype.itemsize, self.dtype

    def alloc(self, n: int) -> np.ndarray:
        """A buffer for n rows in store layout."""
        return np.empty((n, *self.store_shape), dtype=self.store_dtype)

    def alloc_ragged(self, n: int) -> np.ndarray:
        """Ragged: a flat buffer that holds any n rows (n x the longest row)."""
        return np.empty(max(1, n * self.max_len * self.unit_count), dtype=self.dtype)

    def check_ragged_out(self, arr: Any) -> np.ndarray:
        """Ragged: a caller's flat buffer (numpy array or CPU tensor) for read values."""
        if isinstance(arr, torch.Tensor):
            if arr.device.type != "cpu":
                raise DDStoreValueError(f"out buffer for field {self.key!r} must be in host memory")
            arr = arr.numpy()
        if not isinstance(arr, np.ndarray) or arr.dtype != self.dtype:
            raise DDStoreTypeError(
                f"out buffer for ragged field {self.key!r} must be a numpy array or CPU tensor "
                f"of {self.dtype}"
            )
        return arr

    def fill_buffer(self, n: int) -> np.ndarray:
        """A buffer for n rows in value layout (records typed), filled sample by sample."""
        return np.empty((n, *self.shape), dtype=self.dtype)

    def to_store(self, buf: np.ndarray) -> np.ndarray:
        """View a value-layout buffer in store layout."""
        if self.is_record:
            return buf.view(np.uint8).reshape(len(buf), self.row_bytes)
        return buf

    def check_out(self, arr: Any, n: int) -> np.ndarray:
        """The first n rows of a caller's buffer (numpy array or CPU tensor), checked."""
        if isinstance(arr, torch.Tensor):
            if arr.device.type != "cpu":
                raise DDStoreValueError(f"out buffer for field {self.key!r} must be in host memory")
            arr = arr.numpy()
        if not isinstance(arr, np.ndarray):
            raise DDStoreTypeError(f"out buffer for field {self.key!r} must be a numpy array or a CPU tensor")
        if arr.dtype.names is not None:
            arr = arr.view(np.uint8).reshape(len(arr), -1)
        if arr.shape[1:] != self.store_shape or arr.dtype != self.store_dtype or len(arr) < n:
            raise DDStoreValueError(
                f"out buffer for field {self.key!r} has shape {arr.shape} and dtype {arr.dtype}; "
                f"need at least ({n}, {', '.join(map(str, self.store_shape))}) of {self.store_dtype}"
            )
        return arr[:n]

    def values(self, buf: np.ndarray) -> Any:
        """Rows read in store layout as the (n, *shape) value read_rows returns."""
        if self.is_record:
            recs = buf.view(self.dtype).reshape(len(buf), *self.shape)
            if self.record in (REC_RECORD, REC_RECARRAY):
                recs = recs.view(np.recarray)
            return recs
        if self.kind == TENSOR:
            return torch.from_numpy(buf)
        return buf

    def ragged_values(self, flat: np.ndarray, unit_offsets: np.ndarray) -> RaggedRows:
        """A ragged batch as read (flat elements, offsets in steps) as RaggedRows."""
        lengths = np.diff(unit_offsets).tolist()
        values = torch.from_numpy(flat) if self.kind == TENSOR else flat
        return RaggedRows(values, unit_offsets * self.unit_count, [self.row_shape(n) for n in lengths])

    def column(self, batch: Any) -> list:
        """Per-sample values of a batch returned by values() (tensors possibly on a device)."""
        if isinstance(batch, RaggedRows):
            return [batch.row(i) for i in range(len(batch.shapes))]
        if self.kind == TENSOR:
            return list(batch.unbind(0))
        if self.kind in NUMBER_KINDS:
            return batch.tolist()
        if self.kind == NDARRAY and self.shape == ():
            return [batch[j, ...] for j in range(len(batch))]
        return list(batch)

    def _shape_fits(self, shape: tuple) -> bool:
        if self.ragged is None:
            return tuple(shape) == self.shape
        return len(shape) == len(self.shape) and all(
            i == self.ragged or a == b for i, (a, b) in enumerate(zip(shape, self.shape))
        )

    def matches(self, value: Any) -> bool:
        """Whether value fits this field (same kind, shape and dtype; any length along a ragged axis)."""
        kind = self.kind
        if kind == TENSOR:
            return (
                isinstance(value, torch.Tensor)
                and self._shape_fits(value.shape)
                and _TORCH_TO_NP.get(value.dtype) == self.dtype
            )
        if kind == NDARRAY:
            return (
                isinstance(value, np.ndarray)
                and value.dtype.names is None
                and self._shape_fits(value.shape)
                and (value.dtype == self.dtype or np.dtype(value.dtype.name) == self.dtype)
            )
        if kind == NPSCALAR:
            return isinstance(value, np.generic) and value.dtype == self.dtype
        if kind == INT:
            return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
        if kind == FLOAT:
            return isinstance(value, (float, np.floating))
        if kind == BOOL:
            return isinstance(value, (bool, np.bool_))
        return (
            isinstance(value, (np.void, np.ndarray))
            and value.dtype == self.dtype
            and np.shape(value) == self.shape
        )

    def validate(self, value: Any, index: int) -> None:
        """Raises if value does not match this field (sample index for the message)."""
        if not self.matches(value):
            hint = (
                "only the ragged axis may differ"
                if self.is_ragged
                else "every sample must have the same shapes and dtypes, or pass ragged={key: axis} "
                "(or ragged='auto') for fields whose size varies along one axis"
            )
            raise SchemaError(
                f"{field_where(index, self.key)}: {describe(value)} differs from sample 0's "
                f"{self.describe()}; {hint}"
            )

    def describe(self) -> str:
        if self.kind in NUMBER_KINDS:
            return f"Python {self.kind}"
        if self.kind == RECORD:
            return f"record {self.record} shape {self.shape} dtype {self.dtype}"
        ragged = f" (ragged along axis {self.ragged})" if self.is_ragged else ""
        return f"{self.kind} shape {self.shape}{ragged} dtype {self.dtype}"

    def source_dtype(self) -> Any:
        """The dtype as the source had it: torch dtype, numpy dtype, or Python type."""
        if self.kind == TENSOR:
            return _NP_TO_TORCH[self.dtype]
        if self.kind in NUMBER_KINDS:
            return {INT: int, FLOAT: float, BOOL: bool}[self.kind]
        return self.dtype

    def to_json(self) -> dict:
        d = {"key": self.key, "var": self.var, "kind": self.kind, "shape": list(self.shape)}
        if self.is_record:
            d["dtype"] = None
            d["record"] = self.record
            d["descr"] = np.lib.format.dtype_to_descr(self.dtype)
        else:
            d["dtype"] = self.dtype.str
        if self.is_ragged:
            d["ragged"] = self.ragged
            d["max_len"] = self.max_len
        return d

    @classmethod
    def from_json(cls, d: dict) -> Field:
        if d["kind"] == RECORD:
            dtype = np.lib.format.descr_to_dtype(_descr_from_json(d["descr"]))
        else:
            dtype = np.dtype(d["dtype"])
        f = cls(d["key"], d["kind"], tuple(d["shape"]), dtype, d.get("record"), d.get("var", ""))
        if d.get("ragged") is not None:
            ragged, max_len = d["ragged"], d.get("max_len", 0)
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in (ragged, max_len)) or not (
                0 <= ragged < len(f.shape) and f.shape[ragged] == -1 and max_len >= 0
            ):
                raise DDStoreValueError(
                    f"field {f.key!r}: ragged axis {ragged!r} / max_len {max_len!r} malformed"
                )
            f.ragged, f.max_len = ragged, max_len
        return f


def _descr_from_json(descr: Any) -> Any:
    """JSON turned descr tuples into lists; turn them back."""
    if isinstance(descr, str):
        return descr
    if isinstance(descr, dict):
        return descr
    out = []
    for entry in descr:
        name, fmt, *rest = entry
        name = tuple(name) if isinstance(name, list) else name
        item = (name, _descr_from_json(fmt))
        if rest:
            item += (tuple(rest[0]),)
        out.append(item)
    return out


def describe(value: Any) -> str:
    """A short description of a value for error messages."""
    if isinstance(value, torch.Tensor):
        return f"tensor shape {tuple(value.shape)} dtype {value.dtype}"
    if isinstance(value, np.ndarray):
        return f"array shape {value.shape} dtype {value.dtype}"
    if isinstance(value, np.generic):
        return f"numpy scalar {value.dtype}"
    return f"{type(value).__name__}"


def classify(value: Any, index: int, key: Any, allow_empty: bool = False) -> Field:
    """The field a value of sample index would make; raises SchemaTypeError/SchemaError.
    allow_empty: a field that will be ragged may have no elements in this sample."""
    where = field_where(index, key)
    if allow_empty:
        return _classify(value, where, key, lambda f, _w: f)
    return _classify(value, where, key, _nonempty)


def _classify(value: Any, where: str, key: Any, _nonempty: Any) -> Field:
    if isinstance(value, torch.Tensor):
        dtype = _TORCH_TO_NP.get(value.dtype)
        if dtype is None:
            raise SchemaTypeError(
                f"{where}: tensor dtype {value.dtype} is not supported "
                f"(supported: {', '.join(SUPPORTED_DTYPES)}); convert it in the source or with encode="
            )
        if value.is_sparse or value.layout != torch.strided:
            raise SchemaTypeError(f"{where}: only dense (strided) tensors can be stored")
        return _nonempty(Field(key, TENSOR, tuple(value.shape), dtype), where)
    if isinstance(value, np.ndarray):
        if value.dtype.names is not None:
            return _record(value, REC_RECARRAY if isinstance(value, np.recarray) else REC_NDARRAY, key, where)
        return _nonempty(Field(key, NDARRAY, value.shape, _check_numeric(value.dtype, where)), where)
    if isinstance(value, np.void):
        if value.dtype.names is None:
            raise SchemaTypeError(f"{where}: unstructured np.void (raw bytes) is not supported")
        return _record(value, REC_RECORD if isinstance(value, np.record) else REC_VOID, key, where)
    if isinstance(value, (np.str_, np.bytes_)):
        raise _string_hint(where, f"numpy {type(value).__name__}")
    if isinstance(value, np.generic):
        return Field(key, NPSCALAR, (), _check_numeric(value.dtype, where))
    if isinstance(value, bool):
        return Field(key, BOOL, (), _PY_DTYPES[BOOL])
    if isinstance(value, int):
        return Field(key, INT, (), _PY_DTYPES[INT])
    if isinstance(value, float):
        return Field(key, FLOAT, (), _PY_DTYPES[FLOAT])
    if isinstance(value, (str, bytes)):
        raise _string_hint(where, f"a {type(value).__name__}")
    if isinstance(value, (list, tuple, dict)):
        raise SchemaTypeError(
            f"{where}: nested {type(value).__name__} is not supported; make the field an array or "
            "a tensor, or flatten it with encode="
        )
    raise SchemaTypeError(
        f"{where}: {type(value).__name__} is not supported (tensors, numpy arrays and scalars, "
        "Python numbers and numpy records are); convert it with encode="
    )


def _record(value: Any, flavour: str, key: Any, where: str) -> Field:
    if value.dtype.hasobject:
        raise SchemaTypeError(f"{where}: records with Python object fields cannot be stored")
    return _nonempty(Field(key, RECORD, tuple(np.shape(value)), value.dtype, flavour), where)


def _nonempty(field: Field, where: str) -> Field:
    if field.count == 0:
        raise SchemaError(f"{where}: shape {field.shape} has no elements; empty fields cannot be stored")
    return field
