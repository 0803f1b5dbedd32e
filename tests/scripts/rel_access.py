"""Access control of a running store's files, and tampered method-2 records.

python rel_access.py core <handshake_dir> <ready_file> <done_file>
    (plain processes, file communicator) a core group adds ADDS probe
    variables (each briefly has a named shared-memory file per rank),
    then the method-2 variable; rank 0 writes <ready_file>, and all wait
    for <done_file>.
python rel_access.py tamper <core_handshake_dir> <scratch_dir>
    an extra member joins tampered copies of the published record and of
    the store's address file; each must be refused with a DDStoreError
    whose message names the problem; the untampered copies must join and
    read correctly.
"""

import base64
import json
import os
import sys
import time

import numpy as np
from _common import main_guard, rows_of
from pyddstore._shares import share_of

import pyddstore
from pyddstore import _handshake

N, SHAPE, NAME, WAIT_S, ADDS = 24, (8,), "v", 60.0, 40


def wait_for(path, seconds=WAIT_S):
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {seconds} s")
        time.sleep(0.05)


def core(handshake_dir, ready_file, done_file):
    store = pyddstore.PyDDStore(None, method=2, handshake_dir=handshake_dir)
    first, count = share_of(N, store.size, store.rank)
    rows = rows_of(6, np.arange(first, first + count), SHAPE, "float32")
    # Each add() creates a shared-memory file per rank and removes its name once
    # every peer mapped it: the test stops both ranks inside that window.
    for i in range(ADDS):
        store.add(f"probe{i}", rows)
    store.add(NAME, rows)
    store.barrier()
    if store.rank == 0:
        with open(ready_file, "w") as f:
            f.write(str(os.getpid()))
    wait_for(done_file)
    store.barrier()
    store.free()
    print(f"rank {store.rank}: core ok", flush=True)


def tamper_cases(body, peers, token):
    """(label, mutate(body) -> bytes, mutate(peers) -> bytes or None (no address file), fragment the
    error must contain, token presented): the record, then the address file, tampered."""

    def edit(sign=True, fields=_handshake.SIGNED_FIELDS, **changes):
        """Changes fields; sign=True signs the result with the core's token, as if the
        core had written it (what is checked behind the signature), sign=False keeps
        the original signature (what the signature itself catches)."""

        def mutate(b):
            b = dict(b)
            for k, v in changes.items():
                if v is KeyError:
                    b.pop(k, None)
                else:
                    b[k] = v
            if sign:
                b["mac"] = _handshake.record_mac(token, b, fields)
            return json.dumps(b).encode()

        return mutate

    def pedit(sign=True, **changes):
        return edit(sign, _handshake.PEERS_SIGNED_FIELDS, **changes)

    def shares(offset, value):
        """The record's shares with rank 0's bytes from `offset` replaced by `value`."""
        packed = bytearray(base64.b64decode(body["shares"]))
        packed[offset : offset + len(value)] = value
        return base64.b64encode(bytes(packed)).decode()

    same = edit(sign=False)
    other_key = shares(
        8, (int.from_bytes(base64.b64decode(body["shares"])[8:16], "little") ^ 1 << 40).to_bytes(8, "little")
    )
    # The core runs with same-node sharing: its record packs both ranks' locators.
    node_packed = body["node"]["packed"]
    addrs = peers["addrs"]
    other_addr = addrs[1][:-2] + ("00" if addrs[1][-2:] != "00" else "01")
    wrong = [
        ("format", edit(format=9), "format", token),
        ("format-bool", edit(format=True), "format", token),
        ("no-token", edit(token_sha256=KeyError), "token", token),
        ("token-other", edit(token_sha256="00" * 32), "token", token),
        ("token-presented-wrong", edit(), "not the token", "f" * 32),
        ("mac-missing", edit(sign=False, mac=KeyError), "mac", token),
        ("key-unsigned", edit(sign=False, shares=other_key), "integrity", token),
        (
            "counts-unsigned",
            edit(sign=False, counts=[body["counts"][0] + 1, body["counts"][1]]),
            "integrity",
            token,
        ),
        ("dtype-unsigned", edit(sign=False, dtype="float64"), "integrity", token),
        # Signed with the right token, so join() accepts it: the fabric must refuse the key.
        ("key-signed", edit(shares=other_key), "memory key", token),
        ("n_core", edit(n_core=3), "n_core", token),
        ("shares-not-base64", edit(shares="zz!"), "base64", token),
        ("shares-short", edit(shares=body["shares"][:-8]), "per core rank", token),
        ("share-flags", edit(shares=shares(32, b"\x80")), "flags", token),
        (
            "share-registered-past-length",
            edit(shares=shares(24, (2**63).to_bytes(8, "little"))),
            "registers",
            token,
        ),
        ("peers-missing", edit(peers=KeyError), "peers", token),
        ("peers-not-hex", edit(peers={"id": "zz" * 8, "mac": body["peers"]["mac"]}), "peers", token),
        ("peers-other", edit(peers={"id": "12" * 8, "mac": body["peers"]["mac"]}), "does not exist", token),
        ("node-not-packed", edit(node=[None, None]), "node", token),
        ("node-short", edit(node={"hosts": ["h"], "packed": "AAAA"}), "node", token),
        ("node-host-index", edit(node={"hosts": [], "packed": node_packed}), "host index", token),
        ("counts-negative", edit(counts=[-1, body["counts"][1]]), "counts", token),
        ("counts-huge", edit(counts=[2**64, body["counts"][1]]), "counts", token),
        ("counts-past-share", edit(counts=[body["counts"][0] * 1000, body["counts"][1]]), "count", token),
        ("row_bytes", edit(row_bytes=0), "row_bytes", token),
        ("dtype", edit(dtype="complex256"), "dtype", token),
        ("pid-dead", edit(pid=2**22 + 12345), "stale", token),
        ("pid-huge", edit(pid=2**70), "pid", token),
        ("truncated", lambda b: json.dumps(b).encode()[:40], "corrupt", token),
        ("not-json", lambda b: b"\x00\xff" * 10, "corrupt", token),
    ]
    cases = [
        (label, mutate, pedit(sign=False), fragment, presented)
        for label, mutate, fragment, presented in wrong
    ]
    wrong_peers = [
        ("addrs-absent", None, "does not exist"),
        ("addr-unsigned", pedit(sign=False, addrs=[addrs[0], other_addr]), "integrity"),
        # Signed with the job's token, as another store's address file is: not the record's.
        ("addr-signed", pedit(addrs=[addrs[0], other_addr]), "not the one"),
        ("addrs-token-other", pedit(token_sha256="00" * 32), "integrity"),
        ("addrs-format", pedit(format=3), "format"),
        ("addrs-kind", pedit(kind="record"), "not a core job's address file"),
        ("addrs-n_core", pedit(n_core=3), "expected 2"),
        ("addrs-short", pedit(addrs=addrs[:1]), "addresses"),
        ("addr-huge", pedit(addrs=[addrs[0], "00" * 2000]), "address"),
        ("addr-empty", pedit(addrs=[addrs[0], ""]), "address"),
        ("addr-not-hex", pedit(addrs=[addrs[0], "zz"]), "hex"),
        ("addrs-provider", pedit(provider=""), "provider"),
        ("addrs-truncated", lambda p: json.dumps(p).encode()[:60], "corrupt"),
        ("addrs-not-json", lambda p: b"\x00\xff" * 10, "corrupt"),
    ]
    cases += [(label, same, mutate, fragment, token) for label, mutate, fragment in wrong_peers]
    return cases


def read_past_share(extra, real_count):
    """Rows the tampered counts claim but rank 0's share does not hold."""
    out = np.empty((1,) + SHAPE, np.float32)
    try:
        extra.get_batch(NAME, out, [real_count + 2])
        return f"READ {out.ravel()[:4]}"
    except pyddstore.DDStoreError as e:
        return f"DDStoreError: {e}"


def read_with_wrong_key(extra, fragment):
    """A row of rank 0 read through a key rank 0 never issued: an error, never data."""
    out = np.zeros((1,) + SHAPE, np.float32)
    start = time.monotonic()
    try:
        extra.get_batch(NAME, out, [0])
        return f"READ {out.ravel()[:4]}"
    except pyddstore.DDStoreError as e:
        took = time.monotonic() - start
        print(f"tamper key-signed: {type(e).__name__} peer={e.peer} after {took:.2f} s: {e}", flush=True)
        return "refused" if fragment in str(e) and not out.any() else f"UNCLEAR: {e}"


def tamper(core_dir, scratch):
    path = _handshake.record_path(core_dir, NAME)
    with open(path, "rb") as f:
        body = json.loads(f.read())
    peers_path = _handshake.peers_path(core_dir, body["peers"]["id"])
    with open(peers_path, "rb") as f:
        peers = json.loads(f.read())
    with open(_handshake.token_path(core_dir, NAME), encoding="utf-8") as f:
        token = f.read()
    results = {}
    for label, mutate, mutate_peers, fragment, presented in tamper_cases(body, peers, token):
        d = os.path.join(scratch, label)
        os.makedirs(d, mode=0o700)
        _handshake.write_private(_handshake.record_path(d, NAME), mutate(body))
        if mutate_peers is not None:
            _handshake.write_private(_handshake.peers_path(d, peers["id"]), mutate_peers(peers))
        extra = pyddstore.PyDDStore(None, method=2, n_core=2, handshake_dir=d)
        try:
            extra.join(NAME, timeout_s=5, token=presented)
            outcome = "ACCEPTED"
            if label == "key-signed":
                outcome = read_with_wrong_key(extra, fragment)
            if label == "counts-past-share":
                outcome += "; reading past the real share: " + read_past_share(extra, body["counts"][0])
        except pyddstore.DDStoreError as e:
            outcome = "refused" if fragment.lower() in str(e).lower() else f"UNCLEAR: {e}"
        except Exception as e:  # noqa: BLE001 - a non-DDStoreError is the finding
            outcome = f"WRONG-TYPE {type(e).__name__}: {e}"
        results[label] = outcome
        print(f"tamper {label}: {outcome}", flush=True)
    # Control: the untampered record and address file, with the core's token file beside them as
    # the core job leaves it, join without a token argument and read every row.
    d = os.path.join(scratch, "control")
    os.makedirs(d, mode=0o700)
    _handshake.write_private(_handshake.record_path(d, NAME), json.dumps(body).encode())
    _handshake.write_private(_handshake.peers_path(d, peers["id"]), json.dumps(peers).encode())
    _handshake.write_private(_handshake.token_path(d, NAME), token.encode())
    extra = pyddstore.PyDDStore(None, method=2, n_core=2, handshake_dir=d)
    extra.join(NAME, timeout_s=5)
    out = np.empty((N,) + SHAPE, np.float32)
    rows = np.arange(N)[::-1].copy()
    extra.get_batch(NAME, out, rows)
    assert np.array_equal(out, rows_of(6, rows, SHAPE, "float32")), "control join read wrong rows"
    print("tamper control: joined and read", flush=True)
    # One write per report, so that the lines of ranks sharing a pipe stay whole.
    sys.stdout.write(f"tamper-results {json.dumps(results)}\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main_guard(lambda: globals()[sys.argv[1]](*sys.argv[2:]))
