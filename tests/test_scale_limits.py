"""Descriptor limits at emulated scale (issue 35, item 1), over tcp;ofi_rxm, every peer remote.

A rank's connections cost descriptors: one reader endpoint's 10, and per remote peer its own
connection to the owner and that owner's reader's connection to it (2 per peer). Where the limit
is below that, each reader endpoint keeps a bounded set of live connections (idle peers are
disconnected with fi_av_remove and reconnected on their next read): the job stays correct, slower.
Below even the bounded set, every rank fails at once, naming `ulimit -n`, the need and
DDSTORE_MAX_CONNECTIONS. Run by tests/scripts/scale_fds.py; every read is checked against what
its owner stored. Counted, never timed (the failures' times are checked against half the
readers' timeout only).
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from conftest import SCRIPTS, _env, reports, run_mpi

# Every peer remote (no same-node shared memory): the connections are what is measured.
TCP = {"DDSTORE_FABRIC": "tcp", "DDSTORE_SHM": "0", "DDSTORE_TIMEOUT_S": "120"}
# Descriptors one reader endpoint holds besides its connections (ddstore-core's fd_limit.rs).
PER_ENDPOINT = 10


def _ok(found: list, n: int, rows: int) -> None:
    assert sorted(r["rank"] for r in found) == list(range(n)), found
    for r in found:
        assert r["result"] == "ok", r
        assert r["read"] == rows, r  # every row of the job, twice, each checked in the script


@pytest.mark.slow
def test_16_ranks_below_one_connection_per_peer_read_a_global_shuffle_exactly():
    # 48 descriptors per rank (soft and hard): one connection per peer would need 28 open + 10
    # + 2 x 15 = 68 at N = 16 (measured); the bounded set keeps it within 48.
    # One shuffled epoch: its 64 batches of 8 rows already meet each peer many times, so peers are
    # disconnected and reconnected all through it (a second epoch doubled the test's CPU: 40 s).
    n = 16
    proc = run_mpi(n, "scale_fds.py", "m1", "--limit", "48", "--epochs", "1", env=TCP, timeout=900)
    found = reports(proc.stdout, "SCALEFD")
    assert len(found) >= n // 2, proc.stdout + proc.stderr  # Open MPI may drop a rank's last line
    for r in found:
        assert r["result"] == "ok" and r["read"] == n * 32, r
        assert r["fds_after"] <= 48, r
    # One warning per rank names the limit.
    warned = [ln for ln in proc.stderr.splitlines() if "live connections" in ln]
    assert warned and all("`ulimit -n`" in ln and "limit 48" in ln for ln in warned), proc.stderr[-3000:]
    assert len(warned) <= n, warned


def _start_core(hs, n: int) -> subprocess.Popen:
    cmd = ["mpirun", "-n", str(n), "--bind-to", "none", sys.executable, str(SCRIPTS / "scale_fds.py")]
    cmd += ["core", "--hs", str(hs)]
    out, err = subprocess.PIPE, subprocess.STDOUT
    return subprocess.Popen(cmd, env=_env(TCP), stdout=out, stderr=err, text=True, start_new_session=True)


def _stop_core(core: subprocess.Popen, hs) -> str:
    (hs / "STOP").touch()
    try:
        out, _ = core.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        core.kill()
        out, _ = core.communicate()
    return out


def _wait_record(core: subprocess.Popen, hs, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not (hs / "x.ddstore.json").exists():
        assert core.poll() is None, core.communicate()[0]
        assert time.monotonic() < deadline, "the core job did not publish x"
        time.sleep(0.2)


@pytest.mark.slow
def test_method_2_extra_ranks_below_one_connection_per_core_rank_read_exactly(handshake_dir):
    # 8 core ranks; 8 extra processes, each reading every core rank at 40 descriptors (one
    # connection per core rank: 14 open + 10 + 10 + 2 x 8 = 50, measured).
    core = _start_core(handshake_dir, 8)
    try:
        _wait_record(core, handshake_dir)
        env = {**TCP, "DDSTORE_HANDSHAKE_DIR": str(handshake_dir), "DDSTORE_HANDSHAKE_TIMEOUT_S": "120"}
        # One shuffled epoch, as above.
        args = ["extra", "--hs", str(handshake_dir), "--n-core", "8", "--limit", "40", "--epochs", "1"]
        proc = run_mpi(8, "scale_fds.py", *args, env=env, timeout=900)
    finally:
        core_out = _stop_core(core, handshake_dir)
    found = reports(proc.stdout, "SCALEFD")
    assert len(found) >= 4, proc.stdout + proc.stderr
    for r in found:
        assert r["result"] == "ok" and r["read"] == 8 * 32, r
        assert r["fds_after"] <= 40, r
    assert "live connections" in proc.stderr, proc.stderr[-3000:]
    assert core.returncode == 0, core_out[-3000:]


def _failed_at_once(found: list, limit: int) -> None:
    for r in found:
        assert r["result"] == "DDStoreValueError", r
        msg = r["message"]
        assert "ulimit -n" in msg and "needs at least" in msg and "DDSTORE_MAX_CONNECTIONS" in msg, msg
        assert f"the limit is {limit}" in msg, msg
        # Long before the readers' timeout (120 s): at the pre-flight check, not at a read.
        assert r["elapsed_s"] < 60, r


def test_below_the_bounded_set_every_rank_fails_at_once_naming_the_limit():
    n = 8
    proc = run_mpi(n, "scale_fds.py", "m1", "--limit", "40", env=TCP, timeout=600)
    found = reports(proc.stdout, "SCALEFD")
    assert len(found) >= n // 2, proc.stdout + proc.stderr
    _failed_at_once(found, 40)


@pytest.mark.slow
def test_a_method_2_extra_below_the_bounded_set_fails_at_join(handshake_dir):
    core = _start_core(handshake_dir, 2)
    try:
        _wait_record(core, handshake_dir)
        # 6 open at the join: 6 + 10 + 10 + 2 x 2 = 30 for both core ranks, 20 allowed.
        env = {**TCP, "DDSTORE_HANDSHAKE_DIR": str(handshake_dir)}
        args = ["extra", "--hs", str(handshake_dir), "--n-core", "2", "--limit", "20"]
        proc = run_mpi(2, "scale_fds.py", *args, env=env, timeout=600)
    finally:
        _stop_core(core, handshake_dir)
    found = reports(proc.stdout, "SCALEFD")
    assert found, proc.stdout + proc.stderr
    _failed_at_once(found, 20)


@pytest.mark.parametrize("n", [4, 8])
def test_descriptors_after_a_global_shuffle_grow_by_the_endpoint_and_two_per_remote_peer(n):
    # Default limit: one reader endpoint (10) and, per remote peer, this rank's connection to it
    # and its reader's connection to this rank (before: the same at one reading thread; each
    # more thread added 10 + 2 per peer again).
    found = reports(run_mpi(n, "scale_fds.py", "m1", env=TCP, timeout=600).stdout, "SCALEFD")
    assert len(found) >= n // 2, found
    remote = n - 1
    for r in found:
        assert r["result"] == "ok" and r["read"] == 2 * n * 32, r
        grown = r["fds_after"] - r["fds_store"]
        assert remote <= grown <= PER_ENDPOINT + 2 * remote, r


@pytest.mark.parametrize("n", [4, 8])
def test_a_bounded_set_holds_no_connection_between_reads(n):
    # DDSTORE_MAX_CONNECTIONS=1: a rank's reads hold one connection at a time and none once a
    # call is done, so after everyone's reads only the reader endpoint's 10 descriptors remain
    # (and a few sockets the owners have not closed yet), whatever N.
    env = {**TCP, "DDSTORE_MAX_CONNECTIONS": "1"}
    proc = run_mpi(n, "scale_fds.py", "m1", "--threads", "2", env=env, timeout=600)
    found = reports(proc.stdout, "SCALEFD")
    assert len(found) >= n // 2, proc.stdout + proc.stderr
    for r in found:
        assert r["result"] == "ok" and r["read"] == 2 * n * 32, r
        assert r["fds_after"] - r["fds_store"] <= 2 * PER_ENDPOINT + 4, r
    assert "DDSTORE_MAX_CONNECTIONS" in proc.stderr, proc.stderr[-3000:]


def test_a_second_reading_thread_shares_the_endpoint_where_the_limit_has_no_room_for_another():
    # N = 8, 60 descriptors: one reader endpoint with all its connections fits (28 + 10 + 2 x 7 =
    # 52), a second thread's own would not (76): both threads read through the one endpoint, in
    # turn, with every connection kept (no peer disconnected, no warning).
    n = 8
    proc = run_mpi(n, "scale_fds.py", "m1", "--threads", "2", "--limit", "60", env=TCP, timeout=600)
    found = reports(proc.stdout, "SCALEFD")
    assert len(found) >= n // 2, proc.stdout + proc.stderr
    for r in found:
        assert r["result"] == "ok" and r["read"] == 2 * n * 32, r
        assert r["fds_after"] - r["fds_store"] <= PER_ENDPOINT + 2 * (n - 1), r
    assert "live connections" not in proc.stderr, proc.stderr[-3000:]
