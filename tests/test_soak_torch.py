"""Issue 8, soak through the PyTorch API (bounded): 2 ranks read a DistDataset
through a shuffling ThreadDataLoader, every sample verified (half of them the other
rank's), resident memory flat after warm-up. The long version (1,000,000 samples per
rank, 4 ranks) is ``make soak``; test_reliability.py's soak of the store runs 4 ranks."""

import pytest
from conftest import SOAK_CONFIGS, reports, run_mpi, show

# Long runs: the slow tier (`pytest -m slow`), after the default one.
pytestmark = pytest.mark.slow

pytest.importorskip("torch")

SOAK_SAMPLES = 30_000


@pytest.mark.parametrize("config", list(SOAK_CONFIGS))
def test_soak_dist_dataset_thread_loader(config):
    method, env = SOAK_CONFIGS[config]
    # 2 ranks: each rank's torch import is most of the test's CPU.
    out = run_mpi(
        2, "rel_soak_torch.py", method, str(SOAK_SAMPLES), env={**env, "DDSTORE_QUIET": "1"}, timeout=300
    )
    found = reports(out.stdout, "soak-torch")
    show("soak-torch", found)
    assert found, "no rank reported"  # mpirun's exit status covers every rank
    for r in found:
        assert r["rows"] >= SOAK_SAMPLES and r["mismatches"] == 0, r
        assert r["rss_growth"] < 0.05, f"{config}: resident memory grew {r['rss_growth']:.1%}: {r}"
