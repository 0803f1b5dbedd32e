"""A VAE trained with DistributedDataParallel from a DistDataset: each rank loads only its share
of the images, every rank reads any sample.

    DDSTORE_METHOD=1 DDSTORE_FABRIC=cxi mpirun -n 4 python examples/vae/vae-ddp.py --num-workers=1
    DDSTORE_METHOD=1 DDSTORE_FABRIC=cxi mpirun -n 4 python examples/vae/vae-ddp.py --num-workers=1 \\
        --gpu-dest --gpu-source
    DDSTORE_FABRIC=cxi srun -n 4 --gpus-per-task=1 python examples/vae/vae-ddp.py --comm=torch

Prints per epoch the mean loss per sample, samples/s and the time spent waiting for data.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402 - after the path is set; imports torch first

ARGS = common.parse_args(__doc__.splitlines()[0])  # before pyddstore: DDSTORE_FORK_WORKERS


def main() -> None:
    a = ARGS
    job = common.Job(a)
    from pyddstore.torch import DistDataset

    source = common.Digits(a.replicate, a.image_scale, a.seed)
    job.log(f"data: {source.origin}, replicated {a.replicate}x, image scale {a.image_scale}")
    ds = DistDataset(
        source,
        a.name,
        comm=job.store_comm,
        method=a.method,
        handshake_dir=a.handshake_dir or None,
        device=job.device if a.gpu_dest else None,
        add_device=job.device if a.gpu_source else None,
    )
    common.train_and_close(ds, a, job, "single job")


if __name__ == "__main__":
    main()
