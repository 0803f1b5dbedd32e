"""The network's ordinary troubles (issue 23 items 3-6): peers and readers stopped and
resumed, many variables read from many threads, signals during native waits, one rank
dying under mpirun. Real jobs over real providers (tcp over loopback).

The stalled-peer-then-resume cases for tcp, sockets and shm are in test_reliability.py."""

import time

import pytest
from conftest import reports, run_mpi, show


def test_many_variables_from_many_threads_share_endpoints_and_a_stopped_reader_reads_on():
    # 9 ranks: rank 0 reads 25 variables from 8 peers in 4 threads while rank 1 stops and
    # resumes it 3 times; every row is checked by the script.
    proc = run_mpi(9, "net_threads.py", env={"DDSTORE_SHM": "0", "DDSTORE_FABRIC": "tcp"}, timeout=240)
    found = [r for r in reports(proc.stdout, "threads") if r["rank"] == 0]
    show("threads", found)
    assert found, proc.stdout[-3000:]
    r = found[0]
    assert r["batches"] >= 25 * 4, r
    # Endpoints per concurrent reader, not per variable and thread: 25 x 4 x 8 held ~1,700.
    assert r["fds_after"] - r["fds_before"] < 200, r


def test_ctrl_c_during_a_stalled_read_and_a_barrier_raises_keyboard_interrupt_promptly():
    # DDSTORE_TIMEOUT_S=10: each wait would last 10 s uninterrupted (the read: rank 1 stopped).
    env = {"DDSTORE_SHM": "0", "DDSTORE_FABRIC": "tcp", "DDSTORE_TIMEOUT_S": "10"}
    proc = run_mpi(2, "net_signals.py", "interrupt", env=env, timeout=180)
    found = {r["rank"]: r for r in reports(proc.stdout, "signals")}
    show("signals", found.values())
    assert found, proc.stdout[-3000:]
    # Each script asserts the rows read after the interrupt are exact.
    if 0 in found:
        assert found[0]["read_interrupt_s"] < 1.0, found[0]
    if 1 in found:
        assert found[1]["barrier_interrupt_s"] < 1.0, found[1]
        assert "interrupted" in found[1]["next_collective"], found[1]


@pytest.mark.parametrize("abort", ["0", "1"])
def test_one_rank_dying_of_an_uncaught_exception_ends_the_mpirun_job(abort):
    limit = 3
    env = {"DDSTORE_SHM": "0", "DDSTORE_FABRIC": "tcp", "DDSTORE_TIMEOUT_S": str(limit)}
    env["DDSTORE_ABORT_ON_EXCEPTION"] = abort
    proc = run_mpi(2, "net_signals.py", "uncaught", env=env, timeout=120, expect_ok=False)
    ended = time.time()
    found = reports(proc.stdout, "uncaught")
    assert proc.returncode != 0 and found, proc.stdout[-3000:] + proc.stderr[-3000:]
    waited = ended - found[0]["waiting_since"]
    print(f"abort={abort}: the job ended {waited:.1f} s after rank 0 began waiting")
    assert waited < limit + 10, waited
    if abort == "1":
        assert "aborting the MPI job (DDSTORE_ABORT_ON_EXCEPTION=1)" in proc.stderr, proc.stderr[-3000:]
    else:
        assert "DDStoreTimeoutError" in proc.stderr and "rank 1" in proc.stderr, proc.stderr[-3000:]
