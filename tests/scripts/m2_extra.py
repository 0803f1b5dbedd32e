"""Method-2 extra member: joins what m2_core.py publishes and checks it.

    python m2_extra.py MODE --hs DIR --n-core N

MODE read: every row of every variable, shuffled, repeated, ranges, from 4 threads; the
    ragged variable r (units (3, 4)) in new arrays and out=.
MODE timeout: no core job: join raises DDStoreTimeoutError within DDSTORE_HANDSHAKE_TIMEOUT_S.
MODE after_stop: joins and reads, creates STOP, waits for {hs}/core-exited, then a read raises
    DDStoreTimeoutError within DDSTORE_TIMEOUT_S (no hang); with M2_AFTER_STOP=timeout_or_data
    (same-node mappings of the core's shares outlive it) it may instead return the core's data.
MODE stale: the core job was killed: join names the stale record.
MODE wrong_token: DDSTORE_JOB_TOKEN is not the core job's: join is refused
    (DDStoreAccessError), and so is a token= argument that is wrong; the right one joins.
The core group read is DDSTORE_CORE_GROUP (default 0).
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import time

import numpy as np
from _common import expect_error, main_guard, rank_tag, rows_of, run_threads
from m2_common import N_ROWS, RAGGED, RAGGED_UNIT, VARS, ragged_rows, seed_of

import pyddstore
from pyddstore import DDStoreError, DDStoreTimeoutError

A = None


def extra_store():
    store = pyddstore.PyDDStore(None, method=2, handshake_dir=A.hs, n_core=A.n_core)
    assert store.is_extra and store.method == 2
    return store


def check(store, name, rows, group):
    _, shape, dtype = VARS[name]
    out = np.empty((len(rows),) + shape, dtype)
    store.get_batch(name, out, rows)
    want = rows_of(seed_of(name, group), rows, shape, dtype)
    assert np.array_equal(out, want), f"{name}: rows {list(rows)[:8]} differ from the core's data"


def check_ragged(store, group):
    """The ragged variable reads as in the core: its dtype, its (3, 4) units, the core's values,
    into a new array and into out=."""
    store.join(RAGGED)
    unit = int(np.prod(RAGGED_UNIT))
    assert store.info(RAGGED) == (N_ROWS, unit, 4), store.info(RAGGED)
    rows = np.array([N_ROWS - 1, 0, 3, 3, 26, 27, 1, 2])
    want, lengths = ragged_rows(group, rows)
    values, offsets = store.get_batch(RAGGED, rows)
    assert values.dtype == np.float32 and values.shape == want.shape, (values.dtype, values.shape)
    assert np.array_equal(offsets, np.concatenate([[0], np.cumsum(lengths)])), offsets
    assert np.array_equal(values, want), "ragged values differ from the core's"
    assert np.array_equal(values[offsets[3] : offsets[4]], want[offsets[3] : offsets[4]])
    buf = np.full((len(want) + 2,) + RAGGED_UNIT, -1, np.float32)
    got, _ = store.get_batch(RAGGED, indices=rows, out=buf)
    assert got.shape == want.shape and np.array_equal(got, want), "ragged values into out= differ"
    assert np.shares_memory(got, buf)


def read():
    group = int(os.environ.get("DDSTORE_CORE_GROUP", "0") or 0)
    store = extra_store()
    for name in VARS:
        store.join(name)
    rng = np.random.default_rng(int(os.environ.get("OMPI_COMM_WORLD_RANK", "0")) + 7)
    for name, (_, shape, dtype) in VARS.items():
        assert store.info(name)[0] == N_ROWS, store.info(name)
        check(store, name, rng.permutation(N_ROWS), group)
        check(store, name, np.array([N_ROWS - 1, 0, 0, 5, 5, N_ROWS - 1]), group)
        out = np.empty((10,) + shape, dtype)
        store.get(name, out, 40)  # a range inside the last core rank's share
        assert np.array_equal(out, rows_of(seed_of(name, group), np.arange(40, 50), shape, dtype))

    def reader(i):
        r = np.random.default_rng(100 + i)
        for _ in range(20):
            check(store, "b", r.integers(0, N_ROWS, 17), group)

    run_threads(4, reader)
    check_ragged(store, group)
    expect_error(IndexError, "out of range", check, store, "a", [N_ROWS], group)
    store.free()
    print(f"{rank_tag()} extra read ok ({store.transport}, group {group})", flush=True)


def timeout():
    store = extra_store()
    limit = float(os.environ["DDSTORE_HANDSHAKE_TIMEOUT_S"])
    t0 = time.monotonic()
    e = expect_error(DDStoreTimeoutError, "no record", store.join, "a")
    secs = time.monotonic() - t0
    assert limit <= secs + 0.5 and secs < limit + 10, secs
    print(f"join timeout -> DDStoreTimeoutError after {secs:.1f} s: {e}", flush=True)


def after_stop():
    store = extra_store()
    store.join("a")
    check(store, "a", np.arange(N_ROWS), 0)
    open(os.path.join(A.hs, "STOP"), "w").close()
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(A.hs, "core-exited")):
        assert time.monotonic() < deadline, "the core job did not exit"
        time.sleep(0.1)
    assert not os.path.exists(os.path.join(A.hs, "a.ddstore.json")), "the core left its record"
    limit = float(os.environ["DDSTORE_TIMEOUT_S"])
    t0 = time.monotonic()
    try:
        check(store, "a", np.arange(N_ROWS), 0)
        outcome = "the core's data"
    except DDStoreTimeoutError as e:
        outcome = f"DDStoreTimeoutError: {e}"
    secs = time.monotonic() - t0
    assert secs < limit + 15, f"took {secs:.1f} s, DDSTORE_TIMEOUT_S={limit}"
    if os.environ.get("M2_AFTER_STOP") != "timeout_or_data":
        assert outcome.startswith("DDStoreTimeoutError"), f"a read after the core stopped gave {outcome}"
    print(f"read after the core stopped -> {outcome} after {secs:.1f} s", flush=True)
    # A new member waits for a core that is not there.
    os.environ["DDSTORE_HANDSHAKE_TIMEOUT_S"] = "1"
    expect_error(DDStoreTimeoutError, "no record", extra_store().join, "a")


def stale():
    store = extra_store()
    e = expect_error(DDStoreError, "stale", store.join, "a")
    assert "no longer running" in str(e), e
    print(f"stale record -> {type(e).__name__}: {e}", flush=True)


def wrong_token():
    store = extra_store()
    e = expect_error(pyddstore.DDStoreAccessError, "not the token", store.join, "a")
    assert os.environ["DDSTORE_JOB_TOKEN"] not in str(e), "the error must not echo the token"
    right = os.environ.pop("M2_RIGHT_TOKEN")
    expect_error(PermissionError, "token= argument", store.join, "a", None, right + "x")
    store.join("a", token=right)
    check(store, "a", np.arange(N_ROWS)[::-1], 0)
    print(f"wrong token -> {type(e).__name__}: {e}", flush=True)


def main():
    global A
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["read", "timeout", "after_stop", "stale", "wrong_token"])
    p.add_argument("--hs", required=True)
    p.add_argument("--n-core", type=int, required=True)
    A = p.parse_args()
    # A hang shows every thread's stack and fails instead of waiting for the test's timeout.
    faulthandler.dump_traceback_later(float(os.environ.get("M2_WATCHDOG_S", "120")), exit=True)
    globals()[A.mode]()


main_guard(main)
