"""The gather path against one-sided reads, alternated round by round in one run.

    mpirun -n 2 --bind-to none python -m pyddstore.benchmarks.paths [--busy 8] [--json FILE]

Two stores hold the same rows at once over tcp;ofi_rxm (``DDSTORE_SHM=0``): one with
``DDSTORE_REMOTE_GATHER=auto`` (the default: gathered, with the per-request choice), one with
``DDSTORE_REMOTE_GATHER=0`` (one-sided reads only). Each round times the first, then the second,
on the same random batches of the other ranks' rows; every rank reads at once (``--readers all``,
as a training job's loaders do) or rank 0 alone. The figure per line is the median over the
rounds of auto's time / one-sided's time, so that this machine's drift between rounds cancels;
``--busy N`` runs N busy-looping processes beside the bench (a loaded node). Every line's rows
are checked against the owners' data first.

Each round also times the line a user could write in an afternoon: a plain Python program that
gathers the same batches over TCP sockets (one request per owner and batch listing its rows, the
owner, a process of its own per rank, packs the rows into one reply). The gather path's ratio to
it (auto / socket) is printed and written with every line, with the CPU time per batch of each
(``auto_cpu_us_per_batch``: a rank's process, that is its reader and its owner thread serving the
others; ``socket_cpu_us_per_batch``: the socket reader and its owner process), which a loaded machine
moves less than the times.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import struct
import subprocess
import sys

import numpy as np

from .._store import PyDDStore
from ._common import bench_settings, description, mpi_world, quiet_wait
from .stores import pattern, timed

PATHS = {
    "auto": {"shm": False, "fabric": "tcp", "remote_gather": "auto"},
    "one-sided": {"shm": False, "fabric": "tcp", "remote_gather": "0"},
}


def _recv_into(sock: socket.socket, buf: memoryview) -> None:
    while buf:
        got = sock.recv_into(buf)
        if not got:
            raise ConnectionError("the socket baseline's peer closed the connection")
        buf = buf[got:]


def serve_rows(first: int, count: int, row_bytes: int) -> None:
    """The socket baseline's owner (run as a process of its own): holds rows first..first+count
    and answers each request (u32 n, then n int64 rows) with the rows packed into one reply."""
    import threading

    rows = pattern(np.arange(first, first + count), row_bytes)
    server = socket.create_server(("127.0.0.1", 0))
    print(server.getsockname()[1], flush=True)

    def serve(conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        head = bytearray(4)
        with conn:
            while True:
                try:
                    _recv_into(conn, memoryview(head))
                except ConnectionError:
                    return
                idx = np.empty(struct.unpack("<I", head)[0], np.int64)
                _recv_into(conn, memoryview(idx).cast("B"))
                conn.sendall(rows[idx - first])

    while True:
        conn, _ = server.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


class SocketGather:
    """The socket baseline's reader: one connection per other rank's owner process."""

    def __init__(self, comm, per_rank: int, row_bytes: int):
        first = comm.rank * per_rank
        code = "from pyddstore.benchmarks.paths import serve_rows; serve_rows(%d, %d, %d)"
        code %= (first, per_rank, row_bytes)
        self.server = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        port = int(self.server.stdout.readline())
        ports = comm.allgather(port)
        if len(set(comm.allgather(socket.gethostname()))) != 1:
            raise SystemExit("the socket baseline serves on 127.0.0.1: run the paths bench on one node")
        self.per_rank = per_rank
        self.conns = {}
        for r, p in enumerate(ports):
            if r != comm.rank:
                self.conns[r] = socket.create_connection(("127.0.0.1", p))
                self.conns[r].setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def gather(self, out: np.ndarray, rows: np.ndarray) -> None:
        owners = rows // self.per_rank
        wanted = [(o, owners == o) for o in np.unique(owners)]
        for o, mask in wanted:  # every request first, then every reply
            mine = np.ascontiguousarray(rows[mask], np.int64)
            self.conns[int(o)].sendall(struct.pack("<I", len(mine)) + mine.tobytes())
        for o, mask in wanted:
            if len(wanted) == 1:
                _recv_into(self.conns[int(o)], memoryview(out).cast("B"))
            else:
                part = np.empty((int(mask.sum()),) + out.shape[1:], out.dtype)
                _recv_into(self.conns[int(o)], memoryview(part).cast("B"))
                out[mask] = part

    def owner_cpu_s(self) -> float:
        """CPU seconds this rank's owner process has used (user + system)."""
        fields = open(f"/proc/{self.server.pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        for c in self.conns.values():
            c.close()
        self.server.kill()
        self.server.wait()


def process_cpu_s() -> float:
    """CPU seconds this process (all its threads) has used."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def measure(args, comm) -> list[dict]:
    rank, size = comm.rank, comm.size
    rng = np.random.default_rng(11)
    stores = {k: PyDDStore(comm, method=1, settings=bench_settings(**v)) for k, v in PATHS.items()}
    reads = args.readers == "all" or rank == 0
    results = []
    for row_bytes in args.row_sizes:
        per_rank = int(max(4, min(4096, args.share_bytes // row_bytes)))
        name = f"p{row_bytes}"
        mine = pattern(np.arange(rank * per_rank, (rank + 1) * per_rank), row_bytes)
        for store in stores.values():
            store.add(name, mine)
        sockets = SocketGather(comm, per_rank, row_bytes)
        others = np.arange(per_rank * size)
        remote = others[others // per_rank != rank]
        for batch in args.batch_sizes:
            batches = rng.choice(remote, (64, batch))
            out = np.empty((batch, row_bytes), np.uint8)
            fns = {}
            for path, store in stores.items():
                if reads:
                    store.get_batch(name, out, batches[0])
                    if not np.array_equal(out, pattern(batches[0], row_bytes)):
                        raise SystemExit(f"{path}: wrong data for rows {batches[0][:8]}")
                if batch == 1:
                    fns[path] = lambda r, t, s=store: s.get(name, out, int(r[0]))
                else:
                    fns[path] = lambda r, t, s=store: s.get_batch(name, out, r)
            if reads:
                sockets.gather(out, batches[0])
                if not np.array_equal(out, pattern(batches[0], row_bytes)):
                    raise SystemExit(f"socket: wrong data for rows {batches[0][:8]}")
            fns["socket"] = lambda r, t: sockets.gather(out, r)
            per_round = {p: [] for p in fns}
            # CPU seconds and batches per path over all rounds: this rank's process (its
            # reader and its owner thread), plus its owner process for the socket line.
            cpu = {p: [0.0, 0] for p in fns}
            for _ in range(args.rounds):
                for path, fn in fns.items():
                    quiet_wait(comm)
                    if reads:
                        cpu0 = process_cpu_s() + (sockets.owner_cpu_s() if path == "socket" else 0)
                        secs, rows = timed(fn, batches, args.seconds, 1)
                        cpu1 = process_cpu_s() + (sockets.owner_cpu_s() if path == "socket" else 0)
                        per_round[path].append(secs / rows * 1e6)
                        cpu[path][0] += cpu1 - cpu0
                        cpu[path][1] += rows // batch
            if reads:
                ratios = [a / b for a, b in zip(per_round["auto"], per_round["one-sided"])]
                vs_socket = [a / b for a, b in zip(per_round["auto"], per_round["socket"])]
                results.append(
                    {
                        "rank": rank,
                        "row_bytes": row_bytes,
                        "batch": batch,
                        "auto_us_per_row": statistics.median(per_round["auto"]),
                        "one_sided_us_per_row": statistics.median(per_round["one-sided"]),
                        "socket_us_per_row": statistics.median(per_round["socket"]),
                        "ratios": ratios,
                        "vs_socket": vs_socket,
                        "auto_cpu_us_per_batch": cpu["auto"][0] / cpu["auto"][1] * 1e6,
                        "socket_cpu_us_per_batch": cpu["socket"][0] / cpu["socket"][1] * 1e6,
                    }
                )
        quiet_wait(comm)
        sockets.close()
    for store in stores.values():
        store.free()
    return results


def summarize(per_rank: list) -> list[dict]:
    """Per line: the medians over ranks' medians, and the median of every (rank, round) ratio."""
    lines: dict = {}
    for results in per_rank:
        for r in results:
            lines.setdefault((r["row_bytes"], r["batch"]), []).append(r)
    out = []
    for (row_bytes, batch), rs in sorted(lines.items()):
        ratios = sorted(x for r in rs for x in r["ratios"])
        vs_socket = sorted(x for r in rs for x in r["vs_socket"])
        out.append(
            {
                "row_bytes": row_bytes,
                "batch": batch,
                "auto_us_per_row": statistics.median(r["auto_us_per_row"] for r in rs),
                "one_sided_us_per_row": statistics.median(r["one_sided_us_per_row"] for r in rs),
                "ratio_median": statistics.median(ratios),
                "ratio_q1": ratios[len(ratios) // 4],
                "ratio_q3": ratios[(3 * len(ratios)) // 4],
                "socket_us_per_row": statistics.median(r["socket_us_per_row"] for r in rs),
                "auto_vs_socket": statistics.median(vs_socket),
                "auto_vs_socket_q1": vs_socket[len(vs_socket) // 4],
                "auto_vs_socket_q3": vs_socket[(3 * len(vs_socket)) // 4],
                "auto_cpu_us_per_batch": statistics.median(r["auto_cpu_us_per_batch"] for r in rs),
                "socket_cpu_us_per_batch": statistics.median(r["socket_cpu_us_per_batch"] for r in rs),
            }
        )
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m pyddstore.benchmarks.paths", description=description(__doc__)
    )
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    ap.add_argument("--row-sizes", type=ints, default=[3072, 65536, 262144, 1 << 20, 4 << 20])
    ap.add_argument("--batch-sizes", type=ints, default=[1, 2, 8, 32, 128])
    ap.add_argument("--rounds", type=int, default=9, help="alternating rounds per line")
    ap.add_argument("--seconds", type=float, default=0.15, help="time per path per round")
    ap.add_argument("--share-bytes", type=float, default=64e6, help="bytes per rank per variable")
    ap.add_argument("--readers", choices=["all", "rank0"], default="all")
    ap.add_argument("--busy", type=int, default=0, help="busy-looping processes beside the bench")
    ap.add_argument("--json", help="write the figures to this file")
    args = ap.parse_args(argv)
    comm = mpi_world()
    busy = []
    if comm.rank == 0:
        busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        results = measure(args, comm)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    lines = summarize(comm.allgather(results))
    if comm.rank != 0:
        return
    who = "every rank reads" if args.readers == "all" else "rank 0 reads"
    print(
        f"# {comm.size} ranks, {who}, {args.busy} busy processes, {args.rounds} alternating rounds;"
        " ratio = auto / one-sided time per row (median, quartiles over ranks x rounds);"
        " x socket = auto / a plain-socket gather of the same batches"
    )
    print(
        f"{'row B':>8} {'batch':>5} {'auto us/row':>12} {'1s us/row':>10} {'ratio':>6} {'q1-q3':>11}"
        f" {'socket us/row':>13} {'x socket':>8}"
    )
    for r in lines:
        print(
            f"{r['row_bytes']:>8} {r['batch']:>5} {r['auto_us_per_row']:>12.2f}"
            f" {r['one_sided_us_per_row']:>10.2f} {r['ratio_median']:>6.2f}"
            f" {r['ratio_q1']:>5.2f}-{r['ratio_q3']:<5.2f}"
            f" {r['socket_us_per_row']:>13.2f} {r['auto_vs_socket']:>8.2f}"
        )
    for r in lines:
        if (r["row_bytes"], r["batch"]) == (3072, 128):
            print(
                f"# the tcp gather path (DDSTORE_SHM=0) is {r['auto_vs_socket']:.2f}x a plain-socket gather"
                f" of 128 x 3 KB rows ({r['auto_us_per_row']:.2f} vs {r['socket_us_per_row']:.2f} us per row;"
                f" goal: at most 1.3x)"
            )
            if args.readers == "all":
                print(
                    f"# CPU per batch: {r['auto_cpu_us_per_batch']:.0f} us gathered (a rank's process: its"
                    f" reader and its owner thread), {r['socket_cpu_us_per_batch']:.0f} us socket (reader"
                    f" and owner processes)"
                )
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(
                {"ranks": comm.size, "readers": args.readers, "busy": args.busy, "lines": lines}, f, indent=1
            )


if __name__ == "__main__":
    main()
