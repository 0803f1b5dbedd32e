"""Method-2 core job of the GNN: loads the generated molecules into a DistDataset published in
the handshake directory and serves them to extra jobs (gnn_extra_train.py) until
{handshake_dir}/STOP appears or SIGTERM/SIGINT arrives; then frees it (records removed).

    mpirun -n 4 python examples/gnn/gnn_core_server.py --handshake-dir /path/hs &
    mpirun -n 2 python examples/gnn/gnn_extra_train.py --handshake-dir /path/hs --n-core 4
    touch /path/hs/STOP
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
        common.fail(f"the core server publishes with method 2, not --method {a.method}")
    if not a.handshake_dir:
        common.fail("the core server needs --handshake-dir (or DDSTORE_HANDSHAKE_DIR)")
    stop = common.StopFlag()
    job = common.Job(a, ddp=False)
    from pyddstore.torch import DistDataset

    stop_file = os.path.join(a.handshake_dir, "STOP")
    if job.rank == 0 and os.path.exists(stop_file):
        os.unlink(stop_file)  # left by an earlier run; the load below synchronises the ranks
    ds = DistDataset(
        common.Molecules(a.molecules, a.seed),
        a.name,
        comm=job.store_comm,
        method=2,
        handshake_dir=a.handshake_dir,
    )
    try:
        common.describe(ds, a, job, "core server")
        job.log(f"core: serving {a.name!r} in {a.handshake_dir} to extra jobs (n_core={job.size})")
        job.log(f"core: stopping ({stop.wait(stop_file)})")
    finally:
        ds.free()  # removes this group's records and meta file
        job.close()
    job.log("core: stopped")


if __name__ == "__main__":
    main()
