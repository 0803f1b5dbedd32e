"""What each rank spends as a job grows: real jobs of N = 2, 4, 8, ... ranks for every method and
provider, each quantity fitted against N and extrapolated to 1,024 and 16,384 ranks.

    python -m pyddstore.benchmarks.scale [--max-ranks 64] [--configs mpi,tcp,...] [--vcluster 4] [--json FILE]

Run as a plain process: it starts its own jobs (mpirun, or plain processes for the file
communicator). Each rank is a store and nothing else (no torch): it makes a store, adds one
variable (``--rows`` rows of ``--row-bytes`` per rank), reads a first batch holding a row of every
other rank (checked against the owners' data), waits for every rank to have read, and reports its
descriptors (/proc/self/fd), sockets, RSS, PSS and private memory (/proc/self/smaps_rollup),
threads, init and first-batch time (wall and CPU), and what it handed its communicator while
making the store and in ``add`` (method 2's extra ranks: ``join``):
MPI messages and bytes through a PMPI counting shim (tests/scripts/pmpi_count.c, built here with
mpicc), file-communicator file operations through an LD_PRELOAD'ed counter
(tests/scripts/fileops_count.c); without a source checkout or a compiler those are left out.
``tcp-bounded`` keeps a bounded set of 4 live connections (``DDSTORE_MAX_CONNECTIONS=4``): with
``tcp`` it gives what a rank spends at 1,024 and 16,384 ranks with the default set of 1,024.
On one node every peer is reached through the provider (``DDSTORE_SHM=0``), as a remote one would
be, so the extrapolation at 8 ranks per node is an upper bound; ``--vcluster K`` also runs the tcp
job across K virtual nodes (root, scripts/vcluster.py) with same-node peers through memory. Wall
times on an oversubscribed node measure the node; CPU times and counts measure a rank.

It also prints the bytes of the files a method-2 core job publishes at 1,024 to 65,536 core
ranks (the store's address file, once, and a variable's record), from synthetic shares through
the publisher's own encoding; ``--method2-files`` prints only those. ``--idle-threads`` prints
only the CPU a store's own threads spend while nobody reads, in a lone tcp store holding 64 to
2,100 descriptors (a rank at 16,384 ranks with the default set of live connections holds about
2,100): what a rank pays in the background whatever the job does.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ._common import description

SOURCE_TREE = Path(__file__).resolve().parents[4]
# config -> (method, communicator, settings given to the ranks as DDSTORE_* variables)
CONFIGS = {
    "mpi": (0, "mpi", {"DDSTORE_SHM": "0"}),
    "tcp": (1, "mpi", {"DDSTORE_SHM": "0", "DDSTORE_FABRIC": "tcp"}),
    "shm": (1, "mpi", {"DDSTORE_SHM": "0", "DDSTORE_FABRIC": "shm"}),
    # N ranks: N/2 core ranks (one mpirun) and an extra job of N/2 ranks reading them.
    "m2-tcp": (2, "mpi", {"DDSTORE_SHM": "0", "DDSTORE_FABRIC": "tcp"}),
    "file-tcp": (1, "file", {"DDSTORE_SHM": "0", "DDSTORE_FABRIC": "tcp"}),
    # A job larger than its bounded set of live connections, emulated with a set of EMULATED_SET:
    # what a rank spends per remote rank beyond its connections.
    "tcp-bounded": (1, "mpi", {"DDSTORE_SHM": "0", "DDSTORE_FABRIC": "tcp", "DDSTORE_MAX_CONNECTIONS": "4"}),
}
# The live connections a reader endpoint keeps by default (fd_limit::DEFAULT_MAX_CONNECTIONS), and
# the set tcp-bounded emulates it with.
DEFAULT_SET = 1024
EMULATED_SET = 4
# quantity -> (label, unit); per N the figure is the largest over the job's ranks.
QUANTITIES = {
    "fds": ("descriptors", ""),
    "sockets": ("sockets", ""),
    "rss_mib": ("RSS", "MiB"),
    "pss_mib": ("PSS", "MiB"),
    "uss_mib": ("private memory (USS)", "MiB"),
    "threads": ("threads", ""),
    "create_msgs": ("store creation: messages", ""),
    "create_bytes": ("store creation: bytes", "B"),
    "add_msgs": ("add: messages", ""),
    "add_bytes": ("add: bytes", "B"),
    "init_s": ("init time (wall)", "s"),
    "first_batch_s": ("first batch time (wall)", "s"),
    "init_cpu_s": ("init CPU time", "s"),
    "first_batch_cpu_s": ("first batch CPU time", "s"),
}
# The error a fit need not explain, as a fraction of the largest value: counts and memory are
# exact or nearly so; times on a shared node move by tens of percent.
NOISE = {"s": 0.1}
MODELS = {
    "const": lambda n: 0.0,
    "log N": lambda n: math.log2(n),
    "N": lambda n: float(n),
    "N log N": lambda n: n * math.log2(n),
    "N^2": lambda n: float(n) ** 2,
}
TARGETS = (1024, 16384)
PER_NODE = 8
FD_LIMITS = (1024, 65536)
MPI_FIELDS = ("sends", "send_bytes", "collectives", "collective_bytes", "recvs")
# A rank's first lines: the counting shim goes into the global symbol scope before pyddstore
# loads libmpi, so the extension's MPI calls resolve to it (LD_PRELOAD would load it into mpirun).
RANK_CODE = (
    "import ctypes, sys\n"
    "if sys.argv[1] != '-': ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)\n"
    "from pyddstore.benchmarks.scale import rank_main\n"
    "rank_main(sys.argv[2:])\n"
)


# ---------------------------------------------------------------- one rank


def _counters() -> dict:
    """What the counting shims in this process have counted so far (empty without them)."""
    import ctypes

    lib = ctypes.CDLL(None)
    out = {}
    if hasattr(lib, "pmpi_counts"):
        mpi = (ctypes.c_longlong * 5)()
        lib.pmpi_counts(mpi)
        out.update(zip(MPI_FIELDS, mpi))
    if hasattr(lib, "file_counts"):
        files = (ctypes.c_longlong * 2)()
        lib.file_counts(files)
        out.update(zip(("file_opens", "file_creates"), files))
    return out


def _since(before: dict) -> dict:
    """Messages and bytes handed to the communicator since `before`: MPI point-to-point sends and
    collective calls (bytes: what this rank gives them), or the file communicator's file opens
    and creates (no bytes)."""
    now = _counters()
    d = {k: now[k] - before[k] for k in now}
    if "sends" in d:
        return {"msgs": d["sends"] + d["collectives"], "bytes": d["send_bytes"] + d["collective_bytes"], **d}
    if "file_opens" in d:
        return {"msgs": d["file_opens"] + d["file_creates"], "bytes": None, **d}
    return {"msgs": None, "bytes": None}


def snapshot() -> dict:
    """This process's descriptors, sockets, threads, RSS, PSS and private memory (MiB) now."""
    fds = os.listdir("/proc/self/fd")
    sockets = 0
    for fd in fds:
        try:
            sockets += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass  # the descriptor listdir itself had open
    out = {"fds": len(fds) - 1, "sockets": sockets}
    out["uss_mib"] = 0.0
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("Rss", "Pss"):
                out[key.lower() + "_mib"] = int(rest.split()[0]) / 1024
            elif key in ("Private_Clean", "Private_Dirty"):
                out["uss_mib"] += int(rest.split()[0]) / 1024
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                out["threads"] = int(line.split()[1])
    return out


def rank_main(argv: list[str]) -> None:
    """One rank of a scale job (started by `run_job` through RANK_CODE): writes its report."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--role", choices=["rank", "core", "extra"], default="rank")
    ap.add_argument("--n-core", type=int, default=0)
    ap.add_argument("--n-extra", type=int, default=0)
    ap.add_argument("--hs", default="")
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--row-bytes", type=int, default=3072)
    ap.add_argument("--batch", type=int, default=128)
    a = ap.parse_args(argv)
    from .._store import PyDDStore
    from .stores import pattern

    method = CONFIGS[a.config][0]
    report = {"config": a.config, "role": a.role, "before": snapshot()}
    t = _counters()
    t0, c0 = time.perf_counter(), time.process_time()
    n_core = a.n_core if a.role == "extra" else 0
    store = PyDDStore(None, method=method, handshake_dir=a.hs, n_core=n_core)
    report["init_s"], report["init_cpu_s"] = time.perf_counter() - t0, time.process_time() - c0
    report["create"] = _since(t)
    report["rank"], report["size"] = store.rank, store.size
    owners = a.n_core if a.role == "extra" else store.size
    t = _counters()
    if a.role == "extra":
        store.join("x")
    else:
        first = store.rank * a.rows
        store.add("x", pattern(np.arange(first, first + a.rows), a.row_bytes))
    report["add"] = _since(t)
    if a.role != "core":
        rng = np.random.default_rng(store.rank + 1)
        others = [r for r in range(owners) if a.role == "extra" or r != store.rank]
        # A row of every other owner (every peer connected), then random rows of any of them.
        picks = list(others) + list(rng.choice(others, max(0, a.batch - len(others))))
        rows = np.array([o * a.rows + rng.integers(a.rows) for o in rng.permutation(picks)], np.int64)
        out = np.empty((len(rows), a.row_bytes), np.uint8)
        t0, c0 = time.perf_counter(), time.process_time()
        store.get_batch("x", out, rows)
        report["first_batch_s"] = time.perf_counter() - t0
        report["first_batch_cpu_s"] = time.process_time() - c0
        if not np.array_equal(out, pattern(rows, a.row_bytes)):
            raise SystemExit(
                f"rank {store.rank}: a first batch of {len(rows)} rows differs from the owners' data"
            )
        report["batch_rows"] = len(rows)
    store.barrier()  # every rank has read: each holds what serving the others' reads costs too
    if a.role == "core":  # the extra ranks have read and stay connected until the core reported
        _wait_for_reports(a.out, "extra", a.n_extra)
    report.update(snapshot())
    # Extra members are each a store of their own (rank 0 of 1): named by their launcher's rank.
    who = os.environ.get("OMPI_COMM_WORLD_RANK", store.rank) if a.role == "extra" else store.rank
    path = os.path.join(a.out, f"{a.role}-{who}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(report, f)
    os.rename(path + ".tmp", path)
    if a.role == "extra":
        _wait_for_reports(a.out, "core", a.n_core)
    store.barrier()
    store.free()


def _wait_for_reports(out: str, role: str, count: int, timeout_s: float = 900) -> None:
    deadline = time.monotonic() + timeout_s
    while sum(n.startswith(role) and n.endswith(".json") for n in os.listdir(out)) < count:
        if time.monotonic() > deadline:
            raise SystemExit(f"the {count} {role} ranks did not report within {timeout_s:.0f} s")
        time.sleep(0.05)


# ---------------------------------------------------------------- the driver


def build_shims(tmp: str) -> dict:
    """The counting shims, built from the source checkout's tests/scripts with mpicc and cc;
    each is None where its source or compiler is missing (the counts are then left out)."""
    shims = {}
    for name, compiler, libs in (("pmpi_count", "mpicc", []), ("fileops_count", "cc", ["-ldl"])):
        src = SOURCE_TREE / "tests" / "scripts" / f"{name}.c"
        cc = shutil.which(compiler)
        shims[name] = None
        if src.exists() and cc:
            out = os.path.join(tmp, f"{name}.so")
            proc = subprocess.run(
                [cc, "-shared", "-fPIC", "-O1", "-o", out, str(src), *libs], capture_output=True, text=True
            )
            if proc.returncode == 0:
                shims[name] = out
            else:
                print(f"# {name}: {compiler} failed: {proc.stderr[-400:]}", file=sys.stderr)
    return shims


def _env(extra: dict) -> dict:
    env = dict(os.environ)
    env.setdefault("FI_TCP_IFACE", "lo")
    env.update(
        {
            "OMPI_ALLOW_RUN_AS_ROOT": "1",
            "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            "OMPI_MCA_rmaps_base_oversubscribe": "1",
            "DDSTORE_QUIET": "1",
        }
    )
    env.update(extra)
    return env


def _rank_argv(shim: str | None, *args: str) -> list[str]:
    return [sys.executable, "-c", RANK_CODE, shim or "-", *args]


def _mpirun(n: int, argv: list[str], cluster, nodes: int, settings: dict) -> list[str]:
    if cluster is None:
        return ["mpirun", "-n", str(n), "--bind-to", "none", *argv]
    # Across nodes only what -x names reaches the ranks.
    return cluster.mpirun_argv(
        n // nodes, argv, env={**settings, "DDSTORE_QUIET": "1"}, nodes=list(range(nodes))
    )


def _finish(procs: list, timeout: float) -> str | None:
    """Waits for every process; None, or why the job failed (every process is then killed)."""
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            _, err = p.communicate(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
                q.communicate()
            return f"timed out after {timeout:.0f} s"
        if p.returncode != 0:
            for q in procs:
                if q.poll() is None:
                    q.kill()
                    q.communicate()
            return f"exit status {p.returncode}: {err[-1500:]}"
    return None


def run_job(config: str, n: int, args, shims: dict, cluster=None, nodes: int = 1) -> tuple[list, str | None]:
    """One job of n ranks of `config`; returns (the ranks' reports, None or why it failed)."""
    method, comm, settings = CONFIGS[config]
    if cluster is not None:
        settings = {k: v for k, v in settings.items() if k != "DDSTORE_SHM"}  # same-node peers in memory
    shim = shims.get("fileops_count" if comm == "file" else "pmpi_count")
    with tempfile.TemporaryDirectory(prefix="ddscale-") as tmp:
        out, hs = os.path.join(tmp, "out"), os.path.join(tmp, "hs")
        os.makedirs(out)
        os.makedirs(hs)
        common = ["--out", out, "--config", config, "--hs", hs, "--rows", str(args.rows)]
        common += ["--row-bytes", str(args.row_bytes), "--batch", str(args.batch)]
        timeout = args.timeout_s + 10 * n
        pipes = {"stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE, "text": True}
        if comm == "file":
            env = _env({**settings, "DDSTORE_HANDSHAKE_DIR": hs, "DDSTORE_JOB_ID": f"scale{n}"})
            if shim:
                env["LD_PRELOAD"] = shim
            procs = [
                subprocess.Popen(
                    _rank_argv(None, *common),
                    env={**env, "SLURM_PROCID": str(r), "SLURM_NTASKS": str(n), "SLURM_LOCALID": str(r)},
                    **pipes,
                )
                for r in range(n)
            ]
            failed = _finish(procs, timeout)
        elif method == 2:
            core_n = max(1, n // 2)
            env = _env(settings)
            core = subprocess.Popen(
                _mpirun(
                    core_n,
                    _rank_argv(shim, *common, "--role", "core", "--n-extra", str(n - core_n)),
                    cluster,
                    nodes,
                    settings,
                ),
                env=env,
                **pipes,
            )
            extra = subprocess.Popen(
                _mpirun(
                    n - core_n,
                    _rank_argv(shim, *common, "--role", "extra", "--n-core", str(core_n)),
                    cluster,
                    nodes,
                    settings,
                ),
                env=env,
                **pipes,
            )
            failed = _finish([extra, core], timeout)
        else:
            argv = _mpirun(n, _rank_argv(shim, *common), cluster, nodes, settings)
            failed = _finish([subprocess.Popen(argv, env=_env(settings), **pipes)], timeout)
        reports = []
        for name in sorted(os.listdir(out)):
            with open(os.path.join(out, name)) as f:
                reports.append(json.load(f))
    if not failed and len(reports) != n:
        failed = f"{len(reports)} of {n} ranks reported"
    return reports, failed


def summarize(reports: list) -> dict:
    """Per quantity, the largest over the job's ranks (None where nothing was counted)."""
    flat = []
    for r in reports:
        flat.append(
            {
                **{k: r.get(k) for k in ("fds", "sockets", "rss_mib", "pss_mib", "uss_mib", "threads")},
                **{k: r.get(k) for k in ("init_s", "first_batch_s", "init_cpu_s", "first_batch_cpu_s")},
                "create_msgs": r["create"]["msgs"],
                "create_bytes": r["create"]["bytes"],
                "add_msgs": r["add"]["msgs"],
                "add_bytes": r["add"]["bytes"],
            }
        )
    out = {}
    for q in QUANTITIES:
        values = [f[q] for f in flat if f[q] is not None]
        out[q] = max(values) if values else None
    out["fds_before"] = max(r["before"]["fds"] for r in reports)
    return out


def fit(ns: list[int], ys: list[float], noise: float = 0.003) -> dict | None:
    """y = a + b f(N), f of const, log N, N, N log N, N^2 (b >= 0): starting from const, a faster
    growth is taken where it halves the error of the one taken so far, until that error is within
    `noise` x the largest value (0.3%: a constant with a slow per-peer term, like memory, still
    shows the term). With its values at TARGETS."""
    pts = [(n, y) for n, y in zip(ns, ys) if y is not None]
    if len(pts) < 2:
        return None
    n = np.array([p[0] for p in pts], float)
    y = np.array([p[1] for p in pts], float)
    floor = noise * float(np.abs(y).max())
    chosen = None
    for name, f in MODELS.items():
        x = np.array([f(v) for v in n])
        if name == "const":
            a, b = float(y.mean()), 0.0
        else:
            b, a = (float(v) for v in np.polyfit(x, y, 1))
            if b < 0:  # a falling fit is noise around a constant
                continue
        rms = float(np.sqrt(np.mean((y - (a + b * x)) ** 2)))
        if chosen is None or (chosen[3] > floor and rms < 0.5 * chosen[3]):
            chosen = (name, a, b, rms)
    name, a, b, rms = chosen
    return {"model": name, "a": a, "b": b, "rms": rms, **{str(t): a + b * MODELS[name](t) for t in TARGETS}}


def _mem_total_mib() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _num(v, unit: str = "") -> str:
    if v is None:
        return "-"
    if unit == "s":
        return f"{v:.3g}"
    if abs(v) >= 1e6:
        return f"{v:.3g}"
    return f"{v:,.0f}" if abs(v) >= 100 or float(v).is_integer() else f"{v:.1f}"


def verdicts(fits: dict, mem_mib: float, shared_mib: float) -> list[str]:
    """The extrapolations beside the limits: ulimit -n, and this node's memory at 8 ranks, each
    with its private memory (fitted) and what it shares (RSS - USS at the largest N measured:
    MPI's same-node segments, libraries; an upper bound, counted once per rank)."""
    out = []
    fds = fits.get("fds")
    if fds:
        for t in TARGETS:
            v = fds[str(t)]
            over = [str(lim) for lim in FD_LIMITS if v > lim]
            out.append(
                f"N={t}: {v:,.0f} descriptors per rank"
                + (f", over ulimit -n {'/'.join(over)}" if over else "")
            )
    uss = fits.get("uss_mib")
    if uss:
        for t in TARGETS:
            node = PER_NODE * (uss[str(t)] + shared_mib)
            out.append(
                f"N={t}: {node / 1024:,.1f} GiB per node of {PER_NODE} ranks (private + shared)"
                f" ({node / mem_mib:.0%} of this node's {mem_mib / 1024:.0f} GiB)"
            )
    return out


def with_default_set(results: dict) -> dict | None:
    """tcp at TARGETS with the default bounded set: tcp's fit up to DEFAULT_SET + 1 ranks (one
    connection per peer, out and in), then tcp-bounded's growth per further rank (its connections
    are given up after each call: what is left grows with the ranks a rank knows, not reads). That
    growth is the least-squares slope (at least 0) of its points, not a chosen model: a few hundred
    bytes per rank are within the noise of 64 ranks and still count over 15,000 more."""
    full, bounded = results.get("tcp"), results.get("tcp-bounded")
    if not full or not bounded:
        return None
    ok = [p for p in bounded["points"] if not p.get("failed")]
    out = {}
    for q in ("fds", "rss_mib", "uss_mib"):
        f = full["fits"].get(q)
        pts = [(p["n"], p["summary"][q]) for p in ok if p["summary"].get(q) is not None]
        if not f or len(pts) < 2:
            continue
        at_set = f["a"] + f["b"] * MODELS[f["model"]](DEFAULT_SET + 1)
        per_rank = max(0.0, float(np.polyfit([n for n, _ in pts], [y for _, y in pts], 1)[0]))
        out[q] = {
            "per_rank_past_set": per_rank,
            **{
                str(t): f[str(t)] if t <= DEFAULT_SET + 1 else at_set + per_rank * (t - DEFAULT_SET - 1)
                for t in TARGETS
            },
        }
    return out


def print_with_default_set(fits: dict) -> None:
    print(f"\n# tcp with the default bounded set of {DEFAULT_SET} live connections (emulated: tcp-bounded)")
    for q, f in fits.items():
        unit = QUANTITIES[q][1]
        past = f["per_rank_past_set"] * (1024 if unit == "MiB" else 1)
        print(
            f"  {QUANTITIES[q][0]:<26} N=1,024: {_num(f['1024'], unit):>10} {unit:<3}"
            f" N=16,384: {_num(f['16384'], unit):>10} {unit}"
            f"  ({past:.2f} {'KiB' if unit == 'MiB' else ''} per rank past the set)"
        )


def print_config(config: str, points: list, fits: dict, mem_mib: float, where: str) -> None:
    cols = list(QUANTITIES)
    print(f"\n# {config} ({where}): the largest over each job's ranks")
    print(f"{'N':>5} " + " ".join(f"{c:>13}" for c in cols))
    for p in points:
        if p.get("failed"):
            print(f"{p['n']:>5} failed: {p['failed'].splitlines()[0][:200]}")
            continue
        s = p["summary"]
        print(f"{p['n']:>5} " + " ".join(f"{_num(s[c], QUANTITIES[c][1]):>13}" for c in cols))
    print(f"# fit against N, extrapolated ({PER_NODE} ranks per node)")
    for q, f in fits.items():
        if f:
            unit = QUANTITIES[q][1]
            print(
                f"  {QUANTITIES[q][0]:<26} {f['model']:<8} N=1,024: {_num(f['1024'], unit):>10} {unit:<3}"
                f" N=16,384: {_num(f['16384'], unit):>10} {unit}"
            )
    last = [p["summary"] for p in points if p.get("summary")][-1:]
    shared = last[0]["rss_mib"] - last[0]["uss_mib"] if last else 0.0
    for line in verdicts(fits, mem_mib, shared):
        print(f"  {line}")


TABLE_QUANTITIES = ("fds", "rss_mib", "add_msgs", "add_bytes")


def table(results: dict, largest: int) -> tuple[list, list]:
    """The figures page's table: per config, at the largest N measured and fitted to 16,384."""
    columns = ["config", "N", "descriptors", "RSS MiB", "add: messages", "add: bytes", "fds at 16,384 (fit)"]
    rows = []
    for config, r in results.items():
        ok = [p for p in r["points"] if not p.get("failed") and p["n"] <= largest]
        if not ok:
            continue
        s = ok[-1]["summary"]
        f = r["fits"].get("fds")
        rows.append(
            [config, ok[-1]["n"]]
            + [
                "-" if s[q] is None else round(s[q], 1) if isinstance(s[q], float) else s[q]
                for q in TABLE_QUANTITIES
            ]
            + [f"{round(f['16384']):,} ({f['model']})" if f else None]
        )
    return columns, rows


FILE_TARGETS = (1024, 16384, 65536)


def method2_files(n_core: int) -> dict:
    """Bytes of the files a method-2 core job of `n_core` ranks publishes, through the publisher's
    own encoding (_handshake.peers_body, record_body) of synthetic shares as tcp registers them (a
    sockaddr_in address, a random 64-bit key, 786,432 bytes per rank): the address file, once per
    store, and a variable's record without same-node locators (DDSTORE_SHM=0) and with them (the
    default: a host id and the share's file per rank, PER_NODE ranks per host)."""
    from .. import _handshake, _native

    rng = np.random.default_rng(n_core)
    addrs = [
        struct.pack(">HH4s8x", 0x0200, 7000 + r % 8, bytes([10, r >> 16 & 255, r >> 8 & 255, r & 255]))
        for r in range(n_core)
    ]
    # The packed layout (PACKED_SHARE_BYTES): base, key, length, registered length, gather flag.
    packed = b"".join(
        struct.pack("<QQQQB", 0x7F00_0000_0000 + r * 2**30, int(rng.integers(2**63)), 786432, 786432, 1)
        for r in range(n_core)
    )
    records = _native.join_share_records("tcp;ofi_rxm", addrs, packed)
    provider, addrs, shares = _native.split_share_records(records)
    token, store = "0" * 32, {"n_core": n_core, "group": 0, "transport": "ofi:" + provider}
    peers = _handshake.peers_body(token, "0" * 16, provider, addrs, **store)
    ref = {"id": peers["id"], "mac": peers["mac"]}
    variable = {"name": "x", "dtype": "float32", "row_bytes": 3072, "itemsize": 4, "counts": [256] * n_core}
    variable.update(unit_shape=None, **store)
    # A locator as ddstore_core::region::NodeLocator serialises (host id: hostname/boot id).
    node = [
        json.dumps(
            {
                "host": f"frontier{r // PER_NODE:05d}/{r // PER_NODE:08x}-1c2d-4e5f-8a9b-0c1d2e3f4a5b",
                "pid": 100000 + r,
            }
            | {"fd": 40, "len": 786432, "ctl": 786432, "id": int(rng.integers(2**63))},
            separators=(",", ":"),
        )
        for r in range(n_core)
    ]
    return {
        "n_core": n_core,
        "address_file": len(json.dumps(peers)),
        "record": len(json.dumps(_handshake.record_body(token, ref, shares, [None] * n_core, **variable))),
        "record_shm": len(json.dumps(_handshake.record_body(token, ref, shares, node, **variable))),
    }


def print_method2_files() -> list:
    rows = [method2_files(n) for n in FILE_TARGETS]
    print("# method 2's files: the address file once per store, a record per variable")
    for r in rows:
        n = r["n_core"]
        print(
            f"  {n:>6,} core ranks: address file {r['address_file']:>10,} B; record {r['record']:>10,} B "
            f"({r['record'] / n:.1f} B per core rank), with same-node locators {r['record_shm']:>10,} B "
            f"({r['record_shm'] / n:.1f} B per core rank)"
        )
    return rows


# Descriptors a lone store holds while its threads are timed (--idle-threads).
IDLE_FDS = (64, 512, 2100)
IDLE_CODE = """
import glob, json, os, resource, sys, time
import numpy as np
from pyddstore import PyDDStore
want, seconds = int(sys.argv[1]), float(sys.argv[2])
resource.setrlimit(resource.RLIMIT_NOFILE, (max(want + 64, 1024),) * 2)
store = PyDDStore(None, method=1)
store.add("x", np.zeros((16, 8), np.float32))
held = [os.open(os.devnull, os.O_RDONLY) for _ in range(max(0, want - len(os.listdir("/proc/self/fd"))))]
def cpu():
    out = {}
    for task in glob.glob("/proc/self/task/*/stat"):
        head, _, rest = open(task).read().rpartition(")")
        name, f = head.partition("(")[2], rest.split()
        if name.startswith("ddstore"):
            out[name] = out.get(name, 0) + (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    return out
time.sleep(1)
before = cpu()
time.sleep(seconds)
after = cpu()
fds = len(os.listdir("/proc/self/fd")) - 1
print(json.dumps({"fds": fds, "cpu_pct": {k: 100 * (after[k] - before.get(k, 0)) / seconds for k in after}}))
store.free()
"""


def idle_threads(seconds: float = 5.0) -> list:
    """Per descriptor count in IDLE_FDS: the percent of a core each of a lone method-1 tcp store's
    threads (ddstore-*) used over `seconds` with nothing read, in a process of its own."""
    env = _env({"DDSTORE_SHM": "0", "DDSTORE_FABRIC": "tcp"})
    rows = []
    for want in IDLE_FDS:
        got = subprocess.run(
            [sys.executable, "-c", IDLE_CODE, str(want), str(seconds)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120 + seconds,
        )
        if got.returncode != 0:
            raise SystemExit(f"--idle-threads at {want} descriptors failed:\n{got.stderr[-2000:]}")
        rows.append(json.loads(got.stdout.strip().splitlines()[-1]))
    print("# a lone tcp store's threads while nobody reads (percent of a core)")
    for r in rows:
        each = ", ".join(f"{k} {v:.1f}%" for k, v in sorted(r["cpu_pct"].items()))
        print(f"  {r['fds']:>6,} descriptors: {sum(r['cpu_pct'].values()):.1f}% ({each})")
    return rows


def measure(configs: list[str], ranks: list[int], args, shims: dict, cluster=None, nodes: int = 1) -> dict:
    where = f"{nodes} virtual nodes" if cluster is not None else "one node"
    mem = _mem_total_mib()
    results = {}
    for config in configs:
        points: dict = {}
        for n in ranks:
            if cluster is not None and (n % nodes or n < nodes):
                continue
            t0 = time.monotonic()
            reports, failed = run_job(config, n, args, shims, cluster, nodes)
            secs = time.monotonic() - t0
            print(
                f"# {config} N={n} ({where}): {'failed' if failed else 'ok'} in {secs:.0f} s",
                file=sys.stderr,
                flush=True,
            )
            # Method 2's core and extra ranks each get a line: their costs grow differently.
            roles = sorted({r["role"] for r in reports}) or ["rank"]
            for role in roles:
                key = config if role == "rank" else f"{config} {role}"
                mine = [r for r in reports if r["role"] == role]
                point = {"n": n, "ranks": mine}
                if failed:
                    point["failed"] = failed
                else:
                    point["summary"] = summarize(mine)
                points.setdefault(key, []).append(point)
            if failed:
                break  # a larger job of this config would fail the same way
        for key, pts in points.items():
            ok = [p for p in pts if not p.get("failed")]
            fits = {
                q: fit([p["n"] for p in ok], [p["summary"][q] for p in ok], NOISE.get(unit, 0.003))
                for q, (_, unit) in QUANTITIES.items()
            }
            results[key] = {"points": pts, "fits": fits}
            print_config(key, pts, fits, mem, where)
    return results


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m pyddstore.benchmarks.scale", description=description(__doc__)
    )
    ap.add_argument("--max-ranks", type=int, default=64, help="N = 2, 4, 8, ... up to this")
    ap.add_argument("--ranks", help="these N instead (comma-separated)")
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"of {', '.join(CONFIGS)}")
    ap.add_argument("--rows", type=int, default=256, help="rows per rank")
    ap.add_argument("--row-bytes", type=int, default=3072)
    ap.add_argument("--batch", type=int, default=128, help="rows of the first batch (at least one per peer)")
    ap.add_argument("--timeout-s", type=float, default=300, help="per job, plus 10 s per rank")
    ap.add_argument(
        "--vcluster", type=int, default=0, help="also run tcp across this many virtual nodes (root)"
    )
    ap.add_argument("--json", help="write the figures to this file")
    ap.add_argument("--method2-files", action="store_true", help="print only method 2's file sizes")
    ap.add_argument("--idle-threads", action="store_true", help="print only a lone store's background CPU")
    ap.add_argument("--idle-seconds", type=float, default=5.0, help="time per --idle-threads line")
    args = ap.parse_args(argv)
    if args.method2_files:
        print_method2_files()
        return
    if args.idle_threads:
        idle_threads(args.idle_seconds)
        return
    if os.environ.get("OMPI_COMM_WORLD_SIZE"):
        raise SystemExit("the scale bench starts its own jobs: run it as a plain process, not under mpirun")
    configs = args.configs.split(",")
    unknown = set(configs) - set(CONFIGS)
    if unknown:
        raise SystemExit(f"--configs: unknown {sorted(unknown)}; expected some of {', '.join(CONFIGS)}")
    if args.ranks:
        ranks = [int(x) for x in args.ranks.split(",")]
    else:
        ranks = [2**k for k in range(1, 31) if 2**k <= args.max_ranks]
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="ddscale-shims-") as tmp:
        shims = build_shims(tmp)
        results = measure(configs, ranks, args, shims)
        bounded = with_default_set(results)
        if bounded:
            print_with_default_set(bounded)
        vcluster = None
        if args.vcluster:
            vcluster = run_vcluster(ranks, args, shims)
    doc = {
        "question": "How does it scale with ranks?",
        "bench": "scale",
        "command": "python -m pyddstore.benchmarks.scale "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "conditions": (
            f"{os.cpu_count()} cores, {_mem_total_mib() / 1024:.0f} GiB, every rank on one node, "
            "oversubscribed, DDSTORE_SHM=0 (every peer through the provider), "
            f"{args.rows} rows of {args.row_bytes} B per rank, "
            f"first batch {args.batch} rows with one of every peer; load average "
            f"{load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after"
        ),
        "counted": {k: v is not None for k, v in shims.items()},
        "per_node": PER_NODE,
        "fd_limits": list(FD_LIMITS),
        "node_mem_mib": _mem_total_mib(),
        "configs": results,
        "with_default_set": bounded,
        "vcluster": vcluster,
        "method2_files": print_method2_files(),
    }
    doc["columns"], doc["rows"] = table(results, max(ranks))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)


def run_vcluster(ranks: list[int], args, shims: dict) -> dict:
    """The tcp job across --vcluster virtual nodes; {"skipped": why} where none can be made."""
    from .cluster import load_harness

    try:
        harness = load_harness()
    except SystemExit as e:
        print(f"# virtual cluster skipped: {e}")
        return {"skipped": str(e)}
    reason = harness.why_unavailable()
    if reason:
        print(f"# virtual cluster skipped: {reason}")
        return {"skipped": reason}
    with harness.VCluster(args.vcluster) as cluster:
        return {
            "nodes": args.vcluster,
            "configs": measure(["tcp"], ranks, args, shims, cluster, args.vcluster),
        }


if __name__ == "__main__":
    main()
