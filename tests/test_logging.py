"""Logging: the `pyddstore` logger has only a NullHandler by default (nothing printed);
DDSTORE_LOG_LEVEL gives it a level and a stderr handler: the store's method/provider and
the load summary at INFO, per-rank timings at DEBUG, one line per event with the rank."""

import subprocess
import sys

import pytest
from conftest import _env

pytest.importorskip("torch")

LOAD = r"""
import logging, torch
from torch.utils.data import TensorDataset
import pyddstore
from pyddstore.torch import DistDataset
log = logging.getLogger("pyddstore")
assert any(isinstance(h, logging.NullHandler) for h in log.handlers), log.handlers
x = torch.arange(64, dtype=torch.float32).reshape(16, 4)
ds = DistDataset(TensorDataset(x), "logged", comm=pyddstore._native.Comm.single(), method=1)
assert torch.equal(ds[5][0], x[5])
ds.free()
print("done")
"""


def _run(env):
    proc = subprocess.run(
        [sys.executable, "-c", LOAD], env=_env(env), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and "done" in proc.stdout, proc.stderr
    return [line for line in proc.stderr.splitlines() if "pyddstore" in line]


def test_silent_by_default_and_levels_from_the_environment():
    assert _run({"DDSTORE_LOG_LEVEL": None, "DDSTORE_PROFILE": None}) == []
    lines = _run({"DDSTORE_LOG_LEVEL": "debug", "DDSTORE_QUIET": "0"})
    text = "\n".join(lines)
    assert "pyddstore INFO: rank 0: store of 1 ranks: method 1, transport ofi:tcp;ofi_rxm" in text, text
    assert "pyddstore.torch INFO: rank 0: loaded logged: 16 samples" in text, text
    assert "pyddstore.torch DEBUG: rank 0: logged: loaded rows 0..16 (256 bytes)" in text, text
    assert all(" rank " in line for line in lines), lines  # every line names its rank


def test_bad_level_is_a_clear_error():
    proc = subprocess.run(
        [sys.executable, "-c", "import pyddstore"],
        env=_env({"DDSTORE_LOG_LEVEL": "loud"}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0 and "DDSTORE_LOG_LEVEL='loud'" in proc.stderr, proc.stderr
