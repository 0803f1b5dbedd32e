"""Method 2: a core group publishes each variable as one record file in
``handshake_dir``; extra jobs wait for it, validate it and attach. What every variable of a
store shares (the provider and each core rank's endpoint address) is published once per store,
in an address file (``+peers-{id}{.gN}.ddstore.json``, a name no variable's quoting gives) that
each record names; a record holds per core rank only its packed share (base, key, length,
registered length, gather flag: 33 bytes, base64), so its size does not depend on the address.

Every file operation goes through ``_native.HandshakeDir`` (Rust,
``ddstore_core::private_dir``): the directory must be owned by this user and
not writable by group or others; files are written owner-only under random
temporary names then renamed, and read only if they are regular files of
this user, of bounded size. Nothing read is unpickled or evaluated: records
are JSON, checked field by field. A core job holds a lock (``flock``) on each
name it publishes for its whole life, so a second live core job cannot
publish the same name in the same directory; a dead job's lock is taken over
and its records removed. Each record carries the core job's host and pid, so
a record left by a core job that is gone is recognised as stale.

Access: every core job has a job token, ``DDSTORE_JOB_TOKEN`` when set (give
the extra job the same value), else a random one that core rank 0 writes to
an owner-only token file beside each record. A record holds the token's
SHA-256 and an HMAC, keyed by the token, over everything a reader uses (the
memory keys, addresses, counts, dtype). An extra job must present the token;
a wrong token, or a record whose keys or addresses were altered, is refused
with DDStoreAccessError before any read is posted. The address file carries its own HMAC over
its addresses, and the record the id and HMAC of the address file it was written with (signed),
so an address file altered, or swapped for another store's, is refused too."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import socket
import time
import urllib.parse

from . import _errors, _json, _native, _wire
from ._errors import (
    DDStoreAccessError,
    DDStoreError,
    DDStoreStaleError,
    DDStoreTimeoutError,
    DDStoreValueError,
)
from ._kinds import RAGGED_VALUES, ragged_parts

FORMAT_VERSION = 4
SUFFIX = ".ddstore.json"
TOKEN_ENV = "DDSTORE_JOB_TOKEN"
# What a reader relies on: covered by the record's HMAC.
SIGNED_FIELDS = ("name", "n_core", "group", "transport", "dtype", "row_bytes", "itemsize", "counts")
SIGNED_FIELDS += ("peers", "shares", "node", "unit_shape")
# What a reader relies on of an address file: covered by its HMAC.
PEERS_SIGNED_FIELDS = ("kind", "id", "n_core", "group", "transport", "provider", "addrs")
# Longest endpoint address and provider name an address file may give (fi_getname gives far less).
MAX_ADDR_BYTES = 1024
MAX_PROVIDER_BYTES = 256


# Largest record, meta or token file read back (a record grows with the number of core ranks).
RECORD_CAP = 64 << 20
TOKEN_CAP = 4096
# Longest file stem a name may give: the stem plus ".token" and a temporary suffix fit NAME_MAX.
MAX_STEM = 200


def record_stem(name: str, group_id: int = 0) -> str:
    """``{quoted name}{.gN}.ddstore``: the record is stem + ".json", its lock stem + ".lock" and
    the job token beside it "." + stem + ".token"."""
    group = "" if group_id == 0 else f".g{group_id}"
    return f"{urllib.parse.quote(name, safe='')}{group}.ddstore"


def check_name_length(name: str, group_id: int = 0) -> None:
    """Names whose files would not fit the file system's name limit are refused up front."""
    stem = record_stem(name, group_id)
    if len(stem.encode()) > MAX_STEM:
        raise DDStoreValueError(
            f"variable name {name[:40]!r}... is too long for method 2: its record file name would be "
            f"{len(stem.encode())} bytes after quoting, at most {MAX_STEM} fit"
        )


def record_path(directory: str, name: str, group_id: int = 0) -> str:
    return os.path.join(directory, record_stem(name, group_id) + ".json")


def peers_stem(peers_id: str, group_id: int = 0) -> str:
    """The stem of a store's address file: ``+`` is quoted in every variable's stem, so no
    variable's record, lock or token file can take its name."""
    group = "" if group_id == 0 else f".g{group_id}"
    return f"+peers-{peers_id}{group}.ddstore"


def peers_path(directory: str, peers_id: str, group_id: int = 0) -> str:
    return os.path.join(directory, peers_stem(peers_id, group_id) + ".json")


def token_path(directory: str, name: str, group_id: int = 0) -> str:
    """The owner-only file holding the core job's token beside `name`'s record."""
    return os.path.join(directory, "." + record_stem(name, group_id) + ".token")


def open_dir(directory: str) -> _native.HandshakeDir:
    """The verified handshake directory (created 0700 if missing); DDStoreAccessError otherwise."""
    return _native.HandshakeDir(os.fspath(directory), True)


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def record_mac(token: str, body: dict, fields: tuple = SIGNED_FIELDS) -> str:
    """HMAC-SHA256, keyed by the job token, of the fields a reader relies on."""
    signed = {k: body.get(k) for k in fields}
    canonical = json.dumps(signed, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(token.encode(), canonical, hashlib.sha256).hexdigest()


def signed_body(token: str, fields: tuple, **body) -> dict:
    """A file's body: `body` with the format, the token's digest, the writer (host, pid, time)
    and the HMAC, keyed by `token`, over `fields`."""
    body = {"format": FORMAT_VERSION, **body, "token_sha256": token_digest(token)}
    body.update(host=socket.gethostname(), pid=os.getpid(), created=time.time())
    body["mac"] = record_mac(token, body, fields)
    return body


def peers_body(token: str, peers_id: str, provider: str, addrs: list, **store) -> dict:
    """A core store's address file: the provider and, per core rank, its endpoint's address (hex);
    `store` gives n_core, group and transport."""
    addrs = [a.hex() for a in addrs]
    return signed_body(
        token, PEERS_SIGNED_FIELDS, kind="peers", id=peers_id, **store, provider=provider, addrs=addrs
    )


def record_body(token: str, peers: dict, shares: bytes, node: list, **variable) -> dict:
    """A variable's record: `variable` (name, n_core, group, transport, dtype, row_bytes, itemsize,
    counts, unit_shape), the reference of its store's address file (`peers`, see
    Publisher.publish_peers), per core rank its packed share (base64) and its same-node locator
    (`node`, JSON or None per rank: packed, each host once; None when no rank has one)."""
    shares = base64.b64encode(shares).decode()
    packed_node = None
    if any(n is not None for n in node):
        hosts, packed = _native.pack_node_records(node)
        packed_node = {"hosts": hosts, "packed": base64.b64encode(packed).decode()}
    return signed_body(token, SIGNED_FIELDS, **variable, peers=peers, shares=shares, node=packed_node)


def ensure_private_dir(directory: str) -> None:
    open_dir(directory)


def write_private(path: str, data: bytes) -> None:
    """Writes an owner-only file atomically in a verified directory."""
    directory, name = os.path.split(os.fspath(path))
    open_dir(directory or ".").write(name, bytes(data))


def holder_text() -> str:
    return f"host {socket.gethostname()}, pid {os.getpid()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}"


def clean_dead(hdir) -> None:
    """Takes every name lock whose holder is dead and removes what that job left."""
    names = hdir.list()
    for lock in [n for n in names if n.endswith(".ddstore.lock")]:
        got = hdir.try_lock(lock, "cleaning")
        if isinstance(got, str):
            continue  # a live job holds it
        stem = lock[: -len(".lock")]
        for n in names:
            if n in (stem + ".json", "." + stem + ".token") or n.startswith(
                ("." + stem + ".json.tmp-", "." + stem + ".token.tmp-")
            ):
                hdir.remove(n)
        got.release()


# The random token of each (handshake_dir, group) this process publishes in, with the
# number of live publishers using it: every store of a core job signs with one token,
# and the token file stays until the last of them withdraws.
_JOB_TOKENS: dict[tuple[str, int], list] = {}


class Publisher:
    """Core side: rank 0 of each group holds each name's lock and writes its record."""

    def __init__(self, store, directory: str):
        self.store = store
        self.directory = directory
        self.published: list[str] = []
        self.locks: dict = {}
        self.token_key: tuple[str, int] | None = None
        self.hdir = None
        # The address files this store published (their stems and locks), and the last one's
        # addresses with its reference ({"id", "mac"}) that records carry.
        self.peer_files: list[tuple[str, object]] = []
        self.peers: tuple | None = None
        problem = None
        if store.rank == 0:
            try:
                self.hdir = open_dir(directory)
                clean_dead(self.hdir)
            except DDStoreError as e:
                problem = str(e)
        given = store.settings.job_token or ""
        # One token per core job, known to every core rank; the same exchange tells every
        # rank whether rank 0 could use the directory.
        key = (os.path.realpath(directory), store.group_id)
        known = _JOB_TOKENS.get(key)
        mine = None
        if store.rank == 0:
            mine = {"problem": problem, "token": given or (known[0] if known else secrets.token_hex(16))}
        agreed = store.allgather(mine)[0]
        if agreed["problem"] is not None:
            raise DDStoreAccessError(agreed["problem"])
        self.token = agreed["token"]
        # Requests between the job's processes (and its extra jobs') are MACed under a key
        # derived from the token: a party without it is never answered.
        store._native.set_secret(self.token.encode())
        if given:
            return
        entry = _JOB_TOKENS.setdefault(key, [self.token, 0])
        entry[0] = self.token
        entry[1] += 1
        self.token_key = key

    def reserve(self, *names: str) -> None:
        """Collective, before `names` are created: every rank checks the names' length, rank 0
        takes their locks (one exchange for all); a live job holding one is refused on every
        rank."""
        for name in names:
            check_name_length(name, self.store.group_id)
        problem = None
        for name in names:
            if self.store.rank != 0 or name in self.locks or problem is not None:
                continue
            stem = record_stem(name, self.store.group_id)
            try:
                got = self.hdir.try_lock(stem + ".lock", holder_text())
                if isinstance(got, str):
                    problem = (
                        f"'{name}' is already published in {self.directory} by a live core job ({got}): "
                        "use another name or handshake_dir, or stop that job"
                    )
                else:
                    self.locks[name] = got
            except DDStoreError as e:
                problem = str(e)
        agreed = self.store.allgather(problem)[0]
        if agreed is not None:
            raise DDStoreAccessError(agreed)

    def publish_peers(self, provider: str, addrs: list) -> dict:
        """The reference ({"id", "mac"}) of the address file holding `provider` and `addrs`:
        written (and its name locked) once per store, again only if a variable's addresses
        differ from the last file's."""
        if self.peers is not None and self.peers[0] == (provider, addrs):
            return self.peers[1]
        peers_id = secrets.token_hex(8)
        stem = peers_stem(peers_id, self.store.group_id)
        lock = self.hdir.try_lock(stem + ".lock", holder_text())
        if isinstance(lock, str):  # a fresh random name: only a hostile party holds it
            raise DDStoreAccessError(f"address file lock {stem}.lock in {self.directory} is held ({lock})")
        self.peer_files.append((stem, lock))
        body = peers_body(
            self.token,
            peers_id,
            provider,
            addrs,
            n_core=self.store.size,
            group=self.store.group_id,
            transport=self.store._native.transport,
        )
        self.hdir.write(stem + ".json", json.dumps(body).encode())
        self.peers = ((provider, addrs), {"id": peers_id, "mac": body["mac"]})
        return self.peers[1]

    def publish(self, name: str) -> None:
        if self.store.rank != 0:
            return
        native = self.store._native
        provider, addrs, shares = _native.split_share_records([bytes(r) for r in native.records(name)])
        peers = self.publish_peers(provider, [bytes(a) for a in addrs])
        total, disp, itemsize = native.info(name)
        # A ragged variable's values part: the shape of one unit (what a row's entries look like).
        values = name.endswith(RAGGED_VALUES)
        unit = self.store._ragged_units.get(name[: -len(RAGGED_VALUES)]) if values else None
        body = record_body(
            self.token,
            peers,
            shares,
            # Same-node extra jobs map these shares instead of reading them remotely.
            list(native.node_records(name)),
            name=name,
            n_core=self.store.size,
            group=self.store.group_id,
            transport=native.transport,
            dtype=native.dtype(name),
            row_bytes=native.row_bytes(name),
            itemsize=itemsize,
            counts=list(native.counts(name)),
            unit_shape=None if unit is None else [int(d) for d in unit],
        )
        stem = record_stem(name, self.store.group_id)
        if not self.store.settings.job_token:
            self.hdir.write("." + stem + ".token", self.token.encode())
        self.hdir.write(stem + ".json", json.dumps(body).encode())
        self.published.append(name)

    def withdraw(self) -> None:
        """Removes this store's records and token files, then releases its locks."""
        published, self.published = self.published, []
        if self.token_key is not None:
            entry = _JOB_TOKENS[self.token_key]
            entry[1] -= 1
            if entry[1] == 0:
                del _JOB_TOKENS[self.token_key]
            self.token_key = None
        if self.hdir is None:
            return
        for name in published:
            stem = record_stem(name, self.store.group_id)
            self.hdir.remove(stem + ".json")
            self.hdir.remove("." + stem + ".token")
        peer_files, self.peer_files, self.peers = self.peer_files, [], None
        for stem, _ in peer_files:
            self.hdir.remove(stem + ".json")
        locks, self.locks = self.locks, {}
        for lock in [*locks.values(), *(lock for _, lock in peer_files)]:
            lock.release()


class RecordComm:
    """An extra job's communicator as its members share what they read of the core job's files:
    one member reads (rank 0; with a file communicator, rank 0 of each node, as the merged
    files of a node-spanning group would be read by every rank again) and gives every member
    its bytes (see `read_once`)."""

    def __init__(self, extra_comm, settings):
        from ._comm import resolve_comm

        comm = resolve_comm(extra_comm, settings)
        if comm.kind == "file" and comm.size > 1:
            host = int.from_bytes(hashlib.sha256(socket.gethostname().encode()).digest()[:7], "little")
            comm = comm.split(host, comm.rank)
        self.native = comm

    @classmethod
    def of(cls, extra_comm, settings) -> RecordComm | None:
        """`extra_comm` (a communicator the extra job's members share, or None: each reads) as a
        RecordComm; collective over it."""
        if extra_comm is None or isinstance(extra_comm, RecordComm):
            return extra_comm
        return cls(extra_comm, settings)


def read_once(comm: RecordComm | None, read):
    """`read()` on one member of the extra job (see RecordComm; every member when `comm` is
    None) and what it returned on every member, or the DDStoreError it raised raised on every
    member. Collective over `comm`."""
    if comm is None or comm.native.size == 1:
        return read()
    result = None
    if comm.native.rank == 0:
        try:
            result = {"data": read()}
        except DDStoreError as e:
            result = {"error": [type(e).__name__, str(e)]}
    got = _wire.gather(comm.native, result)[0]
    if "error" in got:
        kind = getattr(_errors, got["error"][0], DDStoreError)
        raise (kind if isinstance(kind, type) and issubclass(kind, DDStoreError) else DDStoreError)(
            got["error"][1]
        )
    return got["data"]


def wait_and_read(path: str, timeout_s: float, missing: str, cap: int = RECORD_CAP) -> bytes:
    """The bytes of `path` once it exists; DDStoreTimeoutError(missing) after timeout_s.
    Whatever sits at the path (a symlink, FIFO, device, directory, another user's or an
    oversized file) is refused with a DDStoreError, never followed or waited on."""
    directory, name = os.path.split(os.fspath(path))
    raw = open_dir(directory or ".").wait_for(name, float(timeout_s), cap)
    if raw is None:
        raise DDStoreTimeoutError(missing)
    return raw


def _pid_alive(pid: int) -> bool:
    """The one liveness check (ddstore_core::private_dir::pid_alive); a pid outside 1..2^31 is
    no process."""
    return 0 < pid < 2**31 and _native.pid_alive(pid)


def load_json_object(raw: bytes, what: str) -> dict:
    """The JSON object in `raw`; DDStoreValueError naming `what` for anything else."""
    body = _json.loads(raw, what, DDStoreValueError, RECORD_CAP)
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
        "peers": dict,
        "shares": str,
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
    if len(body["counts"]) != n_core:
        raise DDStoreValueError(f"handshake record {path}: expected {n_core} counts")
    node = body.get("node")
    if node is not None and not (
        isinstance(node, dict)
        and sorted(node) == ["hosts", "packed"]
        and isinstance(node["hosts"], list)
        and all(isinstance(h, str) for h in node["hosts"])
        and isinstance(node["packed"], str)
    ):
        raise DDStoreValueError(
            f"handshake record {path}: field 'node' must be null or the same-node locators' hosts "
            "(strings) and packed bytes (base64)"
        )
    ref = body["peers"]
    if sorted(ref) != ["id", "mac"] or not _is_hex(ref["id"], 16) or not _is_hex(ref["mac"], 64):
        raise DDStoreValueError(
            f"handshake record {path}: field 'peers' must be the id (16 hex digits) and mac (64) of "
            "its core job's address file"
        )
    if not all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c < 2**62 for c in body["counts"]):
        raise DDStoreValueError(f"handshake record {path}: counts must be non-negative integers")
    if not (0 < body["pid"] < 2**31) or body["row_bytes"] >= 2**40 or body["itemsize"] > body["row_bytes"]:
        raise DDStoreValueError(f"handshake record {path}: pid, row_bytes or itemsize out of range")
    check_digests(body, path)
    body["packed_shares"] = packed_field(body["shares"], path, "shares", n_core, _native.PACKED_SHARE_BYTES)
    if node is not None:
        packed = packed_field(node["packed"], path, "node", n_core, _native.PACKED_LOCATOR_BYTES)
        try:
            body["node_records"] = _native.unpack_node_records(node["hosts"], packed)
        except DDStoreError as e:
            raise DDStoreValueError(f"handshake record {path}: field 'node': {e}") from None
    if body["row_bytes"] <= 0 or body["itemsize"] <= 0:
        raise DDStoreValueError(f"handshake record {path}: row_bytes and itemsize must be positive")
    unit = body.get("unit_shape")
    if unit is not None:
        if not isinstance(unit, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**40 for d in unit
        ):
            raise DDStoreValueError(f"handshake record {path}: unit_shape must be a list of integers >= 0")
        elements = 1
        for d in unit:
            elements *= d
        if elements and elements * body["itemsize"] != body["row_bytes"]:
            raise DDStoreValueError(
                f"handshake record {path}: unit_shape {unit} of {body['itemsize']}-byte items does not "
                f"make rows of {body['row_bytes']} bytes"
            )
    return body


def packed_field(text: str, path: str, field: str, n_core: int, per_rank: int) -> bytes:
    """The bytes of a record's base64 `field`, which must hold `per_rank` bytes per core rank."""
    try:
        packed = base64.b64decode(text, validate=True)
    except ValueError:
        raise DDStoreValueError(f"handshake record {path}: field {field!r} is not base64") from None
    if len(packed) != n_core * per_rank:
        raise DDStoreValueError(
            f"handshake record {path}: field {field!r} holds {len(packed)} bytes, expected {per_rank} "
            f"per core rank ({n_core})"
        )
    return packed


def _is_hex(value, digits: int) -> bool:
    return isinstance(value, str) and len(value) == digits and all(c in "0123456789abcdef" for c in value)


def check_digests(body: dict, path: str) -> None:
    for key in ("token_sha256", "mac"):
        if not _is_hex(body[key], 64):
            raise DDStoreValueError(f"handshake record {path}: field {key!r} is not a SHA-256 hex digest")


def parse_peers(raw: bytes, path: str, n_core: int, group: int) -> dict:
    """Validates a core job's address file (see Publisher.publish_peers); every problem names the
    file and the field. Its addresses come back as bytes."""
    body = load_json_object(raw, f"handshake address file {path}")
    if body.get("format") != FORMAT_VERSION or isinstance(body.get("format"), bool):
        raise DDStoreValueError(
            f"handshake address file {path} has format {body.get('format')!r}, this pyddstore reads "
            f"format {FORMAT_VERSION}: use the same pyddstore version in the core and extra jobs"
        )
    required = {"kind": str, "id": str, "token_sha256": str, "mac": str, "n_core": int, "group": int}
    required.update(provider=str, addrs=list)
    for key, typ in required.items():
        if not isinstance(body.get(key), typ) or isinstance(body.get(key), bool):
            raise DDStoreValueError(
                f"handshake address file {path}: field {key!r} is missing or not a {typ.__name__}"
            )
    check_digests(body, path)
    if body["kind"] != "peers" or not _is_hex(body["id"], 16):
        raise DDStoreValueError(f"handshake address file {path}: not a core job's address file")
    if body["n_core"] != n_core or body["group"] != group or len(body["addrs"]) != n_core:
        raise DDStoreValueError(
            f"handshake address file {path} holds {len(body['addrs'])} addresses of {body['n_core']} "
            f"core ranks of group {body['group']}, expected {n_core} of group {group}"
        )
    if not 0 < len(body["provider"].encode()) <= MAX_PROVIDER_BYTES:
        raise DDStoreValueError(f"handshake address file {path}: provider name out of range")
    addrs = []
    for rank, a in enumerate(body["addrs"]):
        if not isinstance(a, str) or not 0 < len(a) <= 2 * MAX_ADDR_BYTES:
            raise DDStoreValueError(
                f"handshake address file {path}: core rank {rank}'s address is not 1 to "
                f"{MAX_ADDR_BYTES} bytes of hex"
            )
        try:
            addrs.append(bytes.fromhex(a))
        except ValueError:
            raise DDStoreValueError(
                f"handshake address file {path}: core rank {rank}'s address is not hex"
            ) from None
    return dict(body, addrs=addrs)


def check_peers(peers: dict, ppath: str, body: dict, path: str, name: str, token: str) -> None:
    """Refuses an address file the job token did not sign, or not the one `body` (the record of
    `name` at `path`, already checked) was written with."""
    signed = dict(peers, addrs=[a.hex() for a in peers["addrs"]])
    if not hmac.compare_digest(token_digest(token), peers["token_sha256"]) or not hmac.compare_digest(
        record_mac(token, signed, PEERS_SIGNED_FIELDS), peers["mac"]
    ):
        raise DDStoreAccessError(
            f"join('{name}'): refused: address file {ppath} fails its integrity check under this job "
            "token (its addresses were altered after the core job wrote it)"
        )
    if peers["id"] != body["peers"]["id"] or not hmac.compare_digest(peers["mac"], body["peers"]["mac"]):
        raise DDStoreAccessError(
            f"join('{name}'): refused: address file {ppath} is not the one record {path} was written "
            "with (another store's or an older one)"
        )


def share_records(peers: dict, body: dict, path: str, ppath: str) -> list:
    """Every core rank's share record of `body` (the record at `path`) with the addresses of
    `peers` (the address file at `ppath`)."""
    try:
        return _native.join_share_records(peers["provider"], peers["addrs"], body["packed_shares"])
    except DDStoreError as e:
        raise DDStoreValueError(f"handshake record {path} with address file {ppath}: {e}") from None


def presented_token(directory: str, name: str, group_id: int, token: str | None, settings) -> tuple[str, str]:
    """The token this extra job presents and where it came from: the argument,
    DDSTORE_JOB_TOKEN (from `settings`), else the token file beside the core job's record."""
    if token is not None:
        return str(token), "the token= argument"
    if settings.job_token:
        return settings.job_token, TOKEN_ENV
    path = token_path(directory, name, group_id)
    raw = open_dir(directory).read(os.path.basename(path), TOKEN_CAP)
    if raw is None:
        raise DDStoreAccessError(
            f"no job token to present: {TOKEN_ENV} is unset and {path} does not exist; set "
            f"{TOKEN_ENV} to the core job's {TOKEN_ENV}"
        )
    return raw.decode("utf-8", errors="replace").strip(), path


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


def joined_from(part: str, body: dict) -> dict:
    """What an extra member keeps of the record it joined `part` from, to tell later whether
    the core job freed that variable (see freed_record)."""
    return {"part": part, "mac": body["mac"], "host": body["host"], "pid": body["pid"]}


def freed_record(directory: str, group: int, joined: list) -> str | None:
    """Why the variable joined from records `joined` (joined_from's) is no longer the one the
    core job publishes: its record was removed or replaced while the core's process lives;
    None when every record is still the one joined, or the core's process (on this host) is
    gone (a stopped core: the read's own error says so)."""
    hdir = open_dir(directory)
    for j in joined:
        path = record_path(directory, j["part"], group)
        try:
            raw = hdir.read(os.path.basename(path), RECORD_CAP)
            now = None if raw is None else load_json_object(raw, path).get("mac")
        except DDStoreError:
            now = ""  # unreadable or corrupt: not the record joined
        if now == j["mac"]:
            continue
        if j["host"] == socket.gethostname() and not _pid_alive(j["pid"]):
            return None
        what = "removed" if now is None else "replaced by another variable of the same name"
        return f"its record {path} was {what}"
    return None


def join(store, name: str, timeout_s: float | None = None, token: str | None = None) -> dict:
    """Extra side: waits for ``name``'s record, checks it and the job token, reads the core
    store's address file it names (once per extra store), attaches."""
    if timeout_s is None:
        timeout_s = store.settings.handshake_timeout_s
    group = store.settings.core_group
    check_name_length(name, group)
    path = record_path(store.handshake_dir, name, group)

    def presented_for(got: dict) -> tuple:
        """The token this member presents and where it came from (see presented_token)."""
        if got["token"] is not None:
            return tuple(got["token"])
        return presented_token(store.handshake_dir, name, group, token, store.settings)

    def checked(got: dict) -> tuple[dict, str]:
        """The record read, and the token presented: refused for a wrong token, an altered
        record, another name or a core job gone (on this host)."""
        body = parse_record(got["raw"], path, store.n_core)
        presented, source = presented_for(got)
        check_access(body, path, name, presented, source)
        if body["name"] != name:
            raise DDStoreValueError(f"handshake record {path} is for {body['name']!r}, not {name!r}")
        if body["host"] == socket.gethostname() and not _pid_alive(body["pid"]):
            raise DDStoreError(
                f"join('{name}'): stale record {path}: its core job (pid {body['pid']} on "
                f"{body['host']}) is no longer running; start the core job, or clear the "
                "handshake_dir of old records"
            )
        return body, presented

    def read() -> dict:
        raw = wait_and_read(
            path,
            timeout_s,
            f"join('{name}'): no record {path} after {timeout_s:g} s: is the core job running with "
            f"handshake_dir={store.handshake_dir!r}? (DDSTORE_HANDSHAKE_TIMEOUT_S sets the wait)",
        )
        got = {"raw": raw, "peers": None, "token": None}
        if token is None and not store.settings.job_token:
            got["token"] = list(presented_token(store.handshake_dir, name, group, None, store.settings))
        # The reader's problems are every member's: a refused record reads no address file.
        body, presented = checked(got)
        ref = body["peers"]
        if (ref["id"], ref["mac"]) not in store._peer_tables:  # once per store of the core job
            ppath = peers_path(store.handshake_dir, ref["id"], group)
            got["peers"] = open_dir(store.handshake_dir).read(os.path.basename(ppath), RECORD_CAP)
            if got["peers"] is None:
                raise DDStoreError(
                    f"join('{name}'): record {path} names the core job's address file {ppath}, which "
                    "does not exist: the core job withdrew it (it freed the store), or the record "
                    "is stale"
                )
            check_peers(
                parse_peers(got["peers"], ppath, store.n_core, group), ppath, body, path, name, presented
            )
        return got

    # One member of the extra job reads the record, the address file (once per core store) and
    # the token file; every member checks.
    got = read_once(store._record_comm, read)
    body, presented = checked(got)
    ref = (body["peers"]["id"], body["peers"]["mac"])
    ppath = peers_path(store.handshake_dir, ref[0], group)
    peers = store._peer_tables.get(ref)
    if peers is None:
        if got["peers"] is None:
            raise DDStoreError(f"join('{name}'): no member read the core job's address file {ppath}")
        peers = parse_peers(got["peers"], ppath, store.n_core, group)
        check_peers(peers, ppath, body, path, name, presented)
        store._peer_tables[ref] = peers
    # This job's requests to the core job's owners carry proof of the token.
    store._native.set_secret(presented.encode())
    node = body.get("node_records")
    records = share_records(peers, body, path, ppath)
    store._native.attach(
        name, body["dtype"], body["row_bytes"], body["itemsize"], body["counts"], records, node
    )
    return body


def join_variable(store, name: str, timeout_s: float | None, token: str | None) -> None:
    """PyDDStore.join of a method-2 extra member `store`: waits for `name`'s record (a ragged
    variable's two records), checks and attaches it, and notes what it was joined from."""
    group = store.settings.core_group
    plain = record_path(store.handshake_dir, name, group)
    parts = ragged_parts(name)
    ends = record_path(store.handshake_dir, parts[1], group)
    # Whichever record appears first tells a fixed-row variable from a ragged one.
    if timeout_s is None:
        timeout_s = store.settings.handshake_timeout_s
    deadline = time.monotonic() + timeout_s

    def ragged() -> bool:
        while not (os.path.exists(plain) or os.path.exists(ends)):
            if time.monotonic() >= deadline:
                raise DDStoreTimeoutError(
                    f"join('{name}'): no record {plain} (nor {ends} of a ragged variable) after "
                    f"{timeout_s:g} s: is the core job running with handshake_dir="
                    f"{store.handshake_dir!r}? (DDSTORE_HANDSHAKE_TIMEOUT_S sets the wait)"
                )
            time.sleep(0.05)
        return os.path.exists(ends)

    if not read_once(store._record_comm, ragged):
        body = join(store, name, timeout_s, token)
        store._joined[name] = [joined_from(name, body)]
        return
    # A ragged variable: its values and row ends are published as two variables.
    bodies = [join(store, part, timeout_s, token) for part in parts]
    store._native.link_ragged(name)
    # Values come back in the unit shape the core published.
    store._ragged_units[name] = tuple(bodies[0].get("unit_shape") or ())
    store._joined[name] = [joined_from(p, b) for p, b in zip(parts, bodies)]


def stale_error(store, name: str, error: DDStoreError) -> DDStoreStaleError | None:
    """After a failed read of `name` by extra member `store`: the DDStoreStaleError to raise when
    the core job withdrew or replaced the record `name` was joined from while its process lives
    (it freed the variable); None when `error` stands."""
    if not store._joined.get(name) or type(error) not in (
        DDStoreError,
        DDStoreTimeoutError,
        DDStoreAccessError,
    ):
        return None
    stale = freed_record(store.handshake_dir, store.settings.core_group, store._joined[name])
    if stale is None:
        return None
    peer = error.peer
    rank = f"core rank {peer}" if peer is not None else "the core job"
    e = DDStoreStaleError(
        f"'{name}': the core job freed this variable while this extra job held it ({stale}); "
        f"{rank} no longer serves it and this handle reads nothing more: attach again "
        f"(join('{name}') on a new PyDDStore, or a new DistDatasetReader) to read what the core "
        f"job publishes now (the read failed with: {error})"
    )
    e.peer = peer
    return e
