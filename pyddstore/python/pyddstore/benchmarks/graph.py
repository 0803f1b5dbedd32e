"""Graph benchmark: batched ragged reads of variable-size graphs against the other ways to hold
them, measured in the same run.

    mpirun -n 4 python -m pyddstore.benchmarks.graph [--configs node-shm,ofi-tcp] [--json FILE]

Each rank holds its share of generated graphs as byte records (node features and edge lists,
1 to 40 nodes, some without edges). Rank 0 reads random batches of graphs owned by the other
ranks while they wait, as:

- ragged: one ragged variable, ``get_batch(name, indices)`` (values + offsets; a fresh values
  array per batch);
- ragged-out: the same into a preallocated buffer, ``get_batch(name, indices=..., out=buf)``
  (as padded reads into preallocated rows);
- padded: the same records padded to the longest one, fixed rows through ``get_batch``;
- records: HydraGNN's way, one 1-byte-row variable and one ``get(name, buf, start)`` per graph
  (the record offsets replicated on every rank);
- list: indexing a local Python list of the graphs (the ceiling: no store at all).

Also a range ``get`` of n 1-byte rows against one n-byte row, and the memory the row offsets
cost (owner-only; see ddstore-core's ragged module). Every line is checked against the data
first; lines alternate for ``--rounds`` rounds and each keeps its best.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from .. import _native
from .._kinds import ragged_parts
from ._common import description, mpi_world, quiet_wait
from .stores import CONFIGS, open_store


def graph_record(i: int, max_nodes: int = 40) -> np.ndarray:
    """Graph i as one byte record: (n, 16) float32 node features + (2, E) int64 edges,
    1 <= n <= max_nodes, n <= E <= 3n (every 17th graph without edges)."""
    rng = np.random.default_rng(i)
    n = int(rng.integers(1, max_nodes + 1))
    e = 0 if i % 17 == 0 else int(rng.integers(n, 3 * n + 1))
    x = rng.standard_normal((n, 16), dtype=np.float32)
    edges = rng.integers(0, n, (2, e), dtype=np.int64)
    return np.concatenate([x.reshape(-1).view(np.uint8), edges.reshape(-1).view(np.uint8)])


def best_of(lines: dict, seconds: float, rounds: int) -> dict:
    """{label: best seconds per call} of fn() calls, lines alternating round by round."""
    best: dict = {}
    for _ in range(rounds):
        for label, fn in lines.items():
            fn()  # warm
            calls, start = 0, time.perf_counter()
            stop_at = start + seconds / rounds
            while True:
                fn()
                calls += 1
                if calls >= 3 and time.perf_counter() >= stop_at:
                    break
            per_call = (time.perf_counter() - start) / calls
            best[label] = min(best.get(label, per_call), per_call)
    return best


def measure(args, comm) -> list[dict]:
    rank, size = comm.rank, comm.size
    per_rank = args.graphs
    first = rank * per_rank
    mine = [graph_record(i, args.max_nodes) for i in range(first, first + per_rank)]
    lengths = np.array([len(r) for r in mine], np.int64)
    every_len = np.concatenate(comm.allgather(lengths))  # HydraGNN keeps every record's offset
    rec_offsets = np.concatenate([[0], np.cumsum(every_len)])
    max_len = int(every_len.max())
    results = []
    for label in args.configs:
        store = open_store(comm, label)
        if store is None:
            continue
        flat = np.concatenate(mine)
        store.add("graphs", flat, lengths=lengths)
        padded = np.zeros((per_rank, max_len), np.uint8)
        for j, r in enumerate(mine):
            padded[j, : len(r)] = r
        store.add("padded", padded)
        store.add("records", flat)
        n_range = args.range_bytes
        store.add("b1", np.arange(n_range * 4, dtype=np.int64).astype(np.uint8))
        store.add("bn", (np.arange(n_range * 4, dtype=np.int64).astype(np.uint8)).reshape(4, n_range))
        if rank == 0 and size > 1:
            results.extend(measure_reads(args, store, label, size, per_rank, rec_offsets, max_len, mine))
            results.extend(measure_range(args, store, label, n_range))
        quiet_wait(comm)
        store.free()
    return results


def measure_reads(args, store, label, size, per_rank, rec_offsets, max_len, mine) -> list[dict]:
    rng = np.random.default_rng(3)
    b = args.batch
    batches = [rng.integers(per_rank, per_rank * size, b) for _ in range(64)]
    want = [graph_record(int(i), args.max_nodes) for i in batches[0]]
    values, offsets = store.get_batch("graphs", batches[0])
    for j, w in enumerate(want):
        if not np.array_equal(values[offsets[j] : offsets[j + 1]], w):
            raise SystemExit(f"{label}: ragged read of graph {batches[0][j]} differs")
    rout = np.empty(b * max_len, np.uint8)
    values, offsets = store.get_batch("graphs", indices=batches[0], out=rout)
    for j, w in enumerate(want):
        if not np.array_equal(values[offsets[j] : offsets[j + 1]], w):
            raise SystemExit(f"{label}: ragged read (out=) of graph {batches[0][j]} differs")
    pad = np.empty((b, max_len), np.uint8)
    store.get_batch("padded", pad, batches[0])
    rec = [np.empty(int(rec_offsets[i + 1] - rec_offsets[i]), np.uint8) for i in batches[0]]
    for buf, i in zip(rec, batches[0]):
        store.get("records", buf, int(rec_offsets[i]))
    for j, w in enumerate(want):
        if not (np.array_equal(pad[j, : len(w)], w) and np.array_equal(rec[j], w)):
            raise SystemExit(f"{label}: padded or record read of graph {batches[0][j]} differs")
    local = [graph_record(i, args.max_nodes) for i in range(per_rank, per_rank * size)]  # the ceiling's list
    state = {"k": 0}

    def nxt():
        state["k"] = (state["k"] + 1) % len(batches)
        return batches[state["k"]]

    def per_sample():
        for i in nxt():
            n = int(rec_offsets[i + 1] - rec_offsets[i])
            store.get("records", recbuf[:n], int(rec_offsets[i]))

    recbuf = np.empty(max_len, np.uint8)
    lines = {
        "ragged": lambda: store.get_batch("graphs", nxt()),
        "ragged-out": lambda: store.get_batch("graphs", indices=nxt(), out=rout),
        "padded": lambda: store.get_batch("padded", pad, nxt()),
        "records": per_sample,
        "list": lambda: [local[i - per_rank] for i in nxt()],
    }
    best = best_of(lines, args.seconds * len(lines), args.rounds)
    moved_ragged = float(np.mean([sum(len(local[i - per_rank]) for i in bt) for bt in batches]))
    moved = {
        "ragged": moved_ragged,
        "ragged-out": moved_ragged,
        "padded": float(b * max_len),
        "records": moved_ragged,
        "list": moved_ragged,
    }
    out = []
    for kind, secs in best.items():
        out.append(
            {
                "config": label,
                "line": kind,
                "batch": b,
                "us_per_graph": secs / b * 1e6,
                "graphs_per_s": b / secs,
                "ns_per_byte": secs / moved[kind] * 1e9,
                "bytes_per_batch": moved[kind],
            }
        )
    r = {o["line"]: o for o in out}
    out.append(
        {
            "config": label,
            "line": "ratios",
            "ragged_vs_padded_per_byte": r["ragged"]["ns_per_byte"] / r["padded"]["ns_per_byte"],
            "ragged_out_vs_padded_per_byte": r["ragged-out"]["ns_per_byte"] / r["padded"]["ns_per_byte"],
            "records_vs_ragged_per_graph": r["records"]["us_per_graph"] / r["ragged"]["us_per_graph"],
            "ragged_vs_list_per_graph": r["ragged"]["us_per_graph"] / r["list"]["us_per_graph"],
            "offset_bytes_per_row": store._native.row_bytes(ragged_parts("graphs")[1]),
        }
    )
    return out


def measure_range(args, store, label, n) -> list[dict]:
    """A range get of n 1-byte rows (rank 1's share) against one n-byte row of the same bytes."""
    a = np.empty(n, np.uint8)
    one = np.empty((1, n), np.uint8)
    store.get("b1", a, 4 * n)  # each rank holds 4n 1-byte rows, or 4 n-byte rows
    store.get("bn", one, 4)
    if not np.array_equal(a, one[0]):
        raise SystemExit(f"{label}: range get differs from the row")
    best = best_of(
        {"range": lambda: store.get("b1", a, 4 * n), "row": lambda: store.get("bn", one, 4)},
        args.seconds * 2,
        args.rounds,
    )
    return [
        {
            "config": label,
            "line": "range-get",
            "bytes": n,
            "us_range_of_1B_rows": best["range"] * 1e6,
            "us_one_row": best["row"] * 1e6,
            "ratio": best["range"] / best["row"],
        }
    ]


def print_table(results: list[dict], header: str) -> None:
    print(header)
    for r in results:
        if r["line"] == "ratios":
            print(
                f"{r['config']:10s} ragged/padded per byte {r['ragged_vs_padded_per_byte']:.2f}x "
                f"(out= {r['ragged_out_vs_padded_per_byte']:.2f}x), "
                f"records/ragged per graph {r['records_vs_ragged_per_graph']:.1f}x, "
                f"ragged/list per graph {r['ragged_vs_list_per_graph']:.1f}x, "
                f"offsets {r['offset_bytes_per_row']} B per own row"
            )
        elif r["line"] == "range-get":
            print(
                f"{r['config']:10s} get of {r['bytes']} 1-byte rows {r['us_range_of_1B_rows']:.2f} us vs one "
                f"{r['bytes']}-byte row {r['us_one_row']:.2f} us: {r['ratio']:.2f}x"
            )
        else:
            print(
                f"{r['config']:10s} {r['line']:10s} batch {r['batch']}: {r['us_per_graph']:8.2f} us/graph "
                f"{r['graphs_per_s']:10.0f} graphs/s {r['ns_per_byte']:7.3f} ns/byte"
            )


def plot(results: list[dict], path: str) -> None:
    """Grouped bars: graphs/s of each way of reading (ragged, ragged into out=, padded rows,
    per-sample records, a local list) for each config."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in results if "graphs_per_s" in r]
    configs = list(dict.fromkeys(r["config"] for r in rows))
    lines = list(dict.fromkeys(r["line"] for r in rows))
    fig, ax = plt.subplots(figsize=(9, 4.2))
    width = 0.8 / max(1, len(lines))
    for k, line in enumerate(lines):
        got = {r["config"]: r["graphs_per_s"] for r in rows if r["line"] == line}
        xs = [i + k * width for i, c in enumerate(configs) if c in got]
        ax.bar(xs, [got[c] for c in configs if c in got], width, label=line)
    ax.set_xticks([i + width * (len(lines) - 1) / 2 for i in range(len(configs))], configs)
    ax.set_yscale("log")
    ax.set_ylabel("graphs/s (log; higher is better)")
    ax.set_title(f"batches of {rows[0]['batch'] if rows else '?'} random graphs of other ranks")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m pyddstore.benchmarks.graph", description=description(__doc__)
    )
    ap.add_argument(
        "--configs",
        type=lambda s: s.split(","),
        default=["node-shm", "mpi-rma", "ofi-tcp"],
        help=f"comma-separated, from {', '.join(CONFIGS)}",
    )
    ap.add_argument("--graphs", type=int, default=2000, help="graphs per rank")
    ap.add_argument("--batch", type=int, default=32, help="graphs per batch")
    ap.add_argument("--max-nodes", type=int, default=40, help="nodes of the largest graph (sizes uniform)")
    ap.add_argument("--range-bytes", type=int, default=8192, help="n of the range get")
    ap.add_argument("--seconds", type=float, default=0.3, help="time per line")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds; the best is kept")
    ap.add_argument("--json", help="write the figures to this file")
    ap.add_argument("--plot", help="write a PNG bar chart (matplotlib) to this file")
    args = ap.parse_args(argv)
    unknown = [c for c in args.configs if c not in CONFIGS]
    if unknown:
        ap.error(f"unknown configs {unknown}: choose from {', '.join(CONFIGS)}")
    comm = mpi_world()
    if comm.size < 2:
        ap.error("run under mpirun -n 2 or more: rank 0 reads the other ranks' graphs")
    results = measure(args, comm)
    if comm.rank == 0:
        print_table(
            results,
            f"# pyddstore {_native.__version__} graph bench: {comm.size} ranks, rank 0 reads graphs of "
            f"the other ranks, {args.graphs} graphs per rank",
        )
        if args.json:
            os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
            with open(args.json, "w") as f:
                json.dump({"ranks": comm.size, "results": results}, f, indent=1)
        if args.plot:
            plot(results, args.plot)


if __name__ == "__main__":
    main()
