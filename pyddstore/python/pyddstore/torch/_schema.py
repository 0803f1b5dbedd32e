"""Sample schemas: what a dataset's samples look like and how they map onto store variables.

Pure logic (no store, no communication) so it can be tested in one process: inference and
validation of samples, the balanced share split, chunk filling, turning read rows back into
samples, and the JSON form used by `{name}.meta.json` for method-2 readers.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from pyddstore import DDStoreTypeError

from ._field import TENSOR, Field, SchemaError, SchemaTypeError, classify, field_where

META_VERSION = 1

# Sample structures.
VALUE = "value"
TUPLE = "tuple"
LIST = "list"
DICT = "dict"
PYG = "pyg"  # torch_geometric.data.Data
PYG_HETERO = "pyg-hetero"  # torch_geometric.data.HeteroData
PYG_STRUCTURES = (PYG, PYG_HETERO)


def sample_of(source: Any, i: int, encode: Any) -> Any:
    """Sample i of a source as it is stored: through encode= where given."""
    s = source[i]
    return encode(s) if encode is not None else s


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
                    f.make_ragged(ragged[k], field_where(0, k))
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
                raise SchemaError(f"{field_where(index, f.key)}: {e}") from None

    def store_views(self, n: int) -> list[np.ndarray]:
        """Views of the fixed fields' first n rows, in `schema.fixed_fields` order."""
        return [f.to_store(b[:n]) for f, b in zip(self.schema.fixed_fields, self.bufs)]

    def ragged_share(self, f: Field) -> tuple[np.ndarray, np.ndarray]:
        """(values as (steps, unit_count), lengths) of every sample collected for ragged f."""
        chunks, lengths = self.ragged[f.key]
        flat = np.concatenate(chunks) if chunks else np.empty(0, f.dtype)
        return flat.reshape(-1, f.unit_count), np.asarray(lengths, dtype=np.int64)


def check_data_cls(data_cls: Any, who: str) -> None:
    """data_cls= of `who` is None or a torch_geometric Data / HeteroData (subclass)."""
    if data_cls is not None and pyg_structure_of(data_cls) is None:
        raise DDStoreTypeError(
            f"{who}(data_cls={data_cls!r}): expected torch_geometric.data.Data, HeteroData "
            "or a subclass of one"
        )


def use_data_cls(schema: Schema, data_cls: Any, who: str) -> None:
    """Graph samples of `schema` are built as data_cls (checked against the stored structure).
    The class always comes from the caller, never from a name read from a file."""
    if data_cls is None:
        return
    if schema.structure != pyg_structure_of(data_cls):
        held = f"{schema.structure}s"
        if schema.structure in PYG_STRUCTURES:
            held = "torch_geometric " + ("HeteroData" if schema.structure == PYG_HETERO else "Data")
        raise DDStoreTypeError(
            f"{who} with data_cls={data_cls.__name__}: the dataset's samples are {held}, "
            f"not {data_cls.__name__}"
        )
    schema.seq_type = data_cls
