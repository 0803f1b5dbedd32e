"""One settings type: every DDSTORE_* variable read once per store by ddstore_core's Settings
(pyddstore.Settings), typed, checked with messages naming the variable or argument; the
libfabric variables pyddstore defaults set when the extension is imported, before libfabric
starts; no Python module reads DDSTORE_* from the environment itself."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import pyddstore
from pyddstore import DDStoreTypeError, DDStoreValueError, Settings

PACKAGE = Path(pyddstore.__file__).resolve().parent
# The one place allowed to read DDSTORE_* itself (import-time logging, documented there).
ONE_PLACE = {PACKAGE / "_env.py"}


def test_settings_reflect_environment_and_arguments(monkeypatch):
    for k in list(os.environ):
        if k.startswith("DDSTORE_"):
            monkeypatch.delenv(k)
    s = Settings.from_env()
    assert (s.timeout_s, s.handshake_timeout_s, s.max_inflight, s.max_read_bytes) == (
        60.0,
        300.0,
        64,
        64 << 20,
    )
    assert s.shm is True and s.quiet is False and s.method is None and s.fabric is None
    assert s.remote_gather == "auto" and not s.is_set("timeout_s")
    monkeypatch.setenv("DDSTORE_TIMEOUT_S", "2.5")
    monkeypatch.setenv("DDSTORE_SHM", "false")
    monkeypatch.setenv("DDSTORE_FABRIC", "TCP")
    monkeypatch.setenv("DDSTORE_JOB_TOKEN", "secret-token")
    s = Settings.from_env(method=1, max_inflight=8, quiet=True, handshake_dir=Path("/tmp"))
    assert s.timeout_s == 2.5 and s.shm is False and s.fabric == "tcp"
    assert (s.method, s.max_inflight, s.quiet, s.handshake_dir) == (1, 8, True, "/tmp")
    assert s.is_set("timeout_s") and s.is_set("method")
    assert s.as_dict()["timeout_s"] == 2.5 and "secret-token" not in repr(s)
    # An argument wins over its variable; None keeps the variable's value.
    assert Settings.from_env(timeout_s=None).timeout_s == 2.5
    assert Settings.from_env(timeout_s=7).timeout_s == 7.0
    assert s.replace(shm=True).shm is True and s.shm is False
    with pytest.raises(AttributeError):
        s.no_such_setting  # noqa: B018
    # A one-process store reads them once, with its arguments on top.
    store = pyddstore.PyDDStore(pyddstore._native.Comm.single(), method=1, settings=s.replace(method=None))
    try:
        assert store.settings.method == 1 and store.settings.timeout_s == 2.5
        assert store.settings == store._native.settings
        monkeypatch.setenv("DDSTORE_TIMEOUT_S", "9")  # later changes are not seen
        assert store.settings.timeout_s == 2.5
        store.add("x", np.arange(6.0).reshape(3, 2))
        out = np.empty((2, 2))
        store.get_batch("x", out, [2, 0])
        assert out.tolist() == [[4.0, 5.0], [0.0, 1.0]]
    finally:
        store.free()


def test_bad_values_name_the_variable_or_argument(monkeypatch):
    monkeypatch.setenv("DDSTORE_MAX_INFLIGHT", "lots")
    with pytest.raises(DDStoreValueError, match=r"DDSTORE_MAX_INFLIGHT=\"lots\".*expected an integer"):
        Settings.from_env()
    with pytest.raises(DDStoreValueError, match="DDSTORE_MAX_INFLIGHT"):
        pyddstore.PyDDStore(pyddstore._native.Comm.single(), method=1)
    monkeypatch.delenv("DDSTORE_MAX_INFLIGHT")
    with pytest.raises(
        DDStoreValueError,
        match=r"timeout_s=\"-1\" \(DDSTORE_TIMEOUT_S\) is not valid: expected a positive number",
    ):
        Settings.from_env(timeout_s=-1)
    with pytest.raises(
        DDStoreValueError, match=r"shm=\"maybe\" \(DDSTORE_SHM\) is not valid: expected 0, 1, true or false"
    ):
        Settings.from_env(shm="maybe")
    with pytest.raises(DDStoreTypeError, match="bogus= is not a pyddstore setting"):
        Settings.from_env(bogus=1)
    with pytest.raises(DDStoreTypeError, match="settings="):
        pyddstore.PyDDStore(pyddstore._native.Comm.single(), settings={"timeout_s": 1})


def test_settings_pickle():
    import pickle

    s = Settings.from_env(timeout_s=3, fabric="shm")
    assert pickle.loads(pickle.dumps(s)) == s


def _environ_reads(path: Path) -> list[str]:
    """DDSTORE_* names `path` reads or writes through os.environ / os.getenv."""
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            f = node.func
            env_call = f.attr in ("get", "pop") and ast.unparse(f.value).endswith("environ")
            if (env_call or f.attr == "getenv") and node.args and isinstance(node.args[0], ast.Constant):
                key = node.args[0].value
        elif isinstance(node, ast.Subscript) and ast.unparse(node.value).endswith("environ"):
            if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                key = node.slice.value + (" (write)" if isinstance(node.ctx, ast.Store) else "")
        elif isinstance(node, ast.Compare) and any(isinstance(op, ast.In) for op in node.ops):
            if isinstance(node.left, ast.Constant) and ast.unparse(node.comparators[0]).endswith("environ"):
                key = node.left.value
        if isinstance(key, str) and key.startswith("DDSTORE_"):
            found.append(f"{path.name}:{node.lineno}: {key}")
    return found


def test_no_python_module_reads_ddstore_variables_itself():
    # Every read goes through Settings.
    reads = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path in ONE_PLACE:
            continue
        reads += [hit for hit in _environ_reads(path) if not hit.endswith(" (write)")]
    assert not reads, f"DDSTORE_* read outside pyddstore/_env.py (use pyddstore.Settings): {reads}"


def test_no_module_sets_environment_variables_for_the_library():
    """No module sets DDSTORE_* or FI_* in os.environ (the benchmarks pass pyddstore.Settings to
    their stores, and a child process's variables go in its env dict); libfabric defaults are set
    in Rust, once, when the extension is imported (ddstore_fabric::ofi::env)."""
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        for needle in (
            'environ["FI_',
            "environ['FI_",
            'environ.setdefault("FI_',
            'environ["DDSTORE_',
            'environ.setdefault("DDSTORE_',
            "environ.update(",
        ):
            assert needle not in text, f"{path.name} sets the environment ({needle})"


LIBFABRIC_CHECK = r"""
import ctypes, json, sys
import pyddstore
from pyddstore import _native

libc = ctypes.CDLL(None)
libc.getenv.restype = ctypes.c_char_p
names = ["FI_CXI_DISABLE_HOST_REGISTER", "FI_UNIVERSE_SIZE", "FI_OFI_RXM_BUFFER_SIZE",
         "FI_OFI_RXM_EAGER_LIMIT", "FI_TCP_MAX_RX_SIZE", "FI_MR_CACHE_MONITOR"]
env = lambda: {n: (libc.getenv(n.encode()) or b"").decode() for n in names}
before = _native.libfabric_env()
at_import = env()
store = pyddstore.PyDDStore(_native.Comm.single(), method=1)  # opens the fabric
after = _native.libfabric_env()
store.free()
print(json.dumps({"before": before, "at_import": at_import, "after": after}))
"""


def _libfabric_run(extra: dict) -> dict:
    import json

    prefixes = (
        "DDSTORE_",
        "FI_MR_CACHE",
        "FI_UNIVERSE",
        "FI_OFI_RXM_",
        "FI_TCP_MAX_RX",
        "FI_CXI_DISABLE_HOST_REGISTER",
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    env.update({"DDSTORE_MPI": "0", **extra})
    proc = subprocess.run(
        [sys.executable, "-c", LIBFABRIC_CHECK], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_libfabric_defaults_are_set_at_import_before_the_fabric_starts():
    got = _libfabric_run(
        {"DDSTORE_FABRIC": "tcp", "DDSTORE_MAX_READ_BYTES": "65536", "DDSTORE_FORK_WORKERS": "1"}
    )
    # Set by importing the extension, before any fabric object existed...
    assert got["before"]["started_after_defaults"] is None, got
    imp = got["at_import"]
    assert imp["FI_CXI_DISABLE_HOST_REGISTER"] == "1" and imp["FI_OFI_RXM_BUFFER_SIZE"] == "1024", imp
    assert imp["FI_UNIVERSE_SIZE"] == "16" and imp["FI_OFI_RXM_EAGER_LIMIT"] == "65536", imp
    assert imp["FI_TCP_MAX_RX_SIZE"] == "1024", imp
    assert imp["FI_MR_CACHE_MONITOR"] == "memhooks", imp
    # ...and libfabric started (the store's first fi_getinfo) only after them.
    assert got["after"]["started_after_defaults"] is True, got
    assert got["after"]["variables"]["FI_UNIVERSE_SIZE"] == ["16", True], got


def test_libfabric_defaults_keep_what_the_user_set():
    got = _libfabric_run({"DDSTORE_FABRIC": "tcp", "FI_UNIVERSE_SIZE": "64", "FI_MR_CACHE_MONITOR": "uffd"})
    assert got["at_import"]["FI_UNIVERSE_SIZE"] == "64", got
    assert got["after"]["variables"]["FI_UNIVERSE_SIZE"] == ["64", False], got
    assert got["at_import"]["FI_MR_CACHE_MONITOR"] == "uffd", got
    # Unset on a machine without an RDMA or Slingshot NIC: tcp will be chosen, so its defaults apply
    # (a script that sets DDSTORE_FABRIC after import, or relies on the default order, gets them).
    nic = any(os.path.isdir(d) and os.listdir(d) for d in ("/sys/class/infiniband", "/sys/class/cxi"))
    if not nic and not os.path.exists("/dev/cxi0"):
        got = _libfabric_run({})
        assert got["at_import"]["FI_OFI_RXM_EAGER_LIMIT"] == str(64 << 20), got
    # Not rxm: no rxm variables (cxi sizes its address vectors from FI_UNIVERSE_SIZE).
    got = _libfabric_run({"DDSTORE_FABRIC": "shm"})
    assert got["at_import"]["FI_UNIVERSE_SIZE"] == "" and got["at_import"]["FI_OFI_RXM_BUFFER_SIZE"] == "", (
        got
    )
    assert got["at_import"]["FI_TCP_MAX_RX_SIZE"] == "", got


def test_file_comm_timeout_is_checked_as_its_setting_is(tmp_path):
    # An argument goes through the settings table's parser (inf used to panic converting it).
    for bad in (float("inf"), 0.0, -1.0):
        with pytest.raises(
            DDStoreValueError, match=r"timeout_s=.* \(DDSTORE_HANDSHAKE_TIMEOUT_S\) is not valid"
        ):
            pyddstore.FileComm(tmp_path / "hs", rank=0, size=1, timeout_s=bad)
    comm = pyddstore.FileComm(tmp_path / "hs", rank=0, size=1, timeout_s=0.5)
    assert comm.allgather({"rank": comm.rank}) == [{"rank": 0}]
