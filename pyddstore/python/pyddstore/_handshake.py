"""Method 2: a core group publishes each variable as one record file in
``handshake_dir``; extra jobs wait for it, validate it and attach.

Files are owner-only (directory 0700, files 0600) and written under a
temporary name then renamed, so a reader never sees half a record. Each
record carries the core job's host and pid, so a record left by a core job
that is gone is recognised as stale instead of used.

Access: every core job has a job token, ``DDSTORE_JOB_TOKEN`` when set (give
the extra job the same value), else a random one that core rank 0 writes to
an owner-only token file beside the records. A record holds the token's
SHA-256 and an HMAC, keyed by the token, over everything a reader uses (the
memory keys, addresses, counts, dtype). An extra job must present the token;
a wrong token, or a record whose keys or addresses were altered, is refused
with DDStoreAccessError before any read is posted."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import socket
import time
import urllib.parse

from ._errors import DDStoreAccessError, DDStoreError, DDStoreTimeoutError, DDStoreValueError

FORMAT_VERSION = 2
SUFFIX = ".ddstore.json"
TOKEN_ENV = "DDSTORE_JOB_TOKEN"
# What a reader relies on: covered by the record's HMAC.
SIGNED_FIELDS = ("name", "n_core", "group", "transport", "dtype", "row_bytes", "itemsize", "counts")
SIGNED_FIELDS += ("records", "node")


def record_path(directory: str, name: str, group_id: int = 0) -> str:
    stem = urllib.parse.quote(name, safe="")
    group = "" if group_id == 0 else f".g{group_id}"
    return os.path.join(directory, f"{stem}{group}{SUFFIX}")


def token_path(directory: str, group_id: int = 0) -> str:
    """The owner-only file holding a core job's random token (no variable's record can be named so)."""
    group = "" if group_id == 0 else f".g{group_id}"
    return os.path.join(directory, f".ddstore-token{group}")


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def record_mac(token: str, body: dict) -> str:
    """HMAC-SHA256, keyed by the job token, of the fields a reader relies on."""
    signed = {k: body.get(k) for k in SIGNED_FIELDS}
    canonical = json.dumps(signed, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(token.encode(), canonical, hashlib.sha256).hexdigest()


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


# The random token of each (handshake_dir, group) this process publishes in, with the
# number of live publishers using it: every store of a core job signs with one token,
# and the token file stays until the last of them withdraws.
_JOB_TOKENS: dict[tuple[str, int], list] = {}


class Publisher:
    """Core side: rank 0 of each group writes one record per variable."""

    def __init__(self, store, directory: str):
        self.store = store
        self.directory = directory
        self.paths: list[str] = []
        self.token_key: tuple[str, int] | None = None
        given = os.environ.get(TOKEN_ENV, "")
        if store.rank == 0:
            ensure_private_dir(directory)
        if given:
            self.token = given
            return
        # One token per core job, known to every core rank.
        key = (os.path.realpath(directory), store.group_id)
        known = _JOB_TOKENS.get(key)
        mine = known[0] if known else secrets.token_hex(16)
        self.token = store.allgather(mine if store.rank == 0 else None)[0]
        entry = _JOB_TOKENS.setdefault(key, [self.token, 0])
        entry[0] = self.token
        entry[1] += 1
        self.token_key = key
        if store.rank == 0:
            write_private(token_path(directory, store.group_id), self.token.encode())

    def publish(self, name: str) -> None:
        native = self.store._native
        records = [bytes(r) for r in native.records(name)]
        if self.store.rank != 0:
            return
        total, disp, itemsize = native.info(name)
        body = {
            "format": FORMAT_VERSION,
            "name": name,
            "token_sha256": token_digest(self.token),
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
        body["mac"] = record_mac(self.token, body)
        path = record_path(self.directory, name, self.store.group_id)
        write_private(path, json.dumps(body).encode())
        self.paths.append(path)

    def withdraw(self) -> None:
        """Removes this store's records, and the token file with the job's last store."""
        paths, self.paths = self.paths, []
        if self.token_key is not None:
            entry = _JOB_TOKENS[self.token_key]
            entry[1] -= 1
            if entry[1] == 0:
                del _JOB_TOKENS[self.token_key]
                if self.store.rank == 0:
                    paths.append(token_path(self.directory, self.store.group_id))
            self.token_key = None
        for p in paths:
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass


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


def load_json_object(raw: bytes, what: str) -> dict:
    """The JSON object in `raw`; DDStoreValueError naming `what` for anything else."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise DDStoreValueError(f"{what} is corrupt or truncated: {e}") from None
    if not isinstance(body, dict):
        raise DDStoreValueError(f"{what} is not a JSON object")
    return body


def parse_record(raw: bytes, path: str, n_core: int) -> dict:
    """Validates a record; every problem names the file and the field."""
    body = load_json_object(raw, f"handshake record {path}")
    if body.get("format") != FORMAT_VERSION or isinstance(body.get("format"), bool):
        raise DDStoreValueError(
            f"handshake record {path} has format {body.get('format')!r}, this pyddstore reads format "
            f"{FORMAT_VERSION}: use the same pyddstore version in the core and extra jobs"
        )
    required = {
        "name": str,
        "token_sha256": str,
        "mac": str,
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
    for key in ("token_sha256", "mac"):
        value = body[key]
        if len(value) != 64 or not all(c in "0123456789abcdef" for c in value):
            raise DDStoreValueError(f"handshake record {path}: field {key!r} is not a SHA-256 hex digest")
    if body["row_bytes"] <= 0 or body["itemsize"] <= 0:
        raise DDStoreValueError(f"handshake record {path}: row_bytes and itemsize must be positive")
    try:
        body["records"] = [bytes.fromhex(r) for r in body["records"]]
    except (TypeError, ValueError):
        raise DDStoreValueError(f"handshake record {path}: records are not hex strings") from None
    return body


def presented_token(directory: str, group_id: int, token: str | None) -> tuple[str, str]:
    """The token this extra job presents and where it came from: the argument,
    DDSTORE_JOB_TOKEN, else the core job's token file."""
    if token is not None:
        return str(token), "the token= argument"
    if os.environ.get(TOKEN_ENV):
        return os.environ[TOKEN_ENV], TOKEN_ENV
    path = token_path(directory, group_id)
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip(), path
    except FileNotFoundError:
        raise DDStoreAccessError(
            f"no job token to present: {TOKEN_ENV} is unset and {path} does not exist; set "
            f"{TOKEN_ENV} to the core job's {TOKEN_ENV}"
        ) from None
    except PermissionError:
        raise DDStoreAccessError(f"no permission to read the job token file {path}") from None


def check_access(body: dict, path: str, name: str, token: str, source: str) -> None:
    """Refuses a wrong token, then a record whose signed fields were altered."""
    if not hmac.compare_digest(token_digest(token), body["token_sha256"]):
        raise DDStoreAccessError(
            f"join('{name}'): refused: the job token presented ({source}) is not the token of the core "
            f"job that published {path}; give this job the core job's {TOKEN_ENV}"
        )
    if not hmac.compare_digest(record_mac(token, body), body["mac"]):
        raise DDStoreAccessError(
            f"join('{name}'): refused: record {path} fails its integrity check under this job token "
            "(its memory keys, addresses or counts were altered after the core job wrote it)"
        )


def join(store, name: str, timeout_s: float | None = None, token: str | None = None) -> dict:
    """Extra side: waits for ``name``'s record, checks it and the job token, attaches."""
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
    signed = dict(body, records=[r.hex() for r in body["records"]])
    presented, source = presented_token(store.handshake_dir, group, token)
    check_access(signed, path, name, presented, source)
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
