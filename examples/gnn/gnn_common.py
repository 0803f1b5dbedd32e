"""Shared pieces of the GNN examples: generated molecules of varying size, a small graph model
(torch_geometric), and DDP training from a DistDataset of graphs. Options, job set-up (store
communicator, DDP) and the core server's stop flag come from the VAE example (../vae/common.py).

gnn-ddp.py (single job), gnn_core_server.py (method-2 core) and gnn_extra_train.py (method-2
extra job) take the VAE scripts' options plus --molecules N. Call parse_args() before importing
pyddstore (DDSTORE_FORK_WORKERS).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch  # before MPI starts
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "vae"))
import common as base  # noqa: E402 - the VAE example's options, Job, StopFlag, fail

Job, StopFlag, fail = base.Job, base.StopFlag, base.fail
DATASET_NAME = "gnn-train"
ATOM_TYPES = 5
# Energy per atom type and per bond of the generated molecules: what the model learns.
ATOM_ENERGY = (-1.0, -0.5, 0.3, 0.8, 1.5)
BOND_ENERGY = 0.2


def parse_args(description: str, argv=None) -> argparse.Namespace:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--molecules", type=int, default=2000, help="molecules in the training set")
    known, rest = pre.parse_known_args(argv)
    a = base.parse_args(description, rest)
    a.molecules = known.molecules
    if a.molecules < 1:
        base.fail("--molecules must be at least 1")
    if a.name == base.DATASET_NAME:
        a.name = DATASET_NAME
    if a.lr == 1e-3:  # the VAE's default; this model learns faster with more
        a.lr = 5e-3
    return a


class Molecules(Dataset):
    """Generated molecules: 1 to 24 atoms (one-hot types, 3-D positions), a chain of bonds plus a
    few ring closures, stored both ways (edge_index (2, 2B), bond lengths as edge_attr); the
    target y is the summed atom and bond energy. Sample i is the same on every rank."""

    def __init__(self, n: int, seed: int = 0):
        self.n, self.seed = n, seed

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        from torch_geometric.data import Data

        if not 0 <= i < self.n:
            raise IndexError(i)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        atoms = int(torch.randint(1, 25, (1,), generator=g))
        types = torch.randint(0, ATOM_TYPES, (atoms,), generator=g)
        pos = torch.randn(atoms, 3, generator=g)
        chain = torch.stack([torch.arange(atoms - 1), torch.arange(1, atoms)])
        rings = torch.randint(0, atoms, (2, atoms // 5), generator=g)
        bonds = torch.cat([chain, rings[:, rings[0] != rings[1]]], 1)
        edge_index = torch.cat([bonds, bonds.flip(0)], 1)
        length = (pos[edge_index[0]] - pos[edge_index[1]]).norm(dim=1, keepdim=True)
        y = torch.tensor(ATOM_ENERGY)[types].sum() + BOND_ENERGY * bonds.shape[1]
        return Data(
            x=F.one_hot(types, ATOM_TYPES).float(),
            edge_index=edge_index,
            edge_attr=length,
            pos=pos,
            y=y.view(1),
        )


class GNN(nn.Module):
    """Two graph convolutions, a sum over each molecule's atoms, a linear head."""

    def __init__(self, hidden: int = 64):
        super().__init__()
        from torch_geometric.nn import GCNConv

        self.conv1 = GCNConv(ATOM_TYPES, hidden)
        self.conv2 = GCNConv(hidden, hidden)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x, edge_index, batch, num_graphs):
        from torch_geometric.nn import global_add_pool

        h = F.relu(self.conv1(x, edge_index))
        h = F.relu(self.conv2(h, edge_index))
        return self.head(global_add_pool(h, batch, size=num_graphs)).squeeze(-1)


def make_loader(ds, a: argparse.Namespace, job: Job):
    """A sampler over this rank's part and a loader of torch_geometric Batches."""
    from torch.utils.data.distributed import DistributedSampler
    from torch_geometric.loader import DataLoader as GraphLoader
    from torch_geometric.loader.dataloader import Collater

    sampler = DistributedSampler(ds, num_replicas=job.size, rank=job.rank, shuffle=True, seed=a.seed)
    kw = dict(batch_size=a.batch_size, sampler=sampler, num_workers=a.num_workers, drop_last=True)
    if a.loader == "thread":
        from pyddstore.torch import ThreadDataLoader

        return ThreadDataLoader(ds, collate_fn=Collater(ds), **kw), sampler
    if a.num_workers > 0:
        kw.update(persistent_workers=True)
    return GraphLoader(ds, **kw), sampler


def describe(ds, a: argparse.Namespace, job: Job, what: str) -> None:
    store = ds.ddstore
    job.log(
        f"{what}: {len(ds)} molecules, fields {ds.shapes}, method {store.method}, {store.transport}, "
        f"comm {a.comm}, {job.size} ranks, loader {a.loader} with {a.num_workers} workers, "
        f"device {job.device}"
    )


def train(ds, a: argparse.Namespace, job: Job) -> list[float]:
    """Trains the GNN with DDP; prints per epoch the mean squared error per molecule, molecules/s
    and the fraction of the epoch spent waiting for data. Returns the losses."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(a.seed)
    model = DDP(GNN(min(a.hidden, 64)).to(job.device), device_ids=[job.device.index] if job.cuda else None)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    loader, sampler = make_loader(ds, a, job)
    losses = []
    try:
        for epoch in range(a.epochs):
            sampler.set_epoch(epoch)
            total, count, wait = 0.0, 0, 0.0
            t0 = time.perf_counter()
            t_ask = t0
            for batch in loader:
                wait += time.perf_counter() - t_ask
                batch = batch.to(job.device, non_blocking=True)
                pred = model(batch.x, batch.edge_index, batch.batch, batch.num_graphs)
                loss = F.mse_loss(pred, batch.y, reduction="sum")
                opt.zero_grad()
                (loss / batch.num_graphs).backward()
                opt.step()
                total += loss.item()
                count += batch.num_graphs
                t_ask = time.perf_counter()
            secs = time.perf_counter() - t0
            sums = torch.tensor([total, count, wait, secs], dtype=torch.float64, device=job.device)
            slowest = torch.tensor([secs], dtype=torch.float64, device=job.device)
            dist.all_reduce(sums)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            total, count, wait, rank_secs = sums.tolist()
            losses.append(total / max(count, 1))
            job.log(
                f"epoch {epoch + 1}/{a.epochs}: loss {losses[-1]:.4f}, "
                f"{count / slowest.item():.0f} samples/s, "
                f"{wait / job.size:.3f} s waiting for data (mean per rank), {slowest.item():.2f} s, "
                f"data-wait fraction {wait / max(rank_secs, 1e-9):.1%}"
            )
    finally:
        close = getattr(loader, "close", None)
        if close is not None:
            close()
    return losses


def train_and_close(ds, a: argparse.Namespace, job: Job, what: str) -> None:
    describe(ds, a, job, what)
    try:
        losses = train(ds, a, job)
        job.log(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    finally:
        ds.free()
        job.close()
