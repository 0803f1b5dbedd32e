"""Sample schemas: what a dataset's samples look like and how they map onto store variables.

Pure logic (no store, no communication) so it can be tested in one process: inference and
validation of samples, the balanced share split, chunk filling, turning read rows back into
samples, and the JSON form used by `{name}.meta.json` for method-2 readers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from pyddstore import DDStoreTypeError, DDStoreValueError, _native

META_VERSION = 1

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

# Sample structures.
VALUE = "value"
TUPLE = "tuple"
LIST = "list"
DICT = "dict"
PYG = "pyg"  # torch_geometric.data.Data
PYG_HETERO = "pyg-hetero"  # torch_geometric.data.HeteroData
PYG_STRUCTURES = (PYG, PYG_HETERO)


def _pyg_class_named(cls: Any, name: str) -> bool:
    """Whether cls is torch_geometric's class `name` or a subclass of it (without importing it)."""
    if not isinstance(cls, type):
        return False
    return any(c.__name__ == name and c.__module__.startswith("torch_geometric.") for c in cls.__mro__)


def is_pyg_data_class(cls: Any) -> bool:
    """Whether cls is torch_geometric's Data or a subclass of it (without importing torch_geometric)."""
    return _pyg_class_named(cls, "Data")


def is_pyg_hetero_class(cls: Any) -> bool:
    """Whether cls is torch_geometric's HeteroData or a subclass of it."""
    return _pyg_class_named(cls, "HeteroData")


def pyg_structure_of(cls: Any) -> str | None:
    """PYG or PYG_HETERO for a torch_geometric sample class, else None."""
    if is_pyg_data_class(cls):
        return PYG
    if is_pyg_hetero_class(cls):
        return PYG_HETERO
    return None


def _pyg_class(structure: str = PYG) -> Any:
    """torch_geometric's Data (or HeteroData), imported only when samples need building."""
    name = "HeteroData" if structure == PYG_HETERO else "Data"
    try:
        import torch_geometric.data as pyg_data
    except ImportError:
        raise SchemaTypeError(
            f"this dataset holds torch_geometric {name} samples: install torch_geometric "
            "(pip install torch_geometric) to read them"
        ) from None
    return getattr(pyg_data, name)


# HeteroData attributes are stored as fields named the way torch_geometric writes edge types
# ("author__writes__paper"): "paper.x" (node type "paper"), "author__writes__paper.edge_index"
# (edge type), and "y" (a graph-level attribute). Type and attribute names must therefore not
# contain "." or "__", so that every name maps back to one place.
_EDGE_SEP = "__"


def _hetero_key(store_key: Any, attr: Any, where: str) -> str:
    """The field name of attribute `attr` of the store `store_key` (None: graph level)."""
    parts = [] if store_key is None else [store_key] if isinstance(store_key, str) else list(store_key)
    for name in [*parts, attr]:
        if not isinstance(name, str) or not name or "." in name or _EDGE_SEP in name:
            raise SchemaTypeError(
                f"{where}: HeteroData type or attribute name {name!r} cannot be stored: names must be "
                f"non-empty strings without '.' or '{_EDGE_SEP}'"
            )
    if store_key is not None and not isinstance(store_key, str) and len(parts) != 3:
        raise SchemaTypeError(f"{where}: HeteroData edge type {store_key!r} is not (source, relation, dest)")
    return ".".join([_EDGE_SEP.join(parts), attr]) if parts else attr


def _hetero_place(key: str) -> tuple[Any, str]:
    """(store key or None, attribute) of a HeteroData field name (the inverse of _hetero_key)."""
    if "." not in key:
        return None, key
    prefix, attr = key.rsplit(".", 1)
    parts = prefix.split(_EDGE_SEP)
    return (tuple(parts) if len(parts) == 3 else prefix), attr


def _hetero_items(sample: Any, where: str) -> list[tuple[str, Any, Any]]:
    """(field name, value, store) of every attribute of a HeteroData sample, store by store."""
    out = []
    for store in sample.stores:
        for attr, value in store.items():
            out.append((_hetero_key(store._key, attr, where), value, store))
    return out


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


def share_of(n: int, size: int, rank: int) -> tuple[int, int]:
    """(start, count) of rank's share of n samples split over size ranks: the first n % size
    ranks get one more.

    Args:
        n (int): samples in all.
        size (int): ranks.
        rank (int): the rank whose share to return.

    Example:
        ```python
        share_of(10, 3, 0)  # (0, 4)
        share_of(10, 3, 2)  # (7, 3)
        ```
    """
    if size <= 0 or not 0 <= rank < size:
        raise DDStoreValueError(f"rank {rank} is not in a group of {size}")
    base, extra = divmod(n, size)
    return rank * base + min(rank, extra), base + (1 if rank < extra else 0)


def shares(n: int, size: int) -> list[int]:
    """Rows per rank of the balanced split."""
    return [share_of(n, size, r)[1] for r in range(size)]


def _where(index: int, key: Any) -> str:
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
                f"{_where(index, self.key)}: {describe(value)} differs from sample 0's "
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
    where = _where(index, key)
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


def _container(sample: Any) -> str:
    structure = pyg_structure_of(type(sample))
    if structure is not None:
        return structure
    if isinstance(sample, dict):
        return DICT
    if isinstance(sample, tuple):
        return TUPLE
    if isinstance(sample, list):
        return LIST
    return VALUE


class Schema:
    """The structure of a dataset's samples and the fields kept in the store.

    `fields` are the stored fields in source order; `keys` the keys samples are built with
    (all stored keys, in the order `fields=` gave them).
    """

    def __init__(
        self,
        structure: str,
        fields: list[Field],
        keys: list | None = None,
        seq_type: Any = None,
        n_items: int | None = None,
    ):
        self.structure = structure
        self.n_items = n_items  # items in sample 0 (stored or not), for checking later samples
        self.fields = fields
        self.by_key = {f.key: f for f in fields}
        self.keys = list(keys) if keys is not None else [f.key for f in fields]
        self.seq_type = seq_type

    @property
    def ragged_fields(self) -> list[Field]:
        return [f for f in self.fields if f.is_ragged]

    @property
    def fixed_fields(self) -> list[Field]:
        return [f for f in self.fields if not f.is_ragged]

    @classmethod
    def infer(
        cls, sample: Any, name: str, fields: list | None = None, ragged: Any = None, allow_empty: bool = False
    ) -> Schema:
        """The schema of sample 0; fields= keeps only those keys/positions; ragged= ({key: axis})
        lets those fields vary along that axis. torch_geometric Data samples: every tensor field
        of at least one dimension is ragged along the axis Data batches it on (__cat_dim__)."""
        structure = _container(sample)
        if ragged is not None and not isinstance(ragged, dict):
            raise SchemaError(f"ragged={ragged!r} must be a dict {{key: axis}} or 'auto'")
        ragged = dict(ragged or {})
        if structure == PYG:
            items = [(k, sample[k]) for k in sample.keys()]  # noqa: SIM118 - Data.keys() is a method
            for k, v in items:
                if not isinstance(k, str):
                    raise SchemaTypeError(f"sample 0: Data attribute {k!r} must be a str")
                if k not in ragged and isinstance(v, torch.Tensor) and v.dim() >= 1:
                    ragged[k] = int(sample.__cat_dim__(k, v))
        elif structure == PYG_HETERO:
            items = []
            for k, v, store in _hetero_items(sample, "sample 0"):
                items.append((k, v))
                if k not in ragged and isinstance(v, torch.Tensor) and v.dim() >= 1:
                    ragged[k] = int(sample.__cat_dim__(_hetero_place(k)[1], v, store))
        elif structure == DICT:
            items = list(sample.items())
            for k, _ in items:
                if not isinstance(k, (str, int)) or isinstance(k, bool):
                    raise SchemaTypeError(f"sample 0: dict key {k!r} must be a str or an int")
        elif structure in (TUPLE, LIST):
            items = list(enumerate(sample))
            if not items:
                raise SchemaError("sample 0 is an empty sequence")
        else:
            items = [(0, sample)]
        present = [k for k, _ in items]
        keys = present
        if fields is not None:
            keys = list(fields)
            missing = [k for k in keys if k not in present]
            if missing:
                raise SchemaError(
                    f"fields={fields!r}: sample 0 has no field {missing[0]!r} (it has {present!r})"
                )
            if len(set(keys)) != len(keys):
                raise SchemaError(f"fields={fields!r} names a field twice")
        unknown = [k for k in ragged if k not in keys]
        if unknown:
            raise SchemaError(
                f"ragged={ragged!r}: sample 0 has no stored field {unknown[0]!r} (it has {keys!r})"
            )
        wanted = set(keys)
        out = []
        for k, v in items:
            if k in wanted:
                f = classify(v, 0, k, allow_empty=allow_empty or k in ragged)
                if k in ragged:
                    f.make_ragged(ragged[k], _where(0, k))
                f.var = f"{name}/{k}"
                out.append(f)
        # Data subclasses come back as their own class: the class object of the sample itself.
        seq_type = type(sample) if structure in (TUPLE, LIST, DICT, *PYG_STRUCTURES) else None
        return cls(structure, out, keys, seq_type, None if structure == VALUE else len(items))

    # -- samples -> store -------------------------------------------------------------

    def field_values(self, sample: Any, index: int) -> list:
        """The stored fields' values of a sample, in `fields` order; checks its structure."""
        structure = _container(sample)
        if structure != self.structure:
            raise SchemaError(
                f"sample {index} is a {type(sample).__name__} but sample 0 was a {self.structure}"
            )
        if structure == VALUE:
            return [sample]
        if structure == PYG_HETERO:
            flat = {k: v for k, v, _ in _hetero_items(sample, f"sample {index}")}
            self._same_attributes(set(flat), index)
            return [flat[f.key] for f in self.fields]
        if structure == PYG:
            self._same_attributes(set(sample.keys()), index)  # noqa: SIM118 - Data.keys() is a method
        try:
            return [sample[f.key] for f in self.fields]
        except (KeyError, IndexError):
            raise SchemaError(
                f"sample {index} has no field {next(f.key for f in self.fields if not _has(sample, f.key))!r}"
                " that sample 0 has"
            ) from None

    def _same_attributes(self, have: set, index: int) -> None:
        if have != set(self.keys):
            raise SchemaError(
                f"sample {index} has attributes {sorted(have)} but sample 0 had {sorted(self.keys)}; "
                "every graph must have the same attributes"
            )

    def check_extra(self, sample: Any, index: int, n_fields: int) -> None:
        if len(sample) != n_fields:
            raise SchemaError(
                f"sample {index} has {len(sample)} fields but sample 0 had {n_fields}; "
                "every sample must have the same fields"
            )

    # -- store -> samples -------------------------------------------------------------

    def build(self, columns: dict, n: int) -> list:
        """n samples from per-field columns (lists of per-sample values)."""
        keys = self.keys
        if self.structure == VALUE:
            return list(columns[keys[0]])
        cols = [columns[k] for k in keys]
        if self.structure == PYG:
            # The samples' own class (a Data subclass too), else Data.
            data = self.seq_type if self.seq_type is not None else _pyg_class(PYG)
            return [_make_data(data, keys, vals) for vals in zip(*cols)]
        if self.structure == PYG_HETERO:
            data = self.seq_type if self.seq_type is not None else _pyg_class(PYG_HETERO)
            return [_make_hetero(data, keys, vals) for vals in zip(*cols)]
        if self.structure == DICT:
            if self.seq_type is None or self.seq_type is dict:
                return [dict(zip(keys, vals)) for vals in zip(*cols)]
            return [_make_mapping(self.seq_type, zip(keys, vals)) for vals in zip(*cols)]
        rows = zip(*cols)
        if self.structure == LIST:
            return [list(r) for r in rows]
        t = self.seq_type
        if t is not None and t is not tuple and hasattr(t, "_fields") and len(keys) == len(t._fields):
            return [t(*r) for r in rows]
        return [tuple(r) for r in rows]

    def collate_like(self, values: dict) -> Any:
        """Batch values arranged the way default_collate arranges a batch of samples."""
        keys = self.keys
        if self.structure == VALUE:
            return values[keys[0]]
        if self.structure == DICT:
            if self.seq_type is None or self.seq_type is dict:
                return {k: values[k] for k in keys}
            return _make_mapping(self.seq_type, ((k, values[k]) for k in keys))
        t = self.seq_type
        if t is not None and t is not tuple and hasattr(t, "_fields") and len(keys) == len(t._fields):
            return t(*(values[k] for k in keys))
        return [values[k] for k in keys]  # default_collate turns tuples and lists into lists

    def arrange(self, values: dict) -> Any:
        """One value per key arranged as a sample (WindowedDataset samples)."""
        return self.build({k: [v] for k, v in values.items()}, 1)[0]

    def mirror(self, per_field: dict) -> Any:
        """Something per field, arranged like a sample (ds.shapes, ds.dtypes)."""
        if self.structure == VALUE:
            return per_field[self.keys[0]]
        if self.structure in (DICT, *PYG_STRUCTURES):
            return {k: per_field[k] for k in self.keys}
        vals = [per_field[k] for k in self.keys]
        return vals if self.structure == LIST else tuple(vals)

    # -- JSON (meta file) -------------------------------------------------------------

    def to_json(self) -> dict:
        return {"structure": self.structure, "keys": self.keys, "fields": [f.to_json() for f in self.fields]}

    @classmethod
    def from_json(cls, d: dict, seq_type: Any = None) -> Schema:
        return cls(d["structure"], [Field.from_json(f) for f in d["fields"]], d.get("keys"), seq_type)


def _make_data(cls: type, keys: list, vals: Any) -> Any:
    """A Data (subclass) sample with these attributes: keyword arguments as Data takes them,
    else as torch_geometric builds samples when it splits a batch (no arguments, then set)."""
    try:
        return cls(**dict(zip(keys, vals)))
    except TypeError:
        data = cls()
        for k, v in zip(keys, vals):
            data[k] = v
        return data


def _make_hetero(cls: type, keys: list, vals: Any) -> Any:
    """A HeteroData (subclass) sample: each value set where its field name says (node type,
    edge type, or the graph level)."""
    data = cls()
    for k, v in zip(keys, vals):
        store_key, attr = _hetero_place(k)
        if store_key is None:
            data[attr] = v
        else:
            data[store_key][attr] = v
    return data


def _has(sample: Any, key: Any) -> bool:
    try:
        sample[key]
    except (KeyError, IndexError):
        return False
    return True


def _make_mapping(t: type, items: Any) -> Any:
    try:
        return t(items)
    except TypeError:
        return dict(items)


class ChunkFiller:
    """Fills per-field chunk buffers sample by sample, validating each sample. Ragged fields
    are collected whole (their variable is created once the share is known): `ragged[key]` is
    (list of flat arrays, list of lengths along the ragged axis)."""

    def __init__(self, schema: Schema, rows: int):
        self.schema = schema
        self.bufs = [f.fill_buffer(rows) for f in schema.fixed_fields]
        self.ragged: dict = {f.key: ([], []) for f in schema.ragged_fields}

    def put(self, j: int, sample: Any, index: int) -> None:
        schema = self.schema
        if (
            schema.n_items is not None
            and isinstance(sample, (dict, list, tuple))
            and len(sample) != schema.n_items
        ):
            schema.check_extra(sample, index, schema.n_items)
        values = schema.field_values(sample, index)
        fixed = []
        for f, v in zip(schema.fields, values):
            if not f.is_ragged:
                fixed.append(v)
                continue
            f.validate(v, index)
            arr = v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v, dtype=f.dtype)
            chunks, lengths = self.ragged[f.key]
            chunks.append(np.ascontiguousarray(arr).reshape(-1))
            lengths.append(arr.shape[f.ragged])
        for f, buf, v in zip(schema.fixed_fields, self.bufs, fixed):
            f.validate(v, index)
            try:
                if f.kind == TENSOR:
                    buf[j] = v.detach().cpu().numpy()
                else:
                    buf[j] = v
            except (OverflowError, ValueError) as e:
                raise SchemaError(f"{_where(index, f.key)}: {e}") from None

    def store_views(self, n: int) -> list[np.ndarray]:
        """Views of the fixed fields' first n rows, in `schema.fixed_fields` order."""
        return [f.to_store(b[:n]) for f, b in zip(self.schema.fixed_fields, self.bufs)]

    def ragged_share(self, f: Field) -> tuple[np.ndarray, np.ndarray]:
        """(values as (steps, unit_count), lengths) of every sample collected for ragged f."""
        chunks, lengths = self.ragged[f.key]
        flat = np.concatenate(chunks) if chunks else np.empty(0, f.dtype)
        return flat.reshape(-1, f.unit_count), np.asarray(lengths, dtype=np.int64)
