"""Method 2: a core group publishes each variable as one record file in
``handshake_dir``; extra jobs wait for it, validate it and attach.

Files are owner-only (directory 0700, files 0600) and written under a
temporary name then renamed, so a reader never sees half a record. Each
record carries the core job's random token, host and pid, so a record left
by a core job that is gone is recognised as stale instead of used."""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
import urllib.parse

from ._errors import DDStoreError, DDStoreTimeoutError, DDStoreValueError

FORMAT_VERSION = 1
SUFFIX = ".ddstore.json"


def record_path(directory: str, name: str, group_id: int = 0) -> str:
    stem = urllib.parse.quote(name, safe="")
    group = "" if group_id == 0 else f".g{group_id}"
    return os.path.join(directory, f"{stem}{group}{SUFFIX}")


def ensure_private_dir(directory: str) -> None:
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise DDStoreValueError(f"handshake_dir {directory!r} exists and is not a directory")
    os.makedirs(directory, mode=0o700, exist_ok=True)
    if not os.access(directory, os.W_OK | os.X_OK):
        raise DDStoreValueError(f"handshake_dir {directory!r} is not writable by this user")


def write_private(path: str, data: bytes) -> None:
    """Writes an owner-only file atomically (temporary name, then rename)."""
    tmp = f"{path}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


class Publisher:
    """Core side: rank 0 of each group writes one record per variable."""

    def __init__(self, store, directory: str):
        self.store = store
        self.directory = directory
        if store.rank == 0:
            ensure_private_dir(directory)
        # One token per core job, known to every core rank.
        self.token = store.allgather(secrets.token_hex(16) if store.rank == 0 else None)[0]
        self.paths: list[str] = []

    def publish(self, name: str) -> None:
        native = self.store._native
        records = [bytes(r) for r in native.records(name)]
        if self.store.rank != 0:
            return
        total, disp, itemsize = native.info(name)
        body = {
            "format": FORMAT_VERSION,
            "name": name,
            "token": self.token,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "created": time.time(),
            "n_core": self.store.size,
            "group": self.store.group_id,
            "transport": native.transport,
            "dtype": native.dtype(name),
            "row_bytes": native.row_bytes(name),
            "itemsize": itemsize,
            "counts": list(native.counts(name)),
            "records": [r.hex() for r in records],
            # Same-node extra jobs map these shares instead of reading them remotely.
            "node": list(native.node_records(name)),
        }
        path = record_path(self.directory, name, self.store.group_id)
        write_private(path, json.dumps(body).encode())
        self.paths.append(path)

    def withdraw(self) -> None:
        """Removes this job's records (the server is stopping)."""
        for p in self.paths:
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
        self.paths.clear()


def wait_and_read(path: str, timeout_s: float, missing: str) -> bytes:
    """The bytes of `path` once it exists; DDStoreTimeoutError(missing) after timeout_s."""
    deadline = time.monotonic() + timeout_s
    pause = 0.01
    while True:
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            if time.monotonic() >= deadline:
                raise DDStoreTimeoutError(missing) from None
            time.sleep(pause)
            pause = min(pause * 2, 0.5)
        except PermissionError:
            raise DDStoreError(f"no permission to read {path}") from None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def parse_record(raw: bytes, path: str, n_core: int) -> dict:
    """Validates a record; every problem names the file and the field."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise DDStoreValueError(f"handshake record {path} is corrupt or truncated: {e}") from None
    if not isinstance(body, dict):
        raise DDStoreValueError(f"handshake record {path} is not a JSON object")
    if body.get("format") != FORMAT_VERSION or isinstance(body.get("format"), bool):
        raise DDStoreValueError(
            f"handshake record {path} has format {body.get('format')!r}, this pyddstore reads format "
            f"{FORMAT_VERSION}: use the same pyddstore version in the core and extra jobs"
        )
    required = {
        "name": str,
        "token": str,
        "host": str,
        "pid": int,
        "n_core": int,
        "dtype": str,
        "row_bytes": int,
        "itemsize": int,
        "counts": list,
        "records": list,
    }
    for key, typ in required.items():
        if not isinstance(body.get(key), typ) or isinstance(body.get(key), bool):
            raise DDStoreValueError(
                f"handshake record {path}: field {key!r} is missing or not a {typ.__name__}"
            )
    if body["n_core"] != n_core:
        raise DDStoreValueError(
            f"handshake record {path} was published by {body['n_core']} core ranks, but n_core={n_core}"
        )
    if len(body["counts"]) != n_core or len(body["records"]) != n_core:
        raise DDStoreValueError(f"handshake record {path}: expected {n_core} counts and records")
    if not all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c < 2**62 for c in body["counts"]):
        raise DDStoreValueError(f"handshake record {path}: counts must be non-negative integers")
    if not (0 < body["pid"] < 2**31) or body["row_bytes"] >= 2**40 or body["itemsize"] > body["row_bytes"]:
        raise DDStoreValueError(f"handshake record {path}: pid, row_bytes or itemsize out of range")
    if body["row_bytes"] <= 0 or body["itemsize"] <= 0:
        raise DDStoreValueError(f"handshake record {path}: row_bytes and itemsize must be positive")
    try:
        body["records"] = [bytes.fromhex(r) for r in body["records"]]
    except (TypeError, ValueError):
        raise DDStoreValueError(f"handshake record {path}: records are not hex strings") from None
    return body


def join(store, name: str, timeout_s: float | None = None) -> dict:
    """Extra side: waits for ``name``'s record, checks it, attaches."""
    if timeout_s is None:
        timeout_s = float(os.environ.get("DDSTORE_HANDSHAKE_TIMEOUT_S", "") or 300)
    group = int(os.environ.get("DDSTORE_CORE_GROUP", "0") or 0)
    path = record_path(store.handshake_dir, name, group)
    raw = wait_and_read(
        path,
        timeout_s,
        f"join('{name}'): no record {path} after {timeout_s:g} s: is the core job running with "
        f"handshake_dir={store.handshake_dir!r}? (DDSTORE_HANDSHAKE_TIMEOUT_S sets the wait)",
    )
    body = parse_record(raw, path, store.n_core)
    if body["name"] != name:
        raise DDStoreValueError(f"handshake record {path} is for {body['name']!r}, not {name!r}")
    if body["host"] == socket.gethostname() and not _pid_alive(body["pid"]):
        raise DDStoreError(
            f"join('{name}'): stale record {path}: its core job (pid {body['pid']} on {body['host']}) is no "
            "longer running; start the core job, or clear the handshake_dir of old records"
        )
    node = body.get("node")
    node = node if isinstance(node, list) and all(isinstance(n, (str, type(None))) for n in node) else None
    store._native.attach(
        name, body["dtype"], body["row_bytes"], body["itemsize"], body["counts"], body["records"], node
    )
    return body
