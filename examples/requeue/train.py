"""A training job that stops and comes back (the recipe of docs/guides/restarting.md).

First start: load the dataset into a DistDataset and save a snapshot of it (--snapshot, on
node-local or parallel storage). Every --checkpoint-every steps, and when SIGUSR1 arrives (Slurm
sends it before the time limit with --signal=B:USR1@120; the job script passes it on), every
rank checkpoints the model, the optimizer and its loader's state into --work; after the signal
the job exits with status 0 so that the job script requeues it. A restart restores the dataset
from the snapshot (no source read), loads the checkpoint and the loader state, and goes on
with exactly the batches the uninterrupted run would have trained on next.

    mpirun -n 2 python examples/requeue/train.py --work /tmp/rq --epochs 3
    bash jobs/local-requeue.sh                 # with a simulated time limit and a kill -9

Only the --keep-checkpoints newest checkpoints (default 2) stay in --work. Every rank appends
one line per trained step to {work}/steps.r{rank}.jsonl: [epoch, batch, sample ids]; a restart
first cuts it back to the checkpoint, so after the job is done it holds the run's whole
sequence. Each start prints `requeue-start {json}`: fresh or restored, and the seconds from
process start to the dataset being ready and to the first batch.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time


def process_age() -> float:
    """Seconds since this process started (its start time in /proc, so interpreter start-up
    and imports count too)."""
    with open("/proc/self/stat") as f:
        start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", required=True, help="checkpoints and step logs (shared by the ranks)")
    p.add_argument("--snapshot", default="", help="the dataset snapshot (default {work}/snapshot)")
    p.add_argument("--samples", type=int, default=4000)
    p.add_argument("--features", type=int, default=64)
    p.add_argument(
        "--source",
        choices=["python", "memmap"],
        default="python",
        help="python: per-sample decoding in __getitem__; memmap: rows read natively from a file",
    )
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--num-workers", type=int, default=1)
    p.add_argument("--checkpoint-every", type=int, default=10, help="steps between checkpoints")
    p.add_argument(
        "--keep-checkpoints",
        type=int,
        default=2,
        help="checkpoints kept in --work (the newest; older ones are removed once a newer one is complete)",
    )
    p.add_argument("--method", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--die-at-step",
        type=int,
        default=-1,
        help="test hook: rank 0 kills itself with SIGKILL before this global step",
    )
    p.add_argument("--step-delay", type=float, default=0.0, help="seconds of extra work per step")
    p.add_argument(
        "--max-steps",
        type=int,
        default=-1,
        help="stop (checkpointed, as after the signal) after this many steps of this start",
    )
    return p.parse_args()


class RawFeatures:
    """The dataset as it would come from its own files: one raw int32 file of rows (features,
    label, sample id; made on the first run), each sample decoded and normalised in Python
    (--source python), or the raw rows of an np.memmap read by pyddstore's native file path
    (--source memmap; decoded per batch)."""

    def __init__(self, path: str, n: int, features: int, rank: int, comm):
        import numpy as np

        self.n, self.features = n, features
        raw = path + ".int32"
        if rank == 0 and not os.path.exists(raw):
            rng = np.random.default_rng(1234)
            data = rng.integers(-3000, 3000, size=(n, features + 2), dtype=np.int32)
            data[:, -2] = np.arange(n) % 10  # the label
            data[:, -1] = np.arange(n)
            tmp = raw + ".tmp"
            data.tofile(tmp)
            os.replace(tmp, raw)
        comm.Barrier()
        self.raw = np.memmap(raw, dtype=np.int32, mode="r", shape=(n, features + 2))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        import numpy as np
        import torch

        x, ids, y = decode(torch.from_numpy(np.array(self.raw[i : i + 1])))
        return x[0], ids[0], y[0]


def decode(rows):
    """(features, sample ids, labels) of raw int32 rows."""
    x = rows[:, :-2].float()
    return (x - x.mean(dim=1, keepdim=True)) / 1000.0, rows[:, -1].long(), rows[:, -2].long()


def load_data(a, comm, snapshot: str):
    """The data: restored from the snapshot on a restart, loaded and saved on the first start.
    Returns (dataset, "restore" or "fresh", seconds to get the data, seconds to save it)."""
    from pyddstore.torch import DistDataset

    if os.path.exists(os.path.join(snapshot, "manifest.json")):
        t0 = time.perf_counter()
        ds = DistDataset.restore(snapshot, comm=comm, method=a.method)
        return ds, "restore", time.perf_counter() - t0, 0.0
    rank = comm.Get_rank()
    source = RawFeatures(os.path.join(a.work, "raw"), a.samples, a.features, rank, comm)
    t0 = time.perf_counter()  # the raw file exists now (made once, not timed)
    ds = DistDataset(source if a.source == "python" else source.raw, "requeue", comm=comm, method=a.method)
    if rank == 0 and os.path.isdir(snapshot):
        shutil.rmtree(snapshot)  # a save that a kill interrupted: no manifest, start over
    comm.Barrier()
    data_s = time.perf_counter() - t0
    ds.save(snapshot)
    return ds, "fresh", data_s, time.perf_counter() - t0 - data_s


def prune_checkpoints(work: str, newest: str, keep: int) -> None:
    """Removes all but the `keep` newest checkpoint directories of `work` up to `newest` (by
    step: the names are zero-padded), once latest.json names `newest`, which is always kept. A
    later one (a checkpoint cut short before a kill) is left: the next checkpoint replaces it."""
    names = sorted(n for n in os.listdir(work) if n.startswith("ckpt-") and n < newest)
    for old in names[: max(0, len(names) - max(keep, 1) + 1)]:
        shutil.rmtree(os.path.join(work, old), ignore_errors=True)


def main() -> None:
    a = parse_args()
    stop_requested = []
    signal.signal(signal.SIGUSR1, lambda *_: stop_requested.append(time.time()))

    import torch  # before MPI and pyddstore
    from mpi4py import MPI
    from pyddstore.torch import DistributedSampler, ThreadDataLoader

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    os.makedirs(a.work, exist_ok=True)
    snapshot = a.snapshot or os.path.join(a.work, "snapshot")
    latest = os.path.join(a.work, "latest.json")
    ckpt = None
    if os.path.exists(latest):
        with open(latest) as f:
            ckpt = json.load(f)

    ds, mode, data_s, save_s = load_data(a, comm, snapshot)
    ready_s = process_age()

    torch.manual_seed(a.seed)
    model = torch.nn.Sequential(torch.nn.Linear(a.features, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sampler = DistributedSampler(ds, seed=a.seed)
    loader = ThreadDataLoader(
        ds, batch_size=a.batch_size, sampler=sampler, num_workers=a.num_workers, auto_epoch=True
    )
    steps_path = os.path.join(a.work, f"steps.r{rank}.jsonl")
    step, epoch = 0, 0
    if ckpt is not None:
        state = torch.load(os.path.join(a.work, ckpt["dir"], "model.pt"), weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        with open(os.path.join(a.work, ckpt["dir"], f"loader.r{rank}.json")) as f:
            loader.load_state_dict(json.load(f))  # checked: same dataset, batch size, epochs
        step, epoch = ckpt["step"], ckpt["epoch"]
        with open(steps_path) as f:  # steps after the checkpoint are trained again
            kept = f.readlines()[:step]
        with open(steps_path, "w") as f:
            f.writelines(kept)
    elif os.path.exists(steps_path):
        os.remove(steps_path)  # killed before its first checkpoint: every step is trained again

    def checkpoint(why: str) -> None:
        """Collective: rank 0 writes the model and optimizer, every rank its loader state, then
        latest.json names the new checkpoint (written last, replaced atomically)."""
        name = f"ckpt-{step:08d}"
        d = os.path.join(a.work, name)
        if rank == 0:
            os.makedirs(d, exist_ok=True)
            torch.save(
                {"model": model.state_dict(), "optimizer": opt.state_dict()}, os.path.join(d, "model.pt")
            )
        comm.Barrier()
        with open(os.path.join(d, f"loader.r{rank}.json.tmp"), "w") as f:
            json.dump(loader.state_dict(), f)
        os.replace(os.path.join(d, f"loader.r{rank}.json.tmp"), os.path.join(d, f"loader.r{rank}.json"))
        comm.Barrier()
        if rank == 0:
            with open(latest + ".tmp", "w") as f:
                json.dump({"dir": name, "step": step, "epoch": epoch, "why": why}, f)
            os.replace(latest + ".tmp", latest)
            prune_checkpoints(a.work, name, a.keep_checkpoints)
        comm.Barrier()

    first_batch_s, steps_here = None, 0
    with open(steps_path, "a") as steps_log:
        while epoch < a.epochs:
            for batch in loader:
                x, ids, y = decode(batch) if a.source == "memmap" else batch
                if first_batch_s is None:
                    first_batch_s = process_age()
                    info = {
                        "rank": rank,
                        "ranks": size,
                        "mode": mode,
                        "source": a.source,
                        "samples": len(ds),
                        "data_s": round(data_s, 3),
                        "save_s": round(save_s, 3),
                        "ready_s": round(ready_s, 3),
                        "first_batch_s": round(first_batch_s, 3),
                        "step": step,
                        "epoch": epoch,
                    }
                    # One write per report, so that the lines of ranks sharing a pipe stay whole.
                    sys.stdout.write(f"requeue-start {json.dumps(info)}\n")
                    sys.stdout.flush()
                if step == a.die_at_step and rank == 0:
                    os.kill(os.getpid(), signal.SIGKILL)  # a node failure: no checkpoint
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                for p in model.parameters():  # data-parallel: average the gradients
                    grad = p.grad.numpy()
                    comm.Allreduce(MPI.IN_PLACE, grad, op=MPI.SUM)
                    grad /= size
                opt.step()
                time.sleep(a.step_delay)
                batch = loader.state_dict()["batches_yielded"] - 1  # this one's place in the epoch
                steps_log.write(json.dumps([sampler.epoch, batch, ids.tolist()]) + "\n")
                steps_log.flush()
                step += 1
                steps_here += 1
                stop = comm.allreduce(1 if stop_requested else 0, op=MPI.MAX)  # every rank stops together
                stop = stop or steps_here == a.max_steps
                if stop or step % a.checkpoint_every == 0:
                    checkpoint("signal" if stop else "interval")
                if stop:
                    print(
                        f"requeue-stopped rank {rank} at step {step}: checkpointed, exiting for requeue",
                        flush=True,
                    )
                    loader.close()
                    ds.free()
                    return
            epoch += 1
    checkpoint("done")
    if rank == 0:
        weights = torch.cat([p.detach().flatten() for p in model.parameters()])
        with open(os.path.join(a.work, "DONE"), "w") as f:
            json.dump({"step": step, "weights_sum": float(weights.double().sum())}, f)
        print(f"requeue-done {step} steps", flush=True)
    loader.close()
    ds.free()


if __name__ == "__main__":
    sys.exit(main())
