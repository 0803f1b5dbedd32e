"""The network's ordinary troubles (issue 23 items 3-6): peers and readers stopped and
resumed, many variables read from many threads, signals during native waits, one rank
dying under mpirun. Real jobs over real providers (tcp over loopback).

The stalled-peer-then-resume cases for tcp, sockets and shm are in test_reliability.py."""

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
