"""Method-2 extra job holding variables the core job frees (m2_free_core.py): joins "fx" and
"rg", checks every row, writes {hs}/joined-TAG and waits for {hs}/READDED (the core freed them
and published different variables under the same names), then:

- every read of the old handles (get_batch, get, ragged get_batch) raises DDStoreStaleError
  naming the variable and the core rank, within DDSTORE_TIMEOUT_S, and the destination holds
  neither the old rows nor the new ones;
- with --race, a thread reads "fx" without pause while the core frees it: every read that
  returns holds exactly the old rows; once one raises DDStoreStaleError, every later one does;
- a fresh join reads the new variables' rows.

    python m2_free_extra.py --hs DIR --n-core 2 --tag T [--race]
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import threading
import time

import numpy as np
from _common import expect_error, main_guard
from m2_common import FREE_FIXED_SHAPE, free_gen_fixed, free_gen_ragged, free_gen_rows

import pyddstore
from pyddstore import DDStoreStaleError

A = None


def joined_store():
    store = pyddstore.PyDDStore(None, method=2, handshake_dir=A.hs, n_core=A.n_core)
    store.join("fx")
    store.join("rg")
    return store


def check_gen(store, gen: int, rows) -> None:
    rows = np.asarray(rows, dtype=np.int64)
    out = np.empty((len(rows),) + FREE_FIXED_SHAPE, np.float32)
    store.get_batch("fx", out, rows)
    assert np.array_equal(out, free_gen_fixed(gen, rows)), f"fx gen {gen}: rows differ from the core's"
    values, offsets = store.get_batch("rg", rows)
    want, lengths = free_gen_ragged(gen, rows.tolist())
    assert np.array_equal(np.diff(offsets), lengths), f"rg gen {gen}: lengths differ"
    assert np.array_equal(values, want), f"rg gen {gen}: values differ from the core's"


def racer(store, seen: dict, stop: threading.Event) -> None:
    """Reads fx until told to stop; a read that returns must hold generation 1's rows."""
    rng = np.random.default_rng(5)
    n = free_gen_rows(1)
    while not stop.is_set():
        rows = rng.integers(0, n, 16)
        out = np.empty((16,) + FREE_FIXED_SHAPE, np.float32)
        try:
            store.get_batch("fx", out, rows)
        except DDStoreStaleError:
            seen["stale"] += 1
            continue
        if seen["stale"]:
            seen["after_stale"] += 1  # a read succeeding after the free was reported
        if not np.array_equal(out, free_gen_fixed(1, rows)):
            seen["wrong"] += 1
        seen["ok"] += 1


def main():
    global A
    p = argparse.ArgumentParser()
    p.add_argument("--hs", required=True)
    p.add_argument("--n-core", type=int, required=True)
    p.add_argument("--tag", required=True)
    p.add_argument("--race", action="store_true")
    A = p.parse_args()
    faulthandler.dump_traceback_later(float(os.environ.get("M2_WATCHDOG_S", "200")), exit=True)
    n = free_gen_rows(1)
    old = joined_store()
    check_gen(old, 1, np.random.default_rng(1).permutation(n))
    check_gen(old, 1, [n - 1, 0, 0, 3, 3])
    seen = {"ok": 0, "stale": 0, "after_stale": 0, "wrong": 0}
    stop = threading.Event()
    thread = threading.Thread(target=racer, args=(old, seen, stop)) if A.race else None
    if thread:
        thread.start()
    open(os.path.join(A.hs, f"joined-{A.tag}"), "w").close()
    deadline = time.monotonic() + 180
    while not os.path.exists(os.path.join(A.hs, "READDED")):
        assert time.monotonic() < deadline, "the core did not re-add its variables"
        time.sleep(0.05)

    limit = float(os.environ.get("DDSTORE_TIMEOUT_S", "60"))
    rows = np.arange(n)[::-1].copy()
    out = np.full((n,) + FREE_FIXED_SHAPE, -7.0, np.float32)
    t0 = time.monotonic()
    e = expect_error(DDStoreStaleError, "'fx'", old.get_batch, "fx", out, rows)
    secs = time.monotonic() - t0
    assert secs < limit + 15, f"the stale read took {secs:.1f} s, DDSTORE_TIMEOUT_S={limit}"
    assert isinstance(e, pyddstore.DDStoreFreedError), type(e).__mro__
    assert "attach again" in str(e) and "core rank" in str(e) and e.peer in (0, 1), (str(e), e.peer)
    assert not np.array_equal(out, free_gen_fixed(1, rows)), "the old rows came back"
    assert not np.array_equal(out, free_gen_fixed(2, rows)), "the new variable's rows came back"
    t0 = time.monotonic()
    expect_error(DDStoreStaleError, "'fx'", old.get_batch, "fx", out, rows)  # and stays so, at once
    assert time.monotonic() - t0 < 2, "a handle known stale waited again"
    expect_error(DDStoreStaleError, "'fx'", old.get, "fx", out[:5], 30)
    expect_error(DDStoreStaleError, "'rg'", old.get_batch, "rg", [0, n - 1, 4])
    if thread:
        time.sleep(0.3)
        stop.set()
        thread.join(timeout=120)
        assert not thread.is_alive(), "the racing reader hangs"
        assert seen["ok"] > 0 and seen["stale"] > 0, seen
        assert seen["wrong"] == 0 and seen["after_stale"] == 0, seen

    new = joined_store()
    check_gen(new, 2, np.random.default_rng(2).permutation(free_gen_rows(2)))
    new.free()
    old.free()
    print(
        f"free extra ok {A.tag} ({new.transport}): stale after {secs:.2f} s: {type(e).__name__}: {e} "
        f"racer {seen}",
        flush=True,
    )


main_guard(main)
