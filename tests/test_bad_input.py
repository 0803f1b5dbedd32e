"""The bad-input matrix (tests/scripts/bad_input.py): 72 distinct bad calls across
PyDDStore, the environment, method-2 records, DistDataset, WindowedDataset,
row_of, DistDatasetReader, ThreadDataLoader and the CLI, each raising the
expected exception type with a message fragment, each followed by a valid read."""

import pytest
from conftest import run_mpi

pytest.importorskip("torch")


def test_bad_input_matrix():
    out = run_mpi(2, "bad_input.py", env={"DDSTORE_FABRIC": "tcp"}, timeout=300).stdout
    assert out.count("bad calls raised clearly; the store kept working") >= 1
