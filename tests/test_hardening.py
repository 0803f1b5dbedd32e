"""Issue 12: handshake files are untrusted input. Attacks from a second local user
(squatted directories, planted pickles), special files and symlinks at the names
pyddstore reads and writes, two live core jobs on one name, a killed job's leftovers,
object arrays, out-of-range arguments and bad settings. Every test asserts the outcome."""

import gc
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import _env
from test_access import other_user  # noqa: F401 - the shared second-user fixture

from pyddstore import (
    DDStoreAccessError,
    DDStoreError,
    DDStoreIndexError,
    DDStoreTimeoutError,
    DDStoreTypeError,
    DDStoreValueError,
    _handshake,
    _native,
    _wire,
)

FILE_COMM_JOB = """
import sys
import pyddstore
try:
    store = pyddstore.PyDDStore(None, method=1)
    print("ALLGATHER", store.allgather({"rank": store.rank}))
    store.free()
except pyddstore.DDStoreError as e:
    print("REFUSED", type(e).__name__, e)
"""


class Evil:
    """Unpickling this creates the marker file: proof that planted code ran."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def run_as(user, *cmd):
    return subprocess.run(["runuser", "-u", user, "--", *cmd], capture_output=True, text=True, timeout=30)


@pytest.fixture
def shared_dir():
    """A sticky world-writable directory both users reach (like /tmp or a project directory)."""
    base = Path(tempfile.mkdtemp(prefix="ddstore-shared-", dir="/tmp"))
    os.chmod(base, 0o1777)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def test_squatted_world_writable_dir_with_planted_pickles_is_refused(tmp_path, shared_dir, other_user):  # noqa: F811
    hs = shared_dir / "hs"
    made = run_as(other_user, "mkdir", "-m", "777", str(hs))
    assert made.returncode == 0, made.stderr
    marker = tmp_path / "pwned"
    payload = pickle.dumps([Evil(str(marker))])
    # The round files a 2-rank job would read, for any plausible job id.
    for name in [f"ppid{os.getpid()}-0.c0.r1.{r}.rec" for r in (0, 1)] + ["x.r1.1.rec"]:
        p = hs / name
        p.write_bytes(payload)
        os.chmod(p, 0o666)
    env = _env({"DDSTORE_MPI": "0", "DDSTORE_HANDSHAKE_DIR": str(hs), "SLURM_NTASKS": "2"})
    env["DDSTORE_FABRIC"] = "tcp"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", FILE_COMM_JOB],
            env={**env, "SLURM_PROCID": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in (0, 1)
    ]
    outs = [p.communicate(timeout=60)[0] for p in procs]
    for out in outs:
        assert "REFUSED DDStoreAccessError" in out, out
        assert "mode 0777" in out and "mkdir -m 700" in out and other_user in out, out
    assert not marker.exists(), "planted code ran"


def test_planted_pickles_and_malformed_rounds_are_data_errors(tmp_path):
    marker = tmp_path / "pwned"
    for raw in (pickle.dumps(Evil(str(marker))), b"{" * 100, b'{"$x": 1}', b"\xff\xfe", b"[" * 5000):
        with pytest.raises(DDStoreValueError, match="rank 1"):
            _wire.decode(raw, 1)
    with pytest.raises(DDStoreValueError, match="more than"):
        _wire.decode(b" " * (_wire.MAX_BYTES + 1), 1)
    assert not marker.exists()
    for bad in (object(), {1: 2}, np.zeros(2), Evil("x")):
        with pytest.raises(DDStoreTypeError):
            _wire.encode(bad)
    value = {"a": [1, 2.5, None, True, "s", b"\x00\xff"], "b": {"$d": {"x": b""}}}
    assert _wire.decode(_wire.encode(value), 0) == value


def test_symlinks_at_written_names_never_write_outside(tmp_path):
    hs = tmp_path / "hs"
    d = _handshake.open_dir(str(hs))
    outside = tmp_path / "outside"
    outside.write_bytes(b"owner-only data")
    os.chmod(outside, 0o600)
    names = ["v.ddstore.json", ".v.ddstore.token", "v.ddstore.lock", "j.r1.0.rec"]
    for n in names:
        os.symlink(outside, hs / n)
    d.write("v.ddstore.json", b"{}")
    d.write(".v.ddstore.token", b"secret-token")
    with pytest.raises(DDStoreAccessError, match="symbolic link"):
        d.try_lock("v.ddstore.lock", "me")
    with pytest.raises(DDStoreAccessError, match="symbolic link"):
        d.read("j.r1.0.rec", 100)
    assert outside.read_bytes() == b"owner-only data"
    assert not (hs / "v.ddstore.json").is_symlink() and (hs / "v.ddstore.json").read_bytes() == b"{}"
    assert oct((hs / ".v.ddstore.token").stat().st_mode & 0o777) == "0o600"
    assert not [n for n in os.listdir(hs) if ".tmp-" in n], "temporary files left"


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "directory", "other_mode"])
def test_special_files_at_the_record_path_fail_within_the_timeout(tmp_path, kind):
    hs = tmp_path / "hs"
    _handshake.open_dir(str(hs))
    path = _handshake.record_path(str(hs), "v")
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev_zero":
        os.symlink("/dev/zero", path)
    elif kind == "directory":
        os.mkdir(path)
    else:
        with open(path, "w") as f:
            f.write("{}")
        os.chmod(path, 0o666)
    t0 = time.monotonic()
    with pytest.raises(DDStoreAccessError):
        _handshake.wait_and_read(path, 2.0, "missing")
    assert time.monotonic() - t0 < 4.0
    with pytest.raises(DDStoreTimeoutError):
        _handshake.wait_and_read(str(hs / "absent.json"), 0.5, "missing")


HOLD_LOCK = """
import sys, time
from pyddstore import _native
d = _native.HandshakeDir(sys.argv[1])
lock = d.try_lock("v.ddstore.lock", "host h, pid %d" % __import__("os").getpid())
d.write("v.ddstore.json", b"{}")
d.write(".v.ddstore.token", b"dead-job-token")
print("HELD", flush=True)
time.sleep(600)
"""


def test_one_live_core_job_per_name_and_a_dead_ones_leftovers_are_cleaned(tmp_path):
    hs = tmp_path / "hs"
    d = _handshake.open_dir(str(hs))
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(hs)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "HELD"
        got = d.try_lock("v.ddstore.lock", "second job")
        assert isinstance(got, str) and f"pid {holder.pid}" in got, got
        _handshake.clean_dead(d)
        assert (hs / "v.ddstore.json").exists(), "a live job's record must stay"
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    _handshake.clean_dead(d)
    assert sorted(os.listdir(hs)) == [], "a killed job's lock, record and token are removed"
    lock = d.try_lock("v.ddstore.lock", "new job")
    assert not isinstance(lock, str)
    lock.release()
    assert os.listdir(hs) == []


@pytest.fixture
def single_store(monkeypatch):
    monkeypatch.setenv("DDSTORE_MPI", "0")
    monkeypatch.setenv("DDSTORE_FABRIC", "tcp")
    monkeypatch.delenv("DDSTORE_HANDSHAKE_DIR", raising=False)
    monkeypatch.delenv("SLURM_NTASKS", raising=False)
    import pyddstore

    store = pyddstore.PyDDStore(None, method=1)
    store.add("x", np.arange(12, dtype=np.float32).reshape(6, 2))
    yield store
    store.free()


def test_object_arrays_and_out_of_range_arguments_are_ddstore_errors(single_store):
    s = single_store
    with pytest.raises(DDStoreTypeError, match="object"):
        s.add("o", np.array([object(), object()], dtype=object))
    with pytest.raises(DDStoreTypeError, match="object"):
        s.init("o2", 2, 1, dtype=object)
    with pytest.raises(DDStoreTypeError, match="object"):
        s.get_batch("x", np.empty((1, 2), dtype=object), [0])
    with pytest.raises(DDStoreTypeError, match="object"):
        s.update("x", np.empty((1, 2), dtype=object))
    out = np.empty((1, 2), np.float32)
    with pytest.raises(DDStoreIndexError, match=str(2**63)):
        s.get("x", out, 2**63)
    with pytest.raises(DDStoreTypeError, match="1.5"):
        s.get("x", out, 1.5)
    with pytest.raises(DDStoreIndexError, match=str(2**63)):
        s.update("x", out, 2**63)
    with pytest.raises(DDStoreError):
        s.init("big", 2**64, 1)
    with pytest.raises(DDStoreIndexError, match=str(2**63 + 5)):
        s.get_batch("x", out, np.array([2**63 + 5], dtype=np.uint64))
    s.get_batch("x", out, [5])
    assert out.tolist() == [[10.0, 11.0]]


BAD_VALUES = ["abc", "-1", "1e23", "nan", "2"]
FLAGS = ["DDSTORE_MPI", "DDSTORE_SHM", "DDSTORE_THREAD_READERS", "DDSTORE_QUIET", "DDSTORE_PROFILE"]
FLAGS += ["DDSTORE_OFI_LOCAL_MR", "DDSTORE_OFI_HMEM", "DDSTORE_TEST_HOST_AS_DEVICE", "DDSTORE_FORK_WORKERS"]
FLAGS += ["DDSTORE_BATCH_GET", "DDSTORE_FAST_COLLATE"]
INTS = ["DDSTORE_METHOD", "DDSTORE_N_CORE", "DDSTORE_CORE_GROUP", "DDSTORE_MAX_INFLIGHT"]
INTS += ["DDSTORE_LOAD_THREADS", "DDSTORE_AFFINITY_WIDTH", "DDSTORE_AFFINITY_OFFSET"]
NUMBERS = ["DDSTORE_TIMEOUT_S", "DDSTORE_HANDSHAKE_TIMEOUT_S", "DDSTORE_MAX_READ_BYTES"]
CHOICES = ["DDSTORE_COMM", "DDSTORE_MPI_THREAD_LEVEL"]


def test_fabric_setting_refuses_what_cannot_be_a_provider_name(monkeypatch):
    # Any provider name passes the settings check (efa, opx, psm3, ucx, ...); a name that no provider
    # here has is refused when a store is made (tests/test_providers.py).
    for value in ["-1", "1e23", "2", "a b", "tcp;", "x/y"]:
        monkeypatch.setenv("DDSTORE_FABRIC", value)
        with pytest.raises(DDStoreValueError, match="DDSTORE_FABRIC") as e:
            _native.Settings.from_env()
        assert "expected a libfabric provider name" in str(e.value)
    for value in ["psm3", "tcp;ofi_rxm", "EFA", "udp;ofi_rxd"]:
        monkeypatch.setenv("DDSTORE_FABRIC", value)
        _native.Settings.from_env()


@pytest.mark.parametrize("key", FLAGS + INTS + NUMBERS + CHOICES)
def test_every_setting_refuses_bad_values_naming_the_variable(monkeypatch, key):
    for value in BAD_VALUES:
        if key in INTS and value == "2" or key == "DDSTORE_AFFINITY_OFFSET" and value == "2":
            continue  # 2 is a valid integer for these
        if key in NUMBERS and value == "2":
            continue
        monkeypatch.setenv(key, value)
        with pytest.raises(DDStoreValueError, match=key) as e:
            _native.Settings.from_env()
        assert "expected" in str(e.value)
    monkeypatch.setenv(key, "")
    _native.Settings.from_env()  # empty means unset
    if key in FLAGS:
        for ok in ("0", "1", "true", "false"):
            monkeypatch.setenv(key, ok)
            assert _native.setting(key) == ("1" if ok in ("1", "true") else "0")
        for no in ("yes", "on", "01"):
            monkeypatch.setenv(key, no)
            with pytest.raises(DDStoreValueError, match="0, 1, true or false"):
                _native.Settings.from_env()


def run_file_comm_job(hs, n=2, extra_env=None):
    env = _env({"DDSTORE_MPI": "0", "DDSTORE_HANDSHAKE_DIR": str(hs), "SLURM_NTASKS": str(n)})
    env.update({"DDSTORE_FABRIC": "tcp", **(extra_env or {})})
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", FILE_COMM_JOB],
            env={**env, "SLURM_PROCID": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(n)
    ]
    return [p.communicate(timeout=120)[0] for p in procs]


def test_a_clean_file_comm_run_leaves_nothing_and_a_killed_ones_files_are_cleaned(handshake_dir):
    outs = run_file_comm_job(handshake_dir)
    for out in outs:
        assert "ALLGATHER [{'rank': 0}, {'rank': 1}]" in out, out
    assert os.listdir(handshake_dir) == [], "a clean run left files"
    # A job killed mid-way leaves its round files and its live lock (nobody holds it now).
    for name in ("deadjob.c0.r3.0.rec", ".deadjob.c0.r4.0.rec.tmp-0123456789abcdef", "deadjob.c0.0.live"):
        fd = os.open(handshake_dir / name, os.O_CREAT | os.O_WRONLY, 0o600)
        os.close(fd)
    outs = run_file_comm_job(handshake_dir)
    assert all("ALLGATHER" in out for out in outs), outs
    assert os.listdir(handshake_dir) == [], "the next job did not clean the dead job's files"


MPI_M2_CORE = """
import pyddstore
from mpi4py import MPI
try:
    pyddstore.PyDDStore(MPI.COMM_WORLD, method=2, handshake_dir=__import__("sys").argv[1])
    print("ACCEPTED", flush=True)
    raise SystemExit(3)
except pyddstore.DDStoreAccessError as e:
    print("REFUSED", type(e).__name__, e, flush=True)  # one write: tests/scripts/sitecustomize.py
"""


def test_squatted_dir_under_mpirun_is_refused_on_every_rank(shared_dir, other_user):  # noqa: F811
    hs = shared_dir / "hs"
    assert run_as(other_user, "mkdir", "-m", "777", str(hs)).returncode == 0
    cmd = ["mpirun", "-n", "2", "--bind-to", "none", sys.executable, "-c", MPI_M2_CORE, str(hs)]
    env = _env({"DDSTORE_FABRIC": "tcp"})
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    # mpirun's status covers every rank: each exits 0 only when refused with DDStoreAccessError
    # (Open MPI may drop a rank's last line, so the message is checked on the lines that came).
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    assert "REFUSED DDStoreAccessError" in proc.stdout and "mode 0777" in proc.stdout, proc.stdout
    assert "ACCEPTED" not in proc.stdout
    assert os.listdir(hs) == [], "nothing may be written into a squatted directory"


def _wait_until_unlocked(directory: Path, timeout: float) -> None:
    """Waits until no process holds a name lock in `directory` (the holders have exited)."""
    import fcntl

    deadline = time.monotonic() + timeout
    for lock in directory.glob("*.ddstore.lock"):
        with open(lock, "rb") as f:
            while True:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    fcntl.flock(f, fcntl.LOCK_UN)
                    break
                except BlockingIOError:
                    assert time.monotonic() < deadline, f"{lock.name} still locked after {timeout} s"
                    time.sleep(0.1)


def test_two_live_core_jobs_on_one_name_then_a_killed_one_is_taken_over(handshake_dir):
    from test_method2 import RECORDS, Core

    env = {"DDSTORE_FABRIC": "tcp"}
    first = Core(handshake_dir, env)
    try:
        first.wait_ready(RECORDS)
        record = (handshake_dir / RECORDS[0]).read_bytes()
        second = Core(handshake_dir, env)
        try:
            assert second.proc.wait(timeout=120) != 0, "a second live core job published the same name"
        finally:
            second.kill()
        out = second.output()
        assert "DDStoreAccessError" in out, out  # both ranks raise (mpirun may drop a line)
        assert "already published" in out and "by a live core job (host" in out and ", pid " in out, out
        assert (handshake_dir / RECORDS[0]).read_bytes() == record, "the live job's record was replaced"
        first.kill(signal.SIGKILL)  # dies holding its locks: the kernel releases them
        # mpirun's ranks run in process groups of their own and outlive it briefly: the lock
        # (rightly) stays taken until rank 0 itself has exited.
        _wait_until_unlocked(handshake_dir, timeout=60)
        third = Core(handshake_dir, env)
        try:
            deadline = time.monotonic() + 120
            while "core ready" not in third.output():
                assert third.proc.poll() is None and time.monotonic() < deadline, third.output()
                time.sleep(0.1)
            assert (handshake_dir / RECORDS[0]).read_bytes() != record, "the dead job's record was kept"
            assert third.stop() == 0, third.output()
        finally:
            third.kill()
    finally:
        first.kill(signal.SIGKILL)
    left = [n for n in os.listdir(handshake_dir) if n != "STOP"]
    assert left == [], f"left behind: {left}"


def test_a_name_too_long_for_the_file_system_is_refused_before_creating(handshake_dir, monkeypatch):
    import pyddstore

    monkeypatch.setenv("DDSTORE_MPI", "0")
    monkeypatch.setenv("DDSTORE_FABRIC", "tcp")
    monkeypatch.delenv("SLURM_NTASKS", raising=False)
    store = pyddstore.PyDDStore(None, method=2, handshake_dir=str(handshake_dir))
    try:
        with pytest.raises(DDStoreValueError, match="too long"):
            store.add("x" * 300, np.zeros((2, 2), np.float32))
        assert store.names() == []
        store.add("ok", np.zeros((2, 2), np.float32))
        assert store.names() == ["ok"]
    finally:
        store.free()
    del store  # the communicator's live lock goes with it
    gc.collect()
    assert os.listdir(handshake_dir) == []


INFLIGHT_JOB = """
import numpy as np, pyddstore
from mpi4py import MPI
s = pyddstore.PyDDStore(MPI.COMM_WORLD, method=1)
s.add("x", np.arange(8, dtype=np.float32).reshape(2, 4))
out = np.empty((1, 4), np.float32)
try:
    s.get_batch("x", out, [2 * (1 - s.rank)])
    raise SystemExit("read with DDSTORE_MAX_INFLIGHT beyond the transmit queue")
except pyddstore.DDStoreValueError as e:
    assert "DDSTORE_MAX_INFLIGHT=1048576" in str(e) and "at most" in str(e), e
    print("REFUSED", e, flush=True)
s.free()
"""


@pytest.mark.parametrize("fabric", ["tcp", "shm"])
def test_max_inflight_beyond_the_providers_queue_names_the_variable(fabric):
    env = _env({"DDSTORE_SHM": "0", "DDSTORE_FABRIC": fabric, "DDSTORE_MAX_INFLIGHT": "1048576"})
    cmd = ["mpirun", "-n", "2", "--bind-to", "none", sys.executable, "-c", INFLIGHT_JOB]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    assert "transmit queue" in proc.stdout, proc.stdout
