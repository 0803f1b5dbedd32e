"""A process forked after a large same-node read reads as its parent did (no thread pool
is carried across fork): methods 0 (shared window) and 1 (memfd) under mpirun, and a
DataLoader whose main process read a 64 MiB batch before forking its workers."""

import pytest
from conftest import run_mpi


@pytest.mark.parametrize("method", ["0", "1"])
def test_child_reads_after_parent_read_a_large_batch(method):
    out = run_mpi(2, "fork_large.py", method, timeout=240).stdout
    assert f"fork_large ok (method {method}" in out, out


def test_dataloader_workers_fork_after_a_large_batch_in_the_main_process():
    pytest.importorskip("torch")
    out = run_mpi(2, "fork_large.py", "loader", timeout=240).stdout
    assert "fork_large loader ok" in out, out
