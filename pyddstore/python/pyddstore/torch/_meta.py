"""{handshake_dir}/{name}.meta.json: what a method-2 core group publishes (the fields and the
sample count) so that a DistDatasetReader in another job can read its dataset."""

from __future__ import annotations

import json
import os

from pyddstore import DDStoreError, DDStoreValueError
from pyddstore._handshake import load_json_object, read_once, wait_and_read, write_private

from ._schema import META_VERSION, Schema


def write_meta(hs: str, name: str, n_core: int, n: int, schema: Schema) -> None:
    """{handshake_dir}/{name}.meta.json: what a DistDatasetReader needs to read the fields."""
    if not hs:
        raise DDStoreValueError("method=2 needs handshake_dir= (or DDSTORE_HANDSHAKE_DIR)")
    meta = {"version": META_VERSION, "name": name, "n_core": n_core, "num_samples": n, **schema.to_json()}
    path = os.path.join(hs, f"{name}.meta.json")
    write_private(path, json.dumps(meta, indent=1).encode())  # owner-only, atomic


def read_meta(path: str, timeout: float, comm=None) -> dict:
    """Waits up to timeout seconds for a meta file written by a core group and reads it (once
    per extra job with `comm`, a `RecordComm`: see pyddstore._handshake.read_once)."""
    raw = read_once(
        comm,
        lambda: wait_and_read(
            path,
            timeout,
            f"{path} did not appear within {timeout:.0f} s: is the core group (DistDataset with "
            "method=2 and the same handshake_dir) running?",
        ),
    )
    meta = load_json_object(raw, path)
    if meta.get("version") != META_VERSION or isinstance(meta.get("version"), bool):
        raise DDStoreValueError(f"{path}: meta version {meta.get('version')!r} is not {META_VERSION}")
    for key in ("n_core", "num_samples"):
        value = meta.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**62:
            raise DDStoreValueError(f"{path}: {key!r} must be a non-negative integer, got {value!r}")
    try:
        Schema.from_json(meta)
    except DDStoreError:
        raise
    except Exception as e:  # noqa: BLE001 - any malformed field description
        what = f"{type(e).__name__}: {e}"
        raise DDStoreValueError(f"{path}: the field descriptions are malformed ({what})") from None
    return meta
