"""Rank agreement: every rank learns whether all ranks succeeded before it goes on, and
every rank gets the same schema.

A rank that fails sends its error as data (a kind and a message); every other rank raises the
same kind of error naming the rank that failed, so a collective step never leaves some ranks
waiting for the others. The schema is inferred by rank 0 from sample 0 and sent to all as JSON;
ragged="auto" axes are found by every rank over its own share and merged.
"""

from __future__ import annotations

import collections.abc
import sys
from typing import Any

import numpy as np
import torch

from pyddstore import DDStoreError, DDStoreFileError, DDStoreTimeoutError, _native
from pyddstore._shares import share_of

from ._errors import SnapshotError, snapshot_error
from ._field import NDARRAY, TENSOR, SchemaError, SchemaTypeError
from ._schema import PYG_STRUCTURES, Schema, pyg_structure_of, sample_of


def error_payload(e: BaseException, rank: int) -> tuple:
    """(kind, message) of a failure, and a file error's errno, as data another rank turns back
    into an error of the same kind (rebuild_error); rank -1: a forked load worker of this rank."""
    if isinstance(e, SnapshotError):
        return "snapshot", f"rank {rank}: {e}", e.errno
    if isinstance(e, DDStoreFileError):
        return "file", f"rank {rank}: {e}", e.errno
    if isinstance(e, DDStoreTimeoutError):
        return "timeout", f"rank {rank}: {e}"
    if isinstance(e, SchemaTypeError):
        return "type", str(e)
    if isinstance(e, SchemaError):
        return "value", str(e)
    return "other", f"rank {rank}: {type(e).__name__}: {e}"


def rebuild_error(payload: tuple) -> Exception:
    """The error another rank (or a load worker) reported with error_payload."""
    kind, msg, *errno = payload
    if kind == "type":
        return SchemaTypeError(msg)
    if kind == "value":
        return SchemaError(msg)
    if kind == "snapshot":
        return snapshot_error(msg, *errno)
    if kind == "file":
        return _native.file_error(msg, *errno)
    if kind == "timeout":
        return DDStoreTimeoutError(f"loading timed out on another rank: {msg}")
    return DDStoreError(f"loading failed on another rank: {msg}")


def agree(store: Any, err: BaseException | None, value: Any = None) -> list:
    """Collective: every rank's value (JSON-able); raises on every rank if any rank failed
    (its own error where it failed, else one naming the rank that did)."""
    payload = None if err is None else error_payload(err, store.rank)
    results = store.allgather({"error": payload, "value": value})
    failed = [r["error"] for r in results if r["error"] is not None]
    if err is not None:
        raise err
    if failed:
        raise rebuild_error(tuple(failed[0]))
    return [r["value"] for r in results]


def _type_name(t: Any) -> str | None:
    """A sample container type as data ("module:qualname") for the schema exchange."""
    if not isinstance(t, type):
        return None
    return f"{t.__module__}:{t.__qualname__}"


def _type_from_name(name: Any) -> Any:
    """The container type a peer named, only if this process already has it loaded
    (nothing is imported or run) and it is a tuple, list or mapping type; else None."""
    if not isinstance(name, str) or ":" not in name:
        return None
    module, qualname = name.split(":", 1)
    obj = sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None) if obj is not None and part.isidentifier() else None
    if isinstance(obj, type) and issubclass(obj, (tuple, list, dict, collections.abc.Mapping)):
        return obj
    return None


def agree_schema(
    store: Any, source: Any, name: str, encode: Any, fields: Any, n: int, ragged: Any = None
) -> Schema:
    """Rank 0 infers the schema from sample 0; every rank gets it (or the same error)."""
    payload, local_err = None, None
    if store.rank == 0:
        try:
            if n == 0:
                raise SchemaError("the source is empty")
            if ragged is not None and ragged != "auto" and not isinstance(ragged, dict):
                raise SchemaError(f"ragged={ragged!r} must be a dict {{key: axis}}, 'auto' or None")
            sample = sample_of(source, 0, encode)
            if ragged == "auto":
                schema = Schema.infer(sample, name, fields, allow_empty=True)
            else:
                schema = Schema.infer(sample, name, fields, ragged)
            payload = ("ok", schema.to_json(), _type_name(schema.seq_type))
        except Exception as e:  # noqa: BLE001 - every rank must learn of the failure
            local_err = e
            payload = ("err", error_payload(e, 0))
    agreed = store.allgather(payload)[0]
    if agreed[0] == "err":
        raise local_err if local_err is not None else rebuild_error(agreed[1])
    seq_type = schema.seq_type if store.rank == 0 else _type_from_name(agreed[2])
    if store.rank != 0 and agreed[1].get("structure") in PYG_STRUCTURES:
        seq_type = _own_data_class(store, source, encode, n, agreed[2])
    return Schema.from_json(agreed[1], seq_type)


def _own_data_class(store: Any, source: Any, encode: Any, n: int, name: Any) -> Any:
    """The Data (subclass) rank 0 found, as this rank's own samples give it: the class object
    of the first sample of its share (else sample 0), when its name is the one rank 0 sent;
    never imported or looked up by that name. None (plain Data) otherwise."""
    start, count = share_of(n, store.size, store.rank)
    try:
        cls = type(sample_of(source, start if count else 0, encode))
    except Exception:  # noqa: BLE001 - reading its own sample fails later, with context
        return None
    return cls if pyg_structure_of(cls) is not None and _type_name(cls) == name else None


def agree_ragged_axes(store: Any, source: Any, schema: Schema, encode: Any, n: int) -> None:
    """ragged='auto': every rank scans the shapes of its share (one extra pass over the
    source); the axes along which a field differs from sample 0 anywhere are agreed by
    every rank (JSON-able lists) and become ragged. A field may vary along one axis."""
    start, count = share_of(n, store.size, store.rank)
    varying: dict = {}
    payload = None
    try:
        for i in range(start, start + count):
            values = schema.field_values(sample_of(source, i, encode), i)
            for f, v in zip(schema.fields, values):
                if f.kind not in (TENSOR, NDARRAY):
                    f.validate(v, i)
                    continue
                shape = tuple(v.shape) if isinstance(v, (torch.Tensor, np.ndarray)) else None
                if shape is None or len(shape) != len(f.shape):
                    f.validate(v, i)  # raises with the sample and field named
                for axis, (a, b) in enumerate(zip(shape, f.shape)):
                    if a != b:
                        varying.setdefault(f.key, set()).add(axis)
    except Exception as e:  # noqa: BLE001 - every rank must learn of the failure
        payload = error_payload(e, store.rank)
    mine = {"error": payload, "varying": [[k, sorted(a)] for k, a in varying.items()]}
    results = store.allgather(mine)
    failed = [r["error"] for r in results if r["error"] is not None]
    if failed:
        raise rebuild_error(tuple(failed[0]))
    merged: dict = {}
    for r in results:
        for k, axes in r["varying"]:
            merged.setdefault(k, set()).update(axes)
    for f in schema.fields:
        axes = sorted(merged.get(f.key, ()))
        if len(axes) > 1:
            raise SchemaError(
                f"field {f.key!r} varies along axes {axes}; a ragged field may vary along one axis only"
            )
        if axes:
            f.make_ragged(axes[0], f"field {f.key!r}")
        elif f.count == 0:
            raise SchemaError(f"field {f.key!r}: shape {f.shape} has no elements in any sample")
