"""Native file loads from a file system that hangs: a FUSE server built in the test
(tests/scripts/hangfs.py, the kernel protocol on /dev/fuse, no libfuse) whose READs of one
byte range are never answered (a Lustre OST or NFS server gone) or all answered late (slow but
moving). The load must fail within DDSTORE_LOAD_TIMEOUT_S naming the file and range on every
rank, succeed when slow, and the process must exit cleanly once the hung read is answered.

Skipped (with the reason) where /dev/fuse or root is missing, or mounting is refused."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from conftest import SCRIPTS, _env, reports, run_mpi

sys.path.insert(0, str(SCRIPTS))
from hungfs_load import pattern  # noqa: E402

TIMEOUT_S = 3
K = 64 << 10


@contextlib.contextmanager
def hangfs(tmp_path, files: dict, spec: dict):
    """Mounts hangfs.py at tmp_path/mnt over tmp_path/backing holding `files` (name -> bytes);
    yields (mount point, server pid). Always ends the server (aborting held requests) and
    lazily unmounts, whatever the test did."""
    if not os.path.exists("/dev/fuse"):
        pytest.skip("/dev/fuse is missing: no FUSE in this machine or container")
    if os.geteuid() != 0:
        pytest.skip("mounting a FUSE file system through mount(2) needs root")
    backing, mnt = tmp_path / "backing", tmp_path / "mnt"
    backing.mkdir()
    mnt.mkdir()
    for name, data in files.items():
        (backing / name).write_bytes(data)
    server = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "hangfs.py"), str(mnt), str(backing), json.dumps(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        first = server.stdout.readline().strip()
        if first != "ready":
            pytest.skip(f"hangfs could not mount: {first or server.stdout.read()}")
        yield str(mnt), server.pid
    finally:
        # Ending the server first aborts any READ still held, so no reader stays stuck.
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(10)
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)


def test_hung_range_times_out_and_slow_ranges_succeed(tmp_path):
    files = {
        "slow.bin": pattern("slow.bin", 6 * K),
        "good.bin": pattern("good.bin", 4 * K),
        "hung.bin": pattern("hung.bin", 4 * K),
    }
    spec = {"hang": {"hung.bin": [2 * K, 2 * K + 1]}, "delay": {"slow.bin": 0.8}}
    with hangfs(tmp_path, files, spec) as (mnt, server):
        proc = subprocess.run(
            [sys.executable, str(SCRIPTS / "hungfs_load.py"), "single", mnt, str(server)],
            env=_env({"DDSTORE_LOAD_TIMEOUT_S": str(TIMEOUT_S)}),
            capture_output=True,
            text=True,
            timeout=120,
        )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out  # no crash from the late write, a clean exit
    (rep,) = reports(proc.stdout, "report:")
    # Slow but moving: 4.8 s in all, past the 3 s deadline, each read under it.
    assert rep["slow_ok"] and rep["slow_secs"] > TIMEOUT_S, rep
    # The hung range: named, within the deadline (plus scheduling slack), other ranges landed.
    assert TIMEOUT_S - 0.1 <= rep["hung_secs"] < TIMEOUT_S + 10, rep
    err = rep["hung_error"]
    for part in ("hung.bin bytes 131072..196608", "DDSTORE_LOAD_TIMEOUT_S=3", "file system may be hung"):
        assert part in err, err
    assert rep["landed_ok"], rep
    # The abandoned reader keeps the freed share mapped until its read returns, then exits.
    assert rep["readers_after_timeout"] == 1, rep
    assert rep["mapped_before_free"] and rep["mapped_after_free"], rep
    assert rep["readers_gone"] and rep["unmapped_after_reader"], rep


def test_dist_dataset_hung_file_fails_on_both_ranks(tmp_path):
    rows = np.arange(2048 * 64, dtype=np.float32).reshape(2048, 64)
    files = {}
    for name, part in (("a.npy", rows[:1024]), ("b.npy", rows[1024:])):
        path = tmp_path / name
        np.save(path, part)
        files[name] = path.read_bytes()
    # Rank 1's rows are b.npy's data (from byte 128): never answered past its first 64 KiB.
    with hangfs(tmp_path, files, {"hang": {"b.npy": [K, K + 1]}}) as (mnt, server):
        proc = run_mpi(
            2,
            "hungfs_load.py",
            "dist",
            mnt,
            str(server),
            env={"DDSTORE_LOAD_TIMEOUT_S": str(TIMEOUT_S)},
            timeout=120,
        )
    found = {r["rank"]: r for r in reports(proc.stdout, "report:")}
    assert found, proc.stdout + proc.stderr
    for rank, rep in found.items():
        err = rep["error"] or ""
        assert err.startswith("DDStoreTimeoutError"), rep
        assert "b.npy bytes 128.." in err and "DDSTORE_LOAD_TIMEOUT_S" in err, rep
        if rank == 0:
            assert "on another rank: rank 1" in err, rep
        assert rep["secs"] < TIMEOUT_S + 30, rep  # no hang on either rank
    if 1 in found:
        assert found[1]["readers_gone"], found[1]
