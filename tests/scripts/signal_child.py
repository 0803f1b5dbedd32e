"""A process with pyddstore imported and a method-1 store open, for tests/test_signals.py.

    python signal_child.py MODE [preloaded] [faulthandler]   (DDSTORE_FABRIC=tcp)

preloaded: libinfinipath (PSM) is loaded before pyddstore with none of the PSM variables set,
as another library linking libfabric would, so its handlers are installed before pyddstore
comes; faulthandler: faulthandler is enabled first. The store's rows are read back and
checked; the process prints `ready {json}` (its signal handlers before and after, which lie in
a PSM library, whether one is mapped), then MODE: `wait` sleeps until a signal ends it (it
prints `KeyboardInterrupt` and exits 0 when SIGINT raises it); `abort` calls os.abort()."""

import ctypes
import faulthandler
import json
import os
import sys
import time

import numpy as np


def caught() -> list:
    """The signals (1-31) this process catches (SigCgt)."""
    with open("/proc/self/status") as f:
        mask = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt"))
    return [s for s in range(1, 32) if mask >> (s - 1) & 1]


def main() -> None:
    mode, flags = sys.argv[1], sys.argv[2:]
    if "faulthandler" in flags:
        faulthandler.enable()
    if "preloaded" in flags:
        ctypes.CDLL("libinfinipath.so.4")
    before = caught()

    import pyddstore

    store = pyddstore.PyDDStore(None, method=1)
    rows = np.arange(40, dtype=np.float32).reshape(10, 4)
    store.add("v", rows)
    out = np.zeros_like(rows)
    store.get_batch("v", out, np.arange(10))
    assert np.array_equal(out, rows), "rows differ"
    with open("/proc/self/maps") as f:
        maps = f.read()
    report = {
        "caught_before_import": before,
        "caught": caught(),
        "psm_handlers": pyddstore._native.provider_signal_handlers(),
        "psm_mapped": "libinfinipath" in maps or "libpsm" in maps,
        "transport": store.transport,
    }
    if mode == "abort":
        print("ready " + json.dumps(report), flush=True)
        os.abort()
    try:
        print("ready " + json.dumps(report), flush=True)
        # Short sleeps: a signal that lands between the print and a long sleep's system call
        # (the test sends it as soon as it reads "ready") is handled only when that call returns;
        # the loop's next turn handles it within 50 ms.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            time.sleep(0.05)
    except KeyboardInterrupt:
        print("KeyboardInterrupt", flush=True)
        sys.exit(0)
    sys.exit(5)  # no signal came


if __name__ == "__main__":
    main()
