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


def _cli(*args: str, env: dict | None = None) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "pyddstore", *args],
        env=_env(env or {}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_info_lists_providers_and_the_choice():
    out = _cli("info")
    assert "tcp;ofi_rxm" in out and "shm" in out and "mr_mode" in out, out
    assert "efa" in out and "psm3" in out, out  # the names DDSTORE_FABRIC accepts
    assert "max_msg unlimited" in out and "18446744073709551615" not in out, out
    assert "versions: python 3." in out and "torch " in out, out
    assert "FI_UNIVERSE_SIZE=" in out and "(set by pyddstore): rxm:" in out, out


def test_cli_help_version_and_json():
    """`info --help` is the sub-command's own help, `--version` answers, `info --json` is one JSON
    document: versions, the MPI pyddstore links beside mpi4py's, the libfabric variables and why."""
    import json

    import pyddstore

    helped = _cli("info", "--help")
    assert helped.startswith("usage: python -m pyddstore info") and "--json" in helped, helped
    assert _cli("--version").strip() == f"pyddstore {pyddstore.__version__}"
    report = json.loads(_cli("info", "--json", env={"DDSTORE_FABRIC": "tcp"}))
    assert report["versions"]["libfabric"] == pyddstore._native.system_info()["libfabric_version"]
    assert report["versions"]["python"] == ".".join(map(str, sys.version_info[:3]))
    assert report["choice"]["provider"]["value"] == "tcp;ofi_rxm", report["choice"]
    mpi = report["mpi"]
    if mpi["mpi4py"] is not None and pyddstore._native.HAS_MPI:
        assert mpi["match"] is True and mpi["pyddstore_links"] == mpi["mpi4py_links"], mpi
    fabric = {v["name"]: v for v in report["libfabric_env"]}
    assert fabric["FI_OFI_RXM_BUFFER_SIZE"]["value"] == "1024" and fabric["FI_OFI_RXM_BUFFER_SIZE"]["why"]
    assert all(p["max_msg"] for p in report["providers"]), report["providers"]


def test_info_prints_once_under_a_launcher():
    """Under mpirun only rank 0 reports (one JSON document, not one per rank interleaved);
    --all-ranks prints on every rank."""
    import json
    import shutil

    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not found")
    cmd = ["mpirun", "-n", "2", "--bind-to", "none", sys.executable, "-m", "pyddstore", "info"]
    proc = subprocess.run([*cmd, "--json"], env=_env({}), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["launcher"]["rank"] == 0 and report["launcher"]["size"] == 2, report["launcher"]
    proc = subprocess.run([*cmd, "--all-ranks"], env=_env({}), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.count("launcher: mpirun") == 2, proc.stdout
