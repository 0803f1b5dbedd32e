"""Method-2 extra job of the GNN: reads the molecules gnn_core_server.py serves
(DistDatasetReader) and trains the same model with DDP over this job's ranks.

    mpirun -n 2 python examples/gnn/gnn_extra_train.py --handshake-dir /path/hs --n-core 4
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gnn_common as common  # noqa: E402 - after the path is set; imports torch first

ARGS = common.parse_args(__doc__.splitlines()[0])


def main() -> None:
    a = ARGS
    if a.method not in (None, 2):
        common.fail(f"an extra job reads with method 2, not --method {a.method}")
    if not a.handshake_dir:
        common.fail("the extra job needs --handshake-dir (or DDSTORE_HANDSHAKE_DIR)")
    job = common.Job(a)
    from pyddstore.torch import DistDatasetReader

    ds = DistDatasetReader(
        a.name, handshake_dir=a.handshake_dir, n_core=a.n_core, device=job.device if a.gpu_dest else None
    )
    common.train_and_close(ds, a, job, "extra job")


if __name__ == "__main__":
    main()
