"""Every `make` target that runs a command, run as written (slow tier; `make setup`, which
rebuilds the extension other tests load, and the virtual-cluster bench, which makes network
namespaces, run in the serial phase), as root where the tests run as root, with make
variables that shrink the long benches to seconds: BENCH_ARGS options come after the target's
own (a later option wins), RESULTS puts the JSON in a temporary directory, SETUP=true skips the
setup step that `make setup` runs once as written. The environment has no
OMPI_ALLOW_RUN_AS_ROOT*: each target must set what its mpirun needs.

Not run here, and why:
- test, test-long: the test command itself and its longer variants (this test runs inside it).
- lint: scripts/run-tests.sh runs the same `bash scripts/lint.sh` first.
- fmt: rewrites the sources (lint's --check covers formatting); clean: deletes .venv and target/.
- test-libfabric2: builds libfabric 2.3.1 from the vendored tarball (minutes).
- test-torch-min, test-torch-latest, setup-alt: download torch 2.6 / the newest torch / litdata,
  mosaicml-streaming, webdataset.
- check-no-mpi: builds a second extension in a clean venv (minutes); the same test opts in.
- check-memory: the Rust suites under valgrind (minutes); test_memcheck.py runs its script.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from conftest import SOAK_CONFIGS, _env

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow

# target -> (make variables, files the run leaves in RESULTS). {tmp}: this test's directory.
SMOKE = {
    "bench": (
        {
            "BENCH_ARGS": "--configs ofi-tcp,mpi-rma --row-sizes 256 --batch-sizes 8 --threads 1 "
            "--seconds 0.02 --rounds 1 --share-bytes 1e6"
        },
        ["bench.json"],
    ),
    "bench-paths": (
        {"BENCH_ARGS": "--row-sizes 3072 --batch-sizes 2 --rounds 1 --seconds 0.02 --share-bytes 1e6"},
        ["bench-paths.json", "bench-paths-busy.json"],
    ),
    "bench-graph": (
        {"BENCH_ARGS": "--graphs 150 --seconds 0.02 --rounds 1 --range-bytes 512"},
        ["bench_graph.json"],
    ),
    "bench-load": (
        {"BENCH_ARGS": "--load-files 24 --load-kib 16 --load-rounds 1 --load-warm --load-dir {tmp}/load"},
        ["bench-load.json"],
    ),
    "bench-spill": (
        {
            "BENCH_ARGS": "--mb 24 --budget-mb 4 --sample-kb 3 --only-spill --batch 16 --rounds 2 "
            "--workers 2 --dir {tmp}/spill"
        },
        ["bench-spill.json"],
    ),
    "bench-steps": (
        {
            "BENCH_ARGS": "--samples-small 64 --samples-large 8 --large-bytes 1000000 --epochs 2 "
            "--torch-workers 1 --compute-scale 0.1 --copy-rounds 3 --dir {tmp}/steps"
        },
        ["bench-steps.json"],
    ),
    "bench-workers": (
        {
            "BENCH_ARGS": "--samples 256 --decode-samples 64 --batch-size 32 --epochs 2 --rounds 1 "
            "--decode-ms 0.1 --tmpdir {tmp}"
        },
        ["bench-workers.json"],
    ),
    "bench-loaders": (
        {"BENCH_ARGS": "--samples 512 --epochs 1 --batch 32 --timeout-s 120 --dir {tmp}/loaders"},
        ["loaders.json", "loaders.png"],
    ),
    "bench-vcluster": (
        {"BENCH_ARGS": "--row-sizes 3072 --batch-sizes 128 --seconds 0.05 --rounds 1 --share-bytes 1e6"},
        ["bench-vcluster.json"],
    ),
    "bench-scale": ({"BENCH_ARGS": "--ranks 2,4 --configs tcp --rows 16 --batch 8"}, ["bench-scale.json"]),
    # 600,000 rows: a one-time step of 2 MiB stays under 8 B/row. The soak through the PyTorch API
    # (rel_soak_torch.py: a DistDataset read by a shuffling ThreadDataLoader, every sample checked,
    # RSS flat, asserted by the script) is tested here alone, in the four configurations.
    "soak": ({"SOAK_ROWS": "600000", "SOAK_RANKS": "2"}, []),
    # NP: jobs/local-vae.sh's ranks per job (test_vae.py runs the VAE jobs with 2 ranks each).
    "demo": ({"DEMO_ARGS": "--rows 4000 --batches 20", "EPOCHS": "1", "NP": "1"}, []),
    "docs": ({}, []),
}
NOT_RUN = {"test", "test-long", "lint", "fmt", "clean", "test-libfabric2", "test-torch-min"}
NOT_RUN |= {"test-torch-latest"}
NOT_RUN |= {"setup-alt", "check-no-mpi", "check-memory"}
# docs-shots: tests/test_docs.py::test_pages_render_with_nothing_cut runs its shots.py check.
NOT_RUN |= {"docs-shots"}


def _make(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = _env({})
    for name in ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"):
        env.pop(name, None)  # the targets set these themselves
    env.pop("OMPI_MCA_rmaps_base_oversubscribe", None)
    env.pop("MAKEFLAGS", None)
    return subprocess.run(["make", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def _targets() -> list[str]:
    """Every target of the Makefile that has a recipe."""
    text = (ROOT / "Makefile").read_text()
    return re.findall(r"^([a-z0-9-]+):.*\n\t", text, re.M)


def test_every_target_is_smoke_tested_or_says_why_not():
    targets = set(_targets())
    assert {"bench", "bench-paths", "bench-loaders", "help", "setup"} <= targets, targets
    covered = set(SMOKE) | NOT_RUN | {"help", "setup"}
    assert targets <= covered, f"targets without a smoke run or a reason: {sorted(targets - covered)}"


@pytest.mark.serial
def test_help_and_setup_as_written():
    out = _make("help", timeout=60)
    assert out.returncode == 0 and "make bench-loaders" in out.stdout, out.stdout + out.stderr
    out = _make("setup", timeout=900)
    assert out.returncode == 0 and "ready" in out.stdout, out.stdout[-3000:] + out.stderr[-3000:]


# Host-wide state (network namespaces) keeps this one in the serial phase.
SERIAL_TARGETS = {"bench-vcluster"}


@pytest.mark.parametrize(
    "target", [pytest.param(t, marks=pytest.mark.serial) if t in SERIAL_TARGETS else t for t in sorted(SMOKE)]
)
def test_target_runs_as_written(target, tmp_path):
    if target == "bench-vcluster":
        from vc_fixture import harness

        reason = harness.why_unavailable()
        if reason:
            pytest.skip(reason)
    if target == "demo" and not (ROOT / ".venv" / "bin" / "activate").exists():
        pytest.skip("no .venv (make setup)")
    variables, outputs = SMOKE[target]
    args = [f"{k}={v.format(tmp=tmp_path)}" for k, v in variables.items()]
    out = _make(target, "SETUP=true", f"RESULTS={tmp_path}", *args, timeout=600)
    assert out.returncode == 0, f"make {target}:\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
    for name in outputs:
        path = tmp_path / name
        assert path.exists() and path.stat().st_size > 0, (target, name, out.stdout[-2000:])
        if name.endswith(".json"):
            assert json.loads(path.read_text()), (target, name)
    if target == "bench-loaders":
        results = {r["loader"]: r for r in json.loads((tmp_path / "loaders.json").read_text())["results"]}
        measured = [results[name].get("samples_per_s", 0) for name in ("pyddstore", "np.memmap")]
        assert min(measured) > 0, results
    if target == "bench-spill":  # the spill bench's smoke test: its figures, checked
        from test_spill import check_spill_bench

        check_spill_bench(out.stdout, tmp_path / "bench-spill.json")
    if target == "bench-workers":  # the workers bench's start part (issue 40), checked
        from test_bench_workers import check_start_part

        check_start_part(json.loads((tmp_path / "bench-workers.json").read_text())["rows"])
    if target == "soak":  # each configuration, of the store and through the PyTorch API, passed
        for label in SOAK_CONFIGS:
            for run in (label, f"torch-{label}"):
                assert f"== {run}: ok in" in out.stdout, (run, out.stdout[-3000:])
    if target == "docs":
        assert (ROOT / "site" / "contract" / "index.html").exists()
    assert os.getuid() != 0 or "allow-run-as-root" not in out.stderr, out.stderr[-2000:]
