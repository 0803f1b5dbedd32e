"""Loading shares with many reads in flight from every kind of source, and snapshots (save on 2
ranks, restore on 2 and 3, damaged copies refused). tests/scripts/load_sources.py runs the checks
and verifies every sample on every rank."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import SCRIPTS, run_mpi

pytest.importorskip("torch")
pytest.importorskip("h5py")
_native = pytest.importorskip("pyddstore._native")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("load")
    subprocess.run(
        [sys.executable, str(SCRIPTS / "load_sources.py"), "write", str(d)], check=True, timeout=300
    )
    return d


def test_every_source(data_dir):
    out = run_mpi(2, "load_sources.py", "sources", str(data_dir), "--method", "0", timeout=600).stdout
    assert "sources ok" in out, out
    print(out)


def test_snapshot_other_rank_counts_and_damage(data_dir):
    out = run_mpi(2, "load_sources.py", "save", str(data_dir), "--method", "0", timeout=600).stdout
    assert "save ok" in out, out
    out = run_mpi(3, "load_sources.py", "restore", str(data_dir), "--method", "0", timeout=600).stdout
    assert "restore ok" in out, out
    print(out)


def test_load_env_validation(monkeypatch):
    from pyddstore.torch import _load_runner

    from pyddstore import DDStoreValueError, Settings

    monkeypatch.delenv("DDSTORE_LOAD_THREADS", raising=False)
    monkeypatch.delenv("DDSTORE_LOAD_DEPTH", raising=False)
    assert _load_runner.load_depth(Settings.from_env()) == 32
    monkeypatch.setenv("DDSTORE_LOAD_DEPTH", "8")
    assert _load_runner.load_depth(Settings.from_env()) == 8
    monkeypatch.setenv("DDSTORE_LOAD_THREADS", "5")  # the older name counts when the new one is unset
    assert _load_runner.load_depth(Settings.from_env(load_depth=None)) == 8
    monkeypatch.delenv("DDSTORE_LOAD_DEPTH")
    assert _load_runner.load_depth(Settings.from_env()) == 5
    for bad in ("0", "x", "-3"):
        monkeypatch.setenv("DDSTORE_LOAD_DEPTH", bad)
        with pytest.raises(DDStoreValueError, match="DDSTORE_LOAD_DEPTH"):
            _load_runner.load_depth(Settings.from_env())
    monkeypatch.delenv("DDSTORE_LOAD_DEPTH")
    monkeypatch.setenv("DDSTORE_LOAD_DIRECT", "sometimes")
    with pytest.raises(DDStoreValueError, match="DDSTORE_LOAD_DIRECT"):
        _load_runner.load_direct(Settings.from_env())
