"""The owner-side gather path over tcp and sockets (DDSTORE_REMOTE_GATHER): one request per owner
per batch, answered by the owner's progress thread. Methods 1 and 2, with and without same-node
memory copies, repeats, 4 threads, a forked child, split replies, a stopped owner and a freed
variable; every read is checked against the owner's rows (tests/scripts/gather.py)."""

import json
import re
import subprocess
import sys
import time

import pytest
from conftest import SCRIPTS, _env, run_mpi, run_procs

CASES = [
    pytest.param({"DDSTORE_FABRIC": "tcp", "DDSTORE_SHM": "0"}, id="tcp"),
    # sockets reads one-sided by default (auto); the gather path works there when asked for.
    pytest.param(
        {"DDSTORE_FABRIC": "sockets", "DDSTORE_SHM": "0", "DDSTORE_REMOTE_GATHER": "1"}, id="sockets"
    ),
    # Same-node rows by memory copy beside the gather path (remote_path stays "gather").
    pytest.param({"DDSTORE_FABRIC": "tcp", "DDSTORE_SHM": "1"}, id="tcp-shm"),
    # A 4-deep window and 64 KiB replies: several requests per owner, 1 MB rows split.
    pytest.param(
        {
            "DDSTORE_FABRIC": "tcp",
            "DDSTORE_SHM": "0",
            "DDSTORE_MAX_INFLIGHT": "4",
            "DDSTORE_MAX_READ_BYTES": "65536",
        },
        id="tcp-small-window",
    ),
    # Forced one-sided reads: the previous path, same checks.
    pytest.param(
        {
            "DDSTORE_FABRIC": "tcp",
            "DDSTORE_SHM": "0",
            "DDSTORE_REMOTE_GATHER": "0",
            "GATHER_EXPECT": "one-sided",
        },
        id="tcp-one-sided",
    ),
]


@pytest.mark.parametrize("env", CASES)
def test_gather_reads_are_verified(env):
    out = run_mpi(3, "gather.py", "read", env={"DDSTORE_TIMEOUT_S": "60", **env}, timeout=240).stdout
    assert out.count("gather read ok") >= 1, out


@pytest.mark.parametrize("bounded", [False, True], ids=["default", "bounded-set"])
def test_reader_cap_answers_busy_and_readers_retry(bounded):
    """Each owner serves 2 reader endpoints at once (DDSTORE_GATHER_READERS=2) while 9 (3 threads
    on each of the 3 other ranks) read it together: every row arrives and is checked, the readers
    were answered "busy" and sent again (busy_retries), and nobody waited out DDSTORE_TIMEOUT_S
    (600 s, beyond the job's own timeout: a request left unanswered would fail the test).
    bounded-set: DDSTORE_MAX_CONNECTIONS set, so fi_av_remove closes connections
    (FI_AV_REMOVE_CLEANUP, as in jobs of more than 1,025 ranks): an owner that forgot an idle
    reader's route once closed its connection, and that reader's next request went unanswered."""
    env = {
        "DDSTORE_FABRIC": "tcp",
        "DDSTORE_SHM": "0",
        "DDSTORE_REMOTE_GATHER": "1",
        "DDSTORE_GATHER_READERS": "2",
        "DDSTORE_TIMEOUT_S": "600",
    }
    if bounded:
        env["DDSTORE_MAX_CONNECTIONS"] = "3"  # every peer fits: only the removal's effect changes
    out = run_mpi(4, "gather.py", "capped", env=env, timeout=300).stdout
    m = re.search(r"capped read ok: busy_retries=(\d+)", out)
    assert m, out
    assert int(m.group(1)) > 0, out


@pytest.mark.parametrize("remote_gather", ["auto", "0", "1"])
def test_stopped_owner_times_out_naming_it(handshake_dir, remote_gather):
    """A read of a SIGSTOPped owner times out naming it; its data, arriving after SIGCONT, never
    lands in the buffer the caller got back (refilled with a pattern), on each path: the
    per-request one-sided read (auto), one-sided only (0), gathered (1)."""
    # 5 s: the reads after SIGCONT reconnect to the resumed owner, on a loaded CI machine too.
    env = {"DDSTORE_FABRIC": "tcp", "DDSTORE_SHM": "0", "DDSTORE_TIMEOUT_S": "5"}
    env["DDSTORE_REMOTE_GATHER"] = remote_gather
    env["DDSTORE_HANDSHAKE_DIR"] = str(handshake_dir)
    procs = run_procs(3, "gather.py", "stopped", env=env, timeout=180)
    out = procs[0].stdout
    assert "stopped owner: DDStoreTimeoutError after" in out and "reads after SIGCONT ok" in out, out


def test_method2_extra_job_and_freed_variable(handshake_dir):
    """An extra job reads a core's variable through the gather path; once the core frees it,
    a read is an error and the caller's buffer is untouched."""
    hs = str(handshake_dir)
    env = {"DDSTORE_FABRIC": "tcp", "DDSTORE_SHM": "0", "DDSTORE_TIMEOUT_S": "5", "DDSTORE_MPI": "0"}
    core_env = _env({**env, "SLURM_PROCID": "0", "SLURM_NTASKS": "1"})
    core = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "gather.py"), "core", "--hs", hs],
        env=core_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (handshake_dir / "g.ddstore.json").exists():
            assert core.poll() is None, core.communicate()
            assert time.monotonic() < deadline, "the core did not publish"
            time.sleep(0.1)
        extra = run_procs(1, "gather.py", "extra", "--hs", hs, env=env, timeout=180, expect_ok=False)[0]
        print(extra.stdout)
        assert extra.returncode == 0, f"{extra.stdout}\n{extra.stderr}"
        assert "extra freed-variable ok" in extra.stdout, extra.stdout
        # The owner freed its store and serves nothing while its process lives: the read fails
        # within DDSTORE_TIMEOUT_S and, the core's record being gone, is reported as stale (a
        # stopped owner stays DDStoreTimeoutError: test_method2).
        assert "freed variable: DDStoreStaleError" in extra.stdout, extra.stdout
    finally:
        (handshake_dir / "STOP").touch()
        try:
            core.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            core.kill()
            core.communicate()
    assert core.returncode == 0


@pytest.mark.slow
def test_auth_cost_bench_smoke(tmp_path):
    """tools/auth_cost.py against this same build: one round of tiny jobs,
    every row checked by the bench, a figure and a ratio per row size."""
    out = tmp_path / "auth.json"
    cmd = [
        sys.executable,
        str(SCRIPTS.parent.parent / "tools" / "auth_cost.py"),
        "--against",
        sys.executable,
        "--rounds",
        "1",
    ]
    cmd += ["--row-sizes", "3072,131072", "--batches", "5,3", "--json", str(out)]
    p = subprocess.run(cmd, env=_env(None), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    summary = json.loads(out.read_text())["summary"]
    assert [s["row_bytes"] for s in summary] == [3072, 131072]
    for s in summary:
        assert s["this_us"] > 0 and s["other_us"] > 0 and s["ratio"] > 0, s


@pytest.mark.slow
def test_paths_bench_smoke(tmp_path):
    """python -m pyddstore.benchmarks.paths: both paths and the plain-socket line alternated, every
    rank reading, rows checked by the bench; each line has the three times, its ratio's quartiles
    and the gather path's ratio to the socket line, printed (the 3 KB x 128 line as a sentence, with
    both lines' CPU time per batch)."""
    out = tmp_path / "paths.json"
    args = ["--row-sizes", "3072", "--batch-sizes", "1,128", "--rounds", "2", "--seconds", "0.02"]
    proc = run_mpi(2, "paths_run.py", *args, "--share-bytes", "1e6", "--json", str(out), timeout=240)
    lines = json.loads(out.read_text())["lines"]
    assert [(x["row_bytes"], x["batch"]) for x in lines] == [(3072, 1), (3072, 128)]
    for x in lines:
        assert x["auto_us_per_row"] > 0 and x["one_sided_us_per_row"] > 0, x
        assert 0 < x["ratio_q1"] <= x["ratio_median"] <= x["ratio_q3"], x
        assert x["socket_us_per_row"] > 0, x
        assert 0 < x["auto_vs_socket_q1"] <= x["auto_vs_socket"] <= x["auto_vs_socket_q3"], x
        assert x["auto_cpu_us_per_batch"] > 0 and x["socket_cpu_us_per_batch"] > 0, x
    assert "socket us/row" in proc.stdout and "x socket" in proc.stdout, proc.stdout
    assert "# CPU per batch: " in proc.stdout, proc.stdout
    headline = f"is {lines[1]['auto_vs_socket']:.2f}x a plain-socket gather of 128 x 3 KB rows"
    assert headline in proc.stdout, proc.stdout
