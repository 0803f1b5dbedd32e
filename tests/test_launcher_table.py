"""The launcher table (ddstore-core's `launcher.rs`, `_native.LAUNCHERS`): each launcher's variables,
set in a fresh process, give the rank, size, local rank and job id that Python's `_launch.detect()`
reports and that a `FileComm` made without rank, size or job id uses (its files carry the job
id); the table in docs/guides/launchers.md is the table."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import _check, _env

from pyddstore import _native

ROOT = Path(__file__).resolve().parents[1]

# What the child prints: the launcher seen, whether MPI counts as launched, and the rank, size
# and job id (from the live lock's name, `{job}.c0.{rank}.live`) of a FileComm made with defaults.
CHILD = """
import json, os, sys
from pyddstore import FileComm, _launch
found = _launch.detect()
comm = FileComm(sys.argv[1])
live = [n for n in os.listdir(sys.argv[1]) if n.endswith(".live")]
print(json.dumps({"launcher": found._asdict() if found else None, "mpi": _launch.mpi_launched(),
                  "rank": comm.rank, "size": comm.size, "live": live}))
"""

# (case, variables, launcher name, rank, size, local rank, job id of the FileComm)
CASES = [
    (
        "srun",
        {
            "SLURM_PROCID": "5",
            "SLURM_NTASKS": "8",
            "SLURM_LOCALID": "1",
            "SLURM_JOB_ID": "77",
            "SLURM_STEP_ID": "2",
        },
        "srun",
        5,
        8,
        1,
        "slurm77.2",
    ),
    (
        "torchrun-under-srun",
        {
            **{"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0"},
            **{"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0"},
            **{"RANK": "6", "WORLD_SIZE": "8", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "4"},
        },
        "torchrun",
        6,
        8,
        2,
        "slurm77.0",
    ),
    (
        "open-mpi-in-a-batch-job",
        {
            **{"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1"},
            **{
                "OMPI_MCA_ess_base_jobid": "4242",
                "SLURM_PROCID": "0",
                "SLURM_NTASKS": "4",
                "SLURM_JOB_ID": "9",
            },
        },
        "mpirun (Open MPI)",
        3,
        4,
        1,
        "ompi4242",
    ),
    (
        "pmix",
        {"PMIX_RANK": "2", "PMIX_SIZE": "3", "PMIX_NAMESPACE": "prterun-n1-42@1"},
        "mpiexec (PMIx)",
        2,
        3,
        None,
        "pmixprterun-n1-42_1",
    ),
    (
        "hydra",
        {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"},
        "mpiexec (PMI)",
        1,
        2,
        1,
        None,
    ),
    (
        "cray-pals",
        {"PALS_RANKID": "3", "PALS_LOCAL_RANKID": "3", "PMI_RANK": "3", "PMI_SIZE": "4", "PALS_APID": "a1b2"},
        "mpiexec (Cray PALS)",
        3,
        4,
        3,
        "palsa1b2",
    ),
]


def _clean_env(extra: dict) -> dict:
    """The test's environment without any launcher's variables (nor DDSTORE_JOB_ID), plus `extra`."""
    names = {"DDSTORE_JOB_ID", "DDSTORE_HANDSHAKE_DIR"}
    for row in _native.LAUNCHERS:
        names |= {
            row["rank"],
            row["size"],
            row["local_rank"],
            row["local_size"],
            *row["job_id"],
            *row["requires"],
        }
    return _env({**dict.fromkeys(names - {None}), **extra})


@pytest.mark.parametrize("case,env,name,rank,size,local_rank,job", CASES, ids=[c[0] for c in CASES])
def test_each_launcher_gives_rank_size_local_rank_and_job_id(
    tmp_path, case, env, name, rank, size, local_rank, job
):
    hs = tmp_path / "hs"
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(hs)],
        env=_clean_env(env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    got = json.loads(_check(proc, case).stdout.strip().splitlines()[-1])
    launcher = got["launcher"]
    assert (launcher["name"], launcher["rank"], launcher["size"]) == (name, rank, size), got
    assert launcher["local_rank"] == local_rank, got
    assert got["mpi"] == (name not in ("srun", "torchrun")), got
    assert (got["rank"], got["size"]) == (rank, size), got
    [live] = got["live"]
    if job is None:  # no launcher id: the launching process (the test's pid and start time)
        assert re.fullmatch(rf"ppid{os.getpid()}-\d+\.c0\.{rank}\.live", live), got
    else:
        assert live == f"{job}.c0.{rank}.live", got


def test_a_bad_launcher_variable_is_named():
    env = _clean_env({"OMPI_COMM_WORLD_RANK": "first", "OMPI_COMM_WORLD_SIZE": "2"})
    code = (
        "from pyddstore import _launch\n"
        "try:\n    _launch.detect()\nexcept Exception as e:\n    print(type(e).__name__, e)"
    )
    out = _check(
        subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True), "bad"
    ).stdout
    assert 'DDStoreValueError environment variable OMPI_COMM_WORLD_RANK="first" is not a number' in out, out


def test_the_launchers_guide_shows_the_table():
    guide = (ROOT / "docs" / "guides" / "launchers.md").read_text()
    rows = re.findall(r"^\| (.+?) \| (.+?) \| (.+?) \| (.+?) \| (.+?) \| (.+?) \| (.+?) \|$", guide, re.M)
    shown = [r for r in rows if r[1].startswith("`")]

    def cell(*names):
        return ".".join(f"`{n}`" for n in names if n) or "-"

    want = [
        (
            row["name"],
            cell(row["rank"]),
            cell(row["size"]),
            cell(row["local_rank"]),
            cell(row["local_size"]),
            cell(*row["job_id"]),
            ", ".join(f"`{n}`" for n in row["requires"]) or "-",
        )
        for row in _native.LAUNCHERS
    ]
    assert shown == want
