"""The one way pyddstore parses JSON it did not just write itself (snapshot manifests,
handshake records, allgather records): a size and a nesting limit checked before the
parser runs, and every failure raised as the caller's DDStoreError subclass (never
RecursionError, MemoryError or a crash of the C stack under a high recursion limit)."""

from __future__ import annotations

import json
import re

# Deeper than any document pyddstore writes (manifests nest about 6 levels).
MAX_DEPTH = 64

# Strings may hold brackets; they are blanked before the brackets are counted (the loop unrolled:
# a character at a time, a megabyte-long string of a method-2 record took 0.2 s).
_STRINGS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def nesting_depth(raw: bytes) -> int:
    """How deeply the arrays and objects of JSON text `raw` nest (0 for a scalar)."""
    brackets = _STRINGS.sub(b'""', raw).translate(None, _NOT_BRACKETS)
    depth = deepest = 0
    for b in brackets:
        if b in b"[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def loads(raw: bytes, what: str, error: type[Exception], max_bytes: int, max_depth: int = MAX_DEPTH):
    """The value of JSON text `raw`; `error` naming `what` when it is larger than `max_bytes`,
    nested deeper than `max_depth`, or not valid JSON."""
    if len(raw) > max_bytes:
        raise error(f"{what} is {len(raw)} bytes, more than the {max_bytes} allowed")
    depth = nesting_depth(raw)
    if depth > max_depth:
        raise error(f"{what} is corrupt: JSON nested {depth} levels deep, more than the {max_depth} allowed")
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise error(f"{what} is not valid JSON (corrupt or truncated: {e})") from None
