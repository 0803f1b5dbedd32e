"""Benchmark suite: µs per row and GB/s of reads through every available
method, beside the ceilings measured in the same run (numpy fancy indexing
of a local array for memory, the raw transport line for the fabric).

    mpirun -n 4 python -m pyddstore bench [--json FILE] [--plot FILE.png]
    python -m pyddstore bench --vcluster [--json FILE]     (across namespace nodes; root)

By default every rank reads rows of the other ranks at once (as a training
job's loaders do, each rank's owner thread serving while its own loader
reads) and the figures are the mean over the ranks; `--readers rank0` has
rank 0 read while the others wait without spinning. Every configuration is
checked against the owners' data first.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading
import time

import numpy as np

from .. import _native
from .._store import PyDDStore
from ._common import bench_settings, description, mpi_world, quiet_wait
from .cluster import run as run_vcluster

CONFIGS = {
    # label: (method, settings of its stores: pyddstore.Settings names, DDSTORE_* without the prefix)
    "mpi-shm": (0, {"shm": True}),
    "mpi-rma": (0, {"shm": False}),
    # tcp and sockets, each through the owner-side gather path (auto's choice on tcp) and
    # through one-sided reads (DDSTORE_REMOTE_GATHER=0; rxm emulates them in software on tcp).
    "ofi-tcp": (1, {"shm": False, "fabric": "tcp", "remote_gather": "auto"}),
    "ofi-tcp-1s": (1, {"shm": False, "fabric": "tcp", "remote_gather": "0"}),
    "ofi-sock": (1, {"shm": False, "fabric": "sockets", "remote_gather": "1"}),
    "ofi-sock-1s": (1, {"shm": False, "fabric": "sockets", "remote_gather": "0"}),
    "ofi-shm": (1, {"shm": False, "fabric": "shm"}),
    "node-shm": (1, {"shm": True, "fabric": "tcp"}),
}


# Configs measured beside a plain socket line: the same batches through Python sockets
# (the reader sends each owner the row numbers, the owner answers with np.take + sendall),
# the limit of this link for a request/reply protocol.
SOCKET_LINE = ("ofi-tcp",)


def _recv_exact(conn: socket.socket, buf) -> bool:
    view = memoryview(buf).cast("B")
    got = 0
    while got < len(view):
        n = conn.recv_into(view[got:])
        if n == 0:
            return False
        got += n
    return True


def _line_address() -> str:
    """The IPv4 address of the interface libfabric's tcp provider uses here (FI_TCP_IFACE,
    e.g. eth0 on a virtual-cluster node), so the socket line crosses the same link; else loopback."""
    iface = os.environ.get("FI_TCP_IFACE", "lo")
    if iface == "lo":
        return "127.0.0.1"
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", iface[:15].encode()))  # SIOCGIFADDR
        except OSError:
            return "127.0.0.1"
    return socket.inet_ntoa(packed[20:24])


class SocketServer:
    """Owner side of the socket line: answers (count, rows) requests with the rows packed."""

    def __init__(self, local: np.ndarray):
        self.local = local
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind((_line_address(), 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[:2]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            head = np.empty(1, np.int64)
            while _recv_exact(conn, head):
                rows = np.empty(int(head[0]), np.int64)
                if not _recv_exact(conn, rows):
                    return
                conn.sendall(np.take(self.local, rows, axis=0))

    def close(self) -> None:
        self.sock.close()


class SocketReader:
    """Reader side of the socket line: one connection per (thread, owner); requests to
    every owner of a batch go out before the first reply is read."""

    def __init__(self, ports: list, per_rank: int, row_bytes: int, threads: int, batch: int):
        self.per_rank = per_rank
        self.conns = []
        for _ in range(threads):
            conns = {}
            for owner, port in enumerate(ports):
                if port is not None:
                    c = socket.create_connection(tuple(port), timeout=30)
                    c.settimeout(None)
                    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    conns[owner] = c
            self.conns.append(conns)
        self.bufs = [np.empty((batch, row_bytes), np.uint8) for _ in range(threads)]

    def get_batch(self, rows: np.ndarray, out: np.ndarray, t: int) -> None:
        owners = rows // self.per_rank
        pending = []
        for owner in np.unique(owners):
            pos = np.nonzero(owners == owner)[0]
            local = (rows[pos] - owner * self.per_rank).astype(np.int64)
            conn = self.conns[t][int(owner)]
            conn.sendall(np.int64(len(local)).tobytes() + local.tobytes())
            pending.append((conn, pos))
        for conn, pos in pending:
            buf = self.bufs[t][: len(pos)]
            if not _recv_exact(conn, buf):
                raise SystemExit("socket line: an owner closed its connection")
            out[pos] = buf

    def close(self) -> None:
        for conns in self.conns:
            for c in conns.values():
                c.close()


def pattern(rows: np.ndarray, row_bytes: int) -> np.ndarray:
    return ((rows[:, None] * 131 + np.arange(row_bytes)[None, :]) % 251).astype(np.uint8)


def timed(fn, batches: np.ndarray, seconds: float, threads: int) -> tuple[float, int]:
    """Runs fn(rows, out_slot) over batches from `threads` threads; returns (seconds, rows read)."""
    done = [0] * threads
    stop_at = time.perf_counter() + seconds

    def body(t):
        i = t
        while True:
            fn(batches[i % len(batches)], t)
            done[t] += 1
            i += threads
            if done[t] >= 3 and time.perf_counter() >= stop_at:
                break

    start = time.perf_counter()
    if threads == 1:
        body(0)
    else:
        ts = [threading.Thread(target=body, args=(t,)) for t in range(threads)]
        for th in ts:
            th.start()
        for th in ts:
            th.join()
    return time.perf_counter() - start, sum(done) * batches.shape[1]


def open_store(comm, label: str):
    """A store for configuration `label` (its settings on top of the environment's), or None
    when this machine cannot make it (rank 0 says why)."""
    method, settings = CONFIGS[label]
    try:
        return PyDDStore(comm, method=method, settings=bench_settings(**settings))
    except Exception as e:  # noqa: BLE001 - a missing provider skips its lines
        if comm.rank == 0:
            print(f"# {label}: skipped ({e})", file=sys.stderr)
        return None


def measure(args, comm) -> list[dict]:
    rank, size = comm.rank, comm.size
    rng = np.random.default_rng(7)
    results = []
    for label in args.configs:
        store = open_store(comm, label)
        if store is None:
            continue
        for row_bytes in args.row_sizes:
            per_rank = int(max(4, min(4096, args.share_bytes // row_bytes)))
            name = f"b{row_bytes}"
            first = rank * per_rank
            mine = pattern(np.arange(first, first + per_rank), row_bytes)
            store.add(name, mine)
            all_read = args.readers == "all"
            serves = label in SOCKET_LINE and (rank > 0 or all_read)
            server = SocketServer(mine) if serves else None
            ports = comm.allgather(server.port if server else None)
            if (rank == 0 or all_read) and size > 1:
                others = np.arange(per_rank * size)
                remote = others[others // per_rank != rank]  # rows of the other ranks
                for batch in args.batch_sizes:
                    batches = rng.choice(remote, (64, batch))
                    outs = [np.empty((batch, row_bytes), np.uint8) for _ in range(max(args.threads))]
                    store.get_batch(name, outs[0], batches[0])
                    if not np.array_equal(outs[0], pattern(batches[0], row_bytes)):
                        raise SystemExit(f"{label}: wrong data read for rows {batches[0][:8]}")
                    if batch == 1:  # a single row is what get() is for
                        lines = [("store", lambda r, t: store.get(name, outs[t], int(r[0])))]
                    else:
                        lines = [("store", lambda r, t: store.get_batch(name, outs[t], r))]
                    if label != "node-shm" and label != "mpi-shm":
                        lines.append(("raw", lambda r, t: store._native.get_batch_raw(name, outs[t], r)))
                    sockets = None
                    if (server is None or all_read) and any(p is not None for p in ports):
                        sockets = SocketReader(ports, per_rank, row_bytes, max(args.threads), batch)
                        sockets.get_batch(batches[1], outs[0], 0)
                        if not np.array_equal(outs[0], pattern(batches[1], row_bytes)):
                            raise SystemExit(
                                f"{label}: socket line read wrong data for rows {batches[1][:8]}"
                            )
                        lines.append(("socket", lambda r, t: sockets.get_batch(r, outs[t], t)))
                    for threads in args.threads:
                        # Alternate the lines and keep each one's best round: interference from
                        # the rest of the machine only ever slows a round down.
                        best = {}
                        for _ in range(args.rounds):
                            for kind, fn in lines:
                                secs, nrows = timed(fn, batches, args.seconds / args.rounds, threads)
                                if kind not in best or secs / nrows < best[kind][0] / best[kind][1]:
                                    best[kind] = (secs, nrows)
                        for kind, _ in lines:
                            results.append(_row(label, kind, row_bytes, batch, threads, *best[kind]))
                    if sockets is not None:
                        sockets.close()
            if all_read:
                comm.barrier()  # every reader done before an owner closes its socket line
            if rank == 0:
                print(f"# {label}: {row_bytes} B rows done", file=sys.stderr, flush=True)
            quiet_wait(comm)
            if server is not None:
                server.close()
        store.free()
    if args.readers == "all":
        results = mean_over_ranks(comm.allgather(results))
    if rank == 0:
        results.extend(numpy_ceiling(args, size))
    quiet_wait(comm)  # the others wait without spinning while rank 0 measures numpy
    return results


def mean_over_ranks(per_rank: list) -> list[dict]:
    """Each line's mean time per row over the ranks that measured it (all reading at once)."""
    merged: dict = {}
    for results in per_rank:
        for r in results:
            key = (r["config"], r["kind"], r["row_bytes"], r["batch"], r["threads"])
            merged.setdefault(key, []).append(r)
    out = []
    for rows in merged.values():
        us = sum(r["us_per_row"] for r in rows) / len(rows)
        out.append(dict(rows[0], us_per_row=us, gb_per_s=rows[0]["row_bytes"] / us / 1e3, ranks=len(rows)))
    return out


def numpy_ceiling(args, size: int) -> list[dict]:
    rng = np.random.default_rng(8)
    out = []
    for row_bytes in args.row_sizes:
        per_rank = int(max(4, min(4096, args.share_bytes // row_bytes)))
        local = pattern(np.arange(per_rank * size), row_bytes)
        for batch in args.batch_sizes:
            batches = rng.integers(0, len(local), (64, batch))
            bufs = [np.empty((batch, row_bytes), np.uint8) for _ in range(max(args.threads))]
            for threads in args.threads:
                secs, nrows = timed(
                    lambda r, t: np.take(local, r, axis=0, out=bufs[t]), batches, args.seconds, threads
                )
                out.append(_row("numpy", "ceiling", row_bytes, batch, threads, secs, nrows))
    return out


def _row(label, kind, row_bytes, batch, threads, secs, nrows) -> dict:
    return {
        "config": label,
        "kind": kind,
        "row_bytes": row_bytes,
        "batch": batch,
        "threads": threads,
        "us_per_row": secs / nrows * 1e6,
        "gb_per_s": nrows * row_bytes / secs / 1e9,
    }


def add_ratios(results: list[dict]) -> None:
    """ratio_numpy: time per row / numpy's; ratio_raw: store bandwidth / raw transport bandwidth;
    ratio_socket: store time per row / the socket line's (same config, same run)."""
    key = lambda r: (r["row_bytes"], r["batch"], r["threads"])  # noqa: E731
    numpy = {key(r): r for r in results if r["config"] == "numpy"}
    raw = {(r["config"],) + key(r): r for r in results if r["kind"] == "raw"}
    sock = {key(r): r for r in results if r["kind"] == "socket"}
    for r in results:
        if r["kind"] == "store" and key(r) in sock:
            r["ratio_socket"] = r["us_per_row"] / sock[key(r)]["us_per_row"]
    for r in results:
        if r["config"] == "numpy":
            continue
        if key(r) in numpy:
            r["ratio_numpy"] = r["us_per_row"] / numpy[key(r)]["us_per_row"]
        base = raw.get((r["config"],) + key(r))
        if base and r["kind"] == "store":
            r["ratio_raw"] = r["gb_per_s"] / base["gb_per_s"]


def print_table(results: list[dict], header: str) -> None:
    print(header)
    print(
        f"{'config':<10} {'kind':<8} {'row B':>8} {'batch':>5} {'thr':>3} {'us/row':>9} {'GB/s':>7} "
        f"{'x numpy':>8} {'% raw':>6} {'x sock':>6}"
    )
    for r in results:
        xr = f"{r['ratio_numpy']:.2f}" if "ratio_numpy" in r else "-"
        pr = f"{100 * r['ratio_raw']:.0f}" if "ratio_raw" in r else "-"
        xs = f"{r['ratio_socket']:.2f}" if "ratio_socket" in r else "-"
        print(
            f"{r['config']:<10} {r['kind']:<8} {r['row_bytes']:>8} {r['batch']:>5} {r['threads']:>3} "
            f"{r['us_per_row']:>9.2f} {r['gb_per_s']:>7.2f} {xr:>8} {pr:>6} {xs:>6}"
        )


def plot(results: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, batch in zip(axes, (1, 128)):
        series = {}
        for r in results:
            # The store's lines and the memory ceiling; raw/socket lines are in the JSON and table.
            if r["batch"] == batch and r["threads"] == 1 and r["kind"] in ("store", "ceiling"):
                series.setdefault(r["config"], []).append((r["row_bytes"], r["us_per_row"]))
        colors = plt.get_cmap("tab10")
        for k, (label, pts) in enumerate(sorted(series.items())):
            pts.sort()
            style = "k--" if label == "numpy" else "-"
            kw = {} if label == "numpy" else {"color": colors(k % 10)}
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", label=label, **kw)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("row size (bytes)")
        ax.set_ylabel("µs per row")
        ax.set_title(f"batch of {batch} random rows, 1 thread")
        ax.grid(True, which="both", alpha=0.3)
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None, prog: str = "python -m pyddstore bench") -> None:
    """`python -m pyddstore bench`: measures and prints the table (`prog`: the name --help shows)."""
    ap = argparse.ArgumentParser(prog=prog, description=description(__doc__))
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    ap.add_argument(
        "--configs",
        type=lambda s: s.split(","),
        default=list(CONFIGS),
        help=f"comma-separated, from {', '.join(CONFIGS)}",
    )
    ap.add_argument("--row-sizes", type=ints, default=[256, 3072, 65536, 1 << 20])
    ap.add_argument("--batch-sizes", type=ints, default=[1, 32, 128])
    ap.add_argument("--threads", type=ints, default=[1, 2, 4])
    ap.add_argument("--seconds", type=float, default=0.3, help="time per measurement")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds per line; the best is kept")
    ap.add_argument("--share-bytes", type=float, default=64e6, help="bytes per rank per variable")
    ap.add_argument(
        "--readers",
        choices=["all", "rank0"],
        default="all",
        help="all: every rank reads the others' rows at once (mean over ranks); rank0: rank 0 reads",
    )
    ap.add_argument("--json", help="write the figures to this file")
    ap.add_argument("--plot", help="write a PNG plot (matplotlib) to this file")
    ap.add_argument("--from-json", help="plot (--plot) an earlier --json run's figures, measuring nothing")
    ap.add_argument(
        "--vcluster",
        action="store_true",
        help="run over a virtual cluster of two namespace nodes beside one node (root, not under mpirun)",
    )
    args = ap.parse_args(argv)
    if args.from_json:
        if not args.plot:
            ap.error("--from-json needs --plot")
        with open(args.from_json) as f:
            plot(json.load(f)["results"], args.plot)
        return
    if args.plot:  # before measuring, not after the whole run
        import importlib.util

        if importlib.util.find_spec("matplotlib") is None:
            ap.error("--plot needs matplotlib: pip install matplotlib")
    if args.vcluster:
        run_vcluster(args)
        return
    unknown = [c for c in args.configs if c not in CONFIGS]
    if unknown:
        ap.error(f"unknown configs {unknown}: choose from {', '.join(CONFIGS)}")
    comm = mpi_world()
    results = measure(args, comm)
    if comm.rank == 0:
        add_ratios(results)
        print_table(
            results,
            f"# pyddstore {_native.__version__} bench: {comm.size} ranks, "
            + ("every rank reads (mean over ranks)" if args.readers == "all" else "rank 0 reads")
            + " rows of the other ranks; numpy = fancy indexing of a local array",
        )
        if args.json:
            os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
            with open(args.json, "w") as f:
                json.dump({"ranks": comm.size, "readers": args.readers, "results": results}, f, indent=1)
        if args.plot:
            plot(results, args.plot)


if __name__ == "__main__":
    main()
