"""Jobs that stop and come back, with real processes: loaders over DistDatasets (methods 0 and
1; ThreadDataLoader with 0, 1 and 4 worker threads; torchdata's StatefulDataLoader with forked
and spawned workers) checkpoint every batch; each stops at its own random point (between
batches, with batches prefetched, at an epoch's start, last batch or end), then the job kills
itself with SIGKILL (mpirun -n 3). A second job restores the data from the first one's snapshot
and resumes: the concatenated batches equal an uninterrupted run's, contents checked. A third
job on 2 ranks resumes the same states: every sample no rank had seen comes once; with torch's
own DistributedSampler (tdt-*) a state inside an epoch is refused there, and one at the epoch's
start, last batch or end resumes with every sample of the epoch counted across the ranks."""

import json
import os
import random

import pytest
from conftest import reports, run_mpi

pytest.importorskip("torch")
pytest.importorskip("torchdata")

EVENTS_PER_EPOCH = 8  # start, 6 batches (61 samples on 3 ranks, batches of 4), end
EPOCHS = 3


def kill_plan(rng: random.Random) -> dict:
    """Each scenario's kill event: every kind of point is covered in every run."""

    def at(kind):
        e = rng.randrange(EPOCHS) * EVENTS_PER_EPOCH
        return {"between": e + rng.randint(1, 5), "start": e, "last": e + 6, "end": e + 7}[kind]

    kinds = {
        "tdl-m0-w0": "between",
        "tdl-m0-w1": "end",
        "tdl-m0-w4": "start",  # batches already sent to the workers
        "tdl-m1-w0": "last",
        "tdl-m1-w1": "between",
        "tdl-m1-w4": "between",
        "tdt-m1-w1": "between",  # torch's own DistributedSampler: refused on 2 ranks
        "tdt-m1-w0": rng.choice(["start", "last", "end"]),  # exact on 2 ranks
        "sdl-fork": "between",
        "sdl-spawn": rng.choice(["between", "start", "last", "end"]),
    }
    return {name: at(kind) for name, kind in kinds.items()}


def test_kill_resume_and_resize(tmp_path):
    seed = int(os.environ.get("RESUME_SEED", random.randrange(1 << 30)))
    plan = kill_plan(random.Random(seed))
    print(f"RESUME_SEED={seed} plan {plan}")  # shown on failure: rerun with RESUME_SEED=...
    env = {"DDSTORE_FORK_WORKERS": "1", "DDSTORE_FABRIC": "tcp", "OMP_NUM_THREADS": "1"}
    args = ("--dir", str(tmp_path), "--plan", json.dumps(plan))
    first = run_mpi(3, "resume_kill.py", "--phase", "first", *args, env=env, timeout=400, expect_ok=False)
    killed = reports(first.stdout, "resume-killing")
    assert first.returncode != 0 and len(killed) >= 1, first.stdout + first.stderr
    assert all(k["events"] == plan for k in killed), killed  # each froze at its event
    for r in range(3):  # every rank checkpointed every scenario before the kill
        assert all((tmp_path / f"{n}.r{r}.first.state").exists() for n in plan), os.listdir(tmp_path)

    resumed = run_mpi(3, "resume_kill.py", "--phase", "resume", *args, env=env, timeout=400)
    ok = reports(resumed.stdout, "resume-ok")
    assert {(o["rank"], o["scenario"]) for o in ok} >= {(0, n) for n in plan}, resumed.stdout
    assert all(o["batches"] == EPOCHS * 6 for o in ok)

    resize = {n: e for n, e in plan.items() if n != "sdl-spawn"}  # spawn: covered above
    args = ("--dir", str(tmp_path), "--plan", json.dumps(resize), "--old-size", "3")
    resized = run_mpi(2, "resume_kill.py", "--phase", "resize", *args, env=env, timeout=400)
    ok = reports(resized.stdout, "resume-ok")
    assert {o["scenario"] for o in ok if o["rank"] == 0} == set(resize), resized.stdout
    refused = {o["scenario"] for o in ok if o.get("refused")}
    assert refused == {"tdt-m1-w1"}, resized.stdout
