"""Providers by name: DDSTORE_FABRIC passes any libfabric provider name through (efa, opx,
psm3, ucx, ...), a provider absent here is a clear error, a malformed name a ValueError,
and `python -m pyddstore info` lists the providers usable for one-sided reads."""

import subprocess
import sys

import pytest
from conftest import _env, run_procs

CHECK = r"""
import sys, pyddstore
try:
    pyddstore.PyDDStore(None, method=1)
except pyddstore.DDStoreError as e:
    print(type(e).__name__, "::", e)
else:
    print("no error")
"""


def _store_error(fabric: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", CHECK],
        env=_env({"DDSTORE_FABRIC": fabric}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_full_provider_name_is_passed_through(handshake_dir):
    # "tcp;ofi_rxm" spelled as libfabric names it (no alias), two plain processes, content checked.
    env = {"DDSTORE_FABRIC": "tcp;ofi_rxm", "DDSTORE_SHM": "0", "DDSTORE_HANDSHAKE_DIR": handshake_dir}
    procs = run_procs(2, "store_basic.py", "1", "none", env=env)
    assert all("store_basic ok (method 1, ofi:tcp;ofi_rxm" in p.stdout for p in procs)


@pytest.mark.parametrize("fabric", ["efa", "opx", "psm3", "ucx"])
def test_named_provider_absent_here_is_a_clear_error(fabric):
    out = _store_error(fabric)
    # None of these has hardware (or a provider build) here: the error names it and says where to look.
    assert out.startswith("DDStoreUnsupportedError ::"), out
    assert f"{fabric}:" in out and "python -m pyddstore info" in out, out


def test_malformed_provider_name_is_a_value_error():
    out = _store_error("tcp; rm")
    assert out.startswith("DDStoreValueError ::") and "DDSTORE_FABRIC" in out and "psm3" in out, out
    # A well-formed name that is neither known nor a provider here: a typo, refused at once.
    out = _store_error("nope")
    assert out.startswith("DDStoreValueError ::") and "here: " in out and "tcp;ofi_rxm" in out, out


def test_info_lists_providers_and_the_choice():
    proc = subprocess.run(
        [sys.executable, "-m", "pyddstore", "info"], env=_env({}), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "tcp;ofi_rxm" in out and "shm" in out and "mr_mode" in out, out
    assert "efa" in out and "psm3" in out, out  # the names DDSTORE_FABRIC accepts
