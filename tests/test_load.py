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


def test_a_load_leaves_its_files_out_of_the_page_cache(tmp_path):
    """A list of .npy files and an np.memmap, all cached before the load, are not cached after
    it (mincore over a fresh mapping); every sample is checked (tests/scripts/page_cache.py)."""
    p = subprocess.run(
        [sys.executable, str(SCRIPTS / "page_cache.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0 and p.stdout.rstrip().endswith("ok"), p.stdout + p.stderr
    assert "npy list: resident" in p.stdout and "memmap: resident" in p.stdout, p.stdout


def test_the_samples_in_flight_stay_within_the_loads_bound():
    """16 MiB + a tenth of the budget (256 MiB at most, and without a budget); a sample and its
    copy per thread; at least one reader, never more than the depth asked for."""
    from pyddstore.torch import _load_runner

    from pyddstore import Settings

    mib = 1 << 20
    assert _load_runner.load_held_bytes(Settings.from_env(memory_limit=None)) == 256 * mib
    assert _load_runner.load_held_bytes(Settings.from_env(memory_limit=40 * mib)) == 20 * mib
    assert _load_runner.load_held_bytes(Settings.from_env(memory_limit=1 << 40)) == 256 * mib
    stats = _load_runner.LoadStats("samples", 32)
    assert _load_runner.bounded_depth(32, 20 * mib, 2 * (64 << 10), stats) == 32
    assert not stats.notes and not stats.window_capped
    big = 2 * 14_650_000  # a 14.65 MB sample and its copy: 1 GiB budget, 7 threads
    held = _load_runner.load_held_bytes(Settings.from_env(memory_limit=1 << 30))
    assert _load_runner.bounded_depth(32, held, big, stats) == held // big == 4
    assert stats.window_capped and "4 of 32 readers in flight" in stats.notes[0], stats.notes
    assert _load_runner.bounded_depth(32, 1 * mib, big, stats) == 1  # one at least
