"""Jobs that stop and come back: several loaders over DistDatasets run side by side, each
checkpointing its state (JSON) and logging every batch it yields; each stops at its own kill
point, then the process kills itself with SIGKILL; a second job restores the data from the
snapshot the first one saved and resumes every loader from its last state.

Phases (argv --phase):
  first   load the data, save a snapshot, run every scenario to its kill point, kill -9 itself
  resume  same rank count: restore, resume; the first run's log + the resumed one's must equal
          an uninterrupted run's, batch for batch, and every sample's content is checked
  resize  another rank count: the rest of each state's epoch covers every sample no rank had
          seen exactly once across the new ranks, then normal epochs; exact=True refuses

--plan: JSON {scenario: [kill event, ...]} (one event per scenario: an index into its events,
which are, per epoch: "start" (after iter(), batches in flight), each batch, "end" (after the
epoch's StopIteration)). Scenarios: tdl-m{0,1}-w{0,1,4} (ThreadDataLoader), tdt-m1-w{0,1}
(ThreadDataLoader with torch's own DistributedSampler: on another rank count refused inside an
epoch, exact at its start, last batch or end), sdl-fork, sdl-spawn (torchdata
StatefulDataLoader, method 1). Every rank prints `resume-ok {json}`.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import torch
import torch_common as tc

T_START = time.monotonic()


def mark(what, rank):
    """Progress on stderr: seconds since this process's imports finished."""
    print(f"resume-time rank {rank} {what} {time.monotonic() - T_START:.2f}s", file=sys.stderr, flush=True)


N, EPOCHS, BATCH, SEED = 61, 3, 4, 11


class Src(torch.utils.data.Dataset):
    """Sample i: (float32 (2, 3) tensor from i, i)."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        if not 0 <= i < N:
            raise IndexError(i)
        return torch.arange(6, dtype=torch.float32).reshape(2, 3) * (i + 1) - i / 7, i


def expected(ids):
    return torch.stack([Src()[i][0] for i in ids])


def scenario_config(name):
    """(method, loader kind, workers, auto_epoch, start method)."""
    if name.startswith(("tdl", "tdt")):
        kind, m, w = name.split("-")
        return int(m[1:]), kind, int(w[1:]), w != "w1", None
    return 1, "sdl", 1, False, name.split("-")[1]


def make_loader(name, ds, replicas=None, rank=None, reference=False):
    from pyddstore.torch import DistributedSampler, ThreadDataLoader
    from pyddstore.torch._sampler import replica_of

    method, kind, workers, auto, ctx = scenario_config(name)
    if reference and kind == "sdl":
        workers = 0  # the same batches; no worker processes to start
    if kind == "tdt":  # torch's own sampler: the rank and size of the dataset's store
        rank, replicas, _ = replica_of(ds)
        sampler = torch.utils.data.DistributedSampler(ds, num_replicas=replicas, rank=rank, seed=SEED)
    else:
        sampler = DistributedSampler(ds, num_replicas=replicas, rank=rank, seed=SEED)
    if kind != "sdl":
        loader = ThreadDataLoader(ds, batch_size=BATCH, sampler=sampler, num_workers=workers, auto_epoch=auto)
    else:
        from torchdata.stateful_dataloader import StatefulDataLoader

        loader = StatefulDataLoader(
            ds,
            batch_size=BATCH,
            sampler=sampler,
            num_workers=workers,
            multiprocessing_context=ctx if workers else None,
            persistent_workers=workers > 0,  # one worker start per job (spawn imports torch)
        )
    return sampler, loader, auto


def check_batch(batch, where):
    x, y = batch
    ids = y.tolist()
    assert torch.equal(x, expected(ids)), f"{where}: contents of samples {ids}"
    return ids


def train(name, ds, d, rank, start=None):
    """One scenario's training loop as a generator: yields the event it is at; logs batches
    and saves the state (atomically) at every event, as a checkpointing job would."""
    sampler, loader, auto = make_loader(name, ds)
    which = "resume" if start else "first"
    log_path = os.path.join(d, f"{name}.r{rank}.{which}.log")
    first_epoch = 0
    if start is not None:
        loader.load_state_dict(start["loader"])
        first_epoch = start["epoch"] + (1 if start["epoch_done"] else 0)
    with open(log_path, "w") as log:

        def save(epoch, done):
            state = {"loader": loader.state_dict(), "epoch": epoch, "epoch_done": done}
            tmp = os.path.join(d, f".{name}.r{rank}.tmp")
            with open(tmp, "w") as f:
                json.dump(state, f)
            os.replace(tmp, os.path.join(d, f"{name}.r{rank}.{which}.state"))

        for epoch in range(first_epoch, EPOCHS):
            if not auto:
                sampler.set_epoch(epoch)
            it = iter(loader)
            if auto:
                assert sampler.epoch == epoch, (sampler.epoch, epoch)
            save(epoch, False)
            yield "start"
            for k, batch in enumerate(it):
                ids = check_batch(batch, f"{name} epoch {epoch} batch {k}")
                log.write(json.dumps([epoch, ids]) + "\n")
                log.flush()
                save(epoch, False)
                yield "batch"
            save(epoch, True)
            yield "end"
    if hasattr(loader, "close"):
        loader.close()


def datasets(phase, d, comm, methods):
    from pyddstore.torch import DistDataset

    out = {}
    for m in sorted(methods):
        snap = os.path.join(d, f"snap-m{m}")
        if phase == "first":
            out[m] = DistDataset(Src(), f"resume{m}", comm=comm, method=m)
            out[m].save(snap)
        else:
            out[m] = DistDataset.restore(snap, comm=comm, method=m)
    return out


def read_log(d, name, rank, which):
    path = os.path.join(d, f"{name}.r{rank}.{which}.log")
    with open(path) as f:
        return [tuple(json.loads(line)) for line in f]


def reference(name, ds):
    """The uninterrupted run: (epoch, ids) of every batch, contents checked."""
    sampler, loader, auto = make_loader(name, ds, reference=True)
    out = []
    for epoch in range(EPOCHS):
        if not auto:
            sampler.set_epoch(epoch)
        for k, batch in enumerate(loader):
            out.append((epoch, check_batch(batch, f"{name} reference epoch {epoch} batch {k}")))
    if hasattr(loader, "close"):
        loader.close()
    return out


def phase_first(a, plan, W, dss):
    """Runs every scenario to its kill event, side by side, then kill -9."""
    runs = {name: train(name, dss[scenario_config(name)[0]], a.dir, W.rank) for name in plan}
    counts = dict.fromkeys(plan, 0)
    live = dict(runs)
    while live:
        for name in list(live):
            event = next(live[name], None)
            if event is None or counts[name] == plan[name]:
                del live[name]  # frozen here: its workers keep their batches in flight
                continue
            counts[name] += 1
    mark("scenarios", W.rank)
    W.barrier()
    # One write per report, so that the lines of ranks sharing a pipe stay whole.
    sys.stdout.write(f"resume-killing {json.dumps({'rank': W.rank, 'events': counts})}\n")
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def phase_resume(a, plan, W, dss):
    for name in plan:
        t0 = time.monotonic()
        ds = dss[scenario_config(name)[0]]
        with open(os.path.join(a.dir, f"{name}.r{W.rank}.first.state")) as f:
            start = json.load(f)
        for _ in train(name, ds, a.dir, W.rank, start):
            pass
        got = read_log(a.dir, name, W.rank, "first") + read_log(a.dir, name, W.rank, "resume")
        want = [tuple(b) for b in reference(name, ds)]
        assert got == want, f"{name} rank {W.rank}: resumed {got} != uninterrupted {want}"
        took = round(time.monotonic() - t0, 2)
        report = {"rank": W.rank, "scenario": name, "batches": len(got), "s": took}
        # One write per report, so that the lines of ranks sharing a pipe stay whole.
        sys.stdout.write(f"resume-ok {json.dumps(report)}\n")
        sys.stdout.flush()


def phase_resize(a, plan, W, dss, old_size):
    from pyddstore.torch._state import epoch_order

    from pyddstore import DDStoreValueError

    for name in plan:
        ds = dss[scenario_config(name)[0]]
        with open(os.path.join(a.dir, f"{name}.r{W.rank}.first.state")) as f:
            start = json.load(f)
        sampler, loader, auto = make_loader(name, ds)
        kind = scenario_config(name)[1]
        if kind != "sdl":  # torchdata's load_state_dict() takes the state only
            tc.raises(DDStoreValueError, lambda: loader.load_state_dict(start["loader"], exact=True), "ranks")
        epoch = start["epoch"]
        logs = [read_log(a.dir, name, r, "first") for r in range(old_size)]
        seen = [i for log in logs for e, ids in log if e == epoch for i in ids]
        order = epoch_order(ds, old_size, SEED, epoch, True, False)
        if kind == "tdt" and 0 < len(seen) < len(order) and not start["epoch_done"]:
            # torch's sampler cannot deal the rest of an epoch over other ranks: refused
            tc.raises(DDStoreValueError, lambda: loader.load_state_dict(start["loader"]), "'num_replicas'")
            loader.close()
            report = {"rank": W.rank, "scenario": name, "resized_from": old_size, "refused": True}
            sys.stdout.write(f"resume-ok {json.dumps(report)}\n")
            sys.stdout.flush()
            continue
        loader.load_state_dict(start["loader"])
        if not start["epoch_done"]:
            if not auto:
                sampler.set_epoch(epoch)
            mine = [i for b in loader for i in check_batch(b, f"{name} resized epoch {epoch}")]
            rest = [i for part in W.comm.allgather(mine) for i in part]
            if kind == "tdt":  # at the epoch's start: torch's whole epoch on the new ranks; at its end: none
                whole = epoch_order(ds, W.size, SEED, epoch, True, False) if not seen else []
                assert sorted(rest) == sorted(whole), f"{name}: {sorted(rest)} != {sorted(whole)}"
                assert set(seen + rest) == set(range(N)), f"{name}: samples missing: {seen} {rest}"
            else:
                assert len(rest) == len(set(rest)), f"{name}: a sample twice after the resize: {sorted(rest)}"
                unseen = set(order) - set(seen)
                assert set(rest) == unseen, f"{name}: {sorted(rest)} != unseen {sorted(unseen)}"
        nxt = epoch + 1
        if nxt < EPOCHS:  # then a normal epoch on the new rank count
            if not auto:
                sampler.set_epoch(nxt)
            got = [check_batch(b, f"{name} epoch {nxt}") for b in loader]
            ref = torch.utils.data.DistributedSampler(ds, num_replicas=W.size, rank=W.rank, seed=SEED)
            ref.set_epoch(nxt)
            flat = list(ref)
            assert got == [flat[k : k + BATCH] for k in range(0, len(flat), BATCH)], f"{name} epoch {nxt}"
        if hasattr(loader, "close"):
            loader.close()
        report = {"rank": W.rank, "scenario": name, "resized_from": old_size}
        # One write per report, so that the lines of ranks sharing a pipe stay whole.
        sys.stdout.write(f"resume-ok {json.dumps(report)}\n")
        sys.stdout.flush()


def main():
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--phase", choices=["first", "resume", "resize"], required=True)
    p.add_argument("--dir", required=True)
    p.add_argument("--plan", required=True)
    p.add_argument("--comm", choices=["mpi", "file"], default="mpi")
    p.add_argument("--hs", default="")
    p.add_argument("--old-size", type=int, default=0)
    a = p.parse_args()
    plan = json.loads(a.plan)
    W = tc.World(tc.args(["--comm", a.comm, "--hs", a.hs]))
    need = {scenario_config(n)[0] for n in plan}
    mark("world", W.rank)
    dss = datasets(a.phase, a.dir, W.comm, need)
    mark("data", W.rank)
    if a.phase == "first":
        phase_first(a, plan, W, dss)
    elif a.phase == "resume":
        phase_resume(a, plan, W, dss)
    else:
        phase_resize(a, plan, W, dss, a.old_size)
    W.barrier()
    for ds in dss.values():
        ds.free()


if __name__ == "__main__":
    tc.run(main)
