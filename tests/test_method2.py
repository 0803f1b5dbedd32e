"""Method 2 across jobs: a core job (mpirun -n 2, or plain processes) publishes its variables in
a handshake directory; separate extra jobs (mpirun -n 2, and a plain process) join and read
them. Every read is checked against the core's data (a function of the row)."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import SCRIPTS, _env, run_mpi, run_procs

FABRICS = [
    pytest.param({"DDSTORE_FABRIC": "tcp"}, id="tcp"),
    pytest.param({"DDSTORE_FABRIC": "shm"}, id="shm"),
    pytest.param({"DDSTORE_FABRIC": "tcp", "DDSTORE_SHM": "0"}, id="tcp-noshm"),
    pytest.param({"DDSTORE_FABRIC": "shm", "DDSTORE_SHM": "0"}, id="shm-noshm"),
]


class Core:
    """A core job started in the background (its own process group), always ended: stop file
    first, then SIGTERM, then SIGKILL of that group."""

    def __init__(
        self,
        handshake_dir: Path,
        env: dict,
        n: int = 2,
        script: str = "m2_core.py",
        *args: str,
        hs_flag: str = "--hs",
    ):
        self.hs = Path(handshake_dir)
        self.log = self.hs.parent / f"{Path(script).name}.log"
        if n > 0:
            if shutil.which("mpirun") is None:
                pytest.skip("mpirun not found: install openmpi-bin (the README's test command does)")
            cmd = ["mpirun", "-n", str(n), "--bind-to", "none"]
        else:  # one plain process (file communicator)
            cmd = []
            env = {**env, "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}
        cmd += [sys.executable, str(SCRIPTS / script), hs_flag, str(self.hs), *args]
        self.out = open(self.log, "w")
        self.proc = subprocess.Popen(
            cmd, env=_env(env), stdout=self.out, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )

    def output(self) -> str:
        if not self.out.closed:
            self.out.flush()
        return self.log.read_text()

    def wait_ready(self, files, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not all((self.hs / f).exists() for f in files):
            if self.proc.poll() is not None:
                raise AssertionError(f"the core job exited with {self.proc.returncode}\n{self.output()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"the core job did not publish {files} in {timeout}s\n{self.output()}")
            time.sleep(0.1)

    def stop(self, timeout: float = 60) -> int:
        (self.hs / "STOP").touch()
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self.kill()

    def kill(self, sig=signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=20)
            except ProcessLookupError:
                pass
        self.out.close()


RECORDS = ["a.ddstore.json", "b.ddstore.json", "c.ddstore.json"]


def extra_env(handshake_dir, extra=None):
    return {"DDSTORE_HANDSHAKE_DIR": handshake_dir, "DDSTORE_HANDSHAKE_TIMEOUT_S": "60", **(extra or {})}


@pytest.mark.parametrize("fabric", FABRICS)
def test_core_and_extra_jobs(fabric, handshake_dir):
    env = {**fabric, "DDSTORE_MPI": None}
    core = Core(handshake_dir, env)
    try:
        core.wait_ready(RECORDS)
        args = ("read", "--hs", str(handshake_dir), "--n-core", "2")
        out = run_mpi(2, "m2_extra.py", *args, env=extra_env(handshake_dir, env), timeout=180).stdout
        assert out.count("extra read ok (ofi:") >= 1, out
        plain = run_procs(1, "m2_extra.py", *args, env=extra_env(handshake_dir, env), timeout=180)
        assert "extra read ok" in plain[0].stdout
        assert core.stop() == 0, core.output()
    finally:
        core.kill()
    assert core.output().count("core stopped: rank") >= 1
    assert not list(handshake_dir.glob("*.ddstore.json")), "free() must remove the records"


def test_records_are_owner_only(handshake_dir):
    hs = handshake_dir / "made-by-core"  # the core creates it
    core = Core(hs, {"DDSTORE_FABRIC": "tcp"})
    try:
        core.wait_ready(RECORDS)
        assert stat.S_IMODE(hs.stat().st_mode) == 0o700
        tokens = ["." + r.replace(".json", ".token") for r in RECORDS]
        for f in RECORDS + tokens:
            assert stat.S_IMODE((hs / f).stat().st_mode) == 0o600, f
        assert not list(hs.glob("*.tmp*")), "temporary files left behind"
    finally:
        core.stop()


def test_a_store_publishes_its_addresses_once(handshake_dir):
    """The core ranks' endpoint addresses are in one address file per store; each variable's
    record holds per core rank only its packed share (no address), and names the address file.
    A truncated address file is refused naming it."""
    from pyddstore import DDStoreError, _handshake, _native

    core = Core(handshake_dir, {"DDSTORE_FABRIC": "tcp", "DDSTORE_SHM": "0"})
    try:
        core.wait_ready(RECORDS)
        address_files = sorted(handshake_dir.glob("+peers-*.ddstore.json"))
        assert len(address_files) == 1, address_files  # one store: one address file
        where = str(address_files[0])
        raw = address_files[0].read_bytes()
        assert stat.S_IMODE(address_files[0].stat().st_mode) == 0o600
        peers = _handshake.parse_peers(raw, where, 2, 0)
        assert peers["provider"].startswith("tcp") and len(set(peers["addrs"])) == 2, peers
        records = sorted(set(handshake_dir.glob("*.ddstore.json")) - set(address_files))
        assert len(records) == 5, records  # a, b, c and the ragged variable's two parts
        for path in records:
            text = path.read_bytes()
            body = _handshake.parse_record(text, str(path), 2)
            assert body["peers"] == {"id": peers["id"], "mac": peers["mac"]}, path
            assert len(body["packed_shares"]) == 2 * _native.PACKED_SHARE_BYTES, path
            assert "records" not in body
            assert not any(a.hex().encode() in text for a in peers["addrs"]), path
        for cut in (0, 40, len(raw) // 2, len(raw) - 1):
            with pytest.raises(DDStoreError, match=r"address file .*\+peers-.*(corrupt|truncated)"):
                _handshake.parse_peers(raw[:cut], where, 2, 0)
        assert core.stop() == 0, core.output()
    finally:
        core.kill()
    assert not list(handshake_dir.glob("+peers-*")), "free() removes the address file and its lock"


def test_record_bytes_per_core_rank_are_constant_and_hold_no_address():
    """Synthetic records at 1,024 to 65,536 core ranks (the scale bench's figure): a variable's
    record grows by the same bytes per core rank (its packed share, base64, and its count), and
    the addresses are in the store's address file only."""
    from pyddstore.benchmarks.scale import method2_files

    from pyddstore import _native

    small, large, largest = (method2_files(n) for n in (1024, 16384, 65536))
    share = 4 * _native.PACKED_SHARE_BYTES // 3  # base64
    count = len("256, ")
    # Per core rank (a byte or two of the whole is the writer's time, whose digits vary).
    for a, b in ((small, large), (large, largest)):
        per_rank = (b["record"] - a["record"]) / (b["n_core"] - a["n_core"])
        assert per_rank == pytest.approx(share + count, abs=0.01), (a, b)
        # The address file: the address (16 bytes, hex) once per core rank, once per store.
        per_rank = (b["address_file"] - a["address_file"]) / (b["n_core"] - a["n_core"])
        assert per_rank == pytest.approx(2 * 16 + len('"", '), abs=0.01), (a, b)
        # Same-node locators (the default): a packed locator per rank, each host id once.
        per_rank = (b["record_shm"] - a["record_shm"]) / (b["n_core"] - a["n_core"])
        locator = 4 * _native.PACKED_LOCATOR_BYTES // 3
        assert share + count + locator < per_rank < share + count + locator + 64 / 8, (a, b)
    print(f"method-2 files at 16,384 core ranks: {large}")
    assert large["record"] < 1_000_000  # format 3: 5.5 MB, 336 B per core rank
    assert large["record_shm"] < 2_000_000  # format 3: 8.0 MB, 487 B per core rank


def test_join_times_out_without_core(handshake_dir):
    env = extra_env(handshake_dir, {"DDSTORE_FABRIC": "tcp", "DDSTORE_HANDSHAKE_TIMEOUT_S": "2"})
    args = ("timeout", "--hs", str(handshake_dir), "--n-core", "2")
    t0 = time.monotonic()
    out = run_procs(1, "m2_extra.py", *args, env=env, timeout=60)[0].stdout
    assert "DDStoreTimeoutError after" in out and time.monotonic() - t0 < 40


@pytest.mark.parametrize("shm", ["0", "1"])
def test_reader_after_core_stopped(shm, handshake_dir):
    """A read of a stopped core raises DDStoreTimeoutError naming the rank, through the fabric
    and through same-node mappings (which outlive the core: the extra checks the core's pid)."""
    env = {"DDSTORE_FABRIC": "tcp", "DDSTORE_SHM": shm}
    core = Core(handshake_dir, env)
    try:
        core.wait_ready(RECORDS)
        extra = subprocess.Popen(
            [sys.executable, str(SCRIPTS / "m2_extra.py"), "after_stop", "--hs", str(handshake_dir)]
            + ["--n-core", "2"],
            env=_env(extra_env(handshake_dir, {**env, "DDSTORE_TIMEOUT_S": "3"})),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert core.proc.wait(timeout=120) == 0, core.output()  # the extra creates STOP
            (handshake_dir / "core-exited").touch()
            out, err = extra.communicate(timeout=120)
        finally:
            if extra.poll() is None:
                extra.kill()
                extra.wait()
        assert extra.returncode == 0, f"{out}\n{err}"
        want = "read after the core stopped -> DDStoreTimeoutError"
        assert want in out, out
        print(out)
    finally:
        core.kill()


def test_job_token_from_the_environment(handshake_dir):
    """A core job given DDSTORE_JOB_TOKEN writes no token file; an extra job with the same
    DDSTORE_JOB_TOKEN joins and reads, one with another token is refused."""
    env = {"DDSTORE_FABRIC": "tcp", "DDSTORE_JOB_TOKEN": "core-secret-1"}
    core = Core(handshake_dir, env)
    try:
        core.wait_ready(RECORDS)
        assert not list(handshake_dir.glob("*.token")), "an explicit token must not be written out"
        args = ("read", "--hs", str(handshake_dir), "--n-core", "2")
        out = run_procs(1, "m2_extra.py", *args, env=extra_env(handshake_dir, env), timeout=120)[0].stdout
        assert "extra read ok" in out
        wrong = {**env, "DDSTORE_JOB_TOKEN": "core-secret-2", "M2_RIGHT_TOKEN": "core-secret-1"}
        args = ("wrong_token", "--hs", str(handshake_dir), "--n-core", "2")
        out = run_procs(1, "m2_extra.py", *args, env=extra_env(handshake_dir, wrong), timeout=120)[0].stdout
        assert "wrong token -> DDStoreAccessError" in out, out
        print(out)
        assert core.stop() == 0, core.output()
    finally:
        core.kill()


def test_stale_record_of_a_dead_core(handshake_dir):
    env = {"DDSTORE_FABRIC": "tcp", "DDSTORE_MPI": "0", "DDSTORE_COMM": "file"}
    core = Core(handshake_dir, env, 0)  # one plain process, killed without freeing
    try:
        core.wait_ready(RECORDS)
    finally:
        core.kill(signal.SIGKILL)
    assert (handshake_dir / "a.ddstore.json").exists()
    args = ("stale", "--hs", str(handshake_dir), "--n-core", "1")
    out = run_procs(1, "m2_extra.py", *args, env=extra_env(handshake_dir, env), timeout=60)[0].stdout
    assert "stale record -> DDStoreError" in out and "no longer running" in out


def test_core_group_of_plain_processes(handshake_dir):
    """A core job without MPI (file communicator, 2 processes) and an extra under mpirun."""
    env = {"DDSTORE_FABRIC": "tcp", "DDSTORE_MPI": "0"}
    procs = []
    for rank in range(2):
        e = _env({**env, "SLURM_PROCID": rank, "SLURM_NTASKS": 2, "DDSTORE_JOB_ID": "core-m2"})
        cmd = [sys.executable, str(SCRIPTS / "m2_core.py"), "--hs", str(handshake_dir), "--comm", "file"]
        out = subprocess.PIPE
        procs.append(subprocess.Popen(cmd, env=e, stdout=out, stderr=subprocess.STDOUT, text=True))
    try:
        deadline = time.monotonic() + 120
        while not all((handshake_dir / f).exists() for f in RECORDS):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), [
                p.communicate()[0] for p in procs if p.poll() is not None
            ]
            time.sleep(0.1)
        args = ("read", "--hs", str(handshake_dir), "--n-core", "2")
        run_mpi(2, "m2_extra.py", *args, env=extra_env(handshake_dir, {"DDSTORE_FABRIC": "tcp"}), timeout=180)
    finally:
        (handshake_dir / "STOP").touch()
        outs = []
        for p in procs:
            try:
                outs.append(p.communicate(timeout=60)[0])
            except subprocess.TimeoutExpired:
                p.kill()
                outs.append(p.communicate()[0])
    assert all(p.returncode == 0 for p in procs), outs


def test_ddstore_width_publishes_one_record_per_group(handshake_dir):
    env = {"DDSTORE_FABRIC": "tcp"}
    core = Core(handshake_dir, env, 2, "m2_core.py", "--width", "1")
    try:
        core.wait_ready(RECORDS + ["a.g1.ddstore.json", "b.g1.ddstore.json", "c.g1.ddstore.json"])
        args = ("read", "--hs", str(handshake_dir), "--n-core", "1")
        for group in ("0", "1"):
            e = extra_env(handshake_dir, {**env, "DDSTORE_CORE_GROUP": group})
            out = run_procs(1, "m2_extra.py", *args, env=e, timeout=120)[0].stdout
            assert f"group {group})" in out
        assert core.stop() == 0, core.output()
    finally:
        core.kill()


@pytest.mark.parametrize("fabric", [FABRICS[0], FABRICS[1], FABRICS[2]])
def test_dist_dataset_reader_loaders(fabric, handshake_dir):
    """DistDatasetReader in an extra job: forked DataLoader workers, ThreadDataLoader and
    WindowedDataset over a DistDataset served by a core job."""
    core = Core(handshake_dir, fabric, 2, "m2_torch_core.py")
    try:
        core.wait_ready(["m2t.meta.json", "m2t%2F0.ddstore.json", "m2t%2F2.ddstore.json"])
        env = extra_env(handshake_dir, {**fabric, "DDSTORE_FORK_WORKERS": "1"})
        args = ("--hs", str(handshake_dir), "--n-core", "2")
        if fabric == {"DDSTORE_FABRIC": "tcp"}:  # as an mpirun job (slow here: once)
            out = run_mpi(2, "m2_torch_extra.py", *args, env=env, timeout=240).stdout
            assert out.count("torch extra ok") >= 1
        else:  # as one plain process
            out = run_procs(1, "m2_torch_extra.py", *args, env=env, timeout=240)[0].stdout
            assert "torch extra ok" in out
        assert core.stop() == 0, core.output()
    finally:
        core.kill()
    assert not list(handshake_dir.glob("*.ddstore.json"))


def test_meta_file_is_owner_only(handshake_dir):
    core = Core(handshake_dir, {"DDSTORE_FABRIC": "tcp"}, 2, "m2_torch_core.py")
    try:
        core.wait_ready(["m2t.meta.json"])
        assert stat.S_IMODE((handshake_dir / "m2t.meta.json").stat().st_mode) == 0o600
    finally:
        core.stop()


@pytest.mark.parametrize("fabric", ["tcp", "shm"])
def test_extra_reads_of_freed_variables_raise(fabric, handshake_dir):
    """The core job frees a fixed and a ragged variable while two extra jobs hold them, keeps
    living and publishes different variables under the same names: every read of the old
    handles raises DDStoreStaleError (never the old rows, never the new ones), on the same-node
    mapping (with a thread reading through the free: each read returns the old rows or raises)
    and through the fabric (DDSTORE_SHM=0, within DDSTORE_TIMEOUT_S: tcp's gather requests, shm's
    one-sided reads by address, which a re-added share must not be found at); a fresh join reads
    the new variables."""
    env = {"DDSTORE_FABRIC": fabric}
    core = Core(handshake_dir, env, 2, "m2_free_core.py")
    extras = {}
    try:
        core.wait_ready(["fx.ddstore.json", "rg%23values.ddstore.json", "rg%23ends.ddstore.json"])
        args = ["--hs", str(handshake_dir), "--n-core", "2"]
        for tag, extra, more in [
            ("shm", {"DDSTORE_SHM": "1"}, ["--race"]),
            # 15 s: a fresh join's first one-sided reads over shm timed out at 5 s once (fi_read
            # kept returning FI_EAGAIN) beside the test command's pool of 4 workers on 2 cores.
            ("fabric", {"DDSTORE_SHM": "0", "DDSTORE_TIMEOUT_S": "15"}, []),
        ]:
            cmd = [sys.executable, str(SCRIPTS / "m2_free_extra.py"), *args, "--tag", tag, *more]
            extras[tag] = subprocess.Popen(
                cmd,
                env=_env(extra_env(handshake_dir, {**env, **extra})),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        deadline = time.monotonic() + 120
        while not all((handshake_dir / f"joined-{t}").exists() for t in extras):
            for tag, p in extras.items():
                assert p.poll() is None, f"extra {tag} exited early:\n" + "\n".join(p.communicate())
            assert time.monotonic() < deadline, "the extra jobs did not join"
            time.sleep(0.1)
        (handshake_dir / "FREE").touch()
        outs = {}
        for tag, p in extras.items():
            out, err = p.communicate(timeout=240)
            outs[tag] = out
            assert p.returncode == 0, f"extra {tag}:\n{out}\n{err}\n--- core ---\n{core.output()}"
            assert f"free extra ok {tag}" in out and "DDStoreStaleError" in out, out
            print(out)
        assert "core rank" in outs["shm"] and "freed this variable" in outs["shm"]
        assert core.stop() == 0, core.output()
    finally:
        for p in extras.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        core.kill()


def test_dist_dataset_reader_of_a_freed_dataset_raises(handshake_dir):
    """DistDatasetReader (same node) over a DistDataset with a fixed and a ragged field that the
    core job frees and re-creates under the same name: the old reader's item, batch and
    ragged row reads raise DDStoreStaleError, a new reader reads the new samples."""
    env = {"DDSTORE_FABRIC": "tcp"}
    core = Core(handshake_dir, env, 2, "m2_torch_free_core.py")
    try:
        core.wait_ready(["m2f.meta.json"])
        cmd = [sys.executable, str(SCRIPTS / "m2_torch_free_extra.py"), "--hs", str(handshake_dir)]
        extra = subprocess.Popen(
            cmd + ["--n-core", "2"],
            env=_env(extra_env(handshake_dir, env)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 180
            while not (handshake_dir / "joined-torch").exists():
                assert extra.poll() is None, "\n".join(extra.communicate())
                assert time.monotonic() < deadline, "the extra job did not join"
                time.sleep(0.1)
            (handshake_dir / "FREE").touch()
            out, err = extra.communicate(timeout=240)
        finally:
            if extra.poll() is None:
                extra.kill()
                extra.wait()
        assert extra.returncode == 0, f"{out}\n{err}\n--- core ---\n{core.output()}"
        assert "torch free extra ok: DDStoreStaleError" in out, out
        print(out)
        assert core.stop() == 0, core.output()
    finally:
        core.kill()
