"""Descriptor limits of a store's job (`mpirun -n N python fd_limit_job.py MODE`), one
`FDLIMIT {json}` report per rank:

raise: the soft RLIMIT_NOFILE is lowered to 256 first; creating the store raises it to the hard
  limit (read back from /proc/self/limits); an add then works.
low: soft and hard limits are lowered to what is open now + SLACK (argv[2]), below what a
  connection-oriented provider will need for this job: the first add fails, on every rank, with
  the pre-flight check's message.
"""

import json
import os
import resource
import sys
import time

import numpy as np

import pyddstore


def limits() -> tuple:
    with open("/proc/self/limits") as f:
        for line in f:
            if line.startswith("Max open files"):
                soft, hard = line.split()[3:5]
                return int(soft), int(hard)
    raise RuntimeError("no 'Max open files' in /proc/self/limits")


def main():
    mode = sys.argv[1]
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if mode == "raise":
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    else:
        cap = len(os.listdir("/proc/self/fd")) + int(sys.argv[2])
        resource.setrlimit(resource.RLIMIT_NOFILE, (cap, cap))
    before = limits()
    store = pyddstore.PyDDStore(None, method=1)
    report = {"rank": store.rank, "before": list(before), "after": list(limits())}
    t0 = time.monotonic()
    try:
        store.add("x", np.full((4, 8), store.rank, np.float32))
        report["add"] = "ok"
        out = np.zeros((1, 8), np.float32)
        store.get_batch("x", out, np.array([4 * (store.size - 1 - store.rank)], np.int64))
        assert (out == store.size - 1 - store.rank).all(), out
        store.free()
    except pyddstore.DDStoreError as e:
        report["add"] = type(e).__name__
        report["message"] = str(e)
    report["add_s"] = time.monotonic() - t0
    print("FDLIMIT", json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
