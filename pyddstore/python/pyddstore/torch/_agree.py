"""Rank agreement: every rank learns whether all ranks succeeded before it goes on.

A rank that fails sends its error as data (a kind and a message); every other rank raises the
same kind of error naming the rank that failed, so a collective step never leaves some ranks
waiting for the others.
"""

from __future__ import annotations

from typing import Any

from pyddstore import DDStoreError, DDStoreFileError, DDStoreTimeoutError

from ._errors import SnapshotError
from ._field import SchemaError, SchemaTypeError


def error_payload(e: BaseException, rank: int) -> tuple[str, str]:
    """(kind, message) of a failure, as data another rank turns back into an error of the
    same kind (rebuild_error); rank -1: a forked load worker of this rank."""
    if isinstance(e, SnapshotError):
        return "snapshot", f"rank {rank}: {e}"
    if isinstance(e, DDStoreFileError):
        return "file", f"rank {rank}: {e}"
    if isinstance(e, DDStoreTimeoutError):
        return "timeout", f"rank {rank}: {e}"
    if isinstance(e, SchemaTypeError):
        return "type", str(e)
    if isinstance(e, SchemaError):
        return "value", str(e)
    return "other", f"rank {rank}: {type(e).__name__}: {e}"


def rebuild_error(payload: tuple[str, str]) -> Exception:
    """The error another rank (or a load worker) reported with error_payload."""
    kind, msg = payload
    if kind == "type":
        return SchemaTypeError(msg)
    if kind == "value":
        return SchemaError(msg)
    if kind == "snapshot":
        return SnapshotError(msg)
    if kind == "file":
        return DDStoreFileError(msg)
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
