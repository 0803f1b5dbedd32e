"""Method-2 extra job reading a DistDataset the core job frees (m2_torch_free_core.py): a
DistDatasetReader checks every sample of generation 1, writes {hs}/joined-torch and waits for
{hs}/READDED; then its item, batch and ragged reads raise DDStoreStaleError, and a new
DistDatasetReader reads generation 2.

    python m2_torch_free_extra.py --hs DIR --n-core 2
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import time

import torch
from _common import expect_error, main_guard
from m2_common import FreeGenSamples
from pyddstore.torch import DistDatasetReader

from pyddstore import DDStoreStaleError


def check(reader, gen: int) -> None:
    src = FreeGenSamples(gen)
    assert len(reader) == len(src), (len(reader), len(src))
    for i in range(len(src)):
        got, want = reader[i], src[i]
        for k in want:
            assert torch.equal(got[k], want[k]), f"gen {gen} sample {i} {k}: {got[k]} != {want[k]}"
    batch = reader.__getitems__([len(src) - 1, 0, 5])
    assert torch.equal(batch[0]["pos"], src[len(src) - 1]["pos"])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--hs", required=True)
    p.add_argument("--n-core", type=int, default=None)
    a = p.parse_args()
    faulthandler.dump_traceback_later(float(os.environ.get("M2_WATCHDOG_S", "200")), exit=True)
    old = DistDatasetReader("m2f", handshake_dir=a.hs, n_core=a.n_core)
    check(old, 1)
    open(os.path.join(a.hs, "joined-torch"), "w").close()
    deadline = time.monotonic() + 180
    while not os.path.exists(os.path.join(a.hs, "READDED")):
        assert time.monotonic() < deadline, "the core did not re-create its dataset"
        time.sleep(0.05)
    e = expect_error(DDStoreStaleError, "attach again", old.__getitem__, 2)
    expect_error(DDStoreStaleError, "freed", old.__getitems__, [0, 1, 2])
    expect_error(DDStoreStaleError, "'m2f/", old.read_rows, [4, 3], ["pos"])
    new = DistDatasetReader("m2f", handshake_dir=a.hs, n_core=a.n_core)
    check(new, 2)
    print(f"torch free extra ok: {type(e).__name__}: {e}", flush=True)


main_guard(main)
