"""Issue 8, soak through the PyTorch API (bounded): 4 ranks read a DistDataset
through a shuffling ThreadDataLoader, every sample verified, resident memory flat
after warm-up. The long version (1,000,000 samples per rank) is ``make soak``."""

import json

import pytest
from conftest import run_mpi

pytest.importorskip("torch")

SOAK_SAMPLES = 30_000
CONFIGS = {
    "method0-mpi-get": ("0", {"DDSTORE_SHM": "0"}),
    "method0-shm": ("0", {"DDSTORE_SHM": "1"}),
    "method1-tcp": ("1", {"DDSTORE_FABRIC": "tcp", "DDSTORE_SHM": "0"}),
    "method1-shm-path": ("1", {"DDSTORE_FABRIC": "tcp", "DDSTORE_SHM": "1"}),
}


def reports(out: str) -> list:
    decoder, found, pos = json.JSONDecoder(), [], 0
    while (pos := out.find("soak-torch {", pos)) >= 0:
        obj, end = decoder.raw_decode(out, pos + len("soak-torch "))
        found.append(obj)
        pos = end
    return found


@pytest.mark.parametrize("config", list(CONFIGS))
def test_soak_dist_dataset_thread_loader(config):
    method, env = CONFIGS[config]
    out = run_mpi(
        4, "rel_soak_torch.py", method, str(SOAK_SAMPLES), env={**env, "DDSTORE_QUIET": "1"}, timeout=300
    )
    found = reports(out.stdout)
    for r in found:
        print(config, json.dumps(r))
    assert found, "no rank reported"  # mpirun's exit status covers every rank
    for r in found:
        assert r["rows"] >= SOAK_SAMPLES and r["mismatches"] == 0, r
        assert r["rss_growth"] < 0.05, f"{config}: resident memory grew {r['rss_growth']:.1%}: {r}"
