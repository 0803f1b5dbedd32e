"""Shared pieces of the VAE examples: options, data, model, DDP set-up and the training loop.

vae-ddp.py (single job), vae_core_server.py (method-2 core) and vae_extra_train.py (method-2
extra job) take the same options. Call parse_args() before importing pyddstore: it sets
DDSTORE_FORK_WORKERS=1 for forked DataLoader workers, which libfabric reads when it starts.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import time

import numpy as np
import torch  # before MPI starts
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

BASE = 28  # image side at --image-scale 1
DATASET_NAME = "vae-train"


# -- options ------------------------------------------------------------------------------------


def _env_method() -> int | None:
    raw = os.environ.get("DDSTORE_METHOD", "").strip()
    return int(raw) if raw else None


def _default_comm() -> str:
    if os.environ.get("DDSTORE_COMM", "").strip().lower() in ("mpi", "torch", "file"):
        return os.environ["DDSTORE_COMM"].strip().lower()
    return "torch" if os.environ.get("DDSTORE_MPI", "1").strip() == "0" else "mpi"


def parse_args(description: str, argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--num-workers", type=int, default=0, help="threads or forked processes; 0: main process")
    p.add_argument(
        "--loader",
        choices=["torch", "thread"],
        default=None,
        help="torch DataLoader (forked workers) or ThreadDataLoader; default thread if workers > 0",
    )
    p.add_argument("--gpu-dest", action="store_true", help="read batches into GPU memory (device=)")
    p.add_argument(
        "--gpu-source", action="store_true", help="keep each rank's share on the GPU (add_device=)"
    )
    p.add_argument("--replicate", type=int, default=1, help="repeat the training set R times")
    p.add_argument("--image-scale", type=int, default=1, help="(28*S)^2 images")
    p.add_argument(
        "--comm",
        choices=["mpi", "torch", "file"],
        default=_default_comm(),
        help="communicator of the store: MPI, the DDP group, or files in --handshake-dir "
        "(default torch when DDSTORE_MPI=0)",
    )
    p.add_argument(
        "--method", type=int, choices=[0, 1, 2], default=_env_method(), help="default DDSTORE_METHOD"
    )
    p.add_argument("--handshake-dir", default=os.environ.get("DDSTORE_HANDSHAKE_DIR", ""))
    p.add_argument("--n-core", type=int, default=None, help="extra job: ranks of the core job")
    p.add_argument("--name", default=DATASET_NAME, help="dataset name in the store")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--hidden", type=int, default=400)
    p.add_argument("--latent", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if a.loader is None:
        a.loader = "thread" if a.num_workers > 0 else "torch"
    for opt in ("epochs", "batch_size", "replicate", "image_scale"):
        if getattr(a, opt) < 1:
            p.error(f"--{opt.replace('_', '-')} must be at least 1")
    if a.num_workers < 0:
        p.error("--num-workers must be >= 0")
    if a.loader == "torch" and a.num_workers > 0:
        if a.method == 0:
            p.error("--loader torch with workers needs method 1 or 2 (MPI does not survive fork)")
        # Before pyddstore is imported: libfabric reads its memory-monitor setting at start.
        os.environ.setdefault("DDSTORE_FORK_WORKERS", "1")
    if a.comm in ("torch", "file") and a.method == 0:
        p.error(f"--comm {a.comm} needs method 1 or 2: method 0 is MPI RMA")
    if a.comm == "file" and not a.handshake_dir:
        p.error("--comm file needs --handshake-dir (or DDSTORE_HANDSHAKE_DIR)")
    return a


# -- data ---------------------------------------------------------------------------------------

# Seven-segment strokes per digit: (row0, col0, row1, col1) in a 28x28 frame.
_SEGMENTS = {
    "a": (5, 9, 5, 19),
    "b": (5, 19, 14, 19),
    "c": (14, 19, 23, 19),
    "d": (23, 9, 23, 19),
    "e": (14, 9, 23, 9),
    "f": (5, 9, 14, 9),
    "g": (14, 9, 14, 19),
}
_DIGITS = ["abcdef", "bc", "abged", "abgcd", "fgbc", "afgcd", "afgedc", "abc", "abcdefg", "abcdfg"]


def _generated_digits(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic digit-like 28x28 images in [0, 1]: seven-segment digits with random shift,
    stroke width, slant and intensity, blurred."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:BASE, 0:BASE].astype(np.float32)
    images = np.zeros((n, BASE, BASE), np.float32)
    labels = np.arange(n, dtype=np.int64) % 10
    for i in range(n):
        dy, dx = rng.uniform(-2.5, 2.5, 2)
        width = rng.uniform(1.0, 2.2)
        slant = rng.uniform(-0.15, 0.15)
        img = np.zeros((BASE, BASE), np.float32)
        for s in _DIGITS[labels[i]]:
            r0, c0, r1, c1 = _SEGMENTS[s]
            r0, r1 = r0 + dy, r1 + dy
            c0, c1 = c0 + dx + slant * (14 - r0), c1 + dx + slant * (14 - r1)
            # Distance from every pixel to the segment.
            vy, vx = r1 - r0, c1 - c0
            t = np.clip(((yy - r0) * vy + (xx - c0) * vx) / (vy * vy + vx * vx), 0, 1)
            d = np.hypot(yy - (r0 + t * vy), xx - (c0 + t * vx))
            img = np.maximum(img, np.clip(width + 0.5 - d, 0, 1))
        images[i] = img * rng.uniform(0.7, 1.0)
    return images, labels


def base_digits(seed: int = 0) -> tuple[np.ndarray, np.ndarray, str]:
    """1797 28x28 float32 images in [0, 1] and labels: scikit-learn's digits (8x8, upscaled) when
    scikit-learn is installed, else generated digit-like images."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        images, labels = _generated_digits(1797, seed)
        return images, labels, "generated digits (scikit-learn not installed)"
    d = load_digits()
    small = torch.from_numpy(d.images.astype(np.float32) / 16.0)[:, None]
    big = F.interpolate(small, size=(BASE, BASE), mode="bilinear", align_corners=False)
    return big[:, 0].clamp(0, 1).numpy(), d.target.astype(np.int64), "scikit-learn load_digits"


class Digits(Dataset):
    """(image (1, 28S, 28S) float32, label) per sample; --replicate R repeats the base set R times.
    Samples are made on demand, so each rank builds only the share it loads."""

    def __init__(self, replicate: int = 1, image_scale: int = 1, seed: int = 0):
        self.images, self.labels, self.origin = base_digits(seed)
        self.replicate, self.scale = replicate, image_scale

    def __len__(self) -> int:
        return len(self.images) * self.replicate

    def __getitem__(self, i: int):
        if not 0 <= i < len(self):
            raise IndexError(i)
        j = i % len(self.images)
        img = torch.from_numpy(self.images[j])
        if self.scale > 1:
            img = img.repeat_interleave(self.scale, 0).repeat_interleave(self.scale, 1)
        return img[None].contiguous(), int(self.labels[j])


# -- model --------------------------------------------------------------------------------------


class VAE(nn.Module):
    def __init__(self, pixels: int, hidden: int = 400, latent: int = 20):
        super().__init__()
        self.pixels = pixels
        self.enc = nn.Linear(pixels, hidden)
        self.mu = nn.Linear(hidden, latent)
        self.logvar = nn.Linear(hidden, latent)
        self.dec1 = nn.Linear(latent, hidden)
        self.dec2 = nn.Linear(hidden, pixels)

    def forward(self, x):
        h = F.relu(self.enc(x.reshape(-1, self.pixels)))
        mu, logvar = self.mu(h), self.logvar(h)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        return torch.sigmoid(self.dec2(F.relu(self.dec1(z)))), mu, logvar


def vae_loss(recon, x, mu, logvar):
    """Summed over the batch: reconstruction (binary cross-entropy) + KL divergence."""
    bce = F.binary_cross_entropy(recon, x.reshape(recon.shape), reduction="sum")
    return bce - 0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())


# -- processes ----------------------------------------------------------------------------------


def launcher_rank_size() -> tuple[int, int, int]:
    """(rank, size, local rank) from the launcher: Open MPI, Slurm, or torchrun-style variables."""
    for r, s, lr in (
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
        ("RANK", "WORLD_SIZE", "LOCAL_RANK"),
        ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
        ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
    ):
        if r in os.environ and s in os.environ:
            rank = int(os.environ[r])
            return rank, int(os.environ[s]), int(os.environ.get(lr, rank))
    return 0, 1, 0


def load_pyddstore():
    import pyddstore

    return pyddstore


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Job:
    """This process's place in the job: the store's communicator, DDP, and the compute device."""

    def __init__(self, a: argparse.Namespace, ddp: bool = True):
        self.args = a
        self.mpi = None
        if a.comm == "mpi":
            load_pyddstore()  # before mpi4py: it sets libfabric defaults
            from mpi4py import MPI

            self.mpi = MPI.COMM_WORLD
            self.rank, self.size = self.mpi.Get_rank(), self.mpi.Get_size()
            self.local_rank = launcher_rank_size()[2]
        else:
            self.rank, self.size, self.local_rank = launcher_rank_size()
        if "OMP_NUM_THREADS" not in os.environ:
            # Ranks sharing a CPU set (mpirun on one node) split it instead of oversubscribing.
            local = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", os.environ.get("LOCAL_WORLD_SIZE", "1")))
            torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // max(1, local)))
        self.cuda = torch.cuda.is_available()
        if self.cuda:
            torch.cuda.set_device(self.local_rank % torch.cuda.device_count())
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            self.device = torch.device("cpu")
        if (a.gpu_dest or a.gpu_source) and not self.cuda:
            self.log("no GPU available: --gpu-dest/--gpu-source skipped, data stays in host memory")
            a.gpu_dest = a.gpu_source = False
        self.file_comm = None
        if a.comm == "file":
            from pyddstore import FileComm

            self.file_comm = FileComm(a.handshake_dir, rank=self.rank, size=self.size)
        # The core server trains nothing: it needs a process group only as its store's comm.
        self.ddp_group = self._init_ddp() if ddp or a.comm == "torch" else None
        self.store_comm = self._store_comm()

    def _agree(self, value):
        """Rank 0's value, everywhere, over the communicator that exists before DDP."""
        if self.mpi is not None:
            return self.mpi.bcast(value, root=0)
        if self.file_comm is not None:
            return self.file_comm.allgather(value)[0]
        return value

    def _init_ddp(self):
        backend = "nccl" if self.cuda else "gloo"
        addr = os.environ.get("MASTER_ADDR")
        port = os.environ.get("MASTER_PORT")
        if addr is None or port is None:
            if self.mpi is None and self.file_comm is None:
                # --comm torch: nothing to agree through; the job script sets MASTER_ADDR/PORT
                # on several nodes (srun), on one node every rank finds the same default.
                agreed = ("127.0.0.1", 29500)
            else:
                mine = (socket.gethostname() if self.size > 1 else "127.0.0.1", _free_port())
                agreed = self._agree(mine if self.rank == 0 else None)
            addr = addr or agreed[0]
            port = port or str(agreed[1])
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = addr, str(port)
        dist.init_process_group(backend, init_method="env://", rank=self.rank, world_size=self.size)
        return dist.group.WORLD

    def _store_comm(self):
        if self.args.comm == "mpi":
            return self.mpi
        if self.args.comm == "torch":
            return self.ddp_group
        return self.file_comm

    def log(self, *msg) -> None:
        if self.rank == 0:
            print(*msg, flush=True)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


# -- loading and training -----------------------------------------------------------------------


def make_loader(ds, a: argparse.Namespace, job: Job):
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler

    sampler = DistributedSampler(ds, num_replicas=job.size, rank=job.rank, shuffle=True, seed=a.seed)
    kw = dict(batch_size=a.batch_size, sampler=sampler, num_workers=a.num_workers, drop_last=True)
    if a.loader == "thread":
        from pyddstore.torch import ThreadDataLoader

        return ThreadDataLoader(ds, pin_memory=job.cuda and not a.gpu_dest, **kw), sampler
    if a.num_workers > 0:
        kw.update(persistent_workers=True, pin_memory=job.cuda)
    return DataLoader(ds, **kw), sampler


def describe(ds, a: argparse.Namespace, job: Job, what: str) -> None:
    store = ds.ddstore
    job.log(
        f"{what}: {len(ds)} samples of {tuple(ds.shapes[0])}, method {store.method}, {store.transport}, "
        f"comm {a.comm}, {job.size} ranks, loader {a.loader} with {a.num_workers} workers, "
        f"device {job.device}"
    )


def train(ds, a: argparse.Namespace, job: Job) -> list[float]:
    """Trains the VAE on ds with DDP; prints and returns the mean loss per sample of each epoch."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(a.seed)
    pixels = int(np.prod(ds.shapes[0]))
    model = VAE(pixels, a.hidden, a.latent).to(job.device)
    model = DDP(model, device_ids=[job.device.index] if job.cuda else None)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    loader, sampler = make_loader(ds, a, job)
    losses = []
    try:
        for epoch in range(a.epochs):
            sampler.set_epoch(epoch)
            model.train()
            total, count, wait = 0.0, 0, 0.0
            t0 = time.perf_counter()
            t_ask = t0
            for x, _ in loader:
                wait += time.perf_counter() - t_ask
                x = x.to(job.device, non_blocking=True)
                recon, mu, logvar = model(x)
                loss = vae_loss(recon, x, mu, logvar)
                opt.zero_grad()
                (loss / len(x)).backward()
                opt.step()
                total += loss.item()
                count += len(x)
                t_ask = time.perf_counter()
            secs = time.perf_counter() - t0
            sums = torch.tensor([total, count, wait], dtype=torch.float64, device=job.device)
            slowest = torch.tensor([secs], dtype=torch.float64, device=job.device)
            dist.all_reduce(sums)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            total, count, wait = sums.tolist()
            secs = slowest.item()
            losses.append(total / max(count, 1))
            job.log(
                f"epoch {epoch + 1}/{a.epochs}: loss {losses[-1]:.4f}, "
                f"{count / secs:.0f} samples/s, {wait / job.size:.3f} s waiting for data "
                f"(mean per rank), {secs:.2f} s"
            )
    finally:
        close = getattr(loader, "close", None)
        if close is not None:
            close()
    return losses


# -- core server --------------------------------------------------------------------------------


class StopFlag:
    """Set by SIGTERM/SIGINT; the serving loop also stops when {handshake_dir}/STOP exists."""

    def __init__(self):
        self.signal = None
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._set)

    def _set(self, signum, _frame) -> None:
        self.signal = signum

    def wait(self, stop_file: str, poll_s: float = 0.2) -> str:
        while self.signal is None and not os.path.exists(stop_file):
            time.sleep(poll_s)
        return f"signal {signal.Signals(self.signal).name}" if self.signal is not None else stop_file


def train_and_close(ds, a: argparse.Namespace, job: Job, what: str) -> None:
    """Describes the dataset, trains on it, logs the loss, then frees it and ends the job."""
    describe(ds, a, job, what)
    try:
        losses = train(ds, a, job)
        job.log(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    finally:
        ds.free()
        job.close()


def fail(msg: str) -> None:
    print(f"error: {msg}", file=sys.stderr, flush=True)
    sys.exit(2)
