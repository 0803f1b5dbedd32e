"""Shares past their memory budget (issue 27): every row read is checked against what its owner stored.

python spill_job.py member <spill_dir> <method> <expect: node|remote>   (under mpirun, 2 ranks)
python spill_job.py full <spill_dir>          (a spill file system without room: a clear error)
python spill_job.py killed <spill_dir>        (leaves spill files behind: SIGKILLs itself)
python spill_job.py rss <spill_dir>           (resident memory stays within the budget)
python spill_job.py refused <spill_dir>       (a spill_dir of another user)
"""

import os
import signal
import sys

import numpy as np
from _common import expect_error, main_guard, rows_of, rss_kib
from pyddstore._shares import share_of

import pyddstore
from pyddstore import DDStoreAccessError, DDStoreError, DDStoreUnsupportedError

N, SHAPE = 1203, (20,)  # 80-byte float32 rows
ROW = 80
NR = 301  # ragged rows: row g holds (g % 7) units of 3 int32


def ragged_rows(rows):
    return [rows_of(11, np.full(g % 7, g) * 10 + np.arange(g % 7), (3,), "int32") for g in rows]


def spill_files(d):
    return sorted(f for f in os.listdir(d) if f.endswith(".spill"))


def check_fixed(store, name, seed, idx):
    out = np.empty((len(idx),) + SHAPE, np.float32)
    store.get_batch(name, out, idx)
    want = rows_of(seed, idx, SHAPE, "float32")
    bad = np.flatnonzero(~np.all(out == want, axis=1))
    assert not len(bad), f"'{name}': rows {np.asarray(idx)[bad][:8]} differ from what their owners stored"


def check_ragged(store, idx, name="r"):
    values, offsets = store.get_batch(name, idx)
    for i, g in enumerate(idx):
        want = ragged_rows([g])[0]
        got = values[offsets[i] : offsets[i + 1]]
        assert np.array_equal(got, want), f"ragged row {g}: {got.tolist()} != {want.tolist()}"


def member(spill_dir, method, expect):
    from mpi4py import MPI

    store = pyddstore.PyDDStore(MPI.COMM_WORLD, method=int(method))
    first, count = share_of(N, store.size, store.rank)
    mine = np.arange(first, first + count)
    budget = (count // 3) * ROW  # a third in memory, the rest spilled
    store.add("v", rows_of(3, mine, SHAPE, "float32"), memory_limit=budget, spill_dir=spill_dir)
    store.add("z", rows_of(5, mine, SHAPE, "float32"), memory_limit=0, spill_dir=spill_dir)
    store.add("big", rows_of(7, mine, SHAPE, "float32"), memory_limit=10 * count * ROW, spill_dir=spill_dir)
    rfirst, rcount = share_of(NR, store.size, store.rank)
    rmine = ragged_rows(range(rfirst, rfirst + rcount))
    lengths = [len(r) for r in rmine]
    store.add("r", np.concatenate(rmine), lengths=lengths, memory_limit=40 * 12, spill_dir=spill_dir)
    # The same ragged rows with room for a read-ahead stage (an eighth of the budget).
    rbytes = sum(r.nbytes for r in rmine)
    store.add("rs", np.concatenate(rmine), lengths=lengths, memory_limit=rbytes // 2, spill_dir=spill_dir)
    # v, z, r#values and r#ends spill on each rank; big fits: no file for it.
    files = spill_files(spill_dir)
    assert not any(".big.spill" in f for f in files), files
    assert sum(".v.spill" in f for f in files) == store.size, files
    assert sum(".z.spill" in f for f in files) == store.size, files
    store.barrier()

    rng = np.random.default_rng(store.rank)
    for _ in range(12):
        idx = rng.integers(0, N, 97)  # every batch mixes memory and spilled rows of both ranks
        check_fixed(store, "v", 3, idx)
        check_fixed(store, "z", 5, idx)
        check_fixed(store, "big", 7, idx)
        check_ragged(store, rng.integers(0, NR, 40))
    check_fixed(store, "v", 3, np.arange(N))  # every row once, runs across the memory boundary
    check_ragged(store, np.arange(NR))

    # Read-ahead: rows staged before the batch that needs them, which mixes staged, spilled
    # (not staged) and memory rows of both ranks.
    before = store.get_profile("v")
    ahead = rng.permutation(N)[:150]
    staged = store._native.prefetch("v", ahead[:100])
    assert staged > 0, "spilled rows among the next batch were staged"
    assert store.get_profile("v")["rows"] == before["rows"], "reading ahead is not counted as reads"
    check_fixed(store, "v", 3, ahead)
    hits = store.get_profile("v")["prefetch_hits"] - before["prefetch_hits"]
    assert hits == staged, (hits, staged)
    check_fixed(store, "v", 3, ahead)  # taken by the first read: read from the files again
    assert store.get_profile("v")["prefetch_hits"] - before["prefetch_hits"] == staged
    assert store._native.prefetch("big", ahead) == 0, "nothing to stage for a share in memory"

    # Ragged rows are staged whole; the batch mixes staged, spilled and memory rows of both ranks.
    rbefore = store.get_profile("rs")
    rahead = rng.permutation(NR)[:80]
    rstaged = store._native.prefetch("rs", rahead[:50])
    assert rstaged > 0, "spilled ragged rows among the next batch were staged"
    assert store.get_profile("rs")["rows"] == rbefore["rows"], "reading ahead is not counted as reads"
    check_ragged(store, rahead, "rs")
    rhits = store.get_profile("rs")["prefetch_hits"] - rbefore["prefetch_hits"]
    assert rhits == rstaged, (rhits, rstaged)
    check_ragged(store, rahead, "rs")  # taken by the first read: read from the files again
    assert store.get_profile("rs")["prefetch_hits"] - rbefore["prefetch_hits"] == rstaged
    assert store._native.prefetch("rs#values", rahead) == 0, "a ragged part stages nothing by itself"
    check_ragged(store, rahead, "rs")

    prof = store.get_profile("v")
    # Repeated rows of a batch are read once: rows >= what the routes read.
    assert prof["rows"] >= prof["local_rows"] + prof["node_rows"] + prof["remote_rows"], prof
    assert prof["memory_rows"] > 0 and prof["spilled_rows"] > 0, prof
    if expect == "remote":
        assert prof["remote_rows"] > 0, prof
    else:
        assert prof["remote_rows"] == 0 and prof["node_rows"] > 0, prof
    assert store.get_profile("big")["spilled_rows"] == 0

    # A forked worker reads the same rows (own and other ranks', memory and spilled).
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            check_fixed(store, "v", 3, rng.integers(0, N, 200))
            check_ragged(store, rng.integers(0, NR, 50))
        except BaseException as e:  # noqa: BLE001 - reported by the exit status
            print(rank_tag_of(store), "forked reader:", e, file=sys.stderr, flush=True)
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the forked reader failed"
    store.barrier()
    assert len(spill_files(spill_dir)) > 0, "the forked child left its parent's spill files alone"
    store.free()
    MPI.COMM_WORLD.Barrier()
    assert spill_files(spill_dir) == [], f"free() removes every spill file: {spill_files(spill_dir)}"
    print(f"rank {MPI.COMM_WORLD.rank}: spill ok")


def core(hs, spill_dir):
    """A method-2 core job whose shares spill, serving until {hs}/STOP."""
    import time

    from mpi4py import MPI

    store = pyddstore.PyDDStore(MPI.COMM_WORLD, method=2, handshake_dir=hs)
    first, count = share_of(N, store.size, store.rank)
    rows = rows_of(3, np.arange(first, first + count), SHAPE, "float32")
    store.add("v", rows, memory_limit=(count // 4) * ROW, spill_dir=spill_dir)
    print(f"rank {store.rank}: serving", flush=True)
    while not os.path.exists(os.path.join(hs, "STOP")):
        time.sleep(0.05)
    store.free()


def extra(hs):
    """An extra job on the node reads every row of the core's spilled shares."""
    store = pyddstore.PyDDStore(None, method=2, handshake_dir=hs, n_core=2)
    store.join("v")
    check_fixed(store, "v", 3, np.arange(N))
    check_fixed(store, "v", 3, np.random.default_rng(0).integers(0, N, 500))
    print("extra: spill ok", store.get_profile("v")["rows"])


def rank_tag_of(store):
    return f"[rank {store.rank}]"


def refused_on_method0():
    expect_error(
        DDStoreUnsupportedError,
        "method 1 or 2",
        lambda: pyddstore.PyDDStore(method=0, settings=pyddstore.Settings.from_env(memory_limit=1 << 20)),
    )


def full(spill_dir):
    store = pyddstore.PyDDStore(method=1)
    rows = rows_of(3, np.arange(40000), SHAPE, "float32")  # 3.2 MB, the file system has 1 MiB
    e = expect_error(
        DDStoreError, spill_dir, lambda: store.add("v", rows, memory_limit=0, spill_dir=spill_dir)
    )
    assert "needs 3207168 bytes" in str(e), e  # 3.2 MB of rows, a header block, rounded to 4 KiB
    assert spill_files(spill_dir) == [], "nothing is left half-written"
    assert "v" not in store.names()
    store.add("w", rows[:100], memory_limit=0, spill_dir=spill_dir)  # what fits still works
    check_fixed(store, "w", 3, np.arange(100)[::-1])
    print("full ok")


def killed(spill_dir):
    store = pyddstore.PyDDStore(method=1)
    store.add("v", rows_of(3, np.arange(500), SHAPE, "float32"), memory_limit=100 * ROW, spill_dir=spill_dir)
    assert len(spill_files(spill_dir)) == 1
    print("killed: spilled", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def next_job(spill_dir):
    left = spill_files(spill_dir)
    assert len(left) == 1, left
    store = pyddstore.PyDDStore(method=1)
    store.add("v", rows_of(4, np.arange(300), SHAPE, "float32"), memory_limit=0, spill_dir=spill_dir)
    now = spill_files(spill_dir)
    assert left[0] not in now and len(now) == 1, (left, now)
    check_fixed(store, "v", 4, np.arange(300))
    print("next job ok")


def rss(spill_dir):
    """80 MB of rows through a 16 MiB budget, filled in slices (no copy of the data set is held)."""
    store = pyddstore.PyDDStore(method=1)
    budget = 16 << 20
    n = 1_000_000  # 80 MB of 80-byte rows
    # The transport's own set-up (endpoints, queues) is not the budget's: warm it first.
    store.add("warm", rows_of(3, np.arange(10), SHAPE, "float32"))
    check_fixed(store, "warm", 3, np.arange(10))
    before = rss_kib()
    store.init("v", n, SHAPE[0], dtype=np.float32, memory_limit=budget, spill_dir=spill_dir)
    step = 10_000
    for a in range(0, n, step):
        store.update("v", rows_of(3, np.arange(a, a + step), SHAPE, "float32"), a)
    rng = np.random.default_rng(0)
    for _ in range(20):
        check_fixed(store, "v", 3, rng.integers(0, n, 4096))
    check_fixed(store, "v", 3, np.arange(n - 30_000, n))
    grown = (rss_kib() - before) * 1024
    # Generous: the budget x 1.1, plus slices, batches, read threads and allocator slack (the data
    # set is 80 MB: five times the budget).
    assert grown < budget * 1.1 + (16 << 20), f"resident memory grew {grown >> 20} MiB with a 16 MiB budget"
    print(f"rss ok: grew {grown >> 20} MiB for 80 MB of rows, budget 16 MiB")


def refused(spill_dir):
    store = pyddstore.PyDDStore(method=1)
    e = expect_error(
        DDStoreAccessError,
        "spill_dir",
        lambda: store.add("v", np.zeros((10, 4)), memory_limit=0, spill_dir=spill_dir),
    )
    assert "ddattack" in str(e) or "uid" in str(e), e
    print("refused ok")


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "member":
        main_guard(lambda: member(*sys.argv[2:5]))
    elif what == "core":
        main_guard(lambda: core(sys.argv[2], sys.argv[3]))
    elif what == "extra":
        main_guard(lambda: extra(sys.argv[2]))
    elif what == "method0":
        main_guard(refused_on_method0)
    else:
        main_guard(
            lambda: {"full": full, "killed": killed, "next": next_job, "rss": rss, "refused": refused}[what](
                sys.argv[2]
            )
        )
