"""TorchComm's bounded barrier on gloo (N plain processes, as run_procs starts them, with
MASTER_ADDR/MASTER_PORT):
a few barriers pass; then the last rank comes late and the others raise DDStoreTimeoutError
naming it. Prints `TBARRIER {json}` per rank."""

import json
import os
import time

import torch.distributed as dist

import pyddstore
from pyddstore import TorchComm


def main():
    os.environ.setdefault("RANK", os.environ.get("SLURM_PROCID", "0"))
    os.environ.setdefault("WORLD_SIZE", os.environ.get("SLURM_NTASKS", "1"))
    dist.init_process_group("gloo")
    comm = TorchComm()
    for _ in range(5):
        comm.barrier(30.0)
    report = {"rank": comm.rank}
    late = comm.size - 1
    if comm.rank == late:
        time.sleep(8)
    else:
        t0 = time.monotonic()
        try:
            comm.barrier(2.0)
            report["error"] = None
        except pyddstore.DDStoreTimeoutError as e:
            report["error"] = str(e)
        report["waited_s"] = time.monotonic() - t0
    print("TBARRIER", json.dumps(report), flush=True)
    os._exit(0)  # the late rank's barrier is left pending: no collective teardown


if __name__ == "__main__":
    main()
