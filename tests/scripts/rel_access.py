"""Access control of a running store's files, and tampered method-2 records.

python rel_access.py core <handshake_dir> <ready_file> <done_file>
    (plain processes, file communicator) a core group adds ADDS probe
    variables (each briefly has a named shared-memory file per rank),
    then the method-2 variable; rank 0 writes <ready_file>, and all wait
    for <done_file>.
python rel_access.py tamper <core_handshake_dir> <scratch_dir>
    an extra member joins tampered copies of the published record; each
    must be refused with a DDStoreError whose message names the problem;
    the untampered copy must join and read correctly.
"""

import json
import os
import sys
import time

import numpy as np
from _common import main_guard, rows_of, share_bounds

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
    first, count, _ = share_bounds(N, store.size, store.rank)
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


def tamper_cases(body):
    """(label, mutate(body) -> bytes, fragment the error must contain)."""

    def edit(**changes):
        def mutate(b):
            b = dict(b)
            for k, v in changes.items():
                if v is KeyError:
                    b.pop(k, None)
                else:
                    b[k] = v
            return json.dumps(b).encode()

        return mutate

    first = bytes.fromhex(body["records"][0])
    return [
        ("format", edit(format=2), "format"),
        ("format-bool", edit(format=True), "format"),
        ("no-token", edit(token=KeyError), "token"),
        # join() has no expected token to compare with: recorded, not asserted.
        ("token-other", edit(token="00" * 16), "token"),
        ("n_core", edit(n_core=3), "n_core"),
        ("records-not-hex", edit(records=["zz", body["records"][1]]), "hex"),
        ("records-junk", edit(records=[b"junk".hex(), body["records"][1]]), "not valid"),
        ("record-magic", edit(records=[(b"XXXX" + first[4:]).hex(), body["records"][1]]), "not valid"),
        (
            "record-format",
            edit(records=[first.replace(b'"format":1', b'"format":7').hex(), body["records"][1]]),
            "format",
        ),
        ("records-short", edit(records=body["records"][:1]), "records"),
        ("counts-negative", edit(counts=[-1, body["counts"][1]]), "counts"),
        ("counts-huge", edit(counts=[2**64, body["counts"][1]]), "counts"),
        ("counts-past-share", edit(counts=[body["counts"][0] * 1000, body["counts"][1]]), "count"),
        ("row_bytes", edit(row_bytes=0), "row_bytes"),
        ("dtype", edit(dtype="complex256"), "dtype"),
        ("pid-dead", edit(pid=2**22 + 12345), "stale"),
        ("pid-huge", edit(pid=2**70), "pid"),
        ("truncated", lambda b: json.dumps(b).encode()[:40], "corrupt"),
        ("not-json", lambda b: b"\x00\xff" * 10, "corrupt"),
    ]


def read_past_share(extra, real_count):
    """Rows the tampered counts claim but rank 0's share does not hold."""
    out = np.empty((1,) + SHAPE, np.float32)
    try:
        extra.get_batch(NAME, out, [real_count + 2])
        return f"READ {out.ravel()[:4]}"
    except pyddstore.DDStoreError as e:
        return f"DDStoreError: {e}"


def tamper(core_dir, scratch):
    path = _handshake.record_path(core_dir, NAME)
    with open(path, "rb") as f:
        body = json.loads(f.read())
    results = {}
    for label, mutate, fragment in tamper_cases(body):
        d = os.path.join(scratch, label)
        os.makedirs(d, mode=0o700)
        _handshake.write_private(_handshake.record_path(d, NAME), mutate(body))
        extra = pyddstore.PyDDStore(None, method=2, n_core=2, handshake_dir=d)
        try:
            extra.join(NAME, timeout_s=5)
            outcome = "ACCEPTED"
            if label == "counts-past-share":
                outcome += "; reading past the real share: " + read_past_share(extra, body["counts"][0])
        except pyddstore.DDStoreError as e:
            outcome = "refused" if fragment.lower() in str(e).lower() else f"UNCLEAR: {e}"
        except Exception as e:  # noqa: BLE001 - a non-DDStoreError is the finding
            outcome = f"WRONG-TYPE {type(e).__name__}: {e}"
        results[label] = outcome
        print(f"tamper {label}: {outcome}", flush=True)
    # Control: the untampered record joins and reads every row.
    d = os.path.join(scratch, "control")
    os.makedirs(d, mode=0o700)
    _handshake.write_private(_handshake.record_path(d, NAME), json.dumps(body).encode())
    extra = pyddstore.PyDDStore(None, method=2, n_core=2, handshake_dir=d)
    extra.join(NAME, timeout_s=5)
    out = np.empty((N,) + SHAPE, np.float32)
    rows = np.arange(N)[::-1].copy()
    extra.get_batch(NAME, out, rows)
    assert np.array_equal(out, rows_of(6, rows, SHAPE, "float32")), "control join read wrong rows"
    print("tamper control: joined and read", flush=True)
    print("tamper-results", json.dumps(results), flush=True)


if __name__ == "__main__":
    main_guard(lambda: globals()[sys.argv[1]](*sys.argv[2:]))
