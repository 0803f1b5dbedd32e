"""The data-only encoding of the Python-object allgather (``PyDDStore.allgather``,
``FileComm.allgather``): JSON, with bytes and non-JSON dicts tagged, so nothing a
peer (or a file) sends can run code when decoded.

Values: None, bool, int, float, str, bytes, list/tuple (decoded as list), and
dicts with str keys. Anything else is refused when sending with DDStoreTypeError;
a record over ``MAX_BYTES`` or nested deeper than ``MAX_DEPTH`` is refused on
both sides."""

from __future__ import annotations

import base64
import json

from . import _json
from ._errors import DDStoreTypeError, DDStoreValueError

MAX_BYTES = 64 << 20
MAX_DEPTH = 32
_BYTES, _DICT = "$b", "$d"


def _tag(obj, depth: int):
    if depth > MAX_DEPTH:
        raise DDStoreTypeError(f"allgather: the value is nested deeper than {MAX_DEPTH} levels")
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return {_BYTES: base64.b64encode(bytes(obj)).decode()}
    if isinstance(obj, (list, tuple)):
        return [_tag(v, depth + 1) for v in obj]
    if isinstance(obj, dict):
        if not all(isinstance(k, str) for k in obj):
            raise DDStoreTypeError("allgather: dict keys must be str")
        return {_DICT: {k: _tag(v, depth + 1) for k, v in obj.items()}}
    raise DDStoreTypeError(
        f"allgather: a {type(obj).__name__} cannot be sent: values are None, bool, int, float, str, "
        "bytes, lists/tuples and dicts with str keys (data only, no pickles)"
    )


def _untag(obj, depth: int, rank: int):
    if depth > MAX_DEPTH:
        raise DDStoreValueError(f"allgather: rank {rank}'s record is nested deeper than {MAX_DEPTH} levels")
    if isinstance(obj, list):
        return [_untag(v, depth + 1, rank) for v in obj]
    if isinstance(obj, dict):
        if len(obj) == 1 and _BYTES in obj and isinstance(obj[_BYTES], str):
            try:
                return base64.b64decode(obj[_BYTES], validate=True)
            except ValueError:
                raise DDStoreValueError(f"allgather: rank {rank}'s record holds malformed bytes") from None
        if len(obj) == 1 and isinstance(obj.get(_DICT), dict):
            return {k: _untag(v, depth + 1, rank) for k, v in obj[_DICT].items()}
        raise DDStoreValueError(f"allgather: rank {rank}'s record holds an untagged object")
    return obj


def encode(obj) -> bytes:
    raw = json.dumps(_tag(obj, 0), separators=(",", ":"), allow_nan=True).encode()
    if len(raw) > MAX_BYTES:
        raise DDStoreValueError(f"allgather: the value encodes to {len(raw)} bytes, more than {MAX_BYTES}")
    return raw


def decode(raw: bytes, rank: int):
    # A tagged dict is two JSON levels.
    what = f"allgather: rank {rank}'s record"
    value = _json.loads(raw, what, DDStoreValueError, MAX_BYTES, 2 * MAX_DEPTH + 2)
    return _untag(value, 0, rank)


def gather(native_comm, obj) -> list:
    """Every rank's `obj` (data only), in rank order."""
    mine = encode(obj)
    return [decode(bytes(b), r) for r, b in enumerate(native_comm.allgather(mine))]
