"""A graph neural network trained with DistributedDataParallel from a DistDataset of generated
molecules of varying size (torch_geometric Data): each rank loads only its share of the graphs,
every rank reads any graph (one ragged read per field and batch).

    mpirun -n 4 python examples/gnn/gnn-ddp.py                                   # method 0
    DDSTORE_METHOD=1 DDSTORE_FABRIC=cxi mpirun -n 4 python examples/gnn/gnn-ddp.py --num-workers=1

Prints per epoch the mean squared error per molecule, molecules/s and the data-wait fraction.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gnn_common as common  # noqa: E402 - after the path is set; imports torch first

ARGS = common.parse_args(__doc__.splitlines()[0])  # before pyddstore: DDSTORE_FORK_WORKERS


def main() -> None:
    a = ARGS
    job = common.Job(a)
    from pyddstore.torch import DistDataset

    ds = DistDataset(
        common.Molecules(a.molecules, a.seed),
        a.name,
        comm=job.store_comm,
        method=a.method,
        handshake_dir=a.handshake_dir or None,
        device=job.device if a.gpu_dest else None,
    )
    common.train_and_close(ds, a, job, "single job")


if __name__ == "__main__":
    main()
