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
assert repr(ds).startswith("<DistDataset 'logged': 16 samples, fields {0: float32(4)}, method 1 ("), repr(ds)
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


def test_bad_level_warns_and_import_goes_on():
    proc = subprocess.run(
        [sys.executable, "-c", "import pyddstore; print('imported')"],
        env=_env({"DDSTORE_LOG_LEVEL": "loud"}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and "imported" in proc.stdout, proc.stderr
    assert "DDSTORE_LOG_LEVEL='loud' is not valid" in proc.stderr and "Warning" in proc.stderr, proc.stderr


APP = r"""
import ctypes, logging, os, subprocess, sys
logging.basicConfig(level=logging.INFO, format="APP %(name)s %(levelname)s %(message)s")
import pyddstore
libc = ctypes.CDLL(None)
libc.getenv.restype = ctypes.c_char_p
fabric = pyddstore._native.libfabric_env()["variables"]
assert fabric, fabric
for name, (value, ours) in fabric.items():
    c_value = (libc.getenv(name.encode()) or b"").decode()
    assert os.environ.get(name) == c_value == value, (name, os.environ.get(name), c_value, value)
child = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('FI_UNIVERSE_SIZE'))"],
                       capture_output=True, text=True, check=True).stdout.strip()
assert child == fabric["FI_UNIVERSE_SIZE"][0], child
store = pyddstore.PyDDStore(pyddstore._native.Comm.single(), method=1)
store.free()
print("done")
"""


def test_application_logging_and_ddstore_level_print_each_line_once():
    """DDSTORE_LOG_LEVEL set and the application's own logging.basicConfig: each line once
    (through the application's handler); `import pyddstore` logs each libfabric variable it set
    and why, and os.environ shows them as the C environment does."""
    env = {"DDSTORE_LOG_LEVEL": "debug", "DDSTORE_FABRIC": "tcp", "FI_UNIVERSE_SIZE": None}
    proc = subprocess.run(
        [sys.executable, "-c", APP], env=_env(env), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and "done" in proc.stdout, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "pyddstore" in line]
    assert any("store of 1 ranks: method 1" in line for line in lines), proc.stderr
    assert all(line.startswith("APP ") for line in lines), lines  # none from pyddstore's own handler
    assert len(lines) == len(set(lines)), lines
    assert any("FI_UNIVERSE_SIZE=16 (set by pyddstore): rxm" in line and "DEBUG" in line for line in lines), (
        lines
    )
