"""Security: another user cannot read a running store's shared-memory files
or its method-2 handshake records; tampered records are refused by join()
with a clear error; the record parser only ever raises DDStoreError."""

import base64
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from conftest import SCRIPTS, _env, start_procs

from pyddstore import DDStoreError, _handshake, _native

# -- the record parser on random, mutated and truncated input -----------------------


# Two core ranks' same-node locators, packed: one on host 0, one without.
SAME_NODE = struct.pack("<IIiQQQ", 0, 1234, 40, 4096, 4096, 7) + struct.pack("<I32x", 2**32 - 1)


def valid_body(n_core=2) -> dict:
    return {
        "format": _handshake.FORMAT_VERSION,
        "name": "v",
        "token_sha256": "ab" * 32,
        "mac": "cd" * 32,
        "host": "h",
        "pid": 1,
        "created": 0.0,
        "n_core": n_core,
        "group": 0,
        "transport": "ofi:tcp;ofi_rxm",
        "dtype": "float32",
        "row_bytes": 32,
        "itemsize": 4,
        "counts": [12] * n_core,
        "peers": {"id": "0f" * 8, "mac": "ef" * 32},
        "shares": base64.b64encode(bytes(_native.PACKED_SHARE_BYTES * n_core)).decode(),
        "node": {"hosts": ["host/boot"], "packed": base64.b64encode(SAME_NODE).decode()},
        "unit_shape": [4, 2],
    }


ODD_VALUES = [None, True, False, -1, 0, 2**70, -(2**70), 1.5, float("nan"), "x", ""]
ODD_VALUES += [[], {}, [1], ["zz"], [[]]]


def mutations(rng: random.Random, body: dict):
    raw = json.dumps(body).encode()
    kind = rng.randrange(7)
    if kind == 0:
        return raw[: rng.randrange(len(raw))]
    if kind == 1:
        b = bytearray(raw)
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        return bytes(b)
    if kind == 2:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(64)))
    if kind == 3:
        b = dict(body)
        b[rng.choice(list(b))] = rng.choice(ODD_VALUES)
        return json.dumps(b).encode()
    if kind == 4:
        b = dict(body)
        del b[rng.choice(list(b))]
        return json.dumps(b).encode()
    if kind == 5:
        b = dict(body)
        key = rng.choice([k for k in ("counts", "peers", "addrs", "node", "shape") if k in b] or list(b))
        b[key] = [rng.choice(ODD_VALUES) for _ in range(rng.randint(0, 3))]
        return json.dumps(b).encode()
    return json.dumps(rng.choice(ODD_VALUES + [list(body.values()), [body]])).encode()


def valid_peers(n_core=2) -> dict:
    """A core store's address file (method 2), as Publisher.publish_peers writes it."""
    return {
        "format": _handshake.FORMAT_VERSION,
        "kind": "peers",
        "id": "0f" * 8,
        "token_sha256": "ab" * 32,
        "mac": "cd" * 32,
        "host": "h",
        "pid": 1,
        "created": 0.0,
        "n_core": n_core,
        "group": 0,
        "transport": "ofi:tcp;ofi_rxm",
        "provider": "tcp;ofi_rxm",
        "addrs": ["02001f90" + "7f000001" + "00" * 8] * n_core,
    }


PARSERS = {
    "record": (lambda raw: _handshake.parse_record(raw, "rec.json", 2), valid_body),
    "address file": (lambda raw: _handshake.parse_peers(raw, "peers.json", 2, 0), valid_peers),
}


@pytest.mark.parametrize("what", sorted(PARSERS))
def test_parse_record_fuzz_raises_only_ddstore_errors(what):
    parse, valid = PARSERS[what]
    rng = random.Random(8)
    start, cases, accepted = time.monotonic(), 0, 0
    for _ in range(3000):
        raw = mutations(rng, valid())
        cases += 1
        try:
            parse(raw)
            accepted += 1
        except DDStoreError:
            pass
        except Exception as e:  # noqa: BLE001 - the finding
            pytest.fail(f"parsing the {what} raised {type(e).__name__} on {raw[:200]!r}: {e}")
    print(f"{what} fuzz: {cases} cases, {accepted} accepted, {time.monotonic() - start:.2f} s")
    assert parse(json.dumps(valid()).encode())["n_core"] == 2


@pytest.mark.parametrize("depth", [10_000, 100_000])
def test_parse_record_deeply_nested_json_is_a_ddstore_error(depth):
    with pytest.raises(DDStoreError, match="corrupt"):
        _handshake.parse_record(b"[" * depth, "rec.json", 2)


@pytest.mark.parametrize("field,value", [("format", True), ("counts", [True, 12]), ("n_core", True)])
def test_parse_record_refuses_booleans_for_numbers(field, value):
    body = valid_body()
    body[field] = value
    with pytest.raises(DDStoreError, match=field):
        _handshake.parse_record(json.dumps(body).encode(), "rec.json", 2)


# -- another user ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def other_user():
    if os.geteuid() != 0:
        pytest.skip("needs root to create a second user")
    if not (shutil.which("useradd") and shutil.which("userdel") and shutil.which("runuser")):
        pytest.skip("useradd/userdel/runuser not available")
    name = f"ddsrel{uuid.uuid4().hex[:6]}"
    subprocess.run(["useradd", "-M", "-N", "-s", "/bin/sh", name], check=True, capture_output=True)
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], capture_output=True)


PROBE = """
import os, sys
for path in sys.argv[1:]:
    try:
        if os.path.isdir(path):
            os.listdir(path)
        else:
            with open(path, "rb") as f:
                f.read(1)
        print("READABLE", path)
    except PermissionError:
        print("denied", path)
    except OSError as e:
        print("error", type(e).__name__, path)
"""


def probe_as(user, paths) -> dict:
    """What `user` gets trying to read each path: denied, READABLE or error."""
    out = subprocess.run(
        ["runuser", "-u", user, "--", "/usr/bin/python3", "-c", PROBE, *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    return {line.split()[-1]: line.split()[0] for line in out.stdout.splitlines()}


def shm_files_of(pid):
    return sorted(Path("/dev/shm").glob(f"ddstore-{pid}-*"))


@pytest.fixture(scope="module")
def core_job(other_user):
    """A 2-rank method-2 core group (plain processes, tcp, node sharing on);
    while it adds, both ranks are stopped once a shared-memory file exists
    and `other_user` tries to read it."""
    # Under /tmp, not pytest's owner-only tmp_path: the other user can reach what lies below.
    base = Path(tempfile.mkdtemp(prefix="ddstore-access-"))
    base.chmod(0o755)
    hs = base / "hs"
    hs.mkdir()
    hs.chmod(0o755)  # a permissive handshake_dir: the files alone must protect the records
    ready, done = base / "ready", base / "done"
    env = {
        "DDSTORE_FABRIC": "tcp",
        "DDSTORE_SHM": "1",
        "DDSTORE_HANDSHAKE_TIMEOUT_S": "60",
        "DDSTORE_JOB_ID": f"access{os.getpid()}",
    }
    procs = start_procs(2, "rel_access.py", "core", str(hs), str(ready), str(done), env=env)
    caught = {}
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline:
            if any(p.poll() is not None for p in procs):
                break
            if not caught and shm_files_of(procs[0].pid):
                for p in procs:
                    os.kill(p.pid, signal.SIGSTOP)
                try:
                    files = shm_files_of(procs[0].pid) + shm_files_of(procs[1].pid)
                    if files:
                        caught = {
                            "modes": {str(f): oct(f.stat().st_mode & 0o777) for f in files},
                            "probe": probe_as(other_user, files + [f"/proc/{procs[0].pid}/mem"]),
                        }
                finally:
                    for p in procs:
                        os.kill(p.pid, signal.SIGCONT)
            time.sleep(0.0005)
        assert ready.exists(), "core job did not get ready: " + "\n".join(
            p.stderr.read() if p.poll() is not None else "(running)" for p in procs
        )
        yield {"hs": hs, "base": base, "caught": caught, "pid": procs[0].pid}
    finally:
        done.write_text("done")
        for rank, p in enumerate(procs):
            try:
                out, err = p.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                out, err = p.communicate()
            assert p.returncode == 0, f"core rank {rank} exited {p.returncode}\n{out}\n{err[-3000:]}"
        shutil.rmtree(base, ignore_errors=True)


def memfd_paths(pid):
    """The /proc/<pid>/fd/<n> paths of a process's memfd shares (how same-node peers open them)."""
    found = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            if os.readlink(fd).startswith("/memfd:"):
                found.append(fd)
        except OSError:
            pass
    return found


def test_other_user_cannot_read_shared_memory_files(core_job, other_user):
    caught = core_job["caught"]
    memfds = memfd_paths(core_job["pid"])
    if not caught and not memfds:
        pytest.skip("no named shared-memory file was caught and the core has no memfd share")
    if caught:  # shares as named files in /dev/shm, between creation and unlink
        print("shared-memory files while named:", caught)
        assert all(m == "0o600" for m in caught["modes"].values()), caught["modes"]
        assert caught["probe"] and all(v == "denied" for v in caught["probe"].values()), caught["probe"]
    if memfds:  # shares as memfds, reached through /proc/<pid>/fd
        probe = probe_as(other_user, memfds + [f"/proc/{core_job['pid']}/mem"])
        print("memfd shares:", probe)
        assert probe and "READABLE" not in probe.values(), probe


def test_other_user_cannot_read_handshake_records(core_job, other_user):
    hs = core_job["hs"]
    records = sorted(hs.iterdir())
    published = _handshake.record_path(str(hs), "v")
    assert Path(published) in records, records
    assert any(p.name.startswith("+peers-") for p in records), records  # the store's addresses
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in records}
    print("handshake files:", modes)
    assert all(m == "0o600" for m in modes.values()), modes
    probe = probe_as(other_user, records)
    assert all(v == "denied" for v in probe.values()), probe
    # A handshake_dir pyddstore creates itself is owner-only as a whole.
    fresh = core_job["base"] / "fresh"
    _handshake.ensure_private_dir(str(fresh))
    assert oct(fresh.stat().st_mode & 0o777) == "0o700"
    assert probe_as(other_user, [fresh]) == {str(fresh): "denied"}


def test_tampered_records_are_refused_by_join(core_job, tmp_path):
    scratch = tmp_path / "tamper"
    scratch.mkdir(mode=0o700)
    out = subprocess.run(
        [sys.executable, str(SCRIPTS / "rel_access.py"), "tamper", str(core_job["hs"]), str(scratch)],
        env=_env({"DDSTORE_FABRIC": "tcp", "DDSTORE_SHM": "0", "DDSTORE_TIMEOUT_S": "5"}),
        capture_output=True,
        text=True,
        timeout=180,
    )
    print(out.stdout)
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads(out.stdout.split("tamper-results ", 1)[1].splitlines()[0])
    not_refused = {k: v for k, v in results.items() if v != "refused"}
    assert not not_refused, f"tampered records not refused with a clear DDStoreError: {not_refused}"
    # A key the owner never issued: refused with the same class on every read path.
    assert "tamper key-signed: DDStoreAccessError peer=0 " in out.stdout, out.stdout


# -- DistDatasetReader's meta.json (pyddstore.torch, method 2) ------------------------


def parse_meta_as_reader_does(path):
    """The parsing steps of DistDatasetReader.__init__ before it joins the store."""
    from pyddstore.torch._meta import read_meta
    from pyddstore.torch._schema import Schema

    meta = read_meta(path, 0.05)
    int(meta["n_core"])
    schema = Schema.from_json(meta)
    int(meta["num_samples"])
    return schema


def test_meta_json_fuzz_raises_only_ddstore_errors(tmp_path):
    np = pytest.importorskip("numpy")
    pytest.importorskip("torch")
    try:
        from pyddstore.torch._meta import META_VERSION
        from pyddstore.torch._schema import Schema
    except ImportError:
        pytest.skip("pyddstore.torch has no meta.json reader in this tree")
    sample = {"x": np.zeros((3, 2), np.float32), "y": np.int64(1)}
    valid = {"version": META_VERSION, "name": "ds", "n_core": 2, "num_samples": 10}
    valid.update(Schema.infer(sample, "ds").to_json())
    path = tmp_path / "ds.meta.json"
    path.write_text(json.dumps(valid))
    parse_meta_as_reader_does(str(path))  # the valid file parses
    rng = random.Random(9)
    wrong = {}
    start = time.monotonic()
    cases = 1500
    for _ in range(cases):
        raw = mutations(rng, valid)
        if rng.random() < 0.3 and isinstance(valid.get("fields"), list):
            body = json.loads(json.dumps(valid))
            field = rng.choice(body["fields"])
            field[rng.choice(list(field))] = rng.choice(ODD_VALUES)
            raw = json.dumps(body).encode()
        path.write_bytes(raw)
        try:
            parse_meta_as_reader_does(str(path))
        except DDStoreError:
            pass
        except Exception as e:  # noqa: BLE001 - the finding
            wrong.setdefault(type(e).__name__, (raw[:160], str(e)[:160]))
    took = time.monotonic() - start
    print(f"meta.json fuzz: {cases} cases in {took:.2f} s; non-DDStoreError: {sorted(wrong)}")
    assert not wrong, f"meta.json parsing raised non-DDStoreError exceptions: {wrong}"
