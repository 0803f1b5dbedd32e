"""Method-2 core job of the VAE: loads the training set into a DistDataset published in the
handshake directory, then serves it to extra jobs (vae_extra_train.py) until the stop file
{handshake_dir}/STOP appears or SIGTERM/SIGINT arrives; then frees it, which removes its records.

    mpirun -n 4 python examples/vae/vae_core_server.py --handshake-dir /path/hs &
    mpirun -n 2 python examples/vae/vae_extra_train.py --handshake-dir /path/hs --n-core 4
    touch /path/hs/STOP

Takes the same options as vae-ddp.py; the training ones are ignored here.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402 - after the path is set; imports torch first

ARGS = common.parse_args(__doc__.splitlines()[0])


def main() -> None:
    a = ARGS
    if a.method not in (None, 2):
        common.fail(f"the core server publishes with method 2, not --method {a.method}")
    if not a.handshake_dir:
        common.fail("the core server needs --handshake-dir (or DDSTORE_HANDSHAKE_DIR)")
    stop = common.StopFlag()  # before loading: a signal during the load still stops cleanly
    job = common.Job(a, ddp=False)
    from pyddstore.torch import DistDataset

    stop_file = os.path.join(a.handshake_dir, "STOP")
    if job.rank == 0 and os.path.exists(stop_file):
        os.unlink(stop_file)  # left by an earlier run; the load below synchronises the ranks
        job.log(f"core: removed an old {stop_file}")
    source = common.Digits(a.replicate, a.image_scale, a.seed)
    ds = DistDataset(
        source,
        a.name,
        comm=job.store_comm,
        method=2,
        handshake_dir=a.handshake_dir,
        add_device=job.device if a.gpu_source else None,
    )
    meta = os.path.join(a.handshake_dir, f"{a.name}.meta.json")
    try:
        common.describe(ds, a, job, f"core server ({source.origin})")
        job.log(f"core: serving {a.name!r} in {a.handshake_dir} to extra jobs (n_core={job.size})")
        why = stop.wait(stop_file)
        job.log(f"core: stopping ({why})")
    finally:
        ds.free()  # removes this group's records: new readers wait, attached ones time out
        if job.rank == 0:
            try:
                os.unlink(meta)
            except FileNotFoundError:
                pass
        job.close()
    job.log("core: stopped")


if __name__ == "__main__":
    main()
