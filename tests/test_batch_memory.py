"""Batch memory and the read-ahead stage (issue 37): large batches land in resident, reused
memory (no new pages after the first batches), and a spilling variable's stage holds the next
batches of 14 MB rows within the budget (over 90% of the spilled rows an epoch reads in the
sampler's order are found staged). Every batch is compared with the source
(tests/scripts/batch_memory.py)."""

import pytest
from conftest import run_mpi


@pytest.mark.parametrize("ranks", [1, 2])
def test_large_batches_land_in_reused_memory(ranks):
    out = run_mpi(ranks, "batch_memory.py", "faults", env={"DDSTORE_FABRIC": "tcp"}, timeout=300).stdout
    assert out.count("batch memory ok") == ranks, out


@pytest.mark.slow  # 20-40 s on a loaded 2-core machine: 40 rows of 14 MB per rank, a third spilled
@pytest.mark.parametrize("ranks", [1, 2])
def test_the_stage_holds_the_next_batches_of_large_rows(tmp_path, ranks):
    d = tmp_path / "spill"
    d.mkdir(mode=0o700)
    env = {"DDSTORE_FABRIC": "tcp", "DDSTORE_STAGE_ROWS": "16"}
    out = run_mpi(ranks, "batch_memory.py", "stage", str(d), env=env, timeout=600).stdout
    assert out.count("stage ok") == ranks, out
