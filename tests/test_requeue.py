"""The requeue recipe end to end (slow tier): jobs/local-requeue.sh runs examples/requeue/train.py
uninterrupted, then killed with SIGKILL at a random step, then stopped by a simulated time-limit
signal (SIGUSR1, checkpoint, exit), then to the end; each restart restores the dataset from the
first start's snapshot. The (epoch, batch, sample ids) sequence and the final weights must equal
the uninterrupted run's. Also: the job scripts are shellcheck-clean and need no placeholder."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import MPI_ENV, reports

ROOT = Path(__file__).resolve().parent.parent
JOBS = [*sorted((ROOT / "jobs").glob("*requeue.sh")), ROOT / "jobs" / "local-restart-times.sh"]


@pytest.mark.slow
def test_local_requeue_job(tmp_path):
    pytest.importorskip("torch")
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not found")
    env = {
        **os.environ,
        **MPI_ENV,
        "WORK": str(tmp_path / "rq"),
        "KEEP": "1",  # the work directory stays, to count its checkpoints
        "SAMPLES": "600",
        "EVERY": "5",
    }
    p = subprocess.run(
        ["bash", "jobs/local-requeue.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "requeue-compare ok" in p.stdout, p.stdout
    starts = reports(p.stdout, "requeue-start")
    modes = [s["mode"] for s in starts if s["rank"] == 0]
    assert modes[:2] == ["fresh", "fresh"] and set(modes[2:]) == {"restore"}, modes  # ref, start 1; restarts
    # 30 steps, a checkpoint every 5 and at each stop: train.py keeps the newest 2 (--keep-checkpoints).
    import json

    for run in ("ref", "run"):
        work = tmp_path / "rq" / run
        kept = sorted(d.name for d in work.glob("ckpt-*"))
        latest = json.loads((work / "latest.json").read_text())["dir"]
        assert len(kept) == 2 and kept[-1] == latest, (run, kept, latest)
        assert (work / latest / "model.pt").exists() and (work / kept[0] / "loader.r1.json").exists(), kept


def test_job_scripts_are_shellcheck_clean():
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck not found (scripts/setup.sh installs it)")
    assert len(JOBS) == 4, JOBS
    p = subprocess.run(["shellcheck", *map(str, JOBS)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout
    for job in JOBS:
        text = job.read_text()
        assert "CHANGEME" not in text and "#SBATCH -A" not in text, job  # the account: sbatch -A
        if "#SBATCH" in text:
            assert "--signal=B:USR1@120" in text and "scontrol requeue" in text, job
            assert '"${SLURM_JOB_ACCOUNT:?submit with an account' in text, job  # a clear error without -A
            # Like the other job scripts: the user's environment from VENV=, the site's modules.
            assert '"${VENV:?set VENV' in text and "cray-python" not in text, job


def test_every_job_script_is_shellcheck_clean_and_frontier_ones_load_one_rocm():
    """Every script in jobs/ (as scripts/lint.sh checks them); Frontier's load OLCF's ROCm 7.1.1."""
    import re

    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck not found (scripts/setup.sh installs it)")
    jobs = sorted((ROOT / "jobs").glob("*.sh"))
    p = subprocess.run(["shellcheck", "-S", "warning", *map(str, jobs)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout
    for job in jobs:
        for line in re.findall(r"^module load .*$", job.read_text(), re.M):
            if "rocm" in line:
                assert "rocm/7.1.1" in line, f"{job.name}: {line}"
