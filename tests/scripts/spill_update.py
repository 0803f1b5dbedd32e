"""Updates reach staged rows (issue 36): rows read ahead into a read-ahead stage, then updated by
their owner and followed by barrier(), read back new from a thread, a forked worker, a spawned
worker and the other rank (same-node or remote), content checked against what the owner wrote.

python spill_update.py <spill_dir>     (under mpirun, 2 ranks)
"""

import multiprocessing
import os
import sys
import threading

import numpy as np
from _common import main_guard, rows_of
from pyddstore._shares import share_of

import pyddstore

N, SHAPE = 4096, (20,)  # 80-byte float32 rows; rank 1 owns 2048..4095
ROW = 80
OLD, NEW = 3, 9  # content seeds before and after the update


def check(store, idx, want_seed_of):
    """Reads rows idx; every row must hold what its owner wrote last (want_seed_of(row))."""
    out = np.empty((len(idx),) + SHAPE, np.float32)
    store.get_batch("v", out, np.asarray(idx, np.int64))
    for i, g in enumerate(idx):
        want = rows_of(want_seed_of(g), [g], SHAPE, "float32")[0]
        if not np.array_equal(out[i], want):
            old = np.array_equal(out[i], rows_of(OLD, [g], SHAPE, "float32")[0])
            raise AssertionError(f"row {g}: {'the OLD value' if old else 'garbage'} came back")


def hits(store):
    return store.get_profile("v")["prefetch_hits"]


def spawned_reader(store, rows, new_rows, conn):
    """A spawned worker (the store pickled to a handle, attached): tries to stage `rows`, then
    reads them once told that their owner updated `new_rows` and barrier() returned."""
    try:
        conn.send(store._native.prefetch("v", np.asarray(rows)))
        assert conn.recv() == "go"
        new = set(new_rows)
        check(store, rows, lambda g: NEW if g in new else OLD)
        conn.send("ok")
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        conn.send(f"spawned reader: {e!r}")


def main(spill_dir):
    from mpi4py import MPI

    store = pyddstore.PyDDStore(MPI.COMM_WORLD, method=1)
    first, count = share_of(N, store.size, store.rank)
    budget = (count // 3) * ROW  # a third in memory, the rest (and 3000..3063, 1400..1463) spilled
    store.add(
        "v",
        rows_of(OLD, np.arange(first, first + count), SHAPE, "float32"),
        memory_limit=budget,
        spill_dir=spill_dir,
    )
    store.barrier()
    updated = set()  # rows rewritten with NEW so far

    def seed_of(g):
        return NEW if g in updated else OLD

    def update(rows):
        """The owner of `rows` (all of one rank) writes their NEW content; collective barrier."""
        rows = np.asarray(rows)
        owner = int(rows[0] >= share_of(N, store.size, 1)[0])
        if store.rank == owner:
            store.update("v", rows_of(NEW, rows, SHAPE, "float32"), offset=int(rows[0]) - first)
        updated.update(int(g) for g in rows)
        store.barrier()

    # The reproduction: 32 spilled rows of rank 1 read ahead (by both ranks: rank 1 from
    # its own file, rank 0 through rank 1), rows 3000-3063 updated, barrier, read back.
    staged = store._native.prefetch("v", np.arange(3000, 3032))
    assert staged == 32, staged
    before = hits(store)
    update(np.arange(3000, 3064))
    check(store, np.arange(2990, 3070), seed_of)
    assert hits(store) == before, "an updated row was served from the stage"

    # Rows not updated stay staged; rows updated while others are staged go, whoever owns them.
    assert store._native.prefetch("v", np.arange(1400, 1432)) == 32  # rank 0's spilled rows
    assert store._native.prefetch("v", np.arange(3500, 3516)) == 16  # rank 1's, not updated
    before = hits(store)
    update(np.arange(1400, 1464))
    check(store, np.arange(3500, 3516), seed_of)
    assert hits(store) - before == 16, "rows nobody updated are still served from the stage"

    # A thread stages, the main thread updates, another thread reads.
    t = threading.Thread(target=store._native.prefetch, args=("v", np.arange(1464, 1496)))
    t.start()
    t.join()
    before = hits(store)
    update(np.arange(1470, 1480))
    errors = []

    def read():
        try:
            check(store, np.arange(1464, 1496), seed_of)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    t = threading.Thread(target=read)
    t.start()
    t.join()
    assert not errors, errors
    assert hits(store) - before == 22, (hits(store) - before, "the 22 rows not updated stay staged")

    # A worker forked while rows are staged reads them after the update.
    assert store._native.prefetch("v", np.arange(3600, 3632)) == 32
    updated.update(range(3600, 3632))  # what the child expects once told to read
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(go_w)
            assert os.read(go_r, 1) == b"g"
            check(store, np.arange(3600, 3632), seed_of)
        except BaseException as e:  # noqa: BLE001 - reported by the exit status
            print(f"[rank {store.rank}] forked reader:", e, file=sys.stderr, flush=True)
            code = 1
        os._exit(code)
    os.close(go_r)
    update(np.arange(3600, 3632))
    os.write(go_w, b"g")
    os.close(go_w)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the forked reader read an old row"
    check(store, np.arange(3600, 3632), seed_of)

    # A spawned worker (an attached store: no stage of its own) reads after the update.
    ctx = multiprocessing.get_context("spawn")
    here, there = ctx.Pipe()
    rows = list(range(3700, 3732))
    worker = ctx.Process(target=spawned_reader, args=(store, rows, rows[:16], there))
    worker.start()
    assert here.poll(120), "the spawned worker did not start"
    assert here.recv() == 0, "an attached store stages nothing"
    update(rows[:16])
    here.send("go")
    assert here.poll(120), "the spawned worker did not read"
    assert (said := here.recv()) == "ok", said
    worker.join(60)
    assert worker.exitcode == 0, worker.exitcode

    # Every row, once more, from every rank.
    check(store, np.arange(N), seed_of)
    store.barrier()
    store.free()
    print(f"rank {store.rank}: update ok")


if __name__ == "__main__":
    main_guard(lambda: main(sys.argv[1]))
